// The math of critic-free policy-gradient RL (GRPO, RLOO, REINFORCE++) and of
// DPO, as free functions over CPU tensors beside DeepSpeed-Chat's PPO math
// (rlhf_math.h), so that tests and trainers call them without an actor.
//
// Conventions (as rlhf_math.h): float tensors f32, masks i32 (1 = a real
// answer token), per-token arrays (B, n) over the answer part. Arithmetic is
// done in double. Bad shapes or settings throw std::invalid_argument.
//
// Sources, cited per function:
//  - TRL (huggingface/trl): trl/trainer/grpo_trainer.py
//    (_generate_and_score_completions: group advantages, scale_rewards),
//    trl/trainer/rloo_trainer.py (the leave-one-out baseline),
//    trl/trainer/dpo_trainer.py (dpo_loss: sigmoid, ipo).
//  - veRL (volcengine/verl): verl/trainer/ppo/core_algos.py
//    (compute_grpo_outcome_advantage, compute_reinforce_plus_plus_outcome_advantage,
//    compute_policy_loss with clip_ratio_c, agg_loss, kl_penalty) and
//    verl/utils/torch_functional.py (masked_whiten).
//  - Papers: Shao et al. 2024 (DeepSeekMath, GRPO); Ahmadian et al. 2024 (RLOO);
//    Hu 2025 (REINFORCE++); Ye et al. 2020 / veRL (dual clip); Rafailov et al.
//    2023 (DPO); Azar et al. 2023 (IPO); Schulman 2020, "Approximating KL
//    divergence" (k1, k2, k3); Liu et al. 2025 (Dr. GRPO: no std scaling).
//
// Where TRL and veRL differ, the default follows the one named and the other
// is a setting away:
//  - group std epsilon: TRL's 1e-4 (veRL: 1e-6) -> group_advantage_config::epsilon;
//  - std: Bessel's (n - 1), both;
//  - dual clip: veRL's (TRL has none) -> policy_loss_config::clip_ratio_c (0 = off);
//  - IPO length normalisation: TRL's (average log-prob per answer token) ->
//    sequence_log_probs(..., average).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace flowrun::rlhf {

// -- advantages -----------------------------------------------------------------------------

/// How GRPO scales the centred rewards (TRL GRPOConfig.scale_rewards).
enum class reward_scaling {
  group,  ///< by the std of the prompt's group (GRPO; TRL's default)
  batch,  ///< by the std of the whole batch
  none,   ///< not at all: Dr. GRPO
};
/// "group", "batch" or "none"; throws std::invalid_argument naming the choices otherwise.
reward_scaling parse_reward_scaling(const std::string& s);

struct group_advantage_config {
  int64_t num_generations = 8;  ///< samples per prompt; >= 2 (TRL's default 8)
  reward_scaling scale_rewards = reward_scaling::group;
  double epsilon = 1e-4;  ///< added to the std (TRL 1e-4; veRL 1e-6)
};

/// GRPO's group-normalised advantages: rewards (N) f32, N = G · num_generations,
/// the samples of one prompt adjacent. A_i = (r_i − mean_g) / (s + epsilon), s the
/// Bessel std of the group (group), of all N rewards (batch), or no division (none).
/// The mean is taken two-pass from the group's first reward, so equal rewards give
/// exact zeros. Returns (N) f32. num_generations < 2 throws (a group of one has
/// nothing to compare with).
tensor group_advantages(const tensor& rewards, const group_advantage_config& cfg);

/// RLOO's leave-one-out advantages: A_i = r_i − (Σ_{j≠i} r_j) / (k − 1) over each
/// group of k = num_generations, computed as k / (k − 1) · (r_i − mean_g) with the
/// two-pass mean, so it neither cancels catastrophically (the sum minus one
/// element) nor leaves rounding residue for equal rewards. rewards (N) f32;
/// returns (N) f32. k < 2 throws.
tensor rloo_advantages(const tensor& rewards, int64_t num_generations);

/// Per group of num_generations: true when its rewards are not all equal. DAPO's
/// dynamic sampling keeps only these (a group of equal rewards has zero advantage).
std::vector<bool> groups_with_signal(const tensor& rewards, int64_t num_generations);

/// REINFORCE++ advantages (veRL compute_reinforce_plus_plus_outcome_advantage):
/// returns G_t = r_t + gamma · G_{t+1}, the running sum reset after each row's last
/// real token, then whitened over every real token of the batch:
/// A = (G − mean) / sqrt(var + 1e-8), var with Bessel's correction (masked_whiten),
/// and A = 0 on padding. token_rewards (B, n) f32 already holding the per-token KL
/// penalty and the score (rlhf::compute_rewards builds them); mask (B, n) i32.
tensor reinforce_pp_advantages(const tensor& token_rewards, const tensor& mask, double gamma);

