// Helpers shared by the test suites: assets and the reference JSON.
#pragma once

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "models/decoder.h"
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

}  // namespace flowrun::test
