// The parsed form of a chat template (models/chat_template.h): expression and statement trees,
// each node with its line and column in the template. Internal to models/chat.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/chat/value.h"

namespace flowrun::chat {

struct pos {
  int line = 1;
  int col = 1;
};

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct kwarg {
  std::string name;
  expr_ptr val;
};

/// One expression node. Which fields mean what depends on `op`:
///   literal      lit
///   name         name
///   attr         a.name
///   item         a[b]
///   slice        a[b:c:d] (b/c/d may be null)
///   call         a(args, kwargs)
///   filter       a | name(args, kwargs)          (a null: the filter of a {% filter %}, unused)
///   test         a is [not] name(args)            (negate)
///   unary        name in {"not", "-", "+"} applied to a
///   binary       name in {"or","and","==","!=","<",">","<=",">=","in","not in","+","-","*","/","//","%","**","~"}
///   cond         b if a else c (c may be null: undefined)
///   list/tuple   args
///   dict         kwargs-like pairs: keys in args (expressions), values in vals
struct expr {
  enum class kind { literal, name, attr, item, slice, call, filter, test, unary, binary, cond, list, tuple, dict };
  kind k;
  pos at;
  value lit;
  std::string name;
  expr_ptr a, b, c, d;
  std::vector<expr_ptr> args;
  std::vector<expr_ptr> vals;
  std::vector<kwarg> kwargs;
  bool negate = false;
};

struct stmt;
using body = std::vector<std::unique_ptr<stmt>>;

/// One statement node:
///   text         the literal text `text`
///   output       {{ e }}
///   for_loop     {% for targets in e [if cond] %} body [{% else %} else_body] {% endfor %}
///   if_chain     conds[i] → bodies[i]; else_body
///   set          {% set targets = e %} (attr_target: {% set ns.attr = e %}), or block set (e null, body)
///   generation   {% generation %} body {% endgeneration %}
///   brk, cont    {% break %}, {% continue %}
///   macro        {% macro name(targets[i] = conds[i] or null, ...) %} main {% endmacro %} (name in text)
struct stmt {
  enum class kind { text, output, for_loop, if_chain, set, generation, brk, cont, macro };
  kind k;
  pos at;
  std::string text;
  expr_ptr e;
  expr_ptr cond;
  std::vector<std::string> targets;
  std::string attr_target;  // set: the attribute of targets[0] (a namespace)
  std::vector<expr_ptr> conds;
  std::vector<body> bodies;
  body main;
  body else_body;
};

struct template_root {
  std::string name;
  body main;
};

/// Parse a template (models/chat/parse.cpp). Throws chat_template_error.
std::unique_ptr<template_root> parse_template(const std::string& source, const std::string& name);

/// The filters, tests and global functions the interpreter knows (models/chat/render.cpp); the
/// parser refuses others with their position.
bool known_filter(const std::string& name);
bool known_test(const std::string& name);

}  // namespace flowrun::chat
