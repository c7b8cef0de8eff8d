// The gloo backend: processes on one or several hosts, TCP transport,
// rendezvous through gloo's FileStore on a shared directory, or through any
// flowrun store (gloo_options::kv, e.g. the CAF store) via store_adapter.
//
// all_gather, all_reduce, broadcast and barrier call gloo's collectives
// (options API: gloo/allgather.h, allreduce.h, broadcast.h, barrier.h).
// gloo's ring all-reduce reduces each segment along the ring in a fixed
// order and then all-gathers the owner's result, so every rank ends with the
// same bytes. bf16/f16 are all-reduced as f32 and rounded back once.
//
// reduce_scatter: gloo's ReduceScatterHalvingDoubling has a different
// interface (in place, counts per rank, halving-doubling traffic), so this is
// a ring over unbound buffers: in step s (0 <= s < N-1) rank r sends its
// partial sum of chunk (r-s-1) mod N to rank r+1 and receives the partial of
// chunk (r-s-2) mod N from rank r-1, adding its own contribution; after
// N-1 steps it holds chunk r summed over all ranks. Each rank sends exactly
// (N-1) chunks: the ring volume. Partials travel in f32 for bf16/f16.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/reduce_kernels.h"

#ifdef FLOWRUN_HAVE_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
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
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "gloo"; }
  device tensor_device() const override { return device::cpu(); }

 protected:
  void do_all_gather(const tensor& send, tensor& recv) override {
    guarded("all_gather", [&] {
      gloo::AllgatherOptions opts(ctx_);
      auto* out = static_cast<uint8_t*>(recv.raw());
      const size_t nb = send.nbytes();
      if (send.raw() != out + static_cast<size_t>(rank_) * nb)
        opts.setInput<uint8_t>(const_cast<uint8_t*>(static_cast<const uint8_t*>(send.raw())), nb);
      opts.setOutput<uint8_t>(out, recv.nbytes());
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  void do_reduce_scatter(const tensor& send, tensor& recv) override {
    guarded("reduce_scatter", [&] { ring_reduce_scatter(send, recv); });
  }

  void do_all_reduce(tensor& x, reduce_op op) override {
    guarded("all_reduce", [&] {
      const dtype t = x.type(), w = detail::wire_type(t);
      const int64_t n = x.numel();
      void* buf = x.raw();
      std::vector<float> wide;
      if (w != t) {
        wide.resize(static_cast<size_t>(n));
        detail::to_wire(t, x.raw(), wide.data(), n);
        buf = wide.data();
      }
      gloo::AllreduceOptions opts(ctx_);
      switch (w) {
        case dtype::f32:
          opts.setOutput(static_cast<float*>(buf), static_cast<size_t>(n));
          break;
        case dtype::i32:
          opts.setOutput(static_cast<int32_t*>(buf), static_cast<size_t>(n));
          break;
        case dtype::i64:
          opts.setOutput(static_cast<int64_t*>(buf), static_cast<size_t>(n));
          break;
        default:
          throw std::logic_error("gloo all_reduce: unexpected wire dtype");
      }
      opts.setReduceFunction(
          [w, op](void* c, const void* a, const void* b, size_t k) { detail::combine(w, op, c, a, b, k); });
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
      if (w != t) detail::from_wire(t, wide.data(), x.raw(), n);
    });
  }

  void do_broadcast(tensor& x, int root) override {
    guarded("broadcast", [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<uint8_t*>(x.raw()), x.nbytes());
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void do_barrier() override {
    guarded("barrier", [&] { gloo_barrier(); });
  }

  void do_send(const tensor& x, int peer) override {
    guarded("send", [&] {
      auto buf = ctx_->createUnboundBuffer(const_cast<void*>(x.raw()), x.nbytes());
      buf->send(peer, gloo::Slot::build(kP2PSlotPrefix, sent_to_[peer]++), 0, x.nbytes());
      if (!buf->waitSend(timeout_)) throw std::runtime_error("sending to rank " + std::to_string(peer) + " was aborted");
    });
  }

  void do_recv(tensor& x, int peer) override {
    guarded("recv", [&] {
      auto buf = ctx_->createUnboundBuffer(x.raw(), x.nbytes());
      buf->recv(peer, gloo::Slot::build(kP2PSlotPrefix, received_from_[peer]++), 0, x.nbytes());
      if (!buf->waitRecv(timeout_))
        throw std::runtime_error("receiving from rank " + std::to_string(peer) + " was aborted");
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
  static std::shared_ptr<gloo::transport::Device> make_device(const gloo_options& o) {
    gloo::transport::tcp::attr attr;
    if (!o.iface.empty())
      attr.iface = o.iface;
    else
      attr.hostname = o.hostname;
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
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(next_tag());
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  }

  template <class F>
  void guarded(const char* op, F&& f) {
    if (!broken_.empty())
      throw std::runtime_error(where(op) + ": the gloo group is broken by an earlier error: " + broken_);
    try {
      f();
    } catch (const std::exception& e) {
      broken_ = e.what();
      throw std::runtime_error(where(op) + ": " + e.what());
    }
  }

  void ring_reduce_scatter(const tensor& send, tensor& recv) {
    const int N = world_, r = rank_;
    const dtype t = send.type(), w = detail::wire_type(t);
    const int64_t n = recv.numel();
    const size_t es = dtype_size(t), cb = static_cast<size_t>(n) * dtype_size(w);
    const int right = (r + 1) % N, left = (r + N - 1) % N;
    auto mod = [N](int c) { return ((c % N) + N) % N; };
    auto own = [&](int c) { return static_cast<const char*>(send.raw()) + static_cast<size_t>(c) * n * es; };

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
      try {
        if (!in_buf->waitRecv(timeout_)) throw std::runtime_error("aborted");
      } catch (const std::exception& e) {
        throw std::runtime_error("step " + std::to_string(s) + " of the ring: waiting for rank " +
                                 std::to_string(left) + ": " + e.what());
      }
      const int c = mod(r - s - 2);  // the chunk just received; c == r in the last step
      if (s < N - 2)
        detail::accumulate(t, reduce_op::sum, in, own(c), acc[1 - cur], n, false);
      else
        detail::accumulate(t, reduce_op::sum, in, own(c), recv.raw(), n, true);
      if (!acc_buf[cur]->waitSend(timeout_))
        throw std::runtime_error("sending to rank " + std::to_string(right) + " was aborted");
    }
  }

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 0;
  std::map<int, uint32_t> sent_to_, received_from_;  // point-to-point message counts per peer
  std::string broken_;
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
