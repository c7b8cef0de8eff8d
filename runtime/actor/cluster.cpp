// Layer 5, actor runtime: node daemons and cluster runs (cluster.h, cluster_run.h).
//
// The protocol (every field an integer, a string, an actor handle or raw bytes):
//
//   coordinator link -> gate      hello(client_nonce)            -> (daemon_nonce, daemon_proof)
//                                 auth(client_nonce, daemon_nonce, client_proof, link)
//                                                                -> (verdict, session)  verdict "" = accepted
//   coordinator -> session        job(graph_toml, processes, where, self, heartbeat_ms, lost_after_ms)
//                                                                -> (error, local replicas)
//                                 table(all replicas)            -> error
//                                 end                            -> counts
//   link -> session               beat(process, seq)             session -> link: beat(process, seq, uptime_ms)
//
// A session trusts only the link it was authenticated with: it answers work
// requests whose sender is on that link's node.
#include "runtime/actor/cluster.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <spdlog/spdlog.h>

#include "runtime/actor/cluster_auth.h"
#include "runtime/actor/cluster_run.h"
#include "runtime/actor/console.h"
#include "runtime/actor/job.h"
#include "runtime/actor/liveness.h"
#include "runtime/actor/payload_codec.h"
#include "runtime/actor/socket_numbers.h"
#include "runtime/actor/tls_error_queue.h"
#include "runtime/comm/abort_registry.h"
#include "runtime/comm/caf_scheduler.h"
#include "runtime/comm/caf_store_actor.h"
#include "runtime/comm/communicator.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"
#include "runtime/util/connect_budget.h"
#include "runtime/util/host_port.h"

namespace flowrun::actor {

namespace cl {

using hello_atom = caf::atom_constant<caf::atom("fr_hello")>;
using auth_atom = caf::atom_constant<caf::atom("fr_auth")>;
using job_atom = caf::atom_constant<caf::atom("fr_job")>;
using table_atom = caf::atom_constant<caf::atom("fr_table")>;
using beat_atom = caf::atom_constant<caf::atom("fr_beat")>;
using cend_atom = caf::atom_constant<caf::atom("fr_cend")>;
using watch_atom = caf::atom_constant<caf::atom("fr_watch")>;
using abort_atom = caf::atom_constant<caf::atom("fr_abort")>;
/// The liveness channel's verdict, sent from its thread: a session's coordinator, or main's node, is lost.
using lost_atom = caf::atom_constant<caf::atom("fr_lost")>;
/// The coordinator asks a session to join the bulk plane (a gloo group over the run's processes).
using comm_atom = caf::atom_constant<caf::atom("fr_comm")>;
/// peer_lost(place, why), main to every node still in the run: cluster node `place` was lost; abort
/// this process's collectives that wait for its ranks (comm/abort_registry.h).
using peer_lost_atom = caf::atom_constant<caf::atom("fr_plost")>;

using clk = std::chrono::steady_clock;

std::int64_t ms_since(clk::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t).count();
}

// CAF 0.17 has no built-in std::vector<uint32_t>/<uint64_t> message types: integer
// lists travel as the little-endian bytes of a std::vector<char>.
template <class T>
std::vector<char> pack(const std::vector<T>& v) {
  std::vector<char> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}
template <class T>
std::vector<T> unpack(const std::vector<char>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

// -- the daemon ------------------------------------------------------------------------------------

struct daemon_shared {
  node_daemon_options options;
  const graph::node_kind_registry* kinds = nullptr;
  const node_factory_registry* factories = nullptr;
  std::mutex mutex;
  std::condition_variable cv;
  bool busy = false;  // a job is running here
  bool done = false;  // once: the first job ended
  bool aborted = false;  // a job's part here was aborted (the coordinator's connection dropped, a stop without it)
  std::vector<caf::actor> sessions;
  std::vector<caf::actor> replicas;  // this node's replicas of the running job (for a clean shutdown)
  clk::time_point started = clk::now();

  void finish_job() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      busy = false;
      replicas.clear();
      if (options.once) done = true;
    }
    cv.notify_all();
  }
};

struct session_state {
  static const char* name;
  std::shared_ptr<daemon_shared> shared;
  caf::actor link;  // the coordinator's link actor this session was authenticated with
  std::optional<job_part> part;
  bool active = false;
  std::uint32_t self_index = 0;
  std::string self_name;
  std::string scope;  // comm::attempt_scope of the job: its rank groups' entries in the abort registry
  cross_process_counts at_start;
  std::uint64_t beats = 0;  // counter polls answered (CAF); liveness is the responder's
  std::unique_ptr<liveness_responder> liveness;  // answers main's pings on a UDP socket and thread of its own
  std::shared_ptr<bulk_plane> bulk;  // this node's end of the bulk plane (when the job moves tensors)
};
const char* session_state::name = "flowrun_cluster_session";

void end_part(caf::stateful_actor<session_state>* self, bool aborted) {
  auto& st = self->state;
  if (!st.part) return;
  if (aborted) {
    // replicas that wait in a collective would handle their stop only at comm_timeout_s
    if (int n = comm::abort_scope(st.scope, "node '" + st.self_name + "' stops its part of the run"))
      spdlog::warn("[{}] aborted the collectives of {} rank group(s) here", st.self_name, n);
    abort_part(*st.part);
    std::lock_guard<std::mutex> lock(st.shared->mutex);
    st.shared->aborted = true;  // --once: the exit code says so (it exited 0, as after a job that ended)
  }
  const auto snap = st.part->metrics->snapshot();
  // "ended": the coordinator ended the run, which may have failed elsewhere (another node lost); this node
  // does not know the run's outcome (it said "finished" after a run that failed)
  spdlog::info("[{}] this node's part ({}): {}", st.self_name, aborted ? "aborted" : "ended by the coordinator",
               format_summary(snap));
  release_part(*st.part);
  st.part.reset();
  st.bulk.reset();
  st.liveness.reset();
  st.active = false;
  st.shared->finish_job();
}

// Joins a gloo group through the coordinator's rendezvous store: this
// process's end of the bulk plane (bulk_plane.h). Blocks until every process
// has joined or `timeout` passes (then throws std::runtime_error).
std::shared_ptr<bulk_plane> join_bulk_plane(std::shared_ptr<comm::store> kv, int rank, int world,
                                            const std::string& hostname, std::chrono::milliseconds timeout,
                                            const std::string& prefix) {
  comm::gloo_options o;
  o.rank = rank;
  o.world_size = world;
  o.kv = std::move(kv);
  o.prefix = prefix;
  o.hostname = hostname;
  o.timeout = timeout;
  return std::make_shared<bulk_plane>(std::shared_ptr<comm::communicator>(comm::gloo_communicator(o)));
}

