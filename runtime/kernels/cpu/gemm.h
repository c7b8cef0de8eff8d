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
//  - both (AUTO when both are installed): chosen at run time by the CPU, oneDNN
//    where it has AVX-512 and BLIS (its detected haswell/zen kernels) where it
//    has not. oneDNN 2.6's AVX2 sgemm gives a row a result that depends on M
//    (how many rows share the call: 1-2 ulp in some rows for M = 1, 2, 3, 8,
//    13, 19, 25, 32, 38, 57, 128 against M = 152, K = 64, N = 512), so a row's
//    log-probs changed with its micro-batch and PPO's first ratio was not 1
//    (test_ppo); BLIS gives every row the same bits whatever M and wherever the
//    row sits (docs/performance.md, "GEMM per ISA"). FLOWRUN_CPU_GEMM=onednn,
//    blis or split (below) in the environment overrides the choice (bench_gemm, checks);
//  - otherwise OpenBLAS cblas_sgemm (its own core detection).
// All use the calling thread's OpenMP team size (ops::set_thread_budget)
// and run single-threaded when called inside a parallel region.
//
// Per product where BLIS is the library (CPUs without AVX-512, AUTO; change 23 in
// docs/performance.md): BLIS 0.9's zen3 kernels ran x·Wᵀ at 55-100 GFLOP/s on
// GPT-2's products where flowrun's packed kernel ran them at 110-150, and dy·W
// at 63-118 where OpenBLAS's Haswell/Zen kernels ran them at 120-171 (bench_gemm,
// 2 threads, rows 256). So x·Wᵀ (a Linear forward) goes to packed_gemm at any
// row count above k_small_m, in column chunks (split_products), up to K =
// k_packed_chunk / panel width (32,768 on AVX-512, 65,536 on AVX2; BLIS above),
// and dy·W (a Linear's dx) to OpenBLAS when OpenBLAS runs its Haswell or Zen
// kernels (nn_on_openblas; in fixed blocks, one thread each: openblas_blocks);
// dyᵀ·x stays on BLIS. gemm_batched takes the same
// rule item by item. A forward row's bits so stay independent of M (the packed
// kernel's rule, and BLIS's); backward products need no such rule.
// FLOWRUN_CPU_GEMM=blis sends every library-sized product to BLIS as before;
// FLOWRUN_CPU_GEMM=split takes this split on any CPU (with OPENBLAS_CORETYPE=Zen
// for the dy·W part where OpenBLAS detects another core).
//
// Few rows times a transposed weight (x·Wᵀ with M <= k_small_m: decoding) goes
// to small_m_nt below instead: one pass over W, no packing. Other products whose
// op(B) is small (at most k_packed_max floats once padded to whole panels: every
// weight of stories260K and the 6.1 M LLaMA, the attention heads) go to
// packed_gemm: no library call overhead, and a row's bits do not depend on M
// (simd_kernels.h, "packed GEMM"), except that x·Wᵀ with at most k_small_m
// rows gets small_m_nt's bits (another summation order; decoding would pay the
// packing per token otherwise).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/simd_kernels.h"

#include <cstdio>
#include <cstdlib>

#include <cblas.h>  // OpenBLAS's, linked in every build (cmake/deps.cmake); before blis.h

#if defined(FLOWRUN_GEMM_DNNL)
#include <oneapi/dnnl/dnnl.h>
#endif
#if defined(FLOWRUN_GEMM_BLIS)
#include <blis.h>
extern "C" cntx_t* bli_gks_lookup_nat_cntx(arch_t id);  // defined in libblis.a (hidden in the .so only)
#endif

