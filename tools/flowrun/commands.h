// flowrun's subcommands. Each registers itself on the CLI11 app.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/graph/node_kind.h"

namespace flowrun::cli {

/// `flowrun generate`: text from a model and a prompt.
void add_generate(CLI::App& app);
/// `flowrun train-lm`: causal-LM training on a text file, printing the loss each step.
void add_train_lm(CLI::App& app);
/// `flowrun convert --from llama2c|hf SRC --to hf|llama2c DST [--dtype f32|bf16|f16]`: weight formats.
void add_convert(CLI::App& app);
/// `flowrun eval prompts|reward`: DS-Chat's prompt_eval.py and rw_eval.py.
void add_eval(CLI::App& app);
/// `flowrun chat --model PATH`: DS-Chat's chat.py, a multi-turn Human:/Assistant: chat.
void add_chat(CLI::App& app);
/// `flowrun run FILE.graph [--set PATH=VALUE ...] [--metrics FILE] ...`: runs a graph on the actor runtime.
void add_run(CLI::App& app);
/// `flowrun train --step 1 2 3 --deployment-type ...`: DS-Chat's train.py over our graphs.
void add_train(CLI::App& app);
/// `flowrun node --listen HOST:PORT [--secret-file F]`: a cluster node daemon (docs/scaling.md).
void add_node(CLI::App& app);
/// `flowrun kinds`: one line per runnable node kind.
void add_kinds(CLI::App& app);
/// `flowrun explain KIND`: a kind's ports and settings.
void add_explain(CLI::App& app);
/// `flowrun launch --nproc P FILE.graph`: one graph over P processes (gloo ranks).
void add_launch(CLI::App& app);

/// `flowrun report METRICS.jsonl [-o DIR] [--signals a,b]`: the run's signals as an SVG per node and REPORT.md.
void add_report(CLI::App& app);

/// The most CAF worker threads `--threads` accepts: 8 per hardware thread and
/// never more than 1024. More workers than that only contend for the cores
/// (and `--threads 5000` hung at start).
std::size_t max_threads();

/// A CLI11 check that the number given is in [low, high] (read as a double,
/// so "1e12" and "-1" are caught before the option's own conversion); its
/// error reads "must be in [low, high] (why), got TEXT".
CLI::Validator bounded(double low, double high, std::string why);

/// A CLI11 check built from a node kind's setting declaration: the value must
/// lie in the setting's range (graph::range_violation), so a command-line
/// option and the graph setting it mirrors follow one rule (e.g. `flowrun
/// generate --temperature` and the generator's temperature). `kind` names the
/// kind in the error.
CLI::Validator setting_check(const graph::setting_decl& decl, const std::string& kind);

/// Thrown by a subcommand that wants main() to return `code` (e.g. a graph
/// run's 1, 130 or 143) after it has reported what happened.
struct exit_request {
  int code = 0;
};

/// For the subcommands that run graphs (args[1]: run, train, launch, node), when the user set neither
/// OMP_WAIT_POLICY nor GOMP_SPINCOUNT: re-executes this program (argv unchanged) with
/// OMP_WAIT_POLICY=active, GOMP_SPINCOUNT=300000 and FLOWRUN_OMP_DEFAULTS=1, since libgomp reads them
/// before main (tools/flowrun/omp_defaults.cpp says why). Returns when nothing is to be done, or when
/// the exec failed (then with the environment as it was), or /proc/self/exe is the dynamic loader.
/// Linux only; elsewhere a no-op.
void apply_omp_defaults(const std::vector<std::string>& args, char** argv);

/// With FLOWRUN_SHOW_OMP=1: prints to stderr the OpenMP wait settings this process runs with and who
/// chose them (flowrun's defaults, the user's, or libgomp's defaults).
void show_omp_settings_if_asked();

/// argv as strings, with "run" inserted before argv[1] when argv[1] names a
/// graph (ends in ".graph", or is an existing file) and is not the name of
/// one of `app`'s subcommands: `flowrun x.graph ...` means `flowrun run x.graph ...`.
std::vector<std::string> expand_graph_shorthand(const CLI::App& app, int argc, char** argv);

}  // namespace flowrun::cli
