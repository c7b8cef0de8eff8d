// Tests of the graph description layer (runtime/graph): edge syntax, the
// node kind registry, reading files with includes and overrides, and the
// validator, over the good and bad graphs in tests/graphs.
#include <doctest/doctest.h>

#include <atomic>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "runtime/graph/graph_spec.h"
#include "runtime/graph/node_kind.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"
#include "runtime/util/writable.h"

#ifndef FLOWRUN_TEST_DIR
#error "FLOWRUN_TEST_DIR must name the tests folder"
#endif

using namespace flowrun::graph;
namespace fs = std::filesystem;

namespace {

const fs::path graphs_dir = fs::path(FLOWRUN_TEST_DIR) / "graphs";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// The example kinds plus a few made up for the tests.
const node_kind_registry& test_kinds() {
  static const node_kind_registry registry = [] {
    node_kind_registry r;
    register_example_kinds(r);
    r.register_kind(
        node_kind{"merger", "joins two text streams"}.input("a", "text").input("b", "text").output("merged", "text"));
    r.register_kind(node_kind{"trainer", "learns from text, emits weights"}
                        .input("data", "text")
                        .output("weights", "weights", "new weights after each step", true)
                        .option("lr", setting_type::float_, 1e-4, "learning rate")
                        .option("tags", setting_type::string_list, std::vector<std::string>{}, "labels")
                        .option("batch", setting_type::int_, std::int64_t{8}, "rows per step")
                        .at_least(1)
                        .known_as("learning_rate_init", "sklearn's learning_rate_init is lr here"));
    r.register_kind(node_kind{"player", "plays games with the latest weights"}
                        .input("weights", "weights", "weights from the trainer", true, /*feedback=*/true)
                        .output("games", "text"));
    return r;
  }();
  return registry;
}

validate_options test_options() {
  validate_options o;
  o.asset_root = graphs_dir / "assets";
  return o;
}

validation_result load(const std::string& relative, const std::vector<std::string>& overrides = {}) {
  return load_graph(graphs_dir / relative, test_kinds(), test_options(), overrides);
}

std::string all_errors(const std::vector<graph_error>& errors) { return format_errors(errors); }

}  // namespace

// ------------------------------------------------------------ basics

TEST_CASE("graph_error formats as FILE:LINE:COL: error: MESSAGE and a hint line") {
  graph_error e{"a.graph", 3, 7, "unknown node kind 'x'", "did you mean 'y'?"};
  CHECK(e.to_string() == "a.graph:3:7: error: unknown node kind 'x'\n  hint: did you mean 'y'?");
  CHECK(format_errors({e, e}) == e.to_string() + "\n" + e.to_string() + "\n");
  graph_error no_hint{"b", 1, 1, "m", ""};
  CHECK(no_hint.to_string() == "b:1:1: error: m");
}

TEST_CASE("edit distance and nearest names") {
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("same", "same") == 0);
  CHECK(edit_distance("otu", "out") == 1);  // a swap of neighbours counts 1
  CHECK(nearest_name("temprature", {"top_k", "temperature", "top_p"}) == "temperature");
  CHECK(nearest_name("sinc", {"sink", "generator"}) == "sink");
  CHECK(nearest_name("completely_different", {"sink", "generator"}).empty());
  CHECK(is_identifier("gen_2"));
  CHECK_FALSE(is_identifier("2nd"));
  CHECK_FALSE(is_identifier("a-b"));
  CHECK_FALSE(is_identifier(""));
}

TEST_CASE("node seeds are deterministic and differ by seed, name and replica") {
  CHECK(splitmix64(0) == 0xe220a8397b1dcdafull);
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(node_seed(1234, "generator", 0) == node_seed(1234, "generator", 0));
  CHECK(node_seed(1234, "generator", 0) == splitmix64(splitmix64(splitmix64(1234) ^ fnv1a64("generator")) ^ 0));
  CHECK(node_seed(1234, "generator", 0) != node_seed(1234, "generator", 1));
  CHECK(node_seed(1234, "generator", 0) != node_seed(1235, "generator", 0));
  CHECK(node_seed(1234, "generator", 0) != node_seed(1234, "tokenizer", 0));
  CHECK(node_seed(0, "a", 1) != node_seed(0, "b", 0));
}

TEST_CASE("values print in TOML spelling") {
  CHECK(to_string(setting_value{std::int64_t{64}}) == "64");
  CHECK(to_string(setting_value{0.0}) == "0.0");
  CHECK(to_string(setting_value{1e-5}) == "1e-05");
  CHECK(to_string(setting_value{0.9}) == "0.9");
  CHECK(to_string(setting_value{true}) == "true");
  CHECK(to_string(setting_value{std::string("a\"b")}) == "\"a\\\"b\"");
  CHECK(to_string(setting_value{std::vector<std::string>{"x", "y"}}) == "[\"x\", \"y\"]");
  CHECK(value_type_name(setting_value{2.0}) == "float");
}

// ------------------------------------------------------------ edge syntax

TEST_CASE("edge strings: endpoints, several targets and options") {
  auto r = parse_edge("a.out -> b.in");
  REQUIRE(r.errors.empty());
  REQUIRE(r.edges.size() == 1);
  CHECK(r.edges[0].from_node == "a");
  CHECK(r.edges[0].from_port == "out");
  CHECK(r.edges[0].to_node == "b");
  CHECK(r.edges[0].to_port == "in");
  CHECK(r.edges[0].credit == 0);
  CHECK(r.edges[0].dispatch == dispatch_mode::broadcast);
  CHECK_FALSE(r.edges[0].feedback);

  r = parse_edge("gen.rollouts -> reward, reference.rollouts ,critic [credit=4, dispatch=split]");
  REQUIRE(r.errors.empty());
  REQUIRE(r.edges.size() == 3);
  CHECK(r.edges[0].to_node == "reward");
  CHECK(r.edges[0].to_port.empty());
  CHECK(r.edges[1].to_node == "reference");
  CHECK(r.edges[1].to_port == "rollouts");
  CHECK(r.edges[2].to_node == "critic");
  for (const auto& e : r.edges) {
    CHECK(e.from_node == "gen");
    CHECK(e.credit == 4);
    CHECK(e.dispatch == dispatch_mode::split);
  }

  r = parse_edge("  trainer->gen.weights[feedback, dispatch=round_robin]  ");
  REQUIRE(r.errors.empty());
  REQUIRE(r.edges.size() == 1);
  CHECK(r.edges[0].from_port.empty());
  CHECK(r.edges[0].feedback);
  CHECK(r.edges[0].dispatch == dispatch_mode::round_robin);
  CHECK(r.edges[0].to_string() == "trainer -> gen.weights");

  r = parse_edge("a -> b []");
  CHECK(r.errors.empty());
  CHECK(r.edges.size() == 1);
}

TEST_CASE("edge strings: errors point at the column inside the string") {
  source_pos at{"f.graph", 2, 10};  // the opening quote; text starts at column 11
  struct bad {
    const char* text;
    const char* message;
    int col;
    std::size_t edges;  // edges still returned
  };
  const bad cases[] = {
      {"", "the edge string is empty", 11, 0},
      {"a.out", "expected '->'", 16, 0},
      {"a.out -> ", "expected a target node name", 20, 0},
      {"a. -> b", "expected a port name after 'a.'", 13, 0},
      {"-> b", "expected a source node name", 11, 0},
      {"a -> b c", "unexpected 'c' after the last target", 18, 0},
      {"a -> b [credit=-1]", "credit must be a positive integer", 26, 1},
      {"a -> b [credit=x]", "credit must be a positive integer", 26, 1},
      {"a -> b [dispatch=all]", "unknown dispatch mode 'all'", 28, 1},
      {"a -> b [credit=4", "'[' is not closed", 18, 1},
      {"a -> b [ttl=4]", "unknown edge option 'ttl'", 19, 1},
      {"a -> b [credit=1, credit=2]", "given twice", 29, 1},
      {"a -> b [feedback feedback]", "expected ',' or ']', found 'f'", 28, 1},
      {"a -> b [feedback=maybe]", "feedback takes no value", 28, 1},
  };
  for (const auto& c : cases) {
    CAPTURE(std::string(c.text));
    auto r = parse_edge(c.text, at, true);
    REQUIRE(r.errors.size() == 1);
    CHECK(contains(r.errors[0].message, c.message));
    CHECK(r.errors[0].file == "f.graph");
    CHECK(r.errors[0].line == 2);
    CHECK(r.errors[0].col == c.col);
    CHECK_FALSE(r.errors[0].hint.empty());
    CHECK(r.edges.size() == c.edges);
    // Without exact columns, errors point at the string itself.
    auto r2 = parse_edge(c.text, at, false);
    REQUIRE(r2.errors.size() == 1);
    CHECK(r2.errors[0].col == 10);
  }
}

// ------------------------------------------------------------ registry

TEST_CASE("node kind registry: register, lookup, list, explain") {
  node_kind_registry r;
  register_example_kinds(r);
  CHECK(r.size() == 4);
  CHECK(r.names() == std::vector<std::string>{"generator", "sink", "text_source", "tokenizer"});
  REQUIRE(r.list().size() == 4);
  CHECK(r.list()[0]->name == "generator");
  CHECK(r.lookup("nope") == nullptr);

  const node_kind* gen = r.lookup("generator");
  REQUIRE(gen != nullptr);
  REQUIRE(gen->find_port("prompts") != nullptr);
  CHECK(gen->find_port("prompts")->dir == port_dir::in);
  CHECK(gen->find_port("prompts")->message_type == "tokens");
  CHECK(gen->find_port("prompts")->required);
  CHECK(gen->find_port("completions")->dir == port_dir::out);
  CHECK(gen->find_port("completions")->message_type == "text");
  CHECK(gen->setting_names() ==
        std::vector<std::string>{"model", "tokenizer", "max_new_tokens", "temperature", "top_k", "top_p", "seed"});
  CHECK(gen->find_setting("model")->required);
  CHECK(gen->find_setting("model")->type == setting_type::path);
  CHECK(std::get<std::int64_t>(gen->find_setting("max_new_tokens")->default_value) == 64);
  CHECK(std::get<double>(gen->find_setting("temperature")->default_value) == 0.0);
  CHECK(std::get<double>(gen->find_setting("top_p")->default_value) == 1.0);
  CHECK(std::get<std::int64_t>(gen->find_setting("seed")->default_value) == -1);
  CHECK(std::get<bool>(r.lookup("tokenizer")->find_setting("add_bos")->default_value));
  CHECK(std::get<std::string>(r.lookup("sink")->find_setting("path")->default_value).empty());
  CHECK(r.lookup("sink")->find_setting("path")->type == setting_type::output);  // a file it writes
  CHECK(r.lookup("text_source")->find_port("lines")->message_type == "text");

  std::string text = explain(*gen);
  CHECK(contains(text, "generator: samples"));
  CHECK(contains(text, "in ports:\n  prompts "));
  CHECK(contains(text, "(required)"));
  CHECK(contains(text, "out ports:\n  completions"));
  CHECK(contains(text, "max_new_tokens  int     = 64"));
  CHECK(contains(text, "model           path    required"));
  CHECK(contains(text, "temperature     float   = 0.0"));
  std::string all = describe_kinds(r);
  CHECK(contains(all, "generator    (prompts:tokens) -> (completions:text)"));
  CHECK(contains(all, "text_source  () -> (lines:text)"));

  CHECK(parse_setting_type("string_list") == setting_type::string_list);
  CHECK(parse_setting_type("output") == setting_type::output);
  CHECK(parse_setting_type("path_list") == setting_type::path_list);
  CHECK_FALSE(parse_setting_type("double").has_value());
}

TEST_CASE("node kind registry: declaration mistakes are programmer errors") {
  node_kind_registry r;
  register_example_kinds(r);
  CHECK_THROWS_AS(register_example_kinds(r), std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"bad name"}), std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.input("x", "t").output("x", "t")), std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.option("replicas", setting_type::int_, std::int64_t{1}, "")),
                  std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.option("n", setting_type::int_, std::string("1"), "")),
                  std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.option("n", setting_type::int_, std::monostate{}, "")),
                  std::invalid_argument);
  node_kind with_default{"k"};
  with_default.settings.push_back({"m", setting_type::path, std::string("x"), "", true, {}});
  CHECK_THROWS_AS(r.register_kind(with_default), std::invalid_argument);
  node_kind feedback_out{"k"};
  feedback_out.ports.push_back({"o", "t", port_dir::out, false, true, ""});
  CHECK_THROWS_AS(r.register_kind(feedback_out), std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.input("x", "")), std::invalid_argument);
  // An integer default of a float setting is stored as a float.
  r.register_kind(node_kind{"k"}.option("f", setting_type::float_, std::int64_t{2}, ""));
  CHECK(std::get<double>(r.lookup("k")->find_setting("f")->default_value) == 2.0);
  CHECK(r.size() == 5);
}

// ------------------------------------------------------------ good graphs