caf::behavior session(caf::stateful_actor<session_state>* self, std::shared_ptr<daemon_shared> shared, caf::actor link) {
  self->state.shared = shared;
  self->state.link = link;
  self->monitor(link);
  // An exit message (the coordinator gave up starting the run: abandon(), or
  // the daemon shuts down) must not leave this node's part behind: without
  // this the daemon stayed "busy with another job" for good.
  self->set_exit_handler([=](caf::exit_msg& em) {
    if (self->state.active)
      spdlog::warn("[{}] the coordinator ended the session ({}): stopping this node's replicas", self->state.self_name,
                   self->system().render(em.reason));
    end_part(self, true);
    self->quit(em.reason);
  });
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source != self->state.link.address()) return;
    if (self->state.active)
      spdlog::error("[{}] the coordinator's connection dropped ({}): stopping this node's replicas (their stop() runs)",
                    self->state.self_name, self->system().render(dm.reason));
    end_part(self, true);
    self->quit();
  });
  // Work only from the authenticated coordinator's node.
  auto trusted = [=] {
    auto s = self->current_sender();
    return s && s->node() == self->state.link.node();
  };
  return {
      [=](job_atom, const std::string& toml, const std::vector<std::string>& processes,
          const std::vector<char>& where_bytes, std::uint32_t self_index, std::int64_t heartbeat_ms,
          std::int64_t lost_after_ms, const std::string& run_id, std::int64_t attempt,
          const caf::actor& kv) -> caf::result<std::string, std::vector<caf::actor>, std::int64_t> {
        auto& st = self->state;
        const auto where_flat = unpack<std::uint32_t>(where_bytes);
        if (!trusted()) return {std::string("refused: not the authenticated coordinator"), std::vector<caf::actor>{}, std::int64_t{0}};
        if (self_index >= processes.size())
          return {std::string("bad job request: process index out of range"), std::vector<caf::actor>{}, std::int64_t{0}};
        {
          std::lock_guard<std::mutex> lock(shared->mutex);
          if (shared->busy)
            return {"cluster node '" + processes[self_index] + "' is busy with another job", std::vector<caf::actor>{}, std::int64_t{0}};
          shared->busy = true;
        }
        auto refuse = [&](std::string why) -> caf::result<std::string, std::vector<caf::actor>, std::int64_t> {
          {
            std::lock_guard<std::mutex> lock(shared->mutex);
            shared->busy = false;
          }
          spdlog::error("[{}] refused the job: {}", processes[self_index], why);
          return {std::move(why), std::vector<caf::actor>{}, std::int64_t{0}};
        };
        auto parsed = graph::parse_graph_string(toml, "<graph from the coordinator>");
        if (!parsed.ok()) return refuse("the graph does not parse here:\n" + graph::format_errors(parsed.errors));
        graph::validate_options vo;
        vo.asset_root = shared->options.asset_root;
        auto v = graph::validate(parsed.spec, *shared->kinds, vo);
        if (!v.ok()) return refuse("the graph is not valid here:\n" + graph::format_errors(v.errors));
        placement pl;
        pl.processes = processes;
        pl.self = self_index;
        pl.bulk = st.bulk;
        std::size_t i = 0;
        for (const auto& n : v.spec.nodes) {
          std::vector<std::uint32_t> row;
          for (std::int64_t r = 0; r < n.replicas; ++r) {
            if (i >= where_flat.size()) return refuse("the placement has fewer entries than the graph has replicas");
            row.push_back(where_flat[i++]);
          }
          pl.where.push_back(std::move(row));
        }
        if (i != where_flat.size()) return refuse("the placement has more entries than the graph has replicas");
        run_options ro;
        ro.summary = false;
        ro.run_id = run_id;
        ro.attempt = attempt;
        if (kv) ro.rendezvous_store = comm::actor_store(self->system(), kv);
        auto part = spawn_part(self->system(), v.spec, *shared->kinds, *shared->factories, ro, pl);
        if (!part) return refuse(part.error());
        st.self_index = self_index;
        st.self_name = processes[self_index];
        st.scope = comm::attempt_scope(run_id, attempt);
        // Liveness on a thread and UDP socket of its own (liveness.h): its verdict comes back as a message.
        try {
          caf::actor_addr me = self->address();
          st.liveness = std::make_unique<liveness_responder>(
              shared->options.host, shared->options.secret, run_id + "/" + std::to_string(attempt),
              phi_settings::for_cluster(heartbeat_ms, lost_after_ms), [me](const std::string& why) {
                if (auto a = caf::actor_cast<caf::actor>(me)) caf::anon_send(a, lost_atom::value, why);
              });
        } catch (const std::exception& e) {
          abort_part(*part);
          release_part(*part);
          return refuse(e.what());
        }
        st.at_start = cross_process_totals();
        st.active = true;
        auto local = part->local;
        {
          std::lock_guard<std::mutex> lock(shared->mutex);
          shared->replicas = local;
        }
        spdlog::info("[{}] job '{}': {} replicas here", st.self_name, v.spec.name, local.size());
        st.part = std::move(*part);
        return {std::string(), std::move(local), static_cast<std::int64_t>(st.liveness->port())};
      },
      [=](comm_atom, const caf::actor& kv, std::uint32_t rank, std::uint32_t world, const std::string& hostname,
          std::int64_t timeout_ms, const std::string& prefix) -> std::string {
        if (!trusted()) return "refused: not the authenticated coordinator";
        // The session runs detached (a thread of its own): blocking here until
        // every process has joined holds up nothing else of this node.
        try {
          const std::chrono::milliseconds t(timeout_ms);
          self->state.bulk = join_bulk_plane(comm::actor_store(self->system(), kv, t), static_cast<int>(rank),
                                             static_cast<int>(world), hostname, t, prefix);
          spdlog::info("bulk plane: joined as rank {} of {} (gloo, listening on {})", rank, world, hostname);
          return std::string();
        } catch (const std::exception& e) {
          return std::string("cannot join the bulk plane: ") + e.what();
        }
      },
      [=](table_atom, const std::vector<caf::actor>& all) -> std::string {
        auto& st = self->state;
        if (!trusted()) return "refused: not the authenticated coordinator";
        if (!st.part) return "no job here";
        auto ok = set_actor_table(*st.part, all);
        return ok ? std::string() : ok.error();
      },
      [=](beat_atom, std::uint32_t process, std::int64_t seq, std::int64_t checkpoint_gen, std::int64_t printed_seen) {
        // a counter poll (liveness is the responder's), with main's latest console checkpoint request
        auto& st = self->state;
        ++st.beats;
        if (st.part && st.part->live && checkpoint_gen > 0)
          st.part->live->raise_checkpoint_generation(static_cast<std::uint64_t>(checkpoint_gen));
        // with the counters of this node's replicas, which main mirrors (console, summary, progress), and
        // what its nodes did with checkpoint requests (the console's reply and the end of the run say it)
        std::int64_t honoured = 0;
        std::vector<std::string> capable;
        if (st.part && st.part->live) {
          honoured = static_cast<std::int64_t>(st.part->live->checkpoint_honoured());
          capable = st.part->live->checkpoint_capable_nodes();
        }
        // and the lines its replicas printed since the last one main printed
        std::uint64_t first = 0;
        auto printed = st.part && st.part->live
                           ? st.part->live->printed_since(printed_seen, &first)
                           : std::vector<std::string>{};
        self->send(caf::actor_cast<caf::actor>(self->current_sender()), beat_atom::value, process, seq,
                   static_cast<std::int64_t>(ms_since(st.shared->started)),
                   st.part ? encode_replica_counters(*st.part->metrics, st.part->local_ids) : std::vector<char>{},
                   honoured, capable, static_cast<std::int64_t>(first), std::move(printed));
      },
      [=](lost_atom, const std::string& why) {  // from the liveness responder's thread
        auto& st = self->state;
        if (!st.active) return;
        spdlog::error("[{}] {}: stopping this node's replicas (their stop() runs)", st.self_name, why);
        end_part(self, true);
        self->quit();
      },
      [=](peer_lost_atom, const std::string& place, const std::string& why) {
        // another cluster node was lost: its ranks will never answer the collectives of this node's
        // replicas, which hold their threads (and would see their stop only at comm_timeout_s)
        auto& st = self->state;
        if (!trusted() || !st.active) return;
        if (int n = comm::abort_spanning(st.scope, place, why))
          spdlog::warn("[{}] cluster node '{}' was lost: aborted the collectives of {} rank group(s) here that span it",
                       st.self_name, place, n);
      },
      [=](abort_atom) {  // the daemon is shutting down (SIGINT/SIGTERM)
        if (self->state.active)
          spdlog::error("[{}] shutting down: stopping this node's replicas (their stop() runs)", self->state.self_name);
        end_part(self, true);
        self->quit(caf::exit_reason::user_shutdown);
      },
      [=](cend_atom, std::int64_t printed_seen)
          -> caf::result<std::vector<char>, std::vector<char>, std::int64_t, std::vector<std::string>> {
        auto& st = self->state;
        if (!trusted()) return {std::vector<char>{}, std::vector<char>{}, std::int64_t{0}, std::vector<std::string>{}};
        const auto now = cross_process_totals();
        const auto bs = st.bulk ? st.bulk->stats() : bulk_stats{};
        std::vector<std::uint64_t> counts{now.data_msgs - st.at_start.data_msgs, now.data_bytes - st.at_start.data_bytes,
                                          now.control_msgs - st.at_start.control_msgs,
                                          st.liveness ? st.liveness->pongs() : 0,
                                          bs.sends, bs.tensors_sent, bs.bytes_sent};
        auto final_counters =
            st.part ? encode_replica_counters(*st.part->metrics, st.part->local_ids) : std::vector<char>{};
        auto live = st.part ? st.part->live : nullptr;  // (end_part lets go of the part)
        end_part(self, false);  // its replicas' stop() may print (what an interrupted run kept)
        std::uint64_t first = 0;
        auto printed = live ? live->printed_since(printed_seen, &first)
                            : std::vector<std::string>{};
        self->quit();
        return {pack(counts), std::move(final_counters), static_cast<std::int64_t>(first), std::move(printed)};
      },
  };
}

struct gate_state {
  static const char* name;
  std::optional<handshake_gate> handshake;  // cluster_auth.h: nonces, proofs, replays
};
const char* gate_state::name = "flowrun_cluster_gate";

caf::behavior gate(caf::stateful_actor<gate_state>* self, std::shared_ptr<daemon_shared> shared) {
  self->state.handshake.emplace(shared->options.secret);
  return {
      [=](hello_atom, const std::string& client_nonce) -> caf::result<std::string, std::string> {
        auto answer = self->state.handshake->hello(client_nonce);
        if (!answer) return {std::string(), std::string()};
        return {std::move(answer->first), std::move(answer->second)};
      },
      [=](auth_atom, const std::string& client_nonce, const std::string& daemon_nonce, const std::string& proof,
          caf::actor link) -> caf::result<std::string, caf::actor> {
        auto me = caf::actor_cast<caf::actor>(self);
        auto sender = self->current_sender();
        const std::string peer = sender ? to_string(sender->node()) : std::string("an unknown node");
        if (auto why = self->state.handshake->auth(client_nonce, daemon_nonce, proof); !why.empty()) {
          spdlog::error("refused a peer ({}): {}", peer, why);
          return {"refused: " + why, me};
        }
        if (!link || !sender || link.node() != sender->node()) {
          spdlog::error("refused a peer ({}): its link actor is not on its own node", peer);
          return {std::string("refused: the link actor must be on the authenticating node"), me};
        }
        // Detached: a thread of its own, so that busy replicas (a training step inside one
        // handler) never delay its heartbeat replies.
        auto s = self->spawn<caf::detached>(session, shared, link);
        {
          std::lock_guard<std::mutex> lock(shared->mutex);
          shared->sessions.push_back(s);
        }
        spdlog::info("accepted a coordinator ({})", peer);
        return {std::string(), s};
      },
  };
}

