// flowrun ops: forward/backward pairs over tensors, dispatched to a backend.
//
// Every function here checks shapes and dtypes (throwing std::invalid_argument
// with the op name, the expected and the actual shapes), then calls the
// backend of the tensors' device (runtime/kernels/backend.h). Models call only
// these functions, so a new backend (CUDA) slots in without touching them.
//
// Conventions (llm.c style):
//  - All float tensors are f32 and contiguous. B = batch, T = time, C = channels,
//    H = query heads, KV = key/value heads, hs = head size, V = vocabulary.
//  - Backward functions ACCUMULATE into parameter gradients (dw += ...) and into
//    input gradients marked "+=" below; the others overwrite. This matches llm.c
//    and lets a residual stream and a tied embedding share one gradient buffer.
//  - Weights use the Hugging Face layout: a Linear weight is (out_features, in_features).
//  - Shape checks are exact unless a comment says otherwise ("x may have leading dims":
//    x (..., C) is treated as (N, C) with N the product of the leading dims, and the
//    per-row outputs (rstd, mean, losses, targets) only need N elements).
//  - Elementwise ops, activations, softmax and the cross-entropy gradient may run in
//    place (output == an input). GEMM outputs (matmul, linear) must not alias inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace flowrun::ops {

// ------------------------------------------------------------------ basics

/// out = a + b (elementwise, identical shapes; out may be a or b).
void add(tensor& out, const tensor& a, const tensor& b);
/// y += alpha * x (same numel).
void axpy(tensor& y, const tensor& x, float alpha = 1.0f);
/// x *= s.
void scale(tensor& x, float s);
/// x = v.
void fill(tensor& x, float v);

// ------------------------------------------------------------------ matmul

/// out (M, N) = alpha * op(a) @ op(b) + beta * out, with op(x) = x or x^T.
/// a is (M, K) or (K, M) when trans_a; b is (K, N) or (N, K) when trans_b.
/// Leading dims of a/b/out may be flattened: a, b and out (dim >= 1) are each viewed as
/// 2-D (product of the leading dims, last dim), e.g. a (B, T, C) with trans_a for dW.
/// K == 0 or alpha == 0 gives out = beta * out; beta == 0 ignores out's old contents
/// (NaN included), as BLAS. CPU: the GEMM library of runtime/kernels/cpu/gemm.h.
void matmul(tensor& out, const tensor& a, const tensor& b, bool trans_a, bool trans_b,
            float alpha = 1.0f, float beta = 0.0f);

/// Precision of the matrix products of the calling thread (matmul, matmul_batched,
/// linear_forward / linear_backward; the backends' gemm / gemm_batched), in the
/// spirit of torch.autocast for matmuls (torch.backends.cuda.matmul precision):
///  - f32 (the default): fp32 inputs, fp32 products and accumulation (on CUDA cuBLAS
///    in CUBLAS_DEFAULT_MATH, no TF32).
///  - bf16: on CUDA, op(a) and op(b) are rounded to bf16 (round to nearest even) in
///    scratch memory and multiplied by cublasGemmEx / cublasGemmStridedBatchedEx with
///    bf16 inputs, fp32 output and fp32 accumulation (CUBLAS_COMPUTE_32F); alpha, beta
///    and the output stay fp32. Expect ~1e-2 norm-wise relative error against fp32.
///    On the CPU the same: op(a) and op(b) rounded to bf16, oneDNN's bf16 matmul, fp32
///    accumulation (runtime/kernels/cpu/gemm_bf16.h), where the CPU has bf16 dot products
///    (cpu_bf16_matmul(): AVX512_BF16, AMX); elsewhere the CPU backend ignores the setting
///    (its GEMMs stay fp32, as emulated bf16 would be slower).
/// Only GEMMs use it; attention, norms, losses and optimizer math stay fp32.
/// The setting is per thread (like set_thread_budget); threads start at f32.
enum class matmul_precision : uint8_t { f32, bf16 };
void set_matmul_precision(matmul_precision p);
matmul_precision get_matmul_precision();

