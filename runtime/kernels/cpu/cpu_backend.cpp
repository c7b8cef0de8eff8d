// The CPU backend: a GEMM library for matrix products (runtime/kernels/cpu/gemm.h:
// oneDNN, BLIS or OpenBLAS, chosen at configure time by measurement), and
// llm.c-style loops for the rest, parallelised over rows with OpenMP, whose
// inner loops are the Highway kernels of runtime/kernels/cpu/simd_kernels.h
// (AVX-512, AVX2, SSE4, NEON or scalar, chosen at run time from the CPU).
//
// Every function receives tensors already validated by ops.cpp (shapes, dtypes,
// devices), so nothing here re-checks shapes; the only throws are the data
// dependent ones (out-of-range token ids / targets), done serially before any
// parallel region (an exception must not leave an OpenMP region).
//
// Numerics: reductions that feed a statistic (norm means/variances, softmax
// and logsumexp sums, sum of squares, the column sums of weight gradients)
// are accumulated in double, so f32 results agree with a float64 reference to
// ~1e-6 relative. Column reductions over rows (dw, dbias) are done per column
// block in a fixed order: results do not depend on the number of threads.
// exp is a vector polynomial (simd_kernels.h, ~2 ulp). AdamW's element math is f32
// (see adamw_step). Attention at training sizes runs on GEMMs per (batch, head).
//
// Aliasing: elementwise ops (add, axpy, activations, swiglu, softmax, the
// cross-entropy gradient) read each element before writing it, so they may be
// called in place (out == input). GEMM outputs must not alias their inputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernels/backend.h"
#include "runtime/kernels/cpu/gemm.h"
#include "runtime/kernels/cpu/gemm_bf16.h"
#include "runtime/kernels/cpu/simd_kernels.h"
#include "runtime/kernels/ops.h"

namespace flowrun {
namespace {

// Below this many elements of work an op runs on one thread. A parallel region
// costs a few microseconds on an idle machine, but when the cores are shared
// (other processes, or the actor runtime's own threads) a region waits for a
// descheduled team member for up to a scheduler time slice (milliseconds):
// stories260K's step took 40x longer with 2 threads than with 1 on a loaded
// machine at the old 32K threshold. 128K elements is ~50-100 us of work.
constexpr int64_t k_par_min = 1 << 17;
// Column block of the deterministic column reductions (dw, dbias).
constexpr int64_t k_col_block = 32;

using simd::dot_f;

/// Runs f(i0, len) over [0, n) in chunks of 4K elements, spread over the
/// OpenMP team when `par` (the chunking, and so the results, do not depend on
/// the number of threads).
template <class F>
inline void for_chunks(int64_t n, bool par, F&& f) {
  constexpr int64_t CH = 1 << 12;
  const int64_t nch = (n + CH - 1) / CH;
#pragma omp parallel for schedule(static) if (par && nch > 1)
  for (int64_t c = 0; c < nch; ++c) {
    const int64_t i0 = c * CH;
    f(i0, std::min(n, i0 + CH) - i0);
  }
}

class cpu_backend_impl final : public backend {
 public:
  // FLOWRUN_CPU_GEMM read when the backend first serves: an unknown value is named on stderr in every
  // build, also in those whose products never consult it (no BLIS)
  cpu_backend_impl() { (void)cpu_gemm::gemm_override(); }
  const char* name() const override { return "cpu"; }

  // ---------------------------------------------------------------- basics

