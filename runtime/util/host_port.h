// HOST:PORT, as a cluster node's `address` and `flowrun node --listen` take it, and back.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <optional>
#include <string>

namespace flowrun::util {

/// A host (a name, an IPv4 address, or an IPv6 address without brackets) and a TCP port.
struct host_port {
  std::string host;
  int port = 0;
};

/// Whether `host` is an IPv6 address (an interface zone, "fe80::1%eth0", allowed).
inline bool is_ipv6_address(const std::string& host) {
  const std::string bare = host.substr(0, host.find('%'));
  in6_addr a{};
  return !bare.empty() && ::inet_pton(AF_INET6, bare.c_str(), &a) == 1;
}

/// Splits "HOST:PORT": the port 1 to 5 digits (its range is the caller's), the host a name, an IPv4 address,
/// or an IPv6 address in brackets as URLs write it ("[::1]:7001"), or bare where it reads as one at the last
/// colon ("::1:7001"); the host comes back without brackets. nullopt for anything else ("[::1]", "::1", which
/// would be host ":" port 1, "h:70x", "[::1"). Used by the cluster file's parser and `flowrun node --listen`.
inline std::optional<host_port> split_host_port(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size() || text.size() - colon - 1 > 5)
    return std::nullopt;
  for (std::size_t i = colon + 1; i < text.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return std::nullopt;
  std::string host = text.substr(0, colon);
  const bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) host = host.substr(1, host.size() - 2);
  if (host.empty() || host.find_first_of("[] /") != std::string::npos) return std::nullopt;
  if ((bracketed || host.find(':') != std::string::npos) && !is_ipv6_address(host)) return std::nullopt;
  return host_port{host, std::stoi(text.substr(colon + 1))};
}

/// "HOST:PORT" as `flowrun node --listen` takes it: an IPv6 host in brackets ("[::1]:7001").
inline std::string join_host_port(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace flowrun::util
