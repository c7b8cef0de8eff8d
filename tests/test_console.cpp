// The live console (runtime/console, docs/console.md): the hub's rates and
// states on hand-made samples, and every HTTP endpoint against a real run
// (run_graph on threads, with test-only node kinds defined below), including
// the refusal of state-changing requests without the token, a non-loopback
// console that wants the token everywhere, and a port already in use.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/actor/console_bridge.h"
#include "runtime/actor/live.h"
#include "runtime/actor/node.h"
#include "runtime/actor/runtime.h"
#include "runtime/console/hub.h"
#include "runtime/console/server.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"

using namespace flowrun;
using namespace flowrun::actor;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::atomic<int> g_starts{0};

// c_src: emits 0, 1, 2, ... every period_ms (forever when count = 0); polls checkpoint requests.
class c_src final : public node {
 public:
  void start(node_context& ctx) override {
    ++g_starts;
    period_ = ctx.spec().get_int("period_ms");
    count_ = ctx.spec().get_int("count");
  }
  bool produce(node_context& ctx) override {
    if (count_ > 0 && next_ >= count_) return false;
    if (ctx.checkpoint_requested()) ctx.print("c_src: checkpoint at item " + std::to_string(next_));
    std::this_thread::sleep_for(std::chrono::milliseconds(period_));
    ctx.emit("out", payload::make("nums", std::vector<std::int64_t>(16, next_++)));
    return true;
  }

 private:
  std::int64_t period_ = 2, count_ = 0, next_ = 0;
};

// c_work: takes work_ms per message, reports a loss, a phase and its memory; throws once at fail_at.
class c_work final : public node {
 public:
  void start(node_context& ctx) override {
    ++g_starts;
    work_ms_ = ctx.spec().get_int("work_ms");
    fail_at_ = ctx.spec().get_int("fail_at");
    fail_always_ = ctx.spec().get_bool("fail_always");
    ctx.memory({{"params", 1000 + static_cast<std::int64_t>(ctx.replica())}, {"optimizer", 2000}});
  }
  void on_message(node_context& ctx, std::string_view, payload msg) override {
    const std::int64_t v = msg.as<std::vector<std::int64_t>>().at(0);
    if (v == fail_at_ && (fail_always_ || !failed_once().exchange(true)))
      throw std::runtime_error("injected failure at " + std::to_string(v));
    ctx.phase(v % 2 ? "training" : "scoring");
    std::this_thread::sleep_for(std::chrono::milliseconds(work_ms_));
    ctx.signal("loss", 1.0 / static_cast<double>(v + 1));
    ctx.metric("tokens", 16);
    ctx.emit("out", msg);
  }
  static std::atomic<bool>& failed_once() {
    static std::atomic<bool> f{false};
    return f;
  }

 private:
  std::int64_t work_ms_ = 1, fail_at_ = -1;
  bool fail_always_ = false;
};

class c_sink final : public node {
 public:
  void on_message(node_context&, std::string_view, payload) override {}
};

struct kinds_and_factories {
  graph::node_kind_registry kinds;
  node_factory_registry factories;
  kinds_and_factories() {
    using T = graph::setting_type;
    register_node_kind(kinds, factories,
                       graph::node_kind{"c_src", "test source"}
                           .output("out", "nums")
                           .option("period_ms", T::int_, std::int64_t{2}, "ms per item")
                           .option("count", T::int_, std::int64_t{0}, "items; 0: forever"),
                       [] { return std::unique_ptr<node>(new c_src); });
    register_node_kind(kinds, factories,
                       graph::node_kind{"c_work", "test worker"}
                           .input("in", "nums")
                           .output("out", "nums")
                           .option("work_ms", T::int_, std::int64_t{4}, "ms per message")
                           .option("fail_at", T::int_, std::int64_t{-1}, "value to fail on")
                           .option("fail_always", T::bool_, false, "fail every time at fail_at"),
                       [] { return std::unique_ptr<node>(new c_work); });
    register_node_kind(kinds, factories, graph::node_kind{"c_sink", "test sink"}.input("in", "nums"),
                       [] { return std::unique_ptr<node>(new c_sink); });
  }
};

graph::graph_spec spec_of(const kinds_and_factories& kf, const std::string& toml) {
  auto parsed = graph::parse_graph_string(toml, "console_test.graph");
  INFO(graph::format_errors(parsed.errors));
  REQUIRE(parsed.ok());
  graph::validate_options vo;
  vo.check_files = false;
  auto v = graph::validate(parsed.spec, kf.kinds, vo);
  INFO(graph::format_errors(v.errors));
  REQUIRE(v.ok());
  return v.spec;
}

const char* pipeline = R"(
edges = ["src.out -> work.in [dispatch=round_robin]", "work.out -> sink.in"]
[graph]
name = "console_test"
[node.src]
kind = "c_src"
period_ms = 3
[node.work]
kind = "c_work"
replicas = 2
work_ms = 8
fail_at = 5
restart = "on-failure"
[node.sink]
kind = "c_sink"
)";

// A run of `toml` on its own thread with the console on; url and token once it listens.
struct live_run {
  kinds_and_factories kf;
  std::promise<std::pair<std::string, std::string>> ready;
  std::future<run_result> done;
  std::string url, token;
  int port = 0;

