// Layer 5, actor runtime: the API a node kind implements.
//
// Every replica of every node in a graph runs as one CAF actor, but node code
// never sees CAF: it implements `node` and talks to the runtime through
// `node_context`. The runtime calls, on the replica's actor thread and never
// concurrently:
//
//   start(ctx)                  once, before anything else (and again on a
//                               fresh object after a restart);
//   on_message(ctx, port, msg)  for each message on an in port;
//   produce(ctx)                sources only (nodes without non-feedback in
//                               edges): emit one item; return false when
//                               exhausted. Called only while every out edge
//                               has credit (backpressure);
//   awaits_feedback(ctx)        when all inputs have ended (every upstream
//                               replica sent end-of-stream, or the source is
//                               exhausted), before finish(): true keeps the
//                               replica handling its feedback in ports, and
//                               it is asked again after each message;
//   finish(ctx)                 once, when all inputs have ended and
//                               awaits_feedback() said false: flush partial
//                               batches;
//   stop(ctx)                   once, at shutdown (completion, SIGINT or
//                               SIGTERM, or another node's failure): the
//                               checkpoint hook. ctx.reason() says why.
//
// Emits made inside start/on_message/produce/finish are staged and sent when
// the call returns; a call that throws has its emits discarded. A throw is a
// failure of the replica: per its restart policy the runtime either makes a
// fresh object with the node's factory, calls start() on it and retries the
// failed call, or stops the run with an error naming the node.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <spdlog/logger.h>

#include "runtime/actor/payload.h"
#include "runtime/comm/store.h"
#include "runtime/graph/graph_spec.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actor {

/// Thrown by a node callback that gives up because the run is stopping without draining
/// (node_context::stop_requested(): a second SIGINT, a failure elsewhere), e.g. from the progress
/// callback of a long held-out pass; or because the run drains (node_context::draining()) and the
/// call has nothing to keep (the held-out pass before training, which held a drain up for as long as
/// it took). The runtime takes it, and any other exception that escapes a callback while the run is
/// stopping, as the replica having stopped: no restart, no failure of its own (the run's exit code
/// stays the signal's or the first failure's). A replica that gave up so handles, produces and
/// finishes nothing more; one that gave up in start() gets no stop().
struct stopped : std::exception {
  const char* what() const noexcept override { return "the run is stopping"; }
};

/// Why the run is stopping (see node_context::reason()).
enum class stop_reason {
  running,      ///< not stopping (the value during every call but stop())
  completed,    ///< every source ran out and every message was handled
  interrupted,  ///< SIGINT or SIGTERM (after the pipeline drained, or not: see docs/runtime.md)
  failed,       ///< a node failed for good
};

/// "running", "completed", "interrupted" or "failed".
std::string_view to_string(stop_reason r);

/// What the runtime does when a replica's handler throws.
struct restart_policy {
  enum class mode { never, on_failure };
  mode when = mode::never;
  /// Restarts allowed over the replica's lifetime (on_failure only).
  std::int64_t max_restarts = 3;
};

/// Parses "never" or "on-failure" (also "on_failure"); nullopt otherwise.
std::optional<restart_policy::mode> parse_restart_mode(std::string_view s);

/// The runtime's side of a node: what a node may do and know.
/// One context per replica; valid for the replica's whole life (it survives
/// restarts). Not thread-safe: use it only inside the node's callbacks.
class node_context {
 public:
  virtual ~node_context() = default;

  /// The node as written in the graph, with every setting filled in by the
  /// validator (typed access: spec().get_int("max_lines"), ...).
  virtual const graph::node_spec& spec() const = 0;
  /// The node's name (e.g. "generator").
  const std::string& name() const { return spec().name; }
  /// This replica's index, 0 .. replicas() - 1.
  virtual std::size_t replica() const = 0;
  /// The number of replicas of this node.
  virtual std::size_t replicas() const = 0;
  /// The deterministic seed of this replica: graph::node_seed(graph seed, name, replica).
  virtual std::uint64_t seed() const = 0;
  /// The graph's `steps` (0: until the sources run out).
  virtual std::int64_t graph_steps() const = 0;
  /// The run's checkpoint folder ([graph] checkpoint_dir), "" when the graph has none.
  /// A node that checkpoints keeps its state in a subfolder named after it.
  virtual const std::string& checkpoint_dir() const {
    static const std::string none;
    return none;
  }
  /// How often this replica has been restarted so far.
  virtual std::int64_t restarts() const = 0;
  /// Which attempt of the run this is: 0, or k after the run restarted k times
  /// because a cluster node was lost ([cluster] on_node_lost = "restart",
  /// docs/scaling.md). Nodes resume from what earlier attempts of the same
  /// run_id() saved.
  virtual std::int64_t attempt() const { return 0; }
  /// An id shared by every attempt of one run (and by every process of a
  /// cluster run); differs between runs. Nodes write it beside what they save
  /// so that a later attempt of the same run can trust it.
  virtual const std::string& run_id() const {
    static const std::string none;
    return none;
  }
  /// A rendezvous store that every process of the run reaches (null when
  /// the run has none): cluster runs keep one on main for the whole run, and
  /// reach it over the run's own CAF connections. Nodes that form
  /// communicator groups of their own across cluster nodes (zero_rank with
  /// comm_backend gloo or nccl) rendezvous through it.
  virtual std::shared_ptr<comm::store> rendezvous_store() const { return nullptr; }
  /// Why the run is stopping; stop_reason::running outside stop().
  virtual stop_reason reason() const = 0;

