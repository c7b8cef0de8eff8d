// Layer 5, actor runtime: the replica actor, the coordinator and launch().
//
// This is one of the two translation units that include CAF (with
// runtime.cpp). The protocol, in brief (docs/runtime.md has the details):
//
//   coordinator -> replica  init(coordinator)   wire the links, make the node, start()
//                           run                 begin (sources start producing)
//                           end                 sources: stop producing (drain)
//                           stop(reason)        call stop(), report, quit
//   replica -> replica      data(envelope)      a payload on a link (uses one credit)
//                           ack(out link, n)    n messages handled: n credits back
//                           eos(in link)        end of stream on a link
//   replica -> coordinator  done / fail(why) / stopped(error)
//   replica -> itself       produce             sources: call produce() once
#include "runtime/actor/job.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <type_traits>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "runtime/actor/console.h"
#include "runtime/actor/payload_codec.h"
#include "runtime/kernels/compute_scope.h"
#include "runtime/kernels/ops.h"
#include "runtime/tensorboard/event_writer.h"
#include "runtime/util/dir_lock.h"

namespace flowrun::actor::rt {

using clock_type = std::chrono::steady_clock;

// -- control atoms (CAF 0.17: at most 10 characters) -------------------------

using init_atom = caf::atom_constant<caf::atom("fr_init")>;
using run_atom = caf::atom_constant<caf::atom("fr_run")>;
using data_atom = caf::atom_constant<caf::atom("fr_data")>;
using ack_atom = caf::atom_constant<caf::atom("fr_ack")>;
using eos_atom = caf::atom_constant<caf::atom("fr_eos")>;
using produce_atom = caf::atom_constant<caf::atom("fr_prod")>;
using end_atom = caf::atom_constant<caf::atom("fr_end")>;
using stop_atom = caf::atom_constant<caf::atom("fr_stop")>;
using done_atom = caf::atom_constant<caf::atom("fr_done")>;
using fail_atom = caf::atom_constant<caf::atom("fr_fail")>;
using stopped_atom = caf::atom_constant<caf::atom("fr_stopd")>;
using flush_atom = caf::atom_constant<caf::atom("fr_flush")>;
/// A payload from a replica in another process, as bytes (see on_remote_data).
using rdata_atom = caf::atom_constant<caf::atom("fr_rdata")>;
// the coordinator to itself while draining: say which replicas it still waits for
using drain_report_atom = caf::atom_constant<caf::atom("fr_drrep")>;

// -- what crosses processes (cluster runs; all of it is counted) ----------------

struct cross_counters {
  std::atomic<std::uint64_t> data_msgs{0}, data_bytes{0}, control_msgs{0};
};
cross_counters& cross() {
  static cross_counters c;
  return c;
}

/// produce() calls per produce event at most.
constexpr int produce_burst = 16;
/// A produce event stops calling produce() after this long (milliseconds).
constexpr int produce_burst_ms = 20;

// -- the data message ----------------------------------------------------------

/// The order key of a message in a stream that is gathered at the receiver.
/// origin == 0: untagged. Otherwise origin names the dispatching edge and
/// replica (a round_robin or split edge), seq the message it dispatched,
/// part/parts which part of a split it was; index counts the outputs of one
/// (seq, part) and `last` marks the final one. A tombstone carries no
/// payload: it says "this (seq, part) produced nothing on this edge".
struct tag {
  std::uint64_t origin = 0;
  std::uint64_t seq = 0;
  std::uint32_t part = 0;
  std::uint32_t parts = 1;
  std::uint32_t index = 0;
  bool last = true;
  bool tombstone = false;
};

/// A payload on a link. `link` is the link's index at the receiver.
struct envelope {
  std::uint32_t link = 0;
  tag t;
  payload data;
};

}  // namespace flowrun::actor::rt

// In-process only (a payload holds a shared_ptr): never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(flowrun::actor::rt::envelope)

namespace flowrun::actor::rt {

// -- the plan: what launch() worked out from the spec ---------------------------

struct edge_plan {
  std::string name;
  std::uint32_t from_node = 0, from_port = 0;  // port: index into node_plan::out_ports
  std::uint32_t to_node = 0, to_port = 0;      // port: index into node_plan::in_ports
  graph::dispatch_mode mode = graph::dispatch_mode::broadcast;
  bool feedback = false;
  std::int64_t credit = 8;
  std::size_t metrics_edge = 0;
};

struct link_plan {
  std::uint32_t edge = 0;
  std::uint32_t from_node = 0, from_replica = 0, out_index = 0;
  std::uint32_t to_node = 0, to_replica = 0, in_index = 0;
  link_counters* counters = nullptr;
};

struct port_plan {
  std::string name;
  std::string_view type;  // interned
};

struct node_plan {
  graph::node_spec spec;
  std::string kind_name;
  std::size_t replicas = 1;
  node_factory factory;
  restart_policy policy;
  bool source = false;
  bool blocking = false;  // graph::node_kind::blocking: a caf::blocking_actor per replica (a thread of its own)
  std::vector<port_plan> out_ports;
  std::vector<port_plan> in_ports;
  std::vector<std::uint32_t> out_edges;  // edge ids leaving the node, in spec order
  std::string tensorboard_dir;  // enable_tensorboard: TENSORBOARD_PATH/NAME, where replica 0 writes; else ""
};

struct job_plan {
  std::string graph_name;
  std::uint64_t seed = 0;
  std::int64_t steps = 0;
  std::string checkpoint_dir;  // node_context::checkpoint_dir
  std::shared_ptr<dir_lock> checkpoint_lock;  // held while the job lives: one run writes checkpoint_dir
  std::string run_id;        // node_context::run_id
  std::int64_t attempt = 0;  // node_context::attempt
  std::shared_ptr<comm::store> rendezvous_store;  // node_context::rendezvous_store
  std::vector<node_plan> nodes;
  std::vector<edge_plan> edges;
  std::vector<link_plan> links;
  std::vector<std::vector<std::vector<std::uint32_t>>> out_links;  // [node][replica] -> link ids, by out index
  std::vector<std::vector<std::vector<std::uint32_t>>> in_links;   // [node][replica] -> link ids, by in index
  std::shared_ptr<job_metrics> metrics;
  std::shared_ptr<job_live> live;
  std::shared_ptr<run_state> state;
  std::vector<std::vector<caf::actor>> actors;  // filled after spawning, cleared at the end
  // Guards `actors` where two threads meet: a cluster part's session fills
  // it (set_actor_table) and releases it (release_part) on its own thread,
  // while a replica reads it in on_init (a coordinator lost just after
  // sending init released the table under a replica still wiring: a
  // use-after-free).
  mutable std::mutex actors_mutex;
  // Cluster runs: where each replica runs (empty: all in this process).
  flowrun::actor::placement where;
  bool local(std::uint32_t node, std::uint32_t replica) const {
    return where.where.empty() || where.where[node][replica] == where.self;
  }
  std::uint32_t process_of(std::uint32_t node, std::uint32_t replica) const {
    return where.where.empty() ? 0 : where.where[node][replica];
  }
};

// Adds to a counter that only the calling actor writes (no read-modify-write
// instruction needed; readers see a consistent value with acquire loads).
inline void bump(std::atomic<std::uint64_t>& a, std::uint64_t d) {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_release);
}

std::string replica_name(const job_plan& p, std::uint32_t node, std::uint32_t replica) {
  const auto& n = p.nodes[node];
  return "node '" + n.spec.name + "'" + (n.replicas > 1 ? " replica " + std::to_string(replica) : std::string());
}


// -- the replica actor ------------------------------------------------------------

// One replica of a node: its links, its credit and its calls into the node. Base is
// caf::event_based_actor for the kinds that run on CAF's scheduler, caf::blocking_actor for the
// blocking kinds (graph::node_kind::blocking: collectives, long training steps), which get a thread
// of their own. Not a detached event-based actor: CAF 0.17's private thread of one waits for the
// actor object's destruction, so a reference CAF keeps (a down message in the BASP broker after a
// cluster node's loss) kept ~actor_system waiting for good (actor-framework issue #1196); a
// blocking_actor's thread ends when act() returns (blocking_actor::launch, 0.17.6), whoever still
// holds the object (docs/reliability.md, "Liveness under load").
template <class Base>
class replica_actor_t : public Base {
 public:
  replica_actor_t(caf::actor_config& cfg, std::shared_ptr<job_plan> plan, std::uint32_t node, std::uint32_t replica)
      : Base(cfg),
        plan_(std::move(plan)),
        node_(node),
        replica_(replica),
        np_(plan_->nodes[node]),
        counters_(plan_->metrics->replica(node, replica)),
        live_(plan_->live->replica(node, replica)),
        ctx_(*this) {
    if constexpr (std::is_base_of_v<caf::scheduled_actor, Base>)
      this->set_exception_handler([](caf::scheduled_actor*, std::exception_ptr& eptr) -> caf::error {
        return exception_error(eptr);
      });
  }

