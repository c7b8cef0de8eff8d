// Highway kernels of the CPU backend: see simd_kernels.h for what each one
// computes. This file is compiled once per target by hwy/foreach_target.h
// (it re-includes itself through HWY_TARGET_INCLUDE); the HWY_ONCE part at the
// end defines the plain functions that dispatch to the best target at run time.
//
// Every target Highway can build here is compiled, not only those above the
// build's -march baseline (HWY_COMPILE_ALL_ATTAINABLE): so that a native build
// still has the AVX2 and portable paths the parity tests run, and a
// FLOWRUN_NATIVE=OFF build has the AVX-512 one. Left out: SSSE3 (SSE4 covers
// its CPUs), AVX3_DL (it adds only integer/crypto instructions these float
// kernels do not use; its CPUs run the AVX3 path), and the sizeless-vector
// targets SVE/SVE2/RVV, because the kernels below keep arrays of vectors
// (Map's operands, the GEMM tile's accumulators), which sizeless types cannot
// be; ARM64 CPUs with SVE run the NEON path.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "runtime/kernels/cpu/simd_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "runtime/kernels/cpu/simd_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace flowrun::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
// the most f32 lanes any target has (SVE: 2048 bits): tail buffers
constexpr size_t k_max_lanes = HWY_MAX_BYTES / sizeof(float);

/// e^x, see simd_kernels.h (Cephes expf.c's constants, as the AVX-512 code before it).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp(D d, V x) {
  const hn::RebindToSigned<D> di;
  const auto nan = hn::IsNaN(x);
  // below -87.33 the result would be denormal (< 2^-126): 0 instead (a change of < 1.2e-38)
  const auto tiny = hn::Lt(x, hn::Set(d, -87.33f));
  V xc = hn::IfThenZeroElse(nan, x);  // NaN lanes: any finite input, replaced at the end
  xc = hn::Min(hn::Set(d, 88.8f), hn::Max(hn::Set(d, -87.33f), xc));
  const V n = hn::Round(hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  V p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::MulAdd(p, hn::Mul(r, r), hn::Add(r, hn::Set(d, 1.0f)));
  // 2^n, n in [-126, 128], as 2^(n>>1) 2^(n - (n>>1)): each factor a normal float, both products exact
  const auto ni = hn::ConvertTo(di, n);
  const auto n1 = hn::ShiftRight<1>(ni);
  const auto n2 = hn::Sub(ni, n1);
  const auto bias = hn::Set(di, 127);
  const V s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const V s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n2, bias)));
  const V y = hn::IfThenZeroElse(tiny, hn::Mul(hn::Mul(p, s1), s2));
  return hn::IfThenElse(nan, x, y);
}

/// 1 / (1 + exp(-x))
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Sigmoid(D d, V x) {
  return hn::Div(hn::Set(d, 1.0f), hn::Add(hn::Set(d, 1.0f), Exp(d, hn::Neg(x))));
}

// Tails: masked loads and stores where the target's float masked memory ops
// never touch the masked-off lanes (AVX-512's masked moves, AVX2's vmaskmovps),
// else through a stack buffer (SSE4, NEON and the scalar fallback emulate them
// with full-width accesses, which could fault past the end of a buffer).
#undef FLOWRUN_MASKED_TAILS
#define FLOWRUN_MASKED_TAILS (!HWY_MEM_OPS_MIGHT_FAULT || HWY_TARGET == HWY_AVX2)

/// Runs op(d, in[NI] vectors, out[NO] vectors) over [0, n): full vectors, then
/// the tail through zero-padded stack buffers (no access outside [0, n)).
/// All inputs of a vector are loaded before its outputs are stored.
template <size_t NI, size_t NO, class Op>
HWY_INLINE void Map(int64_t n, const float* const (&in)[NI], float* const (&out)[NO], const Op& op) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF vi[NI], vo[NO];
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    for (size_t k = 0; k < NI; ++k) vi[k] = hn::LoadU(d, in[k] + i);
    op(d, vi, vo);
    for (size_t k = 0; k < NO; ++k) hn::StoreU(vo[k], d, out[k] + i);
  }
  if (i < n) {
    const size_t r = static_cast<size_t>(n - i);
#if FLOWRUN_MASKED_TAILS
    const auto m = hn::FirstN(d, r);
    for (size_t k = 0; k < NI; ++k) vi[k] = hn::MaskedLoad(m, d, in[k] + i);
    op(d, vi, vo);
    for (size_t k = 0; k < NO; ++k) hn::BlendedStore(vo[k], m, d, out[k] + i);
    return;
#endif
    HWY_ALIGN float buf[NI + NO][k_max_lanes] = {};
    for (size_t k = 0; k < NI; ++k) {
      std::memcpy(buf[k], in[k] + i, r * sizeof(float));
      vi[k] = hn::Load(d, buf[k]);
    }
    op(d, vi, vo);
    for (size_t k = 0; k < NO; ++k) {
      hn::Store(vo[k], d, buf[NI + k]);
      std::memcpy(out[k] + i, buf[NI + k], r * sizeof(float));
    }
  }
}

/// Loads the tail x[i, n) padded with `pad` (i < n < i + Lanes), in vectors of D (the full width
/// by default).
template <class D = DF>
HWY_INLINE hn::Vec<D> LoadTail(const float* x, int64_t i, int64_t n, float pad) {
  const D d;
#if FLOWRUN_MASKED_TAILS
  const auto m = hn::FirstN(d, static_cast<size_t>(n - i));
  return hn::IfThenElse(m, hn::MaskedLoad(m, d, x + i), hn::Set(d, pad));
#endif
  HWY_ALIGN float buf[k_max_lanes];
  for (size_t k = 0; k < hn::Lanes(d); ++k) buf[k] = pad;
  std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
  return hn::Load(d, buf);
}

// ---------------------------------------------------------------- double accumulation

// double accumulators from the two halves of an f32 vector (not on HWY_SCALAR,
// one lane, nor on armv7 NEON, which has no f64 lanes: those sum lane by lane)
#undef FLOWRUN_WIDE
#define FLOWRUN_WIDE (HWY_HAVE_FLOAT64 && HWY_TARGET != HWY_SCALAR)
#if FLOWRUN_WIDE
using DD = hn::Repartition<double, DF>;  // half the lanes of DF
using VD = hn::Vec<DD>;
/// acc += both halves of v, widened to double.
HWY_INLINE VD AddWide(VD acc, VF v) {
  const DD dd;
  const hn::Half<DF> dh;
  acc = hn::Add(acc, hn::PromoteTo(dd, hn::LowerHalf(dh, v)));
  return hn::Add(acc, hn::PromoteTo(dd, hn::UpperHalf(dh, v)));
}
/// acc += a b over both halves, widened to double before the product.
HWY_INLINE VD MulAddWide(VD acc, VF a, VF b) {
  const DD dd;
  const hn::Half<DF> dh;
  acc = hn::MulAdd(hn::PromoteTo(dd, hn::LowerHalf(dh, a)), hn::PromoteTo(dd, hn::LowerHalf(dh, b)), acc);
  return hn::MulAdd(hn::PromoteTo(dd, hn::UpperHalf(dh, a)), hn::PromoteTo(dd, hn::UpperHalf(dh, b)), acc);
}
/// acc += a b c over both halves, each factor widened to double.
HWY_INLINE VD Mul3AddWide(VD acc, VF a, VF b, VF c) {
  const DD dd;
  const hn::Half<DF> dh;
  auto lo = [&](VF v) { return hn::PromoteTo(dd, hn::LowerHalf(dh, v)); };
  auto hi = [&](VF v) { return hn::PromoteTo(dd, hn::UpperHalf(dh, v)); };
  acc = hn::MulAdd(hn::Mul(lo(a), lo(b)), lo(c), acc);
  return hn::MulAdd(hn::Mul(hi(a), hi(b)), hi(c), acc);
}
HWY_INLINE double SumD(VD v) { return hn::GetLane(hn::SumOfLanes(DD(), v)); }
#endif

