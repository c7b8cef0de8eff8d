// Layer 5, actor runtime: run_graph, the loop that owns a run in a real
// process (threaded CAF scheduler, signals, periodic metrics, progress line).
#include "runtime/actor/runtime.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <future>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <spdlog/spdlog.h>

#include "runtime/actor/cluster.h"
#include "runtime/actor/cluster_auth.h"
#include "runtime/actor/cluster_run.h"
#include "runtime/actor/console.h"
#include "runtime/actor/console_bridge.h"
#include "runtime/actor/job.h"
#include "runtime/actor/teardown.h"
#include "runtime/comm/caf_scheduler.h"
#include "runtime/console/hub.h"
#include "runtime/graph/parse.h"

namespace flowrun::actor {

// -- run_state ------------------------------------------------------------------------

void run_state::finish(int exit_code, std::string error, stop_reason reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = true;
    exit_code_ = exit_code;
    error_ = std::move(error);
    reason_ = reason;
  }
  cv_.notify_all();
}

bool run_state::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

bool run_state::wait_for_ms(int ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return finished_; });
}

int run_state::exit_code() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exit_code_;
}

std::string run_state::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

stop_reason run_state::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

void run_state::mark_lost(std::uint32_t process) {
  std::lock_guard<std::mutex> lock(mutex_);
  lost_.insert(process);
}

bool run_state::lost(std::uint32_t process) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_.count(process) > 0;
}

