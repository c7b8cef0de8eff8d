// Layer 5, actor runtime: the shared secret of a cluster (docs/scaling.md).
//
// A `flowrun node` daemon accepts work only from a peer that proves it knows
// the cluster's secret, and the peer checks that the daemon knows it too:
// each side sends a fresh random nonce and answers the other's with
// HMAC-SHA256(secret, label | client nonce | daemon nonce) (OpenSSL's
// libcrypto), so the secret never travels. This authenticates; it does not
// encrypt: for that, give both sides --tls-cert/--tls-key/--tls-ca (caf_openssl).
//
// This header includes no CAF and no OpenSSL.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "runtime/actor/expected.h"

namespace flowrun::actor {

/// The secret from `file` (its first line, trailing whitespace removed) or,
/// when `file` is empty, from $FLOWRUN_CLUSTER_SECRET. Errors: the file
/// cannot be read, or the secret is empty or missing (the message says where
/// to put one).
expected<std::string> load_cluster_secret(const std::string& file);

/// 32 random bytes from the system's CSPRNG, as 64 lowercase hex digits.
std::string random_nonce();

/// HMAC-SHA256(secret, message) as 64 lowercase hex digits.
std::string hmac_sha256_hex(std::string_view secret, std::string_view message);

/// The proof a daemon (role "daemon") or a coordinator (role "client") sends:
/// hmac_sha256_hex(secret, "flowrun-cluster-v1|" + role + "|" + client_nonce + "|" + daemon_nonce).
std::string cluster_proof(std::string_view secret, std::string_view role, std::string_view client_nonce,
                          std::string_view daemon_nonce);

/// Compares two strings in time independent of where they differ.
bool constant_time_equal(std::string_view a, std::string_view b);

/// True when `s` has the shape of random_nonce(): 64 lowercase hex digits.
bool is_nonce(std::string_view s);

/// The daemon's side of the handshake, without CAF (the gate actor in
/// cluster.cpp holds one; tests/fuzz/fuzz_cluster feeds it arbitrary bytes):
///   hello(client_nonce)                      -> {daemon_nonce, daemon proof}
///   auth(client_nonce, daemon_nonce, proof)  -> "" (accepted) or why refused
/// A daemon nonce is accepted at most once (a replayed auth is refused), and
/// at most `max_pending` unanswered hellos are remembered: beyond that the
/// oldest handshakes are forgotten rather than memory grown.
class handshake_gate {
 public:
  explicit handshake_gate(std::string secret, std::size_t max_pending = 1024)
      : secret_(std::move(secret)), max_pending_(max_pending) {}

  /// The daemon's nonce and proof for a client's hello; nullopt when
  /// `client_nonce` is not a nonce (is_nonce).
  std::optional<std::pair<std::string, std::string>> hello(std::string_view client_nonce);

  /// "" when `daemon_nonce` was issued by hello() and not used yet and
  /// `proof` is cluster_proof(secret, "client", client_nonce, daemon_nonce);
  /// otherwise the reason it is refused ("malformed or replayed handshake",
  /// "wrong cluster secret ..."). The nonce is used up either way.
  std::string auth(std::string_view client_nonce, std::string_view daemon_nonce, std::string_view proof);

  /// Daemon nonces issued and not used yet.
  std::size_t pending() const { return issued_.size(); }

 private:
  std::string secret_;
  std::size_t max_pending_;
  std::set<std::string, std::less<>> issued_;
};

}  // namespace flowrun::actor