  /// Sends `msg` on out port `out_port` to every edge leaving it (an out port
  /// without edges drops it). Staged until the current callback returns.
  /// Throws std::invalid_argument if the port is not an out port of the
  /// node's kind, if msg's type() differs from the port's message type, or
  /// if an edge has dispatch=split and msg cannot be split.
  virtual void emit(std::string_view out_port, payload msg) = 0;

  /// Adds `delta` to this replica's counter `name` (reported in the metrics;
  /// "tokens" feeds the progress line's tokens/s, "steps" its step count).
  virtual void metric(std::string_view name, std::int64_t delta = 1) = 0;

  /// Sources only: do not call produce() again until the next message
  /// arrives on an in port (for sources paced by a feedback edge).
  virtual void wait_for_input() = 0;

  /// Writes `line` and a newline to standard output without garbling the
  /// progress line (use this rather than std::cout in node code).
  virtual void print(std::string_view line) = 0;

  /// This replica's logger (named "NODE[REPLICA]"; same sinks as spdlog's default logger).
  virtual spdlog::logger& log() = 0;

  // -- what the console shows (docs/console.md). The defaults do nothing. --

  /// Reports a training signal: `name` (e.g. "loss", "reward", "kl",
  /// "actor_loss") took `value` now. The console keeps a time series per
  /// (node, name) and charts it. Cheap (one lock, no I/O); call it once per
  /// step, not per token. With `step` >= 0 (the step the value belongs to, as
  /// the node's printed lines number it), a node with enable_tensorboard also
  /// writes it to its TensorBoard event file as the scalar `name` at `step`
  /// (replica 0 only; one record, flushed: docs/console.md, "TensorBoard").
  /// A held-out value, `held_out/...` without a step (the report shows it as
  /// before -> after), goes there at the last step the replica wrote (0 before any).
  virtual void signal(std::string_view name, double value, std::int64_t step = -1) {}

  /// Reports how far a long phase of the node is: `done` of `total` units of
  /// `what` ("step 1 sft" updates, "step 3 ppo" iterations, "pretrain" steps).
  /// The runtime shows every phase under way (done < total) as
  /// "WHAT DONE/TOTAL ETA M:SS" in the progress line, the console header and
  /// flowctl status; the ETA is the rate since the node's first report of
  /// `what`. Cheap (one lock); call it once per unit.
  virtual void progress(std::string_view what, std::int64_t done, std::int64_t total) {}

  /// Says which phase of its work the replica is in ("generation",
  /// "scoring", "training", ...). The last phase any node reported is the
  /// run's phase in the console (PPO's phase).
  virtual void phase(std::string_view name) {}

  /// Reports the bytes this replica holds, by category (e.g. {"params", n},
  /// {"grads", n}, {"optimizer", n}, {"activations", n}); replaces the last
  /// report. The console shows it as the memory of this rank.
  virtual void memory(std::initializer_list<std::pair<std::string_view, std::int64_t>> bytes) {}

  /// True once per console checkpoint request (POST /api/checkpoint): the node
  /// should write a checkpoint now. Nodes poll it where a checkpoint is cheap
  /// to take (after a step). With `step` >= 0, every replica of the node gets
  /// true at the same step (the first replica to see the request fixes it at
  /// step + 1), so replicas that checkpoint together (ZeRO ranks, with
  /// barriers) stay in lock step. Polling also marks the node as able to
  /// checkpoint in the console.
  virtual bool checkpoint_requested(std::int64_t step = -1) { return false; }
  /// The number of the latest console checkpoint request this process knows of (0: none; 1, 2, ...
  /// as they come), for replicas in several processes that agree on requests themselves (zero_rank:
  /// an all_reduce of it at every step; a cluster node learns main's requests a heartbeat later, so
  /// the number, not a once-only flag, tells a request already taken). Marks the node as able to
  /// checkpoint in the console, as polling checkpoint_requested does.
  virtual std::uint64_t checkpoint_generation() { return 0; }
  /// True once the run is stopping without draining (a second SIGINT, a failure elsewhere):
  /// a handler that waits on something outside the run (a child process, a long poll) should
  /// give up, since nothing it produces will be used. Thread-safe. A long computation may
  /// throw stopped{} then (see `stopped`).
  virtual bool stop_requested() const { return false; }
  /// True while the run drains after a first SIGINT or SIGTERM (or the console's stop): sources have
  /// been told to end and what is in flight is being handled, so the finish() that follows is the
  /// last call before stop(interrupted). A trainer that holds unsaved updates may commit them there
  /// (a preempted job's SIGTERM then loses none; DS-Chat's steps 1-2 and DPO do). Thread-safe.
  virtual bool draining() const { return false; }
  /// Asks for at most n threads in this replica's ops (the OpenMP team of its kernels), e.g.
  /// the machine's cores shared among the ranks it runs with. The runtime applies
  /// min(n, the node's `threads` key) before every call into the node, on whatever thread
  /// runs it, so one replica's team size never leaks into another's; n < 1 means 1.
  virtual void thread_budget(int n) {}
};

