// The CAF store (caf_store.h): a stateful key-value actor published with the
// middleman, and clients that talk to it with scoped_actor requests.
//
// Protocol (dynamically typed; only strings, raw bytes and bools travel):
//   (kv_set, key, bytes) -> true       stores, answers every parked get of key
//   (kv_get, key)        -> bytes      at once when present, else parked until a set
//   (kv_has, key)        -> bool
//   (kv_del, key)        -> bool       true when the key was present
//   (kv_size)            -> uint64     records held
// A parked get whose requester gave up (timeout) is answered later into the
// void, or dropped with the actor.
#include "runtime/comm/caf_store.h"
#include "runtime/comm/caf_scheduler.h"
#include "runtime/comm/caf_store_actor.h"
#include "runtime/util/connect_budget.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace flowrun::comm {

namespace {

using kv_set_atom = caf::atom_constant<caf::atom("kv_set")>;
using kv_get_atom = caf::atom_constant<caf::atom("kv_get")>;
using kv_has_atom = caf::atom_constant<caf::atom("kv_has")>;
using kv_del_atom = caf::atom_constant<caf::atom("kv_del")>;
using kv_size_atom = caf::atom_constant<caf::atom("kv_size")>;

using bytes = std::vector<char>;

struct kv_state {
  std::map<std::string, bytes> kv;
  std::multimap<std::string, caf::response_promise> waiting;
  static const char* name;
};
const char* kv_state::name = "flowrun_kv_store";

caf::behavior kv_actor(caf::stateful_actor<kv_state>* self) {
  return {
      [=](kv_set_atom, const std::string& key, const bytes& value) -> bool {
        self->state.kv[key] = value;
        auto range = self->state.waiting.equal_range(key);
        for (auto it = range.first; it != range.second; ++it) it->second.deliver(value);
        self->state.waiting.erase(range.first, range.second);
        return true;
      },
      [=](kv_get_atom, const std::string& key) -> caf::result<bytes> {
        auto it = self->state.kv.find(key);
        if (it != self->state.kv.end()) return it->second;
        auto rp = self->make_response_promise();
        self->state.waiting.emplace(key, rp);
        return rp;
      },
      [=](kv_has_atom, const std::string& key) -> bool { return self->state.kv.count(key) > 0; },
      [=](kv_del_atom, const std::string& key) -> bool { return self->state.kv.erase(key) > 0; },
      [=](kv_size_atom) -> uint64_t { return static_cast<uint64_t>(self->state.kv.size()); },
  };
}

// One CAF actor system (with the middleman) per process for every host and
// client: made by the first, stopped with the last.
struct caf_env {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf_env() {
    cfg.load<caf::io::middleman>();
    configure_scheduler(cfg, 2);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
  ~caf_env() { sys.reset(); }
};

std::shared_ptr<caf_env> acquire_env() {
  static std::mutex mu;
  static std::weak_ptr<caf_env> current;
  std::lock_guard lk(mu);
  if (auto p = current.lock()) return p;
  auto p = std::make_shared<caf_env>();
  current = p;
  return p;
}

/// True when binding host:port (IPv4; empty host = any) fails with EADDRINUSE: how a failed
/// publish tells "another process listens there" from other errors.
bool port_in_use(const std::string& host, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (host.empty() || ::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool in_use = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

class caf_host_impl final : public caf_store_host {
 public:
  caf_host_impl(const std::string& host, uint16_t port) : env_(acquire_env()) {
    kv_ = env_->sys->spawn(kv_actor);
    auto p = env_->sys->middleman().publish(kv_, port, host.empty() ? nullptr : host.c_str(), true);
    if (!p) {
      caf::anon_send_exit(kv_, caf::exit_reason::user_shutdown);
      std::string why = env_->sys->render(p.error());
      if (port != 0 && port_in_use(host, port))
        why = "port " + std::to_string(port) + " is already in use (see `ss -ltnp 'sport = :" + std::to_string(port) +
              "'`): choose another --rendezvous-port, or 0 for any free port";
      throw std::runtime_error("caf_store: cannot publish the store on " + host + ":" + std::to_string(port) + ": " +
                               why);
    }
    addr_.host = host.empty() || host == "0.0.0.0" ? "127.0.0.1" : host;
    addr_.port = *p;
  }
  ~caf_host_impl() override {
    env_->sys->middleman().unpublish(kv_, addr_.port);
    caf::anon_send_exit(kv_, caf::exit_reason::user_shutdown);
    kv_ = nullptr;
  }
  caf_address address() const override { return addr_; }
  std::size_t size() override {
    caf::scoped_actor self{*env_->sys};
    std::size_t n = 0;
    self->request(kv_, std::chrono::seconds(10), kv_size_atom::value)
        .receive([&](uint64_t k) { n = static_cast<std::size_t>(k); },
                 [&](caf::error& e) {
                   throw std::runtime_error("caf_store " + addr_.str() + ": size: " + env_->sys->render(e));
                 });
    return n;
  }

 private:
  std::shared_ptr<caf_env> env_;
  caf::actor kv_;
  caf_address addr_;
};

// One request to a store actor, with the error turned into std::runtime_error
// naming `where`, the op and the key.
template <class F, class... Ts>
void kv_call(caf::actor_system& sys, const caf::actor& server, const std::string& where, const char* op,
             const std::string& key, std::chrono::milliseconds timeout, F on_ok, Ts&&... xs) {
  caf::error err;
  {
    caf::scoped_actor self{sys};
    self->request(server, timeout, std::forward<Ts>(xs)...).receive(on_ok, [&](caf::error& e) { err = e; });
  }
  if (!err) return;
  if (err == caf::sec::request_timeout) {
    if (std::string(op) == "get")
      throw std::runtime_error(where + ": timed out after " + std::to_string(timeout.count()) +
                               " ms waiting for key '" + key + "' (did every rank start?)");
    throw std::runtime_error(where + ": " + op + " of key '" + key + "': no answer within " +
                             std::to_string(timeout.count()) + " ms");
  }
  throw std::runtime_error(where + ": " + op + " of key '" + key + "' failed: " + sys.render(err) +
                           " (is the store's host still running?)");
}

// A client of a store actor in an actor system the caller owns (cluster runs).
class kv_client final : public store {
 public:
  kv_client(caf::actor_system& sys, caf::actor kv, std::chrono::milliseconds op_timeout)
      : sys_(sys), kv_(std::move(kv)), op_timeout_(op_timeout) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    bytes b(value.begin(), value.end());
    kv_call(sys_, kv_, where(), "set", key, op_timeout_, [](bool) {}, kv_set_atom::value, key, std::move(b));
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::vector<uint8_t> out;
    kv_call(sys_, kv_, where(), "get", key, timeout, [&](const bytes& b) { out.assign(b.begin(), b.end()); },
            kv_get_atom::value, key);
    return out;
  }
  bool contains(const std::string& key) override {
    bool r = false;
    kv_call(sys_, kv_, where(), "contains", key, op_timeout_, [&](bool v) { r = v; }, kv_has_atom::value, key);
    return r;
  }
  void erase(const std::string& key) override {
    kv_call(sys_, kv_, where(), "erase", key, op_timeout_, [](bool) {}, kv_del_atom::value, key);
  }

 private:
  std::string where() const { return "the cluster run's store (actor " + std::to_string(kv_.id()) + ")"; }
  caf::actor_system& sys_;
  caf::actor kv_;
  std::chrono::milliseconds op_timeout_;
};

class caf_client final : public store {
 public:
  caf_client(const std::string& host, uint16_t port, std::chrono::milliseconds connect_timeout,
             std::chrono::milliseconds op_timeout)
      : env_(acquire_env()), op_timeout_(op_timeout) {
    addr_.host = host;
    addr_.port = port;
    const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
    auto pause = std::chrono::milliseconds(20);
    // Not the blocking remote_actor: it waits for the connect and CAF's handshake without a time
    // limit, so a port that accepts but never answers would hang every rank. The same connect
    // request to the middleman, each attempt bounded by the time left before the deadline (a retry by at least
    // min(connect_timeout, 1 s): runtime/util/connect_budget.h).
    caf::scoped_actor self{*env_->sys};
    const caf::io::middleman_actor mm = env_->sys->middleman().actor_handle();
    for (bool retry = false;; retry = true) {
      const auto left = connect_attempt_budget(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
          connect_timeout, retry);
      std::string failure;
      bool timed_out = false;
      caf::strong_actor_ptr ptr;
      self->request(mm, left, caf::connect_atom::value, host, port)
          .receive([&](caf::node_id&, caf::strong_actor_ptr& x, std::set<std::string>&) { ptr = std::move(x); },
                   [&](caf::error& e) {
                     timed_out = e == caf::sec::request_timeout;
                     failure = env_->sys->render(e);
                   });
      if (ptr) {
        server_ = caf::actor_cast<caf::actor>(std::move(ptr));
        break;
      }
      if (timed_out)
        throw std::runtime_error("caf_store: nothing at " + addr_.str() + " answered as a rendezvous store within " +
                                 std::to_string(connect_timeout.count()) +
                                 " ms (something accepts connections on that port but does not speak CAF's "
                                 "protocol; flowrun launch hosts the store and sets FLOWRUN_RENDEZVOUS)");
      if (failure.empty()) failure = "no actor published at port " + std::to_string(port);
      if (std::chrono::steady_clock::now() + pause >= deadline)
        throw std::runtime_error("caf_store: cannot connect to " + addr_.str() + " within " +
                                 std::to_string(connect_timeout.count()) + " ms: " + failure +
                                 " (is the store hosted there? flowrun launch hosts it and sets FLOWRUN_RENDEZVOUS)");
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::milliseconds(500)) pause *= 2;
    }
  }
  ~caf_client() override { server_ = nullptr; }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    bytes b(value.begin(), value.end());
    call("set", key, op_timeout_, [](bool) {}, kv_set_atom::value, key, std::move(b));
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::vector<uint8_t> out;
    call("get", key, timeout, [&](const bytes& b) { out.assign(b.begin(), b.end()); }, kv_get_atom::value, key);
    return out;
  }