  void add(tensor& out, const tensor& a, const tensor& b) override {
    const int64_t n = out.numel();
    float* o = out.data<float>();
    const float* x = a.data<float>();
    const float* y = b.data<float>();
#pragma omp parallel for simd schedule(static) if (n >= 4 * k_par_min)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  }

  void axpy(tensor& y, const tensor& x, float alpha) override {
    const int64_t n = y.numel();
    float* yp = y.data<float>();
    const float* xp = x.data<float>();
#pragma omp parallel for simd schedule(static) if (n >= 4 * k_par_min)
    for (int64_t i = 0; i < n; ++i) yp[i] += alpha * xp[i];
  }

  void scale(tensor& x, float s) override {
    const int64_t n = x.numel();
    float* p = x.data<float>();
#pragma omp parallel for simd schedule(static) if (n >= 4 * k_par_min)
    for (int64_t i = 0; i < n; ++i) p[i] *= s;
  }

  void fill(tensor& x, float v) override {
    const int64_t n = x.numel();
    float* p = x.data<float>();
#pragma omp parallel for simd schedule(static) if (n >= 4 * k_par_min)
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  }

  // ---------------------------------------------------------------- GEMM

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    gemm_at(bf16_products(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  /// Whether the calling thread's products are bf16 ones (ops::matmul_precision::bf16 on a CPU
  /// with bf16 dot products: gemm_bf16.h); read by the caller, as OpenMP's threads start at f32.
  static bool bf16_products() {
    return ops::get_matmul_precision() == ops::matmul_precision::bf16 && cpu_gemm::bf16_native();
  }

  /// gemm with the precision given: bf16 = gemm_bf16.h's products, whatever the shape.
  void gemm_at(bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) {  // C = beta C (BLAS semantics: beta == 0 ignores C's old contents)
      for (int64_t i = 0; i < M; ++i) {
        float* c = C + i * ldc;
        if (beta == 0.0f)
          for (int64_t j = 0; j < N; ++j) c[j] = 0.0f;
        else
          for (int64_t j = 0; j < N; ++j) c[j] *= beta;
      }
      return;
    }
    lda = std::max<int64_t>(lda, 1);
    ldb = std::max<int64_t>(ldb, 1);
    ldc = std::max<int64_t>(ldc, 1);
    cpu_gemm::check_sizes(M, N, K, lda, ldb, ldc);
    if (bf16) {
      cpu_gemm::bf16_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
    // decoding: a few rows times a transposed weight, one pass over the weight
    if (!trans_a && trans_b && M <= cpu_gemm::k_small_m) {
      cpu_gemm::small_m_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
    // small op(B) (stories260K's weights, attention heads): our packed kernel, no library overhead;
    // and x·Wᵀ of any size up to use_packed_nt's K where the products are split (gemm.h)
    if (cpu_gemm::use_packed(N, K) || (!trans_a && trans_b && cpu_gemm::use_packed_nt(K))) {
      cpu_gemm::packed_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
    cpu_gemm::library_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                    float* C, int64_t ldc, int64_t stride_c, int64_t batch) override {
    // Small matrices (attention heads): one single-threaded GEMM per OpenMP
    // thread (the libraries run single-threaded inside a parallel region).
    // Large ones: let the library thread each GEMM.
    const bool small = M * N * K < (1 << 18);
    const bool bf16 = bf16_products();  // the caller's setting: the team's threads have their own
    if (small && batch > 1) {
      cpu_gemm::check_sizes(M, N, K, lda, ldb, ldc);  // throws here, not inside the parallel region
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < batch; ++i)
        gemm_at(bf16, trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
                C + i * stride_c, ldc);
    } else {
      for (int64_t i = 0; i < batch; ++i)
        gemm_at(bf16, trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
                C + i * stride_c, ldc);
    }
  }

  // out (N, C) += bias (C)
  void add_bias(tensor& out, const tensor& bias) override {
    const int64_t C = bias.numel();
    const int64_t N = C ? out.numel() / C : 0;
    float* o = out.data<float>();
    const float* __restrict__ b = bias.data<float>();
#pragma omp parallel for schedule(static) if (N * C >= k_par_min)
    for (int64_t n = 0; n < N; ++n) {
      float* __restrict__ row = o + n * C;
      for (int64_t c = 0; c < C; ++c) row[c] += b[c];
    }
  }

  // dbias (C) += sum over rows of dout (N, C); column blocks, rows in order.
  void bias_backward(tensor& dbias, const tensor& dout) override {
    const int64_t C = dbias.numel();
    const int64_t N = C ? dout.numel() / C : 0;
    float* db = dbias.data<float>();
    const float* d = dout.data<float>();
    const int64_t nblk = (C + k_col_block - 1) / k_col_block;
#pragma omp parallel for schedule(static) if (N * C >= k_par_min)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t c0 = blk * k_col_block, c1 = std::min(C, c0 + k_col_block);
      double acc[k_col_block] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* row = d + n * C;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) db[c] += static_cast<float>(acc[c - c0]);
    }
  }

  // ---------------------------------------------------------------- embedding

  // out (N, C) = wte (V, C)[ids (N)]
  void embedding_forward(tensor& out, const tensor& ids, const tensor& wte) override {
    const int64_t N = ids.numel(), C = wte.size(1);
    const int32_t* id = ids.data<int32_t>();  // in [0, V): checked by ops.cpp
    float* o = out.data<float>();
    const float* w = wte.data<float>();
#pragma omp parallel for schedule(static) if (N * C >= k_par_min)
    for (int64_t n = 0; n < N; ++n) std::memcpy(o + n * C, w + static_cast<int64_t>(id[n]) * C, C * sizeof(float));
  }

  // dwte[ids[n]] += dout[n]; ids < 0 skipped. Parallel over column blocks so
  // repeated ids never race and the summation order is fixed.
  void embedding_backward(tensor& dwte, const tensor& dout, const tensor& ids) override {
    const int64_t N = ids.numel(), C = dwte.size(1);
    const int32_t* id = ids.data<int32_t>();  // < V: checked by ops.cpp
    float* dw = dwte.data<float>();
    const float* d = dout.data<float>();
    const int64_t blk_c = 64;
    const int64_t nblk = (C + blk_c - 1) / blk_c;
#pragma omp parallel for schedule(static) if (N * C >= k_par_min)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t c0 = blk * blk_c, c1 = std::min(C, c0 + blk_c);
      for (int64_t n = 0; n < N; ++n) {
        if (id[n] < 0) continue;
        float* __restrict__ dst = dw + static_cast<int64_t>(id[n]) * C;
        const float* __restrict__ src = d + n * C;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }

  // ---------------------------------------------------------------- norms

  // RMSNorm (Zhang & Sennrich 2019, eq. 4): out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
  void rmsnorm_forward(tensor& out, tensor& rstd, const tensor& x, const tensor& w, float eps) override {
    const int64_t C = w.numel();
    const int64_t N = C ? x.numel() / C : 0;
    float* o = out.data<float>();
    float* rs = rstd.data<float>();
    const float* xp = x.data<float>();
    const float* __restrict__ wp = w.data<float>();
#pragma omp parallel for schedule(static) if (N * C >= k_par_min)
    for (int64_t n = 0; n < N; ++n) rs[n] = simd::rmsnorm_row_forward(o + n * C, xp + n * C, wp, C, eps);
  }

  // y_c = x_c r w_c with r = (mean(x^2) + eps)^(-1/2), dr/dx_c = -r^3 x_c / C:
  // dx_c += r w_c dy_c - r^3 x_c / C * sum_k(dy_k w_k x_k); dw_c += sum_n dy_c x_c r.
  void rmsnorm_backward(tensor& dx, tensor& dw, const tensor& dout, const tensor& x, const tensor& w,
                        const tensor& rstd) override {
    const int64_t C = w.numel();
    const int64_t N = C ? x.numel() / C : 0;
    float* dxp = dx.data<float>();
    float* dwp = dw.data<float>();
    const float* dop = dout.data<float>();
    const float* xp = x.data<float>();
    const float* __restrict__ wp = w.data<float>();
    const float* rs = rstd.data<float>();
    const bool par = N * C >= k_par_min;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t n = 0; n < N; ++n) {
      simd::rmsnorm_row_backward(dxp + n * C, dop + n * C, xp + n * C, wp, rs[n], C);
    }
    const int64_t nblk = (C + k_col_block - 1) / k_col_block;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t c0 = blk * k_col_block, c1 = std::min(C, c0 + k_col_block);
      double acc[k_col_block] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* dy = dop + n * C;
        const float* xr = xp + n * C;
        const double r = rs[n];
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(dy[c]) * xr[c] * r;
      }
      for (int64_t c = c0; c < c1; ++c) dwp[c] += static_cast<float>(acc[c - c0]);
    }
  }

