// Layer 4, graph description: reading `.graph` files (TOML, via toml++).
//
// File format
// -----------
//   include = ["common.graph"]          # optional; paths relative to this file
//   edges = [                           # top-level, so before the first [table]
//     "prompts.lines -> tok.text",
//     "tok -> gen",                     # ports may be left out (see below)
//     "gen.completions -> sink, log [credit=4, dispatch=round_robin]",
//     "trainer.weights -> gen.weights [feedback]",
//   ]
//   [graph]
//   name = "generate"                   # default: the file's stem
//   seed = 1234                         # int >= 0, default 0
//   steps = 100                         # int >= 0, default 0 (until the sources end)
//   [node.gen]
//   kind = "generator"                  # required: a registered node kind
//   replicas = 2                        # optional, int 1..1024 (validate.h), default 1
//   on = "node-2"                       # optional placement: a [cluster] node, or one per replica
//   [cluster]                           # optional: the machines (graph_spec.h, docs/scaling.md)
//   [cluster.nodes.node-2]
//   address = "10.0.0.2:7001"
//   temperature = 0.8                   # every other key is a setting of the kind
//
// Edge strings: `FROM -> TO[, TO...] [OPTIONS]`.
//   - FROM is `node.port` or `node` (the node's only out port);
//   - TO is `node.port` or `node` (the node's only in port whose message
//     type matches FROM's; an error if none or several match);
//   - several targets give one edge each, all with the same options;
//   - OPTIONS, in square brackets, comma separated: `credit=N` (N >= 1,
//     messages in flight per link; at most max_credit, validate.h), `dispatch=broadcast|split|round_robin`, and
//     `feedback` (the edge closes a cycle; see validate.h);
//   - node and port names are identifiers: [A-Za-z_][A-Za-z0-9_]*.
// Errors inside an edge string point at the offending column when the
// string is written without escapes on one line, else at the string itself.
//
// Includes: `include` (a string or an array of strings) names files loaded
// before this one. Their [graph] keys, nodes and node keys are merged under
// this file's: for every key both define, the including file wins (and a
// later include wins over an earlier one). Their edges come first, then this
// file's. A file reached twice (a diamond) is loaded once; a file that
// includes itself, directly or not, is an error (include cycle).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/graph/graph_spec.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::graph {

/// What the reader produced: the spec (possibly partial) and every error.
struct parse_result {
  graph_spec spec;
  std::vector<graph_error> errors;
  /// True when a file could not be read, was not valid TOML, or an include
  /// was missing or cyclic: the spec then lacks whole files and validating
  /// it would only report the consequences.
  bool fatal = false;

  bool ok() const { return errors.empty(); }
};

/// Reads the `.graph` file at `file` with its includes. Errors: the file or
/// an include cannot be opened, TOML syntax errors (with toml++'s position;
/// a [node.NAME] table given twice is reported as a duplicate node name),
/// include cycles, unknown top-level or [graph] keys (with the nearest valid
/// name), values of the wrong TOML type (kind, replicas, on, name, seed,
/// steps, setting values that are tables, dates or arrays of non-strings),
/// node names that are not identifiers, and malformed edge strings.
parse_result parse_graph_file(const std::filesystem::path& file);

/// Like parse_graph_file, for text already in memory. `source_name` names
/// the text in errors and its directory is where includes are looked up.
parse_result parse_graph_string(std::string_view text, const std::filesystem::path& source_name = "<string>");

/// The edges of one edge string and the errors in it.
struct edge_parse_result {
  std::vector<edge_spec> edges;  ///< one per target; empty if the endpoints are malformed
  std::vector<graph_error> errors;
};

/// Parses one edge string (syntax above). `pos` is where the string starts
/// (its opening quote); when `exact_columns` is true, character i of `text`
/// is at column pos.col + 1 + i and errors point there, otherwise at `pos`.
/// An edge whose options are wrong is still returned (with default options).
edge_parse_result parse_edge(std::string_view text, const source_pos& pos = {}, bool exact_columns = false);

