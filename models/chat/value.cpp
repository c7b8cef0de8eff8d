// Values of the chat-template interpreter: conversions with Python's str / repr / json.dumps rules.
#include "models/chat/value.h"

#include "models/bpe.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace flowrun::chat {

const value* value::find(const std::string& key) const {
  if ((k != kind::dict && k != kind::ns) || !m) return nullptr;
  for (const auto& [kk, vv] : *m)
    if (kk == key) return &vv;
  return nullptr;
}

value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return value::none_v();
    case nlohmann::ordered_json::value_t::boolean: return value::boolean_v(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return value::int_v(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return value::int_v(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return value::real_v(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return value::str_v(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      list_t l;
      for (const auto& e : j) l.push_back(from_json(e));
      return value::list_v(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      dict_t m;
      for (auto it = j.begin(); it != j.end(); ++it) m.emplace_back(it.key(), from_json(it.value()));
      return value::dict_v(std::move(m));
    }
    default: throw std::runtime_error("chat template: a JSON value of an unsupported type (binary)");
  }
}

bool truthy(const value& v) {
  switch (v.k) {
    case value::kind::undefined:
    case value::kind::none: return false;
    case value::kind::boolean: return v.b;
    case value::kind::integer: return v.i != 0;
    case value::kind::real: return v.d != 0.0;
    case value::kind::string: return !v.s.empty();
    case value::kind::list: return !v.l->empty();
    case value::kind::dict: return !v.m->empty();
    case value::kind::ns:
    case value::kind::func: return true;
  }
  return false;
}

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);  // shortest round trip
  std::string s(buf, r.ptr);
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  auto epos = s.find('e');
  int exp = std::stoi(s.substr(epos + 1));
  std::string digits;
  for (char c : s.substr(0, epos))
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {  // Python's repr: fixed notation in this range
    if (exp >= 0) {
      size_t ip = static_cast<size_t>(exp) + 1;
      if (digits.size() <= ip) out = digits + std::string(ip - digits.size(), '0') + ".0";
      else out = digits.substr(0, ip) + "." + digits.substr(ip);
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    int ae = std::abs(exp);
    out += std::string("e") + (exp < 0 ? "-" : "+") + (ae < 10 ? "0" : "") + std::to_string(ae);
  }
  return neg ? "-" + out : out;
}

namespace {

std::string py_str_repr(const std::string& s) {
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) { out += '\\'; out += static_cast<char>(c); }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void json_dump(std::string& out, const value& v, int indent, bool sort_keys, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.k) {
    case value::kind::none: out += "null"; return;
    case value::kind::boolean: out += v.b ? "true" : "false"; return;
    case value::kind::integer: out += std::to_string(v.i); return;
    case value::kind::real:
      if (std::isnan(v.d)) out += "NaN";
      else if (std::isinf(v.d)) out += v.d > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(v.d);
      return;
    case value::kind::string: json_string(out, v.s); return;
    case value::kind::list: {
      if (v.l->empty()) { out += "[]"; return; }
      out += '[';
      bool first = true;
      for (const auto& e : *v.l) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(depth + 1);
        json_dump(out, e, indent, sort_keys, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case value::kind::dict: {
      if (v.m->empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, value>*> items;
      for (const auto& kv : *v.m) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(depth + 1);
        json_string(out, kv->first);
        out += ": ";
        json_dump(out, kv->second, indent, sort_keys, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    default: throw std::runtime_error("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string to_repr(const value& v) {
  switch (v.k) {
    case value::kind::string: return py_str_repr(v.s);
    case value::kind::list: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.l->size(); ++i) out += (i ? ", " : "") + to_repr((*v.l)[i]);
      if (v.tuple) return out + (v.l->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case value::kind::dict: {
      std::string out = "{";
      for (size_t i = 0; i < v.m->size(); ++i)
        out += (i ? ", " : "") + py_str_repr((*v.m)[i].first) + ": " + to_repr((*v.m)[i].second);
      return out + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const value& v) {
  switch (v.k) {
    case value::kind::undefined: return "";
    case value::kind::none: return "None";
    case value::kind::boolean: return v.b ? "True" : "False";
    case value::kind::integer: return std::to_string(v.i);
    case value::kind::real: return py_float_repr(v.d);
    case value::kind::string: return v.s;
    case value::kind::list:
    case value::kind::dict: return to_repr(v);
    case value::kind::ns: {
      value d = value::dict_v(*v.m);
      return "<Namespace " + to_repr(d) + ">";
    }
    case value::kind::func: return "<function " + v.s + ">";
  }
  return "";
}

std::string to_json_text(const value& v, int indent, bool sort_keys) {
  std::string out;
  json_dump(out, v, indent, sort_keys, 0);
  return out;
}

bool equals(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.k == value::kind::real || b.k == value::kind::real) {
      double x = a.k == value::kind::real ? a.d : static_cast<double>(a.k == value::kind::boolean ? a.b : a.i);
      double y = b.k == value::kind::real ? b.d : static_cast<double>(b.k == value::kind::boolean ? b.b : b.i);
      return x == y;
    }
    int64_t x = a.k == value::kind::boolean ? a.b : a.i, y = b.k == value::kind::boolean ? b.b : b.i;
    return x == y;
  }
  if (a.k != b.k) return false;
  switch (a.k) {
    case value::kind::undefined:
    case value::kind::none: return true;
    case value::kind::string: return a.s == b.s;
    case value::kind::list:
      if (a.l->size() != b.l->size()) return false;
      for (size_t i = 0; i < a.l->size(); ++i)
        if (!equals((*a.l)[i], (*b.l)[i])) return false;
      return true;
    case value::kind::dict:
      if (a.m->size() != b.m->size()) return false;
      for (const auto& [k, v] : *a.m) {
        const value* o = b.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    case value::kind::ns: return a.m == b.m;
    case value::kind::func: return a.s == b.s && a.self == b.self;
    default: return false;
  }
}

std::string type_name(const value& v) {
  switch (v.k) {
    case value::kind::undefined: return "Undefined";
    case value::kind::none: return "NoneType";
    case value::kind::boolean: return "bool";
    case value::kind::integer: return "int";
    case value::kind::real: return "float";
    case value::kind::string: return "str";
    case value::kind::list: return "list";
    case value::kind::dict: return "dict";
    case value::kind::ns: return "Namespace";
    case value::kind::func: return "function";
  }
  return "?";
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    size_t n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 0x6) { cp = c & 0x1f; n = 2; }
    else if ((c >> 4) == 0xe) { cp = c & 0x0f; n = 3; }
    else if ((c >> 3) == 0x1e) { cp = c & 0x07; n = 4; }
    else throw std::runtime_error("chat template: a string is not valid UTF-8");
    if (i + n > s.size()) throw std::runtime_error("chat template: a string is not valid UTF-8 (truncated)");
    for (size_t j = 1; j < n; ++j) {
      unsigned char cc = static_cast<unsigned char>(s[i + j]);
      if ((cc >> 6) != 0x2) throw std::runtime_error("chat template: a string is not valid UTF-8");
      cp = (cp << 6) | (cc & 0x3f);
    }
    out += cp;
    i += n;
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) bpe::append_utf8(out, static_cast<uint32_t>(c));
  return out;
}

bool py_isspace(char32_t c) {
  // Python's str.isspace: bidirectional class WS, B or S, or category Zs.
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

}  // namespace flowrun::chat