  // LayerNorm (Ba et al. 2016; llm.c layernorm_forward), biased variance.
  void layernorm_forward(tensor& out, tensor& mean, tensor& rstd, const tensor& x, const tensor& w,
                         const tensor& b, float eps) override {
    const int64_t C = w.numel();
    const int64_t N = C ? x.numel() / C : 0;
    float* o = out.data<float>();
    float* mp = mean.data<float>();
    float* rs = rstd.data<float>();
    const float* xp = x.data<float>();
    const float* __restrict__ wp = w.data<float>();
    const float* __restrict__ bp = b.defined() ? b.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (N * C >= k_par_min)
    for (int64_t n = 0; n < N; ++n) simd::layernorm_row_forward(o + n * C, mp + n, rs + n, xp + n * C, wp, bp, C, eps);
  }

  // llm.c layernorm_backward: norm = (x - mean) rstd, dnorm = w dy,
  // dx += rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)); dw += dy norm; db += dy.
  void layernorm_backward(tensor& dx, tensor& dw, tensor& db, const tensor& dout, const tensor& x,
                          const tensor& w, const tensor& mean, const tensor& rstd) override {
    const int64_t C = w.numel();
    const int64_t N = C ? x.numel() / C : 0;
    float* dxp = dx.data<float>();
    float* dwp = dw.data<float>();
    float* dbp = db.defined() ? db.data<float>() : nullptr;
    const float* dop = dout.data<float>();
    const float* xp = x.data<float>();
    const float* __restrict__ wp = w.data<float>();
    const float* mp = mean.data<float>();
    const float* rs = rstd.data<float>();
    const bool par = N * C >= k_par_min;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t n = 0; n < N; ++n) {
      simd::layernorm_row_backward(dxp + n * C, dop + n * C, xp + n * C, wp, mp[n], rs[n], C);
    }
    const int64_t nblk = (C + k_col_block - 1) / k_col_block;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t c0 = blk * k_col_block, c1 = std::min(C, c0 + k_col_block);
      double aw[k_col_block] = {}, ab[k_col_block] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* dy = dop + n * C;
        const float* xr = xp + n * C;
        const float m = mp[n], r = rs[n];
        for (int64_t c = c0; c < c1; ++c) {
          aw[c - c0] += static_cast<double>(dy[c]) * ((xr[c] - m) * r);
          ab[c - c0] += dy[c];
        }
      }
      for (int64_t c = c0; c < c1; ++c) {
        dwp[c] += static_cast<float>(aw[c - c0]);
        if (dbp) dbp[c] += static_cast<float>(ab[c - c0]);
      }
    }
  }

  // ---------------------------------------------------------------- activations

  void activation_forward(tensor& out, const tensor& x, ops::activation a) override {
    const int64_t n = x.numel();
    float* o = out.data<float>();
    const float* xp = x.data<float>();
    const bool par = n >= k_par_min;
    switch (a) {
      case ops::activation::silu:
        for_chunks(n, par, [&](int64_t i, int64_t len) { simd::silu_forward(o + i, xp + i, len); });
        break;
      case ops::activation::gelu_tanh:
        for_chunks(n, par, [&](int64_t i, int64_t len) { simd::gelu_forward(o + i, xp + i, len); });
        break;
      case ops::activation::relu:
#pragma omp parallel for simd schedule(static) if (par)
        for (int64_t i = 0; i < n; ++i) o[i] = xp[i] > 0.0f ? xp[i] : 0.0f;
        break;
    }
  }

  // dx = dout * act'(x) (overwrite). relu'(0) = 0 (as torch).
  void activation_backward(tensor& dx, const tensor& dout, const tensor& x, ops::activation a) override {
    const int64_t n = x.numel();
    float* d = dx.data<float>();
    const float* dy = dout.data<float>();
    const float* xp = x.data<float>();
    const bool par = n >= k_par_min;
    switch (a) {
      case ops::activation::silu:
        for_chunks(n, par, [&](int64_t i, int64_t len) { simd::silu_backward(d + i, dy + i, xp + i, len); });
        break;
      case ops::activation::gelu_tanh:
        for_chunks(n, par, [&](int64_t i, int64_t len) { simd::gelu_backward(d + i, dy + i, xp + i, len); });
        break;
      case ops::activation::relu:
#pragma omp parallel for simd schedule(static) if (par)
        for (int64_t i = 0; i < n; ++i) d[i] = xp[i] > 0.0f ? dy[i] : 0.0f;
        break;
    }
  }

  // SwiGLU (Shazeer 2020, eq. 6): out = silu(gate) * up.
  void swiglu_forward(tensor& out, const tensor& gate, const tensor& up) override {
    const int64_t n = out.numel();
    float* o = out.data<float>();
    const float* g = gate.data<float>();
    const float* u = up.data<float>();
    for_chunks(n, n >= k_par_min, [&](int64_t i, int64_t len) { simd::swiglu_forward(o + i, g + i, u + i, len); });
  }

  // dgate = dout * up * silu'(gate), dup = dout * silu(gate) (overwrite).
  void swiglu_backward(tensor& dgate, tensor& dup, const tensor& dout, const tensor& gate,
                       const tensor& up) override {
    const int64_t n = dout.numel();
    float* dg = dgate.data<float>();
    float* du = dup.data<float>();
    const float* dy = dout.data<float>();
    const float* g = gate.data<float>();
    const float* u = up.data<float>();
    for_chunks(n, n >= k_par_min, [&](int64_t i, int64_t len) {
      simd::swiglu_backward(dg + i, du + i, dy + i, g + i, u + i, len);
    });
  }

  // ---------------------------------------------------------------- RoPE

  // RoPE (Su et al. 2021, eq. 34). x (B, T, NH, hs) in place, positions (B, T).
  // Angles in f32 exactly as llama2.c's forward():
  //   freq_i = 1.0f / powf(theta, (float)(2i) / (float)hs); val = (float)pos * freq_i;
  //   cos = cosf(val), sin = sinf(val)
  // which is also how Hugging Face builds inv_freq and the angles (float32).
  // inverse = rotation by -angle (the transposed Jacobian).
  void rope(tensor& x, const tensor& positions, float theta, ops::rope_layout layout, bool inverse) override {
    const int64_t B = x.size(0), T = x.size(1), NH = x.size(2), hs = x.size(3);
    const int64_t half = hs / 2;
    const int64_t BT = B * T;
    float* xp = x.data<float>();
    const int32_t* pos = positions.data<int32_t>();
    std::vector<float> freq(half);
    for (int64_t i = 0; i < half; ++i)
      freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(hs));
    const bool adjacent = layout == ops::rope_layout::adjacent;
