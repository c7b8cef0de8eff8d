// The live console (docs/console.md): what the HTTP server serves, as plain C++.
//
// The runtime feeds a `hub` (no CAF type crosses into this folder):
//
//   hub h(describe(spec));               // the graph as written
//   h.set_controls({pause, resume, ...}); // what POST /api/... does
//   every 0.5 s: h.publish(sample);       // cumulative counters + states + new events/signals
//   at the end:  h.publish(final); h.close();
//
// The hub turns successive samples into rates (messages and bytes per second
// per node and per edge, busy/idle/blocked milliseconds per second), keeps
// the training signals as time series and the event log, ranks bottlenecks,
// and renders each API document as JSON. server.h serves them over HTTP.
// Thread-safe: publish() from the run loop, reads from the server's threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flowrun::console {

// -- the graph as written ------------------------------------------------------------

/// One setting of a node, spelled as in TOML ("64", "0.5", "\"text\"").
struct setting_entry {
  std::string key;
  std::string value;
  bool from_default = false;  ///< filled in from the kind's default (not written in the file)
};

/// One node of the graph file (a replica group when replicas > 1).
struct node_info {
  std::string name;
  std::string kind;
  std::int64_t replicas = 1;
  bool source = false;    ///< no non-feedback input: the runtime calls produce()
  bool terminal = false;  ///< no output edge
  std::string on;         ///< placement as written ("" = anywhere)
  std::vector<setting_entry> settings;
};

/// One edge "from.port -> to.port".
struct edge_info {
  std::string name;  ///< "from.port -> to.port"
  std::string from, from_port, to, to_port;
  std::string dispatch = "broadcast";  ///< broadcast, split or round_robin (among the consumer's replicas)
  /// How messages travel: "in-process" (a payload handle between actors of
  /// one process; nothing is copied or serialized) or "cross-process" (a
  /// cluster run places some producer and consumer replica in different
  /// processes: those links serialize, tensors over the bulk plane).
  std::string transport = "in-process";
  std::int64_t credit = 0;  ///< messages in flight per link
  std::int64_t links = 1;   ///< producer replicas x consumer replicas (each link has its own credit)
  bool feedback = false;    ///< closes a cycle (e.g. PPO's tick back to the prompt loader)
};

struct graph_info {
  std::string name;
  std::string file;  ///< the .graph file ("" for a graph built in code)
  std::uint64_t seed = 0;
  std::int64_t steps = 0;
  std::vector<node_info> nodes;
  std::vector<edge_info> edges;
};

// -- where the page draws the graph ---------------------------------------------------

/// One node's box as the console page draws it (collapsed: replicas not expanded), in SVG pixels
/// from the graph's top-left corner.
struct node_box {
  std::string name;
  int column = 0;  ///< the node's layer: the longest path from a source, feedback edges left out
  int band = 0;    ///< the row of columns it is in (0 unless the columns wrap)
  double x = 0, y = 0, w = 0, h = 0;
};

/// The graph's drawing: a box per node (in graph_info::nodes order) and the drawing's size.
struct graph_layout {
  std::vector<node_box> boxes;
  double width = 0, height = 0;
};

/// The widest the graph may be drawn: the graph panel's inner width in a 1600-pixel-wide window
/// (console.css: 1600 - 2 x 14 page padding - 12 grid gap - 400 side column - 2 x 11 panel
/// padding and border - 18 for a scroll bar).
inline constexpr double layout_max_width = 1120;

/// Lays the graph out in columns, left to right: a node's column is the longest path to it from a
/// source, feedback edges left out (a cycle not closed by a feedback edge is broken at the node
/// first in graph order); within a column nodes are ordered by the mean row of their
/// predecessors. Columns are 200 px wide with 170 px between them (room for an edge's label);
/// when they do not fit `max_width` the gaps shrink to 70 px, then the boxes to 150 px, and past
/// that the columns wrap into bands, one below the other. Every box lies within
/// [0, max_width] x [0, height]; `width` <= max_width. The page draws these boxes (GET /api/graph,
/// "layout") and only moves boxes down when a replica group is expanded.
graph_layout layout_graph(const graph_info& g, double max_width = layout_max_width);

// -- one sample of the live state (cumulative counters) ----------------------------------