namespace flowrun::cpu_gemm {

/// Rows up to which x·Wᵀ uses the small-M kernel.
constexpr int64_t k_small_m = 16;
/// op(B) of at most this many floats once packed (1 MiB: every weight of stories260K and of the
/// 6.1 M LLaMA of bench/trl_ppo.py, dim 288, hidden 768, vocab 512) goes to packed_gemm, whatever M.
constexpr int64_t k_packed_max = int64_t(1) << 18;
/// Floats of op(B) packed at once when packed_gemm takes a larger op(B) in column chunks (4 MiB: a chunk
/// of GPT-2's 768-wide products is 1,360 columns).
constexpr int64_t k_packed_chunk = int64_t(1) << 20;
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

/// AVX-512F/DQ/BW/VL, the set oneDNN's and BLIS's AVX-512 kernels need. False on every other
/// architecture (GCC's __builtin_cpu_supports exists for x86 only: an ARM64 build did not compile).
inline bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

/// FLOWRUN_CPU_GEMM, read once for the process: "" when unset or empty, else "onednn", "blis" or "split".
/// Another value is named on stderr and ignored (the CPU chooses); the CPU backend reads it when first
/// used, so that happens in every build. A value naming a library the build lacks (onednn without
/// oneDNN, blis or split without BLIS) changes nothing.
inline const std::string& gemm_override() {
  static const std::string v = [] {
    const char* e = std::getenv("FLOWRUN_CPU_GEMM");
    if (e == nullptr || *e == '\0') return std::string();
    const std::string s(e);
    if (s == "onednn" || s == "blis" || s == "split") return s;
    std::fprintf(stderr, "flowrun: FLOWRUN_CPU_GEMM=%s is none of onednn, blis, split: ignored, the CPU chooses\n", e);
    return std::string();
  }();
  return v;
}

/// Whether library_sgemm calls BLIS (else oneDNN or OpenBLAS, as built). Fixed for the process.
inline bool use_blis() {
#if defined(FLOWRUN_GEMM_DNNL) && defined(FLOWRUN_GEMM_BLIS)
  static const bool blis = [] {
    const std::string& o = gemm_override();
    if (o == "blis" || o == "split") return true;
    if (o == "onednn") return false;
    return !cpu_has_avx512();
  }();
  return blis;
#elif defined(FLOWRUN_GEMM_BLIS)
  return true;
#else
  return false;
#endif
}

/// Whether the products are split by kind (the header comment): BLIS is the library, the CPU has no
/// AVX-512 (where the split was measured) and FLOWRUN_CPU_GEMM is unset, or FLOWRUN_CPU_GEMM=split on
/// any CPU (the ctest gemm_split_path runs test_ops' GEMM cases so where the CPU has AVX-512).
/// Fixed for the process.
inline bool split_products() {
#if defined(FLOWRUN_GEMM_BLIS)
  static const bool on = [] {
    const std::string& o = gemm_override();
    return use_blis() && (o == "split" || (o.empty() && !cpu_has_avx512()));
  }();
  return on;
#else
  return false;
#endif
}

/// Whether dy·W (neither operand transposed) goes to OpenBLAS: split_products() and OpenBLAS's
/// detected core is one whose kernels were measured faster than BLIS's (Haswell, Zen). OpenBLAS runs
/// its slow generic kernels on a core it does not know (Prescott on the Xeon of "The GEMM library").
inline bool nn_on_openblas() {
  static const bool on = [] {
    if (!split_products()) return false;
    const std::string core = openblas_get_corename();
    return core == "Haswell" || core == "Zen";
  }();
  return on;
}

#if defined(FLOWRUN_GEMM_BLIS)
inline cntx_t* blis_context() {
  static cntx_t* cx = [] {
    bli_init();
    cntx_t* c = cpu_has_avx512() ? bli_gks_lookup_nat_cntx(BLIS_ARCH_SKX) : nullptr;
    return c ? c : bli_gks_query_cntx();
  }();
  return cx;
}
#endif

inline std::string library_name() {
#if defined(FLOWRUN_GEMM_BLIS)
  if (use_blis()) {
    cntx_t* cx = blis_context();
    const bool skx = cx == bli_gks_lookup_nat_cntx(BLIS_ARCH_SKX);
    std::string name = std::string("BLIS ") + bli_info_get_version_str() + ", " + (skx ? "skx" : "detected") +
                       " kernels (BLIS detects " + bli_arch_string(bli_arch_query_id()) + ")";
    if (nn_on_openblas()) name += std::string("; dy·W on OpenBLAS, core ") + openblas_get_corename();
    if (split_products())
      name += "; x·Wᵀ on flowrun's packed kernel (more than " + std::to_string(k_small_m) + " rows, K <= " +
              std::to_string(k_packed_chunk / simd::gemm_panel_width()) + ")";
    return name;
  }
#endif
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
#elif !defined(FLOWRUN_GEMM_BLIS)
  return std::string("OpenBLAS ") + openblas_get_config() + ", core " + openblas_get_corename();
#else
  return "BLIS";  // not reached: use_blis() is true in a BLIS-only build
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

/// Columns (rows where N fits one block) per single-threaded OpenBLAS call (openblas_blocks): fixed, so
/// the bits do not depend on the thread count; 128 splits GPT-2's 768 and 3,072 columns evenly over 2
/// or 4 threads.
constexpr int64_t k_openblas_block = 128;

/// C = alpha op(A) op(B) + beta C on OpenBLAS in fixed blocks, each on one thread, the team taking
/// blocks in turn. OpenBLAS's threaded sgemm gives bits that depend on its thread count (test_ops "cpu
/// gemm, backward products ...": 17,814 of 196,608 outputs of a GPT-2 dy·W differed at 1 and 2
/// threads), and a graph's node runs on 1 or 2 threads as the cores it shares allow
/// (ops::compute_scope), so a run would not be deterministic. Here a block's bits are one-thread
/// OpenBLAS's for that block, whatever the team (docs/performance.md change 36). Blocks of columns, or
/// of rows where N fits one block. Sizes fit OpenBLAS's 32-bit ints (check_sizes).
inline void openblas_blocks(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  const bool by_cols = N > k_openblas_block;
  const int64_t blocks = ((by_cols ? N : M) + k_openblas_block - 1) / k_openblas_block;
  const bool team = blocks > 1 && !omp_in_parallel() && omp_get_max_threads() > 1;
  single_thread_scope one(!team && !omp_in_parallel() && omp_get_max_threads() > 1);
#pragma omp parallel for schedule(dynamic) if (team)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t p0 = b * k_openblas_block, n = std::min(k_openblas_block, (by_cols ? N : M) - p0);
    const float* Ab = by_cols ? A : (ta ? A + p0 : A + p0 * lda);  // op(A)'s rows [p0, p0 + n)
    const float* Bb = !by_cols ? B : (tb ? B + p0 * ldb : B + p0);  // op(B)'s columns [p0, p0 + n)
    float* Cb = by_cols ? C + p0 : C + p0 * ldc;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, i32(by_cols ? M : n),
                i32(by_cols ? n : N), i32(K), alpha, Ab, i32(lda), Bb, i32(ldb), beta, Cb, i32(ldc));
  }
}

