#include "models/train/zero.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "models/train/zero_device.h"
#include "runtime/kernels/ops.h"
#include "runtime/tensor/half_bits.h"

namespace flowrun {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string mb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

int64_t bytes_of(const tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(dtype_size(t.type())) : 0; }

int64_t activation_bytes(const activations& a) {
  int64_t n = 0;
  for (auto& r : a.resid) n += bytes_of(r);
  for (auto& L : a.layers) {
    for (const tensor* t : {&L.ln1, &L.ln1_mean, &L.ln1_rstd, &L.q, &L.k, &L.v, &L.att, &L.atty, &L.resid2,
                            &L.resid3, &L.ln2, &L.ln2_mean, &L.ln2_rstd, &L.gate, &L.up, &L.act})
      n += bytes_of(*t);
    for (int m = 0; m < lm_count; ++m) n += bytes_of(L.lora_u[m]) + bytes_of(L.lora_mask[m]);
  }
  for (const tensor* t : {&a.emb, &a.lnf, &a.lnf_mean, &a.lnf_rstd, &a.hout, &a.logits, &a.values, &a.losses,
                          &a.dlogits, &a.dlnf, &a.dres, &a.dln, &a.dact, &a.dgate, &a.dup, &a.datty, &a.dq, &a.dk,
                          &a.dv, &a.lora_du, &a.lora_dx, &a.dhout, &a.demb, &a.keep_x, &a.keep_atty, &a.keep_out,
                          &a.keep_dres, &a.keep_datty})
    n += bytes_of(*t);
  return n;
}

// ---- element work on the buffers' device: the host code as before on the CPU (bit for
// bit), the kernels of models/train/zero_device.cu on a CUDA device.

bool on_gpu(const tensor& t) { return t.defined() && t.dev().kind == device_kind::cuda; }

#ifndef FLOWRUN_HAVE_CUDA
[[noreturn]] void no_cuda() {
  throw std::logic_error("zero_engine: a CUDA tensor in a build without the CUDA backend");
}
#endif

// t (f32, bf16 or f16) converted to `to` on t's device (round to nearest even).
tensor convert(const tensor& t, dtype to) {
  if (!on_gpu(t) || to == t.type()) return t.to(to);
#ifdef FLOWRUN_HAVE_CUDA
  tensor r = tensor::empty(t.shape(), to, t.dev());
  detail::cuda_convert(r.raw(), to, t.raw(), t.type(), t.numel(), to, t.dev().index);
  return r;
#else
  no_cuda();
#endif
}

// d[i] = s[i] rounded to `via` (bf16/f16, round to nearest even, half_bits) and back, on the host;
// d may be s. The bits of src.to(via).to(f32), without its two temporaries (fresh pages each call: with
// them a bf16 PPO iteration of the 6.1 M LLaMA ran 1.35x slower; docs/performance.md, change 30).
void round_host(float* d, const float* s, int64_t n, dtype via) {
  if (via == dtype::bf16) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t x;
      std::memcpy(&x, s + i, sizeof x);
      x = half_bits::f32_from_bf16(half_bits::bf16_from_f32(x));
      std::memcpy(d + i, &x, sizeof x);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t x;
      std::memcpy(&x, s + i, sizeof x);
      x = half_bits::f32_from_f16(half_bits::f16_from_f32(x));
      std::memcpy(d + i, &x, sizeof x);
    }
  }
}

// dst (f32) = src (f32) rounded to `via` (bf16/f16) and back; dst may be src.
void copy_rounded(tensor& dst, const tensor& src, dtype via) {
  if (!on_gpu(dst) && !on_gpu(src)) {
    if (dst.type() != dtype::f32 || src.type() != dtype::f32 || dst.numel() != src.numel())
      throw std::invalid_argument("zero_engine: copy_rounded " + src.str() + " into " + dst.str());
    round_host(dst.data<float>(), src.data<float>(), src.numel(), via);
    return;
  }
#ifdef FLOWRUN_HAVE_CUDA
  if (dst.dev() != src.dev() || dst.numel() != src.numel())
    throw std::invalid_argument("zero_engine: copy_rounded " + src.str() + " into " + dst.str());
  detail::cuda_convert(dst.raw(), dtype::f32, src.raw(), dtype::f32, src.numel(), via, dst.dev().index);
#else
  no_cuda();
#endif
}

// The optimizer's view of a run of elements with one weight-decay setting.
struct segment {
  int64_t flat = 0;   // first element in the full flat buffer
  int64_t local = 0;  // first element in the shard (== flat for unsharded buffers)
  int64_t len = 0;
  bool no_decay = false;
};

// Segments of [lo, hi) of the flat buffer (shard offset local0 at lo) split by entries' decay flags.
void add_segments(std::vector<segment>& out, const std::vector<param_entry>& es, int64_t lo, int64_t hi,
                  int64_t local0) {
  for (auto& e : es) {
    int64_t a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel);
    if (a >= b) continue;
    if (!out.empty() && out.back().no_decay == e.no_decay && out.back().flat + out.back().len == a &&
        out.back().local + out.back().len == local0 + (a - lo)) {
      out.back().len += b - a;
    } else {
      out.push_back({a, local0 + (a - lo), b - a, e.no_decay});
    }
  }
}

}  // namespace

void round_through(tensor& t, dtype via) { copy_rounded(t, t, via); }

