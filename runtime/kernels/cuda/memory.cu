// CUDA device memory for flowrun tensors: the caching allocator, the streams
// and cuBLAS handles, and the device_memory_hooks of device_kind::cuda.
// The design and its guarantees are described in runtime/kernels/cuda/cuda_api.h.
//
// cuda_register_memory() is called by the tensor layer (runtime/tensor/tensor.cpp)
// the first time a CUDA tensor is allocated or cuda_device_present() is asked;
// when a GPU is present it registers both the memory hooks and the CUDA kernel
// backend (register_backend(device_kind::cuda, ...)), once per process.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/kernels/backend.h"
#include "runtime/kernels/cuda/cuda_api.h"
#include "runtime/kernels/cuda/cuda_common.cuh"
#include "runtime/tensor/device_memory.h"

namespace flowrun::cuda {

namespace detail {
namespace {

constexpr int k_max_devices = 64;
constexpr size_t k_small_granule = 512;
constexpr size_t k_large_granule = size_t{2} << 20;  // 2 MiB
constexpr size_t k_large_from = size_t{1} << 20;     // 1 MiB

int checked_device(int device) {
  if (device < 0 || device >= k_max_devices || device >= cuda::device_count())
    throw std::out_of_range("CUDA device ordinal " + std::to_string(device) + " out of range (" +
                            std::to_string(cuda::device_count()) + " devices)");
  return device;
}

// ---------------------------------------------------------------- streams

std::mutex g_stream_mutex;
cudaStream_t g_default_stream[k_max_devices] = {};
bool g_default_stream_made[k_max_devices] = {};
thread_local cudaStream_t t_stream[k_max_devices] = {};
thread_local bool t_stream_set[k_max_devices] = {};

cudaStream_t default_stream(int device) {
  std::lock_guard<std::mutex> lock(g_stream_mutex);
  if (!g_default_stream_made[device]) {
    device_guard g(device);
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    g_default_stream[device] = s;
    g_default_stream_made[device] = true;
  }
  return g_default_stream[device];
}

// ---------------------------------------------------------------- cuBLAS handles

/// The handles of one thread; destroyed when the thread exits.
struct thread_handles {
  cublasHandle_t h[k_max_devices] = {};
  ~thread_handles() {
    for (int d = 0; d < k_max_devices; ++d)
      if (h[d]) {
        int prev = 0;
        if (cudaGetDevice(&prev) != cudaSuccess) continue;
        cudaSetDevice(d);
        cublasDestroy(h[d]);
        cudaSetDevice(prev);
      }
  }
};
thread_local thread_handles t_handles;

// ---------------------------------------------------------------- the caching allocator

struct block {
  size_t size = 0;  // rounded
  int device = 0;
  cudaStream_t stream = nullptr;
};

struct device_pool {
  // free blocks by (stream, rounded size)
  std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> free_blocks;
  memory_stats stats;
};

// Leaked on purpose: tensors held by static objects may be freed after static
// destructors ran, so the allocator's state must outlive them.
struct allocator_state {
  std::mutex mutex;
  device_pool pools[k_max_devices];
  std::unordered_map<void*, block> live;  // blocks handed out, by pointer
};
allocator_state& state() {
  static allocator_state* s = new allocator_state;
  return *s;
}

/// cudaFree every cached block of `device`, after synchronising it (caller holds state().mutex).
void release_cached(int device) {
  device_pool& pool = state().pools[device];
  if (pool.free_blocks.empty()) return;
  device_guard g(device);
  cudaDeviceSynchronize();
  for (auto& [key, ptrs] : pool.free_blocks) {
    for (void* p : ptrs) {
      cudaFree(p);
      pool.stats.reserved -= key.second;
      pool.stats.cuda_free_calls += 1;
    }
  }
  pool.free_blocks.clear();
}

}  // namespace

void* alloc(size_t bytes, int device) {
  checked_device(device);
  const size_t size = cuda::round_size(bytes);
  cudaStream_t s = stream(device);
  std::lock_guard<std::mutex> lock(state().mutex);
  device_pool& pool = state().pools[device];
  pool.stats.alloc_calls += 1;
  void* p = nullptr;
  auto it = pool.free_blocks.find({s, size});
  if (it != pool.free_blocks.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) pool.free_blocks.erase(it);
    pool.stats.cache_hits += 1;
  } else {
    device_guard g(device);
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) allocation error
      pool.stats.oom_retries += 1;
      release_cached(device);
      e = cudaMalloc(&p, size);
      if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        throw out_of_memory("CUDA out of memory on cuda:" + std::to_string(device) + ": tried to allocate " +
                            std::to_string(bytes) + " bytes (" + std::to_string(size) + " rounded); " +
                            std::to_string(free_b) + " bytes free of " + std::to_string(total_b) +
                            "; this process holds " + std::to_string(pool.stats.allocated) +
                            " bytes in tensors (" + cudaGetErrorString(e) + ")");
      }
    }
    pool.stats.cuda_malloc_calls += 1;
    pool.stats.reserved += size;
  }
  pool.stats.allocated += size;
  pool.stats.peak_allocated = std::max(pool.stats.peak_allocated, pool.stats.allocated);
  state().live[p] = block{size, device, s};
  return p;
}

