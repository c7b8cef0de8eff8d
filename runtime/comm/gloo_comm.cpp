// The gloo backend: processes on one or several hosts, TCP transport,
// rendezvous through gloo's FileStore on a shared directory, or through any
// flowrun store (gloo_options::kv, e.g. the CAF store) via store_adapter.
//
// gloo gives the transport (TCP pairs, unbound buffers) and the rendezvous;
// the collectives are rings over unbound buffers this file owns, so that
// abort() can wake a collective waiting in another thread: gloo's own
// collectives (gloo/allgather.h, ...) keep their buffers to themselves and
// wait out their timeout. Rings (Patarasuk & Yuan, JPDC 2009):
//
// reduce_scatter: in step s (0 <= s < N-1) rank r sends its partial sum of
// chunk (r-s-1) mod N to rank r+1 and receives the partial of chunk
// (r-s-2) mod N from rank r-1, adding its own contribution; after N-1 steps
// it holds chunk r summed over all ranks. Each rank sends exactly (N-1)
// chunks: the ring volume. Partials travel in f32 for bf16/f16.
//
// all_gather: in step s rank r sends chunk (r-s) mod N to rank r+1 and
// receives chunk (r-s-1) mod N from rank r-1.
//
// all_reduce: the reduce-scatter ring over the tensor in its wire type,
// zero-padded to N equal chunks, then the all-gather ring: chunk c is summed
// in one fixed order (along the ring, ending at rank c) and every rank ends
// with the same bytes. bf16/f16 are reduced as f32 and rounded back once.
//
// broadcast: the root sends x to every other rank. barrier: an all_gather of
// one byte per rank (a rank's byte travels only once it has entered).
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/reduce_kernels.h"

#ifdef FLOWRUN_HAVE_GLOO
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#endif

namespace flowrun::comm {

#ifdef FLOWRUN_HAVE_GLOO

namespace {

// Slot prefix of flowrun's own ring reduce-scatter; gloo's collectives use
// 0x01..0x08 (gloo/types.h).
constexpr uint8_t kReduceScatterSlotPrefix = 0x46;
// The all-gather ring (all_gather, all_reduce's second half, barrier) and broadcast.
constexpr uint8_t kAllGatherSlotPrefix = 0x49;
constexpr uint8_t kBroadcastSlotPrefix = 0x4a;
// all_reduce's reduce-scatter ring moves each chunk in segments of this many bytes (a multiple of
// every wire type's size), at most kSegmentsAhead of them in flight, reducing one while the next arrive.
constexpr size_t kSegmentBytes = size_t{1} << 20;
constexpr size_t kSegmentsAhead = 4;
// Slot prefix of point-to-point send/recv; the tag counts the messages of one (src, dst) pair.
constexpr uint8_t kP2PSlotPrefix = 0x47;
// send_tagged / recv_tagged: the caller's tag is the slot.
constexpr uint8_t kTaggedSlotPrefix = 0x48;

// gloo's rendezvous Store interface over a flowrun store. Remembers the keys
// it set, so the rank can erase its records once the group has connected.
class store_adapter final : public gloo::rendezvous::Store {
 public:
  store_adapter(std::shared_ptr<store> kv, std::chrono::milliseconds timeout) : kv_(std::move(kv)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    kv_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
    written_.push_back(key);
  }
  std::vector<char> get(const std::string& key) override {
    auto v = kv_->get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& k : keys) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      kv_->get(k, std::max(left, std::chrono::milliseconds(1)));
    }
  }
  /// Erases the keys this rank set (errors ignored: cleanup only).
  void erase_written() {
    for (const auto& k : written_) {
      try {
        kv_->erase(k);
      } catch (const std::exception&) {
      }
    }
    written_.clear();
  }

 private:
  std::shared_ptr<store> kv_;
  std::chrono::milliseconds timeout_;
  std::vector<std::string> written_;
};

