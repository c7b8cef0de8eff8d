// The NCCL backend: one GPU per rank, tensors on device::cuda.
//
// Compiled with FLOWRUN_HAVE_NCCL (a CUDA build that found nccl.h and
// libnccl); otherwise the factory throws. Rank 0 creates the NCCL unique id
// and publishes it in the store; the other ranks read it (waiting up to the
// timeout), then all call ncclCommInitRank. Each collective is enqueued on
// the communicator's own stream and waited for by polling cudaStreamQuery
// and ncclCommGetAsyncError, so a peer that never arrives ends in
// ncclCommAbort and a std::runtime_error instead of a hang.
#include <stdexcept>
#include <string>

#include "runtime/comm/communicator.h"

#ifdef FLOWRUN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/kernels/cuda/cuda_api.h"
#endif

namespace flowrun::comm {

#ifdef FLOWRUN_HAVE_NCCL

namespace {

bool in_progress(ncclResult_t r) {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 21400
  return r == ncclInProgress;
#else
  (void)r;
  return false;
#endif
}

ncclDataType_t nccl_type(dtype t) {
  switch (t) {
    case dtype::f32:
      return ncclFloat32;
    case dtype::bf16:
      return ncclBfloat16;
    case dtype::f16:
      return ncclFloat16;
    case dtype::i32:
      return ncclInt32;
    case dtype::i64:
      return ncclInt64;
  }
  throw std::logic_error("nccl: unknown dtype");
}

class nccl_comm final : public communicator {
 public:
  explicit nccl_comm(const nccl_options& o) : rank_(o.rank), world_(o.world_size), timeout_(o.timeout) {
    const std::string w = "nccl init (rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ")";
    int count = 0;
    cuda_check(cudaGetDeviceCount(&count), w.c_str(), "cudaGetDeviceCount");
    if (count == 0) throw std::runtime_error(w + ": no CUDA device is visible");
    dev_ = o.device_index >= 0 ? o.device_index : rank_ % count;
    if (dev_ >= count)
      throw std::invalid_argument(w + ": device_index " + std::to_string(dev_) + " but only " + std::to_string(count) +
                                  " GPU(s) are visible");
    if (world_ == 1) return;  // the base class never calls the hooks
    cuda_check(cudaSetDevice(dev_), w.c_str(), "cudaSetDevice");

