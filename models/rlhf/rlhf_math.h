// The math of DeepSpeed-Chat's step 2 (reward model) and step 3 (PPO), as free
// functions over CPU tensors, so that tests can call them without an actor.
//
// Conventions follow DeepSpeed-Chat (microsoft/DeepSpeedExamples,
// applications/DeepSpeed-Chat/dschat/rlhf/ppo_trainer.py):
//  - seq (B, S) = prompt (B, P, left-padded) + answer (right-padded);
//  - per-token arrays (log-probs, values, rewards, action_mask) have length
//    L = S - 1: index t belongs to the state at token t, whose action is token t+1;
//  - action_mask = attention_mask[:, 1:] (i32, 1 = real token);
//  - start = P - 1 is the first index whose action is an answer token.
// Float tensors are f32, masks and ids i32. Shape mismatches throw std::invalid_argument.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace flowrun::rlhf {

/// PPO settings, DeepSpeed-Chat's names and defaults (ppo_trainer.py __init__).
struct ppo_config {
  float kl_ctl = 0.1f;
  float clip_reward_value = 5.0f;
  float cliprange = 0.2f;
  float cliprange_value = 0.2f;
  float gamma = 1.0f;
  float lam = 0.95f;
};

/// log p(labels) under softmax(logits / temperature): out (B, T) from logits (B, T, V), labels
/// (B, T) i32. ppo_trainer.py gather_log_probs (DS-Chat: temperature 1); the rollouts' sampling
/// temperature otherwise, as TRL's, veRL's and OpenRLHF's actors take it (models/sampler.h
/// token_log_prob, the formula the generator records its behaviour log-probs with: the vector exp,
/// the sum in double). Throws std::invalid_argument for temperature <= 0, std::out_of_range for a
/// label outside [0, V). `from`: only positions t >= from are computed, out (b, t < from) is 0 (the
/// logits of decoder::forward's keep_from: the rows before it were never computed).
void gather_log_probs_forward(tensor& out, const tensor& logits, const tensor& labels, float temperature = 1.0f,
                              int64_t from = 0);
/// dlogits (B, T, V) = dout * (onehot(labels) - softmax(logits / T)) / T (overwrites); rows t < from are 0.
void gather_log_probs_backward(tensor& dlogits, const tensor& dout, const tensor& logits, const tensor& labels,
                               float temperature = 1.0f, int64_t from = 0);

/// Per-token rewards (B, L): -kl_ctl · (log_probs - ref_log_probs), plus the reward
/// score clipped to ±clip_reward_value at index min(start + n_j, L - 1), where n_j =
/// sum(action_mask[j, start:]): the state at the answer's last real token (its EOS when
/// the answer ended), or the last index when the answer was cut at the length limit.
/// ppo_trainer.py compute_rewards. `ends` (optional) receives start + n_j + 1 per row.
tensor compute_rewards(const tensor& log_probs, const tensor& ref_log_probs, const tensor& reward_score,
                       const tensor& action_mask, int64_t start, const ppo_config& cfg,
                       std::vector<int64_t>* ends = nullptr);

/// Zero rewards and values at indices >= ends[j] of each row (in place), as
/// ppo_trainer.py train_rlhf does before GAE ("otherwise the advantage/return will be wrong").
void zero_after_ends(tensor& rewards, tensor& values, const std::vector<int64_t>& ends);

/// GAE (Schulman et al. 2016, eq. 16) from index `start` to L-1 with V(L) = 0:
/// delta_t = r_t + gamma V_{t+1} - V_t; A_t = delta_t + gamma lam A_{t+1}.
/// advantages, returns (B, L - start); returns = advantages + values[:, start:].
/// ppo_trainer.py get_advantages_and_returns.
void advantages_and_returns(tensor& advantages, tensor& returns, const tensor& values, const tensor& rewards,
                            int64_t start, const ppo_config& cfg);

/// The clipped policy loss (Schulman et al. 2017, eq. 7, negated):
/// ratio = exp((logprobs - old_logprobs) · mask);
/// loss = sum(max(-A·ratio, -A·clip(ratio, 1±cliprange)) · mask) / sum(mask).
/// All (B, n) (the answer part, [:, start:]). ppo_trainer.py actor_loss_fn.
/// Writes d loss / d logprobs into dlogprobs (overwrites) when it is defined.
/// It is pg_math.h's clipped_policy_loss with token-mean aggregation and no dual
/// clip (whose log-ratio clamp at ±20 DeepSpeed-Chat lacks).
double actor_loss(const tensor& logprobs, const tensor& old_logprobs, const tensor& advantages, const tensor& mask,
                  float cliprange, tensor* dlogprobs = nullptr);

/// The clipped value loss: v_c = clip(values, old_values ± cliprange_value);
/// loss = 0.5 · sum(max((v - R)², (v_c - R)²) · mask) / sum(mask). All (B, n).
/// ppo_trainer.py critic_loss_fn. Writes d loss / d values when dvalues is given.
double critic_loss(const tensor& values, const tensor& old_values, const tensor& returns, const tensor& mask,
                   float cliprange_value, tensor* dvalues = nullptr);

/// The reward model's pairwise loss and scores for B pairs of right-padded
/// sequences (dschat/utils/model/reward_model.py RewardModel.forward), with the
/// real lengths given instead of searched for a pad id (so a score does not
/// depend on the padding). The lengths count the appended EOS, so the score is
/// read at it; DS-Chat with GPT-2 (pad = EOS) reads one token earlier, at the
/// last answer token (docs/rlhf.md, "Where the sequences differ"):
///  - chosen score = chosen_rewards[i, c_len-1], rejected score = rejected_rewards[i, r_len-1];
///  - the loss of pair i is mean over t in [div, end) of -log σ(c_t - r_t), where div
///    is the first index at which the two sequences differ (within max(c_len, r_len))
///    and end = max(c_len, r_len); identical sequences use the single index c_len-1;
///  - the batch loss is the mean over pairs.
/// rewards (B, T) f32, ids (B, T) i32, lengths (B) i32.
struct pairwise_result {
  double loss = 0;
  std::vector<float> chosen_scores, rejected_scores;
  std::vector<int64_t> divergence, end;  ///< per pair, for diagnostics and tests
};
pairwise_result pairwise_loss(const tensor& chosen_rewards, const tensor& rejected_rewards, const tensor& chosen_ids,
                              const tensor& rejected_ids, const tensor& chosen_len, const tensor& rejected_len,
                              tensor* dchosen = nullptr, tensor* drejected = nullptr);

/// ema = beta · ema + (1 - beta) · param over flat buffers (DS-Chat's moving_average, beta 0.992).
void ema_update(tensor& ema, const tensor& param, float beta);

/// Throws std::runtime_error("non-finite value in TENSOR at index I (value V) in node NODE")
/// when x holds NaN or ±inf; otherwise returns.
void check_finite(const tensor& x, const std::string& node, const std::string& tensor_name);

}  // namespace flowrun::rlhf
