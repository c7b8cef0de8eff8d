// Layer 5, actor runtime: the live state of a job, for the console (no CAF here).
//
// The metrics (metrics.h) count; this file says what each replica is doing
// right now and what happened: a state per replica (written by its actor with
// relaxed atomics, so setting it costs no lock), the reason of a failure and
// the last errors, the phase and the memory a node reports, the training
// signals nodes report (node_context::signal), an event log (spawn, start,
// restart, failure, down, pause, ...) and the console's checkpoint requests.
// Whoever watches the job (run_graph's loop, feeding runtime/console) reads
// it with the *_since() calls, which return what is new since a sequence number.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flowrun::actor {

/// What one replica is doing now.
enum class replica_state : int {
  initializing,     ///< spawned, start() not finished yet
  idle,             ///< nothing to do: no message queued, not producing
  busy,             ///< inside on_message / produce / finish / stop
  waiting_credit,   ///< has output to send or items to produce, but no credit downstream
  waiting_request,  ///< a source paused by wait_for_input(): waits for the next message (a feedback tick)
  restarting,       ///< a call threw; making a fresh node object and starting it
  paused,           ///< the console paused the run
  failed,           ///< failed for good (see replica_view::reason)
  done,             ///< its input ended and finish() ran
  stopped,          ///< stop() ran; the actor quit
  remote,           ///< cluster runs: runs on another node (its metrics stay there; docs/scaling.md)
};

/// "initializing", "idle", "busy", "waiting_credit", "waiting_request", "restarting", "paused", "failed", "done",
/// "stopped".
std::string_view to_string(replica_state s);

/// Where the whole run is.
enum class run_phase : int { starting, running, paused, draining, stopping, finished };

/// "starting", "running", "paused", "draining", "stopping", "finished".
std::string_view to_string(run_phase p);

/// One entry of the event log.
struct live_event {
  std::uint64_t seq = 0;  ///< 1, 2, ... in the order recorded
  double t_s = 0;         ///< seconds since the job was launched
  std::string kind;  ///< "spawn", "start", "restart", "failed", "down", "run", "pause", "resume", "stop", "checkpoint"
  std::string node;  ///< "" for run-level events
  std::int64_t replica = -1;  ///< -1: the node as a whole, or a run-level event
  std::string text;
};

/// One reported value (node_context::signal) or phase change (node_context::phase).
struct live_signal {
  std::uint64_t seq = 0;
  double t_s = 0;
  std::string node;
  std::int64_t replica = 0;
  std::string name;  ///< e.g. "loss"; "phase" for a phase change
  double value = 0;  ///< the value (0 for phase changes)
  std::string text;  ///< the phase name (phase changes only)
  std::int64_t step = -1;  ///< the step the value belongs to (node_context::signal); -1: none (held-out, phases)
};

/// How far one long phase of a node is (node_context::progress): `done` of `total` units of
/// `what` ("step 1 sft": updates; "step 3 ppo": iterations; "pretrain": steps).
struct live_progress {
  std::string node;
  std::string what;
  std::int64_t done = 0, total = 0;
  double first_s = 0;             ///< when `what` was first reported by the node (seconds since the job began)
  std::int64_t first_done = 0;    ///< `done` at that first report
  double t_s = 0;                 ///< when it was last reported

  /// Seconds left at `now_s` (since the job began): the rate since the first report,
  /// (t_s - first_s) / (done - first_done) seconds per unit, times the units left, less the
  /// time since the last report (at least 0). Negative when unknown (no unit done since the
  /// first report).
  double eta_s(double now_s) const;
  /// "WHAT DONE/TOTAL ETA M:SS" (H:MM:SS from an hour on; no ETA while unknown, or without
  /// `with_eta`: a run that has ended; "WHAT N/N done" once finished).
  std::string text(double now_s, bool with_eta = true) const;
};

/// Each phase's live_progress::text at `now_s`, joined by " · " ("" for none).
std::string progress_text(const std::vector<live_progress>& phases, double now_s, bool with_eta = true);

