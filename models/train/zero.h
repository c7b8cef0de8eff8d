// ZeRO data-parallel training of a decoder over a communicator (stages 0-3).
//
// Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models" (sec. 5: P_os, P_os+g, P_os+g+p; sec. 7: communication);
// the reference implementation is DeepSpeed's runtime/zero/stage_1_and_2.py and
// stage3.py. One zero_engine per rank; every rank calls the same methods in the
// same order (they run collectives).
//
// Layout. The decoder's flat parameter buffer is cut into blocks (the embeddings,
// each layer, the head: decoder::param_blocks). Block b of n_b elements is padded
// to N·p_b, p_b = ceil(n_b / N), and rank r owns piece r: flat elements
// [begin_b + r·p_b, min(begin_b + (r+1)·p_b, end_b)). A rank's shard is the
// concatenation of its pieces (Σ_b p_b elements, the padding zero).
//
//   stage 0  every rank holds all parameters, gradients and AdamW moments;
//            gradients are all-reduced once per step.
//   stage 1  AdamW moments are sharded: gradients reduce-scattered per block,
//            each rank steps its pieces, parameters all-gathered per block.
//   stage 2  + gradients sharded: each block's gradients are reduce-scattered as
//            soon as backward has finished them (per micro-batch), and only the
//            rank's pieces are kept.
//   stage 3  + parameters sharded: a block is all-gathered just before forward or
//            backward reads it and freed right after (param_hooks).
//
// The loss comes from the caller (train_step(batch_loss)): per micro-batch, the
// caller runs the model's forward and gives its loss and the loss's gradient
// (dlogits or dvalues); the engine does the rest: splitting the global batch's
// micro-batches over the ranks, gradient accumulation, backward (with its ZeRO
// hooks), gradient reduction, the non-finite check, clipping and the AdamW step
// at the scheduled lr. The LM cross-entropy of pretraining is one such loss
// (train_step(ids, targets)); DeepSpeed-Chat's SFT and pairwise RM losses are
// others (models/rlhf/dschat_steps.h).
//
// Normalization. Each micro-batch's loss is a mean over `units` of its own
// (valid targets, pairs, ...; batch_loss::units says how many). The step's
// objective is the mean over every unit of the global batch:
//   L = Σ_k units_k · loss_k / Σ_k units_k    (k over all micro-batches of all ranks)
// so the gradient, the loss and the update do not depend on the world size or on
// how the global batch is cut into accumulation steps, as long as the units are
// the same. For the LM loss the units are the valid targets (-100 ignored).
// Shapes: ids, targets (B_global, T) i32.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/train/ds_config.h"
#include "runtime/comm/communicator.h"