// -- KL estimators ----------------------------------------------------------------------------

/// Estimators of KL(π ‖ π_ref) per token from x = log π − log π_ref (veRL kl_penalty):
enum class kl_estimator {
  k1,  ///< x                                   ("kl")
  k2,  ///< x² / 2                               ("mse")
  k3,  ///< exp(−x) + x − 1, clamped to ±10       ("low_var_kl"; −x clamped to ±20 first)
  abs, ///< |x|                                  ("abs")
};
/// "k1"|"kl", "k2"|"mse", "k3"|"low_var_kl", "abs"; throws std::invalid_argument otherwise.
kl_estimator parse_kl_estimator(const std::string& s);

/// Per-token KL estimates (B, n) f32 from logprobs and ref_logprobs (B, n) f32.
/// With dlogprobs, writes d estimate / d logprobs (overwrites; 0 where a clamp holds).
tensor kl_estimate(const tensor& logprobs, const tensor& ref_logprobs, kl_estimator k, tensor* dlogprobs = nullptr);

// -- loss aggregation -------------------------------------------------------------------------

/// How per-token losses (B, n) become one number (veRL's loss_agg_mode):
enum class loss_agg_mode {
  token_mean,           ///< Σ(l·m) / Σm over the whole batch (veRL's default)
  seq_mean_token_mean,  ///< mean over rows of Σ_t(l·m) / Σ_t m (GRPO as published)
  seq_mean_token_sum,   ///< mean over rows of Σ_t(l·m)
};
/// "token-mean", "seq-mean-token-mean", "seq-mean-token-sum"; throws otherwise.
loss_agg_mode parse_loss_agg_mode(const std::string& s);

/// The aggregate of losses (B, n) f32 under mask (B, n) i32. A row without a real
/// token is skipped (the seq-mean modes average over the other rows; veRL's
/// seq-mean-token-mean would divide 0 by 0 there); an all-padding batch gives 0,
/// never NaN. With dlosses,
/// writes d aggregate / d losses (B, n) (overwrites).
double aggregate_loss(const tensor& losses, const tensor& mask, loss_agg_mode mode, tensor* dlosses = nullptr);

// -- the clipped policy loss with dual clip ---------------------------------------------------

struct policy_loss_config {
  double clip_ratio_low = 0.2;   ///< ratio floor 1 − clip_ratio_low (veRL clip_ratio_low; PPO cliprange)
  double clip_ratio_high = 0.2;  ///< ratio ceiling 1 + clip_ratio_high (veRL clip_ratio_high)
  double clip_ratio_c = 3.0;     ///< dual clip bound for A < 0 (veRL's default 3); 0 turns it off; else > 1
  loss_agg_mode agg = loss_agg_mode::token_mean;
  /// Decoupled PPO only (behav_logprobs given): tokens whose behaviour importance weight
  /// exceeds this are left out of the loss (AReaL's behav_imp_weight_cap); 0: no cap, else > 1.
  double behav_imp_weight_cap = 0;
};

struct policy_loss_result {
  double loss = 0;
  double clipfrac = 0;        ///< share of real tokens with l2 > l1 (veRL pg_clipfrac)
  double dual_clip_frac = 0;  ///< share of real tokens where the dual clip decided (veRL pg_clipfrac_lower)
  double approx_kl = 0;       ///< mean over real tokens of old_logprobs − logprobs (veRL ppo_kl)
  double behav_weight = 1;    ///< decoupled PPO: mean over real tokens of w (capped tokens count 0)
  double behav_capped_frac = 0;  ///< decoupled PPO: share of real tokens left out by behav_imp_weight_cap
};

