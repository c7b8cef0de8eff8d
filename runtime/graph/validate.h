// Layer 4, graph description: checking a graph_spec before anything starts.
//
// validate() checks a spec against the node kind registry and returns every
// error it finds (not just the first), each with file:line:col and a hint,
// together with a resolved copy of the spec that the runtime can use as is:
//   - every declared setting present (defaults filled in, from_default set),
//     integer values of float settings turned into floats;
//   - path settings replaced by the path of the file that was found;
//   - edge ports that were left out filled in; feedback set on edges into
//     ports declared feedback.
//
// What is checked:
//   - the graph has nodes; node names are identifiers and unique;
//     1 <= replicas <= max_replicas; steps >= 0;
//   - each node has a registered kind (hint: the nearest kind name);
//   - settings: unknown names (hint: the nearest valid name), wrong types,
//     values outside the range the kind declares (setting_range in
//     node_kind.h: bounds, non-zero, and finite for every float setting
//     unless the kind allows NaN/inf), required settings missing, files
//     named by path settings missing. The error points at the value, in
//     the file or in the `--set` text, and names the node, the setting, the
//     range and the value;
//   - edges: unknown nodes or ports (nearest name), an edge starting at an
//     in port or ending at an out port, a port left out where the choice is
//     ambiguous or impossible, message types that differ, duplicate edges,
//     credit outside 1..max_credit;
//   - required ports without an edge;
//   - cycles that cannot make progress;
//   - once all of the above pass (and files are checked): each kind's own
//     node_kind::check against the whole graph (e.g. that a trainer's output
//     can be written in the format of the model its edges bring).
//
// Feedback edges and cycles: a directed cycle of edges can only make progress
// when one of its edges carries messages from an earlier step (the weights
// that go from a trainer back to a generator, say). Such an edge is a
// feedback edge: either the edge string says so, with the [feedback] option,
// or the in port it ends at is declared `feedback` in its kind. A cycle with
// no feedback edge is an error, reported at the edge that closes it.
//
// Path settings: one rule for every path, inputs and outputs alike (README,
// "Paths"; `flowrun explain`):
// - a relative path written in a file (the graph file, or an included file)
//   resolves against that file's folder;
// - a relative path given on the command line (--set) resolves against the
//   working directory;
// - an input (a `path` or `path_list` setting) not found there is looked up
//   under the asset root (FLOWRUN_ASSETS); an output (`output` settings and
//   [graph] checkpoint_dir) never is.
// The resolved spec holds every path as an absolute one, so a node, a cluster
// node and a later step all name the very same file. An input must exist
// (unless check_files is off). An empty string in an optional path setting
// means "not set" and is left empty.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/graph/graph_spec.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::graph {

/// The most replicas a node may have. Every replica is an actor (a thread of
/// its own for blocking kinds) and each replica of a node has a link to each
/// replica of the nodes it is connected to, so two connected nodes of 1024
/// replicas already make a million links; more is a typo or exhausts the
/// machine (replicas = 100000 never finished starting).
inline constexpr std::int64_t max_replicas = 1024;

/// The most threads a node's `threads` may give each replica: more is a typo (an
/// OpenMP team of 5000 threads hangs a run); the machine's own count is the
/// useful bound, and a node on a cluster machine may have more cores than main.
inline constexpr std::int64_t max_node_threads = 1024;

/// The most messages in flight per link (an edge's [credit=N], `flowrun run
/// --credit`). Each link keeps a slot per credit (8 bytes), so a larger
/// credit only costs memory (--credit 1e12 failed with bad_alloc).
inline constexpr std::int64_t max_credit = 1'000'000;

/// How to validate.
struct validate_options {
  /// Where relative paths are looked up after the graph file's folder
  /// (usually flowrun::assets_root(), i.e. $FLOWRUN_ASSETS). Empty: nowhere else.
  std::filesystem::path asset_root;
  /// Check that files named by path settings exist (and resolve them).
  bool check_files = true;
};

/// The outcome of validation: the resolved spec and every error, sorted by
/// file, line and column.
struct validation_result {
  graph_spec spec;
  std::vector<graph_error> errors;
  /// Sentences for the caller to print as warnings: a `--set PATH` given twice with two values (as stored).
  std::vector<std::string> warnings;

  bool ok() const { return errors.empty(); }
};

/// Validates `spec` against `kinds` (see the top of this header for the
/// checks and for what the resolved spec holds). Never throws on bad input.
validation_result validate(const graph_spec& spec, const node_kind_registry& kinds,
                           const validate_options& options = {});

/// Reads `file` (parse_graph_file), applies the `--set` overrides in order
/// (apply_override, with `kinds`) and validates the result. Returns the
/// errors of all three stages; validation is skipped when reading failed
/// fatally (a missing file, bad TOML, an include cycle), since it would only
/// report the consequences. A PATH set twice with two values is a warning (the
/// later one holds), the values compared as stored: a string setting's `1e3` and
/// `1000` are two, its `1` and `"1"` one; a number's `1e-3` and `0.001` one.
validation_result load_graph(const std::filesystem::path& file, const node_kind_registry& kinds,
                             const validate_options& options = {}, const std::vector<std::string>& overrides = {});

}  // namespace flowrun::graph