  // An exception out of a handler as the replica's exit reason (the coordinator's down message says it).
  static caf::error exception_error(const std::exception_ptr& eptr) {
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      return caf::make_error(caf::sec::runtime_error, std::string(e.what()));
    } catch (...) {
      return caf::make_error(caf::sec::runtime_error, std::string("unknown exception"));
    }
  }

  const char* name() const override { return "flowrun_replica"; }

  // The messages a replica handles, for either base.
  caf::behavior handlers() {
    return {
        [this](init_atom, caf::actor coordinator) {
          now_valid_ = false;
          on_init(std::move(coordinator));
          publish_state();
        },
        [this](run_atom) {
          now_valid_ = false;
          on_run();
          publish_state();
        },
        [this](data_atom, envelope& e) {
          now_valid_ = false;
          on_data(e);
          publish_state();
        },
        [this](rdata_atom, std::uint32_t link, std::uint64_t origin, std::uint64_t seq, std::uint64_t parts,
               std::uint64_t index_flags, const std::string& type, const std::vector<char>& bytes) {
          now_valid_ = false;
          on_remote_data(link, {origin, seq, parts, index_flags >> 8, index_flags & 0xffu}, type, bytes);
          publish_state();
        },
        [this](ack_atom, std::uint32_t out, std::uint32_t n) {
          now_valid_ = false;
          on_ack(out, n);
          publish_state();
        },
        [this](eos_atom, std::uint32_t in) {
          now_valid_ = false;
          on_eos(in);
          publish_state();
        },
        [this](produce_atom) {
          now_valid_ = false;
          on_produce();
          publish_state();
        },
        [this](flush_atom) {
          ack_flush_scheduled_ = false;
          flush_acks(true);
        },
        [this](end_atom) {
          now_valid_ = false;
          on_end();
          publish_state();
        },
        [this](pause_atom) {
          now_valid_ = false;
          paused_ = true;
          publish_state();
        },
        [this](resume_atom) {
          now_valid_ = false;
          paused_ = false;
          pump();
          publish_state();
        },
        [this](stop_atom, std::int32_t reason) {
          now_valid_ = false;
          on_stop(static_cast<stop_reason>(reason));
        },
    };
  }

  void on_exit() override {
    // an event file that got no scalar (a finished step's rerun trains nothing) holds only its version
    // record: removed, so that the folder holds the runs that wrote something
    if (tensorboard_ && !tb_written_) {
      const auto path = tensorboard_->path();
      tensorboard_.reset();
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
    // Break the reference cycles between actors and release node resources.
    out_links_.clear();
    in_links_.clear();
    ready_.clear();
    gathers_.clear();
    staged_.clear();
    coordinator_ = nullptr;
    impl_.reset();
    // The plan holds every replica's handle (job_plan::actors) until the coordinator's finish() or
    // release_part clears it: a replica that kept the plan after its exit would close the cycle
    // replica -> plan -> actors -> replica on any path that skips both. np_, counters_ and live_
    // refer into the plan and are not read after this.
    plan_.reset();
    Base::on_exit();
  }

 protected:
  using Base::mailbox;
  using Base::send;
  using Base::system;

  // Ends the actor once the current message is handled (blocking: act()'s loop ends).
  void quit() {
    if constexpr (std::is_base_of_v<caf::scheduled_actor, Base>)
      Base::quit();
    else
      quit_ = true;
  }
  bool quit_ = false;  // blocking_actor only: act() returns

 private:
  // The node_context handed to the node: forwards to the actor (kept apart
  // from the actor class so that node_context's names never meet CAF's).
  class context final : public node_context {
   public:
    explicit context(replica_actor_t& a) : a_(a) {}
    const graph::node_spec& spec() const override { return a_.np_.spec; }
    std::size_t replica() const override { return a_.replica_; }
    std::size_t replicas() const override { return a_.np_.replicas; }
    std::uint64_t seed() const override { return graph::node_seed(a_.plan_->seed, a_.np_.spec.name, a_.replica_); }
    std::int64_t graph_steps() const override { return a_.plan_->steps; }
    const std::string& checkpoint_dir() const override { return a_.plan_->checkpoint_dir; }
    std::int64_t restarts() const override { return a_.restarts_; }
    std::int64_t attempt() const override { return a_.plan_->attempt; }
    const std::string& run_id() const override { return a_.plan_->run_id; }
    std::shared_ptr<comm::store> rendezvous_store() const override { return a_.plan_->rendezvous_store; }
    stop_reason reason() const override { return a_.reason_; }
    void emit(std::string_view port, payload msg) override { a_.ctx_emit(port, std::move(msg)); }
    void metric(std::string_view name, std::int64_t delta) override { a_.counters_.add(name, delta); }
    void wait_for_input() override { a_.waiting_input_ = true; }
    void print(std::string_view line) override {
      console::print(line);
      a_.plan_->live->printed(line);  // a cluster node's part keeps it for main (job_live::forward_prints)
    }
    spdlog::logger& log() override { return a_.ctx_log(); }
    void signal(std::string_view name, double value, std::int64_t step) override {
      a_.plan_->live->signal(a_.np_.spec.name, a_.replica_, std::string(name), value, step);
      // a held-out value (held_out/NAME, without a step) goes to TensorBoard at the last step this replica
      // wrote: the "after" figure at the last update (it was left out). Before any, it waits for the first
      // stepped value and goes in at step 0 just before it (the "before" figure); a run that writes no step
      // (a finished run's rerun reports its results again) writes nothing, which would have hidden the
      // earlier run's curves from step 0 on. Other values without a step (a held-out batch's phase times)
      // stay out.
      if (!a_.tensorboard_) return;
      if (step >= 0) {
        for (auto& [held, v] : a_.tb_held_) a_.write_tensorboard(held, v, 0);
        a_.tb_held_.clear();
        a_.write_tensorboard(name, value, step);
      } else if (name.rfind("held_out/", 0) == 0) {
        if (a_.tb_last_step_ >= 0) a_.write_tensorboard(name, value, a_.tb_last_step_);
        else a_.tb_held_.emplace_back(std::string(name), value);
      }
    }
    void progress(std::string_view what, std::int64_t done, std::int64_t total) override {
      a_.plan_->live->progress(a_.np_.spec.name, std::string(what), done, total);
    }
    void phase(std::string_view name) override {
      if (name == a_.last_phase_) return;
      a_.last_phase_.assign(name);
      a_.live_.set_phase(name);
      a_.plan_->live->phase(a_.np_.spec.name, a_.replica_, std::string(name));
    }
    void memory(std::initializer_list<std::pair<std::string_view, std::int64_t>> bytes) override {
      std::vector<std::pair<std::string, std::int64_t>> m;
      for (const auto& [k, v] : bytes) m.emplace_back(std::string(k), v);
      a_.live_.set_memory(std::move(m));
    }
    bool checkpoint_requested(std::int64_t step) override {
      return a_.plan_->live->checkpoint_due(a_.node_, a_.replica_, a_.checkpoint_seen_, step);
    }
    std::uint64_t checkpoint_generation() override {
      return a_.plan_->live->checkpoint_generation_for(a_.node_, a_.replica_);
    }
    bool stop_requested() const override { return a_.plan_->live->get_run_phase() == run_phase::stopping; }
    bool draining() const override { return a_.plan_->live->get_run_phase() == run_phase::draining; }
    void thread_budget(int n) override {
      a_.requested_threads_ = std::max(1, n);
      a_.apply_thread_budget();
    }

   private:
    replica_actor_t& a_;
  };

  // -- node calls ------------------------------------------------------------------

  void ctx_emit(std::string_view port, payload msg) {
    std::uint32_t p = 0;
    while (p < np_.out_ports.size() && np_.out_ports[p].name != port) ++p;
    if (p == np_.out_ports.size()) {
      std::string names;
      for (const auto& op : np_.out_ports) names += (names.empty() ? "" : ", ") + op.name;
      throw std::invalid_argument("node '" + np_.spec.name + "' (kind " + np_.kind_name + ") has no out port '" +
                                  std::string(port) + "'" + (names.empty() ? " (it has none)" : "; out ports: " + names));
    }
    const port_plan& op = np_.out_ports[p];
    if (msg.empty())
      throw std::invalid_argument("node '" + np_.spec.name + "' emitted an empty payload on out port '" + op.name + "'");
    if (msg.type() != op.type)
      throw std::invalid_argument("node '" + np_.spec.name + "' emitted message type '" + std::string(msg.type()) +
                                  "' on out port '" + op.name + "', which carries '" + std::string(op.type) + "'");
    bool any = false;
    for (auto& e : out_edges_) {
      if (e.port != p) continue;
      any = true;
      staged_send s;
      s.edge = static_cast<std::uint32_t>(&e - out_edges_.data());
      if (e.mode == graph::dispatch_mode::split) {
        if (!msg.splittable())
          throw std::invalid_argument("node '" + np_.spec.name + "' emitted '" + std::string(msg.type()) +
                                      "' on edge " + plan_->edges[e.edge].name +
                                      " [dispatch=split], but that payload type cannot be split (declare "
                                      "payload_traits<T>::split, e.g. send a flowrun::actor::batch<T>)");
        s.parts = msg.split(e.links.size());
      } else {
        s.msg = msg;  // a handle copy
      }
      staged_.push_back(std::move(s));
    }
    if (!any) bump(counters_.dropped, 1);
  }

  // One scalar to the event file; a write that fails (a full disk) is logged once, and the
  // node's TensorBoard output ends there: training goes on.
  void write_tensorboard(std::string_view name, double value, std::int64_t step) {
    if (!tensorboard_) return;  // a failed write ended it
    if (!tb_written_) {  // said at the first scalar: a run that writes none (a finished step's rerun) hides nothing
      tb_written_ = true;
      ctx_log().info("TensorBoard event file {}", tensorboard_->path().string());
      // nothing hidden without a word: a fresh run into a folder of another run's events replaced that run's curves
      if (tensorboard_->follows_earlier_run())
        ctx_log().warn("TensorBoard: {} holds event files of an earlier run: TensorBoard shows this run from step {} "
                       "on and hides the earlier run's points from that step (their files stay; a resumed run "
                       "wants this). To compare two runs, give each its own tensorboard_path",
                       np_.tensorboard_dir, step);
    }
    tb_last_step_ = std::max(tb_last_step_, step);
    if (auto err = tensorboard_->scalar(name, value, step)) {
      ctx_log().error("TensorBoard output stops: {}", *err);
      tensorboard_.reset();
    }
  }


  spdlog::logger& ctx_log() {
    if (!logger_) {
      auto def = spdlog::default_logger();
      std::string n = np_.spec.name + "[" + std::to_string(replica_) + "]";
      // under `flowrun launch --nproc P` every process runs replica 0 of each node: its index tells them apart
      const char* nproc = std::getenv("FLOWRUN_NPROC");
      const char* pidx = std::getenv("FLOWRUN_PROCESS_INDEX");
      if (nproc && pidx && std::atoi(nproc) > 1) n = "p" + std::string(pidx) + ":" + n;
      logger_ = std::make_shared<spdlog::logger>(n, def->sinks().begin(), def->sinks().end());
      logger_->set_level(def->level());
    }
    return *logger_;
  }

  // -- local state --------------------------------------------------------------------

  struct out_link {
    caf::actor target;
    bool remote = false;  // the target runs in another process: payloads go as bytes
    std::uint32_t in_index = 0;  // the link's index at the receiver
    std::uint32_t peer = 0;      // the target's process (its bulk plane rank)
    std::uint32_t edge = 0;      // spec edge id (for errors)
    std::int64_t credit = 0, max_credit = 0;
    std::deque<envelope> backlog;  // staged messages waiting for credit
    // send times of the unacknowledged messages (ns since the job began): a ring of
    // max_credit entries, as no more can be in flight
    std::vector<std::int64_t> sent_ns;
    std::uint32_t sent_head = 0, sent_count = 0;
    link_counters* c = nullptr;
    bool blocked = false;
    clock_type::time_point blocked_since;
  };
  struct out_edge {
    std::uint32_t edge = 0;  // spec edge id
    std::uint32_t port = 0;  // index into np_.out_ports
    graph::dispatch_mode mode = graph::dispatch_mode::broadcast;
    std::vector<std::uint32_t> links;  // local out link indices, by consumer replica
    std::size_t rr_next = 0;
    std::uint64_t seq = 0;
    std::uint64_t origin = 0;
    std::uint32_t emitted = 0;  // messages staged in the current commit (broadcast)
  };
  struct in_link {
    std::uint32_t port = 0;  // index into np_.in_ports
    std::uint32_t edge = 0;
    graph::dispatch_mode mode = graph::dispatch_mode::broadcast;
    bool feedback = false;
    bool eos = false;
    caf::actor sender;
    std::uint32_t sender_out = 0;
    std::uint32_t pending_acks = 0;
    std::uint32_t ack_batch = 1;  // acks owed before they are sent while busy
    link_counters* c = nullptr;
  };
  struct ready_item {
    std::uint32_t port = 0;
    payload data;
    tag t;                             // inherited by the outputs (round_robin/split inputs only)
    std::uint32_t ack = 0;             // the in link to acknowledge once handled
    std::vector<std::uint32_t> more_acks;  // merged items: the other parts' in links
    template <class F>
    void for_each_ack(F&& f) const {
      f(ack);
      for (auto l : more_acks) f(l);
    }
  };
  struct staged_send {
    std::uint32_t edge = 0;      // index into out_edges_
    payload msg;                 // broadcast and round_robin edges
    std::vector<payload> parts;  // split edges: one per consumer replica
  };
  struct gather_seq {
    std::uint32_t parts = 1;
    std::uint32_t parts_done = 0;
    std::vector<std::vector<envelope>> by_part;
    std::vector<bool> part_done;
  };
  struct gather_stream {
    std::uint64_t next = 0;
    std::map<std::uint64_t, gather_seq> pending;
  };
  enum class phase { created, running, done, failed, stopped };

  // -- events -------------------------------------------------------------------------

  void on_init(caf::actor coordinator) {
    coordinator_ = std::move(coordinator);
    const job_plan& p = *plan_;
    std::unique_lock<std::mutex> table_lock(p.actors_mutex);
    if (p.actors.empty()) {  // released (release_part): the run ended before this replica was wired
      phase_ = phase::stopped;
      quit();
      return;
    }
    // Out links and edges.
    for (std::uint32_t id : p.out_links[node_][replica_]) {
      const link_plan& l = p.links[id];
      out_link ol;
      ol.target = p.actors[l.to_node][l.to_replica];
      ol.remote = ol.target && ol.target.node() != system().node();
      ol.in_index = l.in_index;
      ol.peer = p.process_of(l.to_node, l.to_replica);
      ol.edge = l.edge;
      ol.credit = ol.max_credit = p.edges[l.edge].credit;
      ol.sent_ns.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, ol.max_credit)), 0);
      ol.c = l.counters;
      out_links_.push_back(std::move(ol));
      auto it = std::find_if(out_edges_.begin(), out_edges_.end(), [&](const out_edge& e) { return e.edge == l.edge; });
      if (it == out_edges_.end()) {
        out_edge e;
        e.edge = l.edge;
        e.port = p.edges[l.edge].from_port;
        e.mode = p.edges[l.edge].mode;
        e.origin = (static_cast<std::uint64_t>(l.edge) + 1) << 32 | (replica_ + 1u);
        out_edges_.push_back(std::move(e));
        it = out_edges_.end() - 1;
      }
      it->links.push_back(static_cast<std::uint32_t>(out_links_.size() - 1));
    }
    // In links.
    for (std::uint32_t id : p.in_links[node_][replica_]) {
      const link_plan& l = p.links[id];
      in_link il;
      il.port = p.edges[l.edge].to_port;
      il.edge = l.edge;
      il.mode = p.edges[l.edge].mode;
      il.feedback = p.edges[l.edge].feedback;
      il.sender = p.actors[l.from_node][l.from_replica];
      il.sender_out = l.out_index;
      il.c = l.counters;
      il.ack_batch = static_cast<std::uint32_t>(std::max<std::int64_t>(1, p.edges[l.edge].credit / 4));
      in_links_.push_back(std::move(il));
    }
    table_lock.unlock();
    phase_ = phase::running;
    // The event file opens before start(), where training begins: a folder that cannot be
    // written stops the run now (not retried by a restart policy: it would fail alike). One writer, as
    // DeepSpeed's global rank 0: replica 0 of `flowrun launch`'s process 0 (every process runs replica 0
    // of each node, and each wrote its own event file into the folder: every point twice)
    if (!np_.tensorboard_dir.empty() && replica_ == 0 && launch_process_index() == 0) {
      auto w = flowrun::tensorboard::event_writer::open(np_.tensorboard_dir);
      if (!w) {
        fail(replica_name(*plan_, node_, replica_) + ": enable_tensorboard: " + w.error() +
             "; give tensorboard_path a writable folder, or set enable_tensorboard = false");
        return;
      }
      tensorboard_ = std::make_unique<flowrun::tensorboard::event_writer>(std::move(*w));
    }
    const auto t0 = now();
    bool ok = guarded("start", [&] {
      impl_ = np_.factory();
      if (!impl_) throw std::runtime_error("the factory of kind '" + np_.kind_name + "' returned no node");
      impl_->start(ctx_);
    });
    if (ok) {
      plan_->live->event("start", np_.spec.name, replica_,
                         "started in " + std::to_string(elapsed_ns(t0) / 1000000) + " ms");
      commit();
    }
  }

  void on_run() {
    running_ = true;
    pump();
  }

  void on_data(envelope& e) {
    if (e.link >= in_links_.size()) return;  // cannot happen: links are wired before data flows
    in_link& in = in_links_[e.link];
    bump(counters_.msgs_in, 1);
    bump(counters_.bytes_in, e.data.byte_size());
    if (phase_ != phase::running || finished_ || gave_up_) {
      // Failed, stopping, gave up, or past finish(): acknowledge and drop.
      bump(in.c->handled, 1);
      if (!e.t.tombstone) bump(counters_.dropped, 1);
      ++in.pending_acks;
      flush_acks();
      return;
    }
    if (in.mode == graph::dispatch_mode::broadcast && e.t.origin != 0) {
      gather(e);
    } else {
      ready_item item;
      item.port = in.port;
      item.data = std::move(e.data);
      if (in.mode != graph::dispatch_mode::broadcast) item.t = e.t;
      item.ack = e.link;
      ready_.push_back(std::move(item));
    }
    pump();
  }

  // A payload from another process: bytes and the tag's fields as integers
  // (origin, seq, part << 32 | parts, index, last | tombstone << 1).
  void on_remote_data(std::uint32_t link, const std::vector<std::uint64_t>& t, const std::string& type,
                      const std::vector<char>& bytes) {
    envelope e;
    e.link = link;
    if (t.size() == 5) {
      e.t.origin = t[0];
      e.t.seq = t[1];
      e.t.part = static_cast<std::uint32_t>(t[2] >> 32);
      e.t.parts = static_cast<std::uint32_t>(t[2] & 0xffffffffu);
      e.t.index = static_cast<std::uint32_t>(t[3]);
      e.t.last = (t[4] & 1u) != 0;
      e.t.tombstone = (t[4] & 2u) != 0;
    }
    if (!type.empty()) {
      expected<payload> p = error_text{"no payload"};
      if (has_bulk_codec(type)) {
        // header (tags, dtypes, shapes) + meta; the tensors come through the bulk plane
        try {
          if (!plan_->where.bulk) throw std::runtime_error("this process has no bulk plane");
          std::size_t at = 0;
          const bulk_header h = decode_bulk_header(bytes, at);
          const std::vector<char> meta(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end());
          const link_plan& lp = plan_->links[plan_->in_links[node_][replica_].at(link)];
          const auto from = static_cast<int>(plan_->process_of(lp.from_node, lp.from_replica));
          auto tensors = plan_->where.bulk->recv(from, h);
          p = decode_payload(type, meta, &tensors);
        } catch (const std::exception& ex) {
          p = error_text{"the tensors of a '" + type + "' payload did not arrive: " + ex.what()};
        }
      } else {
        p = decode_payload(type, bytes);
      }
      if (!p) {
        if (phase_ == phase::running) fail(replica_name(*plan_, node_, replica_) + " received from another process: " + p.error());
        return;
      }
      e.data = std::move(*p);
    }
    on_data(e);
  }

  // Sends to `to`, counting the message when it leaves the process.
  template <class... Ts>
  void send_counted(const caf::actor& to, Ts&&... xs) {
    if (to && to.node() != system().node()) bump_cross_control();
    send(to, std::forward<Ts>(xs)...);
  }
  static void bump_cross_control() { cross().control_msgs.fetch_add(1, std::memory_order_relaxed); }

  void on_ack(std::uint32_t out, std::uint32_t n) {
    if (out >= out_links_.size()) return;
    out_link& l = out_links_[out];
    l.credit += n;
    bump(l.c->acked, n);
    const std::uint32_t done = std::min(n, l.sent_count);
    l.sent_head = static_cast<std::uint32_t>((l.sent_head + done) % l.sent_ns.size());
    l.sent_count -= done;
    l.c->oldest_unacked_ns.store(l.sent_count ? l.sent_ns[l.sent_head] : -1, std::memory_order_relaxed);
    if (l.blocked) {
      l.blocked = false;
      bump(l.c->blocked_ns, elapsed_ns(l.blocked_since));
    }
    pump();
  }

  void on_eos(std::uint32_t in) {
    if (in < in_links_.size()) in_links_[in].eos = true;
    pump();
  }

  // Calls produce() while the source may (credit on every out edge, nothing
  // waiting to be sent), at most a few times per event so that control
  // messages are not held up.
  void on_produce() {
    produce_scheduled_ = false;
    if (produce_some()) pump();
  }

  // Up to produce_burst produce() calls; false when the replica failed.
  bool produce_some() {
    // a burst also ends after produce_burst_ms, so that a source whose produce() is a whole
    // training step gives its worker thread back (signals and other actors get scheduled)
    const auto burst_start = std::chrono::steady_clock::now();
    for (int i = 0; i < produce_burst; ++i) {
      if (i > 0 && std::chrono::steady_clock::now() - burst_start > std::chrono::milliseconds(produce_burst_ms)) break;
      if (phase_ != phase::running || paused_ || !wants_to_produce() || has_backlog() || !produce_credit()) break;
      if (plan_->steps > 0 && produced_ >= plan_->steps) {
        exhausted_ = true;
        break;
      }
      bool more = false;
      bool ok = guarded("produce", [&] { more = impl_->produce(ctx_); });
      if (!ok) return false;
      if (more) {
        ++produced_;
        bump(counters_.produced, 1);
      } else {
        exhausted_ = true;
      }
      commit();
    }
    return true;
  }

  // The coordinator's drain (on_interrupt): a source stops producing. On a cluster daemon the run's phase lives
  // on main, so this replica's part learns of the drain here (node_context::draining(): a trainer there commits
  // the update it stopped at, and cuts a held-out pass before training, as on main; they saw no drain before).
  void on_end() {
    // (a daemon's part never leaves `starting`: main's coordinator moves main's)
    if (const run_phase rp = plan_->live->get_run_phase(); rp == run_phase::starting || rp == run_phase::running)
      plan_->live->set_run_phase(run_phase::draining);
    if (np_.source) exhausted_ = true;
    pump();
  }

  void on_stop(stop_reason why) {
    reason_ = why;
    std::string error;
    if (impl_ && (phase_ == phase::running || phase_ == phase::done)) {
      auto t0 = fresh_now();
      set_state(replica_state::busy);
      apply_thread_budget();
      try {
        impl_->stop(ctx_);
      } catch (const std::exception& e) {
        error = replica_name(*plan_, node_, replica_) + " failed in stop: " + e.what();
      } catch (...) {
        error = replica_name(*plan_, node_, replica_) + " failed in stop: unknown exception";
      }
      fresh_now();
      bump(counters_.busy_ns, elapsed_ns(t0));
    }
    staged_.clear();  // emits made in stop() are dropped: downstream may be gone
    close_blocked();
    const bool failed = phase_ == phase::failed;
    phase_ = phase::stopped;
    if (!failed) publish_state();  // a failed replica keeps showing "failed" (with its reason)
    if (coordinator_) send_counted(coordinator_, stopped_atom::value, node_, replica_, std::move(error));
    quit();
  }

  // -- the pump: everything that can make progress, does ---------------------------

  void pump() {
    // A source with nothing else to do produces right here, a few bursts per
    // event; otherwise (messages waiting) it sends itself a produce message,
    // so that control and data messages are never held up for long.
    for (int round = 0;; ++round) {
      if (!pump_once()) return;
      if (round >= 3 || !wants_to_produce() || produce_scheduled_ || has_backlog() || !produce_credit() ||
          !mailbox().empty())
        break;
      if (!produce_some()) return;
    }
    if (phase_ == phase::running && wants_to_produce() && !produce_scheduled_ && !has_backlog() && produce_credit()) {
      produce_scheduled_ = true;
      send(caf::actor_cast<caf::actor>(this), produce_atom::value);
    }
  }

  // Handles what is queued, finishes when the input ended, sends acks and
  // end-of-stream. Returns false when the replica is no longer running.
  bool pump_once() {
    if (phase_ != phase::running || !running_ || gave_up_) return false;
    flush();
    if (paused_) {  // the console paused the run: nothing is handled or produced until resume
      flush_acks();
      return false;
    }
    for (;;) {
      if (has_backlog()) break;
      if (!ready_.empty()) {
        handle_next();
        if (phase_ != phase::running) return false;
        continue;
      }
      if (!finished_ && all_eos() && !gathers_empty()) {
        // Every upstream replica ended, yet some gathered stream has holes
        // (an upstream replica failed mid-sequence): hand on what arrived, in order.
        spdlog::warn("{}: gathered streams incomplete at end of input; delivering what arrived",
                     replica_name(*plan_, node_, replica_));
        force_release();
        continue;
      }
      if (!finished_ && inputs_ended()) {
        bool held = false;  // the node waits for feedback first (node::awaits_feedback)
        if (!guarded("awaits_feedback", [&] { held = impl_->awaits_feedback(ctx_); })) return false;
        if (held) {
          commit();
          break;
        }
        finished_ = true;
        bool ok = guarded("finish", [&] { impl_->finish(ctx_); });
        if (!ok) return false;
        commit();
        continue;
      }
      break;
    }
    flush_acks();
    const bool blocked = has_backlog() || (wants_to_produce() && !produce_credit());
    if (blocked && !node_blocked_) {
      node_blocked_ = true;
      node_blocked_since_ = now();
      mark_produce_blocked_links();
    } else if (!blocked && node_blocked_) {
      node_blocked_ = false;
      bump(counters_.blocked_ns, elapsed_ns(node_blocked_since_));
    } else if (blocked) {
      mark_produce_blocked_links();
    }
    if (finished_ && !has_backlog()) {
      end_stream();
      return false;
    }
    return true;
  }

  // The replica is done: end of stream on every out link, `done` to the coordinator.
  void end_stream() {
    for (auto& l : out_links_) send_counted(l.target, eos_atom::value, l.in_index);
    phase_ = phase::done;
    close_blocked();
    send_counted(coordinator_, done_atom::value, node_, replica_);
  }

  bool wants_to_produce() const { return np_.source && !exhausted_ && !finished_ && !waiting_input_ && !gave_up_; }

  bool has_backlog() const {
    for (const auto& l : out_links_)
      if (!l.backlog.empty()) return true;
    return false;
  }

  // A source may produce when every out edge can take a message: all links
  // of broadcast and split edges, the next link of a round_robin edge.
  bool produce_credit() const {
    for (const auto& e : out_edges_) {
      if (e.mode == graph::dispatch_mode::round_robin) {
        if (out_links_[e.links[e.rr_next]].credit <= 0) return false;
      } else {
        for (auto l : e.links)
          if (out_links_[l].credit <= 0) return false;
      }
    }
    return true;
  }

  void mark_produce_blocked_links() {
    if (!wants_to_produce()) return;
    auto mark = [&](out_link& l) {
      if (l.credit <= 0 && !l.blocked) {
        l.blocked = true;
        l.blocked_since = now();
      }
    };
    for (auto& e : out_edges_) {
      if (e.mode == graph::dispatch_mode::round_robin) mark(out_links_[e.links[e.rr_next]]);
      else
        for (auto l : e.links) mark(out_links_[l]);
    }
  }

  bool all_eos() const {
    for (const auto& in : in_links_)
      if (!in.feedback && !in.eos) return false;
    return true;
  }

  bool inputs_ended() const {
    if (np_.source && !exhausted_) return false;
    return all_eos() && ready_.empty() && gathers_empty();
  }

  bool gathers_empty() const {
    for (const auto& [key, g] : gathers_)
      if (!g.pending.empty()) return false;
    return true;
  }

  void handle_next() {
    ready_item item = std::move(ready_.front());
    ready_.pop_front();
    item.for_each_ack([&](std::uint32_t l) { bump(in_links_[l].c->handled, 1); });
    cur_tag_ = item.t;
    waiting_input_ = false;  // a message arrived: a waiting source may produce again
    const std::string& port = np_.in_ports[item.port].name;
    bool ok = guarded("on_message", [&] { impl_->on_message(ctx_, port, item.data); });
    item.for_each_ack([&](std::uint32_t l) { ++in_links_[l].pending_acks; });
    if (ok) {
      bump(counters_.handled, 1);
      commit();
    }
    cur_tag_ = tag{};
  }

  // -- gathering the outputs of a round_robin/split group, in order ------------------

  void gather(envelope& e) {
    const in_link& in = in_links_[e.link];
    gather_stream& g = gathers_[{in.edge, e.t.origin}];
    if (e.t.seq < g.next) {  // cannot happen (duplicate); keep the credit flowing
      bump(in.c->handled, 1);
      ++in_links_[e.link].pending_acks;
      return;
    }
    gather_seq& s = g.pending[e.t.seq];
    if (s.by_part.empty()) {
      s.parts = std::max<std::uint32_t>(1, e.t.parts);
      s.by_part.resize(s.parts);
      s.part_done.assign(s.parts, false);
    }
    const std::uint32_t part = std::min(e.t.part, s.parts - 1);
    const bool last = e.t.last;
    s.by_part[part].push_back(std::move(e));
    if (last && !s.part_done[part]) {
      s.part_done[part] = true;
      ++s.parts_done;
    }
    // Release every complete sequence number, in order.
    for (auto it = g.pending.find(g.next); it != g.pending.end() && it->second.parts_done == it->second.parts;
         it = g.pending.find(g.next)) {
      release(it->second);
      g.pending.erase(it);
      ++g.next;
    }
  }

  void release(gather_seq& s) {
    // Merge the parts of a split when each gave exactly one mergeable message.
    bool merge = s.parts > 1;
    for (const auto& part : s.by_part) {
      std::size_t real = 0;
      for (const auto& e : part) real += e.t.tombstone ? 0 : 1;
      if (real != 1) merge = false;
    }
    for (const auto& part : s.by_part)
      for (const auto& e : part)
        if (!e.t.tombstone && !e.data.mergeable()) merge = false;
    if (merge) {
      ready_item item;
      std::vector<payload> parts;
      for (auto& part : s.by_part)
        for (auto& e : part) {
          if (e.t.tombstone) {
            ack_now(e.link);
            continue;
          }
          item.port = in_links_[e.link].port;
          if (parts.empty()) item.ack = e.link;
          else item.more_acks.push_back(e.link);
          parts.push_back(std::move(e.data));
        }
      item.data = payload::merge(parts);
      ready_.push_back(std::move(item));
      return;
    }
    for (auto& part : s.by_part) {
      std::sort(part.begin(), part.end(), [](const envelope& a, const envelope& b) { return a.t.index < b.t.index; });
      for (auto& e : part) {
        if (e.t.tombstone) {
          ack_now(e.link);
          continue;
        }
        ready_item item;
        item.port = in_links_[e.link].port;
        item.data = std::move(e.data);
        item.ack = e.link;
        ready_.push_back(std::move(item));
      }
    }
  }

  void force_release() {
    for (auto& [key, g] : gathers_) {
      for (auto& [seq, s] : g.pending) release(s);
      g.pending.clear();
    }
  }

  void ack_now(std::uint32_t link) {
    bump(in_links_[link].c->handled, 1);
    ++in_links_[link].pending_acks;
  }

  // -- sending ----------------------------------------------------------------------------

  // Turns the staged emits into envelopes on the out links' backlogs, then
  // sends what the credit allows.
  void commit() {
    if (staged_.empty() && cur_tag_.origin == 0) return;
    const bool inherit = cur_tag_.origin != 0;
    for (auto& e : out_edges_) e.emitted = 0;
    for (auto& s : staged_) {
      out_edge& e = out_edges_[s.edge];
      switch (e.mode) {
        case graph::dispatch_mode::broadcast:
          for (auto l : e.links) {
            envelope env;
            env.link = out_links_[l].in_index;
            if (inherit) {
              env.t = cur_tag_;
              env.t.index = e.emitted;
              env.t.last = false;
              env.t.tombstone = false;
            }
            env.data = (l == e.links.back()) ? std::move(s.msg) : s.msg;
            out_links_[l].backlog.push_back(std::move(env));
          }
          ++e.emitted;
          break;
        case graph::dispatch_mode::round_robin: {
          const auto l = e.links[e.rr_next];
          e.rr_next = (e.rr_next + 1) % e.links.size();
          envelope env;
          env.link = out_links_[l].in_index;
          env.t = tag{e.origin, e.seq++, 0, 1, 0, true, false};
          env.data = std::move(s.msg);
          out_links_[l].backlog.push_back(std::move(env));
          break;
        }
        case graph::dispatch_mode::split: {
          const std::uint64_t seq = e.seq++;
          const auto n = static_cast<std::uint32_t>(e.links.size());
          for (std::uint32_t p = 0; p < n; ++p) {
            envelope env;
            env.link = out_links_[e.links[p]].in_index;
            env.t = tag{e.origin, seq, p, n, 0, true, false};
            env.data = std::move(s.parts[p]);
            out_links_[e.links[p]].backlog.push_back(std::move(env));
          }
          break;
        }
      }
    }
    if (inherit) {
      // Every broadcast edge tells the gatherer downstream that this (seq, part) is complete.
      for (auto& e : out_edges_) {
        if (e.mode != graph::dispatch_mode::broadcast) continue;
        for (auto l : e.links) {
          if (e.emitted == 0) {
            envelope env;
            env.link = out_links_[l].in_index;
            env.t = cur_tag_;
            env.t.index = 0;
            env.t.last = true;
            env.t.tombstone = true;
            out_links_[l].backlog.push_back(std::move(env));
          } else {
            out_links_[l].backlog.back().t.last = true;
          }
        }
      }
    }
    staged_.clear();
    flush();
  }

  // Sends what the credit allows. Nothing leaves before `run`: until then
  // some receivers may not have been wired yet (emits of start() wait).
  void flush() {
    if (!running_) return;
    for (auto& l : out_links_) {
      while (l.credit > 0 && !l.backlog.empty()) {
        envelope env = std::move(l.backlog.front());
        l.backlog.pop_front();
        --l.credit;
        const std::size_t bytes = env.data.byte_size();
        bump(l.c->bytes, bytes);
        bump(l.c->sent, 1);
        const auto in_flight = static_cast<std::uint64_t>(l.max_credit - l.credit);
        if (in_flight > l.c->max_in_flight.load(std::memory_order_relaxed))
          l.c->max_in_flight.store(in_flight, std::memory_order_relaxed);
        bump(counters_.msgs_out, 1);
        bump(counters_.bytes_out, bytes);
        note_sent(l);
        if (l.remote) {
          send_remote(l, env);
          if (phase_ != phase::running) return;
        } else {
          send(l.target, data_atom::value, std::move(env));
        }
      }
      if (!l.backlog.empty() && !l.blocked) {
        l.blocked = true;
        l.blocked_since = now();
      }
    }
  }

  // A data message to another process: the payload's bytes (payload_codec.h),
  // never floats or handles. A type without a codec fails the replica (launch
  // refuses such graphs up front, so this is a safety net).
  void send_remote(out_link& l, const envelope& env) {
    std::vector<char> bytes;
    std::string type;
    if (!env.data.empty()) {
      std::vector<tensor> tensors;
      const bool bulk = has_bulk_codec(env.data.type());
      auto enc = encode_payload(env.data, bulk ? &tensors : nullptr);
      if (!enc) {
        fail(replica_name(*plan_, node_, replica_) + " cannot send on edge " + plan_->edges[l.edge].name +
             " to cluster node '" + plan_->where.processes[l.peer] + "': " + enc.error());
        return;
      }
      if (bulk) {
        // The tensors go through the bulk plane (never inside CAF); the message
        // carries their tags, dtypes and shapes ahead of the codec's bytes.
        try {
          if (!plan_->where.bulk) throw std::runtime_error("this process has no bulk plane");
          encode_bulk_header(plan_->where.bulk->send(static_cast<int>(l.peer), tensors), bytes);
        } catch (const std::exception& ex) {
          fail(replica_name(*plan_, node_, replica_) + " cannot send a '" + std::string(env.data.type()) +
               "' payload to another process: " + ex.what());
          return;
        }
        bytes.insert(bytes.end(), enc->begin(), enc->end());
      } else {
        bytes = std::move(*enc);
      }
      type = std::string(env.data.type());
    }
    const auto& t = env.t;
    std::vector<std::uint64_t> tag_fields{t.origin, t.seq, static_cast<std::uint64_t>(t.part) << 32 | t.parts, t.index,
                                          (t.last ? 1u : 0u) | (t.tombstone ? 2u : 0u)};
    cross().data_msgs.fetch_add(1, std::memory_order_relaxed);
    cross().data_bytes.fetch_add(bytes.size(), std::memory_order_relaxed);
    // (CAF 0.17 has no built-in std::vector<uint64_t>: the tag goes as plain integers)
    send(l.target, rdata_atom::value, l.in_index, tag_fields[0], tag_fields[1], tag_fields[2],
         tag_fields[3] << 8 | tag_fields[4], std::move(type), std::move(bytes));
  }

  // Sends the acknowledgements owed. To save messages under load, a link's
  // acks wait until a quarter of its credit is owed, unless the actor has no
  // more messages queued (or `force`); a self message flushes what waited.
  void flush_acks(bool force = false) {
    const bool idle = force || phase_ != phase::running || mailbox().empty();
    bool deferred = false;
    for (auto& in : in_links_) {
      if (in.pending_acks == 0) continue;
      if (!idle && in.pending_acks < in.ack_batch) {
        deferred = true;
        continue;
      }
      send_counted(in.sender, ack_atom::value, in.sender_out, in.pending_acks);
      in.pending_acks = 0;
    }
    if (deferred && !ack_flush_scheduled_) {
      ack_flush_scheduled_ = true;
      send(caf::actor_cast<caf::actor>(this), flush_atom::value);
    }
  }

  void close_blocked() {
    for (auto& l : out_links_)
      if (l.blocked) {
        l.blocked = false;
        bump(l.c->blocked_ns, elapsed_ns(l.blocked_since));
      }
    if (node_blocked_) {
      node_blocked_ = false;
      bump(counters_.blocked_ns, elapsed_ns(node_blocked_since_));
    }
  }

  // The clock is read at most once per event plus once after each call into
  // the node (clock reads are a visible cost at a million messages a second).
  clock_type::time_point now() {
    if (!now_valid_) {
      now_ = clock_type::now();
      now_valid_ = true;
    }
    return now_;
  }
  clock_type::time_point fresh_now() {
    now_ = clock_type::now();
    now_valid_ = true;
    return now_;
  }
  std::uint64_t elapsed_ns(clock_type::time_point since) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now() - since).count());
  }
  // Remembers when a message left on `l` (the console's outstanding-request ages).
  void note_sent(out_link& l) {
    const auto cap = static_cast<std::uint32_t>(l.sent_ns.size());
    if (l.sent_count == cap) {  // cannot happen (in flight <= credit); keep the newest
      l.sent_head = (l.sent_head + 1) % cap;
      --l.sent_count;
    }
    std::uint32_t at = l.sent_head + l.sent_count;
    if (at >= cap) at -= cap;
    l.sent_ns[at] = ns_since_start(now());
    if (++l.sent_count == 1) l.c->oldest_unacked_ns.store(l.sent_ns[at], std::memory_order_relaxed);
  }

  std::int64_t ns_since_start(clock_type::time_point t) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - plan_->metrics->start()).count();
  }

  // -- the live state the console shows (live.h) ---------------------------------------

  void set_state(replica_state s) { live_.set_state(s, ns_since_start(now())); }

  // The state between events: what the replica waits for.
  void publish_state() {
    switch (phase_) {
      case phase::created: set_state(replica_state::initializing); return;
      case phase::failed: set_state(replica_state::failed); return;
      case phase::done: set_state(replica_state::done); return;
      case phase::stopped: set_state(replica_state::stopped); return;
      case phase::running: break;
    }
    if (paused_) set_state(replica_state::paused);
    else if (node_blocked_ || has_backlog()) set_state(replica_state::waiting_credit);
    else if (np_.source && waiting_input_ && !exhausted_ && !finished_) set_state(replica_state::waiting_request);
    else set_state(replica_state::idle);
  }

  // -- supervision ---------------------------------------------------------------------------

  // The OpenMP team of the node's ops on this thread (node_context::thread_budget): what the
  // node asked for, else every hardware thread, at most the node's `threads` key. Set before
  // every call into the node, since event-based replicas share CAF's worker threads.
  void apply_thread_budget() {
    int n = requested_threads_ > 0 ? requested_threads_ : ops::hardware_threads();
    if (np_.spec.threads > 0) n = static_cast<int>(std::min<std::int64_t>(n, np_.spec.threads));
    ops::set_thread_budget(n);
  }

  // Waiting for input (replica_counters::wait_ns): the time from the end of one call into the
  // node to the start of the next, less the time blocked on credit in between.
  void note_wait_start() {
    idle_since_ = now();
    idle_blocked_ns_ = counters_.blocked_ns.load(std::memory_order_relaxed);
    idle_valid_ = true;
  }
  void note_wait_end(clock_type::time_point t0) {
    if (!idle_valid_) return;
    idle_valid_ = false;
    const auto gap = static_cast<std::int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - idle_since_).count());
    const auto blocked =
        static_cast<std::int64_t>(counters_.blocked_ns.load(std::memory_order_relaxed) - idle_blocked_ns_);
    if (gap > blocked) bump(counters_.wait_ns, static_cast<std::uint64_t>(gap - blocked));
  }

  // Runs `f` (a call into the node). On an exception: discard its emits and,
  // per the restart policy, make a fresh node, start it and run `f` again;
  // or fail for good. Returns true once `f` returned normally.
  template <class F>
  bool guarded(const char* what, F&& f) {
    for (;;) {
      std::string why;
      bool gave_way = false;  // the node threw node.h `stopped`
      auto t0 = now();
      note_wait_end(t0);
      set_state(phase_ == phase::running && impl_ ? replica_state::busy : replica_state::initializing);
      apply_thread_budget();
      try {
        {
          ops::compute_scope sharing;  // nodes busy at once split the cores (runtime/kernels/compute_scope.h)
          f();
        }
        fresh_now();
        bump(counters_.busy_ns, elapsed_ns(t0));
        note_wait_start();
        return true;
      } catch (const stopped& e) {
        why = e.what();
        gave_way = true;
      } catch (const std::exception& e) {
        why = e.what();
      } catch (...) {
        why = "unknown exception";
      }
      fresh_now();
      bump(counters_.busy_ns, elapsed_ns(t0));
      note_wait_start();
      staged_.clear();
      waiting_input_ = false;
      // node.h `stopped`: gave up, not failed; while the run stops, any exception; while it drains, `stopped` only
      // (a call with nothing to keep that would hold the drain up: the held-out pass before training)
      const run_phase rp = plan_->live->get_run_phase();
      if (rp == run_phase::stopping || (gave_way && rp == run_phase::draining)) {
        ctx_log().info("{} gave up in {} as the run {}{}", replica_name(*plan_, node_, replica_), what,
                       rp == run_phase::draining ? "drains" : "stops", gave_way ? "" : " (" + why + ")");
        give_up(std::string_view(what).substr(0, 5) == "start");
        return false;
      }
      if (!restart(what, why)) return false;
    }
  }

  // A call gave up as the run stops: the replica handles, produces and finishes nothing more (what is
  // queued is acknowledged and dropped, as after fail()). A node whose start() gave up is discarded, so
  // stop() is not called on a node that never started: a rank that refused a resume kept handling the
  // batches queued for it and waited in a collective for its refused peer until comm_timeout_s.
  void give_up(bool in_start) {
    gave_up_ = true;
    if (in_start) impl_.reset();
    hand_back_queued();
    // in a drain (node.h `stopped` thrown: nothing to keep) the replica ends as a finished one does, without
    // finish(): end of stream downstream, `done` to the coordinator, which waited for it for ever. What it had
    // not yet sent is dropped with it (a start() that gave up has sent nothing)
    if (plan_->live->get_run_phase() == run_phase::draining && phase_ == phase::running) {
      for (auto& l : out_links_) l.backlog.clear();
      end_stream();
    }
  }

  // Makes a fresh node and starts it; false (after fail()) when the policy
  // allows no more restarts.
  bool restart(const char* what, std::string why) {
    for (;;) {
      if (np_.policy.when != restart_policy::mode::on_failure || restarts_ >= np_.policy.max_restarts) {
        std::string detail = np_.policy.when != restart_policy::mode::on_failure
                                 ? "restart = \"never\""
                                 : "no restarts left: " + std::to_string(restarts_) + " of " +
                                       std::to_string(np_.policy.max_restarts) + " used";
        fail(replica_name(*plan_, node_, replica_) + " failed in " + what + ": " + why + " (" + detail + ")");
        return false;
      }
      ++restarts_;
      bump(counters_.restarts, 1);
      spdlog::warn("{} failed in {}: {}; restarting ({} of {})", replica_name(*plan_, node_, replica_), what, why,
                   restarts_, np_.policy.max_restarts);
      live_.note_error(plan_->live->now_s(), std::string(what) + ": " + why);
      plan_->live->event("restart", np_.spec.name, replica_,
                         "restart " + std::to_string(restarts_) + " of " + std::to_string(np_.policy.max_restarts) +
                             " after a failure in " + what + ": " + why);
      auto t0 = fresh_now();
      set_state(replica_state::restarting);
      try {
        impl_.reset();
        impl_ = np_.factory();
        if (!impl_) throw std::runtime_error("the factory of kind '" + np_.kind_name + "' returned no node");
        impl_->start(ctx_);
        fresh_now();
        bump(counters_.busy_ns, elapsed_ns(t0));
        return true;  // start()'s emits stay staged, ahead of the retried call's
      } catch (const stopped&) {
        // gave way as the run drains or stops (guarded's rule): not another failure, which used the restarts up
        // and failed the run (exit 1 where the signal's was due)
        const run_phase rp = plan_->live->get_run_phase();
        if (rp == run_phase::draining || rp == run_phase::stopping) {
          fresh_now();
          bump(counters_.busy_ns, elapsed_ns(t0));
          staged_.clear();
          ctx_log().info("{} gave up in start (after a restart) as the run {}", replica_name(*plan_, node_, replica_),
                         rp == run_phase::draining ? "drains" : "stops");
          give_up(true);
          return false;
        }
        why = stopped{}.what();
      } catch (const std::exception& e) {
        why = e.what();
      } catch (...) {
        why = "unknown exception";
      }
      fresh_now();
      bump(counters_.busy_ns, elapsed_ns(t0));
      staged_.clear();
      what = "start (after a restart)";
    }
  }

  // Hands back the credit of everything queued (ready items, parts waiting in a gather) and drops it, so that
  // upstream does not wait on a replica that handles nothing more (fail(), give_up()).
  void hand_back_queued() {
    for (auto& item : ready_)
      item.for_each_ack([&](std::uint32_t l) { ack_now(l); });
    ready_.clear();
    for (auto& [key, g] : gathers_)
      for (auto& [seq, s] : g.pending)
        for (auto& part : s.by_part)
          for (auto& e : part) ack_now(e.link);
    gathers_.clear();
    flush_acks();
  }

  void fail(std::string message) {
    phase_ = phase::failed;
    live_.note_error(plan_->live->now_s(), message);
    live_.set_failure(message);
    plan_->live->event("failed", np_.spec.name, replica_, message);
    set_state(replica_state::failed);
    staged_.clear();
    hand_back_queued();
    close_blocked();
    // Not logged here: the run's error is the first failure, reported by whoever runs the job.
    send_counted(coordinator_, fail_atom::value, node_, replica_, std::move(message));
  }

  // -- members ---------------------------------------------------------------------------------

  std::shared_ptr<job_plan> plan_;
  std::uint32_t node_, replica_;
  const node_plan& np_;
  replica_counters& counters_;
  replica_live& live_;
  caf::actor coordinator_;
  std::unique_ptr<flowrun::actor::node> impl_;
  std::shared_ptr<spdlog::logger> logger_;
  std::unique_ptr<flowrun::tensorboard::event_writer> tensorboard_;  // replica 0 with enable_tensorboard
  std::int64_t tb_last_step_ = -1;  // the largest step written to TensorBoard (-1: none yet)
  bool tb_written_ = false;         // a scalar was written (the file's name and an earlier run said then)
  std::vector<std::pair<std::string, double>> tb_held_;  // held-out values before any step: written at 0 with the first

  std::vector<out_link> out_links_;
  std::vector<out_edge> out_edges_;
  std::vector<in_link> in_links_;
  std::deque<ready_item> ready_;
  std::map<std::pair<std::uint32_t, std::uint64_t>, gather_stream> gathers_;
  std::vector<staged_send> staged_;
  tag cur_tag_;
  context ctx_;

  phase phase_ = phase::created;
  stop_reason reason_ = stop_reason::running;
  bool running_ = false;
  bool gave_up_ = false;  // give_up(): a call gave up as the run stops
  bool exhausted_ = false;
  bool finished_ = false;
  bool waiting_input_ = false;
  bool produce_scheduled_ = false;
  bool ack_flush_scheduled_ = false;
  bool node_blocked_ = false;
  clock_type::time_point node_blocked_since_;
  clock_type::time_point now_;
  bool now_valid_ = false;
  std::int64_t restarts_ = 0;
  std::int64_t produced_ = 0;
  bool paused_ = false;
  int requested_threads_ = 0;  // node_context::thread_budget (0: not asked)
  clock_type::time_point idle_since_;  // the end of the last call into the node (note_wait_start)
  std::uint64_t idle_blocked_ns_ = 0;  // counters_.blocked_ns then
  bool idle_valid_ = false;
  std::string last_phase_;
  std::uint64_t checkpoint_seen_ = 0;
};