// ---------------------------------------------------------------- reductions

float MaxF(const float* x, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float ninf = -std::numeric_limits<float>::infinity();
  VF m0 = hn::Set(d, ninf), m1 = m0;
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    m0 = hn::Max(m0, hn::LoadU(d, x + i));
    m1 = hn::Max(m1, hn::LoadU(d, x + i + N));
  }
  for (; i + N <= n; i += N) m0 = hn::Max(m0, hn::LoadU(d, x + i));
  if (i < n) m1 = hn::Max(m1, LoadTail(x, i, n, ninf));
  return hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
}

int64_t ArgmaxF(const float* x, int64_t n) {
  if (n <= 0) return -1;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float ninf = -std::numeric_limits<float>::infinity();
  // pass 1: the max, and whether any lane held a NaN (x86's max drops NaNs, NEON's keeps them)
  VF m = hn::Set(d, ninf);
  auto nan = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(v)));
  }
  if (i < n) {
    const VF v = LoadTail(x, i, n, ninf);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(v)));
  }
  if (!hn::AllFalse(d, hn::MaskFromVec(nan))) return std::max_element(x, x + n) - x;  // the scalar rule
  const float mx = hn::GetLane(hn::MaxOfLanes(d, m));
  // pass 2: the first index holding it
  const VF mv = hn::Set(d, mx);
  for (i = 0; i + N <= n; i += N) {
    const intptr_t k = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, x + i), mv));
    if (k >= 0) return i + k;
  }
  for (; i < n; ++i)
    if (x[i] == mx) return i;
  return 0;  // unreachable: mx is one of x
}

double ExpSum(const float* x, float shift, int64_t n, float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF s = hn::Set(d, shift);
#if FLOWRUN_WIDE
  const DD dd;
  VD acc0 = hn::Zero(dd), acc1 = hn::Zero(dd);
#else
  double acc = 0.0;
  HWY_ALIGN float lanes[k_max_lanes];
  auto add_lanes = [&](VF e) {
    hn::Store(e, d, lanes);
    for (int64_t k = 0; k < N; ++k) acc += lanes[k];
  };
#endif
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const VF e0 = Exp(d, hn::Sub(hn::LoadU(d, x + i), s));
    const VF e1 = Exp(d, hn::Sub(hn::LoadU(d, x + i + N), s));
    if (out) {
      hn::StoreU(e0, d, out + i);
      hn::StoreU(e1, d, out + i + N);
    }
#if FLOWRUN_WIDE
    acc0 = AddWide(acc0, e0);
    acc1 = AddWide(acc1, e1);
#else
    add_lanes(e0);
    add_lanes(e1);
#endif
  }
  for (; i < n; i += N) {
    const int64_t r = n - i < N ? n - i : N;
    const VF xv = r == N ? hn::LoadU(d, x + i) : LoadTail(x, i, n, 0.0f);
    const VF e = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(r)), Exp(d, hn::Sub(xv, s)));
    if (out) {
      if (r == N) {
        hn::StoreU(e, d, out + i);
      } else if (FLOWRUN_MASKED_TAILS) {
        hn::BlendedStore(e, hn::FirstN(d, static_cast<size_t>(r)), d, out + i);
      } else {
        HWY_ALIGN float buf[k_max_lanes];
        hn::Store(e, d, buf);
        std::memcpy(out + i, buf, static_cast<size_t>(r) * sizeof(float));
      }
    }
#if FLOWRUN_WIDE
    acc0 = AddWide(acc0, e);
#else
    add_lanes(e);
#endif
  }
#if FLOWRUN_WIDE
  return SumD(hn::Add(acc0, acc1));
#else
  return acc;
#endif
}

// ---------------------------------------------------------------- elementwise

void ExpF(float* out, const float* x, int64_t n) {
  Map<1, 1>(n, {x}, {out}, [](DF d, const VF* in, VF* o) { o[0] = Exp(d, in[0]); });
}

void ScaleF(float* y, float s, int64_t n) {
  Map<1, 1>(n, {y}, {y}, [s](DF d, const VF* in, VF* o) { o[0] = hn::Mul(in[0], hn::Set(d, s)); });
}

void LogSoftmaxBackwardRow(float* dx, const float* dy, const float* y, float sdy, int64_t n) {
  Map<2, 1>(n, {dy, y}, {dx}, [sdy](DF d, const VF* in, VF* o) {
    o[0] = hn::NegMulAdd(Exp(d, in[1]), hn::Set(d, sdy), in[0]);
  });
}

void SiluForward(float* out, const float* x, int64_t n) {
  Map<1, 1>(n, {x}, {out}, [](DF d, const VF* in, VF* o) { o[0] = hn::Mul(in[0], Sigmoid(d, in[0])); });
}

void SiluBackward(float* dx, const float* dy, const float* x, int64_t n) {
  Map<2, 1>(n, {dy, x}, {dx}, [](DF d, const VF* in, VF* o) {
    const VF v = in[1], s = Sigmoid(d, v);
    const VF one = hn::Set(d, 1.0f);
    o[0] = hn::Mul(in[0], hn::Mul(s, hn::MulAdd(v, hn::Sub(one, s), one)));
  });
}

constexpr float k_gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float k_gelu_cube = 0.044715f;

void GeluForward(float* out, const float* x, int64_t n) {
  Map<1, 1>(n, {x}, {out}, [](DF d, const VF* in, VF* o) {
    const VF v = in[0];
    // x sigmoid(2u) = x / (1 + exp(-2u))
    const VF u2 = hn::Mul(hn::Mul(hn::Set(d, -2.0f * k_gelu_scale), v),
                          hn::MulAdd(hn::Mul(hn::Set(d, k_gelu_cube), v), v, hn::Set(d, 1.0f)));
    o[0] = hn::Div(v, hn::Add(hn::Set(d, 1.0f), Exp(d, u2)));
  });
}

void GeluBackward(float* dx, const float* dy, const float* x, int64_t n) {
  Map<2, 1>(n, {dy, x}, {dx}, [](DF d, const VF* in, VF* o) {
    const VF v = in[1], one = hn::Set(d, 1.0f);
    const VF v2 = hn::Mul(v, v);
    const VF u2 = hn::Mul(hn::Mul(hn::Set(d, -2.0f * k_gelu_scale), v), hn::MulAdd(hn::Set(d, k_gelu_cube), v2, one));
    const VF s = hn::Div(one, hn::Add(one, Exp(d, u2)));
    // g = s + v 2 s (1 - s) k (1 + 3 c v^2)
    const VF t = hn::Mul(hn::Mul(hn::Mul(hn::Set(d, 2.0f * k_gelu_scale), v), hn::Mul(s, hn::Sub(one, s))),
                         hn::MulAdd(hn::Set(d, 3.0f * k_gelu_cube), v2, one));
    o[0] = hn::Mul(hn::Add(s, t), in[0]);
  });
}

void SwigluForward(float* out, const float* gate, const float* up, int64_t n) {
  Map<2, 1>(n, {gate, up}, {out}, [](DF d, const VF* in, VF* o) {
    o[0] = hn::Mul(hn::Mul(in[0], Sigmoid(d, in[0])), in[1]);
  });
}

