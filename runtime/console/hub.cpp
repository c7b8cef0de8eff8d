#include "runtime/console/hub.h"

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace flowrun::console {

using json = nlohmann::json;
// Every document is written with bytes that are not UTF-8 replaced by U+FFFD: node names, settings, phases and
// error texts (an exception quoting a file name) may hold any bytes, and a throwing dump ended the whole process
// when it ran in the event stream's content provider (tests/fuzz/fuzz_console.cpp found it).
constexpr auto k_replace = json::error_handler_t::replace;

namespace {

// Rounds for display (JSON stays short); non-finite values become null.
json num(double x, double scale = 1000.0) {
  if (!std::isfinite(x)) return nullptr;
  return std::round(x * scale) / scale;
}

// A training signal's value (loss, lr, kl, ...) rounded to 7 significant digits, not to decimal places: a
// learning rate of 9.65e-6 or a KL of 1e-7 keeps its digits (6 decimal places showed them as 1e-05 and 0).
json sig_num(double x) {
  if (!std::isfinite(x)) return nullptr;
  if (x == 0) return 0.0;
  const double scale = std::pow(10.0, 6 - static_cast<int>(std::floor(std::log10(std::fabs(x)))));
  return std::isfinite(scale) && scale > 0 ? std::round(x * scale) / scale : x;
}

int state_rank(std::string_view s) {
  static const char* order[] = {"failed", "restarting",   "busy",   "waiting_credit", "waiting_request", "paused",
                                "initializing", "remote", "idle", "done",           "stopped"};
  for (int i = 0; i < 11; ++i)
    if (s == order[i]) return i;
  return 11;
}

json event_json(const event& e) {
  return json{{"seq", e.seq},   {"t_s", num(e.t_s)},    {"kind", e.kind},
              {"node", e.node}, {"replica", e.replica}, {"text", e.text}};
}

json signal_json(const signal_point& p) {
  json j{{"seq", p.seq}, {"t_s", num(p.t_s)}, {"node", p.node}, {"replica", p.replica}, {"name", p.name}};
  if (p.name == "phase")
    j["text"] = p.text;
  else
    j["value"] = sig_num(p.value);
  return j;
}

json cluster_node_json(const cluster_node_sample& n) {
  return json{{"name", n.name},
              {"address", n.address},
              {"cpus", n.cpus},
              {"gpus", n.gpus},
              {"tls", n.tls},
              {"state", n.state},
              {"heartbeat_age_ms", n.heartbeat_age_ms < 0 ? json(nullptr) : json(n.heartbeat_age_ms)},
              {"lost_reason", n.lost_reason},
              {"replicas", n.replicas}};
}

json cluster_doc(const cluster_sample& c) {
  json main = json{{"name", "main"}, {"cpus", 0}, {"gpus", 0}, {"replicas", json::array()}};
  json nodes = json::array();
  for (const auto& n : c.nodes) {
    if (n.name == "main")
      main = json{{"name", n.name}, {"cpus", n.cpus}, {"gpus", n.gpus}, {"replicas", n.replicas}};
    else
      nodes.push_back(cluster_node_json(n));
  }
  return json{{"clustered", c.clustered},
              {"heartbeat_ms", c.heartbeat_ms},
              {"lost_after_ms", c.lost_after_ms},
              {"main", std::move(main)},
              {"nodes", std::move(nodes)}};
}

}  // namespace

std::string node_state(const std::vector<replica_sample>& replicas) {
  std::string best = replicas.empty() ? "initializing" : replicas[0].state;
  for (const auto& r : replicas)
    if (state_rank(r.state) < state_rank(best)) best = r.state;
  return best;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Always walks the longer length; the result depends on every byte.
  const std::size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0 && !a.empty();
}

// -- rendering (always called with the hub's lock held) ------------------------------------------

struct hub_json {
  const hub& h;

  const node_info* info(std::size_t i) const { return i < h.graph_.nodes.size() ? &h.graph_.nodes[i] : nullptr; }

  json rates(const hub::node_rates& r) const {
    return json{{"msgs_in_per_s", num(r.msgs_in)},   {"bytes_in_per_s", num(r.bytes_in, 1)},
                {"msgs_out_per_s", num(r.msgs_out)}, {"bytes_out_per_s", num(r.bytes_out, 1)},
                {"handled_per_s", num(r.handled)},   {"produced_per_s", num(r.produced)},
                {"tokens_per_s", num(r.tokens, 10)}};
  }

  // Outstanding requests of node i: messages on its out edges not yet acknowledged.
  json outstanding(const std::string& name, std::int64_t* total, double* oldest) const {
    json list = json::array();
    *total = 0;
    *oldest = 0;
    const auto& edges = h.current_.edges;
    for (std::size_t e = 0; e < h.graph_.edges.size() && e < edges.size(); ++e) {
      if (h.graph_.edges[e].from != name) continue;
      const auto& es = edges[e];
      *total += es.in_flight;
      *oldest = std::max(*oldest, es.oldest_unacked_s);
      list.push_back(json{{"edge", es.name}, {"count", es.in_flight}, {"oldest_age_s", num(es.oldest_unacked_s)}});
    }
    return list;
  }

  json node_summary(std::size_t i) const {
    const node_sample& n = h.current_.nodes[i];
    const node_info* ni = info(i);
    const hub::node_rates& r = i < h.rates_.nodes.size() ? h.rates_.nodes[i] : hub::node_rates{};
    const std::string state = node_state(n.replicas);
    json j;
    j["name"] = n.name;
    j["kind"] = ni ? ni->kind : "";
    j["replicas"] = n.replicas.size();
    j["state"] = state;
    double for_s = 0;
    std::string reason, phase;
    json states = json::array();
    std::uint64_t tot[8] = {};
    double busy = 0, blocked = 0, wait = 0;
    std::optional<std::int64_t> version;  // the policy version the node holds (asynchronous RLHF)
    for (std::size_t k = 0; k < n.replicas.size(); ++k) {
      const auto& rs = n.replicas[k];
      if (rs.state == state) for_s = std::max(for_s, rs.state_for_s);
      if (reason.empty() && !rs.reason.empty()) reason = rs.reason;
      if (!rs.phase.empty()) phase = rs.phase;
      states.push_back(json{{"replica", k},
                            {"state", rs.state},
                            {"state_for_s", num(rs.state_for_s)},
                            {"phase", rs.phase},
                            {"reason", rs.reason}});
      tot[0] += rs.msgs_in, tot[1] += rs.bytes_in, tot[2] += rs.msgs_out, tot[3] += rs.bytes_out;
      tot[4] += rs.handled, tot[5] += rs.produced, tot[6] += rs.restarts, tot[7] += rs.dropped;
      busy += rs.busy_s, blocked += rs.blocked_s, wait += rs.wait_s;
      if (auto v = rs.counters.find("policy_version"); v != rs.counters.end())
        version = std::max(version.value_or(v->second), v->second);
    }
    j["state_for_s"] = num(for_s);
    j["reason"] = reason;
    j["phase"] = phase;
    j["source"] = ni && ni->source;
    j["terminal"] = ni && ni->terminal;
    j["rates"] = rates(r);
    j["policy_version"] = version ? json(*version) : json(nullptr);
    std::int64_t out_total = 0;
    double oldest = 0;
    json outs = outstanding(n.name, &out_total, &oldest);
    const double cap = 1000.0 * static_cast<double>(std::max<std::size_t>(1, n.replicas.size()));
    j["load"] = json{{"mailbox_depth", n.depth},
                     {"busy_ms_per_s", num(r.busy_ms, 10)},
                     {"idle_ms_per_s", num(r.idle_ms, 10)},
                     {"blocked_ms_per_s", num(r.blocked_ms, 10)},
                     {"utilization", num(r.busy_ms / cap)},
                     {"outstanding", out_total},
                     {"oldest_outstanding_s", num(oldest)},
                     {"outstanding_by_edge", outs}};
    j["totals"] = json{{"msgs_in", tot[0]},   {"bytes_in", tot[1]},       {"msgs_out", tot[2]}, {"bytes_out", tot[3]},
                       {"handled", tot[4]},   {"produced", tot[5]},       {"restarts", tot[6]}, {"dropped", tot[7]},
                       {"busy_s", num(busy)}, {"blocked_s", num(blocked)}, {"wait_s", num(wait)}};
    j["replica_states"] = std::move(states);
    return j;
  }

  json node_detail(std::size_t i) const {
    json j = node_summary(i);
    const node_sample& n = h.current_.nodes[i];
    const node_info* ni = info(i);
    json settings = json::array();
    if (ni)
      for (const auto& s : ni->settings)
        settings.push_back(json{{"key", s.key}, {"value", s.value}, {"from_default", s.from_default}});
    j["settings"] = std::move(settings);
    j["on"] = ni ? ni->on : "";
    std::map<std::string, std::int64_t> counters;
    json reps = json::array();
    json errors = json::array();
    for (std::size_t k = 0; k < n.replicas.size(); ++k) {
      const auto& rs = n.replicas[k];
      for (const auto& [c, v] : rs.counters) counters[c] += v;
      const hub::node_rates rr =
          i < h.rates_.replicas.size() && k < h.rates_.replicas[i].size() ? h.rates_.replicas[i][k] : hub::node_rates{};
      json mem = json::object();
      for (const auto& [c, b] : rs.memory) mem[c] = b;
      json errs = json::array();
      for (const auto& [t, text] : rs.errors) {
        errs.push_back(json{{"t_s", num(t)}, {"text", text}});
        errors.push_back(json{{"t_s", num(t)}, {"replica", k}, {"text", text}});
      }
      reps.push_back(json{{"replica", k},
                          {"state", rs.state},
                          {"state_for_s", num(rs.state_for_s)},
                          {"reason", rs.reason},
                          {"phase", rs.phase},
                          {"rates", rates(rr)},
                          {"busy_ms_per_s", num(rr.busy_ms, 10)},
                          {"blocked_ms_per_s", num(rr.blocked_ms, 10)},
                          {"msgs_in", rs.msgs_in},
                          {"msgs_out", rs.msgs_out},
                          {"handled", rs.handled},
                          {"produced", rs.produced},
                          {"restarts", rs.restarts},
                          {"busy_s", num(rs.busy_s)},
                          {"blocked_s", num(rs.blocked_s)},
                          {"wait_s", num(rs.wait_s)},
                          {"counters", rs.counters},
                          {"memory_bytes", mem},
                          {"checkpoint_capable", rs.checkpoint_capable},
                          {"errors", errs}});
    }
    std::sort(errors.begin(), errors.end(),
              [](const json& a, const json& b) { return a["t_s"].get<double>() < b["t_s"].get<double>(); });
    j["counters"] = counters;
    j["replicas_detail"] = std::move(reps);
    j["recent_errors"] = std::move(errors);
    json ins = json::array(), outs = json::array();
    for (const auto& e : h.graph_.edges) {
      if (e.to == n.name) ins.push_back(e.name);
      if (e.from == n.name) outs.push_back(e.name);
    }
    j["edges_in"] = std::move(ins);
    j["edges_out"] = std::move(outs);
    json sig = json::object();
    for (const auto& [key, v] : h.latest_)
      if (key.first == n.name) sig[key.second] = sig_num(v);
    j["signals"] = std::move(sig);
    json evs = json::array();
    for (auto it = h.events_.rbegin(); it != h.events_.rend() && evs.size() < 20; ++it)
      if (it->node == n.name) evs.push_back(event_json(*it));
    std::reverse(evs.begin(), evs.end());
    j["events"] = std::move(evs);
    return j;
  }

  json nodes() const {
    json a = json::array();
    for (std::size_t i = 0; i < h.current_.nodes.size(); ++i) a.push_back(node_summary(i));
    return a;
  }

  json edges() const {
    json a = json::array();
    for (std::size_t e = 0; e < h.graph_.edges.size(); ++e) {
      const edge_info& ei = h.graph_.edges[e];
      json j{{"name", ei.name},       {"from", ei.from},         {"from_port", ei.from_port}, {"to", ei.to},
             {"to_port", ei.to_port}, {"dispatch", ei.dispatch}, {"transport", ei.transport}, {"credit", ei.credit},
             {"links", ei.links},     {"feedback", ei.feedback}};
      if (e < h.current_.edges.size()) {
        const edge_sample& es = h.current_.edges[e];
        const auto rate = e < h.rates_.edges.size() ? h.rates_.edges[e] : std::pair<double, double>{0, 0};
        j["msgs_per_s"] = num(rate.first);
        j["bytes_per_s"] = num(rate.second, 1);
        j["blocked_ms_per_s"] = num(e < h.rates_.edge_blocked_ms.size() ? h.rates_.edge_blocked_ms[e] : 0, 10);
        j["in_flight"] = es.in_flight;
        j["max_in_flight"] = es.max_in_flight;
        j["oldest_outstanding_s"] = num(es.oldest_unacked_s);
        j["sent"] = es.sent;
        j["bytes"] = es.bytes;
        j["acked"] = es.acked;
        j["handled"] = es.handled;
      }
      a.push_back(std::move(j));
    }
    return a;
  }

  json bottlenecks(std::size_t n) const {
    struct row {
      std::size_t i;
      double score, util, upstream;
    };
    std::vector<row> rows;
    for (std::size_t i = 0; i < h.current_.nodes.size(); ++i) {
      const auto& ns = h.current_.nodes[i];
      const hub::node_rates r = i < h.rates_.nodes.size() ? h.rates_.nodes[i] : hub::node_rates{};
      const double cap = 1000.0 * static_cast<double>(std::max<std::size_t>(1, ns.replicas.size()));
      const double util = std::clamp(r.busy_ms / cap, 0.0, 1.0);
      // producers that wait for this node's credit: the share of their time spent waiting
      double upstream = 0;
      for (std::size_t e = 0; e < h.graph_.edges.size(); ++e) {
        if (h.graph_.edges[e].to != ns.name || e >= h.rates_.edge_blocked_ms.size()) continue;
        // blocked time is counted per link: the share of the links' time spent waiting
        const double links = static_cast<double>(std::max<std::int64_t>(1, h.graph_.edges[e].links));
        upstream = std::max(upstream, std::clamp(h.rates_.edge_blocked_ms[e] / (1000.0 * links), 0.0, 1.0));
      }
      rows.push_back({i, util + 0.5 * upstream, util, upstream});
    }
    std::stable_sort(rows.begin(), rows.end(), [&](const row& a, const row& b) {
      if (a.score != b.score) return a.score > b.score;
      return h.current_.nodes[a.i].depth > h.current_.nodes[b.i].depth;
    });
    json a = json::array();
    for (std::size_t k = 0; k < rows.size() && k < n; ++k) {
      const auto& ns = h.current_.nodes[rows[k].i];
      std::string why = "busy " + std::to_string(static_cast<int>(std::lround(rows[k].util * 100))) + "%";
      if (rows[k].upstream > 0.005)
        why += ", upstream waits for its credit " +
               std::to_string(static_cast<int>(std::lround(rows[k].upstream * 100))) + "% of the time";
      if (ns.depth > 0) why += ", mailbox " + std::to_string(ns.depth);
      a.push_back(json{{"name", ns.name},
                       {"score", num(rows[k].score)},
                       {"utilization", num(rows[k].util)},
                       {"upstream_blocked", num(rows[k].upstream)},
                       {"mailbox_depth", ns.depth},
                       {"state", node_state(ns.replicas)},
                       {"replicas", ns.replicas.size()},
                       {"why", why}});
    }
    return a;
  }

  json status() const {
    const sample& s = h.current_;
    json by_state = json::object();
    std::size_t replicas = 0;
    for (const auto& n : s.nodes) {
      const std::string st = node_state(n.replicas);
      by_state[st] = by_state.value(st, 0) + 1;
      replicas += n.replicas.size();
    }
    json sig = json::object();
    for (const auto& [key, v] : h.latest_) sig[key.first + "/" + key.second] = sig_num(v);
    std::int64_t mem = 0;
    for (const auto& n : s.nodes)
      for (const auto& r : n.replicas)
        for (const auto& [c, b] : r.memory) mem += b;
    // Asynchronous RLHF (docs/rlhf.md): the policy version each node holds (its
    // "policy_version" counter), the seconds each waited for input, and the staleness of the
    // last trained batch with the stale-batch counts (the controller's signals)
    json versions = json::object(), waits = json::object(), stale = json::object();
    for (const auto& n : s.nodes) {
      std::optional<std::int64_t> v;
      double w = 0;
      for (const auto& r : n.replicas) {
        w += r.wait_s;
        if (auto c = r.counters.find("policy_version"); c != r.counters.end()) v = std::max(v.value_or(c->second), c->second);
      }
      if (v) {
        versions[n.name] = *v;
        waits[n.name] = num(w);
      }
    }
    for (const auto& [key, v] : h.latest_)
      if (key.second == "staleness" || key.second == "stale_dropped" || key.second == "stale_waited")
        stale[key.second] = sig_num(v);
    json async = versions.empty() ? json(nullptr)
                                  : json{{"policy_versions", versions}, {"wait_s", waits},
                                         {"staleness", stale.value("staleness", json(nullptr))},
                                         {"stale_dropped", stale.value("stale_dropped", json(0))},
                                         {"stale_waited", stale.value("stale_waited", json(0))}};
    json progress = json::array();
    for (const auto& p : s.progress)
      progress.push_back({{"node", p.node}, {"what", p.what}, {"done", p.done}, {"total", p.total},
                          {"eta_s", p.eta_s < 0 ? json(nullptr) : json(num(p.eta_s))}});
    return json{{"graph", h.graph_.name},
                {"file", h.graph_.file},
                {"run_state", s.run_state},
                {"phase", s.phase},
                {"elapsed_s", num(s.t_s)},
                {"finished", s.finished},
                {"exit_code", s.exit_code},
                {"error", s.error},
                {"steps", s.steps},
                {"total_steps", h.graph_.steps},
                {"progress", progress},
                {"progress_text", s.progress_text},
                {"tokens_per_s", num(h.rates_.tokens_per_s, 10)},
                {"rate_window_s", num(h.rates_.window_s)},
                {"frame", h.frame_},
                {"nodes", s.nodes.size()},
                {"replicas", replicas},
                {"nodes_by_state", by_state},
                {"signals", sig},
                {"async", async},
                {"memory_reported_bytes", mem},
                {"rss_bytes", s.rss_bytes},
                {"last_event_seq", h.events_.empty() ? 0 : h.events_.back().seq}};
  }
};

// -- hub --------------------------------------------------------------------------------------------

hub::hub(graph_info graph, hub_options options) : graph_(std::move(graph)), options_(options) {
  // Before the first sample every node is initializing.
  for (const auto& n : graph_.nodes) {
    node_sample ns;
    ns.name = n.name;
    ns.replicas.resize(static_cast<std::size_t>(std::max<std::int64_t>(1, n.replicas)));
    current_.nodes.push_back(std::move(ns));
  }
  for (const auto& e : graph_.edges) {
    edge_sample es;
    es.name = e.name;
    es.credit = e.credit;
    current_.edges.push_back(std::move(es));
  }
  current_.run_state = "starting";
}

hub::derived hub::derive(const sample& now, const sample& then) const {
  derived d;
  const double dt = now.t_s - then.t_s;
  d.window_s = dt;
  auto rate = [dt](double a, double b) { return dt > 0 ? std::max(0.0, (a - b) / dt) : 0.0; };
  auto tokens = [](const replica_sample& r) {  // a node's tokens/s: those it trains on or generates, or a loader's cut
    auto it = r.counters.find("tokens");
    if (it == r.counters.end()) it = r.counters.find("tokens_cut");
    return it == r.counters.end() ? 0.0 : static_cast<double>(it->second);
  };
  d.nodes.resize(now.nodes.size());
  d.replicas.resize(now.nodes.size());
  for (std::size_t i = 0; i < now.nodes.size(); ++i) {
    const auto& a = now.nodes[i];
    const node_sample* b = i < then.nodes.size() ? &then.nodes[i] : nullptr;
    node_rates total;
    for (std::size_t k = 0; k < a.replicas.size(); ++k) {
      const replica_sample& x = a.replicas[k];
      const replica_sample y = b && k < b->replicas.size() ? b->replicas[k] : replica_sample{};
      node_rates r;
      r.msgs_in = rate(x.msgs_in, y.msgs_in);
      r.bytes_in = rate(x.bytes_in, y.bytes_in);
      r.msgs_out = rate(x.msgs_out, y.msgs_out);
      r.bytes_out = rate(x.bytes_out, y.bytes_out);
      r.handled = rate(x.handled, y.handled);
      r.produced = rate(x.produced, y.produced);
      r.tokens = rate(tokens(x), tokens(y));
      r.busy_ms = std::min(1000.0, 1000.0 * rate(x.busy_s, y.busy_s));
      r.blocked_ms = std::min(1000.0 - r.busy_ms, 1000.0 * rate(x.blocked_s, y.blocked_s));
      // a replica inside one long call has its busy time counted only when the call returns:
      // while it is busy now, the time since the window began is busy too
      if (x.state == "busy" && dt > 0) r.busy_ms = std::max(r.busy_ms, std::min(1000.0, 1000.0 * x.state_for_s / dt));
      r.blocked_ms = std::max(0.0, std::min(r.blocked_ms, 1000.0 - r.busy_ms));
      r.idle_ms = std::max(0.0, 1000.0 - r.busy_ms - r.blocked_ms);
      total.msgs_in += r.msgs_in, total.bytes_in += r.bytes_in, total.msgs_out += r.msgs_out;
      total.bytes_out += r.bytes_out, total.handled += r.handled, total.produced += r.produced;
      total.tokens += r.tokens, total.busy_ms += r.busy_ms, total.blocked_ms += r.blocked_ms;
      total.idle_ms += r.idle_ms;
      d.replicas[i].push_back(r);
    }
    d.nodes[i] = total;
  }
  // the job's tokens/s: the rate of its tokens as metrics_snapshot::tokens() counts them (every node's `tokens`;
  // a loader's `tokens_cut` left out, as the nodes it feeds count them)
  d.tokens_per_s = rate(static_cast<double>(now.tokens), static_cast<double>(then.tokens));
  d.edges.resize(now.edges.size());
  d.edge_blocked_ms.resize(now.edges.size());
  for (std::size_t e = 0; e < now.edges.size(); ++e) {
    const edge_sample& x = now.edges[e];
    const edge_sample y = e < then.edges.size() ? then.edges[e] : edge_sample{};
    d.edges[e] = {rate(x.sent, y.sent), rate(x.bytes, y.bytes)};
    d.edge_blocked_ms[e] = 1000.0 * rate(x.blocked_s, y.blocked_s);
  }
  return d;
}

void hub::publish(sample s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    ++frame_;
    cache_.clear();
    for (auto& e : s.events) events_.push_back(std::move(e));
    while (events_.size() > options_.events_kept) events_.pop_front();
    for (auto& p : s.signals) {
      if (p.name == "phase") {
        phases_.push_back(p);
        while (phases_.size() > 500) phases_.pop_front();
      } else {
        auto& ser = series_[{p.node, p.name}];
        ser.emplace_back(p.t_s, p.value);
        while (ser.size() > options_.series_points) ser.pop_front();
        latest_[{p.node, p.name}] = p.value;
      }
      recent_signals_.push_back(std::move(p));
    }
    while (recent_signals_.size() > 4096) recent_signals_.pop_front();
    s.events.clear();
    s.signals.clear();
    // rates against the newest sample at least rate_window_s old (else the oldest)
    const sample* ref = nullptr;
    for (auto it = history_.rbegin(); it != history_.rend(); ++it)
      if (it->t_s <= s.t_s - options_.rate_window_s) {
        ref = &*it;
        break;
      }
    if (!ref && !history_.empty()) ref = &history_.front();
    rates_ = ref ? derive(s, *ref) : derived{};
    if (!ref || s.finished) {  // the run is over: nothing flows (a stopped node showed BUSY 1000 at 1644 tok/s)
      const double window = rates_.window_s;
      rates_ = derived{};
      rates_.window_s = window;
      rates_.nodes.resize(s.nodes.size());
      rates_.replicas.resize(s.nodes.size());
      for (std::size_t i = 0; i < s.nodes.size(); ++i) rates_.replicas[i].resize(s.nodes[i].replicas.size());
      rates_.edges.resize(s.edges.size());
      rates_.edge_blocked_ms.resize(s.edges.size());
    }
    // the run's tokens/s as a series of its own, one point a second at most
    if (ref) {
      auto& ser = series_[{"", "tokens_per_s"}];
      if (ser.empty() || s.t_s - ser.back().first >= 1.0) {
        ser.emplace_back(s.t_s, rates_.tokens_per_s);
        while (ser.size() > options_.series_points) ser.pop_front();
      }
    }
    history_.push_back(s);
    while (history_.size() > 2 && history_.front().t_s < s.t_s - 10.0) history_.pop_front();
    current_ = std::move(s);
  }
  cv_.notify_all();
}