// A replica of a kind that runs on CAF's scheduler.
class replica_actor final : public replica_actor_t<caf::event_based_actor> {
 public:
  using replica_actor_t::replica_actor_t;
  caf::behavior make_behavior() override { return handlers(); }
};

// A replica of a blocking kind, on a thread of its own: handles one message at a time until it quits.
class blocking_replica_actor final : public replica_actor_t<caf::blocking_actor> {
 public:
  using replica_actor_t::replica_actor_t;
  void act() override {
    caf::behavior b = handlers();
    try {
      while (!quit_) receive(b);
    } catch (...) {
      fail_state(exception_error(std::current_exception()));
    }
  }
};

// -- the coordinator ---------------------------------------------------------------------------------

class coordinator_actor final : public caf::event_based_actor {
 public:
  coordinator_actor(caf::actor_config& cfg, std::shared_ptr<job_plan> plan)
      : caf::event_based_actor(cfg), plan_(std::move(plan)) {}

  const char* name() const override { return "flowrun_coordinator"; }

  // Whatever ends the coordinator (finish(), or an exception in a handler), the plan's table of
  // replica handles goes with it, as in finish(): the cycle plan -> actors -> plan is broken.
  void on_exit() override {
    if (plan_) {
      std::lock_guard<std::mutex> lock(plan_->actors_mutex);
      plan_->actors.clear();
    }
    replica_of_.clear();
    caf::event_based_actor::on_exit();
  }