void SwigluBackward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n) {
  Map<3, 2>(n, {dy, gate, up}, {dgate, dup}, [](DF d, const VF* in, VF* o) {
    const VF dv = in[0], gv = in[1], uv = in[2], one = hn::Set(d, 1.0f);
    const VF s = Sigmoid(d, gv);
    const VF ds = hn::Mul(s, hn::MulAdd(gv, hn::Sub(one, s), one));
    o[0] = hn::Mul(hn::Mul(dv, uv), ds);
    o[1] = hn::Mul(hn::Mul(dv, gv), s);
  });
}

void Adamw(float* p, const float* g, float* m, float* v, int64_t n, const adamw_scalars& c) {
  Map<4, 3>(n, {p, g, m, v}, {p, m, v}, [&c](DF d, const VF* in, VF* o) {
    const VF pi = in[0], gi = in[1];
    const VF mi = hn::MulAdd(hn::Set(d, c.beta1), in[2], hn::Mul(hn::Set(d, c.one_minus_beta1), gi));
    const VF vi = hn::MulAdd(hn::Set(d, c.beta2), in[3], hn::Mul(hn::Mul(hn::Set(d, c.one_minus_beta2), gi), gi));
    // mhat / (sqrt(vhat) + eps) with mhat = m / bc1, sqrt(vhat) = sqrt(v) / sqrt(bc2)
    const VF den = hn::MulAdd(hn::Sqrt(vi), hn::Set(d, c.inv_sqrt_bc2), hn::Set(d, c.eps));
    const VF upd = hn::Div(hn::Mul(mi, hn::Set(d, c.inv_bc1)), den);
    o[0] = hn::Sub(hn::NegMulAdd(hn::Set(d, c.lr_wd), pi, pi), hn::Mul(hn::Set(d, c.lr), upd));
    o[1] = mi;
    o[2] = vi;
  });
}

// ---------------------------------------------------------------- norms

/// sum of x^2 (x widened to double first).
double SumSqD(const float* x, int64_t n) {
#if FLOWRUN_WIDE
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VD acc = hn::Zero(DD());
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF v = hn::LoadU(d, x + i);
    acc = MulAddWide(acc, v, v);
  }
  if (i < n) {
    const VF v = LoadTail(x, i, n, 0.0f);
    acc = MulAddWide(acc, v, v);
  }
  return SumD(acc);
#else
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
#endif
}

float RmsnormRowForward(float* out, const float* x, const float* w, int64_t C, float eps) {
  const double r = 1.0 / std::sqrt(SumSqD(x, C) / static_cast<double>(C) + eps);
  const float rf = static_cast<float>(r);
  Map<2, 1>(C, {x, w}, {out}, [rf](DF d, const VF* in, VF* o) { o[0] = hn::Mul(hn::Mul(in[0], hn::Set(d, rf)), in[1]); });
  return rf;
}

void RmsnormRowBackward(float* dx, const float* dy, const float* x, const float* w, float rstd, int64_t C) {
  double dot = 0.0;
#if FLOWRUN_WIDE
  {
    const DF d;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    VD acc = hn::Zero(DD());
    int64_t i = 0;
    for (; i + N <= C; i += N)
      acc = Mul3AddWide(acc, hn::LoadU(d, dy + i), hn::LoadU(d, w + i), hn::LoadU(d, x + i));
    if (i < C) acc = Mul3AddWide(acc, LoadTail(dy, i, C, 0.0f), LoadTail(w, i, C, 0.0f), LoadTail(x, i, C, 0.0f));
    dot = SumD(acc);
  }
#else
  for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dy[c]) * w[c] * x[c];
#endif
  const double r = rstd;
  const float a = rstd;
  const float b = static_cast<float>(r * r * r * dot / static_cast<double>(C));
  Map<4, 1>(C, {dx, dy, x, w}, {dx}, [a, b](DF d, const VF* in, VF* o) {
    // dx + a w dy - b x
    o[0] = hn::NegMulAdd(hn::Set(d, b), in[2], hn::MulAdd(hn::Mul(hn::Set(d, a), in[3]), in[1], in[0]));
  });
}

void LayernormRowForward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                         int64_t C, float eps) {
  double s = 0.0, v = 0.0;
#if FLOWRUN_WIDE
  {
    const DF d;
    const DD dd;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    VD acc = hn::Zero(dd);
    int64_t i = 0;
    for (; i + N <= C; i += N) acc = AddWide(acc, hn::LoadU(d, x + i));
    if (i < C) acc = AddWide(acc, LoadTail(x, i, C, 0.0f));
    s = SumD(acc);
    // sum of (x - m)^2 in double; a padded lane would add m^2, so the tail goes lane by lane
    const VD m = hn::Set(dd, s / static_cast<double>(C));
    const hn::Half<DF> dh;
    VD acc2 = hn::Zero(dd);
    for (i = 0; i + N <= C; i += N) {
      const VF xv = hn::LoadU(d, x + i);
      const VD lo = hn::Sub(hn::PromoteTo(dd, hn::LowerHalf(dh, xv)), m);
      const VD hi = hn::Sub(hn::PromoteTo(dd, hn::UpperHalf(dh, xv)), m);
      acc2 = hn::MulAdd(lo, lo, acc2);
      acc2 = hn::MulAdd(hi, hi, acc2);
    }
    v = SumD(acc2);
    const double md = s / static_cast<double>(C);
    for (; i < C; ++i) {
      const double dv = x[i] - md;
      v += dv * dv;
    }
  }
#else
  for (int64_t c = 0; c < C; ++c) s += x[c];
  const double md = s / static_cast<double>(C);
  for (int64_t c = 0; c < C; ++c) {
    const double dv = x[c] - md;
    v += dv * dv;
  }
#endif
  const double m = s / static_cast<double>(C);
  const double r = 1.0 / std::sqrt(v / static_cast<double>(C) + eps);
  const float mf = static_cast<float>(m), rf = static_cast<float>(r);
  if (b)
    Map<3, 1>(C, {x, w, b}, {out}, [mf, rf](DF d, const VF* in, VF* o) {
      o[0] = hn::MulAdd(hn::Mul(hn::Sub(in[0], hn::Set(d, mf)), hn::Set(d, rf)), in[1], in[2]);
    });
  else
    Map<2, 1>(C, {x, w}, {out}, [mf, rf](DF d, const VF* in, VF* o) {
      o[0] = hn::Mul(hn::Mul(hn::Sub(in[0], hn::Set(d, mf)), hn::Set(d, rf)), in[1]);
    });
  *mean = mf;
  *rstd = rf;
}

void LayernormRowBackward(float* dx, const float* dy, const float* x, const float* w, float mean, float rstd,
                          int64_t C) {
  double s1 = 0.0, s2 = 0.0;
#if FLOWRUN_WIDE
  {
    const DF d;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    const VF mv = hn::Set(d, mean), rv = hn::Set(d, rstd);
    VD a1 = hn::Zero(DD()), a2 = hn::Zero(DD());
    const DD dd;
    const hn::Half<DF> dh;
    auto step = [&](VF dyv, VF wv, VF xv) {
      const VF norm = hn::Mul(hn::Sub(xv, mv), rv);
      // dn = w dy in double
      const VD dlo = hn::Mul(hn::PromoteTo(dd, hn::LowerHalf(dh, wv)), hn::PromoteTo(dd, hn::LowerHalf(dh, dyv)));
      const VD dhi = hn::Mul(hn::PromoteTo(dd, hn::UpperHalf(dh, wv)), hn::PromoteTo(dd, hn::UpperHalf(dh, dyv)));
      a1 = hn::Add(a1, hn::Add(dlo, dhi));
      a2 = hn::MulAdd(dlo, hn::PromoteTo(dd, hn::LowerHalf(dh, norm)), a2);
      a2 = hn::MulAdd(dhi, hn::PromoteTo(dd, hn::UpperHalf(dh, norm)), a2);
    };
    int64_t i = 0;
    for (; i + N <= C; i += N) step(hn::LoadU(d, dy + i), hn::LoadU(d, w + i), hn::LoadU(d, x + i));
    // padded lanes have w = dy = 0: dn = 0 adds nothing to either sum
    if (i < C) step(LoadTail(dy, i, C, 0.0f), LoadTail(w, i, C, 0.0f), LoadTail(x, i, C, 0.0f));
    s1 = SumD(a1);
    s2 = SumD(a2);
  }
#else
  for (int64_t c = 0; c < C; ++c) {
    const double dn = static_cast<double>(w[c]) * dy[c];
    s1 += dn;
    s2 += dn * ((x[c] - mean) * rstd);
  }
#endif
  const float mean_dn = static_cast<float>(s1 / static_cast<double>(C));
  const float mean_dnn = static_cast<float>(s2 / static_cast<double>(C));
  Map<4, 1>(C, {dx, dy, x, w}, {dx}, [=](DF d, const VF* in, VF* o) {
    const VF norm = hn::Mul(hn::Sub(in[2], hn::Set(d, mean)), hn::Set(d, rstd));
    const VF t = hn::NegMulAdd(norm, hn::Set(d, mean_dnn), hn::Sub(hn::Mul(in[3], in[1]), hn::Set(d, mean_dn)));
    o[0] = hn::MulAdd(hn::Set(d, rstd), t, in[0]);
  });
}

