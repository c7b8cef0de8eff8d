// DeepSpeed-Chat's DPO step (microsoft/DeepSpeedExamples,
// applications/DeepSpeed-Chat/training/step2_dpo_finetuning/main.py) as library
// functions over a decoder trained by the engine (models/train/zero.h) and the pair
// batches of step 2 (dschat::rm_batch: prompt + chosen and prompt + rejected rows).
// No actors here: actors/dpo_trainer.cpp wraps these functions.
//
// One update: the frozen reference's sequence log-probs of each micro-batch this rank
// runs (forward only, once per batch, as DS-Chat's ref_model under torch.no_grad());
// then zero_engine::train_step with dpo_batch_loss: the policy's forward on chosen and
// rejected as one (2B, T) batch, per-token log-probs of the answer tokens
// (rlhf::gather_log_probs_forward), sequence sums (rlhf::sequence_log_probs),
// rlhf::dpo_loss (sigmoid with label smoothing, or IPO; models/rlhf/pg_math.h) and the
// gradient back through rlhf::gather_log_probs_backward as dlogits (2B, T, V).
// The loss is a mean over the pairs of the global batch (units = pairs), as step 2's.
//
// Which tokens count. Default (mask_before_divergence = false): the answer tokens only,
// the prompt masked out, as TRL's DPOTrainer (trl/trainer/dpo_trainer.py: the loss mask
// covers the completion). With mask_before_divergence: DS-Chat's masking, every real
// token from the first position where the chosen and rejected ids differ
// (rlhf::mask_before_divergence), so a shared answer start counts neither.
// IPO averages the log-probs over the counted tokens (TRL's ipo: logps / loss_mask.sum);
// sigmoid sums them (DS-Chat's get_batch_logps, TRL).
#pragma once

#include <cstdint>
#include <vector>

#include "models/decoder.h"
#include "models/rlhf/dschat_data.h"
#include "models/rlhf/dschat_steps.h"
#include "models/rlhf/pg_math.h"
#include "models/train/zero.h"

namespace flowrun::dschat {

/// The DPO step's settings (DS-Chat step2_dpo main.py --beta, --label_smoothing; TRL's loss_type).
struct dpo_settings {
  rlhf::dpo_config loss;  ///< beta 0.1, label_smoothing 0, loss_type sigmoid
  /// DS-Chat's masking (from the first differing token) instead of TRL's prompt masking.
  bool mask_before_divergence = false;
};

/// Which logits count, per pair side: (B, T) i32 masks over positions t whose logits
/// predict ids[:, t + 1]; 1 when that token is counted (see the file comment). Position
/// T - 1 predicts nothing (0).
struct dpo_label_masks {
  tensor chosen, rejected;
};
dpo_label_masks dpo_masks(const rm_batch_data& b, bool mask_before_divergence);

/// Sequence log-probs of a pair batch: (B) f32 each, sums over the counted tokens, and the counted
/// tokens per side (B) f32 (IPO divides each side's log-ratio by them: rlhf::dpo_loss).
struct pair_log_probs {
  tensor chosen, rejected;
  tensor chosen_tokens, rejected_tokens;
};

/// `model`'s sequence log-probs of the pairs of `b` (forward only, into `a`). The model
/// needs its LM head: a value head throws std::invalid_argument.
pair_log_probs dpo_log_probs(decoder& model, activations& a, const rm_batch_data& b, const dpo_settings& s);

/// A pair micro-batch with the reference's sequence log-probs (dpo_log_probs of the frozen
/// reference; undefined for micro-batches another rank runs).
struct dpo_batch_data {
  rm_batch_data pairs;
  pair_log_probs ref;
};

/// The DPO loss on the global batch `micro` (gradient_accumulation_steps · world size
/// micro-batches; rank r runs k = g·N + r): per micro-batch, dpo_loss over its pairs
/// (a mean, units = B) and dout = dlogits (2B, T, V) f32. `results`, when given, collects
/// each micro-batch this rank runs. `micro` must outlive the batch_loss. The forward throws
/// std::invalid_argument when a micro-batch this rank runs has no reference log-probs.
batch_loss dpo_batch_loss(const std::vector<dpo_batch_data>& micro, const dpo_settings& s,
                          std::vector<rlhf::dpo_result>* results = nullptr);

/// What one DPO update gave, over every pair of the global batch (all ranks).
struct dpo_step_result {
  double loss = 0;             ///< mean DPO loss
  double accuracy = 0;         ///< share of pairs with β(Δ chosen) > β(Δ rejected) (TRL rewards/accuracies)
  double chosen_reward = 0;    ///< mean β (log π(c) − log π_ref(c))
  double rejected_reward = 0;  ///< mean β (log π(r) − log π_ref(r))
  double grad_norm = 0;        ///< before clipping
  double lr = 0;
  int64_t pairs = 0;
};

/// One DPO update through `engine` at learning rate `lr`: the reference's log-probs of this
/// rank's micro-batches (`reference` is not changed; it runs in evaluation mode), then
/// train_step(dpo_batch_loss), then the statistics summed over the ranks. Throws
/// std::invalid_argument when micro.size() != gradient_accumulation_steps · world size,
/// std::runtime_error on a non-finite loss or gradient (nothing is updated).
dpo_step_result dpo_update(zero_engine& engine, decoder& reference, const std::vector<rm_batch_data>& micro,
                           const dpo_settings& s, double lr);

/// Held-out DPO figures over all pairs of `batches` (the policy in evaluation mode); `progress`
/// hears of each batch done (batch_progress_fn; an empty batch counts as done).
struct dpo_eval_result {
  double accuracy = 0;         ///< share with β(Δ chosen) > β(Δ rejected); 0 while policy == reference
  double accuracy_stderr = 0;  ///< sqrt(p (1 − p) / n)
  /// share with log π(c) > log π(r): the policy's own preference (per-token means under IPO, as its loss compares)
  double logp_accuracy = 0;
  double logp_accuracy_stderr = 0;
  double loss = 0;             ///< mean DPO loss (ln 2 for sigmoid while policy == reference)
  double chosen_reward = 0, rejected_reward = 0;  ///< means of β (log π − log π_ref)
  int64_t pairs = 0;
};
dpo_eval_result dpo_eval(decoder& policy, decoder& reference, const std::vector<rm_batch_data>& batches,
                         const dpo_settings& s, const batch_progress_fn& progress = {});

}  // namespace flowrun::dschat