/// One replica. Counters are cumulative since the start; the hub derives rates.
struct replica_sample {
  std::string state = "initializing";  ///< see docs/console.md (live.h: replica_state)
  double state_for_s = 0;              ///< seconds in `state`
  std::string reason;                  ///< why it failed (state "failed")
  std::string phase;                   ///< last phase it reported
  std::uint64_t msgs_in = 0, bytes_in = 0, msgs_out = 0, bytes_out = 0, handled = 0, produced = 0;
  std::uint64_t restarts = 0, dropped = 0;
  double busy_s = 0, blocked_s = 0;                          ///< seconds inside node calls / waiting for credit
  double wait_s = 0;  ///< seconds waiting for input between calls (metrics.h: replica_counters::wait_ns)
  std::map<std::string, std::int64_t> counters;              ///< node_context::metric
  std::vector<std::pair<double, std::string>> errors;        ///< recent errors (t_s, text)
  std::vector<std::pair<std::string, std::int64_t>> memory;  ///< bytes by category (node_context::memory)
  bool checkpoint_capable = false;
};

struct node_sample {
  std::string name;
  std::int64_t depth = 0;  ///< mailbox depth: messages sent to the node and not yet taken off its queue
  std::vector<replica_sample> replicas;
};

struct edge_sample {
  std::string name;
  std::uint64_t sent = 0, bytes = 0, acked = 0, handled = 0;
  std::int64_t in_flight = 0;  ///< sent - acknowledged: the outstanding requests on the edge
  std::int64_t credit = 0;
  std::uint64_t max_in_flight = 0;
  double blocked_s = 0;         ///< producer time waiting for credit on this edge
  double oldest_unacked_s = 0;  ///< age of the oldest outstanding message (0: none)
};

struct event {
  std::uint64_t seq = 0;
  double t_s = 0;
  std::string kind, node;
  std::int64_t replica = -1;
  std::string text;
};

struct signal_point {
  std::uint64_t seq = 0;
  double t_s = 0;
  std::string node;
  std::int64_t replica = 0;
  std::string name;  ///< "phase" for a phase change (text holds it)
  double value = 0;
  std::string text;
};

/// One process of the run (GET /api/cluster): main, or a cluster node daemon.
struct cluster_node_sample {
  std::string name;     ///< "main" or the [cluster.nodes.NAME] name
  std::string address;  ///< HOST:PORT of the daemon ("" for main)
  std::int64_t cpus = 0, gpus = 0;
  bool tls = false;
  std::string state = "local";         ///< local (main), connecting, connected, lost, unused, closed (the run ended)
  std::int64_t heartbeat_age_ms = -1;  ///< integer ms since its last heartbeat reply; -1: none (JSON null)
  std::string lost_reason;
  std::vector<std::string> replicas;   ///< "tokenizer", "gen[1]"
};

/// The processes of the run: main first, then the cluster's nodes.
struct cluster_sample {
  bool clustered = false;
  std::int64_t heartbeat_ms = 0, lost_after_ms = 0;
  std::vector<cluster_node_sample> nodes;
};

/// One long phase under way (node_context::progress): `done` of `total` units of `what`.
struct progress_sample {
  std::string node, what;
  std::int64_t done = 0, total = 0;
  double eta_s = -1;  ///< seconds left at the phase's rate so far; -1: not known yet
};

struct sample {
  double t_s = 0;                     ///< seconds since the run began
  std::string run_state = "running";  ///< starting, running, paused, draining, stopping, finished
  std::string phase;                  ///< the phase a node reported last (PPO: generation, scoring, ...)
  bool finished = false;
  int exit_code = 0;
  std::string error;
  std::int64_t steps = 0;             ///< progress steps (metrics_snapshot::steps)
  std::int64_t tokens = 0;            ///< the job's tokens (metrics_snapshot::tokens): its tokens/s is their rate
  std::vector<progress_sample> progress;  ///< the phases under way, oldest first
  std::string progress_text;          ///< them as the progress line shows them ("step 1 sft 37/160 ETA 0:41")
  std::int64_t rss_bytes = 0;         ///< the process's resident memory
  std::vector<node_sample> nodes;     ///< in graph order
  std::vector<edge_sample> edges;     ///< in graph order
  std::vector<event> events;          ///< new since the previous sample
  std::vector<signal_point> signals;  ///< new since the previous sample
  cluster_sample cluster;             ///< where the replicas run (main only without a cluster)
};

/// What the POST endpoints do. Each returns a short human message (or throws
/// std::runtime_error to refuse). Empty: the endpoint answers 503.
struct controls {
  std::function<std::string()> pause, resume, stop, checkpoint;
};

/// The reply to an API request: HTTP status and JSON body.
struct reply {
  int status = 200;
  std::string body;
};

struct hub_options {
  double rate_window_s = 1.0;        ///< rates are averaged over at least this long
  std::size_t series_points = 2000;  ///< points kept per signal series (oldest dropped)
  std::size_t events_kept = 2000;
};

