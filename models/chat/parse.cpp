// Lexer and parser of the chat-template subset (models/chat_template.h).
//
// Whitespace follows Jinja2's lexer with transformers' settings (jinja2/lexer.py, Jinja2 3.1):
//   - one trailing newline of the source is dropped (keep_trailing_newline=False), \r\n and \r read as \n;
//   - `{%-` / `{{-` / `{#-` strip all whitespace before the tag, `-%}` / `-}}` / `-#}` all after it;
//   - trim_blocks: the first newline after `%}` or `#}` is removed (not after `+%}`);
//   - lstrip_blocks: spaces and tabs from the start of a line up to `{%` or `{#` are removed (not
//     before `{%+`, not before `{{`). "Start of a line" includes the start of the template and the
//     text right after a tag whose end consumed a newline.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "models/chat/ast.h"
#include "models/chat_template.h"

namespace flowrun::chat {
namespace {

struct token {
  enum class kind { name, str, integer, real, op, end };
  kind k;
  std::string text;
  pos at;
};

[[noreturn]] void fail(const std::string& name, pos at, const std::string& msg) {
  throw chat_template_error(name + ":" + std::to_string(at.line) + ":" + std::to_string(at.col) + ": " + msg);
}

bool is_ws(char32_t c) { return py_isspace(c); }

/// Strip trailing whitespace (Python str.rstrip) of UTF-8 text.
std::string rstrip_ws(const std::string& s) { return py_strip(s, nullptr, false, true); }

class lexer {
 public:
  lexer(const std::string& src, const std::string& name) : name_(name) {
    // newline normalisation and the dropped trailing newline (keep_trailing_newline=False)
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else src_ += src[i];
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  /// The next piece: a text run, or a tag's tokens. Returns false at the end.
  struct piece {
    enum class kind { text, output, block } k;
    std::string text;
    std::vector<token> toks;
    pos at;
  };

  bool next(piece& out) {
    if (p_ >= src_.size()) return false;
    // the next tag start
    size_t t = p_;
    while (true) {
      t = src_.find('{', t);
      if (t == std::string::npos || t + 1 >= src_.size()) { t = std::string::npos; break; }
      char c = src_[t + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++t;
    }
    if (t != p_) {
      // text up to the tag (or the end); the strip rules of the tag that follows apply to it
      std::string text = src_.substr(p_, (t == std::string::npos ? src_.size() : t) - p_);
      pos at = pos_of(p_);
      if (t != std::string::npos) {
        char kind = src_[t + 1];
        char sign = t + 2 < src_.size() ? src_[t + 2] : 0;
        if (sign == '-') text = rstrip_ws(text);
        else if (sign != '+' && kind != '{') {
          size_t l = text.rfind('\n');
          size_t lpos = l == std::string::npos ? 0 : l + 1;
          if (lpos > 0 || line_starting_) {
            bool all_ws = lpos < text.size();
            for (size_t i = lpos; i < text.size(); ++i)
              if (text[i] != ' ' && text[i] != '\t' && text[i] != '\v' && text[i] != '\f') all_ws = false;
            if (all_ws) text.resize(lpos);
          }
        }
      }
      p_ = t == std::string::npos ? src_.size() : t;
      line_starting_ = false;
      if (!text.empty()) {
        out = piece{piece::kind::text, std::move(text), {}, at};
        return true;
      }
      if (p_ >= src_.size()) return false;
    }
    // a tag at p_
    pos at = pos_of(p_);
    char kind = src_[p_ + 1];
    p_ += 2;
    if (p_ < src_.size() && (src_[p_] == '-' || src_[p_] == '+')) ++p_;
    if (kind == '#') {
      size_t e = src_.find("#}", p_);
      if (e == std::string::npos) fail(name_, at, "comment not closed ('#}' missing)");
      bool minus = e > p_ && src_[e - 1] == '-';
      bool plus = e > p_ && src_[e - 1] == '+';
      p_ = e + 2;
      after_tag(minus, !plus);
      return next(out);
    }
    out = piece{kind == '{' ? piece::kind::output : piece::kind::block, {}, {}, at};
    const std::string close = kind == '{' ? "}}" : "%}";
    while (true) {
      skip_space();
      if (p_ >= src_.size()) fail(name_, at, std::string("tag not closed ('") + close + "' missing)");
      // the tag's end: -}} / }} or -%} / +%} / %}
      char c = src_[p_];
      if ((c == '-' || c == '+') && src_.compare(p_ + 1, 2, close) == 0) {
        p_ += 3;
        after_tag(c == '-', kind == '%' && c != '+');
        break;
      }
      if (src_.compare(p_, 2, close) == 0) {
        p_ += 2;
        after_tag(false, kind == '%');
        break;
      }
      out.toks.push_back(lex_token());
    }
    out.toks.push_back(token{token::kind::end, "", pos_of(p_)});
    return true;
  }

 private:
  void after_tag(bool minus, bool trim_newline) {
    if (minus) {
      size_t q = p_;
      // strip every following whitespace code point (Jinja2: `\s*` after `-%}`)
      std::u32string rest;
      while (q < src_.size()) {
        unsigned char ch = static_cast<unsigned char>(src_[q]);
        size_t n = ch < 0x80 ? 1 : (ch >> 5) == 0x6 ? 2 : (ch >> 4) == 0xe ? 3 : 4;
        std::u32string cp = utf8_decode(src_.substr(q, n));
        if (cp.empty() || !is_ws(cp[0])) break;
        q += n;
      }
      line_starting_ = q > p_ && src_[q - 1] == '\n';
      p_ = q;
    } else if (trim_newline && p_ < src_.size() && src_[p_] == '\n') {
      ++p_;
      line_starting_ = true;
    } else {
      line_starting_ = false;
    }
  }

  void skip_space() {
    while (p_ < src_.size() && (src_[p_] == ' ' || src_[p_] == '\t' || src_[p_] == '\n' || src_[p_] == '\r' ||
                                src_[p_] == '\v' || src_[p_] == '\f'))
      ++p_;
  }

  pos pos_of(size_t at) {
    // incremental line/column (positions asked in increasing order)
    if (at < lc_at_) { lc_at_ = 0; lc_ = pos{}; }
    for (; lc_at_ < at; ++lc_at_) {
      if (src_[lc_at_] == '\n') { ++lc_.line; lc_.col = 1; }
      else if ((static_cast<unsigned char>(src_[lc_at_]) & 0xc0) != 0x80) ++lc_.col;
    }
    return lc_;
  }

  token lex_token() {
    pos at = pos_of(p_);
    char c = src_[p_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = p_;
      while (p_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p_])) || src_[p_] == '_')) ++p_;
      return token{token::kind::name, src_.substr(b, p_ - b), at};
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t b = p_;
      bool real = false;
      while (p_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p_])) || src_[p_] == '_')) ++p_;
      if (p_ + 1 < src_.size() && src_[p_] == '.' && std::isdigit(static_cast<unsigned char>(src_[p_ + 1]))) {
        real = true;
        ++p_;
        while (p_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p_])) || src_[p_] == '_')) ++p_;
      }
      if (p_ < src_.size() && (src_[p_] == 'e' || src_[p_] == 'E')) {
        size_t q = p_ + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
          real = true;
          p_ = q;
          while (p_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p_]))) ++p_;
        }
      }
      std::string t;
      for (size_t i = b; i < p_; ++i)
        if (src_[i] != '_') t += src_[i];
      return token{real ? token::kind::real : token::kind::integer, t, at};
    }
    if (c == '\'' || c == '"') return lex_string(at);
    static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                                "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
    for (const char* op : ops) {
      size_t n = std::char_traits<char>::length(op);
      if (src_.compare(p_, n, op) == 0) {
        p_ += n;
        return token{token::kind::op, op, at};
      }
    }
    fail(name_, at, std::string("unexpected character '") + c + "'");
  }

  // Python string literal escapes, as Jinja2 reads them (str.encode("unicode-escape") round trip).
  token lex_string(pos at) {
    char q = src_[p_++];
    std::string out;
    while (true) {
      if (p_ >= src_.size()) fail(name_, at, "string literal not closed");
      char c = src_[p_++];
      if (c == q) break;
      if (c != '\\') { out += c; continue; }
      if (p_ >= src_.size()) fail(name_, at, "string literal not closed");
      char e = src_[p_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '0': out += '\0'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p_ + n > src_.size()) fail(name_, at, "truncated \\" + std::string(1, e) + " escape");
          std::string hex = src_.substr(p_, n);
          for (char h : hex)
            if (!std::isxdigit(static_cast<unsigned char>(h))) fail(name_, at, "bad \\" + std::string(1, e) + " escape");
          p_ += n;
          out += utf8_encode(std::u32string(1, static_cast<char32_t>(std::strtoul(hex.c_str(), nullptr, 16))));
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes
      }
    }
    return token{token::kind::str, out, at};
  }

  std::string src_;
  const std::string& name_;
  size_t p_ = 0;
  bool line_starting_ = true;
  size_t lc_at_ = 0;
  pos lc_{};
};

