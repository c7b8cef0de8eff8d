// CUDA device memory for flowrun tensors: plain cudaMalloc underneath (no
// managed memory), registered as the device_memory_hooks of device_kind::cuda.
// The caching allocator and the op kernels come with the CUDA backend issue.
#include <cuda_runtime.h>

#include <new>
#include <stdexcept>
#include <string>

#include "runtime/tensor/device_memory.h"

namespace flowrun::detail {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

void* cuda_alloc(size_t bytes, int index) {
  check(cudaSetDevice(index), "cudaSetDevice");
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) throw std::bad_alloc();
  return p;
}

void cuda_free(void* p, int index) {
  cudaSetDevice(index);
  cudaFree(p);
}

void cuda_copy(void* dst, device dst_dev, const void* src, device src_dev, size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing picks the direction
  check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

void cuda_memset0(void* p, size_t bytes, int index) {
  check(cudaSetDevice(index), "cudaSetDevice");
  check(cudaMemset(p, 0, bytes), "cudaMemset");
}

}  // namespace

/// Registers CUDA memory with the tensor layer; returns false when no GPU is present.
bool cuda_register_memory() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  register_device_memory(device_kind::cuda, {cuda_alloc, cuda_free, cuda_copy, cuda_memset0});
  return true;
}

}  // namespace flowrun::detail
