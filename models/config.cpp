#include "models/config.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace flowrun {

void model_config::validate() const {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw std::invalid_argument("model config: " + msg);
  };
  need(dim > 0, "dim (hidden_size) must be > 0");
  need(hidden_dim > 0, "hidden_dim (intermediate_size) must be > 0");
  need(n_layers > 0, "n_layers must be > 0");
  need(n_heads > 0 && dim % n_heads == 0,
       "n_heads must divide dim (dim " + std::to_string(dim) + ", n_heads " + std::to_string(n_heads) + ")");
  need(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
       "n_kv_heads must divide n_heads (" + std::to_string(n_heads) + " / " + std::to_string(n_kv_heads) + ")");
  need(vocab_size > 0, "vocab_size must be > 0");
  need(real_vocab_size <= vocab_size, "real_vocab_size " + std::to_string(real_vocab_size) +
                                          " exceeds the embedding rows vocab_size " + std::to_string(vocab_size));
  need(max_seq_len > 0, "max_seq_len must be > 0");
  // the norm divides by sqrt(mean + eps): a negative or NaN eps gives NaN on a zero row
  need(norm_eps > 0.0f && std::isfinite(norm_eps),
       "norm_eps (rms_norm_eps, layer_norm_epsilon) must be a positive number, got " + std::to_string(norm_eps));
  need(!use_rope || head_dim() % 2 == 0, "RoPE needs an even head_dim");
  if (rope_scaling == rope_scaling_kind::llama3) {
    need(use_rope, "llama3 RoPE scaling needs RoPE");
    need(rope_factor > 0.0f, "rope_scaling factor must be > 0, got " + std::to_string(rope_factor));
    need(rope_low_freq_factor > 0.0f && rope_low_freq_factor < rope_high_freq_factor,
         "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got " + std::to_string(rope_low_freq_factor) +
             " and " + std::to_string(rope_high_freq_factor));
    need(rope_original_max_pos > 0, "rope_scaling original_max_position_embeddings must be > 0");
  }
  need(embed_dim >= 0, "embed_dim (word_embed_proj_dim) must be >= 0 (0: same as dim)");
  // Sizes come from file headers and config.json: a corrupt or hostile one must be refused here, before
  // num_parameters() (whose int64 products would overflow) or any allocation. Real models are far inside
  // these bounds (e.g. vocab 256K = 2^18, dim 16K = 2^14, 2^40 parameters).
  constexpr int64_t k_max_size = int64_t{1} << 31;
  for (const auto& [what, v] : {std::pair<const char*, int64_t>{"dim", dim}, {"hidden_dim", hidden_dim},
                                {"n_layers", n_layers}, {"vocab_size", vocab_size}, {"max_seq_len", max_seq_len},
                                {"embed_dim", embed_dim}, {"position_offset", position_offset}})
    need(v <= k_max_size, std::string(what) + " " + std::to_string(v) + " is larger than 2^31 (a corrupt header?)");
  const double C = static_cast<double>(dim), H = static_cast<double>(hidden_dim), L = static_cast<double>(n_layers),
               E = static_cast<double>(embed_width()), V = static_cast<double>(vocab_size),
               P = static_cast<double>(max_seq_len + position_offset);
  const double approx = 2 * V * E + L * (4 * C * C + 3 * H * C + 6 * C + 2 * H) + P * C + 2 * E * C + 2 * C;
  need(approx <= 0x1p48, "the sizes (" + std::to_string(dim) + " wide, " + std::to_string(n_layers) + " layers, MLP " +
                             std::to_string(hidden_dim) + ", vocab " + std::to_string(vocab_size) + ") give about " +
                             std::to_string(approx) + " parameters, more than 2^48 (a corrupt header?)");
}

