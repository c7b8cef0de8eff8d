// DeepSpeed-Chat's step 1 (supervised fine-tuning) and step 2 (reward model)
// as library functions over a decoder trained by the engine (models/train/zero.h) and
// the batches of models/rlhf/dschat_data.h (microsoft/DeepSpeedExamples,
// applications/DeepSpeed-Chat/training/step1_supervised_finetuning/main.py and
// training/step2_reward_model_finetuning/main.py). No actors here: the actor
// nodes wrap these functions.
//
// One call of sft_update / rm_update is one optimizer update (DS-Chat's
// gradient_accumulation_steps calls of engine.backward + engine.step): the
// losses below give zero_engine::train_step their loss and its gradient; the
// engine accumulates over the micro-batches and the ranks, clips to
// gradient_clipping (DS-Chat's ds_utils.py get_train_ds_config: 1.0) and steps
// AdamW with the scheduled learning rate (models/train/lr_schedule.h,
// transformers.get_scheduler semantics).
//
// Normalization (zero.h): step 1's loss is the mean cross-entropy over every
// target token of the global batch (its units are the tokens, as transformers'
// Trainer since 4.46 normalizes accumulated micro-batches by num_items_in_batch);
// step 2's is the mean pairwise loss over every pair of the global batch. With
// one rank and no accumulation (every graph and test here) both are DS-Chat's
// numbers exactly; with several, DeepSpeed averages per-micro-batch means
// instead, which weighs the tokens of short micro-batches more.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/rlhf/dschat_data.h"
#include "models/rlhf/rlhf_math.h"
#include "models/train/lr_schedule.h"
#include "models/train/zero.h"
#include "runtime/kernels/ops.h"

