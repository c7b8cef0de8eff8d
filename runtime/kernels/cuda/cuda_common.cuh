// Internal helpers shared by the CUDA backend's .cu files (never included by
// non-CUDA code): error checks, the device guard, the current stream, the
// per-thread cuBLAS handle and scratch memory from the caching allocator.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace flowrun {
class backend;
}

namespace flowrun::cuda::detail {

/// Throws std::runtime_error "CUDA <what>: <error string>" unless e == cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}
/// Same for cuBLAS status codes.
inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS ") + what + ": " + cublasGetStatusString(s));
}
/// Checks the launch of the kernel just queued (configuration errors).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

/// Makes `device` current for the scope, restoring the previous one after.
class device_guard {
 public:
  explicit device_guard(int device) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~device_guard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int prev_ = 0;
};

/// The calling thread's current stream on `device` (memory.cu).
cudaStream_t stream(int device);
/// The calling thread's cuBLAS handle for `device`, set to stream(device) (memory.cu).
cublasHandle_t cublas(int device);
/// Caching-allocator entry points (memory.cu); alloc throws cuda::out_of_memory.
void* alloc(size_t bytes, int device);
void free(void* p, int device);

/// Device scratch memory from the caching allocator, returned to it on scope exit
/// (stream-ordered, so kernels queued before the free still see valid memory).
class scratch {
 public:
  scratch(size_t bytes, int device) : dev_(device) { p_ = bytes ? alloc(bytes, device) : nullptr; }
  ~scratch() {
    if (p_) free(p_, dev_);
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  int dev_ = 0;
};

/// The process-wide CUDA backend (cuda_backend.cu).
backend* backend_instance();

}  // namespace flowrun::cuda::detail
