// The live console's HTTP server (cpp-httplib): the JSON API, the event
// stream and the web page, all from one `hub` (hub.h). docs/console.md is the
// reference for every endpoint.
//
//   auto h = std::make_shared<hub>(graph);
//   server s(h, {.bind = "127.0.0.1", .port = 0});
//   s.start();                       // throws console_error (port in use, ...)
//   std::cout << s.url() << s.token();
//   ...
//   h->close(); s.stop();
//
// Tokens: every state-changing request (POST) needs the token; when bound to
// an address other than loopback, every request does. A request carries it
// as "Authorization: Bearer TOKEN", as "X-Flowrun-Token: TOKEN" or as the
// query parameter ?token=TOKEN (the page and EventSource use the latter).
// Tokens are compared in constant time. Missing: 401; wrong: 403.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

namespace flowrun::console {

class hub;

/// A console that cannot start: the message names the address, the port and the fix.
struct console_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct server_options {
  /// Address to listen on. "127.0.0.1" (default), "::1" or "localhost" are
  /// loopback; anything else (e.g. "0.0.0.0") makes every request need the token.
  std::string bind = "127.0.0.1";
  /// TCP port; 0: a free port chosen by the system (see server::port()).
  int port = 0;
  /// The token; empty: 32 random hex digits from /dev/urandom.
  std::string token;
  /// Worker threads: each connection holds one while its request is read, each open event stream one.
  /// 64 (it was 16): 16 slow clients, each sending a header line every 2 s, kept everyone else out.
  int threads = 64;
  /// The most event streams open at once (more are answered 503).
  int max_streams = 8;
};

class server {
 public:
  server(std::shared_ptr<hub> h, server_options options);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds and starts serving on a thread of its own. Throws console_error
  /// when the address cannot be bound, e.g. "console: port 8080 on 127.0.0.1
  /// is already in use (...): choose another port with --console PORT, use
  /// --console 0 for a free one, or turn the console off with --no-console".
  void start();
  /// Stops serving (open streams end once the hub is closed or within a second).
  void stop();

  /// The port served (the chosen one when options.port was 0); 0 before start().
  int port() const { return port_; }
  /// "http://HOST:PORT/" (loopback binds print 127.0.0.1; [::1] for IPv6).
  std::string url() const;
  /// The page's address with the token: url() + "?token=" + token().
  std::string url_with_token() const;
  const std::string& token() const { return options_.token; }
  /// True when the bind address is a loopback address.
  bool loopback() const { return loopback_; }

 private:
  struct impl;
  std::shared_ptr<hub> hub_;
  server_options options_;
  bool loopback_ = true;
  int port_ = 0;
  std::unique_ptr<impl> impl_;
  std::thread thread_;
};

/// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_address(const std::string& host);

/// 32 hex digits from /dev/urandom (std::random_device if it cannot be read).
std::string random_token();

}  // namespace flowrun::console