class parser {
 public:
  parser(const std::string& src, const std::string& name) : lex_(src, name), name_(name) {}

  std::unique_ptr<template_root> run() {
    auto root = std::make_unique<template_root>();
    root->name = name_;
    std::string end_tag;
    parse_body(root->main, {}, end_tag);
    return root;
  }

 private:
  // ---- statements ----
  // Parses statements until a block tag whose name is in `stops` (its name returned in `stop`, its
  // tokens left in cur_ after the name). At the end of the template `stop` is empty.
  void parse_body(body& out, const std::vector<std::string>& stops, std::string& stop) {
    lexer::piece pc;
    while (lex_.next(pc)) {
      if (pc.k == lexer::piece::kind::text) {
        auto s = std::make_unique<stmt>();
        s->k = stmt::kind::text;
        s->at = pc.at;
        s->text = std::move(pc.text);
        out.push_back(std::move(s));
        continue;
      }
      toks_ = std::move(pc.toks);
      i_ = 0;
      if (pc.k == lexer::piece::kind::output) {
        auto s = std::make_unique<stmt>();
        s->k = stmt::kind::output;
        s->at = pc.at;
        s->e = parse_expr();
        expect_end();
        out.push_back(std::move(s));
        continue;
      }
      const token& t = peek();
      if (t.k != token::kind::name) fail(name_, t.at, "a block tag must start with a name");
      std::string tag = t.text;
      for (const auto& st : stops)
        if (tag == st) {
          ++i_;
          stop = tag;
          return;
        }
      ++i_;
      out.push_back(parse_statement(tag, pc.at));
    }
    if (!stops.empty()) fail(name_, pc.at, "unexpected end of template: '{% " + stops.back() + " %}' missing");
    stop.clear();
  }

