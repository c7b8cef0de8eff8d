#include "models/decoder.h"

#include <cmath>
#include <random>
#include <stdexcept>

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
  add("model.embed_tokens.weight", {cfg_.vocab_size, C});
  if (!cfg_.use_rope) add("model.embed_positions.weight", {cfg_.max_seq_len + cfg_.position_offset, C});
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, true);
    if (ln_bias) add(p + "input_layernorm.bias", {C}, true);
    add(p + "self_attn.q_proj.weight", {qd, C});
    if (cfg_.bias) add(p + "self_attn.q_proj.bias", {qd}, true);
    add(p + "self_attn.k_proj.weight", {kvd, C});
    if (cfg_.bias) add(p + "self_attn.k_proj.bias", {kvd}, true);
    add(p + "self_attn.v_proj.weight", {kvd, C});
    if (cfg_.bias) add(p + "self_attn.v_proj.bias", {kvd}, true);
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
  add("model.norm.weight", {C}, true);
  if (ln_bias) add("model.norm.bias", {C}, true);
  if (!cfg_.tied_embeddings) add("lm_head.weight", {cfg_.vocab_size, C});
  bind(w_, tensor::zeros({n_params_}, dtype::f32, dev_));
}

void decoder::bind(weights& dst, const tensor& flat) {
  dst = weights{};
  dst.flat = flat;
  for (auto& e : entries_) dst.by_name[e.name] = flat.flat_view(e.offset, e.shape);
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
  if (!g_.flat.defined()) bind(g_, tensor::zeros({n_params_}, dtype::f32, dev_));
  else g_.flat.zero_();
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

// ------------------------------------------------------------------ training forward

double decoder::forward(activations& a, const tensor& ids, const tensor& targets, const tensor& mask,
                        const tensor& positions) {
  if (ids.dim() != 2 || ids.type() != dtype::i32)
    throw std::invalid_argument("decoder::forward: ids must be (B, T) i32, got " + ids.str());
  const int64_t B = ids.size(0), T = ids.size(1), N = B * T;
  const int64_t C = cfg_.dim, H = cfg_.n_heads, KV = cfg_.n_kv_heads, hs = cfg_.head_dim();
  const int64_t F = cfg_.hidden_dim, V = cfg_.vocab_size, NL = cfg_.n_layers;
  if (T > cfg_.max_seq_len)
    throw std::invalid_argument("decoder::forward: T = " + std::to_string(T) + " exceeds max_seq_len " +
                                std::to_string(cfg_.max_seq_len));
  const bool ln = cfg_.norm == norm_kind::layernorm;

  // (re)allocate activations when the batch shape changes
  if (a.B != B || a.T != T || a.layers.size() != static_cast<size_t>(NL)) {
    a = activations{};
    a.B = B;
    a.T = T;
    a.resid.resize(NL + 1);
    for (auto& r : a.resid) ensure(r, {B, T, C}, dev_);
    a.layers.resize(NL);
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
    ensure(a.logits, {B, T, V}, dev_);
    ensure(a.losses, {N}, dev_);
  }
  a.ids = ids;
  a.targets = targets;
  a.mask = mask;
  a.positions = positions.defined() ? positions : make_positions(B, T, mask);

  // embeddings: x = wte[ids] (+ wpe[pos + offset])
  tensor ids_flat = ids.view({N});
  tensor x0 = a.resid[0].view({N, C});
  ops::embedding_forward(x0, ids_flat, w_.wte);
  if (!cfg_.use_rope) {
    auto pos = a.positions.clone();
    int32_t* pp = pos.data<int32_t>();
    for (int64_t i = 0; i < N; ++i) pp[i] += static_cast<int32_t>(cfg_.position_offset);
    auto pe = tensor::empty({N, C}, dtype::f32, dev_);
    ops::embedding_forward(pe, pos.view({N}), w_.wpe);
    ops::axpy(x0, pe);
  }

  for (int64_t l = 0; l < NL; ++l) {
    auto& L = a.layers[l];
    const auto& W = w_.layers[l];
    tensor x = a.resid[l].view({N, C});
    tensor ln1 = L.ln1.view({N, C});
    norm_forward(ln1, L.ln1_mean, L.ln1_rstd, x, W.ln1_w, W.ln1_b);
    tensor q = L.q.view({N, H * hs}), k = L.k.view({N, KV * hs}), v = L.v.view({N, KV * hs});
    ops::linear_forward(q, ln1, W.wq, W.bq);
    ops::linear_forward(k, ln1, W.wk, W.bk);
    ops::linear_forward(v, ln1, W.wv, W.bv);
    if (cfg_.use_rope) {
      ops::rope_forward(L.q, a.positions, cfg_.rope_theta, cfg_.rope);
      ops::rope_forward(L.k, a.positions, cfg_.rope_theta, cfg_.rope);
    }
    ops::attention_forward(L.atty, L.att, L.q, L.k, L.v, mask);
    tensor r2 = L.resid2.view({N, C});
    ops::linear_forward(r2, L.atty.view({N, C}), W.wo, W.bo);
    ops::axpy(r2, x);
    tensor ln2 = L.ln2.view({N, C});
    norm_forward(ln2, L.ln2_mean, L.ln2_rstd, r2, W.ln2_w, W.ln2_b);
    tensor up = L.up.view({N, F}), act = L.act.view({N, F});
    ops::linear_forward(up, ln2, W.w_up, W.b_up);
    if (cfg_.gated_mlp) {
      tensor gate = L.gate.view({N, F});
      ops::linear_forward(gate, ln2, W.w_gate, W.b_gate);
      ops::swiglu_forward(act, gate, up);
    } else {
      ops::activation_forward(act, up, cfg_.act);
    }
    tensor xo = a.resid[l + 1].view({N, C});
    ops::linear_forward(xo, act, W.w_down, W.b_down);
    ops::axpy(xo, r2);
  }
  tensor lnf = a.lnf.view({N, C});
  norm_forward(lnf, a.lnf_mean, a.lnf_rstd, a.resid[NL].view({N, C}), w_.lnf_w, w_.lnf_b);
  tensor logits = a.logits.view({N, V});
  ops::linear_forward(logits, lnf, w_.lm_head, none_tensor);
  if (!targets.defined()) {
    a.n_valid = 0;
    return 0.0;
  }
  if (targets.shape() != ids.shape())
    throw std::invalid_argument("decoder::forward: targets " + targets.str() + " must match ids " + ids.str());
  return ops::cross_entropy_forward(a.losses, logits, targets.view({N}), &a.n_valid);
}

// ------------------------------------------------------------------ training backward

void decoder::backward(activations& a, const tensor& dlogits_in) {
  if (!g_.flat.defined()) zero_grad();
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

  tensor dlogits;
  if (dlogits_in.defined()) {
    if (dlogits_in.numel() != N * V)
      throw std::invalid_argument("decoder::backward: dlogits " + dlogits_in.str() + " must be (B, T, V)");
    dlogits = dlogits_in.view({N, V});
  } else {
    if (!a.targets.defined()) throw std::logic_error("decoder::backward: forward ran without targets");
    ensure(a.dlogits, {N, V}, dev_);
    dlogits = a.dlogits;
    float dloss = a.n_valid > 0 ? 1.0f / static_cast<float>(a.n_valid) : 0.0f;
    ops::cross_entropy_backward(dlogits, a.logits.view({N, V}), a.targets.view({N}), dloss);
  }

  // classifier and final norm
  a.dlnf.zero_();
  tensor no_db;
  ops::linear_backward(a.dlnf, g_.lm_head, no_db, dlogits, a.lnf.view({N, C}), w_.lm_head);
  a.dres.zero_();
  norm_backward(a.dres, g_.lnf_w, g_.lnf_b, a.dlnf, a.resid[NL].view({N, C}), w_.lnf_w, a.lnf_mean, a.lnf_rstd);

  for (int64_t l = NL - 1; l >= 0; --l) {
    auto& L = a.layers[l];
    const auto& W = w_.layers[l];
    auto& G = g_.layers[l];
    // MLP: resid[l+1] = resid2 + down(act(ln2(resid2)))
    a.dact.zero_();
    ops::linear_backward(a.dact, G.w_down, G.b_down, a.dres, L.act.view({N, F}), W.w_down);
    tensor ln2 = L.ln2.view({N, C});
    a.dln.zero_();
    if (cfg_.gated_mlp) {
      ops::swiglu_backward(a.dgate, a.dup, a.dact, L.gate.view({N, F}), L.up.view({N, F}));
      ops::linear_backward(a.dln, G.w_gate, G.b_gate, a.dgate, ln2, W.w_gate);
    } else {
      ops::activation_backward(a.dup, a.dact, L.up.view({N, F}), cfg_.act);
    }
    ops::linear_backward(a.dln, G.w_up, G.b_up, a.dup, ln2, W.w_up);
    norm_backward(a.dres, G.ln2_w, G.ln2_b, a.dln, L.resid2.view({N, C}), W.ln2_w, L.ln2_mean, L.ln2_rstd);
    // attention: resid2 = resid[l] + o_proj(attn(ln1(resid[l])))
    a.datty.zero_();
    ops::linear_backward(a.datty, G.wo, G.bo, a.dres, L.atty.view({N, C}), W.wo);
    tensor datty4 = a.datty.view({B, T, H, hs});
    ops::attention_backward(a.dq, a.dk, a.dv, datty4, L.q, L.k, L.v, L.att);
    if (cfg_.use_rope) {
      ops::rope_backward(a.dq, a.positions, cfg_.rope_theta, cfg_.rope);
      ops::rope_backward(a.dk, a.positions, cfg_.rope_theta, cfg_.rope);
    }
    tensor ln1 = L.ln1.view({N, C});
    a.dln.zero_();
    ops::linear_backward(a.dln, G.wq, G.bq, a.dq.view({N, H * hs}), ln1, W.wq);
    ops::linear_backward(a.dln, G.wk, G.bk, a.dk.view({N, KV * hs}), ln1, W.wk);
    ops::linear_backward(a.dln, G.wv, G.bv, a.dv.view({N, KV * hs}), ln1, W.wv);
    norm_backward(a.dres, G.ln1_w, G.ln1_b, a.dln, a.resid[l].view({N, C}), W.ln1_w, L.ln1_mean, L.ln1_rstd);
  }
  ops::embedding_backward(g_.wte, a.dres, a.ids.view({N}));
  if (!cfg_.use_rope) {
    auto pos = a.positions.clone();
    int32_t* pp = pos.data<int32_t>();
    for (int64_t i = 0; i < N; ++i) pp[i] += static_cast<int32_t>(cfg_.position_offset);
    ops::embedding_backward(g_.wpe, a.dres, pos.view({N}));
  }
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
  tensor positions = positions_in.defined() ? positions_in : make_positions(B, Tq, mask, n_past);
  const bool ln = cfg_.norm == norm_kind::layernorm;

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

  ops::embedding_forward(x, ids.view({N}), w_.wte);
  if (!cfg_.use_rope) {
    auto pos = positions.to(device::cpu()).clone();
    int32_t* pp = pos.data<int32_t>();
    for (int64_t i = 0; i < N; ++i) pp[i] += static_cast<int32_t>(cfg_.position_offset);
    ops::embedding_forward(h, pos.view({N}).to(dev_), w_.wpe);
    ops::axpy(x, h);
  }
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const auto& W = w_.layers[l];
    norm_forward(h, mean, rstd, x, W.ln1_w, W.ln1_b);
    tensor q2 = q.view({N, H * hs}), k2 = k.view({N, KV * hs}), v2 = v.view({N, KV * hs});
    ops::linear_forward(q2, h, W.wq, W.bq);
    ops::linear_forward(k2, h, W.wk, W.bk);
    ops::linear_forward(v2, h, W.wv, W.bv);
    if (cfg_.use_rope) {
      ops::rope_forward(q, positions, cfg_.rope_theta, cfg_.rope);
      ops::rope_forward(k, positions, cfg_.rope_theta, cfg_.rope);
    }
    for (int64_t b = 0; b < B; ++b) {
      cache.k[l].rows(b, b + 1).view({cache.S, KV * hs}).rows(n_past, n_keys).copy_from(k.rows(b, b + 1));
      cache.v[l].rows(b, b + 1).view({cache.S, KV * hs}).rows(n_past, n_keys).copy_from(v.rows(b, b + 1));
    }
    ops::attention_forward(y, no_att, q, cache.k[l], cache.v[l], mask, n_keys);
    ops::linear_forward(h, y.view({N, C}), W.wo, W.bo);
    ops::axpy(x, h);
    norm_forward(h, mean, rstd, x, W.ln2_w, W.ln2_b);
    ops::linear_forward(up, h, W.w_up, W.b_up);
    if (cfg_.gated_mlp) {
      ops::linear_forward(gate, h, W.w_gate, W.b_gate);
      ops::swiglu_forward(act, gate, up);
    } else {
      ops::activation_forward(act, up, cfg_.act);
    }
    ops::linear_forward(h, act, W.w_down, W.b_down);
    ops::axpy(x, h);
  }
  if (all_logits) {
    norm_forward(h, mean, rstd, x, w_.lnf_w, w_.lnf_b);
    auto logits = tensor::empty({B, Tq, V}, dtype::f32, dev_);
    tensor l2 = logits.view({N, V});
    ops::linear_forward(l2, h, w_.lm_head, none_tensor);
    return logits;
  }
  // last position of each sequence only
  auto xl = tensor::empty({B, C}, dtype::f32, dev_);
  for (int64_t b = 0; b < B; ++b) xl.rows(b, b + 1).copy_from(x.rows(b * Tq + Tq - 1, b * Tq + Tq));
  auto hl = tensor::empty({B, C}, dtype::f32, dev_);
  auto ml = ln ? tensor::empty({B}, dtype::f32, dev_) : tensor{};
  auto rl = tensor::empty({B}, dtype::f32, dev_);
  norm_forward(hl, ml, rl, xl, w_.lnf_w, w_.lnf_b);
  auto logits = tensor::empty({B, V}, dtype::f32, dev_);
  ops::linear_forward(logits, hl, w_.lm_head, none_tensor);
  return logits;
}

