// Layer 5, actor runtime: the coordinator's side of a cluster run (cluster.h).
// For run_graph (runtime.cpp) and tests; node code never includes it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>

#include "runtime/actor/cluster.h"
#include "runtime/actor/expected.h"
#include "runtime/actor/job.h"

namespace flowrun::actor {

/// Whether a flowrun node daemon answers at host:port within `timeout`: the connection, CAF's handshake
/// and the first step of the cluster handshake (hello: the daemon's nonce). A TCP connect alone is not
/// enough: a frozen daemon (SIGSTOP) still accepts connections, and the next attempt of a restarted run
/// would wait connect_timeout_ms for it and spend a restart. `tls`: through caf_openssl's manager.
bool daemon_answers(caf::actor_system& sys, const std::string& host, int port, bool tls,
                    std::chrono::milliseconds timeout);

/// A job spread over the cluster nodes of spec.cluster. Needs an actor
/// system with the middleman loaded.
class cluster_run {
 public:
  /// Connects to every cluster node the placement uses, authenticates both
  /// ways with options.cluster.secret, spawns each node's replicas there and
  /// this process's here, wires them all and starts the job's coordinator.
  /// Errors (every replica spawned so far is stopped again): a node cannot be
  /// reached ("is `flowrun node --listen HOST:PORT` running there?"), the
  /// secret differs (named as such, on both sides), a node refuses the graph
  /// (its validation errors), an edge that crosses nodes carries a type that
  /// cannot cross (spawn_part). When the error is one cluster node's (it
  /// cannot be reached, fails the handshake, refuses or fails to start its
  /// part), its name goes to *failed_node (if given).
  static expected<std::unique_ptr<cluster_run>> start(caf::actor_system& sys, const graph::graph_spec& spec,
                                                      const graph::node_kind_registry& kinds,
                                                      const node_factory_registry& factories,
                                                      const run_options& options, std::string* failed_node = nullptr);
  ~cluster_run();
  cluster_run(const cluster_run&) = delete;
  cluster_run& operator=(const cluster_run&) = delete;

  /// The running job (its coordinator, state, metrics and live view).
  job& the_job();

  /// One line: every node, where it listens, its actors and the age of its
  /// last heartbeat in ms (or "lost").
  std::string status() const;

  /// Every process of the run (main first, then the cluster's nodes in file
  /// order) with its address, capacity, TLS, state (connected, lost, unused),
  /// the age of its last heartbeat reply in integer ms and its replicas: what
  /// the console serves as GET /api/cluster. Thread-safe.
  cluster_view view() const;

  /// Shows the cluster in the live view (and so in the console): every
  /// replica on another node gets the phase "on NODE (ADDRESS), heartbeat N
  /// ms ago", and replicas of a lost node turn failed with "lost with cluster
  /// node 'NODE'". Call it periodically (run_graph does, with each console
  /// sample). Thread-safe against the job's actors.
  void publish_live();

  /// Copies the counters that the nodes sent with their latest heartbeat
  /// replies into this process's metrics, for the replicas that run there
  /// (so the console, the progress line and the summary count their work).
  /// Call it periodically (run_graph does, every 50 ms). Thread-safe.
  void sync_metrics();

  /// After the job finished: tells every node that is still there, collects
  /// what each sent across processes and its replicas' final counters
  /// (mirrored into this process's metrics), and returns a report (one line per
  /// process and a total: data messages, payload bytes, control messages,
  /// heartbeats).
  std::string end();

  struct impl;

 private:
  explicit cluster_run(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

}  // namespace flowrun::actor
