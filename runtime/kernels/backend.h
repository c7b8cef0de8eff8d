// The backend interface (one per device kind), as in ggml's ggml-backend.
//
// ops.cpp validates shapes, and the values of index tensors (token ids in range,
// cross-entropy targets in range or ignore_index), then calls the backend of the
// tensors' device. A backend implements every op for already-validated,
// contiguous tensors.
// The CPU backend lives in runtime/kernels/cpu; a CUDA backend in
// runtime/kernels/cuda registers itself with `register_backend` at start-up.
// Per-op parity tests run every registered backend against the CPU one.
#pragma once

#include "runtime/kernels/ops.h"

namespace flowrun {

class backend {
 public:
  virtual ~backend() = default;
  virtual const char* name() const = 0;

  virtual void add(tensor& out, const tensor& a, const tensor& b) = 0;
  virtual void axpy(tensor& y, const tensor& x, float alpha) = 0;
  virtual void scale(tensor& x, float s) = 0;
  virtual void fill(tensor& x, float v) = 0;

  /// Plain 2-D GEMM on raw row-major pointers of this device:
  /// C (M, N) = alpha op(A) op(B) + beta C, lda/ldb/ldc are row strides.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) = 0;
  /// Strided batched GEMM; strides are in elements.
  virtual void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                            const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                            int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                            int64_t batch) = 0;
  /// out (N, C) += bias (C) broadcast over rows.
  virtual void add_bias(tensor& out, const tensor& bias) = 0;
  /// dbias (C) += column sums of dout (N, C).
  virtual void bias_backward(tensor& dbias, const tensor& dout) = 0;

  virtual void embedding_forward(tensor& out, const tensor& ids, const tensor& wte) = 0;
  virtual void embedding_backward(tensor& dwte, const tensor& dout, const tensor& ids) = 0;

  virtual void rmsnorm_forward(tensor& out, tensor& rstd, const tensor& x, const tensor& w, float eps) = 0;
  virtual void rmsnorm_backward(tensor& dx, tensor& dw, const tensor& dout, const tensor& x, const tensor& w,
                                const tensor& rstd) = 0;
  virtual void layernorm_forward(tensor& out, tensor& mean, tensor& rstd, const tensor& x, const tensor& w,
                                 const tensor& b, float eps) = 0;
  virtual void layernorm_backward(tensor& dx, tensor& dw, tensor& db, const tensor& dout, const tensor& x,
                                  const tensor& w, const tensor& mean, const tensor& rstd) = 0;

  virtual void activation_forward(tensor& out, const tensor& x, ops::activation a) = 0;
  virtual void activation_backward(tensor& dx, const tensor& dout, const tensor& x, ops::activation a) = 0;
  virtual void swiglu_forward(tensor& out, const tensor& gate, const tensor& up) = 0;
  virtual void swiglu_backward(tensor& dgate, tensor& dup, const tensor& dout, const tensor& gate,
                               const tensor& up) = 0;

  virtual void rope(tensor& x, const tensor& positions, float theta, ops::rope_layout layout, bool inverse) = 0;

  virtual void attention_forward(tensor& out, tensor& att, const tensor& q, const tensor& k, const tensor& v,
                                 const tensor& attn_mask, int64_t n_keys) = 0;
  virtual void attention_backward(tensor& dq, tensor& dk, tensor& dv, const tensor& dout, const tensor& q,
                                  const tensor& k, const tensor& v, const tensor& att) = 0;

  virtual void softmax_forward(tensor& out, const tensor& x, bool log) = 0;
  virtual void softmax_backward(tensor& dx, const tensor& dout, const tensor& out, bool log) = 0;
  virtual double cross_entropy_forward(tensor& losses, const tensor& logits, const tensor& targets,
                                       int64_t* n_valid, int32_t ignore_index) = 0;
  virtual void cross_entropy_backward(tensor& dlogits, const tensor& logits, const tensor& targets, float dloss,
                                      int32_t ignore_index) = 0;

  virtual void adamw_step(tensor& param, const tensor& grad, tensor& m, tensor& v, int64_t t,
                          const ops::adamw_config& cfg) = 0;
  virtual double sum_squares(const tensor& x) = 0;
};

/// The backend for a device kind. Throws std::runtime_error if none is registered
/// (a CUDA tensor in a build without CUDA).
backend& backend_for(device d);
/// Called by a backend's start-up code.
void register_backend(device_kind k, backend* b);
/// The CPU backend (always present).
backend& cpu_backend();

}  // namespace flowrun