// ------------------------------------------------------------------ AdamW

adamw_optimizer::adamw_optimizer(decoder& model, const ops::adamw_config& cfg) : model_(model), cfg_(cfg) {
  m_ = tensor::zeros({model.num_parameters()}, dtype::f32, model.w().flat.dev());
  v_ = tensor::zeros({model.num_parameters()}, dtype::f32, model.w().flat.dev());
}

void adamw_optimizer::step(float lr) {
  ++t_;
  ops::adamw_config c = cfg_;
  if (lr >= 0) c.lr = lr;
  auto& P = model_.w().flat;
  auto& G = model_.grads().flat;
  if (c.weight_decay == 0.0f) {
    ops::adamw_step(P, G, m_, v_, t_, c);
    return;
  }
  // runs of consecutive parameters with the same decay setting, one kernel call each
  const auto& es = model_.params();
  size_t i = 0;
  while (i < es.size()) {
    size_t j = i;
    while (j + 1 < es.size() && es[j + 1].no_decay == es[i].no_decay) ++j;
    int64_t off = es[i].offset, n = es[j].offset + es[j].numel - off;
    auto p = P.flat_view(off, {n});
    auto g = G.flat_view(off, {n});
    auto m = m_.flat_view(off, {n});
    auto v = v_.flat_view(off, {n});
    ops::adamw_config ci = c;
    if (es[i].no_decay) ci.weight_decay = 0.0f;
    ops::adamw_step(p, g, m, v, t_, ci);
    i = j + 1;
  }
}

}  // namespace flowrun
