// A model folder's chat template (tokenizer_config.json) and transformers' apply_chat_template
// variables. The interpreter itself is models/chat/{parse,render,value}.cpp.
#include "models/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace flowrun {

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error(p.string() + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

hf_chat_template load_hf_chat_template(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path cfg = fs::is_directory(path) ? fs::path(path) / "tokenizer_config.json" : fs::path(path);
  if (!fs::exists(cfg))
    throw std::runtime_error(cfg.string() + ": no tokenizer_config.json (a Hugging Face model folder holds one)");
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(read_file(cfg));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(cfg.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(cfg.string() + ": expected a JSON object");

  std::string source, name;
  fs::path jinja = cfg.parent_path() / "chat_template.jinja";
  if (fs::exists(jinja)) {  // transformers >= 4.43 saves the template beside the config; it wins when loading
    source = read_file(jinja);
    name = jinja.string();
  } else if (j.contains("chat_template") && j["chat_template"].is_string()) {
    source = j["chat_template"].get<std::string>();
    name = cfg.string() + ":chat_template";
  } else if (j.contains("chat_template") && j["chat_template"].is_array()) {
    for (const auto& t : j["chat_template"])
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
        source = t["template"].get<std::string>();
        name = cfg.string() + ":chat_template[default]";
      }
    if (name.empty()) {
      std::string names;
      for (const auto& t : j["chat_template"])
        if (t.is_object() && t.contains("name") && t["name"].is_string())
          names += (names.empty() ? "" : ", ") + t["name"].get<std::string>();
      // complete with its fix (invalid_argument: chat_formatter_for_tokenizer adds none of its own)
      throw std::invalid_argument(cfg.string() + ": chat_template is a list of named templates (" +
                                  (names.empty() ? std::string("none named") : names) +
                                  ") without one named \"default\", the one transformers takes when none is named: "
                                  "name the template to use \"default\", or write it to chat_template.jinja beside "
                                  "the file");
    }
  } else {
    throw std::runtime_error(cfg.string() +
                             ": no chat_template (the key is missing or not a string, and there is no chat_template.jinja "
                             "beside it; a base model has none)");
  }

  hf_chat_template out{chat_template::parse(source, name), nlohmann::ordered_json::object()};
  // transformers' special_tokens_map: the named special tokens that are set, as strings
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const auto& v = j[key];
    if (v.is_string()) out.special_tokens[key] = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      out.special_tokens[key] = v["content"].get<std::string>();
    else
      throw std::runtime_error(cfg.string() + ": " + key + " is neither a string nor an AddedToken {\"content\": ...}");
  }
  return out;
}

std::string apply_chat_template(const hf_chat_template& t, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const nlohmann::ordered_json& extra,
                                const nlohmann::ordered_json& tools) {
  if (!messages.is_array())
    throw chat_template_error(t.tmpl.name() + ": messages must be a JSON array of {\"role\", \"content\"} objects");
  for (const auto& m : messages)
    if (!m.is_object())
      throw chat_template_error(t.tmpl.name() + ": each message must be a JSON object, got " + m.dump());
  if (!extra.is_object()) throw chat_template_error(t.tmpl.name() + ": the extra variables must be a JSON object");
  if (!tools.is_null() && !tools.is_array())
    throw chat_template_error(t.tmpl.name() + ": tools must be null or a JSON array of function schemas");
  // render_jinja_template(messages=..., tools=None, documents=None, add_generation_prompt=..., **special_tokens, **kwargs)
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = messages;
  vars["tools"] = tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  for (auto it = t.special_tokens.begin(); it != t.special_tokens.end(); ++it) vars[it.key()] = it.value();
  for (auto it = extra.begin(); it != extra.end(); ++it) vars[it.key()] = it.value();
  return t.tmpl.render(vars);
}

}  // namespace flowrun
