// The values a chat template computes with (models/chat_template.h): Jinja2's view of Python objects,
// restricted to what JSON messages and the templates' own literals produce. Internal to models/chat.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace flowrun::chat {

struct value;
using list_t = std::vector<value>;
/// A Python dict: insertion-ordered (what json.dumps and `items` show), string keys (JSON's).
using dict_t = std::vector<std::pair<std::string, value>>;

/// One value. `undefined` is Jinja2's Undefined (a missing variable, attribute or item), `none` is
/// Python's None (JSON null). `ns` is a namespace() (a dict shared by every copy, the one mutable
/// kind: `set ns.attr = ...`). `func` is a global function (raise_exception, strftime_now, namespace,
/// range, dict), a method bound to `self` (e.g. "strip" of a string, "items" of a dict) or a macro.
struct value {
  enum class kind { undefined, none, boolean, integer, real, string, list, dict, ns, func };
  kind k = kind::undefined;
  bool b = false;
  int64_t i = 0;
  double d = 0.0;
  std::string s;                     // string; func: the function's or method's name
  std::shared_ptr<list_t> l;         // list (tuples too)
  std::shared_ptr<dict_t> m;         // dict, ns
  std::shared_ptr<value> self;       // func: the bound receiver (null for a global)
  const void* macro = nullptr;       // func: a {% macro %} of the template (models/chat/ast.h stmt)
  bool tuple = false;                // list: a Python tuple (repr "(a, b)"; `items` and tuple literals)

  static value none_v() { value v; v.k = kind::none; return v; }
  static value boolean_v(bool x) { value v; v.k = kind::boolean; v.b = x; return v; }
  static value int_v(int64_t x) { value v; v.k = kind::integer; v.i = x; return v; }
  static value real_v(double x) { value v; v.k = kind::real; v.d = x; return v; }
  static value str_v(std::string x) { value v; v.k = kind::string; v.s = std::move(x); return v; }
  static value list_v(list_t x = {}) { value v; v.k = kind::list; v.l = std::make_shared<list_t>(std::move(x)); return v; }
  static value tuple_v(list_t x) { value v = list_v(std::move(x)); v.tuple = true; return v; }
  static value dict_v(dict_t x = {}) { value v; v.k = kind::dict; v.m = std::make_shared<dict_t>(std::move(x)); return v; }
  static value ns_v(dict_t x = {}) { value v; v.k = kind::ns; v.m = std::make_shared<dict_t>(std::move(x)); return v; }
  static value func_v(std::string name, std::shared_ptr<value> self = nullptr) {
    value v; v.k = kind::func; v.s = std::move(name); v.self = std::move(self); return v;
  }

  bool is_undefined() const { return k == kind::undefined; }
  bool is_number() const { return k == kind::integer || k == kind::real || k == kind::boolean; }
  /// The entry `key` of a dict or namespace, or nullptr.
  const value* find(const std::string& key) const;
};

/// JSON (insertion-ordered) to a value: null → none, numbers → integer / real, objects → dict.
value from_json(const nlohmann::ordered_json& j);

/// Python's truth value (Undefined is false).
bool truthy(const value& v);
/// Python's str(): strings as they are, None → "None", True → "True", floats as repr, lists and dicts as
/// their repr; Undefined → "" (Jinja2's default Undefined).
std::string to_str(const value& v);
/// Python's repr() (strings quoted as Python quotes them).
std::string to_repr(const value& v);
/// transformers' tojson filter: json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys)
/// (indent < 0: None, one line with ", " and ": "). Throws std::runtime_error for a value JSON cannot
/// hold (Undefined, a namespace, a function), as json.dumps raises TypeError.
std::string to_json_text(const value& v, int indent, bool sort_keys);
/// Python's repr of a float ("1.0", "0.1", "1e+16").
std::string py_float_repr(double x);
/// Python's ==, across int / float / bool and deeply over lists and dicts; Undefined equals Undefined only.
bool equals(const value& a, const value& b);
/// Python's type name ("str", "int", "NoneType", "Undefined", ...), for error messages.
std::string type_name(const value& v);

// UTF-8 helpers with Python's str semantics (code points, not bytes).
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
/// Python's str.isspace for one code point.
bool py_isspace(char32_t c);
/// Python's str.strip / lstrip / rstrip: `chars` empty → whitespace (py_isspace), else those code points.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);

}  // namespace flowrun::chat
