#include "models/decoder.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "models/device_copy.h"
#include "runtime/kernels/ops.h"

namespace flowrun {

namespace {

// splitmix64: a small, well-mixed generator whose output is the same on every
// platform (std:: distributions are not), used for deterministic init.
struct splitmix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {  // Box–Muller
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

// Ensure `t` is an f32 tensor of `shape` on `dev`, reallocating only when it differs.
void ensure(tensor& t, const shape_t& shape, device dev, dtype dt = dtype::f32) {
  if (t.defined() && t.shape() == shape && t.type() == dt && t.dev() == dev) return;
  t = tensor::empty(shape, dt, dev);
}

tensor none_tensor;  // an undefined tensor to pass for absent optional arguments

// `t` on `dev`: the same handle when it is already there or undefined, else a copy.
tensor on_device(const tensor& t, device dev) { return t.defined() ? t.to(dev) : t; }

// Copy `rows` rows of `width` elements from src (row r at src_off + r * spitch) to dst
// (row r at dst_off + r * dpitch), offsets and pitches in elements of the tensors' dtype.
// Both on one CUDA device: one cudaMemcpy2D instead of a copy per row (KV cache writes,
// the last positions' hidden states).
void copy_rows_strided(tensor& dst, int64_t dst_off, int64_t dpitch, const tensor& src, int64_t src_off,
                       int64_t spitch, int64_t width, int64_t rows) {
#ifdef FLOWRUN_HAVE_CUDA
  if (dst.dev().kind == device_kind::cuda && src.dev() == dst.dev()) {
    const size_t es = dtype_size(dst.type());
    detail::cuda_copy_2d(static_cast<char*>(dst.raw()) + dst_off * es, dpitch * es,
                         static_cast<const char*>(src.raw()) + src_off * es, spitch * es, width * es, rows,
                         dst.dev().index);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r)
    dst.flat_view(dst_off + r * dpitch, {width}).copy_from(src.flat_view(src_off + r * spitch, {width}));
}

// The kept positions t >= t0 of each of the B sequences of x (B*T rows of W elements each)
// into out (B*(T - t0) rows): the rows decoder::forward(keep_from = t0) computes after the
// last layer's attention. One strided copy (one cudaMemcpy2D on a GPU).
void gather_kept(tensor& out, const tensor& x, int64_t B, int64_t T, int64_t t0) {
  const int64_t Tk = T - t0, W = x.numel() / (B * T);
  copy_rows_strided(out, 0, Tk * W, x, t0 * W, T * W, Tk * W, B);
}

// The inverse: full (B*T rows) = zero, then the kept rows from kept (B*(T - t0) rows).
void scatter_kept(tensor& full, const tensor& kept, int64_t B, int64_t T, int64_t t0) {
  const int64_t Tk = T - t0, W = full.numel() / (B * T);
  full.zero_();
  copy_rows_strided(full, t0 * W, T * W, kept, 0, Tk * W, Tk * W, B);
}

// The first n rows of t (dim 0), or t itself when undefined (a LayerNorm mean under RMSNorm).
tensor first_rows(const tensor& t, int64_t n) { return t.defined() ? t.rows(0, n) : t; }

// The kept rows' view of one of activations' keep_* buffers: allocated at (B*T, C), so that the bytes a
// trainer holds do not depend on keep_from (estimate_memory's memory_plan::keep_rows), and used for
// its first B * (T - keep_from) rows.
tensor kept_view(tensor& buf, const activations& a, int64_t C, device dev) {
  ensure(buf, {a.B * a.T, C}, dev);
  return buf.rows(0, a.B * (a.T - a.keep_from));
}

// The head's blocks for one forward pass: the head and, with tied embeddings, the
// embedding block (lm_head is a view of embed_tokens). Acquired now, released when
// the pass returns (on every path).
class head_blocks {
 public:
  head_blocks(param_hooks* h, int head, bool tied) : h_(h), head_(head), tied_(tied) {
    if (!h_) return;
    h_->acquire(head_, param_hooks::phase::forward);
    if (tied_) h_->acquire(0, param_hooks::phase::forward);
  }
  ~head_blocks() {
    if (!h_) return;
    h_->release(head_, param_hooks::phase::forward);
    if (tied_) h_->release(0, param_hooks::phase::forward);
  }
  head_blocks(const head_blocks&) = delete;
  head_blocks& operator=(const head_blocks&) = delete;

 private:
  param_hooks* h_;
  int head_;
  bool tied_;
};

// Positions for a (B, T) batch: 0..T-1, or cumsum(mask)-1 clamped at 0 (HF's
// position_ids for left padding), plus `offset`.
tensor make_positions(int64_t B, int64_t T, const tensor& mask, int64_t start = 0) {
  auto pos = tensor::empty({B, T}, dtype::i32);
  int32_t* p = pos.data<int32_t>();
  if (!mask.defined()) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) p[b * T + t] = static_cast<int32_t>(start + t);
    return pos;
  }
  auto m = mask.to(device::cpu());
  const int32_t* mp = m.data<int32_t>();
  int64_t S = m.size(1);  // may be longer than T (cached decoding): positions of the last T
  for (int64_t b = 0; b < B; ++b) {
    int32_t c = 0;
    for (int64_t s = 0; s < S; ++s) {
      c += mp[b * S + s] != 0;
      if (s >= S - T) p[b * T + (s - (S - T))] = std::max(c - 1, 0);
    }
  }
  return pos;
}

}  // namespace

// ------------------------------------------------------------------ layout

decoder::decoder(const model_config& cfg, device dev) : cfg_(cfg), dev_(dev) {
  cfg_.validate();
  const int64_t C = cfg_.dim, hs = cfg_.head_dim(), F = cfg_.hidden_dim;
  const int64_t qd = cfg_.n_heads * hs, kvd = cfg_.n_kv_heads * hs;
  const bool ln_bias = cfg_.norm == norm_kind::layernorm && cfg_.bias;
  auto add = [&](const std::string& name, shape_t shape, bool no_decay = false) {
    param_entry e{name, shape, n_params_, shape_numel(shape), no_decay};
    n_params_ += e.numel;
    entries_.push_back(e);
  };
  const int64_t E = cfg_.embed_width();
  add("model.embed_tokens.weight", {cfg_.vocab_size, E});
  if (!cfg_.use_rope) add("model.embed_positions.weight", {cfg_.max_seq_len + cfg_.position_offset, C});
  if (cfg_.has_projection()) add("model.project_in.weight", {C, E});
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, true);
    if (ln_bias) add(p + "input_layernorm.bias", {C}, true);
    add(p + "self_attn.q_proj.weight", {qd, C});
    if (cfg_.has_qkv_bias()) add(p + "self_attn.q_proj.bias", {qd}, true);
    add(p + "self_attn.k_proj.weight", {kvd, C});
    if (cfg_.has_qkv_bias()) add(p + "self_attn.k_proj.bias", {kvd}, true);
    add(p + "self_attn.v_proj.weight", {kvd, C});
    if (cfg_.has_qkv_bias()) add(p + "self_attn.v_proj.bias", {kvd}, true);
    add(p + "self_attn.o_proj.weight", {C, qd});
    if (cfg_.bias) add(p + "self_attn.o_proj.bias", {C}, true);
    add(p + "post_attention_layernorm.weight", {C}, true);
    if (ln_bias) add(p + "post_attention_layernorm.bias", {C}, true);
    if (cfg_.gated_mlp) {
      add(p + "mlp.gate_proj.weight", {F, C});
      if (cfg_.bias) add(p + "mlp.gate_proj.bias", {F}, true);
    }
    add(p + "mlp.up_proj.weight", {F, C});
    if (cfg_.bias) add(p + "mlp.up_proj.bias", {F}, true);
    add(p + "mlp.down_proj.weight", {C, F});
    if (cfg_.bias) add(p + "mlp.down_proj.bias", {C}, true);
  }
  if (!cfg_.post_norm) {
    add("model.norm.weight", {C}, true);
    if (ln_bias) add("model.norm.bias", {C}, true);
  }
  if (cfg_.has_projection()) add("model.project_out.weight", {E, C});
  if (!cfg_.tied_embeddings) add("lm_head.weight", {cfg_.vocab_size, E});
  bind(w_, tensor::zeros({n_params_}, dtype::f32, dev_));
}

void decoder::to(device d) {
  if (d == dev_) return;
  if (hooks_ || external_grads_)
    throw std::logic_error("decoder::to(" + d.str() + "): ZeRO hooks or external gradients are installed; "
                           "move the model before creating its zero_engine (docs/cuda.md)");
  if (!w_.flat.defined())
    throw std::logic_error("decoder::to(" + d.str() + "): the flat parameter buffer was released (ZeRO-3)");
  // copy everything first, so a failed allocation leaves the model as it was
  tensor wf = w_.flat.to(d);
  tensor wa = on_device(w_.adapter_flat, d);
  tensor gf = on_device(g_.flat, d);
  tensor ga = on_device(g_.adapter_flat, d);
  dev_ = d;
  bind(w_, wf);
  if (wa.defined()) bind_adapter(w_, wa);
  if (gf.defined()) {
    bind(g_, gf);
    if (ga.defined()) bind_adapter(g_, ga);
  } else {
    g_ = weights{};
  }
}

void decoder::bind(weights& dst, const tensor& flat) {
  dst = weights{};
  dst.flat = flat;
  for (auto& e : entries_) dst.by_name[e.name] = flat.flat_view(e.offset, e.shape);
  wire(dst);
}

