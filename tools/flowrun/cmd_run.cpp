// `flowrun run`, `flowrun kinds` and `flowrun explain`: graphs on the actor runtime.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/register.h"
#include "runtime/actor/cluster.h"
#include "runtime/actor/console.h"
#include "runtime/actor/cluster_auth.h"
#include "runtime/actor/runtime.h"
#include "runtime/actor/tls_files.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"
#include "runtime/tensor/device_memory.h"
#include "models/checkpoint.h"
#include "runtime/util/assets.h"
#include "runtime/util/host_port.h"
#include "tools/flowrun/commands.h"
#include "tools/flowrun/model_tokenizer.h"

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
  bool check = false;  // --check: validate and exit
  bool quiet = false;
  // the live console (docs/console.md)
  int console_port = -1;  // -1: not given (the graph's console_port decides)
  bool no_console = false;
  std::string console_bind = "127.0.0.1";
  std::string console_token;
  bool console_token_given = false;  // --console-token was on the command line (even as '')
  std::string console_token_file;
  double console_linger = 0;
  // clusters (docs/scaling.md)
  std::string cluster_file;
  std::string secret_file;
  std::string tls_cert, tls_key, tls_ca;
};

// --tls-cert, --tls-key and --tls-ca: all three or none, loaded and checked now (actor::tls_files_check:
// the key is the certificate's, the CA file is PEM, the certificate valid today). Returns false (after
// logging the file and the fix) otherwise; what peers may refuse is logged as a warning.
bool tls_files_ok(const std::string& cert, const std::string& key, const std::string& ca) {
  const auto r = actor::tls_files_check(cert, key, ca);
  for (const auto& w : r.warnings) spdlog::warn("{}", w);
  if (!r.error.empty()) spdlog::error("{}", r.error);
  return r.error.empty();
}

void add_tls_options(CLI::App* sub, std::string& cert, std::string& key, std::string& ca) {
  sub->add_option("--tls-cert", cert, "TLS between cluster processes (caf_openssl): this process's certificate (PEM)");
  sub->add_option("--tls-key", key, "TLS: this process's private key (PEM)");
  sub->add_option("--tls-ca", ca, "TLS: the CA file that peers' certificates must chain to (PEM)");
}

// Logs go to standard error: standard output belongs to the graph's sinks.
void log_to_stderr() {
  static bool done = false;
  if (done) return;
  done = true;
  auto logger = std::make_shared<spdlog::logger>("", actor::console::log_sink());  // never inside the progress line
  logger->set_level(spdlog::default_logger()->level());
  spdlog::set_default_logger(logger);
}

// --threads: 0 (one per core) up to max_threads().
CLI::Validator threads_check() {
  return bounded(0, static_cast<double>(max_threads()),
                 "at most 8 per hardware thread (" + std::to_string(std::thread::hardware_concurrency()) +
                     " here) and never over 1024: more CAF workers only contend for the cores");
}

struct registries {
  graph::node_kind_registry kinds;
  actor::node_factory_registry factories;
  registries() { actors::register_builtin_nodes(kinds, factories); }
};

}  // namespace

std::size_t max_threads() {
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return std::min<std::size_t>(1024, 8 * hw);
}

CLI::Validator bounded(double low, double high, std::string why) {
  graph::setting_range r;
  r.low = low;
  r.high = high;
  const std::string range = graph::describe_range(r, graph::setting_type::int_);
  return CLI::Validator(
      [low, high, range, why](std::string& text) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') return {};  // not a number: the option's own conversion says so
        if (x >= low && x <= high) return {};
        return "must be " + range + " (" + why + "), got " + text;
      },
      "[" + range + "]");
}

CLI::Validator setting_check(const graph::setting_decl& decl, const std::string& kind) {
  std::string range = graph::describe_range(decl.range, decl.type);
  return CLI::Validator(
      [decl, kind](std::string& text) -> std::string {
        graph::setting_value v;
        char* end = nullptr;
        if (decl.type == graph::setting_type::int_) {
          const long long i = std::strtoll(text.c_str(), &end, 10);
          if (end == text.c_str() || *end != '\0') return {};  // not an integer: the option's conversion says so
          v = static_cast<std::int64_t>(i);
        } else {
          const double x = std::strtod(text.c_str(), &end);
          if (end == text.c_str() || *end != '\0') return {};
          v = x;
        }
        if (auto why = graph::range_violation(decl, v))
          return *why + " (the same rule as the " + kind + " setting " + decl.name + ": `flowrun explain " + kind +
                 "`)";
        return {};
      },
      range.empty() ? std::string() : "[" + range + "]");
}

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

