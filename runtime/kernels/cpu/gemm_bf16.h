// The CPU backend's bf16 products (included by cpu_backend.cpp only): what the backend runs
// under ops::matmul_precision::bf16 where the CPU multiplies bf16 in hardware.
//
// C = alpha bf16(op(A)) bf16(op(B)) + beta C: op(A) and op(B) are rounded to bf16 (round to
// nearest even, half_bits::bf16_from_f32) into per-thread scratch, kept in their stored layout,
// and multiplied by oneDNN's matmul primitive with bf16 source and weights, fp32 accumulation
// and an fp32 destination; alpha is the primitive's output scale and beta its sum post-op. The
// semantics of the CUDA backend's cublasGemmEx path (ops.h, matmul_precision), and of
// torch.autocast(bfloat16) on a CPU (bf16 inputs, fp32 accumulation).
//
// Where: oneDNN's ISA is one with bf16 dot products (avx512_core_bf16: AVX512_BF16 on Cooper
// Lake, Zen 4 and later; avx512_core_amx: AMX on Sapphire Rapids and later). There the
// primitive is brgemm (its bf16 kernels); on the 6.1 M LLaMA's products (M = 640, N and K 288
// or 768) it ran at 316-426 GFLOP/s on two Zen 4 cores where fp32 ran at 200-212
// (docs/performance.md, change 30). On other CPUs (AVX2 only, AVX-512 without bf16) oneDNN
// would emulate bf16 more slowly than fp32, so bf16_native() is false and the backend ignores
// the setting (fp32 products), as it did everywhere before.
//
// Primitives are cached per thread by shape, transposes, leading dimensions, alpha and beta
// (a model's products are a few dozen shapes); oneDNN runs them on the calling thread's OpenMP
// team (one thread inside a parallel region or below k_par_macs, as library_sgemm).
#pragma once

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/kernels/cpu/gemm.h"
#include "runtime/tensor/half_bits.h"

#if defined(FLOWRUN_GEMM_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace flowrun::cpu_gemm {

/// Whether the bf16 products run here: a oneDNN build on a CPU whose oneDNN ISA has bf16 dot
/// products (avx512_core_bf16 or avx512_core_amx). Fixed for the process.
inline bool bf16_native() {
#if defined(FLOWRUN_GEMM_DNNL)
  static const bool on = [] {
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return isa == dnnl_cpu_isa_avx512_core_bf16 || isa == dnnl_cpu_isa_avx512_core_amx;
  }();
  return on;
#else
  return false;
#endif
}

/// Rounds a (rows, cols) block of floats with leading dimension ld to compact bf16 bits in out
/// (rows x cols), row-major. Spread over the team from 128K elements (outside a parallel region).
inline void round_block_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  const bool par = !omp_in_parallel() && rows * cols >= (int64_t(1) << 17) && rows > 1;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    uint16_t* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t x;
      std::memcpy(&x, s + c, sizeof x);
      o[c] = half_bits::bf16_from_f32(x);
    }
  }
}

#if defined(FLOWRUN_GEMM_DNNL)
/// The per-thread oneDNN engine, stream and primitives of bf16_gemm.
struct bf16_gemm_state {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  using key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, float, float>;  // ta tb M N K ldc alpha beta
  std::map<key, dnnl::matmul> prims;
  std::vector<uint16_t> a, b;  // the rounded op(A) and op(B), compact, in their stored layouts
};
#endif

/// C = alpha bf16(op(A)) bf16(op(B)) + beta C (row-major, M, N, K > 0; beta = 0 ignores C's old
/// contents). Only where bf16_native(); throws std::runtime_error on a oneDNN failure outside a
/// parallel region (inside one the caller's fp32 path would be no better: it terminates, as an
/// exception leaving an OpenMP region does; not seen on a CPU bf16_native() accepts).
inline void bf16_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#if defined(FLOWRUN_GEMM_DNNL)
  thread_local bf16_gemm_state st;
  single_thread_scope small(M * N * K < k_par_macs && !omp_in_parallel() && omp_get_max_threads() > 1);
  // stored A: (K, M) when transposed, else (M, K); stored B: (N, K) when transposed, else (K, N)
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  if (st.a.size() < static_cast<size_t>(M * K)) st.a.resize(static_cast<size_t>(M * K));
  if (st.b.size() < static_cast<size_t>(K * N)) st.b.resize(static_cast<size_t>(K * N));
  round_block_bf16(A, a_rows, a_cols, lda, st.a.data());
  round_block_bf16(B, b_rows, b_cols, ldb, st.b.data());
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc a_md({M, K}, dt::bf16, ta ? dims{1, M} : dims{K, 1});
  const dnnl::memory::desc b_md({K, N}, dt::bf16, tb ? dims{1, K} : dims{N, 1});
  const dnnl::memory::desc c_md({M, N}, dt::f32, dims{ldc, 1});
  try {
    const bf16_gemm_state::key k{ta, tb, M, N, K, ldc, alpha, beta};
    auto it = st.prims.find(k);
    if (it == st.prims.end()) {
      dnnl::primitive_attr attr;
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(beta);
        attr.set_post_ops(po);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, st.eng);
      it = st.prims.emplace(k, dnnl::matmul(pd)).first;
    }
    dnnl::memory am(a_md, st.eng, st.a.data()), bm(b_md, st.eng, st.b.data()), cm(c_md, st.eng, C);
    it->second.execute(st.strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    st.strm.wait();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("bf16 gemm (oneDNN matmul) failed: ") + e.what() + " (status " +
                             std::to_string(static_cast<int>(e.status)) + ")");
  }
#else
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta,
      (void)C, (void)ldc;
  throw std::logic_error("bf16_gemm: this build has no oneDNN (bf16_native() is false)");
#endif
}

}  // namespace flowrun::cpu_gemm