// ---------------------------------------------------------------- small-M GEMM

#if HWY_TARGET != HWY_SCALAR
/// Lane j of each 128-bit block of the result: that block's sum of v[j], j < 4. A transposing add
/// tree within each block (InterleaveLower/Upper work per block on every x86 and NEON target): 9
/// vector ops instead of four full reductions.
template <class D = DF>
HWY_INLINE hn::Vec<D> BlockSums4(const hn::Vec<D>* v) {
  const D d;
  const hn::Repartition<uint64_t, D> du;
  const auto t0 = hn::Add(hn::InterleaveLower(d, v[0], v[1]), hn::InterleaveUpper(d, v[0], v[1]));
  const auto t1 = hn::Add(hn::InterleaveLower(d, v[2], v[3]), hn::InterleaveUpper(d, v[2], v[3]));
  const auto a = hn::BitCast(du, t0), b = hn::BitCast(du, t1);
  return hn::Add(hn::BitCast(d, hn::InterleaveLower(du, a, b)), hn::BitCast(d, hn::InterleaveUpper(du, a, b)));
}

/// out[0..3] = the lane sums of v[0..3]: BlockSums4, then the blocks added in order
/// (((block 0 + block 1) + block 2) + block 3) in scalar adds.
template <class D = DF>
HWY_INLINE void Sum4(const hn::Vec<D>* v, float* out) {
  const D d;
  HWY_ALIGN float buf[k_max_lanes];
  hn::Store(BlockSums4<D>(v), d, buf);
  const size_t N = hn::Lanes(d);
  for (int j = 0; j < 4; ++j) {
    float t = buf[j];
    for (size_t k = 4 + j; k < N; k += 4) t += buf[k];
    out[j] = t;
  }
}

/// out[0..n) = the lane sums of v[0..n), n a multiple of 4, with room in out for n rounded up to the
/// lanes. Where a vector holds 2 or 4 blocks (AVX2; AVX-512), the BlockSums4 of 2 or 4 groups are
/// transposed by blocks, so that one vector add per block adds 8 or 16 outputs at once: the same
/// additions in the same order as Sum4's scalar ones, so the same bits (test_simd's "every output has
/// the bits of its written-out lane arithmetic" checks every tile shape against that order), without
/// the scalar adds and the reload of a stored vector lane by lane (docs/performance.md change 35).
/// Elsewhere (SSE4, NEON: one block; scalable vectors) Sum4's path.
template <class D = DF>
HWY_INLINE void SumsOfLanes(const hn::Vec<D>* v, int n, float* out) {
  const D d;
#if !HWY_HAVE_SCALABLE
  constexpr size_t L = hn::MaxLanes(D());
  if constexpr (L == 4) {
    for (int q = 0; q < n; q += 4) hn::StoreU(BlockSums4<D>(v + q), d, out + q);
    return;
  } else if constexpr (L == 8) {
    const auto z = hn::Zero(d);
    for (int q = 0; q < n; q += 8) {
      const auto u0 = BlockSums4<D>(v + q), u1 = q + 4 < n ? BlockSums4<D>(v + q + 4) : z;
      // [u0 block 0, u1 block 0] + [u0 block 1, u1 block 1]
      hn::StoreU(hn::Add(hn::ConcatLowerLower(d, u1, u0), hn::ConcatUpperUpper(d, u1, u0)), d, out + q);
    }
    return;
  } else if constexpr (L == 16) {
    const auto z = hn::Zero(d);
    for (int q = 0; q < n; q += 16) {
      const auto u0 = BlockSums4<D>(v + q);
      const auto u1 = q + 4 < n ? BlockSums4<D>(v + q + 4) : z;
      const auto u2 = q + 8 < n ? BlockSums4<D>(v + q + 8) : z;
      const auto u3 = q + 12 < n ? BlockSums4<D>(v + q + 12) : z;
      // a = [u0.0 u1.0 u0.2 u1.2], b = [u0.1 u1.1 u0.3 u1.3] (blocks), c and e the same of u2, u3
      const auto a = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(u1), u0);
      const auto b = hn::OddEvenBlocks(u1, hn::SwapAdjacentBlocks(u0));
      const auto c = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(u3), u2);
      const auto e = hn::OddEvenBlocks(u3, hn::SwapAdjacentBlocks(u2));
      // block k of every group side by side: t_k = [u0.k u1.k u2.k u3.k]
      const auto t0 = hn::ConcatLowerLower(d, c, a), t1 = hn::ConcatLowerLower(d, e, b);
      const auto t2 = hn::ConcatUpperUpper(d, c, a), t3 = hn::ConcatUpperUpper(d, e, b);
      hn::StoreU(hn::Add(hn::Add(hn::Add(t0, t1), t2), t3), d, out + q);
    }
    return;
  }
#endif
  for (int q = 0; q < n; q += 4) Sum4<D>(v + q, out + q);
}
#endif

/// v, kept in a register in a tile of MR > 1 rows: GCC otherwise folds the load of a row of A or B
/// into each of its multiply-adds' memory operand and reads the row again for each (the load
/// ports, not the FMA units, then bound the tile). A one-row tile uses each row of B once, and
/// pinning its 16 rows would spill. Changes no value.
template <int MR, class V>
HWY_INLINE V Pin(V v) {
#if HWY_ARCH_X86 && (defined(__GNUC__) || defined(__clang__)) && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  if constexpr (MR > 1) asm("" : "+v"(v.raw));
#endif
  return v;
}