// Validate and run one graph file; returns the exit code (2: invalid graph).
int run_graph_file(const run_opts& o_in) {
  const run_opts* o = &o_in;
  log_to_stderr();
  registries r;
  graph::validate_options vo;
  vo.asset_root = assets_root();
  auto v = graph::load_graph(o->file, r.kinds, vo, o->overrides);
  for (const auto& w : v.warnings) spdlog::warn("{}", w);
  if (!v.ok()) {
    std::cerr << graph::format_errors(v.errors);
    return 2;
  }
  // The cluster: --cluster FILE replaces the graph's [cluster]; then every `on` must name one of its nodes
  // (or "any").
  if (!o->cluster_file.empty()) {
    auto c = graph::parse_cluster_file(o->cluster_file);
    if (!c.ok()) {
      std::cerr << graph::format_errors(c.errors);
      return 2;
    }
    if (v.spec.cluster.pos.known())  // the graph's own table is set aside whole (its nodes were replaced silently)
      spdlog::info("--cluster {}: its [cluster] replaces the graph's own ({}:{}), nodes and settings",
                   o->cluster_file, v.spec.cluster.pos.file, v.spec.cluster.pos.line);
    v.spec.cluster = std::move(c.cluster);
  }
  if (auto errors = graph::check_placement(v.spec); !errors.empty()) {
    std::cerr << graph::format_errors(errors);
    return 2;
  }
  // `on` means nothing without a cluster (docs/scaling.md): a placement written for one (a --cluster forgotten)
  // ran every node in this process without a word
  if (v.spec.cluster.empty() && !v.spec.cluster.pos.known())
    for (const auto& n : v.spec.nodes)
      if (!n.on.empty() && n.on != graph::main_process_name)
        spdlog::warn("node '{}': on = \"{}\" places it on a cluster node, but the run has no cluster: every node runs "
                     "in this process (give --cluster FILE, or a [cluster] table in the graph, to spread it)",
                     n.name, n.on);
  // on = "any": the planner picks a cluster node by resources (docs/scaling.md).
  if (auto errors = graph::assign_placement(v.spec); !errors.empty()) {
    std::cerr << graph::format_errors(errors);
    return 2;
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
    return 2;
  }
  ro.default_restart.when = *mode;
  // The console: --no-console wins, then --console PORT, then the graph's console_port; off otherwise.
  const std::int64_t port = o->console_port >= 0 ? o->console_port : v.spec.console_port;
  if (!o->no_console && port >= 0) {
    if (port > 65535) {
      spdlog::error("--console {}: a TCP port is 0 to 65535 (0: a free one)", port);
      return 2;
    }
    ro.console.enabled = true;
    ro.console.port = static_cast<int>(port);
    ro.console.bind = o->console_bind;
    ro.console.token = o->console_token;
    const bool given = o->console_token_given;  // --console-token '' was taken as "no token": a random one
    if (ro.console.token.empty() && !given)
      if (const char* t = std::getenv("FLOWRUN_CONSOLE_TOKEN")) ro.console.token = t;
    // a token is sent in an HTTP header and written as one line of --console-token-file (flowctl reads the first
    // line): one with a space or a control character could not be used (a newline split the log's line too)
    const std::string from = given ? "--console-token" : "FLOWRUN_CONSOLE_TOKEN";
    if (given && ro.console.token.empty()) {
      spdlog::error("--console-token is empty: give a token of 16 or more printable characters, or leave the option "
                    "out for a random one");
      return 2;
    }
    if (std::any_of(ro.console.token.begin(), ro.console.token.end(),
                    [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; })) {
      spdlog::error("{}: the console token holds a space or a control character (a newline, a tab): it travels in an "
                    "HTTP header and as one line of --console-token-file; give printable characters only",
                    from);
      return 2;
    }
    ro.console.token_file = o->console_token_file;
    ro.console.linger_s = o->console_linger;
    // the token guards pause, stop and checkpoint (and every request off loopback): a short one is guessed
    if (!ro.console.token.empty() && ro.console.token.size() < 16)
      spdlog::warn("the console token is {} characters: one of 16 or more (the default is a random one) keeps it "
                   "from being guessed",
                   ro.console.token.size());
  }
  // TLS files given are checked even when the graph places nothing on a cluster node (a dry run
  // passed a bad key, which the real one refused)
  if (!(o->tls_cert.empty() && o->tls_key.empty() && o->tls_ca.empty()) &&
      !tls_files_ok(o->tls_cert, o->tls_key, o->tls_ca))
    return 2;
  if (!actor::needs_cluster(v.spec) && !(o->tls_cert.empty() && o->tls_key.empty() && o->tls_ca.empty()))
    spdlog::warn("--tls-cert / --tls-key / --tls-ca: the graph places nothing on a cluster node, so no connection "
                 "uses them (they secure a cluster run's links: docs/scaling.md)");
  if (actor::needs_cluster(v.spec)) {
    auto secret = actor::load_cluster_secret(o->secret_file);
    if (!secret) {
      spdlog::error("{}", secret.error());
      return 2;
    }
    ro.cluster.secret = *secret;
    ro.cluster.tls_cert = o->tls_cert;
    ro.cluster.tls_key = o->tls_key;
    ro.cluster.tls_ca = o->tls_ca;
  }
  if (o->check) {  // everything checked before a run starts; the nodes' own start (files they read) is not
    std::cout << fmt::format("{}: {} nodes, {} edges: the settings, edges and placement check out; nothing was run (what "
                             "is checked only as the run starts is not: a checkpoint's recorded settings, the --metrics "
                             "file, a cluster's addresses as they resolve)\n",
                             o->file, v.spec.nodes.size(), v.spec.edges.size());
    return 0;
  }
  auto result = actor::run_graph(v.spec, r.kinds, r.factories, ro);
  if (!result.error.empty()) spdlog::error("{}", result.error);
  return result.exit_code;
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
      ->capture_default_str()
      ->check(bounded(1, static_cast<double>(graph::max_credit),
                      "each link keeps a slot per credit: more only costs memory"));
  sub->add_option("--threads", o->threads, "CAF worker threads (0: one per core)")
      ->capture_default_str()
      ->check(threads_check());
  sub->add_option("--restart", o->restart, "Restart policy of nodes whose kind has no restart setting")
      ->capture_default_str();
  sub->add_flag("--check", o->check, "Check the graph (settings, edges, placement, the --set overrides, the files "
                                     "they name) and exit: 0 when it checks out, 2 with the errors; nothing is run");
  sub->add_flag("--no-progress", o->no_progress, "No progress line, even on a terminal");
  sub->add_flag("--quiet,-q", o->quiet, "No metrics summary at the end");
  sub->add_option("--console", o->console_port,
                  "Serve the live console (HTTP API, event stream, web page) on 127.0.0.1:PORT; 0: a free port "
                  "(printed at start). Default: the graph's console_port, else off")
      ->check(CLI::Range(0, 65535));
  sub->add_flag("--no-console", o->no_console, "No console, even if the graph sets console_port");
  sub->add_option("--console-bind", o->console_bind,
                  "Address the console listens on (not loopback: every request needs the token)")
      ->capture_default_str();
  sub->add_option("--console-token", o->console_token,
                  "The console's token (default: $FLOWRUN_CONSOLE_TOKEN, else a random one printed at start)")
      ->each([o](const std::string&) { o->console_token_given = true; });
  sub->add_option("--console-token-file", o->console_token_file, "Write the console's token to this file (mode 0600)");
  sub->add_option("--console-linger", o->console_linger,
                  "Seconds to keep serving the console's final state after the run ended (Ctrl-C ends it)")
      ->check(bounded(0, 604800, "seconds, at most a week"));
  sub->add_option("--cluster", o->cluster_file,
                  "A TOML file with a [cluster] table (replaces the graph's): the node daemons replicas are placed "
                  "on with on = \"NAME\" (docs/scaling.md)");
  sub->add_option("--secret-file", o->secret_file,
                  "The cluster's shared secret (first line); default: $FLOWRUN_CLUSTER_SECRET");
  add_tls_options(sub, o->tls_cert, o->tls_key, o->tls_ca);
  sub->callback([o] {
    int rc = run_graph_file(*o);
    if (rc != 0) throw exit_request{rc};
  });
}

