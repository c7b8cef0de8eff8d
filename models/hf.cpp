#include "models/hf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <stdexcept>

#include "models/safetensors.h"
#include "models/tokenizer.h"

namespace flowrun {

namespace fs = std::filesystem;

namespace {

const char* family_str(model_family f) {
  return f == model_family::llama ? "llama" : f == model_family::opt ? "opt" : "gpt2";
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// ---- config.json readers with errors naming the file and the key

struct json_reader {
  const nlohmann::json& j;
  const std::string& where;
  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t i(const char* k) const {
    if (!has(k)) throw std::runtime_error(where + ": missing \"" + k + "\"");
    if (!j[k].is_number_integer()) throw std::runtime_error(where + ": \"" + k + "\" is not an integer: " + j[k].dump());
    return j[k].get<int64_t>();
  }
  int64_t i(const char* k, int64_t def) const { return has(k) ? i(k) : def; }
  double f(const char* k, double def) const {
    if (!has(k)) return def;
    if (!j[k].is_number()) throw std::runtime_error(where + ": \"" + k + "\" is not a number: " + j[k].dump());
    return j[k].get<double>();
  }
  bool b(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) throw std::runtime_error(where + ": \"" + k + "\" is not true/false: " + j[k].dump());
    return j[k].get<bool>();
  }
  std::string s(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j[k].is_string()) throw std::runtime_error(where + ": \"" + k + "\" is not a string: " + j[k].dump());
    return j[k].get<std::string>();
  }
};

// transformers' ACT2FN names (activations.py) flowrun computes exactly.
ops::activation hf_activation(const std::string& name, const std::string& where, const char* key) {
  if (name == "relu") return ops::activation::relu;
  if (name == "silu" || name == "swish") return ops::activation::silu;
  // NewGELUActivation, PytorchGELUTanh and FastGELUActivation are all the tanh approximation
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast") return ops::activation::gelu_tanh;
  throw std::runtime_error(where + ": \"" + key + "\": \"" + name +
                           "\" is not supported; flowrun has relu, silu and the tanh-approximated GELU "
                           "(gelu_new / gelu_pytorch_tanh)" +
                           (name == "gelu" ? std::string(" (\"gelu\" is the exact erf GELU)") : std::string()));
}

void unsupported(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what + " is not supported yet by flowrun's decoder");
}

// ---- tensors

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

// dst (Cc, R) = transpose of src (R, Cc), both row-major.
void transpose_into(float* dst, const float* src, int64_t R, int64_t Cc) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < Cc; ++c) dst[c * R + r] = src[r * Cc + c];
}

