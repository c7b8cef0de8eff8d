// flowrun communicators: bulk-tensor collectives for ZeRO data parallelism.
//
// Layer 2 of docs/architecture.md (issue #5). Uses only layer 1 (tensors); no
// CAF, no models. One `communicator` object per rank; every rank of a group
// calls the same collectives, in the same order, with tensors of the same
// dtype and size. A communicator is NOT thread-safe: one thread drives it.
//
// Collectives (n = elements per rank, N = world_size):
//   all_gather      send (n) on every rank -> recv (N*n), rank r's send at [r*n, (r+1)*n)
//   reduce_scatter  send (N*n) -> recv (n) = sum over ranks of their send[rank*n, (rank+1)*n)
//   all_reduce      x (n) in place -> sum (or max) over ranks, the same on every rank
//   broadcast       x (n) in place -> root's x on every rank
//   barrier         returns once every rank has entered it
// Point to point (two ranks, not the whole group):
//   send / recv     x (n) from this rank to `peer`, which calls recv(x', this rank)
//                   with the same dtype and numel; the k-th send to a peer matches
//                   the peer's k-th recv from this rank (per-pair FIFO order).
// ZeRO uses them on flat buffers (tensor::flat_view): gradients are
// reduce-scattered into each rank's shard, the updated shards all-gathered.
//
// Shapes: only the element count matters (tensors are contiguous; any shape
// with the right numel is accepted). Dtypes: every op takes f32, bf16, f16,
// i32 and i64. all_gather and broadcast move plain bytes. Sums and maxima of
// bf16/f16 are computed in f32 and rounded back ONCE (round to nearest even)
// by the inproc and gloo backends; NCCL reduces bf16/f16 in its own kernels
// (see nccl_communicator). Integer sums wrap around (two's complement).
// max propagates NaN (inproc, gloo; NCCL's max follows its own kernels).
//
// Determinism: a reduction's result is bitwise identical on every rank and
// does not depend on timing. inproc sums in rank order 0, 1, ..., N-1; gloo
// and nccl sum along their ring (a fixed order per chunk, not rank order).
//
// Byte counting (comm_stats), the same convention for every backend and
// counted here in the base class, not measured on the wire: the bytes ONE
// rank sends under the bandwidth-optimal ring algorithms (Patarasuk & Yuan,
// "Bandwidth optimal all-reduce algorithms for clusters of workstations",
// JPDC 2009; the same factors as NCCL's "busBw" in nccl-tests'
// doc/PERFORMANCE.md), with B = the op's full-size tensor in bytes:
//   all_gather      (N-1) * (B / N)       B = recv bytes
//   reduce_scatter  (N-1) * (B / N)       B = send bytes
//   all_reduce      2 * (N-1) * (B / N)   B = x bytes (reduce-scatter + all-gather)
//   broadcast       (N-1) * (B / N)       B = x bytes (pipelined ring/scatter-allgather)
//   barrier         0
//   send            B                     B = x bytes (recv counts 0)
// in exact integer arithmetic (B / N rounds down). With N = 1 everything is 0.
// What a backend really sends may differ (gloo's broadcast goes from the
// root to each rank; gloo reduces bf16/f16 as f32, twice the bytes): the counters are for
// comparing runs and planning, by one formula.
//
// Errors: bad arguments (undefined tensor, dtype mismatch, wrong element
// count, wrong device, overlapping buffers, root out of range) throw
// std::invalid_argument naming the op, the rank and the tensors (dtype,
// shape, device). Communication failures (a peer that never arrives within
// the timeout, a broken connection) throw std::runtime_error naming the op
// and, where known, the missing ranks. After a communication failure the
// group is unusable: every later call on it throws.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/store.h"
#include "runtime/tensor/tensor.h"

