// The actor runtime (runtime/actor) on CAF's deterministic test scheduler:
// backpressure, supervision, shutdown, dispatch modes and gather order, with
// test-only node kinds defined below.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <nlohmann/json.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "runtime/actor/cluster_auth.h"
#include "runtime/actor/console.h"
#include "runtime/actor/job.h"
#include "runtime/actor/payload_codec.h"
#include "runtime/actor/node.h"
#include "runtime/actor/payload.h"
#include "runtime/actor/runtime.h"
#include "runtime/actor/socket_numbers.h"
#include "runtime/actor/teardown.h"
#include "runtime/actor/tls_error_queue.h"
#include "runtime/kernels/ops.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"

using namespace flowrun;
using namespace flowrun::actor;

namespace {

// -- a payload type that counts its live instances (memory bound checks) -----------

struct counted {
  std::int64_t v = 0;
  static inline std::atomic<std::int64_t> live{0};
  explicit counted(std::int64_t x) : v(x) { ++live; }
  counted(const counted& o) : v(o.v) { ++live; }
  counted& operator=(const counted&) = default;
  ~counted() { --live; }
};

using nums = batch<std::int64_t>;

// -- what the test nodes saw (shared across restarts: nodes are re-created) ---------

struct record {
  std::mutex m;
  std::map<std::string, std::vector<std::int64_t>> items;  // "node[r]" -> values received
  std::map<std::string, int> starts, stops, failures;
  std::map<std::string, stop_reason> stop_reasons;
  std::map<std::string, bool> finish_draining;  // node_context::draining() in finish(), per finish() called
  std::map<std::string, std::int64_t> produced;

  void clear() {
    std::lock_guard<std::mutex> lock(m);
    items.clear();
    starts.clear();
    stops.clear();
    failures.clear();
    stop_reasons.clear();
    finish_draining.clear();
    produced.clear();
  }
};
record rec;

std::string key(const node_context& ctx) { return ctx.name() + "[" + std::to_string(ctx.replica()) + "]"; }

// Common behaviour: count start() and stop() calls.
class test_node : public node {
 public:
  void start(node_context& ctx) override {
    std::lock_guard<std::mutex> lock(rec.m);
    ++rec.starts[key(ctx)];
  }
  void finish(node_context& ctx) override {
    std::lock_guard<std::mutex> lock(rec.m);
    rec.finish_draining[key(ctx)] = ctx.draining();
  }
  void stop(node_context& ctx) override {
    std::lock_guard<std::mutex> lock(rec.m);
    ++rec.stops[key(ctx)];
    rec.stop_reasons[key(ctx)] = ctx.reason();
  }
};

// src: emits counted{0}, counted{1}, ... (count = 0: forever).
class src_node final : public test_node {
 public:
  void start(node_context& ctx) override {
    test_node::start(ctx);
    count_ = ctx.spec().get_int("count");
    if (ctx.spec().get_bool("greet")) ctx.emit("out", payload::make("num", counted{-1}));
  }
  bool produce(node_context& ctx) override {
    if (count_ > 0 && next_ >= count_) return false;
    ctx.emit("out", payload::make("num", counted{next_++}));
    std::lock_guard<std::mutex> lock(rec.m);
    rec.produced[key(ctx)] = next_;
    return true;
  }

 private:
  std::int64_t count_ = 0, next_ = 0;
};

// relay: passes numbers on; throws on value fail_at while its node has failed
// fewer than `failures` times; drops odd values when drop_odd.
class relay_node final : public test_node {
 public:
  void start(node_context& ctx) override {
    test_node::start(ctx);
    fail_at_ = ctx.spec().get_int("fail_at");
    failures_ = static_cast<int>(ctx.spec().get_int("failures"));
    drop_odd_ = ctx.spec().get_bool("drop_odd");
  }
  void on_message(node_context& ctx, std::string_view, payload msg) override {
    const std::int64_t v = msg.as<counted>().v;
    {
      std::lock_guard<std::mutex> lock(rec.m);
      if (v == fail_at_ && rec.failures[ctx.name()] < failures_) {
        ++rec.failures[ctx.name()];
        throw std::runtime_error("injected failure at " + std::to_string(v));
      }
      rec.items[key(ctx)].push_back(v);
    }
    if (drop_odd_ && v % 2) return;
    ctx.emit("out", msg);  // forward the same handle: no copy
  }

 private:
  std::int64_t fail_at_ = -1;
  int failures_ = 0;
  bool drop_odd_ = false;
};

// collect: records what arrives.
class collect_node final : public test_node {
 public:
  void on_message(node_context& ctx, std::string_view, payload msg) override {
    std::lock_guard<std::mutex> lock(rec.m);
    rec.items[key(ctx)].push_back(msg.as<counted>().v);
  }
};

// threads_probe: records the OpenMP team size its ops would get (omp_get_max_threads) for each
// message; `budget` > 0 asks for that many in start() (node_context::thread_budget).
class threads_probe_node final : public test_node {
 public:
  void start(node_context& ctx) override {
    test_node::start(ctx);
    if (const auto b = ctx.spec().get_int("budget"); b > 0) ctx.thread_budget(static_cast<int>(b));
  }
  void on_message(node_context& ctx, std::string_view, payload) override {
    std::lock_guard<std::mutex> lock(rec.m);
    rec.items[key(ctx)].push_back(omp_get_max_threads());
  }
};

// batch_src: `count` batches of `size` consecutive numbers.
class batch_src_node final : public test_node {
 public:
  void start(node_context& ctx) override {
    test_node::start(ctx);
    count_ = ctx.spec().get_int("count");
    size_ = ctx.spec().get_int("size");
  }
  bool produce(node_context& ctx) override {
    if (done_ >= count_) return false;
    nums b;
    for (std::int64_t i = 0; i < size_; ++i) b.items.push_back(done_ * size_ + i);
    ++done_;
    ctx.emit("out", payload::make("nums", std::move(b)));
    return true;
  }

 private:
  std::int64_t count_ = 0, size_ = 0, done_ = 0;
};

// batch_relay: multiplies every item by 10; records the part sizes it got.
class batch_relay_node final : public test_node {
 public:
  void on_message(node_context& ctx, std::string_view, payload msg) override {
    nums out = msg.as<nums>();
    for (auto& x : out.items) x *= 10;
    {
      std::lock_guard<std::mutex> lock(rec.m);
      rec.items[key(ctx)].push_back(static_cast<std::int64_t>(out.items.size()));
    }
    ctx.emit("out", payload::make("nums", std::move(out)));
  }
};

// batch_collect: records every batch as a -1 marker followed by its items.
class batch_collect_node final : public test_node {
 public:
  void on_message(node_context& ctx, std::string_view, payload msg) override {
    std::lock_guard<std::mutex> lock(rec.m);
    auto& v = rec.items[key(ctx)];
    v.push_back(-1);
    for (auto x : msg.as<nums>().items) v.push_back(x);
  }
};

// ping: a source paced by a feedback edge: emits one number, then waits for its echo.
class ping_node final : public test_node {
 public:
  void start(node_context& ctx) override {
    test_node::start(ctx);
    count_ = ctx.spec().get_int("count");
  }
  bool produce(node_context& ctx) override {
    if (next_ >= count_) return false;
    ctx.emit("out", payload::make("num", counted{next_++}));
    ctx.wait_for_input();
    return true;
  }
  void on_message(node_context& ctx, std::string_view port, payload msg) override {
    CHECK(port == "back");
    std::lock_guard<std::mutex> lock(rec.m);
    rec.items[key(ctx)].push_back(msg.as<counted>().v);
  }