void hub::set_controls(controls c) {
  std::lock_guard<std::mutex> lock(mutex_);
  controls_ = std::move(c);
  cache_.clear();
}

void hub::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    controls_ = {};
    cache_.clear();
  }
  cv_.notify_all();
}

bool hub::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

bool hub::ended() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_ || current_.finished;
}

std::uint64_t hub::frame() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return frame_;
}

std::uint64_t hub::wait_frame(std::uint64_t after, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return closed_ || frame_ > after; });
  return frame_;
}

std::string hub::graph_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached("graph", [&] { return render_graph(); });
}

std::string hub::render_graph() const {
  json nodes = json::array();
  for (const auto& n : graph_.nodes) {
    json settings = json::array();
    for (const auto& s : n.settings)
      settings.push_back(json{{"key", s.key}, {"value", s.value}, {"from_default", s.from_default}});
    nodes.push_back(json{{"name", n.name},
                         {"kind", n.kind},
                         {"replicas", n.replicas},
                         {"source", n.source},
                         {"terminal", n.terminal},
                         {"on", n.on},
                         {"settings", std::move(settings)}});
  }
  json groups = json::array();
  for (const auto& n : graph_.nodes) {
    if (n.replicas <= 1) continue;
    json members = json::array();
    for (std::int64_t r = 0; r < n.replicas; ++r) members.push_back(n.name + "[" + std::to_string(r) + "]");
    groups.push_back(json{{"node", n.name}, {"replicas", n.replicas}, {"members", std::move(members)}});
  }
  json edges = json::array();
  for (const auto& e : graph_.edges)
    edges.push_back(json{{"name", e.name},
                         {"from", e.from},
                         {"from_port", e.from_port},
                         {"to", e.to},
                         {"to_port", e.to_port},
                         {"dispatch", e.dispatch},
                         {"transport", e.transport},
                         {"credit", e.credit},
                         {"links", e.links},
                         {"feedback", e.feedback}});
  const graph_layout lay = layout_graph(graph_);
  json boxes = json::array();
  for (const auto& b : lay.boxes)
    boxes.push_back(json{{"name", b.name}, {"column", b.column}, {"band", b.band}, {"x", num(b.x)},
                         {"y", num(b.y)},  {"w", num(b.w)},           {"h", num(b.h)}});
  return json{{"name", graph_.name},
              {"file", graph_.file},
              {"seed", graph_.seed},
              {"steps", graph_.steps},
              {"nodes", std::move(nodes)},
              {"replica_groups", std::move(groups)},
              {"edges", std::move(edges)},
              {"layout", json{{"width", num(lay.width)}, {"height", num(lay.height)}, {"nodes", std::move(boxes)}}}}
      .dump(-1, ' ', false, k_replace);
}

