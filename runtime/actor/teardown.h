// Layer 5, actor runtime: the end of a run's actor system, bounded in time.
#pragma once

#include <memory>
#include <string>

namespace caf {
class actor_system;
}

namespace flowrun::actor {

/// ~actor_system waits for every detached actor's thread, and the thread of a
/// detached event-based actor waits until the actor is destroyed (CAF 0.17's
/// private_thread; actor-framework issue #1196). Blocking replicas once ran that
/// way, and after a cluster node's loss CAF sometimes kept a reference to one, so
/// the destructor never returned (about one run in 20 of cluster_rlhf_small and
/// cluster_pretrain_small under load, after the job had completed and printed its
/// summary). They are caf::blocking_actor now, whose thread ends when act()
/// returns (job.cpp, replica_actor_t). The watchdog stays for any other actor CAF
/// might hold: the destructor must run on this thread, before the config it reads
/// is gone; so a watchdog waits for it, and if it has not returned after 10 s, the
/// run being over and reported, flushes the output and ends the process with the
/// run's exit code. The run's error goes out first: the caller prints it only after
/// this returns, and a run stopped by a lost node otherwise exited 1 without saying
/// why. It also says CAF's count of running actors. Single-process runs have no
/// watchdog.
///
/// Destroys `sys`. clustered: under the watchdog above (10 s), whose way out
/// prints `error` (when not empty) and ends the process with `exit_code`.
void teardown_actor_system(std::unique_ptr<caf::actor_system> sys, bool clustered, int exit_code,
                           const std::string& error);

}  // namespace flowrun::actor
