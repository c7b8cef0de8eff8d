// Layer 5, actor runtime: the end of a run's actor system, bounded in time.
#pragma once

#include <memory>
#include <string>

namespace caf {
class actor_system;
}

namespace flowrun::actor {

/// ~actor_system waits for every detached actor's thread, and a detached actor's
/// thread waits until the actor is destroyed. After a cluster restart in which a
/// blocking (detached) replica lived on main and talked to other nodes, CAF
/// 0.17 sometimes keeps a reference to it and the destructor never returns
/// (seen in about one run in three of cluster_pretrain_small's restart, after
/// the job had completed and printed its summary: the main thread in
/// await_detached_threads, the replica's thread in await_self_destroyed). The
/// destructor must run on this thread, before the config it reads is gone; so a
/// watchdog waits for it, and if it has not returned after 10 s, the run being
/// over and reported, flushes the output and ends the process with the run's
/// exit code. The run's error goes out first: the caller prints it only after
/// this returns, and a run stopped by a lost node otherwise exited 1 without
/// saying why (seen once in 20 cluster_rlhf_small runs under a CPU hog).
/// Single-process runs have no watchdog. When it fires it also names the detached
/// replicas that still exist and their strong reference counts (held_detached_replicas),
/// so that a hang says what CAF held.
///
/// Destroys `sys`. clustered: under the watchdog above (10 s), whose way out
/// prints `error` (when not empty) and ends the process with `exit_code`.
void teardown_actor_system(std::unique_ptr<caf::actor_system> sys, bool clustered, int exit_code,
                           const std::string& error);

}  // namespace flowrun::actor
