// The CPU backend: OpenBLAS for GEMM, plain C++ loops (llm.c style) for the
// rest, parallelised over rows with OpenMP.
//
// Every function receives tensors already validated by ops.cpp (shapes, dtypes,
// devices), so nothing here re-checks shapes; the only throws are the data
// dependent ones (out-of-range token ids / targets), done serially before any
// parallel region (an exception must not leave an OpenMP region).
//
// Numerics: reductions that feed a statistic (norm means/variances, softmax
// and logsumexp sums, sum of squares, the column sums of weight gradients,
// attention backward accumulators) are accumulated in double, so f32 results
// agree with a float64 reference to ~1e-6 relative. Column reductions over rows
// (dw, dbias) are done per column block in a fixed order: results do not depend
// on the number of threads.
//
// Aliasing: elementwise ops (add, axpy, activations, swiglu, softmax, the
// cross-entropy gradient) read each element before writing it, so they may be
// called in place (out == input). GEMM outputs must not alias their inputs.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernels/backend.h"

namespace flowrun {
namespace {

// Below this many elements of work an op runs on one thread (a parallel
// region costs a few microseconds).
constexpr int64_t k_par_min = 1 << 15;
// Column block of the deterministic column reductions (dw, dbias).
constexpr int64_t k_col_block = 32;

inline int blas_int(int64_t v, const char* what) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw std::invalid_argument(std::string("gemm: ") + what + " = " + std::to_string(v) +
                                " does not fit OpenBLAS's 32-bit int");
  return static_cast<int>(v);
}

/// Dot product of two f32 vectors, accumulated in f32 (vectorised).
inline float dot_f(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// GELU, tanh approximation (Hendrycks & Gimpel 2016, sec. 2; llm.c gelu_forward).
constexpr float k_gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)

class cpu_backend_impl final : public backend {
 public:
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
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                blas_int(M, "M"), blas_int(N, "N"), blas_int(K, "K"), alpha, A,
                blas_int(std::max<int64_t>(lda, 1), "lda"), B, blas_int(std::max<int64_t>(ldb, 1), "ldb"), beta,
                C, blas_int(std::max<int64_t>(ldc, 1), "ldc"));
  }

  void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                    float* C, int64_t ldc, int64_t stride_c, int64_t batch) override {
    // Small matrices (attention heads): one single-threaded sgemm per OpenMP
    // thread (OpenBLAS's OpenMP build runs single-threaded inside a parallel
    // region). Large ones: let OpenBLAS thread each GEMM.
    const bool small = M * N * K < (1 << 18);
    if (small && batch > 1) {
      // Validate the int ranges before entering the parallel region.
      (void)blas_int(M, "M");
      (void)blas_int(N, "N");
      (void)blas_int(K, "K");
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < batch; ++i)
        gemm(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
             C + i * stride_c, ldc);
    } else {
      for (int64_t i = 0; i < batch; ++i)
        gemm(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
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
    const int64_t N = ids.numel(), V = wte.size(0), C = wte.size(1);
    const int32_t* id = ids.data<int32_t>();
    for (int64_t n = 0; n < N; ++n)
      if (id[n] < 0 || id[n] >= V)
        throw std::out_of_range("embedding_forward: token id " + std::to_string(id[n]) + " at position " +
                                std::to_string(n) + " is outside [0, " + std::to_string(V) + ")");
    float* o = out.data<float>();
    const float* w = wte.data<float>();
#pragma omp parallel for schedule(static) if (N * C >= k_par_min)
    for (int64_t n = 0; n < N; ++n) std::memcpy(o + n * C, w + static_cast<int64_t>(id[n]) * C, C * sizeof(float));
  }

  // dwte[ids[n]] += dout[n]; ids < 0 skipped. Parallel over column blocks so
  // repeated ids never race and the summation order is fixed.
  void embedding_backward(tensor& dwte, const tensor& dout, const tensor& ids) override {
    const int64_t N = ids.numel(), V = dwte.size(0), C = dwte.size(1);
    const int32_t* id = ids.data<int32_t>();
    for (int64_t n = 0; n < N; ++n)
      if (id[n] >= V)
        throw std::out_of_range("embedding_backward: token id " + std::to_string(id[n]) + " at position " +
                                std::to_string(n) + " is outside [0, " + std::to_string(V) + ")");
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
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = xp + n * C;
      float* orow = o + n * C;
      double ss = 0.0;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
      const float rf = static_cast<float>(r);
      for (int64_t c = 0; c < C; ++c) orow[c] = xr[c] * rf * wp[c];
      rs[n] = rf;
    }
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
      const float* __restrict__ dy = dop + n * C;
      const float* __restrict__ xr = xp + n * C;
      float* __restrict__ dxr = dxp + n * C;
      const double r = rs[n];
      double dot = 0.0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dy[c]) * wp[c] * xr[c];
      const float a = static_cast<float>(r);
      const float b = static_cast<float>(r * r * r * dot / static_cast<double>(C));
      for (int64_t c = 0; c < C; ++c) dxr[c] += a * wp[c] * dy[c] - b * xr[c];
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
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = xp + n * C;
      float* orow = o + n * C;
      double s = 0.0;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += xr[c];
      const double m = s / static_cast<double>(C);
      double v = 0.0;
