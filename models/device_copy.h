// Device-side copies the decoder needs beyond tensor::copy_from (CUDA builds only).
#pragma once

#include <cstddef>

namespace flowrun::detail {

#ifdef FLOWRUN_HAVE_CUDA
/// A 2-D copy on CUDA device `device_index`: `rows` rows of `width` bytes, row r read at
/// src + r * spitch and written at dst + r * dpitch (cudaMemcpy2DAsync, device to device,
/// on the calling thread's current stream of the device, runtime/kernels/cuda/cuda_api.h,
/// so it is ordered with the backend's kernels like tensor::copy_from). Both pointers are device memory of that device. Throws
/// std::runtime_error with the CUDA error string on failure. Used for KV cache writes
/// (B rows at pitch S * KV * hs) and the last positions' hidden states in forward_cached.
void cuda_copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                  int device_index);
#endif

}  // namespace flowrun::detail