// Why `host:port` cannot be bound (errno), probing with a socket of our own;
// 0 when it can (or the address does not resolve).
int bind_errno(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    return 0;
  int err = 0;
  const int s = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (s >= 0) {
    int one = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s, res->ai_addr, res->ai_addrlen) != 0) err = errno;
    ::close(s);
  }
  ::freeaddrinfo(res);
  return err;
}

std::atomic<int> g_daemon_signal{0};
extern "C" void on_daemon_signal(int sig) { g_daemon_signal.store(sig); }

}  // namespace cl

int run_node_daemon(const node_daemon_options& options, const graph::node_kind_registry& kinds,
                    const node_factory_registry& factories) {
  if (options.secret.empty()) {
    spdlog::error("flowrun node: the cluster secret is empty");
    return 1;
  }
  // socket_numbers.h: without it a coordinator that connects right after
  // another's connection dropped can be taken for the dropped one.
  if (!fresh_socket_numbers_active())
    spdlog::warn("flowrun node: accept() and socket() are not flowrun's here (socket_numbers.h): a coordinator that "
                 "connects within a second of another's disconnect may not be answered");
  auto shared = std::make_shared<cl::daemon_shared>();
  shared->options = options;
  shared->kinds = &kinds;
  shared->factories = &factories;
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  const bool tls = !options.tls_cert.empty();
  // tls_error_queue.h: without it one peer's dropped TLS connection can close another's.
  if (tls && !tls_error_queue_cleared())
    spdlog::warn("flowrun node: SSL_read and SSL_write are not flowrun's here (tls_error_queue.h): when one TLS "
                 "connection drops, another may be closed with it");
  if (tls) {
    cfg.openssl_certificate = options.tls_cert;
    cfg.openssl_key = options.tls_key;
    cfg.openssl_cafile = options.tls_ca;
    cfg.load<caf::openssl::manager>();
  }
  comm::configure_scheduler(cfg, options.threads);
  int code = 0;
  caf::actor_system sys{cfg};
  auto g = sys.spawn(cl::gate, shared);
  auto port = tls ? caf::openssl::publish(g, static_cast<std::uint16_t>(options.port), options.host.c_str(), true)
                  : sys.middleman().publish(g, static_cast<std::uint16_t>(options.port), options.host.c_str(), true);
  if (!port) {
    const int err = options.port > 0 ? cl::bind_errno(options.host, options.port) : 0;
    if (err == EADDRINUSE)
      spdlog::error("flowrun node: cannot listen on {}: port {} is already in use (another flowrun node or another "
                    "program listens there; `ss -ltnp 'sport = :{}'` shows which): choose another port with --listen "
                    "HOST:PORT, or --listen HOST:0 with --port-file FILE for a free one",
                    util::join_host_port(options.host, options.port), options.port, options.port);
    else
      spdlog::error("flowrun node: cannot listen on {}: {}{}", util::join_host_port(options.host, options.port),
                    err ? std::string(std::strerror(err)) + " (" : std::string(), sys.render(port.error()) + (err ? ")" : ""));
    caf::anon_send_exit(g, caf::exit_reason::user_shutdown);
    return 1;
  }
  if (!options.port_file.empty()) {
    // Written before anything announces the node: a port file that cannot be
    // written is an error at start, not a daemon nobody finds.
    const std::string tmp = options.port_file + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    int err = f ? 0 : errno;
    if (f) {
      if (std::fprintf(f, "%u\n", static_cast<unsigned>(*port)) < 0) err = errno ? errno : EIO;
      if (std::fclose(f) != 0 && !err) err = errno;
      if (!err && std::rename(tmp.c_str(), options.port_file.c_str()) != 0) err = errno;
      if (err) std::remove(tmp.c_str());
    }
    if (err) {
      spdlog::error("flowrun node: cannot write the port file {}: {}", options.port_file, std::strerror(err));
      caf::anon_send_exit(g, caf::exit_reason::user_shutdown);
      spdlog::default_logger()->flush();
      std::fflush(stderr);
      std::_Exit(1);  // the gate is published: ~actor_system would wait for the middleman
    }
  }
  std::cout << "flowrun node: listening on " << util::join_host_port(options.host, *port) << (tls ? " (TLS)" : "")
            << std::endl;
  struct sigaction sa {};
  sa.sa_handler = cl::on_daemon_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  {
    std::unique_lock<std::mutex> lock(shared->mutex);
    while (!shared->done && cl::g_daemon_signal.load() == 0) shared->cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  if (int sig = cl::g_daemon_signal.load()) {
    spdlog::warn("flowrun node: signal {}: stopping", sig);
    code = 128 + sig;
  } else if (options.once) {
    std::lock_guard<std::mutex> lock(shared->mutex);
    if (shared->aborted) {
      spdlog::error("flowrun node: --once: its job's part here was aborted (see above): exit 1");
      code = 1;
    }
  }
  // Sessions stop their replicas (stop() runs, the checkpoint hook); wait up
  // to 30 s for the replicas to quit, then leave without waiting on remote
  // peers (the actor system's destructor would wait for every actor).
  std::vector<caf::actor> sessions, replicas;
  {
    std::lock_guard<std::mutex> lock(shared->mutex);
    sessions = shared->sessions;
    replicas = shared->replicas;
  }
  {
    caf::scoped_actor self{sys};
    for (auto& r : replicas) self->monitor(r);
    for (auto& s : sessions) self->send(s, cl::abort_atom::value);
    const auto deadline = cl::clk::now() + std::chrono::seconds(30);
    std::size_t down = 0;
    while (down < replicas.size() && cl::clk::now() < deadline)
      self->receive([&](caf::down_msg&) { ++down; },
                    caf::after(std::chrono::milliseconds(200)) >> [] {});
    if (down < replicas.size())
      spdlog::warn("flowrun node: {} replicas still running after 30 s; exiting anyway", replicas.size() - down);
  }
  caf::anon_send_exit(g, caf::exit_reason::user_shutdown);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

cluster_view planned_cluster_view(const graph::graph_spec& spec, bool tls) {
  cluster_view v;
  v.clustered = needs_cluster(spec);
  v.heartbeat_ms = spec.cluster.heartbeat_ms;
  v.lost_after_ms = spec.cluster.lost_after_ms;
  cluster_node_view main;
  main.name = std::string(graph::main_process_name);
  main.cpus = static_cast<std::int64_t>(std::thread::hardware_concurrency());
  v.nodes.push_back(std::move(main));
  for (const auto& cn : spec.cluster.nodes) {
    cluster_node_view n;
    n.name = cn.name;
    n.address = cn.host_port();
    n.cpus = cn.cpus;
    n.gpus = cn.gpus;
    n.tls = tls;
    n.state = "unused";
    v.nodes.push_back(std::move(n));
  }
  for (const auto& n : spec.nodes)
    for (std::int64_t r = 0; r < n.replicas; ++r) {
      const std::string where = v.clustered ? graph::placement_of(n, r) : std::string(graph::main_process_name);
      for (auto& pn : v.nodes)
        if (pn.name == where) {
          pn.replicas.push_back(n.replicas > 1 ? fmt::format("{}[{}]", n.name, r) : n.name);
          if (pn.state == "unused") pn.state = "connecting";
        }
    }
  return v;
}

bool needs_cluster(const graph::graph_spec& spec) {
  if (spec.cluster.empty()) return false;
  for (const auto& n : spec.nodes)
    for (std::int64_t r = 0; r < n.replicas; ++r)
      if (graph::placement_of(n, r) != graph::main_process_name) return true;
  return false;
}

// -- the coordinator's side ----------------------------------------------------------------------

namespace cl {

struct beat_table {
  mutable std::mutex mutex;
  std::vector<std::string> names;       // by session index
  std::vector<std::string> addresses;
  std::vector<std::string> actors;      // the replicas each holds, for status()
  std::vector<std::int64_t> last_ms;    // ms since `t0` of the last liveness answer; -1: none yet
  std::vector<bool> lost;
  std::vector<std::string> lost_why;
  std::vector<std::vector<char>> counters;  // the latest replica counters each sent (encode_replica_counters)
  std::vector<bool> counters_new;           // not yet applied to main's metrics
  std::vector<std::uint64_t> printed_seen;  // the number of the last line each printed that main printed
  bool closing = false;  // cluster_run::end() began: a session that now quits normally is closed, not lost
  std::string scope;     // comm::attempt_scope of the run: its rank groups' entries in the abort registry
  std::shared_ptr<job_live> live;  // main's part: its console's checkpoint requests go to the nodes
  clk::time_point t0 = clk::now();
};

// The lines node `i` printed, numbered from `first`, on main's terminal, each once, behind the node's name
// ("[w1] [pretrain] step 5/40 ..."): what main printed itself stays as it was. Call with table.mutex held.
void print_node_lines(beat_table& table, std::size_t i, std::int64_t first, const std::vector<std::string>& lines) {
  if (i >= table.printed_seen.size() || first < 1) return;
  // the node keeps its last job_live::max_events lines: more between two heartbeats, and the oldest are gone
  if (!lines.empty() && static_cast<std::uint64_t>(first) > table.printed_seen[i] + 1)
    console::print("[" + table.names[i] + "] (" + std::to_string(static_cast<std::uint64_t>(first) - table.printed_seen[i] - 1) +
                   " lines not shown here: more came between two heartbeats than the node keeps; its own terminal "
                   "has them)");
  for (std::size_t k = 0; k < lines.size(); ++k) {
    const auto n = static_cast<std::uint64_t>(first) + k;
    if (n <= table.printed_seen[i]) continue;  // a reply that crossed an earlier one's
    std::string tagged = "[" + table.names[i] + "] ";  // each line of a print of several behind the name
    for (std::size_t at = 0; at < lines[k].size();) {
      const std::size_t nl = std::min(lines[k].find('\n', at), lines[k].size());
      tagged += (at ? "\n[" + table.names[i] + "] " : std::string()) + lines[k].substr(at, nl - at);
      at = nl + 1;
    }
    console::print(tagged);
    table.printed_seen[i] = n;
  }
}

// Connects to the daemon's gate at host:port (caf_openssl's manager when `tls`). Not the blocking
// remote_actor: it waits for the connect and the BASP handshake without a time limit, and a port that
// accepts but never speaks (not a flowrun node, or a frozen one) would hang the run. The same connect
// request to the middleman, with a timeout; *timed_out says whether it ran out.
expected<caf::actor> connect_gate(caf::actor_system& sys, caf::scoped_actor& self, const std::string& host, int port,
                                  bool tls, std::chrono::milliseconds timeout, bool* timed_out) {
  const caf::io::middleman_actor mm =
      tls ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
  std::string failure;
  caf::strong_actor_ptr ptr;
  *timed_out = false;
  self->request(mm, timeout, caf::connect_atom::value, host, static_cast<std::uint16_t>(port))
      .receive([&](caf::node_id&, caf::strong_actor_ptr& x, std::set<std::string>&) { ptr = std::move(x); },
               [&](caf::error& e) {
                 *timed_out = e == caf::sec::request_timeout;
                 failure = sys.render(e);
               });
  if (!failure.empty()) return error_text{failure};
  if (!ptr) return error_text{"no actor published at port " + std::to_string(port)};
  return caf::actor_cast<caf::actor>(std::move(ptr));
}

std::set<std::string> host_addresses(const std::string& host);

// What a failed connect_gate to `host` said (CAF 0.17's cannot_connect_to_node context, rendered): the port
// refused the connection, or the host name does not resolve. CAF 0.17 tries an IPv6 address, then looks the
// host up again as IPv4 and, where it has no IPv4 address ("::1"), says "no such host": so a refused IPv6
// port read "its host '::1' does not resolve" (cluster_small case 1g). "no such host" for a host that
// resolves here is a refusal.
bool no_such_host(const std::string& e, const std::string& host) {
  return e.find("no such host") != std::string::npos && host_addresses(host).empty();
}
bool refused(const std::string& e, const std::string& host) {
  return e.find("ip_connect failed") != std::string::npos ||
         (e.find("no such host") != std::string::npos && !no_such_host(e, host));
}

// The addresses `host` resolves to (numeric, e.g. "127.0.0.1", "::1"); none when it does not.
std::set<std::string> host_addresses(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::set<std::string> out;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return out;
  for (const addrinfo* a = res; a; a = a->ai_next) {
    char text[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) out.insert(text);
  }
  ::freeaddrinfo(res);
  return out;
}

// Whether `host` (a name or an address) resolves.
bool host_resolves(const std::string& host) { return !host_addresses(host).empty(); }

// The address family gloo's TCP device takes for `host` as this machine resolves it: the first of
// getaddrinfo's answers (gloo binds the first that binds; for an address that is the address's own family).
// AF_INET or AF_INET6; AF_UNSPEC where the name does not resolve.
int first_family(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return AF_UNSPEC;
  const int family = res->ai_family;
  ::freeaddrinfo(res);
  return family;
}

// The bulk plane's address families: main listens on main_address and each node on its own host, and gloo
// connects every process to every other, so an IPv4 main and an IPv6 node failed only at the bulk plane
// ("address family mismatch"), after every node had been set up. "" when they agree.
std::string bulk_families_differ(const graph::cluster_spec& c, const std::vector<std::string>& processes) {
  const int main_family = first_family(c.main_address);
  auto name = [](int f) { return f == AF_INET6 ? std::string("IPv6") : std::string("IPv4"); };
  auto node_at = [&](const graph::cluster_node_spec& cn, int f) {
    return "cluster node '" + cn.name + "' (" + cn.host_port() + ", " + name(f) +
           (cn.address_pos.known() ? ", address at " + cn.address_pos.file + ":" + std::to_string(cn.address_pos.line)
                                   : std::string()) +
           ")";
  };
  // each node's family, resolved once; nodes that differ among themselves first: no main_address serves both
  std::vector<std::pair<const graph::cluster_node_spec*, int>> nodes;
  for (std::size_t i = 1; i < processes.size(); ++i)
    if (const auto* cn = c.find(processes[i]))
      if (const int f = first_family(cn->host); f != AF_UNSPEC) nodes.emplace_back(cn, f);
  for (const auto& [cn, f] : nodes)
    if (f != nodes.front().second)
      return node_at(*nodes.front().first, nodes.front().second) + " and " + node_at(*cn, f) +
             " are on different address families, and the bulk plane (gloo) connects every process to every other "
             "over one: give every node, and [cluster] main_address, addresses of one family";
  if (nodes.empty() || main_family == AF_UNSPEC || nodes.front().second == main_family) return "";
  const auto& [cn, f] = nodes.front();
  const auto& at = c.main_address_pos;
  return "the bulk plane cannot connect [cluster] main_address = \"" + c.main_address + "\" (" + name(main_family) +
         (at.known() ? ", at " + at.file + ":" + std::to_string(at.line) : std::string(", the default")) +
         ") with " + node_at(*cn, f) +
         ": gloo connects every process to every other over one address family; give main_address an " + name(f) +
         " address of this machine that the nodes reach" +
         (f == AF_INET6 ? " (main_address = \"::1\" on one machine)" : " (main_address = \"127.0.0.1\" on one machine)") +
         ", or the nodes " + name(main_family) + " addresses";
}

// Two cluster nodes whose hosts reach one address on the same port: one daemon under two names (the file's own
// check compares the text: 127.0.0.1:7001 and localhost:7001 passed, and the second was "busy with another
// job", this one). "" when none.
std::string one_daemon_twice(const graph::cluster_spec& c) {
  for (std::size_t a = 0; a < c.nodes.size(); ++a)
    for (std::size_t b = a + 1; b < c.nodes.size(); ++b) {
      const auto& x = c.nodes[a];
      const auto& y = c.nodes[b];
      if (x.port != y.port || x.host == y.host) continue;  // the same text is the parser's error
      const auto ax = host_addresses(x.host), ay = host_addresses(y.host);
      for (const auto& addr : ax)
        if (ay.count(addr))
          return "cluster nodes '" + x.name + "' (" + x.host_port() + ") and '" + y.name + "' (" + y.host_port() +
                 ") are one daemon: both reach " + addr + " port " +
                 std::to_string(x.port) +
                 (y.address_pos.known() ? " (address at " + y.address_pos.file + ":" + std::to_string(y.address_pos.line) + ")"
                                        : std::string()) +
                 "; each cluster node is one `flowrun node` daemon (one job at a time): start another daemon on "
                 "another port, or place both nodes' replicas on '" + x.name + "'";
    }
  return "";
}

// The first step of the handshake: the daemon's nonce and proof for `client_nonce`; "" or the error.
std::string hello(caf::actor_system& sys, caf::scoped_actor& self, const caf::actor& gate,
                  const std::string& client_nonce, std::chrono::milliseconds timeout, std::string* daemon_nonce,
                  std::string* daemon_proof) {
  std::string failure;
  self->request(gate, timeout, hello_atom::value, client_nonce)
      .receive(
          [&](std::string& n, std::string& proof) {
            *daemon_nonce = std::move(n);
            *daemon_proof = std::move(proof);
          },
          [&](caf::error& e) { failure = sys.render(e); });
  return failure;
}

// The coordinator's link: a blocking actor on a std::thread of its own
// (link_loop), not a detached CAF actor. It polls the nodes' replica counters
// every heartbeat_ms and turns session exits and the liveness monitor's
// verdicts (liveness.h: UDP, a thread of its own) into node losses. A detached actor would make
// ~actor_system wait for its thread until the actor is destroyed: after a
// cluster run, something in CAF 0.17's middleman could keep a reference to
// it, and `flowrun run` printed its summary and then hung (cluster_small,
// about one run in three under load). A scoped actor on our own thread is
// destroyed when the loop ends, whoever still points at it.
//
// Messages: watch(coordinator, sessions, process indices, heartbeat_ms,
// lost_after_ms) starts the counter polls; beat(i, seq, uptime_ms, counters)
// from session i; lost(i, why) from the liveness monitor; down_msg from a
// session; cend ends the loop once every session that was not lost has gone down (its
// "closed" line logged), or after 2 s: a remote session's down message can come after the
// local cend, and a clean run must name every session closed.
void link_loop(caf::actor_system& sys, std::shared_ptr<beat_table> table, std::promise<caf::actor> ready) {
  caf::scoped_actor self{sys, true};
  ready.set_value(caf::actor_cast<caf::actor>(self.ptr()));
  caf::actor coordinator;
  std::vector<caf::actor> sessions;
  std::vector<std::uint32_t> process;  // placement index of each session
  std::int64_t heartbeat_ms = 500, seq = 0;
  bool watching = false, running = true, ending = false;
  std::vector<bool> down;  // per session: its down message came
  clk::time_point next_tick = clk::now(), end_by;
  // After cend: done when every session is down or lost, or at end_by.
  auto settled = [&] {
    if (clk::now() >= end_by) return true;
    std::lock_guard<std::mutex> lock(table->mutex);
    for (std::size_t i = 0; i < sessions.size(); ++i)
      if (!down[i] && !(i < table->lost.size() && table->lost[i])) return false;
    return true;
  };
  auto lose = [&](std::size_t i, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(table->mutex);
      if (table->lost[i]) return;
      table->lost[i] = true;
      table->lost_why[i] = why;
    }
    spdlog::error("cluster node '{}' ({}) lost: {}", table->names[i], table->addresses[i], why);
    // The ranks that wait in a collective for the lost node's ranks, here and on the other nodes, fail
    // now: a node that stopped without closing its sockets (SIGSTOP, a partition) held them until
    // comm_timeout_s before the run could stop or restart (docs/scaling.md).
    const std::string abort_why = "cluster node '" + table->names[i] + "' was lost (" + why + ")";
    if (int n = comm::abort_spanning(table->scope, table->names[i], abort_why))
      spdlog::warn("aborted the collectives of {} rank group(s) on main that span '{}'", n, table->names[i]);
    for (std::size_t j = 0; j < sessions.size(); ++j) {
      std::lock_guard<std::mutex> lock(table->mutex);
      if (j != i && !table->lost[j]) self->send(sessions[j], peer_lost_atom::value, table->names[i], abort_why);
    }
    self->send(coordinator, node_lost_atom::value, process[i], why);
  };
  auto tick = [&] {
    ++seq;
    std::int64_t checkpoint_gen = 0;  // main's console requests go to the nodes with every poll
    {
      std::lock_guard<std::mutex> lock(table->mutex);
      if (table->live) checkpoint_gen = static_cast<std::int64_t>(table->live->checkpoint_generation());
    }
    for (std::size_t i = 0; i < sessions.size(); ++i) {
      {
        std::lock_guard<std::mutex> lock(table->mutex);
        if (table->lost[i] || table->closing) continue;
      }
      std::int64_t seen = 0;
      {
        std::lock_guard<std::mutex> lock(table->mutex);
        if (i < table->printed_seen.size()) seen = static_cast<std::int64_t>(table->printed_seen[i]);
      }
      self->send(sessions[i], beat_atom::value, static_cast<std::uint32_t>(i), seq, checkpoint_gen, seen);
    }
  };
  while (running) {
    if (watching && clk::now() >= next_tick) {
      tick();
      next_tick = clk::now() + std::chrono::milliseconds(heartbeat_ms);
    }
    const auto wait = ending     ? std::int64_t{20}
                      : watching ? std::max<std::int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                 next_tick - clk::now()).count())
                                 : std::int64_t{200};
    self->receive(
        [&](watch_atom, caf::actor c, const std::vector<caf::actor>& s, const std::vector<char>& process_bytes,
            std::int64_t hb, std::int64_t lost_after) {
          coordinator = std::move(c);
          sessions = s;
          process = unpack<std::uint32_t>(process_bytes);
          heartbeat_ms = std::max<std::int64_t>(1, hb);
          (void)lost_after;  // the liveness monitor judges silence
          watching = true;
          next_tick = clk::now();
          down.assign(sessions.size(), false);
          for (auto& x : sessions) self->monitor(x);
        },
        [&](lost_atom, std::uint32_t i, const std::string& why) {  // the liveness monitor's verdict
          bool closing = false;
          {
            std::lock_guard<std::mutex> lock(table->mutex);
            closing = table->closing;
          }
          if (i < sessions.size() && !closing) lose(i, why);
        },
        [&](beat_atom, std::uint32_t i, std::int64_t, std::int64_t, std::vector<char>& counters,
            std::int64_t honoured, const std::vector<std::string>& capable, std::int64_t first,
            const std::vector<std::string>& printed) {
          if (i >= sessions.size()) return;
          std::lock_guard<std::mutex> lock(table->mutex);
          print_node_lines(*table, i, first, printed);
          if (table->live) table->live->note_remote_checkpoints(static_cast<std::uint64_t>(std::max<std::int64_t>(0, honoured)), capable);
          if (i < table->counters.size() && !counters.empty()) {
            table->counters[i] = std::move(counters);
            table->counters_new[i] = true;
          }
        },
        [&](caf::down_msg& dm) {
          bool closing = false;
          {
            std::lock_guard<std::mutex> lock(table->mutex);
            closing = table->closing;
          }
          for (std::size_t i = 0; i < sessions.size(); ++i)
            if (sessions[i].address() != dm.source) continue;
            else if (down[i] = true; closing && !dm.reason)  // end() asked it to finish and it quit normally: not a loss
              spdlog::info("session with cluster node '{}' ({}) closed", table->names[i], table->addresses[i]);
            else
              lose(i, dm.reason == caf::exit_reason::user_shutdown
                          ? std::string("its daemon is shutting down (SIGINT or SIGTERM)")
                          : dm.reason == caf::exit_reason::remote_link_unreachable
                                ? "its connection dropped: " + sys.render(dm.reason)
                                : dm.reason ? "its session ended: " + sys.render(dm.reason)
                                            : std::string("its session ended on its own (the node stopped its part: "
                                                          "it had lost contact with this process)"));
        },
        [&](cend_atom) {
          ending = true;
          end_by = clk::now() + std::chrono::seconds(2);
        },
        caf::after(std::chrono::milliseconds(wait)) >> [] {});
    if (ending && settled()) running = false;
  }
}

}  // namespace cl