/// A copy of one replica's live state.
struct replica_view {
  replica_state state = replica_state::initializing;
  double state_for_s = 0;                                    ///< how long it has been in `state`
  std::string reason;                                        ///< why it failed (state failed), else ""
  std::string phase;                                         ///< the last node_context::phase, or ""
  std::vector<std::pair<double, std::string>> errors;        ///< the last errors: (t_s, text), oldest first
  std::vector<std::pair<std::string, std::int64_t>> memory;  ///< bytes by category (node_context::memory)
  bool checkpoint_capable = false;  ///< the node has asked node_context::checkpoint_requested()
};

/// The live state of one replica. The state is written only by the replica's
/// actor; the rest is guarded by a mutex (written rarely).
class replica_live {
 public:
  /// Sets the state (and, when it changes, the time it began: `now_ns` since the job began).
  void set_state(replica_state s, std::int64_t now_ns) {
    if (s == state_.load(std::memory_order_relaxed)) return;
    since_ns_.store(now_ns, std::memory_order_relaxed);
    state_.store(s, std::memory_order_release);
  }
  replica_state state() const { return state_.load(std::memory_order_acquire); }
  /// Records the reason of a failure for good.
  void set_failure(std::string why);
  /// Remembers an error (the last 8 are kept).
  void note_error(double t_s, std::string what);
  void set_phase(std::string_view phase);
  void set_memory(std::vector<std::pair<std::string, std::int64_t>> bytes);
  void mark_checkpoint_capable() { checkpoint_capable_.store(true, std::memory_order_relaxed); }
  /// A consistent copy; `now_ns`: the current time since the job began.
  replica_view read(std::int64_t now_ns) const;

 private:
  std::atomic<replica_state> state_{replica_state::initializing};
  std::atomic<std::int64_t> since_ns_{0};
  std::atomic<bool> checkpoint_capable_{false};
  mutable std::mutex mutex_;
  std::string reason_, phase_;
  std::deque<std::pair<double, std::string>> errors_;
  std::vector<std::pair<std::string, std::int64_t>> memory_;
};

/// The live state of a job: one replica_live per replica, the event log, the
/// signals, the run's phase and the checkpoint requests. Thread-safe.
class job_live {
 public:
  /// The most events and signals kept for readers that fall behind.
  static constexpr std::size_t max_events = 4096;
  static constexpr std::size_t max_signals = 16384;

  explicit job_live(std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now()) : start_(start) {}

  /// Lays out `replicas` replica_live objects for node `node` (index order = spec order). Not thread-safe: at launch.
  void add_node(std::string name, std::size_t replicas);
  replica_live& replica(std::size_t node, std::size_t replica) { return *nodes_.at(node).replicas.at(replica); }
  const replica_live& replica(std::size_t node, std::size_t replica) const {
    return *nodes_.at(node).replicas.at(replica);
  }
  std::size_t nodes() const { return nodes_.size(); }
  std::size_t replicas(std::size_t node) const { return nodes_.at(node).replicas.size(); }
  const std::string& node_name(std::size_t node) const { return nodes_.at(node).name; }

  /// Seconds and nanoseconds since the job began.
  double now_s() const;
  std::int64_t now_ns() const;
  std::chrono::steady_clock::time_point start() const { return start_; }

  /// Appends to the event log.
  void event(std::string kind, std::string node, std::int64_t replica, std::string text);
  /// Records a signal value at `step` (-1: none; a non-finite value is recorded as is; readers decide).
  void signal(std::string node, std::int64_t replica, std::string name, double value, std::int64_t step = -1);
  /// Records a phase change of a replica (and makes it the job's current phase).
  void phase(std::string node, std::int64_t replica, std::string phase);
  /// The phase most recently reported by any node ("" if none).
  std::string current_phase() const;
  /// Records how far `node`'s phase `what` is (node_context::progress).
  void progress(std::string node, std::string what, std::int64_t done, std::int64_t total);
  /// The phases under way (done < total), oldest first: what the progress line, the console
  /// header and flowctl show. A finished phase drops out; when none is under way (between
  /// step 2's end and step 3's first iteration, or after the last), the phase reported last,
  /// finished, so that the line never falls back to the largest step counter.
  std::vector<live_progress> progress_now() const;