namespace flowrun::comm {

/// Element-wise reduction of all_reduce (reduce_scatter always sums).
enum class reduce_op { sum, max };
/// "sum" | "max"
const char* reduce_op_name(reduce_op op);

/// What one rank's communicator has done since construction or reset_stats().
struct comm_stats {
  /// Bytes this rank sent by the ring convention in the file comment.
  int64_t bytes_sent = 0;
  /// Completed collective calls, barriers included.
  int64_t calls = 0;
  /// bytes_sent split by op: "all_gather", "reduce_scatter", "all_reduce",
  /// "broadcast", "barrier" (an op appears once it has been called).
  std::map<std::string, int64_t> bytes_by_op;
};

/// The byte-count convention as a function: the bytes one rank sends for
/// collective `op` ("all_gather", "reduce_scatter", "all_reduce", "broadcast",
/// "barrier") on a full-size tensor of `bytes` bytes in a group of
/// `world_size` ranks ("send": the bytes themselves, "recv": 0). Throws
/// std::invalid_argument for an unknown op or world_size < 1.
int64_t ring_bytes_sent(const std::string& op, int64_t bytes, int world_size);

/// One rank's end of a communication group. Subclasses implement the do_*
/// hooks; the public calls validate their arguments, handle world_size 1 and
/// empty tensors without communicating, and count bytes.
class communicator {
 public:
  virtual ~communicator();
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  /// This rank, in [0, world_size()).
  virtual int rank() const = 0;
  /// Number of ranks in the group (>= 1).
  virtual int world_size() const = 0;
  /// "inproc" | "gloo" | "nccl"
  virtual std::string backend() const = 0;
  /// The device whose tensors this communicator takes (cpu for inproc and
  /// gloo, cuda:i for nccl).
  virtual device tensor_device() const = 0;
  /// Whether this communicator takes tensors on `d`: tensor_device() only, except
  /// inproc, which takes host and CUDA tensors (ranks sharing a GPU; see
  /// inproc_communicator). Every tensor argument must pass this check.
  virtual bool takes(device d) const { return d == tensor_device(); }

  /// recv[r*n : (r+1)*n] = send of rank r, for every rank r; n = send.numel().
  /// send and recv: same dtype, on tensor_device(); recv.numel() must be
  /// world_size() * send.numel(). recv must not overlap send, except in place:
  /// send may be exactly recv.flat_view(rank()*n, {n}) (the same bytes), then
  /// this rank's part is already in place and is not copied.
  void all_gather(const tensor& send, tensor& recv);

  /// recv[i] = sum over ranks r of send_r[rank()*n + i], i < n = recv.numel().
  /// send.numel() must be world_size() * recv.numel(), same dtype, on
  /// tensor_device(). recv must not overlap send, except in place: recv may be
  /// exactly send.flat_view(rank()*n, {n}).
  void reduce_scatter(const tensor& send, tensor& recv);

  /// x = op over ranks of x, element-wise, in place; the result is bitwise the
  /// same on every rank. Every dtype; sum or max.
  void all_reduce(tensor& x, reduce_op op = reduce_op::sum);

  /// x = root's x on every rank (in place). root in [0, world_size()).
  void broadcast(tensor& x, int root);

  /// Returns once every rank has called barrier().
  void barrier();

  /// Point to point: send x (any shape; numel and dtype matter) to rank `peer`, which
  /// must call recv(y, rank()) with y of the same dtype and numel. x on tensor_device().
  /// peer in [0, world_size()) and != rank(), else std::invalid_argument. Empty tensors
  /// return at once on both sides. Semantics per backend: inproc buffers the message
  /// (send returns at once; recv waits up to the timeout); gloo and nccl return when the
  /// transfer has completed, so two ranks that both send to each other first deadlock
  /// until the timeout: order the calls (the lower rank sends first, say). Backends
  /// without point-to-point throw std::runtime_error ("... not supported by this backend").
  void send(const tensor& x, int peer);
  /// Receive into x (overwritten) the matching send of rank `peer` (see send). A
  /// message of another dtype or size throws std::invalid_argument naming both
  /// (inproc; gloo and nccl cannot tell and fail or truncate, as their own APIs do).
  void recv(tensor& x, int peer);

  /// Tagged point to point, for independent streams between the same two ranks
  /// (the cluster's bulk plane, runtime/actor/bulk_plane.h, moves each cross-node
  /// payload's tensors this way). send_tagged(x, peer, tag) matches the peer's
  /// recv_tagged(y, rank(), tag) with the same tag, whatever the order of the calls
  /// on either side, and each returns when its transfer has completed (or throws
  /// std::runtime_error at the communicator's timeout, or when the peer's
  /// connection drops). Unlike the other calls these are safe to call from several
  /// threads at once (one tag each), they do not mark the group broken when they
  /// fail, and they are not counted in stats() (the caller counts). A tag must be
  /// used once per ordered (sender, receiver) pair; tag < 2^56. x and y: same
  /// dtype and numel, on tensor_device(). Backends without it (inproc, nccl) throw
  /// std::runtime_error ("... not supported by this backend").
  void send_tagged(const tensor& x, int peer, uint64_t tag);
  /// Receive into x (overwritten) the send_tagged of rank `peer` with `tag` (see send_tagged).
  void recv_tagged(tensor& x, int peer, uint64_t tag);

