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

/// LoRA settings (Hu et al. 2021, eq. 3; PEFT's LoraConfig; TencentPretrain's
/// --use_lora --lora_r --lora_alpha --lora_dropout). A targeted Linear computes
/// y = x Wᵀ + b + (lora_alpha / lora_r) · dropout(x) Aᵀ Bᵀ with A (r, in), B (out, r).
struct lora_config {
  int64_t lora_r = 8;
  float lora_alpha = 16.0f;
  float lora_dropout = 0.0f;
  /// Module names (PEFT's target_modules: a Linear matches when its name ends with
  /// the entry). LLaMA names q_proj k_proj v_proj o_proj gate_proj up_proj down_proj;
  /// OPT's out_proj fc1 fc2 and GPT-2's c_attn (q, k and v) c_proj c_fc are aliases.
  /// "all-linear" (PEFT's name) is every Linear of the blocks the model has (gate_proj
  /// only with a gated MLP). On GPT-2, q, k and v targeted together (c_attn, all-linear)
  /// share one adapter as PEFT's c_attn does (see k_fused_qkv_path).
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  uint64_t seed = 0;  ///< init of A and the dropout masks
  float scale() const { return lora_alpha / static_cast<float>(lora_r); }
};

/// The module path of a fused q/k/v LoRA adapter, "self_attn.qkv_proj": a GPT-2 whose q, k and v
/// are all targeted (its Conv1D c_attn, as PEFT adapts it) gets ONE adapter per layer,
/// model.layers.N.self_attn.qkv_proj.lora_A.weight (r, C) shared by q, k and v, and lora_B
/// (H*hs + 2*KV*hs, r) whose row ranges are q's, k's and v's B (layer_weights::lora views them).
/// With lora_dropout > 0, q, k and v still draw their own dropout masks (PEFT draws one).
extern const char* const k_fused_qkv_path;

/// The Linear layers of a decoder layer, in a fixed order.
enum lora_module : int { lm_q, lm_k, lm_v, lm_o, lm_gate, lm_up, lm_down, lm_count };
/// "q_proj", "k_proj", ... (HF LLaMA names).
const char* lora_module_name(int m);

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
  struct lora_pair {
    tensor A, B;                 ///< lora_A (r, in), lora_B (out, r); undefined when not targeted
  };
  lora_pair lora[lm_count];
};

/// All weights (or all gradients: same structure over the gradient buffer).
struct weights {
  tensor flat;                   ///< (n_params,)
  tensor wte;                    ///< model.embed_tokens.weight (V, E), E = embed_width()
  tensor wpe;                    ///< model.embed_positions.weight (P, C), learned positions only
  std::vector<layer_weights> layers;
  tensor project_in;             ///< model.project_in.weight (C, E), only when E != C
  tensor lnf_w, lnf_b;           ///< model.norm (C), absent with post_norm
  tensor project_out;            ///< model.project_out.weight (E, C), only when E != C
  tensor lm_head;                ///< lm_head.weight (V, E); == wte view when tied
  tensor v_head;                 ///< v_head.weight (1, E): the scalar value head (critic, reward)
  tensor adapter_flat;           ///< (n_adapter,): LoRA tensors and the value head
  std::map<std::string, tensor> by_name;  ///< base and adapter tensors
};

/// A contiguous range of the flat parameter buffer that one stage of the model
/// reads: block 0 the embeddings (embed_tokens, embed_positions, project_in),
/// blocks 1..L the decoder layers, block L+1 the head (final norm, project_out,
/// lm_head when untied). ZeRO partitions and gathers parameters per block.
struct param_block {
  std::string name;      ///< "embed", "layers.0", ..., "head"
  int64_t begin = 0;     ///< first element in the flat buffer
  int64_t end = 0;       ///< one past the last element
  int64_t numel() const { return end - begin; }
};

