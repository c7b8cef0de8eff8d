// DeepSpeed-Chat's step 1 (supervised fine-tuning) and step 2 (reward model)
// as library functions over a decoder, an AdamW optimizer and the batches of
// models/dschat_data.h (microsoft/DeepSpeedExamples, applications/DeepSpeed-Chat/
// training/step1_supervised_finetuning/main.py and
// training/step2_reward_model_finetuning/main.py). No actors here: the actor
// nodes wrap these functions.
//
// One call of sft_step / rm_step is one micro-batch (DS-Chat's engine.backward +
// engine.step): gradients accumulate over gradient_accumulation_steps
// micro-batches, are averaged, clipped to gradient_clipping (DS-Chat's
// ds_utils.py get_train_ds_config: 1.0), and the optimizer steps with the
// scheduled learning rate (transformers.get_scheduler semantics).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/dschat_data.h"
#include "models/rlhf_math.h"
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
  /// Train only the LoRA tensors (and the value head). Without it DS-Chat still freezes
  /// the weights of the LoRA'd Linears (LinearLayer_LoRA sets requires_grad = False) and
  /// trains everything else; we zero those weights' gradients (exactly frozen when
  /// weight_decay = 0; with decay AdamW still shrinks them).
  bool only_optimize_lora = false;
  float gradient_clipping = 1.0f;       ///< max global grad norm (ds_utils.py); <= 0: off
  /// Steps 1-2's --gradient_checkpointing: recompute each layer's activations in backward
  /// (decoder::set_gradient_checkpointing; the node applies it to the model).
  bool gradient_checkpointing = false;
  float adam_beta1 = 0.9f, adam_beta2 = 0.95f, adam_eps = 1e-8f;  ///< step1/2 main.py betas=(0.9, 0.95)
};

/// Step 2's defaults (step2 main.py): learning_rate 5e-5, the rest as step 1.
dschat_settings rm_defaults();

/// AdamW settings from `s` (lr, betas, eps, weight_decay).
ops::adamw_config adamw_from(const dschat_settings& s);

/// The lora_config DS-Chat's settings mean (rank lora_dim, alpha 1, targets from
/// lora_module_name). Throws std::invalid_argument when lora_dim < 1 or a module name is unknown.
lora_config lora_from(const dschat_settings& s);

/// Enable LoRA on `model` when s.lora_dim > 0 (freezing the base when only_optimize_lora).
/// Call before building the optimizer. No-op when lora_dim == 0.
void apply_lora(decoder& model, const dschat_settings& s);

/// The learning rate factor of update step k (0-based; the count of optimizer steps taken)
/// of `total` (transformers.get_scheduler): warmup k/W for k < W, then linear
/// (total-k)/(total-W), cosine 0.5(1 + cos(π (k-W)/(total-W))), both floored at 0, or 1
/// (constant). "constant" ignores the warmup, as transformers does. Throws
/// std::invalid_argument naming an unknown lr_scheduler_type.
double lr_factor(const std::string& lr_scheduler_type, int64_t k, int64_t num_warmup_steps, int64_t total);

/// Optimizer steps of a run: num_train_epochs · ceil(ceil(n_train / batch) / accumulation)
/// (main.py num_update_steps_per_epoch).
int64_t total_update_steps(int64_t n_train, const dschat_settings& s);

/// Training progress across micro-batches, and scratch activations.
struct train_state {
  int64_t micro_step = 0;          ///< micro-batches seen
  int64_t update_step = 0;         ///< optimizer steps taken
  int64_t total_update_steps = 0;  ///< for the scheduler; set before training (total_update_steps())
  double last_grad_norm = 0;       ///< global norm before clipping, at the last optimizer step
  float last_lr = 0;               ///< learning rate of the last optimizer step
  bool stepped = false;            ///< whether the last micro-batch ended with an optimizer step
  activations acts;
};

/// One step 1 micro-batch: forward with the batch's next-token targets (-100 on padding
/// and, with mask_prompt, on the prompt), backward, and at an accumulation boundary average,
/// clip, and step with the scheduled lr. Returns the micro-batch's mean token loss.
/// Right padding needs no attention mask (causal: real tokens never see later padding).
/// Throws std::runtime_error when the loss is not finite.
double sft_step(decoder& model, adamw_optimizer& opt, const sft_batch_data& batch, const dschat_settings& s,
                train_state& st);

/// Step 1 evaluation on the held-out batches (step1 main.py evaluation).
struct sft_eval_result {
  double loss = 0;             ///< token-mean cross-entropy over all eval target tokens
  double perplexity = 0;       ///< exp(loss)
  double batch_mean_loss = 0;  ///< DS-Chat's figure: the mean of the per-batch mean losses
  int64_t tokens = 0;
  int64_t rows = 0;
};
sft_eval_result sft_eval(decoder& model, const std::vector<sft_batch_data>& batches);

/// The reward model's forward on a pair batch: chosen and rejected as one (2B, T) batch
/// (DataCollatorReward concatenates them), values split back, and rlhf::pairwise_loss.
/// With `dvalues`, also the loss gradient (2B, T) for decoder::backward.
rlhf::pairwise_result rm_forward(decoder& value_model, activations& a, const rm_batch_data& batch,
                                 tensor* dvalues = nullptr);

/// What one step 2 micro-batch gave.
struct rm_step_result {
  double loss = 0;
  double accuracy = 0;       ///< share of pairs with chosen score > rejected score
  double chosen_mean = 0;    ///< mean end score of the chosen answers
  double rejected_mean = 0;  ///< mean end score of the rejected answers
};

/// One step 2 micro-batch (step2 main.py): rm_forward, backward with dvalues, and the
/// optimizer step at an accumulation boundary, as sft_step. The model needs a value head
/// (decoder::add_value_head). Throws std::invalid_argument without one, std::runtime_error
/// on a non-finite loss.
rm_step_result rm_step(decoder& value_model, adamw_optimizer& opt, const rm_batch_data& batch,
                       const dschat_settings& s, train_state& st);

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
rm_eval_result rm_eval(decoder& value_model, const std::vector<rm_batch_data>& batches);

}  // namespace flowrun::dschat