namespace flowrun {

/// The DeepSpeed settings the engine uses (ds_config.h fills them from JSON).
/// t (f32, on the CPU or a CUDA device) rounded in place to `via` (bf16 or f16, round to nearest
/// even) and back: the engine's working parameters of a mixed-precision model are the master so
/// rounded, and so are the frozen models DS-Chat runs in its dtype (the reference and reward
/// models) and the model a DS-Chat step loads before its engine makes the master from it.
/// Throws std::invalid_argument for a tensor that is not f32.
void round_through(tensor& t, dtype via);

struct zero_settings {
  int stage = 0;                          ///< zero_optimization.stage: 0, 1, 2 or 3
  int64_t micro_batch = 1;                ///< train_micro_batch_size_per_gpu (rows per rank per micro-step)
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;         ///< max global L2 norm; 0 = off
  ops::adamw_config adamw;                ///< lr is the base lr (a schedule passes its own per step)
  /// Mixed precision (DeepSpeed's "bf16" / "fp16" sections): the working
  /// parameters are the fp32 master rounded to this type, parameters travel and
  /// gradients are reduced in it (DeepSpeed's communication_data_type default);
  /// the master weights, AdamW moments and the update stay fp32. The kernels compute
  /// in f32 on the rounded values, but for bf16's GEMMs (bf16_matmul). f32 = full precision.
  dtype precision = dtype::f32;
  /// fp16 only: the loss scaler (DeepSpeed's DynamicLossScaler, or a static
  /// scale); the engine scales dloss, unscales the reduced gradients, skips a
  /// step whose gradients overflowed and updates the scale. Null: no scaling.
  std::shared_ptr<dynamic_loss_scaler> loss_scaler;
  /// bf16: forward and backward run their GEMMs with bf16 inputs and fp32 accumulation
  /// (ops::set_matmul_precision(bf16), for the engine's calls only), on CUDA and on a CPU
  /// with bf16 dot products (ops::cpu_bf16_matmul(); other CPUs ignore the setting);
  /// false: fp32 GEMMs on the bf16-rounded weights. No effect for f32/f16.
  bool bf16_matmul = true;
  /// Ranges [begin, end) of the flat base buffer whose gradients are zeroed after the
  /// reduction, before the norm, the clip and the step (DeepSpeed-Chat's
  /// LinearLayer_LoRA freezes the weight of a LoRA'd Linear while the rest trains).
  /// AdamW's weight decay still applies to them (exactly frozen when weight_decay = 0).
  std::vector<std::pair<int64_t, int64_t>> frozen_ranges;
  /// The LoRA tensors' (A and B; not a value head in the adapter buffer) peak learning rate, when >= 0: a step
  /// given lr steps them at adapter_lr x lr / adamw.lr (adapter_lr itself when adamw.lr is 0), the
  /// schedule shared as DS-Chat's LoRA parameter group shares LambdaLR's (utils.py
  /// get_optimizer_grouped_parameters' lora_lr beside the base learning_rate). < 0: the base lr.
  double adapter_lr = -1;
};

/// Bytes one rank holds, by kind (what DeepSpeed's see_memory_usage splits).
struct memory_report {
  int rank = 0, world_size = 1, stage = 0;
  dtype precision = dtype::f32;     ///< zero_settings::precision (named by str() when not f32)
  int64_t param_bytes = 0;          ///< persistent parameters held: the working copy (below stage 3), the fp32 master
                                    ///< (this rank's pieces at stages 1-3, a full copy at stage 0 in bf16/fp16) and
                                    ///< the adapter buffer (LoRA A/B, v_head)
  int64_t gathered_peak_bytes = 0;  ///< stage 3: most bytes of gathered blocks alive at once
  int64_t max_block_bytes = 0;      ///< the largest block (padded), for comparison
  int64_t grad_bytes = 0;           ///< persistent gradient buffers (+ the peak of per-block buffers at stages 2-3)
  int64_t optimizer_bytes = 0;      ///< AdamW exp_avg and exp_avg_sq (base and adapter)
  int64_t activation_bytes = 0;     ///< saved activations and backward scratch (the largest step's)
  int64_t loss_bytes = 0;           ///< the caller's loss gradient micro_loss::dout of the largest micro-batch: a float
                                    ///< dlogits (B, T, V) beside the logits (PPO policy, ptx), dvalues (B, T)
  int64_t total() const {
    return param_bytes + gathered_peak_bytes + grad_bytes + optimizer_bytes + activation_bytes + loss_bytes;
  }
  /// One line: "rank 0/2 stage 3: params 0.52 MB (+0.18 MB gathered peak) grads ... total ...";
  /// "rank 0/1 stage 0, bf16: ..." in mixed precision.
  std::string str() const;
};

/// What a trainer's rank will run, for estimate_memory: the micro-batch, the engine's stage
/// and world size, the precision, and which gradient the loss gives backward.
struct memory_plan {
  int64_t micro_batch = 1;  ///< rows per micro-batch on one rank (B); the RM's pairs count twice
  int64_t seq_len = 1;      ///< tokens per row (T)
  int world_size = 1;
  int stage = 0;            ///< ZeRO stage 0-3
  dtype precision = dtype::f32;  ///< zero_settings::precision: bf16/fp16 keep an fp32 master beside the working copy
  /// The caller's dout (micro_loss::dout): none (the model's own cross-entropy: activations::dlogits),
  /// dlogits (a (B, T, V) f32 tensor the loss allocates: rlhf::gather_log_probs_backward for the PPO
  /// policy, the ptx loss), or dvalues ((B, T) f32: a value head's loss, RM or critic).
  enum class loss_grad { model_cross_entropy, dlogits, dvalues };
  loss_grad dout = loss_grad::model_cross_entropy;
  /// The trainer's forward keeps the answer's rows (decoder::forward's keep_from: PPO's and GRPO's
  /// policy and critic, DPO): activations::keep_* buffers, (B·T, C) each, five (two post-norm) more.
  bool keep_rows = false;
};

/// An estimate made before a run (no allocation beyond `model` itself): the bytes
/// zero_engine::memory() reports after steps of this plan, category by category. `model` is
/// the decoder as it will train: LoRA enabled or not (adapter parameters, their gradients and
/// moments; a frozen base has no moments, though stages 0-1 still allocate its gradient
/// buffer, which backward uses for scratch), a value head or not, gradient checkpointing set.
/// Exact for the engine's buffers (the blocks' padding, the stage-3 gathered peak of a layer or
/// of the head with a tied embedding, the stage 2-3 gradient buffers); activations from
/// estimate_activation_bytes; loss_bytes from plan.dout. Throws std::invalid_argument on a
/// stage outside 0..3, world_size < 1 or a micro-batch or seq_len < 1.
memory_report estimate_memory(const decoder& model, const memory_plan& plan);
/// Bytes of saved activations and backward scratch for a (B, T) training micro-batch of
/// `model` (its head: logits (B, T, V), with their gradient activations::dlogits when
/// `model_cross_entropy`, or values (B, T) for a value head; its LoRA: u (B·T, r) per adapted
/// Linear, and in training mode with lora_dropout the (B·T, in) masks and backward scratch; its
/// gradient checkpointing: one layer's tensors instead of n_layers'), f32: exactly what
/// decoder::forward and backward allocate, i.e. zero_engine::memory().activation_bytes after a step.
/// keep_rows: the forward runs with keep_from > 0 (memory_plan::keep_rows).
int64_t estimate_activation_bytes(const decoder& model, int64_t B, int64_t T, bool model_cross_entropy = true,
                                  bool keep_rows = false);

/// What one optimizer step did (identical on every rank).
struct step_result {
  double loss = 0;         ///< the loss over the global batch: Σ units_k · loss_k / Σ units_k (LM: mean cross-entropy over the valid targets)
  double grad_norm = 0;    ///< global L2 norm before clipping
  double lr = 0;
  int64_t tokens = 0;      ///< units in the global batch (LM: valid targets)
  int64_t comm_bytes = 0;  ///< bytes this rank's communicator sent during the step
  bool skipped = false;    ///< fp16: the gradients overflowed; no update was made
  double loss_scale = 1;   ///< the scale this step ran with (fp16)
};

/// Theoretical bytes one rank sends per optimizer step (ring collectives: each
/// all-gather or reduce-scatter of S bytes moves (N-1)/N·S, an all-reduce twice
/// that; ZeRO paper sec. 7.2): stage 0 all-reduces the gradients (2Ψ), stages 1-2
/// reduce-scatter them and all-gather the parameters (2Ψ), stage 3 all-gathers
/// the parameters in forward and in backward and reduce-scatters the gradients per
/// micro-batch (3Ψ each). Ψ counts padded blocks in f32. This is the textbook
/// volume plus one term: with tied embeddings at stages 2-3 the head's share of the
/// embedding's gradient is reduce-scattered on its own right after the head's
/// backward, so that its buffer does not live through every layer's backward: one
/// more reduce-scatter of the embedding block per micro-batch (counted). The
/// engine's schedule also differs in a way not counted: with tied embeddings
/// (stories260K) the head gathers the embedding a second time in forward, and the
/// lookup's backward needs no gather of an untied embedding.
/// Scalars (token counts, the loss, the norm) are not included.
int64_t zero_theoretical_bytes(const decoder& model, int world_size, int stage, int64_t gradient_accumulation_steps);

/// What a caller's loss gave on one micro-batch.
struct micro_loss {
  /// The micro-batch's loss: a mean over its units (batch_loss::units).
  double loss = 0;
  /// d loss / d (the forward's output): dlogits (B, T, V) for an LM head, dvalues (B, T)
  /// for a value head (decoder::backward's `dout`), f32, on the host or the model's
  /// device; the engine scales it (in place) by units · loss_scale / Σ units. Undefined:
  /// the model's own cross-entropy over the targets the forward was given (then `loss`
  /// must be that forward's return value).
  tensor dout;
};

/// A caller's loss over one global batch of gradient_accumulation_steps · world_size
/// micro-batches, numbered k = 0 .. gas·N - 1; rank r runs micro-batch k = g·N + r in
/// its accumulation step g (with rows: micro-batch k = rows [k·mb, (k+1)·mb)).
struct batch_loss {
  /// How many units micro-batch k's loss is a mean over (>= 0): its valid targets for a
  /// token-mean LM loss, its pairs for the pairwise RM loss, 1 for a loss that is a
  /// micro-batch mean and should weigh as one. Called once per micro-batch of this
  /// rank, before any forward (the engine needs Σ units before the first backward).
  std::function<int64_t(int64_t k)> units;
  /// Run `model`'s forward (decoder::forward: at stage 3 it gathers each block through the
  /// engine's hooks) on micro-batch k into `a` (the engine's activations) and return the
  /// loss with its gradient. The engine runs backward. Throws what the caller throws.
  std::function<micro_loss(int64_t k, decoder& model, activations& a)> forward;
};

class zero_engine : private param_hooks {
 public:
  /// `model` holds the full initial weights on every rank (identical); at stage 3
  /// the engine keeps only this rank's pieces and drops the full buffer. LoRA
  /// (model.has_lora() with a frozen base): the base is still partitioned and
  /// gathered at stage 3, the adapter is replicated and its gradients all-reduced.
  /// Device: every buffer the engine owns (fp32 master shard, AdamW moments, gradient
  /// shard, gathered blocks) lives on model.dev(); the communicator must take tensors
  /// there (comm.takes: inproc takes host and CUDA tensors, nccl its GPU, gloo the
  /// host only). Checkpoint accessors (owned_*, adapter_*, gather_full_params)
  /// return host tensors; restore takes tensors on any device.
  /// Throws std::invalid_argument on a stage outside 0..3 or batch sizes < 1, and for a
  /// communicator that does not take the model's device (e.g. gloo with a CUDA model).
  zero_engine(decoder& model, comm::communicator& comm, const zero_settings& s);
  ~zero_engine() override;

