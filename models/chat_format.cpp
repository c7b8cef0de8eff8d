// DS-Chat / HH-RLHF rows and GSM8K questions as chat messages, rendered by a model's chat template.
#include "models/chat_format.h"

#include <filesystem>
#include <stdexcept>

#include "models/chat/value.h"

namespace flowrun {

namespace {

std::string excerpt(const std::string& s) {
  std::string e = s.substr(0, 60);
  for (auto& c : e)
    if (c == '\n') c = ' ';
  return "\"" + e + (s.size() > 60 ? "...\"" : "\"");
}

std::string py_strip(const std::string& s) { return chat::py_strip(s, nullptr, true, true); }

}  // namespace

nlohmann::ordered_json dschat_messages(const std::string& prompt_in, const std::string* response) {
  static const std::pair<const char*, const char*> markers[] = {{"\n\nHuman:", "user"}, {"\n\nAssistant:", "assistant"}};
  std::string prompt = prompt_in;
  {
    std::string l = chat::py_strip(prompt, nullptr, true, false);
    if (l.rfind("Human:", 0) == 0 || l.rfind("Assistant:", 0) == 0) prompt = "\n\n" + l;
  }
  std::vector<std::pair<std::string, std::string>> turns;  // role, raw text
  size_t pos = 0;
  while (true) {
    size_t best = std::string::npos;
    const std::pair<const char*, const char*>* which = nullptr;
    for (const auto& m : markers) {
      size_t at = prompt.find(m.first, pos);
      if (at != std::string::npos && at < best) {
        best = at;
        which = &m;
      }
    }
    if (!which) break;
    if (turns.empty() && !py_strip(prompt.substr(0, best)).empty())
      throw std::runtime_error("DS-Chat prompt " + excerpt(prompt_in) +
                               ": text before its first \"\\n\\nHuman:\" turn (expected the HH-RLHF format "
                               "\"\\n\\nHuman: ...\\n\\nAssistant: ...\")");
    if (!turns.empty()) turns.back().second = prompt.substr(pos, best - pos);
    turns.emplace_back(which->second, "");
    pos = best + std::char_traits<char>::length(which->first);
  }
  if (turns.empty())
    throw std::runtime_error("DS-Chat prompt " + excerpt(prompt_in) +
                             ": no \"\\n\\nHuman:\" or \"\\n\\nAssistant:\" turn (expected the HH-RLHF format)");
  turns.back().second = prompt.substr(pos);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& [role, text] : turns) out.push_back({{"role", role}, {"content", py_strip(text)}});
  if (out.back()["role"] == "assistant" && out.back()["content"] == "") out.erase(out.size() - 1);
  if (response) out.push_back({{"role", "assistant"}, {"content", py_strip(*response)}});
  return out;
}

nlohmann::ordered_json gsm8k_messages(const std::string& question, const std::string& system) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  if (!system.empty()) out.push_back({{"role", "system"}, {"content", system}});
  out.push_back({{"role", "user"}, {"content", question}});
  return out;
}

chat_formatter::chat_formatter(const std::string& model_dir, nlohmann::ordered_json extra)
    : chat_formatter(load_hf_chat_template(model_dir), std::move(extra)) {}

chat_formatter::chat_formatter(hf_chat_template t, nlohmann::ordered_json extra)
    : t_(std::move(t)), extra_(std::move(extra)) {
  if (!extra_.is_object()) throw std::runtime_error(t_.tmpl.name() + ": the extra template variables must be a JSON object");
}

std::string chat_formatter::prompt(const nlohmann::ordered_json& messages) const {
  return apply_chat_template(t_, messages, true, extra_);
}

chat_prompt_response chat_formatter::prompt_response(const nlohmann::ordered_json& messages,
                                                     const std::string& response) const {
  chat_prompt_response r;
  r.prompt = apply_chat_template(t_, messages, true, extra_);
  nlohmann::ordered_json all = messages;
  all.push_back({{"role", "assistant"}, {"content", response}});
  r.full = apply_chat_template(t_, all, false, extra_);
  if (r.full.compare(0, r.prompt.size(), r.prompt) != 0)
    throw chat_template_error(t_.tmpl.name() +
                              ": the rendered prompt (add_generation_prompt=true) is not a prefix of the prompt "
                              "with its response, so the response's tokens cannot be told apart; this template "
                              "cannot format prompt/response pairs");
  return r;
}

chat_prompt_response chat_formatter::dschat_prompt_response(const std::string& prompt, const std::string& response) const {
  return prompt_response(dschat_messages(prompt), py_strip(response));
}

std::shared_ptr<const chat_formatter> chat_formatter_for_tokenizer(const std::string& tokenizer,
                                                                   const std::string& who, const std::string& on,
                                                                   const std::string& tokenizer_name,
                                                                   const std::string& off) {
  if (!std::filesystem::is_directory(tokenizer))
    throw std::invalid_argument(who + ": " + on + " renders the rows with the chat template of a Hugging Face model "
                                "folder, but " + tokenizer_name + " \"" + tokenizer + "\" is not a folder: set " +
                                tokenizer_name + " to the model folder (tokenizer.json and tokenizer_config.json "
                                "with \"chat_template\"), or " + off);
  try {
    return std::make_shared<const chat_formatter>(tokenizer);
  } catch (const chat_template_error&) {
    throw;  // names the template, the line and the construct
  } catch (const std::invalid_argument& e) {  // a message with its own fix (a list of templates without "default")
    throw std::invalid_argument(who + ": " + on + ": " + e.what());
  } catch (const std::exception& e) {
    throw std::invalid_argument(who + ": " + on + ": " + e.what() +
                                ": use a model folder whose tokenizer_config.json has \"chat_template\" (an "
                                "instruct or chat model's), or " + off);
  }
}

}  // namespace flowrun
