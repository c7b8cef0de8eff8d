// The decoder-only transformer (LLaMA / OPT / GPT-2 by config switches),
// written as explicit per-layer forward and backward passes, llm.c style.
//
// Parameters live in ONE flat f32 buffer; each named parameter (Hugging Face
// LlamaForCausalLM names, e.g. "model.layers.0.self_attn.q_proj.weight") is a
// view into it. Gradients mirror the layout in a second flat buffer. This makes
// AdamW one pass, the global norm one reduction, and ZeRO shards plain ranges.
//
// Shapes: B batch, T time, C = dim, H heads, KV kv heads, hs = C / H,
// F = hidden_dim, V = vocab_size.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/config.h"
#include "runtime/tensor/tensor.h"

namespace flowrun {

/// One named parameter: a view into the flat buffer.
struct param_entry {
  std::string name;
  shape_t shape;
  int64_t offset = 0;  ///< in elements, into the flat buffer
  int64_t numel = 0;
  bool no_decay = false;  ///< norms and biases: no weight decay (GPT-2/LLaMA practice)
};

/// Views of one decoder layer's weights (undefined when the config has no such tensor).
struct layer_weights {
  tensor ln1_w, ln1_b;           ///< input_layernorm (C)
  tensor wq, bq, wk, bk, wv, bv; ///< q_proj (H*hs, C), k_proj/v_proj (KV*hs, C)
  tensor wo, bo;                 ///< o_proj (C, H*hs)
  tensor ln2_w, ln2_b;           ///< post_attention_layernorm (C)
  tensor w_gate, b_gate;         ///< mlp.gate_proj (F, C), gated MLP only
  tensor w_up, b_up;             ///< mlp.up_proj (F, C) (OPT fc1, GPT-2 c_fc)
  tensor w_down, b_down;         ///< mlp.down_proj (C, F)
};

/// All weights (or all gradients: same structure over the gradient buffer).
struct weights {
  tensor flat;                   ///< (n_params,)
  tensor wte;                    ///< model.embed_tokens.weight (V, C)
  tensor wpe;                    ///< model.embed_positions.weight (P, C), learned positions only
  std::vector<layer_weights> layers;
  tensor lnf_w, lnf_b;           ///< model.norm (C)
  tensor lm_head;                ///< lm_head.weight (V, C); == wte view when tied
  std::map<std::string, tensor> by_name;
};

/// Saved activations of one training forward pass.
struct activations {
  int64_t B = 0, T = 0;
  tensor ids, targets, positions, mask;  ///< (B, T) i32; mask may be undefined
  std::vector<tensor> resid;  ///< n_layers + 1 residual streams (B, T, C); resid[0] = embeddings
  struct layer {
    tensor ln1, ln1_mean, ln1_rstd;   // (B,T,C), (B*T), (B*T)
    tensor q, k, v;                   // (B,T,H,hs), (B,T,KV,hs), (B,T,KV,hs) after RoPE
    tensor att;                       // (B,H,T,T) probabilities
    tensor atty;                      // (B,T,C) attention output before o_proj
    tensor resid2;                    // (B,T,C) after the attention residual
    tensor ln2, ln2_mean, ln2_rstd;
    tensor gate, up, act;             // (B,T,F): gate/up pre-activation, act = MLP hidden
  };
  std::vector<layer> layers;
  tensor lnf, lnf_mean, lnf_rstd;  // (B,T,C)
  tensor logits;                   // (B,T,V)
  tensor losses;                   // (B*T)
  int64_t n_valid = 0;
  /// Gradient scratch for backward, sized with the activations.
  tensor dlogits, dlnf, dres, dln, dact, dgate, dup, datty, dq, dk, dv;  // (B*T, ...) each
};

/// A KV cache for incremental decoding: per layer k, v of shape (B, S, KV, hs).
struct kv_cache {
  int64_t B = 0, S = 0;
  std::vector<tensor> k, v;
};

/// The decoder model: config, weights, gradients and AdamW state.
class decoder {
 public:
  decoder() = default;
  /// Allocates zeroed weights for `cfg` on `dev`. Throws std::invalid_argument on a bad config.
  explicit decoder(const model_config& cfg, device dev = device::cpu());

  const model_config& config() const { return cfg_; }
  const std::vector<param_entry>& params() const { return entries_; }
  weights& w() { return w_; }
  const weights& w() const { return w_; }
  /// Gradients (allocated on first use by `zero_grad`).
  weights& grads() { return g_; }
  int64_t num_parameters() const { return n_params_; }
  /// A parameter by HF name; throws std::out_of_range naming it.
  tensor& param(const std::string& name);

  /// GPT-2-style random init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
  /// norms 1, biases 0. Deterministic for a seed.
  void init_random(uint64_t seed);

  /// Training forward. ids, targets (B, T) i32 (targets may be undefined: no loss;
  /// -100 entries are ignored). mask (B, T) i32 may be undefined (no padding);
  /// positions (B, T) i32 may be undefined (0..T-1, or from the mask's cumsum when
  /// a mask is given, as HF does for left padding). Returns the mean loss (0 without targets).
  double forward(activations& a, const tensor& ids, const tensor& targets, const tensor& mask = {},
                 const tensor& positions = {});
  /// Backward of the mean cross-entropy of the last forward; accumulates into grads().
  /// `dlogits` may be given instead (B, T, V) for other losses (then targets are unused).
  void backward(activations& a, const tensor& dlogits = {});
  /// Zero the gradient buffer (allocating it on first use).
  void zero_grad();

  /// Incremental decode: run `ids` (B, Tq) i32 at positions `positions` (B, Tq) through the
  /// model using and extending `cache` from n_past; mask (B, n_past + Tq) may be undefined.
  /// Returns logits (B, Tq, V) when all_logits, else the last position's (B, V).
  tensor forward_cached(kv_cache& cache, const tensor& ids, const tensor& positions, const tensor& mask,
                        int64_t n_past, bool all_logits = false);
  kv_cache make_cache(int64_t B, int64_t S) const;

 private:
  void bind(weights& dst, const tensor& flat);
  void norm_forward(tensor& out, tensor& mean, tensor& rstd, const tensor& x, const tensor& w, const tensor& b);
  void norm_backward(tensor& dx, tensor& dw, tensor& db, const tensor& dout, const tensor& x, const tensor& w,
                     const tensor& mean, const tensor& rstd);

  model_config cfg_;
  device dev_;
  std::vector<param_entry> entries_;
  int64_t n_params_ = 0;
  weights w_, g_;
};

/// AdamW over a decoder's flat buffers, with no weight decay on norms and biases.
class adamw_optimizer {
 public:
  adamw_optimizer(decoder& model, const ops::adamw_config& cfg);
  /// One step with the gradients in model.grads(); `lr` overrides cfg.lr when >= 0.
  void step(float lr = -1.0f);
  int64_t step_count() const { return t_; }
  tensor& m() { return m_; }
  tensor& v() { return v_; }

 private:
  decoder& model_;
  ops::adamw_config cfg_;
  tensor m_, v_;
  int64_t t_ = 0;
};

}  // namespace flowrun