#pragma omp parallel if (BT * NH * hs >= k_par_min)
    {
      std::vector<float> cs(half), sn(half);
#pragma omp for schedule(static)
      for (int64_t bt = 0; bt < BT; ++bt) {
        const float p = static_cast<float>(pos[bt]);
        for (int64_t i = 0; i < half; ++i) {
          const float val = p * freq[i];
          cs[i] = std::cos(val);
          sn[i] = inverse ? -std::sin(val) : std::sin(val);
        }
        for (int64_t h = 0; h < NH; ++h) {
          float* __restrict__ row = xp + (bt * NH + h) * hs;
          if (adjacent) {
            for (int64_t i = 0; i < half; ++i) {
              const float v0 = row[2 * i], v1 = row[2 * i + 1];
              row[2 * i] = v0 * cs[i] - v1 * sn[i];
              row[2 * i + 1] = v0 * sn[i] + v1 * cs[i];
            }
          } else {
            for (int64_t i = 0; i < half; ++i) {
              const float v0 = row[i], v1 = row[i + half];
              row[i] = v0 * cs[i] - v1 * sn[i];
              row[i + half] = v0 * sn[i] + v1 * cs[i];
            }
          }
        }
      }
    }
  }

  // ---------------------------------------------------------------- attention

  // Training and prefill sizes run attention on GEMMs per (batch, head), on the
  // packed kernel (simd::gemm_packed) in causal row blocks of k_att_rows queries:
  // block [i0, i1) sees keys [0, kend), kend = q0 + i1, so
  //   S[i0:i1, :kend] = scale Q[i0:i1] K[:kend]ᵀ;  row softmax with the causal and
  //   padding masks;  out[i0:i1] = P[i0:i1, :kend] V[:kend]
  // and the keys no query of the block can see are never multiplied (about half
  // of each product at T >> k_att_rows). Each output is the packed kernel's one
  // FMA chain, which ends at kend instead of n_keys: for finite inputs the dropped
  // terms are exact zeros (P = 0 there), so the bits are those of the whole
  // product on the packed kernel (tests/test_ops.cpp checks it against
  // ops::matmul; shapes whose op(B) is over cpu_gemm::k_packed_max went to the
  // GEMM library before, whose bits differ). Kᵀ and V are packed once per head
  // into per-thread buffers of n_keys x hs floats (padded to whole panels, 64-byte aligned).
  // Decoding (Tq < 32) goes to simd::attend_decode instead (attention_forward).
  static bool gemm_attention(int64_t Tq, int64_t /*hs*/) { return Tq >= 32; }
  /// Query rows per causal block: a multiple of the packed kernel's tile rows (6 and 12).
  static constexpr int64_t k_att_rows = 12;

  /// C (M, N) = alpha op(A) (M, K) · rows [k0, k0 + K) of op(B), where `packed` holds op(B)
  /// (Ktot, N) packed by simd::gemm_pack_b (panel p at p W Ktot): one gemm_packed call per
  /// panel, each reading its panel from row k0. beta as gemm_packed (0 ignores C).
  static void packed_rows(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                          const float* packed, int64_t Ktot, int64_t k0, float beta, float* C, int64_t ldc) {
    const int64_t W = simd::gemm_panel_width();
    for (int64_t j0 = 0; j0 < N; j0 += W) {
      const int64_t nj = std::min(W, N - j0);
      simd::gemm_packed(ta, M, nj, K, alpha, A, lda, packed + j0 * Ktot + k0 * W, beta, C + j0, ldc, 0,
                        simd::gemm_packed_tiles(ta, M, nj, K));
    }
  }

  /// The padding positions (mask 0) among keys [0, n_keys) of each batch row, ascending; empty
  /// lists without a mask. attn_mask (B, mstride) i32 or null.
  static std::vector<std::vector<int32_t>> padded_keys(const int32_t* mp, int64_t mstride, int64_t B,
                                                        int64_t n_keys) {
    std::vector<std::vector<int32_t>> pads(static_cast<size_t>(B));
    if (mp)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < n_keys; ++j)
          if (mp[b * mstride + j] == 0) pads[b].push_back(static_cast<int32_t>(j));
    return pads;
  }

  static size_t packed_size(int64_t N, int64_t K) { return static_cast<size_t>(cpu_gemm::packed_floats(N, K)); }

  void attention_forward_gemm(float* op, float* ap, const float* qp, const float* kp, const float* vp,
                              const int32_t* mp, int64_t mstride, int64_t B, int64_t Tq, int64_t H, int64_t hs,
                              int64_t S, int64_t KV, int64_t n_keys) {
    const int64_t group = H / KV;
    const int64_t q0 = n_keys - Tq;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const auto pads = padded_keys(mp, mstride, B, n_keys);
#pragma omp parallel if (B * H * Tq * n_keys * hs >= cpu_gemm::k_par_macs)
    {
      std::vector<float> scratch(ap ? 0 : static_cast<size_t>(Tq * n_keys));
      cpu_gemm::aligned_floats kt(packed_size(n_keys, hs)), vpk(packed_size(hs, n_keys));
#pragma omp for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H, kvh = h / group;
        float* P = ap ? ap + bh * Tq * n_keys : scratch.data();
        const float* Q = qp + (b * Tq * H + h) * hs;
        const float* K = kp + (b * S * KV + kvh) * hs;
        const float* Vv = vp + (b * S * KV + kvh) * hs;
        float* O = op + (b * Tq * H + h) * hs;
        const int64_t W = simd::gemm_panel_width();
        simd::gemm_pack_b(true, n_keys, hs, K, KV * hs, kt.data(), 0, (n_keys + W - 1) / W);  // Kᵀ (hs, n_keys)
        simd::gemm_pack_b(false, hs, n_keys, Vv, KV * hs, vpk.data(), 0, (hs + W - 1) / W);   // V (n_keys, hs)
        for (int64_t i0 = 0; i0 < Tq; i0 += k_att_rows) {
          const int64_t i1 = std::min(Tq, i0 + k_att_rows), rows = i1 - i0, kend = q0 + i1;
          float* Pb = P + i0 * n_keys;
          simd::gemm_packed(false, rows, kend, hs, scale, Q + i0 * H * hs, H * hs, kt.data(), 0.0f, Pb, n_keys, 0,
                            simd::gemm_packed_tiles(false, rows, kend, hs));
          for (int64_t i = i0; i < i1; ++i) {
            float* a = P + i * n_keys;
            const int64_t nvis = q0 + i + 1;
            // zeros past the visible keys: to kend for the product, to n_keys when att is kept
            simd::softmax_row(a, nvis, pads[b].data(), static_cast<int64_t>(pads[b].size()));
            std::fill(a + nvis, a + (ap ? n_keys : kend), 0.0f);
          }
          packed_rows(false, rows, hs, kend, 1.0f, Pb, n_keys, vpk.data(), n_keys, 0, 0.0f, O + i0 * H * hs, H * hs);
        }
      }
    }
  }

  // Backward on the packed kernel in the forward's causal blocks, one task per
  // (batch, kv head) so dk/dv of a kv head are summed over its query heads in a
  // fixed order (no atomics):
  //   dP = dO Vᵀ;  dS = P ∘ (dP - rowsum(P ∘ dP)) scale;  dQ = dS K   (query blocks, keys < kend)
  //   dV += Pᵀ dO;  dK += dSᵀ Q                                      (key blocks, queries >= j0)
  // P is re-read from att's causal part only (copied with zeros above the
  // diagonal, to the block's kend), as the row loops do. As in the forward, the
  // products skip only exact zeros: the bits are those of the whole products.
  void attention_backward_gemm(float* dqp, float* dkp, float* dvp, const float* dop, const float* qp,
                               const float* kp, const float* vp, const float* ap, int64_t B, int64_t T, int64_t H,
                               int64_t KV, int64_t hs) {
    const int64_t group = H / KV;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel if (B * H * T * T * hs >= cpu_gemm::k_par_macs)
    {
      std::vector<float> pm(static_cast<size_t>(T * T)), ds(static_cast<size_t>(T * T));
      cpu_gemm::aligned_floats vt(packed_size(T, hs)), kpk(packed_size(hs, T)), qpk(packed_size(hs, T)),
          dopk(packed_size(hs, T));
      const int64_t W = simd::gemm_panel_width(), np_t = (T + W - 1) / W, np_hs = (hs + W - 1) / W;
#pragma omp for schedule(dynamic, 1)
      for (int64_t bk = 0; bk < B * KV; ++bk) {
        const int64_t b = bk / KV, kvh = bk % KV;
        const float* K = kp + (b * T * KV + kvh) * hs;
        const float* Vv = vp + (b * T * KV + kvh) * hs;
        float* dK = dkp + (b * T * KV + kvh) * hs;
        float* dV = dvp + (b * T * KV + kvh) * hs;
        simd::gemm_pack_b(true, T, hs, Vv, KV * hs, vt.data(), 0, np_t);   // Vᵀ (hs, T)
        simd::gemm_pack_b(false, hs, T, K, KV * hs, kpk.data(), 0, np_hs);  // K (T, hs)
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          const float beta = h == kvh * group ? 0.0f : 1.0f;
          const float* A = ap + (b * H + h) * T * T;
          const float* Q = qp + (b * T * H + h) * hs;
          const float* dO = dop + (b * T * H + h) * hs;
          float* dQ = dqp + (b * T * H + h) * hs;
          simd::gemm_pack_b(false, hs, T, Q, H * hs, qpk.data(), 0, np_hs);    // Q (T, hs)
          simd::gemm_pack_b(false, hs, T, dO, H * hs, dopk.data(), 0, np_hs);  // dO (T, hs)
          for (int64_t i0 = 0; i0 < T; i0 += k_att_rows) {
            const int64_t i1 = std::min(T, i0 + k_att_rows), rows = i1 - i0, kend = i1;
            for (int64_t i = i0; i < i1; ++i) {
              std::copy(A + i * T, A + i * T + i + 1, pm.data() + i * T);
              std::fill(pm.data() + i * T + i + 1, pm.data() + i * T + kend, 0.0f);
            }
            simd::gemm_packed(false, rows, kend, hs, 1.0f, dO + i0 * H * hs, H * hs, vt.data(), 0.0f,
                              ds.data() + i0 * T, T, 0, simd::gemm_packed_tiles(false, rows, kend, hs));
            for (int64_t i = i0; i < i1; ++i) {
              const float* p = pm.data() + i * T;
              float* d = ds.data() + i * T;
              double D = 0.0;
#pragma omp simd reduction(+ : D)
              for (int64_t j = 0; j <= i; ++j) D += static_cast<double>(p[j]) * d[j];
              const float Df = static_cast<float>(D);
#pragma omp simd
              for (int64_t j = 0; j <= i; ++j) d[j] = p[j] * (d[j] - Df) * scale;
              std::fill(d + i + 1, d + kend, 0.0f);
            }
            packed_rows(false, rows, hs, kend, 1.0f, ds.data() + i0 * T, T, kpk.data(), T, 0, 0.0f, dQ + i0 * H * hs,
                        H * hs);
          }
          // key block [j0, j1): the queries i >= j0 see it
          for (int64_t j0 = 0; j0 < T; j0 += k_att_rows) {
            const int64_t cols = std::min(T, j0 + k_att_rows) - j0;
            packed_rows(true, cols, hs, T - j0, 1.0f, pm.data() + j0 * T + j0, T, dopk.data(), T, j0, beta,
                        dV + j0 * KV * hs, KV * hs);
            packed_rows(true, cols, hs, T - j0, 1.0f, ds.data() + j0 * T + j0, T, qpk.data(), T, j0, beta,
                        dK + j0 * KV * hs, KV * hs);
          }
        }
      }
    }
  }


  // Causal GQA attention, one (b, h, query) row per iteration (llm.c
  // attention_forward, generalised to GQA, a key offset and a padding mask).
  void attention_forward(tensor& out, tensor& att, const tensor& q, const tensor& k, const tensor& v,
                         const tensor& attn_mask, int64_t n_keys) override {
    const int64_t B = q.size(0), Tq = q.size(1), H = q.size(2), hs = q.size(3);
    const int64_t S = k.size(1), KV = k.size(2);
    const int64_t group = H / KV;
    const int64_t q0 = n_keys - Tq;  // absolute position of query 0
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const float* qp = q.data<float>();
    const float* kp = k.data<float>();
    const float* vp = v.data<float>();
    float* op = out.data<float>();
    float* ap = att.defined() ? att.data<float>() : nullptr;
    const int32_t* mp = attn_mask.defined() ? attn_mask.data<int32_t>() : nullptr;
    const int64_t mstride = attn_mask.defined() ? attn_mask.size(1) : 0;
    const int64_t rows = B * H * Tq;
    if (gemm_attention(Tq, hs)) {
      attention_forward_gemm(op, ap, qp, kp, vp, mp, mstride, B, Tq, H, hs, S, KV, n_keys);
      return;
    }
    // Decoding and short queries: one task per (batch, kv head, query) does the `group` query
    // heads that share a kv head together, so each key and value row is read once per group:
    // simd::attend_decode (scores, masked softmax, P V in one call).
    const int64_t tasks = B * KV * Tq;
    const auto pads = padded_keys(mp, mstride, B, n_keys);
#pragma omp parallel if (rows * n_keys * hs >= k_par_min)
    {
      std::vector<float> scratch(ap ? 0 : static_cast<size_t>(group * n_keys));
#pragma omp for schedule(dynamic, 2)
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t i = t % Tq;
        const int64_t kvh = (t / Tq) % KV;
        const int64_t b = t / (Tq * KV);
        const int64_t h0 = kvh * group;
        const float* Q = qp + ((b * Tq + i) * H + h0) * hs;  // group rows, stride hs
        float* O = op + ((b * Tq + i) * H + h0) * hs;
        // probability rows of the group: att (B, H, Tq, n_keys) or the scratch
        float* A = ap ? ap + ((b * H + h0) * Tq + i) * n_keys : scratch.data();
        const int64_t lda = ap ? Tq * n_keys : n_keys;
        const int64_t nvis = q0 + i + 1;  // keys [0, nvis) are causally visible
        if (ap)
          for (int64_t g = 0; g < group; ++g) std::fill(A + g * lda + nvis, A + g * lda + n_keys, 0.0f);
        simd::attend_decode(group, hs, nvis, scale, Q, hs, kp + (b * S * KV + kvh) * hs, vp + (b * S * KV + kvh) * hs,
                            KV * hs, pads[b].data(), static_cast<int64_t>(pads[b].size()), A, lda, O, hs);
      }
    }
  }

  // Backward through softmax(q k^T * scale) v given the saved probabilities P:
  //   dP_ij = dout_i . v_j;  D_i = sum_j P_ij dP_ij;  dS_ij = P_ij (dP_ij - D_i)
  //   dq_i = scale sum_j dS_ij k_j;  dk_j = scale sum_i dS_ij q_i;  dv_j = sum_i P_ij dout_i
  // Pass 1 (parallel over query rows): D and dq. Pass 2 (parallel over key rows
  // and kv heads): dk, dv summed over the query heads of the group, dP recomputed.
  // Each output element is written by one iteration: deterministic, no atomics.
  void attention_backward(tensor& dq, tensor& dk, tensor& dv, const tensor& dout, const tensor& q,
                          const tensor& k, const tensor& v, const tensor& att) override {
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), hs = q.size(3);
    const int64_t KV = k.size(2);
    const int64_t group = H / KV;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    const float* qp = q.data<float>();
    const float* kp = k.data<float>();
    const float* vp = v.data<float>();
    const float* dop = dout.data<float>();
    const float* ap = att.data<float>();
    float* dqp = dq.data<float>();
    float* dkp = dk.data<float>();
    float* dvp = dv.data<float>();
    if (gemm_attention(T, hs)) {
      attention_backward_gemm(dqp, dkp, dvp, dop, qp, kp, vp, ap, B, T, H, KV, hs);
      return;
    }
    std::vector<double> Dbuf(static_cast<size_t>(B * H * T));
    const bool par = B * H * T * T * hs >= k_par_min;

    // pass 1: rows r = (b, h, i)
