#include "runtime/graph/graph_spec.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace flowrun::graph {

graph_error graph_error::at(const source_pos& pos, std::string message, std::string hint) {
  return graph_error{pos.file, pos.line, pos.col, std::move(message), std::move(hint)};
}

std::string graph_error::to_string() const {
  std::string s = (file.empty() ? std::string("<input>") : file) + ":" + std::to_string(line) + ":" +
                  std::to_string(col) + ": error: " + message;
  if (!hint.empty()) s += "\n  hint: " + hint;
  return s;
}

std::string format_errors(const std::vector<graph_error>& errors) {
  std::string s;
  for (const auto& e : errors) s += e.to_string() + "\n";
  return s;
}

void sort_errors(std::vector<graph_error>& errors) {
  std::stable_sort(errors.begin(), errors.end(), [](const graph_error& a, const graph_error& b) {
    if (a.file != b.file) return a.file < b.file;
    if (a.line != b.line) return a.line < b.line;
    return a.col < b.col;
  });
}

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string to_string(const setting_value& v) {
  struct visitor {
    std::string operator()(std::monostate) const { return "(none)"; }
    std::string operator()(std::int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", d);
      std::string s = buf;
      // Shortest spelling that round-trips, and always recognisably a float.
      for (int prec = 1; prec <= 17; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, d);
        if (std::strtod(buf, nullptr) == d) {
          s = buf;
          break;
        }
      }
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(const std::string& s) const { return quote(s); }
    std::string operator()(const std::vector<std::string>& l) const {
      std::string s = "[";
      for (std::size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + quote(l[i]);
      return s + "]";
    }
  };
  return std::visit(visitor{}, v);
}

std::string_view value_type_name(const setting_value& v) {
  switch (v.index()) {
    case 0:
      return "none";
    case 1:
      return "int";
    case 2:
      return "float";
    case 3:
      return "bool";
    case 4:
      return "string";
    default:
      return "string_list";
  }
}

const setting* node_spec::find_setting(std::string_view n) const {
  auto it = settings.find(n);
  return it == settings.end() ? nullptr : &it->second;
}

namespace {
const setting& must_find(const node_spec& node, std::string_view n) {
  const setting* s = node.find_setting(n);
  if (!s) throw std::out_of_range("node '" + node.name + "' has no setting '" + std::string(n) + "'");
  return *s;
}
}  // namespace

std::int64_t node_spec::get_int(std::string_view n) const { return std::get<std::int64_t>(must_find(*this, n).value); }

double node_spec::get_float(std::string_view n) const {
  const auto& v = must_find(*this, n).value;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  return std::get<double>(v);
}

bool node_spec::get_bool(std::string_view n) const { return std::get<bool>(must_find(*this, n).value); }

const std::string& node_spec::get_string(std::string_view n) const {
  return std::get<std::string>(must_find(*this, n).value);
}

const std::vector<std::string>& node_spec::get_string_list(std::string_view n) const {
  return std::get<std::vector<std::string>>(must_find(*this, n).value);
}

std::string_view to_string(dispatch_mode d) {
  switch (d) {
    case dispatch_mode::broadcast:
      return "broadcast";
    case dispatch_mode::split:
      return "split";
    case dispatch_mode::round_robin:
      return "round_robin";
  }
  return "broadcast";
}

std::optional<dispatch_mode> parse_dispatch(std::string_view s) {
  if (s == "broadcast") return dispatch_mode::broadcast;
  if (s == "split") return dispatch_mode::split;
  if (s == "round_robin") return dispatch_mode::round_robin;
  return std::nullopt;
}

std::string edge_spec::to_string() const {
  std::string s = from_node;
  if (!from_port.empty()) s += "." + from_port;
  s += " -> " + to_node;
  if (!to_port.empty()) s += "." + to_port;
  return s;
}

const cluster_node_spec* cluster_spec::find(std::string_view n) const {
  for (const auto& node : nodes)
    if (node.name == n) return &node;
  return nullptr;
}

const node_spec* graph_spec::find_node(std::string_view n) const {
  for (const auto& node : nodes)
    if (node.name == n) return &node;
  return nullptr;
}

node_spec* graph_spec::find_node(std::string_view n) {
  for (auto& node : nodes)
    if (node.name == n) return &node;
  return nullptr;
}

std::uint64_t fnv1a64(std::string_view s, std::uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t node_seed(std::uint64_t graph_seed, std::string_view node_name, std::uint64_t replica) {
  return splitmix64(splitmix64(splitmix64(graph_seed) ^ fnv1a64(node_name)) ^ replica);
}

bool is_identifier(std::string_view s) {
  if (s.empty()) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(s[0])) return false;
  for (char c : s)
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

}  // namespace flowrun::graph