int64_t model_config::num_parameters() const {
  int64_t C = dim, hs = head_dim(), kv = n_kv_heads * hs, b = bias ? 1 : 0;
  int64_t norm_p = norm == norm_kind::layernorm && bias ? 2 * C : C;
  const int64_t qb = has_qkv_bias() ? 1 : 0;
  int64_t attn = C * C + qb * C + 2 * (kv * C + qb * kv) + C * C + b * C;
  int64_t mlp = (gated_mlp ? 2 : 1) * (hidden_dim * C + b * hidden_dim) + C * hidden_dim + b * C;
  const int64_t E = embed_width();
  int64_t n = vocab_size * E + n_layers * (2 * norm_p + attn + mlp) + (post_norm ? 0 : norm_p);
  if (has_projection()) n += 2 * E * C;
  if (!use_rope) n += (max_seq_len + position_offset) * C;
  if (!tied_embeddings) n += vocab_size * E;
  return n;
}

std::string model_config::summary() const {
  std::ostringstream os;
  const char* fam = family == model_family::llama ? "llama" : family == model_family::opt ? "opt" : "gpt2";
  os << fam << " dim=" << dim << " hidden=" << hidden_dim << " layers=" << n_layers << " heads=" << n_heads
     << " kv_heads=" << n_kv_heads << " vocab=" << vocab_size << " seq=" << max_seq_len
     << " params=" << num_parameters();
  if (has_projection()) os << " embed_dim=" << embed_dim;
  if (post_norm) os << " post_norm";
  if (qkv_bias && !bias) os << " qkv_bias";
  if (rope_scaling == rope_scaling_kind::llama3) os << " rope_scaling=llama3(factor " << rope_factor << ")";
  return os.str();
}

std::vector<float> model_config::rope_inv_freq() const {
  const int64_t hs = head_dim();
  std::vector<float> f(static_cast<size_t>(hs / 2));
  for (int64_t i = 0; i < hs / 2; ++i)  // as ops::rope_forward and HF's inv_freq (f32 throughout)
    f[i] = 1.0f / powf(rope_theta, static_cast<float>(2 * i) / static_cast<float>(hs));
  if (rope_scaling != rope_scaling_kind::llama3) return f;
  // transformers modeling_rope_utils.py _compute_llama3_parameters, in f32 like torch
  const float old_ctx = static_cast<float>(rope_original_max_pos);
  const float low_wavelen = old_ctx / rope_low_freq_factor, high_wavelen = old_ctx / rope_high_freq_factor;
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  for (auto& x : f) {
    const float wavelen = two_pi * (1.0f / x);  // torch: 2π / t is t.reciprocal() * 2π
    if (wavelen > low_wavelen) {
      x = x / rope_factor;
    } else if (!(wavelen < high_wavelen)) {  // medium: interpolate
      const float s = (old_ctx * (1.0f / wavelen) - rope_low_freq_factor) / (rope_high_freq_factor - rope_low_freq_factor);
      x = (1.0f - s) * x / rope_factor + s * x;
    }
  }
  return f;
}

model_config stories260k_config() {
  model_config c;
  c.dim = 64;
  c.hidden_dim = 172;
  c.n_layers = 5;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.vocab_size = 512;
  c.max_seq_len = 512;
  return c;
}

model_config gpt2_124m_config() {
  model_config c;
  c.family = model_family::gpt2;
  c.dim = 768;
  c.hidden_dim = 3072;
  c.n_layers = 12;
  c.n_heads = 12;
  c.n_kv_heads = 12;
  c.vocab_size = 50257;
  c.max_seq_len = 1024;
  c.norm = norm_kind::layernorm;
  c.norm_eps = 1e-5f;
  c.use_rope = false;
  c.position_offset = 0;
  c.gated_mlp = false;
  c.act = ops::activation::gelu_tanh;
  c.bias = true;
  c.tied_embeddings = true;
  return c;
}

model_config llama_124m_config() {
  model_config c;
  c.dim = 768;
  c.hidden_dim = 2048;
  c.n_layers = 12;
  c.n_heads = 12;
  c.n_kv_heads = 12;
  c.vocab_size = 32000;
  c.max_seq_len = 1024;
  return c;
}

