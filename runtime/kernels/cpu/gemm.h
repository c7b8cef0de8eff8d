// The CPU backend's sgemm (included by cpu_backend.cpp only).
//
// The library is chosen at configure time (cmake/deps.cmake, FLOWRUN_GEMM) by
// measurement (bench/bench_gemm.cpp, docs/performance.md):
//  - FLOWRUN_GEMM_DNNL: oneDNN's dnnl_sgemm (row-major; AVX-512 JIT kernels
//    chosen from CPUID feature bits, so a CPU model it does not know still
//    gets its AVX-512 code);
//  - FLOWRUN_GEMM_BLIS: BLIS, with its skx (AVX-512) context picked explicitly
//    when the CPU has AVX-512F/DQ/BW/VL (BLIS 0.9's own detection looks for
//    "Gold"/"Platinum" in the model name and falls back to haswell);
//  - otherwise OpenBLAS cblas_sgemm (its own core detection).
// All three use the calling thread's OpenMP team size (ops::set_thread_budget)
// and run single-threaded when called inside a parallel region.
//
// Few rows times a transposed weight (x·Wᵀ with M <= k_small_m: decoding) goes
// to small_m_nt below instead: one pass over W, no packing.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "runtime/kernels/cpu/simd.h"

#if defined(FLOWRUN_GEMM_DNNL)
#include <oneapi/dnnl/dnnl.h>
#elif defined(FLOWRUN_GEMM_BLIS)
#include <blis.h>
extern "C" cntx_t* bli_gks_lookup_nat_cntx(arch_t id);  // defined in libblis.a (hidden in the .so only)
#else
#include <cblas.h>
#endif

namespace flowrun::cpu_gemm {

/// Rows up to which x·Wᵀ uses the small-M kernel.
constexpr int64_t k_small_m = 16;
/// GEMMs below this many multiply-adds run on one thread (~40 us of work): a
/// parallel region on shared cores can cost milliseconds (cpu_backend.cpp, k_par_min).
constexpr int64_t k_par_macs = int64_t(1) << 22;

/// Runs the calling thread's next OpenMP regions (and the GEMM libraries, which
/// follow omp_get_max_threads) on one thread while it lives.
class single_thread_scope {
 public:
  explicit single_thread_scope(bool on) : saved_(on ? omp_get_max_threads() : 0) {
    if (on) omp_set_num_threads(1);
  }
  ~single_thread_scope() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  single_thread_scope(const single_thread_scope&) = delete;
  single_thread_scope& operator=(const single_thread_scope&) = delete;

 private:
  int saved_;
};

#if defined(FLOWRUN_GEMM_BLIS)
inline cntx_t* blis_context() {
  static cntx_t* cx = [] {
    bli_init();
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    cntx_t* c = avx512 ? bli_gks_lookup_nat_cntx(BLIS_ARCH_SKX) : nullptr;
    return c ? c : bli_gks_query_cntx();
  }();
  return cx;
}
#endif

inline std::string library_name() {
#if defined(FLOWRUN_GEMM_DNNL)
  const dnnl_version_t* v = dnnl_version();
  const char* isa = "?";
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core: isa = "avx512_core"; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl_cpu_isa_avx512_core_amx: isa = "avx512_core_amx"; break;
    case dnnl_cpu_isa_avx2: isa = "avx2"; break;
    case dnnl_cpu_isa_avx2_vnni: isa = "avx2_vnni"; break;
    default: isa = "other"; break;
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " dnnl_sgemm, ISA " + isa;
#elif defined(FLOWRUN_GEMM_BLIS)
  cntx_t* cx = blis_context();
  const bool skx = cx == bli_gks_lookup_nat_cntx(BLIS_ARCH_SKX);
  return std::string("BLIS ") + bli_info_get_version_str() + ", " + (skx ? "skx" : "detected") + " kernels (BLIS detects " +
         bli_arch_string(bli_arch_query_id()) + ")";
#else
  return std::string("OpenBLAS ") + openblas_get_config() + ", core " + openblas_get_corename();
#endif
}

/// Throws std::invalid_argument when a size does not fit the library's integer
/// type (OpenBLAS's cblas takes 32-bit ints; oneDNN and BLIS take 64-bit ones).
inline void check_sizes(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
#if !defined(FLOWRUN_GEMM_DNNL) && !defined(FLOWRUN_GEMM_BLIS)
  const int64_t v[6] = {M, N, K, lda, ldb, ldc};
  const char* names[6] = {"M", "N", "K", "lda", "ldb", "ldc"};
  for (int i = 0; i < 6; ++i)
    if (v[i] < 0 || v[i] > std::numeric_limits<int>::max())
      throw std::invalid_argument(std::string("gemm: ") + names[i] + " = " + std::to_string(v[i]) +
                                  " does not fit OpenBLAS's 32-bit int");
#else
  (void)M, (void)N, (void)K, (void)lda, (void)ldb, (void)ldc;
#endif
}

/// The library call (sizes checked by check_sizes): C = alpha op(A) op(B) + beta C, row-major, M, N, K > 0.
inline void library_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  single_thread_scope small(M * N * K < k_par_macs && !omp_in_parallel() && omp_get_max_threads() > 1);
#if defined(FLOWRUN_GEMM_DNNL)
  const dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success && !omp_in_parallel())
    throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(static_cast<int>(st)));