TEST_CASE("good: a pipeline with omitted ports, options, defaults and paths") {
  auto r = load("good/pipeline.graph");
  INFO(all_errors(r.errors));
  REQUIRE(r.ok());
  const graph_spec& g = r.spec;
  CHECK(g.name == "pipeline");
  CHECK(g.seed == 42);
  CHECK(g.steps == 10);
  CHECK(ends_with(g.source_file.string(), "good/pipeline.graph"));
  REQUIRE(g.nodes.size() == 5);
  std::vector<std::string> order;
  for (const auto& n : g.nodes) order.push_back(n.name);
  CHECK(order == std::vector<std::string>{"prompts", "tok", "gen", "out", "log"});

  REQUIRE(g.edges.size() == 4);
  CHECK(g.edges[0].to_string() == "prompts.lines -> tok.text");
  CHECK(g.edges[1].to_string() == "tok.tokens -> gen.prompts");  // ports filled in
  CHECK(g.edges[1].credit == 4);
  CHECK(g.edges[2].to_string() == "gen.completions -> out.items");
  CHECK(g.edges[3].to_string() == "gen.completions -> log.items");
  for (int i : {2, 3}) {
    CHECK(g.edges[i].dispatch == dispatch_mode::round_robin);
    CHECK(g.edges[i].credit == 2);
  }
  CHECK(g.edges[1].pos.line == 6);
  CHECK(g.edges[1].pos.col == 3);

  const node_spec* gen = g.find_node("gen");
  REQUIRE(gen != nullptr);
  CHECK(gen->kind == "generator");
  CHECK(gen->replicas == 2);
  CHECK(gen->on == "gpu0");
  CHECK(gen->get_float("temperature") == 1.0);
  CHECK(std::holds_alternative<double>(gen->find_setting("temperature")->value));  // int coerced
  CHECK(gen->get_float("top_p") == doctest::Approx(0.9));
  CHECK(gen->get_int("max_new_tokens") == 64);  // default
  CHECK(gen->find_setting("max_new_tokens")->from_default);
  CHECK_FALSE(gen->find_setting("top_p")->from_default);
  CHECK(gen->find_setting("top_p")->value_pos.line == 29);
  CHECK(gen->find_setting("top_p")->value_pos.col == 9);
  CHECK(gen->get_int("seed") == -1);
  // Paths resolve next to the graph file first, then under the asset root.
  CHECK(ends_with(g.find_node("prompts")->get_string("path"), "good/data/prompts.txt"));
  CHECK(fs::path(g.find_node("prompts")->get_string("path")).is_absolute());
  CHECK(ends_with(gen->get_string("model"), "assets/model/tiny.bin"));
  CHECK(ends_with(gen->get_string("tokenizer"), "assets/model/tok.model"));
  CHECK(g.find_node("prompts")->get_int("max_lines") == 5);
  CHECK(g.find_node("tok")->get_bool("add_bos"));
  CHECK(g.find_node("out")->get_string("path").empty());
  // an output: resolved against the graph file's folder like an input, but it need not exist
  CHECK(g.find_node("log")->get_string("path") == (graphs_dir / "good" / "completions.txt").lexically_normal().string());
  CHECK(g.find_node("out")->pos.line == 33);
  CHECK(g.find_node("out")->pos.col == 1);
  CHECK_THROWS_AS((void)gen->get_int("nope"), std::out_of_range);
  CHECK_THROWS_AS((void)gen->get_int("model"), std::bad_variant_access);
}

TEST_CASE("good: includes merge under the including file, diamonds load once") {
  auto r = load("good/with_include.graph");
  INFO(all_errors(r.errors));
  REQUIRE(r.ok());
  const graph_spec& g = r.spec;
  CHECK(g.name == "with_include");  // the including file wins
  CHECK(g.seed == 7);               // only the include sets it
  CHECK(g.steps == 5);
  REQUIRE(g.included_files.size() == 2);
  CHECK(ends_with(g.included_files[0].string(), "good/inc/common.inc"));
  CHECK(ends_with(g.included_files[1].string(), "good/inc/source.inc"));
  std::vector<std::string> order;
  for (const auto& n : g.nodes) order.push_back(n.name);
  CHECK(order == std::vector<std::string>{"prompts", "tok", "gen", "out"});
  REQUIRE(g.edges.size() == 3);  // the include's edges first, then this file's
  CHECK(g.edges[0].to_string() == "prompts.lines -> tok.text");
  CHECK(g.edges[1].to_string() == "tok.tokens -> gen.prompts");
  CHECK(g.edges[2].to_string() == "gen.completions -> out.items");
  CHECK(ends_with(g.edges[0].pos.file, "good/inc/common.inc"));
  CHECK(ends_with(g.edges[2].pos.file, "good/with_include.graph"));
  const node_spec* gen = g.find_node("gen");
  CHECK(gen->get_int("max_new_tokens") == 32);  // overridden by the including file
  CHECK(ends_with(gen->find_setting("max_new_tokens")->value_pos.file, "good/with_include.graph"));
  CHECK(gen->get_float("temperature") == 0.5);  // kept from the include
  CHECK(ends_with(gen->find_setting("temperature")->value_pos.file, "good/inc/common.inc"));
  CHECK_FALSE(g.find_node("tok")->get_bool("add_bos"));
  CHECK(g.find_node("prompts")->get_int("max_lines") == 1);
  // A relative path is relative to the file it is written in (inc/source.inc).
  CHECK(ends_with(g.find_node("prompts")->get_string("path"), "good/data/prompts.txt"));
}

TEST_CASE("good: cycles through feedback edges and feedback ports") {
  auto r = load("good/feedback.graph");
  INFO(all_errors(r.errors));
  REQUIRE(r.ok());
  const graph_spec& g = r.spec;
  CHECK(g.name == "feedback");  // the file's stem when [graph] has no name
  REQUIRE(g.edges.size() == 6);
  CHECK(g.edges[2].feedback);  // [feedback]
  CHECK(g.edges[4].feedback);  // into player.weights, declared feedback
  CHECK_FALSE(g.edges[0].feedback);
  CHECK_FALSE(g.edges[5].feedback);
  const node_spec* learner = g.find_node("learner");
  CHECK(learner->get_float("lr") == doctest::Approx(3e-4));
  CHECK(learner->get_string_list("tags") == std::vector<std::string>{"ppo", "demo"});

  // Without the [feedback] option the tok/gen cycle is an error again.
  auto parsed = parse_graph_file(graphs_dir / "good/feedback.graph");
  REQUIRE(parsed.ok());
  parsed.spec.edges[2].feedback = false;
  auto v = validate(parsed.spec, test_kinds(), test_options());
  REQUIRE(v.errors.size() == 1);
  CHECK(contains(v.errors[0].message, "cycle without a feedback edge: tok -> gen -> tok"));
  CHECK(v.errors[0].line == 6);
  CHECK(v.errors[0].col == 3);
}

TEST_CASE("good: the example pipeline validates against the example kinds") {
  node_kind_registry kinds;
  register_example_kinds(kinds);
  validate_options o;
  if (const char* env = std::getenv("FLOWRUN_ASSETS"); env && *env)
    o.asset_root = env;
  else
    o.asset_root = fs::path(FLOWRUN_SOURCE_DIR) / ".." / "shared" / "assets";
  const fs::path example = fs::path(FLOWRUN_SOURCE_DIR) / "graphs" / "examples" / "generate.graph";
  if (!fs::exists(o.asset_root / "model/stories260K/stories260K.bin")) {
    MESSAGE("assets not found under " << o.asset_root << ": checking the example without its files");
    o.check_files = false;
  }
  auto r = load_graph(example, kinds, o);
  INFO(all_errors(r.errors));
  REQUIRE(r.ok());
  CHECK(r.spec.name == "generate");
  CHECK(r.spec.nodes.size() == 4);
  CHECK(r.spec.edges.size() == 3);
  const node_spec* gen = r.spec.find_node("generator");
  CHECK(gen->get_int("max_new_tokens") == 64);
  if (o.check_files) CHECK(ends_with(gen->get_string("model"), "model/stories260K/stories260K.bin"));

  // An asset root without the files: the error names both places.
  validate_options empty;
  empty.asset_root = graphs_dir / "assets";
  auto missing = load_graph(example, kinds, empty);
  REQUIRE(missing.errors.size() == 4);
  CHECK(contains(missing.errors[0].message, "graphs/examples/data/tinystories/tinystories_train_head.txt"));
  CHECK(contains(missing.errors[0].message, "assets/data/tinystories/tinystories_train_head.txt"));
}

// ------------------------------------------------------------ overrides

TEST_CASE("overrides: --set node.NAME.SETTING=VALUE as a TOML scalar") {
  auto parsed = parse_graph_file(graphs_dir / "good/pipeline.graph");
  REQUIRE(parsed.ok());
  graph_spec spec = parsed.spec;
  const auto& kinds = test_kinds();

  CHECK_FALSE(apply_override(spec, "node.gen.temperature=0.8", &kinds));
  CHECK(std::get<double>(spec.find_node("gen")->find_setting("temperature")->value) == 0.8);
  CHECK_FALSE(apply_override(spec, "node.gen.top_p=1e-5", &kinds));
  CHECK(std::get<double>(spec.find_node("gen")->find_setting("top_p")->value) == 1e-5);
  // Not written in the file, but declared by the kind.
  CHECK_FALSE(apply_override(spec, "node.gen.max_new_tokens=128", &kinds));
  CHECK(std::get<std::int64_t>(spec.find_node("gen")->find_setting("max_new_tokens")->value) == 128);
  CHECK_FALSE(apply_override(spec, "node.tok.add_bos=false", &kinds));
  CHECK_FALSE(std::get<bool>(spec.find_node("tok")->find_setting("add_bos")->value));
  // Strings: bare or quoted.
  CHECK_FALSE(apply_override(spec, "node.log.path=out/log.txt", &kinds));
  CHECK(std::get<std::string>(spec.find_node("log")->find_setting("path")->value) == "out/log.txt");
  CHECK_FALSE(apply_override(spec, "node.log.path=\"quoted name.txt\"", &kinds));
  CHECK(std::get<std::string>(spec.find_node("log")->find_setting("path")->value) == "quoted name.txt");
  CHECK_FALSE(apply_override(spec, "node.log.path=2024", &kinds));  // a string setting keeps the text
  CHECK(std::get<std::string>(spec.find_node("log")->find_setting("path")->value) == "2024");
  CHECK_FALSE(apply_override(spec, "graph.seed=99"));
  CHECK(spec.seed == 99);
  CHECK_FALSE(apply_override(spec, "graph.steps=3"));
  CHECK(spec.steps == 3);
  CHECK_FALSE(apply_override(spec, "graph.name=renamed"));
  CHECK(spec.name == "renamed");
  CHECK_FALSE(apply_override(spec, "node.gen.replicas=3"));
  CHECK(spec.find_node("gen")->replicas == 3);
  CHECK_FALSE(apply_override(spec, "node.gen.on=gpu1"));
  CHECK(spec.find_node("gen")->on == "gpu1");
  // Without the registry only settings written in the file exist.
  CHECK_FALSE(apply_override(spec, "node.prompts.max_lines=2"));
  auto no_registry = apply_override(spec, "node.gen.top_k=3");
  REQUIRE(no_registry);
  CHECK(contains(no_registry->message, "unknown setting 'top_k'"));

  auto v = validate(spec, kinds, test_options());
  INFO(all_errors(v.errors));
  CHECK(v.ok());
  CHECK(v.spec.find_node("gen")->get_int("max_new_tokens") == 128);

  // A node whose kind is unknown takes any setting: the validator names the kind alone (the override's
  // "unknown setting ... valid settings: ..." only confused, and a setting new to the node crashed)
  graph_spec typo = parsed.spec;
  typo.find_node("gen")->kind = "generatr";
  CHECK_FALSE(apply_override(typo, "node.gen.brand_new=3", &kinds));
  CHECK_FALSE(apply_override(typo, "node.gen.out_path=/tmp/x", &kinds));
  auto tv = validate(typo, kinds, test_options());
  INFO(all_errors(tv.errors));
  CHECK(std::none_of(tv.errors.begin(), tv.errors.end(),
                     [](const graph_error& e) { return contains(e.message, "unknown setting"); }));
  CHECK(std::any_of(tv.errors.begin(), tv.errors.end(),
                    [](const graph_error& e) { return contains(e.message, "unknown node kind 'generatr'"); }));
}

TEST_CASE("unknown settings: another tool's name gets its hint, a setting of another node names that node") {
  const std::string text = R"(edges = ["src.lines -> t.data", "t.weights -> p.weights [feedback]", "p.games -> out"]
[node.src]
kind = "text_source"
path = "data/prompts.txt"
[node.t]
kind = "trainer"
[node.p]
kind = "player"
lr = 0.5
[node.out]
kind = "sink"
)";
  auto parsed = parse_graph_string(text, graphs_dir / "good" / "hints.graph");
  REQUIRE(parsed.ok());
  auto v = validate(parsed.spec, test_kinds(), test_options());
  REQUIRE(v.errors.size() == 1);
  CHECK(v.errors[0].message == "unknown setting 'lr' for node 'p' (kind player)");
  CHECK(v.errors[0].hint == "'lr' is a setting of [node.t] (kind trainer): write it there");
  // the same through --set, and a foreign name's hint (not "did you mean")
  graph_spec spec = parsed.spec;
  auto e = apply_override(spec, "node.p.tags=[]", &test_kinds());
  REQUIRE(e);
  CHECK(e->hint == "'tags' is a setting of [node.t] (kind trainer): write it there");
  e = apply_override(spec, "node.t.learning_rate_init=0.1", &test_kinds());
  REQUIRE(e);
  CHECK(e->hint == "sklearn's learning_rate_init is lr here");
  CHECK(contains(explain(*test_kinds().lookup("trainer")),
                 "other tools' names:\n  learning_rate_init: sklearn's learning_rate_init is lr here\n"));
  // a fraction for an int setting >= 1: offered 1, inside the range (0.5 was offered 0)
  e = apply_override(spec, "node.t.batch=0.5", &test_kinds());
  REQUIRE_FALSE(e);
  auto vb = validate(spec, test_kinds(), test_options());
  REQUIRE(vb.errors.size() == 2);  // and p's lr
  CHECK(std::any_of(vb.errors.begin(), vb.errors.end(),
                    [](const graph_error& x) { return x.hint == "write batch = 1 (`flowrun explain trainer`)"; }));
  // a kind whose foreign name is one of its own settings is a programmer error
  node_kind_registry r;
  CHECK_THROWS_WITH_AS(r.register_kind(node_kind{"k"}.option("lr", setting_type::float_, 0.1, "").known_as("lr", "x")),
                       "node kind 'k': known_as(\"lr\") names a setting of the kind itself", std::invalid_argument);
}