graph_layout layout_graph(const graph_info& g, double max_width) {
  constexpr double node_w = 200, node_h = 76, gap_x = 170, gap_y = 34, pad = 24;
  constexpr double min_gap_x = 70, min_node_w = 150, band_gap = 2 * gap_y;
  const std::size_t n = g.nodes.size();
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < n; ++i) index.emplace(g.nodes[i].name, i);
  std::vector<std::vector<std::size_t>> preds(n), succs(n);
  for (const auto& e : g.edges) {
    auto f = index.find(e.from), t = index.find(e.to);
    if (e.feedback || f == index.end() || t == index.end() || f->second == t->second) continue;
    preds[t->second].push_back(f->second);
    succs[f->second].push_back(t->second);
  }
  // longest path from the sources (Kahn's order); a node left on an unmarked cycle starts one
  // column after its placed predecessors, and the walk goes on from it
  std::vector<int> layer(n, -1);
  std::vector<std::size_t> indeg(n);
  std::vector<std::size_t> queue;
  for (std::size_t i = 0; i < n; ++i)
    if ((indeg[i] = preds[i].size()) == 0) queue.push_back(i), layer[i] = 0;
  for (std::size_t placed = 0;;) {
    for (; placed < queue.size(); ++placed) {
      const std::size_t a = queue[placed];
      for (std::size_t b : succs[a]) {
        if (layer[b] >= 0 && indeg[b] == 0) continue;  // already walked (placed by the cycle rule)
        layer[b] = std::max(layer[b], layer[a] + 1);
        if (indeg[b] > 0 && --indeg[b] == 0) queue.push_back(b);
      }
    }
    std::size_t next = n;
    for (std::size_t i = 0; i < n && next == n; ++i)
      if (indeg[i] > 0) next = i;
    if (next == n) break;
    int l = 0;
    for (std::size_t p : preds[next])
      if (indeg[p] == 0) l = std::max(l, layer[p] + 1);
    layer[next] = l;
    indeg[next] = 0;
    queue.push_back(next);
  }
  int columns = 0;
  for (int l : layer) columns = std::max(columns, l + 1);
  std::vector<std::vector<std::size_t>> cols(static_cast<std::size_t>(columns));
  for (std::size_t i = 0; i < n; ++i) cols[static_cast<std::size_t>(layer[i])].push_back(i);
  // order within a column by the mean row of the predecessors (one pass, left to right)
  std::vector<double> row(n, 0);
  for (std::size_t c = 0; c < cols.size(); ++c) {
    if (c > 0) {
      auto key = [&](std::size_t i) {
        if (preds[i].empty()) return 1e9;
        double sum = 0;
        for (std::size_t p : preds[i]) sum += row[p];
        return sum / static_cast<double>(preds[i].size());
      };
      std::stable_sort(cols[c].begin(), cols[c].end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
    }
    for (std::size_t r = 0; r < cols[c].size(); ++r) row[cols[c][r]] = static_cast<double>(r);
  }
  // the widths: full size if it fits, then narrower gaps, then narrower boxes, then bands
  const double room = std::max(0.0, max_width - 2 * pad);
  auto fits = [&](int k, double w, double gap) { return k * w + (k - 1) * gap <= room + 1e-9; };
  double w = node_w, gap = gap_x;
  int per_band = std::max(columns, 1);
  if (!fits(per_band, w, gap)) {
    gap = per_band > 1 ? std::max(min_gap_x, (room - per_band * w) / (per_band - 1)) : gap;
    if (!fits(per_band, w, gap)) w = std::max(min_node_w, (room - (per_band - 1) * gap) / per_band);
    if (!fits(per_band, w, gap)) {
      per_band = std::max(1, static_cast<int>(std::floor((room + gap) / (w + gap))));
      w = std::min(w, room);
    }
  }
  graph_layout out;
  out.boxes.resize(n);
  double band_top = pad, width = 0;
  for (int b0 = 0; b0 < columns; b0 += per_band) {
    double bottom = band_top;
    for (int c = b0; c < std::min(columns, b0 + per_band); ++c) {
      double y = band_top;
      for (std::size_t i : cols[static_cast<std::size_t>(c)]) {
        node_box& box = out.boxes[i];
        box.name = g.nodes[i].name;
        box.column = c;
        box.band = b0 / per_band;
        box.x = pad + (c - b0) * (w + gap);
        box.y = y;
        box.w = w;
        box.h = node_h;
        y += node_h + gap_y;
        width = std::max(width, box.x + w + pad);
      }
      bottom = std::max(bottom, y - gap_y);
    }
    band_top = bottom + band_gap;
  }
  out.width = std::min(max_width, std::max(width, 2 * pad));
  out.height = band_top - band_gap + pad + 40;  // 40: room for the loops of feedback edges below the nodes
  return out;
}

