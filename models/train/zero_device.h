// Element kernels of the ZeRO engine on a CUDA device (CUDA builds only): dtype
// conversions of flat buffers (round to nearest even, bit for bit the host's
// float_to_bf16 / float_to_f16 of runtime/tensor/tensor.cpp) and the fp16 overflow
// check. They run on the calling thread's current stream of the device
// (runtime/kernels/cuda/cuda_api.h), ordered with the backend's kernels and copies.
#pragma once

#include <cstdint>

#include "runtime/tensor/tensor.h"

namespace flowrun::detail {

#ifdef FLOWRUN_HAVE_CUDA
/// dst[i] = src[i] converted, for f32 -> bf16/f16, bf16/f16 -> f32 and f32 -> f32
/// through `via` (bf16 or f16: the f32 value of the rounded number; dst may be src).
/// n elements on cuda:`device_index`. Throws std::runtime_error on a CUDA error.
void cuda_convert(void* dst, dtype dst_type, const void* src, dtype src_type, int64_t n, dtype via,
                  int device_index);
/// Sets *flag (an int in device memory of cuda:`device_index`) to 1 when any of the
/// n f32 elements at x is inf or NaN; leaves it alone otherwise (queued, not waited for).
void cuda_flag_nonfinite(const float* x, int64_t n, int* flag, int device_index);
#endif

}  // namespace flowrun::detail