  explicit live_run(const std::string& toml, console_options co = {}) {
    co.enabled = true;
    co.interval_s = 0.1;
    co.on_ready = [this](const std::string& u, const std::string& t) { ready.set_value({u, t}); };
    run_options ro;
    ro.console = co;
    ro.progress = false;
    ro.summary = false;
    ro.metrics_interval_s = 0;
    graph::graph_spec spec = spec_of(kf, toml);
    done = std::async(std::launch::async, [this, spec, ro] { return run_graph(spec, kf.kinds, kf.factories, ro); });
    auto f = ready.get_future();
    REQUIRE(f.wait_for(20s) == std::future_status::ready);
    std::tie(url, token) = f.get();
    const auto colon = url.rfind(':');
    port = std::stoi(url.substr(colon + 1));
  }
  ~live_run() {
    if (done.valid() && done.wait_for(0s) != std::future_status::ready) {
      // stop twice (the second stops without draining) until the run ends
      httplib::Client c("127.0.0.1", port);
      for (int i = 0; i < 100 && done.wait_for(100ms) != std::future_status::ready; ++i)
        c.Post("/api/stop", httplib::Headers{{"Authorization", "Bearer " + token}}, "", "text/plain");
      done.wait();
    }
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    return c;
  }
  json get(const std::string& path) const {
    auto c = client();
    auto r = c.Get(path.c_str());
    REQUIRE(r);
    INFO(path << ": " << r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  }
  int post(const std::string& path, const std::string& tok, std::string* body = nullptr) const {
    auto c = client();
    httplib::Headers h;
    if (!tok.empty()) h.emplace("Authorization", "Bearer " + tok);
    auto r = c.Post(path.c_str(), h, "", "text/plain");
    REQUIRE(r);
    if (body) *body = r->body;
    return r->status;
  }
  // Polls `pred` on GET path until true (or fails after `limit`).
  template <class P>
  json wait_for(const std::string& path, P pred, std::chrono::milliseconds limit = 15s) const {
    auto until = std::chrono::steady_clock::now() + limit;
    json j;
    while (std::chrono::steady_clock::now() < until) {
      j = get(path);
      if (pred(j)) return j;
      std::this_thread::sleep_for(50ms);
    }
    FAIL("timed out waiting on " << path << ": " << j.dump());
    return j;
  }
};

// Sends each of `requests` as it is, one after the other over one connection, reading each response (to
// its Content-Length; 3 s at most) before the next; returns the responses and, in `ms`, how long the first took.
std::string raw_http(int port, const std::vector<std::string>& requests, double* ms = nullptr) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{3, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string all;
  for (std::size_t k = 0; k < requests.size(); ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(::send(s, requests[k].data(), requests[k].size(), 0) == static_cast<ssize_t>(requests[k].size()));
    std::string got;
    char buf[4096];
    auto complete = [&] {
      const auto end = got.find("\r\n\r\n");
      if (end == std::string::npos) return false;
      const auto cl = got.find("Content-Length: ");
      const std::size_t n = cl != std::string::npos && cl < end ? std::stoul(got.substr(cl + 16)) : 0;
      return got.size() >= end + 4 + n;
    };
    while (!complete()) {
      const auto n = ::recv(s, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    if (k == 0 && ms) *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    all += got;
  }
  ::close(s);
  return all;
}

const json* find_by(const json& arr, const char* key, const std::string& value) {
  for (const auto& x : arr)
    if (x.value(key, "") == value) return &x;
  return nullptr;
}

std::int64_t produced_by(const json& nodes, const std::string& name) {
  const json* n = find_by(nodes["nodes"], "name", name);
  REQUIRE(n);
  return (*n)["totals"].value("produced", std::int64_t{0});
}

}  // namespace

TEST_CASE("console: the hub derives rates, states, bottlenecks and series from samples") {
  console::graph_info g;
  g.name = "g";
  g.nodes = {{"a", "src", 1, true, false, "", {{"rate", "5", false}}}, {"b", "work", 2, false, true, "", {}}};
  g.edges = {{"a.out -> b.in", "a", "out", "b", "in", "round_robin", "in-process", 8, 2, false}};
  console::hub h(g);
  CHECK(json::parse(h.status_json())["run_state"] == "starting");
  auto make = [](double t, std::uint64_t n, double busy_b, const char* state_b) {
    console::sample s;
    s.t_s = t;
    console::node_sample a{"a", 0, {}};
    console::replica_sample ra;
    ra.state = "waiting_credit";
    ra.msgs_out = n;
    ra.bytes_out = n * 100;
    ra.produced = n;
    ra.blocked_s = t * 0.8;
    ra.counters["tokens_cut"] = static_cast<std::int64_t>(n * 16);  // the batches it cut: b counts them
    a.replicas.push_back(ra);
    console::node_sample b{"b", 6, {}};
    for (int r = 0; r < 2; ++r) {
      console::replica_sample rb;
      rb.state = r == 0 ? state_b : "idle";
      rb.state_for_s = 0.5;
      rb.msgs_in = n / 2;
      rb.handled = n / 2;
      rb.busy_s = busy_b;
      rb.wait_s = t * 0.05;
      rb.counters["tokens"] = static_cast<std::int64_t>(n * 8);
      rb.counters["policy_version"] = static_cast<std::int64_t>(n / 100) + r;  // replica 1 holds a newer one
      b.replicas.push_back(rb);
    }
    s.nodes = {a, b};
    s.tokens = static_cast<std::int64_t>(n * 16);  // metrics_snapshot::tokens(): b's (a's are tokens_cut)
    console::edge_sample e;
    e.name = "a.out -> b.in";
    e.sent = n;
    e.bytes = n * 100;
    e.in_flight = 8;
    e.blocked_s = t * 0.8;
    e.oldest_unacked_s = 0.25;
    s.edges = {e};
    return s;
  };
  console::sample s0 = make(0.0, 0, 0.0, "idle");
  s0.events.push_back({1, 0.0, "spawn", "a", 0, "spawned"});
  s0.signals.push_back({1, 0.0, "b", 0, "loss", 2.5, ""});
  h.publish(s0);
  console::sample s1 = make(2.0, 200, 1.9, "busy");
  s1.events.push_back({2, 1.0, "restart", "b", 1, "restart 1 of 3"});
  s1.signals.push_back({2, 1.5, "b", 0, "loss", 2.0, ""});
  s1.signals.push_back({3, 1.6, "b", 1, "phase", 0, "training"});
  s1.signals.push_back({4, 1.7, "b", 0, "staleness", 1.0, ""});
  s1.signals.push_back({5, 1.8, "b", 0, "lr", 7.7012345e-6, ""});  // DS-Chat's learning rates: digits, not decimals
  h.publish(s1);

  json nodes = json::parse(h.nodes_json())["nodes"];
  REQUIRE(nodes.size() == 2);
  CHECK(nodes[0]["state"] == "waiting_credit");
  CHECK(nodes[0]["rates"]["msgs_out_per_s"].get<double>() == doctest::Approx(100.0));
  CHECK(nodes[0]["rates"]["bytes_out_per_s"].get<double>() == doctest::Approx(10000.0));
  CHECK(nodes[0]["load"]["blocked_ms_per_s"].get<double>() == doctest::Approx(800.0));
  CHECK(nodes[0]["load"]["outstanding"] == 8);
  CHECK(nodes[0]["load"]["oldest_outstanding_s"].get<double>() == doctest::Approx(0.25));
  CHECK(nodes[1]["state"] == "busy");  // one replica busy, one idle: busy wins
  CHECK(nodes[1]["rates"]["handled_per_s"].get<double>() == doctest::Approx(100.0));
  CHECK(nodes[1]["rates"]["tokens_per_s"].get<double>() == doctest::Approx(1600.0));  // 800 per replica
  CHECK(nodes[1]["load"]["busy_ms_per_s"].get<double>() == doctest::Approx(1900.0));  // 950 per replica
  CHECK(nodes[1]["load"]["idle_ms_per_s"].get<double>() == doctest::Approx(100.0));
  CHECK(nodes[1]["load"]["mailbox_depth"] == 6);
  // asynchronous RLHF: the newest policy version a replica holds, the seconds waiting for input
  CHECK(nodes[0]["policy_version"].is_null());  // a node without the counter has none
  CHECK(nodes[1]["policy_version"] == 3);       // 200 / 100 + 1: replica 1's
  CHECK(nodes[1]["totals"]["wait_s"].get<double>() == doctest::Approx(0.2));  // 2 replicas x 2 s x 0.05
  {
    json a = json::parse(h.status_json())["async"];
    CHECK(a["policy_versions"] == json{{"b", 3}});
    CHECK(a["wait_s"]["b"].get<double>() == doctest::Approx(0.2));
    CHECK(a["staleness"].get<double>() == 1.0);  // the last trained batch's
    CHECK(a["stale_dropped"] == 0);
  }
  json edges = json::parse(h.edges_json())["edges"];
  CHECK(edges[0]["msgs_per_s"].get<double>() == doctest::Approx(100.0));
  CHECK(edges[0]["transport"] == "in-process");
  json bn = json::parse(h.bottlenecks_json(5))["nodes"];
  REQUIRE(bn.size() == 2);
  CHECK(bn[0]["name"] == "b");  // busy 95%, and its producer waits for its credit 80% of the time
  CHECK(bn[0]["why"].get<std::string>().find("upstream waits") != std::string::npos);
  json sig = json::parse(h.signals_json(-1));
  const json* loss = find_by(sig["series"], "name", "loss");
  REQUIRE(loss);
  CHECK((*loss)["points"].size() == 2);
  CHECK((*loss)["latest"].get<double>() == doctest::Approx(2.0));
  CHECK(json::parse(h.signals_json(1.0))["series"][0]["points"].size() <= 1);
  // a small value keeps 7 significant digits everywhere (6 decimal places showed lr 7.7e-6 as 8e-06, 1.5e-8 as 0)
  const json* lr = find_by(sig["series"], "name", "lr");
  REQUIRE(lr);
  CHECK((*lr)["latest"].get<double>() / 7.7012345e-6 == doctest::Approx(1.0).epsilon(1e-6));
  CHECK((*lr)["points"][0][1].get<double>() / 7.7012345e-6 == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(json::parse(h.status_json())["signals"]["b/lr"].get<double>() / 7.7012345e-6 == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(sig["phases"][0]["phase"] == "training");
  json ev = json::parse(h.events_json(1));
  REQUIRE(ev["events"].size() == 1);
  CHECK(ev["events"][0]["kind"] == "restart");
  // the job's tokens/s: b's, which processes them, not b's plus those the source a cut into batches
  CHECK(nodes[0]["rates"]["tokens_per_s"].get<double>() == doctest::Approx(1600.0));
  CHECK(json::parse(h.status_json())["tokens_per_s"].get<double>() == doctest::Approx(1600.0));
  auto detail = h.node_json("a");
  REQUIRE(detail);
  CHECK(json::parse(*detail)["settings"][0]["key"] == "rate");
  CHECK(!h.node_json("zzz"));
  // a frame hands each event and signal to a stream reader once
  std::uint64_t es = 0, ss = 0;
  json f1 = json::parse(h.frame_json(&es, &ss));
  CHECK(f1["events"].size() == 2);
  CHECK(f1["signals"].size() == 5);
  CHECK(f1["signals"][4]["value"].get<double>() / 7.7012345e-6 == doctest::Approx(1.0).epsilon(1e-6));
  json f2 = json::parse(h.frame_json(&es, &ss));
  CHECK(f2["events"].empty());
  CHECK(f2["signals"].empty());
  // the final sample (the run is over): nothing flows, so no rate or load is shown (the last window's
  // stayed: a stopped node at BUSY 1000 and 1644 tokens/s)
  {
    console::sample fin = make(4.0, 400, 3.9, "stopped");
    fin.finished = true;
    fin.run_state = "finished";
    h.publish(fin);
    json after = json::parse(h.nodes_json())["nodes"];
    for (const auto& n : after) {
      INFO(n.dump());
      CHECK(n["rates"]["msgs_out_per_s"].get<double>() == 0);
      CHECK(n["rates"]["handled_per_s"].get<double>() == 0);
      CHECK(n["load"]["busy_ms_per_s"].get<double>() == 0);
    }
    CHECK(json::parse(h.status_json())["tokens_per_s"].get<double>() == 0);
  }
  CHECK(h.act("pause").status == 503);  // no controls yet
  h.set_controls({[] { return std::string("paused"); }, nullptr, nullptr, nullptr});
  CHECK(h.act("pause").status == 200);
  CHECK(h.act("explode").status == 404);
  h.close();
  CHECK(h.act("pause").status == 409);
}

TEST_CASE("console: bytes that are not UTF-8 (a node's error, a setting, an event) are written as U+FFFD") {
  // tests/fuzz/fuzz_console found it: the first frame of GET /api/stream threw nlohmann's type_error 316
  // ("invalid UTF-8 byte") inside cpp-httplib's content provider, which ended the whole process; the other
  // documents answered 500.
  console::graph_info g;
  g.name = "g";
  g.nodes = {{"a", "src", 1, true, true, "", {{"path", "data/\xff.txt", false}}}};
  console::hub h(g);
  console::sample s;
  s.t_s = 1;
  s.phase = "gen\xfe";
  console::node_sample a{"a", 0, {}};
  console::replica_sample r;
  r.state = "failed";
  r.reason = "cannot open data/\xff.txt";
  r.errors = {{0.5, "\xc3("}};
  a.replicas.push_back(r);
  s.nodes = {a};
  s.events = {{1, 0.5, "failed", "a", 0, "bad \xfe byte"}};
  s.signals = {{1, 0.5, "a", 0, "phase", 0, "x\xff"}};
  h.publish(s);
  const std::string fffd = "\xef\xbf\xbd";
  std::uint64_t ev = 0, sig = 0;
  for (const std::string& doc : {h.graph_json(), h.status_json(), h.nodes_json(), *h.node_json("a"), h.events_json(0),
                                 h.signals_json(-1), h.frame_json(&ev, &sig)}) {
    CAPTURE(doc);
    CHECK_NOTHROW((void)json::parse(doc));
    CHECK(doc.find(fffd) != std::string::npos);
  }
  h.set_controls({[]() -> std::string { throw std::runtime_error("refused: \xff"); }, {}, {}, {}});
  const console::reply rep = h.act("pause");
  CHECK(rep.status == 409);
  CHECK(json::parse(rep.body)["error"] == "refused: " + fffd);
}

TEST_CASE("console: /api/cluster lists main and each node with heartbeat age, replicas and a lost one's reason") {
  console::graph_info g;
  g.name = "c";
  console::hub h(g);
  // before the first sample: main alone, no replica
  json empty = json::parse(h.cluster_json());
  CHECK(empty["main"]["name"] == "main");
  CHECK(empty["nodes"].empty());
  console::sample s;
  s.cluster.clustered = true;
  s.cluster.heartbeat_ms = 200;
  s.cluster.lost_after_ms = 2000;
  console::cluster_node_sample m;
  m.name = "main";
  m.cpus = 8;
  m.replicas = {"src", "sink"};
  console::cluster_node_sample w1;
  w1.name = "w1";
  w1.address = "10.0.0.2:7001";
  w1.cpus = 16;
  w1.gpus = 2;
  w1.tls = true;
  w1.state = "connected";
  w1.heartbeat_age_ms = 37;
  w1.replicas = {"gen[0]", "gen[1]"};
  console::cluster_node_sample w2 = w1;
  w2.name = "w2";
  w2.state = "lost";
  w2.lost_reason = "its connection dropped";
  w2.heartbeat_age_ms = -1;
  w2.replicas = {"tok"};
  console::cluster_node_sample w3;
  w3.name = "w3";
  w3.state = "unused";
  s.cluster.nodes = {m, w1, w2, w3};
  h.publish(s);
  json c = json::parse(h.cluster_json());
  CHECK(c["clustered"] == true);
  CHECK(c["heartbeat_ms"] == 200);
  CHECK(c["lost_after_ms"] == 2000);
  CHECK(c["main"]["cpus"] == 8);
  CHECK(c["main"]["replicas"] == json::array({"src", "sink"}));
  REQUIRE(c["nodes"].size() == 3);
  CHECK(c["nodes"][0]["name"] == "w1");
  CHECK(c["nodes"][0]["address"] == "10.0.0.2:7001");
  CHECK(c["nodes"][0]["gpus"] == 2);
  CHECK(c["nodes"][0]["tls"] == true);
  CHECK(c["nodes"][0]["state"] == "connected");
  CHECK(c["nodes"][0]["heartbeat_age_ms"] == 37);
  CHECK(c["nodes"][0]["heartbeat_age_ms"].is_number_integer());
  CHECK(c["nodes"][0]["replicas"] == json::array({"gen[0]", "gen[1]"}));
  CHECK(c["nodes"][1]["state"] == "lost");
  CHECK(c["nodes"][1]["lost_reason"] == "its connection dropped");
  CHECK(c["nodes"][1]["heartbeat_age_ms"].is_null());
  CHECK(c["nodes"][2]["state"] == "unused");
  // the stream's frames carry the same document
  std::uint64_t es = 0, ss = 0;
  CHECK(json::parse(h.frame_json(&es, &ss))["cluster"] == c);
}

TEST_CASE("console: node states rank the most telling replica first, tokens and addresses") {
  std::vector<console::replica_sample> rs(3);
  rs[0].state = "idle";
  rs[1].state = "waiting_credit";
  rs[2].state = "done";
  CHECK(console::node_state(rs) == "waiting_credit");
  rs[2].state = "failed";
  CHECK(console::node_state(rs) == "failed");
  CHECK(console::constant_time_equal("abc123", "abc123"));
  CHECK(!console::constant_time_equal("abc123", "abc124"));
  CHECK(!console::constant_time_equal("abc123", "abc1234"));
  CHECK(!console::constant_time_equal("", ""));
  const std::string t1 = console::random_token(), t2 = console::random_token();
  CHECK(t1.size() == 32);
  CHECK(t1.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(t1 != t2);
  CHECK(console::is_loopback_address("127.0.0.1"));
  CHECK(console::is_loopback_address("127.1.2.3"));
  CHECK(console::is_loopback_address("::1"));
  CHECK(console::is_loopback_address("localhost"));
  CHECK(!console::is_loopback_address("0.0.0.0"));
  CHECK(!console::is_loopback_address("10.0.0.1"));
}

TEST_CASE("console: console_port is read from [graph] and from --set graph.console_port") {
  auto p = graph::parse_graph_string("[graph]\nname = \"x\"\nconsole_port = 8123\n", "x.graph");
  REQUIRE(p.ok());
  CHECK(p.spec.console_port == 8123);
  auto none = graph::parse_graph_string("[graph]\nname = \"x\"\n", "x.graph");
  CHECK(none.spec.console_port == -1);
  auto bad = graph::parse_graph_string("[graph]\nname = \"x\"\nconsole_port = 70000\n", "x.graph");
  REQUIRE(!bad.ok());
  CHECK(bad.errors[0].line == 3);
  CHECK(bad.errors[0].message.find("console_port") != std::string::npos);
  auto ov = graph::parse_graph_string("[graph]\nname = \"x\"\n", "x.graph");
  CHECK(!graph::apply_override(ov.spec, "graph.console_port=0"));
  CHECK(ov.spec.console_port == 0);
  CHECK(graph::apply_override(ov.spec, "graph.console_port=-3"));
}

TEST_CASE("console: every endpoint of a live run, and the token rules") {
  c_work::failed_once() = false;
  live_run run(pipeline);
  CHECK(run.url == "http://127.0.0.1:" + std::to_string(run.port) + "/");
  CHECK(run.token.size() == 32);

  // the page and its files, from inside the binary
  {
    auto c = run.client();
    auto r = c.Get("/");
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->get_header_value("Content-Type").find("text/html") == 0);
    CHECK(r->body.find("<title>flowrun console</title>") != std::string::npos);
    // nothing from outside: no absolute URL but the SVG namespace
    auto outside = [](const std::string& text) {
      int n = 0;
      for (std::size_t at = text.find("http"); at != std::string::npos; at = text.find("http", at + 1))
        if (text.compare(at, 26, "http://www.w3.org/2000/svg") != 0 && text.compare(at, 5, "http:") == 0) ++n;
      for (std::size_t at = text.find("https:"); at != std::string::npos; at = text.find("https:", at + 1)) ++n;
      return n;
    };
    CHECK(outside(r->body) == 0);
    auto js = c.Get("/console.js");
    REQUIRE(js);
    CHECK(js->status == 200);
    CHECK(js->body.find("EventSource") != std::string::npos);
    CHECK(outside(js->body) == 0);
    auto css = c.Get("/console.css");
    REQUIRE(css);
    CHECK(css->status == 200);
    auto missing = c.Get("/api/nope");
    REQUIRE(missing);
    CHECK(missing->status == 404);
    CHECK(json::parse(missing->body)["error"].get<std::string>().find("GET /api lists them") != std::string::npos);
    // a known path with another method: 405 with the methods it takes (RFC 9110 sec. 15.5.6)
    auto get_pause = c.Get("/api/pause");
    REQUIRE(get_pause);
    CHECK(get_pause->status == 405);
    CHECK(get_pause->get_header_value("Allow") == "POST");
    CHECK(json::parse(get_pause->body)["error"] == "GET /api/pause is not allowed: it takes POST (GET /api lists the endpoints)");
    auto post_graph = c.Post("/api/graph", httplib::Headers{{"Authorization", "Bearer " + run.token}}, "", "text/plain");
    REQUIRE(post_graph);
    CHECK(post_graph->status == 405);
    CHECK(post_graph->get_header_value("Allow") == "GET, HEAD");
    auto post_node = c.Post("/api/nodes/work", httplib::Headers{{"Authorization", "Bearer " + run.token}}, "", "text/plain");
    REQUIRE(post_node);
    CHECK(post_node->status == 405);
    // loopback consoles answer only to loopback Host names (a DNS-rebinding guard)
    auto evil = c.Get("/api/status", httplib::Headers{{"Host", "evil.example:80"}});
    REQUIRE(evil);
    CHECK(evil->status == 403);
  }
  CHECK(run.get("/api")["endpoints"].size() >= 16);

  // the graph as written
  json g = run.get("/api/graph");
  CHECK(g["name"] == "console_test");
  REQUIRE(g["nodes"].size() == 3);
  CHECK(g["nodes"][0]["source"] == true);
  CHECK(g["nodes"][2]["terminal"] == true);
  REQUIRE(g["replica_groups"].size() == 1);
  CHECK(g["replica_groups"][0]["node"] == "work");
  CHECK(g["replica_groups"][0]["members"][1] == "work[1]");
  REQUIRE(g["edges"].size() == 2);
  CHECK(g["edges"][0]["dispatch"] == "round_robin");
  CHECK(g["edges"][0]["transport"] == "in-process");
  CHECK(g["edges"][0]["credit"] == 8);
  const json* wn = find_by(g["nodes"], "name", "work");
  REQUIRE(wn);
  CHECK(find_by((*wn)["settings"], "key", "work_ms"));

  // without a cluster: /api/cluster holds only main, with every replica
  json cl = run.wait_for("/api/cluster", [](const json& j) { return !j["main"]["replicas"].empty(); });
  CHECK(cl["clustered"] == false);
  CHECK(cl["nodes"].empty());
  CHECK(cl["main"]["name"] == "main");
  CHECK(cl["main"]["replicas"] == json::array({"src", "work[0]", "work[1]", "sink"}));
  CHECK(cl["main"]["cpus"].get<std::int64_t>() >= 1);

  // live: nodes turn busy and rates become non-zero
  json nodes = run.wait_for("/api/nodes", [](const json& j) {
    const json* w = find_by(j["nodes"], "name", "work");
    return w && (*w)["rates"]["handled_per_s"].get<double>() > 0 && (*w)["load"]["busy_ms_per_s"].get<double>() > 0;
  });
  const json* w = find_by(nodes["nodes"], "name", "work");
  CHECK((*w)["replicas"] == 2);
  CHECK((*w)["replica_states"].size() == 2);
  CHECK((*w)["load"].contains("mailbox_depth"));
  CHECK((*w)["load"].contains("idle_ms_per_s"));
  CHECK((*w)["load"].contains("outstanding"));
  json status = run.get("/api/status");
  CHECK(status["run_state"] == "running");
  CHECK(status["graph"] == "console_test");
  CHECK(status["tokens_per_s"].get<double>() >= 0);
  json edges = run.wait_for("/api/edges", [](const json& j) { return j["edges"][0]["msgs_per_s"].get<double>() > 0; });
  CHECK(edges["edges"][0]["bytes_per_s"].get<double>() > 0);
  // the worker (2 x 8 ms per item, fed every 3 ms) is the bottleneck
  json bn = run.wait_for("/api/bottlenecks?n=2", [](const json& j) { return j["nodes"][0]["name"] == "work"; });
  CHECK(bn["nodes"].size() == 2);

  // one node in detail: settings, counters, replicas, the restart's error
  json d = run.wait_for("/api/nodes/work", [](const json& j) { return !j["recent_errors"].empty(); });
  CHECK(d["kind"] == "c_work");
  CHECK(find_by(d["settings"], "key", "fail_at"));
  CHECK(d["counters"].contains("tokens"));
  CHECK(d["replicas_detail"].size() == 2);
  CHECK(d["recent_errors"][0]["text"].get<std::string>().find("injected failure at 5") != std::string::npos);
  CHECK(d["replicas_detail"][0]["memory_bytes"]["params"] == 1000);
  {
    auto c = run.client();
    auto r = c.Get("/api/nodes/nope");
    REQUIRE(r);
    CHECK(r->status == 404);
  }

  // training signals, phases, memory per rank, the event log
  json sig = run.wait_for("/api/signals", [](const json& j) { return !j["series"].empty() && !j["phases"].empty(); });
  const json* loss = find_by(sig["series"], "name", "loss");
  REQUIRE(loss);
  CHECK((*loss)["node"] == "work");
  CHECK(!(*loss)["points"].empty());
  CHECK((sig["phase"] == "training" || sig["phase"] == "scoring"));
  json mem = run.get("/api/memory");
  REQUIRE(mem["ranks"].size() == 2);
  CHECK(mem["ranks"][1]["rank"] == "work[1]");
  CHECK(mem["ranks"][1]["total_bytes"] == 3001);
  CHECK(mem["rss_bytes"].get<std::int64_t>() > 0);
  json ev = run.get("/api/events");
  std::set<std::string> kinds;
  for (const auto& e : ev["events"]) kinds.insert(e["kind"].get<std::string>());
  CHECK(kinds.count("spawn"));
  CHECK(kinds.count("start"));
  CHECK(kinds.count("restart"));
  CHECK(kinds.count("run"));
  const std::uint64_t last = ev["last_seq"];
  CHECK(run.get("/api/events?since=" + std::to_string(last))["events"].empty());

  // the event stream: frames as Server-Sent Events
  {
    auto c = run.client();
    std::string buf;
    int frames = 0;
    auto r = c.Get("/api/stream", [&](const char* data, std::size_t n) {
      buf.append(data, n);
      std::size_t at = 0;
      frames = 0;
      while ((at = buf.find("event: frame\ndata: ", at)) != std::string::npos) ++frames, ++at;
      return frames < 2;
    });
    CHECK(frames >= 2);
    const auto start = buf.find("event: frame\ndata: ") + 19;
    json f = json::parse(buf.substr(start, buf.find("\n\n", start) - start));
    CHECK(f.contains("status"));
    CHECK(f["nodes"].size() == 3);
    CHECK(f.contains("bottlenecks"));
  }

  // state-changing requests need the token: none -> 401, a wrong one -> 403
  std::string body;
  for (const char* a : {"/api/pause", "/api/resume", "/api/stop", "/api/checkpoint"}) {
    CHECK(run.post(a, "", &body) == 401);
    CHECK(body.find("token") != std::string::npos);
    CHECK(run.post(a, "0123456789abcdef0123456789abcdef") == 403);
  }
  CHECK(run.get("/api/status")["run_state"] == "running");  // none of them did anything
  // another method on a path that changes nothing: 405 (or 404) without the token on loopback, as the docs
  // say (it was 401, "this request changes the run's state")
  for (const auto& [line, want] : std::vector<std::pair<std::string, std::string>>{
           {"POST /api/graph", "HTTP/1.1 405"}, {"DELETE /api/status", "HTTP/1.1 405"}, {"PUT /api/pause", "HTTP/1.1 405"},
           {"POST /api/nosuch", "HTTP/1.1 404"}, {"POST /api/stop", "HTTP/1.1 401"}}) {
    const std::string a = raw_http(run.port, {line + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"});
    INFO(line << ": " << a);
    CHECK(a.rfind(want, 0) == 0);
  }
  CHECK(run.get("/api/status")["run_state"] == "running");

  // pause: nothing is produced until resume
  CHECK(run.post("/api/pause", run.token, &body) == 200);
  CHECK(json::parse(body)["ok"] == true);
  run.wait_for("/api/status", [](const json& j) { return j["run_state"] == "paused"; });
  run.wait_for("/api/nodes", [](const json& j) { return (*find_by(j["nodes"], "name", "src"))["state"] == "paused"; });
  std::this_thread::sleep_for(300ms);
  const std::int64_t p0 = produced_by(run.get("/api/nodes"), "src");
  std::this_thread::sleep_for(500ms);
  CHECK(produced_by(run.get("/api/nodes"), "src") == p0);
  // a second pause says the run is paused already (it answered "pausing" again)
  CHECK(run.post("/api/pause", run.token, &body) == 200);
  CHECK_MESSAGE(body.find("already paused") != std::string::npos, body);
  CHECK(run.post("/api/resume", run.token) == 200);
  run.wait_for("/api/nodes", [&](const json& j) { return produced_by(j, "src") > p0 + 5; });
  CHECK(run.get("/api/status")["run_state"] == "running");
  CHECK(run.post("/api/resume", run.token, &body) == 200);  // a resume of a running run says so
  CHECK_MESSAGE(body.find("not paused") != std::string::npos, body);
  // the replies go by the requests, not the run's phase, which lags them: a pause right after a resume was refused
  // as "already paused" and the run went on
  CHECK(run.post("/api/pause", run.token, &body) == 200);
  CHECK(run.post("/api/resume", run.token, &body) == 200);
  CHECK(run.post("/api/pause", run.token, &body) == 200);
  CHECK_MESSAGE(body.find("pausing") != std::string::npos, body);
  run.wait_for("/api/status", [](const json& j) { return j["run_state"] == "paused"; });
  CHECK(run.post("/api/resume", run.token, &body) == 200);
  CHECK_MESSAGE(body.find("resuming") != std::string::npos, body);
  run.wait_for("/api/status", [](const json& j) { return j["run_state"] == "running"; });
  // a query parameter that is not a number of its range is a 400 naming it (it was taken as the default);
  // a host name in another case is the same host (RFC 3986 3.2.2)
  for (const auto& [path, want] : std::vector<std::pair<std::string, std::string>>{
           {"/api/bottlenecks?n=0", "HTTP/1.1 400"}, {"/api/bottlenecks?n=abc", "HTTP/1.1 400"},
           {"/api/bottlenecks?n=1.5", "HTTP/1.1 400"}, {"/api/bottlenecks?n=1000", "HTTP/1.1 200"},
           {"/api/signals?since=nan", "HTTP/1.1 400"}, {"/api/signals?since=abc", "HTTP/1.1 400"},
           {"/api/signals?since=1.5", "HTTP/1.1 200"}, {"/api/events?since=1.5", "HTTP/1.1 400"},
           {"/api/events?since=-1", "HTTP/1.1 400"}, {"/api/events?since=3", "HTTP/1.1 200"}}) {
    const std::string a = raw_http(run.port, {"GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"});
    INFO(path << ": " << a);
    CHECK(a.rfind(want, 0) == 0);
    if (want == "HTTP/1.1 400") CHECK(a.find("query parameter ") != std::string::npos);
  }
  CHECK(raw_http(run.port, {"GET /api/status HTTP/1.1\r\nHost: LocalHost:1\r\n\r\n"}).rfind("HTTP/1.1 200", 0) == 0);

  // checkpoint: the source polls checkpoint_requested() and honours it
  CHECK(run.post("/api/checkpoint", run.token, &body) == 200);
  CHECK(json::parse(body)["message"].get<std::string>().find("src") != std::string::npos);
  run.wait_for("/api/events", [](const json& j) {
    for (const auto& e : j["events"])
      if (e["kind"] == "checkpoint" && e["node"] == "src") return true;
    return false;
  });

  // A POST with no body and no Content-Length (`curl -X POST`) is answered at once, not after the 5 s
  // read timeout; a declared body is read and ignored, and the kept-alive connection serves the next request.
  {
    double ms = 0;
    const std::string auth = "Host: 127.0.0.1\r\nAuthorization: Bearer " + run.token + "\r\n";
    const std::string r = raw_http(run.port, {"POST /api/checkpoint HTTP/1.1\r\n" + auth + "\r\n"}, &ms);
    INFO(r);
    CHECK(r.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(ms < 2000);
    const std::string two = raw_http(run.port, {"POST /api/checkpoint HTTP/1.1\r\n" + auth + "Content-Length: 5\r\n\r\nhello",
                                                "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"});
    INFO(two);
    CHECK(two.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(two.find("HTTP/1.1 200", 1) != std::string::npos);
    CHECK(two.find("run_state") != std::string::npos);
    // the same for a path that takes another method, and for no path at all: 405 / 404 at once (they
    // waited the 5 s read timeout, then said 400)
    for (const auto& [line, want] : std::vector<std::pair<std::string, std::string>>{
             {"POST /api/graph", "HTTP/1.1 405"}, {"PUT /api/pause", "HTTP/1.1 405"}, {"POST /api/nosuch", "HTTP/1.1 404"}}) {
      double t = 0;
      const std::string a = raw_http(run.port, {line + " HTTP/1.1\r\n" + auth + "\r\n"}, &t);
      INFO(line << ": " << a);
      CHECK(a.rfind(want, 0) == 0);
      CHECK(t < 2000);
    }
  }
  // A node name that decodes to bytes that are not UTF-8 is a 404 with a message, not a 500
  {
    auto c = run.client();
    auto r = c.Get("/api/nodes/%ff");
    REQUIRE(r);
    CHECK(r->status == 404);
    CHECK(json::parse(r->body)["error"].get<std::string>().find("no node called") == 0);
  }

  // stop: drains like SIGINT; the run ends with 130
  CHECK(run.post("/api/stop", run.token, &body) == 200);
  REQUIRE(run.done.wait_for(20s) == std::future_status::ready);
  run_result rr = run.done.get();
  CHECK(rr.exit_code == exit_sigint);
  CHECK(rr.reason == stop_reason::interrupted);
  // the console is gone with the run
  auto c = run.client();
  c.set_connection_timeout(1, 0);
  CHECK(!c.Get("/api/status"));
}

TEST_CASE("console: replies go out without Nagle's delay, from threads below the run's priority") {
  // bench/console_load.sh (docs/reliability.md, "Console under load"): without TCP_NODELAY each reply's
  // body waited about 40 ms for the ACK of its head (a client's delayed ACK); at the run's priority, a
  // client polling as fast as it could took 40% of a 2-core machine's training throughput.
  c_work::failed_once() = false;
  live_run run(pipeline);
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(run.port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  sockaddr_in mine{};
  socklen_t mine_len = sizeof mine;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&mine), &mine_len) == 0);
  timeval tv{5, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  REQUIRE(::send(s, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[4096];
  while (got.find("\r\n\r\n") == std::string::npos) {
    const auto n = ::recv(s, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
  // the server's end of this (kept-alive) connection lives in this process: TCP_NODELAY is on
  int server_nodelay = -1;  // -1: the server's end was not found
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(e.path().filename().string());
    sockaddr_in local{}, peer{};
    socklen_t l1 = sizeof local, l2 = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &l1) != 0 || local.sin_family != AF_INET) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &l2) != 0) continue;
    if (ntohs(local.sin_port) != run.port || peer.sin_port != mine.sin_port) continue;
    int on = 0;
    socklen_t on_len = sizeof on;
    REQUIRE(::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &on_len) == 0);
    server_nodelay = on != 0 ? 1 : 0;
  }
  ::close(s);
  CHECK(server_nodelay == 1);
  // the thread that answered lowered its own nice value by 10 (at most 19): proc(5) stat field 19
  errno = 0;
  const int base = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  REQUIRE(errno == 0);
  int lowered = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(e.path() / "stat");
    std::string st;
    std::getline(f, st);
    std::istringstream rest(st.substr(st.rfind(')') + 2));  // from field 3 (state) on
    std::vector<std::string> v;
    for (std::string x; rest >> x;) v.push_back(x);
    if (v.size() > 16 && std::stoi(v[16]) == std::min(19, base + 10)) ++lowered;
  }
  INFO("this thread's nice value: " << base);
  if (base < 19) CHECK(lowered >= 1);
}

TEST_CASE("console: a failed node shows failed with its reason, linger keeps the final state") {
  console_options co;
  co.linger_s = 4;
  live_run run(R"(
edges = ["src.out -> work.in"]
[graph]
name = "failing"
[node.src]
kind = "c_src"
period_ms = 1
[node.work]
kind = "c_work"
work_ms = 0
fail_at = 3
fail_always = true
)",
               co);
  json s = run.wait_for("/api/status", [](const json& j) { return j["finished"] == true; });
  CHECK(s["exit_code"] == 1);
  CHECK(s["run_state"] == "finished");
  CHECK(s["error"].get<std::string>().find("injected failure at 3") != std::string::npos);
  json w = run.get("/api/nodes/work");
  CHECK(w["state"] == "failed");
  // the run is over: nothing flows, so no node shows a rate or load (the last window's stayed: a stopped
  // node at BUSY 1000 and 1644 tokens/s)
  for (const auto& n : run.get("/api/nodes")["nodes"]) {
    INFO(n.dump());
    CHECK(n["rates"]["handled_per_s"].get<double>() == 0);
    CHECK(n["rates"]["msgs_out_per_s"].get<double>() == 0);
    CHECK(n["load"]["busy_ms_per_s"].get<double>() == 0);
  }
  CHECK(w["reason"].get<std::string>().find("injected failure at 3") != std::string::npos);
  json ev = run.get("/api/events");
  std::set<std::string> kinds;
  for (const auto& e : ev["events"]) kinds.insert(e["kind"].get<std::string>());
  CHECK(kinds.count("failed"));
  CHECK(kinds.count("down"));
  std::string body;
  CHECK(run.post("/api/pause", run.token, &body) == 409);
  CHECK(body.find("finished") != std::string::npos);
  // a stream opened during the linger: one frame, then "end" with the final status, and it closes, while
  // the server still serves (it sent keep-alives until the linger ended)
  {
    auto c = run.client();
    c.set_read_timeout(10, 0);
    std::string buf;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Get("/api/stream", [&](const char* data, std::size_t n) {
      buf.append(data, n);
      return true;
    });
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(buf);
    CHECK(r);
    CHECK(took < 3.0);
    const auto end = buf.find("event: end\ndata: ");
    REQUIRE(end != std::string::npos);
    CHECK(buf.find("event: frame") < end);
    json fin = json::parse(buf.substr(end + 17, buf.find("\n\n", end) - end - 17));
    CHECK(fin["run_state"] == "finished");
    CHECK(fin["exit_code"] == 1);
    CHECK(run.done.wait_for(0s) != std::future_status::ready);  // still lingering
  }
  REQUIRE(run.done.wait_for(20s) == std::future_status::ready);
  CHECK(run.done.get().exit_code == exit_failed);
}

TEST_CASE("console: without a linger, every open stream still gets the final frame and end before the server stops") {
  // the server stopped as the run ended, and most streams closed with neither the final frame nor `end`
  // (2 of 4 runs of a tiny sft; a page then showed "conn lost" and retried)
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    live_run run(R"(
edges = ["src.out -> sink.in"]
[graph]
name = "short"
[node.src]
kind = "c_src"
period_ms = 3
count = 600
[node.sink]
kind = "c_sink"
)");
    constexpr int n_streams = 4;
    std::vector<std::string> bufs(n_streams);
    std::vector<std::thread> readers;
    std::atomic<int> open{0};
    for (int i = 0; i < n_streams; ++i)
      readers.emplace_back([&, i] {
        auto c = run.client();
        ++open;
        c.Get("/api/stream", [&](const char* data, std::size_t n) {
          bufs[i].append(data, n);
          return true;
        });
      });
    for (auto& t : readers) t.join();
    REQUIRE(run.done.wait_for(20s) == std::future_status::ready);
    CHECK(run.done.get().exit_code == 0);
    for (const auto& buf : bufs) {
      INFO(buf.substr(buf.size() > 600 ? buf.size() - 600 : 0));
      const auto end = buf.rfind("event: end\ndata: ");
      REQUIRE(end != std::string::npos);
      const json fin = json::parse(buf.substr(end + 17, buf.find("\n\n", end) - end - 17));
      CHECK(fin["run_state"] == "finished");
      CHECK(fin["exit_code"] == 0);
      // the last frame before it says the run finished, as `end` does
      const auto last = buf.rfind("event: frame\ndata: ", end);
      REQUIRE(last != std::string::npos);
      const json frame = json::parse(buf.substr(last + 19, buf.find("\n\n", last) - last - 19));
      CHECK(frame["status"]["finished"] == true);
    }
  }
}

TEST_CASE("console: a console on a non-loopback address needs the token for every request but the page's script and style") {
  console_options co;
  co.bind = "0.0.0.0";
  co.token = "s3cret-token-for-the-test";
  live_run run(R"(
edges = ["src.out -> sink.in"]
[graph]
name = "open"
[node.src]
kind = "c_src"
period_ms = 5
[node.sink]
kind = "c_sink"
)",
               co);
  CHECK(run.token == "s3cret-token-for-the-test");
  CHECK(run.url.rfind("http://127.0.0.1:", 0) == 0);
  auto c = run.client();
  for (const char* path : {"/", "/api/status", "/api/graph", "/api/stream"}) {
    auto r = c.Get(path);
    REQUIRE(r);
    CHECK(r->status == 401);
  }
  auto wrong = c.Get("/api/status", httplib::Headers{{"Authorization", "Bearer nope"}});
  REQUIRE(wrong);
  CHECK(wrong->status == 403);
  auto ok = c.Get("/api/status", httplib::Headers{{"Authorization", "Bearer s3cret-token-for-the-test"}});
  REQUIRE(ok);
  CHECK(ok->status == 200);
  auto q = c.Get("/api/graph?token=s3cret-token-for-the-test");
  REQUIRE(q);
  CHECK(q->status == 200);
  auto x = c.Get("/api/status", httplib::Headers{{"X-Flowrun-Token", "s3cret-token-for-the-test"}});
  REQUIRE(x);
  CHECK(x->status == 200);
  // the page's script and style (code, no run data) come without the token: the browser asks for
  // them without the ?token the page was opened with, so the page would load bare otherwise
  for (const char* path : {"/console.js", "/console.css"}) {
    auto r = c.Get(path);
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(!r->body.empty());
  }
  auto post = c.Post("/console.js");
  REQUIRE(post);
  CHECK(post->status == 401);
}

TEST_CASE("console: a port already in use is refused before anything runs, naming the port and the fix") {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(s, 1) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int port = ntohs(a.sin_port);

  kinds_and_factories kf;
  run_options ro;
  ro.console.enabled = true;
  ro.console.port = port;
  ro.progress = false;
  g_starts = 0;
  run_result r = run_graph(spec_of(kf, pipeline), kf.kinds, kf.factories, ro);
  ::close(s);
  CHECK(r.exit_code == exit_failed);
  INFO(r.error);
  CHECK(r.error.find("port " + std::to_string(port) + " on 127.0.0.1 is already in use") != std::string::npos);
  CHECK(r.error.find("--console") != std::string::npos);
  CHECK(r.error.find("--no-console") != std::string::npos);
  CHECK(g_starts == 0);  // nothing ran
}

TEST_CASE("console: a document is rendered once per sample, and every change of state renders it again") {
  // bench/console_load.sh: a client polling faster than samples arrive made the console render each document
  // per request (about 240 us of a core each); now it copies the sample's rendering.
  console::graph_info g;
  g.name = "g";
  g.nodes = {{"a", "src", 1, true, true, "", {}}};
  console::hub h(g);
  auto sample_at = [](double t, std::uint64_t n) {
    console::sample s;
    s.t_s = t;
    console::node_sample a{"a", 0, {}};
    console::replica_sample r;
    r.state = "busy";
    r.produced = n;
    r.msgs_out = n;
    a.replicas.push_back(r);
    s.nodes = {a};
    s.signals.push_back({n, t, "a", 0, "loss", 1.0 / static_cast<double>(n), ""});
    s.events.push_back({n, t, "spawn", "a", 0, "event " + std::to_string(n)});
    return s;
  };
  h.publish(sample_at(1.0, 1));
  const std::string nodes1 = h.nodes_json(), status1 = h.status_json(), events1 = h.events_json(0);
  CHECK(h.nodes_json() == nodes1);  // the same sample: the same bytes
  CHECK(h.status_json() == status1);
  h.publish(sample_at(2.0, 2));
  CHECK(h.nodes_json() != nodes1);  // a new sample renders again
  CHECK(json::parse(h.nodes_json())["nodes"][0]["totals"]["produced"] == 2);
  CHECK(json::parse(h.status_json())["frame"] == json::parse(status1)["frame"].get<int>() + 1);
  CHECK(json::parse(h.events_json(0))["events"].size() == json::parse(events1)["events"].size() + 1);
  // arguments are part of the key, exactly: since = 1.0 and since = 1.0 - 1e-9 are different documents
  CHECK(json::parse(h.events_json(1))["events"].size() == 1);
  const auto points = [&](double since) {
    const json doc = json::parse(h.signals_json(since));
    for (const auto& s : doc["series"])
      if (s["name"] == "loss") return s["points"].size();
    return std::size_t{0};
  };
  CHECK(points(0.0) == 2);
  CHECK(points(1.0) == 1);
  CHECK(points(1.0 - 1e-9) == 2);
}

// on_node_lost = "restart" starts a new job, whose events and signals count from 1 again: the console's numbers
// started again with them (GET /api/events listed 1..13 then 1..6, and a client asking since 13 got nothing).
TEST_CASE("console: a restarted run's events and signals are numbered after the earlier attempts'") {
  kinds_and_factories kf;
  const graph::graph_spec spec = spec_of(kf, pipeline);
  console_options co;
  co.enabled = true;
  co.on_ready = [](const std::string&, const std::string&) {};
  console_session session(spec, co, 8);
  session.announce();
  const metrics_snapshot m;
  job_live first;
  for (int i = 0; i < 3; ++i) first.event("note", "work", 0, "first attempt " + std::to_string(i));
  first.signal("work", 0, "loss", 1.0, 1);
  session.sample(m, first);
  session.new_attempt();
  job_live second;  // the restarted job's own numbers: 1, 2
  second.event("note", "work", 0, "second attempt 0");
  second.event("note", "work", 0, "second attempt 1");
  second.signal("work", 0, "loss", 0.5, 2);
  session.sample(m, second);
  httplib::Client c("127.0.0.1", session.port());
  auto r = c.Get("/api/events?since=0", httplib::Headers{{"Authorization", "Bearer " + session.token()}});
  REQUIRE(r);
  REQUIRE(r->status == 200);
  std::vector<std::uint64_t> seqs;
  const json all = json::parse(r->body);
  for (const auto& e : all.at("events")) seqs.push_back(e.at("seq").get<std::uint64_t>());
  INFO(r->body);
  CHECK(seqs == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
  auto since = c.Get("/api/events?since=3", httplib::Headers{{"Authorization", "Bearer " + session.token()}});
  REQUIRE(since);
  const json later = json::parse(since->body).at("events");
  REQUIRE(later.size() == 2);
  CHECK(later[0].at("text") == "second attempt 0");
  session.close();
}
