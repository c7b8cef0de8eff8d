// Layer 4, graph description: the data model of a `.graph` file.
//
// A graph_spec is what parse.h reads from a TOML `.graph` file (with its
// includes and `--set` overrides applied) and what validate.h checks against
// the registry of node kinds (node_kind.h). It knows nothing of kernels, CAF
// or the actors that will run the nodes: it only names them, their settings
// and the edges between their ports, each with the place in the source file
// it came from so that every error can point at it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/util/host_port.h"
#include "runtime/util/nearest.h"

namespace flowrun::graph {

/// A place in a source file: 1-based line and column (in characters, as
/// toml++ counts them). line == 0 means "no position known" (e.g. a value
/// that came from a kind's default, or a spec built in code).
struct source_pos {
  std::string file;
  int line = 0;
  int col = 0;

  /// True when the position names a real place (line > 0).
  bool known() const { return line > 0; }
  /// True when the value was given on the command line (`--set`; apply_override
  /// names such positions "--set ASSIGNMENT"), not written in a file.
  bool from_command_line() const { return file.rfind("--set ", 0) == 0; }
  /// The same place shifted `n` columns to the right (for spots inside a string).
  source_pos shifted(int n) const { return {file, line, col + n}; }
  bool operator==(const source_pos&) const = default;
};

/// One problem found while reading or validating a graph. Errors are values:
/// the reader and the validator return every one they find.
struct graph_error {
  std::string file;
  int line = 0;
  int col = 0;
  std::string message;
  std::string hint;

  /// Builds an error at `pos`.
  static graph_error at(const source_pos& pos, std::string message, std::string hint);

  /// `FILE:LINE:COL: error: MESSAGE` followed, when there is a hint, by
  /// `\n  hint: HINT`. No trailing newline.
  std::string to_string() const;
};

/// All errors, one to_string() each, separated and ended by newlines.
std::string format_errors(const std::vector<graph_error>& errors);

/// Sorts errors by file, then line, then column (stable: errors at the same
/// place keep their order).
void sort_errors(std::vector<graph_error>& errors);

/// The value of one setting: TOML integer, float, bool, string (also used for
/// settings of type path) or array of strings. monostate means "no value"
/// (used for the default of a required setting).
using setting_value = std::variant<std::monostate, std::int64_t, double, bool, std::string, std::vector<std::string>>;

/// The TOML-like spelling of a value: 64, 0.5, true, "text", ["a", "b"]; "(none)" for monostate.
std::string to_string(const setting_value& v);

/// The name of the type a value holds: "int", "float", "bool", "string", "string_list", "none".
std::string_view value_type_name(const setting_value& v);

/// One setting of a node as written in the file (or filled in by the validator).
struct setting {
  setting_value value;
  source_pos key_pos;         ///< where the key was written (unknown for defaults)
  source_pos value_pos;       ///< where the value was written (unknown for defaults)
  bool from_default = false;  ///< filled in by the validator from the kind's default
};

/// What each replica of a node needs from a cluster node when it is placed
/// by resources (`on = "any"`): `resources = { cpus = N, gpus = M }`.
struct resource_needs {
  std::int64_t cpus = 1;  ///< CPU cores per replica (default 1)
  std::int64_t gpus = 0;  ///< GPUs per replica (default 0)
};

/// The placement that lets the planner choose a cluster node by resources
/// (assign_placement, parse.h).
inline constexpr std::string_view any_process_name = "any";

/// One `[node.NAME]` table. `kind`, `replicas`, `on`, `threads` and `resources`
/// are reserved keys; every other key is a setting of the node's kind.
struct node_spec {
  std::string name;
  std::string kind;
  std::int64_t replicas = 1;
  /// Placement: the name of a node of the graph's [cluster] ("main": the
  /// `flowrun run` process); empty: the `flowrun run` process. Without a
  /// [cluster] it is not interpreted. An array `on = ["a", "b"]` places each
  /// replica (on_replicas) and sets `on` to the names joined by ",".
  std::string on;
  /// Per-replica placement (on = [...]); empty: every replica goes to `on`.
  std::vector<std::string> on_replicas;
  /// What each replica needs where it is placed by resources (on = "any").
  resource_needs resources;
  /// The most threads each replica's ops run on (the OpenMP team of its kernels);
  /// 0: not set (every hardware thread of the machine it runs on, or what the node
  /// asks for: node_context::thread_budget). Generator and trainers on separate
  /// cores of one machine: threads = 1 on each.
  std::int64_t threads = 0;
  std::map<std::string, setting, std::less<>> settings;

