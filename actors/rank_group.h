// The communicator of a node's replicas: the ranks of a data-parallel group
// (zero_rank's shard owners, step 3's policy and critic). Replica i of a node
// with replicas = R in process p of a `flowrun launch --nproc P` is rank
// p·R + i of P·R; its collectives go through comm_backend:
//   inproc  threads of this process (the replicas of one node share a group)
//   gloo    processes, through a rendezvous (caf://HOST:PORT, a folder, or the
//           cluster run's store)
//   nccl    GPUs, through the same rendezvous
#pragma once

#include <memory>
#include <set>
#include <string>

#include "runtime/actor/node.h"
#include "runtime/comm/abort_registry.h"
#include "runtime/comm/communicator.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actors {

/// This replica's place in its node's rank group, and the group's communicator.
struct rank_group {
  /// The rendezvous store the group met through (a CAF store client, or null), kept as long as the
  /// group: the last of a process's CAF store clients ends the process's store actor system, and ending
  /// it in start() waited in ~actor_system while this process's other rank sat in the group's first
  /// collective (`flowrun launch --nproc 2` with replicas = 2 hung until comm_timeout_s). Declared
  /// before `comm`, so the communicator goes first.
  std::shared_ptr<comm::store> rendezvous;
  std::unique_ptr<comm::communicator> comm;
  /// `comm` in this process's abort registry (comm/abort_registry.h) with the processes its ranks run
  /// in: a lost cluster node aborts the collectives waiting for its ranks. Declared after `comm`, so
  /// it unregisters first.
  comm::abort_registration abortable;
  int rank = 0;        ///< p·R + replica
  int world = 1;       ///< P·R
  int local_ranks = 1; ///< R: the ranks in this process
};

/// Runs `f` (a node callback's body); when it throws, aborts `comm` (when not null) with the error
/// before rethrowing, so that this rank's peers waiting in a collective fail now, naming it, rather
/// than at comm_timeout_s (300 s by default; a replica that failed at init left its peer waiting that
/// long). inproc peers only: see communicator::abort.
template <class F>
void aborting_on_failure(comm::communicator* comm, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    if (comm) comm->abort(e.what());
    throw;
  }
}

/// The process index and count of a `flowrun launch` (0 and 1 otherwise: FLOWRUN_PROCESS_INDEX, FLOWRUN_NPROC).
int process_index();
int process_count();

/// Whether every replica of the node runs in this one process (no flowrun launch, every replica placed on
/// main), so that the console's checkpoint requests (node_context::checkpoint_requested) reach all of them
/// at once and the step-based agreement of checkpoint_requested(step) holds. Where it is false, zero_rank's
/// ranks agree on the latest request by a collective at every step (zero_nodes.cpp, console_asked): split
/// over processes, a request seen on one side alone had those ranks checkpoint alone and hung the others'
/// next collective. join_rank_group also asks it: gloo/nccl ranks all here meet through a store in memory.
bool all_replicas_here(const actor::node_context& ctx);

/// Join the node's rank group with the settings add_rank_group_settings declares (comm_backend,
/// rendezvous, store_dir, comm_timeout_s). Every replica calls it in start(). gloo/nccl ranks that
/// are all threads of this one process with no rendezvous given meet through a store in memory (a
/// cluster run whose restart moved every rank to main has no cluster store: it failed at start).
/// Throws std::invalid_argument naming the node for inproc across processes or gloo/nccl ranks in
/// several processes without a rendezvous.
rank_group join_rank_group(actor::node_context& ctx);

/// Declare comm_backend, rendezvous, store_dir and comm_timeout_s on `k`.
void add_rank_group_settings(graph::node_kind& k);
/// The names add_rank_group_settings declares: where the ranks meet, never what they compute
/// (settings_record leaves them out, so a resume or rerun may change them).
const std::set<std::string>& rank_group_setting_names();

}  // namespace flowrun::actors
