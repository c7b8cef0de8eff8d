// models/device_copy.h: strided device-to-device copies for the decoder.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "models/device_copy.h"
#include "runtime/kernels/cuda/cuda_api.h"

namespace flowrun::detail {

void cuda_copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                  int device_index) {
  if (rows == 0 || width == 0) return;
  cudaError_t e = cudaSetDevice(device_index);
  if (e == cudaSuccess)
    e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice,
                          static_cast<cudaStream_t>(flowrun::cuda::current_stream(device_index)));
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cuda_copy_2d (") + std::to_string(rows) + " rows of " +
                             std::to_string(width) + " bytes on cuda:" + std::to_string(device_index) +
                             "): " + cudaGetErrorString(e));
}

}  // namespace flowrun::detail
