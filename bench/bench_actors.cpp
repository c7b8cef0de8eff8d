// bench_actors: what the actor runtime costs per message, next to bare CAF.
//
//   build/bin/bench_actors [--quick] [--threads N]
//
// 1. Throughput through a chain of 8 actors in one process: a source, 6
//    relays and a sink. Runtime: graph nodes with credit-based edges (credit
//    8 and 64). Bare CAF: 8 event-based actors forwarding an int64 with
//    no flow control (unbounded mailboxes).
// 2. Round-trip latency around a ring of 8 actors, one message at a time.
//    Runtime: a source paced by a feedback edge (wait_for_input), 7 relays.
//    Bare CAF: 8 actors forwarding a token.
// 3. The runtime's overhead per message and hop: (runtime - bare) / (N * hops).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "runtime/actor/job.h"
#include "runtime/actor/node.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"

using namespace flowrun;
using namespace flowrun::actor;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

// -- bare CAF ---------------------------------------------------------------------------------

using hop_atom = caf::atom_constant<caf::atom("hop")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

caf::behavior forwarder(caf::event_based_actor* self, caf::actor next) {
  return {[=](hop_atom, std::int64_t x) { self->send(next, hop_atom::value, x); }};
}

caf::behavior counter(caf::event_based_actor* self, std::int64_t n, caf::actor report) {
  auto seen = std::make_shared<std::int64_t>(0);
  return {[=](hop_atom, std::int64_t) {
    if (++*seen == n) {
      self->send(report, done_atom::value);
      self->quit();
    }
  }};
}

// Throughput: n messages from the driver through 6 forwarders into a counter (8 actors, 7 hops).
double bare_chain(caf::actor_system& sys, std::int64_t n) {
  caf::scoped_actor self{sys};
  caf::actor last = sys.spawn(counter, n, caf::actor{self});
  std::vector<caf::actor> chain{last};
  for (int i = 0; i < 6; ++i) chain.push_back(sys.spawn(forwarder, chain.back()));
  auto t0 = clk::now();
  for (std::int64_t i = 0; i < n; ++i) self->send(chain.back(), hop_atom::value, i);
  self->receive([](done_atom) {});
  double s = seconds_since(t0);
  for (auto& a : chain) self->send_exit(a, caf::exit_reason::user_shutdown);
  return s;
}

// Latency: one token around a ring of 8 event-based actors (a pinger and 7
// forwarders), `laps` times (8 hops a lap); the pinger reports at the end.
caf::behavior pinger(caf::event_based_actor* self, std::int64_t laps, caf::actor report) {
  auto lap = std::make_shared<std::int64_t>(0);
  auto first = std::make_shared<caf::actor>();
  return {
      [=](caf::actor next) {
        *first = next;
        self->send(next, hop_atom::value, std::int64_t{0});
      },
      [=](hop_atom, std::int64_t x) {
        if (++*lap == laps) {
          self->send(report, done_atom::value);
          *first = nullptr;
          self->quit();
          return;
        }
        self->send(*first, hop_atom::value, x + 1);
      },
  };
}

double bare_ring(caf::actor_system& sys, std::int64_t laps) {
  caf::scoped_actor self{sys};
  caf::actor ping = sys.spawn(pinger, laps, caf::actor{self});
  std::vector<caf::actor> ring{sys.spawn(forwarder, ping)};
  for (int i = 0; i < 6; ++i) ring.push_back(sys.spawn(forwarder, ring.back()));
  auto t0 = clk::now();
  self->send(ping, ring.back());
  self->receive([](done_atom) {});
  double s = seconds_since(t0);
  for (auto& a : ring) self->send_exit(a, caf::exit_reason::user_shutdown);
  return s;
}

// -- the runtime ----------------------------------------------------------------------------------

struct tick {
  std::int64_t v = 0;
};

class bench_src final : public node {
 public:
  void start(node_context& ctx) override {
    count_ = ctx.spec().get_int("count");
    paced_ = ctx.spec().get_bool("paced");
  }
  bool produce(node_context& ctx) override {
    if (next_ >= count_) return false;
    ctx.emit("out", payload::make("tick", tick{next_++}));
    if (paced_) ctx.wait_for_input();
    return true;
  }
  void on_message(node_context&, std::string_view, payload) override {}

 private:
  std::int64_t count_ = 0, next_ = 0;
  bool paced_ = false;
};

class bench_relay final : public node {
 public:
  void on_message(node_context& ctx, std::string_view, payload msg) override { ctx.emit("out", std::move(msg)); }
};

class bench_sink final : public node {
 public:
  void on_message(node_context&, std::string_view, payload) override {}
};

struct runtime_bench {
  graph::node_kind_registry kinds;
  node_factory_registry factories;

  runtime_bench() {
    using T = graph::setting_type;
    register_node_kind(kinds, factories,
                       graph::node_kind{"bench_src", "ticks"}
                           .input("back", "tick", "echoes (paced mode)", false, true)
                           .output("out", "tick")
                           .option("count", T::int_, std::int64_t{1000}, "ticks")
                           .option("paced", T::bool_, false, "wait for an echo after each tick"),
                       [] { return std::make_unique<bench_src>(); });
    register_node_kind(kinds, factories, graph::node_kind{"bench_relay", "forwards"}.input("in", "tick").output("out", "tick"),
                       [] { return std::make_unique<bench_relay>(); });
    register_node_kind(kinds, factories, graph::node_kind{"bench_sink", "swallows"}.input("in", "tick"),
                       [] { return std::make_unique<bench_sink>(); });
  }