#elif defined(FLOWRUN_GEMM_BLIS)
  rntm_t r = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(omp_in_parallel() ? 1 : omp_get_max_threads(), &r);
  bli_sgemm_ex(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M, N, K, &alpha,
               const_cast<float*>(A), lda, 1, const_cast<float*>(B), ldb, 1, &beta, C, ldc, 1, blis_context(), &r);
#else
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, i32(M), i32(N), i32(K),
              alpha, A, i32(lda), B, i32(ldb), beta, C, i32(ldc));
#endif
}

// ------------------------------------------------------------------ small M: C = alpha A Bᵀ + beta C

#if FLOWRUN_AVX512
/// The 16 horizontal sums of v[0..15] as one vector (lane i = sum of v[i]):
/// a transposing add tree, 45 shuffles and adds instead of 16 separate reductions.
inline __m512 hsum16(const __m512* v) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)
    z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/// One MR x NR tile of C from rows A[0, MR) and B[0, NR) over K (dot products
/// of rows, 16 lanes at a time, masked tail). MR x NR == 16 tiles reduce with hsum16.
template <int MR, int NR>
inline void small_tile(int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                       float* C, int64_t ldc) {
  __m512 acc[MR * NR];
  for (int i = 0; i < MR * NR; ++i) acc[i] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 b[NR];
    for (int j = 0; j < NR; ++j) b[j] = _mm512_loadu_ps(B + j * ldb + k);
    // the next tile's rows of B (the weight streams from memory once; with one
    // row of A the tile is a plain sequential stream the hardware prefetches)
    if constexpr (MR > 1)
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(B + (NR + j) * ldb + k), _MM_HINT_T0);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_loadu_ps(A + i * lda + k);
      for (int j = 0; j < NR; ++j) acc[i * NR + j] = _mm512_fmadd_ps(a, b[j], acc[i * NR + j]);
    }
  }
  if (k < K) {
    const __mmask16 m = simd::tail_mask(K - k);
    __m512 b[NR];
    for (int j = 0; j < NR; ++j) b[j] = _mm512_maskz_loadu_ps(m, B + j * ldb + k);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_maskz_loadu_ps(m, A + i * lda + k);
      for (int j = 0; j < NR; ++j) acc[i * NR + j] = _mm512_fmadd_ps(a, b[j], acc[i * NR + j]);
    }
  }
  if constexpr (MR * NR == 16) {
    alignas(64) float r[16];
    _mm512_store_ps(r, _mm512_mul_ps(hsum16(acc), _mm512_set1_ps(alpha)));
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        float& c = C[i * ldc + j];
        c = beta == 0.0f ? r[i * NR + j] : r[i * NR + j] + beta * c;
      }
  } else {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        const float s = alpha * _mm512_reduce_add_ps(acc[i * NR + j]);
        float& c = C[i * ldc + j];
        c = beta == 0.0f ? s : s + beta * c;
      }
  }
}

/// Rows [0, M) of C against NR rows of B: 4-row tiles (MR x NR = 16 when NR = 4),
/// then the remaining 1-3 rows.
template <int NR>
inline void small_rows(int64_t M, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                       float beta, float* C, int64_t ldc) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) small_tile<4, NR>(K, alpha, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc);
  switch (M - i) {
    case 3: small_tile<3, NR>(K, alpha, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc); break;
    case 2: small_tile<2, NR>(K, alpha, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc); break;
    case 1: small_tile<1, NR>(K, alpha, A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc); break;
    default: break;
  }
}
#endif

/// x·Wᵀ for M <= k_small_m rows: parallel over blocks of W's rows (each thread
/// streams its part of W once). Returns false where the build has no AVX-512.
inline bool small_m_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                       int64_t ldb, float beta, float* C, int64_t ldc) {
#if FLOWRUN_AVX512
  // B rows per block: 16 for one row of A (a 1x16 tile), 8 for two, 4 otherwise
  const int64_t NB = M == 1 ? 16 : M == 2 ? 8 : 4;
  const int64_t nblk = (N + NB - 1) / NB;
  // streaming the weight once: worth two threads from ~128K multiply-adds (a
  // 288x288 layer is 83K: one thread; the LM head of stories15M: two)
  const bool par = !omp_in_parallel() && M * N * K >= (int64_t(1) << 17);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t bk = 0; bk < nblk; ++bk) {
    const int64_t n0 = bk * NB, nn = std::min(NB, N - n0);
    const float* Bb = B + n0 * ldb;
    float* Cb = C + n0;
    if (nn == 16) {
      small_tile<1, 16>(K, alpha, A, lda, Bb, ldb, beta, Cb, ldc);
    } else if (nn == 8 && M == 2) {
      small_tile<2, 8>(K, alpha, A, lda, Bb, ldb, beta, Cb, ldc);
    } else if (nn == 4) {
      small_rows<4>(M, K, alpha, A, lda, Bb, ldb, beta, Cb, ldc);
    } else {  // the last, partial block: 4, 2 and 1 rows of B at a time
      int64_t j = 0;
      for (; j + 4 <= nn; j += 4) small_rows<4>(M, K, alpha, A, lda, Bb + j * ldb, ldb, beta, Cb + j, ldc);
      for (; j + 2 <= nn; j += 2) small_rows<2>(M, K, alpha, A, lda, Bb + j * ldb, ldb, beta, Cb + j, ldc);
      for (; j < nn; ++j) small_rows<1>(M, K, alpha, A, lda, Bb + j * ldb, ldb, beta, Cb + j, ldc);
    }
  }
  return true;
#else
  return false;
#endif
}

}  // namespace flowrun::cpu_gemm
