// DeepSpeed-Chat's step 3 (PPO RLHF) as functions over models and tensors,
// one per phase, so that each actor of graphs/ppo.graph wraps one of them and
// the controller's loop reads like DS-Chat's main loop
// (dschat/rlhf/ppo_trainer.py: generate_experience, compute_rewards,
// get_advantages_and_returns, train_rlhf). The actor and critic train through
// the one engine (models/train/zero.h): the losses here are batch_losses it runs.
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
#include "models/rlhf/pg_math.h"
#include "models/rlhf/rlhf_math.h"
#include "models/train/zero.h"

namespace flowrun::ppo {

/// Step-3 settings of the PPO math, with DeepSpeed-Chat's names (training/step3_rlhf_finetuning/main.py).
/// The engine's settings (actor_/critic_learning_rate, _weight_decay, _zero_stage, _lora_dim,
/// _gradient_checkpointing, gradient_clipping, dtype, gradient_accumulation_steps) are the
/// trainer's dschat_settings (models/rlhf/dschat_steps.h engine_settings: the one settings-to-config
/// function); per_device_generation_batch_size and generation_batches are the prompt loader's
/// and the experience maker's.
/// The policy loss beyond DeepSpeed-Chat's clipped surrogate (pg_math.h, veRL's names):
/// the defaults are DS-Chat's loss exactly (no dual clip, token-mean, no KL term).
struct policy_loss_settings {
  double clip_ratio_c = 0;  ///< dual clip for A < 0 (0: off, DS-Chat and TRL; veRL's default is 3)
  /// DAPO's clip-higher (Yu et al. 2025): the ratio ceiling 1 + clip_ratio_high (veRL's clip_ratio_high,
  /// TRL's epsilon_high; DAPO 0.28); 0: cliprange, the floor's width (a symmetric clip)
  double clip_ratio_high = 0;
  rlhf::loss_agg_mode loss_agg_mode = rlhf::loss_agg_mode::token_mean;
  bool use_kl_loss = false;    ///< add kl_loss_coef x the aggregated KL to the reference (GRPO)
  double kl_loss_coef = 0.001;  ///< veRL's default
  rlhf::kl_estimator kl_loss_type = rlhf::kl_estimator::k3;  ///< veRL's low_var_kl
  /// Decoupled PPO (AReaL; rlhf::clipped_policy_loss with behav_logprobs): the experience's
  /// logprobs are the proximal policy's (recomputed just before the update) and its
  /// behav_logprobs the generator's; the asynchronous loop (max_staleness >= 1) sets it.
  bool decoupled = false;
  double behav_imp_weight_cap = 0;  ///< AReaL's name: 0 no cap, else > 1 (pg_math.h)
};

struct ppo_settings {
  int64_t per_device_training_batch_size = 4;  ///< rows per PPO mini-batch (all ranks together)
  int64_t ppo_epochs = 1;
  int64_t max_prompt_seq_len = 48;
  int64_t max_answer_seq_len = 32;
  bool enable_ema = false;      ///< keep an EMA of the actor
  float ema_beta = 0.992f;
  float unsup_coef = 27.8f;     ///< weight of the unsupervised (ptx) loss when ptx batches are given
  float temperature = 1.0f;     ///< sampling for rollouts (DS-Chat samples for OPT)
  int top_k = 0;
  float top_p = 1.0f;
  /// Drop answers of at most one token (DS-Chat). Off when a prompt's samples form a
  /// group (num_generations > 1): a group must stay whole.
  bool drop_short_answers = true;
  rlhf::ppo_config ppo;
  policy_loss_settings policy;  ///< the actor's loss beyond cliprange         ///< kl_ctl, clip_reward_value, cliprange, cliprange_value, gamma, lam
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
  /// (B, L) the behaviour log-probs: log p(seq[t+1]) under the weights that sampled it, recorded
  /// by the generator while sampling (the raw logits' log-softmax, as sequence_logprobs computes
  /// it), 0 off the answer
  tensor behav_logprobs;
  /// The temperature every log-prob of these rows is taken at (rlhf::gather_log_probs_forward,
  /// token_log_prob): the rollouts' sampling temperature, 1 for greedy rows (log_prob_temperature).
  /// The policy's and the reference's scores, the actor's loss and the behaviour log-probs all use
  /// it, as TRL, veRL and OpenRLHF divide the logits by it; DS-Chat samples at 1.
  float temperature = 1.0f;
  std::vector<int64_t> answer_len;  ///< real answer tokens per row (EOS included)
  /// Per row: the row of the prompts given to generate_rollouts it answers (rows may be dropped).
  std::vector<int64_t> source_rows;
  /// The token ids that ended an answer (generate_rollouts' stop_ids): rollout_row_ids leaves a final one
  /// out of the answer's text.
  std::vector<int32_t> stop_ids;
  int64_t start() const { return prompts.size(1) - 1; }
};

/// Generate answers for left-padded prompts with the actor's current weights (the
/// hybrid engine: no copy, no reload). Rows whose answer has at most one real
/// token are dropped, as DS-Chat drops them (unless s.drop_short_answers is off); returns
/// nullopt when all are dropped. Fills prompts, seq, attention_mask, answer_len, source_rows, temperature
/// (log_prob_temperature of the sampling) and behav_logprobs (each sampled token's log-prob under
/// the logits divided by that temperature, recorded while sampling; top-k/top-p shape the sampling,
/// not the log-prob, as sequence_logprobs at the same temperature gives it).
/// An answer ends at the first of `stop_ids` it samples (kept in it, as the EOS is: DS-Chat's generate
/// stops at every eos_token_id of the model's generation config, stop_ids_for's list: Llama 3's
/// <|eot_id|> and <|end_of_text|>, Qwen2's <|im_end|> and <|endoftext|>), or after max_answer_seq_len.
std::optional<experience> generate_rollouts(decoder& actor, const tensor& prompts, const tensor& prompt_mask,
                                            const ppo_settings& s, const std::vector<int32_t>& stop_ids,
                                            int32_t pad_id, uint64_t seed);

/// log p(seq[t+1] | seq[:t+1]) for t < S-1: (B, L), under the logits divided by `temperature`
/// (experience::temperature). The model keeps `acts` for a backward.
/// keep_from (every function below that takes it): only columns t >= keep_from are read by the
/// caller (experience::start(), the answer's); the forward then runs the last layer's MLP and the
/// head at those positions only (decoder::forward's keep_from), and the columns before it are not
/// to be read (0 where they were skipped). 0 computes every column.
/// A caller that scores often passes the same `acts` each time (forward reallocates them only on
/// a new shape); a trainer passes its engine's (zero_engine::activations), so that the update on
/// exactly these rows can reuse this forward (actor_batch_loss's `scored`).
tensor sequence_logprobs(decoder& model, activations& acts, const tensor& seq, const tensor& mask,
                         float temperature = 1.0f, int64_t keep_from = 0);
/// Values of a value-head model at t < S-1: (B, L). `acts` and keep_from as sequence_logprobs.
tensor sequence_values(decoder& model, activations& acts, const tensor& seq, const tensor& mask,
                       int64_t keep_from = 0);
/// Reward model scores: the value at each row's last real token (B,)
/// (reward_model.py forward_value's chosen_end_scores, found from the mask). `acts` as sequence_logprobs.
/// keep_from > 0: the forward keeps the positions from the earliest row's last token on (one position
/// when every answer has the same length); a row whose last token lies before keep_from makes it a
/// full forward.
tensor reward_scores(decoder& reward_model, activations& acts, const tensor& seq, const tensor& mask,
                     int64_t keep_from = 0);
/// Whether `acts` hold a forward of exactly these rows: the last decoder::forward into them read
/// these very `seq` and `mask` tensors (the same memory and shape; on the CPU forward keeps the
/// caller's handles) with this keep_from. Whether the weights are still the ones it ran with is the
/// caller's to know.
bool holds_forward_of(const activations& acts, const tensor& seq, const tensor& mask, int64_t keep_from = 0);

/// Rows [a, b) of an experience (views of its tensors, no copy).
experience slice_rows(const experience& e, int64_t a, int64_t b);

/// Row `b` of an experience as token ids, for decoding: the prompt (the real tokens, attention_mask
/// 1, of seq's first P = prompts.size(1) columns: the left padding left out) and the answer (the
/// real tokens after them, less a final one of e.stop_ids). Rule rewards score their text; the
/// generator's print_answers shows it.
struct row_ids {
  std::vector<int32_t> prompt, answer;
};
row_ids rollout_row_ids(const experience& e, int64_t b);

/// Experience maker: per-token rewards, zeroing after the ends, GAE.
/// advantages, returns (B, n). Returns the rewards (B, L) for reporting.
tensor make_advantages(const experience& e, const rlhf::ppo_config& cfg, tensor& advantages, tensor& returns);

/// The experience maker's advantage estimator (veRL's algorithm.adv_estimator names): DS-Chat's
/// GAE with a critic, or one of the critic-free ones.
enum class advantage_estimator { gae, grpo, rloo, reinforce_plus_plus };
/// "gae", "grpo", "rloo" or "reinforce_plus_plus"; throws std::invalid_argument naming the choices.
advantage_estimator parse_advantage_estimator(const std::string& s);
/// Whether `a` needs a value model (only GAE does).
inline bool needs_critic(advantage_estimator a) { return a == advantage_estimator::gae; }
/// The KL coefficient inside the reward (kl_ctl) when a graph does not write one, per estimator name:
/// 0.1 for gae (DS-Chat's ppo_trainer.py kl_ctl), 0 for grpo and rloo (veRL's algorithm.use_kl_in_reward
/// defaults to false; GRPO as published puts the KL in the loss), 0.001 for reinforce_plus_plus (veRL's
/// algorithm.kl_ctrl.kl_coef; REINFORCE++ keeps the KL in the per-token reward). An unknown name gets
/// gae's (the estimator's own check names it).
double default_kl_ctl(const std::string& estimator);

/// The critic-free estimators' settings (experience_maker's, veRL's and TRL's names).
struct critic_free_config {
  advantage_estimator estimator = advantage_estimator::grpo;
  int64_t num_generations = 8;  ///< a prompt's samples, adjacent rows (grpo, rloo)
  rlhf::reward_scaling scale_rewards = rlhf::reward_scaling::group;  ///< grpo
  double epsilon = 1e-4;  ///< grpo: added to the std (TRL)
  rlhf::ppo_config ppo;   ///< kl_ctl (the KL penalty inside the reward), clip_reward_value and gamma (REINFORCE++)
};

/// Critic-free advantages (B, n) f32 over the answer tokens of `e` (logprobs, ref_logprobs and
/// reward_score filled), 0 on padding:
///  - grpo, rloo: each row's sequence reward R = reward_score − kl_ctl · Σ_t (logprobs −
///    ref_logprobs) over its answer tokens (veRL's use_kl_in_reward summed as its outcome
///    estimators sum token_level_rewards; kl_ctl = 0: the score alone), then
///    rlhf::group_advantages (grpo) or rlhf::rloo_advantages (rloo) over groups of
///    num_generations adjacent rows, each row's advantage on every one of its answer tokens;
///  - reinforce_plus_plus: per-token rewards −kl_ctl · (logprobs − ref_logprobs) with the score,
///    clipped to ±clip_reward_value, added on the answer's last real token (veRL's
///    token_level_rewards), then rlhf::reinforce_pp_advantages with gamma.
/// ref_logprobs may be undefined (a graph without a reference model: veRL with neither
/// use_kl_in_reward nor use_kl_loss, as DAPO and Dr. GRPO): no KL term, which needs kl_ctl = 0.
/// Throws std::invalid_argument for gae, when B is not a multiple of num_generations (grpo, rloo),
/// or for kl_ctl > 0 without ref_logprobs.
tensor critic_free_advantages(const experience& e, const critic_free_config& c);

/// Rows `rows` of an experience, copied (DAPO's filter keeps the groups with signal).
experience take_rows(const experience& e, const std::vector<int64_t>& rows);

/// Micro-batch k of M over a mini-batch of B rows: rows [a, b), M = gradient_accumulation_steps
/// x ranks, each ceil(B / M) rows (the last ones shorter). A micro-batch past the rows is
/// `empty`: it runs row B - 1 with 0 units, so that its rank's collectives (stage 3 gathers,
/// reduce-scatters) match the other ranks' and it adds nothing to the gradient.
struct micro_slice {
  int64_t a = 0, b = 0;
  bool empty = false;
};
micro_slice micro_slice_of(int64_t B, int64_t M, int64_t k);

/// The actor's clipped policy loss (DS-Chat ppo_trainer.py actor_loss_fn; with `p`, veRL's
/// compute_policy_loss: dual clip, loss_agg_mode, and the KL loss term kl_loss_coef x
/// agg(kl_estimate(logprobs, ref_logprobs))) on the mini-batch `e` with per-token
/// `advantages` (B, n), for zero_engine::train_step: micro-batch k (of `micro_batches`, see
/// micro_slice_of) forwards its rows, its loss is aggregated over its answer tokens (units:
/// its answer tokens for token-mean, its rows with an answer token for the seq-mean modes),
/// dout the gradient through the log-softmax gather. So the step's loss is the aggregate over
/// the whole mini-batch at any rank count and accumulation, as DS-Chat's with one rank.
/// Refers to `e` and `advantages` (tensor handles are copied); the KL term needs
/// e.ref_logprobs. Throws std::runtime_error on non-finite log-probs.
/// `scored`: the caller scored micro-batch 0's rows into the engine's activations with the
/// weights this step starts from (ppo_trainer: the synchronous loop's first update after scoring
/// the batch), so micro-batch 0 takes that forward instead of running it again; it is the same
/// forward (same rows, weights and shapes), so the loss and gradients are those of running it.
/// Micro-batch 0 still runs its forward when the activations do not hold these rows
/// (holds_forward_of) or the model has LoRA dropout (a training forward draws new masks).
/// At ZeRO stage 3 a forward gathers blocks (collectives): every rank must then pass the same
/// `scored` and hold the same rows, or none pass it (ppo_trainer does not at stage 3).
batch_loss actor_batch_loss(const experience& e, const tensor& advantages, float cliprange,
                            const policy_loss_settings& p, int64_t micro_batches, bool scored = false);
/// The critic's clipped value loss (critic_loss_fn: 0.5 · masked mean of the larger squared
/// error) against `returns` (B, n); dout is dvalues (rows, S). As actor_batch_loss, `scored` too.
batch_loss critic_batch_loss(const experience& e, const tensor& returns, float cliprange_value,
                             int64_t micro_batches, bool scored = false);
/// The unsupervised (ptx) loss, DS-Chat train_unsupervised: unsup_coef x the causal-LM loss
/// on ids/labels (B, T) i32 (-100: ignored). The step's reported loss is the LM loss itself
/// (without the coefficient); the gradient carries unsup_coef. Units: valid labels.
batch_loss ptx_batch_loss(const tensor& ids, const tensor& labels, float unsup_coef, int64_t micro_batches);

/// One actor update through the engine on mini-batch `e` (DS-Chat train_rlhf, actor half):
/// train_step(actor_batch_loss(e, advantages, cliprange, s.policy, gas x ranks, scored), lr). The engine
/// clips and steps; every rank calls it with the same mini-batch (each runs its micro-batches).
step_result actor_update(zero_engine& engine, const experience& e, const tensor& advantages, const ppo_settings& s,
                         double lr, bool scored = false);
/// One critic update (train_rlhf, critic half): critic_batch_loss against the returns.
step_result critic_update(zero_engine& engine, const experience& e, const tensor& returns, const ppo_settings& s,
                          double lr, bool scored = false);
/// One ptx update (train_unsupervised, its own optimizer step): ptx_batch_loss.
step_result ptx_update(zero_engine& engine, const tensor& ids, const tensor& labels, const ppo_settings& s, double lr);

/// Asynchronous RLHF (the controller's max_staleness, docs/rlhf.md): of the experience items
/// sampled with policy versions `sampled_with`, the indices a trainer at version `version` (its
/// updates so far) trains on, in order: all of them, except with `drop` those staler than
/// max_staleness (version − v > max_staleness). `staleness` gets the largest version − v over all
/// items (0 when max_staleness is 0: the synchronous loop checks nothing).
std::vector<size_t> fresh_items(const std::vector<int64_t>& sampled_with, int64_t version, int64_t max_staleness,
                                bool drop, int64_t& staleness);

/// Mean per-token KL estimate sum((logprobs - ref_logprobs) · mask) / sum(mask) over the answer;
/// 0 without ref_logprobs (no reference model).
double mean_kl(const experience& e);

}  // namespace flowrun::ppo
