// Layer 5, actor runtime: failure detection between the processes of a cluster run.
//
// Liveness does not travel with the work. Each side runs a plain thread with a
// UDP socket of its own: main's liveness_monitor pings every node each
// heartbeat_ms, and each node's liveness_responder answers at once. Neither
// thread touches CAF, so a heartbeat never waits behind a training step, the
// CAF scheduler, or the middleman's queue of bulky messages (the cause of
// false node losses under load, when heartbeats were CAF messages).
//
// Whether a silent peer is lost is decided by a φ accrual failure detector
// (Hayashibara, Défago, Yared, Katayama 2004, "The φ Accrual Failure
// Detector"; the form Akka and Cassandra use): from the recent inter-arrival
// times it computes φ = -log10(P(a heartbeat arrives later than now)), and a
// peer is lost when φ passes a threshold. A peer whose heartbeats arrive with
// more jitter gets a longer timeout by itself.
//
//   interval mean μ and standard deviation σ over the last `window` arrivals;
//   μ' = μ + acceptable_pause_ms,   σ' = clamp(σ, min_std_ms, max_std_ms);
//   y  = (t_since_last − μ') / σ';
//   φ  = −log10(1 − F(y)),  F the logistic approximation of the normal CDF
//        F(y) = 1 / (1 + exp(−y (1.5976 + 0.070566 y²)))   (Akka's, |error| < 1e-4).
//
// A cluster's heartbeat_ms and lost_after_ms give acceptable_pause_ms =
// lost_after_ms − heartbeat_ms, min_std_ms = heartbeat_ms / 5, max_std_ms =
// lost_after_ms / 4 and threshold 8. A peer is therefore never lost before
// lost_after_ms of silence, and a peer whose heartbeats were regular (σ at
// its floor) is lost after about lost_after_ms + 5.2 · heartbeat_ms / 5 of
// silence; in the worst case (σ at its ceiling) after μ + lost_after_ms −
// heartbeat_ms + 5.2 · lost_after_ms / 4, about 2.3 × lost_after_ms
// (phi_settings::bound_ms). A process that dies (SIGKILL) is found sooner: its
// CAF connection drops and the run learns at once.
//
// Datagrams are text, authenticated with the cluster secret:
//   "FRLV1 ping|pong INDEX SEQ TAG"   TAG = first 32 hex of HMAC-SHA256(secret, CONTEXT " " kind " " INDEX " " SEQ)
// where CONTEXT names the run and its attempt, so a datagram of another run or
// attempt (or a forged one) is dropped.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace flowrun::actor {

/// The accrual failure detector's settings (see the file comment for their use).
struct phi_settings {
  double heartbeat_ms = 500;          ///< expected interval between heartbeats; seeds the history
  double acceptable_pause_ms = 2500;  ///< added to the mean interval: silence tolerated without suspicion
  double min_std_ms = 100;            ///< floor of σ (a perfectly regular peer is not lost at the first late beat)
  double max_std_ms = 750;            ///< ceiling of σ: bounds the time to detect a silent peer
  double threshold = 8;               ///< φ above this: lost (P(late heartbeat) < 1e-8)
  std::size_t window = 200;           ///< inter-arrival times kept

  /// From a cluster's [cluster] heartbeat_ms and lost_after_ms (lost_after_ms >= 2 x heartbeat_ms).
  static phi_settings for_cluster(std::int64_t heartbeat_ms, std::int64_t lost_after_ms);
  /// The longest silence after which a peer is surely lost, whatever its history
  /// had been (σ at max_std_ms), when its mean interval is `mean_interval_ms`.
  double bound_ms(double mean_interval_ms) const;
};

/// φ for a silence of `elapsed_ms` when arrivals have mean `mean_ms` and standard
/// deviation `std_ms` (> 0): −log10(1 − F((elapsed − mean)/std)), F the logistic
/// approximation of the normal CDF (see the file comment). 0 at elapsed = −∞,
/// about 0.30 at elapsed = mean; finite for every finite input (capped at 300).
double phi(double elapsed_ms, double mean_ms, double std_ms);