std::string memory_report::str() const {
  std::string s = "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " stage " + std::to_string(stage) +
                  (precision == dtype::f32 ? "" : precision == dtype::f16 ? ", fp16" : ", bf16") + ": params " +
                  mb(param_bytes);
  if (gathered_peak_bytes > 0) s += " (+" + mb(gathered_peak_bytes) + " gathered peak)";
  s += ", grads " + mb(grad_bytes) + ", optimizer " + mb(optimizer_bytes) + ", activations " +
       mb(activation_bytes);
  if (loss_bytes > 0) s += ", loss gradient " + mb(loss_bytes);
  s += ", total " + mb(total());
  return s;
}

memory_report estimate_memory(const decoder& model, const memory_plan& p) {
  if (p.stage < 0 || p.stage > 3)
    throw std::invalid_argument("estimate_memory: zero stage must be 0, 1, 2 or 3, got " + std::to_string(p.stage));
  if (p.world_size < 1 || p.micro_batch < 1 || p.seq_len < 1)
    throw std::invalid_argument("estimate_memory: world_size, micro_batch and seq_len must be >= 1");
  const int N = p.world_size, stage = p.stage;
  const int64_t P = model.num_parameters(), A = model.num_adapter_parameters();
  const bool base_trains = model.base_trainable();
  // the engine's layout: block b padded to N·p_b, this rank's shard Σ_b p_b (zero_engine's constructor)
  const auto blocks = model.param_blocks();
  int64_t shard = 0, max_block = 0;
  for (auto& b : blocks) {
    shard += ceil_div(b.numel(), N);
    max_block = std::max(max_block, ceil_div(b.numel(), N) * N);
  }
  // stage 3 gathers one block at a time, except the head with a tied embedding (forward's
  // head_blocks, backward's head); stages 2-3 hold per-block gradient buffers the same way
  const int64_t padded_embed = ceil_div(blocks.front().numel(), N) * N;
  const int64_t padded_head = ceil_div(blocks.back().numel(), N) * N;
  const int64_t peak_blocks =
      std::max(max_block, padded_head + (model.config().tied_embeddings ? padded_embed : 0)) * 4;
  memory_report m;
  m.world_size = N;
  m.stage = stage;
  m.precision = p.precision;
  m.max_block_bytes = max_block * 4;
  int64_t master = 0;  // fp32 master: pieces at stages 1-3, a full copy at stage 0 in mixed precision
  if ((stage >= 1 && base_trains) || stage == 3) master = shard;
  else if (stage == 0 && p.precision != dtype::f32 && base_trains) master = P;
  m.param_bytes = (master + (stage == 3 ? 0 : P) + A) * 4;
  m.gathered_peak_bytes = stage == 3 ? peak_blocks : 0;
  m.grad_bytes = ((stage >= 1 && base_trains ? shard : 0) + A + (stage <= 1 ? P : 0)) * 4 +
                 (stage >= 2 ? peak_blocks : 0);
  m.optimizer_bytes = 2 * ((base_trains ? (stage == 0 ? P : shard) : 0) + A) * 4;
  const int64_t BT = p.micro_batch * p.seq_len;
  m.activation_bytes = estimate_activation_bytes(model, p.micro_batch, p.seq_len,
                                                 p.dout == memory_plan::loss_grad::model_cross_entropy, p.keep_rows);
  m.loss_bytes = p.dout == memory_plan::loss_grad::dlogits  ? BT * model.config().vocab_size * 4
                 : p.dout == memory_plan::loss_grad::dvalues ? BT * 4
                                                             : 0;
  return m;
}

int64_t estimate_activation_bytes(const decoder& model, int64_t B, int64_t T, bool model_cross_entropy,
                                  bool keep_rows) {
  // What decoder::forward and backward allocate (activations in decoder.h), in floats.
  const model_config& c = model.config();
  const int64_t N = B * T, C = c.dim, F = c.hidden_dim, H = c.n_heads, hs = c.head_dim(), KV = c.n_kv_heads;
  const int64_t E = c.embed_width(), V = c.vocab_size;
  const int64_t stats = c.norm == norm_kind::layernorm ? 2 : 1;  // rstd (+ mean) per row and norm
  // one layer: ln1, resid2, ln2 (+ resid3 post-norm); q, atty; k, v; the (B, H, T, T) probabilities;
  // up, act (+ gate); the two norms' statistics
  int64_t per_layer = N * ((c.post_norm ? 4 : 3) * C + 2 * H * hs + 2 * KV * hs + (c.gated_mlp ? 3 : 2) * F +
                           2 * stats) +
                      B * H * T * T;
  // LoRA (decoder::lin_fwd / lin_bwd): u = dropout(x) Aᵀ (N, r) per adapted Linear; in training
  // with lora_dropout its mask (N, in); backward scratch du (N, r) and, with dropout, dx (N, in)
  // of the last adapted Linear that backward visits (down, gate, up, o, q, k, v within a layer)
  int64_t lora_scratch = 0;
  if (model.has_lora() && !model.lora_merged()) {
    const int64_t r = model.lora().lora_r;
    const bool drop = model.training() && model.lora().lora_dropout > 0.0f;
    const auto& L0 = model.w().layers.at(0).lora;
    int64_t last_in = 0;
    for (int mod : {lm_down, lm_gate, lm_up, lm_o, lm_q, lm_k, lm_v}) {
      if (!L0[mod].A.defined()) continue;
      const int64_t in = L0[mod].A.size(1);
      per_layer += N * r + (drop ? N * in : 0);
      last_in = in;
    }
    if (last_in > 0) lora_scratch = N * r + (drop ? N * last_in : 0);
  }
  const int64_t layers = model.gradient_checkpointing() ? 1 : c.n_layers;  // checkpointed: one slot, reused
  int64_t floats = layers * per_layer + lora_scratch;
  floats += (c.n_layers + 1) * N * C;        // resid: the layer inputs (kept with checkpointing too)
  floats += N * C + N * stats + N;           // lnf and its statistics, losses
  if (model.has_value_head()) floats += N;   // values (B, T); the dvalues are the caller's
  else floats += (model_cross_entropy ? 2 : 1) * N * V;  // logits (+ dlogits of the model's cross-entropy)
  floats += 4 * N * C + (c.gated_mlp ? 3 : 2) * N * F + N * (H * hs + 2 * KV * hs);  // backward scratch
  if (c.has_projection()) floats += 4 * N * E;  // emb, hout, dhout, demb
  // keep_from: keep_out, keep_dres (+ keep_x, keep_atty, keep_datty: the last layer's kept rows, pre-norm)
  if (keep_rows) floats += (c.post_norm ? 2 : 5) * N * C;
  return floats * 4;
}

