// Helpers shared by the test suites: assets and the reference JSON.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "models/decoder.h"
#include "models/llama2c.h"
#include "models/lm_data.h"
#include "models/tokenizer.h"
#include "runtime/tensor/device_memory.h"
#include "runtime/kernels/ops.h"
#include "runtime/util/assets.h"

namespace flowrun::test {

/// Parse a JSON asset file (e.g. "ref/stories260K_forward_reference.json").
inline nlohmann::json load_json_asset(const std::string& rel) {
  std::ifstream f(asset_path(rel));
  return nlohmann::json::parse(f);
}

inline std::string model_path() { return asset_path("model/stories260K/stories260K.bin").string(); }
inline std::string model_v1_path() { return asset_path("model/stories260K/stories260K_v1.bin").string(); }
inline std::string tokenizer_path() { return asset_path("model/stories260K/tok512.model").string(); }

/// FLOWRUN_TEST_DEVICE=cpu: the CUDA suites run their "GPU" side on the CPU, a check of the
/// tests themselves (configs, tolerances) on machines without a GPU.
inline bool on_cpu_instead() {
  const char* e = std::getenv("FLOWRUN_TEST_DEVICE");
  return e && std::string(e) == "cpu";
}

/// The device the CUDA suites test: cuda:0, or the CPU under FLOWRUN_TEST_DEVICE=cpu.
inline device test_gpu() { return on_cpu_instead() ? device::cpu() : device::cuda(0); }

/// True when a CUDA case can run (a GPU, or FLOWRUN_TEST_DEVICE=cpu). Otherwise prints
/// "SUITE: no CUDA device: skipped" once per process and returns false.
inline bool need_gpu(const char* suite) {
  if (on_cpu_instead() || cuda_device_present()) return true;
  static bool said = false;
  if (!said) std::printf("%s: no CUDA device: skipped\n", suite);
  said = true;
  return false;
}

/// An 8-layer config of each family for random-init tests (gradient checkpointing):
/// LLaMA (RMSNorm, RoPE, SwiGLU, GQA), GPT-2 (pre-LayerNorm with bias, learned
/// positions, GELU, tied head) and OPT-350M's layout (ReLU, positions from 2,
/// post-LayerNorm, project_in/out, untied head). C = 64, H = 4, V = 64, max_seq_len 64.
inline model_config eight_layer_config(model_family f) {
  model_config c;
  c.family = f;
  c.dim = 64;
  c.n_layers = 8;
  c.n_heads = 4;
  c.vocab_size = 64;
  c.max_seq_len = 64;
  if (f == model_family::llama) {
    c.hidden_dim = 176;
    c.n_kv_heads = 2;
    return c;
  }
  c.hidden_dim = 256;
  c.n_kv_heads = 4;
  c.norm = norm_kind::layernorm;
  c.use_rope = false;
  c.gated_mlp = false;
  c.bias = true;
  c.act = ops::activation::gelu_tanh;
  if (f == model_family::opt) {
    c.act = ops::activation::relu;
    c.position_offset = 2;
    c.post_norm = true;
    c.embed_dim = 32;
    c.tied_embeddings = false;
  }
  return c;
}

/// stories260K (llama2.c file), loaded once per process.
inline const decoder& stories260k() {
  static decoder m = load_llama2c(model_path());
  return m;
}

/// The TinyStories head as a language-modelling dataset of 64-token rows (tok512),
/// built once per process: the ZeRO suites' training data.
inline const lm_dataset& tinystories_lm64() {
  static std::unique_ptr<tokenizer> tok = load_tokenizer(tokenizer_path());
  static lm_dataset d(asset_path("data/tinystories/tinystories_train_head.txt").string(), *tok, 64);
  return d;
}

/// Gradient norms of a LLaMA decoder grouped by llama2.c's stacked tensor names (emb, rms_att,
/// wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final), as the reference file groups them; sums
/// of squares in double (ops::sum_squares, so the gradients may live on any device).
inline std::map<std::string, double> grouped_grad_norms(decoder& m) {
  static const std::map<std::string, std::string> names = {
      {"input_layernorm.weight", "rms_att"},  {"self_attn.q_proj.weight", "wq"},
      {"self_attn.k_proj.weight", "wk"},      {"self_attn.v_proj.weight", "wv"},
      {"self_attn.o_proj.weight", "wo"},      {"post_attention_layernorm.weight", "rms_ffn"},
      {"mlp.gate_proj.weight", "w1"},         {"mlp.down_proj.weight", "w2"},
      {"mlp.up_proj.weight", "w3"}};
  std::map<std::string, double> sq;
  auto& g = m.grads();
  for (auto& e : m.params()) {
    std::string key;
    if (e.name == "model.embed_tokens.weight") key = "emb";
    else if (e.name == "model.norm.weight") key = "rms_final";
    else key = names.at(e.name.substr(e.name.find('.', std::string("model.layers.").size()) + 1));
    sq[key] += ops::sum_squares(g.by_name.at(e.name));
  }
  for (auto& [k, v] : sq) v = std::sqrt(v);
  return sq;
}

/// Plain AdamW on a decoder's base parameters: the reference the engine's optimizer is checked
/// against (Loshchilov & Hutter 2019, decoupled weight decay), one ops::adamw_step per named
/// parameter with no weight decay on norms and biases (param_entry::no_decay, GPT-2/LLaMA
/// practice). m, v: (n_params,) f32 moments on the parameters' device; t: the 1-based step.
inline void reference_adamw_step(decoder& model, tensor& m, tensor& v, int64_t t, ops::adamw_config c) {
  for (const auto& e : model.params()) {
    tensor p = model.w().flat.flat_view(e.offset, {e.numel});
    tensor g = model.grads().flat.flat_view(e.offset, {e.numel});
    tensor me = m.flat_view(e.offset, {e.numel}), ve = v.flat_view(e.offset, {e.numel});
    ops::adamw_config ce = c;
    if (e.no_decay) ce.weight_decay = 0.0f;
    ops::adamw_step(p, g, me, ve, t, ce);
  }
}

}  // namespace flowrun::test