struct cluster_run::impl {
  caf::actor_system& sys;
  caf::actor link;           // the scoped actor of link_thread
  std::thread link_thread;   // runs cl::link_loop until it gets cend
  std::shared_ptr<cl::beat_table> table;
  std::unique_ptr<liveness_monitor> monitor;  // pings the nodes (UDP, a thread of its own)
  struct conn {
    std::string name, address;
    std::uint32_t process = 0;
    caf::actor session;
    std::int64_t liveness_port = 0;  // its session's liveness responder (UDP)
  };
  std::vector<conn> conns;
  placement where;
  std::optional<job_part> part;
  job j;
  cross_process_counts at_start;
  bool ended = false;
  std::shared_ptr<bulk_plane> bulk;  // this process's end of the bulk plane (null: no tensors cross)
  caf::actor kv;  // the run's rendezvous store (comm::spawn_kv_store; node_context::rendezvous_store)
  cluster_view planned;  // planned_cluster_view; view() adds states and heartbeat ages

  explicit impl(caf::actor_system& s) : sys(s) {}
  ~impl() {
    monitor.reset();
    if (kv) caf::anon_send_exit(kv, caf::exit_reason::user_shutdown);
    if (link_thread.joinable()) {
      caf::anon_send(link, cl::cend_atom::value);
      link_thread.join();
    }
  }

