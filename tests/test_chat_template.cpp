// Chat templates (models/chat_template.h) against transformers' apply_chat_template: the expected
// texts in tests/fixtures/chat_templates/expected.json were rendered by make_expected.py beside it
// (transformers + Jinja2); every comparison is byte for byte. Also the rows-to-messages functions of
// models/chat_format.h against the same script's Python rule.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "models/chat_format.h"
#include "models/chat_template.h"

using flowrun::chat_template;
using flowrun::chat_template_error;
using json = nlohmann::ordered_json;

namespace {

const std::filesystem::path fixtures = std::filesystem::path(FLOWRUN_TEST_DIR) / "fixtures" / "chat_templates";

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& expected() {
  static const json j = json::parse(slurp(fixtures / "expected.json"));
  return j;
}

/// The error a template gives, or "" when it renders.
std::string render_error(const std::string& src, const json& vars = json::object(), std::string* raised = nullptr) {
  try {
    chat_template::parse(src, "t.jinja").render(vars);
  } catch (const chat_template_error& e) {
    if (raised) *raised = e.raised;
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("chat templates of five model families match transformers' apply_chat_template byte for byte") {
  const json& ex = expected();
  const json& convs = ex["conversations"];
  REQUIRE(ex["templates"].size() == 7);
  REQUIRE(convs.size() == 9);
  int texts = 0, errors = 0;
  for (auto it = ex["templates"].begin(); it != ex["templates"].end(); ++it) {
    const std::string file = it.key();
    const json& t = it.value();
    flowrun::hf_chat_template ht{chat_template::parse(slurp(fixtures / file), file), json::object()};
    if (!t["bos_token"].is_null()) ht.special_tokens["bos_token"] = t["bos_token"];
    if (!t["eos_token"].is_null()) ht.special_tokens["eos_token"] = t["eos_token"];
    for (const auto& c : convs) {
      const std::string cname = c["name"].get<std::string>();
      CAPTURE(file);
      CAPTURE(cname);
      const json& want = t["results"][cname];
      if (want.contains("text")) {
        std::string got = flowrun::apply_chat_template(ht, c["messages"], c["add_generation_prompt"].get<bool>(),
                                                       t["variables"], c.value("tools", json()));
        CHECK(got == want["text"].get<std::string>());
        ++texts;
      } else {
        std::string raised;
        try {
          flowrun::apply_chat_template(ht, c["messages"], c["add_generation_prompt"].get<bool>(), t["variables"],
                                       c.value("tools", json()));
          FAIL("rendered, but transformers refused: " << want["error"].get<std::string>());
        } catch (const chat_template_error& e) {
          raised = e.raised;
          // the error names the template file and the raise_exception call's line
          CHECK(std::string(e.what()).rfind(file + ":", 0) == 0);
        }
        CHECK(raised == want["error"].get<std::string>());
        ++errors;
      }
    }
  }
  // 7 templates x 9 conversations: 56 texts and 7 refusals (Gemma's three conversations with a system
  // turn; Mistral v0.2 refusing the tool turn; both Mistrals and Gemma refusing two user turns in a row)
  CHECK(texts == 56);
  CHECK(errors == 7);
}

TEST_CASE("chat template constructs match Jinja2 in transformers' environment") {
  int n = 0;
  for (const auto& f : expected()["features"]) {
    const std::string name = f["name"].get<std::string>();
    CAPTURE(name);
    std::string got;
    try {
      got = chat_template::parse(f["template"].get<std::string>(), name).render(f["variables"]);
    } catch (const chat_template_error& e) {
      FAIL(e.what());
    }
    CHECK(got == f["text"].get<std::string>());
    ++n;
  }
  CHECK(n == 25);
}

TEST_CASE("chat template errors name the template, the line and column, and the construct") {
  // an unsupported tag, filter and test are refused when parsing
  CHECK(render_error("ab\n  {% call m() %}{% endcall %}") ==
        "t.jinja:2:3: unsupported tag '{% call %}' (supported: for, if/elif/else, set, macro, generation, break, "
        "continue; docs/chat_templates.md)");
  CHECK(render_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}") ==
        "t.jinja:1:41: macro 'm' takes 1 arguments, 2 given");
  CHECK(render_error("{% macro m(a) %}{{ m(a) }}{% endmacro %}{{ m(1) }}") ==
        "t.jinja:1:20: macro 'm' calls nested more than 100 deep");
  CHECK(render_error("{{ x | wordwrap }}") ==
        "t.jinja:1:8: unsupported filter 'wordwrap' (docs/chat_templates.md lists the supported ones)");
  CHECK(render_error("{{ x is escaped }}") ==
        "t.jinja:1:9: unsupported test 'escaped' (docs/chat_templates.md lists the supported ones)");
  CHECK(render_error("{% if x %}a") == "t.jinja:1:11: unexpected end of template: '{% endif %}' missing");
  CHECK(render_error("{{ 'abc }}") == "t.jinja:1:4: string literal not closed");
  CHECK(render_error("{% for x in y %}{% endif %}") == "t.jinja:1:17: unsupported tag '{% endif %}' (supported: for, "
                                                         "if/elif/else, set, macro, generation, break, continue; "
                                                         "docs/chat_templates.md)");
  // raise_exception carries the template's message
  std::string raised;
  CHECK(render_error("x\n{{ raise_exception('no system role') }}", json::object(), &raised) ==
        "t.jinja:2:4: raise_exception: no system role");
  CHECK(raised == "no system role");
  // runtime errors: Python's TypeError / Jinja2's UndefinedError, never a silent fallback
  CHECK(render_error("{{ 'a' + 1 }}") == "t.jinja:1:8: unsupported operand types for +: 'str' and 'int'");
  // Python's string formatting: said to be flowrun's gap, with the way round it (it read as a template fault)
  CHECK(render_error("{{ '%d: ' % 3 }}") ==
        "t.jinja:1:11: Python's '%' string formatting ('str' % 'int') is not supported by flowrun's renderer: build "
        "the text with ~ and |string instead (e.g. n|string ~ ': ')");
  CHECK(render_error("{{ m['role'] }}") == "t.jinja:1:4: an item of an undefined value (jinja2.exceptions.UndefinedError)");
  CHECK(render_error("{{ messages[0].role }}", json{{"messages", json::array()}}) ==
        "t.jinja:1:4: 'role' of an undefined value (jinja2.exceptions.UndefinedError)");
  CHECK(render_error("{{ 'x' + u }}") == "t.jinja:1:8: an undefined value used in '+' (jinja2.exceptions.UndefinedError)");
  CHECK(render_error("{{ s.zfill(3) }}", json{{"s", "1"}}) ==
        "t.jinja:1:4: 'zfill' is undefined or not a supported function or method");
  CHECK(render_error("{{ foo() }}") == "t.jinja:1:4: 'foo' is undefined or not a supported function or method");
  CHECK(render_error("{% set x = 1 %}{% set x.a = 2 %}") ==
        "t.jinja:1:16: cannot assign attribute 'a' on 'x' (a int, not a namespace())");
  // limits: nesting that would overflow the stack, and memory a template would exhaust
  CHECK(render_error("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}") ==
        "t.jinja:1:204: nested more than 200 levels deep");
  CHECK(render_error("{{ " + std::string(1000, '-') + "1 }}").find("nested more than 200 levels deep") != std::string::npos);
  CHECK(render_error("{{ range(100000000000) | length }}") == "t.jinja:1:4: range() of more than 10000000 items");
  CHECK(render_error("{{ 'ab' * 1000000000000 }}") == "t.jinja:1:9: a string repeated to more than 268435456 bytes");
  // number literals past a 64-bit integer or a double: refused by name (the parser let std::out_of_range out;
  // found by the fuzz target chat_template)
  CHECK(render_error("{{ 99999999999999999999 }}") == "t.jinja:1:4: the integer 99999999999999999999 is out of the range "
                                                        "of a 64-bit integer");
  CHECK(render_error("{{ 1e999 }}") == "t.jinja:1:4: the number 1e999 is out of the range of a double");
  CHECK(render_error("{{ messages.99999999999999999999 }}").find("out of the range of a 64-bit integer") !=
        std::string::npos);
  // a template that is not parsed renders nothing and says so
  CHECK_THROWS_AS(chat_template().render(json::object()), chat_template_error);
  // chat_render_limits: the work and the strings of one render (time and memory a template would exhaust;
  // small limits here, as the fuzz target gives)
  flowrun::chat_render_limits small;
  small.max_items = 1000;
  small.max_string = 1 << 20;
  small.max_work = 1 << 24;
  auto limited = [&](const std::string& src) {
    try {
      return chat_template::parse(src, "t.jinja").render(json::object(), small);
    } catch (const chat_template_error& e) {
      return std::string(e.what());
    }
  };
  // loops within max_items each, nested past max_work: 1000 x 1000 iterations x 64 > 2^24 (the inner range()
  // and its walk spend 16 an item each: the 513th inner range() passes it)
  CHECK(limited("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}").find(
            "t.jinja:1:39: the template's work passed 16777216 units (64 a loop iteration") == 0);
  CHECK(limited("{{ range(1001) | length }}") == "t.jinja:1:4: range() of more than 1000 items");
  // a string doubled in a loop: the concatenation past max_string (2^20 bytes: 'ab' doubled 19 times)
  CHECK(limited("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}") ==
        "t.jinja:1:76: a string joined with + of more than 1048576 bytes");
  CHECK(limited("{{ ('x' * 1000) | replace('', 'y' * 1100) }}") ==
        "t.jinja:1:19: replace: a result of more than 1048576 bytes");
  CHECK(limited("{% for i in range(600) %}{{ 'x' * 2000 }}{% endfor %}") ==
        "t.jinja:1:26: an output of more than 1048576 bytes");
  CHECK(limited("{{ [1] | tojson(indent=100000) }}") == "t.jinja:1:10: tojson: indent 100000 is more than 1024");
  // the same loops within the limits render as before: 100 x 100 iterations
  CHECK(limited("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{{ i % 10 }}{% endfor %}").size() == 100);
}

TEST_CASE("chat template: strftime_now gives today's date as Llama 3.2's template asks when date_string is not passed") {
  const std::string src = slurp(fixtures / "meta-llama-Llama-3.2-3B-Instruct.jinja");
  json vars = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
               {"tools", nullptr},
               {"add_generation_prompt", true},
               {"bos_token", "<|begin_of_text|>"}};
  std::time_t before = std::time(nullptr);
  std::string out = chat_template::parse(src, "llama3.2").render(vars);
  std::time_t after = std::time(nullptr);
  auto day = [](std::time_t t) {
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    return std::string(buf, std::strftime(buf, sizeof buf, "%d %b %Y", &tm));
  };
  bool found = out.find("Today Date: " + day(before) + "\n") != std::string::npos ||
               out.find("Today Date: " + day(after) + "\n") != std::string::npos;
  CHECK_MESSAGE(found, out);
}

TEST_CASE("load_hf_chat_template reads tokenizer_config.json: a string, a named list, AddedToken special tokens") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("flowrun_chat_template_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string gemma = slurp(fixtures / "google-gemma-2-2b-it.jinja");
  json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  {
    json cfg = {{"bos_token", {{"content", "<bos>"}, {"lstrip", false}}}, {"eos_token", "<eos>"}, {"pad_token", nullptr},
                {"chat_template", gemma}};
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
    auto t = flowrun::load_hf_chat_template(dir.string());
    CHECK(t.special_tokens == json({{"bos_token", "<bos>"}, {"eos_token", "<eos>"}}));
    CHECK(flowrun::apply_chat_template(t, msgs, true) ==
          "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    CHECK(t.tmpl.name() == (dir / "tokenizer_config.json").string() + ":chat_template");
  }
  {
    json cfg = {{"eos_token", "<eos>"},
                {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                               {{"name", "default"}, {"template", "{{ messages[0].content }}!"}}})}};
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
    auto t = flowrun::load_hf_chat_template((dir / "tokenizer_config.json").string());
    CHECK(flowrun::apply_chat_template(t, msgs, false) == "Hi!");
    // chat_template.jinja beside the config wins, as in transformers
    std::ofstream(dir / "chat_template.jinja") << "[{{ messages | length }}]\n";
    auto t2 = flowrun::load_hf_chat_template(dir.string());
    CHECK(flowrun::apply_chat_template(t2, msgs, false) == "[1]");
    fs::remove(dir / "chat_template.jinja");
    // a list without "default": the names it has and the fix (it said only "without one named default", and
    // chat_formatter_for_tokenizer then told to use a folder that has a chat_template, which this one has)
    cfg["chat_template"].erase(1);
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
    CHECK_THROWS_WITH_AS(flowrun::load_hf_chat_template(dir.string()),
                         doctest::Contains("chat_template is a list of named templates (tool_use) without one named "
                                           "\"default\", the one transformers takes when none is named: name the "
                                           "template to use \"default\""),
                         std::invalid_argument);
    try {
      flowrun::chat_formatter_for_tokenizer(dir.string(), "flowrun chat", "--apply_chat_template", "--tokenizer",
                                            "drop --apply_chat_template");
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      const std::string w = e.what();
      CHECK(w.find("flowrun chat: --apply_chat_template: ") == 0);
      CHECK(w.find("use a model folder whose") == std::string::npos);
    }
  }
  {
    std::ofstream(dir / "tokenizer_config.json") << json({{"eos_token", "</s>"}}).dump();
    CHECK_THROWS_WITH_AS(flowrun::load_hf_chat_template(dir.string()),
                         doctest::Contains("no chat_template"), std::runtime_error);
    try {  // one fix, said once (the file's words and the caller's both told to use another folder)
      flowrun::chat_formatter_for_tokenizer(dir.string(), "flowrun chat", "--apply_chat_template", "--tokenizer",
                                            "drop --apply_chat_template");
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      const std::string w = e.what();
      CHECK(w.find("a base model has none") != std::string::npos);
      CHECK(w.find("use ") == w.rfind("use "));
    }
    std::ofstream(dir / "tokenizer_config.json") << json({{"chat_template", "{% include 'x' %}"}}).dump();
    CHECK_THROWS_WITH_AS(flowrun::load_hf_chat_template(dir.string()),
                         doctest::Contains("tokenizer_config.json:chat_template:1:1: unsupported tag '{% include %}'"),
                         chat_template_error);
  }
  fs::remove_all(dir);
}