namespace flowrun::dschat {

/// Training settings with DS-Chat's argument names. Defaults are step 1's
/// (step1 main.py); step 2 differs in learning_rate (5e-5): see rm_defaults().
struct dschat_settings {
  int64_t per_device_train_batch_size = 16;
  int64_t per_device_eval_batch_size = 16;
  int64_t gradient_accumulation_steps = 1;
  float learning_rate = 1e-3f;
  float weight_decay = 0.0f;
  int64_t num_train_epochs = 1;
  int64_t max_seq_len = 512;
  int64_t max_prompt_seq_len = 256;     ///< step 3 (step3 main.py)
  std::string lr_scheduler_type = "cosine";  ///< cosine, linear, constant, constant_with_warmup
  /// A DeepSpeed JSON's "scheduler" section (apply_ds_config; type "" without one). When set it
  /// is the schedule (schedule_from), as in DeepSpeed, whose configured scheduler wins over the
  /// client's (engine._configure_lr_scheduler).
  lr_schedule ds_scheduler;
  int64_t num_warmup_steps = 0;
  uint64_t seed = 1234;
  std::string data_split = "2,4,4";
  double eval_fraction = 0.1;           ///< held-out share (split_settings::eval_fraction)
  bool mask_prompt = false;             ///< step 1: no loss on prompt tokens (DS-Chat: off)
  /// LoRA rank (lora_config::lora_r); 0 = no LoRA. DS-Chat's LinearLayer_LoRA scales by
  /// lora_scaling / lora_dim with lora_scaling = 1, i.e. lora_alpha = 1.
  int64_t lora_dim = 0;
  /// Which Linear layers get LoRA. DS-Chat matches a substring of the module path
  /// ("decoder.layers." for OPT, "layers." for LLaMA: every Linear in the blocks); here a
  /// value containing "layers" means all of q,k,v,o,gate,up,down_proj, anything else is a
  /// comma-separated list of module names ("q_proj,v_proj").
  std::string lora_module_name = "decoder.layers.";
  /// The LoRA tensors' peak learning rate (DS-Chat's --lora_learning_rate, --actor_lora_learning_rate,
  /// default 5e-4): its own AdamW group beside learning_rate, on the same schedule
  /// (zero_settings::adapter_lr). Used when lora_dim > 0.
  float lora_learning_rate = 5e-4f;
  /// Train only the LoRA tensors (and the value head). Without it DS-Chat still freezes
  /// the weights of the LoRA'd Linears (LinearLayer_LoRA sets requires_grad = False) and
  /// trains everything else; we zero those weights' gradients (exactly frozen when
  /// weight_decay = 0; with decay AdamW still shrinks them).
  bool only_optimize_lora = false;
  float gradient_clipping = 1.0f;       ///< max global grad norm (ds_utils.py); <= 0: off
  /// Steps 1-2's --gradient_checkpointing: recompute each layer's activations in backward
  /// (decoder::set_gradient_checkpointing; the node applies it to the model).
  bool gradient_checkpointing = false;
  int zero_stage = 0;                   ///< DS-Chat's --zero_stage: the engine's ZeRO stage, 0-3
  /// DS-Chat's --dtype: fp32, bf16 (fp32 masters, bf16 working weights and communication) or
  /// fp16 (the same with DeepSpeed's dynamic loss scaling).
  std::string dtype = "fp32";
  /// The DeepSpeed JSON these settings came from (apply_ds_config), or null: fp16's loss scaling
  /// reads its fp16 section (loss_scale, initial_scale_power, loss_scale_window, hysteresis,
  /// consecutive_hysteresis, min_loss_scale), else DeepSpeed's defaults (dynamic from 2^16).
  std::shared_ptr<const ds_config> ds;
  float adam_beta1 = 0.9f, adam_beta2 = 0.95f, adam_eps = 1e-8f;  ///< step1/2 main.py betas=(0.9, 0.95)
};

/// Fill `s` from a DeepSpeed JSON (a user's own ds_config, DS-Chat's --deepspeed_config):
/// zero_optimization.stage, bf16/fp16, gradient_clipping, gradient_accumulation_steps,
/// train_micro_batch_size_per_gpu, and the optimizer's lr, betas, eps and weight_decay when the
/// config has an optimizer section. The config's keys win over the node's settings (DeepSpeed
/// reads them from the JSON too). Its "scheduler" section, when there is one, goes to
/// ds_scheduler and replaces lr_scheduler_type's schedule, as DeepSpeed prefers a configured
/// scheduler to the one DS-Chat hands it (transformers.get_scheduler). Throws std::invalid_argument for the
/// Adam (L2) optimizer, which the engine does not run.
void apply_ds_config(dschat_settings& s, const ds_config& c);

/// Step 2's defaults (step2 main.py): learning_rate 5e-5, the rest as step 1.
dschat_settings rm_defaults();

/// AdamW settings from `s` (lr, betas, eps, weight_decay).
ops::adamw_config adamw_from(const dschat_settings& s);

/// The lora_config DS-Chat's settings mean (rank lora_dim, alpha 1, targets from
/// lora_module_name). Throws std::invalid_argument when lora_dim < 1 or a module name is unknown.
lora_config lora_from(const dschat_settings& s);

/// Enable LoRA on `model` when s.lora_dim > 0 (freezing the base when only_optimize_lora).
/// Call before making the engine (engine_settings). No-op when lora_dim == 0.
void apply_lora(decoder& model, const dschat_settings& s);

/// The learning-rate schedule DS-Chat's settings mean: the DeepSpeed JSON's scheduler when it has
/// one (ds_scheduler), else lr_schedule::transformers(lr_scheduler_type, num_warmup_steps, total)
/// (main.py get_scheduler). Throws
/// std::invalid_argument naming an unknown lr_scheduler_type.
lr_schedule schedule_from(const dschat_settings& s, int64_t total_update_steps);

/// The engine settings DS-Chat's settings mean for `model` (after apply_lora): ZeRO stage
/// zero_stage, micro-batch per_device_train_batch_size, gradient_accumulation_steps,
/// gradient_clipping, AdamW from adamw_from(s), the precision of dtype (fp16: a dynamic loss
/// scaler with DeepSpeed's defaults); and, when LoRA is on while the base
/// trains, the adapted Linears' weights as frozen_ranges (DS-Chat's LinearLayer_LoRA sets
/// their requires_grad = False). This is the one function that turns a trainer's settings into
/// the engine's (steps 1, 2 and 3). Throws std::invalid_argument on a zero_stage outside 0-3,
/// gradient_accumulation_steps < 1 or a dtype other than fp32, bf16, fp16.
zero_settings engine_settings(const decoder& model, const dschat_settings& s);

/// Optimizer steps of a run: num_train_epochs · ceil(ceil(n_train / batch) / accumulation)
/// (main.py num_update_steps_per_epoch).
int64_t total_update_steps(int64_t n_train, const dschat_settings& s);

/// Refuses a global batch of `n` micro-batches unless n = gradient_accumulation_steps · world
/// size of `e`: std::invalid_argument naming `what` (the caller) and both numbers.
void check_global_batch(zero_engine& e, size_t n, const char* what);

/// Evaluation mode for a scope (no LoRA dropout), as torch's model.eval() in DS-Chat's evaluation.
class eval_mode {
 public:
  explicit eval_mode(decoder& m) : m_(m), was_(m.training()) { m_.set_training(false); }
  ~eval_mode() { m_.set_training(was_); }
  eval_mode(const eval_mode&) = delete;
  eval_mode& operator=(const eval_mode&) = delete;