  /// This rank fails and will call no more collectives (`why`: its error): the ranks waiting in a
  /// collective for it should fail now rather than at the timeout. inproc marks the group broken,
  /// which wakes every waiting rank with "the inproc group is broken: WHY"; gloo fails its TCP
  /// connections, so that a call waiting in this process (another thread: abort_registry.h) throws
  /// "aborted: WHY" at once and the peers' calls fail as the connections close; nccl does nothing
  /// (its peers time out). Thread-safe; never throws.
  virtual void abort(const std::string& why) noexcept { (void)why; }

  /// Counters since construction or the last reset_stats().
  comm_stats stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  communicator() = default;
  // The hooks run with validated arguments, world_size() > 1 and numel > 0.
  // all_gather's in-place case has send.raw() == recv slot rank().
  virtual void do_all_gather(const tensor& send, tensor& recv) = 0;
  virtual void do_reduce_scatter(const tensor& send, tensor& recv) = 0;
  virtual void do_all_reduce(tensor& x, reduce_op op) = 0;
  virtual void do_broadcast(tensor& x, int root) = 0;
  virtual void do_barrier() = 0;
  /// Point to point with a validated peer and numel > 0. The defaults throw
  /// std::runtime_error "<op> (...): not supported by this backend".
  virtual void do_send(const tensor& x, int peer);
  virtual void do_recv(tensor& x, int peer);
  virtual void do_send_tagged(const tensor& x, int peer, uint64_t tag);
  virtual void do_recv_tagged(tensor& x, int peer, uint64_t tag);
  /// "all_gather (rank 1 of 4, inproc)": the prefix of every error message.
  std::string where(const char* op) const;