  bool contains(const std::string& key) override {
    bool r = false;
    call("contains", key, op_timeout_, [&](bool v) { r = v; }, kv_has_atom::value, key);
    return r;
  }

  void erase(const std::string& key) override {
    call("erase", key, op_timeout_, [](bool) {}, kv_del_atom::value, key);
  }

 private:
  template <class F, class... Ts>
  void call(const char* op, const std::string& key, std::chrono::milliseconds timeout, F on_ok, Ts&&... xs) {
    kv_call(*env_->sys, server_, "caf_store " + addr_.str(), op, key, timeout, on_ok, std::forward<Ts>(xs)...);
  }

  std::shared_ptr<caf_env> env_;
  caf::actor server_;
  caf_address addr_;
  std::chrono::milliseconds op_timeout_;
};

}  // namespace

caf::actor spawn_kv_store(caf::actor_system& sys) { return sys.spawn(kv_actor); }

std::shared_ptr<store> actor_store(caf::actor_system& sys, caf::actor kv, std::chrono::milliseconds op_timeout) {
  if (!kv) throw std::invalid_argument("actor_store: no store actor");
  return std::make_shared<kv_client>(sys, std::move(kv), op_timeout);
}

std::string caf_address::str() const { return "caf://" + host + ":" + std::to_string(port); }