/// Sets the calling thread's matmul precision for a scope and restores the previous one.
class matmul_precision_scope {
 public:
  explicit matmul_precision_scope(matmul_precision p) : prev_(get_matmul_precision()) { set_matmul_precision(p); }
  ~matmul_precision_scope() { set_matmul_precision(prev_); }
  matmul_precision_scope(const matmul_precision_scope&) = delete;
  matmul_precision_scope& operator=(const matmul_precision_scope&) = delete;

 private:
  matmul_precision prev_;
};

/// Batched matmul over the leading dim: out[i] = alpha * op(a[i]) @ op(b[i]) + beta * out[i].
/// a (Bt, M, K), b (Bt, K, N), out (Bt, M, N) (before transposes).
void matmul_batched(tensor& out, const tensor& a, const tensor& b, bool trans_a, bool trans_b,
                    float alpha = 1.0f, float beta = 0.0f);

/// Linear layer, HF layout: out (N, out) = x (N, in) @ w^T (w is (out, in)) + bias (out).
/// `bias` may be undefined. x may have leading dims (B, T, in).
void linear_forward(tensor& out, const tensor& x, const tensor& w, const tensor& bias);
/// dx (N, in) += dout @ w (if dx defined); dw += dout^T @ x (if defined: an undefined dw
/// skips it, for a frozen weight); dbias += sum_rows(dout) (if defined).
void linear_backward(tensor& dx, tensor& dw, tensor& dbias, const tensor& dout, const tensor& x,
                     const tensor& w);

// ------------------------------------------------------------------ embedding

/// out (N, C) = wte[ids] for ids (N) i32. Throws std::out_of_range naming the bad id.
/// ids may have any shape; out is (ids.numel(), C) or ids' shape + (C). Negative ids throw.
void embedding_forward(tensor& out, const tensor& ids, const tensor& wte);
/// dwte[ids[n]] += dout[n]. Ids < 0 are skipped; ids >= V throw std::out_of_range.
void embedding_backward(tensor& dwte, const tensor& dout, const tensor& ids);

// ------------------------------------------------------------------ norms

/// RMSNorm (Zhang & Sennrich 2019, eq. 4; llama2.c rmsnorm):
/// out = x / sqrt(mean(x^2) + eps) * w. x, out (N, C); w (C); rstd (N) saved for backward.
/// x may have leading dims. Statistics are accumulated in double.
void rmsnorm_forward(tensor& out, tensor& rstd, const tensor& x, const tensor& w, float eps);
/// dx += ..., dw += ... given the saved rstd.
void rmsnorm_backward(tensor& dx, tensor& dw, const tensor& dout, const tensor& x, const tensor& w,
                      const tensor& rstd);

/// LayerNorm (Ba et al. 2016; llm.c layernorm_forward): out = (x - mean) * rstd * w + b.
/// x, out (N, C); w, b (C); mean, rstd (N) saved. b may be undefined. x may have leading
/// dims. Biased variance (as torch); statistics accumulated in double.
void layernorm_forward(tensor& out, tensor& mean, tensor& rstd, const tensor& x, const tensor& w,
                       const tensor& b, float eps);
/// dx += ..., dw += ..., db += ... (db may be undefined).
void layernorm_backward(tensor& dx, tensor& dw, tensor& db, const tensor& dout, const tensor& x,
                        const tensor& w, const tensor& mean, const tensor& rstd);

// ------------------------------------------------------------------ activations

enum class activation : uint8_t { silu, gelu_tanh, relu };
const char* activation_name(activation a);

/// out = act(x). GELU uses the tanh approximation (Hendrycks & Gimpel 2016, as GPT-2).
void activation_forward(tensor& out, const tensor& x, activation a);
/// dx = dout * act'(x) (overwrites). relu'(0) = 0, as torch.
void activation_backward(tensor& dx, const tensor& dout, const tensor& x, activation a);

/// SwiGLU (Shazeer 2020, eq. 6; LLaMA's MLP): out = silu(gate) * up. All (N, hidden).
void swiglu_forward(tensor& out, const tensor& gate, const tensor& up);
/// dgate, dup (overwrite) from dout.
void swiglu_backward(tensor& dgate, tensor& dup, const tensor& dout, const tensor& gate, const tensor& up);

// ------------------------------------------------------------------ RoPE