  source_pos pos;           ///< the table header ([node.NAME])
  source_pos kind_pos;      ///< the `kind` value (unknown if missing)
  source_pos replicas_pos;  ///< the `replicas` value (unknown if not written)
  source_pos on_pos;        ///< the `on` value (unknown if not written)
  source_pos resources_pos; ///< the `resources` value (unknown if not written)
  source_pos threads_pos;   ///< the `threads` value (unknown if not written)

  /// The setting called `name`, or nullptr.
  const setting* find_setting(std::string_view name) const;

  /// Typed access for the runtime, after validation has filled in defaults.
  /// They throw std::out_of_range if the setting is absent and
  /// std::bad_variant_access if it holds another type (programmer errors:
  /// a validated spec has every declared setting with its declared type).
  /// get_float also accepts an integer value.
  std::int64_t get_int(std::string_view name) const;
  double get_float(std::string_view name) const;
  bool get_bool(std::string_view name) const;
  const std::string& get_string(std::string_view name) const;  ///< also for path settings
  const std::vector<std::string>& get_string_list(std::string_view name) const;
};

/// How a message on an edge with several consumers of one output port is
/// delivered. broadcast: every consumer gets every message; split: a batch is
/// cut into equal parts, one per consumer; round_robin: whole messages go to
/// the consumers in turn.
enum class dispatch_mode { broadcast, split, round_robin };

/// "broadcast", "split" or "round_robin".
std::string_view to_string(dispatch_mode d);
/// Parses the spelling above; nullopt for anything else.
std::optional<dispatch_mode> parse_dispatch(std::string_view s);

/// One edge `from_node.from_port -> to_node.to_port`. An edge string with
/// several targets ("a.out -> b, c") yields one edge_spec per target.
struct edge_spec {
  std::string from_node;
  std::string from_port;  ///< empty: the node's only output port (resolved by the validator)
  std::string to_node;
  std::string to_port;      ///< empty: the input port whose message type matches (resolved by the validator)
  std::int64_t credit = 0;  ///< messages in flight on the edge; 0: the runtime's default
  dispatch_mode dispatch = dispatch_mode::broadcast;
  bool feedback = false;  ///< marks the edge as the one that closes a cycle (see validate.h)

  source_pos pos;       ///< the edge string in the file
  source_pos from_pos;  ///< the source endpoint inside the string (or the string's position)
  source_pos to_pos;    ///< the target endpoint inside the string (or the string's position)

  /// "from_node.from_port -> to_node.to_port" (ports omitted when empty).
  std::string to_string() const;
};

/// One machine of a `[cluster.nodes.NAME]` table: where its `flowrun node`
/// daemon listens and what it offers.
struct cluster_node_spec {
  std::string name;        ///< [A-Za-z0-9_-]+, not "main" (the `flowrun run` process)
  std::string host;        ///< the daemon's address (name or IP)
  int port = 0;            ///< the daemon's TCP port, 1..65535
  std::int64_t cpus = 0;   ///< CPU cores offered to replicas placed by resources (on = "any")
  std::int64_t gpus = 0;   ///< GPUs offered to replicas placed by resources
  source_pos pos;          ///< the table header
  source_pos address_pos;  ///< the address value

  /// HOST:PORT as `flowrun node --listen` takes it: an IPv6 host in brackets ("[::1]:7001").
  std::string host_port() const { return util::join_host_port(host, port); }
};

/// The `[cluster]` table (or a `--cluster FILE`): the machines a graph runs
/// on besides the `flowrun run` process ("main"), and how they are watched.
///
///   [cluster]
///   heartbeat_ms = 500         # between heartbeats (integer milliseconds)
///   lost_after_ms = 3000       # silence before a node can be lost (φ accrual detector, liveness.h; >= 2 x heartbeat_ms)
///   connect_timeout_ms = 10000 # connecting to a node and its handshake, each
///   on_node_lost = "stop"      # or "restart": start again from the checkpoints
///   max_restarts = 3           # restarts allowed per run (on_node_lost = "restart")
///   rejoin_wait_ms = 0         # before a restart, wait this long for a lost node to come back
///   main_address = "10.0.0.1"  # where the other nodes reach this process's bulk plane
///   [cluster.nodes.w1]
///   address = "127.0.0.1:7001"
///   cpus = 2
///   gpus = 0
struct cluster_spec {
  std::vector<cluster_node_spec> nodes;  ///< in file order
  std::int64_t heartbeat_ms = 500;
  std::int64_t lost_after_ms = 3000;
  std::int64_t connect_timeout_ms = 10000;
  /// "stop": a lost node stops the run (the other nodes' stop() runs, so what
  /// they checkpoint is intact). "restart": then the run starts again (a new
  /// attempt, node_context::attempt) from what was checkpointed, the lost
  /// node's replicas placed on main unless the node answers again.
  std::string on_node_lost = "stop";
  /// Restarts allowed per run under on_node_lost = "restart".
  std::int64_t max_restarts = 3;
  /// Before a restart, how long to wait for a lost node to answer again (its
  /// daemon restarted by a supervisor on the same address) before its actors
  /// move to main; 0: do not wait.
  std::int64_t rejoin_wait_ms = 0;
  /// The host (name, IPv4 address, or IPv6 address, stored without brackets) on
  /// which the `flowrun run` process listens for the bulk plane (the communicator
  /// that moves tensors between nodes) and its rendezvous store; the nodes must
  /// reach it there. The daemons listen on the host of their own `address`, in
  /// the same address family (gloo connects every process to every other: an
  /// IPv4 main and IPv6 nodes are refused at start, cluster.cpp).
  std::string main_address = "127.0.0.1";
  source_pos main_address_pos;  ///< the main_address value (unknown if absent)
  source_pos pos;  ///< the [cluster] table (unknown if absent)