static const char* family_name(model_family f) {
  return f == model_family::llama ? "llama" : f == model_family::opt ? "opt" : "gpt2";
}

void to_json(nlohmann::json& j, const model_config& c) {
  j = nlohmann::json{{"model_type", family_name(c.family)},
                     {"hidden_size", c.dim},
                     {"intermediate_size", c.hidden_dim},
                     {"num_hidden_layers", c.n_layers},
                     {"num_attention_heads", c.n_heads},
                     {"num_key_value_heads", c.n_kv_heads},
                     {"vocab_size", c.vocab_size},
                     {"real_vocab_size", c.vocab_limit()},
                     {"max_position_embeddings", c.max_seq_len},
                     {"norm_eps", c.norm_eps},
                     {"norm", c.norm == norm_kind::rmsnorm ? "rmsnorm" : "layernorm"},
                     {"rope_theta", c.rope_theta},
                     {"rope_layout", c.rope == ops::rope_layout::adjacent ? "adjacent" : "half"},
                     {"use_rope", c.use_rope},
                     {"position_offset", c.position_offset},
                     {"gated_mlp", c.gated_mlp},
                     {"hidden_act", ops::activation_name(c.act)},
                     {"bias", c.bias},
                     {"tie_word_embeddings", c.tied_embeddings}};
  if (c.has_projection()) j["embed_dim"] = c.embed_dim;
  if (c.post_norm) j["post_norm"] = true;
  if (c.qkv_bias) j["qkv_bias"] = true;
  if (c.rope_scaling == rope_scaling_kind::llama3)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_max_pos}};
}

void from_json(const nlohmann::json& j, model_config& c) {
  std::string fam = j.value("model_type", "llama");
  c.family = fam == "opt" ? model_family::opt : fam == "gpt2" ? model_family::gpt2 : model_family::llama;
  c.dim = j.at("hidden_size");
  c.hidden_dim = j.at("intermediate_size");
  c.n_layers = j.at("num_hidden_layers");
  c.n_heads = j.at("num_attention_heads");
  c.n_kv_heads = j.value("num_key_value_heads", c.n_heads);
  c.vocab_size = j.at("vocab_size");
  c.real_vocab_size = j.value("real_vocab_size", c.vocab_size);
  c.max_seq_len = j.at("max_position_embeddings");
  c.norm_eps = j.value("norm_eps", 1e-5f);
  c.norm = j.value("norm", "rmsnorm") == "layernorm" ? norm_kind::layernorm : norm_kind::rmsnorm;
  c.rope_theta = j.value("rope_theta", 10000.0f);
  c.rope = j.value("rope_layout", "adjacent") == "half" ? ops::rope_layout::half : ops::rope_layout::adjacent;
  c.use_rope = j.value("use_rope", true);
  c.position_offset = j.value("position_offset", 0);
  c.gated_mlp = j.value("gated_mlp", true);
  std::string act = j.value("hidden_act", "silu");
  c.act = act == "relu" ? ops::activation::relu : act == "gelu_tanh" ? ops::activation::gelu_tanh : ops::activation::silu;
  c.bias = j.value("bias", false);
  c.tied_embeddings = j.value("tie_word_embeddings", true);
  c.embed_dim = j.value("embed_dim", int64_t{0});
  c.post_norm = j.value("post_norm", false);
  c.qkv_bias = j.value("qkv_bias", false);
  if (j.contains("rope_scaling")) {
    const auto& rs = j.at("rope_scaling");
    const std::string type = rs.value("rope_type", std::string("llama3"));
    if (type != "llama3")
      throw std::invalid_argument("model config: rope_scaling type \"" + type + "\" is not supported (only llama3)");
    c.rope_scaling = rope_scaling_kind::llama3;
    c.rope_factor = rs.at("factor");
    c.rope_low_freq_factor = rs.at("low_freq_factor");
    c.rope_high_freq_factor = rs.at("high_freq_factor");
    c.rope_original_max_pos = rs.at("original_max_position_embeddings");
  }
  c.validate();
}

}  // namespace flowrun