/// Called by the decoder around every use of a block's parameters, so a ZeRO
/// engine can gather them just in time and reduce-scatter their gradients as soon
/// as they are complete (Rajbhandari et al. 2020, ZeRO, sec. 5.3; DeepSpeed's
/// runtime/zero/partitioned_param_coordinator.py fetch/release). Order of calls:
///   forward:  acquire(0) release(0); acquire(l) release(l) for each layer;
///             acquire(head) [+ acquire(0) when embeddings are tied] ... release.
///   backward: acquire(head) [+ acquire(0) tied], grads_ready(head), release;
///             acquire(l), grads_ready(l), release(l) from the last layer down;
///             acquire(0, backward, params = projection only), grads_ready(0), release(0).
/// With gradient checkpointing the order is the same: layer l's forward is recomputed
/// after acquire(l, backward) and before its backward, so the block is gathered once
/// for both (ZeRO-3 moves no more bytes than without checkpointing).
/// In the backward phase acquire() must also make the block's gradient views
/// valid (zeroed on first use in a backward pass); grads_ready(b) says no more
/// gradient will be accumulated into block b during this backward pass.
class param_hooks {
 public:
  enum class phase { forward, backward };
  virtual ~param_hooks() = default;
  /// The decoder is about to read block `b`'s parameters (when `params`) and,
  /// in the backward phase, to accumulate into its gradients.
  virtual void acquire(int b, phase p, bool params = true) = 0;
  /// The decoder does not read block `b`'s parameters any more in this phase.
  virtual void release(int b, phase p) = 0;
  /// Block `b`'s gradients accumulated since its acquire are handed over (the engine reduces
  /// them and frees the buffer). Once per block and backward pass, except a tied embedding:
  /// after the head's backward (the head's share) and after the lookup's (the rest); the
  /// hook sums the reports.
  virtual void grads_ready(int b) = 0;
};

/// Saved activations of one training forward pass.
///
/// Gradient checkpointing (decoder::set_gradient_checkpointing): `layers` holds ONE
/// slot that every layer's forward reuses, so only the layer inputs resid[l] (B, T, C)
/// survive the forward pass; backward recomputes layer l into the slot from resid[l]
/// just before layer l's backward (Chen et al. 2016, "Training Deep Nets with Sublinear
/// Memory Cost"; HF's gradient_checkpointing_enable, torch.utils.checkpoint).
/// Use at(l) for layer l's saved tensors.
struct activations {
  int64_t B = 0, T = 0;
  /// The forward ran with gradient checkpointing: `layers` is one reused slot.
  bool checkpointed = false;
  /// Checkpointed: which layer's tensors the slot holds now (-1: none).
  int64_t slot_layer = -1;
  /// Checkpointed: the LoRA dropout stream position at each layer's start (n_layers),
  /// and whether forward ran in training mode, so a recomputation draws the same masks.
  std::vector<uint64_t> layer_rng;
  bool training = true;
  /// The loss's denominator for backward: 0 = the mean over this batch's valid
  /// targets (n_valid); otherwise the number of valid targets of the whole global
  /// batch across data-parallel ranks and micro-batches (so gradients sum to the
  /// global mean's gradient). Set it before backward.
  int64_t loss_norm = 0;
  /// Scale on dloss (fp16 loss scaling; 1 otherwise).
  float loss_scale = 1.0f;
  tensor ids, targets, positions, mask;  ///< (B, T) i32 on the model's device; mask may be undefined
  /// (B*T, hs, hs) f32 on the model's device: the RoPE rotation of each position, with scaled RoPE
  /// (model_config::rope_scaling) only; undefined otherwise (the rope kernel computes its own angles).
  tensor rope_rot;
  /// (B*T) i32 positions + position_offset on the model's device: the rows of
  /// embed_positions that forward read (learned positions only; backward reuses them).
  tensor pos_ids;
  std::vector<tensor> resid;  ///< n_layers + 1 residual streams (B, T, C); resid[0] = embeddings
  tensor emb;                 ///< (B, T, E) token embeddings before project_in (projection only)
  struct layer {
    tensor ln1, ln1_mean, ln1_rstd;   // (B,T,C), (B*T), (B*T)
    tensor q, k, v;                   // (B,T,H,hs), (B,T,KV,hs), (B,T,KV,hs) after RoPE
    tensor att;                       // (B,H,T,T) probabilities
    tensor atty;                      // (B,T,C) attention output before o_proj
    tensor resid2;                    // (B,T,C) after the attention residual (post_norm: before ln1)
    tensor resid3;                    // (B,T,C) post_norm only: after the MLP residual, before ln2
    tensor ln2, ln2_mean, ln2_rstd;
    tensor gate, up, act;             // (B,T,F): gate/up pre-activation, act = MLP hidden
    tensor lora_u[lm_count];          // (B*T, r): dropout(x) Aᵀ, LoRA modules only
    tensor lora_mask[lm_count];       // (B*T, in): dropout mask scaled by 1/(1-p), when lora_dropout > 0
  };
  std::vector<layer> layers;  ///< n_layers entries, or one slot when checkpointed
  /// Layer l's saved tensors: layers[l], or the slot when checkpointed.
  layer& at(int64_t l) { return layers[checkpointed ? 0 : static_cast<size_t>(l)]; }
  /// forward's keep_from: the outputs at positions t >= keep_from only (decoder::forward). With it,
  /// Nh = B * (T - keep_from) rows: lnf, lnf_mean/rstd, hout and (pre-norm) the last layer's resid2, ln2,
  /// ln2_mean/rstd, gate, up, act hold the kept rows in their first Nh rows, compacted, and
  /// resid[n_layers] is not written (keep_out holds the kept rows of it).
  int64_t keep_from = 0;
  tensor keep_x, keep_atty, keep_out;  // (Nh, C): the last layer's input, attention output and output rows
  tensor keep_dres, keep_datty;        // (Nh, C): backward scratch of the kept rows
  tensor lnf, lnf_mean, lnf_rstd;  // (B,T,C) final hidden (post_norm: a copy of resid[n_layers])
  tensor hout;                     // (B,T,E) project_out(lnf), projection only
  tensor logits;                   // (B,T,V) (LM head)
  tensor values;                   // (B,T) (value head)
  tensor losses;                   // (B*T)
  int64_t n_valid = 0;
  /// Gradient scratch for backward, sized with the activations.
  tensor dlogits, dlnf, dres, dln, dact, dgate, dup, datty, dq, dk, dv;  // (B*T, ...) each
  tensor lora_du, lora_dx;  // LoRA backward scratch
  tensor dhout, demb;       // (B*T, E) projection backward scratch
};

