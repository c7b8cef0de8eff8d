// Turning the project's data rows into chat messages and rendering them with a model folder's chat
// template (models/chat_template.h): DeepSpeed-Chat / HH-RLHF rows ("\n\nHuman: ...\n\nAssistant: ...")
// and GSM8K questions. This is the one place that knows those row formats as conversations; the
// tokenization of DS-Chat rows calls it (models/rlhf/dschat_data.h tokenize_settings::chat).
//
// Tokenizing a rendered text: the template already wrote the model's BOS when it has one (Llama 3's
// <|begin_of_text|>, Gemma's <bos>), so encode it without adding BOS again, as transformers'
// apply_chat_template(tokenize=True) does (add_special_tokens=False).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "models/chat_template.h"

namespace flowrun {

/// A DS-Chat / HH-RLHF prompt as messages. The prompt is a run of turns "\n\nHuman: TEXT" (role
/// user) and "\n\nAssistant: TEXT" (role assistant); a prompt may also start with "Human:" without the
/// blank line. Each TEXT is stripped (Python's str.strip), and a last empty "Assistant:" turn (the
/// place of the reply in DS-Chat's prompts) is dropped. When `response` is given (a row's chosen or
/// rejected), it is appended, stripped, as an assistant message.
/// Returns a JSON array of {"role", "content"}. Throws std::runtime_error when the prompt has text
/// before its first turn or no turn at all (the message quotes its start).
/// The same rule, in Python, made the fixtures (tests/fixtures/chat_templates/make_expected.py).
nlohmann::ordered_json dschat_messages(const std::string& prompt, const std::string* response = nullptr);

/// A GSM8K question as messages: an optional system message, then the question as the user's message.
nlohmann::ordered_json gsm8k_messages(const std::string& question, const std::string& system = "");

/// A prompt and the prompt followed by its response, rendered by one template; `prompt` is a prefix
/// of `full`, so the response's tokens are those after the prompt's.
struct chat_prompt_response {
  std::string prompt;  // rendered with add_generation_prompt = true
  std::string full;    // the prompt's messages and the response as an assistant message, add_generation_prompt = false
};

/// A model folder's chat template applied to the project's rows.
class chat_formatter {
 public:
  /// `model_dir`: a Hugging Face folder (or its tokenizer_config.json) with a chat template
  /// (load_hf_chat_template). `extra`: more template variables (e.g. {"date_string": "26 Jul 2024"}
  /// for Llama 3.x, whose template otherwise writes today's date). Throws as load_hf_chat_template.
  explicit chat_formatter(const std::string& model_dir,
                          nlohmann::ordered_json extra = nlohmann::ordered_json::object());
  /// Same, from a template already loaded.
  explicit chat_formatter(hf_chat_template t, nlohmann::ordered_json extra = nlohmann::ordered_json::object());

  /// `messages` rendered to be continued by the model (add_generation_prompt = true).
  std::string prompt(const nlohmann::ordered_json& messages) const;
  /// `messages` then `response` as the assistant's reply. Throws chat_template_error when the
  /// template does not render the prompt as a prefix of the whole (the response's tokens could not
  /// be told apart), naming the template.
  chat_prompt_response prompt_response(const nlohmann::ordered_json& messages, const std::string& response) const;

  /// A DS-Chat / HH-RLHF row's prompt (dschat_messages) ready for generation (PPO's prompts).
  std::string dschat_prompt(const std::string& prompt) const { return this->prompt(dschat_messages(prompt)); }
  /// A DS-Chat row's prompt and its chosen or rejected response (SFT and reward-model pairs).
  chat_prompt_response dschat_prompt_response(const std::string& prompt, const std::string& response) const;
  /// A GSM8K question ready for generation (GRPO's prompts).
  std::string gsm8k_prompt(const std::string& question, const std::string& system = "") const {
    return this->prompt(gsm8k_messages(question, system));
  }

  const hf_chat_template& chat_template_of_model() const { return t_; }

 private:
  hf_chat_template t_;
  nlohmann::ordered_json extra_;
};

/// The one switch every user of chat templates has (the trainers' and prompt_loader's
/// `apply_chat_template` setting, `flowrun eval --apply_chat_template`): the chat_formatter of the
/// Hugging Face model folder that `tokenizer` names (tokenizer.json beside tokenizer_config.json with
/// "chat_template", or chat_template.jinja). `who` starts each error ("node 'sft'", "flowrun eval"),
/// `on` names the switch as the user set it ("apply_chat_template = true", "--apply_chat_template"),
/// `tokenizer_name` the tokenizer's setting or option ("tokenizer", "--tokenizer") and `off` how to
/// turn the switch off ("set apply_chat_template = false", "drop --apply_chat_template").
/// Throws std::invalid_argument when `tokenizer` is not a folder or has no template (naming the
/// folder, the file and the fix), and chat_template_error (file, line, construct) when the template
/// does not parse.
std::shared_ptr<const chat_formatter> chat_formatter_for_tokenizer(const std::string& tokenizer,
                                                                   const std::string& who, const std::string& on,
                                                                   const std::string& tokenizer_name,
                                                                   const std::string& off);

}  // namespace flowrun
