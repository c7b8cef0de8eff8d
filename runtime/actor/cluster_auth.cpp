#include "runtime/actor/cluster_auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace flowrun::actor {

namespace {

std::string to_hex(const unsigned char* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

}  // namespace

expected<std::string> load_cluster_secret(const std::string& file) {
  std::string secret;
  if (!file.empty()) {
    if (std::filesystem::is_directory(file))
      return error_text{"the cluster secret file '" + file + "' is a folder: give the file whose first line is the secret"};
    std::ifstream in(file);
    if (!in) return error_text{"cannot read the cluster secret file '" + file + "'"};
    std::getline(in, secret);
    while (!secret.empty() && (secret.back() == '\r' || secret.back() == ' ' || secret.back() == '\t'))
      secret.pop_back();
    if (secret.empty()) {
      const bool more = static_cast<bool>(in.peek() != std::char_traits<char>::eof());
      return error_text{"the cluster secret file '" + file + "' " +
                        (more ? "begins with a blank line: the secret is its first line; remove the blank line"
                              : "is empty (its first line is the secret)")};
    }
  } else {
    if (const char* env = std::getenv("FLOWRUN_CLUSTER_SECRET")) secret = env;
    if (secret.empty())
      return error_text{"no cluster secret: give --secret-file FILE (its first line is the secret) or set "
                        "FLOWRUN_CLUSTER_SECRET, the same on every node and on the flowrun run process"};
  }
  if (secret.size() < 16)  // whoever has it can run jobs, and so code, on the nodes
    spdlog::warn("the cluster secret is {} characters long: a node accepts jobs from whoever knows it; use a long "
                 "random one (openssl rand -hex 32)",
                 secret.size());
  return secret;
}

std::string random_nonce() {
  unsigned char b[32];
  if (RAND_bytes(b, sizeof b) != 1) throw std::runtime_error("RAND_bytes failed: no randomness for a cluster nonce");
  return to_hex(b, sizeof b);
}

std::string hmac_sha256_hex(std::string_view secret, std::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &n))
    throw std::runtime_error("HMAC-SHA256 failed");
  return to_hex(out, n);
}

std::string cluster_proof(std::string_view secret, std::string_view role, std::string_view client_nonce,
                          std::string_view daemon_nonce) {
  std::string m = "flowrun-cluster-v1|";
  m.append(role).append("|").append(client_nonce).append("|").append(daemon_nonce);
  return hmac_sha256_hex(secret, m);
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

bool is_nonce(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::optional<std::pair<std::string, std::string>> handshake_gate::hello(std::string_view client_nonce) {
  if (!is_nonce(client_nonce)) return std::nullopt;
  if (issued_.size() >= max_pending_) issued_.clear();  // forget stale handshakes rather than grow
  std::string mine = random_nonce();
  issued_.insert(mine);
  std::string proof = cluster_proof(secret_, "daemon", client_nonce, mine);
  return std::make_pair(std::move(mine), std::move(proof));
}

std::string handshake_gate::auth(std::string_view client_nonce, std::string_view daemon_nonce,
                                 std::string_view proof) {
  auto it = issued_.find(daemon_nonce);
  if (it == issued_.end() || !is_nonce(client_nonce)) return "malformed or replayed handshake";
  issued_.erase(it);
  if (!constant_time_equal(proof, cluster_proof(secret_, "client", client_nonce, daemon_nonce)))
    return "wrong cluster secret (its proof does not match ours)";
  return {};
}

}  // namespace flowrun::actor