std::string hub::status_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached("status", [&] { return hub_json{*this}.status().dump(-1, ' ', false, k_replace); });
}

std::string hub::nodes_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached("nodes", [&] {
    return json{{"window_s", num(rates_.window_s)}, {"nodes", hub_json{*this}.nodes()}}.dump(-1, ' ', false, k_replace);
  });
}

std::optional<std::string> hub::node_json(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < current_.nodes.size(); ++i)
    if (current_.nodes[i].name == name) return hub_json{*this}.node_detail(i).dump(-1, ' ', false, k_replace);
  return std::nullopt;
}

std::string hub::edges_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached("edges", [&] {
    return json{{"window_s", num(rates_.window_s)}, {"edges", hub_json{*this}.edges()}}.dump(-1, ' ', false, k_replace);
  });
}

std::string hub::bottlenecks_json(std::size_t n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached("bottlenecks:" + std::to_string(n), [&] {
    return json{{"window_s", num(rates_.window_s)}, {"nodes", hub_json{*this}.bottlenecks(n)}}.dump(-1, ' ', false,
                                                                                                 k_replace);
  });
}

std::string hub::signals_json(double since_t) const {
  std::lock_guard<std::mutex> lock(mutex_);
  char key[48];
  std::snprintf(key, sizeof key, "signals:%.17g", since_t);  // exact: each since_t its own document
  return cached(key, [&] { return render_signals(since_t); });
}