std::vector<param_block> decoder::param_blocks() const {
  std::vector<param_block> bs;
  const std::string lp = "model.layers.";
  int64_t first_layer = -1, after_layers = -1;
  for (auto& e : entries_) {
    if (e.name.compare(0, lp.size(), lp) == 0) {
      if (first_layer < 0) first_layer = e.offset;
      after_layers = e.offset + e.numel;
    }
  }
  if (first_layer < 0) first_layer = after_layers = n_params_;  // (a model always has layers)
  bs.push_back({"embed", 0, first_layer});
  int64_t at = first_layer;
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = lp + std::to_string(l) + ".";
    int64_t end = at;
    for (auto& e : entries_)
      if (e.name.compare(0, p.size(), p) == 0) end = std::max(end, e.offset + e.numel);
    bs.push_back({"layers." + std::to_string(l), at, end});
    at = end;
  }
  bs.push_back({"head", after_layers, n_params_});
  return bs;
}

void decoder::rebind_block(int b, const tensor& params, const tensor& grads) {
  const auto bs = param_blocks();
  if (b < 0 || b >= static_cast<int>(bs.size())) throw std::out_of_range("rebind_block: no block " + std::to_string(b));
  const auto& blk = bs[b];
  auto check = [&](const tensor& t, const char* what) {
    if (t.defined() && (t.numel() != blk.numel() || t.type() != dtype::f32))
      throw std::invalid_argument(std::string("rebind_block: ") + what + " for block " + blk.name + " must be (" +
                                  std::to_string(blk.numel()) + ",) f32, got " + t.str());
  };
  check(params, "params");
  check(grads, "grads");
  for (auto& e : entries_) {
    if (e.offset < blk.begin || e.offset >= blk.end) continue;
    w_.by_name[e.name] = params.defined() ? params.flat_view(e.offset - blk.begin, e.shape) : tensor{};
    g_.by_name[e.name] = grads.defined() ? grads.flat_view(e.offset - blk.begin, e.shape) : tensor{};
  }
  wire(w_);
  if (g_.layers.size() != w_.layers.size()) g_.layers.resize(w_.layers.size());
  wire(g_);
}

void decoder::release_flat_params() { w_.flat = tensor{}; }

void decoder::restore_flat_params(const tensor& flat) {
  if (flat.numel() != n_params_ || flat.type() != dtype::f32)
    throw std::invalid_argument("decoder::restore_flat_params: need (" + std::to_string(n_params_) + ",) f32, got " +
                                flat.str());
  tensor adapter = w_.adapter_flat;
  bind(w_, flat.dev() == dev_ ? flat.clone() : flat.to(dev_));
  if (adapter.defined()) bind_adapter(w_, adapter);
}

void decoder::wire(weights& dst) {
  auto get = [&](const std::string& n) -> tensor {
    auto it = dst.by_name.find(n);
    return it == dst.by_name.end() ? tensor{} : it->second;
  };
  dst.wte = get("model.embed_tokens.weight");
  dst.wpe = get("model.embed_positions.weight");
  dst.layers.resize(cfg_.n_layers);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    auto& L = dst.layers[l];
    L.ln1_w = get(p + "input_layernorm.weight");
    L.ln1_b = get(p + "input_layernorm.bias");
    L.wq = get(p + "self_attn.q_proj.weight");
    L.bq = get(p + "self_attn.q_proj.bias");
    L.wk = get(p + "self_attn.k_proj.weight");
    L.bk = get(p + "self_attn.k_proj.bias");
    L.wv = get(p + "self_attn.v_proj.weight");
    L.bv = get(p + "self_attn.v_proj.bias");
    L.wo = get(p + "self_attn.o_proj.weight");
    L.bo = get(p + "self_attn.o_proj.bias");
    L.ln2_w = get(p + "post_attention_layernorm.weight");
    L.ln2_b = get(p + "post_attention_layernorm.bias");
    L.w_gate = get(p + "mlp.gate_proj.weight");
    L.b_gate = get(p + "mlp.gate_proj.bias");
    L.w_up = get(p + "mlp.up_proj.weight");
    L.b_up = get(p + "mlp.up_proj.bias");
    L.w_down = get(p + "mlp.down_proj.weight");
    L.b_down = get(p + "mlp.down_proj.bias");
  }
  dst.lnf_w = get("model.norm.weight");
  dst.lnf_b = get("model.norm.bias");
  dst.project_in = get("model.project_in.weight");
  dst.project_out = get("model.project_out.weight");
  dst.lm_head = cfg_.tied_embeddings ? dst.wte : get("lm_head.weight");
}

tensor& decoder::param(const std::string& name) {
  auto it = w_.by_name.find(name);
  if (it == w_.by_name.end()) throw std::out_of_range("no parameter named '" + name + "' in " + cfg_.summary());
  return it->second;
}

void decoder::init_random(uint64_t seed) {
  splitmix64 rng{seed};
  auto host = tensor::empty({n_params_});
  float* p = host.data<float>();
  const double std_resid = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layers));
  for (auto& e : entries_) {
    float* q = p + e.offset;
    bool is_norm_w = e.name.find("layernorm.weight") != std::string::npos || e.name == "model.norm.weight";
    bool is_bias = e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
    bool resid = e.name.find("o_proj.weight") != std::string::npos || e.name.find("down_proj.weight") != std::string::npos;
    for (int64_t i = 0; i < e.numel; ++i) {
      if (is_norm_w) q[i] = 1.0f;
      else if (is_bias) q[i] = 0.0f;
      else q[i] = static_cast<float>(rng.normal() * (resid ? std_resid : 0.02));
    }
  }
  w_.flat.copy_from(host.to(dev_));
}

void decoder::zero_grad() {
  if (external_grads_) {  // base gradients are bound per block by the hooks; only the adapter's here
    if (g_.layers.size() != static_cast<size_t>(cfg_.n_layers)) g_.layers.resize(cfg_.n_layers);
  } else if (!g_.flat.defined()) {
    bind(g_, tensor::zeros({n_params_}, dtype::f32, dev_));
  } else {
    g_.flat.zero_();
  }
  if (n_adapter_ > 0) {
    if (!g_.adapter_flat.defined() || g_.adapter_flat.numel() != n_adapter_)
      bind_adapter(g_, tensor::zeros({n_adapter_}, dtype::f32, dev_));
    else
      g_.adapter_flat.zero_();
  }
}

void decoder::norm_forward(tensor& out, tensor& mean, tensor& rstd, const tensor& x, const tensor& w,
                           const tensor& b) {
  if (cfg_.norm == norm_kind::rmsnorm) ops::rmsnorm_forward(out, rstd, x, w, cfg_.norm_eps);
  else ops::layernorm_forward(out, mean, rstd, x, w, b, cfg_.norm_eps);
}

void decoder::norm_backward(tensor& dx, tensor& dw, tensor& db, const tensor& dout, const tensor& x,
                            const tensor& w, const tensor& mean, const tensor& rstd) {
  if (cfg_.norm == norm_kind::rmsnorm) ops::rmsnorm_backward(dx, dw, dout, x, w, rstd);
  else ops::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
}

// ------------------------------------------------------------------ LoRA and the value head

const char* const k_fused_qkv_path = "self_attn.qkv_proj";

const char* lora_module_name(int m) {
  static const char* names[lm_count] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return m >= 0 && m < lm_count ? names[m] : "?";
}

namespace {

const char* module_path(int m) {
  static const char* p[lm_count] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  return p[m];
}

std::pair<const tensor*, const tensor*> module_wb(const layer_weights& L, int m) {
  switch (m) {
    case lm_q: return {&L.wq, &L.bq};
    case lm_k: return {&L.wk, &L.bk};
    case lm_v: return {&L.wv, &L.bv};
    case lm_o: return {&L.wo, &L.bo};
    case lm_gate: return {&L.w_gate, &L.b_gate};
    case lm_up: return {&L.w_up, &L.b_up};
    default: return {&L.w_down, &L.b_down};
  }
}

// Module m's name inside a layer of a Hugging Face model of family `f` (LlamaDecoderLayer,
// OPTDecoderLayer, GPT2Block), "" where the family has none (the gate outside LLaMA). GPT-2's
// q, k and v are one Conv1D, attn.c_attn.
const char* hf_module_path(int m, model_family f) {
  static const char* llama[lm_count] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  static const char* opt[lm_count] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                                      "",                 "fc1",              "fc2"};
  static const char* gpt2[lm_count] = {"attn.c_attn", "attn.c_attn", "attn.c_attn", "attn.c_proj",
                                       "",            "mlp.c_fc",    "mlp.c_proj"};
  return (f == model_family::opt ? opt : f == model_family::gpt2 ? gpt2 : llama)[m];
}

bool ends_at_dot(const std::string& name, const std::string& suffix) {  // name == suffix or "...." + suffix
  return name == suffix || (name.size() > suffix.size() && name[name.size() - suffix.size() - 1] == '.' &&
                            name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0);
}

// Which modules a target_modules entry selects, by PEFT's rule (peft/tuners/tuners_utils.py,
// check_target_module_exists): a module whose full name equals the entry or ends with "." + entry,
// with the family's own names ("foo_proj" and "xq_proj" select nothing; "c_attn" nothing on a
// LLaMA). "all-linear" is every Linear. An entry longer than the module's name within its layer
// ("layers.0.self_attn.q_proj") selects that module in one layer only, which flowrun cannot do
// (a module is adapted in every layer): *one_layer is set, and nothing returned.
std::vector<int> modules_for_pattern(const std::string& pat, model_family f, bool* one_layer) {
  std::vector<int> out;
  if (pat == "all-linear") {  // PEFT's target_modules="all-linear" (the gate is dropped where there is none)
    for (int m = 0; m < lm_count; ++m) out.push_back(m);
    return out;
  }
  for (int m = 0; m < lm_count; ++m) {
    const std::string path = hf_module_path(m, f);
    if (path.empty()) continue;
    if (ends_at_dot(path, pat)) out.push_back(m);
    else if (ends_at_dot(pat, path)) *one_layer = true;
  }
  if (*one_layer) out.clear();
  return out;
}

}  // namespace