/// The value of a `--set PATH=VALUE` override's VALUE text: read as a TOML value (int, float, bool,
/// "string" or an array of strings) when it is one, else the text as a bare string (`x` and `"x"` are
/// the same value). apply_override takes values through it.
setting_value override_value(std::string_view raw);

/// Applies one `--set` override, `PATH=VALUE`, to `spec`. PATH is
/// `graph.name|seed|steps`, `node.NAME.replicas|on|kind` or
/// `node.NAME.SETTING`; VALUE is read as a TOML value (int, float, bool,
/// "string" or an array of strings) and, if it is not valid TOML or the
/// setting holds a string, taken as a bare string. A setting must already be
/// written in the node or, when `kinds` is given and knows the node's kind,
/// be declared by the kind. Returns an error (at file `--set PATH=VALUE`,
/// line 1, column of the offending part) if the text has no `=`, the value is
/// not UTF-8, the path does not exist (with the nearest name as hint), or a
/// graph/replicas value has the wrong type. The new value remembers that position, so type errors
/// the validator finds point at the override. `stored` (when given) gets the value as applied (a
/// string setting's text kept as written).
std::optional<graph_error> apply_override(graph_spec& spec, std::string_view assignment,
                                          const node_kind_registry* kinds = nullptr, setting_value* stored = nullptr);

/// What parse_cluster_file read: the cluster and every error.
struct cluster_parse_result {
  cluster_spec cluster;
  std::vector<graph_error> errors;
  bool ok() const { return errors.empty(); }
};

/// Reads a cluster file (`flowrun run --cluster FILE`): TOML holding one
/// `[cluster]` table with its `[cluster.nodes.NAME]` tables, the same syntax
/// as a graph's [cluster] (graph_spec.h). Errors (FILE:LINE:COL): the file
/// cannot be read, TOML syntax, unknown keys (with the nearest name), an
/// address that is not HOST:PORT, a non-integer or negative cpus/gpus, a
/// heartbeat or timeout < 1 ms, on_node_lost other than "stop", a missing
/// [cluster] table.
cluster_parse_result parse_cluster_file(const std::filesystem::path& file);

/// Checks every node's placement against spec.cluster: `on` (or each entry
/// of on = [...]) must be "main", "any" (placed by resources:
/// assign_placement) or a cluster node, and on = [...] must have
/// one entry per replica. Errors point at the `on` value. A graph without a
/// cluster has no placement errors (`on` is not interpreted then).
std::vector<graph_error> check_placement(const graph_spec& spec);

/// Placement by resources: gives every replica placed `on = "any"` (the
/// node's `on`, or an entry of on = [...]) a cluster node, and writes the
/// result into the node's on_replicas (one name per replica), so that
/// placement_of, to_toml and the daemons see explicit names. Deterministic:
/// replicas are taken in graph order (nodes in file order, then replica
/// index); each goes to the cluster node with the most cpus left after it
/// among those with enough free cpus and gpus, ties to the node declared
/// first. Capacity is the cpus/gpus of [cluster.nodes.NAME]; only replicas
/// placed by resources use it up, and main is never chosen. Errors
/// (FILE:LINE:COL at the `resources` value, else the `on` value): a replica
/// that fits nowhere, naming the node, the replica, its needs and every
/// cluster node's free and declared capacity. A graph without a cluster is
/// left as it is (`on` is not interpreted then). Call it after
/// check_placement.
std::vector<graph_error> assign_placement(graph_spec& spec);

/// The cluster node replica `replica` of `n` runs on: its on = [...] entry,
/// else `on`, else "main" (the flowrun run process).
std::string placement_of(const node_spec& n, std::int64_t replica);

/// Serialises a spec back to `.graph` TOML (no includes: everything inline).
/// Settings filled in from their kind's default (setting::from_default) are left out: validating
/// the result fills them in again. Reading and validating the result gives an equal spec, positions
/// aside.
std::string to_toml(const graph_spec& spec);

}  // namespace flowrun::graph