/// One MR x NR tile of C = alpha A Bᵀ + beta C: MR rows of A against NR rows of
/// B over K, one vector accumulator of D per output, the tail zero-padded.
template <int MR, int NR, class D = DF>
HWY_INLINE void SmallTile(int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                          float beta, float* C, int64_t ldc) {
  using V = hn::Vec<D>;
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  V acc[MR * NR];
  for (int i = 0; i < MR * NR; ++i) acc[i] = hn::Zero(d);
  int64_t k = 0;
  for (; k + N <= K; k += N) {
    V b[NR];
    for (int j = 0; j < NR; ++j) b[j] = Pin<MR>(hn::LoadU(d, B + j * ldb + k));
    // the next tile's rows of B (the weight streams from memory once), at one row too: decoding
    // at batch 1 read its weights at 10-13 GB/s without, 14-16 with (docs/performance.md change 18)
    for (int j = 0; j < NR; ++j) hwy::Prefetch(B + (NR + j) * ldb + k);
    for (int i = 0; i < MR; ++i) {
      const V a = Pin<MR>(hn::LoadU(d, A + i * lda + k));
      for (int j = 0; j < NR; ++j) acc[i * NR + j] = hn::MulAdd(a, b[j], acc[i * NR + j]);
    }
  }
  if (k < K) {
    V b[NR];
    for (int j = 0; j < NR; ++j) b[j] = LoadTail<D>(B + j * ldb, k, K, 0.0f);
    for (int i = 0; i < MR; ++i) {
      const V a = LoadTail<D>(A + i * lda, k, K, 0.0f);
      for (int j = 0; j < NR; ++j) acc[i * NR + j] = hn::MulAdd(a, b[j], acc[i * NR + j]);
    }
  }
  HWY_ALIGN float sums[(MR * NR + k_max_lanes - 1) / k_max_lanes * k_max_lanes];
  int q = 0;
#if HWY_TARGET != HWY_SCALAR
  q = MR * NR / 4 * 4;
  SumsOfLanes<D>(acc, q, sums);
#endif
  for (; q < MR * NR; ++q) sums[q] = hn::GetLane(hn::SumOfLanes(d, acc[q]));
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      // s = alpha sum rounded, then fma(beta, c, s): the packed kernel's epilogue (PackedTiles),
      // written out. `s + beta * c` left the contraction to the compiler, which fused it into
      // fma(alpha, sum, beta c) in some tile shapes and ISAs and not in others, so with beta != 0
      // an output's bits hung on the tile it fell in (docs/performance.md change 28)
      const float s = alpha * sums[i * NR + j];
      float& c = C[i * ldc + j];
      c = beta == 0.0f ? s : std::fma(beta, c, s);
    }
}

/// Rows of A per SmallRows tile. 4 (16 accumulators at NR = 4) where the ISA has 32 vector
/// registers; 2 on x86's 16-register paths (AVX2, SSE4), where a 4 x 4 tile's accumulators and
/// loaded rows spilled to the stack and a 3 x 4 tile re-read every row of B from memory at each
/// multiply-add (docs/performance.md, issue 19 change 17). Each output keeps its own FMA chain,
/// and the reduction groups (Sum4 over 4 consecutive outputs of a tile) are a row's 4 columns at
/// NR = 4 and two even-aligned rows' 2 columns at NR = 2 for either row count, so those bits do
/// not depend on it; a single tail column (odd N) reduces each row alone at 2 rows.
#if HWY_ARCH_X86 && HWY_TARGET >= HWY_AVX2
constexpr int k_small_rows = 2;
#else
constexpr int k_small_rows = 4;
#endif

template <int NR, class D>
HWY_INLINE void SmallRows(int64_t M, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                          float beta, float* C, int64_t ldc) {
  constexpr int R = k_small_rows;
  int64_t i = 0;
  for (; i + R <= M; i += R) SmallTile<R, NR, D>(K, alpha, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc);
  switch (M - i) {  // R = 2 leaves at most 1
    case 3: SmallTile<3, NR, D>(K, alpha, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc); break;
    case 2: SmallTile<2, NR, D>(K, alpha, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc); break;
    case 1: SmallTile<1, NR, D>(K, alpha, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc); break;
    default: break;
  }
}

template <class D>
HWY_INLINE void GemmSmallNTIn(int64_t M, int64_t Nn, int64_t K, float alpha, const float* A, int64_t lda,
                              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  int64_t j = 0;
  if (M == 1) {
    // 16 rows of B at once only where K is long (a weight): at a head's K (decode attention's scores,
    // K = 48) the 16 row offsets did not fit the registers, and their reloads cost more than the 3
    // multiply-adds per row (change 35). The tile changes no bits (SumsOfLanes)
    if (K > 64)
      for (; j + 16 <= Nn; j += 16) SmallTile<1, 16, D>(K, alpha, A, lda, B + j * ldb, ldb, beta, C + j, ldc);
    for (; j + 8 <= Nn; j += 8) SmallTile<1, 8, D>(K, alpha, A, lda, B + j * ldb, ldb, beta, C + j, ldc);
  } else if (M == 2 && k_small_rows == 4) {  // 16 accumulators: only where 32 registers hold them
    for (; j + 8 <= Nn; j += 8) SmallTile<2, 8, D>(K, alpha, A, lda, B + j * ldb, ldb, beta, C + j, ldc);
  }
  for (; j + 4 <= Nn; j += 4) SmallRows<4, D>(M, K, alpha, A, lda, B + j * ldb, ldb, beta, C + j, ldc);
  for (; j + 2 <= Nn; j += 2) SmallRows<2, D>(M, K, alpha, A, lda, B + j * ldb, ldb, beta, C + j, ldc);
  for (; j < Nn; ++j) SmallRows<1, D>(M, K, alpha, A, lda, B + j * ldb, ldb, beta, C + j, ldc);
}

