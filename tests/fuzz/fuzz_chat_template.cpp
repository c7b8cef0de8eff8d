// Fuzz target: the Jinja2 chat-template reader (models/chat/: parse, render) and the tokenizer_config.json
// that carries a template (load_hf_chat_template). Any input must either render or be refused with
// chat_template_error (the template) or std::runtime_error / std::invalid_argument (the JSON file), never
// another exception, a crash, a hang or a memory blow-up: the render runs within chat_render_limits 1,000
// times smaller than the defaults (libFuzzer's -timeout and -rss_limit_mb would report what they miss).
//
// Input: parts separated by a line "%%": 0 a template (Jinja2 text), or, when it starts with '{', a
// tokenizer_config.json that holds one; 1 the messages, a JSON array (default: a system, user, assistant
// and user conversation); 2 anything: when present, add_generation_prompt = false.
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "models/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), "%%");
  hf_chat_template t;
  try {
    if (!parts[0].empty() && parts[0][0] == '{') {
      const auto& dir = fuzz::scratch_dir("chat_template");
      fuzz::write_file(dir / "tokenizer_config.json", parts[0]);
      t = load_hf_chat_template(dir.string());
    } else {
      t.tmpl = chat_template::parse(std::string(parts[0]), "fuzz.jinja");
      t.special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    }
  } catch (const chat_template_error&) {
    return 0;
  } catch (const std::invalid_argument&) {
    return 0;
  } catch (const std::runtime_error&) {
    return 0;
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", "What is 2+2? caf\xc3\xa9 \xe4\xb8\xad"}},
       {{"role", "assistant"}, {"content", " #### 4"}},
       {{"role", "user"}, {"content", "And 3+3?"}}});
  if (parts.size() > 1) {
    auto m = nlohmann::ordered_json::parse(parts[1], nullptr, /*allow_exceptions=*/false);
    if (!m.is_discarded()) messages = std::move(m);
  }
  chat_render_limits small;
  small.max_items = 10'000;
  small.max_string = 256 << 10;
  small.max_work = 16 << 20;
  nlohmann::ordered_json vars = t.special_tokens;
  vars["messages"] = messages;
  vars["add_generation_prompt"] = parts.size() < 3;
  vars["tools"] = nullptr;
  try {
    (void)t.tmpl.render(vars, small);
  } catch (const chat_template_error&) {
  }
  return 0;
}
