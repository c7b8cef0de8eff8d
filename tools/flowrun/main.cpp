// flowrun: the command-line entry point.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <memory>
#include <string>
#include <thread>
#include <chrono>

#include <unistd.h>

#include <spdlog/spdlog.h>

#include "runtime/actor/console.h"
#include "runtime/graph/graph_spec.h"
#include "runtime/kernels/cpu/simd_kernels.h"
#include "runtime/util/assets.h"
#include "tools/flowrun/commands.h"
#include "tools/flowrun/option_hints.h"

namespace {

// A process `flowrun launch` started (FLOWRUN_LAUNCHER_PID: the launcher's pid) gets one SIGTERM when the
// launcher dies, kill -9 included, and drains as on SIGTERM: it kept training (and committing checkpoints
// into the output_dir a resume would use) as an orphan. A thread of its own watches the parent's pid (it
// changes when the launcher dies and the process is re-parented). PR_SET_PDEATHSIG did this first, but it
// fires on the death of each launcher thread the process is re-parented to: two or three SIGTERMs, and
// the third is "exit at once" (no drain). A launcher gone before this ran: exit at once.
bool watch_launcher() {
  const char* v = std::getenv("FLOWRUN_LAUNCHER_PID");
  if (!v || !*v) return true;
  const pid_t launcher = static_cast<pid_t>(std::atol(v));
  if (::getppid() != launcher) {
    std::fprintf(stderr, "flowrun: the flowrun launch that started this process (pid %s) has ended; stopping\n", v);
    return false;
  }
  std::thread([launcher] {
    while (::getppid() == launcher) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::kill(::getpid(), SIGTERM);  // once
  }).detach();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // A peer that goes away (a killed cluster node, a console client) must be an error on the write, not
  // SIGPIPE ending this process silently.
  std::signal(SIGPIPE, SIG_IGN);
  if (!watch_launcher()) return 1;
  // logs go to stderr; stdout carries the program's output (generated text, results)
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("flowrun", flowrun::actor::console::log_sink()));
  // FLOWRUN_SIMD=PATH runs the vector kernels' PATH (AVX3, AVX2, SSE4, SCALAR, NEON, ...) instead of the
  // CPU's best, as bench_core --simd: to tell a kernel path's numerics from the rest.
  if (const char* path = std::getenv("FLOWRUN_SIMD"); path && *path) {
    try {
      flowrun::simd::force_target(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "flowrun: FLOWRUN_SIMD: %s\n", e.what());
      return 2;
    }
  }
  CLI::App app{"flowrun: a dataflow runtime that trains and aligns language models"};
  app.require_subcommand(1);
  flowrun::cli::add_generate(app);
  flowrun::cli::add_train_lm(app);
  flowrun::cli::add_run(app);
  flowrun::cli::add_train(app);
  flowrun::cli::add_kinds(app);
  flowrun::cli::add_explain(app);
  flowrun::cli::add_convert(app);
  flowrun::cli::add_eval(app);
  flowrun::cli::add_chat(app);
  flowrun::cli::add_launch(app);
  flowrun::cli::add_node(app);
  flowrun::cli::add_report(app);
  // `flowrun x.graph ...` is `flowrun run x.graph ...`.
  auto args = flowrun::cli::expand_graph_shorthand(app, argc, argv);
  // A first word that is no command (and no graph file): say so, with the commands (CLI11 said
  // only "A subcommand is required")
  if (args.size() >= 2 && !args[1].empty() && args[1][0] != '-' &&
      app.get_subcommands([&](const CLI::App* sub) { return sub->check_name(args[1]); }).empty()) {
    std::string names, closest;
    std::size_t best = 3;  // at most 2 edits away to be suggested
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      if (const std::size_t d = flowrun::graph::edit_distance(args[1], sub->get_name()); d < best) {
        best = d;
        closest = sub->get_name();
      }
    }
    if (args[1].find_first_of("./") != std::string::npos)  // a path: the graph file is what is missing
      std::fprintf(stderr, "flowrun: no file '%s' (a graph file runs with `flowrun FILE.graph`), and it is not a "
                   "command either (flowrun --help)\n",
                   args[1].c_str());
    else
      std::fprintf(stderr, "flowrun: '%s' is not a command%s; the commands are %s, and `flowrun FILE.graph` runs a "
                   "graph (flowrun --help)\n",
                   args[1].c_str(), closest.empty() ? "" : (" (did you mean '" + closest + "'?)").c_str(), names.c_str());
    return 2;
  }
  flowrun::cli::apply_omp_defaults(args, argv);  // may re-execute this program (same pid and arguments)
  flowrun::cli::show_omp_settings_if_asked();  // FLOWRUN_SHOW_OMP=1 (tests/omp_defaults.sh)
  std::vector<char*> args_c;
  for (auto& a : args) args_c.push_back(a.data());
  try {
    app.parse(static_cast<int>(args_c.size()), args_c.data());
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error (unknown option, missing or bad value) exits 2,
    // not CLI11's own codes (105 and so on), like every other refused input
    const int rc = app.exit(e) == 0 ? 0 : 2;
    if (rc != 0 && args.size() >= 2)  // an option of another spelling or tool: what it is here
      for (const auto* sub : app.get_subcommands([&](const CLI::App* s) { return s->check_name(args[1]); }))
        for (const auto& hint : flowrun::cli::unknown_option_hints(*sub, args)) std::fprintf(stderr, "  hint: %s\n", hint.c_str());
    return rc;
  } catch (const flowrun::cli::exit_request& e) {
    return e.code;
  } catch (const flowrun::asset_missing& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