void decoder::set_lora_dropout(float p, uint64_t seed) {
  if (!has_lora()) throw std::logic_error("set_lora_dropout: the model has no LoRA adapter");
  if (!(p >= 0.0f && p < 1.0f)) throw std::invalid_argument("set_lora_dropout: lora_dropout must be in [0, 1)");
  lora_.lora_dropout = p;
  lora_.seed = seed;
}

void decoder::enable_lora(const lora_config& cfg, bool freeze_base) {
  if (cfg.lora_r < 1) throw std::invalid_argument("enable_lora: lora_r must be >= 1 (got " + std::to_string(cfg.lora_r) + ")");
  // rank(B A) <= min(in, out) of every adapted layer, so a rank above the model's width adds no capacity, only
  // memory and time (lora_dim = 4096 on a dim-64 model took 2.3 GB; 100000 did not start in 90 s).
  if (cfg.lora_r > cfg_.dim)
    throw std::invalid_argument("LoRA rank must be <= the model's dim (" + std::to_string(cfg_.dim) + ", " +
                                cfg_.summary() + "), got " + std::to_string(cfg.lora_r) +
                                ": a rank above the layers' width adds no capacity; lower lora_dim (DS-Chat) or "
                                "lora_r (zero_rank)");
  if (cfg.lora_dropout < 0.0f || cfg.lora_dropout >= 1.0f)
    throw std::invalid_argument("enable_lora: lora_dropout must be in [0, 1)");
  if (cfg.target_modules.empty()) throw std::invalid_argument("enable_lora: target_modules is empty");
  if (has_lora()) throw std::logic_error("enable_lora: LoRA is already enabled");
  bool want[lm_count] = {};
  for (const auto& pat : cfg.target_modules) {
    bool one_layer = false;
    auto ms = modules_for_pattern(pat, cfg_.family, &one_layer);
    ms.erase(std::remove_if(ms.begin(), ms.end(), [&](int m) { return m == lm_gate && !cfg_.gated_mlp; }), ms.end());
    std::string names;  // the family's module names, as PEFT matches them
    for (int m = 0; m < lm_count; ++m) {
      const std::string p = hf_module_path(m, cfg_.family);
      const std::string leaf = p.substr(p.find('.') + 1);
      if (!p.empty() && (m != lm_gate || cfg_.gated_mlp) && names.find(leaf) == std::string::npos)
        names += (names.empty() ? "" : ", ") + leaf;
    }
    if (one_layer)
      throw std::invalid_argument("enable_lora: target module '" + pat + "' names a module of one layer (PEFT would "
                                  "adapt that layer only); flowrun adapts a module in every layer: write its name "
                                  "alone, one of " + names + ", or all-linear");
    const std::string leaf = pat.substr(pat.rfind('.') == std::string::npos ? 0 : pat.rfind('.') + 1);
    if (ms.empty() && (leaf == "lm_head" || leaf == "embed_tokens" || leaf == "wte" || leaf == "embed_out"))
      throw std::invalid_argument("enable_lora: target module '" + pat + "': LoRA on the LM head or the token "
                                  "embedding is not supported (flowrun adapts the Linear layers of the blocks): "
                                  "use " + names + ", or all-linear (which leaves lm_head out, as PEFT's does)");
    if (ms.empty())
      throw std::invalid_argument("enable_lora: target module '" + pat + "' matches no Linear layer of " +
                                  cfg_.summary() + " by PEFT's rule (the module's name, or its end after a '.'); " +
                                  "use " + names + ", or all-linear");
    for (int m : ms) want[m] = true;
  }
  lora_ = cfg;
  lora_on_ = true;
  base_trainable_ = !freeze_base;
  // GPT-2's q, k and v are one Conv1D (c_attn): PEFT gives it ONE adapter, lora_A (r, C) and lora_B
  // (3C, r), so the three share A. So do we: one "qkv_proj" pair whose B rows are q's, k's and v's.
  const bool fused_qkv = cfg_.family == model_family::gpt2 && want[lm_q] && want[lm_k] && want[lm_v];
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    if (fused_qkv) {
      const auto& L = w_.layers[l];
      const int64_t in = L.wq.size(1), out = L.wq.size(0) + L.wk.size(0) + L.wv.size(0);
      std::string p = "model.layers." + std::to_string(l) + "." + k_fused_qkv_path + ".";
      adapter_entries_.push_back({p + "lora_A.weight", {cfg.lora_r, in}, n_adapter_, cfg.lora_r * in});
      n_adapter_ += adapter_entries_.back().numel;
      adapter_entries_.push_back({p + "lora_B.weight", {out, cfg.lora_r}, n_adapter_, out * cfg.lora_r});
      n_adapter_ += adapter_entries_.back().numel;
    }
    for (int m = 0; m < lm_count; ++m) {
      if (!want[m] || (fused_qkv && (m == lm_q || m == lm_k || m == lm_v))) continue;
      auto [w, b] = module_wb(w_.layers[l], m);
      std::string p = "model.layers." + std::to_string(l) + "." + module_path(m) + ".";
      adapter_entries_.push_back({p + "lora_A.weight", {cfg.lora_r, w->size(1)}, n_adapter_, cfg.lora_r * w->size(1)});
      n_adapter_ += adapter_entries_.back().numel;
      adapter_entries_.push_back({p + "lora_B.weight", {w->size(0), cfg.lora_r}, n_adapter_, w->size(0) * cfg.lora_r});
      n_adapter_ += adapter_entries_.back().numel;
    }
  }
  rebuild_adapter();
  // A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT: kaiming_uniform_(a=sqrt(5))), B = 0
  splitmix64 rng{cfg.seed * 0x9e3779b97f4a7c15ull + 17};
  for (auto& e : adapter_entries_) {
    if (e.name.find("lora_A") == std::string::npos) continue;
    auto host = tensor::empty(e.shape);
    float bound = 1.0f / std::sqrt(static_cast<float>(e.shape[1]));
    for (int64_t i = 0; i < e.numel; ++i) host.data<float>()[i] = static_cast<float>((2 * rng.uniform() - 1) * bound);
    w_.by_name.at(e.name).copy_from(host.to(dev_));
  }
}

void decoder::add_value_head(uint64_t seed) {
  if (value_head_) throw std::logic_error("add_value_head: the model already has a value head");
  value_head_ = true;
  const int64_t E = cfg_.embed_width();  // DeepSpeed-Chat: word_embed_proj_dim when the config has it
  adapter_entries_.push_back({"v_head.weight", {1, E}, n_adapter_, E, false});
  n_adapter_ += E;
  rebuild_adapter();
  splitmix64 rng{seed * 0x9e3779b97f4a7c15ull + 29};
  auto host = tensor::empty({1, E});
  float bound = 1.0f / std::sqrt(static_cast<float>(E));  // torch nn.Linear default init
  for (int64_t i = 0; i < E; ++i) host.data<float>()[i] = static_cast<float>((2 * rng.uniform() - 1) * bound);
  w_.v_head.copy_from(host.to(dev_));
}

// Re-allocate the adapter buffer for the current entries, keeping existing values.
void decoder::rebuild_adapter() {
  auto fresh = tensor::zeros({n_adapter_}, dtype::f32, dev_);
  for (auto& e : adapter_entries_) {
    auto it = w_.by_name.find(e.name);
    if (it != w_.by_name.end()) fresh.flat_view(e.offset, e.shape).copy_from(it->second);
  }
  bind_adapter(w_, fresh);
  if (g_.flat.defined()) bind_adapter(g_, tensor::zeros({n_adapter_}, dtype::f32, dev_));
}

void decoder::bind_adapter(weights& dst, const tensor& flat) {
  dst.adapter_flat = flat;
  for (auto& e : adapter_entries_) dst.by_name[e.name] = flat.flat_view(e.offset, e.shape);
  dst.v_head = value_head_ ? dst.by_name.at("v_head.weight") : tensor{};
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    for (int m = 0; m < lm_count; ++m) {
      std::string p = "model.layers." + std::to_string(l) + "." + module_path(m) + ".";
      auto a = dst.by_name.find(p + "lora_A.weight");
      auto b = dst.by_name.find(p + "lora_B.weight");
      dst.layers[l].lora[m].A = a == dst.by_name.end() ? tensor{} : a->second;
      dst.layers[l].lora[m].B = b == dst.by_name.end() ? tensor{} : b->second;
    }
    // a fused q/k/v adapter (GPT-2's c_attn): q, k and v share A; their B are row ranges of one B
    const std::string p = "model.layers." + std::to_string(l) + "." + k_fused_qkv_path + ".";
    auto a = dst.by_name.find(p + "lora_A.weight");
    if (a == dst.by_name.end()) continue;
    const tensor& B = dst.by_name.at(p + "lora_B.weight");
    const int64_t qd = cfg_.n_heads * cfg_.head_dim(), kvd = cfg_.n_kv_heads * cfg_.head_dim();
    auto& lr = dst.layers[l].lora;
    lr[lm_q] = {a->second, B.rows(0, qd)};
    lr[lm_k] = {a->second, B.rows(qd, qd + kvd)};
    lr[lm_v] = {a->second, B.rows(qd + kvd, qd + 2 * kvd)};
  }
}

