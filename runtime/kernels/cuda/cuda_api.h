// The CUDA backend's public controls: the caching allocator's statistics,
// emptying its cache, and the per-thread current stream.
//
// This header includes no CUDA header (a stream is passed as void*, i.e. a
// cudaStream_t), so any file may include it; the functions are defined only in
// builds with FLOWRUN_HAVE_CUDA (runtime/kernels/cuda/memory.cu), so call them
// under `#ifdef FLOWRUN_HAVE_CUDA` and after `cuda_device_present()`.
//
// Memory model (runtime/kernels/cuda/memory.cu):
//  - Tensors on device_kind::cuda get their storage from a caching allocator
//    (the idea of PyTorch's CUDACachingAllocator, much simplified): a request is
//    rounded up (to a multiple of 512 B below 1 MiB, to a multiple of 2 MiB from
//    1 MiB) and served from a free list of blocks of exactly that rounded size,
//    kept per (device, stream); only on a miss is cudaMalloc called (never
//    managed memory). Freeing a tensor returns its block to the list of the
//    stream it was allocated on, so reuse is ordered by that stream: a kernel
//    still queued on the stream that reads the old tensor runs before any
//    kernel that writes the new one. A tensor used on a stream other than the
//    one current at its allocation must be synchronised by the caller before it
//    is freed (as with torch's record_stream).
//  - When cudaMalloc fails, the allocator synchronises the device, returns every
//    cached block of the device to the driver (empty_cache) and tries once more;
//    if that fails too it throws flowrun::cuda::out_of_memory (a std::bad_alloc)
//    whose what() names the bytes asked for and the bytes free on the device.
//  - Streams: every kernel, cuBLAS call, memset and copy of the backend runs on
//    the calling thread's current stream of the tensor's device. By default
//    that is one non-blocking stream per device, created on first use and
//    shared by all threads (so all work of a device is ordered, as on the CPU);
//    `set_current_stream` overrides it for the calling thread. Copies between
//    host and device synchronise that stream before returning, so CPU code
//    (tensor::to(cpu), to_floats, item) always sees finished results; device to
//    device copies and memsets are only ordered on the stream.
//  - cuBLAS: one handle per (thread, device), set to the current stream before
//    each call, math mode CUBLAS_DEFAULT_MATH (fp32 GEMMs stay fp32: no TF32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

namespace flowrun::cuda {

/// The caching allocator's counters for one device (bytes are rounded sizes).
struct memory_stats {
  size_t allocated = 0;       ///< bytes in blocks handed out and not yet freed
  size_t reserved = 0;        ///< bytes obtained from cudaMalloc and not yet cudaFree'd (allocated + cached)
  size_t peak_allocated = 0;  ///< maximum of `allocated` since start-up or reset_peak_memory
  int64_t alloc_calls = 0;    ///< allocations served (hits + misses)
  int64_t cache_hits = 0;     ///< allocations served from a free list
  int64_t cuda_malloc_calls = 0;  ///< successful cudaMalloc calls
  int64_t cuda_free_calls = 0;    ///< cudaFree calls (empty_cache)
  int64_t oom_retries = 0;        ///< cudaMalloc failures followed by empty_cache and a retry
};

/// Thrown when device memory runs out even after emptying the cache.
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

/// Number of CUDA devices (0 when none or the driver is missing).
int device_count();

/// Counters of device `device`. Throws std::out_of_range for a bad ordinal.
memory_stats get_memory_stats(int device);
/// Sets peak_allocated to the current allocated bytes.
void reset_peak_memory(int device);
/// The size a request of `bytes` is rounded to (512 B granules below 1 MiB, 2 MiB above).
size_t round_size(size_t bytes);
/// Returns every cached (free) block of every device to the driver (cudaFree),
/// after synchronising the devices. Blocks in use are untouched.
void empty_cache();

/// The calling thread's current stream on `device` (a cudaStream_t).
void* current_stream(int device);
/// Makes `stream` (a cudaStream_t created by the caller on `device`, or nullptr
/// for the backend's default stream of the device) the calling thread's current
/// stream on `device`. The caller keeps ownership of the stream.
void set_current_stream(int device, void* stream);
/// Waits for all work queued on the calling thread's current stream of `device`.
void synchronize(int device);

}  // namespace flowrun::cuda
