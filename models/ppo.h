// DeepSpeed-Chat's step 3 (PPO RLHF) as functions over models and tensors,
// one per phase, so that each actor of graphs/ppo.graph wraps one of them and
// the controller's loop reads like DS-Chat's main loop
// (dschat/rlhf/ppo_trainer.py: generate_experience, compute_rewards,
// get_advantages_and_returns, train_rlhf).
//
// Shapes: B rollouts, P prompt length (left-padded), S = P + answer length
// (right-padded), L = S - 1 per-token entries (index t: state at token t,
// action = token t+1), n = L - start answer entries, start = P - 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/generate.h"
#include "models/rlhf_math.h"

namespace flowrun::ppo {

/// Step-3 settings with DeepSpeed-Chat's names (training/step3_rlhf_finetuning/main.py).
struct ppo_settings {
  // per_device_generation_batch_size and generation_batches are the prompt loader's and the
  // controller's settings (actors/rlhf_nodes.cpp): they shape what reaches these functions.
  int64_t per_device_training_batch_size = 4;
  int64_t ppo_epochs = 1;
  int64_t max_prompt_seq_len = 48;
  int64_t max_answer_seq_len = 32;
  float actor_learning_rate = 1e-4f;
  float critic_learning_rate = 1e-4f;
  float actor_weight_decay = 0.0f;
  float critic_weight_decay = 0.0f;
  int64_t actor_lora_dim = 0;   ///< 0: full fine-tuning
  int64_t critic_lora_dim = 0;
  /// Recompute each layer's activations in the backward pass (decoder::set_gradient_checkpointing).
  bool actor_gradient_checkpointing = false;
  bool critic_gradient_checkpointing = false;
  bool enable_ema = false;      ///< keep an EMA of the actor (beta 0.992)
  float ema_beta = 0.992f;
  float unsup_coef = 27.8f;     ///< weight of the unsupervised (ptx) loss when ptx batches are given
  float gradient_clipping = 1.0f;
  float temperature = 1.0f;     ///< sampling for rollouts (DS-Chat samples for OPT)
  int top_k = 0;
  float top_p = 1.0f;
  rlhf::ppo_config ppo;         ///< kl_ctl, clip_reward_value, cliprange, cliprange_value, gamma, lam
};

/// A batch of rollouts and their scores (what DS-Chat's generate_experience returns).
struct experience {
  tensor prompts;         ///< (B, P) i32, left-padded
  tensor seq;             ///< (B, S) i32: prompt + answer (+ pad)
  tensor attention_mask;  ///< (B, S) i32: 1 on real tokens (the prompt's and the answer's, EOS included)
  tensor logprobs;        ///< (B, L) under the actor that generated (old policy)
  tensor ref_logprobs;    ///< (B, L) under the frozen reference
  tensor values;          ///< (B, L) critic values (DS-Chat: values[:, :-1])
  tensor reward_score;    ///< (B,) reward model score at the answer's last real token
  std::vector<int64_t> answer_len;  ///< real answer tokens per row (EOS included)
  int64_t start() const { return prompts.size(1) - 1; }
};

/// Generate answers for left-padded prompts with the actor's current weights (the
/// hybrid engine: no copy, no reload). Rows whose answer has at most one real
/// token are dropped, as DS-Chat drops them; returns nullopt when all are dropped.
/// Fills prompts, seq, attention_mask and answer_len only.
std::optional<experience> generate_rollouts(decoder& actor, const tensor& prompts, const tensor& prompt_mask,
                                            const ppo_settings& s, int32_t eos_id, int32_t pad_id, uint64_t seed);

/// log p(seq[t+1] | seq[:t+1]) for t < S-1: (B, L). The model keeps `acts` for a backward.
tensor sequence_logprobs(decoder& model, activations& acts, const tensor& seq, const tensor& mask);
/// Values of a value-head model at t < S-1: (B, L).
tensor sequence_values(decoder& model, activations& acts, const tensor& seq, const tensor& mask);
/// Reward model scores: the value at each row's last real token (B,)
/// (reward_model.py forward_value's chosen_end_scores, found from the mask).
tensor reward_scores(decoder& reward_model, const tensor& seq, const tensor& mask);

/// Rows [a, b) of an experience (views of its tensors, no copy).
experience slice_rows(const experience& e, int64_t a, int64_t b);

/// Experience maker: per-token rewards, zeroing after the ends, GAE.
/// advantages, returns (B, n). Returns the rewards (B, L) for reporting.
tensor make_advantages(const experience& e, const rlhf::ppo_config& cfg, tensor& advantages, tensor& returns);

/// Statistics of one PPO training step.
struct train_stats {
  double actor_loss = 0, critic_loss = 0, unsup_loss = 0;
  double actor_grad_norm = 0, critic_grad_norm = 0;
};

/// One actor update on the experience (DS-Chat train_rlhf, actor half): forward the
/// current policy, clipped policy loss over the answer, backward, clip, AdamW step.
double actor_train_step(decoder& actor, adamw_optimizer& opt, const experience& e, const tensor& advantages,
                        const ppo_settings& s, double* grad_norm = nullptr);
/// One critic update (critic half): clipped value loss against the returns.
double critic_train_step(decoder& critic, adamw_optimizer& opt, const experience& e, const tensor& returns,
                         const ppo_settings& s, double* grad_norm = nullptr);
/// Unsupervised (ptx) step: unsup_coef × causal-LM loss on ids/labels (B, T) (DS-Chat train_unsupervised).
double unsupervised_step(decoder& actor, adamw_optimizer& opt, const tensor& ids, const tensor& labels,
                         const ppo_settings& s);

/// Mean per-token KL estimate sum((logprobs - ref_logprobs) · mask) / sum(mask) over the answer.
double mean_kl(const experience& e);

}  // namespace flowrun::ppo
