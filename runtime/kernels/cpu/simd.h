// Vector helpers of the CPU backend (included by cpu_backend.cpp only).
//
// With AVX-512 (FLOWRUN_NATIVE builds on an AVX-512 machine) the hot loops use
// 16-lane intrinsics; otherwise the same functions fall back to scalar loops,
// so the backend builds and gives the same results (to rounding) anywhere.
//
// exp: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, and Cephes'
// degree-6 polynomial for e^r (Moshier, Cephes expf.c), then 2^n by scalef.
// Max error about 2 ulp over [-87, 88] (checked against double exp in
// tests/test_ops.cpp through every op that uses it); exp(x < -87.33) = 0 (no
// denormal results), exp(-inf) = 0, exp(+large) = inf, NaN propagates.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
// GCC 12 reports _mm512_undefined_ps() inside its own reduce/extract intrinsics
// as uninitialized (a false positive, GCC bug 105593); this header is included
// only by the CPU backend's translation unit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define FLOWRUN_AVX512 1
#else
#define FLOWRUN_AVX512 0
#endif

namespace flowrun::simd {

#if FLOWRUN_AVX512

inline __m512 exp_ps(__m512 x) {
  // below -87.33 the result would be denormal (< 2^-126): return 0 instead, so
  // no denormal reaches the GEMMs downstream (attention's P: a 10x slowdown
  // from microcode assists when scores are large), a change of < 1.2e-38
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_LT_OQ);
  // clamp (NaN passes through: max/min return their second operand on NaN)
  x = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(_mm512_set1_ps(-87.33f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, n));
}

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }

/// Sum of 16 floats widened to double (as two 8-lane double sums).
inline __m512d widen_add(__m512d acc, __m512 v) {
  acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  return _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
}

#endif

/// max over x[0, n)
inline float max_f(const float* x, int64_t n) {
#if FLOWRUN_AVX512
  __m512 m = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  if (i < n) m = _mm512_mask_max_ps(m, tail_mask(n - i), m, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
  return _mm512_reduce_max_ps(m);
#else
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
#endif
}

/// sum over i of exp(x[i] - shift), accumulated in double; if `out` is given,
/// out[i] = exp(x[i] - shift) (out may be x).
inline double exp_sum(const float* x, float shift, int64_t n, float* out) {
#if FLOWRUN_AVX512
  const __m512 s = _mm512_set1_ps(shift);
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 e0 = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    const __m512 e1 = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), s));
    if (out) {
      _mm512_storeu_ps(out + i, e0);
      _mm512_storeu_ps(out + i + 16, e1);
    }
    acc0 = widen_add(acc0, e0);
    acc1 = widen_add(acc1, e1);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s)));
    if (out) _mm512_mask_storeu_ps(out + i, k, e);
    acc0 = widen_add(acc0, e);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
#else
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = std::exp(x[i] - shift);
    if (out) out[i] = e;
    sum += e;
  }
  return sum;
#endif
}

/// Dot product in f32 (vectorised, 2 accumulators).
inline float dot_f(const float* a, const float* b, int64_t n) {
#if FLOWRUN_AVX512
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#else
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
#endif
}

/// y[i] += a * x[i]
inline void axpy_f(float* __restrict__ y, const float* __restrict__ x, float a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace flowrun::simd