namespace {

// -- signals: the handler only counts; the run loop forwards them ------------------------

std::atomic<int> g_signal_count{0};
std::atomic<int> g_last_signal{0};

extern "C" void on_signal(int sig) {
  g_last_signal.store(sig);
  g_signal_count.fetch_add(1);
}

class signal_guard {
 public:
  signal_guard() {
    g_signal_count = 0;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~signal_guard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  signal_guard(const signal_guard&) = delete;
  signal_guard& operator=(const signal_guard&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// Requests from the console's threads, forwarded by the run loop.
class control_queue {
 public:
  enum { pause, resume, stop };
  void push(int r) {
    std::lock_guard<std::mutex> lock(mutex_);
    items_.push_back(r);
  }
  std::vector<int> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(items_, {});
  }

 private:
  std::mutex mutex_;
  std::vector<int> items_;
};

// True when something accepts a TCP connection at host:port within timeout_ms
// (a lost cluster node whose daemon came back). Plain sockets: no CAF.
bool port_answers(const std::string& host, int port, std::int64_t timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return false;
  bool ok = false;
  for (addrinfo* a = res; a && !ok; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(timeout_ms, 10000))) == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        ok = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return ok;
}

// The run id of this process's run (node_context::run_id): $FLOWRUN_RUN_ID (flowrun launch gives its
// processes one, so that they share the run's checkpoint folders: runtime/util/dir_lock.h), else a random one.
// One with a space or a line break is refused: it was replaced by a random id here while the checkpoint lock
// took it as set, so processes started by hand with FLOWRUN_RUN_ID="my run" refused each other's output_dir.
std::string shared_run_id() {
  const char* id = std::getenv("FLOWRUN_RUN_ID");
  if (!id || !*id) return random_nonce().substr(0, 16);
  if (std::string(id).find_first_of(" \t\r\n") != std::string::npos)
    throw std::invalid_argument(fmt::format("FLOWRUN_RUN_ID '{}' holds a space or a line break: give the processes of "
                                            "the run one word (e.g. my_run), or unset it",
                                            id));
  return id;
}

}  // namespace

// -- run_graph ----------------------------------------------------------------------------

// The lost-node message (job.cpp) promised a restart ("; the run stops and starts again ..."), but
// none comes (restarts used up, or an interruption): `error` gets `instead` in place of the promise.
static void no_restart_after_all(std::string& error, const std::string& instead) {
  if (const auto at = error.find("; the run stops and starts again"); at != std::string::npos)
    error = error.substr(0, at) + instead;
}

std::string attempt_stop_reason(const graph::graph_spec& spec, const std::vector<std::string>& lost,
                                const std::string& first_error) {
  std::string why;
  bool named = true;
  for (const auto& name : lost) {
    std::string actors;
    for (const auto& n : spec.nodes)
      for (std::int64_t r = 0; r < n.replicas; ++r)
        if (graph::placement_of(n, r) == name)
          actors += (actors.empty() ? "" : ", ") + n.name + (n.replicas > 1 ? "[" + std::to_string(r) + "]" : "");
    named = named && first_error.rfind("cluster node '" + name + "' lost", 0) == 0;
    why += (why.empty() ? "" : "; ") + ("cluster node '" + name + "' lost; its actors: ") +
           (actors.empty() ? std::string("none") : actors);
  }
  if (lost.size() == 1 && named) return first_error;  // the loss was the first error: it says it all
  return why + (first_error.empty() ? std::string() : " (the run's first error: " + first_error + ")");
}

run_result run_graph(const graph::graph_spec& spec, const graph::node_kind_registry& kinds,
                     const node_factory_registry& factories, const run_options& options) {
  run_result result;
  std::ofstream metrics_file;
  // the processes of one run (flowrun launch, or started by hand with FLOWRUN_PROCESS_INDEX) share its command
  // line: process 0 writes the metrics file, as it writes TensorBoard's (both wrote it, their lines interleaved)
  if (!options.metrics_path.empty() && launch_process_index() > 0)
    spdlog::info("process {}: the metrics file {} is written by process 0", launch_process_index(),
                 options.metrics_path);
  else if (!options.metrics_path.empty()) {
    // its folder is made, like every output's (`--metrics out/rlhf/metrics.jsonl` before out/rlhf exists)
    const auto parent = std::filesystem::path(options.metrics_path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    // A run that resumes (its checkpoint folder holds something) adds to the file of the run it
    // continues instead of wiping it; `flowrun report` keeps, per series, the later run's values
    // for the steps it did again (tools/flowrun/report.h, parse_metrics).
    bool resuming = false, appends_to_records = false;
    if (!spec.checkpoint_dir.empty() && std::filesystem::is_directory(spec.checkpoint_dir, ec))
      resuming = !std::filesystem::is_empty(spec.checkpoint_dir, ec);
    // a node with checkpoints of its own (pretraining's output_dir): its resume kept the file too (it was
    // started again, the run's history lost, on every resume and every rerun of a finished run)
    for (const auto& n : spec.nodes)
      if (const auto* k = kinds.lookup(n.kind); !resuming && k && k->resumes) resuming = k->resumes(n);
    if (resuming && std::filesystem::exists(options.metrics_path, ec)) {
      // a run killed while writing a line leaves part of it: cut back to the last whole line, so the
      // appended records start on a line of their own (the file is read only then)
      std::ifstream in(options.metrics_path, std::ios::binary | std::ios::ate);
      std::size_t keep = static_cast<std::size_t>(std::max<std::streamoff>(0, in.tellg()));
      if (keep > 0 && (in.seekg(-1, std::ios::end), in.get() != '\n')) {
        in.clear();
        in.seekg(0);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        std::filesystem::resize_file(options.metrics_path, keep, ec);
      }
      appends_to_records = keep > 0;
    }
    metrics_file.open(options.metrics_path, std::ios::out | (resuming ? std::ios::app : std::ios::trunc));
    // the resume mark: `flowrun report` lets this run's records replace the earlier run's from the
    // steps it does again (tools/flowrun/report.h)
    if (metrics_file && appends_to_records) metrics_file << "{\"resumed\":true}\n" << std::flush;
    if (!metrics_file) {
      result.exit_code = exit_failed;
      result.reason = stop_reason::failed;
      result.error = "cannot open the metrics file '" + options.metrics_path + "' for writing";
      return result;
    }
  }
  // The console listens before anything runs, so that a port in use stops the run before it starts.
  std::unique_ptr<console_session> console_live;
  if (options.console.enabled) {
    try {
      console_live = std::make_unique<console_session>(spec, options.console, options.default_credit);
    } catch (const std::exception& e) {
      result.exit_code = exit_failed;
      result.reason = stop_reason::failed;
      result.error = e.what();
      return result;
    }
  }
  const bool show_progress = options.progress.value_or(isatty(STDERR_FILENO) == 1);
  caf::actor_system_config cfg;
  comm::configure_scheduler(cfg, options.threads);
  // A graph placed over cluster nodes needs CAF's middleman (docs/scaling.md).
  const bool clustered = needs_cluster(spec);
  if (clustered) cfg.load<caf::io::middleman>();
  if (clustered && !options.cluster.tls_cert.empty()) {
    cfg.openssl_certificate = options.cluster.tls_cert;
    cfg.openssl_key = options.cluster.tls_key;
    cfg.openssl_cafile = options.cluster.tls_ca;
    cfg.load<caf::openssl::manager>();
  }
  {
    // Heap-allocated: its destruction is bounded at the end (teardown_actor_system).
    auto sys_owner = std::make_unique<caf::actor_system>(cfg);
    caf::actor_system& sys = *sys_owner;
    signal_guard signals;
    int forwarded = 0;
    // What the console's POST endpoints ask. They run on the server's threads and only queue the request; the
    // loop below forwards it to the coordinator (so no CAF handle ever leaves this thread or outlives the actor
    // system). One queue for every attempt: a pause or stop asked while a restart waits for a lost node was
    // answered and then dropped with the attempt's queue. `want_paused`: the state the requests so far ask for,
    // which the replies go by (the run's phase lags the queue: a pause right after a resume was refused), and
    // which a restarted attempt starts in (the restarted job ran on).
    auto requests = std::make_shared<control_queue>();
    auto want_paused = std::make_shared<std::atomic<bool>>(false);
    bool console_stop = false;  // a console stop while no job runs (a restart's wait)
    auto between_attempts = [&] {  // a stop among the requests that came while no job runs (want_paused has the rest)
      for (int req : requests->take()) console_stop = console_stop || req == control_queue::stop;
      return console_stop;
    };
    // Attempts: more than one when a cluster node is lost under on_node_lost =
    // "restart" (docs/scaling.md). Each attempt is a new job over the same
    // graph, with the lost nodes' replicas moved to main (unless they answer
    // again); nodes resume from what earlier attempts of this run_id saved.
    run_options attempt_options = options;
    if (attempt_options.run_id.empty()) attempt_options.run_id = shared_run_id();
    graph::graph_spec attempt_spec = spec;
    // Places every replica of cluster node `name` on main; returns what moved.
    auto move_to_main = [&](const std::string& name) {
      std::string moved;
      for (auto& n : attempt_spec.nodes) {
        std::vector<std::string> where;
        bool changed = false;
        for (std::int64_t r = 0; r < n.replicas; ++r) {
          where.push_back(graph::placement_of(n, r));
          if (where.back() == name) where.back() = std::string(graph::main_process_name), changed = true;
        }
        if (!changed) continue;
        n.on.clear();
        n.on_replicas = where;
        moved += (moved.empty() ? "" : "; ") + n.name + " moves from " + name + " to main";
      }
      return moved;
    };
    for (;;) {
    std::unique_ptr<cluster_run> cluster;
    job j;
    if (needs_cluster(attempt_spec)) {
      std::string failed_node;
      auto started = cluster_run::start(sys, attempt_spec, kinds, factories, attempt_options, &failed_node);
      if (!started) {
        // A restart whose start fails at one node (it died meanwhile, or its
        // daemon ran with --once and is gone) moves that node's actors to
        // main and tries again, while restarts are left.
        if (attempt_options.attempt > 0 && !failed_node.empty() && g_signal_count.load() == 0 &&
            attempt_options.attempt < spec.cluster.max_restarts) {
          const std::string moved = move_to_main(failed_node);
          if (!moved.empty()) {
            ++attempt_options.attempt;
            spdlog::warn("[{}] restarting the run (attempt {} of at most {}): cluster node '{}' failed while the run "
                         "started ({}); {}",
                         spec.name, attempt_options.attempt + 1, spec.cluster.max_restarts + 1, failed_node,
                         started.error(), moved);
            continue;
          }
        }
        result.exit_code = exit_failed;
        result.reason = stop_reason::failed;
        result.error = started.error();
        return result;
      }
      cluster = std::move(*started);
      j = cluster->the_job();
    } else {
      auto launched = launch(sys, attempt_spec, kinds, factories, attempt_options);
      if (!launched) {
        result.exit_code = exit_failed;
        result.reason = stop_reason::failed;
        result.error = launched.error();
        return result;
      }
      j = std::move(*launched);
    }
    if (console_live) {
      std::shared_ptr<job_live> live = j.live;
      ::flowrun::console::controls c;
      c.pause = [requests, want_paused] {
        if (want_paused->exchange(true)) return std::string("already paused: resume to go on");
        requests->push(control_queue::pause);
        return std::string("pausing: no message is handled and no source produces until resume");
      };
      c.resume = [requests, want_paused] {
        if (!want_paused->exchange(false)) return std::string("not paused: nothing to resume");
        requests->push(control_queue::resume);
        return std::string("resuming");
      };
      auto stops = std::make_shared<std::atomic<int>>(0);
      c.stop = [requests, live, stops] {
        const int n = ++*stops;
        if (n == 1) live->event("stop", "", -1, "stop requested by the console: draining as on SIGINT");
        else if (n == 2) live->event("stop", "", -1, "second stop from the console: stopping without draining");
        if (n <= 2) requests->push(control_queue::stop);
        std::string pending;  // a request a paused run never reached: the stop drains, the checkpoint stays unwritten
        if (live->checkpoint_generation() > live->checkpoint_honoured())
          pending = "; checkpoint request #" + std::to_string(live->checkpoint_generation()) +
                    " was not honoured yet and may not be before the run ends (the last committed checkpoint stays)";
        if (n == 1)
          return "stopping: sources stop, messages in flight are handled, every node's stop() runs (exit code 130); "
                 "a second stop stops without draining" + pending;
        if (n == 2) return "stopping without draining (the second stop)" + pending;
        return std::string("already stopping without draining");
      };
      c.checkpoint = [live] {
        const std::uint64_t n = live->request_checkpoint();
        auto nodes = live->checkpoint_capable_nodes();
        std::string names;
        for (const auto& x : nodes) names += (names.empty() ? "" : ", ") + x;
        return "checkpoint request #" + std::to_string(n) + " sent; " +
               (nodes.empty() ? std::string("no node has asked for checkpoint requests yet (the nodes that poll them, "
                                            "e.g. zero_rank, honour it at their next step; those on cluster nodes say so "
                                            "with their next counter report, whose replicas the console then shows "
                                            "checkpoint_capable; flowrun launch's processes checkpoint by "
                                            "save_checkpoint_steps only)")
                              : "nodes that honour it at their next step: " + names) +
               (live->get_run_phase() == run_phase::paused
                    ? "; the run is paused: that step comes after resume (a stop before it writes no checkpoint)"
                    : "");
      };
      console_live->set_controls(std::move(c));
      if (attempt_options.attempt == 0) console_live->announce();
      else console_live->new_attempt();
      if (want_paused->load()) {
        pause(j);
        const std::string msg = "the restarted run starts paused, as the console left it: resume to go on";
        j.live->event("pause", "", -1, msg);
        spdlog::warn("[{}] {}", spec.name, msg);
      }
    }
    using clk = std::chrono::steady_clock;
    auto next_console = clk::now();
    auto next_metrics = clk::now() + std::chrono::duration_cast<clk::duration>(
                                         std::chrono::duration<double>(std::max(0.0, options.metrics_interval_s)));
    auto next_progress = clk::now();
    metrics_snapshot prev = j.metrics->snapshot();
    metrics_snapshot prev_progress = prev;
    // Signal records (node_context::signal, through job_live) go to the metrics file as they
    // come, one line per point; job_live keeps the last max_signals, so a gap in the sequence
    // numbers (a reader far behind) is counted and reported, never silent.
    std::uint64_t signal_seq = 0, signals_lost = 0;
    auto write_signals = [&] {
      if (!metrics_file) return;
      for (const auto& p : j.live->signals_since(signal_seq)) {
        signals_lost += p.seq - signal_seq - 1;
        signal_seq = p.seq;
        if (p.name != "phase") metrics_file << to_json_line(p) << '\n';
      }
      metrics_file << std::flush;
    };
    while (!j.state->wait_for_ms(50)) {
      write_signals();
      if (cluster) cluster->sync_metrics();  // the other nodes' replicas, as of their last heartbeat
      // Forward each signal once (the first drains, the second stops at once).
      const int seen = g_signal_count.load();
      while (forwarded < seen && forwarded < 2) {
        ++forwarded;
        interrupt(j, g_last_signal.load());
      }
      if (seen >= 3) {
        console::clear_progress();
        spdlog::error("third signal: exiting without waiting for the nodes");
        std::_Exit(128 + g_last_signal.load());
      }
      for (int req : requests->take()) {
        if (req == control_queue::pause) {  // said in the log, as the console's stop is
          pause(j);
          spdlog::info("[{}] the console's pause: nothing is handled or produced until resume", spec.name);
        } else if (req == control_queue::resume) {
          resume(j);
          spdlog::info("[{}] the console's resume", spec.name);
        }
        else interrupt(j, 0);  // the console's stop: drains as SIGINT, named so
      }
      const auto now = clk::now();
      if (options.metrics_interval_s > 0 && now >= next_metrics) {
        next_metrics = now + std::chrono::duration_cast<clk::duration>(
                                 std::chrono::duration<double>(options.metrics_interval_s));
        metrics_snapshot snap = j.metrics->snapshot();
        if (metrics_file) metrics_file << to_json_line(snap, false) << '\n' << std::flush;
        const double dt = snap.elapsed_s - prev.elapsed_s;
        const double tps = dt > 0 ? static_cast<double>(snap.tokens() - prev.tokens()) / dt : 0.0;
        std::string busiest;
        double busiest_busy = -1;
        for (const auto& n : snap.nodes)
          if (n.busy_s > busiest_busy) busiest_busy = n.busy_s, busiest = n.name;
        console::clear_progress();
        const std::string phases = progress_text(j.live->progress_now(), snap.elapsed_s);
        spdlog::info("[{}] {:.1f}s: {}, {} tokens ({:.0f} tok/s), busiest node {} ({:.2f}s busy)", spec.name,
                     snap.elapsed_s, phases.empty() ? "step " + std::to_string(snap.steps()) : phases, snap.tokens(),
                     tps, busiest, busiest_busy);
        if (cluster) spdlog::info("[{}] cluster: {}", spec.name, cluster->status());
        for (const auto& n : snap.nodes)
          spdlog::debug("node {}: in {} out {} depth {} busy {:.3f}s blocked {:.3f}s", n.name, n.msgs_in, n.msgs_out,
                        n.depth, n.busy_s, n.blocked_s);
        prev = std::move(snap);
      }
      if (cluster && console_live && now >= next_console) {
        cluster->publish_live();
        console_live->set_cluster(cluster->view());
      }
      if (console_live && now >= next_console) {
        next_console = now + std::chrono::duration_cast<clk::duration>(
                                 std::chrono::duration<double>(std::max(0.05, options.console.interval_s)));
        console_live->sample(j.metrics->snapshot(), *j.live);
      }
      if (show_progress && now >= next_progress) {
        next_progress = now + std::chrono::milliseconds(250);
        metrics_snapshot snap = j.metrics->snapshot();
        // tok/s over the last few seconds rather than the last tick.
        console::progress(format_progress(spec.name, snap, prev_progress, spec.steps, j.live->progress_now()));
        if (snap.elapsed_s - prev_progress.elapsed_s > 3.0) prev_progress = std::move(snap);
      }
    }
    console::clear_progress();
    std::vector<std::string> lost;
    if (cluster) {
      cluster->publish_live();
      spdlog::info("[{}] cluster: {}", spec.name, cluster->status());
      std::string traffic = cluster->end();
      if (options.summary) spdlog::info("[{}] {}", spec.name, traffic);
      // The console's last view is the one the run's outcome is read from, taken after end():
      // a node whose loss was noticed while the run stopped (its replica's failure can end the
      // job before the liveness monitor marks the node) is shown lost, not connected.
      const cluster_view last = cluster->view();
      if (console_live) console_live->set_cluster(last);
      for (const auto& n : last.nodes)
        if (n.state == "lost") lost.push_back(n.name);
    }
    result.exit_code = j.state->exit_code();
    result.error = j.state->error();
    result.reason = j.state->reason();
    result.metrics = j.metrics->snapshot();
    // on_node_lost = "restart": the run starts again unless it was interrupted
    // or the restarts are used up.
    const bool restart = !lost.empty() && spec.cluster.on_node_lost == "restart" && forwarded == 0 &&
                         result.reason == stop_reason::failed && attempt_options.attempt < spec.cluster.max_restarts;
    if (!lost.empty() && spec.cluster.on_node_lost == "restart" && !restart) {
      const std::string why = forwarded > 0 ? std::string("the run was interrupted")
                                            : "max_restarts = " + std::to_string(spec.cluster.max_restarts) + " used up";
      spdlog::error("[{}] not restarting: {}", spec.name, why);
      no_restart_after_all(result.error, "; the run stops, not restarted (" + why + ")");
    }
    // a console checkpoint request the run ended before (paused, then stopped): said, not silent
    if (j.live->checkpoint_generation() > j.live->checkpoint_honoured())
      spdlog::warn("[{}] checkpoint request #{} was not honoured before the run ended ({}): nothing was written for "
                   "it, the last committed checkpoint stays{}",
                   spec.name, j.live->checkpoint_generation(), to_string(result.reason),
                   j.live->checkpoint_capable_nodes().empty()
                       ? " (no node of this run polled the console's checkpoint requests, here or on a cluster node; "
                         "flowrun launch's processes checkpoint by save_checkpoint_steps only)"
                       : "");
    write_signals();
    if (signals_lost > 0)
      spdlog::warn("[{}] {} signal records were not written to the metrics file (more than {} came between two "
                   "reads)", spec.name, signals_lost, job_live::max_signals);
    if (metrics_file) metrics_file << to_json_line(result.metrics, !restart) << '\n' << std::flush;
    if (console_live && !restart) console_live->finish(result.metrics, *j.live, result.exit_code, result.error);
    if (options.summary) {
      std::string summary = format_summary(result.metrics);
      if (restart)
        spdlog::info("[{}] attempt {} {} in {:.2f}s; the run restarts", spec.name, attempt_options.attempt + 1,
                     to_string(result.reason), result.metrics.elapsed_s);
      else
        spdlog::info("[{}] {} in {:.2f}s (exit code {})", spec.name, to_string(result.reason), result.metrics.elapsed_s,
                     result.exit_code);
      std::size_t at = 0;
      while (at < summary.size()) {
        std::size_t nl = summary.find('\n', at);
        if (nl == std::string::npos) nl = summary.size();
        spdlog::info("  {}", summary.substr(at, nl - at));
        at = nl + 1;
      }
    }
    std::shared_ptr<job_live> last_live = j.live;
    j = job{};  // release the handles before the actor system goes away
    cluster.reset();
    if (!restart) break;
    // what stopped it (naming the lost node's actors) first, before any wait for the node to come back
    spdlog::error("[{}] attempt {} stopped: {}", spec.name, attempt_options.attempt + 1,
                  attempt_stop_reason(attempt_spec, lost, result.error));
    // Every node of the last attempt that does not answer now (the lost one,
    // or a survivor whose daemon ended with --once) has its replicas moved to
    // main; a lost node whose daemon came back on the same address keeps them.
    std::string moved;
    for (const auto& cn : attempt_spec.cluster.nodes) {
      const std::string& name = cn.name;
      bool used = false;
      for (const auto& n : attempt_spec.nodes)
        for (std::int64_t r = 0; r < n.replicas; ++r) used = used || graph::placement_of(n, r) == name;
      if (!used) continue;
      const bool was_lost = std::find(lost.begin(), lost.end(), name) != lost.end();
      // A lost node may come back (a supervisor restarts its daemon): wait up to rejoin_wait_ms for it.
      // A lost node counts as back once its daemon answers the cluster handshake's first step: a frozen
      // daemon (SIGSTOP, a hung machine) still accepts TCP connections, and the next attempt would wait
      // connect_timeout_ms for it in vain and spend a restart. `accepted`: the port took the connection.
      const bool tls = !options.cluster.tls_cert.empty();
      bool accepted = false;
      auto answers_within = [&](std::int64_t ms) {
        accepted = port_answers(cn.host, cn.port, ms);
        return accepted && (!was_lost || daemon_answers(sys, cn.host, cn.port, tls, std::chrono::milliseconds(ms)));
      };
      bool answers = answers_within(attempt_spec.cluster.connect_timeout_ms);
      if (was_lost && !answers && attempt_spec.cluster.rejoin_wait_ms > 0) {
        spdlog::info("[{}] waiting up to {} ms for cluster node '{}' ({}) to come back (rejoin_wait_ms)", spec.name,
                     attempt_spec.cluster.rejoin_wait_ms, name, cn.host_port());
        const auto until = clk::now() + std::chrono::milliseconds(attempt_spec.cluster.rejoin_wait_ms);
        // SIGINT/SIGTERM or the console's stop: stop waiting
        while (!answers && clk::now() < until && g_signal_count.load() == 0 && !between_attempts()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          answers = answers_within(std::min<std::int64_t>(1000, attempt_spec.cluster.connect_timeout_ms));
        }
      }
      if (answers) {
        if (was_lost) moved += (moved.empty() ? "" : "; ") + name + " answers again: its actors stay there";
        continue;
      }
      if (was_lost && accepted)
        spdlog::warn("[{}] cluster node '{}' ({}) accepts connections but its daemon does not answer the cluster "
                     "handshake (connect_timeout_ms = {}{}): it counts as gone",
                     spec.name, name, cn.host_port(), attempt_spec.cluster.connect_timeout_ms,
                     attempt_spec.cluster.rejoin_wait_ms > 0
                         ? ", rejoin_wait_ms = " + std::to_string(attempt_spec.cluster.rejoin_wait_ms)
                         : std::string());
      const std::string m = move_to_main(name);
      if (!m.empty()) moved += (moved.empty() ? "" : "; ") + m;
    }
    if (g_signal_count.load() > 0 || between_attempts()) {  // interrupted while waiting for a node: no restart
      spdlog::error("[{}] interrupted before the restart{}; the run stops", spec.name,
                    g_signal_count.load() > 0 ? "" : " (the console's stop)");
      no_restart_after_all(result.error, "; the run was interrupted before its restart: it stops (the same command "
                                         "starts it again from its checkpoints)");
      result.exit_code = g_signal_count.load() > 0 && g_last_signal.load() == SIGTERM ? exit_sigterm : exit_sigint;
      result.reason = stop_reason::interrupted;
      if (console_live) console_live->finish(result.metrics, *last_live, result.exit_code, result.error);
      break;
    }
    ++attempt_options.attempt;
    const std::string msg = "restarting the run (attempt " + std::to_string(attempt_options.attempt + 1) + " of at most " +
                            std::to_string(spec.cluster.max_restarts + 1) +
                            ", on_node_lost = \"restart\"): " + moved +
                            "; nodes resume from what earlier attempts checkpointed";
    spdlog::warn("[{}] {}", spec.name, msg);
    if (last_live) last_live->event("restart", "", -1, msg);
    if (console_live) console_live->sample(result.metrics, *last_live);
    }  // attempts
    teardown_actor_system(std::move(sys_owner), clustered, result.exit_code, result.error);
  }
  if (console_live) {  // a signal during the linger ends it; the run's exit code stays
    signal_guard signals;
    console_live->close([] { return g_signal_count.load() > 0; });
  }
  return result;
}

}  // namespace flowrun::actor