  caf::behavior make_behavior() override {
    const job_plan& p = *plan_;
    for (std::uint32_t n = 0; n < p.nodes.size(); ++n) {
      status_.emplace_back(p.nodes[n].replicas);
      total_ += p.nodes[n].replicas;
    }
    set_down_handler([this](caf::down_msg& dm) { on_down(dm); });
    plan_->live->set_run_phase(run_phase::running);
    plan_->live->event("run", "", -1, "running: " + std::to_string(total_) + " replicas of " +
                                          std::to_string(p.nodes.size()) + " nodes");
    auto me = caf::actor_cast<caf::actor>(this);
    for (std::uint32_t n = 0; n < p.actors.size(); ++n)
      for (std::uint32_t r = 0; r < p.actors[n].size(); ++r) {
        monitor(p.actors[n][r]);
        replica_of_.emplace(p.actors[n][r].address(), std::make_pair(n, r));
      }
    for (auto& row : plan_->actors)
      for (auto& a : row) send_counted(a, init_atom::value, me);
    for (auto& row : plan_->actors)
      for (auto& a : row) send_counted(a, run_atom::value);
    if (total_ == 0) finish();
    return {
        [this](done_atom, std::uint32_t n, std::uint32_t r) {
          auto& s = status_[n][r];
          if (s.done) return;
          s.done = true;
          if (++done_ == total_ && phase_ < phase::stopping)
            begin_stop(interrupts_ > 0 ? stop_reason::interrupted : stop_reason::completed);
        },
        [this](fail_atom, std::uint32_t, std::uint32_t, std::string& why) {
          if (phase_ >= phase::stopping) {
            report(std::move(why));
            return;
          }
          set_error(why);
          begin_stop(stop_reason::failed);
        },
        [this](interrupt_atom, std::int32_t sig) { on_interrupt(sig); },
        [this](drain_report_atom) { report_drain(); },
        [this](pause_atom) { set_paused(true); },
        [this](resume_atom) { set_paused(false); },
        [this](stopped_atom, std::uint32_t n, std::uint32_t r, std::string& err) {
          if (!err.empty()) report(std::move(err));
          mark_stopped(n, r);
        },
        [this](node_lost_atom, std::uint32_t process, std::string& why) { lose_process(process, why); },
    };
  }