  // Stops what was started (after an error while starting).
  void abandon() {
    monitor.reset();
    if (part) {
      abort_part(*part);
      release_part(*part);
      part.reset();
    }
    for (auto& c : conns)
      if (c.session) caf::anon_send_exit(c.session, caf::exit_reason::user_shutdown);
    if (link) caf::anon_send(link, cl::cend_atom::value);
    if (kv) caf::anon_send_exit(kv, caf::exit_reason::user_shutdown);
  }
};

cluster_run::cluster_run(std::unique_ptr<impl> p) : p_(std::move(p)) {}

cluster_run::~cluster_run() {
  if (p_ && !p_->ended) p_->abandon();
}

job& cluster_run::the_job() { return p_->j; }

expected<std::unique_ptr<cluster_run>> cluster_run::start(caf::actor_system& sys, const graph::graph_spec& spec,
                                                          const graph::node_kind_registry& kinds,
                                                          const node_factory_registry& factories,
                                                          const run_options& options, std::string* failed_node) {
  auto blame = [&](const std::string& name) {
    if (failed_node) *failed_node = name;
  };
  using namespace std::chrono;
  auto p = std::make_unique<impl>(sys);
  p->at_start = cross_process_totals();
  p->planned = planned_cluster_view(spec, !options.cluster.tls_cert.empty());
  // Connecting, the handshake and each start-up request: at most connect_timeout_ms each.
  const auto timeout = milliseconds(std::max<std::int64_t>(1, spec.cluster.connect_timeout_ms));
  // The processes: main, then the cluster nodes that hold a replica, in cluster order.
  placement pl;
  // the lost-node message promises a restart only while restarts are left, and says when none is
  const bool restart_policy = spec.cluster.on_node_lost == "restart";
  const bool restart_left = restart_policy && options.attempt < spec.cluster.max_restarts;
  pl.on_node_lost = restart_left ? "restart" : "stop";
  if (restart_policy && !restart_left) pl.restarts_used_up = spec.cluster.max_restarts;
  pl.processes.push_back(std::string(graph::main_process_name));
  std::map<std::string, std::uint32_t> index{{std::string(graph::main_process_name), 0}};
  for (const auto& cn : spec.cluster.nodes) {
    bool used = false;
    for (const auto& n : spec.nodes)
      for (std::int64_t r = 0; r < n.replicas; ++r) used = used || graph::placement_of(n, r) == cn.name;
    if (!used) continue;
    index[cn.name] = static_cast<std::uint32_t>(pl.processes.size());
    pl.processes.push_back(cn.name);
  }
  std::vector<std::string> actors_of(pl.processes.size());
  std::vector<std::uint32_t> where_flat;
  for (const auto& n : spec.nodes) {
    std::vector<std::uint32_t> row;
    for (std::int64_t r = 0; r < n.replicas; ++r) {
      auto it = index.find(graph::placement_of(n, r));
      if (it == index.end())
        return error_text{"node '" + n.name + "' is placed on '" + graph::placement_of(n, r) +
                          "', which is not a node of the cluster"};
      row.push_back(it->second);
      where_flat.push_back(it->second);
      auto& a = actors_of[it->second];
      a += (a.empty() ? "" : " ") + n.name + (n.replicas > 1 ? "[" + std::to_string(r) + "]" : "");
    }
    pl.where.push_back(std::move(row));
  }
  // Before connecting anywhere: every edge that crosses processes must carry a
  // type that can cross (a codec); types with tensors need the bulk plane.
  bool bulk_needed = false;
  std::map<std::string_view, const graph::node_spec*> node_named;  // one lookup per edge, not a scan
  for (const auto& n : spec.nodes) node_named.emplace(n.name, &n);
  auto named = [&](const std::string& name) -> const graph::node_spec* {
    auto it = node_named.find(name);
    return it == node_named.end() ? nullptr : it->second;
  };
  for (const auto& e : spec.edges) {
    const auto* from = named(e.from_node);
    const auto* to = named(e.to_node);
    const auto* kind = from ? kinds.lookup(from->kind) : nullptr;
    if (!from || !to || !kind) continue;  // spawn_part reports these
    std::string type;
    for (const auto* port : kind->ports_of(graph::port_dir::out))
      if (port->name == e.from_port) type = port->message_type;
    if (type.empty()) continue;
    const bool codec = has_payload_codec(type), bulk = has_bulk_codec(type);
    for (std::int64_t a = 0; a < from->replicas; ++a)
      for (std::int64_t b = 0; b < to->replicas; ++b) {
        const auto pa = graph::placement_of(*from, a), pb = graph::placement_of(*to, b);
        if (pa == pb) continue;
        if (!codec)
          return error_text{"edge " + e.to_string() + " crosses from cluster node '" + pa + "' to '" + pb +
                            "', but its message type '" + type +
                            "' cannot cross processes (it has no codec): place both ends on the same node (on = \"...\")"};
        bulk_needed = bulk_needed || bulk;
      }
  }
  // main's bulk-plane host, before any node is connected: one that does not resolve failed the run only at
  // the bulk plane, after every node had been set up
  if (bulk_needed && !cl::host_resolves(spec.cluster.main_address)) {
    const auto& at = spec.cluster.main_address_pos;
    return error_text{"[cluster] main_address = \"" + spec.cluster.main_address + "\" does not resolve" +
                      (at.known() ? " (at " + at.file + ":" + std::to_string(at.line) + ")" : std::string()) +
                      ": give the name or address of this machine that the cluster nodes reach (the bulk plane "
                      "listens there)"};
  }
  if (bulk_needed)
    if (const std::string differ = cl::bulk_families_differ(spec.cluster, pl.processes); !differ.empty())
      return error_text{differ};
  if (const std::string twice = cl::one_daemon_twice(spec.cluster); !twice.empty()) return error_text{twice};
  p->table = std::make_shared<cl::beat_table>();
  p->table->scope = comm::attempt_scope(options.run_id, options.attempt);
  // A thread of its own: heartbeats must not wait for a worker thread that a training step holds.
  {
    std::promise<caf::actor> ready;
    auto handle = ready.get_future();
    p->link_thread = std::thread(cl::link_loop, std::ref(sys), p->table, std::move(ready));
    p->link = handle.get();
  }
  caf::scoped_actor self{sys};
  // tls_error_queue.h: without it one node's dropped TLS connection can close another's.
  if (!options.cluster.tls_cert.empty() && options.attempt == 0 && !tls_error_queue_cleared())
    spdlog::warn("cluster run: SSL_read and SSL_write are not flowrun's here (tls_error_queue.h): when one node's TLS "
                 "connection drops, another's may be closed with it");
  // Connect and authenticate, both ways.
  for (std::uint32_t i = 1; i < pl.processes.size(); ++i) {
    const auto* cn = spec.cluster.find(pl.processes[i]);
    const std::string address = cn->host_port();
    const std::string who = "cluster node '" + cn->name + "' (" + address + ")";
    // A daemon started at the same time as the run (a script, a scheduler) may not listen yet: the
    // first attempt tries again while the port refuses, until connect_timeout_ms has passed.
    const auto deadline = cl::clk::now() + timeout;
    const std::string where = cn->address_pos.known() ? " (address at " + cn->address_pos.file + ":" +
                                                            std::to_string(cn->address_pos.line) + ")"
                                                      : std::string();
    bool timed_out = false, waited = false;
    expected<caf::actor> gate = error_text{"not connected"};
    for (;;) {
      const auto left =
          connect_attempt_budget(duration_cast<milliseconds>(deadline - cl::clk::now()), timeout, waited);
      gate = cl::connect_gate(sys, self, cn->host, cn->port, !options.cluster.tls_cert.empty(), left, &timed_out);
      if (gate || timed_out || options.attempt > 0 || !cl::refused(gate.error(), cn->host) || cl::clk::now() >= deadline)
        break;
      if (!waited)
        spdlog::info("{}: nothing listens there yet; trying again until connect_timeout_ms = {} has passed", who,
                     timeout.count());
      waited = true;
      std::this_thread::sleep_for(milliseconds(200));
    }
    if (!gate && cl::no_such_host(gate.error(), cn->host)) {
      p->abandon();
      blame(cn->name);
      return error_text{"cluster node '" + cn->name + "': its host '" + cn->host + "' does not resolve" + where +
                        ": fix the address (HOST:PORT of `flowrun node --listen`)"};
    }
    if (!gate && cl::refused(gate.error(), cn->host)) {
      p->abandon();
      blame(cn->name);
      return error_text{"cannot reach " + who + ": nothing listens on port " + std::to_string(cn->port) +
                        (waited ? " (connections refused for connect_timeout_ms = " + std::to_string(timeout.count()) +
                                      " ms)"
                                : std::string(" (connection refused)")) +
                        ": start `flowrun node --listen " + address + " --secret-file FILE` there first, or fix the address" +
                        where};
    }
    {
      if (timed_out) {
        p->abandon();
        blame(cn->name);
        return error_text{who + ": no flowrun node answered within " + std::to_string(timeout.count()) +
                          " ms: is `flowrun node --listen " + address +
                          "` running there? (something accepts connections on that port but does not speak "
                          "flowrun's protocol; [cluster] connect_timeout_ms sets the limit)"};
      }
    }
    if (!gate) {
      p->abandon();
      blame(cn->name);
      return error_text{"cannot reach " + who + ": " + gate.error() + " (is `flowrun node --listen " +
                        address + "` running there" +
                        (options.cluster.tls_cert.empty()
                             ? std::string("? A daemon started with --tls-cert/--tls-key/--tls-ca refuses a run "
                                           "without them: give this run the same three options)")
                             : std::string(" with TLS, and is its certificate one our --tls-ca trusts, and ours one "
                                           "its CA trusts? A daemon without TLS refuses this run's TLS)"))};
    }
    const std::string client_nonce = random_nonce();
    std::string daemon_nonce, daemon_proof;
    std::string failure = cl::hello(sys, self, *gate, client_nonce, timeout, &daemon_nonce, &daemon_proof);
    if (!failure.empty() || !is_nonce(daemon_nonce)) {
      p->abandon();
      blame(cn->name);
      return error_text{who + " did not answer the cluster handshake: " +
                        (failure.empty() ? std::string("malformed reply") : failure) +
                        " (is a flowrun node listening there, of the same version?)"};
    }
    const bool daemon_ok = constant_time_equal(
        daemon_proof, cluster_proof(options.cluster.secret, "daemon", client_nonce, daemon_nonce));
    // The proof goes out even when the daemon's is wrong, so that both sides report the mismatch.
    std::string verdict;
    caf::actor session;
    self->request(*gate, timeout, cl::auth_atom::value, client_nonce, daemon_nonce,
                  cluster_proof(options.cluster.secret, "client", client_nonce, daemon_nonce), p->link)
        .receive(
            [&](std::string& v, caf::actor& s) {
              verdict = std::move(v);
              session = std::move(s);
            },
            [&](caf::error& e) { failure = sys.render(e); });
    if (!failure.empty()) {
      p->abandon();
      blame(cn->name);
      return error_text{who + " did not answer the cluster handshake: " + failure};
    }
    if (!daemon_ok || !verdict.empty()) {
      p->abandon();
      return error_text{"authentication with " + who + " failed: wrong cluster secret (" +
                        (!daemon_ok ? std::string("the node's proof does not match our secret")
                                    : std::string("the node says: ") + verdict) +
                        "); every node and the flowrun run process need the same --secret-file or "
                        "FLOWRUN_CLUSTER_SECRET"};
    }
    p->conns.push_back({cn->name, address, i, session});
    spdlog::info("cluster node '{}' ({}): authenticated; actors there: {}", cn->name, address, actors_of[i]);
  }
  // The run's rendezvous store: an actor on main for the whole run, which the
  // nodes reach over their session connections (no port of its own). The
  // bulk plane joins through it, and so do nodes that form communicator
  // groups of their own (node_context::rendezvous_store, e.g. zero_rank).
  const std::string& host = spec.cluster.main_address;
  p->kv = comm::spawn_kv_store(sys);
  run_options run_opts = options;
  run_opts.rendezvous_store = comm::actor_store(sys, p->kv);
  // The bulk plane: a gloo group of every process of the run (rank = process
  // index). Only when some edge moves tensors between processes.
  if (bulk_needed) {
    const auto plane_timeout = std::max<milliseconds>(timeout, milliseconds(60000));
    const std::string prefix = "flowrun/bulk/" + random_nonce().substr(0, 16);
    const auto world = static_cast<std::uint32_t>(pl.processes.size());
    std::vector<caf::response_handle<caf::blocking_actor, caf::message, true>> asks;
    for (auto& c : p->conns) {
      const auto* cn = spec.cluster.find(c.name);
      asks.push_back(self->request(c.session, plane_timeout + milliseconds(5000), cl::comm_atom::value, p->kv,
                                   c.process, world, cn->host, static_cast<std::int64_t>(plane_timeout.count()),
                                   prefix));
    }
    std::string main_error;
    try {
      p->bulk = cl::join_bulk_plane(comm::actor_store(sys, p->kv, plane_timeout), 0, static_cast<int>(world), host,
                                    plane_timeout, prefix);
    } catch (const std::exception& e) {
      main_error = e.what();
    }
    std::string node_errors;
    // When main cannot join (its address is not this machine's, say), the
    // nodes would wait for it until their timeout: do not wait for them.
    for (std::size_t i = 0; i < asks.size() && main_error.empty(); ++i) {
      std::string err;
      asks[i].receive([&](std::string& e) { err = std::move(e); }, [&](caf::error& e) { err = sys.render(e); });
      if (!err.empty()) node_errors += "; cluster node '" + p->conns[i].name + "': " + err;
    }
    if (!main_error.empty() || !node_errors.empty()) {
      p->abandon();
      return error_text{"the bulk plane (gloo over every process of the run, for the tensors that cross nodes) did "
                        "not connect: " +
                        (main_error.empty() ? std::string() : "main: " + main_error) + node_errors +
                        " (the nodes must reach [cluster] main_address = \"" + host +
                        "\" and each other at their addresses' hosts, on any TCP port)"};
    }
    pl.bulk = p->bulk;
    spdlog::info("bulk plane: {} processes joined (gloo; main listens on {})", world, host);
    if (!options.cluster.tls_cert.empty())
      spdlog::warn("bulk plane: tensors between nodes travel over plain TCP (gloo), not TLS");
  }
  // This process's replicas.
  auto part = spawn_part(sys, spec, kinds, factories, run_opts, pl);
  if (!part) {
    p->abandon();
    return error_text{part.error()};
  }
  p->part = std::move(*part);
  p->where = pl;
  for (auto& c : p->conns)
    p->part->live->event("cluster", "", -1,
                         "cluster node '" + c.name + "' (" + c.address + "): authenticated; actors there: " +
                             actors_of[c.process]);
  std::size_t total = where_flat.size();
  std::vector<caf::actor> all(total);
  {
    std::size_t k = 0;
    for (std::size_t i = 0; i < where_flat.size(); ++i)
      if (where_flat[i] == 0) all[i] = p->part->local[k++];
  }
  // Each node's replicas.
  const std::string toml = graph::to_toml(spec);
  for (auto& c : p->conns) {
    std::string err, failure;
    std::vector<caf::actor> local;
    self->request(c.session, timeout, cl::job_atom::value, toml, pl.processes, cl::pack(where_flat), c.process,
                  spec.cluster.heartbeat_ms, spec.cluster.lost_after_ms, options.run_id, options.attempt,
                  p->kv)
        .receive(
            [&](std::string& e, std::vector<caf::actor>& l, std::int64_t liveness_port) {
              err = std::move(e);
              local = std::move(l);
              c.liveness_port = liveness_port;
            },
            [&](caf::error& e) { failure = sys.render(e); });
    if (!failure.empty() || !err.empty()) {
      p->abandon();
      blame(c.name);
      return error_text{"cluster node '" + c.name + "' (" + c.address + ") could not start its part: " +
                        (failure.empty() ? err : failure)};
    }
    std::size_t k = 0;
    for (std::size_t i = 0; i < where_flat.size(); ++i)
      if (where_flat[i] == c.process) {
        if (k >= local.size()) break;
        all[i] = local[k++];
      }
    if (k != local.size() || std::count(where_flat.begin(), where_flat.end(), c.process) != static_cast<long>(k)) {
      p->abandon();
      return error_text{"cluster node '" + c.name + "' spawned " + std::to_string(local.size()) +
                        " replicas, not the number placed there"};
    }
  }
  // The table, everywhere.
  auto ok = set_actor_table(*p->part, all);
  if (!ok) {
    p->abandon();
    return error_text{ok.error()};
  }
  for (auto& c : p->conns) {
    std::string err, failure;
    self->request(c.session, timeout, cl::table_atom::value, all)
        .receive([&](std::string& e) { err = std::move(e); }, [&](caf::error& e) { failure = sys.render(e); });
    if (!failure.empty() || !err.empty()) {
      p->abandon();
      blame(c.name);
      return error_text{"cluster node '" + c.name + "' could not wire its replicas: " + (failure.empty() ? err : failure)};
    }
  }
  p->j = start_part(sys, *p->part);
  {
    std::lock_guard<std::mutex> lock(p->table->mutex);
    for (auto& c : p->conns) {
      p->table->names.push_back(c.name);
      p->table->addresses.push_back(c.address);
      p->table->actors.push_back(actors_of[c.process]);
      p->table->last_ms.push_back(-1);
      p->table->lost.push_back(false);
      p->table->lost_why.emplace_back();
      p->table->counters.emplace_back();
      p->table->counters_new.push_back(false);
      p->table->printed_seen.push_back(0);
    }
  }
  std::vector<caf::actor> sessions;
  std::vector<std::uint32_t> procs;
  std::vector<liveness_monitor::peer> peers;
  for (auto& c : p->conns) {
    sessions.push_back(c.session);
    procs.push_back(c.process);
    peers.push_back({spec.cluster.find(c.name)->host, static_cast<int>(c.liveness_port)});
  }
  // Liveness: UDP pings from a thread of their own, judged by a φ accrual detector (liveness.h).
  try {
    auto table = p->table;
    caf::actor link = p->link;
    p->monitor = std::make_unique<liveness_monitor>(
        peers, options.cluster.secret, options.run_id + "/" + std::to_string(options.attempt),
        phi_settings::for_cluster(spec.cluster.heartbeat_ms, spec.cluster.lost_after_ms),
        [table](std::size_t i) {
          std::lock_guard<std::mutex> lock(table->mutex);
          if (i < table->last_ms.size())
            table->last_ms[i] =
                std::chrono::duration_cast<std::chrono::milliseconds>(cl::clk::now() - table->t0).count();
        },
        [link](std::size_t i, const std::string& why) {
          caf::anon_send(link, cl::lost_atom::value, static_cast<std::uint32_t>(i), why);
        });
  } catch (const std::exception& e) {
    p->abandon();
    return error_text{std::string("cluster run: ") + e.what()};
  }
  {
    std::lock_guard<std::mutex> lock(p->table->mutex);
    if (p->part) p->table->live = p->part->live;
  }
  caf::anon_send(p->link, cl::watch_atom::value, p->j.coordinator, sessions, cl::pack(procs), spec.cluster.heartbeat_ms,
                 spec.cluster.lost_after_ms);
  spdlog::info("cluster run: main holds {}; {}", actors_of[0].empty() ? std::string("no actors") : actors_of[0],
               std::to_string(p->conns.size()) + " node(s) connected, heartbeat every " +
                   std::to_string(spec.cluster.heartbeat_ms) + " ms, lost after " +
                   std::to_string(spec.cluster.lost_after_ms) + " ms");
  return std::unique_ptr<cluster_run>(new cluster_run(std::move(p)));
}