TEST_CASE("overrides: errors name the override and the offending column") {
  auto parsed = parse_graph_file(graphs_dir / "good/pipeline.graph");
  REQUIRE(parsed.ok());
  graph_spec spec = parsed.spec;
  const auto& kinds = test_kinds();
  struct bad {
    const char* text;
    const char* message;
    const char* hint;
    int col;
  };
  const bad cases[] = {
      {"node.gen.tempreature=1", "unknown setting 'tempreature' of node 'gen'", "did you mean 'temperature'?", 10},
      {"node.gne.top_k=3", "unknown node 'gne'", "did you mean 'gen'?", 6},
      {"node.gen.temperature", "has no '='", "--set node.NAME.SETTING=VALUE", 1},
      {"nodes.gen.top_k=3", "unknown override path", "node.NAME.SETTING=VALUE", 1},
      {"node.gen=3", "unknown override path", "node.NAME.SETTING=VALUE", 1},
      {"graph.sed=3", "unknown graph key 'sed'", "did you mean 'seed'?", 7},
      {"graph.seed=-3", "graph seed must be a non-negative integer", "graph.seed=", 12},
      {"graph.steps=many", "graph steps must be an integer", "graph.steps=", 13},
      {"node.gen.replicas=two", "replicas must be an integer", "replicas=2", 19},
      // tests/fuzz/fuzz_graph: a Latin-1 bare string came back from to_toml as other characters
      {"graph.name=caf\xe9", "override value is not UTF-8 text (byte 0xe9)", "--set values are UTF-8", 15},
      {"node.gen.prompt=\xed\xa0\x80", "not UTF-8 text (byte 0xed)", "iconv", 17},  // a surrogate
  };
  for (const auto& c : cases) {
    CAPTURE(std::string(c.text));
    auto e = apply_override(spec, c.text, &kinds);
    REQUIRE(e);
    CHECK(contains(e->message, c.message));
    CHECK(contains(e->hint, c.hint));
    CHECK(e->file == std::string("--set ") + c.text);
    CHECK(e->line == 1);
    CHECK(e->col == c.col);
  }
  // A value of the wrong type is caught by the validator, at the override.
  CHECK_FALSE(apply_override(spec, "node.gen.top_k=abc", &kinds));
  auto v = validate(spec, kinds, test_options());
  REQUIRE(v.errors.size() == 1);
  CHECK(v.errors[0].to_string() ==
        "--set node.gen.top_k=abc:1:16: error: setting 'top_k' of node 'gen' must be int, got string \"abc\"\n"
        "  hint: write top_k = 0 (`flowrun explain generator`)");
  {  // a fraction for an int: the hint keeps the user's number (it offered the default)
    graph_spec s2 = parsed.spec;
    CHECK_FALSE(apply_override(s2, "node.gen.top_k=8.5", &kinds));
    auto v2 = validate(s2, kinds, test_options());
    REQUIRE(v2.errors.size() == 1);
    CHECK(v2.errors[0].hint == "write top_k = 8 (`flowrun explain generator`)");
  }
  // A number TOML cannot hold arrives as a string: the message says it is out of range.
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"node.gen.temperature=1e999", "(1e999 is out of the range of a double"},
           {"node.gen.top_k=99999999999999999999", "(99999999999999999999 is out of the range of a 64-bit integer)"}}) {
    CAPTURE(text);
    graph_spec big = parsed.spec;
    CHECK_FALSE(apply_override(big, text, &kinds));
    auto r = validate(big, kinds, test_options());
    REQUIRE(r.errors.size() == 1);
    CHECK(contains(r.errors[0].message, says));
  }
}

TEST_CASE("overrides: a UTF-8 bare string survives to_toml and a re-read") {
  // What a cluster node receives is to_toml of the overridden spec (tests/fuzz/fuzz_graph checks this for
  // every graph it reads; a non-UTF-8 value is refused above).
  auto parsed = parse_graph_file(graphs_dir / "good/pipeline.graph");
  REQUIRE(parsed.ok());
  graph_spec spec = parsed.spec;
  REQUIRE_FALSE(apply_override(spec, "graph.name=caf\xc3\xa9 \xe2\x9c\x93 \\ \"q\"", &test_kinds()));
  CHECK(spec.name == "caf\xc3\xa9 \xe2\x9c\x93 \\ \"q\"");
  auto again = parse_graph_string(to_toml(spec));
  REQUIRE(again.ok());
  CHECK(again.spec.name == spec.name);
  CHECK(to_toml(again.spec) == to_toml(spec));
}

TEST_CASE("to_toml keeps every [graph] key: what a cluster node receives") {
  // bench/chaos_soak.sh: on a cluster, sft/rm on a node wrote no done marker and the ppo_controller there
  // committed no step-3 checkpoint: to_toml dropped checkpoint_dir, so every node but main saw it empty.
  auto parsed = parse_graph_file(graphs_dir / "good/pipeline.graph");
  REQUIRE(parsed.ok());
  graph_spec spec = parsed.spec;
  for (const char* o : {"graph.name=g2", "graph.seed=77", "graph.steps=5", "graph.console_port=8123",
                        "graph.checkpoint_dir=/tmp/run/ck"})
    REQUIRE_FALSE(apply_override(spec, o, &test_kinds()));
  auto again = parse_graph_string(to_toml(spec));
  REQUIRE(again.ok());
  CHECK(again.spec.name == "g2");
  CHECK(again.spec.seed == 77);
  CHECK(again.spec.steps == 5);
  CHECK(again.spec.console_port == 8123);
  CHECK(again.spec.checkpoint_dir == "/tmp/run/ck");
}

TEST_CASE("overrides: load_graph applies them before validating") {
  auto r = load("good/pipeline.graph", {"node.gen.temperature=0.7", "node.prompts.max_lines=2"});
  INFO(all_errors(r.errors));
  REQUIRE(r.ok());
  CHECK(r.spec.find_node("gen")->get_float("temperature") == doctest::Approx(0.7));
  auto bad = load("good/pipeline.graph", {"node.gen.temperature=hot", "node.nope.x=1"});
  REQUIRE(bad.errors.size() == 2);
  // Sorted by "file" (the override text): node.gen... before node.nope...
  CHECK(contains(bad.errors[0].message, "must be float, got string \"hot\""));
  CHECK(contains(bad.errors[1].message, "unknown node 'nope'"));
}

TEST_CASE("a spec written back to TOML reads the same") {
  auto r = load("good/pipeline.graph");
  REQUIRE(r.ok());
  std::string text = to_toml(r.spec);
  auto parsed = parse_graph_string(text, graphs_dir / "good" / "roundtrip.graph");
  INFO(text);
  INFO(all_errors(parsed.errors));
  REQUIRE(parsed.ok());
  // the kinds' defaults are left out of the text and filled in again, marked as defaults, by validation (a
  // cluster node validates what it receives: a default read as written set off the checks on user settings)
  auto again = validate(parsed.spec, test_kinds(), test_options());
  INFO(all_errors(again.errors));
  REQUIRE(again.ok());
  CHECK(again.spec.name == r.spec.name);
  CHECK(again.spec.seed == r.spec.seed);
  CHECK(again.spec.steps == r.spec.steps);
  REQUIRE(again.spec.nodes.size() == r.spec.nodes.size());
  for (std::size_t i = 0; i < r.spec.nodes.size(); ++i) {
    const auto& a = r.spec.nodes[i];
    const auto& b = again.spec.nodes[i];
    CHECK(a.name == b.name);
    CHECK(a.kind == b.kind);
    CHECK(a.replicas == b.replicas);
    CHECK(a.on == b.on);
    REQUIRE(a.settings.size() == b.settings.size());
    for (const auto& [k, s] : a.settings) {
      CAPTURE(k);
      CHECK(b.find_setting(k)->value == s.value);
      CHECK(b.find_setting(k)->from_default == s.from_default);
    }
  }
  // at least one setting of the pipeline is a default and one is written, so both ways are exercised
  bool some_default = false, some_written = false;
  for (const auto& n : r.spec.nodes)
    for (const auto& [k, s] : n.settings) (s.from_default ? some_default : some_written) = true;
  CHECK(some_default);
  CHECK(some_written);
  REQUIRE(again.spec.edges.size() == r.spec.edges.size());
  for (std::size_t i = 0; i < r.spec.edges.size(); ++i) {
    CHECK(again.spec.edges[i].to_string() == r.spec.edges[i].to_string());
    CHECK(again.spec.edges[i].credit == r.spec.edges[i].credit);
    CHECK(again.spec.edges[i].dispatch == r.spec.edges[i].dispatch);
    CHECK(again.spec.edges[i].feedback == r.spec.edges[i].feedback);
  }
}

TEST_CASE("a spec built in code is validated too") {
  graph_spec g;
  g.name = "built";
  node_spec a;
  a.name = "a";
  a.kind = "sink";
  g.nodes.push_back(a);
  g.nodes.push_back(a);  // duplicate name
  edge_spec e;
  e.from_node = "a";
  e.to_node = "a";
  e.credit = -2;
  g.edges.push_back(e);
  auto r = validate(g, test_kinds());
  INFO(all_errors(r.errors));
  REQUIRE(r.errors.size() == 3);
  for (const auto& err : r.errors) CHECK(err.file == "<graph>");
  CHECK(contains(all_errors(r.errors), "duplicate node name 'a'"));
  CHECK(contains(all_errors(r.errors), "edge credit must be >= 1"));
  CHECK(contains(all_errors(r.errors), "node 'a' (kind sink) has no out ports"));
}

TEST_CASE("node_kind::check: whole-graph checks run once the rest is valid, errors at the setting") {
  node_kind_registry r;
  r.register_kind(node_kind{"lines_source", "emits lines"}.output("lines", "text"));
  // a sink whose `out` must not be the name of any node that feeds it (a made-up cross-node rule)
  auto k = node_kind{"checked_sink", "a sink with a graph check"}.input("items", "text").option(
      "out", setting_type::string, std::string(""), "a name");
  int calls = 0;
  k.check = [&calls](const node_spec& n, const graph_spec& g) {
    ++calls;
    std::vector<node_kind::problem> p;
    for (const auto& e : g.edges)
      if (e.to_node == n.name && e.from_node == n.get_string("out"))
        p.push_back({"out", "node '" + n.name + "': out names its own input '" + e.from_node + "'", "rename it"});
    if (n.get_string("out") == "boom") throw std::runtime_error("the check failed");
    return p;
  };
  r.register_kind(k);
  const std::string text = R"(edges = ["src.lines -> out.items"]
[graph]
name = "g"
[node.src]
kind = "lines_source"
[node.out]
kind = "checked_sink"
out = "src"
)";
  auto parsed = parse_graph_string(text, "checked.graph");
  REQUIRE(parsed.errors.empty());
  auto res = validate(parsed.spec, r);
  REQUIRE(res.errors.size() == 1);
  CHECK(calls == 1);
  CHECK(res.errors[0].message == "node 'out': out names its own input 'src'");
  CHECK(res.errors[0].hint == "rename it");
  CHECK(res.errors[0].line == 8);  // at the setting's value
  CHECK(res.errors[0].col == 7);
  // not run when files are not checked (checks may read them), nor when other errors exist
  validate_options no_files;
  no_files.check_files = false;
  CHECK(validate(parsed.spec, r, no_files).ok());
  auto broken = parsed.spec;
  broken.nodes[0].kind = "no_such_kind";
  calls = 0;
  CHECK(validate(broken, r).errors.size() >= 1);
  CHECK(calls == 0);
  // a check that throws is reported as an error of the node
  auto boom = parsed.spec;
  boom.nodes[1].settings["out"].value = std::string("boom");
  auto rb = validate(boom, r);
  REQUIRE(rb.errors.size() == 1);
  CHECK(contains(rb.errors[0].message, "node 'out' (kind checked_sink): the check failed"));
}

TEST_CASE("node_kind::default_by: an unwritten setting's default follows the node's other settings") {
  // as the experience maker's kl_ctl follows advantage_estimator (DS-Chat's 0.1 for gae, 0 for grpo)
  node_kind_registry r;
  r.register_kind(node_kind{"lines_source", "emits lines"}.output("lines", "text"));
  auto k = node_kind{"mode_sink", "a sink whose coef default depends on its mode"}
               .input("items", "text")
               .option("mode", setting_type::string, std::string("a"), "a or b")
               .option("coef", setting_type::float_, 0.1, "0.1 with mode a, 0 with mode b")
               .at_least(0)
               .default_by([](const node_spec& n) -> setting_value {
                 if (n.get_string("mode") == "b") return 0.0;
                 if (n.get_string("mode") == "bad") return -1.0;  // outside the range: reported
                 return 0.1;
               });
  r.register_kind(k);
  CHECK_THROWS_AS(node_kind{"x"}.default_by([](const node_spec&) { return setting_value{1.0}; }),
                  std::invalid_argument);  // no setting to attach it to
  auto run = [&](const std::string& extra) {
    auto parsed = parse_graph_string("edges = [\"src.lines -> out.items\"]\n[graph]\nname = \"g\"\n[node.src]\n"
                                     "kind = \"lines_source\"\n[node.out]\nkind = \"mode_sink\"\n" + extra,
                                     "modes.graph");
    REQUIRE(parsed.errors.empty());
    return validate(parsed.spec, r);
  };
  auto coef = [](const validation_result& v) { return v.spec.nodes[1].settings.at("coef"); };
  auto a = run("");
  REQUIRE(a.ok());
  CHECK(coef(a).value == setting_value{0.1});
  CHECK(coef(a).from_default);
  auto b = run("mode = \"b\"\n");
  REQUIRE(b.ok());
  CHECK(coef(b).value == setting_value{0.0});
  CHECK(coef(b).from_default);
  auto written = run("mode = \"b\"\ncoef = 0.5\n");  // a written value wins
  REQUIRE(written.ok());
  CHECK(coef(written).value == setting_value{0.5});
  CHECK_FALSE(coef(written).from_default);
  auto bad = run("mode = \"bad\"\n");
  REQUIRE(bad.errors.size() == 1);
  CHECK(contains(bad.errors[0].message, "the default of setting 'coef' of node 'out' (kind mode_sink)"));
  CHECK(contains(bad.errors[0].hint, "write coef = "));
}

