// Kernel callers that run at once share the cores (issue 19, docs/performance.md "A PPO
// iteration side by side with TRL").
//
// Each thread's ops run an OpenMP team of its thread budget (ops::set_thread_budget). When
// several threads run ops at once (PPO's four scorers, its two trainers: each a node of its own),
// their teams together outnumber the cores, and an OpenMP team whose member is descheduled waits
// at every barrier: on 2 cores, four 2-thread teams made a 6.1 M model's forward 2-3x slower than
// the same forwards one after another. So while n threads of this process are inside a
// compute_scope (the actor runtime opens one around every call into a node), each op one of them
// starts runs on min(its thread budget, max(1, hardware_threads() / n)) threads: the cores are
// split among the callers that are busy now, re-read at every op, so a caller that is left alone
// gets them all back at its next op. Outside a scope an op runs on its thread budget, as before.
#pragma once

namespace flowrun::ops {

/// Marks the calling thread as a kernel caller that shares the cores (see above) while it lives.
/// Nests (only the outermost scope of a thread counts). Not copyable.
class compute_scope {
 public:
  compute_scope();
  ~compute_scope();
  compute_scope(const compute_scope&) = delete;
  compute_scope& operator=(const compute_scope&) = delete;
};

/// The threads inside a compute_scope now (process-wide).
int busy_compute_threads();

/// Called by every op as it starts (runtime/kernels/ops.cpp): inside a compute_scope, sets the
/// calling thread's OpenMP team size to its share of the cores; outside one it does nothing.
void share_cores();

}  // namespace flowrun::ops