std::string hub::render_signals(double since_t) const {
  // mutex_ held
  json series = json::array();
  for (const auto& [key, points] : series_) {
    json pts = json::array();
    for (const auto& [t, v] : points)
      if (t > since_t) pts.push_back(json::array({num(t), sig_num(v)}));
    auto it = latest_.find(key);
    series.push_back(
        json{{"node", key.first},
             {"name", key.second},
             {"latest", it != latest_.end() ? sig_num(it->second)
                                            : (points.empty() ? json(nullptr) : sig_num(points.back().second))},
             {"points", std::move(pts)}});
  }
  json phases = json::array();
  for (const auto& p : phases_)
    if (p.t_s > since_t)
      phases.push_back(json{{"t_s", num(p.t_s)}, {"node", p.node}, {"replica", p.replica}, {"phase", p.text}});
  return json{{"phase", current_.phase}, {"series", std::move(series)}, {"phases", std::move(phases)}}.dump(-1, ' ', false, k_replace);
}

std::string hub::memory_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached("memory", [&] { return render_memory(); });
}

std::string hub::render_memory() const {
  // mutex_ held
  json ranks = json::array();
  for (const auto& n : current_.nodes)
    for (std::size_t k = 0; k < n.replicas.size(); ++k) {
      const auto& r = n.replicas[k];
      if (r.memory.empty()) continue;
      json bytes = json::object();
      std::int64_t total = 0;
      for (const auto& [c, b] : r.memory) {
        bytes[c] = b;
        total += b;
      }
      ranks.push_back(json{{"node", n.name},
                           {"replica", k},
                           {"rank", n.name + "[" + std::to_string(k) + "]"},
                           {"bytes", std::move(bytes)},
                           {"total_bytes", total}});
    }
  return json{{"rss_bytes", current_.rss_bytes}, {"ranks", std::move(ranks)}}.dump(-1, ' ', false, k_replace);
}

