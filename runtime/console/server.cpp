#include "runtime/console/server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>

#include "runtime/console/console_assets.h"  // generated from page/ (CMakeLists.txt)
#include "runtime/console/hub.h"

namespace flowrun::console {

using json = nlohmann::json;

namespace {

// The console's request threads: cpp-httplib's ThreadPool whose threads lower their own priority
// (nice + 10, at most 19; Linux keeps a nice value per thread) before their first request. A client
// that polls as fast as it can then gets the cores the run leaves idle instead of taking them from
// the training: bench/console_load.sh, wrk -t1 -c8 at about 4,000 requests/s, took 40% of a 2-core
// machine's training throughput at the run's own priority (docs/reliability.md, "Console under load").
class background_pool final : public httplib::TaskQueue {
 public:
  explicit background_pool(std::size_t n) : pool_(n) {}
  void enqueue(std::function<void()> fn) override {
    pool_.enqueue([fn = std::move(fn)] {
      thread_local const bool lowered = lower_this_thread();
      (void)lowered;
      fn();
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  static bool lower_this_thread() {
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int now = ::getpriority(PRIO_PROCESS, tid);
    if (errno != 0) return false;
    return ::setpriority(PRIO_PROCESS, tid, std::min(19, now + 10)) == 0;
  }
  httplib::ThreadPool pool_;
};

}  // namespace

bool is_loopback_address(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

std::string random_token() {
  unsigned char bytes[16] = {};
  bool ok = false;
  if (std::ifstream f{"/dev/urandom", std::ios::binary})
    ok = static_cast<bool>(f.read(reinterpret_cast<char*>(bytes), sizeof bytes));
  if (!ok) {
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<unsigned char>(rd());
  }
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (unsigned char b : bytes) {
    t += hex[b >> 4];
    t += hex[b & 15];
  }
  return t;
}

namespace {

// Tries to bind `host`:`port` (as the server will) and explains a failure.
void probe_bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    throw console_error("console: cannot use the address '" + host + "' (" + gai_strerror(rc) +
                        "): give a local address with --console-bind, e.g. 127.0.0.1");
  int err = 0;
  bool ok = false;
  for (addrinfo* ai = res; ai && !ok; ai = ai->ai_next) {
    int s = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (s < 0) {
      err = errno;
      continue;
    }
    int yes = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(s, ai->ai_addr, ai->ai_addrlen) == 0)
      ok = true;
    else
      err = errno;
    ::close(s);
  }
  freeaddrinfo(res);
  if (ok) return;
  const std::string where = "port " + std::to_string(port) + " on " + host;
  const char* nproc = std::getenv("FLOWRUN_NPROC");  // a process of `flowrun launch --nproc P`
  if (err == EADDRINUSE && nproc && std::atoi(nproc) > 1)
    throw console_error("console: " + where +
                        " is already in use: under flowrun launch every process serves a console of its own, and "
                        "another of this launch's processes (or another program) took the port; give each its own: "
                        "--run-arg=--console=0 (a free port each, printed by each process)");
  if (err == EADDRINUSE)
    throw console_error("console: " + where +
                        " is already in use (another flowrun run or another program listens there; `ss -ltnp "
                        "'sport = :" +
                        std::to_string(port) +
                        "'` shows which): choose another port with --console PORT "
                        "(or console_port in the graph's [graph] table), use --console 0 for a free port, or turn the "
                        "console off with --no-console");
  if (err == EACCES)
    throw console_error("console: " + where +
                        ": permission denied (ports below 1024 need privileges): choose a port "
                        "above 1024 with --console PORT, or --console 0 for a free one");
  if (err == EADDRNOTAVAIL)
    throw console_error("console: " + where +
                        ": the address is not one of this machine's: use --console-bind 127.0.0.1");
  throw console_error("console: cannot listen on " + where + ": " + std::strerror(err));
}

// "Host: 127.0.0.1:8080" -> "127.0.0.1"; "[::1]:80" -> "::1".
std::string host_of(const std::string& h) {
  if (!h.empty() && h[0] == '[') {
    auto e = h.find(']');
    return e == std::string::npos ? h : h.substr(1, e - 1);
  }
  auto c = h.find(':');
  return c == std::string::npos ? h : h.substr(0, c);
}

void send_json(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body, "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  // The message may quote the request (a path segment decoded from %ff is not UTF-8): replace such bytes
  // rather than let nlohmann's dump throw (which httplib turned into a bare 500).
  send_json(res, status,
            json{{"error", message}, {"status", status}}.dump(-1, ' ', false, json::error_handler_t::replace));
}

// Reads and drops a request's body when it declares one (Content-Length or chunked), so a kept-alive
// connection stays in step; a request that declares none has none (RFC 9112 sec. 6.3), and is not
// waited for: cpp-httplib 0.11 would read it until the connection closes (a `curl -X POST` stalled for
// the 5 s read timeout, then got 400). For the handlers that take a content reader.
void skip_body(const httplib::Request& req, const httplib::ContentReader& content) {
  if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding"))
    content([](const char*, std::size_t) { return true; });
}

// A query parameter that is a number: absent -> `dflt`; a number in [lo, hi] (a whole one when `whole`)
// -> it; anything else (abc, 1.5 for a sequence number, nan, 0 for n) -> false, with a 400 naming the
// parameter and its range in `res` (it was taken as the default, silently).
bool query_number(const httplib::Request& req, httplib::Response& res, const char* name, double dflt, double lo,
                  double hi, bool whole, double& out) {
  out = dflt;
  if (!req.has_param(name)) return true;
  const std::string v = req.get_param_value(name);
  char* end = nullptr;
  errno = 0;
  const double x = v.empty() ? std::nan("") : std::strtod(v.c_str(), &end);
  if (std::isfinite(x) && errno == 0 && end && *end == '\0' && x >= lo && x <= hi && (!whole || x == std::floor(x))) {
    out = x;
    return true;
  }
  char range[96];
  std::snprintf(range, sizeof range, " from %.15g to %.15g", lo, hi);
  send_error(res, 400,
             "query parameter " + std::string(name) + "='" + v + "' is not " + (whole ? "a whole number" : "a number") +
                 range + " (GET /api lists the endpoints)");
  return false;
}

// The paths of the controls, the only requests that change the run's state (POST).
const char* const control_paths = R"(/api/(pause|resume|stop|checkpoint))";

const char* const api_index = R"json({
  "endpoints": [
    {"method": "GET", "path": "/", "what": "the web page"},
    {"method": "GET", "path": "/api", "what": "this list"},
    {"method": "GET", "path": "/api/graph", "what": "the graph as written: nodes, replica groups, edges"},
    {"method": "GET", "path": "/api/status", "what": "the run: state, phase, progress, tokens/s, signals"},
    {"method": "GET", "path": "/api/nodes", "what": "live state, rates and load of every node"},
    {"method": "GET", "path": "/api/nodes/NAME", "what": "one node: settings, counters, replicas, errors"},
    {"method": "GET", "path": "/api/edges", "what": "rates, in flight and outstanding age of every edge"},
    {"method": "GET", "path": "/api/bottlenecks?n=5", "what": "the top-n nodes by busy share and upstream waiting"},
    {"method": "GET", "path": "/api/signals?since=T", "what": "training signals over time, and phases"},
    {"method": "GET", "path": "/api/memory", "what": "memory per rank (node replica) and the process's RSS"},
    {"method": "GET", "path": "/api/cluster", "what": "the processes: main and each cluster node, heartbeat ages, replicas"},
    {"method": "GET", "path": "/api/events?since=SEQ", "what": "the event log: spawn, restart, failed, down, ..."},
    {"method": "GET", "path": "/api/stream", "what": "Server-Sent Events: frame per sample, end at the end"},
    {"method": "POST", "path": "/api/pause", "what": "pause the run (token)"},
    {"method": "POST", "path": "/api/resume", "what": "resume a paused run (token)"},
    {"method": "POST", "path": "/api/stop", "what": "drain and stop, as SIGINT (token)"},
    {"method": "POST", "path": "/api/checkpoint", "what": "ask nodes to checkpoint (token)"}
  ]
})json";

}  // namespace

struct server::impl {
  httplib::Server svr;
  std::atomic<int> streams{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};  // stop() began: each stream sends what is left and its end, then closes
  std::atomic<bool> listened{false};  // listen_after_bind returned
};

server::server(std::shared_ptr<hub> h, server_options options)
    : hub_(std::move(h)), options_(std::move(options)), impl_(std::make_unique<impl>()) {}

server::~server() { stop(); }

std::string server::url() const {
  std::string host = options_.bind;
  if (host == "0.0.0.0" || host.empty())
    host = "127.0.0.1";
  else if (host == "::" || host == "::1")
    host = "[" + host + "]";
  if (host == "[::]") host = "[::1]";
  return "http://" + host + ":" + std::to_string(port_) + "/";
}

std::string server::url_with_token() const { return url() + "?token=" + options_.token; }

void server::start() {
  if (options_.token.empty()) options_.token = random_token();
  loopback_ = is_loopback_address(options_.bind);
  if (options_.port < 0 || options_.port > 65535)
    throw console_error("console: port " + std::to_string(options_.port) +
                        " is not a TCP port (0 to 65535; 0: a free one)");
  if (options_.port != 0) probe_bind(options_.bind, options_.port);

  auto& svr = impl_->svr;
  const int threads = std::max(2, options_.threads);
  svr.new_task_queue = [threads] { return new background_pool(static_cast<std::size_t>(threads)); };
  // cpp-httplib writes a response's head and body in two sends: with Nagle's algorithm on, the body waited
  // for the ACK of the head, which the client's delayed ACK held back about 40 ms (bench/console_load.sh:
  // every request took 42 ms, 37 requests/s on one connection; docs/reliability.md "Console under load")
  svr.set_tcp_nodelay(true);
  svr.set_keep_alive_timeout(2);
  svr.set_read_timeout(5);
  svr.set_write_timeout(5);
  svr.set_payload_max_length(64 * 1024);

  // Every request: the Host check (loopback binds: a DNS-rebinding guard) and the token.
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (loopback_ && req.has_header("Host")) {
      std::string host = host_of(req.get_header_value("Host"));  // host names are case-insensitive (RFC 3986 3.2.2)
      std::transform(host.begin(), host.end(), host.begin(), [](unsigned char c) { return std::tolower(c); });
      if (host != "127.0.0.1" && host != "localhost" && host != "::1" && host != options_.bind) {
        send_error(res, 403,
                   "unexpected Host header '" + req.get_header_value("Host") +
                       "': open the console as http://127.0.0.1:" + std::to_string(port_) + "/");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // Only the controls change the run's state: another method (POST /api/graph, DELETE /api/status)
    // is answered 405 or 404 by the routes below, on loopback without the token (it asked for one, saying
    // the request "changes the run's state")
    static const std::regex controls(control_paths);
    const bool changes_state = req.method == "POST" && std::regex_match(req.path, controls);
    const bool reads = req.method == "GET" || req.method == "HEAD";
    if (!changes_state && loopback_) return httplib::Server::HandlerResponse::Unhandled;
    // The page's script and style are code shipped in the binary, no run data, and the browser
    // fetches them without the ?token the page was opened with: off loopback they need none, or
    // the page loads without them and shows nothing. The page itself and /api still do.
    if (reads && (req.path == "/console.js" || req.path == "/console.css" || req.path == "/favicon.ico"))
      return httplib::Server::HandlerResponse::Unhandled;
    std::string presented;
    if (req.has_header("Authorization")) {
      const std::string a = req.get_header_value("Authorization");
      if (a.rfind("Bearer ", 0) == 0) presented = a.substr(7);
    }
    if (presented.empty() && req.has_header("X-Flowrun-Token")) presented = req.get_header_value("X-Flowrun-Token");
    if (presented.empty() && req.has_param("token")) presented = req.get_param_value("token");
    const std::string why = changes_state ? "this request changes the run's state"
                                          : "this console listens on " + options_.bind + " (not loopback)";
    if (presented.empty()) {
      send_error(res, 401,
                 why +
                     ": it needs the console token (header 'Authorization: Bearer TOKEN', "
                     "'X-Flowrun-Token: TOKEN' or ?token=TOKEN). flowrun printed the token at start "
                     "(and wrote it to --console-token-file); flowctl takes --token or FLOWRUN_CONSOLE_TOKEN");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!constant_time_equal(presented, options_.token)) {
      send_error(res, 403, why + ": the token given is not this console's token");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Every route's pattern and method, so that a known path asked with another method answers 405
  // with Allow (RFC 9110 sec. 15.5.6) rather than cpp-httplib's 404.
  struct route {
    std::regex pattern;
    const char* method;
  };
  auto routes = std::make_shared<std::vector<route>>();
  auto get = [&svr, routes](const std::string& pattern, httplib::Server::Handler handler) {
    routes->push_back({std::regex(pattern), "GET"});
    svr.Get(pattern, std::move(handler));
  };

  // The page (no build step, no outside network: shipped inside the binary).
  auto page = [](std::string_view body, const char* type) {
    return [body, type](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_header("Content-Security-Policy",
                     "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_content(std::string(body), type);
    };
  };
  get("/", page(assets::index_html(), "text/html; charset=utf-8"));
  get("/index.html", page(assets::index_html(), "text/html; charset=utf-8"));
  get("/console.js", page(assets::console_js(), "application/javascript; charset=utf-8"));
  get("/console.css", page(assets::console_css(), "text/css; charset=utf-8"));
  get("/favicon.ico", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });

  auto h = hub_;
  get("/api", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, api_index); });
  get("/api/graph", [h](const httplib::Request&, httplib::Response& res) { send_json(res, 200, h->graph_json()); });
  get("/api/status",
          [h](const httplib::Request&, httplib::Response& res) { send_json(res, 200, h->status_json()); });
  get("/api/nodes", [h](const httplib::Request&, httplib::Response& res) { send_json(res, 200, h->nodes_json()); });
  get(R"(/api/nodes/([^/]+))", [h](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    if (auto j = h->node_json(name))
      send_json(res, 200, *j);
    else
      send_error(res, 404, "no node called '" + name + "' (GET /api/graph lists the nodes)");
  });
  get("/api/edges", [h](const httplib::Request&, httplib::Response& res) { send_json(res, 200, h->edges_json()); });
  get("/api/bottlenecks", [h](const httplib::Request& req, httplib::Response& res) {
    double n = 5;
    if (query_number(req, res, "n", 5, 1, 1000, true, n))
      send_json(res, 200, h->bottlenecks_json(static_cast<std::size_t>(n)));
  });
  get("/api/signals", [h](const httplib::Request& req, httplib::Response& res) {
    double since = -1;  // seconds since the run began
    if (query_number(req, res, "since", -1, -1e300, 1e300, false, since)) send_json(res, 200, h->signals_json(since));
  });
  get("/api/memory",
          [h](const httplib::Request&, httplib::Response& res) { send_json(res, 200, h->memory_json()); });
  get("/api/cluster",
          [h](const httplib::Request&, httplib::Response& res) { send_json(res, 200, h->cluster_json()); });
  get("/api/events", [h](const httplib::Request& req, httplib::Response& res) {
    double since = 0;  // an event's sequence number
    if (query_number(req, res, "since", 0, 0, 9007199254740992.0, true, since))
      send_json(res, 200, h->events_json(static_cast<std::uint64_t>(since)));
  });
  get("/api/stream", [this, h](const httplib::Request&, httplib::Response& res) {
    if (impl_->streams.load() >= options_.max_streams) {
      send_error(res, 503,
                 "too many open event streams (" + std::to_string(options_.max_streams) +
                     "): close one, or poll /api/status and /api/nodes");
      return;
    }
    ++impl_->streams;
    struct stream_state {
      std::uint64_t frame = 0, event_seq = 0, signal_seq = 0;
      int quiet = 0;
      bool first = true, ended = false;
    };
    auto st = std::make_shared<stream_state>();
    impl* im = impl_.get();
    res.set_header("Cache-Control", "no-store");
    res.set_chunked_content_provider(
        "text/event-stream",
        [h, st, im](std::size_t, httplib::DataSink& sink) {
          if (st->ended || im->stopping.load()) {
            sink.done();
            return true;
          }
          // The server is stopping (the run ended, its linger if any over): the final frame if this stream has
          // not sent it, then `end` when the run is over, so that a client knows the run finished. (Without a
          // linger the server stopped as the run ended, and most streams closed with neither.)
          const auto finish = [&] {
            std::string out;
            if (h->frame() > st->frame) {
              st->frame = h->frame();
              out = "event: frame\ndata: " + h->frame_json(&st->event_seq, &st->signal_seq) + "\n\n";
            }
            if (h->ended()) out += "event: end\ndata: " + h->status_json() + "\n\n";
            st->ended = true;
            if (!out.empty() && !sink.write(out.data(), out.size())) return false;
            sink.done();
            return true;
          };
          if (im->draining.load() && !st->first) return finish();
          std::string out;
          if (st->first) {
            st->first = false;
            st->frame = h->frame();
            out = "retry: 2000\n\nevent: frame\ndata: " + h->frame_json(&st->event_seq, &st->signal_seq) + "\n\n";
          } else {
            const std::uint64_t f = h->wait_frame(st->frame, std::chrono::milliseconds(1000));
            if (im->stopping.load()) {
              sink.done();
              return true;
            }
            if (im->draining.load()) return finish();
            if (f > st->frame) {
              st->frame = f;
              out = "event: frame\ndata: " + h->frame_json(&st->event_seq, &st->signal_seq) + "\n\n";
            } else if (h->ended()) {  // the run is over (its final frame went out above): end now, not after the linger
              out = "event: end\ndata: " + h->status_json() + "\n\n";
              st->ended = true;
            } else if (++st->quiet % 10 == 0) {
              out = ": keep-alive\n\n";
            }
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;
          if (st->ended) sink.done();
          return true;
        },
        [im](bool) { --im->streams; });
  });
  // These take no body (skip_body).
  routes->push_back({std::regex(control_paths), "POST"});
  svr.Post(control_paths,
           [h](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& content) {
             skip_body(req, content);
             reply r = h->act(std::string(req.matches[1]));
             send_json(res, r.status, r.body);
           });
  // No route for the method and path: 405 with Allow when the path has other methods, else 404.
  auto unrouted = [routes](const httplib::Request& req, httplib::Response& res) {
    std::string allow;  // the methods the path has
    for (const auto& r : *routes)
      if (std::regex_match(req.path, r.pattern) && allow.find(r.method) == std::string::npos)
        allow += (allow.empty() ? "" : ", ") + std::string(r.method) + (r.method == std::string("GET") ? ", HEAD" : "");
    if (!allow.empty()) {
      res.set_header("Allow", allow);
      send_error(res, 405, req.method + " " + req.path + " is not allowed: it takes " + allow +
                               " (GET /api lists the endpoints)");
    } else {
      send_error(res, 404, "no such endpoint: " + req.method + " " + req.path + " (GET /api lists them)");
    }
  };
  // The other body-carrying methods on every path: answered at once, as the controls are (skip_body).
  // Registered after the controls, which match first.
  auto fallback = [unrouted](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& content) {
    skip_body(req, content);
    unrouted(req, res);
  };
  svr.Post(".*", fallback);
  svr.Put(".*", fallback);
  svr.Patch(".*", fallback);
  svr.Delete(".*", fallback);
  svr.set_error_handler([unrouted](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) unrouted(req, res);
    else
      send_error(res, res.status, "request failed");
  });

  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, with which two processes that passed probe_bind
  // together (flowrun launch's, started at once) both bound the port and the kernel split requests between them
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  if (options_.port == 0) {
    port_ = svr.bind_to_any_port(options_.bind);
    if (port_ <= 0) {
      port_ = 0;
      throw console_error("console: cannot listen on " + options_.bind + " (a free port): " + std::strerror(errno) +
                          ": use --console-bind 127.0.0.1");
    }
  } else {
    // another process's probe_bind holds the port for an instant (flowrun launch starts its processes at once):
    // two processes that failed on each other's probe both failed, "Address already in use", where one should
    // listen; a few tries tell an instant from a listener (which probe_bind then names)
    bool bound = svr.bind_to_port(options_.bind, options_.port);
    int err = bound ? 0 : errno;
    for (int attempt = 0; !bound && err == EADDRINUSE && attempt < 10; ++attempt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 + 10 * attempt));
      bound = svr.bind_to_port(options_.bind, options_.port);
      err = bound ? 0 : errno;
    }
    if (!bound) {
      probe_bind(options_.bind, options_.port);  // explains EADDRINUSE and friends
      throw console_error("console: cannot listen on port " + std::to_string(options_.port) + " on " + options_.bind +
                          ": " + std::strerror(err));
    }
    port_ = options_.port;
  }
  thread_ = std::thread([this] {
    impl_->svr.listen_after_bind();
    impl_->listened = true;
  });
}

void server::stop() {
  if (!thread_.joinable()) return;
  // Let the open streams send their last frame and `end` (each does on its next turn, at most the
  // 1 s wait_frame timeout away, at once when the hub is closed) before the sockets close.
  impl_->draining = true;
  const auto drain_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (impl_->streams.load() > 0 && std::chrono::steady_clock::now() < drain_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  impl_->stopping = true;
  // cpp-httplib's stop() closes the socket only once the accept loop runs: called before the thread
  // got there (a start that failed just after, e.g. an unwritable --console-token-file), it did
  // nothing and the join waited forever. So it is repeated until the loop has ended.
  while (!impl_->listened) {
    impl_->svr.stop();
    if (!impl_->listened) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  thread_.join();
}

}  // namespace flowrun::console