 private:
  enum class phase { running, draining, stopping, finished };
  struct replica_status {
    bool done = false;
    bool stopped = false;
  };

  void set_error(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    exit_code_ = exit_failed;
  }

  template <class... Ts>
  void send_counted(const caf::actor& to, Ts&&... xs) {
    if (to && to.node() != system().node()) cross().control_msgs.fetch_add(1, std::memory_order_relaxed);
    send(to, std::forward<Ts>(xs)...);
  }

  // A cluster node is gone (no heartbeat, or its connection dropped): its
  // replicas will never answer, so they count as stopped; the run stops
  // (on_node_lost = "stop"), and the other replicas' stop() runs as usual.
  void lose_process(std::uint32_t process, const std::string& why) {
    const auto& w = plan_->where;
    if (w.where.empty() || process >= w.processes.size() || process == w.self) return;
    if (!lost_.insert(process).second) return;
    plan_->state->mark_lost(process);
    std::string names;
    for (std::uint32_t n = 0; n < plan_->nodes.size(); ++n)
      for (std::uint32_t r = 0; r < plan_->nodes[n].replicas; ++r) {
        if (w.where[n][r] != process) continue;
        const auto& np = plan_->nodes[n];
        names += (names.empty() ? "" : ", ") + np.spec.name + (np.replicas > 1 ? "[" + std::to_string(r) + "]" : "");
        if (!status_[n][r].stopped) {
          plan_->live->event("lost", np.spec.name, static_cast<std::int64_t>(r), "lost with cluster node '" + w.processes[process] + "'");
          mark_stopped(n, r);
        }
      }
    std::string msg = "cluster node '" + w.processes[process] + "' lost (" + why + "); its actors: " +
                      (names.empty() ? std::string("none") : names) +
                      (w.on_node_lost == "restart"
                           ? std::string("; the run stops and starts again from its checkpoints (on_node_lost = "
                                         "\"restart\"): the other nodes' stop() runs first, so what they checkpoint "
                                         "is intact")
                           : (w.restarts_used_up >= 0
                                  ? "; the run stops (on_node_lost = \"restart\", but max_restarts = " +
                                        std::to_string(w.restarts_used_up) + " are used up)"
                                  : std::string("; the run stops (on_node_lost = \"stop\")")) +
                                 ": the other nodes' stop() runs, so what they checkpoint is intact");
    plan_->live->event("run", "", -1, msg);
    report(std::move(msg));
    if (phase_ < phase::stopping) begin_stop(stop_reason::failed);
    else if (phase_ == phase::stopping && stopped_ == total_) finish();
  }