std::string hub::cluster_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached("cluster", [&] { return cluster_doc(current_.cluster).dump(-1, ' ', false, k_replace); });
}

std::string hub::events_json(std::uint64_t since_seq) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached("events:" + std::to_string(since_seq), [&] { return render_events(since_seq); });
}

std::string hub::render_events(std::uint64_t since_seq) const {
  // mutex_ held
  json a = json::array();
  for (const auto& e : events_)
    if (e.seq > since_seq) a.push_back(event_json(e));
  return json{{"events", std::move(a)}, {"last_seq", events_.empty() ? 0 : events_.back().seq}}.dump(-1, ' ', false, k_replace);
}

std::string hub::frame_json(std::uint64_t* event_seq, std::uint64_t* signal_seq) const {
  std::lock_guard<std::mutex> lock(mutex_);
  hub_json r{*this};
  json evs = json::array();
  for (const auto& e : events_)
    if (e.seq > *event_seq) evs.push_back(event_json(e));
  if (!events_.empty()) *event_seq = std::max(*event_seq, events_.back().seq);
  json sigs = json::array();
  for (const auto& p : recent_signals_)
    if (p.seq > *signal_seq) sigs.push_back(signal_json(p));
  if (!recent_signals_.empty()) *signal_seq = std::max(*signal_seq, recent_signals_.back().seq);
  json tps = nullptr;
  if (auto it = series_.find({"", "tokens_per_s"}); it != series_.end() && !it->second.empty())
    tps = json::array({num(it->second.back().first), num(it->second.back().second, 10)});
  return json{{"frame", frame_},
              {"status", r.status()},
              {"nodes", r.nodes()},
              {"edges", r.edges()},
              {"bottlenecks", r.bottlenecks(5)},
              {"cluster", cluster_doc(current_.cluster)},
              {"events", std::move(evs)},
              {"signals", std::move(sigs)},
              {"tokens_per_s_point", std::move(tps)}}
      .dump(-1, ' ', false, k_replace);
}

reply hub::act(std::string_view what) {
  std::function<std::string()> f;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return {409, json{{"ok", false}, {"action", what}, {"error", "the run has finished"}}.dump(-1, ' ', false, k_replace)};
    if (what == "pause")
      f = controls_.pause;
    else if (what == "resume")
      f = controls_.resume;
    else if (what == "stop")
      f = controls_.stop;
    else if (what == "checkpoint")
      f = controls_.checkpoint;
    else
      return {404, json{{"ok", false}, {"error", "unknown action '" + std::string(what) + "'"}}.dump(-1, ' ', false, k_replace)};
  }
  if (!f) return {503, json{{"ok", false}, {"action", what}, {"error", "the run is not ready for this yet"}}.dump(-1, ' ', false, k_replace)};
  try {
    return {200, json{{"ok", true}, {"action", what}, {"message", f()}}.dump(-1, ' ', false, k_replace)};
  } catch (const std::exception& e) {
    return {409, json{{"ok", false}, {"action", what}, {"error", e.what()}}.dump(-1, ' ', false, k_replace)};
  }
}

}  // namespace flowrun::console