void decoder::merge_lora() {
  if (!has_lora() || merged_) return;
  for (int64_t l = 0; l < cfg_.n_layers; ++l)
    for (int m = 0; m < lm_count; ++m) {
      auto& lp = w_.layers[l].lora[m];
      if (!lp.A.defined()) continue;
      tensor w = *module_wb(w_.layers[l], m).first;
      ops::matmul(w, lp.B, lp.A, false, false, lora_.scale(), 1.0f);  // W += s·B A
    }
  merged_ = true;
}

void decoder::unmerge_lora() {
  if (!has_lora() || !merged_) return;
  for (int64_t l = 0; l < cfg_.n_layers; ++l)
    for (int m = 0; m < lm_count; ++m) {
      auto& lp = w_.layers[l].lora[m];
      if (!lp.A.defined()) continue;
      tensor w = *module_wb(w_.layers[l], m).first;
      ops::matmul(w, lp.B, lp.A, false, false, -lora_.scale(), 1.0f);  // W -= s·B A
    }
  merged_ = false;
}

void decoder::lin_fwd(int64_t l, int m, tensor& out, const tensor& x, activations::layer* la, int64_t hold_rows) {
  const auto& L = w_.layers[l];
  auto [w, b] = module_wb(L, m);
  ops::linear_forward(out, x, *w, *b);
  const auto& lp = L.lora[m];
  if (!lora_on_ || merged_ || !lp.A.defined()) return;
  const int64_t in = w->size(1), N = x.numel() / in, r = lora_.lora_r;
  tensor x2 = x.view({N, in});
  tensor xd = x2;
  // the saved u and mask: buffers of the layer's full rows, used for the N rows of this call (fewer in the
  // last layer under forward's keep_from), so that their bytes do not depend on keep_from (estimate_memory)
  const auto saved_rows = [&](tensor& buf, int64_t width) {
    if (!buf.defined() || buf.size(0) < N || buf.size(1) != width || buf.dev() != dev_)
      buf = tensor::empty({std::max(N, hold_rows), width}, dtype::f32, dev_);
    return buf.rows(0, N);
  };
  if (la && training_ && lora_.lora_dropout > 0.0f) {  // training: inverted dropout, mask saved for backward
    if (dev_.kind != device_kind::cpu) throw std::runtime_error("lora_dropout is implemented on CPU only");
    tensor mask = saved_rows(la->lora_mask[m], in);
    xd = tensor::empty({N, in}, dtype::f32, dev_);
    splitmix64 rng{lora_.seed * 0x9e3779b97f4a7c15ull + (++dropout_calls_) * 0xd1b54a32d192ed03ull};
    const float keep = 1.0f - lora_.lora_dropout, inv = 1.0f / keep;
    float* mk = mask.data<float>();
    const float* xs = x2.data<float>();
    float* xo = xd.data<float>();
    for (int64_t i = 0; i < N * in; ++i) {
      mk[i] = rng.uniform() < keep ? inv : 0.0f;
      xo[i] = xs[i] * mk[i];
    }
  }
  tensor u = la ? saved_rows(la->lora_u[m], r) : tensor::empty({N, r}, dtype::f32, dev_);
  tensor none;
  ops::linear_forward(u, xd, lp.A, none);  // u = dropout(x) Aᵀ (N, r)
  tensor o2 = out.view({N, w->size(0)});
  ops::matmul(o2, u, lp.B, false, true, lora_.scale(), 1.0f);  // out += s · u Bᵀ
}

void decoder::lin_bwd(int64_t l, int m, tensor& dx, const tensor& dout, const tensor& x, activations& a,
                      activations::layer& la) {
  const auto& L = w_.layers[l];
  auto& G = g_.layers[l];
  auto [w, b] = module_wb(L, m);
  auto [gw, gb] = module_wb(G, m);
  tensor dw = base_trainable_ ? *gw : tensor{};
  tensor db = base_trainable_ ? *gb : tensor{};
  ops::linear_backward(dx, dw, db, dout, x, *w);
  const auto& lp = L.lora[m];
  if (!lora_on_ || merged_ || !lp.A.defined()) return;
  const int64_t in = w->size(1), out_f = w->size(0), N = x.numel() / in, r = lora_.lora_r;
  const float s = lora_.scale();
  tensor d2 = dout.view({N, out_f});
  tensor x2 = x.view({N, in});
  auto& gp = G.lora[m];
  const bool drop = lora_.lora_dropout > 0.0f && la.lora_mask[m].defined();
  tensor xd = x2;
  if (drop) {  // recompute dropout(x) from the saved mask
    xd = tensor::empty({N, in}, dtype::f32, dev_);
    const float* xs = x2.data<float>();
    const float* mk = la.lora_mask[m].data<float>();
    float* xo = xd.data<float>();
    for (int64_t i = 0; i < N * in; ++i) xo[i] = xs[i] * mk[i];
  }
  ensure(a.lora_du, {N, r}, dev_);
  const tensor u = la.lora_u[m].rows(0, N);                   // forward's rows (saved_rows in lin_fwd)
  ops::matmul(gp.B, d2, u, true, false, s, 1.0f);              // dB += s · doutᵀ u   (out, r)
  ops::matmul(a.lora_du, d2, lp.B, false, false, s, 0.0f);    // du = s · dout B      (N, r)
  ops::matmul(gp.A, a.lora_du, xd, true, false, 1.0f, 1.0f);  // dA += duᵀ dropout(x) (r, in)
  tensor dx2 = dx.view({N, in});
  if (!drop) {
    ops::matmul(dx2, a.lora_du, lp.A, false, false, 1.0f, 1.0f);  // dx += du A
  } else {
    ensure(a.lora_dx, {N, in}, dev_);
    ops::matmul(a.lora_dx, a.lora_du, lp.A, false, false, 1.0f, 0.0f);
    const float* mk = la.lora_mask[m].data<float>();
    const float* t = a.lora_dx.data<float>();
    float* o = dx2.data<float>();
    for (int64_t i = 0; i < N * in; ++i) o[i] += t[i] * mk[i];
  }
}

// ------------------------------------------------------------------ RoPE

tensor decoder::rope_rotations(const tensor& positions_host) const {
  if (!cfg_.use_rope || cfg_.rope_scaling == rope_scaling_kind::none) return {};
  const int64_t N = positions_host.numel(), hs = cfg_.head_dim(), half = hs / 2;
  const std::vector<float> inv_freq = cfg_.rope_inv_freq();
  auto host = tensor::zeros({N, hs, hs});
  float* r = host.data<float>();
  const int32_t* pos = positions_host.data<int32_t>();
  for (int64_t n = 0; n < N; ++n) {
    float* R = r + n * hs * hs;
    for (int64_t i = 0; i < half; ++i) {
      // HF LlamaRotaryEmbedding: freqs = position (f32) * inv_freq (f32), then cos / sin in f32
      const float ang = static_cast<float>(pos[n]) * inv_freq[static_cast<size_t>(i)];
      const float c = std::cos(ang), s = std::sin(ang);
      // the pair (j0, j1): (i, i + hs/2) in the half layout, (2i, 2i+1) in the adjacent one
      const int64_t j0 = cfg_.rope == ops::rope_layout::half ? i : 2 * i;
      const int64_t j1 = cfg_.rope == ops::rope_layout::half ? i + half : 2 * i + 1;
      R[j0 * hs + j0] = c;  // out[j0] = x[j0] cos - x[j1] sin
      R[j0 * hs + j1] = -s;
      R[j1 * hs + j1] = c;  // out[j1] = x[j1] cos + x[j0] sin
      R[j1 * hs + j0] = s;
    }
  }
  return host.to(dev_);
}

void decoder::rope_apply(tensor& x, const tensor& positions, const tensor& rot, bool inverse) const {
  if (!rot.defined()) {  // unscaled RoPE: the kernel computes its frequencies from theta
    if (inverse) ops::rope_backward(x, positions, cfg_.rope_theta, cfg_.rope);
    else ops::rope_forward(x, positions, cfg_.rope_theta, cfg_.rope);
    return;
  }
  // scaled RoPE: x (B, T, NH, hs) viewed as (N, NH, hs); out[n] = x[n] R[n]ᵀ (forward) or x[n] R[n]
  // (inverse: R is orthogonal, and the backward of x Rᵀ is dout R). Always f32 products (a bf16
  // matmul setting would round the rotation).
  const int64_t N = x.size(0) * x.size(1), NH = x.size(2), hs = x.size(3);
  if (rot.numel() != N * hs * hs)
    throw std::logic_error("decoder: the RoPE rotations are for " + std::to_string(rot.numel() / (hs * hs)) +
                           " positions, the tensor has " + std::to_string(N));
  ops::matmul_precision_scope f32(ops::matmul_precision::f32);
  tensor src = x.clone().view({N, NH, hs});
  tensor out = x.view({N, NH, hs});
  ops::matmul_batched(out, src, rot.view({N, hs, hs}), false, !inverse);
}

// ------------------------------------------------------------------ training forward