 private:
  void count(const char* op, int64_t full_bytes);
  comm_stats stats_;
};

// ------------------------------------------------------------------ inproc

/// Shared state of an inproc group: a generation-counted barrier and a table
/// of the ranks' buffer pointers. Opaque; create with make_inproc_group.
class inproc_group;

/// A group of `world_size` (>= 1) ranks that are threads of this process.
/// Throws std::invalid_argument for world_size < 1.
std::shared_ptr<inproc_group> make_inproc_group(int world_size);

/// Rank `rank` of `group`. Each rank may be claimed once per group (a second
/// claim throws std::invalid_argument). Each collective waits at most
/// `timeout` for the other ranks; then it throws std::runtime_error naming
/// the op and the ranks that did not arrive, and the group is broken (every
/// later call on any rank throws). Collectives: publish this rank's pointers,
/// wait for all ranks, read the peers' buffers directly (no copies through
/// a channel), wait again so no buffer is reused while a peer reads it.
/// Reductions sum in rank order 0..N-1; all_reduce splits the work: rank r
/// reduces chunk r. The first wait also checks that every rank called the
/// same op with the same dtype and sizes (else every rank throws
/// std::invalid_argument naming the ranks that differ).
///
/// Device tensors: inproc also takes CUDA tensors (takes() is true for cpu and,
/// when the CUDA backend is present, cuda:i), e.g. ranks that are threads sharing
/// one GPU. all_gather, broadcast and send/recv copy through the tensor copy hooks
/// (device to device on the calling thread's current stream); reduce_scatter and
/// all_reduce read the ranks' chunks to the host, reduce there in rank order
/// (bitwise the CPU result) and copy the result back. The device path relies on
/// the ranks' threads sharing the device's default current stream (the backend's
/// default): a peer's buffer is read after the work that wrote it was queued, on
/// the same stream. Ranks with their own streams must synchronise them before a
/// collective. (tensor_device() stays cpu.)
std::unique_ptr<communicator> inproc_communicator(std::shared_ptr<inproc_group> group, int rank,
                                                  std::chrono::milliseconds timeout = std::chrono::seconds(300));

// ------------------------------------------------------------------ gloo

/// Settings of a gloo communicator (processes on one or several hosts).
struct gloo_options {
  int rank = 0;
  int world_size = 1;
  /// Rendezvous directory seen by every rank (created when missing): gloo's
  /// FileStore writes each rank's listening addresses there. Each rank
  /// deletes its records once the whole group has connected, so the same
  /// directory can be reused by the next job; a job that crashed during
  /// rendezvous may leave records behind: use a fresh directory or prefix.
  /// Ignored when `kv` is set.
  std::string store_dir;
  /// Rendezvous through this store instead of store_dir (e.g. the CAF store
  /// of caf_store.h, or a memory_store shared by threads): gloo's addresses
  /// go through an adapter to gloo::rendezvous::Store; each rank erases the
  /// keys it set once the group has connected.
  std::shared_ptr<store> kv;
  /// Key prefix inside store_dir or kv (gloo PrefixStore), to run several
  /// groups in one store at once.
  std::string prefix = "flowrun";
  /// Address this rank listens on and announces to its peers (gloo TCP
  /// transport). 127.0.0.1 for processes on one host; a host name or IP
  /// the other hosts can reach otherwise. Ignored when `iface` is set.
  std::string hostname = "127.0.0.1";
  /// Network interface to listen on (e.g. "eth0"), instead of hostname.
  std::string iface;
  /// How long rendezvous and each collective wait for the peers.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

/// A gloo communicator over TCP (libgloo-dev). Connects to all peers in the
/// constructor (waits up to options.timeout for every rank to rendezvous).
/// Every call is ours over gloo's unbound buffers (gloo_comm.cpp), so that
/// abort() can wake it from another thread: reduce_scatter and all_gather are
/// rings (N-1 steps; each rank sends (N-1)/N of the data, reduce_scatter
/// accumulating in f32 for bf16/f16); all_reduce is the two rings over the
/// tensor padded to N chunks (bf16/f16 in f32, rounded back once); broadcast
/// sends from the root to each rank; barrier is a one-byte all_gather.
/// Throws std::invalid_argument for bad options, std::runtime_error when the
/// rendezvous fails, and std::runtime_error ("flowrun was built without
/// gloo: ...") when this build has no gloo.
std::unique_ptr<communicator> gloo_communicator(const gloo_options& options);

// ------------------------------------------------------------------ nccl

/// Settings of an NCCL communicator (one GPU per rank).
struct nccl_options {
  int rank = 0;
  int world_size = 1;
  /// CUDA ordinal this rank uses; -1 = rank % (number of visible GPUs).
  int device_index = -1;
  /// Where rank 0 publishes the NCCL unique id and the others read it; rank 0
  /// erases it once every rank has joined. Required when world_size > 1
  /// (e.g. the CAF store of caf_store.h, which flowrun launch hosts, a
  /// file_store on a shared directory, or a memory_store shared by threads). A stale id left by a crashed job under the same key would make
  /// the other ranks join a dead group: use a job-specific key.
  std::shared_ptr<store> kv;
  /// Key of the unique id in `kv`; make it unique per job/group.
  std::string key = "flowrun/nccl_unique_id";
  /// How long ranks wait for the unique id and for each collective
  /// (ncclCommInitRank itself, once every rank has the id, has no timeout).
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

/// An NCCL communicator; tensors must be on cuda:device_index. Each call
/// runs on the communicator's own CUDA stream, which first waits (an event)
/// for the work queued on the calling thread's current stream of the device
/// (runtime/kernels/cuda/cuda_api.h: the backend's kernels, memsets and
/// copies), and returns after the collective has finished on the device; a call still running after
/// `timeout` aborts the communicator (ncclCommAbort) and throws
/// std::runtime_error. bf16/f16 reductions use ncclBfloat16/ncclHalf, which
/// NCCL reduces in its own kernels (rounding to bf16/f16 after each ring
/// step, not once as inproc/gloo do). Throws std::runtime_error ("flowrun
/// was built without NCCL ...") when this build has no CUDA/NCCL.
std::unique_ptr<communicator> nccl_communicator(const nccl_options& options);

// ------------------------------------------------------------------ by name

/// Everything make_communicator needs for any backend.
struct comm_options {
  /// "inproc" | "gloo" | "nccl"
  std::string backend = "inproc";
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  /// inproc: the group shared by the ranks' threads (required when
  /// world_size > 1; created for world_size 1 when null).
  std::shared_ptr<inproc_group> group;
  /// gloo: rendezvous directory, prefix, address (see gloo_options).
  std::string store_dir;
  std::string prefix = "flowrun";
  std::string hostname = "127.0.0.1";
  std::string iface;
  /// nccl: GPU ordinal (-1 = rank % GPUs).
  int device_index = -1;
  /// gloo and nccl: the rendezvous store (gloo's addresses; nccl's unique id
  /// under prefix + "/nccl_unique_id"), e.g. open_store("caf://HOST:PORT")
  /// (caf_store.h). When null, store_dir is used: gloo's FileStore, or a
  /// file_store for nccl.
  std::shared_ptr<store> kv;
};

/// The backends this build has, e.g. {"inproc", "gloo"}.
std::vector<std::string> available_backends();

/// A communicator of backend options.backend. Throws std::invalid_argument
/// for an unknown name (listing "inproc", "gloo", "nccl") and whatever the
/// chosen factory throws.
std::unique_ptr<communicator> make_communicator(const comm_options& options);

}  // namespace flowrun::comm