/// A KV cache for incremental decoding: per layer k, v of shape (B, S, KV, hs).
struct kv_cache {
  int64_t B = 0, S = 0;
  std::vector<tensor> k, v;
};

/// The decoder model: config, weights and gradients (zero_engine, models/train/zero.h, trains it).
class decoder {
 public:
  decoder() = default;
  /// Allocates zeroed weights for `cfg` on `dev`. Throws std::invalid_argument on a bad config.
  explicit decoder(const model_config& cfg, device dev = device::cpu());

  /// The device of the parameters; forward, backward and forward_cached allocate every
  /// activation, gradient scratch and KV cache there (docs/cuda.md).
  device dev() const { return dev_; }
  /// Move the parameters, the gradients (when allocated) and the adapter buffers to `d`
  /// (e.g. device::cuda(0)); a no-op when already there. Every view (by_name, layers,
  /// lm_head) is rebound to the new buffers; tensors obtained before the move keep
  /// pointing at the old copies. Make the zero_engine and the activations after the
  /// move (forward reallocates activations of another device). Throws std::logic_error
  /// while ZeRO hooks or external gradients are installed (move the model, then make its zero_engine)
  /// or after release_flat_params(); std::runtime_error when `d` has no memory backend
  /// (a CUDA device in a build without CUDA, or no GPU present).
  void to(device d);

  const model_config& config() const { return cfg_; }
  const std::vector<param_entry>& params() const { return entries_; }
  weights& w() { return w_; }
  const weights& w() const { return w_; }
  /// Gradients (allocated on first use by `zero_grad`).
  weights& grads() { return g_; }
  int64_t num_parameters() const { return n_params_; }
  /// A parameter by HF name; throws std::out_of_range naming it.
  tensor& param(const std::string& name);

