#include "runtime/graph/node_kind.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace flowrun::graph {

std::string_view to_string(port_dir d) { return d == port_dir::in ? "in" : "out"; }

std::string_view to_string(setting_type t) {
  switch (t) {
    case setting_type::int_:
      return "int";
    case setting_type::float_:
      return "float";
    case setting_type::bool_:
      return "bool";
    case setting_type::string:
      return "string";
    case setting_type::path:
      return "path";
    case setting_type::string_list:
      return "string_list";
  }
  return "string";
}

std::optional<setting_type> parse_setting_type(std::string_view s) {
  for (auto t : {setting_type::int_, setting_type::float_, setting_type::bool_, setting_type::string,
                 setting_type::path, setting_type::string_list})
    if (to_string(t) == s) return t;
  return std::nullopt;
}

bool value_matches(setting_type t, const setting_value& v) {
  switch (t) {
    case setting_type::int_:
      return std::holds_alternative<std::int64_t>(v);
    case setting_type::float_:
      return std::holds_alternative<double>(v) || std::holds_alternative<std::int64_t>(v);
    case setting_type::bool_:
      return std::holds_alternative<bool>(v);
    case setting_type::string:
    case setting_type::path:
      return std::holds_alternative<std::string>(v);
    case setting_type::string_list:
      return std::holds_alternative<std::vector<std::string>>(v);
  }
  return false;
}

node_kind& node_kind::input(std::string port, std::string message_type, std::string port_doc, bool required,
                            bool feedback) {
  ports.push_back({std::move(port), std::move(message_type), port_dir::in, required, feedback, std::move(port_doc)});
  return *this;
}

node_kind& node_kind::output(std::string port, std::string message_type, std::string port_doc, bool required) {
  ports.push_back({std::move(port), std::move(message_type), port_dir::out, required, false, std::move(port_doc)});
  return *this;
}

node_kind& node_kind::option(std::string setting_name, setting_type type, setting_value default_value,
                             std::string setting_doc) {
  if (type == setting_type::float_)
    if (const auto* i = std::get_if<std::int64_t>(&default_value)) default_value = static_cast<double>(*i);
  settings.push_back({std::move(setting_name), type, std::move(default_value), std::move(setting_doc), false});
  return *this;
}

node_kind& node_kind::require(std::string setting_name, setting_type type, std::string setting_doc) {
  settings.push_back({std::move(setting_name), type, std::monostate{}, std::move(setting_doc), true});
  return *this;
}

const port_decl* node_kind::find_port(std::string_view port) const {
  for (const auto& p : ports)
    if (p.name == port) return &p;
  return nullptr;
}

const setting_decl* node_kind::find_setting(std::string_view setting_name) const {
  for (const auto& s : settings)
    if (s.name == setting_name) return &s;
  return nullptr;
}

std::vector<const port_decl*> node_kind::ports_of(port_dir d) const {
  std::vector<const port_decl*> out;
  for (const auto& p : ports)
    if (p.dir == d) out.push_back(&p);
  return out;
}

std::vector<std::string> node_kind::setting_names() const {
  std::vector<std::string> out;
  for (const auto& s : settings) out.push_back(s.name);
  return out;
}

std::vector<std::string> node_kind::port_names() const {
  std::vector<std::string> out;
  for (const auto& p : ports) out.push_back(p.name);
  return out;
}

void node_kind_registry::register_kind(node_kind kind) {
  auto fail = [&](const std::string& why) { throw std::invalid_argument("node kind '" + kind.name + "': " + why); };
  if (!is_identifier(kind.name)) fail("the name is not an identifier ([A-Za-z_][A-Za-z0-9_]*)");
  if (kinds_.count(kind.name)) fail("a kind with this name is registered already");
  std::set<std::string, std::less<>> seen;
  for (const auto& p : kind.ports) {
    if (!is_identifier(p.name)) fail("port '" + p.name + "' is not an identifier");
    if (!seen.insert(p.name).second) fail("two ports are called '" + p.name + "'");
    if (p.message_type.empty()) fail("port '" + p.name + "' has no message type");
    if (p.feedback && p.dir == port_dir::out) fail("out port '" + p.name + "' cannot be a feedback port");
  }
  seen.clear();
  for (auto& s : kind.settings) {
    if (!is_identifier(s.name)) fail("setting '" + s.name + "' is not an identifier");
    if (!seen.insert(s.name).second) fail("two settings are called '" + s.name + "'");
    for (auto r : reserved_node_keys)
      if (s.name == r) fail("setting '" + s.name + "' uses a reserved name (kind, replicas, on)");
    if (s.type == setting_type::float_)
      if (const auto* i = std::get_if<std::int64_t>(&s.default_value)) s.default_value = static_cast<double>(*i);
    if (s.required) {
      if (!std::holds_alternative<std::monostate>(s.default_value))
        fail("required setting '" + s.name + "' has a default");
    } else if (!value_matches(s.type, s.default_value)) {
      fail("the default of setting '" + s.name + "' is " + std::string(value_type_name(s.default_value)) + ", not " +
           std::string(to_string(s.type)));
    }
  }
  std::string name = kind.name;
  kinds_.emplace(std::move(name), std::move(kind));
}

