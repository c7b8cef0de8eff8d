// Layer 5, actor runtime: a graph over several machines (docs/scaling.md).
//
//   node daemon   `flowrun node --listen HOST:PORT`: run_node_daemon below.
//                 It publishes one actor, the gate, with CAF's middleman. The
//                 gate answers only the challenge-response of cluster_auth.h;
//                 a peer that passes gets a session actor of its own, and only
//                 a session takes work: it spawns the replicas that the
//                 coordinator places on this node, wires them, answers
//                 heartbeats and, when the coordinator goes silent or its
//                 connection drops, stops them (their stop() runs).
//   coordinator   the `flowrun run` process ("main"), cluster_run.h: it
//                 connects to the daemons that the graph's [cluster] and `on`
//                 placements use, ships the validated graph as TOML text (no
//                 floats in messages), spawns its own replicas and runs the
//                 job's coordinator over all of them, and watches the nodes
//                 with heartbeats (integer milliseconds).
//
// What crosses processes: control messages (integers and strings) and
// payloads as raw bytes (payload_codec.h); the tensors of payloads that hold
// them go through the bulk plane (bulk_plane.h: a gloo group of the run's
// processes), never inside a CAF message. A graph whose cross-process edge
// carries a type without a codec is refused before anything connects.
// A lost node stops the run, or restarts it ([cluster] on_node_lost,
// run_graph in runtime.cpp).
//
// This header includes no CAF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/actor/node.h"
#include "runtime/graph/graph_spec.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actor {

/// How to run a node daemon.
struct node_daemon_options {
  std::string host = "127.0.0.1";  ///< the address to listen on
  int port = 0;                    ///< the TCP port; 0: a free one (printed, and written to port_file)
  std::string secret;              ///< the cluster's shared secret (load_cluster_secret)
  std::string port_file;           ///< if set, the port is written here once listening
  bool once = false;               ///< exit after the first job ends (tests)
  std::size_t threads = 0;         ///< CAF worker threads; 0: one per core (at least 2)
  std::filesystem::path asset_root;  ///< where relative paths of graphs are looked up (validation)
  /// TLS through caf_openssl (all three or none; see cluster_options): the
  /// daemon's certificate and key (PEM) and the CA file that the coordinator's
  /// certificate must chain to. Empty: plain TCP.
  std::string tls_cert, tls_key, tls_ca;
};

/// Runs a node daemon until SIGINT/SIGTERM (or, with `once`, the end of its
/// first job). Prints "flowrun node: listening on HOST:PORT" on standard
/// output once the gate is published. Returns 0, or 1 after logging why
/// (the port cannot be bound, the secret is empty; with `once`, its job's
/// part was aborted: the coordinator's connection dropped).
int run_node_daemon(const node_daemon_options& options, const graph::node_kind_registry& kinds,
                    const node_factory_registry& factories);

/// One process of a run as the console shows it (GET /api/cluster).
struct cluster_node_view {
  std::string name;     ///< "main" or the [cluster.nodes.NAME] name
  std::string address;  ///< HOST:PORT of its daemon ("" for main)
  std::int64_t cpus = 0, gpus = 0;  ///< as declared in [cluster.nodes.NAME] (main: this machine's cores, 0 GPUs)
  bool tls = false;                 ///< its connection is TLS (caf_openssl)
  /// "local" (main), "connecting" (replicas placed there, not yet
  /// authenticated), "connected", "lost", or "unused" (declared, but no
  /// replica is placed there).
  std::string state = "local";
  std::int64_t heartbeat_age_ms = -1;  ///< ms since its last heartbeat reply; -1: none yet (or main, unused)
  std::string lost_reason;             ///< why it was lost ("" unless state is "lost")
  std::vector<std::string> replicas;   ///< "tokenizer", "gen[1]": the replicas placed there, in graph order
};

/// Every process of a run: main first, then the cluster's nodes in file order.
struct cluster_view {
  bool clustered = false;  ///< false: one process (only main)
  std::int64_t heartbeat_ms = 0, lost_after_ms = 0;
  std::vector<cluster_node_view> nodes;
};

/// The view of `spec` before (or without) any connection: main with the
/// replicas placed on it (every replica when the spec needs no cluster), and
/// each cluster node "unused" or, when replicas are placed there,
/// "connecting". `tls`: the run connects with TLS.
cluster_view planned_cluster_view(const graph::graph_spec& spec, bool tls);

/// True when `spec` places some replica on a cluster node other than "main"
/// (so running it needs the daemons).
bool needs_cluster(const graph::graph_spec& spec);

}  // namespace flowrun::actor
