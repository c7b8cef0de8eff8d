// models/train/zero_device.h: conversions and the overflow check of the ZeRO engine on CUDA.
#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "models/train/zero_device.h"
#include "runtime/tensor/half_bits.h"
#include "runtime/kernels/cuda/cuda_api.h"

namespace flowrun::detail {

namespace {

// The host's conversions (runtime/tensor/half_bits.h, also behind tensor.cpp's float_to_bf16 & co.).
__device__ uint16_t d_float_to_bf16(float f) { return half_bits::bf16_from_f32(__float_as_uint(f)); }
__device__ float d_bf16_to_float(uint16_t h) { return __uint_as_float(half_bits::f32_from_bf16(h)); }
__device__ uint16_t d_float_to_f16(float f) { return half_bits::f16_from_f32(__float_as_uint(f)); }
__device__ float d_f16_to_float(uint16_t h) { return __uint_as_float(half_bits::f32_from_f16(h)); }

// kind: 0 f32 -> bf16, 1 f32 -> f16, 2 bf16 -> f32, 3 f16 -> f32, 4 f32 -> f32 via bf16, 5 via f16
__global__ void convert_kernel(void* dst, const void* src, int64_t n, int kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    switch (kind) {
      case 0: static_cast<uint16_t*>(dst)[i] = d_float_to_bf16(static_cast<const float*>(src)[i]); break;
      case 1: static_cast<uint16_t*>(dst)[i] = d_float_to_f16(static_cast<const float*>(src)[i]); break;
      case 2: static_cast<float*>(dst)[i] = d_bf16_to_float(static_cast<const uint16_t*>(src)[i]); break;
      case 3: static_cast<float*>(dst)[i] = d_f16_to_float(static_cast<const uint16_t*>(src)[i]); break;
      case 4: static_cast<float*>(dst)[i] = d_bf16_to_float(d_float_to_bf16(static_cast<const float*>(src)[i])); break;
      default: static_cast<float*>(dst)[i] = d_f16_to_float(d_float_to_f16(static_cast<const float*>(src)[i])); break;
    }
  }
}

__global__ void nonfinite_kernel(const float* x, int64_t n, int* flag) {
  int bad = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bad |= !isfinite(x[i]);
  if (bad) atomicOr(flag, 1);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("zero_engine (CUDA ") + what + "): " + cudaGetErrorString(e));
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks < 1 ? 1 : blocks) : 4096);
}

}  // namespace

void cuda_convert(void* dst, dtype dst_type, const void* src, dtype src_type, int64_t n, dtype via,
                  int device_index) {
  if (n <= 0) return;
  int kind = -1;
  if (src_type == dtype::f32 && dst_type == dtype::bf16) kind = 0;
  else if (src_type == dtype::f32 && dst_type == dtype::f16) kind = 1;
  else if (src_type == dtype::bf16 && dst_type == dtype::f32) kind = 2;
  else if (src_type == dtype::f16 && dst_type == dtype::f32) kind = 3;
  else if (src_type == dtype::f32 && dst_type == dtype::f32 && via == dtype::bf16) kind = 4;
  else if (src_type == dtype::f32 && dst_type == dtype::f32 && via == dtype::f16) kind = 5;
  if (kind < 0)
    throw std::invalid_argument(std::string("cuda_convert: no conversion from ") + dtype_name(src_type) + " to " +
                                dtype_name(dst_type) + " via " + dtype_name(via));
  check(cudaSetDevice(device_index), "set device");
  auto s = static_cast<cudaStream_t>(flowrun::cuda::current_stream(device_index));
  convert_kernel<<<grid_for(n), 256, 0, s>>>(dst, src, n, kind);
  check(cudaGetLastError(), "convert");
}

void cuda_flag_nonfinite(const float* x, int64_t n, int* flag, int device_index) {
  if (n <= 0) return;
  check(cudaSetDevice(device_index), "set device");
  auto s = static_cast<cudaStream_t>(flowrun::cuda::current_stream(device_index));
  nonfinite_kernel<<<grid_for(n), 256, 0, s>>>(x, n, flag);
  check(cudaGetLastError(), "overflow check");
}

}  // namespace flowrun::detail