const node_kind* node_kind_registry::lookup(std::string_view name) const {
  auto it = kinds_.find(name);
  return it == kinds_.end() ? nullptr : &it->second;
}

std::vector<const node_kind*> node_kind_registry::list() const {
  std::vector<const node_kind*> out;
  for (const auto& [name, kind] : kinds_) out.push_back(&kind);
  return out;
}

std::vector<std::string> node_kind_registry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, kind] : kinds_) out.push_back(name);
  return out;
}

namespace {

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

}  // namespace

std::string explain(const node_kind& kind) {
  std::string out = kind.name;
  if (!kind.doc.empty()) out += ": " + kind.doc;
  out += "\n";
  std::size_t wname = 4, wtype = 4;
  for (const auto& p : kind.ports) {
    wname = std::max(wname, p.name.size());
    wtype = std::max(wtype, p.message_type.size());
  }
  for (const auto& s : kind.settings) {
    wname = std::max(wname, s.name.size());
    wtype = std::max(wtype, to_string(s.type).size());
  }
  for (port_dir d : {port_dir::in, port_dir::out}) {
    auto ports = kind.ports_of(d);
    out += d == port_dir::in ? "in ports:" : "out ports:";
    if (ports.empty()) out += " (none)";
    out += "\n";
    for (const auto* p : ports) {
      std::string flags;
      if (p->required) flags += "required";
      if (p->feedback) flags += flags.empty() ? "feedback" : ", feedback";
      std::string line = "  " + pad(p->name, wname) + "  " + pad(p->message_type, wtype);
      if (!flags.empty()) line += "  (" + flags + ")";
      if (!p->doc.empty()) line += "  " + p->doc;
      out += line + "\n";
    }
  }
  out += "settings:";
  if (kind.settings.empty()) out += " (none)";
  out += "\n";
  std::size_t wdef = 8;
  for (const auto& s : kind.settings)
    wdef = std::max(wdef, s.required ? std::size_t{8} : to_string(s.default_value).size() + 2);
  for (const auto& s : kind.settings) {
    std::string def = s.required ? "required" : "= " + to_string(s.default_value);
    std::string line =
        "  " + pad(s.name, wname) + "  " + pad(std::string(to_string(s.type)), wtype) + "  " + pad(def, wdef);
    if (!s.doc.empty()) line += "  " + s.doc;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string describe_kinds(const node_kind_registry& registry) {
  std::size_t w = 4;
  for (const auto* k : registry.list()) w = std::max(w, k->name.size());
  std::string out;
  for (const auto* k : registry.list()) {
    std::string ports;
    for (port_dir d : {port_dir::in, port_dir::out}) {
      std::string part;
      for (const auto* p : k->ports_of(d)) part += (part.empty() ? "" : ", ") + p->name + ":" + p->message_type;
      ports += (d == port_dir::in ? "(" : ") -> (") + part;
    }
    ports += ")";
    std::string line = pad(k->name, w) + "  " + ports;
    if (!k->doc.empty()) line += "  " + k->doc;
    out += line + "\n";
  }
  return out;
}

void register_example_kinds(node_kind_registry& registry) {
  using T = setting_type;
  registry.register_kind(
      node_kind{"text_source", "reads a text file and emits it one line at a time"}
          .output("lines", "text", "one line of the file per message")
          .require("path", T::path, "the text file to read")
          .option("max_lines", T::int_, std::int64_t{0}, "stop after this many lines; 0: the whole file"));
  registry.register_kind(node_kind{"tokenizer", "turns text into token ids with a SentencePiece model"}
                             .input("text", "text", "text to encode")
                             .output("tokens", "tokens", "the token ids of each text")
                             .require("model", T::path, "the tokenizer model (.model)")
                             .option("add_bos", T::bool_, true, "prepend the beginning-of-sequence token"));
  registry.register_kind(
      node_kind{"generator", "samples a completion for each prompt from a language model"}
          .input("prompts", "tokens", "prompt token ids")
          .output("completions", "text", "the decoded completion of each prompt")
          .require("model", T::path, "the model weights (llama2.c .bin, or a HF or flowrun model folder)")
          .require("tokenizer", T::path, "the tokenizer model used to decode")
          .option("max_new_tokens", T::int_, std::int64_t{64}, "tokens to generate per prompt")
          .option("temperature", T::float_, 0.0, "sampling temperature; 0: greedy")
          .option("top_k", T::int_, std::int64_t{0}, "sample from the k most likely tokens; 0: all")
          .option("top_p", T::float_, 1.0, "nucleus sampling threshold; 1: off")
          .option("seed", T::int_, std::int64_t{-1}, "sampling seed; -1: derived from the graph seed"));
  registry.register_kind(node_kind{"sink", "writes each item it receives as a line of text"}
                             .input("items", "text", "the items to write")
                             .option("path", T::string, std::string{}, "output file; \"\": standard output"));
}

}  // namespace flowrun::graph
