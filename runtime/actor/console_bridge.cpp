#include "runtime/actor/console_bridge.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <stdexcept>
#include <thread>

#include "runtime/actor/console.h"
#include "runtime/graph/parse.h"
#include "runtime/console/hub.h"
#include "runtime/console/server.h"

namespace flowrun::actor {

namespace fc = ::flowrun::console;

namespace {

std::int64_t rss_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<std::int64_t>(resident) * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

fc::graph_info describe_graph(const graph::graph_spec& spec, std::int64_t default_credit) {
  fc::graph_info g;
  g.name = spec.name;
  g.file = spec.source_file.string();
  g.seed = spec.seed;
  g.steps = spec.steps;
  std::set<std::string> has_input, has_output;
  for (const auto& e : spec.edges) {
    if (!e.feedback) has_input.insert(e.to_node);
    has_output.insert(e.from_node);
  }
  for (const auto& n : spec.nodes) {
    fc::node_info ni;
    ni.name = n.name;
    ni.kind = n.kind;
    ni.replicas = n.replicas;
    ni.on = n.on;
    ni.source = !has_input.count(n.name);
    ni.terminal = !has_output.count(n.name);
    for (const auto& [k, s] : n.settings) ni.settings.push_back({k, graph::to_string(s.value), s.from_default});
    g.nodes.push_back(std::move(ni));
  }
  for (const auto& e : spec.edges) {
    fc::edge_info ei;
    ei.name = e.to_string();
    ei.from = e.from_node;
    ei.from_port = e.from_port;
    ei.to = e.to_node;
    ei.to_port = e.to_port;
    ei.dispatch = std::string(graph::to_string(e.dispatch));
    ei.credit = e.credit > 0 ? e.credit : std::max<std::int64_t>(1, default_credit);
    ei.feedback = e.feedback;
    std::int64_t from_r = 1, to_r = 1;
    const graph::node_spec *from = nullptr, *to = nullptr;
    for (const auto& n : spec.nodes) {
      if (n.name == e.from_node) from_r = std::max<std::int64_t>(1, n.replicas), from = &n;
      if (n.name == e.to_node) to_r = std::max<std::int64_t>(1, n.replicas), to = &n;
    }
    ei.links = from_r * to_r;
    // a cluster run: a link whose two replicas are placed in different processes serializes its payloads
    // (the console called such edges in-process, as one process's were)
    bool crosses = false;
    for (std::int64_t a = 0; from && to && a < from_r && !crosses; ++a)
      for (std::int64_t b = 0; b < to_r && !crosses; ++b)
        crosses = graph::placement_of(*from, a) != graph::placement_of(*to, b);
    ei.transport = crosses ? "cross-process" : "in-process";
    g.edges.push_back(std::move(ei));
  }
  return g;
}

console_session::console_session(const graph::graph_spec& spec, const console_options& options,
                                 std::int64_t default_credit)
    : options_(options) {
  hub_ = std::make_shared<fc::hub>(describe_graph(spec, default_credit));
  cluster_ = std::make_unique<fc::cluster_sample>();
  set_cluster(planned_cluster_view(spec, false));
  fc::server_options so;
  so.bind = options.bind;
  so.port = options.port;
  so.token = options.token;
  server_ = std::make_unique<fc::server>(hub_, so);
  server_->start();
  if (!options.token_file.empty()) {
    // the token file is readable by its owner only
    std::remove(options.token_file.c_str());
    const mode_t old = umask(077);
    std::ofstream f(options.token_file, std::ios::out | std::ios::trunc);
    umask(old);
    f << server_->token() << '\n';
    if (!f) throw fc::console_error("console: cannot write the token to '" + options.token_file + "'");
  }
}

void console_session::set_cluster(const cluster_view& view) {
  fc::cluster_sample c;
  c.clustered = view.clustered;
  c.heartbeat_ms = view.heartbeat_ms;
  c.lost_after_ms = view.lost_after_ms;
  for (const auto& n : view.nodes) {
    fc::cluster_node_sample s;
    s.name = n.name;
    s.address = n.address;
    s.cpus = n.cpus;
    s.gpus = n.gpus;
    s.tls = n.tls;
    s.state = n.state;
    s.heartbeat_age_ms = n.heartbeat_age_ms;
    s.lost_reason = n.lost_reason;
    s.replicas = n.replicas;
    c.nodes.push_back(std::move(s));
  }
  *cluster_ = std::move(c);
}

void console_session::announce() {
  if (options_.on_ready) {
    options_.on_ready(server_->url(), server_->token());
  } else {
    console::clear_progress();
    spdlog::info(
        "console: {} (token {}; state-changing requests need it{}): open {} or run `flowctl --port {} --token "
        "{} top`",
        server_->url(), server_->token(), server_->loopback() ? "" : ", and every request on this address",
        server_->url_with_token(), server_->port(), server_->token());
  }
}

console_session::~console_session() { close(); }

void console_session::set_controls(fc::controls c) { hub_->set_controls(std::move(c)); }

void console_session::publish(const metrics_snapshot& m, const job_live& live, bool finished, int exit_code,
                              const std::string& error) {
  fc::sample s;
  s.t_s = m.elapsed_s;
  s.run_state = finished ? "finished" : std::string(to_string(live.get_run_phase()));
  s.phase = live.current_phase();
  s.finished = finished;
  s.exit_code = exit_code;
  s.error = error;
  s.steps = m.steps();
  s.tokens = m.tokens();
  const auto phases = live.progress_now();
  // a run that ended (stopped, failed or lost a node before its phases were done) has no ETA left, and a paused
  // one none to give (its rate so far, less the time since the last report, counted down to 0:00 while paused)
  const bool eta = !finished && live.get_run_phase() != run_phase::paused;
  for (const auto& p : phases)
    s.progress.push_back({p.node, p.what, p.done, p.total, eta ? p.eta_s(m.elapsed_s) : -1.0});
  s.progress_text = progress_text(phases, m.elapsed_s, /*with_eta=*/eta);
  s.rss_bytes = rss_bytes();
  const std::int64_t now_ns = live.now_ns();
  for (std::size_t i = 0; i < m.nodes.size(); ++i) {
    const node_stats& ns = m.nodes[i];
    fc::node_sample n;
    n.name = ns.name;
    n.depth = ns.depth;
    for (std::size_t r = 0; r < ns.per_replica.size(); ++r) {
      const replica_stats& rs = ns.per_replica[r];
      fc::replica_sample x;
      if (i < live.nodes() && r < live.replicas(i)) {
        replica_view v = live.replica(i, r).read(now_ns);
        x.state = std::string(to_string(v.state));
        x.state_for_s = v.state_for_s;
        x.reason = std::move(v.reason);
        x.phase = std::move(v.phase);
        x.errors = std::move(v.errors);
        x.memory = std::move(v.memory);
        x.checkpoint_capable = v.checkpoint_capable;
      }
      x.msgs_in = rs.msgs_in;
      x.bytes_in = rs.bytes_in;
      x.msgs_out = rs.msgs_out;
      x.bytes_out = rs.bytes_out;
      x.handled = rs.handled;
      x.produced = rs.produced;
      x.restarts = rs.restarts;
      x.dropped = rs.dropped;
      x.busy_s = rs.busy_s;
      x.blocked_s = rs.blocked_s;
      x.wait_s = rs.wait_s;
      x.counters = rs.counters;
      n.replicas.push_back(std::move(x));
    }
    s.nodes.push_back(std::move(n));
  }
  for (const auto& es : m.edges) {
    fc::edge_sample e;
    e.name = es.name;
    e.sent = es.sent;
    e.bytes = es.bytes;
    e.acked = es.acked;
    e.handled = es.handled;
    e.in_flight = es.in_flight;
    e.credit = es.credit;
    e.max_in_flight = es.max_in_flight;
    e.blocked_s = es.blocked_s;
    e.oldest_unacked_s = es.oldest_unacked_s;
    s.edges.push_back(std::move(e));
  }
  for (auto& e : live.events_since(event_seq_)) {
    event_seq_ = e.seq;
    s.events.push_back(fc::event{event_base_ + e.seq, e.t_s, std::move(e.kind), std::move(e.node), e.replica, std::move(e.text)});
  }
  for (auto& p : live.signals_since(signal_seq_)) {
    signal_seq_ = p.seq;
    s.signals.push_back(
        fc::signal_point{signal_base_ + p.seq, p.t_s, std::move(p.node), p.replica, std::move(p.name), p.value, std::move(p.text)});
  }
  s.cluster = *cluster_;
  hub_->publish(std::move(s));
}

void console_session::sample(const metrics_snapshot& m, const job_live& live) { publish(m, live, false, 0, {}); }

void console_session::finish(const metrics_snapshot& m, const job_live& live, int exit_code, const std::string& error) {
  publish(m, live, true, exit_code, error);
}

void console_session::close(const std::function<bool()>& stop_waiting) {
  if (closed_) return;
  closed_ = true;
  auto ended = []() -> std::string { throw std::runtime_error("the run has finished"); };
  hub_->set_controls({ended, ended, ended, ended});
  if (options_.linger_s > 0) {
    spdlog::info("console: the run ended; serving its final state for {:.0f} s more at {} (Ctrl-C ends it)",
                 options_.linger_s, server_->url());
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.linger_s);
    while (std::chrono::steady_clock::now() < until) {
      if (stop_waiting && stop_waiting()) {
        spdlog::info("console: stopped serving (a signal during the linger)");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  hub_->close();
  server_->stop();
}

std::string console_session::url() const { return server_->url(); }
const std::string& console_session::token() const { return server_->token(); }
int console_session::port() const { return server_->port(); }

}  // namespace flowrun::actor