  /// One optimizer step on the global batch (B_global = micro_batch ·
  /// gradient_accumulation_steps · world_size rows, T): rank r's micro-batch g is
  /// rows [(g·N + r)·micro_batch, +micro_batch). `lr` < 0 uses settings.adamw.lr.
  /// This is the LM loss (mean cross-entropy over the valid targets, units = valid
  /// targets, the model's own cross-entropy backward) given to train_step(batch_loss).
  /// Throws std::invalid_argument on a wrong batch shape.
  step_result train_step(const tensor& ids, const tensor& targets, double lr = -1.0);
  /// One optimizer step on the caller's loss (see batch_loss and the normalization
  /// above): zero the gradients; for each of this rank's micro-batches the caller's
  /// forward, then backward of its dout scaled by units · loss_scale / Σ units; reduce;
  /// zero the frozen ranges; the non-finite check; clip to gradient_clipping; AdamW with
  /// `lr` (< 0: settings.adamw.lr). fp16 with a loss scaler: an overflow skips the update.
  /// Throws std::runtime_error when the loss or the gradient norm is not finite (without
  /// a loss scaler; nothing is updated), std::logic_error after release_model().
  step_result train_step(const batch_loss& loss, double lr = -1.0);
  /// Mean loss of `ids`/`targets` (B_global, T) split over the ranks (rank r: rows [B r / N, B (r + 1) / N)),
  /// forward only: the sum over every rank's valid targets over their count. Every rank calls it (the
  /// forward's collectives). Throws std::invalid_argument when B < N (a rank without a row).
  double eval_loss(const tensor& ids, const tensor& targets);