 private:
  std::int64_t count_ = 0, next_ = 0;
};

// refuser: every replica's start() throws (as every ZeRO rank refuses a resume whose settings changed);
// on_message records what it is handed, which must be nothing.
class refuser_node final : public test_node {
 public:
  void start(node_context& ctx) override {
    test_node::start(ctx);
    throw std::invalid_argument("refused: settings changed");
  }
  void on_message(node_context& ctx, std::string_view, payload msg) override {
    std::lock_guard<std::mutex> lock(rec.m);
    rec.items[key(ctx)].push_back(msg.as<counted>().v);
  }
};

class echo_node final : public test_node {
 public:
  void on_message(node_context& ctx, std::string_view, payload msg) override { ctx.emit("back", msg); }
};

// bad_emit: emits on a port it does not have, or the wrong type.
class bad_emit_node final : public test_node {
 public:
  void on_message(node_context& ctx, std::string_view, payload msg) override {
    if (ctx.spec().get_bool("wrong_port")) ctx.emit("nope", msg);
    ctx.emit("out", payload::make("text", std::string("not a number")));
  }
};

void register_test_kinds(graph::node_kind_registry& kinds, node_factory_registry& factories) {
  using T = graph::setting_type;
  register_node_kind(kinds, factories,
                     graph::node_kind{"src", "counts"}
                         .output("out", "num")
                         .option("count", T::int_, std::int64_t{10}, "items; 0: forever")
                         .option("greet", T::bool_, false, "emit -1 in start()"),
                     [] { return std::make_unique<src_node>(); });
  register_node_kind(kinds, factories,
                     graph::node_kind{"relay", "passes on"}
                         .input("in", "num")
                         .output("out", "num")
                         .option("fail_at", T::int_, std::int64_t{-1}, "value to fail on")
                         .option("failures", T::int_, std::int64_t{0}, "times to fail")
                         .option("drop_odd", T::bool_, false, "drop odd values"),
                     [] { return std::make_unique<relay_node>(); });
  register_node_kind(kinds, factories, graph::node_kind{"collect", "records"}.input("in", "num"),
                     [] { return std::make_unique<collect_node>(); });
  register_node_kind(kinds, factories,
                     graph::node_kind{"threads_probe", "records its OpenMP team size"}
                         .input("in", "num")
                         .option("budget", T::int_, std::int64_t{0}, "thread_budget asked in start(); 0: none"),
                     [] { return std::make_unique<threads_probe_node>(); });
  register_node_kind(kinds, factories,
                     graph::node_kind{"batch_src", "batches"}
                         .output("out", "nums")
                         .option("count", T::int_, std::int64_t{4}, "batches")
                         .option("size", T::int_, std::int64_t{6}, "items per batch"),
                     [] { return std::make_unique<batch_src_node>(); });
  register_node_kind(kinds, factories, graph::node_kind{"batch_relay", "x10"}.input("in", "nums").output("out", "nums"),
                     [] { return std::make_unique<batch_relay_node>(); });
  register_node_kind(kinds, factories, graph::node_kind{"batch_collect", "records"}.input("in", "nums"),
                     [] { return std::make_unique<batch_collect_node>(); });
  register_node_kind(kinds, factories,
                     graph::node_kind{"ping", "paced source"}
                         .input("back", "num", "echoes", true, true)
                         .output("out", "num")
                         .option("count", T::int_, std::int64_t{10}, "pings"),
                     [] { return std::make_unique<ping_node>(); });
  register_node_kind(kinds, factories, graph::node_kind{"refuser", "refuses in start"}.input("in", "num"),
                     [] { return std::make_unique<refuser_node>(); });
  register_node_kind(kinds, factories, graph::node_kind{"echo", "echoes"}.input("in", "num").output("back", "num"),
                     [] { return std::make_unique<echo_node>(); });
  register_node_kind(kinds, factories,
                     graph::node_kind{"bad_emit", "misbehaves"}
                         .input("in", "num")
                         .output("out", "num")
                         .option("wrong_port", T::bool_, true, "emit on a port that does not exist"),
                     [] { return std::make_unique<bad_emit_node>(); });
}

// -- fixture: an actor system on the deterministic scheduler ----------------------------------

struct fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  graph::node_kind_registry kinds;
  node_factory_registry factories;

  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    c.set("logger.inline-output", true);
    return c;
  }

  fixture() : sys(init(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    register_test_kinds(kinds, factories);
    rec.clear();
    counted::live = 0;
  }
  ~fixture() { sched.run(); }

  graph::graph_spec spec_of(const std::string& toml) {
    auto parsed = graph::parse_graph_string(toml, "test.graph");
    INFO(graph::format_errors(parsed.errors));
    REQUIRE(parsed.ok());
    graph::validate_options vo;
    vo.check_files = false;
    auto v = graph::validate(parsed.spec, kinds, vo);
    INFO(graph::format_errors(v.errors));
    REQUIRE(v.ok());
    return v.spec;
  }

  job start(const std::string& toml, const run_options& o = {}) {
    auto j = launch(sys, spec_of(toml), kinds, factories, o);
    INFO(j.error());
    REQUIRE(j.has_value());
    return *j;
  }

  // Runs every job in a seeded random order (scrambles the interleavings).
  void run_random(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    while (sched.has_job()) {
      auto i = static_cast<std::ptrdiff_t>(rng() % sched.jobs.size());
      std::rotate(sched.jobs.begin(), sched.jobs.begin() + i, sched.jobs.begin() + i + 1);
      sched.run_once();
    }
  }

  static caf::resumable* job_of(const caf::actor& a) {
    return dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(a));
  }

  std::vector<std::int64_t> items(const std::string& k) {
    std::lock_guard<std::mutex> lock(rec.m);
    return rec.items[k];
  }
};

std::vector<std::int64_t> iota(std::int64_t n, std::int64_t from = 0, std::int64_t step = 1) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(from + i * step);
  return v;
}

}  // namespace

// -- payload --------------------------------------------------------------------------------------

TEST_CASE("payload: shared handle, type name, byte size, split and merge") {
  auto p = payload::make("text", std::string("hello"));
  CHECK(p.type() == "text");
  CHECK(p.byte_size() == 5);
  CHECK(p.as<std::string>() == "hello");
  CHECK(p.get<int>() == nullptr);
  CHECK_THROWS_AS(p.as<int>(), bad_payload_cast);
  auto q = p;  // a handle copy
  CHECK(&q.as<std::string>() == &p.as<std::string>());
  CHECK(!p.splittable());
  CHECK_THROWS_WITH_AS(p.split(2), doctest::Contains("cannot be split"), std::invalid_argument);

  auto b = payload::make("nums", nums{{1, 2, 3, 4, 5, 6, 7}});
  CHECK(b.byte_size() == 7 * sizeof(std::int64_t));
  REQUIRE(b.splittable());
  auto parts = b.split(3);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].as<nums>().items == std::vector<std::int64_t>{1, 2, 3});
  CHECK(parts[1].as<nums>().items == std::vector<std::int64_t>{4, 5});
  CHECK(parts[2].as<nums>().items == std::vector<std::int64_t>{6, 7});
  CHECK(parts[2].type() == "nums");
  CHECK(payload::merge(parts).as<nums>().items == b.as<nums>().items);
  auto tokens = payload::make("tokens", std::vector<std::int32_t>{1, 2, 3});
  CHECK(tokens.byte_size() == 12);
  CHECK(!tokens.splittable());
}

// -- backpressure ------------------------------------------------------------------------------------

TEST_CASE_FIXTURE(fixture, "a consumer 100x slower than its producer: in-flight messages and memory stay bounded") {
  constexpr std::int64_t n = 1000, credit = 4;
  auto j = start(R"(
edges = ["producer.out -> consumer.in [credit=4]"]
[node.producer]
kind = "src"
count = 1000
[node.consumer]
kind = "collect"
)");
  caf::resumable* consumer = job_of(j.replicas[1][0]);
  std::int64_t max_live = 0, max_in_flight = 0, max_depth = 0;
  std::size_t steps = 0;
  // The consumer may run one event per 100 scheduler ticks; everyone else runs whenever they have work.
  for (std::size_t tick = 0; sched.has_job(); ++tick) {
    auto other = std::find_if(sched.jobs.begin(), sched.jobs.end(), [&](caf::resumable* r) { return r != consumer; });
    if (tick % 100 == 0 && sched.prioritize(j.replicas[1][0])) {
      sched.run_once();
    } else if (other != sched.jobs.end()) {
      std::rotate(sched.jobs.begin(), other, other + 1);
      sched.run_once();
    } else {
      continue;  // the consumer has work but it is not its turn: the producer waits
    }
    ++steps;
    auto s = j.metrics->snapshot();
    max_in_flight = std::max(max_in_flight, s.edges[0].in_flight);
    max_depth = std::max(max_depth, s.nodes[1].depth);
    max_live = std::max<std::int64_t>(max_live, counted::live.load());
  }
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  CHECK(items("consumer[0]") == iota(n));
  auto s = j.metrics->snapshot();
  INFO("max in flight " << max_in_flight << ", max depth " << max_depth << ", max live payloads " << max_live);
  CHECK(max_in_flight <= credit);
  CHECK(s.edges[0].max_in_flight == static_cast<std::uint64_t>(credit));  // the credit was used, never exceeded
  CHECK(max_depth <= credit);
  CHECK(max_live <= credit + 1);  // the queued payloads plus the one being made
  CHECK(counted::live.load() == 0);
  CHECK(s.nodes[0].blocked_s > 0);  // the producer waited for credit
  CHECK(s.edges[0].sent == static_cast<std::uint64_t>(n));
  CHECK(steps > static_cast<std::size_t>(n));
}

