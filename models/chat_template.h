// Chat templates: the Jinja2 template string `chat_template` of a Hugging Face tokenizer_config.json,
// rendered over a conversation as transformers' apply_chat_template(tokenize=False) renders it.
//
// No C++ Jinja engine is packaged by Debian, so models/chat/ holds a small interpreter of the subset
// the models' templates use (docs/chat_templates.md lists it): {% for %} (tuple targets, `if`
// filters, `else`, loop.index0/index/first/last/length/revindex/previtem/nextitem, break/continue),
// {% if/elif/else %}, {% set %} (names, tuples, namespace attributes, {% set x %}...{% endset %}),
// {% generation %} (transformers' extension; rendered as its body), comments, whitespace control
// ({%- -%}, {{- -}}, {%+ +%}) with transformers' trim_blocks and lstrip_blocks, Python expressions
// (+ - * / // % ** ~, comparisons, and/or/not, in / not in, `a if c else b`, attributes, items,
// slices, list / dict / tuple literals), the string and dict methods the templates call, filters and
// tests. Anything else (an unknown tag, filter, test, function or method) is an error naming the
// template, the construct, and its line and column, never a silent fallback.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace flowrun {

namespace chat {
struct template_impl;
}

/// A template that cannot be parsed or rendered. what() is "NAME:LINE:COL: message" (NAME: the
/// template's file, or "tokenizer_config.json:chat_template"); `raised` is the message of the
/// template's own raise_exception(...) when that was the cause (empty otherwise), the text
/// transformers' TemplateError carries.
class chat_template_error : public std::runtime_error {
 public:
  chat_template_error(const std::string& what, std::string raised = {})
      : std::runtime_error(what), raised(std::move(raised)) {}
  std::string raised;
};

/// What one render may build, against templates that would exhaust memory or time (Python's Jinja2
/// would try): a template past one fails with chat_template_error naming the limit. Real chat
/// templates stay far below the defaults (a few loop iterations per message).
struct chat_render_limits {
  /// The most items of a range() or a list built with +.
  int64_t max_items = 10'000'000;
  /// The most bytes of any one string: the output, a repetition ("x" * n), a concatenation, a
  /// replace, join or format result, a tojson indent.
  uint64_t max_string = 256ull << 20;
  /// The work of one render: each loop iteration and macro call costs 64, each item a loop or filter
  /// walks (a list, a dict's keys, a string's characters) and each range() item 16, each string the
  /// render builds (output, ~, +, *, replace, join, format, tojson) its length in bytes.
  uint64_t max_work = 16ull << 30;
};

/// A parsed Jinja2 chat template. Copies share the parsed form (immutable; render is const and
/// may run on several threads at once).
class chat_template {
 public:
  /// Parse `source` (the template text). `name` names it in errors (a file path).
  /// Throws chat_template_error at the first construct outside the supported subset or a syntax error.
  static chat_template parse(const std::string& source, const std::string& name);

  /// Render with `variables` (a JSON object: each key a template variable, e.g. messages,
  /// add_generation_prompt, bos_token; JSON null is Python's None, a missing key is undefined).
  /// The globals are transformers': raise_exception(msg), strftime_now(fmt) (local time, as
  /// datetime.now().strftime), namespace(...), dict(...), range(...).
  /// Throws chat_template_error naming the template, line and column (a raise_exception, an
  /// undefined value used as a value, a type error such as str + int).
  /// `limits` bounds what the render builds (chat_render_limits; the fuzz target gives small ones).
  std::string render(const nlohmann::ordered_json& variables, const chat_render_limits& limits = {}) const;

  const std::string& name() const;

 private:
  std::shared_ptr<const chat::template_impl> impl_;
};

/// A model's chat template with the special tokens its tokenizer passes to it.
struct hf_chat_template {
  chat_template tmpl;
  /// transformers' special_tokens_map as template variables: bos_token, eos_token, unk_token,
  /// pad_token, sep_token, cls_token, mask_token (those tokenizer_config.json sets, as strings).
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
};

/// Read the chat template of a Hugging Face tokenizer: `path` is a model folder or its
/// tokenizer_config.json. "chat_template" may be a string or a list of {name, template} (the one
/// named "default" is taken); a chat_template.jinja beside tokenizer_config.json (newer
/// transformers save it there) wins over the key, as transformers' loading does.
/// Special tokens may be strings or AddedToken objects ({"content": ...}).
/// Throws std::runtime_error naming the file when there is no template or the JSON is bad,
/// std::invalid_argument (with its fix) for a list of named templates without "default", and
/// chat_template_error when the template does not parse.
hf_chat_template load_hf_chat_template(const std::string& path);

/// transformers' apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=...):
/// renders with messages, tools (JSON null: None, or an array of JSON schemas), documents=None,
/// add_generation_prompt, the special tokens and `extra` (extra keys win, as apply_chat_template's
/// **kwargs do; e.g. {"date_string": "26 Jul 2024"}).
/// `messages`: a JSON array of {"role": ..., "content": ..., ...} objects. Throws chat_template_error.
std::string apply_chat_template(const hf_chat_template& t, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt,
                                const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                                const nlohmann::ordered_json& tools = nullptr);

}  // namespace flowrun