/// The accrual detector for one peer. Not thread-safe: one owner thread.
class phi_detector {
 public:
  /// `now_ms`: the time the watch starts, as if a heartbeat had arrived then.
  phi_detector(const phi_settings& s, double now_ms);
  /// A heartbeat arrived at `now_ms` (monotonic, ms).
  void heartbeat(double now_ms);
  /// φ at `now_ms`.
  double phi(double now_ms) const;
  bool lost(double now_ms) const { return phi(now_ms) > s_.threshold; }
  double silence_ms(double now_ms) const { return now_ms - last_; }
  double mean_interval_ms() const;
  double std_interval_ms() const;  ///< before the clamp to [min_std_ms, max_std_ms]
  const phi_settings& settings() const { return s_; }

 private:
  phi_settings s_;
  double last_;
  std::deque<double> intervals_;
  double sum_ = 0, sum_sq_ = 0;
};

/// "FRLV1 KIND INDEX SEQ TAG" with its tag (see the file comment).
std::string liveness_datagram(const std::string& secret, const std::string& context, const std::string& kind,
                              std::uint32_t index, std::uint64_t seq);
/// Parses and authenticates a datagram of `kind`; false for anything else (wrong
/// kind, context or secret, malformed, oversized).
bool parse_liveness_datagram(const std::string& secret, const std::string& context, const std::string& kind,
                             const char* data, std::size_t size, std::uint32_t& index, std::uint64_t& seq);

/// A node's side: answers the coordinator's pings from a thread of its own and
/// watches them with a φ detector (armed by the first ping, so the time main
/// spends starting the other nodes does not count).
class liveness_responder {
 public:
  /// Binds a UDP socket on every address (IPv6 and IPv4 where the kernel allows
  /// both; `host`, the daemon's listen host, only names it in errors), port 0:
  /// main may reach this machine at another address than the first `host`
  /// resolves to here. `on_lost(why)` runs once, on the responder's
  /// thread, when the coordinator's pings stop. Throws std::runtime_error when
  /// the socket cannot be made.
  liveness_responder(const std::string& host, std::string secret, std::string context, phi_settings s,
                     std::function<void(const std::string&)> on_lost);
  ~liveness_responder();
  liveness_responder(const liveness_responder&) = delete;
  liveness_responder& operator=(const liveness_responder&) = delete;
  int port() const { return port_; }
  std::uint64_t pongs() const { return pongs_.load(); }

 private:
  void loop();
  std::string secret_, context_;
  phi_settings s_;
  std::function<void(const std::string&)> on_lost_;
  int fd_ = -1, wake_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> pongs_{0};
  std::thread thread_;
};

/// Main's side: pings each node every heartbeat_ms from a thread of its own and
/// reports a node lost when φ of its answers passes the threshold.
class liveness_monitor {
 public:
  struct peer {
    std::string host;  ///< the node's address (its [cluster.nodes] host)
    int port = 0;      ///< its responder's UDP port
  };
  /// `on_pong(i, silence_ms)` runs on each valid answer of peer i; `on_lost(i, why)`
  /// once when peer i is lost. Both run on the monitor's thread. Throws
  /// std::runtime_error when a peer's address does not resolve or no socket can be made.
  liveness_monitor(const std::vector<peer>& peers, std::string secret, std::string context, phi_settings s,
                   std::function<void(std::size_t)> on_pong,
                   std::function<void(std::size_t, const std::string&)> on_lost);
  ~liveness_monitor();
  liveness_monitor(const liveness_monitor&) = delete;
  liveness_monitor& operator=(const liveness_monitor&) = delete;
  /// Stops judging (the run is ending: sessions that close are not lost); pings go on.
  void stop_judging() { judging_.store(false); }
  std::uint64_t pings() const { return pings_.load(); }

 private:
  void loop();
  std::string secret_, context_;
  phi_settings s_;
  std::function<void(std::size_t)> on_pong_;
  std::function<void(std::size_t, const std::string&)> on_lost_;
  std::vector<int> fds_;  // one connected UDP socket per peer
  int wake_ = -1;
  std::atomic<bool> stop_{false}, judging_{true};
  std::atomic<std::uint64_t> pings_{0};
  std::thread thread_;
};

}  // namespace flowrun::actor