/// The library call (sizes checked by check_sizes): C = alpha op(A) op(B) + beta C, row-major, M, N, K > 0.
inline void library_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  single_thread_scope small(M * N * K < k_par_macs && !omp_in_parallel() && omp_get_max_threads() > 1);
  constexpr int64_t i32_max = std::numeric_limits<int>::max();
  if (!ta && !tb && nn_on_openblas() && std::max({M, N, K, lda, ldb, ldc}) <= i32_max) {
    openblas_blocks(false, false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#if defined(FLOWRUN_GEMM_BLIS)
  if (use_blis()) {
    rntm_t r = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(omp_in_parallel() ? 1 : omp_get_max_threads(), &r);
    bli_sgemm_ex(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M, N, K, &alpha,
                 const_cast<float*>(A), lda, 1, const_cast<float*>(B), ldb, 1, &beta, C, ldc, 1, blis_context(), &r);
    return;
  }
#endif
#if defined(FLOWRUN_GEMM_DNNL)
  const dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success && !omp_in_parallel())
    throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(static_cast<int>(st)));
#elif !defined(FLOWRUN_GEMM_BLIS)
  openblas_blocks(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

// ------------------------------------------------------------------ small M: C = alpha A Bᵀ + beta C

/// x·Wᵀ for M <= k_small_m rows: parallel over blocks of W's rows (each thread
/// streams its part of W once), each block on the vector kernel of the CPU
/// (simd::gemm_small_nt: AVX-512, AVX2, NEON, ... chosen at run time).
inline void small_m_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                       int64_t ldb, float beta, float* C, int64_t ldc) {
  // B rows per block: a multiple of the kernel's tiles (8 rows for one or two rows of A, 4 otherwise)
  constexpr int64_t NB = simd::k_small_nt_block;
  const int64_t nblk = (N + NB - 1) / NB;
  // Two threads from ~128K multiply-adds, or from a 256 KiB weight at any row count: at one row
  // the weight's stream is the whole cost, and one thread reads it at about half the rate of two
  // (stories15M's 288x288 layers at batch 1: 83K multiply-adds, 331 KB; on one thread they held
  // decoding to 725 tok/s, on two 790: docs/performance.md change 42). stories260K's layers and
  // head (64 x 64, 512 x 64) stay on one.
  const bool par = !omp_in_parallel() && (M * N * K >= (int64_t(1) << 17) || N * K >= (int64_t(1) << 16));
#pragma omp parallel for schedule(static) if (par)
  for (int64_t bk = 0; bk < nblk; ++bk) {
    const int64_t n0 = bk * NB, nn = std::min(NB, N - n0);
    simd::gemm_small_nt(M, nn, K, alpha, A, lda, B + n0 * ldb, ldb, beta, C + n0, ldc);
  }
}