  /// Events / signals with seq > `seq`, oldest first (at most the last max_*).
  std::vector<live_event> events_since(std::uint64_t seq) const;
  std::vector<live_signal> signals_since(std::uint64_t seq) const;

  void set_run_phase(run_phase p) { run_phase_.store(p, std::memory_order_release); }
  run_phase get_run_phase() const { return run_phase_.load(std::memory_order_acquire); }

  /// Asks every node that polls node_context::checkpoint_requested() to
  /// checkpoint; returns the request's number (1, 2, ...).
  std::uint64_t request_checkpoint();
  /// The number of the latest request (0: none).
  std::uint64_t checkpoint_generation() const { return checkpoint_gen_.load(std::memory_order_acquire); }
  /// node_context::checkpoint_requested for replica `replica` of `node`; `seen`
  /// is the replica's own record of the last request it honoured. With step >= 0
  /// every replica of the node honours a request at the same step: the first
  /// replica to see it fixes the step at step + 1 (replicas that run in lock
  /// step, like ZeRO ranks, cannot be past it then).
  bool checkpoint_due(std::size_t node, std::size_t replica, std::uint64_t& seen, std::int64_t step);
  /// node_context::checkpoint_generation for replica `replica` of `node`: checkpoint_generation(),
  /// and the replica counts as able to checkpoint.
  std::uint64_t checkpoint_generation_for(std::size_t node, std::size_t replica);
  /// Names of the nodes that have polled checkpoint_requested() so far (here, or on a cluster node:
  /// note_remote_checkpoints).
  std::vector<std::string> checkpoint_capable_nodes() const;
  /// Cluster runs, a node's part: main's console asked for request `gen` (main forwards its
  /// checkpoint_generation() with every counter poll); raises this part's generation to it.
  void raise_checkpoint_generation(std::uint64_t gen);
  /// Cluster runs, main: what a node's part reported with its counters: the latest request it
  /// honoured and the names of its nodes that poll checkpoint_requested(); every replica of those
  /// nodes then reads checkpoint_capable (the console's replica view).
  void note_remote_checkpoints(std::uint64_t honoured, const std::vector<std::string>& capable);
  /// Cluster runs, a node's part: keep the lines its replicas print (node_context::print: losses,
  /// checkpoints, what an interrupted run kept) for main, which prints them too; the daemon's own
  /// terminal was the only place they showed.
  void forward_prints() { forward_prints_.store(true, std::memory_order_release); }
  /// A line a replica printed (kept only under forward_prints: the last max_events, numbered 1, 2, ...).
  void printed(std::string_view line);
  /// The kept lines numbered after `seen`, oldest first; *first gets the number of the first (main
  /// asks with the last number it printed, so a reply that crossed another prints nothing twice).
  /// (`seen` as sent over the wire: below 0 reads as 0.)
  std::vector<std::string> printed_since(std::int64_t seen, std::uint64_t* first) const;

  /// The latest request some node has honoured (checkpoint_due returned true for it; 0: none).
  /// A run that ends with checkpoint_generation() above it ends with a request not written.
  std::uint64_t checkpoint_honoured() const { return checkpoint_honoured_.load(std::memory_order_acquire); }

 private:
  struct node_entry {
    std::string name;
    std::vector<std::unique_ptr<replica_live>> replicas;
    std::uint64_t claimed_gen = 0;  // checkpoint request the target step belongs to
    std::int64_t target_step = -1;
  };
  std::chrono::steady_clock::time_point start_;
  std::vector<node_entry> nodes_;
  std::atomic<run_phase> run_phase_{run_phase::starting};
  std::atomic<std::uint64_t> checkpoint_gen_{0};
  std::atomic<std::uint64_t> checkpoint_honoured_{0};
  std::atomic<bool> forward_prints_{false};
  mutable std::mutex mutex_;
  std::deque<std::string> printed_;  // under forward_prints; the last is number printed_seq_
  std::uint64_t printed_seq_ = 0;
  std::deque<live_event> events_;
  std::deque<live_signal> signals_;
  std::uint64_t event_seq_ = 0, signal_seq_ = 0;
  std::string current_phase_;
  std::vector<live_progress> progress_;  // by (node, what), in the order first reported
};

}  // namespace flowrun::actor