double decoder::forward(activations& a, const tensor& ids, const tensor& targets, const tensor& mask,
                        const tensor& positions, int64_t keep_from) {
  if (ids.dim() != 2 || ids.type() != dtype::i32)
    throw std::invalid_argument("decoder::forward: ids must be (B, T) i32, got " + ids.str());
  const int64_t B = ids.size(0), T = ids.size(1), N = B * T;
  if (keep_from < 0 || keep_from >= T)
    throw std::invalid_argument("decoder::forward: keep_from = " + std::to_string(keep_from) + " outside [0, T = " +
                                std::to_string(T) + ")");
  if (keep_from > 0 && targets.defined())
    throw std::invalid_argument("decoder::forward: keep_from > 0 computes no logits before it, and the loss of "
                                "`targets` reads every position: pass keep_from = 0 with targets");
  const int64_t C = cfg_.dim, H = cfg_.n_heads, KV = cfg_.n_kv_heads, hs = cfg_.head_dim();
  const int64_t F = cfg_.hidden_dim, V = cfg_.vocab_size, NL = cfg_.n_layers;
  if (T > cfg_.max_seq_len)
    throw std::invalid_argument("decoder::forward: T = " + std::to_string(T) + " exceeds max_seq_len " +
                                std::to_string(cfg_.max_seq_len));
  const bool ln = cfg_.norm == norm_kind::layernorm;
  const bool proj = cfg_.has_projection(), post = cfg_.post_norm;
  const int64_t E = cfg_.embed_width();

  // (re)allocate activations when the batch shape, the model's device or the
  // checkpointing mode changes (checkpointed: one layer slot reused by every layer)
  const size_t slots = checkpointing_ ? 1 : static_cast<size_t>(NL);
  if (a.B != B || a.T != T || a.layers.size() != slots || a.checkpointed != checkpointing_ ||
      (!a.resid.empty() && a.resid[0].dev() != dev_)) {
    a = activations{};
    a.B = B;
    a.T = T;
    a.checkpointed = checkpointing_;
    a.resid.resize(NL + 1);
    for (auto& r : a.resid) ensure(r, {B, T, C}, dev_);
    a.layers.resize(slots);
    for (auto& L : a.layers) {
      ensure(L.ln1, {B, T, C}, dev_);
      ensure(L.ln1_rstd, {N}, dev_);
      if (ln) ensure(L.ln1_mean, {N}, dev_);
      ensure(L.q, {B, T, H, hs}, dev_);
      ensure(L.k, {B, T, KV, hs}, dev_);
      ensure(L.v, {B, T, KV, hs}, dev_);
      ensure(L.att, {B, H, T, T}, dev_);
      ensure(L.atty, {B, T, H, hs}, dev_);
      ensure(L.resid2, {B, T, C}, dev_);
      ensure(L.ln2, {B, T, C}, dev_);
      ensure(L.ln2_rstd, {N}, dev_);
      if (ln) ensure(L.ln2_mean, {N}, dev_);
      if (cfg_.gated_mlp) ensure(L.gate, {B, T, F}, dev_);
      ensure(L.up, {B, T, F}, dev_);
      ensure(L.act, {B, T, F}, dev_);
    }
    ensure(a.lnf, {B, T, C}, dev_);
    ensure(a.lnf_rstd, {N}, dev_);
    if (ln) ensure(a.lnf_mean, {N}, dev_);
    ensure(a.losses, {N}, dev_);
  }
  if (proj) {  // outside the block above: activations reused across models get them too
    ensure(a.emb, {B, T, E}, dev_);
    ensure(a.hout, {B, T, E}, dev_);
  }
  if (post)
    for (auto& L : a.layers) ensure(L.resid3, {B, T, C}, dev_);
  // host inputs go to the model's device (the same handles on the CPU); positions are
  // computed on the host from the caller's mask
  const tensor ids_d = on_device(ids, dev_), targets_d = on_device(targets, dev_), mask_d = on_device(mask, dev_);
  const tensor pos_host = positions.defined() ? positions.to(device::cpu()) : make_positions(B, T, mask);
  a.ids = ids_d;
  a.targets = targets_d;
  a.mask = mask_d;
  a.positions = pos_host.to(dev_);
  a.rope_rot = rope_rotations(pos_host);
  a.training = training_;
  a.slot_layer = -1;
  a.keep_from = keep_from;
  const int64_t Nh = B * (T - keep_from);  // the rows the head reads (N when keep_from = 0)
  tensor keep_out = keep_from > 0 ? kept_view(a.keep_out, a, C, dev_) : tensor{};
  if (a.checkpointed) a.layer_rng.assign(static_cast<size_t>(NL), 0);

  // embeddings: x = wte[ids] (+ wpe[pos + offset])
  using ph = param_hooks::phase;
  const int head_block = static_cast<int>(NL) + 1;
  hook_acquire(0, ph::forward);
  tensor ids_flat = ids_d.view({N});
  tensor x0 = a.resid[0].view({N, C});
  if (proj) {  // OPT project_in: x = wte[ids] project_inᵀ, positions added after
    tensor e = a.emb.view({N, E});
    ops::embedding_forward(e, ids_flat, w_.wte);
    ops::linear_forward(x0, e, w_.project_in, none_tensor);
  } else {
    ops::embedding_forward(x0, ids_flat, w_.wte);
  }
  if (!cfg_.use_rope) {
    auto pos = pos_host.clone();
    int32_t* pp = pos.data<int32_t>();
    for (int64_t i = 0; i < N; ++i) pp[i] += static_cast<int32_t>(cfg_.position_offset);
    a.pos_ids = pos.view({N}).to(dev_);
    auto pe = tensor::empty({N, C}, dtype::f32, dev_);
    ops::embedding_forward(pe, a.pos_ids, w_.wpe);
    ops::axpy(x0, pe);
  }
  hook_release(0, ph::forward);

  for (int64_t l = 0; l < NL; ++l) {
    hook_acquire(static_cast<int>(l) + 1, ph::forward);
    if (a.checkpointed) a.layer_rng[l] = dropout_calls_;
    tensor xo = a.resid[l + 1].view({N, C});
    layer_forward(a, l, a.resid[l].view({N, C}), xo, mask_d);
    hook_release(static_cast<int>(l) + 1, ph::forward);
  }
  if (a.checkpointed) a.slot_layer = NL - 1;  // the slot holds the last layer's tensors
  head_blocks guard(hooks_, head_block, cfg_.tied_embeddings);  // acquired until every return below
  // the head's input: every position's last hidden state, or the kept rows (Nh, C) compacted
  tensor hx = a.resid[NL].view({N, C});
  if (keep_from > 0) {
    if (!kept_last_layer(a)) gather_kept(keep_out, hx, B, T, keep_from);  // else the last layer wrote them
    hx = keep_out;
  }
  tensor lnf = a.lnf.view({N, C}).rows(0, Nh);
  if (post) lnf.copy_from(hx);  // no final norm
  else {
    tensor mean = first_rows(a.lnf_mean, Nh), rstd = first_rows(a.lnf_rstd, Nh);
    norm_forward(lnf, mean, rstd, hx, w_.lnf_w, w_.lnf_b);
  }
  if (proj) {  // OPT project_out
    tensor ho = a.hout.view({N, E}).rows(0, Nh);
    ops::linear_forward(ho, lnf, w_.project_out, none_tensor);
    lnf = ho;
  }
  const int64_t W = value_head_ ? 1 : V;  // the head's width
  tensor& out = value_head_ ? a.values : a.logits;
  ensure(out, value_head_ ? shape_t{B, T} : shape_t{B, T, V}, dev_);
  tensor head_out = out.view({N, W});
  const tensor& head_w = value_head_ ? w_.v_head : w_.lm_head;
  if (keep_from == 0) {
    ops::linear_forward(head_out, lnf, head_w, none_tensor);
  } else {  // each sequence's kept rows straight into their places (no (Nh, V) copy), 0 before them
    const int64_t Tk = T - keep_from;
    for (int64_t b = 0; b < B; ++b) {
      tensor o = head_out.rows(b * T + keep_from, (b + 1) * T), z = head_out.rows(b * T, b * T + keep_from);
      ops::linear_forward(o, lnf.rows(b * Tk, (b + 1) * Tk), head_w, none_tensor);
      z.zero_();
    }
  }
  if (value_head_) {
    a.n_valid = 0;
    return 0.0;
  }
  tensor logits = a.logits.view({N, V});
  if (!targets.defined()) {
    a.n_valid = 0;
    return 0.0;
  }
  if (targets.shape() != ids.shape())
    throw std::invalid_argument("decoder::forward: targets " + targets.str() + " must match ids " + ids.str());
  return ops::cross_entropy_forward(a.losses, logits, targets_d.view({N}), &a.n_valid);
}

// Pre-norm: resid2 = x + attn(ln1(x)); out = resid2 + mlp(ln2(resid2)). x, out (N, C).
void decoder::layer_forward(activations& a, int64_t l, const tensor& x, tensor& out, const tensor& mask) {
  if (cfg_.post_norm) {
    forward_post_layer(a, l, x, out, mask);
    return;
  }
  if (l == cfg_.n_layers - 1 && kept_last_layer(a)) {
    last_layer_forward_kept(a, l, x, mask);
    return;
  }
  const int64_t N = a.B * a.T, C = cfg_.dim;
  auto& L = a.at(l);
  const auto& W = w_.layers[l];
  tensor ln1 = L.ln1.view({N, C});
  norm_forward(ln1, L.ln1_mean, L.ln1_rstd, x, W.ln1_w, W.ln1_b);
  tensor r2 = L.resid2.view({N, C});
  attn_fwd(a, l, ln1, x, r2, mask);
  tensor ln2 = L.ln2.view({N, C});
  norm_forward(ln2, L.ln2_mean, L.ln2_rstd, r2, W.ln2_w, W.ln2_b);
  mlp_fwd(a, l, ln2, r2, out);
}

// Layer l's forward again from its saved input resid[l], into the slot. The output
// goes to the scratch a.dln (resid[l+1] is already right); the LoRA dropout stream is
// rewound to where forward drew layer l's masks, then put back.
void decoder::recompute_layer(activations& a, int64_t l) {
  struct restore {
    decoder& d;
    uint64_t rng;
    bool training;
    ~restore() {
      d.dropout_calls_ = rng;
      d.training_ = training;
    }
  } guard{*this, dropout_calls_, training_};
  dropout_calls_ = a.layer_rng.at(static_cast<size_t>(l));
  training_ = a.training;
  const int64_t N = a.B * a.T, C = cfg_.dim;
  ensure(a.dln, {N, C}, dev_);
  layer_forward(a, l, a.resid[l].view({N, C}), a.dln, a.mask);
  a.slot_layer = l;
}