  std::unique_ptr<stmt> parse_statement(const std::string& tag, pos at) {
    depth_guard guard(*this, at);
    auto s = std::make_unique<stmt>();
    s->at = at;
    if (tag == "for") {
      s->k = stmt::kind::for_loop;
      s->targets = parse_targets();
      expect_name("in");
      s->e = parse_expr(/*no_cond=*/true);
      if (accept_name("if")) s->cond = parse_expr();
      if (peek().k == token::kind::name && peek().text == "recursive")
        fail(name_, peek().at, "unsupported: recursive for loops");
      expect_end();
      std::string stop;
      parse_body(s->main, {"else", "endfor"}, stop);
      if (stop == "else") {
        expect_end();
        parse_body(s->else_body, {"endfor"}, stop);
      }
      expect_end();
    } else if (tag == "if") {
      s->k = stmt::kind::if_chain;
      s->conds.push_back(parse_expr());
      expect_end();
      while (true) {
        std::string stop;
        s->bodies.emplace_back();
        parse_body(s->bodies.back(), {"elif", "else", "endif"}, stop);
        if (stop == "elif") {
          s->conds.push_back(parse_expr());
          expect_end();
          continue;
        }
        if (stop == "else") {
          expect_end();
          parse_body(s->else_body, {"endif"}, stop);
        }
        expect_end();
        break;
      }
    } else if (tag == "set") {
      s->k = stmt::kind::set;
      const token& t = peek();
      if (t.k != token::kind::name) fail(name_, t.at, "set: expected a name");
      if (peek(1).k == token::kind::op && peek(1).text == ".") {
        s->targets.push_back(t.text);
        i_ += 2;
        if (peek().k != token::kind::name) fail(name_, peek().at, "set: expected an attribute name after '.'");
        s->attr_target = peek().text;
        ++i_;
      } else {
        s->targets = parse_targets();
      }
      if (accept_op("=")) {
        s->e = parse_tuple_or_expr();
        expect_end();
      } else {
        if (s->targets.size() != 1 || !s->attr_target.empty())
          fail(name_, peek().at, "set: a block set takes one plain name");
        expect_end();
        std::string stop;
        parse_body(s->main, {"endset"}, stop);
        expect_end();
      }
    } else if (tag == "generation") {
      s->k = stmt::kind::generation;
      expect_end();
      std::string stop;
      parse_body(s->main, {"endgeneration"}, stop);
      expect_end();
    } else if (tag == "macro") {
      s->k = stmt::kind::macro;
      if (peek().k != token::kind::name) fail(name_, peek().at, "macro: expected its name");
      s->text = peek().text;
      ++i_;
      expect_op("(");
      while (!accept_op(")")) {
        if (!s->targets.empty()) {
          expect_op(",");
          if (accept_op(")")) break;
        }
        if (peek().k != token::kind::name) fail(name_, peek().at, "macro: expected a parameter name");
        s->targets.push_back(peek().text);
        ++i_;
        s->conds.push_back(accept_op("=") ? parse_expr() : nullptr);
      }
      expect_end();
      std::string stop;
      parse_body(s->main, {"endmacro"}, stop);
      if (peek().k == token::kind::name && peek().text == s->text) ++i_;  // {% endmacro name %}
      expect_end();
    } else if (tag == "break" || tag == "continue") {
      s->k = tag == "break" ? stmt::kind::brk : stmt::kind::cont;
      expect_end();
    } else {
      fail(name_, at,
           "unsupported tag '{% " + tag +
               " %}' (supported: for, if/elif/else, set, macro, generation, break, continue; docs/chat_templates.md)");
    }
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = accept_op("(");
    do {
      const token& t = peek();
      if (t.k != token::kind::name) fail(name_, t.at, "expected a variable name");
      names.push_back(t.text);
      ++i_;
    } while (accept_op(","));
    if (paren) expect_op(")");
    return names;
  }