class gloo_comm final : public communicator {
 public:
  explicit gloo_comm(const gloo_options& o) : rank_(o.rank), world_(o.world_size), timeout_(o.timeout) {
    if (world_ > 1) connect(o);
    connected_ = world_ > 1;
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "gloo"; }
  device tensor_device() const override { return device::cpu(); }

  /// Wakes every wait of this rank's calls in flight (another thread's: they throw "aborted: WHY"),
  /// makes every later call throw, and closes the group's connections, so the peers' calls fail
  /// too ("Connection reset by peer") instead of waiting out their timeout. Before the group has
  /// connected it does nothing (the rendezvous waits out its timeout). The tagged calls (the bulk
  /// plane's) are not counted in flight: abort a bulk plane by closing it.
  void abort(const std::string& why) noexcept override {
    try {
      {
        std::lock_guard<std::mutex> lock(abort_mutex_);
        if (!aborted_.empty() || !connected_.load()) return;
        aborted_ = why.empty() ? std::string("(no reason given)") : why;
        for (auto* b : in_flight_) {
          b->abortWaitRecv();
          b->abortWaitSend();
        }
      }
      ctx_->closeConnections();
    } catch (...) {  // never throws: the peers time out as before
    }
  }

 protected:
  void do_all_gather(const tensor& send, tensor& recv) override {
    guarded("all_gather", [&] {
      auto* out = static_cast<char*>(recv.raw());
      const size_t nb = send.nbytes();
      if (send.raw() != out + static_cast<size_t>(rank_) * nb) std::memcpy(out + static_cast<size_t>(rank_) * nb, send.raw(), nb);
      ring_all_gather(out, nb);
    });
  }

  void do_reduce_scatter(const tensor& send, tensor& recv) override {
    guarded("reduce_scatter", [&] {
      ring_reduce_scatter(send.raw(), send.type(), recv.numel(), recv.raw(), reduce_op::sum);
    });
  }

  void do_all_reduce(tensor& x, reduce_op op) override {
    guarded("all_reduce", [&] {
      const dtype t = x.type(), w = detail::wire_type(t);
      const int64_t n = x.numel();
      if (w == t) return ring_all_reduce(x.raw(), w, n, op);
      std::vector<float> wide(static_cast<size_t>(n));  // bf16/f16: reduced in f32, rounded back once
      detail::to_wire(t, x.raw(), wide.data(), n);
      ring_all_reduce(wide.data(), w, n, op);
      detail::from_wire(t, wide.data(), x.raw(), n);
    });
  }

  void do_broadcast(tensor& x, int root) override {
    guarded("broadcast", [&] {
      auto buf = ctx_->createUnboundBuffer(x.raw(), x.nbytes());
      const auto slot = gloo::Slot::build(kBroadcastSlotPrefix, next_tag());
      if (rank_ != root) {
        buf->recv(root, slot, 0, x.nbytes());
        wait(*buf, true, "waiting for the root, rank " + std::to_string(root));
        return;
      }
      for (int p = 0; p < world_; ++p)
        if (p != root) buf->send(p, slot, 0, x.nbytes());
      for (int p = 0; p < world_ - 1; ++p) wait(*buf, false, "sending to the other ranks");
    });
  }

  void do_barrier() override {
    guarded("barrier", [&] { gloo_barrier(); });
  }

  void do_send(const tensor& x, int peer) override {
    guarded("send", [&] {
      auto buf = ctx_->createUnboundBuffer(const_cast<void*>(x.raw()), x.nbytes());
      buf->send(peer, gloo::Slot::build(kP2PSlotPrefix, sent_to_[peer]++), 0, x.nbytes());
      wait(*buf, false, "sending to rank " + std::to_string(peer));
    });
  }

  void do_recv(tensor& x, int peer) override {
    guarded("recv", [&] {
      auto buf = ctx_->createUnboundBuffer(x.raw(), x.nbytes());
      buf->recv(peer, gloo::Slot::build(kP2PSlotPrefix, received_from_[peer]++), 0, x.nbytes());
      wait(*buf, true, "receiving from rank " + std::to_string(peer));
    });
  }