    ncclUniqueId id;
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), w.c_str(), "ncclGetUniqueId");
      std::vector<uint8_t> bytes(sizeof(id));
      std::memcpy(bytes.data(), &id, sizeof(id));
      o.kv->set(o.key, bytes);
    } else {
      std::vector<uint8_t> bytes;
      try {
        bytes = o.kv->get(o.key, timeout_);
      } catch (const std::exception& e) {
        throw std::runtime_error(w + ": rank 0 did not publish the NCCL unique id: " + e.what());
      }
      if (bytes.size() != sizeof(id))
        throw std::runtime_error(w + ": the record '" + o.key + "' holds " + std::to_string(bytes.size()) +
                                 " bytes, not an NCCL unique id (" + std::to_string(sizeof(id)) + " bytes)");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    // Waits for every rank (NCCL has no timeout here).
    nccl_check(ncclCommInitRank(&comm_, world_, id, rank_), w.c_str(), "ncclCommInitRank");
    cuda_check(cudaStreamCreate(&stream_), w.c_str(), "cudaStreamCreate");  // blocking: orders after stream 0
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), w.c_str(), "cudaEventCreate");
    cuda_check(cudaMalloc(&flag_, sizeof(int32_t)), w.c_str(), "cudaMalloc");
    cuda_check(cudaMemset(flag_, 0, sizeof(int32_t)), w.c_str(), "cudaMemset");
    // Every rank has read the id once all pass this barrier: remove it, so a
    // later job on the same store cannot pick up a stale id.
    do_barrier();
    if (rank_ == 0) o.kv->erase(o.key);
  }

  ~nccl_comm() override {
    if (world_ == 1) return;
    cudaSetDevice(dev_);
    if (comm_) {
      if (aborted_)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    if (stream_) cudaStreamDestroy(stream_);
    if (ready_) cudaEventDestroy(ready_);
    if (flag_) cudaFree(flag_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "nccl"; }
  device tensor_device() const override { return device::cuda(dev_); }

 protected:
  void do_all_gather(const tensor& send, tensor& recv) override {
    // Plain bytes; in place when send is recv's slot `rank` (NCCL allows it).
    run("all_gather", [&] { return ncclAllGather(send.raw(), recv.raw(), send.nbytes(), ncclUint8, comm_, stream_); });
  }

  void do_reduce_scatter(const tensor& send, tensor& recv) override {
    run("reduce_scatter", [&] {
      return ncclReduceScatter(send.raw(), recv.raw(), static_cast<size_t>(recv.numel()), nccl_type(recv.type()),
                               ncclSum, comm_, stream_);
    });
  }

  void do_all_reduce(tensor& x, reduce_op op) override {
    run("all_reduce", [&] {
      return ncclAllReduce(x.raw(), x.raw(), static_cast<size_t>(x.numel()), nccl_type(x.type()),
                           op == reduce_op::sum ? ncclSum : ncclMax, comm_, stream_);
    });
  }

  void do_broadcast(tensor& x, int root) override {
    run("broadcast", [&] { return ncclBroadcast(x.raw(), x.raw(), x.nbytes(), ncclUint8, root, comm_, stream_); });
  }

  // ncclSend/ncclRecv (NCCL >= 2.7) of plain bytes; each call waits for its transfer.
  void do_send(const tensor& x, int peer) override {
    run("send", [&] { return ncclSend(x.raw(), x.nbytes(), ncclUint8, peer, comm_, stream_); });
  }

  void do_recv(tensor& x, int peer) override {
    run("recv", [&] { return ncclRecv(x.raw(), x.nbytes(), ncclUint8, peer, comm_, stream_); });
  }

  void do_barrier() override {
    run("barrier", [&] { return ncclAllReduce(flag_, flag_, 1, ncclInt32, ncclSum, comm_, stream_); });
  }

 private:
  static void cuda_check(cudaError_t e, const char* where, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(where) + ": " + what + ": " + cudaGetErrorString(e));
  }
  static void nccl_check(ncclResult_t r, const char* where, const char* what) {
    if (r != ncclSuccess) throw std::runtime_error(std::string(where) + ": " + what + ": " + ncclGetErrorString(r));
  }

  /// Enqueues `enqueue` and waits for it on the device, with the timeout.
  template <class F>
  void run(const char* op, F&& enqueue) {
    const std::string w = where(op);
    if (aborted_) throw std::runtime_error(w + ": the NCCL communicator was aborted by an earlier error");
    cuda_check(cudaSetDevice(dev_), w.c_str(), "cudaSetDevice");
    // The backend's kernels run on a non-blocking stream (runtime/kernels/cuda/cuda_api.h):
    // wait for the work queued there (a memset of recv, a kernel that wrote x) first.
    cuda_check(cudaEventRecord(ready_, static_cast<cudaStream_t>(flowrun::cuda::current_stream(dev_))), w.c_str(),
               "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), w.c_str(), "cudaStreamWaitEvent");
    const ncclResult_t r = enqueue();
    if (r != ncclSuccess) {
      fail();
      throw std::runtime_error(w + ": " + ncclGetErrorString(r));
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    int spins = 0;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        fail();
        throw std::runtime_error(w + ": cudaStreamQuery: " + cudaGetErrorString(e));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && !in_progress(async)) {
        fail();
        throw std::runtime_error(w + ": NCCL error: " + ncclGetErrorString(async));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        fail();
        throw std::runtime_error(w + ": timed out after " + std::to_string(timeout_.count()) +
                                 " ms (did every rank call it?); the communicator was aborted");
      }
      if (++spins < 1000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void fail() {
    if (!aborted_ && comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
  }

  int rank_, world_;
  int dev_ = 0;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the backend's current stream before each call
  void* flag_ = nullptr;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<communicator> nccl_communicator(const nccl_options& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw std::invalid_argument("nccl_communicator: rank " + std::to_string(o.rank) + " is not in [0, world_size " +
                                std::to_string(o.world_size) + ")");
  if (o.world_size > 1 && !o.kv)
    throw std::invalid_argument("nccl_communicator: options.kv (a store shared by the ranks) is null");
  if (o.timeout.count() <= 0) throw std::invalid_argument("nccl_communicator: timeout must be positive");
  return std::make_unique<nccl_comm>(o);
}

#else  // !FLOWRUN_HAVE_NCCL

std::unique_ptr<communicator> nccl_communicator(const nccl_options&) {
  throw std::runtime_error(
      "flowrun was built without NCCL: the nccl backend needs a CUDA build (FLOWRUN_CUDA, nvcc under "
      "/usr/local/cuda) with nccl.h and libnccl; use the gloo or inproc backend instead");
}

#endif

}  // namespace flowrun::comm