/// The clipped surrogate with dual clip (veRL compute_policy_loss):
/// ratio = exp(clamp(logprobs − old_logprobs, ±20));
/// l1 = −A·ratio, l2 = −A·clip(ratio, 1 − low, 1 + high), c = max(l1, l2);
/// per token: A < 0 ? min(−A·clip_ratio_c, c) : c; then aggregate_loss.
/// All (B, n); advantages per token (broadcast a sequence's advantage over its
/// tokens). With dlogprobs, writes d loss / d logprobs (overwrites).
///
/// Decoupled PPO (AReaL: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous
/// Reinforcement Learning System for Language Reasoning", eq. 5; Hilton et al. 2021,
/// "Batch size-invariance for policy optimization"; areal/utils/functional.py
/// ppo_actor_loss_fn) when behav_logprobs (B, n) f32 is given: the samples came from
/// a behaviour policy older than the proximal one, old_logprobs (recomputed with the
/// weights at the start of the update). Each token's clipped loss above is multiplied
/// by the behaviour importance weight w = exp(old_logprobs − behav_logprobs), a
/// constant of the update; a token with w > behav_imp_weight_cap (when set) gets
/// w = 0 but still counts in the aggregate's divisors, as in AReaL. With
/// behav_logprobs equal to old_logprobs every w is exactly 1 and the loss and
/// gradient are the plain clipped loss's, bit for bit. Throws std::invalid_argument
/// for a shape mismatch or a cap in (0, 1].
policy_loss_result clipped_policy_loss(const tensor& logprobs, const tensor& old_logprobs, const tensor& advantages,
                                       const tensor& mask, const policy_loss_config& cfg,
                                       tensor* dlogprobs = nullptr, const tensor* behav_logprobs = nullptr);

// -- DPO ---------------------------------------------------------------------------------------

enum class dpo_loss_type {
  sigmoid,  ///< −log σ(β z) (Rafailov et al. 2023), with label smoothing (cDPO)
  ipo,      ///< (z − 1/(2β))² (Azar et al. 2023, eq. 17; β is τ there)
};
/// "sigmoid" or "ipo"; throws std::invalid_argument otherwise.
dpo_loss_type parse_dpo_loss_type(const std::string& s);

struct dpo_config {
  double beta = 0.1;             ///< TRL's and DeepSpeed-Chat's default
  double label_smoothing = 0.0;  ///< sigmoid only: ε of conservative DPO, in [0, 0.5)
  dpo_loss_type loss_type = dpo_loss_type::sigmoid;
};

struct dpo_result {
  double loss = 0;                                    ///< mean over pairs
  std::vector<float> chosen_rewards, rejected_rewards;  ///< β (log π − log π_ref) per pair, of the inputs (sums)
  double accuracy = 0;                                ///< share of pairs with chosen reward > rejected reward
};

/// The DPO loss over B pairs (TRL dpo_trainer.py dpo_loss; DeepSpeed-Chat
/// step2_dpo_finetuning): z = (log π(c) − log π(r)) − (log π_ref(c) − log π_ref(r));
/// sigmoid: −(1 − ε) log σ(β z) − ε log σ(−β z); ipo: (z' − 1/(2β))² with z' = (log π(c) −
/// log π_ref(c)) / n_c − (log π(r) − log π_ref(r)) / n_r, each side's log-ratio over its counted
/// tokens (TRL 1.12 dpo_trainer.py, "ipo": the length normalisation its IPO authors confirmed; n = 1
/// when chosen_tokens / rejected_tokens are not given, n >= 1 always); mean over pairs.
/// Inputs are sequence log-probs (B) f32, sums over the counted tokens (sequence_log_probs), and
/// the rewards and accuracy are of those sums under every loss, as TRL's rewards/* (DS-Chat's too).
/// chosen_tokens / rejected_tokens: (B) f32 counted tokens per side. With dchosen and drejected,
/// writes d loss / d policy log-probs (B) (overwrites). β <= 0 throws.
dpo_result dpo_loss(const tensor& policy_chosen, const tensor& policy_rejected, const tensor& ref_chosen,
                    const tensor& ref_rejected, const dpo_config& cfg, tensor* dchosen = nullptr,
                    tensor* drejected = nullptr, const tensor* chosen_tokens = nullptr,
                    const tensor* rejected_tokens = nullptr);

/// A sequence's log-prob from per-token ones: Σ_t lp·m, or with `average` that sum
/// over Σ_t m (0 for a row without a real token; DPO sums, and its IPO loss divides the
/// log-ratios by the counts itself: dpo_loss). token_logprobs (B, n) f32, mask (B, n)
/// i32; returns (B) f32. The backward is mask (/ count).
tensor sequence_log_probs(const tensor& token_logprobs, const tensor& mask, bool average);

/// DeepSpeed-Chat's DPO masking (step2_dpo_finetuning/main.py): for each pair,
/// zero both masks before the first position where chosen and rejected ids differ,
/// so the shared prompt (and any shared answer start) adds nothing to z. Identical
/// rows keep their masks (DS-Chat's divergence index 0). ids and masks (B, T) i32,
/// masks changed in place.
void mask_before_divergence(tensor& chosen_mask, tensor& rejected_mask, const tensor& chosen_ids,
                            const tensor& rejected_ids);

}  // namespace flowrun::rlhf