  // ---- expressions (Jinja2's precedence: parser.py) ----
  expr_ptr node(expr::kind k, pos at) {
    auto e = std::make_unique<expr>();
    e->k = k;
    e->at = at;
    return e;
  }

  // `a, b` without brackets (set's right side) builds a tuple
  expr_ptr parse_tuple_or_expr() {
    pos at = peek().at;
    auto first = parse_expr();
    if (!(peek().k == token::kind::op && peek().text == ",")) return first;
    auto t = node(expr::kind::tuple, at);
    t->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (at_end()) break;
      t->args.push_back(parse_expr());
    }
    return t;
  }

  expr_ptr parse_expr(bool no_cond = false) {
    auto e = parse_or();
    if (no_cond) return e;
    while (peek().k == token::kind::name && peek().text == "if") {
      pos at = peek().at;
      ++i_;
      auto c = node(expr::kind::cond, at);
      c->a = parse_or();
      c->b = std::move(e);
      if (accept_name("else")) c->c = parse_expr();
      e = std::move(c);
    }
    return e;
  }

  expr_ptr binary(const std::string& op, expr_ptr l, expr_ptr r, pos at) {
    auto e = node(expr::kind::binary, at);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  expr_ptr parse_or() {
    auto e = parse_and();
    while (peek().k == token::kind::name && peek().text == "or") {
      pos at = peek().at;
      ++i_;
      e = binary("or", std::move(e), parse_and(), at);
    }
    return e;
  }
  expr_ptr parse_and() {
    auto e = parse_not();
    while (peek().k == token::kind::name && peek().text == "and") {
      pos at = peek().at;
      ++i_;
      e = binary("and", std::move(e), parse_not(), at);
    }
    return e;
  }
  expr_ptr parse_not() {
    if (peek().k == token::kind::name && peek().text == "not") {
      pos at = peek().at;
      depth_guard guard(*this, at);
      ++i_;
      auto e = node(expr::kind::unary, at);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  expr_ptr parse_compare() {
    auto e = parse_math1();
    while (true) {
      const token& t = peek();
      pos at = t.at;
      std::string op;
      if (t.k == token::kind::op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                     t.text == "<=" || t.text == ">=")) {
        op = t.text;
        ++i_;
      } else if (t.k == token::kind::name && t.text == "in") {
        op = "in";
        ++i_;
      } else if (t.k == token::kind::name && t.text == "not" && peek(1).k == token::kind::name && peek(1).text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        break;
      }
      e = binary(op, std::move(e), parse_math1(), at);
    }
    return e;
  }
  expr_ptr parse_math1() {
    auto e = parse_concat();
    while (peek().k == token::kind::op && (peek().text == "+" || peek().text == "-")) {
      pos at = peek().at;
      std::string op = peek().text;
      ++i_;
      e = binary(op, std::move(e), parse_concat(), at);
    }
    return e;
  }
  expr_ptr parse_concat() {
    auto e = parse_math2();
    while (peek().k == token::kind::op && peek().text == "~") {
      pos at = peek().at;
      ++i_;
      e = binary("~", std::move(e), parse_math2(), at);
    }
    return e;
  }
  expr_ptr parse_math2() {
    auto e = parse_pow();
    while (peek().k == token::kind::op &&
           (peek().text == "*" || peek().text == "/" || peek().text == "//" || peek().text == "%")) {
      pos at = peek().at;
      std::string op = peek().text;
      ++i_;
      e = binary(op, std::move(e), parse_pow(), at);
    }
    return e;
  }
  expr_ptr parse_pow() {
    auto e = parse_unary();
    while (peek().k == token::kind::op && peek().text == "**") {
      pos at = peek().at;
      ++i_;
      e = binary("**", std::move(e), parse_unary(), at);
    }
    return e;
  }
  expr_ptr parse_unary(bool with_filter = true) {
    const token& t = peek();
    depth_guard guard(*this, t.at);
    expr_ptr e;
    if (t.k == token::kind::op && (t.text == "-" || t.text == "+")) {
      pos at = t.at;
      std::string op = t.text;
      ++i_;
      e = node(expr::kind::unary, at);
      e->name = op;
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  expr_ptr parse_primary() {
    const token& t = peek();
    pos at = t.at;
    switch (t.k) {
      case token::kind::name: {
        ++i_;
        auto e = node(expr::kind::literal, at);
        if (t.text == "true" || t.text == "True") e->lit = value::boolean_v(true);
        else if (t.text == "false" || t.text == "False") e->lit = value::boolean_v(false);
        else if (t.text == "none" || t.text == "None") e->lit = value::none_v();
        else {
          e->k = expr::kind::name;
          e->name = t.text;
        }
        return e;
      }
      case token::kind::str: {
        std::string s;
        while (peek().k == token::kind::str) s += toks_[i_++].text;  // adjacent literals concatenate
        auto e = node(expr::kind::literal, at);
        e->lit = value::str_v(std::move(s));
        return e;
      }
      case token::kind::integer: {
        ++i_;
        auto e = node(expr::kind::literal, at);
        e->lit = value::int_v(int_literal(t.text, at));
        return e;
      }
      case token::kind::real: {
        ++i_;
        auto e = node(expr::kind::literal, at);
        e->lit = value::real_v(real_literal(t.text, at));
        return e;
      }
      case token::kind::op:
        if (t.text == "(") {
          ++i_;
          if (accept_op(")")) return node(expr::kind::tuple, at);
          auto first = parse_expr();
          if (accept_op(")")) return first;
          auto tu = node(expr::kind::tuple, at);
          tu->args.push_back(std::move(first));
          while (accept_op(",")) {
            if (peek().k == token::kind::op && peek().text == ")") break;
            tu->args.push_back(parse_expr());
          }
          expect_op(")");
          return tu;
        }
        if (t.text == "[") {
          ++i_;
          auto l = node(expr::kind::list, at);
          while (!accept_op("]")) {
            if (!l->args.empty()) {
              expect_op(",");
              if (accept_op("]")) break;
            }
            l->args.push_back(parse_expr());
          }
          return l;
        }
        if (t.text == "{") {
          ++i_;
          auto d = node(expr::kind::dict, at);
          while (!accept_op("}")) {
            if (!d->args.empty()) {
              expect_op(",");
              if (accept_op("}")) break;
            }
            d->args.push_back(parse_expr());
            expect_op(":");
            d->vals.push_back(parse_expr());
          }
          return d;
        }
        break;
      default: break;
    }
    fail(name_, at, t.k == token::kind::end ? "expected an expression" : "unexpected '" + t.text + "'");
  }

  expr_ptr parse_postfix(expr_ptr e) {
    while (true) {
      const token& t = peek();
      if (t.k != token::kind::op) return e;
      pos at = e->at;  // attributes, items and calls are reported at their expression's start
      if (t.text == ".") {
        ++i_;
        const token& n = peek();
        if (n.k == token::kind::name) {
          auto a = node(expr::kind::attr, at);
          a->a = std::move(e);
          a->name = n.text;
          ++i_;
          e = std::move(a);
        } else if (n.k == token::kind::integer) {  // x.0 is x[0]
          auto it = node(expr::kind::item, at);
          it->a = std::move(e);
          it->b = node(expr::kind::literal, n.at);
          it->b->lit = value::int_v(int_literal(n.text, n.at));
          ++i_;
          e = std::move(it);
        } else {
          fail(name_, n.at, "expected an attribute name after '.'");
        }
      } else if (t.text == "[") {
        ++i_;
        expr_ptr parts[3];
        int colons = 0;
        while (true) {
          if (peek().k == token::kind::op && peek().text == ":") {
            if (++colons > 2) fail(name_, peek().at, "too many ':' in a slice");
            ++i_;
            continue;
          }
          if (peek().k == token::kind::op && peek().text == "]") break;
          if (parts[colons]) fail(name_, peek().at, "expected ':' or ']'");
          parts[colons] = parse_expr();
        }
        expect_op("]");
        if (colons == 0) {
          if (!parts[0]) fail(name_, at, "empty subscript");
          auto it = node(expr::kind::item, at);
          it->a = std::move(e);
          it->b = std::move(parts[0]);
          e = std::move(it);
        } else {
          auto sl = node(expr::kind::slice, at);
          sl->a = std::move(e);
          sl->b = std::move(parts[0]);
          sl->c = std::move(parts[1]);
          sl->d = std::move(parts[2]);
          e = std::move(sl);
        }
      } else if (t.text == "(") {
        ++i_;
        auto c = node(expr::kind::call, at);
        c->a = std::move(e);
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  void parse_call_args(expr& c) {
    while (!accept_op(")")) {
      if (!c.args.empty() || !c.kwargs.empty()) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      if (peek().k == token::kind::name && peek(1).k == token::kind::op && peek(1).text == "=") {
        std::string n = peek().text;
        i_ += 2;
        c.kwargs.push_back(kwarg{n, parse_expr()});
      } else {
        if (!c.kwargs.empty()) fail(name_, peek().at, "a positional argument after a keyword argument");
        c.args.push_back(parse_expr());
      }
    }
  }

  expr_ptr parse_filter_expr(expr_ptr e) {
    while (true) {
      const token& t = peek();
      if (t.k == token::kind::op && t.text == "|") {
        ++i_;
        const token& n = peek();
        if (n.k != token::kind::name) fail(name_, n.at, "expected a filter name after '|'");
        if (!known_filter(n.text))
          fail(name_, n.at, "unsupported filter '" + n.text + "' (docs/chat_templates.md lists the supported ones)");
        auto f = node(expr::kind::filter, n.at);
        f->name = n.text;
        f->a = std::move(e);
        ++i_;
        if (accept_op("(")) parse_call_args(*f);
        e = parse_postfix(std::move(f));
      } else if (t.k == token::kind::name && t.text == "is") {
        ++i_;
        auto te = node(expr::kind::test, t.at);
        te->negate = accept_name("not");
        const token& n = peek();
        if (n.k != token::kind::name && !(n.k == token::kind::op && (n.text == "==" || n.text == "!=" || n.text == "<" ||
                                                                    n.text == ">" || n.text == "<=" || n.text == ">=")))
          fail(name_, n.at, "expected a test name after 'is'");
        std::string tname = n.text == "none" || n.text == "None" ? "none"
                            : n.text == "true" || n.text == "True" ? "true"
                            : n.text == "false" || n.text == "False" ? "false"
                                                                     : n.text;
        if (!known_test(tname))
          fail(name_, n.at, "unsupported test '" + n.text + "' (docs/chat_templates.md lists the supported ones)");
        te->name = tname;
        te->a = std::move(e);
        ++i_;
        if (accept_op("(")) {
          parse_call_args(*te);
        } else {
          // one bare argument: `is divisibleby 3`, `is equalto 'x'` (Jinja2 allows a primary here)
          const token& a = peek();
          bool arg = a.k == token::kind::str || a.k == token::kind::integer || a.k == token::kind::real ||
                     (a.k == token::kind::name && a.text != "and" && a.text != "or" && a.text != "else" &&
                      a.text != "if" && a.text != "in" && a.text != "is" && a.text != "not");
          if (arg) te->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(te);
      } else {
        return e;
      }
    }
  }

  // ---- token helpers ----
  const token& peek(size_t k = 0) const {
    size_t j = i_ + k;
    return j < toks_.size() ? toks_[j] : toks_.back();
  }
  bool at_end() const { return peek().k == token::kind::end; }
  bool accept_op(const char* op) {
    if (peek().k == token::kind::op && peek().text == op) {
      ++i_;
      return true;
    }
    return false;
  }
  bool accept_name(const char* n) {
    if (peek().k == token::kind::name && peek().text == n) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect_op(const char* op) {
    if (!accept_op(op))
      fail(name_, peek().at, std::string("expected '") + op + "'" +
                                 (peek().k == token::kind::end ? " before the tag's end" : ", found '" + peek().text + "'"));
  }
  void expect_name(const char* n) {
    if (!accept_name(n)) fail(name_, peek().at, std::string("expected '") + n + "'");
  }
  void expect_end() {
    if (!at_end()) fail(name_, peek().at, "unexpected '" + peek().text + "' (expected the end of the tag)");
  }

  // A number literal as a 64-bit integer or a double: one past their range is refused by name (Python's int
  // has no bound; stoll threw std::out_of_range through parse)
  int64_t int_literal(const std::string& text, pos at) const {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == ERANGE || end != text.c_str() + text.size())
      fail(name_, at, "the integer " + text + " is out of the range of a 64-bit integer");
    return v;
  }
  double real_literal(const std::string& text, pos at) const {
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if ((errno == ERANGE && std::isinf(v)) || end != text.c_str() + text.size())
      fail(name_, at, "the number " + text + " is out of the range of a double");
    return v;
  }

  // Nesting limit: a template nested deeper (brackets, unary operators, blocks) is refused rather than
  // overflowing the stack of this recursive parser and of the evaluator.
  static constexpr int max_depth = 200;
  struct depth_guard {
    parser& p;
    depth_guard(parser& p_, pos at) : p(p_) {
      if (++p.depth_ > max_depth)
        fail(p.name_, at, "nested more than " + std::to_string(max_depth) + " levels deep");
    }
    ~depth_guard() { --p.depth_; }
  };

  lexer lex_;
  const std::string& name_;
  std::vector<token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

std::unique_ptr<template_root> parse_template(const std::string& source, const std::string& name) {
  parser p(source, name);
  return p.run();
}

}  // namespace flowrun::chat