std::string cluster_run::status() const {
  const auto& t = *p_->table;
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(cl::clk::now() - t.t0).count();
  std::string s;
  for (std::size_t i = 0; i < t.names.size(); ++i) {
    s += (s.empty() ? "" : "; ") + t.names[i] + " (" + t.addresses[i] + ", " + t.actors[i] + "): ";
    if (t.lost[i]) s += "lost";
    else if (t.last_ms[i] < 0) s += "no heartbeat yet";
    else s += "heartbeat " + std::to_string(now - t.last_ms[i]) + " ms ago";
  }
  return s;
}

cluster_view cluster_run::view() const {
  cluster_view v = p_->planned;
  const auto& t = *p_->table;
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(cl::clk::now() - t.t0).count();
  for (auto& n : v.nodes) {
    if (n.name == graph::main_process_name) continue;
    for (std::size_t i = 0; i < t.names.size(); ++i) {
      if (t.names[i] != n.name) continue;
      // after end() began, a node not lost had its session closed with the run (it read "connected" in the
      // console's linger after the sessions had closed)
      n.state = t.lost[i] ? "lost" : t.closing ? "closed" : "connected";
      n.lost_reason = t.lost[i] ? t.lost_why[i] : std::string();
      n.heartbeat_age_ms = t.last_ms[i] < 0 ? -1 : now - t.last_ms[i];
    }
  }
  return v;
}