TEST_CASE_FIXTURE(fixture, "a source paced by a feedback edge has one message in flight") {
  auto j = start(R"(
edges = ["p.out -> e.in", "e.back -> p.back"]
[node.p]
kind = "ping"
count = 25
[node.e]
kind = "echo"
)");
  run_random(7);
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  CHECK(items("p[0]") == iota(25));
  auto s = j.metrics->snapshot();
  CHECK(s.edges[0].max_in_flight == 1);
}

// -- supervision ----------------------------------------------------------------------------------------

// A node's `threads` key bounds its replicas' OpenMP teams; thread_budget asks for fewer. All four run on
// the one thread of the test scheduler, interleaved: each sees its own team size, never the last one set.
TEST_CASE_FIXTURE(fixture, "threads: each replica's OpenMP team is its own, bounded by the node's threads key") {
  const int hw = ops::hardware_threads();
  auto j = start(R"(
edges = ["src.out -> one.in", "src.out -> all.in", "src.out -> asks.in", "src.out -> capped.in"]
[node.src]
kind = "src"
count = 6
[node.one]
kind = "threads_probe"
threads = 1
[node.all]
kind = "threads_probe"
[node.asks]
kind = "threads_probe"
budget = 1
[node.capped]
kind = "threads_probe"
threads = 1
budget = 64
)");
  run_random(3);
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  CHECK(items("one[0]") == std::vector<std::int64_t>(6, 1));
  CHECK(items("all[0]") == std::vector<std::int64_t>(6, hw));
  CHECK(items("asks[0]") == std::vector<std::int64_t>(6, 1));
  CHECK(items("capped[0]") == std::vector<std::int64_t>(6, 1));
}

TEST_CASE_FIXTURE(fixture, "a node that throws is restarted per its policy and every item is delivered") {
  auto j = start(R"(
edges = ["src.out -> boom.in", "boom.out -> sink.in"]
[node.src]
kind = "src"
count = 50
[node.boom]
kind = "relay"
fail_at = 7
failures = 2
restart = "on-failure"
max_restarts = 3
[node.sink]
kind = "collect"
)");
  sched.run();
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  CHECK(j.state->error() == "");
  CHECK(items("sink[0]") == iota(50));  // in order, none lost, none twice
  CHECK(items("boom[0]") == iota(50));  // the failed calls recorded nothing
  CHECK(rec.starts["boom[0]"] == 3);    // the first start and two restarts
  CHECK(rec.stops["boom[0]"] == 1);     // stop() on the live object only
  CHECK(rec.stop_reasons["sink[0]"] == stop_reason::completed);
  CHECK(j.metrics->snapshot().node("boom")->restarts == 2);
}

TEST_CASE_FIXTURE(fixture, "a node that fails for good stops the run with exit code 1 and an error naming it") {
  SUBCASE("restarts used up") {
    auto j = start(R"(
edges = ["src.out -> boom.in", "boom.out -> sink.in"]
[node.src]
kind = "src"
count = 0
[node.boom]
kind = "relay"
fail_at = 7
failures = 100
restart = "on-failure"
max_restarts = 2
[node.sink]
kind = "collect"
)");
    sched.run();
    REQUIRE(j.state->finished());
    CHECK(j.state->exit_code() == exit_failed);
    CHECK(j.state->reason() == stop_reason::failed);
    CHECK_MESSAGE(j.state->error().find("node 'boom'") != std::string::npos, j.state->error());
    CHECK_MESSAGE(j.state->error().find("injected failure at 7") != std::string::npos, j.state->error());
    CHECK_MESSAGE(j.state->error().find("no restarts left") != std::string::npos, j.state->error());
    CHECK(rec.starts["boom[0]"] == 3);
    CHECK(rec.stops["src[0]"] == 1);  // the others still get stop() (their checkpoint hook)
    CHECK(rec.stop_reasons["src[0]"] == stop_reason::failed);
    CHECK(rec.stops["boom[0]"] == 0);  // not the failed one
    CHECK(items("sink[0]") == iota(7));
  }
  SUBCASE("restart = never") {
    auto j = start(R"(
edges = ["src.out -> boom.in", "boom.out -> sink.in"]
[node.src]
kind = "src"
count = 20
[node.boom]
kind = "relay"
fail_at = 3
failures = 1
[node.sink]
kind = "collect"
)");
    sched.run();
    REQUIRE(j.state->finished());
    CHECK(j.state->exit_code() == exit_failed);
    CHECK_MESSAGE(j.state->error().find("node 'boom' failed in on_message: injected failure at 3") != std::string::npos,
                  j.state->error());
    CHECK_MESSAGE(j.state->error().find("restart = \"never\"") != std::string::npos, j.state->error());
  }
  SUBCASE("a replica is named") {
    auto j = start(R"(
edges = ["src.out -> boom.in [dispatch=round_robin]", "boom.out -> sink.in"]
[node.src]
kind = "src"
count = 20
[node.boom]
kind = "relay"
replicas = 2
fail_at = 5
failures = 1
[node.sink]
kind = "collect"
)");
    sched.run();
    CHECK(j.state->exit_code() == exit_failed);
    CHECK_MESSAGE(j.state->error().find("node 'boom' replica 1 failed") != std::string::npos, j.state->error());
  }
}

TEST_CASE_FIXTURE(fixture, "a replica whose start() gave up as the run stops handles none of the messages queued for it") {
  // The first replica to refuse fails the run; the others refuse while it stops ("gave up"). A pretraining
  // rank whose start gave up then took the batches queued for it and waited in a collective for its
  // refused peer until comm_timeout_s (300 s). In every interleaving: no message reaches a replica whose
  // start threw, and no stop() is called on a node that never started.
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    CAPTURE(seed);
    rec.clear();
    auto j = start(R"(
edges = ["src.out -> ref.in [dispatch=broadcast]"]
[node.src]
kind = "src"
count = 20
[node.ref]
kind = "refuser"
replicas = 3
)");
    run_random(seed);
    REQUIRE(j.state->finished());
    CHECK(j.state->exit_code() == exit_failed);
    CHECK_MESSAGE(j.state->error().find("refused: settings changed") != std::string::npos, j.state->error());
    for (int r = 0; r < 3; ++r) {
      const std::string k = "ref[" + std::to_string(r) + "]";
      CAPTURE(k);
      CHECK(rec.starts[k] == 1);
      CHECK(items(k).empty());
      CHECK(rec.stops[k] == 0);
    }
  }
}

TEST_CASE_FIXTURE(fixture, "emitting on an unknown port or the wrong type fails the node with a clear error") {
  SUBCASE("unknown port") {
    auto j = start(R"(
edges = ["src.out -> bad.in", "bad.out -> sink.in"]
[node.src]
kind = "src"
[node.bad]
kind = "bad_emit"
[node.sink]
kind = "collect"
)");
    sched.run();
    CHECK(j.state->exit_code() == exit_failed);
    CHECK_MESSAGE(j.state->error().find("has no out port 'nope'; out ports: out") != std::string::npos, j.state->error());
  }
  SUBCASE("wrong message type") {
    auto j = start(R"(
edges = ["src.out -> bad.in", "bad.out -> sink.in"]
[node.src]
kind = "src"
[node.bad]
kind = "bad_emit"
wrong_port = false
[node.sink]
kind = "collect"
)");
    sched.run();
    CHECK(j.state->exit_code() == exit_failed);
    CHECK_MESSAGE(j.state->error().find("emitted message type 'text' on out port 'out', which carries 'num'") !=
                      std::string::npos,
                  j.state->error());
  }
  SUBCASE("a payload that cannot be split on a split edge") {
    auto j = start(R"(
edges = ["src.out -> sink.in [dispatch=split]"]
[node.src]
kind = "src"
[node.sink]
kind = "collect"
replicas = 2
)");
    sched.run();
    CHECK(j.state->exit_code() == exit_failed);
    CHECK_MESSAGE(j.state->error().find("node 'src' failed in produce") != std::string::npos, j.state->error());
    CHECK_MESSAGE(j.state->error().find("cannot be split") != std::string::npos, j.state->error());
  }
}

