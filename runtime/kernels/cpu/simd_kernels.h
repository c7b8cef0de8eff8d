// Vector kernels of the CPU backend, one source for every instruction set.
//
// runtime/kernels/cpu/simd_kernels.cpp compiles each function once per target
// of Google Highway (x86: SSE4, AVX2, AVX-512 "AVX3"; ARM: NEON; plus the
// portable fallback everywhere) and calls the best one the running CPU
// supports (hwy's foreach_target.h + HWY_DYNAMIC_DISPATCH). The build's own
// -march flags do not limit the choice: a FLOWRUN_NATIVE=OFF build runs the
// AVX-512 path on an AVX-512 CPU. The functions below are plain C++ and hide
// Highway from their callers (cpu_backend.cpp, gemm.h, the tests, bench_core).
//
// All buffers are f32, contiguous, of n elements (n >= 0, no alignment needed);
// tails shorter than a vector go through a stack buffer, so no read or write
// leaves [0, n). Unless said otherwise an output may alias an input of the same
// index range (each element is read before it is written).
//
// exp: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, and Cephes'
// degree-6 polynomial for e^r (Moshier, Cephes expf.c), then 2^n from the
// exponent bits (as two factors, so n = 128 is representable). Max error about
// 2 ulp over [-87, 88] (tests/test_simd.cpp checks it against double exp on
// every target); exp(x < -87.33) = 0 (no denormal results: attention's P
// feeds GEMMs, where denormals cost microcode assists), exp(-inf) = 0,
// exp(+large) = inf, NaN propagates.
//
// Sums that feed a statistic (exp_sum, the norms' moments) are accumulated in
// double; the elementwise math is f32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowrun::simd {

// ------------------------------------------------------------------ dispatch

/// Name of the path the kernels take now (Highway's target name: "AVX3",
/// "AVX2", "SSE4", "NEON", or the portable fallback "SCALAR" (GCC 12) / "EMU128").
std::string active_target();

/// The compiled paths this CPU can run, best first.
std::vector<std::string> available_targets();

/// Makes every kernel take the path `name` (one of available_targets()) until
/// reset_target(); for tests and bench_core, not thread-safe against running
/// kernels. Throws std::invalid_argument naming the available paths.
void force_target(const std::string& name);

/// Back to the best path of this CPU.
void reset_target();

// ------------------------------------------------------------------ reductions and row helpers

/// max over x[0, n) (-inf when n == 0).
float max_f(const float* x, int64_t n);

/// Index of the first largest element of x[0, n) (-1 when n == 0): std::max_element's
/// answer, in two vector passes (the max, then the first lane equal to it). A row with
/// a NaN takes std::max_element itself, so NaNs give the same index as before.
int64_t argmax_f(const float* x, int64_t n);

/// The log-softmax of x[0, n) at index i (0 <= i < n): x[i] - m - log(sum_j exp(x[j] - m)),
/// m = max(x), the sum in double over the vector exp (about 2 ulp per term). The one formula
/// of a token's log-prob: the trainers' rlhf::gather_log_probs_forward and the generator's
/// recorded behaviour log-probs (models/generate.cpp) both call it, so they agree bit for bit.
float log_softmax_at(const float* x, int64_t n, int64_t i);

/// sum over i of exp(x[i] - shift), accumulated in double; if `out` is not
/// null, out[i] = exp(x[i] - shift) (out may be x).
double exp_sum(const float* x, float shift, int64_t n, float* out);

/// out[i] = exp(x[i]) (the vector exp above; out may be x).
void exp_f(float* out, const float* x, int64_t n);

// dot_f and axpy_f run on one attention head's row (8 to 128 floats) once per
// key: a dispatched call with its tail handling costs more than that work, so
// these two stay inline loops the compiler vectorises for the build's ISA.

