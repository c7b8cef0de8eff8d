// `flowrun run`, `flowrun kinds` and `flowrun explain`: graphs on the actor runtime.
#include <filesystem>
#include <iostream>
#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "actors/register.h"
#include "runtime/actor/runtime.h"
#include "runtime/graph/validate.h"
#include "runtime/util/assets.h"
#include "tools/flowrun/commands.h"

namespace flowrun::cli {

namespace {

struct run_opts {
  std::string file;
  std::vector<std::string> overrides;
  std::string metrics;
  double metrics_interval = 10.0;
  std::int64_t credit = 8;
  std::size_t threads = 0;
  std::string restart = "never";
  bool no_progress = false;
  bool quiet = false;
};

// Logs go to standard error: standard output belongs to the graph's sinks.
void log_to_stderr() {
  static bool done = false;
  if (done) return;
  done = true;
  auto logger = std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_level(spdlog::default_logger()->level());
  spdlog::set_default_logger(logger);
}

struct registries {
  graph::node_kind_registry kinds;
  actor::node_factory_registry factories;
  registries() { actors::register_builtin_nodes(kinds, factories); }
};

}  // namespace

std::vector<std::string> expand_graph_shorthand(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2) return args;
  const std::string& first = args[1];
  if (!app.get_subcommands([&](const CLI::App* sub) { return sub->check_name(first); }).empty()) return args;
  std::error_code ec;
  const bool graph_name = first.size() > 6 && first.compare(first.size() - 6, 6, ".graph") == 0;
  if (graph_name || (first[0] != '-' && std::filesystem::is_regular_file(first, ec)))
    args.insert(args.begin() + 1, "run");
  return args;
}

void add_run(CLI::App& app) {
  auto o = std::make_shared<run_opts>();
  auto* sub = app.add_subcommand("run", "Run a .graph file on the actor runtime (also: flowrun FILE.graph ...)");
  sub->add_option("file", o->file, "The .graph file")->required();
  sub->add_option("--set", o->overrides,
                  "Override a value: graph.seed=1, node.NAME.SETTING=VALUE, node.NAME.replicas=2 (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--metrics", o->metrics, "Write metrics as JSON lines to this file");
  sub->add_option("--metrics-interval", o->metrics_interval, "Seconds between metric records and log lines")
      ->capture_default_str();
  sub->add_option("--credit", o->credit, "Messages in flight per link on edges that set no credit")
      ->capture_default_str();
  sub->add_option("--threads", o->threads, "CAF worker threads (0: one per core)")->capture_default_str();
  sub->add_option("--restart", o->restart, "Restart policy of nodes whose kind has no restart setting")
      ->capture_default_str();
  sub->add_flag("--no-progress", o->no_progress, "No progress line, even on a terminal");
  sub->add_flag("--quiet,-q", o->quiet, "No metrics summary at the end");
  sub->callback([o] {
    log_to_stderr();
    registries r;
    graph::validate_options vo;
    vo.asset_root = assets_root();
    auto v = graph::load_graph(o->file, r.kinds, vo, o->overrides);
    if (!v.ok()) {
      std::cerr << graph::format_errors(v.errors);
      throw exit_request{2};
    }
    actor::run_options ro;
    ro.default_credit = o->credit;
    ro.threads = o->threads;
    ro.metrics_path = o->metrics;
    ro.metrics_interval_s = o->metrics_interval;
    ro.summary = !o->quiet;
    if (o->no_progress) ro.progress = false;
    auto mode = actor::parse_restart_mode(o->restart);
    if (!mode) {
      spdlog::error("--restart {}: use never or on-failure", o->restart);
      throw exit_request{2};
    }
    ro.default_restart.when = *mode;
    auto result = actor::run_graph(v.spec, r.kinds, r.factories, ro);
    if (!result.error.empty()) spdlog::error("{}", result.error);
    if (result.exit_code != 0) throw exit_request{result.exit_code};
  });
}

void add_kinds(CLI::App& app) {
  auto* sub = app.add_subcommand("kinds", "List the node kinds a graph can use");
  sub->callback([] {
    registries r;
    std::cout << graph::describe_kinds(r.kinds);
  });
}

void add_explain(CLI::App& app) {
  auto kind = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("explain", "Print a node kind's ports and settings");
  sub->add_option("kind", *kind, "The kind's name (see `flowrun kinds`)")->required();
  sub->callback([kind] {
    registries r;
    const graph::node_kind* k = r.kinds.lookup(*kind);
    if (!k) {
      std::string near = graph::nearest_name(*kind, r.kinds.names());
      std::cerr << "error: unknown node kind '" << *kind << "'"
                << (near.empty() ? std::string() : "; did you mean '" + near + "'?") << " (`flowrun kinds` lists them)\n";
      throw exit_request{2};
    }
    std::cout << graph::explain(*k);
  });
}

}  // namespace flowrun::cli
