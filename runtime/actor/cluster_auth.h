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

#include <string>
#include <string_view>

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

}  // namespace flowrun::actor