/// sum of a[i] b[i] in f32.
inline float dot_f(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// y[i] += a x[i] (y must not overlap x).
inline void axpy_f(float* __restrict__ y, const float* __restrict__ x, float a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

/// y[i] *= s
void scale_f(float* y, float s, int64_t n);

/// log-softmax backward of one row: dx[i] = dy[i] - exp(y[i]) sdy, where y is
/// the log-softmax output and sdy = sum(dy) (dx may alias dy).
void log_softmax_backward_row(float* dx, const float* dy, const float* y, float sdy, int64_t n);

// ------------------------------------------------------------------ activations (x, dy, out: (n))

/// SiLU (Elfwing et al. 2018): out = x sigmoid(x).
void silu_forward(float* out, const float* x, int64_t n);
/// dx = dy s (1 + x (1 - s)), s = sigmoid(x) (overwrites dx).
void silu_backward(float* dx, const float* dy, const float* x, int64_t n);

/// GELU, tanh form (Hendrycks & Gimpel 2016, sec. 2; llm.c gelu_forward):
/// out = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
void gelu_forward(float* out, const float* x, int64_t n);
/// llm.c gelu_backward with s = sigmoid(2u): dx = dy (s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 0.044715 x^2)).
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);

/// SwiGLU (Shazeer 2020, eq. 6): out = silu(gate) up.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
/// dgate = dy up silu'(gate), dup = dy silu(gate) (overwrites both).
void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n);

// ------------------------------------------------------------------ norms, one row of C (C >= 1)

/// RMSNorm (Zhang & Sennrich 2019, eq. 4) of one row: out = (x rstd) w with
/// rstd = 1/sqrt(mean(x^2) + eps), mean(x^2) in double. Returns rstd (f32).
float rmsnorm_row_forward(float* out, const float* x, const float* w, int64_t C, float eps);
/// dx += rstd w dy - rstd^3 x / C sum_k(dy_k w_k x_k) (the sum in double).
void rmsnorm_row_backward(float* dx, const float* dy, const float* x, const float* w, float rstd, int64_t C);

/// LayerNorm (Ba et al. 2016; llm.c layernorm_forward), biased variance, the
/// mean and variance in double: out = ((x - mean) rstd) w + b (b may be null).
/// Writes the row's mean and rstd (f32).
void layernorm_row_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                           int64_t C, float eps);
/// llm.c layernorm_backward: norm = (x - mean) rstd, dnorm = w dy,
/// dx += rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)) (the means in double).
void layernorm_row_backward(float* dx, const float* dy, const float* x, const float* w, float mean, float rstd,
                            int64_t C);

// ------------------------------------------------------------------ AdamW

/// The per-step scalars of torch.optim.AdamW (decoupled weight decay, bias
/// corrected moments); see ops::adamw_coeffs.
struct adamw_scalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float inv_bc1;       // 1 / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps, lr, lr_wd;
};

/// One AdamW step over n parameters, f32 element math:
///   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
///   p = (p - lr wd p) - lr (m / bc1) / (sqrt(v) / sqrt(bc2) + eps).
/// p, m, v are updated in place; none may overlap another.
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const adamw_scalars& s);

// ------------------------------------------------------------------ small-M GEMM

/// C (M, N) = alpha A Bᵀ + beta C for a few rows of A (M >= 1): A (M, K) row
/// stride lda, B (N, K) row stride ldb, C row stride ldc; beta == 0 ignores
/// C's old contents. Dot products of rows accumulated in f32, vector lanes in
/// parallel over K. Single-threaded (the caller splits N over threads).
/// Rows of B per gemm_small_nt call where a caller splits a longer B (cpu_gemm::small_m_nt over
/// threads, attend_decode over keys): the tiles, and so the bits, depend on this split.
constexpr int64_t k_small_nt_block = 16;
void gemm_small_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                   int64_t ldb, float beta, float* C, int64_t ldc);

// ------------------------------------------------------------------ attention rows

/// One attention row in place: a[0, n) holds the scaled scores of the causally visible keys,
/// pad[0, npad) the padding keys (ascending; those >= n are ignored). Writes the softmax over the
/// visible non-padding keys: a[j] = exp(a[j] - max) / sum, the max over the non-padding keys, the
/// sum in double, each probability rounded once from its double product with 1 / sum (a float
/// scale by a rounded 1 / sum adds an ulp that test_dpo's finite differences of the loss saw);
/// padding keys 0, and a row with no visible key all 0. The one softmax of attention's forward
/// (the causal blocks of the GEMM path and attend_decode).
void softmax_row(float* a, int64_t n, const int32_t* pad, int64_t npad);