void GemmSmallNT(int64_t M, int64_t Nn, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
#if HWY_TARGET != HWY_SCALAR
  // K <= 8 on a path wider than 8 lanes (decode attention's scores at head size 8, stories260K, on
  // AVX-512): vectors of 8 lanes. The lanes past K are zeros either way, and adding a zero changes no
  // sum, so the bits are those of the full width, at half the loads and reductions (change 28)
  if constexpr (k_max_lanes > 8)
    if (K <= 8) return GemmSmallNTIn<hn::CappedTag<float, 8>>(M, Nn, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
  GemmSmallNTIn<DF>(M, Nn, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// ---------------------------------------------------------------- attention rows

void SoftmaxRow(float* a, int64_t n, const int32_t* pad, int64_t npad) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < npad && pad[p] < n; ++p) a[pad[p]] = neg_inf;
  const float m = MaxF(a, n);
  if (m == neg_inf) {  // no visible key: zeros
    std::fill(a, a + n, 0.0f);
    return;
  }
  const double inv = 1.0 / ExpSum(a, m, n, a);
  int64_t j = 0;
#if FLOWRUN_WIDE
  // each probability float(e_j * inv) from the double product, as the scalar tail below
  const DF d;
  const DD dd;
  const hn::Half<DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VD vinv = hn::Set(dd, inv);
  for (; j + N <= n; j += N) {
    const VF e = hn::LoadU(d, a + j);
    const auto lo = hn::DemoteTo(dh, hn::Mul(hn::PromoteTo(dd, hn::LowerHalf(dh, e)), vinv));
    const auto hi = hn::DemoteTo(dh, hn::Mul(hn::PromoteTo(dd, hn::UpperHalf(dh, e)), vinv));
    hn::StoreU(hn::Combine(d, hi, lo), d, a + j);
  }
#endif
  for (; j < n; ++j) a[j] = static_cast<float>(a[j] * inv);
}

// ---------------------------------------------------------------- decode attention

/// Rows [0, NG) and lane chunks [0, NC) of O = P V: o[g, c] = sum_j p[g, j] v[j, c], NG NC vector
/// FMA chains over the keys j < nvis in order, zero probabilities skipped. p row stride lda, v row
/// stride ldkv, o row stride ldo. D: the vectors (the full width, or a capped one for the lanes of
/// a head that a full vector would overrun); each output lane is the same chain whatever the width.
template <int NG, int NC, class D = DF>
HWY_INLINE void PvTile(int64_t nvis, const float* p, int64_t lda, const float* v, int64_t ldkv, float* o,
                       int64_t ldo) {
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<D> acc[NG * NC];
  for (int i = 0; i < NG * NC; ++i) acc[i] = hn::Zero(d);
  for (int64_t j = 0; j < nvis; ++j) {
    const float* vj = v + j * ldkv;
    for (int g = 0; g < NG; ++g) {
      const float pj = p[g * lda + j];
      if (pj == 0.0f) continue;
      const auto pv = hn::Set(d, pj);
      for (int c = 0; c < NC; ++c) acc[g * NC + c] = hn::MulAdd(pv, hn::LoadU(d, vj + c * N), acc[g * NC + c]);
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int c = 0; c < NC; ++c) hn::StoreU(acc[g * NC + c], d, o + g * ldo + c * N);
}

/// One lane chunk of D's width for every head of the group: PvTile over 4, 2 and 1 heads at once.
template <class D>
HWY_INLINE void PvGroups(int64_t group, int64_t nvis, const float* p, int64_t lda, const float* v, int64_t ldkv,
                         float* o, int64_t ldo) {
  int64_t g = 0;
  for (; g + 4 <= group; g += 4) PvTile<4, 1, D>(nvis, p + g * lda, lda, v, ldkv, o + g * ldo, ldo);
  for (; g + 2 <= group; g += 2) PvTile<2, 1, D>(nvis, p + g * lda, lda, v, ldkv, o + g * ldo, ldo);
  for (; g < group; ++g) PvTile<1, 1, D>(nvis, p + g * lda, lda, v, ldkv, o + g * ldo, ldo);
}

void AttendDecode(int64_t group, int64_t hs, int64_t nvis, float scale, const float* q, int64_t ldq, const float* k,
                  const float* v, int64_t ldkv, const int32_t* pad, int64_t npad, float* a, int64_t lda, float* o,
                  int64_t ldo) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  // scores (group, nvis) = scale q Kᵀ: cpu_gemm::small_m_nt's blocks of 16 keys on the small-M tiles
  for (int64_t n0 = 0; n0 < nvis; n0 += k_small_nt_block)
    GemmSmallNT(group, std::min(k_small_nt_block, nvis - n0), hs, scale, q, ldq, k + n0 * ldkv, ldkv, 0.0f, a + n0, lda);
  for (int64_t g = 0; g < group; ++g) SoftmaxRow(a + g * lda, nvis, pad, npad);
  // o_g = sum_j a[g, j] v_j: per output element one FMA chain over the keys in order (zero
  // probabilities skipped), up to 8 chains at once over the group's heads and the head's chunks
  // of lanes (one chain at a time ran at one FMA per latency)
  const int64_t chunks = hs / N;
  if (chunks == 1) {
    PvGroups<DF>(group, nvis, a, lda, v, ldkv, o, ldo);
  } else if (chunks > 1) {
    for (int64_t g = 0; g < group; ++g) {
      const float* ag = a + g * lda;
      float* og = o + g * ldo;
      int64_t c = 0;
      for (; c + 8 <= chunks; c += 8) PvTile<1, 8>(nvis, ag, lda, v + c * N, ldkv, og + c * N, ldo);
      switch (chunks - c) {
        case 7: PvTile<1, 7>(nvis, ag, lda, v + c * N, ldkv, og + c * N, ldo); break;
        case 6: PvTile<1, 6>(nvis, ag, lda, v + c * N, ldkv, og + c * N, ldo); break;
        case 5: PvTile<1, 5>(nvis, ag, lda, v + c * N, ldkv, og + c * N, ldo); break;
        case 4: PvTile<1, 4>(nvis, ag, lda, v + c * N, ldkv, og + c * N, ldo); break;
        case 3: PvTile<1, 3>(nvis, ag, lda, v + c * N, ldkv, og + c * N, ldo); break;
        case 2: PvTile<1, 2>(nvis, ag, lda, v + c * N, ldkv, og + c * N, ldo); break;
        case 1: PvTile<1, 1>(nvis, ag, lda, v + c * N, ldkv, og + c * N, ldo); break;
        default: break;
      }
    }
  }
  // lanes past the whole vectors (a head size under the lanes: stories260K's 8 on AVX-512) in
  // vectors of 8 and 4 lanes, then one by one: the same chains, so the same bits (stories260K
  // decode on AVX-512 1.36x at batch 1, 1.51x at batch 16: docs/performance.md change 27)
  int64_t c0 = chunks * N;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (k_max_lanes > 8)
    if (hs - c0 >= 8) {
      PvGroups<hn::CappedTag<float, 8>>(group, nvis, a, lda, v + c0, ldkv, o + c0, ldo);
      c0 += 8;
    }
  if constexpr (k_max_lanes > 4)
    if (hs - c0 >= 4) {
      PvGroups<hn::CappedTag<float, 4>>(group, nvis, a, lda, v + c0, ldkv, o + c0, ldo);
      c0 += 4;
    }
#endif
  for (int64_t c = c0; c < hs; ++c)  // the tail of a head size that is not a multiple of the lanes
    for (int64_t g = 0; g < group; ++g) {
      const float* ag = a + g * lda;
      float s = 0.0f;
      for (int64_t j = 0; j < nvis; ++j)
        if (ag[j] != 0.0f) s = std::fma(ag[j], v[j * ldkv + c], s);
      o[g * ldo + c] = s;
    }
}

// ---------------------------------------------------------------- packed GEMM (small weights)

/// Width of a packed panel of op(B): two vectors (16 floats on AVX2, 32 on AVX-512, 8 on SSE4/NEON).
int64_t GemmPanelWidth() { return 2 * static_cast<int64_t>(hn::Lanes(DF())); }

/// One panel of op(B) = Bᵀ: dst (K, W) row-major, dst[k W + j] = src[j ldb + k] for the nj <= W
/// rows j of src (N, K), columns j >= nj zero. Transposes 4 x 4 blocks in 128-bit vectors (every
/// target but HWY_SCALAR has them), k in blocks of 64 so that both the 64-row slice of the panel
/// (W x 64 floats) and the source block stay in L1: 3-6x the scalar column-by-column loop it replaced
/// (in cache; docs/performance.md change 24). A pure copy: the packed kernel's bits do not change.
HWY_INLINE void PackTransposed(int64_t W, int64_t nj, int64_t K, const float* src, int64_t ldb, float* dst) {
  int64_t j4 = 0;  // rows [0, j4) of src go through the 4 x 4 blocks
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<float> d4;
  constexpr int64_t KB = 64;
  const int64_t k4 = K / 4 * 4;
  j4 = nj / 4 * 4;
  for (int64_t kb = 0; kb < k4; kb += KB) {
    const int64_t ke = std::min(k4, kb + KB);
    for (int64_t j = 0; j < j4; j += 4) {
      const float* s0 = src + j * ldb;
      for (int64_t k = kb; k < ke; k += 4) {
        const auto r0 = hn::LoadU(d4, s0 + k), r1 = hn::LoadU(d4, s0 + ldb + k);
        const auto r2 = hn::LoadU(d4, s0 + 2 * ldb + k), r3 = hn::LoadU(d4, s0 + 3 * ldb + k);
        const auto t0 = hn::InterleaveLower(d4, r0, r1), t1 = hn::InterleaveLower(d4, r2, r3);  // k, k+1
        const auto t2 = hn::InterleaveUpper(d4, r0, r1), t3 = hn::InterleaveUpper(d4, r2, r3);  // k+2, k+3
        float* o = dst + k * W + j;
        hn::StoreU(hn::ConcatLowerLower(d4, t1, t0), d4, o);
        hn::StoreU(hn::ConcatUpperUpper(d4, t1, t0), d4, o + W);
        hn::StoreU(hn::ConcatLowerLower(d4, t3, t2), d4, o + 2 * W);
        hn::StoreU(hn::ConcatUpperUpper(d4, t3, t2), d4, o + 3 * W);
      }
    }
  }
  for (int64_t j = 0; j < j4; ++j)  // the last K % 4 columns of the blocked rows
    for (int64_t k = k4; k < K; ++k) dst[k * W + j] = src[j * ldb + k];
#endif
  for (int64_t j = j4; j < W; ++j) {  // the rows past the last whole block, then the zero padding
    if (j < nj) {
      const float* s = src + j * ldb;
      for (int64_t k = 0; k < K; ++k) dst[k * W + j] = s[k];
    } else {
      for (int64_t k = 0; k < K; ++k) dst[k * W + j] = 0.0f;
    }
  }
}

/// Panels [p0, p1) of op(B) (K, N) as ceil(N / W) panels of K rows of W floats, columns past N zero.
void GemmPackB(bool tb, int64_t N, int64_t K, const float* B, int64_t ldb, float* P, int64_t p0, int64_t p1) {
  const int64_t W = GemmPanelWidth();
  for (int64_t j0 = p0 * W; j0 < std::min(N, p1 * W); j0 += W) {
    const int64_t nj = std::min(W, N - j0);
    float* dst = P + j0 * K;  // panel j0 / W starts at (j0 / W) K W = j0 K
    if (!tb && nj == W) {  // B (K, N), a whole panel: two vector copies per row (a memcpy call of
      const DF d;          // 64 bytes per row cost more than the copy: 3% of a PPO iteration's samples)
      const int64_t L = static_cast<int64_t>(hn::Lanes(d));  // W = 2 L
      for (int64_t k = 0; k < K; ++k) {
        const float* src = B + k * ldb + j0;
        hn::StoreU(hn::LoadU(d, src), d, dst + k * W);
        hn::StoreU(hn::LoadU(d, src + L), d, dst + k * W + L);
      }
    } else if (!tb) {  // B (K, N): row k holds the panel's columns contiguously
      for (int64_t k = 0; k < K; ++k) {
        float* d = dst + k * W;
        std::memcpy(d, B + k * ldb + j0, static_cast<size_t>(nj) * sizeof(float));
        for (int64_t j = nj; j < W; ++j) d[j] = 0.0f;
      }
    } else {  // B (N, K): column j of op(B) is row j of B (x·Wᵀ's weight)
      PackTransposed(W, nj, K, B + j0 * ldb, ldb, dst);
    }
  }
}

/// Whether the target has 32 vector registers (x86's AVX-512), room for a 12 x 2 tile: 24
/// accumulators, two panel vectors and a broadcast. AVX2's 16 hold the 6 x 2 tile.
constexpr bool k_wide_tiles = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3;
/// The K from which x·Wᵀ and dy·W take the wide tile (PackedTileRows).
constexpr int64_t k_wide_min_k = 256;

/// Rows of a tile: 12 rows x 1 vector when N fits one vector (attention's P V at head size 8 on
/// AVX2), else 6 rows x 2 vectors: 12 accumulators, enough to hide the FMA latency. On AVX-512,
/// 12 rows x 2 vectors (24 accumulators) with op(A) = Aᵀ and wherever K >= k_wide_min_k: a panel
/// load then feeds 24 multiply-adds instead of 12. With op(A) = Aᵀ a tile's values of A at each k
/// are MR neighbours of one row of A, and 12 of them ran the 6.1 M LLaMA's dyᵀ·x 1.11-1.19x faster
/// than 6 on a Zen 5 host (docs/performance.md, change 38). On x·Wᵀ and dy·W the wider tile gained
/// at most 2% at K >= 288 and lost 3-12% at K <= 172 (stories260K) there, and ran 1.12-1.17x faster
/// at K = 288 and 768 on an Intel Xeon (family 6 model 167; change 41). The rows change no bits.
HWY_INLINE int64_t PackedTileRows(bool ta, int64_t N, int64_t K) {
  return N <= static_cast<int64_t>(hn::Lanes(DF())) || (k_wide_tiles && (ta || K >= k_wide_min_k)) ? 12 : 6;
}

/// Tiles of an (M, N) product, row block major.
int64_t GemmPackedTiles(bool ta, int64_t M, int64_t N, int64_t K) {
  const int64_t W = GemmPanelWidth(), mr = PackedTileRows(ta, N, K);
  return (M + mr - 1) / mr * ((N + W - 1) / W);
}

/// One MR x (NV vectors) tile: acc[NV r + v] = sum over k, in order, of a(r, k) * panel[k][v L ..]:
/// one fused multiply-add chain per output, so an output's bits depend on neither the tile it is
/// in nor the number of rows or columns of the call. Rows past M read row M - 1 (results dropped).
template <bool TA, int MR, int NV>
HWY_INLINE void PackedTile(int64_t K, const float* const* a, int64_t lda, const float* panel, VF* acc) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int q = 0; q < MR * NV; ++q) acc[q] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = panel + k * 2 * L;  // panels are two vectors wide whatever NV
    VF b[NV];
    for (int v = 0; v < NV; ++v) b[v] = hn::LoadU(d, bk + v * L);
    for (int r = 0; r < MR; ++r) {
      const VF ar = hn::Set(d, TA ? a[r][k * lda] : a[r][k]);
      for (int v = 0; v < NV; ++v) acc[NV * r + v] = hn::MulAdd(ar, b[v], acc[NV * r + v]);
    }
  }
}