void free(void* p, int /*device*/) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(state().mutex);
  auto& live = state().live;
  auto it = live.find(p);
  if (it == live.end()) return;  // not ours (cannot happen for storage from alloc)
  const block b = it->second;
  live.erase(it);
  device_pool& pool = state().pools[b.device];
  pool.stats.allocated -= b.size;
  pool.free_blocks[{b.stream, b.size}].push_back(p);
}

cudaStream_t stream(int device) {
  if (t_stream_set[device]) return t_stream[device];
  return default_stream(device);
}

cublasHandle_t cublas(int device) {
  cublasHandle_t& h = t_handles.h[device];
  if (!h) {
    device_guard g(device);
    check_cublas(cublasCreate(&h), "cublasCreate");
    // fp32 GEMMs stay fp32 (no TF32), for parity with the CPU backend; the bf16 path
    // asks for CUBLAS_COMPUTE_32F explicitly.
    check_cublas(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  check_cublas(cublasSetStream(h, stream(device)), "cublasSetStream");
  return h;
}

namespace {

// ---------------------------------------------------------------- hooks for the tensor layer

void* hook_alloc(size_t bytes, int index) { return alloc(bytes, index); }
void hook_free(void* p, int index) { free(p, index); }

void hook_copy(void* dst, device dst_dev, const void* src, device src_dev, size_t bytes) {
  if (bytes == 0) return;
  const bool dst_gpu = dst_dev.kind == device_kind::cuda, src_gpu = src_dev.kind == device_kind::cuda;
  if (dst_gpu && !src_gpu) {  // host to device: the host buffer may be reused right after
    device_guard g(dst_dev.index);
    cudaStream_t s = stream(dst_dev.index);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (host to device)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  } else if (!dst_gpu && src_gpu) {  // device to host: wait for the kernels that wrote src
    device_guard g(src_dev.index);
    cudaStream_t s = stream(src_dev.index);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  } else if (dst_dev.index == src_dev.index) {  // same device: ordered on the stream
    device_guard g(dst_dev.index);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(dst_dev.index)),
          "cudaMemcpyAsync (device to device)");
  } else {  // peer copy: src must be complete; dst usable by the host's next call
    {
      device_guard g(src_dev.index);
      check(cudaStreamSynchronize(stream(src_dev.index)), "cudaStreamSynchronize");
    }
    device_guard g(dst_dev.index);
    cudaStream_t s = stream(dst_dev.index);
    check(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, bytes, s), "cudaMemcpyPeerAsync");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
}

void hook_memset0(void* p, size_t bytes, int index) {
  if (bytes == 0) return;
  device_guard g(index);
  check(cudaMemsetAsync(p, 0, bytes, stream(index)), "cudaMemsetAsync");
}

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------- public API (cuda_api.h)

int device_count() {
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return std::min(c, detail::k_max_devices);
  }();
  return n;
}

size_t round_size(size_t bytes) {
  if (bytes == 0) return detail::k_small_granule;
  if (bytes < detail::k_large_from)
    return (bytes + detail::k_small_granule - 1) / detail::k_small_granule * detail::k_small_granule;
  return (bytes + detail::k_large_granule - 1) / detail::k_large_granule * detail::k_large_granule;
}

memory_stats get_memory_stats(int device) {
  detail::checked_device(device);
  std::lock_guard<std::mutex> lock(detail::state().mutex);
  return detail::state().pools[device].stats;
}

void reset_peak_memory(int device) {
  detail::checked_device(device);
  std::lock_guard<std::mutex> lock(detail::state().mutex);
  auto& st = detail::state().pools[device].stats;
  st.peak_allocated = st.allocated;
}

void empty_cache() {
  std::lock_guard<std::mutex> lock(detail::state().mutex);
  for (int d = 0; d < device_count(); ++d) detail::release_cached(d);
}

void* current_stream(int device) {
  detail::checked_device(device);
  return detail::stream(device);
}

void set_current_stream(int device, void* stream) {
  detail::checked_device(device);
  detail::t_stream[device] = static_cast<cudaStream_t>(stream);
  detail::t_stream_set[device] = stream != nullptr;
}

void synchronize(int device) {
  detail::checked_device(device);
  detail::device_guard g(device);
  detail::check(cudaStreamSynchronize(detail::stream(device)), "cudaStreamSynchronize");
}

}  // namespace flowrun::cuda

namespace flowrun::detail {

/// Registers CUDA memory and the CUDA kernel backend; returns false when no GPU is
/// present. Thread-safe; the registration happens once.
bool cuda_register_memory() {
  static const bool ok = [] {
    if (cuda::device_count() == 0) return false;
    register_device_memory(device_kind::cuda, {cuda::detail::hook_alloc, cuda::detail::hook_free,
                                               cuda::detail::hook_copy, cuda::detail::hook_memset0});
    register_backend(device_kind::cuda, cuda::detail::backend_instance());
    return true;
  }();
  return ok;
}

}  // namespace flowrun::detail