// The overrides of `user` that apply to graph `file` (node.NAME.* only where the file has [node.NAME]).
std::vector<std::string> overrides_for(const std::string& file, const std::vector<std::string>& user) {
  std::ifstream gf(file);
  std::string text((std::istreambuf_iterator<char>(gf)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  for (const auto& x : user) {  // node.NAME.KEY=VALUE goes to the graphs that have node NAME
    if (x.rfind("node.", 0) == 0) {
      std::string name = x.substr(5, x.find('.', 5) - 5);
      if (text.find("[node." + name + "]") == std::string::npos) continue;
    }
    out.push_back(x);
  }
  return out;
}

// The graph `entry` (its file and overrides) as the run will plan it: paths resolved, not checked on disk.
graph::validation_result planned_graph(const std::pair<std::string, std::vector<std::string>>& entry) {
  registries r;
  graph::validate_options vo;
  vo.asset_root = assets_root();
  vo.check_files = false;  // only the settings' values are wanted here; the run checks the inputs
  return graph::load_graph(entry.first, r.kinds, vo, entry.second);
}

// Path setting `key` of node `node` in a planned graph (file, all its overrides) as validation without file checks
// leaves it: an output absolute, an input as written (the run resolves it); "" when the node or setting is missing.
std::string planned_path(const std::pair<std::string, std::vector<std::string>>& entry, const std::string& node,
                         const std::string& key) {
  auto v = planned_graph(entry);
  if (!v.ok()) {
    std::cerr << graph::format_errors(v.errors);
    throw exit_request{2};
  }
  const auto* n = v.spec.find_node(node);
  const auto* s = n ? n->find_setting(key) : nullptr;
  return s ? std::get<std::string>(s->value) : std::string();
}

// Setting `key` of node `node` in the graph `entry` plans, as text ("true", "3", a path as it is), or "" where the
// graph has no such node or setting, or does not validate (the run names the problem).
std::string planned_setting(const std::pair<std::string, std::vector<std::string>>& entry, const std::string& node,
                            const std::string& key) {
  auto v = planned_graph(entry);
  const auto* n = v.ok() ? v.spec.find_node(node) : nullptr;
  const auto* s = n ? n->find_setting(key) : nullptr;
  if (!s) return "";
  if (const auto* text = std::get_if<std::string>(&s->value)) return *text;  // unquoted
  return graph::to_string(s->value);
}

// Where the run finds input `p` of graph file `file` (p as planned_path leaves it): absolute as it is; else the
// first that exists of beside the graph file, from the working directory (a --set), under FLOWRUN_ASSETS; else
// beside the graph file.
std::string resolve_planned(const std::string& file, const std::string& p) {
  namespace fs = std::filesystem;
  if (p.empty() || fs::path(p).is_absolute()) return p;
  const fs::path graph_dir = fs::path(file).parent_path();
  for (const fs::path& c : {graph_dir / p, fs::path(p), assets_root() / p})
    if (fs::exists(c)) return c.string();
  return (graph_dir / p).string();
}

// The absolute path node `node` of a planned graph will write its `output` to: what a later step of the same
// `flowrun train` must read.
std::string planned_output(const std::pair<std::string, std::vector<std::string>>& entry, const std::string& node) {
  const std::string out = planned_path(entry, node, "output");
  if (out.empty()) {
    spdlog::error("flowrun train: {} has no output for node '{}', so the next step cannot read what it writes: "
                  "set one with --set node.{}.output=PATH",
                  entry.first, node, node);
    throw exit_request{2};
  }
  return out;
}

void add_train(CLI::App& app) {
  struct train_opts {
    std::vector<int> steps = {1, 2, 3};
    std::string deployment_type = "single_node";
    std::string actor_model = "model/stories260K/stories260K.bin";
    std::string reward_model = "model/stories260K/stories260K.bin";
    std::vector<std::string> overrides;
    std::string dtype;  // "": each node's own
    std::string output_dir;  // "": the graphs' own outputs
    int actor_zero_stage = -1, reward_zero_stage = -1;  // -1: each node's own
  };
  auto o = std::make_shared<train_opts>();
  auto* sub = app.add_subcommand("train", "DeepSpeed-Chat's train.py: picks the graphs for --step and runs them");
  sub->add_option("--step", o->steps, "Steps to run: 1 (SFT), 2 (reward model), 3 (PPO)")->capture_default_str();
  sub->add_option("--deployment-type", o->deployment_type, "single_gpu, single_node or multi_node")
      ->capture_default_str();
  auto* actor_opt = sub->add_option("--actor-model", o->actor_model,
                  "Step 1's base model; with step 3 but not step 1, the SFT model PPO starts from (default there: what graphs/sft.graph writes)")
      ->capture_default_str();
  auto* reward_opt = sub->add_option("--reward-model", o->reward_model,
                  "Step 2's base model; with step 3 but not step 2, the reward model folder (default there: what graphs/rm.graph writes)")
      ->capture_default_str();
  sub->add_option("--set", o->overrides, "Extra overrides (node.NAME.KEY=VALUE), each given to the graphs that have NAME");
  sub->add_option("--dtype", o->dtype,
                  "fp32, bf16 or fp16 for every model of the steps (DS-Chat's --dtype): dtype set on the nodes sft, "
                  "rm, policy, critic, reference and reward of the graphs run; default: each node's own (fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_option("--actor-zero-stage", o->actor_zero_stage,
                  "DS-Chat's --actor-zero-stage: the ZeRO stage of step 1 (sft zero_stage) and of step 3's actor "
                  "(policy actor_zero_stage); default: each node's own (0)")
      ->check(CLI::Range(0, 3));
  sub->add_option("--reward-zero-stage", o->reward_zero_stage,
                  "DS-Chat's --reward-zero-stage: the ZeRO stage of step 2 (rm zero_stage) and of step 3's critic "
                  "(critic critic_zero_stage); default: each node's own (0)")
      ->check(CLI::Range(0, 3));
  sub->add_option("--output-dir", o->output_dir,
                  "DS-Chat's --output-dir: the steps write DIR/actor-models/actor, DIR/reward-models/reward_model, "
                  "DIR/step3-models/actor and DIR/step3-models/critic (a .bin file for a llama2.c actor model, else "
                  "folders), with the policy's enable_ema DIR/step3-models/actor_ema, and their checkpoints into "
                  "DIR/checkpoints; default: the graphs' own outputs (out/rlhf), "
                  "as folders for a model folder, and the critic in ppo_critic beside the policy's");
  sub->callback([o, actor_opt, reward_opt] {
    log_to_stderr();
    std::set<int> steps(o->steps.begin(), o->steps.end());
    for (int s : steps)
      if (s < 1 || s > 3) {
        spdlog::error("--step {}: the steps are 1 (SFT), 2 (reward model) and 3 (PPO)", s);
        throw exit_request{2};
      }
    if (o->deployment_type == "single_gpu") {
      if (!cuda_device_present()) {
        spdlog::error("--deployment-type single_gpu: no GPU is present on this machine. flowrun runs the same "
                      "graphs on the CPU backend: use --deployment-type single_node");
        throw exit_request{2};
      }
    } else if (o->deployment_type == "multi_node") {
      spdlog::error("--deployment-type multi_node: flowrun train runs the graphs in this process; to spread them over "
                    "machines run the graph with a cluster, e.g. `flowrun run graphs/rlhf.graph --cluster CLUSTER.toml "
                    "--secret-file SECRET --set node.reward.on=w1 --set node.critic.on=w1` (models and tensors cross "
                    "through the bulk plane; docs/scaling.md), or use --deployment-type single_node");
      throw exit_request{2};
    } else if (o->deployment_type != "single_node") {
      spdlog::error("--deployment-type {}: use single_gpu, single_node or multi_node", o->deployment_type);
      throw exit_request{2};
    }
    auto graph_path = [](const std::string& name) {
      std::filesystem::path local = std::filesystem::path("graphs") / name;
      if (std::filesystem::exists(local)) return local.string();
      return (std::filesystem::path(FLOWRUN_SOURCE_DIR) / "graphs" / name).string();
    };
    // --actor-model / --reward-model are command-line paths: they resolve against the working directory, then
    // FLOWRUN_ASSETS (validate.h, "Path settings"). A step that reads what an earlier step of this command
    // writes is given that step's resolved output, so it reads that very file, wherever either graph points.
    namespace fs = std::filesystem;
    // Step 3 without step 1 (2) reads the actor (reward) model step 1 (2) wrote: --actor-model (--reward-model)
    // when given; under --output-dir its model there (DS-Chat's train.py reads OUTPUT_DIR/actor-models and
    // reward-models; it read ppo.graph's out/rlhf ones, an older run's); else ppo.graph's own input, as the
    // folder of that name without .bin where step 1 on a model folder wrote one (it read an older .bin there,
    // or refused a missing one). "" leaves ppo.graph's input as it is.
    auto earlier = [&](const fs::path& file, const fs::path& folder, const char* option) -> std::string {
      std::error_code ec;
      const bool f = fs::is_regular_file(file, ec), d = fs::is_directory(folder, ec);
      if (f && d) {
        spdlog::error("flowrun train --step {}: both {} and {} are there (a llama2.c run's and a model folder's): "
                      "give {} to say which step 3 starts from",
                      fmt::join(o->steps, " "), file.string(), folder.string(), option);
        throw exit_request{2};
      }
      return f ? file.string() : d ? folder.string() : std::string();
    };
    // under --output-dir, step 3 without step N reads step N's model there and nowhere else (it went on to ppo.graph's
    // out/rlhf model, an older run's, with exit 0, where a mistyped --output-dir held none)
    auto missing_under_output_dir = [&](int step, const fs::path& file, const fs::path& folder, const char* option) {
      spdlog::error("flowrun train --step {} --output-dir {}: step 3 without step {} reads step {}'s model from {} or "
                    "{}, and neither is there: check --output-dir, run step {} with it, or give {}",
                    fmt::join(o->steps, " "), o->output_dir, step, step, file.string(), folder.string(), step, option);
      throw exit_request{2};
    };
    std::string step3_actor, step3_reward;
    if (steps.count(3) && !steps.count(1)) {
      if (actor_opt->count()) step3_actor = o->actor_model;
      else if (!o->output_dir.empty()) {
        const fs::path a = fs::absolute(o->output_dir) / "actor-models";
        step3_actor = earlier(a / "actor.bin", a / "actor", "--actor-model");
        if (step3_actor.empty()) missing_under_output_dir(1, a / "actor.bin", a / "actor", "--actor-model");
      } else {
        const std::string ppo = graph_path("ppo.graph");
        const std::string at = resolve_planned(ppo, planned_path({ppo, {}}, "actor_model", "model"));
        if (at.size() > 4 && at.substr(at.size() - 4) == ".bin")
          step3_actor = earlier(at, at.substr(0, at.size() - 4), "--actor-model");
      }
    }
    if (steps.count(3) && !steps.count(2)) {
      if (reward_opt->count()) step3_reward = o->reward_model;
      else if (!o->output_dir.empty()) {
        const fs::path r = fs::absolute(o->output_dir) / "reward-models";
        step3_reward = earlier(r / "reward_model.bin", r / "reward_model", "--reward-model");
        if (step3_reward.empty())
          missing_under_output_dir(2, r / "reward_model.bin", r / "reward_model", "--reward-model");
      }
    }
    // the models whose text the steps read: steps 1-2's bases, or what step 3 reads
    const std::string actor_model = steps.count(1) ? o->actor_model : step3_actor;
    const std::string reward_model = steps.count(2) ? o->reward_model : step3_reward;
    const bool reads_actor = !actor_model.empty(), reads_reward = !reward_model.empty();
    // DS-Chat's train.py reads every step's text with its model's tokenizer (steps 1 and 3: the actor model's,
    // step 2: the reward model's): a model with a tokenizer of its own (an HF folder, a llama2.c file convert
    // wrote beside one) gives it to the nodes that read text (they kept tok512 and were refused)
    const std::string actor_tok = reads_actor ? tokenizer_for({actor_model}, "", false) : std::string();
    const std::string reward_tok = reads_reward ? tokenizer_for({reward_model}, "", false) : std::string();
    std::vector<std::string> model_ov;
    if (!actor_tok.empty())
      for (const char* n : {"sft", "prompts", "generator", "policy"})
        model_ov.push_back(std::string("node.") + n + ".tokenizer=" + actor_tok);
    if (!reward_tok.empty()) model_ov.push_back("node.rm.tokenizer=" + reward_tok);
    // step 3 reads the actor's and the reward model's text with one tokenizer (train.py's models are of one family):
    // two that differ are refused now, before steps 1-2 train (step 3 refused them after)
    if (steps.count(3) && reads_actor && reads_reward) {
      // a model without one is read with its step's graph's tokenizer
      auto graph_tok = [&](const char* file, const char* node) {
        return resolve_planned(graph_path(file), planned_path({graph_path(file), {}}, node, "tokenizer"));
      };
      const std::string a = actor_tok.empty() ? graph_tok("sft.graph", "sft") : actor_tok;
      const std::string r = reward_tok.empty() ? graph_tok("rm.graph", "rm") : reward_tok;
      std::string why;
      try {
        if (a != r) why = tokenizer_difference(*load_tokenizer(a), *load_tokenizer(r));
      } catch (const std::exception&) {  // an unreadable tokenizer: the run names it
      }
      if (!why.empty()) {
        spdlog::error("flowrun train --step {}: step 3 reads the actor's and the reward model's text with one "
                      "tokenizer, as DeepSpeed-Chat's train.py, and the actor model {} reads with {} and the reward "
                      "model {} with {}: they differ ({}); give a reward model of the actor's family (its tokenizer)",
                      fmt::join(o->steps, " "), actor_model, a, reward_model, r, why);
        throw exit_request{2};
      }
    }
    // the trained models are saved in the format they were given in: a llama2.c actor as .bin files, a model
    // folder as folders (the graphs' .bin outputs were refused for an HF actor)
    bool actor_file = true;
    try {
      actor_file = !reads_actor || inspect_model(resolve_user_path(actor_model, "model").string()).format ==
                                       model_format::llama2c;
    } catch (const std::exception&) {  // the run names a model that cannot be read
    }
    const std::string ext = actor_file ? ".bin" : "";
    if (!o->output_dir.empty()) {  // DS-Chat's layout under --output-dir
      const fs::path d = fs::absolute(o->output_dir);
      model_ov.push_back("graph.checkpoint_dir=" + (d / "checkpoints").string());
      model_ov.push_back("node.sft.output=" + (d / "actor-models" / ("actor" + ext)).string());
      model_ov.push_back("node.rm.output=" + (d / "reward-models" / "reward_model").string());
      model_ov.push_back("node.policy.output=" + (d / "step3-models" / ("actor" + ext)).string());
      model_ov.push_back("node.critic.output=" + (d / "step3-models" / "critic").string());
    }
    std::vector<std::pair<std::string, std::vector<std::string>>> plan;
    auto add = [&](const std::string& name, std::vector<std::string> ov) {  // then the user's overrides for it
      const std::string file = graph_path(name);
      for (auto& x : overrides_for(file, model_ov)) ov.push_back(std::move(x));
      if (!actor_file && o->output_dir.empty())  // the graph's own .bin outputs, as folders of the same names
        for (const char* n : {"sft", "policy"}) {
          const std::string out = planned_path({file, ov}, n, "output");
          if (out.size() > 4 && out.substr(out.size() - 4) == ".bin")
            ov.push_back(std::string("node.") + n + ".output=" + out.substr(0, out.size() - 4));
        }
      {  // DS-Chat's --actor-zero-stage / --reward-zero-stage (train.py hands them to steps 1 and 3, 2 and 3)
        std::vector<std::string> zs;
        if (o->actor_zero_stage >= 0)
          for (const char* x : {"sft.zero_stage", "policy.actor_zero_stage"})
            zs.push_back(std::string("node.") + x + "=" + std::to_string(o->actor_zero_stage));
        if (o->reward_zero_stage >= 0)
          for (const char* x : {"rm.zero_stage", "critic.critic_zero_stage"})
            zs.push_back(std::string("node.") + x + "=" + std::to_string(o->reward_zero_stage));
        for (auto& x : overrides_for(file, zs)) ov.push_back(std::move(x));
      }
      if (!o->dtype.empty()) {  // DS-Chat's --dtype: every model node the graph has (before --set, which wins)
        std::vector<std::string> dt;
        for (const char* n : {"sft", "rm", "policy", "critic", "reference", "reward"})
          dt.push_back(std::string("node.") + n + ".dtype=" + o->dtype);
        for (auto& x : overrides_for(file, dt)) ov.push_back(std::move(x));
      }
      for (auto& x : overrides_for(file, o->overrides)) ov.push_back(std::move(x));
      // DS-Chat's train.py saves the critic beside the actor (OUTPUT_DIR/.../critic): without --output-dir, into
      // ppo_critic beside the policy's output, unless the critic's output is given (it was not saved at all)
      if (o->output_dir.empty() && steps.count(3)) {
        const std::string critic = planned_path({file, ov}, "critic", "output");
        const std::string policy = critic.empty() ? planned_path({file, ov}, "policy", "output") : std::string();
        if (critic.empty() && !policy.empty())
          ov.push_back("node.critic.output=" + (fs::path(policy).parent_path() / "ppo_critic").string());
      }
      // DS-Chat's OUTPUT_DIR/actor_ema: the policy's EMA under --output-dir, where the run keeps one (enable_ema)
      // and names no place for it
      if (!o->output_dir.empty() && steps.count(3) && planned_setting({file, ov}, "policy", "enable_ema") == "true" &&
          planned_setting({file, ov}, "policy", "ema_output").empty())
        ov.push_back("node.policy.ema_output=" +
                     (fs::absolute(o->output_dir) / "step3-models" / ("actor_ema" + ext)).string());
      plan.push_back({file, std::move(ov)});
    };
    if (steps == std::set<int>{1, 2, 3}) {
      add("rlhf.graph", {"node.sft.model=" + o->actor_model, "node.rm.model=" + o->reward_model});
    } else {
      if (steps.count(1)) add("sft.graph", {"node.sft.model=" + o->actor_model});
      if (steps.count(2)) add("rm.graph", {"node.rm.model=" + o->reward_model});
      if (steps.count(3)) {
        // step 3 alone reads what steps 1-2 wrote (step3_actor / step3_reward above), unless told
        std::vector<std::string> ov;
        if (steps.count(1)) ov.push_back("node.actor_model.model=" + planned_output(plan[0], "sft"));
        else if (!step3_actor.empty()) ov.push_back("node.actor_model.model=" + step3_actor);
        if (steps.count(2)) ov.push_back("node.reward_model.model=" + planned_output(plan.back(), "rm"));
        else if (!step3_reward.empty()) ov.push_back("node.reward_model.model=" + step3_reward);
        add("ppo.graph", std::move(ov));
        // step 3 without the step that makes one of its models reads that model from disk: refused now if it is
        // not there, before the steps planned before it train (it failed after them, pointing at FLOWRUN_ASSETS)
        const struct { int step; const char* node; const char* option; } reads[] = {
            {1, "actor_model", "--actor-model"}, {2, "reward_model", "--reward-model"}};
        for (const auto& r : reads) {
          if (steps.count(r.step)) continue;
          namespace fs = std::filesystem;
          const std::string p = planned_path(plan.back(), r.node, "model");  // as written: inputs resolve at the run
          // where the run's rule may find it (lenient: only a model found nowhere is refused here)
          if (!p.empty() && !fs::exists(resolve_planned(plan.back().first, p))) {
            spdlog::error("flowrun train --step {}: step 3 without step {} reads {}'s model from {}, which does not "
                          "exist: give {} (step {}'s output), or add step {} to --step",
                          fmt::join(o->steps, " "), r.step, r.node, p, r.option, r.step, r.step);
            throw exit_request{2};
          }
        }
      }
    }
    for (const auto& x : o->overrides) {  // a node that no planned graph has is a mistake, not a no-op
      if (x.rfind("node.", 0) != 0) continue;
      std::string name = x.substr(5, x.find('.', 5) - 5);
      bool found = false;  // add() gave it to every graph that has the node
      for (auto& [file, ov] : plan) found = found || std::find(ov.begin(), ov.end(), x) != ov.end();
      if (!found) {
        spdlog::error("--set {}: no graph of these steps has a node '{}'", x, name);
        throw exit_request{2};
      }
    }
    for (auto& [file, ov] : plan) {
      run_opts ro;
      ro.file = file;
      ro.overrides = ov;
      std::string shown;
      for (auto& x : ro.overrides) shown += " --set " + x;
      spdlog::info("flowrun train ({}): running {}{}", o->deployment_type, file, shown);
      int rc = run_graph_file(ro);
      if (rc != 0) throw exit_request{rc};
    }
  });
}

void add_node(CLI::App& app) {
  struct node_opts {
    std::string listen = "127.0.0.1:0";
    std::string secret_file;
    std::string port_file;
    bool once = false;
    std::size_t threads = 0;
    std::string tls_cert, tls_key, tls_ca;
  };
  auto o = std::make_shared<node_opts>();
  auto* sub = app.add_subcommand(
      "node", "Run a node daemon: cluster runs (flowrun run with a [cluster]) place replicas here (docs/scaling.md)");
  sub->add_option("--listen", o->listen, "HOST:PORT to listen on (port 0: a free one, printed)")->capture_default_str();
  sub->add_option("--secret-file", o->secret_file,
                  "The cluster's shared secret (first line); default: $FLOWRUN_CLUSTER_SECRET");
  sub->add_option("--port-file", o->port_file, "Write the port here once listening");
  sub->add_flag("--once", o->once, "Exit when the first job ends");
  sub->add_option("--threads", o->threads, "CAF worker threads (0: one per core)")
      ->capture_default_str()
      ->check(threads_check());
  add_tls_options(sub, o->tls_cert, o->tls_key, o->tls_ca);
  sub->callback([o] {
    log_to_stderr();
    if (!tls_files_ok(o->tls_cert, o->tls_key, o->tls_ca)) throw exit_request{2};
    actor::node_daemon_options d;
    d.tls_cert = o->tls_cert;
    d.tls_key = o->tls_key;
    d.tls_ca = o->tls_ca;
    // the cluster file's rule (util::split_host_port): "[::1]", "::1" and "h:7001x" were taken as garbled hosts
    // or ports
    const auto hp = util::split_host_port(o->listen);
    if (!hp) {
      spdlog::error("--listen {}: write HOST:PORT, e.g. 127.0.0.1:7001 or [::1]:7001 (port 0: a free one)", o->listen);
      throw exit_request{2};
    }
    if (hp->port > 65535) {
      spdlog::error("--listen {}: port {} is past 65535: give a port in 1..65535 (0: a free one)", o->listen, hp->port);
      throw exit_request{2};
    }
    d.host = hp->host;
    d.port = hp->port;
    auto secret = actor::load_cluster_secret(o->secret_file);
    if (!secret) {
      spdlog::error("flowrun node: {}", secret.error());
      throw exit_request{2};
    }
    d.secret = *secret;
    d.port_file = o->port_file;
    d.once = o->once;
    d.threads = o->threads;
    d.asset_root = assets_root();
    registries r;
    int rc = actor::run_node_daemon(d, r.kinds, r.factories);
    if (rc != 0) throw exit_request{rc};
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