/// PackedTile for op(A) = Aᵀ (A (K, M)) when the tile's MR rows of op(A) are all inside M: a0 = A + i0,
/// and a(r, k) = a0[k lda + r], so one pointer and MR fixed offsets address them (the pointer array
/// of the general tile costs a load per row per k). The same multiply-adds in the same order.
template <int MR, int NV>
HWY_INLINE void PackedTileTA(int64_t K, const float* a0, int64_t lda, const float* panel, VF* acc) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int q = 0; q < MR * NV; ++q) acc[q] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = panel + k * 2 * L;
    const float* ak = a0 + k * lda;
    VF b[NV];
    for (int v = 0; v < NV; ++v) b[v] = hn::LoadU(d, bk + v * L);
    for (int r = 0; r < MR; ++r) {
      const VF ar = hn::Set(d, ak[r]);
      for (int v = 0; v < NV; ++v) acc[NV * r + v] = hn::MulAdd(ar, b[v], acc[NV * r + v]);
    }
  }
}

template <int MR, int NV>
HWY_INLINE void PackedTiles(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                            const float* P, float beta, float* C, int64_t ldc, int64_t t0, int64_t t1) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d)), W = 2 * L;
  const int64_t np = (N + W - 1) / W;
  const VF va = hn::Set(d, alpha), vb = hn::Set(d, beta);
  VF acc[MR * NV];
  HWY_ALIGN float buf[k_max_lanes];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t i0 = (t / np) * MR, j0 = (t % np) * W;
    if (ta && i0 + MR <= M) {
      PackedTileTA<MR, NV>(K, A + i0, lda, P + j0 * K, acc);
    } else {
      const float* a[MR];
      for (int64_t r = 0; r < MR; ++r) {
        const int64_t i = std::min(i0 + r, M - 1);
        a[r] = ta ? A + i : A + i * lda;
      }
      if (ta)
        PackedTile<true, MR, NV>(K, a, lda, P + j0 * K, acc);
      else
        PackedTile<false, MR, NV>(K, a, lda, P + j0 * K, acc);
    }
    const int64_t rows = std::min<int64_t>(MR, M - i0), nj = std::min(W, N - j0);
    for (int64_t r = 0; r < rows; ++r) {
      float* c = C + (i0 + r) * ldc + j0;
      for (int64_t v = 0; v < NV; ++v) {
        const int64_t n = std::min(L, nj - v * L);
        if (n <= 0) break;
        VF res = hn::Mul(va, acc[NV * r + v]);
        if (n == L) {
          if (beta != 0.0f) res = hn::MulAdd(vb, hn::LoadU(d, c + v * L), res);
          hn::StoreU(res, d, c + v * L);
        } else {  // the same vector math through a buffer, n < L columns kept
          if (beta != 0.0f) {
            for (int64_t j = 0; j < L; ++j) buf[j] = j < n ? c[v * L + j] : 0.0f;
            res = hn::MulAdd(vb, hn::Load(d, buf), res);
          }
          hn::Store(res, d, buf);
          std::memcpy(c + v * L, buf, static_cast<size_t>(n) * sizeof(float));
        }
      }
    }
  }
}