/// The base class of every node implementation. All callbacks have empty
/// defaults, except produce(), which returns false (not a source).
class node {
 public:
  virtual ~node() = default;
  /// Called once before anything else; read settings and load models here.
  virtual void start(node_context& ctx) {}
  /// A message arrived on in port `in_port`.
  virtual void on_message(node_context& ctx, std::string_view in_port, payload msg) {}
  /// Sources: emit (at most a few) items and return true, or return false when exhausted.
  virtual bool produce(node_context& ctx) { return false; }
  /// All inputs ended (the non-feedback ones: docs/runtime.md "Completion and end of stream"), before
  /// finish(): return true to go on handling messages on the feedback in ports, which otherwise are
  /// dropped from here on; the runtime asks again after each one it hands to on_message(), and calls
  /// finish() at the first false. It may emit (what it emits goes out as on_message's does). A node
  /// whose end is held so must know that the feedback will come: everything it waits for must be in
  /// flight in the graph. ppo_controller holds its end in a drain until the iteration in flight has
  /// reported and the trainers have saved it (docs/rlhf.md). The default: false.
  virtual bool awaits_feedback(node_context& ctx) { return false; }
  /// All inputs ended: emit what is still buffered.
  virtual void finish(node_context& ctx) {}
  /// The run is stopping (ctx.reason() says why): checkpoint, close files.
  virtual void stop(node_context& ctx) {}
};

/// Makes a fresh node object (called at start and on every restart).
using node_factory = std::function<std::unique_ptr<node>()>;

/// Kind name -> factory. The graph layer's node_kind_registry describes what
/// a kind accepts (ports, settings); this registry says how to run it.
class node_factory_registry {
 public:
  /// Registers `factory` for `kind`. Throws std::invalid_argument if the
  /// kind already has a factory or `factory` is empty.
  void add(std::string kind, node_factory factory);
  /// Registers a factory that default-constructs T.
  template <class T>
  void add(std::string kind) {
    add(std::move(kind), [] { return std::unique_ptr<node>(std::make_unique<T>()); });
  }
  /// The factory of `kind`, or nullptr.
  const node_factory* find(std::string_view kind) const;
  /// Every kind with a factory, sorted.
  std::vector<std::string> names() const;

 private:
  std::map<std::string, node_factory, std::less<>> factories_;
};

/// The reserved supervision settings every runtime-registered kind carries
/// (the graph layer rejects unknown keys, so they are declared per kind):
///   restart = "never" | "on-failure"   (default: "never")
///   max_restarts = N                   (default: 3)
inline constexpr std::string_view restart_setting = "restart";
inline constexpr std::string_view max_restarts_setting = "max_restarts";

/// `kind` with the supervision settings appended (unless it declares them).
graph::node_kind with_supervision_settings(graph::node_kind kind);

/// DeepSpeed-Chat's TensorBoard settings (its --enable_tensorboard, --tensorboard_path),
/// which the runtime reads for any kind that declares them:
///   enable_tensorboard = true | false   (default: false)
///   tensorboard_path = "FOLDER"          (an output path; required when enabled)
/// Replica 0 of such a node writes every signal reported with a step
/// (node_context::signal) to an event file in FOLDER/NODE_NAME, opened before
/// the node starts: a folder that cannot be written stops the run then, naming
/// the node and the path.
inline constexpr std::string_view enable_tensorboard_setting = "enable_tensorboard";
inline constexpr std::string_view tensorboard_path_setting = "tensorboard_path";

/// Declares the TensorBoard settings above on `kind` (the trainer kinds and
/// ppo_controller call it where they declare their settings). register_node_kind
/// adds to such a kind's check that enable_tensorboard = true has a tensorboard_path,
/// so the graph is refused when it is checked (exit 2, at the setting's file:line).
graph::node_kind& add_tensorboard_settings(graph::node_kind& kind);

/// Registers a runnable kind: `kind` (with the supervision settings added)
/// in `kinds` and `factory` in `factories`. Throws std::invalid_argument
/// (from either registry) if the name is taken or the kind is malformed.
void register_node_kind(graph::node_kind_registry& kinds, node_factory_registry& factories, graph::node_kind kind,
                        node_factory factory);

}  // namespace flowrun::actor