// ------------------------------------------------------------ bad graphs

namespace {

struct expected_error {
  int line;
  int col;
  const char* message;
  const char* hint;            // a substring of the hint ("" checks only that there is one)
  const char* file = nullptr;  // suffix of the error's file; default: the graph itself
};

struct bad_graph {
  const char* file;
  std::vector<expected_error> errors;  // all of them, in order
};

const std::vector<bad_graph>& bad_graphs() {
  static const std::vector<bad_graph> cases = {
      {"syntax_error.graph", {{5, 23, "TOML syntax error", "valid TOML"}}},
      {"duplicate_node.graph", {{8, 1, "duplicate node name 'out'", "may appear once"}}},
      {"unknown_kind.graph", {{7, 8, "unknown node kind 'sinc'", "did you mean 'sink'?"}}},
      {"unknown_port.graph", {{2, 11, "node 'src' (kind text_source) has no port 'line'", "did you mean 'lines'?"}}},
      {"unconnected_port.graph",
       {{6, 1, "required in port 'items' (text) of node 'out' (kind sink) is not connected",
         "add an edge such as \"src.lines -> out.items\""}}},
      {"type_mismatch.graph",
       {{3, 17, "message type mismatch: 'src.lines' sends 'text' but 'gen.prompts' expects 'tokens'",
         "no node in the graph has an out port of type 'tokens'"}}},
      {"unknown_setting.graph",
       {{13, 1, "unknown setting 'temprature' for node 'gen' (kind generator)", "did you mean 'temperature'?"}}},
      {"wrong_setting_type.graph",
       {{13, 18, "setting 'max_new_tokens' of node 'gen' must be int, got string \"48\"",
         "write max_new_tokens = 48"}}},  // the user's number, not the default (64)
      {"cycle.graph",
       {{5, 3, "cycle without a feedback edge: tok -> gen -> tok", "\"gen.completions -> tok.text [feedback]\""}}},
      {"missing_file.graph",
       {{5, 8, "file not found for setting 'path' of node 'src': 'data/missing.txt' (looked in '", "FLOWRUN_ASSETS"}}},
      {"replicas_zero.graph", {{8, 12, "node 'out' has replicas = 0; replicas must be >= 1", "copies"}}},
      {"bad_arrow.graph",
       {{2, 21, "malformed edge: expected '->' after 'src.lines', found '='", "node.port -> node.port"}}},
      {"bad_credit.graph", {{2, 42, "edge option credit must be a positive integer, got '0'", "[credit=4]"}}},
      {"bad_dispatch.graph", {{2, 39, "unknown dispatch mode 'splt'", "did you mean 'split'?"}}},
      {"unknown_edge_node.graph", {{2, 24, "edge to unknown node 'otu'", "did you mean 'out'?"}}},
      {"ambiguous_target.graph",
       {{2, 18, "ambiguous edge target: node 'm' (kind merger) has several in ports of type 'text'",
         "name the port: m.a or m.b"}}},
      {"no_matching_port.graph",
       {{2, 18, "node 'gen' (kind generator) has no in port of type 'text' for 'src.lines'",
         "in ports of generator: prompts (tokens)"}}},
      {"include_cycle.graph", {{2, 12, "include cycle: ", "remove one of these includes", "bad/inc/cycle_b.inc"}}},
      {"missing_include.graph", {{2, 12, "included file not found: '", "relative to the including file"}}},
      {"missing_required_setting.graph",
       {{9, 1, "node 'gen' (kind generator) is missing required setting 'model' (path)",
         "add model = \"path/to/file\" to [node.gen]"}}},
      {"unknown_top_key.graph", {{2, 1, "unknown top-level key 'edge'", "did you mean 'edges'?"}}},
      {"in_port_as_source.graph",
       {{2, 36, "'tok.text' is an in port; an edge must start at an out port", "out ports of tokenizer: tokens"}}},
      {"missing_kind.graph", {{6, 1, "node 'out' has no kind", "add kind = \"...\" to [node.out]"}}},
      {"table_setting.graph",
       {{8, 11, "setting 'options' of node 'out' has an unsupported value: a table", "arrays of strings"}}},
      {"duplicate_edge.graph", {{4, 3, "duplicate edge 'src.lines -> out.items'", "duplicate_edge.graph:3:3"}}},
      {"unknown_option.graph", {{2, 35, "unknown edge option 'credits'", "did you mean 'credit'?"}}},
      {"bad_graph_key.graph", {{5, 1, "unknown key 'sed' in [graph]", "did you mean 'seed'?"}}},
      {"error_in_include.graph",
       {{5, 13, "setting 'max_lines' of node 'src' must be int, got string \"ten\"", "max_lines = 0",
         "bad/inc/bad_setting.inc"}}},
      {"bad_node_name.graph", {{8, 7, "invalid node name '2nd'", "identifiers"}}},
      {"negative_steps.graph", {{4, 9, "graph steps must be >= 0, got -1", "steps = 0"}}},
      {"missing_port_name.graph", {{2, 28, "expected a port name after 'out.', found the end of the edge", ""}}},
      {"bad_replicas_type.graph", {{8, 12, "replicas must be an integer, got a string", "replicas = 2"}}},
      {"edges_in_graph.graph", {{4, 1, "unknown key 'edges' in [graph]", "edges is a top-level key"}}},
      {"multiple_errors.graph",
       {{4, 36, "unknown dispatch mode 'fan_out'", "dispatch is one of broadcast, split, round_robin"},
        {11, 12, "node 'out' has replicas = 0", ""},
        {13, 8, "unknown node kind 'tokeniser'", "did you mean 'tokenizer'?"},
        {15, 1, "required in port 'prompts' (tokens) of node 'gen' (kind generator) is not connected", ""},
        {19, 9, "setting 'top_k' of node 'gen' must be int, got float 0.5", "write top_k = 0"}}},
  };
  return cases;
}

}  // namespace

TEST_CASE("bad graphs: each reports its error at the exact line and column") {
  std::size_t files_on_disk = 0;
  for (const auto& entry : fs::directory_iterator(graphs_dir / "bad"))
    if (entry.path().extension() == ".graph") ++files_on_disk;
  CHECK(files_on_disk == bad_graphs().size());  // every bad file has a case
  CHECK(bad_graphs().size() >= 18);

  for (const auto& c : bad_graphs()) {
    CAPTURE(std::string(c.file));
    auto r = load(std::string("bad/") + c.file);
    INFO(all_errors(r.errors));
    REQUIRE(r.errors.size() == c.errors.size());
    for (std::size_t i = 0; i < c.errors.size(); ++i) {
      const auto& want = c.errors[i];
      const auto& got = r.errors[i];
      CAPTURE(std::string(want.message));
      CHECK(contains(got.message, want.message));
      CHECK(got.line == want.line);
      CHECK(got.col == want.col);
      CHECK_FALSE(got.hint.empty());
      CHECK(contains(got.hint, want.hint));
      CHECK(ends_with(got.file, want.file ? std::string(want.file) : std::string("bad/") + c.file));
      // The formatted form starts with the position.
      CHECK(got.to_string().rfind(
                got.file + ":" + std::to_string(want.line) + ":" + std::to_string(want.col) + ": error: ", 0) == 0);
    }
  }
}

TEST_CASE("bad graphs: details of some messages") {
  auto missing = load("bad/missing_file.graph");
  REQUIRE(missing.errors.size() == 1);
  CHECK(contains(missing.errors[0].message, "bad/data/missing.txt"));
  CHECK(contains(missing.errors[0].message, "assets/data/missing.txt"));

  auto cycle = load("bad/include_cycle.graph");
  REQUIRE(cycle.errors.size() == 1);
  CHECK(contains(cycle.errors[0].message, "bad/include_cycle.graph -> "));
  CHECK(contains(cycle.errors[0].message, "bad/inc/cycle_a.inc -> "));
  CHECK(ends_with(cycle.errors[0].message,
                  "bad/inc/cycle_b.inc -> " + (graphs_dir / "bad/include_cycle.graph").lexically_normal().string()));

  auto syntax = load("bad/syntax_error.graph");
  REQUIRE(syntax.errors.size() == 1);
  CHECK(syntax.errors[0].message ==
        "TOML syntax error: unescaped control characters other than TAB (U+0009) are explicitly prohibited "
        "(in a string)");

  auto no_file = load("bad/does_not_exist.graph");
  REQUIRE(no_file.errors.size() == 1);
  CHECK(contains(no_file.errors[0].message, "cannot open graph file"));
  CHECK(no_file.errors[0].line == 1);

  // Without an asset root the hint says so.
  validate_options no_root;
  auto r = load_graph(graphs_dir / "bad/missing_file.graph", test_kinds(), no_root);
  REQUIRE(r.errors.size() == 1);
  CHECK(contains(r.errors[0].hint, "no asset root was given"));

  // check_files = false skips the existence check.
  validate_options no_check = test_options();
  no_check.check_files = false;
  CHECK(load_graph(graphs_dir / "bad/missing_file.graph", test_kinds(), no_check).ok());
}

TEST_CASE("parse_graph_string: errors name the given source") {
  auto r = parse_graph_string("[graph]\nname = 3\n", "inline.graph");
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].to_string() ==
        "inline.graph:2:8: error: graph name must be a string, got an integer\n  hint: write name = \"my_graph\"");
  auto empty = parse_graph_string("[graph]\nname = \"empty\"\n", "empty.graph");
  REQUIRE(empty.ok());
  auto v = validate(empty.spec, test_kinds());
  REQUIRE(v.errors.size() == 1);
  CHECK(v.errors[0].to_string().rfind("empty.graph:1:1: error: graph 'empty' has no nodes", 0) == 0);
  auto syntax = parse_graph_string("[graph\n", "broken.graph");
  REQUIRE(syntax.errors.size() == 1);
  CHECK(syntax.fatal);
  CHECK(syntax.errors[0].file == "broken.graph");
  CHECK(syntax.errors[0].line == 1);
}

// ------------------------------------------------------------ clusters (docs/scaling.md)

namespace {
const char* cluster_graph = R"(edges = ["src.lines -> sink.items"]
[graph]
name = "c"
[node.src]
kind = "text_source"
path = "x.txt"
on = "node-1"
[node.sink]
kind = "sink"
replicas = 2
on = ["main", "node-2"]
[cluster]
heartbeat_ms = 250
lost_after_ms = 2000
[cluster.nodes.node-1]
address = "127.0.0.1:7001"
cpus = 4
[cluster.nodes.node-2]
address = "10.0.0.2:7002"
gpus = 1
)";
}  // namespace

TEST_CASE("cluster: [cluster] and on = ... (per node and per replica) are read and checked") {
  auto r = parse_graph_string(cluster_graph, "c.graph");
  REQUIRE_MESSAGE(r.ok(), all_errors(r.errors));
  const auto& c = r.spec.cluster;
  REQUIRE(c.nodes.size() == 2);
  CHECK(c.nodes[0].name == "node-1");
  CHECK(c.nodes[0].host == "127.0.0.1");
  CHECK(c.nodes[0].port == 7001);
  CHECK(c.nodes[0].cpus == 4);
  CHECK(c.nodes[1].gpus == 1);
  CHECK(c.heartbeat_ms == 250);
  CHECK(c.lost_after_ms == 2000);
  CHECK(check_placement(r.spec).empty());
  CHECK(placement_of(*r.spec.find_node("src"), 0) == "node-1");
  CHECK(placement_of(*r.spec.find_node("sink"), 0) == "main");
  CHECK(placement_of(*r.spec.find_node("sink"), 1) == "node-2");
  // to_toml keeps per-replica placement (the coordinator ships the graph to the nodes as TOML)
  auto again = parse_graph_string(to_toml(r.spec), "again.graph");
  REQUIRE(again.ok());
  CHECK(again.spec.find_node("sink")->on_replicas == std::vector<std::string>{"main", "node-2"});
}

TEST_CASE("cluster: an unknown node in on = ... is an error at the line of the on value") {
  std::string text = cluster_graph;
  text.replace(text.find("on = \"node-1\""), 13, "on = \"node-9\"");
  auto r = parse_graph_string(text, "c.graph");
  REQUIRE(r.ok());
  auto errors = check_placement(r.spec);
  REQUIRE(errors.size() == 1);
  const std::string e = all_errors(errors);
  CHECK_MESSAGE(contains(e, "c.graph:7:6: error: node 'src': on = \"node-9\" names no node of the cluster"), e);
  CHECK_MESSAGE(contains(e, "did you mean 'node-1'?"), e);
  // one entry per replica
  std::string t2 = cluster_graph;
  t2.replace(t2.find("replicas = 2"), 12, "replicas = 3");
  auto r2 = parse_graph_string(t2, "c.graph");
  const std::string e2 = all_errors(check_placement(r2.spec));
  CHECK_MESSAGE(contains(e2, "c.graph:11:6: error: node 'sink' places 2 replicas with on = [...] but has replicas = 3"), e2);
  // without a cluster, `on` is not interpreted
  auto r3 = parse_graph_string("[node.a]\nkind = \"sink\"\non = \"gpu0\"\n", "n.graph");
  CHECK(check_placement(r3.spec).empty());
  // a [cluster] table without nodes: `on` is checked, and the hint says what is missing
  auto r4 = parse_graph_string("[cluster]\nheartbeat_ms = 500\n[node.a]\nkind = \"sink\"\non = \"w1\"\n", "e.graph");
  const std::string e4 = all_errors(check_placement(r4.spec));
  CHECK_MESSAGE(contains(e4, "e.graph:5:6: error: node 'a': on = \"w1\" names no node of the cluster"), e4);
  CHECK_MESSAGE(contains(e4, "the [cluster] table declares no nodes: add a [cluster.nodes.w1] table"), e4);
  auto r5 = parse_graph_string("[cluster]\n[node.a]\nkind = \"sink\"\non = \"main\"\n", "m.graph");
  CHECK(check_placement(r5.spec).empty());
}

