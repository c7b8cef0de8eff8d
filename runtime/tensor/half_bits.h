// bf16 and IEEE f16 conversions on raw bits, shared by the host (tensor.cpp's
// float_to_bf16 & co.) and CUDA kernels (models/train/zero_device.cu), so both round
// identically. Callers bit-cast float <-> uint32_t (std::memcpy on the host,
// __float_as_uint / __uint_as_float on the device).
//  - f32 -> bf16: round to nearest even; NaN stays a quiet NaN.
//  - f32 -> f16: round to nearest even, overflow to inf, subnormals kept, NaN quiet.
//  - bf16/f16 -> f32: exact.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLOWRUN_HOST_DEVICE __host__ __device__
#else
#define FLOWRUN_HOST_DEVICE
#endif

namespace flowrun::half_bits {

/// bf16 bits of the f32 with bits x.
FLOWRUN_HOST_DEVICE inline uint16_t bf16_from_f32(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

/// f32 bits of the bf16 h.
FLOWRUN_HOST_DEVICE inline uint32_t f32_from_bf16(uint16_t h) { return static_cast<uint32_t>(h) << 16; }

/// f16 bits of the f32 with bits x.
FLOWRUN_HOST_DEVICE inline uint16_t f16_from_f32(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {                                                 // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t r = mant >> shift;
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | r);
}

/// f32 bits of the f16 h.
FLOWRUN_HOST_DEVICE inline uint32_t f32_from_f16(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return sign;
    int e = -1;  // subnormal: normalise
    do {
      ++e;
      mant <<= 1;
    } while (!(mant & 0x400u));
    return sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  if (exp == 0x1f) return sign | 0x7f800000u | (mant << 13);
  return sign | ((exp - 15 + 127) << 23) | (mant << 13);
}

}  // namespace flowrun::half_bits
