// The CAF scheduler settings of every actor system flowrun starts (a graph run, a node daemon,
// the rendezvous store of caf_store.h).
#pragma once

#include <cstddef>

#include <caf/actor_system_config.hpp>

namespace flowrun::comm {

/// Sets `threads` CAF workers (0: one per hardware thread, at least 2) and the scheduler's
/// policy knobs on `cfg`:
///  - max-throughput 4: an actor yields its worker after a few messages, so a busy source (a
///    training node producing step after step) cannot keep the coordinator from a signal;
///  - work-stealing moderate polling every 500 us instead of CAF's 50 us. An idle worker first
///    spins (100 attempts), then polls its queue and steals with a sleep between attempts (500
///    attempts), then waits on a condition variable that external enqueues notify. At 50 us each
///    idle worker woke ~10,000 times a second, preempting the kernels of the nodes on the same
///    cores: in a PPO job on 2 cores (stories260K) the iteration took 7% longer and the system
///    time doubled (docs/performance.md, issue 19 change 13). The cost: in that phase (now up to
///    500 x 500 us = 250 ms after a worker's last job) a worker sees a job stolen from another
///    worker's queue, or one enqueued from outside the scheduler (a blocking node's thread, the
///    middleman), up to 500 us late instead of 50 us; the nodes' callbacks take milliseconds.
void configure_scheduler(caf::actor_system_config& cfg, std::size_t threads);

}  // namespace flowrun::comm
