// Layer 5, actor runtime: the liveness channel and its φ accrual detector (liveness.h).
#include "runtime/actor/liveness.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "runtime/actor/cluster_auth.h"
#include "runtime/util/host_port.h"

namespace flowrun::actor {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr std::size_t max_datagram = 200;

void wake(int fd) {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(fd, &one, sizeof one);
}

// One UDP socket for `host`:`port` (AI_PASSIVE when `bind_it`), bound or connected.
int udp_socket(const std::string& host, int port, bool bind_it, std::string& why) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  if (bind_it) hints.ai_flags = AI_PASSIVE;
  const bool any = host.empty() || host == "0.0.0.0" || host == "::";
  const int rc = ::getaddrinfo(bind_it && any ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) {
    why = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (auto* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if ((bind_it ? ::bind(fd, a->ai_addr, a->ai_addrlen) : ::connect(fd, a->ai_addr, a->ai_addrlen)) == 0) break;
    why = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0 && why.empty()) why = "no usable address for '" + host + "'";
  return fd;
}

std::string tag_of(const std::string& secret, const std::string& context, const std::string& kind,
                   std::uint32_t index, std::uint64_t seq) {
  return hmac_sha256_hex(secret, context + " " + kind + " " + std::to_string(index) + " " + std::to_string(seq))
      .substr(0, 32);
}

}  // namespace

phi_settings phi_settings::for_cluster(std::int64_t heartbeat_ms, std::int64_t lost_after_ms) {
  phi_settings s;
  s.heartbeat_ms = static_cast<double>(std::max<std::int64_t>(1, heartbeat_ms));
  const double lost = std::max(2 * s.heartbeat_ms, static_cast<double>(lost_after_ms));
  s.acceptable_pause_ms = lost - s.heartbeat_ms;
  s.min_std_ms = s.heartbeat_ms / 5;
  s.max_std_ms = lost / 4;
  return s;
}

double phi_settings::bound_ms(double mean_interval_ms) const {
  // the y at which φ = threshold, by bisection on the monotone φ(y)
  double lo = 0, hi = 100;
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (flowrun::actor::phi(mid, 0, 1) > threshold ? hi : lo) = mid;
  }
  return mean_interval_ms + acceptable_pause_ms + hi * max_std_ms;
}

double phi(double elapsed_ms, double mean_ms, double std_ms) {
  const double y = (elapsed_ms - mean_ms) / std_ms;
  const double e = std::exp(-y * (1.5976 + 0.070566 * y * y));
  // 1 - F(y) = e / (1 + e); for y far above the mean e underflows to 0: φ capped
  double p_later = elapsed_ms > mean_ms ? e / (1.0 + e) : 1.0 - 1.0 / (1.0 + e);
  if (!(p_later > 1e-300)) return 300;
  return std::min(300.0, -std::log10(p_later));
}

phi_detector::phi_detector(const phi_settings& s, double now) : s_(s), last_(now) {
  // Akka's first-heartbeat estimate: two intervals of heartbeat ± heartbeat / 4
  for (double d : {s.heartbeat_ms - s.heartbeat_ms / 4, s.heartbeat_ms + s.heartbeat_ms / 4}) {
    intervals_.push_back(d);
    sum_ += d;
    sum_sq_ += d * d;
  }
}

void phi_detector::heartbeat(double now) {
  const double d = std::max(0.0, now - last_);
  last_ = now;
  intervals_.push_back(d);
  sum_ += d;
  sum_sq_ += d * d;
  while (intervals_.size() > std::max<std::size_t>(2, s_.window)) {
    const double old = intervals_.front();
    intervals_.pop_front();
    sum_ -= old;
    sum_sq_ -= old * old;
  }
}

double phi_detector::mean_interval_ms() const { return sum_ / static_cast<double>(intervals_.size()); }

double phi_detector::std_interval_ms() const {
  const double m = mean_interval_ms();
  return std::sqrt(std::max(0.0, sum_sq_ / static_cast<double>(intervals_.size()) - m * m));
}

