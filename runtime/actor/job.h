// Layer 5, actor runtime: a graph's actors inside a given CAF actor system.
//
// This is the CAF-facing API, for run_graph (runtime.h), for tests on CAF's
// deterministic scheduler and for benchmarks. Node code never includes it.
//
//   caf::actor_system sys{cfg};
//   auto j = launch(sys, spec, kinds, factories, options);
//   if (!j) { report(j.error()); }
//   ... run the scheduler (or wait: j->state->wait_for_ms(...)) ...
//   j->state->finished(), j->state->exit_code(), j->metrics->snapshot()
//
// launch() spawns one actor per node replica and one coordinator, which
// wires the replicas together, starts them, supervises them and ends the run
// (see docs/runtime.md). All the actors quit by themselves when the run ends,
// so the actor system's destructor (which waits for every actor) returns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>

#include "runtime/actor/bulk_plane.h"
#include "runtime/actor/expected.h"
#include "runtime/actor/live.h"
#include "runtime/actor/metrics.h"
#include "runtime/actor/node.h"
#include "runtime/actor/runtime.h"
#include "runtime/graph/graph_spec.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actor {

/// Control message to a job's coordinator: `interrupt_atom, int32_t signal`
/// (SIGINT or SIGTERM). The first drains the pipeline (sources stop, every
/// message in flight is handled, every node's stop() runs); a second stops
/// every node at once. The exit code becomes 128 + signal.
using interrupt_atom = caf::atom_constant<caf::atom("fr_intr")>;

/// Control messages to a job's coordinator (the console's pause and resume):
/// a paused replica handles no queued message and a paused source produces
/// nothing, so credit runs out and the whole pipeline stands still; resume
/// continues where it stood. A signal or a stop while paused resumes first.
using pause_atom = caf::atom_constant<caf::atom("fr_pause")>;
using resume_atom = caf::atom_constant<caf::atom("fr_resume")>;

/// Control message to a job's coordinator (cluster runs): `node_lost_atom,
/// uint32_t process, std::string why`. Process `process` of the placement
/// is gone: its replicas count as stopped and the run stops with an error
/// naming the node and its actors (on_node_lost = "stop").
using node_lost_atom = caf::atom_constant<caf::atom("fr_lost")>;

/// Where each replica of a job runs, for a job spread over processes.
struct placement {
  /// The processes' names: [0] is "main" (the flowrun run process), then the cluster nodes.
  std::vector<std::string> processes;
  /// [node index in spec.nodes][replica] -> index into `processes`.
  std::vector<std::vector<std::uint32_t>> where;
  /// The index of this process in `processes`.
  std::uint32_t self = 0;
  /// The bulk plane (rank = process index) when some cross-process edge
  /// carries a payload with tensors (a bulk codec); null otherwise.
  std::shared_ptr<bulk_plane> bulk;
  /// [cluster] on_node_lost ("stop" or "restart"), for the lost-node message.
  std::string on_node_lost = "stop";
  /// max_restarts when on_node_lost = "restart" but none is left (this attempt's loss stops the run,
  /// and the message says why); -1 otherwise.
  std::int64_t restarts_used_up = -1;
};

/// Messages and bytes this process sent to actors in other processes, since
/// it started (cluster runs; all zero otherwise).
struct cross_process_counts {
  std::uint64_t data_msgs = 0;     ///< payloads sent as bytes (one per message on a link)
  std::uint64_t data_bytes = 0;    ///< the payloads' bytes (CAF's own framing not included)
  std::uint64_t control_msgs = 0;  ///< acks, end-of-stream, init/run/stop/done and the like
};

/// This process's counts so far (thread-safe).
cross_process_counts cross_process_totals();

/// A launched job.
struct job {
  caf::actor coordinator;                          ///< supervises the replicas
  std::vector<std::vector<caf::actor>> replicas;   ///< [node index in spec.nodes][replica]
  std::shared_ptr<run_state> state;                ///< the outcome, once finished
  std::shared_ptr<job_metrics> metrics;            ///< live counters
  std::shared_ptr<job_live> live;                  ///< replica states, events, signals (live.h)
};

/// Spawns the actors of `spec` (validated against `kinds`) in `sys`. Errors
/// (nothing is spawned then): a node whose kind is unknown to `kinds` or has
/// no factory in `factories`, an invalid restart setting, an edge naming an
/// unknown node or port. `kinds` and `factories` are copied as needed: they
/// need not outlive the call.
expected<job> launch(caf::actor_system& sys, const graph::graph_spec& spec, const graph::node_kind_registry& kinds,
                     const node_factory_registry& factories, const run_options& options = {});

/// The share of a job that one process of a cluster runs: its replicas, and
/// the plan that says where the others are.
struct job_part {
  std::shared_ptr<void> plan;                 ///< the job's plan (opaque)
  std::vector<caf::actor> local;              ///< this process's replicas, in (node, replica) order
  std::vector<std::pair<std::uint32_t, std::uint32_t>> local_ids;  ///< (node, replica) of each of `local`
  std::shared_ptr<run_state> state;
  std::shared_ptr<job_metrics> metrics;
  std::shared_ptr<job_live> live;
};

/// Plans `spec` like launch() and spawns only the replicas that `where`
/// places on process where.self. Errors (nothing is spawned): those of
/// launch(), a placement whose shape does not match the spec, an edge
/// between replicas in different processes whose message type has no codec
/// (payload_codec.h; the message names the edge, the processes and the
/// type), and such an edge with a bulk codec when `where.bulk` is null (its
/// tensors need the bulk plane).
expected<job_part> spawn_part(caf::actor_system& sys, const graph::graph_spec& spec,
                              const graph::node_kind_registry& kinds, const node_factory_registry& factories,
                              const run_options& options, const placement& where);

/// Gives the part every replica's handle: `all` in (node, replica) order,
/// local and remote. Must be called before the coordinator starts. Error: a
/// size that does not match the plan.
expected<bool> set_actor_table(job_part& part, const std::vector<caf::actor>& all);

/// The main process of a cluster run: starts the coordinator over the
/// complete table (set_actor_table) and returns the job.
job start_part(caf::actor_system& sys, job_part& part);

/// A cluster node whose coordinator is gone: tells its replicas to stop
/// (reason failed), so that their stop() (the checkpoint hook) runs.
void abort_part(job_part& part);

/// Releases the part's handles (the table refers to actors in other processes).
void release_part(job_part& part);

/// Sends `interrupt_atom, signal` to the job's coordinator: the first drains, the second stops
/// without draining; the exit code is 128 + signal. Signal 0 is the console's stop (POST
/// /api/stop): as SIGINT (exit code 130), and named so on the log.
void interrupt(const job& j, int signal);

/// Sends `pause_atom` / `resume_atom` to the job's coordinator.
void pause(const job& j);
void resume(const job& j);

/// This process's index among the processes of one run: FLOWRUN_PROCESS_INDEX, set by `flowrun launch --nproc P`
/// (0 .. P-1) or by hand; 0 without it. Process 0 writes what the run writes once (TensorBoard, --metrics).
int launch_process_index();

}  // namespace flowrun::actor