int64_t zero_theoretical_bytes(const decoder& model, int N, int stage, int64_t gas) {
  if (N <= 1) return 0;
  // Ψ in bytes: the f32 parameters, each block padded to a multiple of N (as they travel)
  int64_t psi = 0;
  for (auto& b : model.param_blocks()) psi += ceil_div(b.numel(), N) * N * 4;
  const int64_t ring = (N - 1) * (psi / N);  // one ring all-gather or reduce-scatter of Ψ
  // stages 2-3, tied embeddings: the head's share of the embedding gradient is reduced on its own
  const int64_t tied = stage >= 2 && model.config().tied_embeddings
                           ? gas * (N - 1) * ceil_div(model.param_blocks().front().numel(), N) * 4
                           : 0;
  switch (stage) {
    case 0: return 2 * ring;        // all-reduce of the gradients, once per step
    case 1: return 2 * ring;        // reduce-scatter of the gradients + all-gather of the parameters
    case 2: return 2 * ring + tied;
    default: return gas * 3 * ring + tied; // per micro-batch: all-gather in forward and in backward, reduce-scatter
  }
}

// ------------------------------------------------------------------ engine

struct zero_engine::block_state {
  tensor params;  // stage 3: the gathered (padded) block, while acquired
  int refs = 0;
  tensor grads;   // stages 2-3: the block's (padded) gradient buffer during backward
};

zero_engine::zero_engine(decoder& model, comm::communicator& comm, const zero_settings& s)
    : model_(model), comm_(comm), s_(s) {
  if (s_.stage < 0 || s_.stage > 3)
    throw std::invalid_argument("zero_optimization.stage must be 0, 1, 2 or 3, got " + std::to_string(s_.stage));
  if (s_.micro_batch < 1 || s_.gradient_accumulation_steps < 1)
    throw std::invalid_argument("train_micro_batch_size_per_gpu and gradient_accumulation_steps must be >= 1");
  if (!comm_.takes(model_.dev()))
    throw std::invalid_argument(
        "zero_engine: the model is on " + model_.dev().str() + ", but the " + comm_.backend() +
        " communicator takes tensors on " + comm_.tensor_device().str() +
        (model_.dev().kind == device_kind::cuda
             ? " only; for a CUDA model use inproc (ranks that are threads sharing the GPU) or nccl (one GPU per "
               "rank): gloo is CPU-only (docs/cuda.md)"
             : ""));
  dev_ = model_.dev();
  N_ = comm_.world_size();
  r_ = comm_.rank();
  base_trains_ = model_.base_trainable();
  blocks_ = model_.param_blocks();
  st_.resize(blocks_.size());
  int64_t off = 0;
  for (auto& b : blocks_) {
    piece_.push_back(ceil_div(b.numel(), N_));
    shard_off_.push_back(off);
    off += piece_.back();
  }
  shard_numel_ = off;
  const int64_t P = model_.num_parameters();
  if (base_trains_) {
    const int64_t n = s_.stage == 0 ? P : shard_numel_;
    m_ = tensor::zeros({n}, dtype::f32, dev_);
    v_ = tensor::zeros({n}, dtype::f32, dev_);
    if (s_.stage >= 1) grad_shard_ = tensor::zeros({shard_numel_}, dtype::f32, dev_);
  }
  if (model_.num_adapter_parameters() > 0) {
    am_ = tensor::zeros({model_.num_adapter_parameters()}, dtype::f32, dev_);
    av_ = tensor::zeros({model_.num_adapter_parameters()}, dtype::f32, dev_);
  }
  if (s_.stage >= 2) {
    model_.set_external_grads(true);
    model_.set_param_hooks(this);
  }
  if (s_.precision != dtype::f32 && s_.precision != dtype::bf16 && s_.precision != dtype::f16)
    throw std::invalid_argument("zero_engine: precision must be f32, bf16 or f16");
  if (s_.loss_scaler && s_.precision != dtype::f16)
    throw std::invalid_argument("zero_engine: a loss scaler is for fp16 only");
  for (const auto& [lo, hi] : s_.frozen_ranges)
    if (lo < 0 || hi < lo || hi > P)
      throw std::invalid_argument("zero_engine: frozen range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                  ") is outside the " + std::to_string(P) + " base parameters");
  // The fp32 master: this rank's pieces (stages 1-3), or a full copy (stage 0 in
  // mixed precision); stage 0 in f32 steps the model's own buffer.
  const tensor& flat = model_.w().flat;
  if ((s_.stage >= 1 && base_trains_) || s_.stage == 3) {
    master_ = tensor::zeros({shard_numel_}, dtype::f32, dev_);
    for (size_t b = 0; b < blocks_.size(); ++b) {
      const auto [lo, hi] = owned(b);
      if (hi > lo) master_.flat_view(shard_off_[b], {hi - lo}).copy_from(flat.flat_view(lo, {hi - lo}));
    }
  } else if (s_.stage == 0 && s_.precision != dtype::f32 && base_trains_) {
    master_ = flat.clone();
  }
  if (s_.stage == 3) {
    for (size_t b = 0; b < blocks_.size(); ++b) model_.rebind_block(static_cast<int>(b), tensor{}, tensor{});
    model_.release_flat_params();
  } else {
    round_working_params();
  }
}