double phi_detector::phi(double now) const {
  const double sd = std::clamp(std_interval_ms(), s_.min_std_ms, std::max(s_.min_std_ms, s_.max_std_ms));
  return flowrun::actor::phi(now - last_, mean_interval_ms() + s_.acceptable_pause_ms, sd);
}

std::string liveness_datagram(const std::string& secret, const std::string& context, const std::string& kind,
                              std::uint32_t index, std::uint64_t seq) {
  return "FRLV1 " + kind + " " + std::to_string(index) + " " + std::to_string(seq) + " " +
         tag_of(secret, context, kind, index, seq);
}

bool parse_liveness_datagram(const std::string& secret, const std::string& context, const std::string& kind,
                             const char* data, std::size_t size, std::uint32_t& index, std::uint64_t& seq) {
  if (size == 0 || size > max_datagram) return false;
  const std::string d(data, size);
  const std::string head = "FRLV1 " + kind + " ";
  if (d.compare(0, head.size(), head) != 0) return false;
  std::size_t pos = head.size();
  auto number = [&](std::uint64_t& out, std::uint64_t max) {
    const std::size_t start = pos;
    out = 0;
    while (pos < d.size() && d[pos] >= '0' && d[pos] <= '9' && pos - start < 20) {
      const std::uint64_t digit = static_cast<std::uint64_t>(d[pos] - '0');
      if (out > (max - digit) / 10) return false;
      out = out * 10 + digit;
      ++pos;
    }
    if (pos == start || pos >= d.size() || d[pos] != ' ') return false;
    ++pos;
    return true;
  };
  std::uint64_t i = 0, s = 0;
  if (!number(i, 0xffffffffu) || !number(s, ~std::uint64_t{0})) return false;
  const std::string tag = d.substr(pos);
  if (!constant_time_equal(tag, tag_of(secret, context, kind, static_cast<std::uint32_t>(i), s))) return false;
  index = static_cast<std::uint32_t>(i);
  seq = s;
  return true;
}

// -- the node's side ------------------------------------------------------------------------------