  /// Bytes held now (peaks since construction for gathered blocks).
  memory_report memory() const;
  const zero_settings& settings() const { return s_; }
  int64_t step_count() const { return t_; }
  int rank() const { return r_; }
  int world_size() const { return N_; }
  decoder& model() { return model_; }
  comm::communicator& comm() { return comm_; }
  /// The activations train_step's forwards run in. A trainer may run a forward-only pass in them
  /// (the PPO trainers score the rows they then train on: ppo::actor_batch_loss's `scored`), which
  /// also saves allocating activations of its own; the next train_step overwrites them.
  activations& forward_activations() { return act_; }
  /// The matmul precision of the engine's forwards and backwards (zero_settings::bf16_matmul):
  /// bf16 for a bf16 model with bf16_matmul, else the calling thread's. A forward-only pass that
  /// stands for a train_step's forward (the PPO trainers' scoring) runs under it too.
  ops::matmul_precision compute_precision() const;

  // ---- checkpoint state: this rank's pieces, compact (padding left out)
  /// Real element ranges [begin, end) of the flat base buffer this rank owns, in shard order.
  std::vector<std::pair<int64_t, int64_t>> owned_ranges() const;
  /// This rank's fp32 master parameters, exp_avg and exp_avg_sq over owned_ranges()
  /// (compact, f32); empty tensors for the moments before any step or when the base is frozen.
  tensor owned_params() const;
  tensor owned_exp_avg() const;
  tensor owned_exp_avg_sq() const;
  /// The adapter buffer (LoRA A/B, v_head) and its moments: replicated on every rank.
  tensor adapter_params() const;
  tensor adapter_exp_avg() const { return am_.to(device::cpu()); }
  tensor adapter_exp_avg_sq() const { return av_.to(device::cpu()); }
  /// Restore from full (unsharded) flat buffers, as a checkpoint of any world size
  /// reassembles them: params (n_params,), moments (n_params,) or undefined; the
  /// adapter the same over its buffer; `step` the optimizer step count.
  void restore(const tensor& params, const tensor& exp_avg, const tensor& exp_avg_sq, const tensor& adapter,
               const tensor& adapter_m, const tensor& adapter_v, int64_t step);
  /// All parameters, gathered (every rank calls; every rank gets the full (n_params,) f32 buffer):
  /// the fp32 master (exact, for checkpoints and outputs), or the working parameters, the master
  /// rounded to the precision the forwards use (!exact: what the hybrid engine generates with,
  /// gathered in that precision at stage 3, as a forward's layers are).
  tensor gather_full_params(bool exact = true);
  /// A buffer laid out as owned_params() (this rank's pieces, compact over owned_ranges()), whole:
  /// every rank calls with its own pieces and gets the full (n_params,) f32 buffer on the host, as
  /// gather_full_params does for the master. For state a caller keeps per piece beside the engine,
  /// e.g. the PPO actor's EMA. Throws std::invalid_argument when `pieces` has another length.
  tensor gather_owned(const tensor& pieces);
  /// Hand the model back whole: every rank calls; the model gets the full fp32 parameters
  /// (gathered at stage 3, the master in mixed precision) and loses the engine's hooks, so
  /// it can be saved or used alone. The engine trains no more (train_step throws).
  void release_model();
  /// Sum (or max) a host tensor across the ranks (through the communicator's device when
  /// it takes no host tensors): for a caller's statistics, e.g. accuracies.
  void all_reduce_host(tensor& x, comm::reduce_op op = comm::reduce_op::sum);