// Post-LayerNorm (OPT do_layer_norm_before = false, modeling_opt.py OPTDecoderLayer):
//   resid2 = x + o_proj(attn(x));     ln1 = LN1(resid2)
//   resid3 = ln1 + down(act(up(ln1))); out = LN2(resid3)
void decoder::forward_post_layer(activations& a, int64_t l, const tensor& x, tensor& out, const tensor& mask) {
  const int64_t N = a.B * a.T, C = cfg_.dim;
  auto& L = a.at(l);
  const auto& W = w_.layers[l];
  tensor r2 = L.resid2.view({N, C});
  attn_fwd(a, l, x, x, r2, mask);
  tensor h = L.ln1.view({N, C});
  norm_forward(h, L.ln1_mean, L.ln1_rstd, r2, W.ln1_w, W.ln1_b);
  tensor r3 = L.resid3.view({N, C});
  mlp_fwd(a, l, h, h, r3);
  norm_forward(out, L.ln2_mean, L.ln2_rstd, r3, W.ln2_w, W.ln2_b);
}

void decoder::attn_fwd(activations& a, int64_t l, const tensor& in, const tensor& resid, tensor& out,
                       const tensor& mask) {
  const int64_t N = a.B * a.T, C = cfg_.dim;
  auto& L = a.at(l);
  attn_core_fwd(a, l, in, mask);
  lin_fwd(l, lm_o, out, L.atty.view({N, C}), &L);
  ops::axpy(out, resid);
}

void decoder::attn_core_fwd(activations& a, int64_t l, const tensor& in, const tensor& mask) {
  const int64_t N = a.B * a.T, H = cfg_.n_heads, KV = cfg_.n_kv_heads, hs = cfg_.head_dim();
  auto& L = a.at(l);
  tensor q = L.q.view({N, H * hs}), k = L.k.view({N, KV * hs}), v = L.v.view({N, KV * hs});
  lin_fwd(l, lm_q, q, in, &L);
  lin_fwd(l, lm_k, k, in, &L);
  lin_fwd(l, lm_v, v, in, &L);
  if (cfg_.use_rope) {
    rope_apply(L.q, a.positions, a.rope_rot, false);
    rope_apply(L.k, a.positions, a.rope_rot, false);
  }
  ops::attention_forward(L.atty, L.att, L.q, L.k, L.v, mask);
}

// The last layer under keep_from (pre-norm): ln1, q, k, v and attention at every position (the kept
// positions attend to all before them), then o_proj, the residual, ln2 and the MLP at the kept rows only
// (Nh = B * (T - keep_from)), compacted: a.keep_atty and a.keep_x hold the attention output and the
// input at those rows, the slot's resid2, ln2, gate, up, act their first Nh rows, a.keep_out the output.
void decoder::last_layer_forward_kept(activations& a, int64_t l, const tensor& x, const tensor& mask) {
  const int64_t B = a.B, T = a.T, N = B * T, C = cfg_.dim, t0 = a.keep_from, Nh = B * (T - t0);
  auto& L = a.at(l);
  const auto& W = w_.layers[l];
  tensor ln1 = L.ln1.view({N, C});
  norm_forward(ln1, L.ln1_mean, L.ln1_rstd, x, W.ln1_w, W.ln1_b);
  attn_core_fwd(a, l, ln1, mask);
  tensor katty = kept_view(a.keep_atty, a, C, dev_), kx = kept_view(a.keep_x, a, C, dev_),
         kout = kept_view(a.keep_out, a, C, dev_);
  gather_kept(katty, L.atty.view({N, C}), B, T, t0);
  gather_kept(kx, x, B, T, t0);
  tensor r2 = L.resid2.view({N, C}).rows(0, Nh);
  lin_fwd(l, lm_o, r2, katty, &L, N);
  ops::axpy(r2, kx);
  tensor ln2 = L.ln2.view({N, C}).rows(0, Nh);
  tensor mean = first_rows(L.ln2_mean, Nh), rstd = first_rows(L.ln2_rstd, Nh);
  norm_forward(ln2, mean, rstd, r2, W.ln2_w, W.ln2_b);
  mlp_fwd(a, l, ln2, r2, kout);
}

// The MLP on the rows of `in` (N, C): every position, or the kept rows of the last layer.
void decoder::mlp_fwd(activations& a, int64_t l, const tensor& in, const tensor& resid, tensor& out) {
  const int64_t N = in.numel() / cfg_.dim, F = cfg_.hidden_dim;
  auto& L = a.at(l);
  tensor up = L.up.view({a.B * a.T, F}).rows(0, N), act = L.act.view({a.B * a.T, F}).rows(0, N);
  lin_fwd(l, lm_up, up, in, &L, a.B * a.T);
  if (cfg_.gated_mlp) {
    tensor gate = L.gate.view({a.B * a.T, F}).rows(0, N);
    lin_fwd(l, lm_gate, gate, in, &L, a.B * a.T);
    ops::swiglu_forward(act, gate, up);
  } else {
    ops::activation_forward(act, up, cfg_.act);
  }
  lin_fwd(l, lm_down, out, act, &L, a.B * a.T);
  ops::axpy(out, resid);
}

void decoder::attn_bwd(activations& a, int64_t l, const tensor& in, const tensor& dout, tensor& din) {
  const int64_t N = a.B * a.T, C = cfg_.dim;
  auto& L = a.at(l);
  a.datty.zero_();
  lin_bwd(l, lm_o, a.datty, dout, L.atty.view({N, C}), a, L);
  attn_core_bwd(a, l, in, din);
}

// din += d attention(in) for the gradient a.datty (N, C) of the attention output (before o_proj).
void decoder::attn_core_bwd(activations& a, int64_t l, const tensor& in, tensor& din) {
  const int64_t B = a.B, T = a.T, N = B * T, H = cfg_.n_heads, KV = cfg_.n_kv_heads, hs = cfg_.head_dim();
  auto& L = a.at(l);
  tensor datty4 = a.datty.view({B, T, H, hs});
  ops::attention_backward(a.dq, a.dk, a.dv, datty4, L.q, L.k, L.v, L.att);
  if (cfg_.use_rope) {
    rope_apply(a.dq, a.positions, a.rope_rot, true);
    rope_apply(a.dk, a.positions, a.rope_rot, true);
  }
  lin_bwd(l, lm_q, din, a.dq.view({N, H * hs}), in, a, L);
  lin_bwd(l, lm_k, din, a.dk.view({N, KV * hs}), in, a, L);
  lin_bwd(l, lm_v, din, a.dv.view({N, KV * hs}), in, a, L);
}

// The MLP's backward on the rows of `in` (N, C), as mlp_fwd.
void decoder::mlp_bwd(activations& a, int64_t l, const tensor& in, const tensor& dout, tensor& din) {
  const int64_t N = in.numel() / cfg_.dim, F = cfg_.hidden_dim, NT = a.B * a.T;
  auto& L = a.at(l);
  tensor dact = a.dact.rows(0, N), dup = a.dup.rows(0, N);
  dact.zero_();
  lin_bwd(l, lm_down, dact, dout, L.act.view({NT, F}).rows(0, N), a, L);
  if (cfg_.gated_mlp) {
    tensor dgate = a.dgate.rows(0, N);
    ops::swiglu_backward(dgate, dup, dact, L.gate.view({NT, F}).rows(0, N), L.up.view({NT, F}).rows(0, N));
    lin_bwd(l, lm_gate, din, dgate, in, a, L);
  } else {
    ops::activation_backward(dup, dact, L.up.view({NT, F}).rows(0, N), cfg_.act);
  }
  lin_bwd(l, lm_up, din, dup, in, a, L);
}

// The backward of last_layer_forward_kept. In: a.keep_dres (Nh, C), the gradient of the kept rows'
// outputs. Out: a.dres (N, C), the gradient of the layer's input (its residual path 0 before keep_from).
void decoder::last_layer_backward_kept(activations& a, int64_t l) {
  const int64_t B = a.B, T = a.T, N = B * T, C = cfg_.dim, t0 = a.keep_from, Nh = B * (T - t0);
  auto& L = a.at(l);
  const auto& W = w_.layers[l];
  auto& G = g_.layers[l];
  // MLP: out = r2 + mlp(ln2(r2)) at the kept rows
  tensor dln = a.dln.rows(0, Nh);
  dln.zero_();
  const tensor r2 = L.resid2.view({N, C}).rows(0, Nh);
  tensor kdres = a.keep_dres.rows(0, Nh), katty = a.keep_atty.rows(0, Nh), kdatty = kept_view(a.keep_datty, a, C, dev_);
  mlp_bwd(a, l, L.ln2.view({N, C}).rows(0, Nh), kdres, dln);
  norm_backward(kdres, G.ln2_w, G.ln2_b, dln, r2, W.ln2_w, first_rows(L.ln2_mean, Nh),
                first_rows(L.ln2_rstd, Nh));
  // o_proj at the kept rows, then attention at every position: r2 = x + o_proj(attention(ln1(x)))
  kdatty.zero_();
  lin_bwd(l, lm_o, kdatty, kdres, katty, a, L);
  scatter_kept(a.datty, kdatty, B, T, t0);
  a.dln.zero_();
  attn_core_bwd(a, l, L.ln1.view({N, C}), a.dln);
  scatter_kept(a.dres, kdres, B, T, t0);  // the residual path
  norm_backward(a.dres, G.ln1_w, G.ln1_b, a.dln, a.resid[l].view({N, C}), W.ln1_w, L.ln1_mean, L.ln1_rstd);
}