  /// Add LoRA adapters to the Linear layers named by cfg.target_modules and, when
  /// freeze_base, train only them (and the value head). A initialised as PEFT does
  /// (kaiming-uniform, bound 1/sqrt(in)), B zero, so the model's output is unchanged.
  /// Throws std::invalid_argument when a pattern matches no layer, lora_r < 1, or lora_r > the model's dim
  /// (rank(B A) <= min(in, out): a larger rank adds no capacity, only memory and time).
  void enable_lora(const lora_config& cfg, bool freeze_base = true);
  bool has_lora() const { return lora_.lora_r > 0 && lora_on_; }
  const lora_config& lora() const { return lora_; }
  /// W += scale · B A for every adapted layer (and mark merged: forward skips the adapter).
  void merge_lora();
  /// W -= scale · B A: the exact inverse of merge_lora (up to float rounding).
  void unmerge_lora();
  bool lora_merged() const { return merged_; }
  /// The dropout of the adapter in place (lora_dropout, in [0, 1)) and the seed of its masks:
  /// continuing base + LoRA with another lora_dropout than the adapter was trained with, as
  /// TencentPretrain's --lora_dropout beside --lora_pretrained_model_path (dropout shapes training,
  /// not what the weights mean). Throws std::logic_error without LoRA, std::invalid_argument for p
  /// outside [0, 1).
  void set_lora_dropout(float p, uint64_t seed);

  /// Replace the LM head by a scalar value head v_head (Linear(C, 1), no bias),
  /// as DeepSpeed-Chat's RewardModel (dschat/utils/model/reward_model.py). The
  /// forward then fills activations::values (B, T) instead of logits.
  void add_value_head(uint64_t seed = 0);
  bool has_value_head() const { return value_head_; }

  /// Whether the base weights train (false after enable_lora with freeze_base).
  bool base_trainable() const { return base_trainable_; }
  void set_base_trainable(bool on) { base_trainable_ = on; }
  /// Adapter tensors (LoRA A/B and v_head) in adapter_flat order.
  const std::vector<param_entry>& adapter_params() const { return adapter_entries_; }
  int64_t num_adapter_parameters() const { return n_adapter_; }

  /// GPT-2-style random init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
  /// norms 1, biases 0. Deterministic for a seed.
  void init_random(uint64_t seed);

  /// Training forward. ids, targets (B, T) i32 (targets may be undefined: no loss;
  /// -100 entries are ignored). The inputs may be on the host or on the model's device:
  /// they are copied to dev() when needed (positions are built on the host, then copied). mask (B, T) i32 may be undefined (no padding);
  /// positions (B, T) i32 may be undefined (0..T-1, or from the mask's cumsum when
  /// a mask is given, as HF does for left padding). Returns the mean loss (0 without targets).
  ///
  /// keep_from (0 <= keep_from < T): the caller reads the logits (or values) at positions
  /// t >= keep_from only, and backward's dlogits/dvalues before it are not read. After the last
  /// layer's attention every position is computed on its own row, so its o_proj, MLP, the final
  /// norm and the head run at the kept B * (T - keep_from) rows only (the K and V of every position
  /// still are computed): RLHF scoring and updates read the answer, not the prompt (DS-Chat's
  /// logits[:, start - 1:], HF's logits_to_keep, which stops at the head). Logits/values before
  /// keep_from are 0. Post-norm (OPT-350m) models keep only at the head. With targets it must be 0
  /// (std::invalid_argument): the loss reads every position.
  double forward(activations& a, const tensor& ids, const tensor& targets, const tensor& mask = {},
                 const tensor& positions = {}, int64_t keep_from = 0);
  /// Backward of the mean cross-entropy of the last forward; accumulates into grads().
  /// `dlogits` may be given instead (B, T, V) for other losses (then targets are unused).
  /// With a value head, `dout` is dvalues (B, T) and is required.
  void backward(activations& a, const tensor& dout = {});
  /// Zero the gradient buffer (allocating it on first use).
  void zero_grad();

