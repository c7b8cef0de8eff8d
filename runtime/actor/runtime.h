// Layer 5, actor runtime: running a validated graph (no CAF in this header).
//
//   graph::validation_result v = graph::load_graph(file, kinds, {...}, overrides);
//   run_result r = run_graph(v.spec, kinds, factories, options);
//   return r.exit_code;
//
// run_graph starts a CAF actor system, spawns one actor per node replica
// (runtime/actor/job.h), waits for the run to end, forwards SIGINT/SIGTERM,
// logs metrics every `metrics_interval_s`, writes them as JSONL and shows a
// progress line on a terminal. See docs/runtime.md for the design.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "runtime/comm/store.h"
#include "runtime/actor/metrics.h"
#include "runtime/actor/node.h"
#include "runtime/graph/graph_spec.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actor {

/// Exit codes of a run.
inline constexpr int exit_ok = 0;
inline constexpr int exit_failed = 1;
inline constexpr int exit_sigint = 130;   ///< 128 + SIGINT
inline constexpr int exit_sigterm = 143;  ///< 128 + SIGTERM

/// The live console (docs/console.md): an HTTP API, an event stream and a web
/// page on `bind`:`port` while the run lasts.
struct console_options {
  bool enabled = false;            ///< off unless asked (flowrun: --console PORT or the graph's console_port)
  int port = 0;                    ///< TCP port; 0: a free port chosen by the system (printed at start)
  std::string bind = "127.0.0.1";  ///< a non-loopback address makes every request need the token
  std::string token;               ///< empty: a random token (printed at start)
  std::string token_file;          ///< if set, the token is written here (mode 0600) at start
  double interval_s = 0.5;         ///< seconds between samples (rates, the event stream)
  double linger_s = 0;             ///< keep serving the final state this long after the run ended
  /// Called once the server listens and the job is launched (its controls
  /// work), with the page's URL ("http://127.0.0.1:PORT/") and the token.
  /// Default: log both on stderr.
  std::function<void(const std::string& url, const std::string& token)> on_ready;
};

/// A run spread over the machines of the graph's [cluster] (docs/scaling.md).
/// Used only when spec.cluster places a replica off the `flowrun run`
/// process ("main").
struct cluster_options {
  /// The cluster's shared secret (load_cluster_secret, cluster_auth.h).
  std::string secret;
  // How long to wait for a node daemon while connecting: [cluster]
  // connect_timeout_ms (graph_spec.h).
  /// TLS through caf_openssl (all three or none): this process's certificate
  /// and key (PEM files) and the CA file that peers' certificates must chain
  /// to. Set: every connection to a node daemon is TLS with mutual
  /// certificate checks, under the secret's handshake. Empty: plain TCP.
  std::string tls_cert, tls_key, tls_ca;
};

/// How to run a graph.
struct run_options {
  /// Credit (messages in flight per link) of edges that give none (credit=0).
  std::int64_t default_credit = 8;
  /// The policy of nodes whose kind declares no `restart` setting.
  restart_policy default_restart{};
  /// CAF worker threads; 0: one per hardware thread (at least 2).
  std::size_t threads = 0;
  /// JSONL metrics file; empty: none.
  std::string metrics_path;
  /// Seconds between metric log lines and JSONL records (<= 0: only at the end).
  double metrics_interval_s = 10.0;
  /// Show the progress line on standard error: nullopt: when it is a terminal.
  std::optional<bool> progress;
  /// Log a per-node metrics summary at the end.
  bool summary = true;
  /// The live console (off by default).
  console_options console;
  /// Cluster runs: the secret and timeouts.
  cluster_options cluster;
  /// Shared by every attempt of a run (node_context::run_id); empty: run_graph makes one.
  std::string run_id;
  /// Which attempt of the run (node_context::attempt): set by run_graph when it restarts.
  std::int64_t attempt = 0;
  /// node_context::rendezvous_store: set by cluster runs (the store lives on main).
  std::shared_ptr<comm::store> rendezvous_store;
};

/// How a run ended.
struct run_result {
  int exit_code = exit_ok;  ///< exit_ok, exit_failed, exit_sigint or exit_sigterm
  /// Empty on success; else what went wrong, naming the node and the reason
  /// (e.g. "node 'gen' replica 0 failed in on_message: out of memory (no restarts left: 3/3)").
  std::string error;
  stop_reason reason = stop_reason::completed;
  metrics_snapshot metrics;  ///< the final counters
};

/// The outcome of a job as it becomes known, shared by the coordinator actor
/// (which writes it once) and whoever waits for it (thread-safe).
class run_state {
 public:
  /// Records the end of the run (first call wins) and wakes the waiters.
  void finish(int exit_code, std::string error, stop_reason reason);
  /// True once finish() was called.
  bool finished() const;
  /// Waits up to `ms` milliseconds for the end; returns finished().
  bool wait_for_ms(int ms) const;
  /// The exit code (exit_ok until finished).
  int exit_code() const;
  /// The error message ("" on success or until finished).
  std::string error() const;
  /// Why the run ended (stop_reason::completed until finished).
  stop_reason reason() const;
  /// Cluster runs: the coordinator counted process `process` (a cluster node) lost. The end of the
  /// run asks no final counters of it (cluster_run::end: it waited 5 s for a node that was gone).
  void mark_lost(std::uint32_t process);
  /// Whether mark_lost(process) was called.
  bool lost(std::uint32_t process) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::set<std::uint32_t> lost_;
  bool finished_ = false;
  int exit_code_ = exit_ok;
  std::string error_;
  stop_reason reason_ = stop_reason::completed;
};

/// What stopped an attempt that restarts (on_node_lost = "restart"), for its "attempt N stopped"
/// line: each cluster node in `lost` with the actors `spec` places on it (the restart's cause), then
/// `first_error`, the run's first error, where that is another ("... lost; its actors: a, b (the
/// run's first error: ...)"); `first_error` itself where it is the loss of the one lost node. A
/// transfer from the lost node can fail, and stop the attempt, before the coordinator sees the node
/// lost: cluster_rlhf_small saw a node's "tensors ... did not arrive" as the run's error under
/// `ctest -j4`, and the line then did not name the lost node.
std::string attempt_stop_reason(const graph::graph_spec& spec, const std::vector<std::string>& lost,
                                const std::string& first_error);

/// Runs `spec` (validated against `kinds`, so settings and ports are filled
/// in) to its end. With options.console.enabled the console's server starts
/// first; if it cannot (e.g. the port is in use) nothing runs and the result
/// is exit_failed with an error naming the port and the fix. Every node's kind needs a factory in `factories`. Returns
/// exit_failed with an error, without starting anything, if a kind has no
/// factory or a node's restart settings are invalid. SIGINT and SIGTERM are
/// caught while it runs (the previous handlers are restored afterwards): the
/// first drains the pipeline and stops every node, a second stops at once.
run_result run_graph(const graph::graph_spec& spec, const graph::node_kind_registry& kinds,
                     const node_factory_registry& factories, const run_options& options = {});

}  // namespace flowrun::actor