/// Tiles [t0, t1) of C = alpha op(A) op(B) + beta C, op(B) packed by GemmPackB; tile t covers rows
/// [MR (t / np), + MR) and panel t % np (np = ceil(N / W), MR = PackedTileRows(ta, N, K)).
void GemmPacked(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* P,
                float beta, float* C, int64_t ldc, int64_t t0, int64_t t1) {
  if (N <= static_cast<int64_t>(hn::Lanes(DF())))
    PackedTiles<12, 1>(ta, M, N, K, alpha, A, lda, P, beta, C, ldc, t0, t1);
  else if (PackedTileRows(ta, N, K) == 12)
    PackedTiles<12, 2>(ta, M, N, K, alpha, A, lda, P, beta, C, ldc, t0, t1);
  else
    PackedTiles<6, 2>(ta, M, N, K, alpha, A, lda, P, beta, C, ldc, t0, t1);
}

/// The name of the target this copy was compiled for (what the dispatcher calls now).
const char* TargetNameOf() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace flowrun::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <stdexcept>

namespace flowrun::simd {

HWY_EXPORT(MaxF);
HWY_EXPORT(ArgmaxF);
HWY_EXPORT(ExpSum);
HWY_EXPORT(ExpF);
HWY_EXPORT(ScaleF);
HWY_EXPORT(LogSoftmaxBackwardRow);
HWY_EXPORT(SiluForward);
HWY_EXPORT(SiluBackward);
HWY_EXPORT(GeluForward);
HWY_EXPORT(GeluBackward);
HWY_EXPORT(SwigluForward);
HWY_EXPORT(SwigluBackward);
HWY_EXPORT(Adamw);
HWY_EXPORT(RmsnormRowForward);
HWY_EXPORT(RmsnormRowBackward);
HWY_EXPORT(LayernormRowForward);
HWY_EXPORT(LayernormRowBackward);
HWY_EXPORT(GemmSmallNT);
HWY_EXPORT(AttendDecode);
HWY_EXPORT(SoftmaxRow);
HWY_EXPORT(GemmPanelWidth);
HWY_EXPORT(GemmPackB);
HWY_EXPORT(GemmPacked);
HWY_EXPORT(GemmPackedTiles);
HWY_EXPORT(TargetNameOf);

std::string active_target() { return HWY_DYNAMIC_DISPATCH(TargetNameOf)(); }

namespace {
/// The compiled targets this CPU supports, best first; read once, before any
/// force_target (the mock it sets would hide the others).
const std::vector<int64_t>& cpu_targets() {
  static const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  return targets;
}
}  // namespace

std::vector<std::string> available_targets() {
  std::vector<std::string> names;
  for (int64_t t : cpu_targets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

void force_target(const std::string& name) {
  std::string known;
  for (int64_t t : cpu_targets()) {
    if (name == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      return;
    }
    known += std::string(known.empty() ? "" : ", ") + hwy::TargetName(t);
  }
  throw std::invalid_argument("simd::force_target: no path '" + name + "' on this CPU (available: " + known + ")");
}

void reset_target() { hwy::SetSupportedTargetsForTest(0); }

float max_f(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxF)(x, n); }
int64_t argmax_f(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(ArgmaxF)(x, n); }
float log_softmax_at(const float* x, int64_t n, int64_t i) {
  const float mx = max_f(x, n);
  const double s = exp_sum(x, mx, n, nullptr);
  return static_cast<float>(static_cast<double>(x[i] - mx) - std::log(s));
}
double exp_sum(const float* x, float shift, int64_t n, float* out) {
  return HWY_DYNAMIC_DISPATCH(ExpSum)(x, shift, n, out);
}
void exp_f(float* out, const float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(ExpF)(out, x, n); }
void scale_f(float* y, float s, int64_t n) { HWY_DYNAMIC_DISPATCH(ScaleF)(y, s, n); }
void log_softmax_backward_row(float* dx, const float* dy, const float* y, float sdy, int64_t n) {
  HWY_DYNAMIC_DISPATCH(LogSoftmaxBackwardRow)(dx, dy, y, sdy, n);
}
void silu_forward(float* out, const float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(SiluForward)(out, x, n); }
void silu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluBackward)(dx, dy, x, n);
}
void gelu_forward(float* out, const float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(GeluForward)(out, x, n); }
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluBackward)(dx, dy, x, n);
}
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluForward)(out, gate, up, n);
}
void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluBackward)(dgate, dup, dy, gate, up, n);
}
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const adamw_scalars& s) {
  HWY_DYNAMIC_DISPATCH(Adamw)(p, g, m, v, n, s);
}
float rmsnorm_row_forward(float* out, const float* x, const float* w, int64_t C, float eps) {
  return HWY_DYNAMIC_DISPATCH(RmsnormRowForward)(out, x, w, C, eps);
}
void rmsnorm_row_backward(float* dx, const float* dy, const float* x, const float* w, float rstd, int64_t C) {
  HWY_DYNAMIC_DISPATCH(RmsnormRowBackward)(dx, dy, x, w, rstd, C);
}
void layernorm_row_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                           int64_t C, float eps) {
  HWY_DYNAMIC_DISPATCH(LayernormRowForward)(out, mean, rstd, x, w, b, C, eps);
}
void layernorm_row_backward(float* dx, const float* dy, const float* x, const float* w, float mean, float rstd,
                            int64_t C) {
  HWY_DYNAMIC_DISPATCH(LayernormRowBackward)(dx, dy, x, w, mean, rstd, C);
}
void gemm_small_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                   int64_t ldb, float beta, float* C, int64_t ldc) {
  HWY_DYNAMIC_DISPATCH(GemmSmallNT)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void softmax_row(float* a, int64_t n, const int32_t* pad, int64_t npad) {
  HWY_DYNAMIC_DISPATCH(SoftmaxRow)(a, n, pad, npad);
}
void attend_decode(int64_t group, int64_t hs, int64_t nvis, float scale, const float* q, int64_t ldq, const float* k,
                   const float* v, int64_t ldkv, const int32_t* pad, int64_t npad, float* a, int64_t lda, float* o,
                   int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(AttendDecode)(group, hs, nvis, scale, q, ldq, k, v, ldkv, pad, npad, a, lda, o, ldo);
}
int64_t gemm_panel_width() { return HWY_DYNAMIC_DISPATCH(GemmPanelWidth)(); }
void gemm_pack_b(bool trans_b, int64_t N, int64_t K, const float* B, int64_t ldb, float* packed, int64_t p0,
                 int64_t p1) {
  HWY_DYNAMIC_DISPATCH(GemmPackB)(trans_b, N, K, B, ldb, packed, p0, p1);
}
int64_t gemm_packed_tiles(bool trans_a, int64_t M, int64_t N, int64_t K) {
  return HWY_DYNAMIC_DISPATCH(GemmPackedTiles)(trans_a, M, N, K);
}
void gemm_packed(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* packed, float beta, float* C, int64_t ldc, int64_t t0, int64_t t1) {
  HWY_DYNAMIC_DISPATCH(GemmPacked)(trans_a, M, N, K, alpha, A, lda, packed, beta, C, ldc, t0, t1);
}

}  // namespace flowrun::simd
#endif  // HWY_ONCE