caf_address parse_caf_address(const std::string& url) {
  const std::string scheme = "caf://";
  auto bad = [&](const char* why) {
    return std::invalid_argument("not a CAF store address '" + url + "' (" + why + "; expected caf://HOST:PORT)");
  };
  if (url.rfind(scheme, 0) != 0) throw bad("no caf:// prefix");
  const std::string rest = url.substr(scheme.size());
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) throw bad("no HOST:PORT");
  caf_address a;
  a.host = rest.substr(0, colon);
  if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']') a.host = a.host.substr(1, a.host.size() - 2);
  const std::string p = rest.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) throw bad("bad port");
  const long v = std::stol(p);
  if (v < 1 || v > 65535) throw bad("port out of range");
  a.port = static_cast<uint16_t>(v);
  return a;
}

caf_store_host::~caf_store_host() = default;

std::unique_ptr<caf_store_host> host_caf_store(const std::string& host, uint16_t port) {
  return std::make_unique<caf_host_impl>(host, port);
}

std::unique_ptr<store> make_caf_store(const std::string& host, uint16_t port, std::chrono::milliseconds connect_timeout,
                                      std::chrono::milliseconds op_timeout) {
  if (host.empty()) throw std::invalid_argument("make_caf_store: empty host");
  if (port == 0) throw std::invalid_argument("make_caf_store: port 0 (give the port the store was published on)");
  return std::make_unique<caf_client>(host, port, connect_timeout, op_timeout);
}

std::shared_ptr<store> open_store(const std::string& address, std::chrono::milliseconds connect_timeout) {
  if (address.empty()) throw std::invalid_argument("open_store: empty address (caf://HOST:PORT, file://DIR or DIR)");
  if (address.rfind("caf://", 0) == 0) {
    auto a = parse_caf_address(address);
    return make_caf_store(a.host, a.port, connect_timeout);
  }
  if (address.rfind("file://", 0) == 0) return std::make_shared<file_store>(address.substr(7));
  if (address.find("://") != std::string::npos)
    throw std::invalid_argument("open_store: unknown scheme in '" + address + "' (caf://HOST:PORT, file://DIR or DIR)");
  return std::make_shared<file_store>(address);
}

}  // namespace flowrun::comm
