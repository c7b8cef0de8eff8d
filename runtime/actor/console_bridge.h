// Layer 5, actor runtime: feeds the live console (runtime/console) from a run.
// No CAF here: run_graph (runtime.cpp) hands it the graph, the metrics and
// the live state (live.h), and the controls as plain functions.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/actor/cluster.h"
#include "runtime/actor/live.h"
#include "runtime/actor/metrics.h"
#include "runtime/actor/runtime.h"
#include "runtime/graph/graph_spec.h"

namespace flowrun::console {
class hub;
class server;
struct controls;
struct graph_info;
struct cluster_sample;
}  // namespace flowrun::console

namespace flowrun::actor {

/// The graph as the console shows it: nodes with their settings (TOML
/// spelling), source/terminal flags, edges with dispatch, credit (edges
/// without one get `default_credit`) and transport.
flowrun::console::graph_info describe_graph(const graph::graph_spec& spec, std::int64_t default_credit);

/// The console of one run: the hub, the HTTP server and what feeds them.
class console_session {
 public:
  /// Starts the server (before the job is launched). Throws
  /// flowrun::console::console_error when it cannot listen (names the port and the fix).
  console_session(const graph::graph_spec& spec, const console_options& options, std::int64_t default_credit);
  ~console_session();
  console_session(const console_session&) = delete;
  console_session& operator=(const console_session&) = delete;

  /// What the POST endpoints do, once the job runs.
  void set_controls(flowrun::console::controls c);
  /// Tells the user where the console is (console_options::on_ready, else a
  /// log line with the URL and the token). Called once the controls are set,
  /// so that whoever reads the address finds every endpoint working.
  void announce();
  /// Where the replicas run, for GET /api/cluster and the page's Cluster
  /// panel: goes out with every following sample. Until it is called, the
  /// console shows planned_cluster_view(spec) (without a cluster: main with
  /// every replica).
  void set_cluster(const cluster_view& view);
  /// Publishes one sample: the counters, every replica's state, and the
  /// events and signals recorded since the previous sample.
  void sample(const metrics_snapshot& m, const job_live& live);
  /// The run starts again (on_node_lost = "restart"): the next samples come
  /// from a new job, whose events and signals count from the start; the
  /// console's numbers go on after the earlier attempts' (they started again
  /// at 1, and a client asking for events since the last number it saw got none).
  void new_attempt() {
    event_base_ += event_seq_;
    signal_base_ += signal_seq_;
    event_seq_ = signal_seq_ = 0;
  }
  /// The final sample (run_state "finished", the exit code and error).
  void finish(const metrics_snapshot& m, const job_live& live, int exit_code, const std::string& error);
  /// Stops serving, after options.linger_s or as soon as `stop_waiting` (polled every 100 ms) says so:
  /// a Ctrl-C during the linger ends it (it slept the whole linger through).
  void close(const std::function<bool()>& stop_waiting = {});

  std::string url() const;
  const std::string& token() const;
  int port() const;

 private:
  void publish(const metrics_snapshot& m, const job_live& live, bool finished, int exit_code, const std::string& error);

  console_options options_;
  std::shared_ptr<flowrun::console::hub> hub_;
  std::unique_ptr<flowrun::console::server> server_;
  std::unique_ptr<flowrun::console::cluster_sample> cluster_;
  std::uint64_t event_seq_ = 0, signal_seq_ = 0;    ///< the job's numbers taken so far (this attempt)
  std::uint64_t event_base_ = 0, signal_base_ = 0;  ///< the earlier attempts' counts, added to the job's numbers
  bool closed_ = false;
};

}  // namespace flowrun::actor