// In: a.dres = d resid[l+1]. Out: a.dres = d resid[l].
void decoder::backward_post_layer(activations& a, int64_t l) {
  const int64_t N = a.B * a.T, C = cfg_.dim;
  auto& L = a.at(l);
  const auto& W = w_.layers[l];
  auto& G = g_.layers[l];
  // LN2: d resid3 -> a.dln
  a.dln.zero_();
  norm_backward(a.dln, G.ln2_w, G.ln2_b, a.dres, L.resid3.view({N, C}), W.ln2_w, L.ln2_mean, L.ln2_rstd);
  // MLP with its residual: d ln1 = d resid3 + mlp backward -> a.dres
  a.dres.copy_from(a.dln);
  mlp_bwd(a, l, L.ln1.view({N, C}), a.dln, a.dres);
  // LN1: d resid2 -> a.dln
  a.dln.zero_();
  norm_backward(a.dln, G.ln1_w, G.ln1_b, a.dres, L.resid2.view({N, C}), W.ln1_w, L.ln1_mean, L.ln1_rstd);
  // attention with its residual: d x = d resid2 + attention backward -> a.dres
  a.dres.copy_from(a.dln);
  attn_bwd(a, l, a.resid[l].view({N, C}), a.dln, a.dres);
}

// ------------------------------------------------------------------ training backward

// The head's backward: dx (Nh, E) += dout W, dw += doutᵀ x for dout (N, W) and its input x (Nh, E),
// Nh = B * (T - keep_from): with keep_from, each sequence's kept rows of dout (the rest are not read).
void decoder::head_backward(const activations& a, tensor& dx, tensor& dw, const tensor& dout, const tensor& x,
                            const tensor& w) {
  tensor no_db;
  const int64_t t0 = a.keep_from, T = a.T, Tk = T - t0;
  if (t0 == 0) {
    ops::linear_backward(dx, dw, no_db, dout, x, w);
    return;
  }
  for (int64_t b = 0; b < a.B; ++b) {
    tensor dxb = dx.rows(b * Tk, (b + 1) * Tk);
    ops::linear_backward(dxb, dw, no_db, dout.rows(b * T + t0, (b + 1) * T), x.rows(b * Tk, (b + 1) * Tk), w);
  }
}

void decoder::backward(activations& a, const tensor& dlogits_in) {
  if (!value_head_ && !a.logits.defined()) throw std::logic_error("decoder::backward: no forward to differentiate");
  if (!g_.flat.defined() && !external_grads_) zero_grad();
  const int64_t B = a.B, T = a.T, N = B * T;
  const int64_t C = cfg_.dim, H = cfg_.n_heads, KV = cfg_.n_kv_heads, hs = cfg_.head_dim();
  const int64_t F = cfg_.hidden_dim, V = cfg_.vocab_size, NL = cfg_.n_layers;
  ensure(a.dlnf, {N, C}, dev_);
  ensure(a.dres, {N, C}, dev_);
  ensure(a.dln, {N, C}, dev_);
  ensure(a.datty, {N, C}, dev_);
  ensure(a.dact, {N, F}, dev_);
  ensure(a.dup, {N, F}, dev_);
  if (cfg_.gated_mlp) ensure(a.dgate, {N, F}, dev_);
  ensure(a.dq, {B, T, H, hs}, dev_);
  ensure(a.dk, {B, T, KV, hs}, dev_);
  ensure(a.dv, {B, T, KV, hs}, dev_);
  const bool proj = cfg_.has_projection(), post = cfg_.post_norm;
  const int64_t E = cfg_.embed_width();
  if (proj) {
    ensure(a.dhout, {N, E}, dev_);
    ensure(a.demb, {N, E}, dev_);
  }

  using ph = param_hooks::phase;
  const int head_block = static_cast<int>(NL) + 1;
  hook_acquire(head_block, ph::backward);
  if (cfg_.tied_embeddings) hook_acquire(0, ph::backward);
  a.dlnf.zero_();
  tensor no_db;
  // keep_from (forward): the head ran at the kept rows only (Nh of them, compacted); the gradients
  // given before keep_from are not read (they must be 0: those outputs were 0 constants)
  const int64_t t0 = a.keep_from, Nh = B * (T - t0);
  // the head reads lnf (N, C), or project_out(lnf) (N, E) with a projection
  tensor head_in = proj ? a.hout.view({N, E}).rows(0, Nh) : a.lnf.view({N, C}).rows(0, Nh);
  tensor dhead_in = proj ? a.dhout.rows(0, Nh) : a.dlnf.rows(0, Nh);
  if (proj) a.dhout.zero_();
  if (value_head_) {
    if (!dlogits_in.defined() || dlogits_in.numel() != N)
      throw std::invalid_argument("decoder::backward: a value-head model needs dvalues (B, T)");
    head_backward(a, dhead_in, g_.v_head, on_device(dlogits_in, dev_).view({N, 1}), head_in, w_.v_head);
  } else {
    tensor dlogits;
    if (dlogits_in.defined()) {
      if (dlogits_in.numel() != N * V)
        throw std::invalid_argument("decoder::backward: dlogits " + dlogits_in.str() + " must be (B, T, V)");
      dlogits = on_device(dlogits_in, dev_).view({N, V});
    } else {
      if (!a.targets.defined()) throw std::logic_error("decoder::backward: forward ran without targets");
      ensure(a.dlogits, {N, V}, dev_);
      dlogits = a.dlogits;
      const int64_t norm = a.loss_norm > 0 ? a.loss_norm : a.n_valid;
      float dloss = norm > 0 ? a.loss_scale / static_cast<float>(norm) : 0.0f;
      ops::cross_entropy_backward(dlogits, a.logits.view({N, V}), a.targets.view({N}), dloss);
    }
    // classifier (its weight gradient only when the base trains)
    tensor dhead = base_trainable_ ? g_.lm_head : tensor{};
    head_backward(a, dhead_in, dhead, dlogits, head_in, w_.lm_head);
  }
  if (proj) {
    tensor dpo = base_trainable_ ? g_.project_out : tensor{};
    tensor dlnf = a.dlnf.rows(0, Nh);
    ops::linear_backward(dlnf, dpo, no_db, a.dhout.rows(0, Nh), a.lnf.view({N, C}).rows(0, Nh), w_.project_out);
  }
  // the final norm: into a.dres (N, C), or with keep_from into a.keep_dres (Nh, C), which the kept last
  // layer reads (or, post-norm, which goes to its rows of a.dres)
  tensor dres = a.dres;
  if (t0 > 0) dres = kept_view(a.keep_dres, a, C, dev_);
  dres.zero_();
  const tensor hx = t0 > 0 ? a.keep_out.rows(0, Nh) : a.resid[NL].view({N, C});
  if (post) dres.copy_from(a.dlnf.rows(0, Nh));
  else norm_backward(dres, g_.lnf_w, g_.lnf_b, a.dlnf.rows(0, Nh), hx, w_.lnf_w, first_rows(a.lnf_mean, Nh),
                     first_rows(a.lnf_rstd, Nh));
  if (t0 > 0 && !kept_last_layer(a)) scatter_kept(a.dres, dres, B, T, t0);
  hook_grads_ready(head_block);
  // A tied embedding's gradient so far (the head's share) is handed over now, so that its
  // buffer does not live through every layer's backward; the lookup's share follows at the end.
  if (cfg_.tied_embeddings) hook_grads_ready(0);
  hook_release(head_block, ph::backward);
  if (cfg_.tied_embeddings) hook_release(0, ph::backward);

  for (int64_t l = NL - 1; l >= 0; --l) {
    const int blk = static_cast<int>(l) + 1;
    hook_acquire(blk, ph::backward);
    if (a.checkpointed && a.slot_layer != l) recompute_layer(a, l);  // under the same acquire: one gather
    auto& L = a.at(l);
    const auto& W = w_.layers[l];
    auto& G = g_.layers[l];
    if (post) {
      backward_post_layer(a, l);
      hook_grads_ready(blk);
      hook_release(blk, ph::backward);
      continue;
    }
    if (l == NL - 1 && kept_last_layer(a)) {
      last_layer_backward_kept(a, l);
      hook_grads_ready(blk);
      hook_release(blk, ph::backward);
      continue;
    }
    // MLP: resid[l+1] = resid2 + mlp(ln2(resid2))
    a.dln.zero_();
    mlp_bwd(a, l, L.ln2.view({N, C}), a.dres, a.dln);
    norm_backward(a.dres, G.ln2_w, G.ln2_b, a.dln, L.resid2.view({N, C}), W.ln2_w, L.ln2_mean, L.ln2_rstd);
    // attention: resid2 = resid[l] + attn(ln1(resid[l]))
    a.dln.zero_();
    attn_bwd(a, l, L.ln1.view({N, C}), a.dres, a.dln);
    norm_backward(a.dres, G.ln1_w, G.ln1_b, a.dln, a.resid[l].view({N, C}), W.ln1_w, L.ln1_mean, L.ln1_rstd);
    hook_grads_ready(blk);
    hook_release(blk, ph::backward);
  }
  hook_acquire(0, ph::backward, proj);  // the lookup's gradient needs no weights; project_in does
  if (proj) {
    a.demb.zero_();
    tensor dpi = base_trainable_ ? g_.project_in : tensor{};
    ops::linear_backward(a.demb, dpi, no_db, a.dres, a.emb.view({N, E}), w_.project_in);
    ops::embedding_backward(g_.wte, a.demb, a.ids.view({N}));
  } else {
    ops::embedding_backward(g_.wte, a.dres, a.ids.view({N}));
  }
  if (!cfg_.use_rope) {
    tensor pos = a.pos_ids;  // forward's positions + position_offset, on dev_
    if (!pos.defined() || pos.numel() != N) {
      pos = a.positions.to(device::cpu()).clone();
      int32_t* pp = pos.data<int32_t>();
      for (int64_t i = 0; i < N; ++i) pp[i] += static_cast<int32_t>(cfg_.position_offset);
      pos = pos.view({N}).to(dev_);
    }
    ops::embedding_backward(g_.wpe, a.dres, pos.view({N}));
  }
  hook_grads_ready(0);
  hook_release(0, ph::backward);
}