// ------------------------------------------------------------------ decode attention

/// One task of attention for decoding and short queries: one query position, the `group` query
/// heads that share one kv head (grouped-query attention; group = 1 for multi-head).
///   q (group, hs), row stride ldq; k, v (nvis, hs), row stride ldkv: the visible keys and values
///   pad[0, npad): ascending padding-key indices (masked out; those >= nvis are ignored)
///   a (group, nvis), row stride lda: out, the probabilities
///     a[g, j] = exp(s_gj - max_j s_gj) / sum_j exp(s_gj - max), s_gj = scale q_g . k_j,
///     padding keys 0, a row with no visible key all 0 (a[g, nvis..) is not touched)
///   o (group, hs), row stride ldo: out, o_g = sum_j a[g, j] v_j
/// The scores on gemm_small_nt's tiles in blocks of k_small_nt_block keys, the probabilities by softmax_row, and
/// each output element one FMA
/// chain over the keys in order (zero probabilities skipped): the arithmetic of the separate
/// calls it replaces (docs/performance.md, issue 19 change 14), without their dispatch and loop
/// overhead, which at head size 8 cost more than the work. Single-threaded.
void attend_decode(int64_t group, int64_t hs, int64_t nvis, float scale, const float* q, int64_t ldq, const float* k,
                   const float* v, int64_t ldkv, const int32_t* pad, int64_t npad, float* a, int64_t lda, float* o,
                   int64_t ldo);

// ------------------------------------------------------------------ packed GEMM (small weights)
//
// C (M, N) = alpha op(A) op(B) + beta C, row-major, op(A) (M, K), op(B) (K, N):
// op(B) is packed once into panels of gemm_panel_width() columns (K rows each,
// zero past N), then each tile (6 rows x one panel, or 12 rows x half a panel
// when N fits in half: attention's P V at head size 8) keeps one
// accumulator per output and runs ONE fused multiply-add chain over k = 0 ..
// K-1 in order; C = alpha acc (+ beta C). So an output's bits depend only on
// its row of op(A), its column of op(B), K and the path: not on M, N, the tile
// it falls in, nor the thread that runs it. The paths with a fused multiply-add
// (AVX-512, AVX2, 64-bit NEON) give the same bits, those of a std::fma chain;
// SSE4 and the portable fallback round the product and the sum separately
// (tests/test_simd.cpp). No per-call setup besides the packing (ceil(N / W) W K
// floats), which is what small products need: BLIS spent ~10 us per call on the
// attention heads of stories260K (docs/performance.md).

/// Columns of one packed panel on this path (16 on AVX2, 32 on AVX-512, 8 on SSE4/NEON).
int64_t gemm_panel_width();

/// Packs panels [p0, p1) of op(B) (K, N) into `packed`, which holds ceil(N / W) W K floats in all
/// (W = gemm_panel_width(); panel p at p W K): B is (K, N) with row stride ldb, or (N, K) when
/// trans_b. Threads may pack disjoint panel ranges at once.
void gemm_pack_b(bool trans_b, int64_t N, int64_t K, const float* B, int64_t ldb, float* packed, int64_t p0,
                 int64_t p1);

/// Number of tiles of an (M, N) product over K for gemm_packed with the same trans_a and K:
/// ceil(M / rows) ceil(N / W), row block major (rows 6; 12 when N <= W / 2, or on AVX-512 with
/// trans_a or K >= 256).
int64_t gemm_packed_tiles(bool trans_a, int64_t M, int64_t N, int64_t K);

/// Computes tiles [t0, t1) of C = alpha op(A) op(B) + beta C from op(B) packed by gemm_pack_b:
/// A is (M, K) with row stride lda, or (K, M) when trans_a; beta == 0 ignores C's old contents.
/// Tiles are independent: threads may run disjoint ranges at once.
void gemm_packed(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* packed, float beta, float* C, int64_t ldc, int64_t t0, int64_t t1);

}  // namespace flowrun::simd