TEST_CASE("dschat_messages splits DS-Chat / HH-RLHF prompts into turns as the fixtures' Python rule does") {
  int n = 0;
  for (const auto& c : expected()["dschat_split"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    CAPTURE(prompt);
    if (c.contains("messages")) {
      CHECK(flowrun::dschat_messages(prompt) == c["messages"]);
    } else {
      CHECK_THROWS_WITH_AS(flowrun::dschat_messages(prompt), doctest::Contains("DS-Chat prompt"), std::runtime_error);
    }
    ++n;
  }
  CHECK(n == 8);
  // the response is appended, stripped, as the assistant's message
  std::string resp = "  fine.\n";
  CHECK(flowrun::dschat_messages("\n\nHuman: hi\n\nAssistant:", &resp) ==
        json::parse(R"([{"role":"user","content":"hi"},{"role":"assistant","content":"fine."}])"));
}

TEST_CASE("chat_formatter renders DS-Chat rows and GSM8K questions with each model's template as transformers does") {
  const json& ex = expected();
  auto conv = [&](const std::string& name) -> const json& {
    for (const auto& c : ex["conversations"])
      if (c["name"] == name) return c;
    FAIL("no conversation " << name);
    return ex;
  };
  const json& prompt_conv = conv("dschat_hh_rlhf_prompt");
  const json& chosen_conv = conv("dschat_hh_rlhf_chosen");
  const json& gsm8k_conv = conv("gsm8k_question");
  const std::string dschat_prompt = prompt_conv["dschat_prompt"].get<std::string>();
  const std::string chosen = chosen_conv["dschat_response"].get<std::string>();
  const std::string question = gsm8k_conv["gsm8k_question"].get<std::string>();
  int n = 0;
  for (auto it = ex["templates"].begin(); it != ex["templates"].end(); ++it) {
    const std::string file = it.key();
    CAPTURE(file);
    const json& t = it.value();
    flowrun::hf_chat_template ht{chat_template::parse(slurp(fixtures / file), file), json::object()};
    if (!t["bos_token"].is_null()) ht.special_tokens["bos_token"] = t["bos_token"];
    if (!t["eos_token"].is_null()) ht.special_tokens["eos_token"] = t["eos_token"];
    flowrun::chat_formatter f(ht, t["variables"]);
    CHECK(f.dschat_prompt(dschat_prompt) == t["results"]["dschat_hh_rlhf_prompt"]["text"].get<std::string>());
    auto pr = f.dschat_prompt_response(dschat_prompt, chosen);
    CHECK(pr.full == t["results"]["dschat_hh_rlhf_chosen"]["text"].get<std::string>());
    CHECK(pr.prompt == t["results"]["dschat_hh_rlhf_prompt"]["text"].get<std::string>());
    CHECK(f.gsm8k_prompt(question) == t["results"]["gsm8k_question"]["text"].get<std::string>());
    ++n;
  }
  CHECK(n == 7);

  // from a model folder's tokenizer_config.json (Llama 3.1's template, its special tokens)
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("flowrun_chat_format_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string llama = "meta-llama-Llama-3.1-8B-Instruct.jinja";
  std::ofstream(dir / "tokenizer_config.json")
      << json({{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}, {"chat_template", slurp(fixtures / llama)}})
             .dump();
  flowrun::chat_formatter f(dir.string(), {{"date_string", "26 Jul 2024"}});
  CHECK(f.dschat_prompt(dschat_prompt) == ex["templates"][llama]["results"]["dschat_hh_rlhf_prompt"]["text"].get<std::string>());
  fs::remove_all(dir);

  // a template whose generation prompt is not a prefix of the whole conversation is refused for pairs
  flowrun::hf_chat_template odd{
      chat_template::parse("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}>>{% endif %}",
                           "odd.jinja"),
      json::object()};
  CHECK_THROWS_WITH_AS(flowrun::chat_formatter(odd).dschat_prompt_response("\n\nHuman: q\n\nAssistant:", "a"),
                       doctest::Contains("odd.jinja: the rendered prompt (add_generation_prompt=true) is not a prefix"),
                       chat_template_error);
}
