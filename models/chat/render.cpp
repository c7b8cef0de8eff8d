// The evaluator of the chat-template subset (models/chat_template.h): statements, Python's operators
// on the values of models/chat/value.h, Jinja2's attribute / item lookup, filters, tests, the globals
// transformers defines, and the string / dict methods the templates call.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <set>

#include <unicode/uchar.h>

#include "models/chat/ast.h"
#include "models/chat_template.h"

namespace flowrun::chat {

struct template_impl {
  std::unique_ptr<template_root> root;
};

namespace {

const std::set<std::string>& test_names() {
  static const std::set<std::string> n = {
      "defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "mapping", "iterable",
      "sequence", "callable", "true", "false", "odd", "even", "divisibleby", "equalto", "eq", "==", "ne", "!=",
      "lt", "<", "le", "<=", "gt", ">", "ge", ">=", "in", "lower", "upper", "sameas"};
  return n;
}

// Limits against templates that would exhaust memory or time (Python would try): chat_render_limits.
constexpr uint64_t step_work = 64;  // what a loop iteration or a macro call costs of max_work

struct break_signal {};
struct continue_signal {};

class renderer {
 public:
  renderer(const template_root& root, const nlohmann::ordered_json& vars, const chat_render_limits& limits)
      : root_(root), limits_(limits) {
    frames_.emplace_back();
    if (!vars.is_object()) throw chat_template_error(root.name + ": the variables must be a JSON object");
    for (auto it = vars.begin(); it != vars.end(); ++it) frames_[0][it.key()] = from_json(it.value());
    frames_.emplace_back();  // the template's own assignments
  }

  std::string run() {
    std::string out;
    exec(root_.main, out);
    return out;
  }

 private:
  using frame = std::map<std::string, value>;

  [[noreturn]] void fail(pos at, const std::string& msg, const std::string& raised = {}) const {
    throw chat_template_error(root_.name + ":" + std::to_string(at.line) + ":" + std::to_string(at.col) + ": " + msg,
                              raised);
  }

  // `units` of the render's work (chat_render_limits::max_work), refused past it
  void spend(uint64_t units, pos at) {
    work_ += units;
    if (work_ > limits_.max_work)
      fail(at, "the template's work passed " + std::to_string(limits_.max_work) +
                   " units (64 a loop iteration or macro call, 16 an item walked, 1 a byte of a string built)");
  }
  // a string of `n` bytes built at `at`: within max_string, and its bytes spent
  void built(uint64_t n, pos at, const char* what) {
    if (n > limits_.max_string)
      fail(at, std::string(what) + " of more than " + std::to_string(limits_.max_string) + " bytes");
    spend(n, at);
  }

  // ---- statements ----
  void exec(const body& b, std::string& out) {
    for (const auto& s : b) exec(*s, out);
  }

  void exec(const stmt& s, std::string& out) {
    switch (s.k) {
      case stmt::kind::text:
        if (out.size() + s.text.size() > limits_.max_string) built(out.size() + s.text.size(), s.at, "an output");
        out += s.text;
        spend(s.text.size(), s.at);
        return;
      case stmt::kind::output: {
        const std::string v = to_str(eval(*s.e));
        if (out.size() + v.size() > limits_.max_string) built(out.size() + v.size(), s.at, "an output");
        out += v;
        spend(v.size(), s.at);
        return;
      }
      case stmt::kind::generation: exec(s.main, out); return;
      case stmt::kind::brk: throw break_signal{};
      case stmt::kind::cont: throw continue_signal{};
      case stmt::kind::if_chain:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (truthy(eval(*s.conds[i]))) {
            exec(s.bodies[i], out);
            return;
          }
        exec(s.else_body, out);
        return;
      case stmt::kind::set: {
        value v;
        if (s.e) v = eval(*s.e);
        else {
          std::string captured;
          exec(s.main, captured);
          v = value::str_v(std::move(captured));
        }
        if (!s.attr_target.empty()) {
          value target = lookup(s.targets[0]);
          if (target.k != value::kind::ns)
            fail(s.at, "cannot assign attribute '" + s.attr_target + "' on '" + s.targets[0] + "' (a " +
                           type_name(target) + ", not a namespace())");
          if (!s.attr_target.empty() && s.attr_target[0] == '_')
            fail(s.at, "namespace attributes cannot start with '_' (transformers refuses them)");
          for (auto& kv : *target.m)
            if (kv.first == s.attr_target) {
              kv.second = v;
              return;
            }
          target.m->emplace_back(s.attr_target, v);
          return;
        }
        assign(s.targets, v, s.at);
        return;
      }
      case stmt::kind::for_loop: exec_for(s, out); return;
      case stmt::kind::macro: {
        value m = value::func_v(s.text);
        m.macro = &s;
        frames_.back()[s.text] = m;
        return;
      }
    }
  }

  void assign(const std::vector<std::string>& targets, const value& v, pos at) {
    if (targets.size() == 1) {
      frames_.back()[targets[0]] = v;
      return;
    }
    list_t items = iterate(v, at);
    if (items.size() != targets.size())
      fail(at, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
                   " names");
    for (size_t i = 0; i < targets.size(); ++i) frames_.back()[targets[i]] = items[i];
  }