// ------------------------------------------------------------------ small op(B): our packed kernel

/// Floats of op(B) (K, N) packed by simd::gemm_pack_b: ceil(N / W) panels of W x K.
inline int64_t packed_floats(int64_t N, int64_t K) {
  const int64_t W = simd::gemm_panel_width();
  return (N + W - 1) / W * W * K;
}

/// Whether C = op(A) op(B) with op(B) (K, N) goes to packed_gemm: op(B) padded to whole panels
/// (ceil(N / W) W K floats, W = simd::gemm_panel_width()) fits k_packed_max, so the per-thread
/// buffer stays within 1 MiB (N = 1 with a long K goes to the library). Depends on N, K and the
/// CPU's path only, so every micro-batch of a layer's forward with more than k_small_m rows takes
/// the same kernel as the whole batch.
inline bool use_packed(int64_t N, int64_t K) { return packed_floats(N, K) <= k_packed_max; }

/// Whether x·Wᵀ with op(B) (K, N) goes to packed_gemm whatever its size: split_products() and one panel
/// (W x K floats) fits a chunk. Depends on N, K and the process only, as use_packed does.
inline bool use_packed_nt(int64_t K) { return split_products() && simd::gemm_panel_width() * K <= k_packed_chunk; }

/// A growable float buffer aligned to 64 bytes, a cache line, for packed panels: a panel row of
/// an AVX-512 path is two 64-byte vectors, which straddle two lines at every load when the buffer
/// starts 16 bytes past a line (glibc's malloc returns blocks so aligned; change 41 in
/// docs/performance.md). Its floats are uninitialised; growing drops them.
class aligned_floats {
 public:
  aligned_floats() = default;
  explicit aligned_floats(size_t n) { reserve(n); }
  /// At least n floats; throws std::bad_alloc.
  float* reserve(size_t n) {
    if (n > cap_) {
      const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
      p_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      if (!p_) throw std::bad_alloc();
      cap_ = n;
    }
    return p_.get();
  }
  float* data() const { return p_.get(); }

 private:
  struct release {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, release> p_;
  size_t cap_ = 0;
};

/// One chunk of packed_gemm: op(B) packed once into the calling thread's buffer (the team packs a
/// share of the panels each, then waits), the tiles split over the team in contiguous ranges (no team
/// inside a parallel region or below k_par_macs). Bits independent of M and of the thread count.
inline void packed_gemm_chunk(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  thread_local aligned_floats packed;
  const int64_t W = simd::gemm_panel_width(), panels = (N + W - 1) / W;
  float* P = packed.reserve(static_cast<size_t>(packed_floats(N, K)));
  const int64_t tiles = simd::gemm_packed_tiles(ta, M, N, K);
  const int nt = omp_in_parallel() || M * N * K < k_par_macs ? 1 : std::min<int64_t>(omp_get_max_threads(), tiles);
  if (nt <= 1) {
    simd::gemm_pack_b(tb, N, K, B, ldb, P, 0, panels);
    simd::gemm_packed(ta, M, N, K, alpha, A, lda, P, beta, C, ldc, 0, tiles);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    simd::gemm_pack_b(tb, N, K, B, ldb, P, panels * t / n, panels * (t + 1) / n);
#pragma omp barrier
    simd::gemm_packed(ta, M, N, K, alpha, A, lda, P, beta, C, ldc, tiles * t / n, tiles * (t + 1) / n);
  }
}

/// C = alpha op(A) op(B) + beta C on simd::gemm_packed: op(B) (K, N) whole when it fits k_packed_max
/// floats once packed, else in chunks of whole panels of at most k_packed_chunk floats (each packed and
/// computed by packed_gemm_chunk in turn). An output's bits depend on its row of op(A), its column of
/// op(B), K and the SIMD path only: not on M, on the chunking, nor on the thread count.
inline void packed_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                        const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t W = simd::gemm_panel_width();
  const int64_t chunk = use_packed(N, K) ? N : std::max<int64_t>(W, k_packed_chunk / K / W * W);
  for (int64_t n0 = 0; n0 < N; n0 += chunk)
    packed_gemm_chunk(ta, tb, M, std::min(chunk, N - n0), K, alpha, A, lda, tb ? B + n0 * ldb : B + n0, ldb, beta,
                      C + n0, ldc);
}

}  // namespace flowrun::cpu_gemm
