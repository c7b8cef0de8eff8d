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
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>

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

/// Sends `interrupt_atom, signal` to the job's coordinator.
void interrupt(const job& j, int signal);

/// Sends `pause_atom` / `resume_atom` to the job's coordinator.
void pause(const job& j);
void resume(const job& j);

}  // namespace flowrun::actor