TEST_CASE("cluster: bad [cluster] entries are errors with file:line:col") {
  auto r = parse_graph_string(R"([cluster]
heartbeat_ms = 0
on_node_lost = "elastic"
colour = 1
[cluster.nodes.a]
address = "localhost"
[cluster.nodes.b]
address = "h:70000"
cpus = -1
[cluster.nodes.main]
address = "h:1"
[cluster.nodes.c]
adress = "h:1"
)",
                              "bad.graph");
  const std::string e = all_errors(r.errors);
  CHECK_MESSAGE(contains(e, "bad.graph:2:16: error: cluster heartbeat_ms must be an integer >= 1"), e);
  CHECK_MESSAGE(contains(e, "bad.graph:3:16: error: cluster on_node_lost must be \"stop\" or \"restart\", got \"elastic\""), e);
  CHECK_MESSAGE(contains(e, "bad.graph:4:1: error: unknown key 'colour' in [cluster]"), e);
  CHECK_MESSAGE(contains(e, "bad.graph:6:11: error: cluster node 'a': address must be \"HOST:PORT\""), e);
  CHECK_MESSAGE(contains(e, "bad.graph:8:11: error: cluster node 'b': address must be"), e);
  CHECK_MESSAGE(contains(e, "bad.graph:9:8: error: cluster node 'b': cpus must be an integer >= 0"), e);
  CHECK_MESSAGE(contains(e, "error: invalid cluster node name 'main'"), e);
  CHECK_MESSAGE(contains(e, "bad.graph:13:1: error: unknown key 'adress' in [cluster.nodes.c]"), e);
  CHECK_MESSAGE(contains(e, "did you mean 'address'?"), e);
}

TEST_CASE("cluster: lost_after_ms under 2 x heartbeat_ms is refused, and bad numbers show their value") {
  auto r = parse_graph_string(R"([cluster]
heartbeat_ms = 500
lost_after_ms = 900
connect_timeout_ms = 0
[cluster.nodes.a]
address = "h:1"
cpus = -4
)",
                              "hb.graph");
  const std::string e = all_errors(r.errors);
  CHECK_MESSAGE(contains(e, "hb.graph:3:17: error: cluster lost_after_ms (900) must be at least 2 x heartbeat_ms (500)"), e);
  CHECK_MESSAGE(contains(e, "at least 6 heartbeats are recommended: write lost_after_ms = 3000"), e);
  CHECK_MESSAGE(contains(e, "hb.graph:4:22: error: cluster connect_timeout_ms must be an integer >= 1 (milliseconds), got 0"), e);
  CHECK_MESSAGE(contains(e, "hb.graph:7:8: error: cluster node 'a': cpus must be an integer >= 0, got -4"), e);
  auto ok = parse_graph_string("[cluster]\nheartbeat_ms = 100\nlost_after_ms = 200\nconnect_timeout_ms = 2500\n"
                               "[cluster.nodes.a]\naddress = \"h:1\"\n",
                               "ok.graph");
  REQUIRE_MESSAGE(ok.ok(), all_errors(ok.errors));
  CHECK(ok.spec.cluster.connect_timeout_ms == 2500);
  CHECK(parse_graph_string("[cluster]\n[cluster.nodes.a]\naddress = \"h:1\"\n", "d.graph").spec.cluster.connect_timeout_ms ==
        10000);
  // on_node_lost = "restart" with max_restarts (default 3; an integer >= 0)
  auto rs = parse_graph_string("[cluster]\non_node_lost = \"restart\"\nmax_restarts = 0\n[cluster.nodes.a]\naddress = \"h:1\"\n",
                               "r.graph");
  REQUIRE_MESSAGE(rs.ok(), all_errors(rs.errors));
  CHECK(rs.spec.cluster.on_node_lost == "restart");
  CHECK(rs.spec.cluster.max_restarts == 0);
  CHECK(parse_graph_string("[cluster]\n", "d.graph").spec.cluster.max_restarts == 3);
  CHECK(parse_graph_string("[cluster]\nrejoin_wait_ms = 1500\n", "j.graph").spec.cluster.rejoin_wait_ms == 1500);
  auto twins = parse_graph_string("[cluster]\n[cluster.nodes.a]\naddress = \"h:1\"\n[cluster.nodes.b]\naddress = \"h:1\"\n",
                                  "t.graph");
  CHECK_MESSAGE(contains(all_errors(twins.errors), "t.graph:5:11: error: cluster nodes 'a' and 'b' have the same address h:1"),
                all_errors(twins.errors));
  CHECK(parse_graph_string("[cluster]\n", "d.graph").spec.cluster.rejoin_wait_ms == 0);
  auto neg = parse_graph_string("[cluster]\nmax_restarts = -1\n", "n.graph");
  CHECK_MESSAGE(contains(all_errors(neg.errors), "n.graph:2:16: error: cluster max_restarts must be an integer >= 0, got -1"),
                all_errors(neg.errors));
  // main_address: where the nodes reach this process's bulk plane (default 127.0.0.1); a host, no port
  CHECK(parse_graph_string("[cluster]\n[cluster.nodes.a]\naddress = \"h:1\"\n", "d.graph").spec.cluster.main_address ==
        "127.0.0.1");
  auto ma = parse_graph_string("[cluster]\nmain_address = \"10.0.0.5\"\n[cluster.nodes.a]\naddress = \"h:1\"\n", "m.graph");
  REQUIRE_MESSAGE(ma.ok(), all_errors(ma.errors));
  CHECK(ma.spec.cluster.main_address == "10.0.0.5");
  auto bad = parse_graph_string("[cluster]\nmain_address = \"10.0.0.5:7000\"\n", "b.graph");
  const std::string be = all_errors(bad.errors);
  CHECK_MESSAGE(contains(be, "b.graph:2:16: error: cluster main_address must be a host name, an IPv4 address or an "
                             "IPv6 address (no port), got \"10.0.0.5:7000\""), be);
  // an IPv6 address, bare or in brackets as URLs write it, stored bare (it was refused as a host with a port, so
  // nodes on IPv6 had no main to match: cluster_small case 1h)
  for (const char* v6 : {"::1", "[::1]", "fd00::5", "[fd00::5]"}) {
    auto ok = parse_graph_string(std::string("[cluster]\nmain_address = \"") + v6 + "\"\n", "v.graph");
    REQUIRE_MESSAGE(ok.ok(), std::string(v6), ": ", all_errors(ok.errors));
    CHECK(ok.spec.cluster.main_address == (std::string(v6).find("fd00") != std::string::npos ? "fd00::5" : "::1"));
  }
  // addresses gloo cannot listen on for the nodes: refused at the setting, saying why (each failed at the bulk
  // plane after the nodes were set up)
  for (const auto& [wrong, why] : std::vector<std::pair<std::string, std::string>>{
           {"0.0.0.0", "is no address the nodes can reach"},
           {"::", "is no address the nodes can reach"},
           {"::ffff:127.0.0.1", "is an IPv4 address written as IPv6"},
           {"[fe80::1]", "is link-local (fe80::/10)"}}) {
    auto no = parse_graph_string("[cluster]\nmain_address = \"" + wrong + "\"\n", "u.graph");
    CHECK_MESSAGE(contains(all_errors(no.errors), "u.graph:2:16: error: cluster main_address = \"" + wrong + "\" " + why),
                  wrong, ": ", all_errors(no.errors));
  }
  // a port after an IPv6 address, an address that is not one, brackets round a name: refused
  for (const char* wrong : {"[::1]:7000", "1::2::3", "[host]", "::1]", "host:7000"}) {
    auto no = parse_graph_string(std::string("[cluster]\nmain_address = \"") + wrong + "\"\n", "w.graph");
    CHECK_MESSAGE(contains(all_errors(no.errors), std::string("w.graph:2:16: error: cluster main_address must be a host "
                                                              "name, an IPv4 address or an IPv6 address (no port), got \"") +
                                                      wrong + "\""),
                  std::string(wrong), ": ", all_errors(no.errors));
  }
}

namespace {
// Placement by resources: three cluster nodes of different sizes.
const char* resources_graph = R"(edges = ["src.lines -> gen.items", "gen.items -> sink.items"]
[graph]
name = "r"
[node.src]
kind = "text_source"
path = "x.txt"
on = "any"
[node.gen]
kind = "sink"
replicas = 3
on = "any"
resources = { cpus = 2, gpus = 1 }
[node.sink]
kind = "sink"
[cluster.nodes.small]
address = "127.0.0.1:7001"
cpus = 2
[cluster.nodes.big]
address = "127.0.0.1:7002"
cpus = 8
gpus = 2
[cluster.nodes.mid]
address = "127.0.0.1:7003"
cpus = 4
gpus = 1
)";
}  // namespace

TEST_CASE("cluster: on = any assigns replicas by cpus/gpus, deterministically") {
  auto r = parse_graph_string(resources_graph, "r.graph");
  REQUIRE_MESSAGE(r.ok(), all_errors(r.errors));
  const auto* gen = r.spec.find_node("gen");
  CHECK(gen->resources.cpus == 2);
  CHECK(gen->resources.gpus == 1);
  CHECK(r.spec.find_node("src")->resources.cpus == 1);  // the default: 1 cpu, 0 gpus
  CHECK(r.spec.find_node("src")->resources.gpus == 0);
  CHECK(check_placement(r.spec).empty());  // "any" is a valid placement
  auto errors = assign_placement(r.spec);
  REQUIRE_MESSAGE(errors.empty(), all_errors(errors));
  // src (1 cpu): the node with the most cpus left after it: big (8 - 1 = 7)
  CHECK(r.spec.find_node("src")->on_replicas == std::vector<std::string>{"big"});
  // gen[0]: big has 7 cpus/2 gpus, mid 4/1, small no gpu -> big (5 left); gen[1]: big 5 -> 3, mid 4 -> 2 -> big;
  // gen[2]: big has no gpu left -> mid
  CHECK(r.spec.find_node("gen")->on_replicas == std::vector<std::string>{"big", "big", "mid"});
  CHECK(placement_of(*r.spec.find_node("gen"), 2) == "mid");
  // the sink has no "any": untouched (main)
  CHECK(r.spec.find_node("sink")->on_replicas.empty());
  CHECK(placement_of(*r.spec.find_node("sink"), 0) == "main");
  // the same graph and cluster give the same placement
  auto r2 = parse_graph_string(resources_graph, "r.graph");
  REQUIRE(assign_placement(r2.spec).empty());
  CHECK(r2.spec.find_node("gen")->on_replicas == r.spec.find_node("gen")->on_replicas);
  CHECK(r2.spec.find_node("src")->on_replicas == r.spec.find_node("src")->on_replicas);
  // the nodes receive explicit names (and the needs) through to_toml
  auto again = parse_graph_string(to_toml(r.spec), "again.graph");
  REQUIRE_MESSAGE(again.ok(), all_errors(again.errors));
  CHECK(again.spec.find_node("gen")->on_replicas == std::vector<std::string>{"big", "big", "mid"});
  CHECK(again.spec.find_node("gen")->resources.gpus == 1);
  CHECK(check_placement(again.spec).empty());
}

TEST_CASE("cluster: on = any in a list mixes explicit and resource placement, ties go to the first node") {
  std::string text = resources_graph;
  text.replace(text.find("on = \"any\"\nresources"), 10, "on = [\"main\", \"any\", \"small\"]");
  text.replace(text.find("cpus = 8"), 8, "cpus = 4");  // big and mid now both offer 4 cpus
  auto r = parse_graph_string(text, "r.graph");
  REQUIRE_MESSAGE(r.ok(), all_errors(r.errors));
  REQUIRE(check_placement(r.spec).empty());
  REQUIRE(assign_placement(r.spec).empty());
  // src: big and mid tie (3 left each): big is declared first. gen[1]: big 3 -> 1, mid 4 -> 2: mid.
  CHECK(r.spec.find_node("src")->on_replicas == std::vector<std::string>{"big"});
  CHECK(r.spec.find_node("gen")->on_replicas == std::vector<std::string>{"main", "mid", "small"});
  // without a cluster, "any" is not interpreted (one process)
  auto one = parse_graph_string("[node.a]\nkind = \"sink\"\non = \"any\"\n", "n.graph");
  CHECK(check_placement(one.spec).empty());
  CHECK(assign_placement(one.spec).empty());
  CHECK(one.spec.find_node("a")->on_replicas.empty());
}

TEST_CASE("cluster: a replica that fits nowhere is an error naming the node, its needs and the capacity left") {
  std::string text = resources_graph;
  text.replace(text.find("replicas = 3"), 12, "replicas = 4");
  auto r = parse_graph_string(text, "r.graph");
  REQUIRE(r.ok());
  auto errors = assign_placement(r.spec);
  REQUIRE(errors.size() == 1);
  const std::string e = all_errors(errors);
  CHECK_MESSAGE(contains(e, "r.graph:12:13: error: node 'gen': replica 3 of 4 is placed by resources (on = \"any\") "
                            "and needs 2 cpus and 1 gpus, but no cluster node has that much free"),
                e);
  CHECK_MESSAGE(contains(e, "small has 2 of 2 cpus and 0 of 0 gpus free, big has 3 of 8 cpus and 0 of 2 gpus free, "
                            "mid has 2 of 4 cpus and 0 of 1 gpus free"),
                e);
  CHECK_MESSAGE(contains(e, "hint: declare more capacity (cpus = N, gpus = M in [cluster.nodes.NAME]"), e);
  // a node without `resources` points at its `on` value; cluster nodes without cpus offer none
  auto r2 = parse_graph_string(R"([node.a]
kind = "sink"
on = "any"
[cluster.nodes.w1]
address = "127.0.0.1:7001"
)",
                               "z.graph");
  REQUIRE(r2.ok());
  const std::string e2 = all_errors(assign_placement(r2.spec));
  CHECK_MESSAGE(contains(e2, "z.graph:3:6: error: node 'a' is placed by resources (on = \"any\") and needs 1 cpus "
                             "and 0 gpus, but no cluster node has that much free (w1 has 0 of 0 cpus and 0 of 0 gpus free)"),
                e2);
}

