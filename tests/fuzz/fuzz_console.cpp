// Fuzz target: the live console's HTTP API (runtime/console/server.cpp and the
// hub's documents): raw request bytes go over a loopback TCP connection to a
// real console server (cpp-httplib, the token and Host checks, every route,
// query parameters, POST bodies, pipelined requests).
//
// Input: raw HTTP/1.1 bytes, sent whole; then the client closes its sending
// side and reads until the server closes the connection. If the input starts
// with '#', that byte is dropped and the request goes to a second console whose
// run has finished (its event stream ends at once); the first console's run is
// live (controls answer) and it allows no event stream (503), so that no
// request can keep a connection open. The token is "fuzztoken".
// Checks beyond "no crash": the server closes the connection within 3 s of the
// request's end (a stall is reported as a crash: the console must answer at once).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "runtime/console/hub.h"
#include "runtime/console/server.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;
using namespace flowrun::console;

namespace {

graph_info small_graph() {
  graph_info g;
  g.name = "fuzz";
  g.file = "fuzz.graph";
  g.seed = 7;
  g.steps = 10;
  node_info src;
  src.name = "src";
  src.kind = "text_source";
  src.source = true;
  src.settings = {{"path", "data/ \"quoted\" \xff.txt", false}, {"lines", "4", true}};
  node_info gen;
  gen.name = "gen";
  gen.kind = "generator";
  gen.replicas = 2;
  gen.terminal = true;
  gen.on = "main";
  g.nodes = {src, gen};
  edge_info e;
  e.name = "src.lines -> gen.text";
  e.from = "src";
  e.from_port = "lines";
  e.to = "gen";
  e.to_port = "text";
  e.dispatch = "round_robin";
  e.credit = 4;
  e.links = 2;
  g.edges = {e};
  return g;
}

sample small_sample(double t) {
  sample s;
  s.t_s = t;
  s.phase = "generation";
  s.steps = 3;
  s.rss_bytes = 1 << 20;
  node_sample a;
  a.name = "src";
  a.replicas.resize(1);
  a.replicas[0].state = "busy";
  a.replicas[0].msgs_out = 10 * static_cast<std::uint64_t>(t + 1);
  a.replicas[0].counters = {{"lines", 10}};
  node_sample b;
  b.name = "gen";
  b.replicas.resize(2);
  b.replicas[1].state = "failed";
  b.replicas[1].reason = "injected \xfe failure";
  b.replicas[1].errors = {{t, "boom"}};
  b.replicas[0].memory = {{"params", 4096}};
  s.nodes = {a, b};
  edge_sample e;
  e.name = "src.lines -> gen.text";
  e.sent = 10;
  e.credit = 4;
  s.edges = {e};
  s.events = {{1, t, "spawn", "gen", 1, "started"}};
  s.signals = {{1, t, "gen", 0, "loss", 0.5, ""}, {2, t, "gen", 0, "phase", 0, "generation"}};
  s.cluster.nodes = {{"main", "", 2, 0, false, "local", -1, "", {"src", "gen[0]", "gen[1]"}}};
  return s;
}

struct console_under_test {
  std::shared_ptr<hub> h;
  std::unique_ptr<server> srv;
  console_under_test(bool finished) {
    h = std::make_shared<hub>(small_graph());
    h->set_controls({[] { return std::string("paused"); }, [] { return std::string("resumed"); },
                     [] { return std::string("stopping"); },
                     []() -> std::string { throw std::runtime_error("no node can checkpoint"); }});
    h->publish(small_sample(0.5));
    h->publish(small_sample(1.5));
    if (finished) h->close();
    server_options o;
    o.token = "fuzztoken";
    o.threads = 4;
    o.max_streams = finished ? 8 : 0;
    srv = std::make_unique<server>(h, o);
    srv->start();
  }
};

// Sends `req`, half-closes, reads until the server closes. False after 3 s without the close.
bool exchange(int port, std::string_view req) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return true;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return true;
  }
  std::size_t sent = 0;
  while (sent < req.size()) {
    const auto n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early (e.g. a 400 on a bad request line)
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  char buf[16384];
  bool closed = false;
  while (!closed) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const auto n = ::recv(fd, buf, sizeof buf, 0);
    closed = n <= 0;
  }
  ::close(fd);
  return closed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static console_under_test live(false), finished(true);
  std::string_view req = fuzz::as_text(data, size);
  console_under_test* c = &live;
  if (!req.empty() && req[0] == '#') {
    c = &finished;
    req.remove_prefix(1);
  }
  if (!exchange(c->srv->port(), req)) {
    std::fprintf(stderr, "the console did not close the connection within 3 s of the request's end\n");
    __builtin_trap();
  }
  return 0;
}