/// Which pairs of a head's channels rotate together (Su et al. 2021, RoFormer eq. 34).
///  - adjacent: (2i, 2i+1), as Meta's LLaMA and llama2.c;
///  - half: (i, i + hs/2), as Hugging Face's LlamaModel (rotate_half).
enum class rope_layout : uint8_t { adjacent, half };

/// In place: x (B, T, NH, hs) rotated by angle pos * theta^(-2i/hs) where pos =
/// positions (B, T) i32 (per-sequence positions support left padding), i in [0, hs/2).
/// hs must be even, theta > 0. For both layouts the angle is computed in f32 exactly
/// as llama2.c's forward(): freq = 1.0f / powf(theta, (float)(2i) / hs), val = (float)pos
/// * freq, cosf(val) / sinf(val); this is also how HF builds inv_freq (float32), so
/// generation tracks both references closely (large positions lose f32 angle precision
/// exactly as they do there).
void rope_forward(tensor& x, const tensor& positions, float theta, rope_layout layout);
/// In place: the inverse rotation, which is RoPE's Jacobian transposed.
void rope_backward(tensor& dx, const tensor& positions, float theta, rope_layout layout);

// ------------------------------------------------------------------ attention

/// Causal scaled dot-product attention with grouped-query heads (Ainslie et al. 2023)
/// and an optional padding mask.
///  q (B, Tq, H, hs); k, v (B, S, KV, hs) of which the first `n_keys` positions are
///  used (n_keys <= S; pass -1 for S); H % KV == 0, head h reads kv head h / (H/KV).
///  Query i sits at absolute position n_keys - Tq + i and sees keys j <= that position.
///  attn_mask (B, n_keys or S) i32 (1 = real token, 0 = padding, as HF's attention_mask)
///  may be undefined. A query with no visible key outputs zeros.
///  out (B, Tq, H, hs). att (B, H, Tq, n_keys) receives the probabilities for
///  backward (0 for every key the query cannot see, the whole row for a query with no
///  visible key); may be undefined (inference), then scratch is used. Tq <= n_keys.
/// Scale 1/sqrt(hs) (Vaswani et al. 2017, eq. 1).
void attention_forward(tensor& out, tensor& att, const tensor& q, const tensor& k, const tensor& v,
                       const tensor& attn_mask, int64_t n_keys = -1);
/// dq (overwrite), dk, dv (overwrite) given dout and the saved att (Tq == S == n_keys).
/// The padding mask needs no argument: it is encoded in att's zeros. Only att's causal
/// part (key j <= query i) is read. dk/dv sum over the H/KV query heads of each kv head.
void attention_backward(tensor& dq, tensor& dk, tensor& dv, const tensor& dout, const tensor& q,
                        const tensor& k, const tensor& v, const tensor& att);

// ------------------------------------------------------------------ softmax, losses

/// Row-wise softmax over the last dim: x, out (N, V).
void softmax_forward(tensor& out, const tensor& x);
/// dx = out * (dout - sum(dout * out)) (overwrite).
void softmax_backward(tensor& dx, const tensor& dout, const tensor& out);
/// Row-wise log-softmax: out = x - logsumexp(x).
void log_softmax_forward(tensor& out, const tensor& x);
/// dx = dout - softmax(x) * sum(dout), with softmax recovered as exp(out) (overwrite).
void log_softmax_backward(tensor& dx, const tensor& dout, const tensor& out);

/// Cross-entropy per row: losses (N) = logsumexp(logits[n]) - logits[n, targets[n]];
/// rows with target == ignore_index (-100, as torch) get 0. logits (N, V), targets (N) i32.
/// Returns the mean over non-ignored rows (0 if none) and writes their count to *n_valid.
/// A target outside [0, V) other than ignore_index throws std::out_of_range (forward and
/// backward). logits may have leading dims; targets and losses need N elements.
/// Numerically stable: max-subtracted logsumexp, sums in double.
double cross_entropy_forward(tensor& losses, const tensor& logits, const tensor& targets,
                             int64_t* n_valid = nullptr, int32_t ignore_index = -100);