  void exec_for(const stmt& s, std::string& out) {
    value seq = eval(*s.e);
    list_t items = iterate(seq, s.e->at);
    frames_.emplace_back();
    struct pop_frame {
      std::vector<frame>& f;
      ~pop_frame() { f.pop_back(); }
    } guard{frames_};
    if (s.cond) {
      list_t kept;
      for (const auto& it : items) {
        spend(step_work, s.at);
        assign(s.targets, it, s.at);
        if (truthy(eval(*s.cond))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      spend(step_work, s.at);
      frames_.back().clear();  // each iteration starts from the outer scope (Jinja2: a `set` lasts one iteration)
      assign(s.targets, items[static_cast<size_t>(i)], s.at);
      dict_t loop = {{"index0", value::int_v(i)},
                     {"index", value::int_v(i + 1)},
                     {"revindex0", value::int_v(n - i - 1)},
                     {"revindex", value::int_v(n - i)},
                     {"first", value::boolean_v(i == 0)},
                     {"last", value::boolean_v(i == n - 1)},
                     {"length", value::int_v(n)},
                     {"depth", value::int_v(1)},
                     {"depth0", value::int_v(0)},
                     {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : value{}},
                     {"nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : value{}}};
      frames_.back()["loop"] = value::dict_v(std::move(loop));
      try {
        exec(s.main, out);
      } catch (const break_signal&) {
        break;
      } catch (const continue_signal&) {
        continue;
      }
    }
    if (n == 0) exec(s.else_body, out);
  }

  // ---- lookups ----
  value lookup(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      auto it = f->find(name);
      if (it != f->end()) return it->second;
    }
    static const std::set<std::string> globals = {"raise_exception", "strftime_now", "namespace", "range", "dict"};
    if (globals.count(name)) return value::func_v(name);
    return value{};
  }

  static bool has_method(const value& v, const std::string& n) {
    static const std::set<std::string> str_methods = {"strip", "lstrip", "rstrip", "split", "lower", "upper",
                                                      "title", "capitalize", "startswith", "endswith", "replace",
                                                      "find", "count", "join", "format", "splitlines"};
    static const std::set<std::string> dict_methods = {"items", "keys", "values", "get"};
    if (v.k == value::kind::string) return str_methods.count(n) > 0;
    if (v.k == value::kind::dict) return dict_methods.count(n) > 0;
    return false;
  }

  // Jinja2's getattr: a Python attribute first (a method), then the item.
  value get_attr(const value& obj, const std::string& n, pos at) const {
    if (obj.is_undefined()) fail(at, "'" + n + "' of an undefined value (jinja2.exceptions.UndefinedError)");
    if (has_method(obj, n)) return value::func_v(n, std::make_shared<value>(obj));
    if (const value* v = obj.find(n)) return *v;
    return value{};
  }

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  // Jinja2's getitem: the item first, then an attribute of that name.
  value get_item(const value& obj, const value& key, pos at) const {
    switch (obj.k) {
      case value::kind::undefined: fail(at, "an item of an undefined value (jinja2.exceptions.UndefinedError)");
      case value::kind::dict:
      case value::kind::ns:
        if (key.k == value::kind::string) {
          if (const value* v = obj.find(key.s)) return *v;
          if (has_method(obj, key.s)) return value::func_v(key.s, std::make_shared<value>(obj));
        }
        return value{};
      case value::kind::list: {
        if (key.k != value::kind::integer && key.k != value::kind::boolean) return value{};
        int64_t n = static_cast<int64_t>(obj.l->size());
        int64_t i = norm_index(key.k == value::kind::boolean ? key.b : key.i, n);
        if (i < 0 || i >= n) return value{};
        return (*obj.l)[static_cast<size_t>(i)];
      }
      case value::kind::string: {
        if (key.k == value::kind::string) return get_attr(obj, key.s, at);
        if (key.k != value::kind::integer) return value{};
        std::u32string u = utf8_decode(obj.s);
        int64_t n = static_cast<int64_t>(u.size());
        int64_t i = norm_index(key.i, n);
        if (i < 0 || i >= n) return value{};
        return value::str_v(utf8_encode(u.substr(static_cast<size_t>(i), 1)));
      }
      default: return value{};
    }
  }

  int64_t as_int(const value& v, pos at, const char* what) const {
    if (v.k == value::kind::integer) return v.i;
    if (v.k == value::kind::boolean) return v.b;
    fail(at, std::string(what) + " must be an integer, not " + type_name(v));
  }

  value slice(const value& obj, const expr& e) {
    int64_t step = 1;
    if (e.d) {
      value sv = eval(*e.d);
      if (sv.k != value::kind::none) step = as_int(sv, e.d->at, "a slice step");
    }
    if (step == 0) fail(e.at, "slice step cannot be zero");
    auto pick = [&](int64_t n, auto&& take) {
      auto bound = [&](const expr_ptr& x, int64_t dflt) -> int64_t {
        if (!x) return dflt;
        value v = eval(*x);
        if (v.k == value::kind::none) return dflt;
        int64_t i = as_int(v, x->at, "a slice index");
        if (i < 0) i += n;
        if (step > 0) return std::clamp<int64_t>(i, 0, n);
        return std::clamp<int64_t>(i, -1, n - 1);
      };
      int64_t b = bound(e.b, step > 0 ? 0 : n - 1), en = bound(e.c, step > 0 ? n : -1);
      for (int64_t i = b; step > 0 ? i < en : i > en; i += step) take(static_cast<size_t>(i));
    };
    if (obj.k == value::kind::list) {
      list_t out;
      pick(static_cast<int64_t>(obj.l->size()), [&](size_t i) { out.push_back((*obj.l)[i]); });
      return value::list_v(std::move(out));
    }
    if (obj.k == value::kind::string) {
      std::u32string u = utf8_decode(obj.s), out;
      pick(static_cast<int64_t>(u.size()), [&](size_t i) { out += u[i]; });
      return value::str_v(utf8_encode(out));
    }
    if (obj.is_undefined()) fail(e.at, "a slice of an undefined value (jinja2.exceptions.UndefinedError)");
    fail(e.at, "cannot slice a " + type_name(obj));
  }

  // The items a loop or a filter walks (a copy), their number x 16 spent of the work
  list_t iterate(const value& v, pos at) {
    switch (v.k) {
      case value::kind::undefined: return {};
      case value::kind::list: spend(v.l->size() * 16, at); return *v.l;
      case value::kind::dict: {
        spend(v.m->size() * 16, at);
        list_t keys;
        for (const auto& kv : *v.m) keys.push_back(value::str_v(kv.first));
        return keys;
      }
      case value::kind::string: {
        spend(v.s.size() * 16, at);
        list_t chars;
        for (char32_t c : utf8_decode(v.s)) chars.push_back(value::str_v(utf8_encode(std::u32string(1, c))));
        return chars;
      }
      default: fail(at, "'" + type_name(v) + "' object is not iterable");
    }
  }

  // ---- expressions ----
  value eval(const expr& e) {
    switch (e.k) {
      case expr::kind::literal: return e.lit;
      case expr::kind::name: return lookup(e.name);
      case expr::kind::attr: return get_attr(eval(*e.a), e.name, e.at);
      case expr::kind::item: {
        value o = eval(*e.a);
        return get_item(o, eval(*e.b), e.at);
      }
      case expr::kind::slice: {
        value o = eval(*e.a);
        return slice(o, e);
      }
      case expr::kind::list:
      case expr::kind::tuple: {
        list_t l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return e.k == expr::kind::tuple ? value::tuple_v(std::move(l)) : value::list_v(std::move(l));
      }
      case expr::kind::dict: {
        dict_t m;
        for (size_t i = 0; i < e.args.size(); ++i) {
          value k = eval(*e.args[i]);
          if (k.k != value::kind::string) fail(e.args[i]->at, "dict keys must be strings here");
          value v = eval(*e.vals[i]);
          bool found = false;
          for (auto& kv : m)
            if (kv.first == k.s) {
              kv.second = v;
              found = true;
            }
          if (!found) m.emplace_back(k.s, v);
        }
        return value::dict_v(std::move(m));
      }
      case expr::kind::cond:
        if (truthy(eval(*e.a))) return eval(*e.b);
        return e.c ? eval(*e.c) : value{};
      case expr::kind::unary: {
        if (e.name == "not") return value::boolean_v(!truthy(eval(*e.a)));
        value v = eval(*e.a);
        if (v.k == value::kind::integer || v.k == value::kind::boolean) {
          int64_t x = v.k == value::kind::boolean ? v.b : v.i;
          return value::int_v(e.name == "-" ? -x : x);
        }
        if (v.k == value::kind::real) return value::real_v(e.name == "-" ? -v.d : v.d);
        fail(e.at, "bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
      }
      case expr::kind::binary: return binary(e);
      case expr::kind::call: return call(e);
      case expr::kind::filter: return filter(e);
      case expr::kind::test: {
        bool r = test(e);
        return value::boolean_v(e.negate ? !r : r);
      }
    }
    fail(e.at, "internal: unknown expression");
  }

  static double as_double(const value& v) {
    return v.k == value::kind::real ? v.d : static_cast<double>(v.k == value::kind::boolean ? v.b : v.i);
  }
  static int64_t as_i(const value& v) { return v.k == value::kind::boolean ? v.b : v.i; }

  [[noreturn]] void type_error(const expr& e, const std::string& op, const value& a, const value& b) const {
    if (a.is_undefined() || b.is_undefined())
      fail(e.at, "an undefined value used in '" + op + "' (jinja2.exceptions.UndefinedError)");
    if (op == "%" && a.k == value::kind::string)  // a feature flowrun lacks, not a fault of the template
      fail(e.at, "Python's '%' string formatting ('" + type_name(a) + "' % '" + type_name(b) +
                     "') is not supported by flowrun's renderer: build the text with ~ and |string instead "
                     "(e.g. n|string ~ ': ')");
    fail(e.at, "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  }

  value binary(const expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      value a = eval(*e.a);
      return truthy(a) ? eval(*e.b) : a;
    }
    if (op == "or") {
      value a = eval(*e.a);
      return truthy(a) ? a : eval(*e.b);
    }
    value a = eval(*e.a), b = eval(*e.b);
    if (op == "==") return value::boolean_v(equals(a, b));
    if (op == "!=") return value::boolean_v(!equals(a, b));
    if (op == "in" || op == "not in") {
      bool r = contains(b, a, e);
      return value::boolean_v(op == "in" ? r : !r);
    }
    if (op == "~") {
      std::string x = to_str(a), y = to_str(b);
      built(x.size() + y.size(), e.at, "a string joined with ~");
      return value::str_v(x + y);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (a.is_number() && b.is_number()) {
        double x = as_double(a), y = as_double(b);
        c = x < y ? -1 : x > y ? 1 : 0;
      } else if (a.k == value::kind::string && b.k == value::kind::string) {
        std::u32string x = utf8_decode(a.s), y = utf8_decode(b.s);
        c = x < y ? -1 : x > y ? 1 : 0;
      } else {
        type_error(e, op, a, b);
      }
      bool r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
      return value::boolean_v(r);
    }
    if (op == "+") {
      if (a.k == value::kind::string && b.k == value::kind::string) {
        built(a.s.size() + b.s.size(), e.at, "a string joined with +");
        return value::str_v(a.s + b.s);
      }
      if (a.k == value::kind::list && b.k == value::kind::list) {
        if (a.l->size() + b.l->size() > static_cast<uint64_t>(limits_.max_items))
          fail(e.at, "a list of more than " + std::to_string(limits_.max_items) + " items");
        spend((a.l->size() + b.l->size()) * 16, e.at);
        list_t l = *a.l;
        l.insert(l.end(), b.l->begin(), b.l->end());
        return value::list_v(std::move(l));
      }
    }
    if (op == "*") {
      if ((a.k == value::kind::string && (b.k == value::kind::integer || b.k == value::kind::boolean)) ||
          (b.k == value::kind::string && (a.k == value::kind::integer || a.k == value::kind::boolean))) {
        const std::string& s = a.k == value::kind::string ? a.s : b.s;
        int64_t n = a.k == value::kind::string ? as_i(b) : as_i(a);
        if (n > 0 && !s.empty() && static_cast<uint64_t>(n) > limits_.max_string / s.size())
          fail(e.at, "a string repeated to more than " + std::to_string(limits_.max_string) + " bytes");
        if (n > 0) spend(static_cast<uint64_t>(n) * s.size(), e.at);
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += s;
        return value::str_v(std::move(out));
      }
    }
    if (!a.is_number() || !b.is_number()) type_error(e, op, a, b);
    bool real = a.k == value::kind::real || b.k == value::kind::real;
    if (op == "/") {
      double y = as_double(b);
      if (y == 0) fail(e.at, "division by zero");
      return value::real_v(as_double(a) / y);
    }
    if (op == "**") {
      if (!real && as_i(b) >= 0) {
        int64_t r = 1, x = as_i(a);
        for (int64_t i = 0; i < as_i(b); ++i) r *= x;
        return value::int_v(r);
      }
      return value::real_v(std::pow(as_double(a), as_double(b)));
    }
    if (real) {
      double x = as_double(a), y = as_double(b);
      if (op == "+") return value::real_v(x + y);
      if (op == "-") return value::real_v(x - y);
      if (op == "*") return value::real_v(x * y);
      if (y == 0) fail(e.at, "float division by zero");
      if (op == "//") return value::real_v(std::floor(x / y));
      double r = std::fmod(x, y);  // Python's %: the sign of the divisor
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return value::real_v(r);
    }
    int64_t x = as_i(a), y = as_i(b);
    if (op == "+") return value::int_v(x + y);
    if (op == "-") return value::int_v(x - y);
    if (op == "*") return value::int_v(x * y);
    if (y == 0) fail(e.at, "integer division or modulo by zero");
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      --q;
      r += y;
    }
    return value::int_v(op == "//" ? q : r);
  }

  bool contains(const value& hay, const value& needle, const expr& e) const {
    switch (hay.k) {
      case value::kind::undefined: return false;
      case value::kind::string:
        if (needle.k != value::kind::string)
          fail(e.at, "'in <string>' requires string as left operand, not " + type_name(needle));
        return hay.s.find(needle.s) != std::string::npos;
      case value::kind::list:
        for (const auto& x : *hay.l)
          if (equals(x, needle)) return true;
        return false;
      case value::kind::dict:
      case value::kind::ns: return needle.k == value::kind::string && hay.find(needle.s) != nullptr;
      default: fail(e.at, "argument of type '" + type_name(hay) + "' is not iterable");
    }
  }

  // ---- calls: globals and methods ----
  struct args_t {
    list_t pos;
    std::vector<std::pair<std::string, value>> kw;
    const value* get(size_t i, const char* name) const {
      if (i < pos.size()) return &pos[i];
      for (const auto& [k, v] : kw)
        if (k == name) return &v;
      return nullptr;
    }
  };

  args_t eval_args(const expr& e) {
    args_t a;
    for (const auto& x : e.args) a.pos.push_back(eval(*x));
    for (const auto& kw : e.kwargs) a.kw.emplace_back(kw.name, eval(*kw.val));
    return a;
  }

  const std::string& str_arg(const value* v, pos at, const std::string& what) const {
    if (!v || v->k != value::kind::string) fail(at, what + " must be a string");
    return v->s;
  }

  value call(const expr& e) {
    value f = eval(*e.a);
    args_t a = eval_args(e);
    if (f.k != value::kind::func) {
      std::string what = e.a->k == expr::kind::name   ? "'" + e.a->name + "'"
                         : e.a->k == expr::kind::attr ? "'" + e.a->name + "'"
                                                      : "the value";
      if (f.is_undefined()) fail(e.at, what + " is undefined or not a supported function or method");
      fail(e.at, what + " (a " + type_name(f) + ") is not callable");
    }
    if (f.self) return call_method(*f.self, f.s, a, e.at);
    if (f.macro) return call_macro(*static_cast<const stmt*>(f.macro), a, e.at);
    const std::string& n = f.s;
    if (n == "raise_exception") {
      const value* m = a.get(0, "message");
      std::string msg = m ? to_str(*m) : "";
      fail(e.at, "raise_exception: " + msg, msg);
    }
    if (n == "strftime_now") {
      const std::string& fmt = str_arg(a.get(0, "format"), e.at, "strftime_now's format");
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[256];
      size_t len = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return value::str_v(std::string(buf, len));
    }
    if (n == "namespace" || n == "dict") {
      dict_t m;
      for (const auto& p : a.pos) {
        if (p.k != value::kind::dict && p.k != value::kind::ns) fail(e.at, n + "() takes a mapping or keywords");
        for (const auto& kv : *p.m) m.push_back(kv);
      }
      for (const auto& [k, v] : a.kw) {
        if (n == "namespace" && !k.empty() && k[0] == '_') fail(e.at, "namespace attributes cannot start with '_'");
        m.emplace_back(k, v);
      }
      return n == "namespace" ? value::ns_v(std::move(m)) : value::dict_v(std::move(m));
    }
    if (n == "range") {
      std::vector<int64_t> p;
      for (const auto& x : a.pos) p.push_back(as_int(x, e.at, "range's argument"));
      int64_t start = 0, stop = 0, step = 1;
      if (p.size() == 1) stop = p[0];
      else if (p.size() == 2 || p.size() == 3) {
        start = p[0];
        stop = p[1];
        if (p.size() == 3) step = p[2];
      } else fail(e.at, "range() takes 1 to 3 arguments");
      if (step == 0) fail(e.at, "range() arg 3 must not be zero");
      const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
      if (count > static_cast<double>(limits_.max_items))
        fail(e.at, "range() of more than " + std::to_string(limits_.max_items) + " items");
      if (count > 0) spend(static_cast<uint64_t>(count) * 16, e.at);
      list_t l;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) l.push_back(value::int_v(i));
      return value::list_v(std::move(l));
    }
    fail(e.at, "unsupported function '" + n + "'");
  }

  // A macro runs with the render's variables and the template's top-level names, its parameters in
  // a frame of their own (the caller's loop variables are not visible, as in Jinja2); it returns its text.
  value call_macro(const stmt& m, const args_t& a, pos at) {
    if (a.pos.size() > m.targets.size())
      fail(at, "macro '" + m.text + "' takes " + std::to_string(m.targets.size()) + " arguments, " +
                   std::to_string(a.pos.size()) + " given");
    for (const auto& [k, v] : a.kw)
      if (std::find(m.targets.begin(), m.targets.end(), k) == m.targets.end())
        fail(at, "macro '" + m.text + "' has no parameter '" + k + "'");
    if (++macro_depth_ > 100) {
      --macro_depth_;
      fail(at, "macro '" + m.text + "' calls nested more than 100 deep");
    }
    spend(step_work, at);
    std::vector<frame> saved = std::move(frames_);
    frames_ = {saved[0], saved[1], frame{}};
    struct restore {
      renderer& r;
      std::vector<frame>& saved;
      ~restore() {
        r.frames_ = std::move(saved);
        --r.macro_depth_;
      }
    } guard{*this, saved};
    // the macro sees itself and the template's other macros defined so far
    for (auto it = saved.begin() + 2; it != saved.end(); ++it)
      for (const auto& [k, v] : *it)
        if (v.k == value::kind::func && v.macro) frames_.back()[k] = v;
    for (size_t i = 0; i < m.targets.size(); ++i) {
      const value* given = i < a.pos.size() ? &a.pos[i] : nullptr;
      if (!given)
        for (const auto& [k, v] : a.kw)
          if (k == m.targets[i]) given = &v;
      frames_.back()[m.targets[i]] = given ? *given : (m.conds[i] ? eval(*m.conds[i]) : value{});
    }
    std::string out;
    exec(m.main, out);
    return value::str_v(std::move(out));
  }

  static std::string case_map(const std::string& s, int how) {  // 0 lower, 1 upper (full Unicode, ICU)
    std::u32string u = utf8_decode(s);
    for (auto& c : u) c = static_cast<char32_t>(how ? u_toupper(static_cast<UChar32>(c)) : u_tolower(static_cast<UChar32>(c)));
    return utf8_encode(u);
  }

  static std::string py_title(const std::string& s, bool only_first) {
    std::u32string u = utf8_decode(s);
    bool prev_cased = false;
    for (size_t i = 0; i < u.size(); ++i) {
      UChar32 c = static_cast<UChar32>(u[i]);
      if (only_first) {
        u[i] = static_cast<char32_t>(i == 0 ? u_totitle(c) : u_tolower(c));
        continue;
      }
      u[i] = static_cast<char32_t>(prev_cased ? u_tolower(c) : u_totitle(c));
      prev_cased = u_hasBinaryProperty(c, UCHAR_CASED);  // Python: the original character is cased
    }
    return utf8_encode(u);
  }

  static list_t py_split(const std::string& s, const value* sep, int64_t maxsplit) {
    list_t out;
    if (!sep || sep->k == value::kind::none) {
      std::u32string u = utf8_decode(s);
      size_t i = 0;
      int64_t splits = 0;
      while (i < u.size()) {
        while (i < u.size() && py_isspace(u[i])) ++i;
        if (i >= u.size()) break;
        if (maxsplit >= 0 && splits >= maxsplit) {
          size_t e = u.size();
          while (e > i && py_isspace(u[e - 1])) --e;
          out.push_back(value::str_v(utf8_encode(u.substr(i, e - i))));
          return out;
        }
        size_t j = i;
        while (j < u.size() && !py_isspace(u[j])) ++j;
        out.push_back(value::str_v(utf8_encode(u.substr(i, j - i))));
        ++splits;
        i = j;
      }
      return out;
    }
    const std::string& d = sep->s;
    size_t p = 0;
    int64_t splits = 0;
    while (true) {
      size_t q = (maxsplit >= 0 && splits >= maxsplit) ? std::string::npos : s.find(d, p);
      if (q == std::string::npos) {
        out.push_back(value::str_v(s.substr(p)));
        return out;
      }
      out.push_back(value::str_v(s.substr(p, q - p)));
      p = q + d.size();
      ++splits;
    }
  }

  // s.replace(old, new[, count]) and the replace filter: py_replace within the render's limits
  value replace_call(const std::string& s, const args_t& a, pos at) {
    const value* c = a.get(2, "count");
    std::string out;
    try {
      out = py_replace(s, str_arg(a.get(0, "old"), at, "replace's old"), str_arg(a.get(1, "new"), at, "replace's new"),
                       c ? as_int(*c, at, "count") : -1, limits_.max_string);
    } catch (const std::length_error& err) {
      fail(at, err.what());
    }
    built(out.size(), at, "a replace result");
    return value::str_v(std::move(out));
  }

  // Python's str.replace; a result past `limit` bytes throws std::length_error as it grows
  static std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                                uint64_t limit) {
    std::string out;
    auto grown = [&] {
      if (out.size() > limit)
        throw std::length_error("replace: a result of more than " + std::to_string(limit) + " bytes");
    };
    if (from.empty()) {  // Python inserts `to` around every code point
      std::u32string u = utf8_decode(s);
      int64_t n = 0;
      for (char32_t c : u) {
        if (count < 0 || n < count) { out += to; ++n; }
        out += utf8_encode(std::u32string(1, c));
        grown();
      }
      if (count < 0 || n < count) out += to;
      grown();
      return out;
    }
    size_t p = 0;
    int64_t n = 0;
    while (true) {
      size_t q = (count >= 0 && n >= count) ? std::string::npos : s.find(from, p);
      if (q == std::string::npos) break;
      out += s.substr(p, q - p) + to;
      grown();
      p = q + from.size();
      ++n;
    }
    out += s.substr(p);
    grown();
    return out;
  }

  value call_method(const value& self, const std::string& n, const args_t& a, pos at) {
    if (self.k == value::kind::string) {
      const std::string& s = self.s;
      if (n == "strip" || n == "lstrip" || n == "rstrip") {
        const value* c = a.get(0, "chars");
        const std::string* chars = c && c->k == value::kind::string ? &c->s : nullptr;
        return value::str_v(py_strip(s, chars, n != "rstrip", n != "lstrip"));
      }
      if (n == "lower" || n == "upper") return value::str_v(case_map(s, n == "upper"));
      if (n == "title" || n == "capitalize") return value::str_v(py_title(s, n == "capitalize"));
      if (n == "startswith" || n == "endswith") {
        const value* p = a.get(0, "prefix");
        if (!p) fail(at, n + "() takes one argument");
        std::vector<std::string> cands;
        if (p->k == value::kind::string) cands.push_back(p->s);
        else if (p->k == value::kind::list)
          for (const auto& x : *p->l) cands.push_back(str_arg(&x, at, n + "'s argument"));
        else fail(at, n + "() takes a string or a tuple of strings");
        for (const auto& c : cands) {
          if (c.size() > s.size()) continue;
          if (n == "startswith" ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0)
            return value::boolean_v(true);
        }
        return value::boolean_v(false);
      }
      if (n == "split") {
        const value* m = a.get(1, "maxsplit");
        const value* sep = a.get(0, "sep");
        if (sep && sep->k != value::kind::none && sep->k != value::kind::string) fail(at, "split's separator must be a string");
        if (sep && sep->k == value::kind::string && sep->s.empty()) fail(at, "split: empty separator");
        return value::list_v(py_split(s, sep, m ? as_int(*m, at, "maxsplit") : -1));
      }
      if (n == "splitlines") {
        list_t out;
        size_t p = 0;
        while (p < s.size()) {
          size_t q = s.find('\n', p);
          if (q == std::string::npos) q = s.size();
          out.push_back(value::str_v(s.substr(p, q - p)));
          p = q + 1;
        }
        return value::list_v(std::move(out));
      }
      if (n == "replace") {
        return replace_call(s, a, at);
      }
      if (n == "find" || n == "count") {
        const std::string& sub = str_arg(a.get(0, "sub"), at, n + "'s argument");
        if (n == "find") {
          size_t q = s.find(sub);
          return value::int_v(q == std::string::npos ? -1 : static_cast<int64_t>(utf8_decode(s.substr(0, q)).size()));
        }
        if (sub.empty()) return value::int_v(static_cast<int64_t>(utf8_decode(s).size()) + 1);
        int64_t c = 0;
        for (size_t q = s.find(sub); q != std::string::npos; q = s.find(sub, q + sub.size())) ++c;
        return value::int_v(c);
      }
      if (n == "format") {
        // str.format with "{}", "{0}", "{name}" fields and "{{" / "}}" (no conversions or format specs)
        std::string out;
        size_t auto_idx = 0;
        int numbering = 0;  // 1 automatic ({}), 2 manual ({0}): Python refuses a mix
        for (size_t i = 0; i < s.size(); ++i) {
          char c = s[i];
          if (c == '}' && i + 1 < s.size() && s[i + 1] == '}') { out += '}'; ++i; continue; }
          if (c != '{') {
            if (c == '}') fail(at, "format: single '}' encountered in format string");
            out += c;
            continue;
          }
          if (i + 1 < s.size() && s[i + 1] == '{') { out += '{'; ++i; continue; }
          size_t e = s.find('}', i);
          if (e == std::string::npos) fail(at, "format: single '{' encountered in format string");
          std::string field = s.substr(i + 1, e - i - 1);
          if (field.find_first_of(":!.[") != std::string::npos)
            fail(at, "format: only plain {} / {N} / {name} fields are supported, not {" + field + "}");
          const value* v = nullptr;
          const bool numbered = !field.empty() && std::isdigit(static_cast<unsigned char>(field[0]));
          if (field.empty() || numbered) {
            int mode = field.empty() ? 1 : 2;
            if (numbering != 0 && numbering != mode)
              fail(at, "format: cannot switch between automatic and manual field numbering");
            numbering = mode;
          }
          if (field.empty()) {
            if (auto_idx >= a.pos.size()) fail(at, "format: not enough arguments");
            v = &a.pos[auto_idx++];
          } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
            size_t k = std::stoul(field);
            if (k >= a.pos.size()) fail(at, "format: no argument " + field);
            v = &a.pos[k];
          } else {
            for (const auto& [k, x] : a.kw)
              if (k == field) v = &x;
            if (!v) fail(at, "format: no argument named '" + field + "'");
          }
          out += to_str(*v);
          if (out.size() > limits_.max_string) built(out.size(), at, "a format result");
          i = e;
        }
        built(out.size(), at, "a format result");
        return value::str_v(std::move(out));
      }
      if (n == "join") {
        const value* it = a.get(0, "iterable");
        if (!it) fail(at, "join() takes one argument");
        std::string out;
        bool first = true;
        for (const auto& x : iterate(*it, at)) {
          if (x.k != value::kind::string) fail(at, "join: expected str instance, " + type_name(x) + " found");
          if (!first) out += s;
          first = false;
          out += x.s;
          if (out.size() > limits_.max_string) built(out.size(), at, "a join result");
        }
        built(out.size(), at, "a join result");
        return value::str_v(std::move(out));
      }
      fail(at, "unsupported string method '" + n + "'");
    }
    if (self.k == value::kind::dict) {
      if (n == "items") {
        list_t out;
        for (const auto& [k, v] : *self.m) out.push_back(value::tuple_v({value::str_v(k), v}));
        return value::list_v(std::move(out));
      }
      if (n == "keys" || n == "values") {
        list_t out;
        for (const auto& [k, v] : *self.m) out.push_back(n == "keys" ? value::str_v(k) : v);
        return value::list_v(std::move(out));
      }
      if (n == "get") {
        const value* k = a.get(0, "key");
        if (!k) fail(at, "get() takes a key");
        if (k->k == value::kind::string)
          if (const value* v = self.find(k->s)) return *v;
        const value* d = a.get(1, "default");
        return d ? *d : value::none_v();
      }
    }
    fail(at, "unsupported method '" + n + "' of a " + type_name(self));
  }

  // ---- filters ----
  value attr_path(const value& item, const std::string& path, pos at) const {
    value v = item;
    size_t p = 0;
    while (true) {
      size_t q = path.find('.', p);
      std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      v = digits ? get_item(v, value::int_v(std::stoll(part)), at) : get_item(v, value::str_v(part), at);
      if (q == std::string::npos) return v;
      p = q + 1;
    }
  }

  bool run_test(const std::string& name, const value& v, const list_t& args, pos at) {
    auto arg = [&](size_t i) -> const value& {
      if (i >= args.size()) fail(at, "test '" + name + "' needs an argument");
      return args[i];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.k == value::kind::none;
    if (name == "string") return v.k == value::kind::string;
    if (name == "number") return v.is_number();
    if (name == "integer") return v.k == value::kind::integer;
    if (name == "float") return v.k == value::kind::real;
    if (name == "boolean") return v.k == value::kind::boolean;
    if (name == "true") return v.k == value::kind::boolean && v.b;
    if (name == "false") return v.k == value::kind::boolean && !v.b;
    if (name == "mapping") return v.k == value::kind::dict;
    if (name == "iterable")
      return v.k == value::kind::string || v.k == value::kind::list || v.k == value::kind::dict || v.is_undefined();
    if (name == "sequence") return v.k == value::kind::string || v.k == value::kind::list || v.k == value::kind::dict;
    if (name == "callable") return v.k == value::kind::func;
    if (name == "odd" || name == "even") {
      int64_t x = as_int(v, at, "the value of 'odd'/'even'");
      return (((x % 2) + 2) % 2 == 1) == (name == "odd");
    }
    if (name == "divisibleby") {
      int64_t d = as_int(arg(0), at, "divisibleby's argument");
      if (d == 0) fail(at, "divisibleby 0");
      return as_int(v, at, "the value of 'divisibleby'") % d == 0;
    }
    if (name == "equalto" || name == "eq" || name == "==") return equals(v, arg(0));
    if (name == "ne" || name == "!=") return !equals(v, arg(0));
    if (name == "sameas") return equals(v, arg(0)) && v.k == arg(0).k;
    if (name == "in") {
      expr dummy;
      dummy.at = at;
      return contains(arg(0), v, dummy);
    }
    if (name == "lower" || name == "upper")
      return v.k == value::kind::string && case_map(v.s, name == "upper") == v.s;
    // lt / le / gt / ge
    const value& b = arg(0);
    if (!(v.is_number() && b.is_number()) && !(v.k == value::kind::string && b.k == value::kind::string))
      fail(at, "test '" + name + "' compares a " + type_name(v) + " with a " + type_name(b));
    int c;
    if (v.is_number()) {
      double x = as_double(v), y = as_double(b);
      c = x < y ? -1 : x > y ? 1 : 0;
    } else c = v.s < b.s ? -1 : v.s > b.s ? 1 : 0;
    if (name == "lt" || name == "<") return c < 0;
    if (name == "le" || name == "<=") return c <= 0;
    if (name == "gt" || name == ">") return c > 0;
    return c >= 0;
  }

  bool test(const expr& e) {
    value v = eval(*e.a);
    list_t args;
    for (const auto& x : e.args) args.push_back(eval(*x));
    return run_test(e.name, v, args, e.at);
  }

  value filter(const expr& e) {
    value v = eval(*e.a);
    args_t a = eval_args(e);
    const std::string& n = e.name;
    pos at = e.at;
    auto need_str = [&](const value& x) -> std::string { return to_str(x); };
    if (n == "safe") return v;
    if (n == "trim") {
      const value* c = a.get(0, "chars");
      const std::string* chars = c && c->k == value::kind::string ? &c->s : nullptr;
      return value::str_v(py_strip(need_str(v), chars, true, true));
    }
    if (n == "length" || n == "count") {
      switch (v.k) {
        case value::kind::undefined: return value::int_v(0);
        case value::kind::string: return value::int_v(static_cast<int64_t>(utf8_decode(v.s).size()));
        case value::kind::list: return value::int_v(static_cast<int64_t>(v.l->size()));
        case value::kind::dict:
        case value::kind::ns: return value::int_v(static_cast<int64_t>(v.m->size()));
        default: fail(at, "object of type '" + type_name(v) + "' has no len()");
      }
    }
    if (n == "tojson") {
      int indent = -1;
      if (const value* i = a.get(0, "indent"); i && i->k != value::kind::none) {
        const int64_t want = as_int(*i, at, "indent");
        if (want > 1024) fail(at, "tojson: indent " + std::to_string(want) + " is more than 1024");  // per level
        indent = static_cast<int>(want);
      }
      if (const value* sep = a.get(2, "separators"); sep && sep->k != value::kind::none)
        fail(at, "tojson: separators are not supported");
      bool sort_keys = false;
      if (const value* s = a.get(3, "sort_keys")) sort_keys = truthy(*s);
      try {
        std::string out = to_json_text(v, indent, sort_keys);
        built(out.size(), at, "a tojson result");
        return value::str_v(std::move(out));
      } catch (const std::runtime_error& err) {
        fail(at, std::string("tojson: ") + err.what());
      }
    }
    if (n == "default" || n == "d") {
      const value* dv = a.get(0, "default_value");
      const value* boolean = a.get(1, "boolean");
      bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      if (use) return dv ? *dv : value::str_v("");
      return v;
    }
    if (n == "upper" || n == "lower") return value::str_v(case_map(need_str(v), n == "upper"));
    if (n == "capitalize" || n == "title") return value::str_v(py_title(need_str(v), n == "capitalize"));
    if (n == "first" || n == "last") {
      list_t l = iterate(v, at);
      if (l.empty()) return value{};
      return n == "first" ? l.front() : l.back();
    }
    if (n == "join") {
      const value* sep = a.get(0, "d");
      const value* attr = a.get(1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& x : iterate(v, at)) {
        if (!first) out += sep ? to_str(*sep) : "";
        first = false;
        out += to_str(attr ? attr_path(x, to_str(*attr), at) : x);
        if (out.size() > limits_.max_string) built(out.size(), at, "a join result");
      }
      built(out.size(), at, "a join result");
      return value::str_v(std::move(out));
    }
    if (n == "items") {
      if (v.is_undefined()) return value::list_v();
      if (v.k != value::kind::dict) fail(at, "items: expected a mapping, got " + type_name(v));
      list_t out;
      for (const auto& [k, x] : *v.m) out.push_back(value::tuple_v({value::str_v(k), x}));
      return value::list_v(std::move(out));
    }
    if (n == "list") return value::list_v(iterate(v, at));
    if (n == "reverse") {
      if (v.k == value::kind::string) {
        std::u32string u = utf8_decode(v.s);
        std::reverse(u.begin(), u.end());
        return value::str_v(utf8_encode(u));
      }
      list_t l = iterate(v, at);
      std::reverse(l.begin(), l.end());
      return value::list_v(std::move(l));
    }
    if (n == "string") return value::str_v(to_str(v));
    if (n == "int") {
      if (v.k == value::kind::integer) return v;
      if (v.k == value::kind::boolean) return value::int_v(v.b);
      if (v.k == value::kind::real) return value::int_v(static_cast<int64_t>(v.d));
      if (v.k == value::kind::string) {
        try {
          size_t used = 0;
          std::string t = py_strip(v.s, nullptr, true, true);
          int64_t x = std::stoll(t, &used);
          if (used == t.size()) return value::int_v(x);
          return value::int_v(static_cast<int64_t>(std::stod(t)));
        } catch (...) {
        }
      }
      const value* d = a.get(0, "default");
      return d ? *d : value::int_v(0);
    }
    if (n == "float") {
      if (v.is_number()) return value::real_v(as_double(v));
      if (v.k == value::kind::string) {
        try {
          return value::real_v(std::stod(v.s));
        } catch (...) {
        }
      }
      const value* d = a.get(0, "default");
      return d ? *d : value::real_v(0.0);
    }
    if (n == "abs") {
      if (v.k == value::kind::real) return value::real_v(std::fabs(v.d));
      return value::int_v(std::llabs(as_int(v, at, "abs's value")));
    }
    if (n == "replace") {
      return replace_call(need_str(v), a, at);
    }
    if (n == "selectattr" || n == "rejectattr" || n == "select" || n == "reject") {
      bool by_attr = n == "selectattr" || n == "rejectattr";
      bool keep_if = n == "selectattr" || n == "select";
      size_t first = by_attr ? 1 : 0;
      std::string attr;
      if (by_attr) {
        if (a.pos.empty() || a.pos[0].k != value::kind::string) fail(at, n + " needs an attribute name");
        attr = a.pos[0].s;
      }
      std::string tname;
      list_t targs;
      if (a.pos.size() > first) {
        if (a.pos[first].k != value::kind::string) fail(at, n + ": the test's name must be a string");
        tname = a.pos[first].s;
        if (!known_test(tname)) fail(at, n + ": unsupported test '" + tname + "'");
        targs.assign(a.pos.begin() + static_cast<long>(first) + 1, a.pos.end());
      }
      list_t out;
      if (!truthy(v)) return value::list_v();  // Jinja2's select_or_reject: `if value:` (None gives nothing)
      for (const auto& x : iterate(v, at)) {
        value probe = by_attr ? attr_path(x, attr, at) : x;
        bool r = tname.empty() ? truthy(probe) : run_test(tname, probe, targs, at);
        if (r == keep_if) out.push_back(x);
      }
      return value::list_v(std::move(out));
    }
    if (n == "map") {
      list_t out;
      if (!truthy(v)) return value::list_v();  // Jinja2's do_map: `if value:`
      if (const value* attr = a.get(99, "attribute")) {
        const value* dflt = a.get(99, "default");
        for (const auto& x : iterate(v, at)) {
          value r = attr_path(x, to_str(*attr), at);
          out.push_back(r.is_undefined() && dflt ? *dflt : r);
        }
        return value::list_v(std::move(out));
      }
      if (a.pos.empty() || a.pos[0].k != value::kind::string) fail(at, "map needs attribute= or a filter name");
      const std::string& fname = a.pos[0].s;
      if (fname != "string" && fname != "trim" && fname != "upper" && fname != "lower" && fname != "length" &&
          fname != "tojson" && fname != "int" && fname != "float")
        fail(at, "map: unsupported filter '" + fname + "'");
      for (const auto& x : iterate(v, at)) {
        expr lit;
        lit.k = expr::kind::literal;
        lit.at = at;
        lit.lit = x;
        expr f;
        f.k = expr::kind::filter;
        f.at = at;
        f.name = fname;
        f.a = std::make_unique<expr>(std::move(lit));
        out.push_back(filter(f));
      }
      return value::list_v(std::move(out));
    }
    if (n == "sort" || n == "dictsort") {
      // Jinja2: strings compare case-insensitively unless case_sensitive; dictsort gives (key, value) pairs
      const bool dict_sort = n == "dictsort";
      const value* rev = a.get(dict_sort ? 2 : 0, "reverse");
      const value* cs = a.get(dict_sort ? 0 : 1, "case_sensitive");
      const value* attr = dict_sort ? nullptr : a.get(2, "attribute");
      const value* by = dict_sort ? a.get(1, "by") : nullptr;
      const bool by_value = by && by->k == value::kind::string && by->s == "value";
      list_t items;
      if (dict_sort) {
        if (v.k != value::kind::dict) fail(at, "dictsort: expected a mapping, got " + type_name(v));
        for (const auto& [k, x] : *v.m) items.push_back(value::tuple_v({value::str_v(k), x}));
      } else {
        items = iterate(v, at);
      }
      auto key = [&](const value& x) {
        value k = dict_sort ? (*x.l)[by_value ? 1 : 0] : attr ? attr_path(x, to_str(*attr), at) : x;
        if (k.k == value::kind::string && !(cs && truthy(*cs))) k.s = case_map(k.s, 0);
        return k;
      };
      auto less = [&](const value& x, const value& y) {
        value kx = key(x), ky = key(y);
        if (kx.is_number() && ky.is_number()) return as_double(kx) < as_double(ky);
        if (kx.k == value::kind::string && ky.k == value::kind::string) return kx.s < ky.s;
        fail(at, n + ": cannot compare a " + type_name(kx) + " with a " + type_name(ky));
      };
      std::stable_sort(items.begin(), items.end(), less);
      if (rev && truthy(*rev)) {
        // Python's sorted(reverse=True) keeps equal items in their order
        std::stable_sort(items.begin(), items.end(), [&](const value& x, const value& y) { return less(y, x); });
      }
      return value::list_v(std::move(items));
    }
    if (n == "unique") {
      list_t out;
      for (const auto& x : iterate(v, at)) {
        bool seen = false;
        for (const auto& y : out) seen = seen || equals(x, y);
        if (!seen) out.push_back(x);
      }
      return value::list_v(std::move(out));
    }
    if (n == "min" || n == "max" || n == "sum") {
      list_t l = iterate(v, at);
      if (n == "sum") {
        value acc = value::int_v(0);
        for (const auto& x : l) {
          if (!x.is_number()) fail(at, "sum: unsupported operand type '" + type_name(x) + "'");
          acc = (acc.k == value::kind::real || x.k == value::kind::real) ? value::real_v(as_double(acc) + as_double(x))
                                                                        : value::int_v(as_i(acc) + as_i(x));
        }
        return acc;
      }
      if (l.empty()) return value{};
      value best = l[0];
      for (const auto& x : l) {
        bool less;
        if (x.is_number() && best.is_number()) less = as_double(x) < as_double(best);
        else if (x.k == value::kind::string && best.k == value::kind::string) less = x.s < best.s;
        else fail(at, n + ": values of different types");
        if ((n == "min") == less && !equals(x, best)) best = x;
      }
      return best;
    }
    fail(at, "unsupported filter '" + n + "' (docs/chat_templates.md lists the supported ones)");
  }

  const template_root& root_;
  const chat_render_limits limits_;
  uint64_t work_ = 0;  // spent of limits_.max_work
  std::vector<frame> frames_;
  int macro_depth_ = 0;
};

}  // namespace

bool known_filter(const std::string& name) {
  static const std::set<std::string> implemented = {
      "trim", "length", "count", "tojson", "default", "d", "upper", "lower", "capitalize", "title", "first", "last",
      "join", "items", "list", "string", "int", "float", "abs", "selectattr", "rejectattr", "select", "reject", "map",
      "replace", "safe", "reverse", "unique", "min", "max", "sum", "sort", "dictsort"};
  return implemented.count(name) > 0;
}
bool known_test(const std::string& name) { return test_names().count(name) > 0; }

}  // namespace flowrun::chat

namespace flowrun {

chat_template chat_template::parse(const std::string& source, const std::string& name) {
  auto impl = std::make_shared<chat::template_impl>();
  try {
    impl->root = chat::parse_template(source, name);
  } catch (const chat_template_error&) {
    throw;
  } catch (const std::exception& e) {  // as render: every failure is the template's, named
    throw chat_template_error(name + ": " + e.what());
  }
  chat_template t;
  t.impl_ = std::move(impl);
  return t;
}

std::string chat_template::render(const nlohmann::ordered_json& variables, const chat_render_limits& limits) const {
  if (!impl_) throw chat_template_error("chat template: render of an empty (never parsed) template");
  try {
    chat::renderer r(*impl_->root, variables, limits);
    return r.run();
  } catch (const chat_template_error&) {
    throw;
  } catch (const std::exception& e) {  // e.g. a string that is not UTF-8
    throw chat_template_error(impl_->root->name + ": " + e.what());
  }
}

const std::string& chat_template::name() const {
  static const std::string none;
  return impl_ ? impl_->root->name : none;
}

}  // namespace flowrun