zero_engine::~zero_engine() {
  if (s_.stage >= 2) model_.set_param_hooks(nullptr);
}

ops::matmul_precision zero_engine::compute_precision() const {
  if (s_.precision == dtype::bf16 && s_.bf16_matmul)
    return ops::matmul_precision::bf16;
  return ops::get_matmul_precision();
}

std::pair<int64_t, int64_t> zero_engine::owned(size_t b) const {
  const int64_t lo = blocks_[b].begin + r_ * piece_[b];
  return {lo, std::max(lo, std::min(lo + piece_[b], blocks_[b].end))};
}

tensor zero_engine::piece(const tensor& full_block, int b) const {
  return full_block.flat_view(r_ * piece_[b], {piece_[b]});
}

void zero_engine::round_working_params() {
  if (s_.precision == dtype::f32 || s_.stage == 3) return;
  tensor& flat = model_.w().flat;
  copy_rounded(flat, flat, s_.precision);
}

void zero_engine::gather_block(int b, tensor& dst, bool exact) {
  const int64_t p = piece_[b];
  tensor mine = master_.flat_view(shard_off_[b], {p});
  if (exact || s_.precision == dtype::f32) {
    dst = tensor::empty({p * N_}, dtype::f32, dev_);
    tensor slot = dst.flat_view(r_ * p, {p});
    slot.copy_from(mine);
    comm_.all_gather(slot, dst);  // in place: this rank's piece is already in its slot
    return;
  }
  tensor half = tensor::empty({p * N_}, s_.precision, dev_);
  tensor slot = half.flat_view(r_ * p, {p});
  slot.copy_from(convert(mine, s_.precision));
  comm_.all_gather(slot, half);
  dst = convert(half, dtype::f32);
}

void zero_engine::reduce_scatter_block(const tensor& send, tensor& dst) {
  if (s_.precision == dtype::f32) {
    comm_.reduce_scatter(send, dst);
    return;
  }
  tensor h = convert(send, s_.precision);
  tensor out = tensor::empty({dst.numel()}, s_.precision, dev_);
  comm_.reduce_scatter(h, out);
  dst.copy_from(convert(out, dtype::f32));
}

void zero_engine::acquire(int b, phase p, bool params) {
  auto& st = st_[b];
  const auto& blk = blocks_[b];
  bool rebind = false;
  if (s_.stage == 3 && params) {
    if (st.refs++ == 0) {
      gather_block(b, st.params);
      gathered_now_ += bytes_of(st.params);
      gathered_peak_ = std::max(gathered_peak_, gathered_now_);
      rebind = true;
    }
  }
  if (p == phase::backward && !st.grads.defined()) {
    st.grads = tensor::zeros({piece_[b] * N_}, dtype::f32, dev_);
    gradbuf_now_ += bytes_of(st.grads);
    gradbuf_peak_ = std::max(gradbuf_peak_, gradbuf_now_);
    rebind = true;
  }
  if (!rebind) return;
  tensor pv = s_.stage == 3 ? (st.params.defined() ? st.params.flat_view(0, {blk.numel()}) : tensor{})
                            : model_.w().flat.flat_view(blk.begin, {blk.numel()});
  tensor gv = st.grads.defined() ? st.grads.flat_view(0, {blk.numel()}) : tensor{};
  model_.rebind_block(b, pv, gv);
}

void zero_engine::release(int b, phase) {
  if (s_.stage != 3) return;
  auto& st = st_[b];
  if (st.refs == 0 || --st.refs > 0) return;
  gathered_now_ -= bytes_of(st.params);
  st.params = tensor{};
  tensor gv = st.grads.defined() ? st.grads.flat_view(0, {blocks_[b].numel()}) : tensor{};
  model_.rebind_block(b, tensor{}, gv);
}

void zero_engine::grads_ready(int b) {
  auto& st = st_[b];
  if (!st.grads.defined()) return;
  if (base_trains_) {
    tensor dst = grad_shard_.flat_view(shard_off_[b], {piece_[b]});
    if (!grad_written_[b]) {  // the step's first report of block b: overwrite the shard
      reduce_scatter_block(st.grads, dst);
      grad_written_[b] = 1;
    } else {  // a later micro-batch, or a tied embedding's second share (decoder::backward)
      auto tmp = tensor::empty({piece_[b]}, dtype::f32, dev_);
      reduce_scatter_block(st.grads, tmp);
      ops::axpy(dst, tmp);
    }
  }
  gradbuf_now_ -= bytes_of(st.grads);
  st.grads = tensor{};
  tensor pv = s_.stage == 3 ? (st.params.defined() ? st.params.flat_view(0, {blocks_[b].numel()}) : tensor{})
                            : model_.w().flat.flat_view(blocks_[b].begin, {blocks_[b].numel()});
  model_.rebind_block(b, pv, tensor{});
}