  // The first error becomes the run's (its caller reports it); later ones are logged.
  void report(std::string why) {
    if (error_.empty()) set_error(std::move(why));
    else spdlog::error("{}", why);
    exit_code_ = exit_failed;
  }

  // The console's pause and resume: forwarded to every replica.
  void set_paused(bool on) {
    if (on == paused_ || phase_ >= phase::stopping || (on && phase_ != phase::running)) return;
    paused_ = on;
    for (auto& row : plan_->actors)
      for (auto& a : row) {
        if (on) send_counted(a, pause_atom::value);
        else send_counted(a, resume_atom::value);
      }
    plan_->live->set_run_phase(on                            ? run_phase::paused
                               : phase_ == phase::draining ? run_phase::draining
                                                           : run_phase::running);
    plan_->live->event(on ? "pause" : "resume", "", -1,
                       on ? "paused: no message is handled, no source produces" : "resumed");
  }

  void on_interrupt(std::int32_t sig) {
    ++interrupts_;
    const bool console = sig == 0;  // the console's stop (interrupt()): SIGINT's drain and exit code
    signal_ = console ? SIGINT : sig;
    const std::string who = console ? "the console's stop" : "signal " + std::to_string(sig);
    set_paused(false);  // a paused pipeline could not drain
    plan_->live->event("run", "", -1, who + (phase_ == phase::running ? ": draining" : ": stopping without draining"));
    if (phase_ == phase::running) {
      phase_ = phase::draining;
      plan_->live->set_run_phase(run_phase::draining);
      spdlog::warn("{}: draining (sources stop; in-flight messages are handled); {} to stop now", who,
                   console ? "a second stop (or Ctrl-C)" : "again");
      for (std::uint32_t n = 0; n < plan_->nodes.size(); ++n)
        if (plan_->nodes[n].source)
          for (auto& a : plan_->actors[n]) send_counted(a, end_atom::value);
      drain_began_ = std::chrono::steady_clock::now();
      delayed_send(this, k_drain_report, drain_report_atom::value);
    } else if (phase_ == phase::draining) {
      spdlog::warn("{}: stopping without draining; a third signal exits at once (a node blocked in a collective "
                   "waits out comm_timeout_s otherwise; the last committed checkpoint stays)",
                   who);
      begin_stop(stop_reason::interrupted);
    }
  }

