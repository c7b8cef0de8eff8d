#include "runtime/actor/live.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace flowrun::actor {

std::string_view to_string(replica_state s) {
  switch (s) {
    case replica_state::initializing:
      return "initializing";
    case replica_state::idle:
      return "idle";
    case replica_state::busy:
      return "busy";
    case replica_state::waiting_credit:
      return "waiting_credit";
    case replica_state::waiting_request:
      return "waiting_request";
    case replica_state::restarting:
      return "restarting";
    case replica_state::paused:
      return "paused";
    case replica_state::failed:
      return "failed";
    case replica_state::done:
      return "done";
    case replica_state::stopped:
      return "stopped";
    case replica_state::remote:
      return "remote";
  }
  return "?";
}

std::string_view to_string(run_phase p) {
  switch (p) {
    case run_phase::starting:
      return "starting";
    case run_phase::running:
      return "running";
    case run_phase::paused:
      return "paused";
    case run_phase::draining:
      return "draining";
    case run_phase::stopping:
      return "stopping";
    case run_phase::finished:
      return "finished";
  }
  return "?";
}

// -- replica_live ---------------------------------------------------------------------

void replica_live::set_failure(std::string why) {
  std::lock_guard<std::mutex> lock(mutex_);
  reason_ = std::move(why);
}

void replica_live::note_error(double t_s, std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  errors_.emplace_back(t_s, std::move(what));
  while (errors_.size() > 8) errors_.pop_front();
}

void replica_live::set_phase(std::string_view phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_.assign(phase);
}

void replica_live::set_memory(std::vector<std::pair<std::string, std::int64_t>> bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  memory_ = std::move(bytes);
}

replica_view replica_live::read(std::int64_t now_ns) const {
  replica_view v;
  v.state = state_.load(std::memory_order_acquire);
  v.state_for_s = std::max<std::int64_t>(0, now_ns - since_ns_.load(std::memory_order_relaxed)) * 1e-9;
  v.checkpoint_capable = checkpoint_capable_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  v.reason = reason_;
  v.phase = phase_;
  v.errors.assign(errors_.begin(), errors_.end());
  v.memory = memory_;
  return v;
}

// -- job_live ---------------------------------------------------------------------------

void job_live::add_node(std::string name, std::size_t replicas) {
  node_entry e;
  e.name = std::move(name);
  for (std::size_t r = 0; r < replicas; ++r) e.replicas.push_back(std::make_unique<replica_live>());
  nodes_.push_back(std::move(e));
}

double job_live::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::int64_t job_live::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
}

void job_live::event(std::string kind, std::string node, std::int64_t replica, std::string text) {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(live_event{++event_seq_, t, std::move(kind), std::move(node), replica, std::move(text)});
  while (events_.size() > max_events) events_.pop_front();
}

void job_live::signal(std::string node, std::int64_t replica, std::string name, double value, std::int64_t step) {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  signals_.push_back(live_signal{++signal_seq_, t, std::move(node), replica, std::move(name), value, {}, step});
  while (signals_.size() > max_signals) signals_.pop_front();
}

void job_live::phase(std::string node, std::int64_t replica, std::string phase) {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  current_phase_ = phase;
  signals_.push_back(live_signal{++signal_seq_, t, std::move(node), replica, "phase", 0.0, std::move(phase)});
  while (signals_.size() > max_signals) signals_.pop_front();
}

std::string job_live::current_phase() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_phase_;
}

void job_live::progress(std::string node, std::string what, std::int64_t done, std::int64_t total) {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& p : progress_)
    if (p.node == node && p.what == what) {
      if (done < p.done) p.first_s = t, p.first_done = done;  // started over (a restart): rate from now
      p.done = done;
      p.total = total;
      p.t_s = t;
      return;
    }
  progress_.push_back(live_progress{std::move(node), std::move(what), done, total, t, done, t});
}

std::vector<live_progress> job_live::progress_now() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<live_progress> out;
  for (const auto& p : progress_)
    if (p.done < p.total) out.push_back(p);
  if (out.empty() && !progress_.empty()) {  // between phases, or after the last: the one reported last
    const live_progress* last = &progress_.front();
    for (const auto& p : progress_)
      if (p.t_s >= last->t_s) last = &p;
    out.push_back(*last);
  }
  return out;
}

double live_progress::eta_s(double now_s) const {
  if (done <= first_done || t_s <= first_s) return -1;
  const double per_unit = (t_s - first_s) / static_cast<double>(done - first_done);
  return std::max(0.0, per_unit * static_cast<double>(std::max<std::int64_t>(0, total - done)) - (now_s - t_s));
}