#pragma omp simd reduction(+ : v)
      for (int64_t c = 0; c < C; ++c) {
        const double d = xr[c] - m;
        v += d * d;
      }
      const double r = 1.0 / std::sqrt(v / static_cast<double>(C) + eps);
      const float mf = static_cast<float>(m), rf = static_cast<float>(r);
      if (bp)
        for (int64_t c = 0; c < C; ++c) orow[c] = (xr[c] - mf) * rf * wp[c] + bp[c];
      else
        for (int64_t c = 0; c < C; ++c) orow[c] = (xr[c] - mf) * rf * wp[c];
      mp[n] = mf;
      rs[n] = rf;
    }
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
      const float* __restrict__ dy = dop + n * C;
      const float* __restrict__ xr = xp + n * C;
      float* __restrict__ dxr = dxp + n * C;
      const float m = mp[n], r = rs[n];
      double s1 = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t c = 0; c < C; ++c) {
        const double dn = static_cast<double>(wp[c]) * dy[c];
        s1 += dn;
        s2 += dn * ((xr[c] - m) * r);
      }
      const float mean_dn = static_cast<float>(s1 / static_cast<double>(C));
      const float mean_dnn = static_cast<float>(s2 / static_cast<double>(C));
      for (int64_t c = 0; c < C; ++c) {
        const float norm = (xr[c] - m) * r;
        dxr[c] += r * (wp[c] * dy[c] - mean_dn - norm * mean_dnn);
      }
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
    switch (a) {
      case ops::activation::silu:
#pragma omp parallel for schedule(static) if (n >= k_par_min)
        for (int64_t i = 0; i < n; ++i) o[i] = xp[i] * sigmoidf(xp[i]);
        break;
      case ops::activation::gelu_tanh:
#pragma omp parallel for schedule(static) if (n >= k_par_min)
        for (int64_t i = 0; i < n; ++i) {  // 0.5 v (1 + tanh(u)) == v sigmoid(2u)
          const float v = xp[i];
          const float u = k_gelu_scale * (v + 0.044715f * v * v * v);
          o[i] = v / (1.0f + std::exp(-2.0f * u));
        }
        break;
      case ops::activation::relu:
#pragma omp parallel for simd schedule(static) if (n >= k_par_min)
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
    switch (a) {
      case ops::activation::silu:
#pragma omp parallel for schedule(static) if (n >= k_par_min)
        for (int64_t i = 0; i < n; ++i) {
          const float v = xp[i], s = sigmoidf(v);
          d[i] = dy[i] * s * (1.0f + v * (1.0f - s));
        }
        break;
      case ops::activation::gelu_tanh:
#pragma omp parallel for schedule(static) if (n >= k_par_min)
        for (int64_t i = 0; i < n; ++i) {
          // llm.c gelu_backward with s = sigmoid(2u): 0.5 (1 + tanh u) = s, 0.5 sech^2 u = 2 s (1 - s)
          const float v = xp[i];
          const float u = k_gelu_scale * (v + 0.044715f * v * v * v);
          const float s = 1.0f / (1.0f + std::exp(-2.0f * u));
          const float g = s + v * 2.0f * s * (1.0f - s) * k_gelu_scale * (1.0f + 3.0f * 0.044715f * v * v);
          d[i] = g * dy[i];
        }
        break;
      case ops::activation::relu:
#pragma omp parallel for simd schedule(static) if (n >= k_par_min)
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
#pragma omp parallel for schedule(static) if (n >= k_par_min)
    for (int64_t i = 0; i < n; ++i) o[i] = g[i] * sigmoidf(g[i]) * u[i];
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
#pragma omp parallel for schedule(static) if (n >= k_par_min)
    for (int64_t i = 0; i < n; ++i) {
      const float gv = g[i], uv = u[i], d = dy[i];
      const float s = sigmoidf(gv);
      dg[i] = d * uv * s * (1.0f + gv * (1.0f - s));
      du[i] = d * gv * s;
    }
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
    const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp parallel if (rows * n_keys * hs >= k_par_min)
    {
      std::vector<float> scratch(ap ? 0 : static_cast<size_t>(n_keys));
#pragma omp for schedule(dynamic, 4)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r % Tq;
        const int64_t h = (r / Tq) % H;
        const int64_t b = r / (Tq * H);
        const int64_t kvh = h / group;
        const float* qi = qp + ((b * Tq + i) * H + h) * hs;
        float* __restrict__ oi = op + ((b * Tq + i) * H + h) * hs;
        float* __restrict__ a = ap ? ap + r * n_keys : scratch.data();
        const int32_t* m = mp ? mp + b * mstride : nullptr;
        const int64_t nvis = q0 + i + 1;  // keys [0, nvis) are causally visible
        float maxv = neg_inf;
        for (int64_t j = 0; j < nvis; ++j) {
          if (m && m[j] == 0) {
            a[j] = neg_inf;
            continue;
          }
          const float s = dot_f(qi, kp + ((b * S + j) * KV + kvh) * hs, hs) * scale;
          a[j] = s;
          maxv = std::max(maxv, s);
        }
        for (int64_t c = 0; c < hs; ++c) oi[c] = 0.0f;
        if (maxv == neg_inf) {  // no visible key: zero output and probabilities
          for (int64_t j = 0; j < n_keys; ++j) a[j] = 0.0f;
          continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < nvis; ++j) {
          const float e = a[j] == neg_inf ? 0.0f : std::exp(a[j] - maxv);
          a[j] = e;
          sum += e;
        }
        const double inv = 1.0 / sum;
        for (int64_t j = 0; j < nvis; ++j) a[j] = static_cast<float>(a[j] * inv);
        for (int64_t j = nvis; j < n_keys; ++j) a[j] = 0.0f;
        for (int64_t j = 0; j < nvis; ++j) {
          const float p = a[j];
          if (p == 0.0f) continue;
          const float* __restrict__ vj = vp + ((b * S + j) * KV + kvh) * hs;
          for (int64_t c = 0; c < hs; ++c) oi[c] += p * vj[c];
        }
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
      float maxv = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < V; ++i) maxv = std::max(maxv, xr[i]);
      double sum = 0.0;
      if (log) {
        for (int64_t i = 0; i < V; ++i) sum += std::exp(xr[i] - maxv);
        const double lse = maxv + std::log(sum);
        for (int64_t i = 0; i < V; ++i) orow[i] = static_cast<float>(xr[i] - lse);
      } else {
        for (int64_t i = 0; i < V; ++i) {
          const float e = std::exp(xr[i] - maxv);
          orow[i] = e;
          sum += e;
        }
        const double inv = 1.0 / sum;
        for (int64_t i = 0; i < V; ++i) orow[i] = static_cast<float>(orow[i] * inv);
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
        for (int64_t i = 0; i < V; ++i) dxr[i] = dy[i] - std::exp(y[i]) * sf;
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < V; ++i) s += static_cast<double>(dy[i]) * y[i];
        const float sf = static_cast<float>(s);
        for (int64_t i = 0; i < V; ++i) dxr[i] = y[i] * (dy[i] - sf);
      }
    }
  }

  static void check_targets(const char* op, const int32_t* tg, int64_t N, int64_t V, int32_t ignore_index) {
    for (int64_t n = 0; n < N; ++n)
      if (tg[n] != ignore_index && (tg[n] < 0 || tg[n] >= V))
        throw std::out_of_range(std::string(op) + ": target " + std::to_string(tg[n]) + " at row " +
                                std::to_string(n) + " is outside [0, " + std::to_string(V) +
                                ") and is not ignore_index " + std::to_string(ignore_index));
  }

  // losses[n] = logsumexp(logits[n]) - logits[n, t] (max-subtracted, sum in double).
  double cross_entropy_forward(tensor& losses, const tensor& logits, const tensor& targets, int64_t* n_valid,
                               int32_t ignore_index) override {
    const int64_t V = logits.size(-1);
    const int64_t N = targets.numel();
    const int32_t* tg = targets.data<int32_t>();
    check_targets("cross_entropy_forward", tg, N, V, ignore_index);
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
      float maxv = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < V; ++i) maxv = std::max(maxv, x[i]);
      double sum = 0.0;
      for (int64_t i = 0; i < V; ++i) sum += std::exp(x[i] - maxv);
      const double loss = maxv + std::log(sum) - x[tg[n]];
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
    check_targets("cross_entropy_backward", tg, N, V, ignore_index);
    const float* lp = logits.data<float>();
    float* dl = dlogits.data<float>();