  // While a drain lasts, every k_drain_report: the replicas still inside a call (a node waiting
  // on a hung reward command drains only when its timeout ends), and how to stop now.
  void report_drain() {
    if (phase_ != phase::draining) return;
    const std::int64_t now = plan_->live->now_ns();
    std::string busy;
    for (std::uint32_t n = 0; n < plan_->nodes.size(); ++n)
      for (std::uint32_t r = 0; r < plan_->nodes[n].replicas; ++r) {
        const replica_view v = plan_->live->replica(n, r).read(now);
        if (v.state != replica_state::busy) continue;
        busy += (busy.empty() ? ": " : ", ") + replica_name(*plan_, n, r) + " busy " +
                std::to_string(static_cast<long long>(v.state_for_s)) + " s" +
                (v.phase.empty() ? std::string() : " (" + v.phase + ")");
      }
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - drain_began_);
    spdlog::warn("still draining after {} s{}; again to stop now", waited.count(), busy);
    delayed_send(this, k_drain_report, drain_report_atom::value);
  }

  void begin_stop(stop_reason why) {
    if (phase_ >= phase::stopping) return;
    phase_ = phase::stopping;
    reason_ = why;
    paused_ = false;  // replicas handle stop while paused
    plan_->live->set_run_phase(run_phase::stopping);
    plan_->live->event("run", "", -1, "stopping (" + std::string(to_string(why)) + ")");
    for (std::uint32_t n = 0; n < plan_->nodes.size(); ++n)
      for (std::uint32_t r = 0; r < plan_->nodes[n].replicas; ++r)
        if (!status_[n][r].stopped) send_counted(plan_->actors[n][r], stop_atom::value, static_cast<std::int32_t>(why));
    if (stopped_ == total_) finish();
  }

  void mark_stopped(std::uint32_t n, std::uint32_t r) {
    auto& s = status_[n][r];
    if (s.stopped) return;
    s.stopped = true;
    ++stopped_;
    if (phase_ == phase::stopping && stopped_ == total_) finish();
  }

  void on_down(const caf::down_msg& dm) {
    // One lookup per down message (a scan of every replica made stopping N replicas N^2).
    auto it = replica_of_.find(dm.source);
    if (it == replica_of_.end() || plan_->actors.empty()) return;
    const auto [n, r] = it->second;
    plan_->live->event("down", plan_->nodes[n].spec.name, r,
                       dm.reason ? "down: " + system().render(dm.reason) : std::string("down (quit normally)"));
    if (!status_[n][r].stopped && !plan_->local(n, r) && dm.reason == caf::exit_reason::remote_link_unreachable) {
      lose_process(plan_->process_of(n, r), "its connection dropped: " + system().render(dm.reason));
      return;
    }
    if (!status_[n][r].stopped) {
      // It quit without being told to: a bug in the runtime or an exception outside the node's calls.
      report(replica_name(*plan_, n, r) + " terminated unexpectedly: " + system().render(dm.reason));
      mark_stopped(n, r);
      begin_stop(stop_reason::failed);
    }
  }

  void finish() {
    if (phase_ == phase::finished) return;
    phase_ = phase::finished;
    int code = exit_code_;
    if (code == exit_ok && reason_ == stop_reason::interrupted) code = 128 + signal_;
    stop_reason why = exit_code_ != exit_ok ? stop_reason::failed : reason_;
    plan_->live->set_run_phase(run_phase::finished);
    plan_->live->event("run", "", -1,
                       "finished (" + std::string(to_string(why)) + ", exit code " + std::to_string(code) + ")" +
                           (error_.empty() ? std::string() : ": " + error_));
    plan_->state->finish(code, error_, why);
    {
      std::lock_guard<std::mutex> lock(plan_->actors_mutex);
      plan_->actors.clear();  // break the cycle plan -> actors -> plan
    }
    quit();
  }

  std::shared_ptr<job_plan> plan_;
  std::map<caf::actor_addr, std::pair<std::uint32_t, std::uint32_t>> replica_of_;  // monitored replica -> (node, replica)
  std::vector<std::vector<replica_status>> status_;
  std::size_t total_ = 0, done_ = 0, stopped_ = 0;
  phase phase_ = phase::running;
  stop_reason reason_ = stop_reason::completed;
  int exit_code_ = exit_ok;
  std::string error_;
  int interrupts_ = 0;
  int signal_ = 0;
  bool paused_ = false;
  static constexpr std::chrono::seconds k_drain_report{10};
  std::chrono::steady_clock::time_point drain_began_;
  std::set<std::uint32_t> lost_;  // cluster processes lost
};

// -- planning ------------------------------------------------------------------------------------------

expected<std::shared_ptr<job_plan>> make_plan(const graph::graph_spec& spec, const graph::node_kind_registry& kinds,
                                              const node_factory_registry& factories, const run_options& options) {
  auto plan = std::make_shared<job_plan>();
  plan->graph_name = spec.name;
  plan->seed = spec.seed;
  plan->steps = spec.steps;
  plan->checkpoint_dir = spec.checkpoint_dir;
  plan->run_id = options.run_id;
  plan->attempt = options.attempt;
  if (!spec.checkpoint_dir.empty()) {  // runtime/util/dir_lock.h
    try {
      plan->checkpoint_lock =
          std::make_shared<dir_lock>(dir_lock::acquire(spec.checkpoint_dir, options.run_id, "[graph] checkpoint_dir"));
    } catch (const std::exception& e) {
      return error_text{e.what()};
    }
  }
  plan->rendezvous_store = options.rendezvous_store;
  plan->metrics = std::make_shared<job_metrics>();
  plan->live = std::make_shared<job_live>(plan->metrics->start());
  plan->state = std::make_shared<run_state>();
  std::map<std::string, std::uint32_t, std::less<>> index;
  const std::string where = spec.source_file.empty() ? std::string("graph '" + spec.name + "'") : spec.source_file.string();
  // Nodes.
  for (const auto& n : spec.nodes) {
    node_plan np;
    np.spec = n;
    np.kind_name = n.kind;
    if (n.replicas < 1) return error_text{where + ": node '" + n.name + "' has replicas = " + std::to_string(n.replicas)};
    np.replicas = static_cast<std::size_t>(n.replicas);
    const graph::node_kind* kind = kinds.lookup(n.kind);
    if (!kind) return error_text{where + ": node '" + n.name + "' has unknown kind '" + n.kind + "'"};
    const node_factory* f = factories.find(n.kind);
    if (!f)
      return error_text{where + ": node '" + n.name + "' has kind '" + n.kind +
                        "', which has no implementation in this program (`flowrun kinds` lists the runnable kinds)"};
    np.factory = *f;
    np.blocking = kind->blocking;
    for (const auto* port : kind->ports_of(graph::port_dir::out))
      np.out_ports.push_back({port->name, intern_message_type(port->message_type)});
    for (const auto* port : kind->ports_of(graph::port_dir::in))
      np.in_ports.push_back({port->name, intern_message_type(port->message_type)});
    // Supervision settings (declared by runtime-registered kinds; else the run's default).
    np.policy = options.default_restart;
    if (const auto* s = n.find_setting(restart_setting)) {
      const auto* text = std::get_if<std::string>(&s->value);
      auto mode = text ? parse_restart_mode(*text) : std::nullopt;
      if (!mode)
        return error_text{where + ": node '" + n.name + "': restart = " + graph::to_string(s->value) +
                          " is not a restart policy (use \"never\" or \"on-failure\")"};
      np.policy.when = *mode;
    }
    if (const auto* s = n.find_setting(max_restarts_setting)) {
      const auto* v = std::get_if<std::int64_t>(&s->value);
      if (!v || *v < 0)
        return error_text{where + ": node '" + n.name + "': max_restarts = " + graph::to_string(s->value) +
                          " must be an integer >= 0"};
      np.policy.max_restarts = *v;
    }
    // TensorBoard (node.h, add_tensorboard_settings): declared by the trainer kinds.
    if (const auto* s = n.find_setting(enable_tensorboard_setting); s && std::get_if<bool>(&s->value) &&
                                                                      std::get<bool>(s->value)) {
      const auto* p = n.find_setting(tensorboard_path_setting);
      const auto* dir = p ? std::get_if<std::string>(&p->value) : nullptr;
      if (!dir || dir->empty())
        return error_text{where + ": node '" + n.name +
                          "': enable_tensorboard = true needs tensorboard_path = \"FOLDER\" (where the event "
                          "files go; each node writes into FOLDER/" + n.name + ")"};
      np.tensorboard_dir = (std::filesystem::path(*dir) / n.name).string();
    } else if (const auto* p = n.find_setting(tensorboard_path_setting)) {
      // DeepSpeed-Chat's semantics (the path alone turns nothing on), but said: TRL users expect the path to
      if (const auto* dir = std::get_if<std::string>(&p->value); dir && !dir->empty())
        spdlog::warn("node '{}': tensorboard_path = \"{}\" but enable_tensorboard is false: no event files are "
                     "written (set enable_tensorboard = true to write them)",
                     n.name, *dir);
    }
    if (!index.emplace(n.name, static_cast<std::uint32_t>(plan->nodes.size())).second)
      return error_text{where + ": duplicate node name '" + n.name + "'"};
    plan->nodes.push_back(std::move(np));
  }
  // Edges.
  std::vector<bool> has_input(plan->nodes.size(), false);
  for (const auto& e : spec.edges) {
    auto fi = index.find(e.from_node);
    auto ti = index.find(e.to_node);
    if (fi == index.end() || ti == index.end())
      return error_text{where + ": edge " + e.to_string() + " names an unknown node"};
    edge_plan ep;
    ep.name = e.to_string();
    ep.from_node = fi->second;
    ep.to_node = ti->second;
    auto& from = plan->nodes[ep.from_node];
    auto& to = plan->nodes[ep.to_node];
    auto find_port = [](const std::vector<port_plan>& ports, const std::string& name) -> std::int64_t {
      for (std::size_t i = 0; i < ports.size(); ++i)
        if (ports[i].name == name) return static_cast<std::int64_t>(i);
      return -1;
    };
    std::int64_t fp = find_port(from.out_ports, e.from_port);
    std::int64_t tp = find_port(to.in_ports, e.to_port);
    if (fp < 0 || tp < 0)
      return error_text{where + ": edge " + ep.name + " names an unknown port (was the graph validated?)"};
    if (from.out_ports[fp].type != to.in_ports[tp].type)
      return error_text{where + ": edge " + ep.name + " connects message type '" + std::string(from.out_ports[fp].type) +
                        "' to '" + std::string(to.in_ports[tp].type) + "'"};
    ep.from_port = static_cast<std::uint32_t>(fp);
    ep.to_port = static_cast<std::uint32_t>(tp);
    ep.mode = e.dispatch;
    ep.feedback = e.feedback;
    ep.credit = e.credit > 0 ? e.credit : std::max<std::int64_t>(1, options.default_credit);
    if (!ep.feedback) has_input[ep.to_node] = true;
    from.out_edges.push_back(static_cast<std::uint32_t>(plan->edges.size()));
    plan->edges.push_back(std::move(ep));
  }
  for (std::size_t n = 0; n < plan->nodes.size(); ++n) plan->nodes[n].source = !has_input[n];
  // Metrics layout and links.
  for (const auto& np : plan->nodes) {
    plan->metrics->add_node(np.spec.name, np.replicas, np.source, np.out_edges.empty());
    plan->live->add_node(np.spec.name, np.replicas);
  }
  plan->out_links.resize(plan->nodes.size());
  plan->in_links.resize(plan->nodes.size());
  for (std::size_t n = 0; n < plan->nodes.size(); ++n) {
    plan->out_links[n].resize(plan->nodes[n].replicas);
    plan->in_links[n].resize(plan->nodes[n].replicas);
  }
  for (std::uint32_t ei = 0; ei < plan->edges.size(); ++ei) {
    auto& ep = plan->edges[ei];
    ep.metrics_edge = plan->metrics->add_edge(ep.name, ep.to_node, ep.credit);
    for (std::uint32_t p = 0; p < plan->nodes[ep.from_node].replicas; ++p)
      for (std::uint32_t c = 0; c < plan->nodes[ep.to_node].replicas; ++c) {
        link_plan l;
        l.edge = ei;
        l.from_node = ep.from_node;
        l.from_replica = p;
        l.to_node = ep.to_node;
        l.to_replica = c;
        auto& outs = plan->out_links[ep.from_node][p];
        auto& ins = plan->in_links[ep.to_node][c];
        l.out_index = static_cast<std::uint32_t>(outs.size());
        l.in_index = static_cast<std::uint32_t>(ins.size());
        l.counters = &plan->metrics->add_link(ep.metrics_edge, ep.from_node, p, c);
        const auto id = static_cast<std::uint32_t>(plan->links.size());
        outs.push_back(id);
        ins.push_back(id);
        plan->links.push_back(l);
      }
  }
  return plan;
}

}  // namespace flowrun::actor::rt

