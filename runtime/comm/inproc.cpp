// The inproc backend: ranks are threads of one process, collectives read the
// peers' buffers directly.
//
// Every collective is: publish this rank's buffer pointers and arguments in
// the group's table, wait at the group barrier (A), compute, and (except for
// barrier) wait again (B) so that no rank returns, and lets its caller
// reuse a buffer, while a peer may still read it. Each rank writes only its
// own outputs. all_reduce splits the work: rank r reduces chunk r of every
// rank's x into a shared scratch buffer between A and B, and after B each
// rank copies the whole scratch into its x. The scratch is resized by the last
// rank to reach A of the next all_reduce, when nobody reads it any more.
//
// The barrier is generation-counted: the last rank to arrive checks that all
// ranks called the same op with the same arguments, bumps the generation and
// wakes the others. A wait that times out names the ranks that did not arrive
// and marks the group broken, which wakes and fails every waiting rank.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/reduce_kernels.h"
#include "runtime/tensor/device_memory.h"

namespace flowrun::comm {

namespace {

enum class op_kind : uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier };

const char* op_name(op_kind k) {
  switch (k) {
    case op_kind::all_gather:
      return "all_gather";
    case op_kind::reduce_scatter:
      return "reduce_scatter";
    case op_kind::all_reduce:
      return "all_reduce";
    case op_kind::broadcast:
      return "broadcast";
    case op_kind::barrier:
      return "barrier";
  }
  return "?";
}

/// What one rank published for the current collective.
struct entry {
  op_kind op = op_kind::barrier;
  const void* send = nullptr;  // all_gather/reduce_scatter: send; all_reduce/broadcast: x
  void* recv = nullptr;
  dtype type = dtype::f32;
  int64_t send_numel = 0;
  int64_t recv_numel = 0;
  int root = 0;
  reduce_op rop = reduce_op::sum;
  device send_dev, recv_dev;  // where send / recv live (host or a CUDA device)

  bool same_call(const entry& o) const {
    return op == o.op && type == o.type && send_numel == o.send_numel && recv_numel == o.recv_numel && root == o.root &&
           rop == o.rop;
  }
  std::string str() const {
    std::string s = op_name(op);
    if (op == op_kind::barrier) return s;
    s += "(";
    s += dtype_name(type);
    s += ", " + std::to_string(send_numel);
    if (op == op_kind::all_gather || op == op_kind::reduce_scatter) s += " -> " + std::to_string(recv_numel);
    s += " elements";
    if (op == op_kind::broadcast) s += ", root " + std::to_string(root);
    if (op == op_kind::all_reduce) s += std::string(", ") + reduce_op_name(rop);
    return s + ")";
  }
};

}  // namespace

class inproc_group {
 public:
  explicit inproc_group(int world) : world_(world), entries_(world), arrived_(world, 0), claimed_(world, 0) {}

  int world() const { return world_; }

  void claim(int rank) {
    std::lock_guard lk(mu_);
    if (claimed_[rank])
      throw std::invalid_argument("inproc_communicator: rank " + std::to_string(rank) +
                                  " of this group is already taken by another communicator");
    claimed_[rank] = 1;
  }
  void release(int rank) {
    std::lock_guard lk(mu_);
    claimed_[rank] = 0;
  }

  /// A point-to-point message: a copy of the sender's bytes.
  struct message {
    dtype type = dtype::f32;
    int64_t numel = 0;
    std::vector<unsigned char> bytes;
  };
  /// Queue a message from `src` to `dst` (send is buffered: returns at once).
  void post(int src, int dst, message m, const std::string& where) {
    {
      std::lock_guard lk(mu_);
      if (broken_) throw std::runtime_error(where + ": the inproc group is broken: " + broken_why_);
      mail_[{src, dst}].push_back(std::move(m));
    }
    cv_.notify_all();
  }
  /// The next message from `src` to `dst`, waiting up to `timeout` (then the group breaks).
  message take(int src, int dst, const std::string& where, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    auto& q = mail_[{src, dst}];
    const bool ok = cv_.wait_for(lk, timeout, [&] { return !q.empty() || broken_; });
    if (!q.empty()) {
      message m = std::move(q.front());
      q.pop_front();
      return m;
    }
    if (!ok) {
      broken_ = true;
      broken_why_ = where + ": timed out after " + std::to_string(timeout.count()) + " ms waiting for rank " +
                    std::to_string(src) + " to send";
      lk.unlock();
      cv_.notify_all();
      throw std::runtime_error(broken_why_);
    }
    throw std::runtime_error(where + ": the inproc group is broken: " + broken_why_);
  }