  // Thread-safe: a fresh unbound buffer per call, and no shared state but the
  // context (gloo's pairs lock themselves); a failure does not break the group.
  void do_send_tagged(const tensor& x, int peer, uint64_t tag) override {
    if (!ctx_) throw std::runtime_error(where("send_tagged") + ": not connected");
    try {
      auto buf = ctx_->createUnboundBuffer(const_cast<void*>(x.raw()), x.nbytes());
      buf->send(peer, gloo::Slot::build(kTaggedSlotPrefix, tag), 0, x.nbytes());
      if (!buf->waitSend(timeout_)) throw std::runtime_error("aborted");
    } catch (const std::exception& e) {
      throw std::runtime_error(where("send_tagged") + ": to rank " + std::to_string(peer) + ", tag " +
                               std::to_string(tag) + ": " + e.what());
    }
  }

  void do_recv_tagged(tensor& x, int peer, uint64_t tag) override {
    if (!ctx_) throw std::runtime_error(where("recv_tagged") + ": not connected");
    try {
      auto buf = ctx_->createUnboundBuffer(x.raw(), x.nbytes());
      buf->recv(peer, gloo::Slot::build(kTaggedSlotPrefix, tag), 0, x.nbytes());
      if (!buf->waitRecv(timeout_)) throw std::runtime_error("aborted");
    } catch (const std::exception& e) {
      throw std::runtime_error(where("recv_tagged") + ": from rank " + std::to_string(peer) + ", tag " +
                               std::to_string(tag) + ": " + e.what());
    }
  }

 private:
  // The TCP device every rendezvous uses: on o.iface, else on o.hostname.
  // A host name that does not resolve is refused here: Debian's gloo (CreateDeviceAttr) read the failed
  // lookup's result and crashed the process (SIGSEGV, no message) in most runs of a cluster whose
  // [cluster] main_address did not resolve.
  static std::shared_ptr<gloo::transport::Device> make_device(const gloo_options& o) {
    gloo::transport::tcp::attr attr;
    if (!o.iface.empty()) {
      attr.iface = o.iface;
    } else {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      if (const int rc = ::getaddrinfo(o.hostname.c_str(), nullptr, &hints, &found); rc != 0)
        throw std::runtime_error("the host '" + o.hostname + "' does not resolve (" + ::gai_strerror(rc) + ")");
      ::freeaddrinfo(found);
      attr.hostname = o.hostname;
    }
    return gloo::transport::tcp::CreateDevice(attr);
  }