TEST_CASE_FIXTURE(fixture, "launch rejects kinds without an implementation and bad restart settings") {
  graph::node_kind_registry only_kinds = kinds;
  only_kinds.register_kind(graph::node_kind{"ghost", "declared only"}.input("in", "num"));
  auto parsed = graph::parse_graph_string(R"(
edges = ["src.out -> g.in"]
[node.src]
kind = "src"
[node.g]
kind = "ghost"
)");
  auto v = graph::validate(parsed.spec, only_kinds);
  REQUIRE(v.ok());
  auto j = launch(sys, v.spec, only_kinds, factories);
  REQUIRE(!j.has_value());
  CHECK(j.error().find("node 'g' has kind 'ghost', which has no implementation") != std::string::npos);

  auto bad = spec_of(R"(
edges = ["src.out -> sink.in"]
[node.src]
kind = "src"
restart = "sometimes"
[node.sink]
kind = "collect"
)");
  auto j2 = launch(sys, bad, kinds, factories);
  REQUIRE(!j2.has_value());
  CHECK(j2.error().find("restart = \"sometimes\" is not a restart policy") != std::string::npos);
}

// -- shutdown -------------------------------------------------------------------------------------------

TEST_CASE_FIXTURE(fixture, "SIGINT drains the pipeline, stops every node and exits 130") {
  auto j = start(R"(
edges = ["src.out -> mid.in [credit=3]", "mid.out -> sink.in [credit=3]"]
[node.src]
kind = "src"
count = 0
[node.mid]
kind = "relay"
[node.sink]
kind = "collect"
)");
  sched.run(300);  // the source runs forever
  CHECK(!j.state->finished());
  interrupt(j, SIGINT);
  sched.run();
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == exit_sigint);
  CHECK(j.state->reason() == stop_reason::interrupted);
  // Drained: everything produced reached the sink, in order.
  const std::int64_t produced = rec.produced["src[0]"];
  CHECK(produced > 0);
  CHECK(items("sink[0]") == iota(produced));
  for (const char* n : {"src[0]", "mid[0]", "sink[0]"}) {
    CHECK(rec.stops[n] == 1);
    CHECK(rec.stop_reasons[n] == stop_reason::interrupted);
    // finish() ran inside the drain and could tell (a trainer commits its last update there)
    REQUIRE(rec.finish_draining.count(n) == 1);
    CHECK(rec.finish_draining[n]);
  }
}

TEST_CASE_FIXTURE(fixture, "a second SIGTERM stops without draining and exits 143") {
  auto j = start(R"(
edges = ["src.out -> sink.in"]
[node.src]
kind = "src"
count = 0
[node.sink]
kind = "collect"
)");
  sched.run(100);
  interrupt(j, SIGTERM);
  interrupt(j, SIGTERM);
  sched.run();
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == exit_sigterm);
  CHECK(rec.stops["src[0]"] == 1);
  CHECK(rec.stops["sink[0]"] == 1);
  CHECK(rec.finish_draining.count("sink[0]") == 0);  // no drain: no finish(), stop() only
}

TEST_CASE_FIXTURE(fixture, "graph steps cap what each source produces") {
  auto j = start(R"(
edges = ["src.out -> sink.in"]
[graph]
steps = 5
[node.src]
kind = "src"
count = 0
[node.sink]
kind = "collect"
)");
  sched.run();
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  CHECK(items("sink[0]") == iota(5));
  CHECK(j.metrics->snapshot().steps() == 5);
  CHECK(rec.finish_draining.count("sink[0]") == 1);
  CHECK(!rec.finish_draining["sink[0]"]);  // a run that ended by itself is not draining in finish()
}

TEST_CASE_FIXTURE(fixture, "emits made in start() are delivered first, to replicas wired later too") {
  auto j = start(R"(
edges = ["src.out -> mid.in", "mid.out -> sink.in"]
[node.sink]
kind = "collect"
replicas = 2
[node.mid]
kind = "relay"
[node.src]
kind = "src"
count = 3
greet = true
)");
  run_random(3);
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  CHECK(items("sink[0]") == std::vector<std::int64_t>{-1, 0, 1, 2});
  CHECK(items("sink[1]") == std::vector<std::int64_t>{-1, 0, 1, 2});
}

// -- dispatch modes and gathering --------------------------------------------------------------------------

TEST_CASE_FIXTURE(fixture, "broadcast: every replica gets every message, in order") {
  auto j = start(R"(
edges = ["src.out -> sink.in"]
[node.src]
kind = "src"
count = 20
[node.sink]
kind = "collect"
replicas = 3
)");
  run_random(1);
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  for (int r = 0; r < 3; ++r) CHECK(items("sink[" + std::to_string(r) + "]") == iota(20));
}

TEST_CASE_FIXTURE(fixture, "round_robin: replicas take turns and their outputs are gathered in order") {
  for (std::uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    CAPTURE(seed);
    rec.clear();
    auto j = start(R"(
edges = ["src.out -> work.in [dispatch=round_robin, credit=2]", "work.out -> sink.in [credit=3]"]
[node.src]
kind = "src"
count = 60
[node.work]
kind = "relay"
replicas = 3
[node.sink]
kind = "collect"
)");
    run_random(seed);
    REQUIRE(j.state->finished());
    CHECK(j.state->exit_code() == 0);
    for (int r = 0; r < 3; ++r) CHECK(items("work[" + std::to_string(r) + "]") == iota(20, r, 3));
    CHECK(items("sink[0]") == iota(60));
  }
}

TEST_CASE_FIXTURE(fixture, "gather order holds when replicas emit nothing for some messages") {
  auto j = start(R"(
edges = ["src.out -> work.in [dispatch=round_robin]", "work.out -> sink.in"]
[node.src]
kind = "src"
count = 40
[node.work]
kind = "relay"
replicas = 4
drop_odd = true
[node.sink]
kind = "collect"
)");
  run_random(11);
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  CHECK(items("sink[0]") == iota(20, 0, 2));
}

TEST_CASE_FIXTURE(fixture, "split: a batch is cut across replicas and the parts are merged back in order") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    rec.clear();
    auto j = start(R"(
edges = ["src.out -> work.in [dispatch=split, credit=2]", "work.out -> sink.in"]
[node.src]
kind = "batch_src"
count = 10
size = 7
[node.work]
kind = "batch_relay"
replicas = 3
[node.sink]
kind = "batch_collect"
)");
    run_random(seed);
    REQUIRE(j.state->finished());
    CHECK(j.state->exit_code() == 0);
    // Parts of 7 over 3 replicas: 3, 2, 2.
    CHECK(items("work[0]") == std::vector<std::int64_t>(10, 3));
    CHECK(items("work[1]") == std::vector<std::int64_t>(10, 2));
    CHECK(items("work[2]") == std::vector<std::int64_t>(10, 2));
    std::vector<std::int64_t> want;
    for (std::int64_t b = 0; b < 10; ++b) {
      want.push_back(-1);  // one merged batch per source batch
      for (std::int64_t i = 0; i < 7; ++i) want.push_back((b * 7 + i) * 10);
    }
    CHECK(items("sink[0]") == want);
  }
}

TEST_CASE_FIXTURE(fixture, "a restarted replica in a round_robin group keeps the gathered order") {
  auto j = start(R"(
edges = ["src.out -> work.in [dispatch=round_robin]", "work.out -> sink.in"]
[node.src]
kind = "src"
count = 30
[node.work]
kind = "relay"
replicas = 3
fail_at = 13
failures = 1
restart = "on-failure"
[node.sink]
kind = "collect"
)");
  run_random(5);
  REQUIRE(j.state->finished());
  CHECK(j.state->exit_code() == 0);
  CHECK(items("sink[0]") == iota(30));
  CHECK(rec.starts["work[1]"] == 2);  // 13 % 3 == 1
}

// -- metrics and the threaded runner ------------------------------------------------------------------------