  entry& slot(int rank) { return entries_[rank]; }
  const entry& slot(int rank) const { return entries_[rank]; }
  unsigned char* scratch() { return scratch_.data(); }

  /// Waits until every rank has arrived. The last one to arrive checks the
  /// published entries (when `check`) and prepares the scratch buffer.
  /// Returns the check's complaint ("" when all ranks agree). Throws
  /// std::runtime_error on timeout or when the group is broken.
  std::string arrive_and_wait(int rank, const std::string& where, std::chrono::milliseconds timeout, bool check) {
    std::unique_lock lk(mu_);
    if (broken_) throw std::runtime_error(where + ": the inproc group is broken: " + broken_why_);
    arrived_[rank] = 1;
    if (++count_ == world_) {
      complaint_ = check ? check_entries() : std::string();
      if (complaint_.empty() && check && entries_[0].op == op_kind::all_reduce) {
        const size_t need = static_cast<size_t>(entries_[0].send_numel) * dtype_size(entries_[0].type);
        if (scratch_.size() < need) scratch_.resize(need);
      }
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), 0);
      ++generation_;
      std::string r = complaint_;
      lk.unlock();
      cv_.notify_all();
      return r;
    }
    const uint64_t gen = generation_;
    const bool done = cv_.wait_for(lk, timeout, [&] { return generation_ != gen || broken_; });
    if (generation_ != gen) return complaint_;
    if (!done) {
      std::string missing, present;
      for (int r = 0; r < world_; ++r) {
        std::string& list = arrived_[r] ? present : missing;
        list += (list.empty() ? "" : ", ") + std::to_string(r);
      }
      broken_ = true;
      broken_why_ = where + ": timed out after " + std::to_string(timeout.count()) + " ms waiting for rank(s) " +
                    missing + " to arrive (arrived: " + present + ")";
      lk.unlock();
      cv_.notify_all();
      throw std::runtime_error(broken_why_);
    }
    throw std::runtime_error(where + ": the inproc group is broken: " + broken_why_);
  }

  /// Marks the group broken (the first reason stays) and wakes every waiting rank.
  void mark_broken(const std::string& why) {
    {
      std::lock_guard lk(mu_);
      if (!broken_) {
        broken_ = true;
        broken_why_ = why;
      }
    }
    cv_.notify_all();
  }

 private:
  std::string check_entries() const {
    std::string bad;
    for (int r = 1; r < world_; ++r)
      if (!entries_[r].same_call(entries_[0])) bad += "; rank " + std::to_string(r) + " called " + entries_[r].str();
    if (bad.empty()) return "";
    return "the ranks called different collectives: rank 0 called " + entries_[0].str() + bad;
  }

  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int count_ = 0;
  std::vector<entry> entries_;
  std::vector<char> arrived_;
  std::vector<char> claimed_;
  std::vector<unsigned char> scratch_;
  std::string complaint_;
  std::map<std::pair<int, int>, std::deque<message>> mail_;  // (src, dst) -> FIFO
  bool broken_ = false;
  std::string broken_why_;
};

