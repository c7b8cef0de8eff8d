// Layer 5, actor runtime: metrics (CAF 0.17 has none of its own).
//
// Counters are relaxed atomics written by the one actor that owns them and
// read by whoever takes a snapshot (the run loop, a test), so counting costs
// no messages. Per node replica: messages and bytes in and out, handler busy
// time, time blocked waiting for credit, restarts, items produced, dropped
// messages and the node's own counters (node_context::metric). Per link (one
// producer replica to one consumer replica of an edge): messages and bytes
// sent, acknowledged and handled, the most messages ever in flight, and time
// blocked on it. A snapshot sums them per node and per edge; the mailbox
// depth of a node is messages sent to it minus messages it handled.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/actor/live.h"

namespace flowrun::actor {

/// Counters of one link (producer replica -> consumer replica of one edge).
struct link_counters {
  std::atomic<std::uint64_t> sent{0};     ///< messages sent (incl. gather markers)
  std::atomic<std::uint64_t> bytes{0};    ///< payload bytes sent
  std::atomic<std::uint64_t> acked{0};    ///< messages the consumer acknowledged
  std::atomic<std::uint64_t> handled{0};  ///< messages the consumer took off its queue
  std::atomic<std::uint64_t> blocked_ns{0};     ///< producer time waiting for credit on this link
  std::atomic<std::uint64_t> max_in_flight{0};  ///< the most unacknowledged messages seen
  /// When the oldest unacknowledged message was sent (ns since the job began); -1: none outstanding.
  std::atomic<std::int64_t> oldest_unacked_ns{-1};
  /// Cluster runs: one end of the link is in another process, which counts that
  /// side; such links add nothing to the consumer's depth. Set before the job starts.
  bool remote = false;
  /// The (node, replica) of its producer and its consumer (job_metrics::add_link): the process that
  /// runs the producer counts sent, bytes, acked, blocked_ns and max_in_flight, the consumer's counts
  /// handled (encode_replica_counters sends each to main).
  std::uint32_t from_node = 0, from_replica = 0, to_node = 0, to_replica = 0;
};

/// Counters of one node replica.
struct replica_counters {
  std::atomic<std::uint64_t> msgs_in{0}, bytes_in{0};    ///< data messages received
  std::atomic<std::uint64_t> msgs_out{0}, bytes_out{0};  ///< data messages sent (per link)
  std::atomic<std::uint64_t> handled{0};     ///< on_message calls completed
  std::atomic<std::uint64_t> produced{0};    ///< produce() calls that returned true
  std::atomic<std::uint64_t> busy_ns{0};     ///< time inside start/on_message/produce/finish/stop
  std::atomic<std::uint64_t> blocked_ns{0};  ///< time with work to do but no credit
  /// Time waiting for input: from the end of one call into the node to the start of the next,
  /// less the time blocked on credit between them (the time before the first call and after
  /// the last is not counted). busy + blocked + wait is the replica's time between its first
  /// call's start and its last call's end.
  std::atomic<std::uint64_t> wait_ns{0};
  std::atomic<std::uint64_t> restarts{0};
  std::atomic<std::uint64_t> dropped{0};     ///< emits on unconnected ports, messages after the end

  /// Adds `delta` to the node's own counter `name` (thread-safe).
  void add(std::string_view name, std::int64_t delta);
  /// A copy of the node's own counters (thread-safe).
  std::map<std::string, std::int64_t> counters() const;
  /// Sets the node's own counter `name` to `value` (thread-safe): main mirrors
  /// the counters of replicas that run on other cluster nodes.
  void set(std::string_view name, std::int64_t value);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::int64_t, std::less<>> custom_;
};

/// One replica's counters at one moment.
struct replica_stats {
  std::uint64_t msgs_in = 0, bytes_in = 0, msgs_out = 0, bytes_out = 0, handled = 0, produced = 0;
  double busy_s = 0, blocked_s = 0, wait_s = 0;  ///< wait_s: replica_counters::wait_ns in seconds
  std::uint64_t restarts = 0, dropped = 0;
  std::map<std::string, std::int64_t> counters;
};

/// Per-node totals at one moment (summed over replicas).
struct node_stats {
  std::string name;
  std::size_t replicas = 1;
  bool source = false;    ///< no non-feedback in edges: produce() is called
  bool terminal = false;  ///< no out edges (a sink of the graph)
  std::uint64_t msgs_in = 0, bytes_in = 0, msgs_out = 0, bytes_out = 0, handled = 0, produced = 0;
  std::int64_t depth = 0;  ///< approximate mailbox depth: messages sent to the node minus handled
  double busy_s = 0, blocked_s = 0, wait_s = 0;  ///< summed over replicas (wait_s: replica_counters::wait_ns)
  std::uint64_t restarts = 0, dropped = 0;
  std::map<std::string, std::int64_t> counters;
  std::vector<replica_stats> per_replica;  ///< the same counters, per replica
};

/// Per-edge totals at one moment (summed over the edge's links).
struct edge_stats {
  std::string name;  ///< "from.port -> to.port"
  std::int64_t credit = 0;  ///< per link
  std::uint64_t sent = 0, bytes = 0, acked = 0, handled = 0;
  std::int64_t in_flight = 0;           ///< sent - acked, now
  std::uint64_t max_in_flight = 0;      ///< the most on any one link, ever
  double blocked_s = 0;
  /// Age in seconds of the oldest message sent on the edge and not yet
  /// acknowledged (any link); 0 when nothing is outstanding.
  double oldest_unacked_s = 0;
};

/// Everything at one moment.
struct metrics_snapshot {
  double elapsed_s = 0;  ///< since the job was launched
  std::vector<node_stats> nodes;
  std::vector<edge_stats> edges;