/// dlogits (N, V) = (softmax(logits) - onehot(target)) * dloss (overwrite); ignored rows get 0.
/// For the mean loss pass dloss = 1 / n_valid. May run in place (dlogits == logits).
void cross_entropy_backward(tensor& dlogits, const tensor& logits, const tensor& targets, float dloss,
                            int32_t ignore_index = -100);

// ------------------------------------------------------------------ optimizer

/// AdamW settings (Loshchilov & Hutter 2019, Algorithm 2; torch.optim.AdamW).
struct adamw_config {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

/// The per-step scalars every backend's AdamW kernel uses (f32 element math, bias
/// corrections in double): 1 - beta1, 1 - beta2, 1 / (1 - beta1^t), 1 / sqrt(1 - beta2^t),
/// lr * weight_decay. With them one element is
///   m = b1 m + omb1 g; v = b2 v + omb2 g^2; p = (p - lr_wd p) - lr (m inv_bc1) / (sqrt(v) inv_sqrt_bc2 + eps).
struct adamw_coeffs {
  float omb1, omb2, inv_bc1, inv_sqrt_bc2, lr_wd;
  static adamw_coeffs of(const adamw_config& cfg, int64_t t) {
    const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), static_cast<double>(t));
    return {static_cast<float>(1.0 - static_cast<double>(cfg.beta1)),
            static_cast<float>(1.0 - static_cast<double>(cfg.beta2)), static_cast<float>(1.0 / bc1),
            static_cast<float>(1.0 / std::sqrt(bc2)),
            static_cast<float>(static_cast<double>(cfg.lr) * cfg.weight_decay)};
  }
};

/// One AdamW step at step number t (1-based) over flat f32 buffers of equal numel:
/// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mhat = m/(1-b1^t); vhat = v/(1-b2^t);
/// p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)  (p on the right is the old p;
/// identical to torch's p *= 1 - lr*wd then p -= lr*mhat/(sqrt(vhat)+eps)).
/// t < 1 throws std::invalid_argument. The CPU backend does the element math in f32 (vectorised;
/// within a few ulp of the float64 formula) with the bias corrections in double.
void adamw_step(tensor& param, const tensor& grad, tensor& m, tensor& v, int64_t t, const adamw_config& cfg);

/// Sum of squares of x, accumulated in double.
double sum_squares(const tensor& x);
/// sqrt(sum over tensors of sum_squares). Undefined tensors are skipped.
double global_norm(const std::vector<tensor>& xs);
/// If the global norm exceeds max_norm (> 0), scale all by max_norm / (norm + 1e-6)
/// (torch.nn.utils.clip_grad_norm_). Returns the norm before clipping.
double clip_grad_norm(std::vector<tensor>& grads, double max_norm);

}  // namespace flowrun::ops

namespace flowrun::ops {

/// The CPU threads the calling thread's kernels may use (its OpenMP team size,
/// which OpenBLAS follows too). Threads that each run a rank (in-process ZeRO
/// ranks) set cores / ranks so they do not oversubscribe the machine; the
/// setting is per calling thread (OpenMP's nthreads-var). n < 1 is taken as 1.
void set_thread_budget(int n);
/// The number of hardware threads of this machine.
int hardware_threads();
/// The op profiler (bench/bench_core --profile): wall time and calls per op
/// (the ops of this header, timed around validation + backend call; nested
/// calls count in the outermost op). Process-wide, off by default.
struct op_time {
  std::string op;
  int64_t calls = 0;
  double seconds = 0;
};
/// Clears the counts and starts timing.
void profile_start();
/// Stops timing; returns the counts, the most time first.
std::vector<op_time> profile_stop();

/// The CPU backend's GEMM library, its version and the kernels it runs on this
/// CPU (runtime/kernels/cpu/gemm.h), e.g. "oneDNN 2.6.3 dnnl_sgemm, ISA avx512_core".
std::string cpu_gemm_library();
/// Whether the CPU backend honours matmul_precision::bf16: a oneDNN build on a CPU with bf16
/// dot products (AVX512_BF16 or AMX; runtime/kernels/cpu/gemm_bf16.h). Where false it ignores
/// the setting and its products stay fp32. Fixed for the process.
bool cpu_bf16_matmul();

}  // namespace flowrun::ops