  void connect(const gloo_options& o) {
    if (o.kv) return connect_kv(o);
    const std::string w = "gloo rendezvous (rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
                          ", store " + o.store_dir + ", prefix '" + o.prefix + "')";
    std::error_code ec;
    std::filesystem::create_directories(o.store_dir, ec);
    if (!std::filesystem::is_directory(o.store_dir))
      throw std::runtime_error(w + ": cannot create the store directory: " + ec.message());
    std::unique_ptr<gloo::rendezvous::FileStore> files;
    try {
      auto dev = make_device(o);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, world_);
      ctx->setTimeout(timeout_);
      files = std::make_unique<gloo::rendezvous::FileStore>(o.store_dir);
      gloo::rendezvous::PrefixStore prefixed(o.prefix, *files);
      ctx->connectFullMesh(prefixed, dev);
      ctx_ = ctx;
      // Every rank has read every address once all have passed this barrier:
      // remove our records so the directory can host the next job.
      gloo_barrier();
      for (const auto& path : files->getAllKeyFilePaths()) std::remove(path.c_str());
    } catch (const std::exception& e) {
      ctx_.reset();
      // The group failed: do not leave our address behind for the next job.
      if (files)
        for (const auto& path : files->getAllKeyFilePaths()) std::remove(path.c_str());
      throw std::runtime_error(w + " failed: " + e.what() +
                               " (did every rank start with the same store_dir and prefix? records left by a "
                               "crashed job make the next rendezvous fail: use a fresh directory or prefix)");
    }
  }

  // The same over a flowrun store (gloo_options::kv).
  void connect_kv(const gloo_options& o) {
    const std::string w = "gloo rendezvous (rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
                          ", a flowrun store, prefix '" + o.prefix + "')";
    store_adapter adapter(o.kv, timeout_);
    try {
      auto dev = make_device(o);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, world_);
      ctx->setTimeout(timeout_);
      gloo::rendezvous::PrefixStore prefixed(o.prefix, adapter);
      ctx->connectFullMesh(prefixed, dev);
      ctx_ = ctx;
      // Every rank has read every address once all have passed this barrier.
      gloo_barrier();
      adapter.erase_written();
    } catch (const std::exception& e) {
      ctx_.reset();
      adapter.erase_written();
      throw std::runtime_error(w + " failed: " + e.what() +
                               " (did every rank start with the same store and prefix?)");
    }
  }

  uint32_t next_tag() { return ++tag_; }

  void gloo_barrier() {
    std::vector<char> bytes(static_cast<size_t>(world_), 1);
    ring_all_gather(bytes.data(), 1);
  }

  // Waits for one receive (recv) or send completion of `buf`, which abort() can wake from another
  // thread; throws std::runtime_error naming `what` when it was aborted or failed.
  void wait(gloo::transport::UnboundBuffer& buf, bool recv, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (!aborted_.empty()) throw std::runtime_error("aborted: " + aborted_);
      in_flight_.insert(&buf);
    }
    bool done = false;
    std::exception_ptr failed;
    try {
      done = recv ? buf.waitRecv(timeout_) : buf.waitSend(timeout_);
    } catch (...) {
      failed = std::current_exception();
    }
    std::string aborted;
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      in_flight_.erase(&buf);
      aborted = aborted_;
    }
    if (!aborted.empty()) throw std::runtime_error(what + ": aborted: " + aborted);
    if (failed) {
      try {
        std::rethrow_exception(failed);
      } catch (const std::exception& e) {
        throw std::runtime_error(what + ": " + e.what());
      }
    }
    if (!done) throw std::runtime_error(what + ": aborted");
  }

  template <class F>
  void guarded(const char* op, F&& f) {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (broken_.empty() && !aborted_.empty()) broken_ = "aborted: " + aborted_;
    }
    if (!broken_.empty())
      throw std::runtime_error(where(op) + ": the gloo group is broken by an earlier error: " + broken_);
    try {
      f();
    } catch (const std::exception& e) {
      broken_ = e.what();
      throw std::runtime_error(where(op) + ": " + e.what());
    }
  }

  // The reduce-scatter ring (top of the file): `send` holds N chunks of n elements of dtype t; `out`
  // (n elements of t) gets chunk rank() reduced with `op` over the ranks. `out` may be send's chunk
  // rank() (all_reduce's case): that chunk is read only in the last step, where it is written.
  void ring_reduce_scatter(const void* send, dtype t, int64_t n, void* out, reduce_op op) {
    const int N = world_, r = rank_;
    const dtype w = detail::wire_type(t);
    const size_t es = dtype_size(t), cb = static_cast<size_t>(n) * dtype_size(w);
    const int right = (r + 1) % N, left = (r + N - 1) % N;
    auto mod = [N](int c) { return ((c % N) + N) % N; };
    auto own = [&](int c) { return static_cast<const char*>(send) + static_cast<size_t>(c) * n * es; };

    std::unique_ptr<unsigned char[]> mem(new unsigned char[3 * cb]);
    unsigned char* acc[2] = {mem.get(), mem.get() + cb};
    unsigned char* in = mem.get() + 2 * cb;
    std::unique_ptr<gloo::transport::UnboundBuffer> acc_buf[2] = {ctx_->createUnboundBuffer(acc[0], cb),
                                                                  ctx_->createUnboundBuffer(acc[1], cb)};
    auto in_buf = ctx_->createUnboundBuffer(in, cb);
    const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());

    detail::to_wire(t, own(mod(r - 1)), acc[0], n);
    for (int s = 0; s < N - 1; ++s) {
      const int cur = s & 1;
      in_buf->recv(left, slot, 0, cb);
      acc_buf[cur]->send(right, slot, 0, cb);
      wait(*in_buf, true, "step " + std::to_string(s) + " of the ring: waiting for rank " + std::to_string(left));
      const int c = mod(r - s - 2);  // the chunk just received; c == r in the last step
      if (s < N - 2)
        detail::accumulate(t, op, in, own(c), acc[1 - cur], n, false);
      else
        detail::accumulate(t, op, in, own(c), out, n, true);
      wait(*acc_buf[cur], false, "step " + std::to_string(s) + " of the ring: sending to rank " + std::to_string(right));
    }
  }

  // The all-gather ring (top of the file) in place over `buf` (the whole data): chunk c is the bytes
  // [at(c), at(c + 1)); this rank's is filled, afterwards every chunk is its rank's.
  template <class At>
  void ring_all_gather(gloo::transport::UnboundBuffer& buf, At at) {
    const int N = world_, r = rank_;
    const int right = (r + 1) % N, left = (r + N - 1) % N;
    auto mod = [N](int c) { return ((c % N) + N) % N; };
    const auto slot = gloo::Slot::build(kAllGatherSlotPrefix, next_tag());
    for (int s = 0; s < N - 1; ++s) {
      const int in = mod(r - s - 1), out = mod(r - s);
      buf.recv(left, slot, at(in), at(in + 1) - at(in));
      buf.send(right, slot, at(out), at(out + 1) - at(out));
      wait(buf, true, "step " + std::to_string(s) + " of the all-gather ring: waiting for rank " + std::to_string(left));
      wait(buf, false, "step " + std::to_string(s) + " of the all-gather ring: sending to rank " + std::to_string(right));
    }
  }

  // The same over N chunks of `nb` bytes, this rank's at rank() * nb.
  void ring_all_gather(void* data, size_t nb) {
    auto buf = ctx_->createUnboundBuffer(data, nb * static_cast<size_t>(world_));
    ring_all_gather(*buf, [nb](int c) { return static_cast<size_t>(c) * nb; });
  }

  // all_reduce (top of the file) in place on n elements of the wire type w: chunk c is the elements
  // [c·n/N + min(c, n mod N), ...), the first n mod N chunks one longer. The reduce-scatter ring
  // accumulates each received partial into x's own chunk (partial op own, as ring_reduce_scatter), so
  // rank r ends with chunk r reduced; the all-gather ring then sends the reduced chunks around.
  void ring_all_reduce(void* x, dtype w, int64_t n, reduce_op op) {
    const int N = world_, r = rank_;
    const int right = (r + 1) % N, left = (r + N - 1) % N;
    auto mod = [N](int c) { return ((c % N) + N) % N; };
    const size_t es = dtype_size(w);
    const int64_t base = n / N, extra = n % N;
    auto at = [&](int c) { return static_cast<size_t>(c * base + std::min<int64_t>(c, extra)) * es; };
    auto* bytes = static_cast<unsigned char*>(x);
    auto buf = ctx_->createUnboundBuffer(x, static_cast<size_t>(n) * es);
    // Each chunk travels in segments of kSegmentBytes, received into kSegmentsAhead slots of scratch_:
    // a segment is reduced while the next ones arrive, and the receive into its slot is posted again
    // only then (sends and receives of one slot between two ranks match in order).
    if (scratch_.empty()) scratch_.resize(kSegmentsAhead * kSegmentBytes);
    auto in_buf = ctx_->createUnboundBuffer(scratch_.data(), scratch_.size());
    auto seg_len = [](size_t total, size_t k) { return std::min(kSegmentBytes, total - std::min(total, k * kSegmentBytes)); };
    auto segments = [](size_t total) { return std::max<size_t>(1, (total + kSegmentBytes - 1) / kSegmentBytes); };
    const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
    for (int s = 0; s < N - 1; ++s) {
      const int out = mod(r - s - 1), c = mod(r - s - 2);  // send partial of chunk out, receive chunk c's
      const size_t cb = at(c + 1) - at(c), ob = at(out + 1) - at(out), K = segments(cb), KO = segments(ob);
      auto post_recv = [&](size_t k) {
        in_buf->recv(left, slot, (k % kSegmentsAhead) * kSegmentBytes, seg_len(cb, k));
      };
      for (size_t k = 0; k < std::min(K, kSegmentsAhead); ++k) post_recv(k);
      for (size_t k = 0; k < KO; ++k) buf->send(right, slot, at(out) + k * kSegmentBytes, seg_len(ob, k));
      for (size_t k = 0; k < K; ++k) {
        wait(*in_buf, true, "step " + std::to_string(s) + " of the ring: waiting for rank " + std::to_string(left));
        unsigned char* own = bytes + at(c) + k * kSegmentBytes;
        const unsigned char* partial = scratch_.data() + (k % kSegmentsAhead) * kSegmentBytes;
        detail::combine(w, op, own, partial, own, seg_len(cb, k) / es);  // partial op own
        if (k + kSegmentsAhead < K) post_recv(k + kSegmentsAhead);
      }
      for (size_t k = 0; k < KO; ++k)
        wait(*buf, false, "step " + std::to_string(s) + " of the ring: sending to rank " + std::to_string(right));
    }
    ring_all_gather(*buf, at);
  }

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 0;
  std::map<int, uint32_t> sent_to_, received_from_;  // point-to-point message counts per peer
  std::string broken_;
  // abort() from any thread: connected_ once ctx_ is set for good; aborted_ the first abort's reason;
  // in_flight_ the buffers whose completion a call of this rank waits for (wait())
  std::atomic<bool> connected_{false};
  std::mutex abort_mutex_;
  std::string aborted_;
  std::set<gloo::transport::UnboundBuffer*> in_flight_;
  std::vector<unsigned char> scratch_;  // all_reduce's receive slots (ring_all_reduce)
};

}  // namespace

