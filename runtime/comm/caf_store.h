// A rendezvous store served by a CAF actor over TCP (layer 2; CAF stays in
// caf_store.cpp, this header is plain C++).
//
// One process hosts the store (host_caf_store): it spawns a small key-value
// actor and publishes it with CAF's middleman on HOST:PORT (port 0 = any free
// port). Every rank, in any process that can reach HOST:PORT, opens a client
// (make_caf_store / open_store("caf://HOST:PORT")) and sets, gets (waiting for
// the key) and erases records. Values travel as raw bytes (std::vector<char>
// in CAF messages: no floats cross a process, see CAF-0.17-NOTES.md).
//
// `flowrun launch --rendezvous caf` hosts one in the launcher and gives the
// children its address in FLOWRUN_RENDEZVOUS=caf://127.0.0.1:PORT; the gloo
// communicators rendezvous through it and NCCL's unique id travels through it
// (docs/zero.md, docs/cuda.md).
//
// A get of a key nobody sets throws std::runtime_error naming the address and
// the key once the timeout passes; a client that cannot reach the address
// within its connect timeout throws naming the address and CAF's reason.
// Hosts and clients of one process share one CAF actor system (created with
// the first of them, stopped with the last), separate from the graph
// runtime's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/store.h"

namespace flowrun::comm {

/// HOST and PORT of "caf://HOST:PORT".
struct caf_address {
  std::string host;
  uint16_t port = 0;
  /// "caf://HOST:PORT"
  std::string str() const;
};

/// Parses "caf://HOST:PORT" (PORT in 1..65535). Throws std::invalid_argument
/// naming the text otherwise.
caf_address parse_caf_address(const std::string& url);

/// A hosted store: the key-value actor, published while this object lives.
class caf_store_host {
 public:
  virtual ~caf_store_host();
  /// The address clients connect to, "caf://HOST:PORT" (the real port when
  /// 0 was asked for).
  virtual caf_address address() const = 0;
  /// Records held now (for tests and diagnostics).
  virtual std::size_t size() = 0;
};

/// Spawns the store actor and publishes it on `host`:`port` (port 0: any free
/// port; `host` is the address to bind, "0.0.0.0" for every interface).
/// Throws std::runtime_error naming host:port when publishing fails (port in
/// use, unknown address).
std::unique_ptr<caf_store_host> host_caf_store(const std::string& host = "127.0.0.1", uint16_t port = 0);

/// A client of the store at `host`:`port`. Connecting is retried until
/// `connect_timeout` passes (the host may start a moment later), then
/// std::runtime_error names "caf://host:port" and CAF's reason. Safe for
/// several threads. set/contains/erase wait at most `op_timeout` for the
/// store's answer; get waits its own timeout for the key.
std::unique_ptr<store> make_caf_store(const std::string& host, uint16_t port,
                                      std::chrono::milliseconds connect_timeout = std::chrono::seconds(30),
                                      std::chrono::milliseconds op_timeout = std::chrono::seconds(60));

/// A store by address: "caf://HOST:PORT" (make_caf_store), "file://DIR" or a
/// plain directory (file_store). Throws std::invalid_argument for an empty
/// address and what the chosen store throws.
std::shared_ptr<store> open_store(const std::string& address,
                                  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30));

}  // namespace flowrun::comm