class hub {
 public:
  explicit hub(graph_info graph, hub_options options = {});

  /// Adds a sample (the run loop, every interval). Wakes stream readers.
  void publish(sample s);
  /// Sets what the POST endpoints do.
  void set_controls(controls c);
  /// No more samples: stream readers get an "end" event and finish.
  void close();
  bool closed() const;
  /// The run is over: closed, or its final sample (sample::finished) published. Streams end here, not
  /// after `--console-linger` (during the linger a new stream gets one frame, then "end").
  bool ended() const;

  // -- the documents (docs/console.md lists their fields) --

  std::string graph_json() const;
  std::string status_json() const;
  std::string nodes_json() const;
  /// nullopt when there is no node called `name`.
  std::optional<std::string> node_json(std::string_view name) const;
  std::string edges_json() const;
  std::string bottlenecks_json(std::size_t n) const;
  /// Signal series with points newer than `since_t` (seconds since start).
  std::string signals_json(double since_t) const;
  std::string memory_json() const;
  /// GET /api/cluster: `clustered`, `heartbeat_ms`, `lost_after_ms`,
  /// `main` (name, cpus, gpus, replicas) and `nodes` (name, address, cpus,
  /// gpus, tls, state, heartbeat_age_ms, lost_reason, replicas).
  std::string cluster_json() const;
  /// Events with seq > `since_seq`.
  std::string events_json(std::uint64_t since_seq) const;
  /// One stream frame: status, nodes, edges, bottlenecks, cluster, and the events
  /// with seq > *event_seq and signal points with seq > *signal_seq (both
  /// are advanced to the newest sent, so a reader gets each one once).
  std::string frame_json(std::uint64_t* event_seq, std::uint64_t* signal_seq) const;

  /// POST /api/pause|resume|stop|checkpoint.
  reply act(std::string_view what);

  /// The number of the latest sample (0 before the first).
  std::uint64_t frame() const;
  /// Waits until a sample newer than `after` arrives, the hub closes, or
  /// `timeout` passes; returns frame().
  std::uint64_t wait_frame(std::uint64_t after, std::chrono::milliseconds timeout) const;

 private:
  struct node_rates {
    double msgs_in = 0, bytes_in = 0, msgs_out = 0, bytes_out = 0, handled = 0, produced = 0, tokens = 0;
    double busy_ms = 0, blocked_ms = 0, idle_ms = 0;
  };
  struct derived {
    std::vector<node_rates> nodes;
    std::vector<std::vector<node_rates>> replicas;
    std::vector<std::pair<double, double>> edges;  // msgs/s, bytes/s
    std::vector<double> edge_blocked_ms;           // ms/s
    double tokens_per_s = 0, window_s = 0;
  };
  derived derive(const sample& now, const sample& then) const;
  // The documents' renderings (mutex_ held, except render_graph: the graph never changes).
  std::string render_graph() const;
  std::string render_signals(double since_t) const;
  std::string render_memory() const;
  std::string render_events(std::uint64_t since_seq) const;
  /// (mutex_ held) Document `key` as rendered since the state last changed (publish,
  /// set_controls, close clear the cache), else render() stored: a client polling faster
  /// than samples arrive costs a copy, not a render (bench/console_load.sh).
  template <class F>
  std::string cached(std::string key, F&& render) const {
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    if (cache_.size() >= 64) cache_.clear();  // keys with arguments (since=...) cannot grow it without bound
    return cache_.emplace(std::move(key), render()).first->second;
  }

  graph_info graph_;
  hub_options options_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::string, std::less<>> cache_;  // see cached()
  mutable std::condition_variable cv_;
  controls controls_;
  bool closed_ = false;
  std::uint64_t frame_ = 0;
  std::deque<sample> history_;  // the last few samples (rates)
  sample current_;
  derived rates_;
  std::map<std::pair<std::string, std::string>, std::deque<std::pair<double, double>>> series_;  // (node, name)
  std::deque<signal_point> phases_;
  std::deque<event> events_;
  std::deque<signal_point> recent_signals_;                       // for stream readers
  std::map<std::pair<std::string, std::string>, double> latest_;  // (node, name) -> last value

  friend struct hub_json;  // hub.cpp: renders the documents (with the lock held)
};

/// The state of a node from its replicas' states (the most telling one wins:
/// failed, restarting, busy, waiting_credit, waiting_request, paused,
/// initializing, remote, idle, done, stopped).
std::string node_state(const std::vector<replica_sample>& replicas);

/// Compares two strings in time that depends only on their lengths (tokens).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace flowrun::console