void zero_engine::reduce_grads_stage01() {
  if (base_trains_) {
    tensor& g = model_.grads().flat;
    if (s_.stage == 0) {
      if (s_.precision == dtype::f32) {
        comm_.all_reduce(g);
      } else if (N_ == 1) {  // the sum over one rank is the rank's own: only the rounding is left
        copy_rounded(g, g, s_.precision);
      } else {
        tensor h = convert(g, s_.precision);
        comm_.all_reduce(h);
        g.copy_from(convert(h, dtype::f32));
      }
    } else {  // stage 1: reduce-scatter each (padded) block into the gradient shard
      for (size_t b = 0; b < blocks_.size(); ++b) {
        const int64_t p = piece_[b], n = blocks_[b].numel();
        auto send = tensor::zeros({p * N_}, dtype::f32, dev_);
        send.flat_view(0, {n}).copy_from(g.flat_view(blocks_[b].begin, {n}));
        tensor dst = grad_shard_.flat_view(shard_off_[b], {p});
        reduce_scatter_block(send, dst);
      }
    }
  }
}

double zero_engine::sum_sq_local() const {
  if (!base_trains_) return 0.0;
  if (s_.stage == 0) return ops::sum_squares(model_.grads().flat);
  return ops::sum_squares(grad_shard_);
}

void zero_engine::optimizer_step(double lr, double clip_coef) {
  ++t_;
  ops::adamw_config c = s_.adamw;
  c.lr = static_cast<float>(lr);
  auto step_segments = [&](const std::vector<segment>& segs, tensor& P, tensor& G, tensor& M, tensor& V,
                           bool p_local) {
    for (auto& sg : segs) {
      tensor p = P.flat_view(p_local ? sg.local : sg.flat, {sg.len});
      tensor g = G.flat_view(sg.local, {sg.len});
      tensor m = M.flat_view(sg.local, {sg.len});
      tensor v = V.flat_view(sg.local, {sg.len});
      ops::adamw_config ci = c;
      if (sg.no_decay) ci.weight_decay = 0.0f;
      ops::adamw_step(p, g, m, v, t_, ci);
    }
  };
  if (base_trains_) {
    std::vector<segment> segs;
    tensor G = s_.stage == 0 ? model_.grads().flat : grad_shard_;
    if (clip_coef != 1.0) ops::scale(G, static_cast<float>(clip_coef));
    if (s_.stage == 0) {
      add_segments(segs, model_.params(), 0, model_.num_parameters(), 0);
      step_segments(segs, master_.defined() ? master_ : model_.w().flat, G, m_, v_, false);
    } else {
      for (size_t b = 0; b < blocks_.size(); ++b) {
        const auto [lo, hi] = owned(b);
        if (hi > lo) add_segments(segs, model_.params(), lo, hi, shard_off_[b]);
      }
      step_segments(segs, master_, G, m_, v_, true);
    }
  }
  if (model_.num_adapter_parameters() > 0) {
    tensor& G = model_.grads().adapter_flat;
    if (clip_coef != 1.0) ops::scale(G, static_cast<float>(clip_coef));
    // the LoRA tensors, at adapter_lr when set (DS-Chat's LoRA group: its own peak lr, the base's
    // schedule); a value head in the same buffer at the base lr, as DS-Chat's v_head is in the base's group
    std::vector<param_entry> lora, head;
    for (const auto& e : model_.adapter_params()) (e.name.rfind("v_head", 0) == 0 ? head : lora).push_back(e);
    std::vector<segment> segs;
    add_segments(segs, head, 0, model_.num_adapter_parameters(), 0);
    step_segments(segs, model_.w().adapter_flat, G, am_, av_, false);
    segs.clear();
    if (s_.adapter_lr >= 0)
      c.lr = static_cast<float>(s_.adamw.lr > 0 ? s_.adapter_lr * lr / s_.adamw.lr : s_.adapter_lr);
    add_segments(segs, lora, 0, model_.num_adapter_parameters(), 0);
    step_segments(segs, model_.w().adapter_flat, G, am_, av_, false);
  }
}

void zero_engine::allgather_params_after_step() {
  if (!base_trains_ || s_.stage == 3) return;
  tensor& flat = model_.w().flat;
  if (s_.stage == 0) {  // mixed precision: the working copy is the master rounded
    if (master_.defined()) copy_rounded(flat, master_, s_.precision);
    return;
  }
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const int64_t n = blocks_[b].numel();
    tensor buf;
    gather_block(static_cast<int>(b), buf);
    flat.flat_view(blocks_[b].begin, {n}).copy_from(buf.flat_view(0, {n}));
  }
}

bool zero_engine::grads_overflowed() {
  std::vector<tensor> ts;
  if (base_trains_) ts.push_back(s_.stage == 0 ? model_.grads().flat : grad_shard_);
  if (model_.num_adapter_parameters() > 0) ts.push_back(model_.grads().adapter_flat);
  bool local = false;
  if (dev_.kind == device_kind::cuda) {
#ifdef FLOWRUN_HAVE_CUDA
    auto dflag = tensor::zeros({1}, dtype::i32, dev_);
    for (auto& t : ts)
      if (t.defined()) detail::cuda_flag_nonfinite(t.data<float>(), t.numel(), dflag.data<int32_t>(), dev_.index);
    local = dflag.to(device::cpu()).data<int32_t>()[0] != 0;
#else
    no_cuda();
#endif
  } else {
    auto bad = [](const tensor& t) {
      if (!t.defined()) return false;
      const float* p = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i)
        if (!std::isfinite(p[i])) return true;
      return false;
    };
    for (auto& t : ts) local = local || bad(t);
  }
  auto flag = tensor::empty({1}, dtype::i32);
  flag.data<int32_t>()[0] = local ? 1 : 0;
  all_reduce_host(flag, comm::reduce_op::max);
  return flag.data<int32_t>()[0] != 0;
}

void zero_engine::all_reduce_host(tensor& x, comm::reduce_op op) {
  if (comm_.takes(device::cpu())) {
    comm_.all_reduce(x, op);
    return;
  }
  tensor d = x.to(comm_.tensor_device());  // e.g. nccl: through the communicator's GPU
  comm_.all_reduce(d, op);
  x.copy_from(d);
}