TEST_CASE("cluster: bad resources and a cluster node called any are errors with file:line:col") {
  auto r = parse_graph_string(R"([node.a]
kind = "sink"
on = "any"
resources = { cpus = -1, memory = 3 }
[node.b]
kind = "sink"
resources = 2
[node.c]
kind = "sink"
resources = { gpus = "one" }
[cluster.nodes.any]
address = "h:1"
)",
                              "bad.graph");
  const std::string e = all_errors(r.errors);
  CHECK_MESSAGE(contains(e, "bad.graph:4:22: error: resources.cpus of node 'a' must be an integer >= 0, got -1"), e);
  CHECK_MESSAGE(contains(e, "bad.graph:4:26: error: unknown key 'memory' in resources of node 'a'"), e);
  CHECK_MESSAGE(contains(e, "bad.graph:7:13: error: resources of node 'b' must be a table, got an integer"), e);
  CHECK_MESSAGE(contains(e, "hint: write resources = { cpus = 2, gpus = 1 }"), e);
  CHECK_MESSAGE(contains(e, "bad.graph:10:22: error: resources.gpus of node 'c' must be an integer >= 0, got a string"), e);
  CHECK_MESSAGE(contains(e, "error: invalid cluster node name 'any'"), e);
  CHECK_MESSAGE(contains(e, "on = \"any\" asks the planner to choose a node by resources"), e);
}

TEST_CASE("cluster: --cluster FILE is read with the same rules and positions") {
  const fs::path dir = fs::temp_directory_path() / ("flowrun_cluster_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "good.toml");
    f << "[cluster]\nlost_after_ms = 1500\n[cluster.nodes.w1]\naddress = \"127.0.0.1:7001\"\n";
    std::ofstream g(dir / "bad.toml");
    g << "[cluster]\n[cluster.nodes.w1]\naddress = 7001\n";
  }
  auto good = parse_cluster_file(dir / "good.toml");
  REQUIRE_MESSAGE(good.ok(), all_errors(good.errors));
  CHECK(good.cluster.lost_after_ms == 1500);
  REQUIRE(good.cluster.nodes.size() == 1);
  CHECK(good.cluster.nodes[0].port == 7001);
  auto bad = parse_cluster_file(dir / "bad.toml");
  const std::string e = all_errors(bad.errors);
  CHECK_MESSAGE(contains(e, "bad.toml:3:11: error: cluster node 'w1': address must be \"HOST:PORT\""), e);
  auto missing = parse_cluster_file(dir / "nope.toml");
  CHECK(contains(all_errors(missing.errors), "cannot open cluster file"));
  // an IPv6 address in brackets, as URLs write it (it was refused: "its host '[::1]' does not resolve")
  std::ofstream(dir / "v6.toml") << "[cluster]\n[cluster.nodes.w1]\naddress = \"[::1]:7001\"\n"
                                     "[cluster.nodes.w2]\naddress = \"::1:7002\"\n";
  auto v6 = parse_cluster_file(dir / "v6.toml");
  REQUIRE_MESSAGE(v6.ok(), all_errors(v6.errors));
  CHECK(v6.cluster.nodes[0].host == "::1");
  CHECK(v6.cluster.nodes[0].port == 7001);
  CHECK(v6.cluster.nodes[1].host == "::1");
  CHECK(v6.cluster.nodes[0].host_port() == "[::1]:7001");
  // util::split_host_port, the rule `flowrun node --listen` takes too: an interface zone kept; a bare "::1"
  // (host ":" port 1 at the last colon), a bracketed name, junk after the port: refused
  std::ofstream(dir / "zone.toml") << "[cluster]\n[cluster.nodes.w1]\naddress = \"[fe80::1%eth0]:7001\"\n";
  auto zone = parse_cluster_file(dir / "zone.toml");
  REQUIRE_MESSAGE(zone.ok(), all_errors(zone.errors));
  CHECK(zone.cluster.nodes[0].host == "fe80::1%eth0");
  for (const char* wrong : {"::1", "[::1]", "[host]:7001", "[::1]:7001x", "h:7001x", "[::1:7001", "[1::2::3]:7001"}) {
    std::ofstream(dir / "w.toml") << "[cluster]\n[cluster.nodes.w1]\naddress = \"" << wrong << "\"\n";
    auto no = parse_cluster_file(dir / "w.toml");
    CHECK_MESSAGE(contains(all_errors(no.errors), "cluster node 'w1': address must be \"HOST:PORT\""), std::string(wrong),
                  ": ", all_errors(no.errors));
  }
  fs::remove_all(dir);
}

TEST_CASE("cluster: to_toml keeps every float setting bit for bit (nodes receive the graph as TOML text)") {
  graph_spec g;
  g.name = "f";
  node_spec n;
  n.name = "t";
  n.kind = "trainer";
  const std::vector<double> values{0.1 + 0.2, 1e-5 / 3, 6.02214076e23, -0.0, 5e-324, 1.0 / 3};
  for (std::size_t i = 0; i < values.size(); ++i) n.settings["v" + std::to_string(i)] = setting{values[i], {}, {}, false};
  g.nodes.push_back(n);
  auto back = parse_graph_string(to_toml(g), "f.graph");
  REQUIRE_MESSAGE(back.ok(), all_errors(back.errors));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto* s = back.spec.nodes.at(0).find_setting("v" + std::to_string(i));
    REQUIRE(s);
    const double* d = std::get_if<double>(&s->value);
    REQUIRE(d);
    CHECK_MESSAGE(std::memcmp(d, &values[i], sizeof(double)) == 0, "v" << i << ": " << *d << " != " << values[i]);
  }
}

// ------------------------------------------------------------ setting ranges (issue 17)

TEST_CASE("setting ranges: declared with the setting, described, and checked") {
  using T = setting_type;
  node_kind k{"ranged", "settings with ranges"};
  k.option("every", T::int_, std::int64_t{10}, "print every N steps").at_least(1)
      .option("p", T::float_, 1.0, "nucleus").in_range(0, 1, /*low_open=*/true)
      .option("lr", T::float_, 1e-3, "learning rate").above(0).below(1)
      .option("shift", T::float_, 0.5, "any finite value")
      .option("scale", T::float_, 1.0, "a non-zero scale").non_zero()
      .option("bound", T::float_, 0.0, "may be inf").allow_nonfinite().at_least(0)
      .option("workers", T::int_, std::int64_t{4}, "threads").in_range(1, 64).because("tied to the machine")
      .option("name", T::string, std::string("x"), "no range");
  node_kind_registry r;
  r.register_kind(k);
  const node_kind& got = *r.lookup("ranged");
  auto d = [&](const char* n) { return *got.find_setting(n); };
  // Described as people read them.
  CHECK(describe_range(d("every").range, T::int_) == ">= 1");
  CHECK(describe_range(d("p").range, T::float_) == "finite, in (0, 1]");
  CHECK(describe_range(d("lr").range, T::float_) == "finite, in (0, 1)");
  CHECK(describe_range(d("shift").range, T::float_) == "finite");
  CHECK(describe_range(d("scale").range, T::float_) == "finite, != 0");
  CHECK(describe_range(d("bound").range, T::float_) == ">= 0");
  CHECK(describe_range(d("workers").range, T::int_) == "in [1, 64]");
  CHECK(describe_range(d("name").range, T::string).empty());
  // Inside: no violation. Bounds are inclusive unless open.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  CHECK_FALSE(range_violation(d("every"), std::int64_t{1}));
  CHECK_FALSE(range_violation(d("p"), 1.0));
  CHECK_FALSE(range_violation(d("p"), 1e-9));
  CHECK_FALSE(range_violation(d("workers"), std::int64_t{64}));
  CHECK_FALSE(range_violation(d("bound"), inf));
  CHECK_FALSE(range_violation(d("bound"), nan));  // allowed explicitly
  CHECK_FALSE(range_violation(d("shift"), -1e300));
  CHECK_FALSE(range_violation(d("name"), std::string("anything")));
  // Outside: what is wrong, with the value as it was written.
  CHECK(range_violation(d("every"), std::int64_t{0}).value() == "must be >= 1, got 0");
  CHECK(range_violation(d("p"), 0.0).value() == "must be finite, in (0, 1], got 0.0");
  CHECK(range_violation(d("p"), -1.0).value() == "must be finite, in (0, 1], got -1.0");
  CHECK(range_violation(d("p"), 1.5).value() == "must be finite, in (0, 1], got 1.5");
  CHECK(range_violation(d("lr"), 1.0).value() == "must be finite, in (0, 1), got 1.0");
  CHECK(range_violation(d("shift"), nan).value() == "must be finite, got nan");
  CHECK(range_violation(d("shift"), inf).value() == "must be finite, got inf");
  CHECK(range_violation(d("shift"), -inf).value() == "must be finite, got -inf");
  CHECK(range_violation(d("scale"), 0.0).value() == "must be finite, != 0, got 0.0");
  CHECK(range_violation(d("bound"), -inf).value() == "must be >= 0, got -inf");
  CHECK(range_violation(d("workers"), std::int64_t{65}).value() == "must be in [1, 64], got 65");
  // explain prints each range, and why when the kind says.
  std::string text = explain(got);
  CHECK(contains(text, "print every N steps  [>= 1]"));
  CHECK(contains(text, "nucleus  [finite, in (0, 1]]"));
  CHECK(contains(text, "threads  [in [1, 64]] (tied to the machine)"));
  CHECK(contains(text, "no range\n"));
  // The example kinds carry their ranges: the generator's sampling settings.
  CHECK(contains(explain(*test_kinds().lookup("generator")), "nucleus sampling threshold; 1: off  [finite, in (0, 1]]"));
}

TEST_CASE("setting ranges: declaration mistakes are programmer errors") {
  using T = setting_type;
  node_kind_registry r;
  // A modifier needs a numeric setting just before it.
  CHECK_THROWS_AS(node_kind{"k"}.at_least(1), std::invalid_argument);
  CHECK_THROWS_AS(node_kind{"k"}.option("s", T::string, std::string(), "").at_least(1), std::invalid_argument);
  CHECK_THROWS_AS(node_kind{"k"}.option("n", T::int_, std::int64_t{1}, "").allow_nonfinite(), std::invalid_argument);
  // A default outside its own range, an empty range, a range on a string set by hand.
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.option("n", T::int_, std::int64_t{0}, "").at_least(1)),
                  std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.option("f", T::float_, 0.0, "").above(0)), std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.option("f", T::float_, 0.5, "").in_range(1, 0)),
                  std::invalid_argument);
  CHECK_THROWS_AS(r.register_kind(node_kind{"k"}.option("f", T::float_, 1.0, "").in_range(1, 1, true)),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      r.register_kind(node_kind{"k"}.option("f", T::float_, std::numeric_limits<double>::infinity(), "")),
      std::invalid_argument);  // floats are finite unless allowed
  node_kind by_hand{"k"};
  by_hand.settings.push_back({"s", T::string, std::string("x"), "", false, {}});
  by_hand.settings.back().range.low = 0;
  CHECK_THROWS_AS(r.register_kind(by_hand), std::invalid_argument);
  try {
    r.register_kind(node_kind{"k"}.option("every", T::int_, std::int64_t{0}, "").at_least(1));
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "node kind 'k': the default of setting 'every' must be >= 1, got 0");
  }
  CHECK(r.size() == 0);
}

TEST_CASE("setting ranges: validation refuses values outside them at file:line:col, in files and in --set") {
  // temperature = nan / inf / -1 and top_p = -1 were accepted and sampled garbage (issue 17).
  const char* text = R"(edges = ["src.lines -> tok.text", "tok -> gen", "gen -> out"]
[node.src]
kind = "text_source"
path = "x.txt"
max_lines = -3
[node.tok]
kind = "tokenizer"
model = "t.model"
[node.gen]
kind = "generator"
model = "m.bin"
tokenizer = "t.model"
temperature = nan
top_p = -1
top_k = -2
max_new_tokens = 16
[node.out]
kind = "sink"
)";
  validate_options no_files;
  no_files.check_files = false;
  auto parsed = parse_graph_string(text, "ranges.graph");
  REQUIRE(parsed.ok());
  auto v = validate(parsed.spec, test_kinds(), no_files);
  INFO(all_errors(v.errors));
  REQUIRE(v.errors.size() == 4);
  CHECK(v.errors[0].to_string() ==
        "ranges.graph:5:13: error: setting 'max_lines' of node 'src' (kind text_source) must be >= 0, got -3\n"
        "  hint: max_lines: stop after this many lines; 0: the whole file; write max_lines = 0 "
        "(`flowrun explain text_source`)");
  CHECK(v.errors[1].to_string() ==
        "ranges.graph:13:15: error: setting 'temperature' of node 'gen' (kind generator) must be finite, >= 0, got "
        "nan\n  hint: temperature: sampling temperature; 0: greedy; write temperature = 0.0 (`flowrun explain "
        "generator`)");
  CHECK(v.errors[2].to_string().rfind(
            "ranges.graph:14:9: error: setting 'top_p' of node 'gen' (kind generator) must be finite, in (0, 1], got "
            "-1.0\n",
            0) == 0);
  CHECK(v.errors[3].to_string().rfind(
            "ranges.graph:15:9: error: setting 'top_k' of node 'gen' (kind generator) must be >= 0, got -2\n", 0) == 0);

  // The same rules for --set, pointing at the value inside the override.
  for (const char* bad : {"inf", "-inf", "-1", "nan"}) {
    CAPTURE(bad);
    auto r = load("good/pipeline.graph", {std::string("node.gen.temperature=") + bad});
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].file == std::string("--set node.gen.temperature=") + bad);
    CHECK(r.errors[0].line == 1);
    CHECK(r.errors[0].col == 22);
    CHECK(contains(r.errors[0].message, "setting 'temperature' of node 'gen' (kind generator) must be finite, >= 0, "
                                        "got " + std::string(bad == std::string("-1") ? "-1.0" : bad)));
  }
  auto top_p = load("good/pipeline.graph", {"node.gen.top_p=-1"});
  REQUIRE(top_p.errors.size() == 1);
  CHECK(top_p.errors[0].to_string().rfind("--set node.gen.top_p=-1:1:16: error: setting 'top_p' of node 'gen' "
                                          "(kind generator) must be finite, in (0, 1], got -1.0",
                                          0) == 0);
  // Values inside the range pass, the bounds included.
  auto edge = load("good/pipeline.graph", {"node.gen.temperature=0", "node.gen.top_p=1", "node.gen.top_k=0"});
  INFO(all_errors(edge.errors));
  CHECK(edge.ok());
}