namespace flowrun::actor {

namespace {
caf::actor spawn_replica(caf::actor_system& sys, const std::shared_ptr<rt::job_plan>& plan, std::uint32_t n,
                         std::uint32_t r) {
  if (!plan->nodes[n].blocking) return sys.spawn<rt::replica_actor>(plan, n, r);
  return sys.spawn<rt::blocking_replica_actor>(plan, n, r);  // a thread of its own
}
}  // namespace

expected<job> launch(caf::actor_system& sys, const graph::graph_spec& spec, const graph::node_kind_registry& kinds,
                     const node_factory_registry& factories, const run_options& options) {
  auto planned = rt::make_plan(spec, kinds, factories, options);
  if (!planned) return error_text{planned.error()};
  std::shared_ptr<rt::job_plan> plan = *planned;
  job j;
  j.state = plan->state;
  j.metrics = plan->metrics;
  j.live = plan->live;
  for (std::uint32_t n = 0; n < plan->nodes.size(); ++n) {
    std::vector<caf::actor> row;
    for (std::uint32_t r = 0; r < plan->nodes[n].replicas; ++r) {
      const bool blocking = plan->nodes[n].blocking;
      row.push_back(spawn_replica(sys, plan, n, r));
      plan->live->event("spawn", plan->nodes[n].spec.name, r,
                        "spawned (kind " + plan->nodes[n].kind_name + ", actor " + std::to_string(row.back().id()) +
                            (blocking ? ", a thread of its own)" : ")"));
    }
    plan->actors.push_back(row);
  }
  j.replicas = plan->actors;
  // The coordinator wires and starts the replicas: they only read plan->actors
  // after its init message, which happens-after the table is complete.
  j.coordinator = sys.spawn<rt::coordinator_actor>(plan);
  return j;
}

cross_process_counts cross_process_totals() {
  auto& c = rt::cross();
  return {c.data_msgs.load(), c.data_bytes.load(), c.control_msgs.load()};
}

expected<job_part> spawn_part(caf::actor_system& sys, const graph::graph_spec& spec,
                              const graph::node_kind_registry& kinds, const node_factory_registry& factories,
                              const run_options& options, const placement& where) {
  auto planned = rt::make_plan(spec, kinds, factories, options);
  if (!planned) return error_text{planned.error()};
  std::shared_ptr<rt::job_plan> plan = *planned;
  if (where.where.size() != plan->nodes.size() || where.self >= where.processes.size())
    return error_text{"placement: " + std::to_string(where.where.size()) + " nodes placed, the graph has " +
                      std::to_string(plan->nodes.size())};
  for (std::uint32_t n = 0; n < plan->nodes.size(); ++n) {
    if (where.where[n].size() != plan->nodes[n].replicas)
      return error_text{"placement: node '" + plan->nodes[n].spec.name + "' has " +
                        std::to_string(plan->nodes[n].replicas) + " replicas, " +
                        std::to_string(where.where[n].size()) + " placed"};
    for (auto p : where.where[n])
      if (p >= where.processes.size()) return error_text{"placement: node '" + plan->nodes[n].spec.name + "' placed on an unknown process"};
  }
  plan->where = where;
  // Every edge that crosses processes must carry a type that travels as bytes.
  for (const auto& l : plan->links) {
    const auto pf = where.where[l.from_node][l.from_replica], pt = where.where[l.to_node][l.to_replica];
    // This process counts one side of a cross-process link at most: no depth from it.
    if (pf != where.self || pt != where.self) l.counters->remote = true;
    if (pf == pt) continue;
    const auto& e = plan->edges[l.edge];
    const std::string_view type = plan->nodes[e.from_node].out_ports[e.from_port].type;
    if (!has_payload_codec(type))
      return error_text{"edge " + e.name + " crosses from cluster node '" + where.processes[pf] + "' to '" +
                        where.processes[pt] + "', but its message type '" + std::string(type) +
                        "' cannot cross processes (it has no codec): place both ends on the same node (on = \"...\")"};
    if (has_bulk_codec(type) && !where.bulk)
      return error_text{"edge " + e.name + " crosses from cluster node '" + where.processes[pf] + "' to '" +
                        where.processes[pt] + "' with tensors ('" + std::string(type) +
                        "'), but this process has no bulk plane (communicator) to move them"};
  }
  job_part part;
  part.plan = plan;
  part.state = plan->state;
  part.metrics = plan->metrics;
  part.live = plan->live;
  if (where.self != 0) plan->live->forward_prints();  // a cluster node's part: main prints its lines too
  plan->actors.resize(plan->nodes.size());
  for (std::uint32_t n = 0; n < plan->nodes.size(); ++n) {
    plan->actors[n].resize(plan->nodes[n].replicas);
    for (std::uint32_t r = 0; r < plan->nodes[n].replicas; ++r) {
      if (where.where[n][r] != where.self) {
        plan->live->replica(n, r).set_state(replica_state::remote, 0);
        continue;
      }
      auto a = spawn_replica(sys, plan, n, r);
      plan->live->event("spawn", plan->nodes[n].spec.name, r,
                        "spawned on cluster node '" + where.processes[where.self] + "' (kind " +
                            plan->nodes[n].kind_name + ", actor " + std::to_string(a.id()) + ")");
      plan->actors[n][r] = a;
      part.local.push_back(a);
      part.local_ids.emplace_back(n, r);
    }
  }
  return part;
}

expected<bool> set_actor_table(job_part& part, const std::vector<caf::actor>& all) {
  auto plan = std::static_pointer_cast<rt::job_plan>(part.plan);
  if (!plan) return error_text{"set_actor_table: the part was released"};
  std::size_t total = 0;
  for (const auto& np : plan->nodes) total += np.replicas;
  if (all.size() != total)
    return error_text{"set_actor_table: " + std::to_string(all.size()) + " handles for " + std::to_string(total) +
                      " replicas"};
  std::size_t i = 0;
  std::lock_guard<std::mutex> lock(plan->actors_mutex);
  for (auto& row : plan->actors)
    for (auto& a : row) {
      if (!all[i]) return error_text{"set_actor_table: replica handle " + std::to_string(i) + " is invalid"};
      a = all[i++];
    }
  return true;
}

job start_part(caf::actor_system& sys, job_part& part) {
  auto plan = std::static_pointer_cast<rt::job_plan>(part.plan);
  job j;
  j.state = plan->state;
  j.metrics = plan->metrics;
  j.live = plan->live;
  j.replicas = plan->actors;
  j.coordinator = sys.spawn<rt::coordinator_actor>(plan);
  return j;
}

void abort_part(job_part& part) {
  for (auto& a : part.local)
    caf::anon_send(a, rt::stop_atom::value, static_cast<std::int32_t>(stop_reason::failed));
}

void release_part(job_part& part) {
  if (auto plan = std::static_pointer_cast<rt::job_plan>(part.plan)) {
    std::lock_guard<std::mutex> lock(plan->actors_mutex);
    plan->actors.clear();
  }
  part.local.clear();
  part.plan.reset();
}

void interrupt(const job& j, int signal) {
  // the replicas see it at once (node_context::draining(), stop_requested()): the coordinator's message waits for a
  // free CAF worker, and where every worker is inside a long call (rlhf.graph's sft and rm both in their held-out
  // pass before training on 2 cores) the drain began only when one of them ended; now those calls give way at their
  // next batch. The coordinator then drains or stops as before (on_interrupt; a paused run is its to resume first)
  if (j.live) {
    if (const run_phase rp = j.live->get_run_phase(); rp == run_phase::running)
      j.live->set_run_phase(run_phase::draining);
    else if (rp == run_phase::draining)
      j.live->set_run_phase(run_phase::stopping);
  }
  caf::anon_send(j.coordinator, interrupt_atom::value, static_cast<std::int32_t>(signal));
}

void pause(const job& j) { caf::anon_send(j.coordinator, pause_atom::value); }

int launch_process_index() {
  const char* pidx = std::getenv("FLOWRUN_PROCESS_INDEX");
  return pidx ? std::atoi(pidx) : 0;
}

void resume(const job& j) { caf::anon_send(j.coordinator, resume_atom::value); }

}  // namespace flowrun::actor