namespace {
int64_t count_valid(const tensor& targets) {
  const int32_t* t = targets.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) n += t[i] != -100;
  return n;
}
}  // namespace

step_result zero_engine::train_step(const tensor& ids, const tensor& targets, double lr) {
  const int64_t gas = s_.gradient_accumulation_steps, mbs = s_.micro_batch;
  const int64_t Bg = mbs * gas * N_;
  if (ids.dim() != 2 || ids.size(0) != Bg || targets.shape() != ids.shape())
    throw std::invalid_argument("zero_engine::train_step: the global batch must be (" + std::to_string(Bg) +
                                ", T) = train_micro_batch_size_per_gpu " + std::to_string(mbs) +
                                " x gradient_accumulation_steps " + std::to_string(gas) + " x world size " +
                                std::to_string(N_) + ", got ids " + ids.str() + ", targets " + targets.str());
  const tensor host_targets = targets.to(device::cpu());
  // the LM loss: micro-batch k is rows [k·mbs, (k+1)·mbs); its units are its valid targets,
  // and the model's own cross-entropy backward gives the gradient (dout undefined)
  batch_loss lm;
  lm.units = [&](int64_t k) { return count_valid(host_targets.rows(k * mbs, k * mbs + mbs)); };
  lm.forward = [&](int64_t k, decoder& m, activations& a) {
    tensor mi = ids.rows(k * mbs, k * mbs + mbs).clone(), mt = targets.rows(k * mbs, k * mbs + mbs).clone();
    micro_loss r;
    r.loss = m.forward(a, mi, mt);
    return r;
  };
  return train_step(lm, lr);
}

step_result zero_engine::train_step(const batch_loss& loss, double lr) {
  if (released_) throw std::logic_error("zero_engine::train_step: the model was released (release_model)");
  if (!loss.units || !loss.forward)
    throw std::invalid_argument("zero_engine::train_step: the batch_loss needs both units and forward");
  const int64_t gas = s_.gradient_accumulation_steps;
  const int64_t bytes0 = comm_.stats().bytes_sent;
  if (lr < 0) lr = s_.adamw.lr;
  ops::matmul_precision_scope gemm(compute_precision());
  // the denominator of the global mean: the units of every micro-batch of every rank
  std::vector<int64_t> units(static_cast<size_t>(gas));
  int64_t local_units = 0;
  for (int64_t g = 0; g < gas; ++g) {
    units[g] = loss.units(g * N_ + r_);
    if (units[g] < 0)
      throw std::invalid_argument("zero_engine::train_step: micro-batch " + std::to_string(g * N_ + r_) + " has " +
                                  std::to_string(units[g]) + " units; a loss is a mean over >= 0 units");
    local_units += units[g];
  }
  auto cnt = tensor::empty({1}, dtype::i64);
  cnt.data<int64_t>()[0] = local_units;
  all_reduce_host(cnt);
  const int64_t global_units = cnt.data<int64_t>()[0];

  model_.zero_grad();
  const double scale = s_.loss_scaler ? s_.loss_scaler->scale() : 1.0;
  double loss_sum = 0.0;
  grad_written_.assign(blocks_.size(), 0);
  for (int64_t g = 0; g < gas; ++g) {
    micro_loss ml = loss.forward(g * N_ + r_, model_, act_);
    loss_peak_ = std::max(loss_peak_, bytes_of(ml.dout));
    loss_sum += ml.loss * static_cast<double>(units[g]);
    // (set after forward: it resets the activations on a new shape)
    tensor dout = ml.dout;
    if (!dout.defined()) {  // the model's cross-entropy: dloss = loss_scale / loss_norm per valid target
      if (units[g] == act_.n_valid) {
        act_.loss_norm = global_units;
        act_.loss_scale = static_cast<float>(scale);
      } else {  // a token mean weighed as units[g]
        act_.loss_norm = 0;
        act_.loss_scale = static_cast<float>(global_units > 0 ? scale * static_cast<double>(units[g]) /
                                                                    static_cast<double>(global_units)
                                                              : 0.0);
      }
    } else {
      if (dout.dev() != dev_) dout = dout.to(dev_);
      const double w = global_units > 0 ? scale * static_cast<double>(units[g]) / static_cast<double>(global_units) : 0.0;
      if (w != 1.0) ops::scale(dout, static_cast<float>(w));
    }
    model_.backward(act_, dout);
  }
  act_peak_ = std::max(act_peak_, activation_bytes(act_));
  if (s_.stage <= 1) reduce_grads_stage01();
  if (model_.num_adapter_parameters() > 0) comm_.all_reduce(model_.grads().adapter_flat);
  zero_frozen_grads();

  step_result r;
  r.loss_scale = scale;
  r.lr = lr;
  r.tokens = global_units;
  if (s_.loss_scaler && grads_overflowed()) {  // fp16: skip this update, lower the scale
    s_.loss_scaler->update(true);
    auto ls = tensor::empty({1});
    ls.data<float>()[0] = static_cast<float>(loss_sum);
    all_reduce_host(ls);
    r.loss = global_units > 0 ? ls.data<float>()[0] / static_cast<double>(global_units) : 0.0;
    r.grad_norm = std::numeric_limits<double>::infinity();
    r.skipped = true;
    r.comm_bytes = comm_.stats().bytes_sent - bytes0;
    return r;
  }
  // the loss and the squared gradient norm, summed over ranks in one all-reduce
  auto sums = tensor::empty({2});
  sums.data<float>()[0] = static_cast<float>(loss_sum);
  sums.data<float>()[1] = static_cast<float>(s_.stage == 0 ? 0.0 : sum_sq_local());
  all_reduce_host(sums);
  double sq = sums.data<float>()[1];
  if (s_.stage == 0) sq = sum_sq_local();  // the all-reduced full buffer: identical on every rank
  if (model_.num_adapter_parameters() > 0) sq += ops::sum_squares(model_.grads().adapter_flat);
  const double norm = std::sqrt(sq) / scale;  // of the unscaled gradients
  r.loss = global_units > 0 ? sums.data<float>()[0] / static_cast<double>(global_units) : 0.0;
  r.grad_norm = norm;
  if (!s_.loss_scaler && (!std::isfinite(r.loss) || !std::isfinite(norm)))  // the same on every rank
    throw std::runtime_error("zero_engine: non-finite " + std::string(std::isfinite(r.loss) ? "gradient norm" : "loss") +
                             " (loss " + std::to_string(r.loss) + ", gradient norm " + std::to_string(norm) +
                             ") at optimizer step " + std::to_string(t_ + 1) +
                             "; nothing was updated: lower the learning rate or check the data");
  double coef = 1.0 / scale;
  if (s_.gradient_clipping > 0 && norm > s_.gradient_clipping) coef *= s_.gradient_clipping / (norm + 1e-6);
  optimizer_step(lr, coef);
  allgather_params_after_step();
  if (s_.loss_scaler) s_.loss_scaler->update(false);
  r.comm_bytes = comm_.stats().bytes_sent - bytes0;
  return r;
}

