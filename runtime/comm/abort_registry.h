// The communicators of this process that a cluster node's loss must abort.
//
// A rank blocked in a collective cannot handle a message: when a cluster node
// is lost without closing its sockets (SIGSTOP, a network partition), the ranks
// of this process that wait for its ranks would sit until comm_timeout_s (300 s
// by default) before the run could stop or restart. The rank groups
// (actors/rank_group.h) register their communicators here with the processes
// their ranks span; the coordinator and the nodes' sessions (runtime/actor/
// cluster.cpp) call abort_spanning when the liveness detector declares a node
// lost, from a thread of their own, and the waiting collectives throw at once
// (communicator::abort). docs/scaling.md, "What happens when a node is lost".
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "runtime/comm/communicator.h"

namespace flowrun::comm {

/// A communicator's entry in this process's abort registry; unregisters when destroyed. Declare it
/// after the communicator it names, so that it goes first: abort_spanning never reaches a
/// communicator being destroyed. Movable, not copyable.
class abort_registration {
 public:
  abort_registration() = default;
  abort_registration(abort_registration&& o) noexcept : id_(o.id_) { o.id_ = 0; }
  abort_registration& operator=(abort_registration&& o) noexcept;
  abort_registration(const abort_registration&) = delete;
  abort_registration& operator=(const abort_registration&) = delete;
  ~abort_registration();

 private:
  friend abort_registration register_abortable(communicator&, std::string, std::set<std::string>);
  explicit abort_registration(std::uint64_t id) : id_(id) {}
  std::uint64_t id_ = 0;
};

/// The scope of one attempt of one run: "RUN_ID/ATTEMPT" (node_context::run_id, attempt).
inline std::string attempt_scope(const std::string& run_id, std::int64_t attempt) {
  return run_id + "/" + std::to_string(attempt);
}

/// Registers `c` (not owned; it must outlive the returned entry) under `scope` (attempt_scope) as a group whose ranks run in the processes named by `places` ("main" and
/// cluster node names, graph::placement_of). Thread-safe.
[[nodiscard]] abort_registration register_abortable(communicator& c, std::string scope, std::set<std::string> places);

/// Aborts (communicator::abort(why)) every communicator registered under `scope` whose places include
/// `place`, and returns how many it aborted. Groups that do not span `place` are left alone: their
/// stop() may still need their collectives (a final checkpoint). Thread-safe; never throws.
int abort_spanning(const std::string& scope, const std::string& place, const std::string& why) noexcept;

/// Aborts every communicator registered under `scope` (this process's part of the run is over: its
/// coordinator was lost, or it stops without draining); returns how many. Thread-safe; never throws.
int abort_scope(const std::string& scope, const std::string& why) noexcept;

}  // namespace flowrun::comm