namespace {

bool on_host(device d) { return d.kind == device_kind::cpu; }

// Copies `bytes` between any two of host and device memory: memcpy on the host, the
// device's copy hook otherwise (device to device: queued on the calling thread's
// current stream; to or from the host: synchronous).
void copy_bytes(void* dst, device dst_dev, const void* src, device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (on_host(dst_dev) && on_host(src_dev)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const device d = on_host(dst_dev) ? src_dev : dst_dev;
  const device_memory_hooks* h = device_memory_for(d.kind);
  if (!h || !h->copy) throw std::runtime_error("inproc: no memory backend for " + d.str());
  h->copy(dst, dst_dev, src, src_dev, bytes);
}

// Rank-ordered reduction of `world` chunks of n elements (each on its device) into
// `out` (host). Device chunks are first copied to host buffers, so the result is
// bitwise the host reduction.
void reduce_chunks(dtype t, reduce_op op, void* out, const std::vector<const void*>& srcs,
                   const std::vector<device>& devs, int64_t n) {
  const size_t nb = static_cast<size_t>(n) * dtype_size(t);
  std::vector<std::vector<unsigned char>> staged;
  std::vector<const void*> host(srcs.size());
  for (size_t r = 0; r < srcs.size(); ++r) {
    if (on_host(devs[r])) {
      host[r] = srcs[r];
    } else {
      staged.emplace_back(nb);
      copy_bytes(staged.back().data(), device::cpu(), srcs[r], devs[r], nb);
      host[r] = staged.back().data();
    }
  }
  detail::reduce_ordered(t, op, out, host.data(), static_cast<int>(srcs.size()), n);
}

class inproc_comm final : public communicator {
 public:
  inproc_comm(std::shared_ptr<inproc_group> g, int rank, std::chrono::milliseconds timeout)
      : g_(std::move(g)), rank_(rank), timeout_(timeout) {
    g_->claim(rank_);
  }
  ~inproc_comm() override { g_->release(rank_); }
  void abort(const std::string& why) noexcept override {
    try {
      g_->mark_broken("rank " + std::to_string(rank_) + " failed: " + why);
    } catch (...) {  // a string that cannot be made: the waiting ranks time out as before
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return g_->world(); }
  std::string backend() const override { return "inproc"; }
  device tensor_device() const override { return device::cpu(); }
  bool takes(device d) const override {
    return on_host(d) || (d.kind == device_kind::cuda && cuda_device_present());
  }

 protected:
  void do_all_gather(const tensor& send, tensor& recv) override {
    publish({op_kind::all_gather, send.raw(), recv.raw(), send.type(), send.numel(), recv.numel(), 0,
             reduce_op::sum, send.dev(), recv.dev()});
    sync("all_gather", true);
    const size_t nb = send.nbytes();
    auto* out = static_cast<char*>(recv.raw());
    for (int r = 0; r < g_->world(); ++r) {
      const void* src = g_->slot(r).send;
      if (src != out + r * nb) copy_bytes(out + r * nb, recv.dev(), src, g_->slot(r).send_dev, nb);
    }
    sync("all_gather", false);
  }

  void do_reduce_scatter(const tensor& send, tensor& recv) override {
    publish({op_kind::reduce_scatter, send.raw(), recv.raw(), send.type(), send.numel(), recv.numel(), 0,
             reduce_op::sum, send.dev(), recv.dev()});
    sync("reduce_scatter", true);
    const int world = g_->world();
    const size_t off = static_cast<size_t>(rank_) * recv.nbytes();
    std::vector<const void*> srcs(world);
    std::vector<device> devs(world);
    bool host = on_host(recv.dev());
    for (int r = 0; r < world; ++r) {
      srcs[r] = static_cast<const char*>(g_->slot(r).send) + off;
      devs[r] = g_->slot(r).send_dev;
      host = host && on_host(devs[r]);
    }
    if (host) {
      detail::reduce_ordered(recv.type(), reduce_op::sum, recv.raw(), srcs.data(), world, recv.numel());
    } else {  // device memory: reduce on the host, copy the result back
      std::vector<unsigned char> out(recv.nbytes());
      reduce_chunks(recv.type(), reduce_op::sum, out.data(), srcs, devs, recv.numel());
      copy_bytes(recv.raw(), recv.dev(), out.data(), device::cpu(), out.size());
    }
    sync("reduce_scatter", false);
  }

  void do_all_reduce(tensor& x, reduce_op op) override {
    entry e{op_kind::all_reduce, x.raw(), nullptr, x.type(), x.numel(), x.numel(), 0, op, x.dev(), x.dev()};
    publish(e);
    sync("all_reduce", true);
    const int world = g_->world();
    const int64_t n = x.numel();
    const int64_t begin = n * rank_ / world, end = n * (rank_ + 1) / world;
    const size_t es = dtype_size(x.type());
    std::vector<const void*> srcs(world);
    std::vector<device> devs(world);
    for (int r = 0; r < world; ++r) {
      srcs[r] = static_cast<const char*>(g_->slot(r).send) + begin * es;
      devs[r] = g_->slot(r).send_dev;
    }
    if (end > begin) reduce_chunks(x.type(), op, g_->scratch() + begin * es, srcs, devs, end - begin);
    sync("all_reduce", false);
    copy_bytes(x.raw(), x.dev(), g_->scratch(), device::cpu(), x.nbytes());
  }

  void do_broadcast(tensor& x, int root) override {
    entry e{op_kind::broadcast, x.raw(), nullptr, x.type(), x.numel(), x.numel(), root, reduce_op::sum, x.dev(),
            x.dev()};
    publish(e);
    sync("broadcast", true);
    const void* src = g_->slot(root).send;
    if (rank_ != root && src != x.raw()) copy_bytes(x.raw(), x.dev(), src, g_->slot(root).send_dev, x.nbytes());
    sync("broadcast", false);
  }

  void do_barrier() override {
    publish({});
    sync("barrier", true);
  }

  void do_send(const tensor& x, int peer) override {
    inproc_group::message m;
    m.type = x.type();
    m.numel = x.numel();
    m.bytes.resize(x.nbytes());
    copy_bytes(m.bytes.data(), device::cpu(), x.raw(), x.dev(), x.nbytes());
    g_->post(rank_, peer, std::move(m), where("send"));
  }

  void do_recv(tensor& x, int peer) override {
    const std::string w = where("recv");
    auto m = g_->take(peer, rank_, w, timeout_);
    if (m.type != x.type() || m.numel != x.numel())
      throw std::invalid_argument(w + ": rank " + std::to_string(peer) + " sent " + dtype_name(m.type) + " (" +
                                  std::to_string(m.numel) + " elements), but x is " + x.str());
    copy_bytes(x.raw(), x.dev(), m.bytes.data(), device::cpu(), m.bytes.size());
  }

 private:
  void publish(const entry& e) { g_->slot(rank_) = e; }

  /// Waits for all ranks; `first` marks the wait after publishing, where the
  /// arguments are compared.
  void sync(const char* op, bool first) {
    const std::string complaint = g_->arrive_and_wait(rank_, where(op), timeout_, first);
    if (!complaint.empty()) throw std::invalid_argument(where(op) + ": " + complaint);
  }

  std::shared_ptr<inproc_group> g_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::shared_ptr<inproc_group> make_inproc_group(int world_size) {
  if (world_size < 1)
    throw std::invalid_argument("make_inproc_group: world_size must be >= 1, got " + std::to_string(world_size));
  return std::make_shared<inproc_group>(world_size);
}

std::unique_ptr<communicator> inproc_communicator(std::shared_ptr<inproc_group> group, int rank,
                                                  std::chrono::milliseconds timeout) {
  if (!group) throw std::invalid_argument("inproc_communicator: group is null (use make_inproc_group)");
  if (rank < 0 || rank >= group->world())
    throw std::invalid_argument("inproc_communicator: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(group->world()) + ")");
  if (timeout.count() <= 0) throw std::invalid_argument("inproc_communicator: timeout must be positive");
  return std::make_unique<inproc_comm>(std::move(group), rank, timeout);
}

}  // namespace flowrun::comm