// A float as the shortest decimal that reads back as the same float (1e-05, not
// 9.999999747378752e-06), for config.json.
double short_float(float f) {
  char buf[32];
  for (int prec = 6; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

decoder relayout_rope(const decoder& model, ops::rope_layout target) {
  model_config c = model.config();
  if (!c.use_rope)
    throw std::invalid_argument("RoPE layout conversion: " + c.summary() + " has learned positions, not RoPE");
  if (c.rope == target) return clone_decoder(model, model.w().flat.dev());
  const bool to_half = target == ops::rope_layout::half;
  auto host = model.w().flat.to(device::cpu()).clone();
  float* p = host.data<float>();
  const int64_t hs = c.head_dim();
  for (const auto& e : model.params()) {
    auto ends = [&](const char* suf) {
      std::string s(suf);
      return e.name.size() > s.size() && e.name.compare(e.name.size() - s.size(), s.size(), s) == 0;
    };
    bool q = ends("self_attn.q_proj.weight") || ends("self_attn.q_proj.bias");
    bool k = ends("self_attn.k_proj.weight") || ends("self_attn.k_proj.bias");
    if (!q && !k) continue;
    int64_t nh = q ? c.n_heads : c.n_kv_heads;
    permute_heads(p + e.offset, nh, hs, e.numel / (nh * hs), to_half);
  }
  c.rope = target;
  decoder out(c, model.w().flat.dev());
  out.w().flat.copy_from(host.to(out.w().flat.dev()));
  return out;
}

// Name a checkpoint of the base model (no LM head wrapper) as the CausalLM one.
std::string normalize_name(model_family f, const std::string& n) {
  if (n == "lm_head.weight" || n == "v_head.weight") return n;
  switch (f) {
    case model_family::llama: return starts_with(n, "model.") ? n : "model." + n;
    case model_family::opt: return starts_with(n, "decoder.") ? "model." + n : n;
    case model_family::gpt2: return starts_with(n, "transformer.") ? n : "transformer." + n;
  }
  return n;
}

// Buffers some checkpoints hold that are not parameters.
const std::string k_value_head_name = "v_head.weight";

bool ignorable(const model_config& c, const std::string& n) {
  static const std::regex gpt2_buf(R"(transformer\.h\.\d+\.attn\.(bias|masked_bias))");
  static const std::regex llama_buf(R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  if (n == "lm_head.weight" && c.tied_embeddings) return true;
  if (c.family == model_family::gpt2) return std::regex_match(n, gpt2_buf);
  if (c.family == model_family::llama) return std::regex_match(n, llama_buf);
  return false;
}

std::string list_names(const std::vector<std::string>& v, size_t max = 12) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > max) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

// The size of a tokenizer stored in an HF folder, or -1 when there is none.
int64_t folder_tokenizer_size(const fs::path& dir) {
  if (!folder_has_tokenizer(dir.string())) return -1;
  try {
    return load_tokenizer(dir.string())->vocab_size();
  } catch (const std::exception& e) {
    throw std::runtime_error(dir.string() + ": cannot read the tokenizer in the folder to find the real vocabulary "
                                            "size (" + e.what() + "); fix or remove it, or set "
                                            "\"flowrun_real_vocab_size\" in config.json");
  }
}

}  // namespace

void permute_heads(float* w, int64_t n_heads, int64_t hs, int64_t cols, bool to_half) {
  std::vector<float> tmp(static_cast<size_t>(hs * cols));
  for (int64_t h = 0; h < n_heads; ++h) {
    float* base = w + h * hs * cols;
    for (int64_t i = 0; i < hs / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        int64_t adj = 2 * i + j, half = j * (hs / 2) + i;
        int64_t from = to_half ? adj : half, to = to_half ? half : adj;
        std::copy(base + from * cols, base + (from + 1) * cols, tmp.data() + to * cols);
      }
    std::copy(tmp.begin(), tmp.end(), base);
  }
}


// ------------------------------------------------------------------ config.json

model_config hf_config_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::runtime_error(where + ": not a JSON object");
  json_reader r{j, where};
  const std::string mt = r.s("model_type", "");
  model_config c;
  // The architectures flowrun reads, by model_type: LLaMA-style decoders (LlamaForCausalLM: LLaMA 1/2,
  // Llama 3.x with llama3 RoPE scaling; Qwen2ForCausalLM: Qwen2 / Qwen2.5, the same with q/k/v biases),
  // OPT and GPT-2.
  static const char* const k_supported =
      "LlamaForCausalLM (model_type \"llama\": LLaMA 1/2, Llama 3.x), Qwen2ForCausalLM (\"qwen2\": Qwen2, "
      "Qwen2.5), OPTForCausalLM (\"opt\") and GPT2LMHeadModel (\"gpt2\"), and their ForSequenceClassification "
      "reward models with one label (TRL's)";
  if (r.has("architectures")) {
    // *ForSequenceClassification: TRL's reward models (score.weight read as DS-Chat's v_head, load_hf)
    static const std::set<std::string> known = {"LlamaForCausalLM", "Qwen2ForCausalLM", "OPTForCausalLM",
                                                "GPT2LMHeadModel", "LlamaModel", "Qwen2Model", "OPTModel",
                                                "GPT2Model", "LlamaForSequenceClassification",
                                                "Qwen2ForSequenceClassification", "OPTForSequenceClassification",
                                                "GPT2ForSequenceClassification"};
    const auto& a = j["architectures"];
    if (!a.is_array()) throw std::runtime_error(where + ": \"architectures\" is not a list: " + a.dump());
    for (const auto& x : a)
      if (!x.is_string() || !known.count(x.get<std::string>()))
        throw std::runtime_error(where + ": architecture " + x.dump() + " (model_type \"" + mt +
                                 "\") is not supported; flowrun's decoder runs " + k_supported);
  }
  if (mt == "llama" || mt == "qwen2") {
    const bool qwen2 = mt == "qwen2";
    c.family = model_family::llama;
    c.dim = r.i("hidden_size");
    c.hidden_dim = r.i("intermediate_size");
    c.n_layers = r.i("num_hidden_layers");
    c.n_heads = r.i("num_attention_heads");
    c.n_kv_heads = r.i("num_key_value_heads", c.n_heads);
    c.vocab_size = r.i("vocab_size");
    c.max_seq_len = r.i("max_position_embeddings", qwen2 ? 32768 : 2048);
    c.norm_eps = static_cast<float>(r.f("rms_norm_eps", 1e-6));
    c.norm = norm_kind::rmsnorm;
    // transformers < 5 writes "rope_theta" and "rope_scaling" (null, or {"rope_type"/"type": "llama3", ...});
    // transformers 5 writes "rope_parameters": {"rope_theta": ..., "rope_type": "default" | "llama3", ...}
    double theta = r.f("rope_theta", 10000.0);
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      if (!r.has(key)) continue;
      const auto& rp = j[key];
      if (!rp.is_object()) throw std::runtime_error(where + ": \"" + key + "\" is not an object: " + rp.dump());
      json_reader rr{rp, where};
      std::string type = rr.s("rope_type", rr.s("type", "default"));
      theta = rr.f("rope_theta", theta);
      if (type == "default") continue;
      if (type != "llama3")
        throw std::runtime_error(where + ": \"" + key + "\" rope_type \"" + type +
                                 "\" is not supported; flowrun's decoder has \"default\" RoPE and \"llama3\" "
                                 "scaling (Llama 3.1+); see " + rp.dump());
      auto num = [&](const char* k) {
        if (!rr.has(k)) throw std::runtime_error(where + ": \"" + key + "\" (llama3 RoPE scaling) lacks \"" + k + "\"");
        return rr.f(k, 0.0);
      };
      c.rope_scaling = rope_scaling_kind::llama3;
      c.rope_factor = static_cast<float>(num("factor"));
      c.rope_low_freq_factor = static_cast<float>(num("low_freq_factor"));
      c.rope_high_freq_factor = static_cast<float>(num("high_freq_factor"));
      if (!rr.has("original_max_position_embeddings") && !r.has("original_max_position_embeddings"))
        throw std::runtime_error(where + ": \"" + key + "\" (llama3 RoPE scaling) lacks "
                                 "\"original_max_position_embeddings\"");
      c.rope_original_max_pos = rr.has("original_max_position_embeddings") ? rr.i("original_max_position_embeddings")
                                                                           : r.i("original_max_position_embeddings");
    }
    c.rope_theta = static_cast<float>(theta);
    c.rope = ops::rope_layout::half;  // modeling_llama.py / modeling_qwen2.py rotate_half
    c.use_rope = true;
    c.gated_mlp = true;
    c.act = hf_activation(r.s("hidden_act", "silu"), where, "hidden_act");
    const std::string name = qwen2 ? "a Qwen2" : "a LLaMA";
    if (c.act != ops::activation::silu) unsupported(where, name + " with hidden_act \"" + r.s("hidden_act", "") + "\"");
    if (r.has("partial_rotary_factor") && r.f("partial_rotary_factor", 1.0) != 1.0)
      unsupported(where, name + " with \"partial_rotary_factor\" " + j["partial_rotary_factor"].dump());
    if (qwen2) {
      // Qwen2Attention: bias on q_proj, k_proj, v_proj; none on o_proj or the MLP. Sliding-window layers
      // (use_sliding_window, layer_types "sliding_attention") are not in flowrun's attention.
      if (r.b("use_sliding_window", false))
        unsupported(where, "a Qwen2 with \"use_sliding_window\": true (sliding-window attention)");
      if (r.has("layer_types")) {
        const auto& lt = j["layer_types"];
        if (!lt.is_array()) throw std::runtime_error(where + ": \"layer_types\" is not a list: " + lt.dump());
        for (const auto& t : lt)
          if (t != "full_attention") unsupported(where, "a Qwen2 with layer_types " + t.dump() + " (only full_attention)");
      }
      c.qkv_bias = true;
    } else if (r.b("attention_bias", false) || r.b("mlp_bias", false)) {
      unsupported(where, "a LLaMA with attention_bias / mlp_bias");
    }
    if (r.has("head_dim") && c.n_heads > 0 && (c.dim % c.n_heads != 0 || r.i("head_dim") != c.dim / c.n_heads))
      unsupported(where, "a head_dim (" + std::to_string(r.i("head_dim")) + ") other than hidden_size / num_attention_heads");
    c.bias = false;
    c.tied_embeddings = r.b("tie_word_embeddings", false);  // LlamaConfig's and Qwen2Config's default
  } else if (mt == "opt") {
    c.family = model_family::opt;
    // do_layer_norm_before = false (facebook/opt-350m): post-LayerNorm and no final
    // LayerNorm (OPTDecoder.final_layer_norm exists only with pre-LayerNorm)
    c.post_norm = !r.b("do_layer_norm_before", true);
    c.dim = r.i("hidden_size");
    // word_embed_proj_dim != hidden_size (facebook/opt-350m): project_in / project_out
    const int64_t wep = r.i("word_embed_proj_dim", c.dim);
    if (wep <= 0) unsupported(where, "OPT with \"word_embed_proj_dim\" " + std::to_string(wep));
    c.embed_dim = wep == c.dim ? 0 : wep;
    if (!c.post_norm && r.b("_remove_final_layer_norm", false))
      unsupported(where, "OPT with \"_remove_final_layer_norm\": true");
    if (!r.b("enable_bias", true)) unsupported(where, "OPT with \"enable_bias\": false");
    if (!r.b("layer_norm_elementwise_affine", true))
      unsupported(where, "OPT with \"layer_norm_elementwise_affine\": false");
    c.hidden_dim = r.i("ffn_dim");
    c.n_layers = r.i("num_hidden_layers");
    c.n_heads = r.i("num_attention_heads");
    c.n_kv_heads = c.n_heads;
    c.vocab_size = r.i("vocab_size");
    c.max_seq_len = r.i("max_position_embeddings", 2048);
    c.norm = norm_kind::layernorm;
    c.norm_eps = 1e-5f;  // nn.LayerNorm's default; OPT has no eps key
    c.use_rope = false;
    c.position_offset = 2;  // OPTLearnedPositionalEmbedding.offset
    c.gated_mlp = false;
    c.act = hf_activation(r.s("activation_function", "relu"), where, "activation_function");
    c.bias = true;
    c.tied_embeddings = r.b("tie_word_embeddings", true);
  } else if (mt == "gpt2") {
    c.family = model_family::gpt2;
    if (!r.b("scale_attn_weights", true)) unsupported(where, "GPT-2 with \"scale_attn_weights\": false");
    if (r.b("scale_attn_by_inverse_layer_idx", false))
      unsupported(where, "GPT-2 with \"scale_attn_by_inverse_layer_idx\": true");
    if (r.b("add_cross_attention", false)) unsupported(where, "GPT-2 with \"add_cross_attention\": true");
    c.dim = r.i("n_embd");
    // GPT2MLP: n_inner or 4 * n_embd (an n_embd too large for that is refused by validate below)
    c.hidden_dim = r.i("n_inner", c.dim > 0 && c.dim <= (int64_t{1} << 40) ? 4 * c.dim : c.dim);
    c.n_layers = r.i("n_layer");
    c.n_heads = r.i("n_head");
    c.n_kv_heads = c.n_heads;
    c.vocab_size = r.i("vocab_size");
    c.max_seq_len = r.i("n_positions", 1024);
    c.norm = norm_kind::layernorm;
    c.norm_eps = static_cast<float>(r.f("layer_norm_epsilon", 1e-5));
    c.use_rope = false;
    c.position_offset = 0;
    c.gated_mlp = false;
    c.act = hf_activation(r.s("activation_function", "gelu_new"), where, "activation_function");
    c.bias = true;
    c.tied_embeddings = r.b("tie_word_embeddings", true);
  } else {
    throw std::runtime_error(where + ": model_type \"" + mt + "\" is not supported; flowrun's decoder runs " +
                             k_supported);
  }
  c.real_vocab_size = r.i("flowrun_real_vocab_size", 0);
  try {
    model_config sizes = c;
    sizes.real_vocab_size = 0;  // a tokenizer larger than the embedding: load_hf's check, which names both
    sizes.validate();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(where + ": " + e.what());
  }
  return c;
}