void cluster_run::sync_metrics() {
  auto& p = *p_;
  if (!p.part || !p.part->metrics) return;
  std::vector<std::vector<char>> fresh;
  {
    std::lock_guard<std::mutex> lock(p.table->mutex);
    for (std::size_t i = 0; i < p.table->counters.size(); ++i)
      if (p.table->counters_new[i]) {
        fresh.push_back(p.table->counters[i]);
        p.table->counters_new[i] = false;
      }
  }
  for (const auto& b : fresh) apply_replica_counters(*p.part->metrics, b);
}

void cluster_run::publish_live() {
  auto& p = *p_;
  if (!p.part || !p.part->live) return;
  const auto& t = *p.table;
  std::vector<std::string> text(p.where.processes.size());
  std::vector<bool> lost(p.where.processes.size(), false);
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(cl::clk::now() - t.t0).count();
    for (std::size_t i = 0; i < p.conns.size() && i < t.names.size(); ++i) {
      const auto proc = p.conns[i].process;
      std::string s = "on " + t.names[i] + " (" + t.addresses[i] + "), ";
      if (t.lost[i]) s += "LOST";
      else if (t.last_ms[i] < 0) s += "no heartbeat yet";
      else s += "heartbeat " + std::to_string(now - t.last_ms[i]) + " ms ago";
      text[proc] = std::move(s);
      lost[proc] = t.lost[i];
    }
  }
  auto& live = *p.part->live;
  const auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(cl::clk::now() - p.part->metrics->start()).count();
  for (std::size_t n = 0; n < p.where.where.size(); ++n)
    for (std::size_t r = 0; r < p.where.where[n].size(); ++r) {
      const auto proc = p.where.where[n][r];
      if (proc == p.where.self || text[proc].empty()) continue;
      auto& rl = live.replica(n, r);
      rl.set_phase(text[proc]);
      if (lost[proc]) {
        rl.set_failure("lost with cluster node '" + p.where.processes[proc] + "'");
        rl.set_state(replica_state::failed, now_ns);
      }
    }
}

