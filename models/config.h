// Decoder configuration: one decoder with switches for the LLaMA, OPT and
// GPT-2 families (docs/architecture.md, layer 3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/kernels/ops.h"

namespace flowrun {

enum class model_family : uint8_t { llama, opt, gpt2 };
enum class norm_kind : uint8_t { rmsnorm, layernorm };
/// RoPE frequency scaling (HF config.json "rope_scaling" / "rope_parameters" rope_type):
/// none ("default"), or Llama 3.1's "llama3" (see model_config::rope_inv_freq).
enum class rope_scaling_kind : uint8_t { none, llama3 };

/// Shape and switches of a decoder-only transformer.
///
/// LLaMA (Touvron et al. 2023): RMSNorm, RoPE, SwiGLU (gated MLP), no biases,
/// grouped-query attention, tied or untied classifier. Llama 3.x is the same with
/// rope_theta 500000 and (3.1+) llama3 RoPE scaling; Qwen2 / Qwen2.5 (HF
/// Qwen2ForCausalLM) is the same with biases on q_proj, k_proj and v_proj (qkv_bias).
/// OPT (Zhang et al. 2022) and GPT-2 (Radford et al. 2019): pre-LayerNorm with
/// bias, learned positions, ReLU/GELU MLP, biases on every Linear.
struct model_config {
  model_family family = model_family::llama;
  int64_t dim = 0;          ///< hidden size C (HF hidden_size)
  int64_t hidden_dim = 0;   ///< MLP width (HF intermediate_size / ffn_dim)
  int64_t n_layers = 0;     ///< HF num_hidden_layers
  int64_t n_heads = 0;      ///< HF num_attention_heads
  int64_t n_kv_heads = 0;   ///< HF num_key_value_heads (== n_heads without GQA)
  int64_t vocab_size = 0;   ///< rows of the embedding (may be padded, see `real_vocab_size`)
  int64_t real_vocab_size = 0;  ///< ids the tokenizer can produce (0 = vocab_size); padded rows are never sampled
  int64_t max_seq_len = 0;  ///< HF max_position_embeddings
  float norm_eps = 1e-5f;
  norm_kind norm = norm_kind::rmsnorm;
  float rope_theta = 10000.0f;
  ops::rope_layout rope = ops::rope_layout::adjacent;
  bool use_rope = true;            ///< false: learned absolute positions
  int64_t position_offset = 0;     ///< OPT's learned positions start at 2
  bool gated_mlp = true;           ///< SwiGLU (gate_proj, up_proj) vs a plain act(fc1)
  ops::activation act = ops::activation::silu;
  bool bias = false;               ///< biases on Linear layers and LayerNorm
  /// Biases on q_proj, k_proj and v_proj only, none on o_proj or the MLP (Qwen2's
  /// Qwen2Attention). Implied by `bias`.
  bool qkv_bias = false;
  /// RoPE scaling (rope_scaling_kind::llama3: transformers' _compute_llama3_parameters,
  /// modeling_rope_utils.py; Meta's llama3 apply_scaling). The four numbers are its
  /// factor, low_freq_factor, high_freq_factor and original_max_position_embeddings.
  rope_scaling_kind rope_scaling = rope_scaling_kind::none;
  float rope_factor = 8.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int64_t rope_original_max_pos = 8192;
  bool tied_embeddings = true;     ///< lm_head shares model.embed_tokens.weight
  /// Width of the token embedding and the LM head (HF OPT word_embed_proj_dim);
  /// 0 = dim. When it differs from dim, project_in (dim, embed_dim) follows the token
  /// embedding and project_out (embed_dim, dim) precedes the LM head (no biases).
  int64_t embed_dim = 0;
  /// Post-LayerNorm (OPT do_layer_norm_before = false): h = LN1(x + attn(x)),
  /// out = LN2(h + mlp(h)), and no final norm.
  bool post_norm = false;

  int64_t head_dim() const { return dim / n_heads; }
  int64_t embed_width() const { return embed_dim > 0 ? embed_dim : dim; }
  bool has_projection() const { return embed_width() != dim; }
  int64_t vocab_limit() const { return real_vocab_size > 0 ? real_vocab_size : vocab_size; }
  /// Whether q_proj / k_proj / v_proj have biases (bias or qkv_bias).
  bool has_qkv_bias() const { return bias || qkv_bias; }
  /// RoPE's inverse frequencies (head_dim() / 2,) f32: inv_freq[i] = 1 / theta^(2i / hs)
  /// (computed in f32 as transformers' and ops::rope_forward do), then with llama3 scaling,
  /// per transformers' _compute_llama3_parameters (all in f32): wavelen = 2π / inv_freq;
  /// wavelen > original / low_freq_factor: inv_freq / factor; wavelen < original /
  /// high_freq_factor: unchanged; in between: (1 - s) inv_freq / factor + s inv_freq with
  /// s = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor).
  std::vector<float> rope_inv_freq() const;
  /// Throws std::invalid_argument naming the bad field: a size <= 0, heads that do not
  /// divide dim (or kv heads n_heads), an odd RoPE head_dim, llama3 RoPE scaling with a
  /// factor <= 0, low_freq_factor >= high_freq_factor or original_max_position_embeddings
  /// <= 0, a size above 2^31 or sizes
  /// that give more than 2^48 parameters (a corrupt header: num_parameters() would overflow).
  void validate() const;
  /// Parameters counted as stored (tied embeddings once).
  int64_t num_parameters() const;
  std::string summary() const;
};

/// The stories260K shape (llama2.c's smallest model) for random-init tests.
model_config stories260k_config();
/// GPT-2 124M (Radford et al. 2019; HF gpt2, llm.c's GPT-2 small): 12 layers, 768 wide,
/// 12 heads, vocabulary 50257, 1024 learned positions, pre-LayerNorm with bias, GELU
/// (tanh), plain MLP 3072, biases on every Linear, head tied to the embedding. For
/// random-weight benchmarks (bench_core, bench_cuda).
model_config gpt2_124m_config();
/// A LLaMA config of about 124M parameters (12 layers, 768 wide, vocab 32000).
model_config llama_124m_config();

/// JSON (our own keys, close to HF's config.json names) for checkpoints.
void to_json(nlohmann::json& j, const model_config& c);
void from_json(const nlohmann::json& j, model_config& c);

}  // namespace flowrun