  /// True when no node is declared (a single-process run).
  bool empty() const { return nodes.empty(); }
  /// The node called `name`, or nullptr.
  const cluster_node_spec* find(std::string_view name) const;
};

/// The name `on` uses for the `flowrun run` process itself.
inline constexpr std::string_view main_process_name = "main";

/// A whole graph: the `[graph]` table, the nodes in file order and the edges.
struct graph_spec {
  std::string name;
  std::uint64_t seed = 0;
  std::int64_t steps = 0;  ///< 0: run until the sources are exhausted
  /// The live console's port (`console_port` in [graph]; docs/console.md):
  /// -1 (not written): no console unless `flowrun run --console PORT`; 0: a free port.
  std::int64_t console_port = -1;
  /// The run's checkpoint folder (`checkpoint_dir` in [graph]); "" (not written): none. Nodes
  /// that checkpoint keep their state under it (node_context::checkpoint_dir; docs/rlhf.md's
  /// step-3 checkpoints) and resume from it when the same command runs again.
  std::string checkpoint_dir;
  std::vector<node_spec> nodes;
  std::vector<edge_spec> edges;
  /// The machines of the run ([cluster] or flowrun run --cluster FILE); empty: one process.
  cluster_spec cluster;
  /// The top-level file (parse_graph_string: its source name; "" for a spec
  /// built in code). Errors without a position name it; relative paths in
  /// settings without a file of their own are relative to its folder.
  std::filesystem::path source_file;
  std::vector<std::filesystem::path> included_files;  ///< every included file, in load order

  source_pos seed_pos;   ///< unknown if not written
  source_pos steps_pos;  ///< unknown if not written
  source_pos console_port_pos;  ///< unknown if not written
  source_pos checkpoint_dir_pos;  ///< unknown if not written

  /// Set by the reader when part of the input could not be understood (a
  /// malformed edge, say). The validator then skips the checks that would
  /// only repeat that error (unconnected required ports).
  bool incomplete = false;

  /// The node called `name`, or nullptr.
  const node_spec* find_node(std::string_view name) const;
  node_spec* find_node(std::string_view name);
};

/// FNV-1a's 64-bit offset basis: the hash of no bytes.
inline constexpr std::uint64_t fnv1a64_basis = 0xcbf29ce484222325ull;
/// 64-bit FNV-1a hash of the bytes of `s`, continuing from `h` (the hash of the bytes before them),
/// so that a stream hashed in pieces equals the whole hashed at once.
std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = fnv1a64_basis);

/// One step of the splitmix64 generator: a bijective mix of `x`.
std::uint64_t splitmix64(std::uint64_t x);

/// The deterministic seed of replica `replica` of node `node_name` in a graph
/// seeded with `graph_seed`: splitmix64(splitmix64(splitmix64(graph_seed) ^
/// fnv1a64(node_name)) ^ replica). Same inputs, same seed, on every machine.
std::uint64_t node_seed(std::uint64_t graph_seed, std::string_view node_name, std::uint64_t replica = 0);

/// "Did you mean": runtime/util/nearest.h's, for the graph layer's callers.
using flowrun::edit_distance;
using flowrun::nearest_name;

/// True for a valid node, port or setting name: [A-Za-z_][A-Za-z0-9_]*.
bool is_identifier(std::string_view s);

}  // namespace flowrun::graph
