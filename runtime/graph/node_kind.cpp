#include "runtime/graph/node_kind.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <stdexcept>

#include "runtime/util/nearest.h"

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
    case setting_type::output:
      return "output";
    case setting_type::path_list:
      return "path_list";
  }
  return "string";
}

std::optional<setting_type> parse_setting_type(std::string_view s) {
  for (auto t : {setting_type::int_, setting_type::float_, setting_type::bool_, setting_type::string,
                 setting_type::path, setting_type::string_list, setting_type::output, setting_type::path_list})
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
    case setting_type::output:
      return std::holds_alternative<std::string>(v);
    case setting_type::string_list:
    case setting_type::path_list:
      return std::holds_alternative<std::vector<std::string>>(v);
  }
  return false;
}

namespace {

bool numeric(setting_type t) { return t == setting_type::int_ || t == setting_type::float_; }

// A bound as people write it: 1000000, 0.5, 1e-08.
std::string bound_text(double x) {
  if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

}  // namespace

std::string describe_range(const setting_range& r, setting_type t) {
  std::vector<std::string> parts;
  if (t == setting_type::float_ && !r.allow_nonfinite) parts.push_back("finite");
  if (r.low && r.high)
    parts.push_back("in " + std::string(r.low_open ? "(" : "[") + bound_text(*r.low) + ", " + bound_text(*r.high) +
                    (r.high_open ? ")" : "]"));
  else if (r.low)
    parts.push_back((r.low_open ? "> " : ">= ") + bound_text(*r.low));
  else if (r.high)
    parts.push_back((r.high_open ? "< " : "<= ") + bound_text(*r.high));
  if (r.non_zero) parts.push_back("!= 0");
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

std::optional<std::string> range_violation(const setting_decl& d, const setting_value& v) {
  if (!numeric(d.type)) return std::nullopt;
  double x = 0;
  if (const auto* i = std::get_if<std::int64_t>(&v))
    x = static_cast<double>(*i);
  else if (const auto* f = std::get_if<double>(&v))
    x = *f;
  else
    return std::nullopt;
  const setting_range& r = d.range;
  bool ok = true;
  if (!std::isfinite(x)) {
    // NaN compares false with every bound: only an explicit allowance lets it (or +-inf) through.
    ok = d.type == setting_type::float_ && r.allow_nonfinite;
    if (ok && std::isinf(x)) {
      if (r.low && (x < *r.low || (r.low_open && x == *r.low))) ok = false;
      if (r.high && (x > *r.high || (r.high_open && x == *r.high))) ok = false;
    }
  } else {
    if (r.low && (x < *r.low || (r.low_open && x == *r.low))) ok = false;
    if (r.high && (x > *r.high || (r.high_open && x == *r.high))) ok = false;
    if (r.non_zero && x == 0) ok = false;
  }
  if (ok) return std::nullopt;
  return "must be " + describe_range(r, d.type) + ", got " + to_string(v);
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

node_kind& node_kind::default_by(std::function<setting_value(const node_spec& node)> f) {
  if (settings.empty()) throw std::invalid_argument("node_kind::default_by: no setting declared yet");
  if (settings.back().required)
    throw std::invalid_argument("node_kind::default_by: setting '" + settings.back().name + "' is required");
  settings.back().default_for = std::move(f);
  return *this;
}

node_kind& node_kind::require(std::string setting_name, setting_type type, std::string setting_doc) {
  settings.push_back({std::move(setting_name), type, std::monostate{}, std::move(setting_doc), true});
  return *this;
}

namespace {

setting_decl& last_numeric(node_kind& k, const char* what) {
  if (k.settings.empty())
    throw std::invalid_argument("node kind '" + k.name + "': " + what + " needs a setting declared before it");
  setting_decl& d = k.settings.back();
  if (!numeric(d.type))
    throw std::invalid_argument("node kind '" + k.name + "': " + what + " applies to int and float settings, not '" +
                                d.name + "' (" + std::string(to_string(d.type)) + ")");
  return d;
}

}  // namespace

node_kind& node_kind::at_least(double low) {
  auto& r = last_numeric(*this, "at_least").range;
  r.low = low;
  r.low_open = false;
  return *this;
}

node_kind& node_kind::above(double low) {
  auto& r = last_numeric(*this, "above").range;
  r.low = low;
  r.low_open = true;
  return *this;
}

node_kind& node_kind::at_most(double high) {
  auto& r = last_numeric(*this, "at_most").range;
  r.high = high;
  r.high_open = false;
  return *this;
}

node_kind& node_kind::below(double high) {
  auto& r = last_numeric(*this, "below").range;
  r.high = high;
  r.high_open = true;
  return *this;
}

node_kind& node_kind::in_range(double low, double high, bool low_open, bool high_open) {
  auto& r = last_numeric(*this, "in_range").range;
  r.low = low;
  r.high = high;
  r.low_open = low_open;
  r.high_open = high_open;
  return *this;
}

node_kind& node_kind::non_zero() {
  last_numeric(*this, "non_zero").range.non_zero = true;
  return *this;
}

node_kind& node_kind::allow_nonfinite() {
  setting_decl& d = last_numeric(*this, "allow_nonfinite");
  if (d.type != setting_type::float_)
    throw std::invalid_argument("node kind '" + name + "': allow_nonfinite applies to float settings, not '" + d.name +
                                "'");
  d.range.allow_nonfinite = true;
  return *this;
}

node_kind& node_kind::because(std::string why) {
  last_numeric(*this, "because").range.why = std::move(why);
  return *this;
}

node_kind& node_kind::known_as(std::string foreign_name, std::string hint) {
  other_names[std::move(foreign_name)] = std::move(hint);
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
  for (const auto& [foreign, hint] : kind.other_names)
    if (kind.find_setting(foreign)) fail("known_as(\"" + foreign + "\") names a setting of the kind itself");
  seen.clear();
  for (auto& s : kind.settings) {
    if (!is_identifier(s.name)) fail("setting '" + s.name + "' is not an identifier");
    if (!seen.insert(s.name).second) fail("two settings are called '" + s.name + "'");
    for (auto r : reserved_node_keys)
      if (s.name == r) fail("setting '" + s.name + "' uses a reserved name (kind, replicas, on, threads)");
    if (s.type == setting_type::float_)
      if (const auto* i = std::get_if<std::int64_t>(&s.default_value)) s.default_value = static_cast<double>(*i);
    if (s.required) {
      if (!std::holds_alternative<std::monostate>(s.default_value))
        fail("required setting '" + s.name + "' has a default");
    } else if (!value_matches(s.type, s.default_value)) {
      fail("the default of setting '" + s.name + "' is " + std::string(value_type_name(s.default_value)) + ", not " +
           std::string(to_string(s.type)));
    }
    const setting_range& r = s.range;
    if (!numeric(s.type) && (r.low || r.high || r.non_zero || r.allow_nonfinite))
      fail("setting '" + s.name + "' is " + std::string(to_string(s.type)) + ": only int and float settings have a range");
    if (r.low && r.high && (*r.low > *r.high || (*r.low == *r.high && (r.low_open || r.high_open))))
      fail("setting '" + s.name + "' has an empty range (" + describe_range(r, s.type) + ")");
    if (!s.required)
      if (auto why = range_violation(s, s.default_value)) fail("the default of setting '" + s.name + "' " + *why);
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
    wdef = std::max(wdef, s.required ? std::size_t{8} : to_string(s.default_value).size() + (s.default_for ? 11 : 2));
  for (const auto& s : kind.settings) {
    // a default that follows other settings (default_by) shows its static value, marked
    std::string def = s.required ? "required" : "= " + to_string(s.default_value) + (s.default_for ? " (varies)" : "");
    std::string line =
        "  " + pad(s.name, wname) + "  " + pad(std::string(to_string(s.type)), wtype) + "  " + pad(def, wdef);
    if (!s.doc.empty()) line += "  " + s.doc;
    if (std::string range = describe_range(s.range, s.type); !range.empty()) {
      line += "  [" + range + "]";
      if (!s.range.why.empty()) line += " (" + s.range.why + ")";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  if (!kind.other_names.empty()) {
    out += "other tools' names:\n";
    for (const auto& [foreign, hint] : kind.other_names) out += "  " + foreign + ": " + hint + "\n";
  }
  bool has_paths = false;
  for (const auto& s : kind.settings)
    has_paths = has_paths || s.type == setting_type::path || s.type == setting_type::path_list ||
                s.type == setting_type::output;
  if (has_paths) out += path_rule_text();
  return out;
}

std::string unknown_setting_hint(const graph_spec& graph, const node_kind_registry& kinds, const node_kind& kind,
                                 std::string_view setting_name, std::string_view node,
                                 const std::vector<std::string>& valid) {
  if (auto o = kind.other_names.find(setting_name); o != kind.other_names.end()) return o->second;
  if (!nearest_name(setting_name, valid).empty()) return {};
  std::string owners;
  for (const auto& other : graph.nodes)
    if (other.name != node)
      if (const node_kind* k = kinds.lookup(other.kind); k && k->find_setting(setting_name))
        owners += (owners.empty() ? "" : " and of ") + ("[node." + other.name + "] (kind " + k->name + ")");
  if (owners.empty()) return {};
  return "'" + std::string(setting_name) + "' is a setting of " + owners + ": write it there";
}

std::string path_rule_text() {
  return "paths (path and path_list: read, must exist; output: written):\n"
         "  a relative path written in a graph file resolves against that file's folder; one given on the command\n"
         "  line (--set) resolves against the working directory; inputs and outputs alike. An input not found there\n"
         "  is looked up under $FLOWRUN_ASSETS. Every path is made absolute before the run starts.\n";
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
          .option("max_lines", T::int_, std::int64_t{0}, "stop after this many lines; 0: the whole file")
              .at_least(0));
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
          .option("max_new_tokens", T::int_, std::int64_t{64}, "tokens to generate per prompt").at_least(0)
          .option("temperature", T::float_, 0.0, "sampling temperature; 0: greedy").at_least(0)
          .option("top_k", T::int_, std::int64_t{0}, "sample from the k most likely tokens; 0: all").at_least(0)
          .option("top_p", T::float_, 1.0, "nucleus sampling threshold; 1: off").in_range(0, 1, /*low_open=*/true)
          .option("seed", T::int_, std::int64_t{-1}, "sampling seed; -1: derived from the graph seed").at_least(-1));
  registry.register_kind(node_kind{"sink", "writes each item it receives as a line of text"}
                             .input("items", "text", "the items to write")
                             .option("path", T::output, std::string{}, "output file; \"\": standard output"));
}

}  // namespace flowrun::graph