void zero_engine::zero_frozen_grads() {
  if (s_.frozen_ranges.empty() || !base_trains_) return;
  for (const auto& [lo, hi] : s_.frozen_ranges) {
    if (s_.stage == 0) {
      model_.grads().flat.flat_view(lo, {hi - lo}).zero_();
      continue;
    }
    for (size_t b = 0; b < blocks_.size(); ++b) {  // the owned part of [lo, hi) in the gradient shard
      const auto [olo, ohi] = owned(b);
      const int64_t a = std::max(lo, olo), e = std::min(hi, ohi);
      if (a < e) grad_shard_.flat_view(shard_off_[b] + (a - olo), {e - a}).zero_();
    }
  }
}

void zero_engine::release_model() {
  if (released_) return;
  tensor full = gather_full_params();
  if (s_.stage >= 2) {
    model_.set_param_hooks(nullptr);
    model_.set_external_grads(false);
  }
  if (s_.stage == 3) {
    model_.restore_flat_params(full);
  } else if (master_.defined()) {
    model_.w().flat.copy_from(full);  // the fp32 master, not the rounded working copy
  }
  released_ = true;
}

double zero_engine::eval_loss(const tensor& ids, const tensor& targets) {
  const int64_t B = ids.size(0);
  if (B < N_)
    throw std::invalid_argument("zero_engine::eval_loss: " + std::to_string(B) + " rows cannot give each of " +
                                std::to_string(N_) + " ranks one (each rank's forward takes part in the collectives)");
  // rank r: rows [B r / N, B (r + 1) / N), an even split where N divides B; the loss is the sum over every
  // rank's valid targets over their count, so the split changes no term
  const int64_t lo = B * r_ / N_, hi = B * (r_ + 1) / N_;
  activations a;
  tensor mi = ids.rows(lo, hi).clone(), mt = targets.rows(lo, hi).clone();
  const bool was_training = model_.training();
  ops::matmul_precision_scope gemm(compute_precision());
  model_.set_training(false);  // no LoRA dropout, and the dropout stream stays where training left it
  double loss = model_.forward(a, mi, mt);
  model_.set_training(was_training);
  auto sums = tensor::empty({2});
  sums.data<float>()[0] = static_cast<float>(loss * static_cast<double>(a.n_valid));
  sums.data<float>()[1] = static_cast<float>(a.n_valid);
  all_reduce_host(sums);
  return sums.data<float>()[1] > 0 ? sums.data<float>()[0] / sums.data<float>()[1] : 0.0;
}

memory_report zero_engine::memory() const {
  memory_report m;
  m.rank = r_;
  m.world_size = N_;
  m.stage = s_.stage;
  m.precision = s_.precision;
  // the working parameters (full below stage 3) and the fp32 master (pieces, or a full copy at stage 0 in mixed precision)
  m.param_bytes = bytes_of(master_) + (s_.stage == 3 ? 0 : bytes_of(model_.w().flat)) + bytes_of(model_.w().adapter_flat);
  m.gathered_peak_bytes = gathered_peak_;
  int64_t mx = 0;
  for (size_t b = 0; b < blocks_.size(); ++b) mx = std::max(mx, piece_[b] * N_ * 4);
  m.max_block_bytes = mx;
  m.grad_bytes = bytes_of(grad_shard_) + bytes_of(model_.grads().adapter_flat) +
                 (s_.stage <= 1 ? bytes_of(model_.grads().flat) : gradbuf_peak_);
  m.optimizer_bytes = bytes_of(m_) + bytes_of(v_) + bytes_of(am_) + bytes_of(av_);
  m.activation_bytes = act_peak_;
  m.loss_bytes = loss_peak_;
  return m;
}

std::vector<std::pair<int64_t, int64_t>> zero_engine::owned_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> rs;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const auto [lo, hi] = owned(b);
    if (hi > lo) rs.push_back({lo, hi});
  }
  return rs;
}