// ------------------------------------------------------------------ cached decoding

kv_cache decoder::make_cache(int64_t B, int64_t S) const {
  if (S > cfg_.max_seq_len) S = cfg_.max_seq_len;
  kv_cache c;
  c.B = B;
  c.S = S;
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    c.k.push_back(tensor::zeros({B, S, cfg_.n_kv_heads, cfg_.head_dim()}, dtype::f32, dev_));
    c.v.push_back(tensor::zeros({B, S, cfg_.n_kv_heads, cfg_.head_dim()}, dtype::f32, dev_));
  }
  return c;
}

tensor decoder::forward_cached(kv_cache& cache, const tensor& ids, const tensor& positions_in, const tensor& mask,
                               int64_t n_past, bool all_logits) {
  const int64_t B = ids.size(0), Tq = ids.size(1), N = B * Tq;
  const int64_t C = cfg_.dim, H = cfg_.n_heads, KV = cfg_.n_kv_heads, hs = cfg_.head_dim();
  const int64_t F = cfg_.hidden_dim, V = cfg_.vocab_size;
  const int64_t n_keys = n_past + Tq;
  if (B != cache.B) throw std::invalid_argument("forward_cached: batch " + std::to_string(B) + " != cache batch");
  if (n_keys > cache.S)
    throw std::invalid_argument("forward_cached: " + std::to_string(n_keys) + " positions exceed the KV cache (" +
                                std::to_string(cache.S) + ", max_seq_len)");
  // positions on the host (learned positions index from there), then on dev_ (RoPE)
  const tensor pos_host = positions_in.defined() ? positions_in.to(device::cpu()) : make_positions(B, Tq, mask, n_past);
  const tensor positions = positions_in.defined() && positions_in.dev() == dev_ ? positions_in : pos_host.to(dev_);
  const tensor ids_d = on_device(ids, dev_), mask_d = on_device(mask, dev_);
  const bool ln = cfg_.norm == norm_kind::layernorm;
  const tensor rot = rope_rotations(pos_host);  // scaled RoPE only

  auto x = tensor::empty({N, C}, dtype::f32, dev_);
  auto h = tensor::empty({N, C}, dtype::f32, dev_);
  auto mean = ln ? tensor::empty({N}, dtype::f32, dev_) : tensor{};
  auto rstd = tensor::empty({N}, dtype::f32, dev_);
  auto q = tensor::empty({B, Tq, H, hs}, dtype::f32, dev_);
  auto k = tensor::empty({B, Tq, KV, hs}, dtype::f32, dev_);
  auto v = tensor::empty({B, Tq, KV, hs}, dtype::f32, dev_);
  auto y = tensor::empty({B, Tq, H, hs}, dtype::f32, dev_);
  auto up = tensor::empty({N, F}, dtype::f32, dev_);
  auto gate = cfg_.gated_mlp ? tensor::empty({N, F}, dtype::f32, dev_) : tensor{};
  auto act = tensor::empty({N, F}, dtype::f32, dev_);
  tensor no_att;
  const bool proj = cfg_.has_projection(), post = cfg_.post_norm;
  const int64_t E = cfg_.embed_width();
  using ph = param_hooks::phase;
  const int head_block = static_cast<int>(cfg_.n_layers) + 1;
  // the caller reads each sequence's last position only: the last layer after attention runs on those rows
  const bool last_only = !all_logits && Tq > 1;

  hook_acquire(0, ph::forward);
  if (proj) {
    auto e = tensor::empty({N, E}, dtype::f32, dev_);
    ops::embedding_forward(e, ids_d.view({N}), w_.wte);
    ops::linear_forward(x, e, w_.project_in, none_tensor);
  } else {
    ops::embedding_forward(x, ids_d.view({N}), w_.wte);
  }
  if (!cfg_.use_rope) {
    auto pos = pos_host.clone();
    int32_t* pp = pos.data<int32_t>();
    for (int64_t i = 0; i < N; ++i) pp[i] += static_cast<int32_t>(cfg_.position_offset);
    ops::embedding_forward(h, pos.view({N}).to(dev_), w_.wpe);
    ops::axpy(x, h);
  }
  hook_release(0, ph::forward);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    hook_acquire(static_cast<int>(l) + 1, ph::forward);
    const auto& W = w_.layers[l];
    if (post) h.copy_from(x);  // attention reads x itself
    else norm_forward(h, mean, rstd, x, W.ln1_w, W.ln1_b);
    tensor q2 = q.view({N, H * hs}), k2 = k.view({N, KV * hs}), v2 = v.view({N, KV * hs});
    lin_fwd(l, lm_q, q2, h, nullptr);
    lin_fwd(l, lm_k, k2, h, nullptr);
    lin_fwd(l, lm_v, v2, h, nullptr);
    if (cfg_.use_rope) {
      rope_apply(q, positions, rot, false);
      rope_apply(k, positions, rot, false);
    }
    if (dev_.kind == device_kind::cpu) {
      for (int64_t b = 0; b < B; ++b) {
        cache.k[l].rows(b, b + 1).view({cache.S, KV * hs}).rows(n_past, n_keys).copy_from(k.rows(b, b + 1));
        cache.v[l].rows(b, b + 1).view({cache.S, KV * hs}).rows(n_past, n_keys).copy_from(v.rows(b, b + 1));
      }
    } else {  // one strided copy per tensor: B rows of Tq * KV * hs at pitch S * KV * hs
      const int64_t row = Tq * KV * hs, pitch = cache.S * KV * hs, at = n_past * KV * hs;
      copy_rows_strided(cache.k[l], at, pitch, k, 0, row, row, B);
      copy_rows_strided(cache.v[l], at, pitch, v, 0, row, row, B);
    }
    ops::attention_forward(y, no_att, q, cache.k[l], cache.v[l], mask_d, n_keys);
    tensor yv = y.view({N, C});
    if (l == cfg_.n_layers - 1 && last_only) {
      // from here on each row is its own, and only each sequence's last position is read: o_proj, the MLP
      // and the head run on B rows (a prefill of Tq positions skips Tq - 1 of them; as forward's keep_from)
      auto yl = tensor::empty({B, C}, dtype::f32, dev_), xl = tensor::empty({B, C}, dtype::f32, dev_);
      copy_rows_strided(yl, 0, C, yv, (Tq - 1) * C, Tq * C, C, B);
      copy_rows_strided(xl, 0, C, x, (Tq - 1) * C, Tq * C, C, B);
      yv = yl;
      x = xl;
      h = tensor::empty({B, C}, dtype::f32, dev_);
      mean = ln ? tensor::empty({B}, dtype::f32, dev_) : tensor{};
      rstd = tensor::empty({B}, dtype::f32, dev_);
      up = up.rows(0, B);
      act = act.rows(0, B);
      if (gate.defined()) gate = gate.rows(0, B);
    }
    lin_fwd(l, lm_o, h, yv, nullptr);
    ops::axpy(x, h);
    if (post) {  // x = LN1(x + attn); h = x (the MLP input and its residual)
      norm_forward(h, mean, rstd, x, W.ln1_w, W.ln1_b);
      x.copy_from(h);
    } else {
      norm_forward(h, mean, rstd, x, W.ln2_w, W.ln2_b);
    }
    lin_fwd(l, lm_up, up, h, nullptr);
    if (cfg_.gated_mlp) {
      lin_fwd(l, lm_gate, gate, h, nullptr);
      ops::swiglu_forward(act, gate, up);
    } else {
      ops::activation_forward(act, up, cfg_.act);
    }
    lin_fwd(l, lm_down, h, act, nullptr);
    ops::axpy(x, h);
    if (post) {  // x = LN2(h + mlp(h))
      norm_forward(h, mean, rstd, x, W.ln2_w, W.ln2_b);
      x.copy_from(h);
    }
    hook_release(static_cast<int>(l) + 1, ph::forward);
  }
  head_blocks guard(hooks_, head_block, cfg_.tied_embeddings);  // acquired until every return below
  // x holds the rows the caller reads: every position (all_logits), or each sequence's last (the last layer
  // took them, or Tq = 1); the head reads lnf(x) (no final norm with post_norm), then project_out
  if (post) h.copy_from(x);
  else norm_forward(h, mean, rstd, x, w_.lnf_w, w_.lnf_b);
  tensor hh = h;
  if (proj) {
    hh = tensor::empty({x.size(0), E}, dtype::f32, dev_);
    ops::linear_forward(hh, h, w_.project_out, none_tensor);
  }
  auto out = tensor::empty({x.size(0), value_head_ ? 1 : V}, dtype::f32, dev_);
  ops::linear_forward(out, hh, value_head_ ? w_.v_head : w_.lm_head, none_tensor);
  if (value_head_) return all_logits ? out.view({B, Tq}) : out.view({B});
  return all_logits ? out.view({B, Tq, V}) : out;
}

}  // namespace flowrun