liveness_responder::liveness_responder(const std::string& host, std::string secret, std::string context,
                                       phi_settings s, std::function<void(const std::string&)> on_lost)
    : secret_(std::move(secret)), context_(std::move(context)), s_(s), on_lost_(std::move(on_lost)) {
  // Every address of this machine, IPv6 and IPv4 at once where the kernel allows: main reaches the node
  // at whatever its [cluster] host resolves to there, which need not be the first address `host`
  // resolves to here (localhost: ::1 or 127.0.0.1). Datagrams without the run's HMAC get no answer.
  std::string why;
  fd_ = ::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ >= 0) {
    int off = 0;
    ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 any{};
    any.sin6_family = AF_INET6;
    any.sin6_addr = in6addr_any;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  if (fd_ < 0) fd_ = udp_socket("0.0.0.0", 0, true, why);  // no IPv6 here
  if (fd_ < 0) throw std::runtime_error("liveness: cannot open a UDP socket (for '" + host + "'): " + why);
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port_ = ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_ < 0) {
    ::close(fd_);
    throw std::runtime_error(std::string("liveness: eventfd: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { loop(); });
}

liveness_responder::~liveness_responder() {
  stop_.store(true);
  wake(wake_);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
  ::close(wake_);
}

void liveness_responder::loop() {
  std::unique_ptr<phi_detector> watch;  // armed by the first ping
  bool reported = false;
  char buf[max_datagram + 1];
  while (!stop_.load()) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
    ::poll(p, 2, static_cast<int>(std::max(1.0, s_.heartbeat_ms / 2)));
    if (stop_.load()) break;
    for (;;) {
      sockaddr_storage from{};
      socklen_t len = sizeof from;
      const auto n = ::recvfrom(fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 0) break;
      std::uint32_t index = 0;
      std::uint64_t seq = 0;
      if (!parse_liveness_datagram(secret_, context_, "ping", buf, static_cast<std::size_t>(n), index, seq)) continue;
      const auto pong = liveness_datagram(secret_, context_, "pong", index, seq);
      ::sendto(fd_, pong.data(), pong.size(), 0, reinterpret_cast<sockaddr*>(&from), len);
      ++pongs_;
      if (!watch) watch = std::make_unique<phi_detector>(s_, now_ms());
      else watch->heartbeat(now_ms());
    }
    if (watch && !reported && watch->lost(now_ms())) {
      reported = true;
      char why[160];
      std::snprintf(why, sizeof why, "no heartbeat from the coordinator for %.0f ms (phi %.1f > %.0f)",
                    watch->silence_ms(now_ms()), watch->phi(now_ms()), s_.threshold);
      on_lost_(why);
    }
  }
}

// -- main's side ----------------------------------------------------------------------------------

liveness_monitor::liveness_monitor(const std::vector<peer>& peers, std::string secret, std::string context,
                                   phi_settings s, std::function<void(std::size_t)> on_pong,
                                   std::function<void(std::size_t, const std::string&)> on_lost)
    : secret_(std::move(secret)),
      context_(std::move(context)),
      s_(s),
      on_pong_(std::move(on_pong)),
      on_lost_(std::move(on_lost)) {
  auto close_all = [&] {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  };
  for (const auto& p : peers) {
    std::string why;
    const int fd = udp_socket(p.host, p.port, false, why);
    if (fd < 0) {
      close_all();
      throw std::runtime_error("liveness: cannot reach " + util::join_host_port(p.host, p.port) + " over UDP: " + why);
    }
    fds_.push_back(fd);
  }
  wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_ < 0) {
    close_all();
    throw std::runtime_error(std::string("liveness: eventfd: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { loop(); });
}

liveness_monitor::~liveness_monitor() {
  stop_.store(true);
  wake(wake_);
  if (thread_.joinable()) thread_.join();
  for (int fd : fds_) ::close(fd);
  ::close(wake_);
}

void liveness_monitor::loop() {
  const std::size_t n = fds_.size();
  std::vector<phi_detector> watch;
  std::vector<bool> reported(n, false);
  std::vector<std::uint64_t> answered(n, 0);  // the newest seq answered: a late duplicate counts once
  for (std::size_t i = 0; i < n; ++i) watch.emplace_back(s_, now_ms());
  std::uint64_t seq = 0;
  double next = now_ms();
  std::vector<pollfd> p(n + 1);
  char buf[max_datagram + 1];
  while (!stop_.load()) {
    if (now_ms() >= next) {
      ++seq;
      for (std::size_t i = 0; i < n; ++i) {
        const auto ping = liveness_datagram(secret_, context_, "ping", static_cast<std::uint32_t>(i), seq);
        // ECONNREFUSED (no responder any more) and the like: the silence is what counts
        if (::send(fds_[i], ping.data(), ping.size(), 0) >= 0) ++pings_;
      }
      next += s_.heartbeat_ms;
      if (next < now_ms()) next = now_ms() + s_.heartbeat_ms;  // a stalled thread does not burst
    }
    if (judging_.load())
      for (std::size_t i = 0; i < n; ++i) {
        const double t = now_ms();
        if (reported[i] || !watch[i].lost(t)) continue;
        reported[i] = true;
        char why[200];
        std::snprintf(why, sizeof why, "no heartbeat for %.0f ms (phi %.1f > %.0f; lost_after_ms = %.0f)",
                      watch[i].silence_ms(t), watch[i].phi(t), s_.threshold, s_.acceptable_pause_ms + s_.heartbeat_ms);
        on_lost_(i, why);
      }
    for (std::size_t i = 0; i < n; ++i) p[i] = {fds_[i], POLLIN, 0};
    p[n] = {wake_, POLLIN, 0};
    ::poll(p.data(), p.size(), static_cast<int>(std::clamp(next - now_ms(), 1.0, s_.heartbeat_ms)));
    for (std::size_t i = 0; i < n; ++i)
      for (;;) {
        const auto got = ::recv(fds_[i], buf, sizeof buf, 0);
        if (got < 0) break;
        std::uint32_t index = 0;
        std::uint64_t s = 0;
        if (!parse_liveness_datagram(secret_, context_, "pong", buf, static_cast<std::size_t>(got), index, s) ||
            index != i || s <= answered[i])
          continue;
        answered[i] = s;
        watch[i].heartbeat(now_ms());
        on_pong_(i);
      }
  }
}

}  // namespace flowrun::actor