 private:
  decoder& m_;
  bool was_;
};

/// Step 1's loss on the global batch `micro` (gradient_accumulation_steps · world size
/// micro-batches; micro-batch k = micro[k], rank r runs k = g·N + r): the next-token
/// cross-entropy on each batch's targets (-100 on padding and, with mask_prompt, on the
/// prompt), a mean over its target tokens (units = n_target_tokens). Right padding needs
/// no attention mask (causal: real tokens never see later padding). The batch_loss
/// refers to `micro`, which must outlive it. Throws (from train_step) std::invalid_argument
/// when the model has a value head.
batch_loss sft_loss(const std::vector<sft_batch_data>& micro);

/// One step 1 update (step1 main.py) through `engine` at learning rate `lr` (the schedule's
/// lr_at(engine.step_count(), learning_rate)): train_step(sft_loss(micro), lr). The
/// result's loss is the mean token loss over the global batch. Throws
/// std::invalid_argument when micro.size() != gradient_accumulation_steps · world size,
/// std::runtime_error on a non-finite loss or gradient (nothing is updated).
step_result sft_update(zero_engine& engine, const std::vector<sft_batch_data>& micro, double lr);

/// How far a held-out pass is (sft_eval, rm_eval, dschat::dpo_eval): called with (0, N) before the
/// first of the N batches, then (k, N) after the k-th, on the calling thread; the trainers turn it
/// into node_context::progress ("step 1 sft held-out k/N ETA m:ss"), `flowrun eval reward` into its
/// progress line. An empty function: no reports.
using batch_progress_fn = std::function<void(int64_t done, int64_t total)>;

/// Step 1 evaluation on the held-out batches (step1 main.py evaluation).
struct sft_eval_result {
  double loss = 0;             ///< token-mean cross-entropy over all eval target tokens
  double perplexity = 0;       ///< exp(loss)
  double batch_mean_loss = 0;  ///< DS-Chat's figure: the mean of the per-batch mean losses
  int64_t tokens = 0;
  int64_t rows = 0;
};
/// A batch without target tokens adds nothing (it still counts as done for `progress`).
sft_eval_result sft_eval(decoder& model, const std::vector<sft_batch_data>& batches,
                         const batch_progress_fn& progress = {});

/// The reward model's forward on a pair batch: chosen and rejected as one (2B, T) batch
/// (DataCollatorReward concatenates them), values split back, and rlhf::pairwise_loss.
/// With `dvalues`, also the loss gradient (2B, T) for decoder::backward.
rlhf::pairwise_result rm_forward(decoder& value_model, activations& a, const rm_batch_data& batch,
                                 tensor* dvalues = nullptr);

/// What one step 2 update gave, over every pair of the global batch (all ranks).
struct rm_step_result {
  double loss = 0;           ///< mean pairwise loss
  double accuracy = 0;       ///< share of pairs with chosen score > rejected score
  double chosen_mean = 0;    ///< mean end score of the chosen answers
  double rejected_mean = 0;  ///< mean end score of the rejected answers
  double grad_norm = 0;      ///< before clipping
  double lr = 0;
  int64_t pairs = 0;
};

/// Step 2's loss on the global batch `micro` (as sft_loss): rm_forward's pairwise loss, a
/// mean over the batch's pairs (units = B), with dvalues. `scores`, when given, collects
/// each micro-batch this rank runs. The model needs a value head (decoder::add_value_head);
/// rm_forward throws std::invalid_argument without one.
batch_loss rm_loss(const std::vector<rm_batch_data>& micro, std::vector<rlhf::pairwise_result>* scores = nullptr);

/// One step 2 update (step2 main.py) through `engine` at learning rate `lr`: train_step(rm_loss),
/// then the accuracy and mean scores summed over the ranks. Throws as sft_update.
rm_step_result rm_update(zero_engine& engine, const std::vector<rm_batch_data>& micro, double lr);

/// Step 2 evaluation (step2 main.py evaluation_reward): accuracy = share of pairs whose
/// chosen end score exceeds the rejected one, over all pairs of `batches`.
struct rm_eval_result {
  double accuracy = 0;
  double accuracy_stderr = 0;  ///< sqrt(p (1 - p) / n)
  double chosen_mean = 0;      ///< mean over pairs (DS-Chat averages per-batch means)
  double rejected_mean = 0;
  double loss = 0;             ///< pair-weighted mean pairwise loss
  int64_t pairs = 0;
};
rm_eval_result rm_eval(decoder& value_model, const std::vector<rm_batch_data>& batches,
                       const batch_progress_fn& progress = {});

}  // namespace flowrun::dschat