nlohmann::json hf_config_to_json(const model_config& c, dtype on_disk) {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok)
      throw std::invalid_argument("save_hf: " + c.summary() + " has no Hugging Face " + family_str(c.family) +
                                  " equivalent: " + what);
  };
  const int64_t real = c.vocab_limit();
  nlohmann::json j;
  auto token_ids = [&](int64_t bos, int64_t eos, int64_t pad) {
    if (bos >= 0 && bos < real) j["bos_token_id"] = bos;
    if (eos >= 0 && eos < real) j["eos_token_id"] = eos;
    if (pad >= 0 && pad < real) j["pad_token_id"] = pad;
  };
  const bool ln_bias = c.norm == norm_kind::layernorm && c.bias;
  switch (c.family) {
    case model_family::llama: {
      need(c.norm == norm_kind::rmsnorm && c.use_rope && c.gated_mlp && c.act == ops::activation::silu && !c.bias,
           "LlamaForCausalLM / Qwen2ForCausalLM have RMSNorm, RoPE, a SwiGLU MLP and no o_proj / MLP biases");
      need(!c.post_norm && !c.has_projection(), "LlamaForCausalLM has pre-norm and no embedding projection");
      // q/k/v biases alone are Qwen2 (Qwen2ForCausalLM); without them, LlamaForCausalLM
      const bool qwen2 = c.qkv_bias;
      nlohmann::json rope = {{"rope_theta", short_float(c.rope_theta)}, {"rope_type", "default"}};
      if (c.rope_scaling == rope_scaling_kind::llama3)
        rope = {{"rope_theta", short_float(c.rope_theta)},
                {"rope_type", "llama3"},
                {"factor", short_float(c.rope_factor)},
                {"low_freq_factor", short_float(c.rope_low_freq_factor)},
                {"high_freq_factor", short_float(c.rope_high_freq_factor)},
                {"original_max_position_embeddings", c.rope_original_max_pos}};
      j = {{"architectures", nlohmann::json::array({qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"})},
           {"model_type", qwen2 ? "qwen2" : "llama"},
           {"hidden_size", c.dim},
           {"intermediate_size", c.hidden_dim},
           {"num_hidden_layers", c.n_layers},
           {"num_attention_heads", c.n_heads},
           {"num_key_value_heads", c.n_kv_heads},
           {"vocab_size", c.vocab_size},
           {"max_position_embeddings", c.max_seq_len},
           {"rms_norm_eps", short_float(c.norm_eps)},
           {"rope_theta", short_float(c.rope_theta)},
           {"rope_parameters", rope},
           {"hidden_act", "silu"},
           {"initializer_range", 0.02},
           {"tie_word_embeddings", c.tied_embeddings}};
      if (c.rope_scaling == rope_scaling_kind::llama3) j["rope_scaling"] = rope;  // transformers < 5 reads this key
      if (qwen2) {
        j["use_sliding_window"] = false;
      } else {
        j["head_dim"] = c.head_dim();
        j["attention_bias"] = false;
        j["mlp_bias"] = false;
        token_ids(1, 2, -1);
      }
      break;
    }
    case model_family::opt:
      need(c.norm == norm_kind::layernorm && ln_bias && !c.use_rope && c.position_offset == 2 && !c.gated_mlp &&
               c.n_kv_heads == c.n_heads,
           "OPTForCausalLM has LayerNorm with bias, learned positions at offset 2, a plain MLP and biases");
      need(std::fabs(c.norm_eps - 1e-5f) < 1e-9f, "OPT's LayerNorm eps is fixed at 1e-5");
      j = {{"architectures", nlohmann::json::array({"OPTForCausalLM"})},
           {"model_type", "opt"},
           {"hidden_size", c.dim},
           {"word_embed_proj_dim", c.embed_width()},
           {"ffn_dim", c.hidden_dim},
           {"num_hidden_layers", c.n_layers},
           {"num_attention_heads", c.n_heads},
           {"vocab_size", c.vocab_size},
           {"max_position_embeddings", c.max_seq_len},
           {"do_layer_norm_before", !c.post_norm},
           {"_remove_final_layer_norm", false},
           {"enable_bias", true},
           {"layer_norm_elementwise_affine", true},
           {"activation_function", c.act == ops::activation::relu ? "relu"
                                   : c.act == ops::activation::silu ? "silu"
                                                                    : "gelu_new"},
           {"init_std", 0.02},
           {"tie_word_embeddings", c.tied_embeddings}};
      token_ids(2, 2, 1);
      break;
    case model_family::gpt2:
      need(c.norm == norm_kind::layernorm && ln_bias && !c.use_rope && c.position_offset == 0 && !c.gated_mlp &&
               c.n_kv_heads == c.n_heads,
           "GPT2LMHeadModel has pre-LayerNorm with bias, learned positions, a plain MLP and biases");
      need(!c.post_norm && !c.has_projection(), "GPT2LMHeadModel has pre-LayerNorm and no embedding projection");
      j = {{"architectures", nlohmann::json::array({"GPT2LMHeadModel"})},
           {"model_type", "gpt2"},
           {"n_embd", c.dim},
           {"n_inner", c.hidden_dim},
           {"n_layer", c.n_layers},
           {"n_head", c.n_heads},
           {"vocab_size", c.vocab_size},
           {"n_positions", c.max_seq_len},
           {"n_ctx", c.max_seq_len},
           {"layer_norm_epsilon", short_float(c.norm_eps)},
           {"activation_function", c.act == ops::activation::relu ? "relu"
                                   : c.act == ops::activation::silu ? "silu"
                                                                    : "gelu_new"},
           {"scale_attn_weights", true},
           {"initializer_range", 0.02},
           {"tie_word_embeddings", c.tied_embeddings}};
      if (real == 50257) token_ids(50256, 50256, -1);  // GPT-2's own vocabulary: <|endoftext|>
      break;
  }
  j["torch_dtype"] = on_disk == dtype::bf16 ? "bfloat16" : on_disk == dtype::f16 ? "float16" : "float32";
  j["flowrun_real_vocab_size"] = real;
  return j;
}

// ------------------------------------------------------------------ tensor map

std::vector<hf_tensor_spec> hf_tensor_map(const model_config& c) {
  const int64_t C = c.dim, F = c.hidden_dim, V = c.vocab_size, hs = c.head_dim();
  const int64_t qd = c.n_heads * hs, kvd = c.n_kv_heads * hs, P = c.max_seq_len + c.position_offset;
  const int64_t E = c.embed_width();
  std::vector<hf_tensor_spec> out;
  auto add = [&](std::string hf, shape_t shape, std::vector<std::string> parts, bool tr = false) {
    out.push_back({std::move(hf), std::move(shape), tr, std::move(parts)});
  };
  switch (c.family) {
    case model_family::llama:
      add("model.embed_tokens.weight", {V, C}, {"model.embed_tokens.weight"});
      for (int64_t l = 0; l < c.n_layers; ++l) {
        auto p = layer_prefix(l);
        add(p + "input_layernorm.weight", {C}, {p + "input_layernorm.weight"});
        for (const char* x : {"q", "k", "v"}) {
          const std::string s = std::string("self_attn.") + x + "_proj.";
          const int64_t rows = std::string(x) == "q" ? qd : kvd;
          add(p + s + "weight", {rows, C}, {p + s + "weight"});
          if (c.has_qkv_bias()) add(p + s + "bias", {rows}, {p + s + "bias"});  // Qwen2
        }
        add(p + "self_attn.o_proj.weight", {C, qd}, {p + "self_attn.o_proj.weight"});
        add(p + "post_attention_layernorm.weight", {C}, {p + "post_attention_layernorm.weight"});
        add(p + "mlp.gate_proj.weight", {F, C}, {p + "mlp.gate_proj.weight"});
        add(p + "mlp.up_proj.weight", {F, C}, {p + "mlp.up_proj.weight"});
        add(p + "mlp.down_proj.weight", {C, F}, {p + "mlp.down_proj.weight"});
      }
      add("model.norm.weight", {C}, {"model.norm.weight"});
      break;
    case model_family::opt:
      add("model.decoder.embed_tokens.weight", {V, E}, {"model.embed_tokens.weight"});
      add("model.decoder.embed_positions.weight", {P, C}, {"model.embed_positions.weight"});
      if (c.has_projection()) {
        add("model.decoder.project_in.weight", {C, E}, {"model.project_in.weight"});
        add("model.decoder.project_out.weight", {E, C}, {"model.project_out.weight"});
      }
      for (int64_t l = 0; l < c.n_layers; ++l) {
        auto p = layer_prefix(l);
        auto h = "model.decoder.layers." + std::to_string(l) + ".";
        for (const char* x : {"q", "k", "v"}) {
          std::string s = std::string("self_attn.") + x + "_proj.";
          int64_t rows = std::string(x) == "q" ? qd : kvd;
          add(h + s + "weight", {rows, C}, {p + s + "weight"});
          add(h + s + "bias", {rows}, {p + s + "bias"});
        }
        add(h + "self_attn.out_proj.weight", {C, qd}, {p + "self_attn.o_proj.weight"});
        add(h + "self_attn.out_proj.bias", {C}, {p + "self_attn.o_proj.bias"});
        add(h + "self_attn_layer_norm.weight", {C}, {p + "input_layernorm.weight"});
        add(h + "self_attn_layer_norm.bias", {C}, {p + "input_layernorm.bias"});
        add(h + "fc1.weight", {F, C}, {p + "mlp.up_proj.weight"});
        add(h + "fc1.bias", {F}, {p + "mlp.up_proj.bias"});
        add(h + "fc2.weight", {C, F}, {p + "mlp.down_proj.weight"});
        add(h + "fc2.bias", {C}, {p + "mlp.down_proj.bias"});
        add(h + "final_layer_norm.weight", {C}, {p + "post_attention_layernorm.weight"});
        add(h + "final_layer_norm.bias", {C}, {p + "post_attention_layernorm.bias"});
      }
      if (!c.post_norm) {
        add("model.decoder.final_layer_norm.weight", {C}, {"model.norm.weight"});
        add("model.decoder.final_layer_norm.bias", {C}, {"model.norm.bias"});
      }
      break;
    case model_family::gpt2:
      add("transformer.wte.weight", {V, C}, {"model.embed_tokens.weight"});
      add("transformer.wpe.weight", {P, C}, {"model.embed_positions.weight"});
      for (int64_t l = 0; l < c.n_layers; ++l) {
        auto p = layer_prefix(l);
        auto h = "transformer.h." + std::to_string(l) + ".";
        add(h + "ln_1.weight", {C}, {p + "input_layernorm.weight"});
        add(h + "ln_1.bias", {C}, {p + "input_layernorm.bias"});
        add(h + "attn.c_attn.weight", {C, qd + 2 * kvd},
            {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"}, true);
        add(h + "attn.c_attn.bias", {qd + 2 * kvd},
            {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"});
        add(h + "attn.c_proj.weight", {qd, C}, {p + "self_attn.o_proj.weight"}, true);
        add(h + "attn.c_proj.bias", {C}, {p + "self_attn.o_proj.bias"});
        add(h + "ln_2.weight", {C}, {p + "post_attention_layernorm.weight"});
        add(h + "ln_2.bias", {C}, {p + "post_attention_layernorm.bias"});
        add(h + "mlp.c_fc.weight", {C, F}, {p + "mlp.up_proj.weight"}, true);
        add(h + "mlp.c_fc.bias", {F}, {p + "mlp.up_proj.bias"});
        add(h + "mlp.c_proj.weight", {F, C}, {p + "mlp.down_proj.weight"}, true);
        add(h + "mlp.c_proj.bias", {C}, {p + "mlp.down_proj.bias"});
      }
      add("transformer.ln_f.weight", {C}, {"model.norm.weight"});
      add("transformer.ln_f.bias", {C}, {"model.norm.bias"});
      break;
  }
  if (!c.tied_embeddings) add("lm_head.weight", {V, E}, {"lm_head.weight"});
  return out;
}

// ------------------------------------------------------------------ load / save

bool is_sequence_classification(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("architectures") || !config["architectures"].is_array()) return false;
  for (const auto& a : config["architectures"])
    if (a.is_string() && a.get<std::string>().find("ForSequenceClassification") != std::string::npos) return true;
  return false;
}

decoder load_hf(const std::string& dir, device dev, const tensor_progress_fn& progress) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw std::runtime_error(dir + ": not a folder (an HF model is a folder with config.json)");
  const fs::path cfg_path = d / "config.json";
  if (!fs::exists(cfg_path))
    throw std::runtime_error(dir + ": no config.json (not a Hugging Face model folder)");
  nlohmann::json j;
  try {
    std::ifstream f(cfg_path);
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw std::runtime_error(cfg_path.string() + ": not valid JSON: " + e.what());
  }
  model_config c = hf_config_from_json(j, cfg_path.string());
  safetensors_checkpoint ck(dir);
  // TRL's reward model (AutoModelForSequenceClassification, num_labels = 1): its score head, Linear(C, 1,
  // bias=False) on every position and read at the last real token, is DS-Chat's v_head; it has no LM head
  const bool seq_cls = is_sequence_classification(j);

  // file names, normalized to the CausalLM names
  std::map<std::string, std::string> present;  // normalized -> name in the file
  for (const auto& n : ck.names()) {
    auto norm = seq_cls && n == "score.weight" ? k_value_head_name : normalize_name(c.family, n);
    if (!present.emplace(norm, n).second)
      throw std::runtime_error(ck.where() + ": tensors '" + present[norm] + "' and '" + n +
                               "' both map to '" + norm + "'");
  }
  if (seq_cls) {
    if (!present.count(k_value_head_name))
      throw std::runtime_error(ck.where() + ": a ForSequenceClassification model without score.weight");
    const auto& e = ck.entry(present.at(k_value_head_name));
    if (e.shape.size() != 2 || e.shape[0] != 1)
      throw std::runtime_error(ck.file_of(present.at(k_value_head_name)) + ": score.weight has shape " +
                               shape_str(e.shape) + ": a reward model scores with one label (TRL's "
                               "AutoModelForSequenceClassification(num_labels=1)); flowrun reads no classifier of more");
    // no LM head in the file: the embedding stands in for an untied one (a value model reads none of it)
    if (!c.tied_embeddings && !present.count("lm_head.weight")) c.tied_embeddings = true;
  }
  auto specs = hf_tensor_map(c);

  // tie_word_embeddings with a separate lm_head.weight in the file too: transformers ties the two only
  // where they are equal, and keeps the file's head, untied, where they differ (modeling_utils.py
  // tie_weights: "...both are present in the checkpoints with different values, so we will NOT tie them").
  // It was dropped here without a word, and the logits came from the embedding.
  if (c.tied_embeddings && present.count("lm_head.weight")) {
    for (const auto& s : specs) {
      if (s.parts.size() != 1 || s.parts[0] != "model.embed_tokens.weight" || !present.count(s.hf_name)) continue;
      const auto& emb = present.at(s.hf_name);
      const auto& head = present.at("lm_head.weight");
      if (ck.entry(emb).shape != ck.entry(head).shape) break;  // named below as a shape mismatch
      const tensor a = ck.read(emb), b = ck.read(head);
      if (std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>())) break;  // truly tied
      std::fprintf(stderr,
                   "flowrun: warning: %s: config.json says tie_word_embeddings = true but %s and %s differ: loaded "
                   "untied, with the file's lm_head.weight (as transformers does); set \"tie_word_embeddings\": "
                   "false in config.json\n",
                   dir.c_str(), emb.c_str(), head.c_str());
      c.tied_embeddings = false;
      specs = hf_tensor_map(c);
      break;
    }
  }

  // the embedding rows against config.json's vocab_size first: the commonest mismatch
  for (const auto& s : specs) {
    if (s.parts.size() != 1 || (s.parts[0] != "model.embed_tokens.weight" && s.parts[0] != "lm_head.weight")) continue;
    auto it = present.find(s.hf_name);
    if (it == present.end()) continue;
    const auto& e = ck.entry(it->second);
    if (!e.shape.empty() && e.shape[0] != c.vocab_size)
      throw std::runtime_error(ck.file_of(it->second) + ": " + it->second + " has " + std::to_string(e.shape[0]) +
                               " rows but config.json vocab_size is " + std::to_string(c.vocab_size) +
                               "; the checkpoint and its config.json disagree (was the embedding resized, e.g. "
                               "padded to a multiple of 8, without updating config.json?). Set vocab_size in " +
                               cfg_path.string() + " to the embedding rows, " + std::to_string(e.shape[0]) +
                               ", and the tokenizer's size as \"flowrun_real_vocab_size\"");
  }

  // missing and unexpected tensors, all named
  std::vector<std::string> missing, unexpected;
  std::set<std::string> wanted;
  for (const auto& s : specs) {
    wanted.insert(s.hf_name);
    if (!present.count(s.hf_name)) missing.push_back(s.hf_name);
  }
  // DeepSpeed-Chat's reward / critic head (reward_model.py v_head = Linear(C, 1, bias=False)), as save_hf writes it
  const bool value_head = present.count(k_value_head_name) > 0;
  for (const auto& [norm, n] : present)
    if (!wanted.count(norm) && !ignorable(c, norm) && norm != k_value_head_name) unexpected.push_back(n);
  if (!missing.empty() || !unexpected.empty()) {
    std::string msg = ck.where() + ": the tensors do not match config.json (" + c.summary() + "):";
    if (!missing.empty()) msg += " missing " + list_names(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected " + list_names(unexpected) + ";";
    msg += " is config.json from this checkpoint?";
    throw std::runtime_error(msg);
  }
  for (const auto& s : specs) {
    const auto& n = present.at(s.hf_name);
    const auto& e = ck.entry(n);
    if (e.shape != s.hf_shape)
      throw std::runtime_error(ck.file_of(n) + ": tensor '" + n + "' has shape " + shape_str(e.shape) + " but " +
                               cfg_path.string() + " implies " + shape_str(s.hf_shape));
  }

  // the tokenizer's real size
  if (c.real_vocab_size <= 0) {
    int64_t tok = folder_tokenizer_size(d);
    c.real_vocab_size = tok > 0 ? tok : c.vocab_size;
  }
  if (c.real_vocab_size > c.vocab_size)
    throw std::runtime_error(dir + ": the tokenizer has " + std::to_string(c.real_vocab_size) +
                             " tokens but the embedding has " + std::to_string(c.vocab_size) +
                             " rows (config.json vocab_size): ids past the embedding would crash; resize the "
                             "embeddings to the tokenizer (model.resize_token_embeddings) or fix "
                             "\"flowrun_real_vocab_size\"");

  try {
    c.validate();
  } catch (const std::exception& e) {
    throw std::runtime_error(cfg_path.string() + ": " + e.what());
  }
  decoder m(c, device::cpu());
  tensor_progress at;  // the tensors read, for `progress`
  auto report = [&](const std::string& n) {
    if (!progress) return;
    const auto& e = ck.entry(n);
    ++at.tensors_done;
    at.bytes_done += static_cast<int64_t>(e.end - e.begin);
    at.name = n;
    progress(at);
  };
  if (progress) {
    at.tensors_total = static_cast<int64_t>(specs.size()) + (value_head ? 1 : 0);
    for (const auto& s : specs) {
      const auto& e = ck.entry(present.at(s.hf_name));
      at.bytes_total += static_cast<int64_t>(e.end - e.begin);
    }
    if (value_head) {
      const auto& e = ck.entry(present.at(k_value_head_name));
      at.bytes_total += static_cast<int64_t>(e.end - e.begin);
    }
    progress(at);
  }
  for (const auto& s : specs) {
    const auto& n = present.at(s.hf_name);
    if (s.parts.size() == 1 && !s.transpose) {
      ck.read_into(n, m.param(s.parts[0]));
      report(n);
      continue;
    }
    tensor t = ck.read(n);
    if (s.transpose) {
      auto tt = tensor::empty({s.hf_shape[1], s.hf_shape[0]});
      transpose_into(tt.data<float>(), t.data<float>(), s.hf_shape[0], s.hf_shape[1]);
      t = tt;
    }
    const float* src = t.data<float>();
    int64_t off = 0;
    for (const auto& part : s.parts) {
      tensor& dst = m.param(part);
      std::copy(src + off, src + off + dst.numel(), dst.data<float>());
      off += dst.numel();
    }
    if (off != t.numel())
      throw std::logic_error("load_hf: parts of " + s.hf_name + " cover " + std::to_string(off) + " of " +
                             std::to_string(t.numel()) + " elements");
    report(n);
  }
  if (value_head) {
    const auto& n = present.at(k_value_head_name);
    const shape_t want{1, c.embed_width()};
    if (ck.entry(n).shape != want)
      throw std::runtime_error(ck.file_of(n) + ": tensor '" + n + "' has shape " + shape_str(ck.entry(n).shape) +
                               " but the value head of this config is " + shape_str(want));
    m.add_value_head();
    ck.read_into(n, m.w().v_head);
    report(n);
  }
  if (dev != device::cpu()) return clone_decoder(m, dev);
  return m;
}

void save_hf(const decoder& model, const std::string& dir, dtype on_disk, int64_t max_shard_bytes,
             const nlohmann::json& extra_config, const tensor_progress_fn& progress) {
  const decoder* src = &model;
  decoder permuted;
  if (model.config().family == model_family::llama && model.config().use_rope &&
      model.config().rope == ops::rope_layout::adjacent) {
    permuted = to_half_rope(model);
    src = &permuted;
  }
  const auto& c = src->config();
  nlohmann::json cj = hf_config_to_json(c, on_disk);
  if (!extra_config.is_null()) {
    if (!extra_config.is_object()) throw std::invalid_argument("save_hf: extra_config must be a JSON object");
    for (auto& [k, v] : extra_config.items()) cj[k] = v;
  }
  const auto& by_name = src->w().by_name;
  named_tensors tensors;
  for (const auto& s : hf_tensor_map(c)) {
    if (s.parts.size() == 1 && !s.transpose) {
      tensors.emplace_back(s.hf_name, by_name.at(s.parts[0]).to(device::cpu()));
      continue;
    }
    const int64_t n = shape_numel(s.hf_shape);
    auto cat = tensor::empty({n});
    float* dst = cat.data<float>();
    int64_t off = 0;
    for (const auto& part : s.parts) {
      auto h = by_name.at(part).to(device::cpu());
      std::copy(h.data<float>(), h.data<float>() + h.numel(), dst + off);
      off += h.numel();
    }
    if (s.transpose) {
      auto out = tensor::empty(s.hf_shape);
      // cat is (hf_shape[1], hf_shape[0]); write its transpose
      transpose_into(out.data<float>(), dst, s.hf_shape[1], s.hf_shape[0]);
      cat = out;
    } else {
      cat = cat.view(s.hf_shape);
    }
    tensors.emplace_back(s.hf_name, cat);
  }
  // a value head as DS-Chat's v_head, or as TRL's reward model's score head where the config names a
  // *ForSequenceClassification (convert keeps a source's: transformers found no score.weight in v_head.weight)
  const bool seq_cls = is_sequence_classification(cj);
  if (seq_cls && !model.has_value_head())
    throw std::invalid_argument("save_hf: " + dir + ": a ForSequenceClassification config for a model without a value head");
  if (model.has_value_head())
    tensors.emplace_back(seq_cls ? "score.weight" : k_value_head_name, model.w().v_head.to(device::cpu()));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw std::runtime_error(dir + ": cannot create the model folder: " + ec.message());
  save_safetensors_checkpoint(dir, tensors, on_disk, max_shard_bytes, {{"format", "pt"}}, progress);
  // config.json last: a folder with a config.json is complete
  write_text_atomic((fs::path(dir) / "config.json").string(), cj.dump(2) + "\n");
}

decoder clone_decoder(const decoder& model, device dev) {
  decoder out(model.config(), dev);
  out.w().flat.copy_from(model.w().flat.to(dev));
  if (model.has_value_head()) {
    out.add_value_head();
    out.w().v_head.copy_from(model.w().v_head.to(dev));
  }
  return out;
}

decoder to_half_rope(const decoder& model) { return relayout_rope(model, ops::rope_layout::half); }
decoder to_adjacent_rope(const decoder& model) { return relayout_rope(model, ops::rope_layout::adjacent); }

}  // namespace flowrun