TEST_CASE("threads: a node's OpenMP team bound, from the file or --set, checked and carried to cluster nodes") {
  // `--threads 5000` hung a run (issue 17); a node's threads key has the same kind of cap.
  auto ok = load("good/pipeline.graph", {"node.gen.threads=1"});
  INFO(all_errors(ok.errors));
  REQUIRE(ok.ok());
  const auto* gen = ok.spec.find_node("gen");
  REQUIRE(gen);
  CHECK(gen->threads == 1);
  // the graph the coordinator sends to cluster nodes keeps it
  auto again = parse_graph_string(to_toml(ok.spec), "sent.graph");
  REQUIRE(again.ok());
  CHECK(again.spec.find_node("gen")->threads == 1);
  for (const char* bad : {"0", "5000"}) {
    auto r = load("good/pipeline.graph", {std::string("node.gen.threads=") + bad});
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].to_string().rfind("--set node.gen.threads=" + std::string(bad) +
                                            ":1:18: error: node 'gen' has threads = " + bad +
                                            "; threads must be in 1..1024\n",
                                        0) == 0);
  }
  auto word = load("good/pipeline.graph", {"node.gen.threads=two"});
  REQUIRE(word.errors.size() == 1);
  CHECK(contains(word.errors[0].message, "threads must be an integer, got 'two'"));
  validate_options no_files;
  no_files.check_files = false;
  auto parsed = parse_graph_string("[node.out]\nkind = \"sink\"\nthreads = \"all\"\n", "t.graph");
  REQUIRE(parsed.errors.size() == 1);
  CHECK(parsed.errors[0].to_string().rfind("t.graph:3:11: error: threads must be an integer, got a string", 0) == 0);
}

TEST_CASE("resource bounds: replicas and edge credit are refused above their caps, with why") {
  // replicas = 100000 never finished starting; [credit=1e12] failed with bad_alloc (issue 17).
  auto many = load("good/pipeline.graph", {"node.gen.replicas=100000"});
  REQUIRE(many.errors.size() == 1);
  CHECK(many.errors[0].to_string().rfind("--set node.gen.replicas=100000:1:19: error: node 'gen' has replicas = "
                                         "100000; replicas must be <= 1024\n",
                                         0) == 0);
  CHECK(contains(many.errors[0].hint, "every replica of a node links to every replica of its neighbours"));
  CHECK(load("good/pipeline.graph", {"node.gen.replicas=1024"}).ok());

  validate_options no_files;
  no_files.check_files = false;
  auto parsed = parse_graph_string(
      "edges = [\"src.lines -> out [credit=1000001]\"]\n[node.src]\nkind = \"text_source\"\npath = \"x\"\n"
      "[node.out]\nkind = \"sink\"\nreplicas = 2000\n",
      "credit.graph");
  REQUIRE(parsed.ok());
  auto v = validate(parsed.spec, test_kinds(), no_files);
  REQUIRE(v.errors.size() == 2);
  CHECK(v.errors[0].to_string().rfind("credit.graph:1:10: error: edge credit must be <= 1000000, got 1000001\n", 0) ==
        0);
  CHECK(v.errors[1].to_string().rfind("credit.graph:7:12: error: node 'out' has replicas = 2000; replicas must be "
                                      "<= 1024",
                                      0) == 0);
}

// ------------------------------------------------------------ scaling (issue 17)

namespace {

// N pairs "sN.lines -> kN.items" of text_source -> sink, as one .graph text.
std::string pairs_graph(std::size_t n) {
  std::string edges = "edges = [\n", nodes;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string s = "s" + std::to_string(i), k = "k" + std::to_string(i);
    edges += "  \"" + s + ".lines -> " + k + ".items\",\n";
    nodes += "[node." + s + "]\nkind = \"text_source\"\npath = \"x.txt\"\n[node." + k + "]\nkind = \"sink\"\n";
  }
  return edges + "]\n" + nodes;
}

// Process CPU seconds to parse and validate `text`, the best of `runs`
// (CPU time, not wall time: other processes on the machine do not count).
double build_cpu_seconds(const std::string& text, std::size_t nodes, int runs) {
  validate_options no_files;
  no_files.check_files = false;
  double best = 1e300;
  for (int i = 0; i < runs; ++i) {
    const std::clock_t t0 = std::clock();
    auto parsed = parse_graph_string(text, "pairs.graph");
    auto v = validate(parsed.spec, test_kinds(), no_files);
    const std::clock_t t1 = std::clock();
    REQUIRE(parsed.ok());
    REQUIRE(v.ok());
    REQUIRE(v.spec.nodes.size() == nodes);
    best = std::min(best, static_cast<double>(t1 - t0) / CLOCKS_PER_SEC);
  }
  return best;
}

}  // namespace

TEST_CASE("graph building is near-linear: 10x the node pairs costs well under 100x") {
  // Before issue 17, reading and validating N pairs was quadratic (a linear node lookup per node table,
  // O(N) scratch arrays per node in the cycle check): 2k pairs took 1 s, 12k 26 s. Linear is 10x, N log N
  // about 13x, quadratic 100x; < 30x leaves room for caches and timer noise without letting N^2 pass.
  const std::string small = pairs_graph(2000), large = pairs_graph(20000);
  const double t_small = std::max(build_cpu_seconds(small, 4000, 3), 1e-3);
  const double t_large = build_cpu_seconds(large, 40000, 1);
  MESSAGE("parse + validate: 2k pairs " << t_small << " s CPU, 20k pairs " << t_large << " s CPU, ratio "
                                        << t_large / t_small);
  CHECK(t_large / t_small < 30.0);
}

TEST_CASE("the cycle check handles a 100k-node chain without deep recursion, and still finds a cycle") {
  graph_spec spec;
  spec.name = "chain";
  const std::size_t n = 100000;
  node_kind_registry r;
  r.register_kind(node_kind{"relay"}.input("in", "t", "", false).output("out", "t"));
  for (std::size_t i = 0; i < n; ++i) {
    node_spec node;
    node.name = "n" + std::to_string(i);
    node.kind = "relay";
    spec.nodes.push_back(node);
  }
  for (std::size_t i = 0; i + 1 < n; ++i) {
    edge_spec e;
    e.from_node = "n" + std::to_string(i);
    e.to_node = "n" + std::to_string(i + 1);
    spec.edges.push_back(e);
  }
  CHECK(validate(spec, r).ok());
  edge_spec back;
  back.from_node = "n" + std::to_string(n - 1);
  back.to_node = "n0";
  spec.edges.push_back(back);
  auto v = validate(spec, r);
  REQUIRE(v.errors.size() == 1);
  CHECK(contains(v.errors[0].message, "cycle without a feedback edge: n0 -> n1 -> n2"));
  CHECK(ends_with(v.errors[0].message, "n99999 -> n0"));
}

// ------------------------------------------------------------ paths (validate.h, "Path settings")

namespace {
void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}
// Runs `f` with the working directory set to `dir`, restoring it after.
template <class F>
void in_dir(const fs::path& dir, F f) {
  const fs::path before = fs::current_path();
  fs::current_path(dir);
  try {
    f();
  } catch (...) {
    fs::current_path(before);
    throw;
  }
  fs::current_path(before);
}
}  // namespace