  // Seconds from launch to the end of the run.
  double run(caf::actor_system& sys, const std::string& toml) {
    auto parsed = graph::parse_graph_string(toml, "bench.graph");
    graph::validate_options vo;
    vo.check_files = false;
    auto v = graph::validate(parsed.spec, kinds, vo);
    if (!parsed.ok() || !v.ok()) {
      std::fprintf(stderr, "%s%s", graph::format_errors(parsed.errors).c_str(), graph::format_errors(v.errors).c_str());
      std::exit(1);
    }
    auto t0 = clk::now();
    auto j = launch(sys, v.spec, kinds, factories);
    if (!j) {
      std::fprintf(stderr, "%s\n", j.error().c_str());
      std::exit(1);
    }
    while (!j->state->wait_for_ms(1)) {
    }
    double s = seconds_since(t0);
    if (j->state->exit_code() != 0) {
      std::fprintf(stderr, "run failed: %s\n", j->state->error().c_str());
      std::exit(1);
    }
    return s;
  }

  // source -> 6 relays -> sink.
  double chain(caf::actor_system& sys, std::int64_t n, std::int64_t credit) {
    std::string toml = "edges = [\"src.out -> r0.in\", ";
    for (int i = 0; i < 5; ++i) toml += "\"r" + std::to_string(i) + ".out -> r" + std::to_string(i + 1) + ".in\", ";
    toml += "\"r5.out -> sink.in\"]\n[node.src]\nkind = \"bench_src\"\ncount = " + std::to_string(n) + "\n";
    for (int i = 0; i < 6; ++i) toml += "[node.r" + std::to_string(i) + "]\nkind = \"bench_relay\"\n";
    toml += "[node.sink]\nkind = \"bench_sink\"\n";
    return run(sys, replace_credit(toml, credit));
  }

  // source -> 7 relays -> back to the source (feedback), one tick at a time.
  double ring(caf::actor_system& sys, std::int64_t laps) {
    std::string toml = "edges = [\"src.out -> r0.in\", ";
    for (int i = 0; i < 6; ++i) toml += "\"r" + std::to_string(i) + ".out -> r" + std::to_string(i + 1) + ".in\", ";
    toml += "\"r6.out -> src.back\"]\n[node.src]\nkind = \"bench_src\"\npaced = true\ncount = " + std::to_string(laps) + "\n";
    for (int i = 0; i < 7; ++i) toml += "[node.r" + std::to_string(i) + "]\nkind = \"bench_relay\"\n";
    return run(sys, toml);
  }

  static std::string replace_credit(std::string toml, std::int64_t credit) {
    // Append [credit=N] to every edge string.
    std::string out;
    std::size_t at = 0;
    const std::string suffix = " [credit=" + std::to_string(credit) + "]\"";
    while (true) {
      std::size_t arrow = toml.find(" -> ", at);
      if (arrow == std::string::npos || toml.find(']', at) < arrow) break;
      std::size_t close = toml.find('"', arrow);
      out += toml.substr(at, close - at) + suffix;
      at = close + 1;
    }
    return out + toml.substr(at);
  }
};

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc && std::atoi(argv[i + 1]) > 0)
      threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_actors [--quick] [--threads N]  (N positive)\n");
      return std::strcmp(argv[i], "--help") && std::strcmp(argv[i], "-h") ? 2 : 0;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  if (threads <= 0) threads = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", static_cast<caf::config_value::integer>(threads));
  caf::actor_system sys{cfg};
  const std::int64_t n = quick ? 50000 : 400000;
  const std::int64_t laps = quick ? 2000 : 20000;
  const int hops = 7;  // messages between the 8 actors of the chain
  runtime_bench rb;

  std::printf("bench_actors: %zu CAF worker threads, %lld messages through a chain of 8 actors, %lld laps of a ring of 8\n",
              sys.scheduler().num_workers(), static_cast<long long>(n), static_cast<long long>(laps));
  bare_chain(sys, n / 10);  // warm-up
  rb.chain(sys, n / 10, 8);
  double bare = 1e9, rt8 = 1e9, rt64 = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    bare = std::min(bare, bare_chain(sys, n));
    rt8 = std::min(rt8, rb.chain(sys, n, 8));
    rt64 = std::min(rt64, rb.chain(sys, n, 64));
  }
  std::printf("throughput (best of 3)\n");
  std::printf("  bare CAF chain of 8 (no flow control): %10.0f msg/s  %7.3f us/msg end to end\n", n / bare, bare / n * 1e6);
  std::printf("  runtime chain of 8, credit 8:          %10.0f msg/s  %7.3f us/msg end to end\n", n / rt8, rt8 / n * 1e6);
  std::printf("  runtime chain of 8, credit 64:         %10.0f msg/s  %7.3f us/msg end to end\n", n / rt64, rt64 / n * 1e6);
  std::printf("  runtime overhead per message and hop:  credit 8: %.3f us, credit 64: %.3f us (data message + ack + bookkeeping)\n",
              (rt8 - bare) / n / hops * 1e6, (rt64 - bare) / n / hops * 1e6);

  bare_ring(sys, laps / 10);
  rb.ring(sys, laps / 10);
  double bare_rt = 1e9, rt_rt = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    bare_rt = std::min(bare_rt, bare_ring(sys, laps));
    rt_rt = std::min(rt_rt, rb.ring(sys, laps));
  }
  std::printf("round trip around a ring of 8 (best of 3)\n");
  std::printf("  bare CAF:  %8.2f us per lap, %6.3f us per hop\n", bare_rt / laps * 1e6, bare_rt / laps / 8 * 1e6);
  std::printf("  runtime:   %8.2f us per lap, %6.3f us per hop\n", rt_rt / laps * 1e6, rt_rt / laps / 8 * 1e6);
  std::printf("  runtime overhead per hop: %.3f us\n", (rt_rt - bare_rt) / laps / 8 * 1e6);
  return 0;
}