  /// The node called `name`, or nullptr.
  const node_stats* node(std::string_view name) const;
  /// Progress steps: the largest "steps" counter of any node's replica if one
  /// counts steps (a node's replicas step together, so they are not summed),
  /// else the most messages handled by a terminal node (one with no out
  /// edges; summed over its replicas), else the items produced per replica by
  /// the busiest source.
  std::int64_t steps() const;
  /// Items produced by all sources together.
  std::int64_t produced() const;
  /// The sum of every node's "tokens" counter over its replicas: the tokens a node trained on or
  /// generated. A loader that cuts batches for other nodes counts them as "tokens_cut" (the nodes it
  /// feeds count the same tokens again), which this leaves out.
  std::int64_t tokens() const;
};

/// The counters of a whole job, laid out once at launch (stable addresses).
class job_metrics {
 public:
  /// Declares a node with `replicas` replicas; returns its index.
  std::size_t add_node(std::string name, std::size_t replicas, bool source, bool terminal = false);
  /// Declares an edge into node `to_node` with per-link `credit`; returns its index.
  std::size_t add_edge(std::string name, std::size_t to_node, std::int64_t credit);
  /// Declares one link of edge `edge`, from replica `from_replica` of node `from_node` to replica
  /// `to_replica` of the edge's node; returns its counters. Every process of a cluster run declares
  /// the same links in the same order (encode_replica_counters names them by position).
  link_counters& add_link(std::size_t edge, std::uint32_t from_node, std::uint32_t from_replica,
                          std::uint32_t to_replica);

  /// The counters of replica `replica` of node `node`.
  replica_counters& replica(std::size_t node, std::size_t replica);
  /// True when `node` has a replica `replica`.
  bool has_replica(std::size_t node, std::size_t replica) const {
    return node < nodes_.size() && replica < nodes_[node].replicas.size();
  }

  /// Sums every counter (thread-safe with respect to the actors counting).
  metrics_snapshot snapshot() const;

  /// When the job began (metrics_snapshot::elapsed_s counts from here).
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  friend std::vector<char> encode_replica_counters(job_metrics&,
                                                   const std::vector<std::pair<std::uint32_t, std::uint32_t>>&);
  friend bool apply_replica_counters(job_metrics&, const std::vector<char>&);
  struct node_entry {
    std::string name;
    bool source = false;
    bool terminal = false;
    std::vector<std::unique_ptr<replica_counters>> replicas;
  };
  struct edge_entry {
    std::string name;
    std::size_t to_node = 0;
    std::int64_t credit = 0;
    std::vector<std::unique_ptr<link_counters>> links;
  };
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::vector<node_entry> nodes_;
  std::vector<edge_entry> edges_;
};

/// Cluster runs: the counters of `ids` ((node, replica) pairs of `m`) as
/// bytes, integers only (busy, blocked and wait times in ns), for main to mirror:
/// each node sends its replicas' counters with every heartbeat reply and at
/// the end of the job (docs/scaling.md). Ids out of range are skipped. With them
/// the links these replicas count: the producer's side (sent, bytes, acked,
/// blocked, max in flight) of links from them, the consumer's (handled) of links
/// into them, so that main's edges count what nodes sent to each other.
std::vector<char> encode_replica_counters(job_metrics& m,
                                          const std::vector<std::pair<std::uint32_t, std::uint32_t>>& ids);
/// Stores what encode_replica_counters wrote into `m`'s counters of the same
/// replicas (absolute values; replicas out of range are skipped). Returns
/// false, changing nothing further, on truncated or implausible bytes.
bool apply_replica_counters(job_metrics& m, const std::vector<char>& bytes);

/// One JSON object (no newline) for a JSONL metrics file:
/// {"t":ELAPSED_S,"final":BOOL,"steps":N,"tokens":N,"nodes":{NAME:{...}},"edges":{NAME:{...}}}.
std::string to_json_line(const metrics_snapshot& s, bool final);

/// One JSON object (no newline) for a JSONL metrics file, a signal record
/// (node_context::signal), one per reported point:
/// {"signal":NAME,"node":NODE,"replica":R,"step":S,"value":V,"t":T_S}.
/// `step` is -1 for a value reported without one (held-out passes); a
/// non-finite value is written as "value":null with "nonfinite":"nan",
/// "inf" or "-inf" (JSON has no such numbers). Snapshot lines
/// (to_json_line above) have no "signal" key, signal records no "nodes" key,
/// so a reader tells them apart by either. `flowrun report` plots them.
std::string to_json_line(const live_signal& s);

/// A multi-line human summary (one line per node, then one per edge) for the log.
std::string format_summary(const metrics_snapshot& s);

/// The progress line: "[NAME] step S/TOTAL | in P | R tok/s | ETA M:SS | T s"
/// (S: metrics_snapshot::steps(); P: items the sources produced; TOTAL and
/// ETA only when total_steps > 0; tok/s from the "tokens" counters between
/// `prev` and `now`). When nodes report phases under way (`phases`:
/// job_live::progress_now()), they replace the step and its ETA:
/// "[NAME] step 1 sft 37/160 ETA 0:41 · step 2 rm 50/250 ETA 1:10 | in P | R tok/s | T s".
std::string format_progress(std::string_view graph_name, const metrics_snapshot& now, const metrics_snapshot& prev,
                            std::int64_t total_steps, const std::vector<live_progress>& phases = {});

}  // namespace flowrun::actor