TEST_CASE_FIXTURE(fixture, "metrics: per node and per edge counts, JSON line") {
  auto j = start(R"(
edges = ["src.out -> sink.in [credit=5]"]
[node.src]
kind = "src"
count = 12
[node.sink]
kind = "collect"
)");
  sched.run();
  REQUIRE(j.state->finished());
  auto s = j.metrics->snapshot();
  const node_stats* src = s.node("src");
  const node_stats* sink = s.node("sink");
  REQUIRE(src);
  REQUIRE(sink);
  CHECK(src->source);
  CHECK(sink->terminal);
  CHECK(src->produced == 12);
  CHECK(src->msgs_out == 12);
  CHECK(src->bytes_out == 12 * sizeof(counted));
  CHECK(sink->msgs_in == 12);
  CHECK(sink->handled == 12);
  CHECK(sink->depth == 0);
  REQUIRE(s.edges.size() == 1);
  CHECK(s.edges[0].name == "src.out -> sink.in");
  CHECK(s.edges[0].credit == 5);
  CHECK(s.edges[0].sent == 12);
  CHECK(s.edges[0].acked == 12);
  CHECK(s.edges[0].in_flight == 0);
  CHECK(s.steps() == 12);
  auto line = nlohmann::json::parse(to_json_line(s, true));
  CHECK(line["final"] == true);
  CHECK(line["steps"] == 12);
  CHECK(line["nodes"]["sink"]["handled"] == 12);
  CHECK(line["edges"]["src.out -> sink.in"]["max_in_flight"].get<int>() <= 5);
  CHECK(format_progress("g", s, s, 24).find("step 12/24") != std::string::npos);
}

// node_context::progress: the ETA is the rate since the first report times the units left, less
// the time since the last report (live.h); worked by hand.
TEST_CASE("metrics: steps and tokens of data-parallel replicas fed by a source are not counted twice, and a training source counts") {
  // pretraining's shape: a data source cuts 6 batches of 8 x 64 tokens, two ZeRO ranks train all 6 steps
  // (each counts its steps; rank 0 the global batch's tokens)
  job_metrics m;
  const std::size_t data = m.add_node("data", 1, true), ranks = m.add_node("ranks", 2, false, true);
  m.replica(data, 0).add("tokens_cut", 6 * 8 * 64);  // a loader's count: the ranks train on these
  for (std::size_t r = 0; r < 2; ++r) m.replica(ranks, r).add("steps", 6);
  m.replica(ranks, 0).add("tokens", 6 * 8 * 64);
  auto s = m.snapshot();
  CHECK(s.node("ranks")->counters.at("steps") == 12);  // the node's total over its replicas stays a sum
  CHECK(s.steps() == 6);
  CHECK(s.tokens() == 3072);
  auto line = nlohmann::json::parse(to_json_line(s, true));
  CHECK(line["steps"] == 6);
  CHECK(line["tokens"] == 3072);
  // where only a source counts tokens, they are the job's
  job_metrics only_source;
  only_source.add_node("src", 1, true);
  only_source.add_node("sink", 1, false, true);
  only_source.replica(0, 0).add("tokens", 100);
  CHECK(only_source.snapshot().tokens() == 100);
  // rlhf.graph's shape: SFT trains on its own data (a source), step 3's generator and policy count theirs; SFT's
  // tokens were left out once step 3 counted any, and the job's total fell (the progress line's tokens/s went negative)
  job_metrics rlhf;
  const std::size_t sft = rlhf.add_node("sft", 1, true), gen = rlhf.add_node("generator", 1, false),
                    policy = rlhf.add_node("policy", 1, false, true);
  rlhf.replica(sft, 0).add("tokens", 5000);
  const auto before = rlhf.snapshot().tokens();
  rlhf.replica(gen, 0).add("tokens", 300);
  rlhf.replica(policy, 0).add("tokens", 700);
  CHECK(before == 5000);
  CHECK(rlhf.snapshot().tokens() == 6000);
}

TEST_CASE("progress: phases under way as step k/N with an ETA") {
  live_progress p{"sft", "step 1 sft", 40, 160, 10.0, 0, 30.0};  // 40 updates in 20 s: 0.5 s each
  CHECK(p.eta_s(30.0) == doctest::Approx(60.0));                 // 120 left
  CHECK(p.eta_s(35.0) == doctest::Approx(55.0));
  CHECK(p.eta_s(500.0) == 0.0);  // overdue: never negative
  CHECK(p.text(35.0) == "step 1 sft 40/160 ETA 0:55");
  live_progress slow{"ranks", "pretrain", 10, 50, 0.0, 0, 1000.0};  // 100 s a step, 40 left
  CHECK(slow.text(1000.0) == "pretrain 10/50 ETA 1:06:40");
  live_progress fresh{"rm", "step 2 rm", 5, 250, 3.0, 5, 3.0};  // nothing done since the first report
  CHECK(fresh.eta_s(4.0) < 0);
  CHECK(fresh.text(4.0) == "step 2 rm 5/250");
  CHECK(progress_text({p, fresh}, 35.0) == "step 1 sft 40/160 ETA 0:55 · step 2 rm 5/250");
  // a run that has ended (stopped, failed) shows where its phases were, with no ETA
  CHECK(progress_text({p, fresh}, 35.0, /*with_eta=*/false) == "step 1 sft 40/160 · step 2 rm 5/250");

  metrics_snapshot snap;
  snap.elapsed_s = 35.0;
  const std::string line = format_progress("rlhf", snap, snap, 24, {p, fresh});
  CHECK(line.rfind("[rlhf] step 1 sft 40/160 ETA 0:55 · step 2 rm 5/250 | in 0 |", 0) == 0);
  CHECK(line.find("/24") == std::string::npos);  // the phases replace graph.steps' count and ETA

  job_live live;
  live.progress("sft", "step 1 sft", 1, 3);
  live.progress("rm", "step 2 rm", 1, 2);
  live.progress("sft", "step 1 sft", 2, 3);
  auto now = live.progress_now();
  REQUIRE(now.size() == 2);
  CHECK(now[0].node == "sft");  // in the order first reported
  CHECK(now[0].done == 2);
  CHECK(now[0].first_done == 1);
  CHECK(now[1].what == "step 2 rm");
  live.progress("rm", "step 2 rm", 2, 2);  // finished: drops out
  now = live.progress_now();
  REQUIRE(now.size() == 1);
  CHECK(now[0].node == "sft");
  live.progress("sft", "step 1 sft", 0, 3);  // started over (a restart): the rate counts from here
  CHECK(live.progress_now().at(0).first_done == 0);
  // the header's phase: while a phase is under way the finished ones never show (the RM's 2/2 is
  // not the current phase); with none under way, the phase reported last, as done
  live.progress("ppo", "step 3 ppo", 0, 4);
  live.progress("ppo", "step 3 ppo", 1, 4);
  now = live.progress_now();
  REQUIRE(now.size() == 2);
  CHECK(now[1].what == "step 3 ppo");
  CHECK(now[1].done == 1);
  live.progress("sft", "step 1 sft", 3, 3);
  live.progress("ppo", "step 3 ppo", 4, 4);
  now = live.progress_now();
  REQUIRE(now.size() == 1);
  CHECK(now[0].what == "step 3 ppo");
  CHECK(progress_text(now, live.now_s()) == "step 3 ppo 4/4 done");
}

// spdlog through console::log_sink: the progress line is erased before each log line (never garbled)
// and drawn again right after it.
TEST_CASE("progress: log lines erase the progress line first and draw it again after") {
  const std::string path = (std::filesystem::temp_directory_path() / ("flowrun_sink_" + std::to_string(getpid()))).string();
  const int saved = dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  dup2(fd, 2);
  spdlog::logger log("t", console::log_sink());
  log.set_pattern("%v");
  console::progress("[g] step 1/2");
  log.info("a log line");
  console::progress("[g] step 2/2");
  log.warn("two");
  log.warn("three");
  console::clear_progress();
  log.info("after the run");  // the line was cleared for good: not drawn again
  std::fflush(stderr);
  dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream f(path);
  const std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  // each log line: erase ("\r\033[K"), the line, then the progress line drawn again below it
  const std::string erase = "\r\033[K";
  CHECK(got == erase + "[g] step 1/2" + erase + "a log line\n" + erase + "[g] step 1/2" +  //
                   erase + "[g] step 2/2" + erase + "two\n" + erase + "[g] step 2/2" + erase + "three\n" + erase +
                   "[g] step 2/2" + erase + "after the run\n");
}

// A progress line never wraps on a terminal: cut to the width less one, counting "·" (2 bytes) as one.
TEST_CASE("progress: the line is cut to the terminal's width") {
  const std::string line = "[g] a 1/2 \xc2\xb7 b 3/4";  // 17 characters, 18 bytes
  CHECK(console::fit_width(line, 0) == line);            // width unknown
  CHECK(console::fit_width(line, 80) == line);
  CHECK(console::fit_width(line, 18) == line);                 // 17 fit in 18 - 1
  CHECK(console::fit_width(line, 17) == "[g] a 1/2 \xc2\xb7 b 3/");  // 16 characters
  CHECK(console::fit_width(line, 12) == "[g] a 1/2 \xc2\xb7");       // 11: the "·" whole, never half of it
  CHECK(console::fit_width(line, 11) == "[g] a 1/2 ");
}