std::unique_ptr<communicator> gloo_communicator(const gloo_options& o) {
  // gloo's TCP pairs write with writev, which cannot pass MSG_NOSIGNAL: a write to a peer that died in
  // the middle of a transfer (a SIGKILLed cluster node) raises SIGPIPE, which by default ends this
  // process without a word. (In one cluster_rlhf_small run under a CPU hog a surviving node's daemon
  // vanished with nothing logged right after its peer was killed; this is the likely cause.) Ignored, the
  // write fails with EPIPE and gloo throws, which the callers report.
  static const bool sigpipe_ignored = [] { return std::signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();
  (void)sigpipe_ignored;
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw std::invalid_argument("gloo_communicator: rank " + std::to_string(o.rank) + " is not in [0, world_size " +
                                std::to_string(o.world_size) + ")");
  if (o.world_size > 1 && o.store_dir.empty() && !o.kv)
    throw std::invalid_argument(
        "gloo_communicator: neither kv (a store shared by the ranks) nor store_dir (a rendezvous directory every rank "
        "can see) is set");
  if (o.timeout.count() <= 0) throw std::invalid_argument("gloo_communicator: timeout must be positive");
  return std::make_unique<gloo_comm>(o);
}

#else  // !FLOWRUN_HAVE_GLOO

std::unique_ptr<communicator> gloo_communicator(const gloo_options&) {
  throw std::runtime_error("flowrun was built without gloo: install libgloo-dev (tools/setup.sh) and rebuild");
}

#endif

}  // namespace flowrun::comm
