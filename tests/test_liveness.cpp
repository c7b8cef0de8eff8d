// The liveness channel of cluster runs (runtime/actor/liveness.h): the φ accrual
// detector against the normal distribution it approximates, its bounds, the
// authenticated datagrams, and a monitor and responder over loopback UDP.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <fstream>
#include <vector>

#include "runtime/actor/liveness.h"

using namespace flowrun::actor;

namespace {
// P(X <= y) for a standard normal X, exactly (erfc), to check φ's logistic approximation.
double normal_cdf(double y) { return 0.5 * std::erfc(-y / std::sqrt(2.0)); }
double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

TEST_CASE("liveness: phi is -log10 of the normal tail (Hayashibara et al. 2004), to the logistic approximation") {
  // 1 - 10^-φ is the probability that the heartbeat would have come by now: the normal CDF.
  // Akka's PhiAccrualFailureDetectorSpec checks the same at y = 0, 0.6 and 1.5 (0.5, 0.7257, 0.9332).
  for (double y : {-3.0, -1.0, 0.0, 0.6, 1.0, 1.5, 2.0, 3.0, 4.0}) {
    const double cdf = 1.0 - std::pow(10.0, -phi(1000 + 100 * y, 1000, 100));
    INFO("y = " << y);
    CHECK(std::fabs(cdf - normal_cdf(y)) < 2e-3);
  }
  CHECK(phi(1000, 1000, 100) == doctest::Approx(-std::log10(0.5)).epsilon(1e-9));
  // monotone, and finite far out
  double last = -1;
  for (double t = 0; t < 5000; t += 50) {
    const double f = phi(t, 1000, 100);
    CHECK(f >= last);
    last = f;
  }
  CHECK(std::isfinite(phi(1e12, 1000, 100)));
  CHECK(phi(1e12, 1000, 100) <= 300);
}

TEST_CASE("liveness: a cluster's heartbeat_ms and lost_after_ms set the detector, a regular peer is lost just after lost_after_ms") {
  const auto s = phi_settings::for_cluster(500, 3000);
  CHECK(s.heartbeat_ms == 500);
  CHECK(s.acceptable_pause_ms == 2500);
  CHECK(s.min_std_ms == 100);
  CHECK(s.max_std_ms == 750);
  phi_detector d(s, 0);
  double t = 0;
  for (int i = 0; i < 400; ++i) d.heartbeat(t += 500);  // the seeds leave the window
  CHECK(d.mean_interval_ms() == doctest::Approx(500));
  CHECK(d.std_interval_ms() < 1e-6);
  // never before lost_after_ms of silence; with σ at its floor (100 ms), y* ≈ 5.2 later
  CHECK_FALSE(d.lost(t + 3000));
  CHECK_FALSE(d.lost(t + 3000 + 5.0 * 100));
  CHECK(d.lost(t + 3000 + 5.5 * 100));
}

TEST_CASE("liveness: a jittery peer gets a longer timeout, never longer than bound_ms") {
  const auto s = phi_settings::for_cluster(500, 3000);
  phi_detector d(s, 0);
  double t = 0;
  for (int i = 0; i < 400; ++i) d.heartbeat(t += (i % 2 ? 900 : 100));  // mean 500, σ 400
  CHECK(d.mean_interval_ms() == doctest::Approx(500));
  CHECK(d.std_interval_ms() == doctest::Approx(400));
  // a regular peer would be lost at 3550 ms; this one not before 3000 + 5·400
  CHECK_FALSE(d.lost(t + 3550));
  CHECK_FALSE(d.lost(t + 3000 + 5.0 * 400));
  CHECK(d.lost(t + 3000 + 5.5 * 400));
  // σ is capped at max_std_ms: a very irregular peer is still lost by bound_ms
  phi_detector w(s, 0);
  t = 0;
  for (int i = 0; i < 400; ++i) w.heartbeat(t += (i % 2 ? 2000 : 0));  // mean 1000, σ 1000 > 750
  const double bound = s.bound_ms(w.mean_interval_ms());
  CHECK(bound == doctest::Approx(1000 + 2500 + 750 * 5.2).epsilon(0.01));
  CHECK_FALSE(w.lost(t + bound - 50));
  CHECK(w.lost(t + bound + 1));
}

TEST_CASE("liveness: datagrams carry an HMAC of the run, kind, index and sequence number") {
  const auto d = liveness_datagram("s3cret", "run-1/1", "ping", 3, 77);
  std::uint32_t i = 0;
  std::uint64_t q = 0;
  REQUIRE(parse_liveness_datagram("s3cret", "run-1/1", "ping", d.data(), d.size(), i, q));
  CHECK(i == 3);
  CHECK(q == 77);
  CHECK_FALSE(parse_liveness_datagram("other", "run-1/1", "ping", d.data(), d.size(), i, q));   // secret
  CHECK_FALSE(parse_liveness_datagram("s3cret", "run-1/2", "ping", d.data(), d.size(), i, q));  // another attempt
  CHECK_FALSE(parse_liveness_datagram("s3cret", "run-1/1", "pong", d.data(), d.size(), i, q));  // kind
  std::string forged = d;
  forged[forged.find(" 77 ") + 2] = '8';  // seq 78 with 77's tag
  CHECK_FALSE(parse_liveness_datagram("s3cret", "run-1/1", "ping", forged.data(), forged.size(), i, q));
  for (const std::string bad : {std::string(), std::string("FRLV1 ping"), std::string("FRLV1 ping 1 2"),
                                std::string("FRLV1 ping 99999999999 1 x"), std::string(4096, 'A'),
                                std::string("FRLV1 ping -1 2 ") + std::string(32, 'a')})
    CHECK_FALSE(parse_liveness_datagram("s3cret", "run-1/1", "ping", bad.data(), bad.size(), i, q));
}

TEST_CASE("liveness: monitor and responder over loopback: answered while alive, lost within the bound when silent") {
  const auto s = phi_settings::for_cluster(50, 600);
  std::atomic<int> node_lost{0}, main_lost{0}, pongs{0};
  std::string main_why;
  auto responder = std::make_unique<liveness_responder>("127.0.0.1", "k", "run/1", s,
                                                        [&](const std::string&) { ++node_lost; });
  REQUIRE(responder->port() > 0);
  std::chrono::steady_clock::time_point silenced;
  auto monitor = std::make_unique<liveness_monitor>(
      std::vector<liveness_monitor::peer>{{"127.0.0.1", responder->port()}}, "k", "run/1", s,
      [&](std::size_t) { ++pongs; },
      [&](std::size_t i, const std::string& why) {
        CHECK(i == 0);
        main_why = why;
        ++main_lost;
      });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  CHECK(main_lost.load() == 0);
  CHECK(node_lost.load() == 0);
  CHECK(pongs.load() >= 10);
  CHECK(responder->pongs() >= 10);
  // the node goes silent (as a SIGSTOPped or cut-off node does): lost within bound_ms
  responder.reset();
  silenced = std::chrono::steady_clock::now();
  const double bound = s.bound_ms(200);  // mean interval under load at most 4 x heartbeat_ms
  while (main_lost.load() == 0 && ms_since(silenced) < bound + 2000)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double took = ms_since(silenced);
  CHECK(main_lost.load() == 1);
  CHECK(took >= 600 - 60);  // never before lost_after_ms of silence (less one heartbeat of phase)
  CHECK(took <= bound + 200);
  CHECK(main_why.find("no heartbeat for") == 0);
  MESSAGE("silent node lost after " << took << " ms (bound " << bound << " ms): " << main_why);
}

TEST_CASE("liveness: a node whose coordinator goes silent learns it, a wrong secret is never answered") {
  const auto s = phi_settings::for_cluster(50, 600);
  std::atomic<int> node_lost{0}, wrong_lost{0}, wrong_pongs{0};
  std::string node_why;
  liveness_responder responder("127.0.0.1", "k", "run/1", s, [&](const std::string& why) {
    node_why = why;
    ++node_lost;
  });
  {
    liveness_monitor monitor({{"127.0.0.1", responder.port()}}, "k", "run/1", s, [](std::size_t) {},
                             [](std::size_t, const std::string&) {});
    liveness_monitor stranger({{"127.0.0.1", responder.port()}}, "not-k", "run/1", s,
                              [&](std::size_t) { ++wrong_pongs; }, [&](std::size_t, const std::string&) { ++wrong_lost; });
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK(wrong_pongs.load() == 0);
    CHECK(wrong_lost.load() == 1);  // pings with the wrong secret get no answer
    CHECK(node_lost.load() == 0);
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (node_lost.load() == 0 && ms_since(t0) < 5000) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(node_lost.load() == 1);
  CHECK(node_why.find("no heartbeat from the coordinator") == 0);
}

TEST_CASE("liveness: a responder answers at every address of the machine (127.0.0.1, localhost, ::1)") {
  // main reaches a node at whatever its [cluster] host resolves to on main's side; the responder must not
  // depend on that being the first address its own listen host resolves to
  const auto s = phi_settings::for_cluster(50, 600);
  liveness_responder responder("localhost", "k", "run/1", s, [](const std::string&) {});
  std::vector<liveness_monitor::peer> peers{{"127.0.0.1", responder.port()}, {"localhost", responder.port()}};
  const bool ipv6 = std::ifstream("/proc/net/if_inet6").good();
  if (ipv6) peers.push_back({"::1", responder.port()});
  std::vector<std::atomic<int>> pongs(peers.size());
  std::atomic<int> lost{0};
  {
    liveness_monitor monitor(peers, "k", "run/1", s, [&](std::size_t i) { ++pongs[i]; },
                             [&](std::size_t, const std::string&) { ++lost; });
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  for (std::size_t i = 0; i < peers.size(); ++i) {
    INFO(peers[i].host);
    CHECK(pongs[i].load() >= 3);
  }
  CHECK(lost.load() == 0);
  MESSAGE("answered at " << peers.size() << " addresses" << (ipv6 ? "" : " (no IPv6 here: ::1 not tried)"));
}