TEST_CASE("run_graph on the threaded scheduler: completes, writes JSONL metrics, reports failures") {
  graph::node_kind_registry kinds;
  node_factory_registry factories;
  register_test_kinds(kinds, factories);
  rec.clear();
  auto spec_of = [&](const std::string& toml) {
    auto parsed = graph::parse_graph_string(toml, "threaded.graph");
    REQUIRE(parsed.ok());
    auto v = graph::validate(parsed.spec, kinds);
    REQUIRE(v.ok());
    return v.spec;
  };
  const auto file = std::filesystem::temp_directory_path() / "flowrun_test_actor_runtime_metrics.jsonl";
  run_options o;
  o.metrics_path = file.string();
  o.metrics_interval_s = 0;
  o.progress = false;
  o.summary = false;
  o.threads = 2;
  auto r = run_graph(spec_of(R"(
edges = ["src.out -> work.in [dispatch=round_robin]", "work.out -> sink.in"]
[node.src]
kind = "src"
count = 2000
[node.work]
kind = "relay"
replicas = 3
[node.sink]
kind = "collect"
)"),
                     kinds, factories, o);
  CHECK(r.exit_code == 0);
  CHECK(r.error == "");
  CHECK(r.reason == stop_reason::completed);
  CHECK(r.metrics.node("sink")->handled == 2000);
  // busy (inside calls) and waiting for input (between calls) are disjoint parts of each replica's time
  for (const auto& n : r.metrics.nodes) {
    INFO(n.name);
    CHECK(n.wait_s >= 0.0);
    CHECK(n.busy_s + n.wait_s <= r.metrics.elapsed_s * static_cast<double>(n.replicas) + 1e-3);
  }
  {
    std::lock_guard<std::mutex> lock(rec.m);
    CHECK(rec.items["sink[0]"] == iota(2000));
  }
  std::ifstream in(file);
  std::string last, line;
  while (std::getline(in, line)) last = line;
  auto j = nlohmann::json::parse(last);
  CHECK(j["final"] == true);
  CHECK(j["nodes"]["sink"]["handled"] == 2000);
  CHECK(r.metrics.node("sink")->wait_s > 0.0);  // it waited for its first message after start
  CHECK(j["nodes"]["sink"]["wait_s"].get<double>() == doctest::Approx(r.metrics.node("sink")->wait_s));
  std::filesystem::remove(file);

  o.metrics_path.clear();
  auto bad = run_graph(spec_of(R"(
edges = ["src.out -> boom.in", "boom.out -> sink.in"]
[node.src]
kind = "src"
count = 0
[node.boom]
kind = "relay"
fail_at = 100
failures = 1
[node.sink]
kind = "collect"
)"),
                       kinds, factories, o);
  CHECK(bad.exit_code == exit_failed);
  CHECK(bad.error.find("node 'boom' failed in on_message: injected failure at 100") != std::string::npos);
}

// ------------------------------------------------------------ clusters: bytes and secrets (docs/scaling.md)

TEST_CASE("cluster: payload codecs turn text and token ids into bytes and back, unknown types are refused") {
  using namespace flowrun::actor;
  register_payload_codec("test_text", string_codec());
  register_payload_codec("test_tokens", pod_vector_codec<std::int32_t>());
  auto t = encode_payload(payload::make("test_text", std::string("Once upon a time")));
  REQUIRE(t);
  auto back = decode_payload("test_text", *t);
  REQUIRE(back);
  CHECK(back->type() == "test_text");
  CHECK(back->as<std::string>() == "Once upon a time");
  std::vector<std::int32_t> ids{1, 403, -7, 2147483647};
  auto b = encode_payload(payload::make("test_tokens", ids));
  REQUIRE(b);
  CHECK(b->size() == 16);
  auto ids_back = decode_payload("test_tokens", *b);
  REQUIRE(ids_back);
  CHECK(ids_back->as<std::vector<std::int32_t>>() == ids);
  CHECK_FALSE(decode_payload("test_tokens", std::vector<char>(5)));
  auto none = encode_payload(payload::make("test_weights", std::vector<float>{1.f}));
  REQUIRE_FALSE(none);
  CHECK(none.error().find("message type 'test_weights' cannot cross processes: it has no codec") != std::string::npos);
  CHECK_FALSE(has_payload_codec("test_weights"));
}

