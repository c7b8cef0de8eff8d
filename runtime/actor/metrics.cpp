#include "runtime/actor/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/actor/byte_io.h"

namespace flowrun::actor {

namespace {

double ns_to_s(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

std::string human_bytes(std::uint64_t b) {
  char buf[32];
  if (b < 1024) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else if (b < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else if (b < (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

}  // namespace

void replica_counters::add(std::string_view name, std::int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = custom_.find(name);
  if (it == custom_.end()) it = custom_.emplace(std::string(name), 0).first;
  it->second += delta;
}

void replica_counters::set(std::string_view name, std::int64_t value) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = custom_.find(name);
  if (it == custom_.end()) it = custom_.emplace(std::string(name), 0).first;
  it->second = value;
}

std::map<std::string, std::int64_t> replica_counters::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {custom_.begin(), custom_.end()};
}

const node_stats* metrics_snapshot::node(std::string_view name) const {
  for (const auto& n : nodes)
    if (n.name == name) return &n;
  return nullptr;
}

std::int64_t metrics_snapshot::steps() const {
  std::int64_t best = -1;
  for (const auto& n : nodes) {
    // a node's replicas step together (data-parallel ranks): its steps are its busiest replica's, not their sum
    for (const auto& r : n.per_replica)
      if (auto it = r.counters.find("steps"); it != r.counters.end()) best = std::max(best, it->second);
    if (n.per_replica.empty())
      if (auto it = n.counters.find("steps"); it != n.counters.end()) best = std::max(best, it->second);
  }
  if (best >= 0) return best;
  for (const auto& n : nodes)
    if (n.terminal && !n.source) best = std::max(best, static_cast<std::int64_t>(n.handled));
  if (best >= 0) return best;
  best = 0;
  for (const auto& n : nodes)
    if (n.source)
      best = std::max(best, static_cast<std::int64_t>(n.produced / std::max<std::size_t>(1, n.replicas)));
  return best;
}

std::int64_t metrics_snapshot::produced() const {
  std::int64_t total = 0;
  for (const auto& n : nodes)
    if (n.source) total += static_cast<std::int64_t>(n.produced);
  return total;
}

std::int64_t metrics_snapshot::tokens() const {
  // every node's "tokens": those it trained on or generated (a loader counts the batches it cuts as "tokens_cut",
  // which the nodes it feeds count again); a source that trains on its own data (SFT, the reward model) counts,
  // and left out, the job's total fell when step 3's nodes began to count (negative tokens/s)
  std::int64_t total = 0;
  for (const auto& n : nodes)
    if (auto it = n.counters.find("tokens"); it != n.counters.end()) total += it->second;
  return total;
}

std::size_t job_metrics::add_node(std::string name, std::size_t replicas, bool source, bool terminal) {
  node_entry e;
  e.name = std::move(name);
  e.source = source;
  e.terminal = terminal;
  for (std::size_t r = 0; r < replicas; ++r) e.replicas.push_back(std::make_unique<replica_counters>());
  nodes_.push_back(std::move(e));
  return nodes_.size() - 1;
}

std::size_t job_metrics::add_edge(std::string name, std::size_t to_node, std::int64_t credit) {
  edges_.push_back(edge_entry{std::move(name), to_node, credit, {}});
  return edges_.size() - 1;
}

link_counters& job_metrics::add_link(std::size_t edge, std::uint32_t from_node, std::uint32_t from_replica,
                                     std::uint32_t to_replica) {
  auto& e = edges_.at(edge);
  e.links.push_back(std::make_unique<link_counters>());
  auto& l = *e.links.back();
  l.from_node = from_node;
  l.from_replica = from_replica;
  l.to_node = static_cast<std::uint32_t>(e.to_node);
  l.to_replica = to_replica;
  return l;
}

replica_counters& job_metrics::replica(std::size_t node, std::size_t replica) {
  return *nodes_.at(node).replicas.at(replica);
}

metrics_snapshot job_metrics::snapshot() const {
  constexpr auto rx = std::memory_order_relaxed;
  metrics_snapshot s;
  s.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  for (const auto& n : nodes_) {
    node_stats ns;
    ns.name = n.name;
    ns.replicas = n.replicas.size();
    ns.source = n.source;
    ns.terminal = n.terminal;
    for (const auto& r : n.replicas) {
      replica_stats rs;
      rs.msgs_in = r->msgs_in.load(rx);
      rs.bytes_in = r->bytes_in.load(rx);
      rs.msgs_out = r->msgs_out.load(rx);
      rs.bytes_out = r->bytes_out.load(rx);
      rs.handled = r->handled.load(rx);
      rs.produced = r->produced.load(rx);
      rs.busy_s = ns_to_s(r->busy_ns.load(rx));
      rs.blocked_s = ns_to_s(r->blocked_ns.load(rx));
      rs.wait_s = ns_to_s(r->wait_ns.load(rx));
      rs.restarts = r->restarts.load(rx);
      rs.dropped = r->dropped.load(rx);
      rs.counters = r->counters();
      ns.msgs_in += rs.msgs_in;
      ns.bytes_in += rs.bytes_in;
      ns.msgs_out += rs.msgs_out;
      ns.bytes_out += rs.bytes_out;
      ns.handled += rs.handled;
      ns.produced += rs.produced;
      ns.busy_s += rs.busy_s;
      ns.blocked_s += rs.blocked_s;
      ns.wait_s += rs.wait_s;
      ns.restarts += rs.restarts;
      ns.dropped += rs.dropped;
      for (const auto& [k, v] : rs.counters) ns.counters[k] += v;
      ns.per_replica.push_back(std::move(rs));
    }
    s.nodes.push_back(std::move(ns));
  }
  for (const auto& e : edges_) {
    edge_stats es;
    es.name = e.name;
    es.credit = e.credit;
    std::int64_t depth = 0;
    for (const auto& l : e.links) {
      // Read handled before sent: a message counted as handled was sent earlier,
      // so the depth derived below never goes negative by a race.
      std::uint64_t handled = l->handled.load(std::memory_order_acquire);
      std::uint64_t acked = l->acked.load(std::memory_order_acquire);
      std::uint64_t sent = l->sent.load(std::memory_order_acquire);
      // a link across processes: its producer's acks and its consumer's handled count come from two
      // processes (one mirrored, encode_replica_counters); a message handled was acknowledged then, and
      // the ack may not have reached the producer's last report (the summary said "in flight 1")
      if (l->remote) acked = std::max(acked, handled);
      es.sent += sent;
      es.acked += acked;
      es.handled += handled;
      if (!l->remote) depth += static_cast<std::int64_t>(sent) - static_cast<std::int64_t>(handled);
      es.bytes += l->bytes.load(rx);
      // (a link whose producer is in another process counts no sends here: a daemon's summary of an edge from main
      // said "in flight -4"; the producer's process counts that link's messages in flight)
      if (sent >= acked) es.in_flight += static_cast<std::int64_t>(sent - acked);
      es.max_in_flight = std::max<std::uint64_t>(es.max_in_flight, l->max_in_flight.load(rx));
      es.blocked_s += ns_to_s(l->blocked_ns.load(rx));
      const std::int64_t oldest = l->oldest_unacked_ns.load(rx);
      if (oldest >= 0) es.oldest_unacked_s = std::max(es.oldest_unacked_s, std::max(0.0, s.elapsed_s - oldest * 1e-9));
    }
    if (e.to_node < s.nodes.size())
      s.nodes[e.to_node].depth += depth;
    s.edges.push_back(std::move(es));
  }
  return s;
}

std::string to_json_line(const metrics_snapshot& s, bool final) {
  nlohmann::json j;
  j["t"] = std::round(s.elapsed_s * 1000.0) / 1000.0;
  j["final"] = final;
  j["steps"] = s.steps();
  j["tokens"] = s.tokens();
  j["produced"] = s.produced();
  nlohmann::json nodes = nlohmann::json::object();
  for (const auto& n : s.nodes) {
    nlohmann::json o;
    o["replicas"] = n.replicas;
    o["msgs_in"] = n.msgs_in;
    o["bytes_in"] = n.bytes_in;
    o["msgs_out"] = n.msgs_out;
    o["bytes_out"] = n.bytes_out;
    o["handled"] = n.handled;
    o["produced"] = n.produced;
    o["mailbox_depth"] = n.depth;
    o["busy_s"] = n.busy_s;
    o["blocked_s"] = n.blocked_s;
    o["wait_s"] = n.wait_s;
    o["restarts"] = n.restarts;
    o["dropped"] = n.dropped;
    o["counters"] = n.counters;
    nodes[n.name] = std::move(o);
  }
  nlohmann::json edges = nlohmann::json::object();
  for (const auto& e : s.edges) {
    nlohmann::json o;
    o["credit"] = e.credit;
    o["sent"] = e.sent;
    o["bytes"] = e.bytes;
    o["acked"] = e.acked;
    o["handled"] = e.handled;
    o["in_flight"] = e.in_flight;
    o["max_in_flight"] = e.max_in_flight;
    o["blocked_s"] = e.blocked_s;
    edges[e.name] = std::move(o);
  }
  j["nodes"] = std::move(nodes);
  j["edges"] = std::move(edges);
  return j.dump();
}

std::string to_json_line(const live_signal& s) {
  nlohmann::json j;
  j["signal"] = s.name;
  j["node"] = s.node;
  j["replica"] = s.replica;
  j["step"] = s.step;
  if (std::isfinite(s.value)) {
    j["value"] = s.value;
  } else {
    j["value"] = nullptr;
    j["nonfinite"] = std::isnan(s.value) ? "nan" : s.value > 0 ? "inf" : "-inf";
  }
  j["t"] = std::round(s.t_s * 1000.0) / 1000.0;
  return j.dump();
}

std::string format_summary(const metrics_snapshot& s) {
  std::string out;
  char buf[512];
  for (const auto& n : s.nodes) {
    std::snprintf(buf, sizeof buf, "node %-16s x%zu in %llu (%s) out %llu (%s) depth %lld busy %.3fs blocked %.3fs",
                  n.name.c_str(), n.replicas, static_cast<unsigned long long>(n.msgs_in), human_bytes(n.bytes_in).c_str(),
                  static_cast<unsigned long long>(n.msgs_out), human_bytes(n.bytes_out).c_str(),
                  static_cast<long long>(n.depth), n.busy_s, n.blocked_s);
    out += buf;
    if (n.restarts) out += " restarts " + std::to_string(n.restarts);
    if (n.dropped) out += " dropped " + std::to_string(n.dropped);
    for (const auto& [k, v] : n.counters) out += " " + k + " " + std::to_string(v);
    out += '\n';
  }
  for (const auto& e : s.edges) {
    std::snprintf(buf, sizeof buf, "edge %s: sent %llu (%s) in flight %lld (max %llu, credit %lld) blocked %.3fs",
                  e.name.c_str(), static_cast<unsigned long long>(e.sent), human_bytes(e.bytes).c_str(),
                  static_cast<long long>(e.in_flight), static_cast<unsigned long long>(e.max_in_flight),
                  static_cast<long long>(e.credit), e.blocked_s);
    out += buf;
    out += '\n';
  }
  return out;
}

std::string format_progress(std::string_view graph_name, const metrics_snapshot& now, const metrics_snapshot& prev,
                            std::int64_t total_steps, const std::vector<live_progress>& phases) {
  char buf[256];
  const std::int64_t steps = now.steps();
  std::string out;
  out.append("[").append(graph_name).append("] ");
  if (!phases.empty()) {
    out.append(progress_text(phases, now.elapsed_s));
    total_steps = 0;  // the phases say how far the run is
  } else {
    out.append("step ").append(std::to_string(steps));
  }
  if (total_steps > 0) out.append("/").append(std::to_string(total_steps));
  const double dt = now.elapsed_s - prev.elapsed_s;
  const double tps = dt > 0 ? static_cast<double>(now.tokens() - prev.tokens()) / dt : 0.0;
  std::snprintf(buf, sizeof buf, " | in %lld | %.0f tok/s", static_cast<long long>(now.produced()), tps);
  out += buf;
  if (total_steps > 0 && steps > 0 && now.elapsed_s > 0) {
    const double per_step = now.elapsed_s / static_cast<double>(steps);
    const long eta = std::lround(per_step * static_cast<double>(std::max<std::int64_t>(0, total_steps - steps)));
    std::snprintf(buf, sizeof buf, " | ETA %ld:%02ld", eta / 60, eta % 60);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, " | %.1fs", now.elapsed_s);
  out += buf;
  return out;
}


std::vector<char> encode_replica_counters(job_metrics& m,
                                          const std::vector<std::pair<std::uint32_t, std::uint32_t>>& ids) {
  std::vector<char> out;
  std::uint32_t present = 0;
  for (const auto& [n, r] : ids) present += m.has_replica(n, r) ? 1 : 0;
  byte_io::put<std::uint32_t>(out, present);
  for (const auto& [n, r] : ids) {
    if (!m.has_replica(n, r)) continue;
    const replica_counters& c = m.replica(n, r);
    byte_io::put<std::uint32_t>(out, n);
    byte_io::put<std::uint32_t>(out, r);
    for (const auto* a : {&c.msgs_in, &c.bytes_in, &c.msgs_out, &c.bytes_out, &c.handled, &c.produced, &c.busy_ns,
                          &c.blocked_ns, &c.restarts, &c.dropped, &c.wait_ns})
      byte_io::put<std::uint64_t>(out, a->load(std::memory_order_relaxed));
    const auto custom = c.counters();
    byte_io::put<std::uint32_t>(out, static_cast<std::uint32_t>(custom.size()));
    for (const auto& [name, value] : custom) {
      byte_io::put<std::uint32_t>(out, static_cast<std::uint32_t>(name.size()));
      out.insert(out.end(), name.begin(), name.end());
      byte_io::put<std::int64_t>(out, value);
    }
  }
  // the links: (edge, link, which sides) and the counters of those sides
  const std::set<std::pair<std::uint32_t, std::uint32_t>> local(ids.begin(), ids.end());
  std::vector<char> links;
  std::uint32_t nlinks = 0;
  for (std::uint32_t e = 0; e < m.edges_.size(); ++e)
    for (std::uint32_t k = 0; k < m.edges_[e].links.size(); ++k) {
      const link_counters& l = *m.edges_[e].links[k];
      const bool from = local.count({l.from_node, l.from_replica}) > 0, to = local.count({l.to_node, l.to_replica}) > 0;
      if (!from && !to) continue;
      ++nlinks;
      byte_io::put<std::uint32_t>(links, e);
      byte_io::put<std::uint32_t>(links, k);
      byte_io::put<std::uint8_t>(links, static_cast<std::uint8_t>((from ? 1 : 0) | (to ? 2 : 0)));
      if (from)
        for (const auto* a : {&l.sent, &l.bytes, &l.acked, &l.blocked_ns, &l.max_in_flight})
          byte_io::put<std::uint64_t>(links, a->load(std::memory_order_relaxed));
      if (to) byte_io::put<std::uint64_t>(links, l.handled.load(std::memory_order_relaxed));
    }
  byte_io::put<std::uint32_t>(out, nlinks);
  out.insert(out.end(), links.begin(), links.end());
  return out;
}

bool apply_replica_counters(job_metrics& m, const std::vector<char>& bytes) {
  std::size_t at = 0;
  std::uint32_t count = 0;
  if (!byte_io::get(bytes, at, count) || count > 100000) return false;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint32_t n = 0, r = 0;
    std::uint64_t v[11];
    if (!byte_io::get(bytes, at, n) || !byte_io::get(bytes, at, r)) return false;
    for (auto& x : v)
      if (!byte_io::get(bytes, at, x)) return false;
    std::uint32_t ncustom = 0;
    if (!byte_io::get(bytes, at, ncustom) || ncustom > 10000) return false;
    std::vector<std::pair<std::string, std::int64_t>> custom;
    for (std::uint32_t k = 0; k < ncustom; ++k) {
      std::uint32_t len = 0;
      std::int64_t value = 0;
      if (!byte_io::get(bytes, at, len) || at + len > bytes.size()) return false;
      std::string name(bytes.data() + at, len);
      at += len;
      if (!byte_io::get(bytes, at, value)) return false;
      custom.emplace_back(std::move(name), value);
    }
    if (!m.has_replica(n, r)) continue;
    replica_counters& c = m.replica(n, r);
    std::size_t k = 0;
    for (auto* a : {&c.msgs_in, &c.bytes_in, &c.msgs_out, &c.bytes_out, &c.handled, &c.produced, &c.busy_ns,
                    &c.blocked_ns, &c.restarts, &c.dropped, &c.wait_ns})
      a->store(v[k++], std::memory_order_relaxed);
    for (const auto& [name, value] : custom) c.set(name, value);
  }
  std::uint32_t nlinks = 0;
  if (!byte_io::get(bytes, at, nlinks) || nlinks > 10000000) return false;
  for (std::uint32_t i = 0; i < nlinks; ++i) {
    std::uint32_t e = 0, k = 0;
    std::uint8_t sides = 0;
    std::uint64_t v[6] = {0, 0, 0, 0, 0, 0};
    if (!byte_io::get(bytes, at, e) || !byte_io::get(bytes, at, k) || !byte_io::get(bytes, at, sides) || sides > 3)
      return false;
    if (sides & 1)
      for (int j = 0; j < 5; ++j)
        if (!byte_io::get(bytes, at, v[j])) return false;
    if ((sides & 2) && !byte_io::get(bytes, at, v[5])) return false;
    if (e >= m.edges_.size() || k >= m.edges_[e].links.size()) continue;
    link_counters& l = *m.edges_[e].links[k];
    if (sides & 1) {
      std::size_t j = 0;
      for (auto* a : {&l.sent, &l.bytes, &l.acked, &l.blocked_ns, &l.max_in_flight}) a->store(v[j++], std::memory_order_relaxed);
    }
    if (sides & 2) l.handled.store(v[5], std::memory_order_release);
  }
  return at == bytes.size();
}

}  // namespace flowrun::actor