namespace {
// Copy the owned ranges out of a full flat buffer (full = true) or out of a padded shard.
tensor compact(const tensor& src, bool full, const std::vector<std::pair<int64_t, int64_t>>& ranges,
               const std::vector<int64_t>& local_starts) {
  int64_t n = 0;
  for (auto& r : ranges) n += r.second - r.first;
  auto out = tensor::empty({n});
  int64_t at = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const int64_t len = ranges[i].second - ranges[i].first;
    out.flat_view(at, {len}).copy_from(src.flat_view(full ? ranges[i].first : local_starts[i], {len}));
    at += len;
  }
  return out;
}
}  // namespace

// Shard offsets matching owned_ranges().
std::vector<int64_t> zero_engine::owned_starts() const {
  std::vector<int64_t> starts;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (const auto [lo, hi] = owned(b); hi > lo) starts.push_back(shard_off_[b]);
  return starts;
}

tensor zero_engine::owned_params() const {
  const auto starts = owned_starts();
  if (!master_.defined()) return compact(model_.w().flat, true, owned_ranges(), starts);
  return compact(master_, s_.stage == 0, owned_ranges(), starts);
}

tensor zero_engine::owned_exp_avg() const {
  if (!m_.defined()) return {};
  const auto starts = owned_starts();
  return compact(m_, s_.stage == 0, owned_ranges(), starts);
}

tensor zero_engine::owned_exp_avg_sq() const {
  if (!v_.defined()) return {};
  const auto starts = owned_starts();
  return compact(v_, s_.stage == 0, owned_ranges(), starts);
}

tensor zero_engine::adapter_params() const { return model_.w().adapter_flat.to(device::cpu()); }

void zero_engine::restore(const tensor& params, const tensor& exp_avg, const tensor& exp_avg_sq,
                          const tensor& adapter, const tensor& adapter_m, const tensor& adapter_v, int64_t step) {
  const int64_t P = model_.num_parameters();
  auto need = [&](const tensor& t, int64_t n, const char* what) {
    if (t.defined() && t.numel() != n)
      throw std::invalid_argument(std::string("zero_engine::restore: ") + what + " has " +
                                  std::to_string(t.numel()) + " elements, the model " + std::to_string(n));
  };
  need(params, P, "fp32_master");
  need(exp_avg, P, "exp_avg");
  need(exp_avg_sq, P, "exp_avg_sq");
  if (params.defined()) {
    if (master_.defined() && s_.stage >= 1) {
      master_.zero_();
      for (size_t b = 0; b < blocks_.size(); ++b) {
        const auto [lo, hi] = owned(b);
        if (hi > lo) master_.flat_view(shard_off_[b], {hi - lo}).copy_from(params.flat_view(lo, {hi - lo}));
      }
    } else if (master_.defined()) {
      master_.copy_from(params);
    }
    if (s_.stage < 3) {
      model_.w().flat.copy_from(params);
      round_working_params();
    }
  }
  auto load_moment = [&](tensor& dst, const tensor& src) {
    if (!dst.defined() || !src.defined()) return;
    if (s_.stage == 0) {
      dst.copy_from(src);
      return;
    }
    dst.zero_();
    for (size_t b = 0; b < blocks_.size(); ++b) {
      const auto [lo, hi] = owned(b);
      if (hi > lo) dst.flat_view(shard_off_[b], {hi - lo}).copy_from(src.flat_view(lo, {hi - lo}));
    }
  };
  load_moment(m_, exp_avg);
  load_moment(v_, exp_avg_sq);
  const int64_t A = model_.num_adapter_parameters();
  need(adapter, A, "adapter");
  if (adapter.defined() && A > 0) model_.w().adapter_flat.copy_from(adapter);
  if (adapter_m.defined() && am_.defined()) am_.copy_from(adapter_m);
  if (adapter_v.defined() && av_.defined()) av_.copy_from(adapter_v);
  t_ = step;
}

tensor zero_engine::gather_owned(const tensor& pieces) {
  int64_t mine = 0;
  for (const auto& [lo, hi] : owned_ranges()) mine += hi - lo;
  if (!pieces.defined() || pieces.numel() != mine)
    throw std::invalid_argument("zero_engine::gather_owned: " +
                                std::to_string(pieces.defined() ? pieces.numel() : 0) + " elements, this rank owns " +
                                std::to_string(mine));
  auto full = tensor::empty({model_.num_parameters()});
  int64_t at = 0;
  for (size_t b = 0; b < blocks_.size(); ++b) {  // per block: each rank's piece into its slot, then all-gather
    const int64_t p = piece_[b];
    tensor buf = tensor::zeros({p * N_}, dtype::f32, dev_);
    tensor slot = buf.flat_view(r_ * p, {p});
    if (const auto [lo, hi] = owned(b); hi > lo) {
      slot.flat_view(0, {hi - lo}).copy_from(pieces.flat_view(at, {hi - lo}));
      at += hi - lo;
    }
    comm_.all_gather(slot, buf);  // in place, as gather_block
    full.flat_view(blocks_[b].begin, {blocks_[b].numel()}).copy_from(buf.flat_view(0, {blocks_[b].numel()}));
  }
  return full;
}

tensor zero_engine::gather_full_params(bool exact) {
  if (!master_.defined() || (s_.stage == 0 && !exact))  // the model's own buffer: the working parameters
    return on_gpu(model_.w().flat) ? model_.w().flat.to(device::cpu()) : model_.w().flat.clone();
  if (s_.stage == 0) return on_gpu(master_) ? master_.to(device::cpu()) : master_.clone();
  auto full = tensor::empty({model_.num_parameters()});
  for (size_t b = 0; b < blocks_.size(); ++b) {
    tensor buf;
    gather_block(static_cast<int>(b), buf, exact);
    full.flat_view(blocks_[b].begin, {blocks_[b].numel()}).copy_from(buf.flat_view(0, {blocks_[b].numel()}));
  }
  return full;
}

}  // namespace flowrun