TEST_CASE("cluster: HMAC-SHA256 matches RFC 4231 and proofs depend on secret, role and both nonces") {
  using namespace flowrun::actor;
  CHECK(hmac_sha256_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::string a = random_nonce(), b = random_nonce();
  CHECK(a.size() == 64);
  CHECK(a != b);
  const std::string p = cluster_proof("s3cret", "client", a, b);
  CHECK(constant_time_equal(p, cluster_proof("s3cret", "client", a, b)));
  CHECK_FALSE(constant_time_equal(p, cluster_proof("s3cret!", "client", a, b)));
  CHECK_FALSE(constant_time_equal(p, cluster_proof("s3cret", "daemon", a, b)));
  CHECK_FALSE(constant_time_equal(p, cluster_proof("s3cret", "client", b, a)));
  ::setenv("FLOWRUN_CLUSTER_SECRET", "", 1);
  auto missing = load_cluster_secret("");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().find("FLOWRUN_CLUSTER_SECRET") != std::string::npos);
  ::setenv("FLOWRUN_CLUSTER_SECRET", "from-env", 1);
  auto env = load_cluster_secret("");
  REQUIRE(env);
  CHECK(*env == "from-env");
  ::unsetenv("FLOWRUN_CLUSTER_SECRET");
  CHECK_FALSE(load_cluster_secret("/nonexistent/secret"));
  // a folder is named as one (it was "is empty")
  auto folder = load_cluster_secret(std::filesystem::temp_directory_path().string());
  REQUIRE_FALSE(folder);
  CHECK(folder.error().find("is a folder") != std::string::npos);
  // a blank first line above the secret is named as such (it was "is empty"); an empty file is empty
  const auto dir = std::filesystem::temp_directory_path() / ("flowrun_secret_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "blank_first") << "\nthe-secret-0123456789\n";
  std::ofstream(dir / "empty").flush();
  auto blank = load_cluster_secret((dir / "blank_first").string());
  REQUIRE_FALSE(blank);
  CHECK(blank.error().find("begins with a blank line: the secret is its first line") != std::string::npos);
  auto empty = load_cluster_secret((dir / "empty").string());
  REQUIRE_FALSE(empty);
  CHECK(empty.error().find("is empty") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("cluster auth: the daemon's handshake gate accepts a right proof once and refuses forgeries") {
  handshake_gate gate("s3cret", 4);
  const std::string client = random_nonce();
  CHECK_FALSE(gate.hello("not a nonce"));
  CHECK_FALSE(gate.hello(std::string(64, 'A')));  // upper-case hex is not what random_nonce makes
  auto answer = gate.hello(client);
  REQUIRE(answer);
  CHECK(is_nonce(answer->first));
  // the daemon proves it knows the secret
  CHECK(answer->second == cluster_proof("s3cret", "daemon", client, answer->first));
  // a proof made with another secret, role or order is refused and uses the nonce up
  CHECK(gate.auth(client, answer->first, cluster_proof("other", "client", client, answer->first)) ==
        "wrong cluster secret (its proof does not match ours)");
  CHECK(gate.auth(client, answer->first, cluster_proof("s3cret", "client", client, answer->first)) ==
        "malformed or replayed handshake");
  // a fresh hello with the right proof is accepted once; the replay is refused
  answer = gate.hello(client);
  REQUIRE(answer);
  const std::string proof = cluster_proof("s3cret", "client", client, answer->first);
  CHECK(gate.auth(client, answer->first, cluster_proof("s3cret", "daemon", client, answer->first)) != "");
  answer = gate.hello(client);
  const std::string right = cluster_proof("s3cret", "client", client, answer->first);
  CHECK(gate.auth(client, answer->first, right).empty());
  CHECK(gate.auth(client, answer->first, right) == "malformed or replayed handshake");
  CHECK(gate.auth(client, random_nonce(), proof) == "malformed or replayed handshake");  // never issued
  // unanswered hellos are bounded
  for (int i = 0; i < 10; ++i) gate.hello(random_nonce());
  CHECK(gate.pending() <= 4);
}

TEST_CASE("cluster: a node's replica counters travel as bytes and main mirrors them") {
  using namespace flowrun::actor;
  // gen (2 replicas) -> sink (1), as every process of the run declares it; the two links' counters
  auto declare = [](job_metrics& m) {
    m.add_node("gen", 2, false);
    m.add_node("sink", 1, false, true);
    const auto e = m.add_edge("gen.out -> sink.in", 1, 8);
    std::array<link_counters*, 2> links{};
    for (std::uint32_t p = 0; p < 2; ++p) links[p] = &m.add_link(e, 0, p, 0);
    return links;
  };
  job_metrics node_side, main_side;
  auto node_links = declare(node_side);  // gen[1] runs on the node; gen[0] and the sink on main
  auto main_links = declare(main_side);
  auto& c = node_side.replica(0, 1);
  c.msgs_in = 7;
  c.handled = 7;
  c.busy_ns = 123456789;
  c.wait_ns = 500000000;
  c.add("tokens", 1500);
  c.add("batches", 3);
  node_side.replica(1, 0).msgs_in = 99;  // not sent: only (0, 1) runs on that node
  auto bytes = encode_replica_counters(node_side, {{0, 1}, {5, 0}});  // (5, 0) does not exist: skipped
  REQUIRE(apply_replica_counters(main_side, bytes));
  auto snap = main_side.snapshot();
  const auto* gen = snap.node("gen");
  REQUIRE(gen != nullptr);
  CHECK(gen->per_replica.at(1).msgs_in == 7);
  CHECK(gen->per_replica.at(1).handled == 7);
  CHECK(gen->per_replica.at(1).busy_s == doctest::Approx(0.123456789));
  CHECK(gen->per_replica.at(1).wait_s == doctest::Approx(0.5));
  CHECK(gen->wait_s == doctest::Approx(0.5));
  CHECK(gen->per_replica.at(1).counters.at("tokens") == 1500);
  CHECK(gen->per_replica.at(0).msgs_in == 0);
  CHECK(snap.node("sink")->msgs_in == 0);
  CHECK(snap.tokens() == 1500);
  CHECK(snap.edges.at(0).sent == 0);  // nothing was sent yet
  // the links: the producer's side of the node's link reaches main (its summary counted 0 for it);
  // the consumer's side stays main's own count, and main's own link is main's
  node_links[1]->sent = 5;
  node_links[1]->bytes = 500;
  node_links[1]->acked = 3;
  node_links[1]->blocked_ns = 2000000000;
  node_links[1]->max_in_flight = 2;
  node_links[1]->handled = 77;  // the node does not run the sink: not sent
  node_links[0]->sent = 99;     // nor gen[0]'s link
  main_links[0]->sent = 4;
  main_links[1]->handled = 3;
  REQUIRE(apply_replica_counters(main_side, encode_replica_counters(node_side, {{0, 1}})));
  snap = main_side.snapshot();
  CHECK(snap.edges.at(0).sent == 4 + 5);
  CHECK(snap.edges.at(0).bytes == 500);
  CHECK(snap.edges.at(0).acked == 3);
  CHECK(snap.edges.at(0).handled == 3);
  CHECK(snap.edges.at(0).in_flight == 4 + 2);
  CHECK(snap.edges.at(0).max_in_flight == 2);
  CHECK(snap.edges.at(0).blocked_s == doctest::Approx(2.0));
  // a node that runs the consumer sends its handled count
  job_metrics sink_node, main2;
  auto sink_links = declare(sink_node);
  auto main2_links = declare(main2);
  sink_links[0]->handled = 4;
  sink_links[1]->handled = 5;
  main2_links[0]->sent = 4;
  main2_links[1]->sent = 6;
  REQUIRE(apply_replica_counters(main2, encode_replica_counters(sink_node, {{1, 0}})));
  CHECK(main2.snapshot().edges.at(0).handled == 9);
  // across processes a handled message was acknowledged, whatever the producer's last report says: the
  // final summary said "in flight 1" when an ack had not reached the producer before it reported
  for (auto* l : main2_links) l->remote = true;
  CHECK(main2.snapshot().edges.at(0).in_flight == 1);  // gen[1] sent 6, the sink handled 5
  CHECK(main2.snapshot().edges.at(0).acked == 9);
  CHECK(main2.snapshot().edges.at(0).sent == 10);
  // the consumer's own process sees no sends on a link whose producer is elsewhere: no message in flight there
  // (a daemon's summary of an edge from main said "in flight -4")
  for (auto* l : sink_links) l->remote = true;
  CHECK(sink_node.snapshot().edges.at(0).in_flight == 0);
  // absolute values: a later report replaces, not adds
  c.add("tokens", 500);
  REQUIRE(apply_replica_counters(main_side, encode_replica_counters(node_side, {{0, 1}})));
  CHECK(main_side.snapshot().tokens() == 2000);
  // truncated bytes are refused
  bytes.resize(bytes.size() - 3);
  CHECK_FALSE(apply_replica_counters(main_side, bytes));
}

// runtime/actor/socket_numbers.h: CAF 0.17 names a connection by its descriptor number, so a number reused
// while the BASP broker still remembers the closed connection made a re-run coordinator unreachable
// (tests/cluster_rerun_small.sh is the end-to-end case). Here: the numbers themselves.
TEST_CASE("socket numbers: accepted and created sockets get fresh numbers, not the one just closed") {
  REQUIRE(flowrun::actor::fresh_socket_numbers_active());
  using flowrun::actor::fresh_fd_ceiling;
  using flowrun::actor::fresh_fd_floor;
  auto in_range = [](int fd) { return fd >= fresh_fd_floor && fd < fresh_fd_ceiling; };
  // socket(): a closed number does not come back next, and the close-on-exec flag is kept
  const int a = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(a >= 0);
  CHECK(in_range(a));
  CHECK((::fcntl(a, F_GETFD) & FD_CLOEXEC) != 0);
  ::close(a);
  const int b = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(b >= 0);
  CHECK(in_range(b));
  CHECK(b != a);
  CHECK((::fcntl(b, F_GETFD) & FD_CLOEXEC) == 0);
  // accept(): two connections accepted one after the other, the first closed before the second arrives
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(b, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(b, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(b, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  std::vector<int> accepted;
  for (int i = 0; i < 2; ++i) {
    const int c = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    const int s = ::accept(b, nullptr, nullptr);
    REQUIRE(s >= 0);
    CHECK(in_range(s));
    accepted.push_back(s);
    ::close(s);
    ::close(c);
  }
  CHECK(accepted[0] != accepted[1]);
  ::close(b);
  // a descriptor past the range keeps its number; a negative one passes through
  CHECK(flowrun::actor::move_to_fresh_number(-1) == -1);
  const int high = ::fcntl(0, F_DUPFD, fresh_fd_ceiling + 5);
  if (high >= 0) {
    CHECK(flowrun::actor::move_to_fresh_number(high) == high);
    ::close(high);
  }
}

// runtime/actor/tls_error_queue.h: caf_openssl runs every TLS connection on one thread and never clears
// OpenSSL's per-thread error queue, so one connection's failure was read back as another's: in a cluster run
// over TLS, killing one node closed the coordinator's connection to a healthy one. Here: two TLS endpoints
// joined by an in-memory BIO pair finish their handshake; then a third connection fails (a server fed bytes
// that are not TLS) and leaves its errors queued, unread, as caf_openssl leaves a reset connection's. A read
// with nothing to read and a write into a full pipe must still report WANT_READ and WANT_WRITE (the socket is
// merely not ready), not SSL_ERROR_SSL, on which caf_openssl closes the connection.
TEST_CASE("tls error queue: a stale error from one TLS connection does not close another") {
  REQUIRE(flowrun::actor::tls_error_queue_cleared());
  // anonymous ECDH over TLS 1.2, as caf_openssl without certificates: no certificate to make here
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  REQUIRE(ctx != nullptr);
  REQUIRE(SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION) == 1);
  REQUIRE(SSL_CTX_set_cipher_list(ctx, "aNULL:@SECLEVEL=0") == 1);
  SSL* client = SSL_new(ctx);
  SSL* server = SSL_new(ctx);
  BIO *client_end = nullptr, *server_end = nullptr;
  REQUIRE(BIO_new_bio_pair(&client_end, 4096, &server_end, 4096) == 1);
  SSL_set_bio(client, client_end, client_end);
  SSL_set_bio(server, server_end, server_end);
  SSL_set_connect_state(client);
  SSL_set_accept_state(server);
  bool client_done = false, server_done = false;
  for (int round = 0; round < 20 && !(client_done && server_done); ++round) {
    client_done = client_done || SSL_do_handshake(client) == 1;
    server_done = server_done || SSL_do_handshake(server) == 1;
  }
  REQUIRE(client_done);
  REQUIRE(server_done);
  // leaves a failed connection's errors in this thread's queue, unread (caf_openssl's handle_ssl_result)
  auto poison = [&] {
    SSL* bad = SSL_new(ctx);
    BIO* in = BIO_new(BIO_s_mem());
    const std::string junk = "GET / HTTP/1.1\r\nHost: not-tls\r\n\r\n" + std::string(64, 'x');
    BIO_write(in, junk.data(), static_cast<int>(junk.size()));
    SSL_set_bio(bad, in, BIO_new(BIO_s_mem()));
    SSL_set_accept_state(bad);
    const int ret = SSL_accept(bad);
    CHECK(ret <= 0);
    CHECK(SSL_get_error(bad, ret) == SSL_ERROR_SSL);
    SSL_free(bad);
    REQUIRE(ERR_peek_error() != 0);
  };
  char buf[64];
  // nothing to read yet
  poison();
  int ret = SSL_read(client, buf, sizeof buf);
  CHECK(ret <= 0);
  CHECK(SSL_get_error(client, ret) == SSL_ERROR_WANT_READ);
  // libssl's own SSL_read (behind the interposed one) reports the stale error: what closed healthy connections
  using read_fn = int (*)(SSL*, void*, int);
  const auto libssl_read = reinterpret_cast<read_fn>(::dlsym(RTLD_NEXT, "SSL_read"));
  REQUIRE(static_cast<bool>(libssl_read));
  poison();
  ret = libssl_read(client, buf, sizeof buf);
  CHECK(ret <= 0);
  CHECK(SSL_get_error(client, ret) == SSL_ERROR_SSL);
  // data arrives after the stale error: it is read
  REQUIRE(SSL_write(server, "ping", 4) == 4);
  poison();
  ret = SSL_read(client, buf, sizeof buf);
  REQUIRE(ret == 4);
  CHECK(std::string(buf, 4) == "ping");
  // a write into a full pipe (the server reads nothing)
  const std::string big(64 * 1024, 'y');
  poison();
  ret = SSL_write(client, big.data(), static_cast<int>(big.size()));
  CHECK(ret <= 0);
  CHECK(SSL_get_error(client, ret) == SSL_ERROR_WANT_WRITE);
  ERR_clear_error();
  SSL_free(client);
  SSL_free(server);
  SSL_CTX_free(ctx);
}

// Runs `body` in a child process with its standard output and error captured; returns the child's exit
// status (waitpid's) and what it wrote. For code that ends the process (the teardown watchdog).
static std::pair<int, std::string> run_in_child(const std::function<void()>& body) {
  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    body();
    std::_Exit(99);  // not reached when body ends the process
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return {status, text};
}

// runtime/actor/teardown.h: when CAF 0.17's ~actor_system never returns, the watchdog ends the process with
// the run's exit code, and says the run's error first (it was lost once: a run stopped by a lost node exited 1
// without a word). In a child process, since the watchdog ends it.
TEST_CASE("teardown: a hung actor system ends with the run's error printed and its exit code") {
  auto [status, text] = run_in_child([] {
    auto cfg = std::make_unique<caf::actor_system_config>();
    auto sys = std::make_unique<caf::actor_system>(*cfg);
    // a detached actor that never quits, held by a handle that outlives the system (as CAF 0.17 held the
    // replica): ~actor_system waits for it for good
    new caf::actor(sys->spawn<caf::detached>([]() -> caf::behavior { return {[](int) {}}; }));
    flowrun::actor::teardown_actor_system(std::move(sys), true, 7, "cluster node 'w2' lost (a test); its actors: x");
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
  CHECK(text.find("cluster node 'w2' lost (a test); its actors: x") != std::string::npos);
  CHECK(text.find("did not shut down within 10 s") != std::string::npos);
  CHECK(text.find("cluster node 'w2' lost") < text.find("did not shut down"));
}

// A blocking replica is a caf::blocking_actor, whose thread ends when act() returns, however long something
// holds the actor. As a detached event-based actor (before), a handle kept past the job (as CAF 0.17 kept one
// in the BASP broker after a cluster node's loss: docs/reliability.md) held ~actor_system for good: this test
// then ended by the watchdog after 10 s with exit code 5. Now the teardown returns, and the child reaches its
// own exit (99), quickly.
TEST_CASE("teardown: a blocking replica held past the end of its job no longer holds up the actor system") {
  const auto t0 = std::chrono::steady_clock::now();
  auto [status, text] = run_in_child([] {
    graph::node_kind_registry kinds;
    node_factory_registry factories;
    register_test_kinds(kinds, factories);
    graph::node_kind blocking_collect = *kinds.lookup("collect");
    blocking_collect.name = "blocking_collect";
    blocking_collect.blocking = true;
    register_node_kind(kinds, factories, blocking_collect, [] { return std::make_unique<collect_node>(); });
    auto parsed = graph::parse_graph_string(R"(
edges = ["src.out -> held.in"]
[node.src]
kind = "src"
count = 3
[node.held]
kind = "blocking_collect"
)");
    graph::validate_options vo;
    vo.check_files = false;
    auto v = graph::validate(parsed.spec, kinds, vo);
    if (!v.ok()) std::_Exit(98);
    auto cfg = std::make_unique<caf::actor_system_config>();
    auto sys = std::make_unique<caf::actor_system>(*cfg);
    auto j = launch(*sys, v.spec, kinds, factories);
    if (!j) std::_Exit(97);
    while (!j->state->wait_for_ms(50)) {
    }
    if (j->state->exit_code() != 0) std::_Exit(96);
    new caf::actor(j->replicas[1][0]);  // the leak: one strong reference that outlives the system
    *j = job{};
    flowrun::actor::teardown_actor_system(std::move(sys), true, 5, "");
    std::fflush(stdout);
    std::_Exit(99);  // the teardown returned
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(WIFEXITED(status));
  INFO(text);
  CHECK(WEXITSTATUS(status) == 99);
  CHECK(text.find("did not shut down") == std::string::npos);
  CHECK(seconds < 9.0);  // the watchdog's 10 s never ran out
}

TEST_CASE("attempt_stop_reason: the lost node and its actors first, whatever error stopped the attempt first") {
  // cluster_rlhf_small under ctest -j4: a transfer from the killed node failed, and became the run's
  // first error, before the coordinator saw the node lost; the "attempt 1 stopped" line must still
  // name the node (the restart's cause) and the actors it held
  graph::graph_spec spec;
  auto add = [&](const std::string& name, std::int64_t replicas, std::string on, std::vector<std::string> each = {}) {
    graph::node_spec n;
    n.name = name;
    n.replicas = replicas;
    n.on = std::move(on);
    n.on_replicas = std::move(each);
    spec.nodes.push_back(n);
  };
  add("experience", 1, "");
  add("ppo_controller", 1, "w2");
  add("critic", 2, "", {"w1", "w2"});
  add("reward", 1, "w2");
  const std::string transfer = "node 'experience' received from another process: the tensors of a 'scores' payload "
                               "did not arrive";
  CHECK(attempt_stop_reason(spec, {"w2"}, transfer) ==
        "cluster node 'w2' lost; its actors: ppo_controller, critic[1], reward (the run's first error: " + transfer + ")");
  // the loss itself was the first error: it is the line, as job.cpp wrote it
  const std::string loss = "cluster node 'w2' lost (its connection dropped); its actors: ppo_controller, critic[1], reward";
  CHECK(attempt_stop_reason(spec, {"w2"}, loss) == loss);
  // two nodes lost: both named, each with its actors, then the first error
  CHECK(attempt_stop_reason(spec, {"w1", "w2"}, loss) ==
        "cluster node 'w1' lost; its actors: critic[0]; cluster node 'w2' lost; its actors: ppo_controller, critic[1], "
        "reward (the run's first error: " + loss + ")");
  CHECK(attempt_stop_reason(spec, {"w3"}, "") == "cluster node 'w3' lost; its actors: none");
}