#pragma omp parallel if (par)
    {
      std::vector<float> dp(static_cast<size_t>(T));
      std::vector<double> acc(static_cast<size_t>(hs));
#pragma omp for schedule(dynamic, 4)
      for (int64_t r = 0; r < B * H * T; ++r) {
        const int64_t i = r % T;
        const int64_t h = (r / T) % H;
        const int64_t b = r / (T * H);
        const int64_t kvh = h / group;
        const float* a = ap + r * T;
        const float* doi = dop + ((b * T + i) * H + h) * hs;
        double D = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          if (a[j] == 0.0f) {
            dp[j] = 0.0f;
            continue;
          }
          dp[j] = dot_f(doi, vp + ((b * T + j) * KV + kvh) * hs, hs);
          D += static_cast<double>(a[j]) * dp[j];
        }
        Dbuf[r] = D;
        std::fill(acc.begin(), acc.end(), 0.0);
        double* __restrict__ ac = acc.data();
        for (int64_t j = 0; j <= i; ++j) {
          if (a[j] == 0.0f) continue;
          const double ds = a[j] * (dp[j] - D);
          const float* __restrict__ kj = kp + ((b * T + j) * KV + kvh) * hs;
          for (int64_t c = 0; c < hs; ++c) ac[c] += ds * kj[c];
        }
        float* __restrict__ dqi = dqp + ((b * T + i) * H + h) * hs;
        for (int64_t c = 0; c < hs; ++c) dqi[c] = static_cast<float>(ac[c] * scale);
      }
    }

    // pass 2: rows (b, j, kvh), the same order as dk / dv in memory