std::string cluster_run::end() {
  auto& p = *p_;
  if (p.ended) return {};
  p.ended = true;
  caf::scoped_actor self{p.sys};
  const auto mine = cross_process_totals();
  std::uint64_t beats_sent = 0;
  std::vector<bool> lost;
  {
    std::lock_guard<std::mutex> lock(p.table->mutex);
    p.table->closing = true;
    beats_sent = p.monitor ? p.monitor->pings() : 0;
    lost = p.table->lost;
  }
  if (p.monitor) p.monitor->stop_judging();
  // The job finished: remote replicas (state remote; failed when their node
  // was lost) end as the run did.
  if (p.part && p.part->live && p.j.state) {
    const auto final_state =
        p.j.state->reason() == stop_reason::completed ? replica_state::done : replica_state::stopped;
    const auto now_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(cl::clk::now() - p.part->metrics->start()).count();
    for (std::size_t n = 0; n < p.where.where.size(); ++n)
      for (std::size_t r = 0; r < p.where.where[n].size(); ++r) {
        if (p.where.where[n][r] == p.where.self) continue;
        auto& rl = p.part->live->replica(n, r);
        if (rl.state() == replica_state::remote) rl.set_state(final_state, now_ns);
      }
  }
  std::uint64_t td = mine.data_msgs - p.at_start.data_msgs, tb = mine.data_bytes - p.at_start.data_bytes,
                tc = mine.control_msgs - p.at_start.control_msgs, th = beats_sent;
  const auto mb = p.bulk ? p.bulk->stats() : bulk_stats{};
  std::uint64_t tbp = mb.sends, tbt = mb.tensors_sent, tbb = mb.bytes_sent;
  std::string report = "cross-process traffic: main sent " + std::to_string(td) + " data messages (" +
                       std::to_string(tb) + " payload bytes), " + std::to_string(tc) + " control messages, " +
                       std::to_string(beats_sent) + " heartbeats";
  if (p.bulk)
    report += ", " + std::to_string(mb.sends) + " bulk payloads (" + std::to_string(mb.tensors_sent) + " tensors, " +
              std::to_string(mb.bytes_sent) + " communicator bytes)";
  for (std::size_t i = 0; i < p.conns.size(); ++i) {
    auto& c = p.conns[i];
    // lost by the link's verdict, or by the coordinator's (a dropped connection reaches it first:
    // the link may mark it a moment after this end began)
    if ((i < lost.size() && lost[i]) || (p.j.state && p.j.state->lost(c.process))) {
      report += "; " + c.name + ": lost";
      continue;
    }
    std::vector<std::uint64_t> counts;
    std::int64_t seen = 0;
    {
      std::lock_guard<std::mutex> lock(p.table->mutex);
      if (i < p.table->printed_seen.size()) seen = static_cast<std::int64_t>(p.table->printed_seen[i]);
    }
    self->request(c.session, std::chrono::seconds(5), cl::cend_atom::value, seen)
        .receive(
            [&](std::vector<char>& v, std::vector<char>& final_counters, std::int64_t first,
                std::vector<std::string>& printed) {
              {  // its last lines (the heartbeats carried the rest)
                std::lock_guard<std::mutex> lock(p.table->mutex);
                cl::print_node_lines(*p.table, i, first, printed);
              }
              counts = cl::unpack<std::uint64_t>(v);
              // the node's replicas as they ended: main's summary and console show them
              if (p.part && !final_counters.empty()) apply_replica_counters(*p.part->metrics, final_counters);
            },
            [&](caf::error&) {});
    if (counts.size() == 7) {
      report += "; " + c.name + " sent " + std::to_string(counts[0]) + " data messages (" + std::to_string(counts[1]) +
                " payload bytes), " + std::to_string(counts[2]) + " control messages, " + std::to_string(counts[3]) +
                " heartbeat replies";
      if (p.bulk)
        report += ", " + std::to_string(counts[4]) + " bulk payloads (" + std::to_string(counts[5]) + " tensors, " +
                  std::to_string(counts[6]) + " communicator bytes)";
      tbp += counts[4];
      tbt += counts[5];
      tbb += counts[6];
      td += counts[0];
      tb += counts[1];
      tc += counts[2];
      th += counts[3];
    } else {  // a node that cannot answer at the end is lost, whatever ended the job first
      report += "; " + c.name + ": no answer";
      std::lock_guard<std::mutex> lock(p.table->mutex);
      if (!p.table->lost[i]) {
        p.table->lost[i] = true;
        p.table->lost_why[i] = "it did not answer at the end of the run (its process or connection is gone)";
        spdlog::error("cluster node '{}' ({}) lost: {}", c.name, c.address, p.table->lost_why[i]);
      }
    }
  }
  report += "; total " + std::to_string(td) + " data messages, " + std::to_string(tb) + " payload bytes, " +
            std::to_string(tc) + " control messages, " + std::to_string(th) + " heartbeat messages";
  if (p.bulk)
    report += ", " + std::to_string(tbp) + " bulk payloads (" + std::to_string(tbt) + " tensors, " +
              std::to_string(tbb) + " communicator bytes)";
  p.monitor.reset();
  caf::anon_send(p.link, cl::cend_atom::value);
  if (p.part) {
    release_part(*p.part);
    p.part.reset();
  }
  p.j = job{};
  p.bulk.reset();
  if (p.kv) caf::anon_send_exit(p.kv, caf::exit_reason::user_shutdown);
  p.kv = nullptr;
  return report;
}

bool daemon_answers(caf::actor_system& sys, const std::string& host, int port, bool tls,
                    std::chrono::milliseconds timeout) {
  caf::scoped_actor self{sys};
  bool timed_out = false;
  auto gate = cl::connect_gate(sys, self, host, port, tls, timeout, &timed_out);
  if (!gate) return false;
  std::string nonce, proof;
  return cl::hello(sys, self, *gate, random_nonce(), timeout, &nonce, &proof).empty() && is_nonce(nonce);
}

}  // namespace flowrun::actor