TEST_CASE("paths: one rule for inputs and outputs, a file's folder for written paths, the working directory for --set") {
  const fs::path root = fs::temp_directory_path() / ("flowrun_paths_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path g = root / "proj" / "graphs", run = root / "elsewhere", assets = root / "assets";
  write_file(g / "data.txt", "a\n");
  write_file(g / "inc" / "more.txt", "b\n");
  write_file(run / "here.txt", "c\n");
  write_file(assets / "data" / "shared.txt", "d\n");
  // an included file's paths resolve against the included file's folder
  write_file(g / "inc" / "part.inc", "[node.sink2]\nkind = \"sink\"\npath = \"written_by_include.txt\"\n");
  write_file(g / "main.graph",
             "include = [\"inc/part.inc\"]\n"
             "edges = [\"src.lines -> sink.items, sink2.items\", \"src2.lines -> mix.data\"]\n"
             "[graph]\nname = \"paths\"\ncheckpoint_dir = \"../out/ck\"\n"
             "[node.src]\nkind = \"text_source\"\npath = \"data.txt\"\n"
             "[node.src2]\nkind = \"text_source\"\npath = \"data/shared.txt\"\n"  // only under the asset root
             "[node.sink]\nkind = \"sink\"\npath = \"../out/result.txt\"\n"
             "[node.mix]\nkind = \"mixer\"\nmix = [\"inc/more.txt\", \"data/shared.txt\"]\n");
  node_kind_registry kinds;
  register_example_kinds(kinds);
  kinds.register_kind(node_kind{"mixer", "reads several files"}.input("data", "text").option(
      "mix", setting_type::path_list, std::vector<std::string>{}, "files to blend"));
  validate_options vo;
  vo.asset_root = assets;
  auto setting_of = [](const validation_result& v, const std::string& node, const std::string& key) {
    const auto* n = v.spec.find_node(node);
    REQUIRE(n);
    const auto* s = n->find_setting(key);
    REQUIRE(s);
    return s->value;
  };
  const fs::path proj = fs::canonical(root / "proj");
  in_dir(run, [&] {
    // the graph run by an absolute path from another folder: inputs and outputs both resolve against graphs/
    auto v = load_graph(g / "main.graph", kinds, vo);
    REQUIRE_MESSAGE(v.ok(), format_errors(v.errors));
    CHECK(std::get<std::string>(setting_of(v, "src", "path")) == (g / "data.txt").string());
    CHECK(std::get<std::string>(setting_of(v, "sink", "path")) == (root / "proj" / "out" / "result.txt").string());
    CHECK(std::get<std::string>(setting_of(v, "sink2", "path")) == (g / "inc" / "written_by_include.txt").string());
    CHECK(v.spec.checkpoint_dir == (root / "proj" / "out" / "ck").string());
    // inputs not found next to the file come from the asset root; outputs never do
    CHECK(std::get<std::string>(setting_of(v, "src2", "path")) == (assets / "data" / "shared.txt").string());
    CHECK(std::get<std::vector<std::string>>(setting_of(v, "mix", "mix")) ==
          std::vector<std::string>{(g / "inc" / "more.txt").string(), (assets / "data" / "shared.txt").string()});
    (void)proj;

    // --set values resolve against the working directory, inputs and outputs alike
    const fs::path cwd = fs::current_path();
    auto s = load_graph(g / "main.graph", kinds, vo,
                        {"node.src.path=here.txt", "node.sink.path=runs/r1.txt", "graph.checkpoint_dir=ck2",
                         "node.mix.mix=[\"here.txt\"]"});
    REQUIRE_MESSAGE(s.ok(), format_errors(s.errors));
    CHECK(std::get<std::string>(setting_of(s, "src", "path")) == (cwd / "here.txt").string());
    CHECK(std::get<std::string>(setting_of(s, "sink", "path")) == (cwd / "runs" / "r1.txt").string());
    CHECK(s.spec.checkpoint_dir == (cwd / "ck2").string());
    CHECK(std::get<std::vector<std::string>>(setting_of(s, "mix", "mix")) ==
          std::vector<std::string>{(cwd / "here.txt").string()});

    // a --set input is not looked up next to the graph file: data.txt is there, not here
    auto bad = load_graph(g / "main.graph", kinds, vo, {"node.src.path=data.txt"});
    REQUIRE(bad.errors.size() == 1);
    CHECK(contains(bad.errors[0].message, "'" + (cwd / "data.txt").string() + "'"));
    CHECK(contains(bad.errors[0].hint, "relative paths given with --set are looked up in the working directory"));
    CHECK(bad.errors[0].file.rfind("--set node.src.path=", 0) == 0);
    // a missing file in a path_list names that entry
    auto bad_list = load_graph(g / "main.graph", kinds, vo, {"node.mix.mix=[\"here.txt\", \"nowhere.txt\"]"});
    REQUIRE(bad_list.errors.size() == 1);
    CHECK(contains(bad_list.errors[0].message, "'nowhere.txt'"));
    CHECK(contains(bad_list.errors[0].message, "setting 'mix' of node 'mix'"));
  });
  // the same graph from its own folder and from the project root names the very same files
  std::string from_graphs, from_root;
  in_dir(g, [&] {
    auto v = load_graph("main.graph", kinds, vo);
    REQUIRE(v.ok());
    from_graphs = std::get<std::string>(setting_of(v, "sink", "path"));
  });
  in_dir(root / "proj", [&] {
    auto v = load_graph("graphs/main.graph", kinds, vo);
    REQUIRE(v.ok());
    from_root = std::get<std::string>(setting_of(v, "sink", "path"));
  });
  CHECK(from_graphs == from_root);
  CHECK(fs::path(from_root).is_absolute());
  // `flowrun explain` states the rule under a kind with path settings
  CHECK(contains(explain(*kinds.lookup("sink")), "resolves against that file's folder"));
  CHECK(contains(explain(*kinds.lookup("sink")), "output"));
  fs::remove_all(root);
}

// Outputs are checked before anything runs: a folder that cannot take a file (below a regular file,
// or /proc, where even root's access(W_OK) says yes) would fail the save after the training before it,
// and two nodes saving a model to one path would overwrite each other's model.
TEST_CASE("outputs: unwritable outputs, two nodes saving to one path, and copies of a one-replica kind are refused") {
  const fs::path root = fs::temp_directory_path() / ("flowrun_outputs_" + std::to_string(::getpid()));
  fs::remove_all(root);
  write_file(root / "data.txt", "a\n");
  write_file(root / "a_file", "x\n");
  node_kind_registry kinds;
  register_example_kinds(kinds);
  kinds.register_kind(node_kind{"saver", "saves a model"}
                          .input("items", "text")
                          .option("output", setting_type::output, std::string(""), "where the model goes")
                          .option("logs", setting_type::output, std::string(""), "a shared folder"));
  write_file(root / "g.graph",
             "edges = [\"src.lines -> a.items, b.items\"]\n"
             "[node.src]\nkind = \"text_source\"\npath = \"data.txt\"\n"
             "[node.a]\nkind = \"saver\"\noutput = \"out/a\"\nlogs = \"out/logs\"\n"
             "[node.b]\nkind = \"saver\"\noutput = \"out/b\"\nlogs = \"out/logs\"\n");
  validate_options vo;
  auto ok = load_graph(root / "g.graph", kinds, vo);  // a shared folder that is not a model output is fine
  CHECK_MESSAGE(ok.ok(), format_errors(ok.errors));
  CHECK(!fs::exists(root / "out"));  // the check creates nothing
  auto dup = load_graph(root / "g.graph", kinds, vo, {"node.b.output=" + (root / "out" / "a").string()});
  REQUIRE(dup.errors.size() == 1);
  CHECK_MESSAGE(contains(dup.errors[0].message, "setting 'output' of node 'b' saves to '" +
                                                    (root / "out" / "a").string() + "', as 'output' of node 'a' does"),
                dup.errors[0].message);
  CHECK(contains(dup.errors[0].message, "the later save would overwrite the earlier model"));
  // two settings of one node saving to one place (a LoRA adapter and the merged model in one folder)
  kinds.register_kind(node_kind{"two_saver", "saves two models"}
                          .input("items", "text")
                          .option("export_hf", setting_type::output, std::string(""), "the merged model")
                          .option("save_lora", setting_type::output, std::string(""), "the adapter"));
  auto both = load_graph(root / "g.graph", kinds, vo,
                         {"node.a.kind=two_saver", "node.a.export_hf=" + (root / "out" / "x").string(),
                          "node.a.save_lora=" + (root / "out" / "x").string()});
  CHECK(std::any_of(both.errors.begin(), both.errors.end(), [](const graph_error& e) {
    return contains(e.message, "setting 'save_lora' of node 'a' saves to") &&
           contains(e.message, "as 'export_hf' of node 'a' does");
  }));
  // the same place spelled otherwise: a trailing '/', a symbolic link to the folder
  fs::create_directories(root / "out");
  fs::create_directory_symlink(root / "out", root / "out_link");
  for (const std::string& other : {(root / "out" / "a").string() + "/", (root / "out_link" / "a").string()}) {
    CAPTURE(other);
    auto same = load_graph(root / "g.graph", kinds, vo, {"node.b.output=" + other});
    REQUIRE(same.errors.size() == 1);
    CHECK(contains(same.errors[0].message, "as 'output' of node 'a' does"));
  }
  auto below = load_graph(root / "g.graph", kinds, vo, {"node.a.output=" + (root / "a_file" / "m").string()});
  REQUIRE(below.errors.size() == 1);
  CHECK(contains(below.errors[0].message, "setting 'output' of node 'a': '" + (root / "a_file").string() +
                                              "' (above the output '" + (root / "a_file" / "m").string() +
                                              "') is not a folder"));
  // a folder setting that names an existing file: refused when checked (a checkpoint_dir that was a file passed,
  // and the run failed at its first checkpoint, after the training before it); a model output may be a file
  const std::string a_file = (root / "a_file").string();
  auto ck_file = load_graph(root / "g.graph", kinds, vo, {"graph.checkpoint_dir=" + a_file});
  REQUIRE(ck_file.errors.size() == 1);
  CHECK_MESSAGE(contains(ck_file.errors[0].message, "graph checkpoint_dir: '" + a_file + "' is a file, not a folder"),
                ck_file.errors[0].message);
  auto lora_file = load_graph(root / "g.graph", kinds, vo, {"node.a.kind=two_saver", "node.a.save_lora=" + a_file});
  CHECK_MESSAGE(std::any_of(lora_file.errors.begin(), lora_file.errors.end(),
                            [&](const graph_error& e) {
                              return contains(e.message, "setting 'save_lora' of node 'a': '" + a_file +
                                                             "' is a file, not a folder");
                            }),
                format_errors(lora_file.errors));
  CHECK(load_graph(root / "g.graph", kinds, vo, {"node.a.output=" + (root / "a_file").string()}).ok());
  // a symbolic link to nothing: refused for a folder (the save failed with "File exists" after the training), and
  // taken for a file output (it is written beside the link and renamed over it)
  fs::create_symlink(root / "nowhere", root / "dangling");
  auto dangling = load_graph(root / "g.graph", kinds, vo, {"graph.checkpoint_dir=" + (root / "dangling").string()});
  REQUIRE(dangling.errors.size() == 1);
  CHECK_MESSAGE(contains(dangling.errors[0].message, "is a symbolic link to '" + (root / "nowhere").string() +
                                                         "', which does not exist"),
                dangling.errors[0].message);
  CHECK(flowrun::unwritable_reason((root / "dangling").string(), flowrun::output_kind::file).empty());
  if (fs::is_directory("/proc/self")) {  // Linux: nothing can be created in /proc, not even by root
    auto proc = load_graph(root / "g.graph", kinds, vo, {"graph.checkpoint_dir=/proc/flowrun_ck"});
    REQUIRE(proc.errors.size() == 1);
    CHECK_MESSAGE(contains(proc.errors[0].message, "graph checkpoint_dir: '/proc' (where '/proc/flowrun_ck' would be "
                                                   "created) is not writable"),
                  proc.errors[0].message);
  }
  // a kind that runs as one replica refuses more, with its reason
  node_kind solo{"solo_saver", "saves a model, alone"};
  solo.input("items", "text").single_replica = "its copies would write the same files";
  kinds.register_kind(solo);
  auto two = load_graph(root / "g.graph", kinds, vo, {"node.a.kind=solo_saver", "node.a.replicas=2"});
  REQUIRE(two.errors.size() >= 1);
  CHECK_MESSAGE(contains(two.errors[0].message, "node 'a' has replicas = 2, but kind solo_saver runs as one replica: "
                                                "its copies would write the same files"),
                two.errors[0].message);
  // threads of one process probing one folder at once all see it writable (a node's two replicas checked
  // their output together, and the second's probe file collided with the first's: "File exists")
  {
    std::atomic<int> refused{0};
    std::vector<std::thread> probes;
    for (int t = 0; t < 8; ++t)
      probes.emplace_back([&] {
        for (int i = 0; i < 200; ++i)
          if (!flowrun::unwritable_reason((root / "out" / "m.bin").string(), flowrun::output_kind::file).empty()) ++refused;
      });
    for (auto& t : probes) t.join();
    CHECK(refused.load() == 0);
  }
  validate_options no_files;  // without file checks (a graph checked for its shape only) nothing is probed
  no_files.check_files = false;
  CHECK(load_graph(root / "g.graph", kinds, no_files, {"node.a.output=" + (root / "a_file" / "m").string()}).ok());
  fs::remove_all(root);
}

TEST_CASE("an unconnected port's hint names a port no edge uses yet, not a connected sibling") {
  // src2 and b were left out of the edges; the hint must pair them with each other, not with the
  // already connected src1 / a (as ppo.graph's critic.stats, missing, belongs to critic_stats,
  // not to actor_stats).
  auto r = parse_graph_string(R"(edges = ["src1.lines -> a.items"]
[graph]
name = "two_pairs"
[node.src1]
kind = "text_source"
path = "x.txt"
[node.src2]
kind = "text_source"
path = "y.txt"
[node.a]
kind = "sink"
[node.b]
kind = "sink"
)",
                              "two_pairs.graph");
  REQUIRE(r.ok());
  validate_options no_files = test_options();
  no_files.check_files = false;
  auto v = validate(r.spec, test_kinds(), no_files);
  bool saw_in = false;
  for (const auto& e : v.errors) {
    if (contains(e.message, "port 'items'")) {
      saw_in = true;
      CHECK(contains(e.hint, "\"src2.lines -> b.items\""));
    }
    if (contains(e.message, "port 'lines'")) CHECK(contains(e.hint, "\"src2.lines -> b.items\""));
  }
  CHECK(saw_in);
}

TEST_CASE("an unconnected port's hint names the likeliest partner: unconnected, required or same-named first") {
  // grpo.graph without "reward.scored -> experience.reward" hinted "reward.scored -> experience.values" for the
  // reward's port: the critic's values port (optional, unconnected there), which would have fed rewards as values
  node_kind_registry r;
  r.register_kind(node_kind{"scorer", "scores"}.output("scored", "scores", "one score per row", true));
  r.register_kind(node_kind{"maker", "makes experience"}
                      .input("values", "scores", "the critic's values", false)
                      .input("reward", "scores", "the rewards", true));
  auto parsed = parse_graph_string("[node.reward]\nkind = \"scorer\"\n\n[node.experience]\nkind = \"maker\"\n");
  REQUIRE(parsed.ok());
  auto v = validate(parsed.spec, r, test_options());
  REQUIRE(v.errors.size() == 2);
  CHECK(contains(v.errors[0].message, "required out port 'scored' (scores) of node 'reward'"));
  CHECK(v.errors[0].hint == "add an edge such as \"reward.scored -> experience.reward\" to edges");
  CHECK(contains(v.errors[1].message, "required in port 'reward' (scores) of node 'experience'"));
  CHECK(v.errors[1].hint == "add an edge such as \"reward.scored -> experience.reward\" to edges");
}

TEST_CASE("a list setting given one string: the hint writes the user's value as a list, a comma-separated one split") {
  // mix_data = "a.jsonl" was answered "write mix_data = []", the default, not the syntax that works
  for (const auto& [written, fix] : std::vector<std::pair<std::string, std::string>>{
           {"\"ppo\"", "write tags = [\"ppo\"]"}, {"\"ppo, demo\"", "write tags = [\"ppo\", \"demo\"]"}}) {
    CAPTURE(written);
    auto parsed = parse_graph_string("edges = [\"src.lines -> learner.data\"]\n\n[node.learner]\nkind = \"trainer\"\n"
                                     "tags = " + written + "\n\n[node.src]\nkind = \"text_source\"\n"
                                     "path = \"data/prompts.txt\"\n",
                                     graphs_dir / "hint_list.graph");
    REQUIRE(parsed.ok());
    auto v = validate(parsed.spec, test_kinds(), test_options());
    const auto it = std::find_if(v.errors.begin(), v.errors.end(), [](const graph_error& e) {
      return contains(e.message, "setting 'tags' of node 'learner' must be string_list, got string");
    });
    REQUIRE(it != v.errors.end());
    CHECK(contains(it->hint, fix));
  }
}

// DS-Chat's several --data_path: a list for `data` (a path) was read as one file name from --set ("file not found:
// '["a.jsonl","b.jsonl"]'") and refused from a file with "write data = \"path/to/file\"": both say where the
// other files go
TEST_CASE("a list for a one-file data setting: refused naming mix_data, from the file and from --set") {
  node_kind_registry kinds;
  kinds.register_kind(node_kind{"pairs", "reads pairs"}
                          .option("data", setting_type::path, std::string(""), "the pairs file")
                          .option("mix_data", setting_type::path_list, std::vector<std::string>{}, "more files"));
  const auto from_file = parse_graph_string("[node.p]\nkind = \"pairs\"\ndata = [\"a.jsonl\", \"b.jsonl\"]\n",
                                            graphs_dir / "list_data.graph");
  REQUIRE(from_file.ok());
  auto v = validate(from_file.spec, kinds, test_options());
  REQUIRE(v.errors.size() == 1);
  CHECK(contains(v.errors[0].message, "setting 'data' of node 'p' must be path, got string_list"));
  CHECK(contains(v.errors[0].hint, "the other files go in mix_data = [\"b.jsonl\", ...]"));
  const auto as_text = parse_graph_string("[node.p]\nkind = \"pairs\"\ndata = '[\"a.jsonl\",\"b.jsonl\"]'\n",
                                          graphs_dir / "list_data.graph");
  REQUIRE(as_text.ok());
  v = validate(as_text.spec, kinds, test_options());
  REQUIRE(v.errors.size() == 1);
  CHECK_MESSAGE(contains(v.errors[0].message, "setting 'data' of node 'p' takes one path, got the list [\"a.jsonl\",\"b.jsonl\"]"),
                v.errors[0].message);
  CHECK(contains(v.errors[0].hint, "mix_data"));
}