#pragma omp parallel if (par)
    {
      std::vector<double> ak(static_cast<size_t>(hs)), av(static_cast<size_t>(hs));
#pragma omp for schedule(dynamic, 4)
      for (int64_t r = 0; r < B * T * KV; ++r) {
        const int64_t kvh = r % KV;
        const int64_t j = (r / KV) % T;
        const int64_t b = r / (KV * T);
        const float* vj = vp + r * hs;
        std::fill(ak.begin(), ak.end(), 0.0);
        std::fill(av.begin(), av.end(), 0.0);
        double* __restrict__ akp = ak.data();
        double* __restrict__ avp = av.data();
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int64_t i = j; i < T; ++i) {
            const int64_t row = (b * H + h) * T + i;
            const float p = ap[row * T + j];
            if (p == 0.0f) continue;
            const float* __restrict__ doi = dop + ((b * T + i) * H + h) * hs;
            const float* __restrict__ qi = qp + ((b * T + i) * H + h) * hs;
            const double ds = p * (static_cast<double>(dot_f(doi, vj, hs)) - Dbuf[row]) * scale;
            for (int64_t c = 0; c < hs; ++c) {
              akp[c] += ds * qi[c];
              avp[c] += static_cast<double>(p) * doi[c];
            }
          }
        }
        float* __restrict__ dkj = dkp + r * hs;
        float* __restrict__ dvj = dvp + r * hs;
        for (int64_t c = 0; c < hs; ++c) {
          dkj[c] = static_cast<float>(akp[c]);
          dvj[c] = static_cast<float>(avp[c]);
        }
      }
    }
  }

  // ---------------------------------------------------------------- softmax, losses

  // Row-wise (log-)softmax over the last dim, max-subtracted, sums in double.
  void softmax_forward(tensor& out, const tensor& x, bool log) override {
    const int64_t V = x.size(-1);
    const int64_t N = V ? x.numel() / V : 0;
    float* o = out.data<float>();
    const float* xp = x.data<float>();
#pragma omp parallel for schedule(static) if (N * V >= k_par_min)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = xp + n * V;
      float* orow = o + n * V;
      const float maxv = simd::max_f(xr, V);
      if (log) {
        const double lse = maxv + std::log(simd::exp_sum(xr, maxv, V, nullptr));
        for (int64_t i = 0; i < V; ++i) orow[i] = static_cast<float>(xr[i] - lse);
      } else {
        const double sum = simd::exp_sum(xr, maxv, V, orow);  // reads xr[i] before writing orow[i]
        simd::scale_f(orow, static_cast<float>(1.0 / sum), V);
      }
    }
  }

  // softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy).
  void softmax_backward(tensor& dx, const tensor& dout, const tensor& out, bool log) override {
    const int64_t V = out.size(-1);
    const int64_t N = V ? out.numel() / V : 0;
    float* d = dx.data<float>();
    const float* dyp = dout.data<float>();
    const float* yp = out.data<float>();
#pragma omp parallel for schedule(static) if (N * V >= k_par_min)
    for (int64_t n = 0; n < N; ++n) {
      const float* dy = dyp + n * V;
      const float* y = yp + n * V;
      float* dxr = d + n * V;
      double s = 0.0;
      if (log) {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < V; ++i) s += dy[i];
        const float sf = static_cast<float>(s);
        simd::log_softmax_backward_row(dxr, dy, y, sf, V);
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < V; ++i) s += static_cast<double>(dy[i]) * y[i];
        const float sf = static_cast<float>(s);
        for (int64_t i = 0; i < V; ++i) dxr[i] = y[i] * (dy[i] - sf);
      }
    }
  }

  // losses[n] = logsumexp(logits[n]) - logits[n, t] (max-subtracted, sum in double).
  double cross_entropy_forward(tensor& losses, const tensor& logits, const tensor& targets, int64_t* n_valid,
                               int32_t ignore_index) override {
    const int64_t V = logits.size(-1);
    const int64_t N = targets.numel();
    const int32_t* tg = targets.data<int32_t>();
    const float* lp = logits.data<float>();
    float* lo = losses.data<float>();
    double total = 0.0;
    int64_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : total, count) if (N * V >= k_par_min)
    for (int64_t n = 0; n < N; ++n) {
      if (tg[n] == ignore_index) {
        lo[n] = 0.0f;
        continue;
      }
      const float* x = lp + n * V;
      const float maxv = simd::max_f(x, V);
      const double loss = maxv + std::log(simd::exp_sum(x, maxv, V, nullptr)) - x[tg[n]];
      lo[n] = static_cast<float>(loss);
      total += loss;
      count += 1;
    }
    if (n_valid) *n_valid = count;
    return count ? total / static_cast<double>(count) : 0.0;
  }

  // dlogits = (softmax(logits) - onehot(t)) * dloss; ignored rows 0. May run in
  // place (dlogits == logits): each element is read before it is written.
  void cross_entropy_backward(tensor& dlogits, const tensor& logits, const tensor& targets, float dloss,
                              int32_t ignore_index) override {
    const int64_t V = logits.size(-1);
    const int64_t N = targets.numel();
    const int32_t* tg = targets.data<int32_t>();
    const float* lp = logits.data<float>();
    float* dl = dlogits.data<float>();
#pragma omp parallel for schedule(static) if (N * V >= k_par_min)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = lp + n * V;
      float* d = dl + n * V;
      if (tg[n] == ignore_index) {
        std::fill(d, d + V, 0.0f);
        continue;
      }
      const float maxv = simd::max_f(x, V);
      const double sum = simd::exp_sum(x, maxv, V, d);  // x[i] is read before d[i] is written
      simd::scale_f(d, static_cast<float>(dloss / sum), V);
      d[tg[n]] -= dloss;
    }
  }

  // ---------------------------------------------------------------- optimizer

  // torch.optim.AdamW (decoupled weight decay, bias-corrected moments).
  // Element math in f32, vectorised: the step is memory-bound (p, g, m, v read,
  // p, m, v written: 28 bytes per parameter), and f32 keeps each result within
  // a few ulp of the float64 formula (tests/test_ops.cpp checks 1e-6 relative).
  // The bias corrections are computed once in double.
  void adamw_step(tensor& param, const tensor& grad, tensor& m, tensor& v, int64_t t,
                  const ops::adamw_config& cfg) override {
    const int64_t n = param.numel();
    float* __restrict__ p = param.data<float>();
    const float* __restrict__ g = grad.data<float>();
    float* __restrict__ mp = m.data<float>();
    float* __restrict__ vp = v.data<float>();
    const float b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, lr = cfg.lr;
    const auto [omb1, omb2, inv_bc1, inv_sqrt_bc2, lr_wd] = ops::adamw_coeffs::of(cfg, t);
    const simd::adamw_scalars sc{b1, b2, omb1, omb2, inv_bc1, inv_sqrt_bc2, eps, lr, lr_wd};
    for_chunks(n, n >= k_par_min, [&](int64_t i, int64_t len) { simd::adamw(p + i, g + i, mp + i, vp + i, len, sc); });
  }

  // Fixed-size chunks summed in order: the result does not depend on the thread count.
  double sum_squares(const tensor& x) override {
    const int64_t n = x.numel();
    const float* p = x.data<float>();
    constexpr int64_t chunk = 1 << 16;
    const int64_t nchunks = (n + chunk - 1) / chunk;
    std::vector<double> part(static_cast<size_t>(nchunks));
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t i0 = c * chunk, i1 = std::min(n, i0 + chunk);
      double s = 0.0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = i0; i < i1; ++i) s += static_cast<double>(p[i]) * p[i];
      part[c] = s;
    }
    double s = 0.0;
    for (double v : part) s += v;
    return s;
  }
};

}  // namespace