 private:
  struct block_state;
  void acquire(int b, phase p, bool params) override;
  void release(int b, phase p) override;
  void grads_ready(int b) override;
  // All-gather block b's parameters into dst ((N·p_b,) f32): rounded to the working
  // precision (exact = false), or the fp32 master itself (exact = true).
  void gather_block(int b, tensor& dst, bool exact = false);
  // Reduce-scatter a padded f32 block buffer into `dst` (p_b,) f32 in the working precision.
  void reduce_scatter_block(const tensor& send, tensor& dst);
  bool grads_overflowed();
  void zero_frozen_grads();
  void round_working_params();
  void reduce_grads_stage01();
  void optimizer_step(double lr, double clip_coef);
  void allgather_params_after_step();
  tensor piece(const tensor& full_block, int b) const;
  // This rank's real elements of block b: [lo, hi) of the flat buffer (hi == lo when it owns only padding).
  std::pair<int64_t, int64_t> owned(size_t b) const;
  std::vector<int64_t> owned_starts() const;  // this rank's piece view of a (padded) block buffer
  double sum_sq_local() const;

  decoder& model_;
  comm::communicator& comm_;
  zero_settings s_;
  int N_ = 1, r_ = 0;
  device dev_;  // the model's device: every engine buffer lives here
  bool base_trains_ = true;
  std::vector<param_block> blocks_;
  std::vector<int64_t> piece_, shard_off_;  // p_b and this rank's offset of block b in the shard
  int64_t shard_numel_ = 0;
  tensor master_;  // stage 3: this rank's parameter pieces (shard_numel_,)
  tensor grad_shard_;  // stages 1-3: reduced gradient pieces (shard_numel_,)
  tensor m_, v_;       // AdamW moments: full (stage 0) or shard (1-3)
  tensor am_, av_;     // adapter moments
  std::vector<block_state> st_;
  int64_t t_ = 0;
  std::vector<char> grad_written_;  // stages 2-3: block b's shard gradient has a report of this step
  bool released_ = false;
  int64_t gathered_now_ = 0, gathered_peak_ = 0, gradbuf_now_ = 0, gradbuf_peak_ = 0;
  activations act_;
  int64_t act_peak_ = 0;
  int64_t loss_peak_ = 0;  // the largest caller's dout
};

}  // namespace flowrun
