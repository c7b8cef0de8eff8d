// Memory hooks for non-CPU devices. The CUDA backend registers its caching
// allocator here at start-up; tensor.cpp itself never includes CUDA headers.
#pragma once

#include <cstddef>

#include "runtime/tensor/tensor.h"

namespace flowrun {

struct device_memory_hooks {
  /// Allocate `bytes` on device ordinal `index`; throw std::bad_alloc on failure.
  void* (*alloc)(size_t bytes, int index) = nullptr;
  void (*free)(void* p, int index) = nullptr;
  /// Copy `bytes` between any two devices (at least one is this kind).
  void (*copy)(void* dst, device dst_dev, const void* src, device src_dev, size_t bytes) = nullptr;
  void (*memset0)(void* p, size_t bytes, int index) = nullptr;
};

void register_device_memory(device_kind k, device_memory_hooks hooks);
/// nullptr when no backend registered memory for this kind.
const device_memory_hooks* device_memory_for(device_kind k);

/// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_device_present();

}  // namespace flowrun