namespace detail {
/// The process-wide CPU backend (ops.cpp's cpu_backend() returns it).
backend& cpu_backend_instance() {
  static cpu_backend_impl instance;
  return instance;
}
}  // namespace detail

}  // namespace flowrun

#include <omp.h>

#include <atomic>
#include <thread>

#include "runtime/kernels/compute_scope.h"

namespace flowrun::ops {

namespace {
std::atomic<int> g_busy_callers{0};  // threads inside a compute_scope
thread_local int t_budget = 0;       // the thread's own team size while share_cores has set another (0: none)
thread_local int t_team = 0;         // the team size share_cores set last (0: none since the budget was set)
thread_local int t_scopes = 0;       // compute_scope nesting depth of this thread
}  // namespace

void set_thread_budget(int n) {
  t_team = 0;
  omp_set_num_threads(n < 1 ? 1 : n);
}

compute_scope::compute_scope() {
  if (t_scopes++ == 0) g_busy_callers.fetch_add(1, std::memory_order_relaxed);
}

compute_scope::~compute_scope() {
  if (--t_scopes > 0) return;
  g_busy_callers.fetch_sub(1, std::memory_order_relaxed);
  if (t_team > 0) {  // back to the thread's own budget
    omp_set_num_threads(t_budget);
    t_team = 0;
  }
}

int busy_compute_threads() { return g_busy_callers.load(std::memory_order_relaxed); }

void share_cores() {
  if (t_scopes == 0 || omp_in_parallel()) return;
  if (t_team == 0) t_budget = omp_get_max_threads();  // the budget (set_thread_budget or OpenMP's default)
  const int hw = hardware_threads(), busy = std::max(1, g_busy_callers.load(std::memory_order_relaxed));
  const int want = std::min(t_budget, std::max(1, hw / busy));
  if (want != (t_team == 0 ? t_budget : t_team)) {
    omp_set_num_threads(want);
    t_team = want;
  }
}

std::string cpu_gemm_library() {
  const int64_t mib = cpu_gemm::k_packed_max * static_cast<int64_t>(sizeof(float)) >> 20;
  return cpu_gemm::library_name() + "; op(B) <= " + std::to_string(mib) + " MiB on flowrun's packed kernel";
}

bool cpu_bf16_matmul() { return cpu_gemm::bf16_native(); }

int hardware_threads() {
  // read once: glibc's hardware_concurrency() opens and parses /sys/devices/system/cpu/online on
  // every call, and share_cores asks at every op (4% of the generator's time in a PPO graph)
  static const int n = [] {
    const unsigned c = std::thread::hardware_concurrency();
    return c == 0 ? 1 : static_cast<int>(c);
  }();
  return n;
}

}  // namespace flowrun::ops