#pragma omp parallel for schedule(static) if (N * V >= k_par_min)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = lp + n * V;
      float* d = dl + n * V;
      if (tg[n] == ignore_index) {
        for (int64_t i = 0; i < V; ++i) d[i] = 0.0f;
        continue;
      }
      float maxv = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < V; ++i) maxv = std::max(maxv, x[i]);
      double sum = 0.0;
      for (int64_t i = 0; i < V; ++i) {  // x[i] is read before d[i] is written
        const float e = std::exp(x[i] - maxv);
        d[i] = e;
        sum += e;
      }
      const float scale = static_cast<float>(dloss / sum);
      for (int64_t i = 0; i < V; ++i) d[i] *= scale;
      d[tg[n]] -= dloss;
    }
  }

  // ---------------------------------------------------------------- optimizer

  // torch.optim.AdamW (decoupled weight decay, bias-corrected moments);
  // element math in double, stored as f32.
  void adamw_step(tensor& param, const tensor& grad, tensor& m, tensor& v, int64_t t,
                  const ops::adamw_config& cfg) override {
    const int64_t n = param.numel();
    float* __restrict__ p = param.data<float>();
    const float* __restrict__ g = grad.data<float>();
    float* __restrict__ mp = m.data<float>();
    float* __restrict__ vp = v.data<float>();
    const double b1 = cfg.beta1, b2 = cfg.beta2, lr = cfg.lr, eps = cfg.eps, wd = cfg.weight_decay;
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
#pragma omp parallel for simd schedule(static) if (n >= k_par_min)
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i];
      const double mi = b1 * mp[i] + (1.0 - b1) * gi;
      const double vi = b2 * vp[i] + (1.0 - b2) * gi * gi;
      const double mhat = mi / bc1, vhat = vi / bc2;
      const double pi = p[i];
      p[i] = static_cast<float>(pi - lr * (mhat / (std::sqrt(vhat) + eps) + wd * pi));
      mp[i] = static_cast<float>(mi);
      vp[i] = static_cast<float>(vi);
    }
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

#include <thread>

namespace flowrun::ops {

void set_thread_budget(int n) { omp_set_num_threads(n < 1 ? 1 : n); }

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace flowrun::ops