  /// Incremental decode: run `ids` (B, Tq) i32 at positions `positions` (B, Tq) through the
  /// model using and extending `cache` from n_past; mask (B, n_past + Tq) may be undefined.
  /// Returns logits (B, Tq, V) when all_logits, else the last position's (B, V).
  /// With a value head: values (B, Tq) or (B,) instead. The result is on dev(); the
  /// inputs may be on the host (preferred: positions are computed on the host) or on dev().
  tensor forward_cached(kv_cache& cache, const tensor& ids, const tensor& positions, const tensor& mask,
                        int64_t n_past, bool all_logits = false);
  kv_cache make_cache(int64_t B, int64_t S) const;

  /// The blocks of the flat parameter buffer (see param_block), in order; they
  /// cover [0, num_parameters()) exactly.
  std::vector<param_block> param_blocks() const;
  /// Install (or, with nullptr, remove) the hooks called around each block.
  void set_param_hooks(param_hooks* h) { hooks_ = h; }
  /// Point block `b`'s parameter views at `params` and its gradient views at
  /// `grads` ((numel,) f32 each, element i = flat element begin + i; either may be
  /// undefined, which leaves those views undefined until the next rebind).
  /// Used by ZeRO stage 3 (parameters) and stages 2-3 (gradients).
  void rebind_block(int b, const tensor& params, const tensor& grads);
  /// Drop the full flat parameter buffer (ZeRO-3: every block is rebound by the engine).
  void release_flat_params();
  /// The inverse: a full (n_params,) f32 parameter buffer (copied to dev()), every base
  /// view rebound to it (zero_engine::release_model). Throws std::invalid_argument on a wrong size.
  void restore_flat_params(const tensor& flat);
  /// When true, backward() does not allocate a full gradient buffer: the hooks
  /// bind gradient views per block (ZeRO stages 2 and 3).
  void set_external_grads(bool on) { external_grads_ = on; }
  /// Training mode (the default) applies lora_dropout in forward(); evaluation
  /// (false) does not and leaves the dropout stream untouched (torch's .eval()).
  void set_training(bool on) { training_ = on; }
  /// Gradient checkpointing (HF's model.gradient_checkpointing_enable(); DeepSpeed-Chat's
  /// --gradient_checkpointing, --actor_gradient_checkpointing, --critic_gradient_checkpointing).
  /// When on, forward() keeps each layer's input resid[l] (B, T, C) and one layer's
  /// intermediate tensors (a slot reused by every layer), and backward() re-runs layer l's
  /// forward from resid[l] just before its backward: the saved activations shrink from
  /// about n_layers layers' worth to one, for one extra layer forward per layer (the last
  /// layer's tensors are still in the slot, so n_layers - 1 recomputations). The LoRA
  /// dropout masks are redrawn from the stream position saved per layer, so gradients
  /// equal those without checkpointing. forward_cached (generation) is unaffected.
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  bool gradient_checkpointing() const { return checkpointing_; }
  bool training() const { return training_; }
  /// The LoRA dropout stream position (the decoder's only RNG state while training).
  uint64_t rng_state() const { return dropout_calls_; }
  void set_rng_state(uint64_t s) { dropout_calls_ = s; }

