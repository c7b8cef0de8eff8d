// Element-wise reduction kernels shared by the CPU backends (inproc, gloo).
// Internal to runtime/comm: not part of the public API.
//
// "Wire" type: the type partial results travel and accumulate in. f32 for
// bf16/f16 (so a reduction rounds back to 16 bits once, at the end), the
// dtype itself otherwise. Integer sums wrap around (computed unsigned);
// float max propagates NaN.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "runtime/comm/communicator.h"

namespace flowrun::comm::detail {

inline dtype wire_type(dtype t) { return (t == dtype::bf16 || t == dtype::f16) ? dtype::f32 : t; }

inline float load_half(dtype t, uint16_t h) { return t == dtype::bf16 ? bf16_to_float(h) : f16_to_float(h); }
inline uint16_t store_half(dtype t, float f) { return t == dtype::bf16 ? float_to_bf16(f) : float_to_f16(f); }

inline float max_nan(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return a < b ? b : a;
}
template <class I>
inline I add_wrap(I a, I b) {
  using U = std::make_unsigned_t<I>;
  return static_cast<I>(static_cast<U>(a) + static_cast<U>(b));
}

/// c[i] = a[i] op b[i] for i < n, on wire dtype `w` (f32, i32 or i64). c may
/// be a or b. The signature of gloo's reduce functions.
inline void combine(dtype w, reduce_op op, void* c, const void* a, const void* b, size_t n) {
  auto run = [&](auto* cc, const auto* aa, const auto* bb, auto f) {
    for (size_t i = 0; i < n; ++i) cc[i] = f(aa[i], bb[i]);
  };
  switch (w) {
    case dtype::f32: {
      auto* cc = static_cast<float*>(c);
      auto* aa = static_cast<const float*>(a);
      auto* bb = static_cast<const float*>(b);
      if (op == reduce_op::sum)
        run(cc, aa, bb, [](float x, float y) { return x + y; });
      else
        run(cc, aa, bb, max_nan);
      return;
    }
    case dtype::i32: {
      auto* cc = static_cast<int32_t*>(c);
      auto* aa = static_cast<const int32_t*>(a);
      auto* bb = static_cast<const int32_t*>(b);
      if (op == reduce_op::sum)
        run(cc, aa, bb, add_wrap<int32_t>);
      else
        run(cc, aa, bb, [](int32_t x, int32_t y) { return x < y ? y : x; });
      return;
    }
    case dtype::i64: {
      auto* cc = static_cast<int64_t*>(c);
      auto* aa = static_cast<const int64_t*>(a);
      auto* bb = static_cast<const int64_t*>(b);
      if (op == reduce_op::sum)
        run(cc, aa, bb, add_wrap<int64_t>);
      else
        run(cc, aa, bb, [](int64_t x, int64_t y) { return x < y ? y : x; });
      return;
    }
    default:
      throw std::logic_error("comm::detail::combine: not a wire dtype");
  }
}

/// dst (wire type of t) = src (dtype t), n elements.
inline void to_wire(dtype t, const void* src, void* dst, int64_t n) {
  if (wire_type(t) == t) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(t));
    return;
  }
  auto* s = static_cast<const uint16_t*>(src);
  auto* d = static_cast<float*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = load_half(t, s[i]);
}

/// dst (dtype t) = src (wire type of t), n elements; rounds f32 to bf16/f16.
inline void from_wire(dtype t, const void* src, void* dst, int64_t n) {
  if (wire_type(t) == t) {
    std::memmove(dst, src, static_cast<size_t>(n) * dtype_size(t));
    return;
  }
  auto* s = static_cast<const float*>(src);
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = store_half(t, s[i]);
}

/// out[i] = partial[i] op own[i]: partial in the wire type, own in dtype t.
/// The result is written in the wire type (to_dtype false) or rounded to t
/// (to_dtype true). out may alias partial, or own when to_dtype is true.
inline void accumulate(dtype t, reduce_op op, const void* partial, const void* own, void* out, int64_t n,
                       bool to_dtype) {
  const dtype w = wire_type(t);
  if (w == t) {
    combine(w, op, out, partial, own, static_cast<size_t>(n));
    return;
  }
  auto* p = static_cast<const float*>(partial);
  auto* o = static_cast<const uint16_t*>(own);
  for (int64_t i = 0; i < n; ++i) {
    const float x = load_half(t, o[i]);
    const float r = op == reduce_op::sum ? p[i] + x : max_nan(p[i], x);
    if (to_dtype)
      static_cast<uint16_t*>(out)[i] = store_half(t, r);
    else
      static_cast<float*>(out)[i] = r;
  }
}

template <class S, class W, class Load, class Store, class Op>
void reduce_typed(void* dst, const void* const* srcs, int k, int64_t n, Load load, Store store, Op f) {
  constexpr int64_t B = 1024;
  W acc[B];
  for (int64_t i0 = 0; i0 < n; i0 += B) {
    const int64_t m = std::min(B, n - i0);
    const S* s0 = static_cast<const S*>(srcs[0]) + i0;
    for (int64_t j = 0; j < m; ++j) acc[j] = load(s0[j]);
    for (int s = 1; s < k; ++s) {
      const S* ss = static_cast<const S*>(srcs[s]) + i0;
      for (int64_t j = 0; j < m; ++j) acc[j] = f(acc[j], load(ss[j]));
    }
    S* d = static_cast<S*>(dst) + i0;
    for (int64_t j = 0; j < m; ++j) d[j] = store(acc[j]);
  }
}

/// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[k-1][i], left to right,
/// for i < n, all in dtype t (accumulating bf16/f16 in f32, rounded once).
/// Works in blocks, so dst may be one of the sources (same index).
inline void reduce_ordered(dtype t, reduce_op op, void* dst, const void* const* srcs, int k, int64_t n) {
  const bool sum = op == reduce_op::sum;
  auto same = [](auto v) { return v; };
  auto fadd = [](float a, float b) { return a + b; };
  switch (t) {
    case dtype::f32:
      if (sum)
        reduce_typed<float, float>(dst, srcs, k, n, same, same, fadd);
      else
        reduce_typed<float, float>(dst, srcs, k, n, same, same, max_nan);
      return;
    case dtype::bf16:
    case dtype::f16: {
      auto load = [t](uint16_t h) { return load_half(t, h); };
      auto store = [t](float f) { return store_half(t, f); };
      if (sum)
        reduce_typed<uint16_t, float>(dst, srcs, k, n, load, store, fadd);
      else
        reduce_typed<uint16_t, float>(dst, srcs, k, n, load, store, max_nan);
      return;
    }
    case dtype::i32:
      if (sum)
        reduce_typed<int32_t, int32_t>(dst, srcs, k, n, same, same, add_wrap<int32_t>);
      else
        reduce_typed<int32_t, int32_t>(dst, srcs, k, n, same, same, [](int32_t a, int32_t b) { return a < b ? b : a; });
      return;
    case dtype::i64:
      if (sum)
        reduce_typed<int64_t, int64_t>(dst, srcs, k, n, same, same, add_wrap<int64_t>);
      else
        reduce_typed<int64_t, int64_t>(dst, srcs, k, n, same, same, [](int64_t a, int64_t b) { return a < b ? b : a; });
      return;
  }
}

}  // namespace flowrun::comm::detail
