// Layer 5, actor runtime: the bulk plane of a cluster run (docs/scaling.md).
//
// CAF carries a cluster's control messages and small payloads as bytes
// (payload_codec.h); tensors never go inside CAF messages. A payload that holds
// tensors (a model's weights, rollouts, scores, experience) crosses processes
// in two parts:
//
//   sender    encode_payload(p, &bulk) -> meta bytes + tensors
//             tags = plane.send(peer, tensors)       (returns at once; a thread
//                                                     of the plane sends them)
//             CAF: fr_rdata(link, order tag, type, header(tags, dtypes, shapes) + meta)
//   receiver  tensors = plane.recv(sender, header)   (blocks until they are here)
//             decode_payload(type, meta, &tensors)
//
// The tensors go through the process group's communicator (gloo over TCP on
// CPU, one rank per cluster process: rank = process index, main = 0) with
// tagged point-to-point (communicator::send_tagged), so transfers between
// the same two processes never need to be matched in order. Device tensors
// are staged through host memory (the plane's communicator is gloo).
//
// The sender never blocks an actor: each send() runs on a thread of its own
// that keeps the tensors alive until the peer has them. The receiver blocks
// its actor until the bytes are in; they were sent before the CAF message
// that announces them, so nothing but the network is waited for.
//
// This header includes no CAF.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/tensor/tensor.h"

namespace flowrun::actor {

/// What one bulk transfer announces in its CAF message: the first tag and, per
/// tensor, its dtype and shape. Travels as bytes (encode_header/decode_header).
struct bulk_header {
  std::uint64_t first_tag = 0;  ///< tensor i uses tag first_tag + i
  std::vector<dtype> types;
  std::vector<shape_t> shapes;
};

/// The header's bytes (little-endian integers), appended to `out`.
void encode_bulk_header(const bulk_header& h, std::vector<char>& out);
/// The most bytes one payload's tensors may announce together (64 GiB): the
/// receiver allocates what the header says before the bytes arrive, so a
/// header beyond this (or whose sizes overflow) is refused, not allocated.
inline constexpr std::uint64_t max_bulk_payload_bytes = std::uint64_t{1} << 36;

/// Reads a header from `bytes` at `at` (advanced past it). Throws
/// std::invalid_argument on truncated or implausible bytes (more than 4096
/// tensors, more than 8 dimensions, negative sizes, an unknown dtype, more
/// than max_bulk_payload_bytes in all).
bulk_header decode_bulk_header(const std::vector<char>& bytes, std::size_t& at);

/// Bytes moved by a plane since it was made (all ranks' transfers from/to this process).
struct bulk_stats {
  std::uint64_t sends = 0, recvs = 0;            ///< payloads (not tensors)
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t tensors_sent = 0, tensors_received = 0;
};

/// One process's end of the bulk plane. Thread-safe.
class bulk_plane {
 public:
  /// Takes a communicator whose rank is this process's index in the cluster's
  /// process list and whose world is the number of processes. It must support
  /// send_tagged / recv_tagged (gloo).
  explicit bulk_plane(std::shared_ptr<comm::communicator> comm);
  /// Does not wait. A completed job has no send in flight (every message was
  /// handled); a stopped one may leave payloads that nobody takes: their
  /// threads keep the communicator alive and end with an error when the
  /// peer's plane closes (its connections drop) or at the timeout.
  ~bulk_plane();
  bulk_plane(const bulk_plane&) = delete;
  bulk_plane& operator=(const bulk_plane&) = delete;

  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }

  /// Starts sending `tensors` (any dtype and device; device tensors are copied
  /// to the host first, on the calling thread) to rank `peer` on a thread of
  /// its own, and returns the header to put in the CAF message. A failed send
  /// is logged (the receiver fails with its own error) and counted in
  /// failed_sends().
  bulk_header send(int peer, const std::vector<tensor>& tensors);
  /// Receives the tensors that rank `peer` announced in `h` (CPU tensors of the
  /// header's dtypes and shapes). Blocks until they are in. Throws
  /// std::runtime_error (naming the peer, the tag and the reason) when the
  /// transfer fails or times out.
  std::vector<tensor> recv(int peer, const bulk_header& h);

  bulk_stats stats() const;
  std::uint64_t failed_sends() const;

 private:
  // Shared with the send threads, which may outlive the plane.
  struct state {
    std::mutex mutex;
    int in_flight = 0;
    std::uint64_t failed = 0;
    bulk_stats stats;
  };
  std::shared_ptr<comm::communicator> comm_;
  std::shared_ptr<state> st_ = std::make_shared<state>();
  std::atomic<std::uint64_t> next_tag_{1};
};

}  // namespace flowrun::actor