 private:
  void bind(weights& dst, const tensor& flat);
  // Set the named fields of `dst` (wte, layers[l].wq, ...) from dst.by_name.
  void wire(weights& dst);
  void hook_acquire(int b, param_hooks::phase p, bool params = true) {
    if (hooks_) hooks_->acquire(b, p, params);
  }
  void hook_release(int b, param_hooks::phase p) {
    if (hooks_) hooks_->release(b, p);
  }
  void hook_grads_ready(int b) {
    if (hooks_) hooks_->grads_ready(b);
  }
  void bind_adapter(weights& dst, const tensor& flat);
  // Scaled RoPE (cfg_.rope_scaling): the rotation matrix R (hs, hs) of each position of
  // positions_host (B, T) i32 on the host, from model_config::rope_inv_freq, as (B*T, hs, hs) on
  // dev_: R rotates each pair of the layout by position * inv_freq[i] (cos and sin in f32, as
  // transformers' LlamaRotaryEmbedding). Undefined without scaling.
  tensor rope_rotations(const tensor& positions_host) const;
  // In place on x (B, T, NH, hs): RoPE (inverse: its transpose, for backward). With `rot`
  // undefined, ops::rope_forward / rope_backward with rope_theta; else x[n] Rᵀ (or x[n] R) by
  // ops::matmul_batched (no new kernel: the rotation is a (hs, hs) matrix per position).
  void rope_apply(tensor& x, const tensor& positions, const tensor& rot, bool inverse) const;
  void rebuild_adapter();
  // y = x Wᵀ + b (+ LoRA) for module m of layer l; `la` saves what backward needs (null: inference), in
  // buffers of at least hold_rows rows (the layer's B*T: the kept last layer's calls have fewer)
  void lin_fwd(int64_t l, int m, tensor& out, const tensor& x, activations::layer* la, int64_t hold_rows = 0);
  // dx += dout W (+ LoRA); dW, db (+ dA, dB) accumulate when trainable
  void lin_bwd(int64_t l, int m, tensor& dx, const tensor& dout, const tensor& x, activations& a,
               activations::layer& la);
  // Layer l's training forward: out (N, C) from x (N, C), its tensors saved in a.at(l).
  void layer_forward(activations& a, int64_t l, const tensor& x, tensor& out, const tensor& mask);
  // Checkpointed backward: recompute layer l into the slot from resid[l] (same dropout masks).
  void recompute_layer(activations& a, int64_t l);
  // post-LayerNorm layer (cfg.post_norm): out = LN2(h + mlp(h)), h = LN1(x + attn(x))
  void forward_post_layer(activations& a, int64_t l, const tensor& x, tensor& out, const tensor& mask);
  // The two sub-blocks shared by pre- and post-norm layers (l: layer; activations saved in a.at(l)):
  // out = resid + o_proj(attention(in)); out = resid + down(act(in)) (N, C) each.
  void attn_fwd(activations& a, int64_t l, const tensor& in, const tensor& resid, tensor& out, const tensor& mask);
  void mlp_fwd(activations& a, int64_t l, const tensor& in, const tensor& resid, tensor& out);
  // din += d block / d in for gradient dout of the block's output (the residual path is the caller's).
  void attn_bwd(activations& a, int64_t l, const tensor& in, const tensor& dout, tensor& din);
  // attention without o_proj: q, k, v of `in` (N, C), RoPE, attention into the layer's atty; its
  // backward adds d in for the gradient a.datty of atty
  void attn_core_fwd(activations& a, int64_t l, const tensor& in, const tensor& mask);
  void attn_core_bwd(activations& a, int64_t l, const tensor& in, tensor& din);
  // The last layer at the kept rows of forward's keep_from (pre-norm): writes a.keep_out (Nh, C); its
  // backward reads a.keep_dres (Nh, C) and writes a.dres (N, C).
  bool kept_last_layer(const activations& a) const { return a.keep_from > 0 && !cfg_.post_norm; }
  // dx (Nh, E) += dout W, dw += doutᵀ x for the head: dout (N, V or 1), x (Nh, E); per sequence with keep_from
  void head_backward(const activations& a, tensor& dx, tensor& dw, const tensor& dout, const tensor& x,
                     const tensor& w);
  void last_layer_forward_kept(activations& a, int64_t l, const tensor& x, const tensor& mask);
  void last_layer_backward_kept(activations& a, int64_t l);
  void mlp_bwd(activations& a, int64_t l, const tensor& in, const tensor& dout, tensor& din);
  void backward_post_layer(activations& a, int64_t l);
  void norm_forward(tensor& out, tensor& mean, tensor& rstd, const tensor& x, const tensor& w, const tensor& b);
  void norm_backward(tensor& dx, tensor& dw, tensor& db, const tensor& dout, const tensor& x, const tensor& w,
                     const tensor& mean, const tensor& rstd);

  model_config cfg_;
  device dev_;
  std::vector<param_entry> entries_;
  int64_t n_params_ = 0;
  weights w_, g_;
  lora_config lora_{0};
  bool lora_on_ = false, merged_ = false, value_head_ = false, base_trainable_ = true;
  std::vector<param_entry> adapter_entries_;
  int64_t n_adapter_ = 0;
  uint64_t dropout_calls_ = 0;
  param_hooks* hooks_ = nullptr;
  bool external_grads_ = false;
  bool training_ = true;
  bool checkpointing_ = false;
};

}  // namespace flowrun