std::string progress_text(const std::vector<live_progress>& phases, double now_s, bool with_eta) {
  std::string out;
  for (const auto& p : phases) out.append(out.empty() ? "" : " · ").append(p.text(now_s, with_eta));
  return out;
}

std::string live_progress::text(double now_s, bool with_eta) const {
  std::string out = what + " " + std::to_string(done) + "/" + std::to_string(total);
  if (total > 0 && done >= total) return out + " done";
  const double eta = with_eta ? eta_s(now_s) : -1;
  if (eta < 0) return out;
  const long s = std::lround(eta);
  char buf[48];
  if (s >= 3600) std::snprintf(buf, sizeof buf, " ETA %ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, " ETA %ld:%02ld", s / 60, s % 60);
  return out + buf;
}

std::vector<live_event> job_live::events_since(std::uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::upper_bound(events_.begin(), events_.end(), seq,
                             [](std::uint64_t s, const live_event& e) { return s < e.seq; });
  return {it, events_.end()};
}

std::vector<live_signal> job_live::signals_since(std::uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::upper_bound(signals_.begin(), signals_.end(), seq,
                             [](std::uint64_t s, const live_signal& e) { return s < e.seq; });
  return {it, signals_.end()};
}

std::uint64_t job_live::request_checkpoint() {
  const std::uint64_t gen = checkpoint_gen_.fetch_add(1) + 1;
  event("checkpoint", "", -1, "checkpoint request #" + std::to_string(gen));
  return gen;
}

namespace {
// Raises `a` to `v` unless it is already higher.
void raise_to(std::atomic<std::uint64_t>& a, std::uint64_t v) {
  for (std::uint64_t cur = a.load(); cur < v && !a.compare_exchange_weak(cur, v);) {
  }
}
}  // namespace

bool job_live::checkpoint_due(std::size_t node, std::size_t replica, std::uint64_t& seen, std::int64_t step) {
  node_entry& n = nodes_.at(node);
  n.replicas.at(replica)->mark_checkpoint_capable();
  const std::uint64_t gen = checkpoint_gen_.load(std::memory_order_acquire);
  if (gen == seen) return false;
  if (step < 0) {
    seen = gen;
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n.claimed_gen != gen) {
      n.claimed_gen = gen;
      n.target_step = step + 1;
    }
    if (step < n.target_step) return false;
    seen = gen;
  }
  raise_to(checkpoint_honoured_, gen);
  event("checkpoint", n.name, static_cast<std::int64_t>(replica),
        "honouring checkpoint request #" + std::to_string(gen) + (step >= 0 ? " at step " + std::to_string(step) : ""));
  return true;
}

std::uint64_t job_live::checkpoint_generation_for(std::size_t node, std::size_t replica) {
  nodes_.at(node).replicas.at(replica)->mark_checkpoint_capable();
  return checkpoint_gen_.load(std::memory_order_acquire);
}

std::vector<std::string> job_live::checkpoint_capable_nodes() const {
  std::vector<std::string> out;  // (a cluster node's report marks its nodes' replicas: note_remote_checkpoints)
  for (const auto& n : nodes_)
    for (const auto& r : n.replicas)
      if (r->read(0).checkpoint_capable) {
        if (std::find(out.begin(), out.end(), n.name) == out.end()) out.push_back(n.name);
        break;
      }
  return out;
}

void job_live::raise_checkpoint_generation(std::uint64_t gen) { raise_to(checkpoint_gen_, gen); }

void job_live::note_remote_checkpoints(std::uint64_t honoured, const std::vector<std::string>& capable) {
  raise_to(checkpoint_honoured_, honoured);
  // every replica of the named nodes: checkpoint_capable_nodes and the console's replica view read them (a node
  // reports names, not replicas, and a kind that polls the requests polls them in every replica)
  for (auto& n : nodes_)
    if (std::find(capable.begin(), capable.end(), n.name) != capable.end())
      for (auto& r : n.replicas) r->mark_checkpoint_capable();
}

void job_live::printed(std::string_view line) {
  if (!forward_prints_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  printed_.emplace_back(line);
  ++printed_seq_;
  if (printed_.size() > max_events) printed_.pop_front();  // main asks every heartbeat: only a stalled one misses
}

std::vector<std::string> job_live::printed_since(std::int64_t seen, std::uint64_t* first) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t oldest = printed_seq_ - printed_.size() + 1;  // the number of printed_.front()
  const std::uint64_t from = std::max(static_cast<std::uint64_t>(std::max<std::int64_t>(seen, 0)) + 1, oldest);
  *first = from;
  if (from > printed_seq_) return {};
  return {printed_.begin() + static_cast<std::ptrdiff_t>(from - oldest), printed_.end()};
}

}  // namespace flowrun::actor
