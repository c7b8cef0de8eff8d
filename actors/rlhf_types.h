// Layer 6: the message types of DeepSpeed-Chat's three steps as graph nodes
// (actors/dschat_trainers.cpp, actors/ppo_nodes.cpp). All are in-process payloads shared by handle.
//
//   message type   | C++ value
//   "model"        | model_msg: a live decoder (shared, not copied) and its version
//   "prompt_batch" | prompt_msg: left-padded prompts (B, P) + mask, iteration, eval flag
//   "rollouts"     | rollout_msg: prompts + answers (ppo::experience with seq/mask filled)
//   "scores"       | score_msg: one per-token or per-row tensor computed on a rollout
//   "experience"   | experience_msg: the full experience with advantages and returns
//   "stats"        | stats_msg: what a training node did in one PPO iteration
//   "summary"      | summary_msg: rewards and KL of one batch (from the experience maker)
//   "tick"         | int64_t: the controller asks the prompt loader for the next batch
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/checkpoint.h"
#include "models/decoder.h"
#include "models/rlhf/ppo.h"

namespace flowrun::actors {

struct model_msg {
  std::shared_ptr<decoder> model;  ///< the owner's live model (readers must not run while it trains), or a snapshot
  int64_t version = 0;             ///< bumped by the owner after each update
  /// The format the model was given in (models/checkpoint.h): a trainer that
  /// starts from it saves in this format (saved_format).
  model_format format = model_format::llama2c;
  /// The tokenizer that goes with the model (what load_tokenizer takes; empty:
  /// unknown): copied next to a model saved as a Hugging Face folder.
  std::string tokenizer;
  /// `model` is a private copy the owner never writes while anyone else holds it (the policy's
  /// double-buffered snapshot for max_staleness >= 1, a ZeRO-3 gather, or a copy from another
  /// process): safe to read while the owner trains. false: the owner's live model.
  bool snapshot = false;
  /// The Hugging Face folder the model came from (empty: none): a trainer that starts from it keeps
  /// its stop ids beside its HF output (save_model's `source`: the eos_token_id list, generation_config.json).
  std::string source;
};

struct prompt_msg {
  tensor ids, mask;        ///< (B, P) i32, left-padded
  int64_t iteration = 0;   ///< PPO iteration (eval batches: -1 before training, -2 after)
  bool eval = false;       ///< held-out prompts: scored, never trained on
  /// The loader's last batch: asked for another, it ends its stream. With max_staleness >= 1
  /// the controller asks for the next batch only once nothing is in flight after it, so the end
  /// of the stream never overtakes batches still being trained (the held-out batch after
  /// training is the last one; with eval_prompts = 0 the last training batch is).
  bool last = false;
  /// The longest prompt of the loader's data, training and held-out rows (tokens, after
  /// max_prompt_seq_len): the generator checks it with max_answer_seq_len against the policy's
  /// context at the first batch, before any update, not when that prompt comes.
  int64_t longest_prompt = 0;
  /// The run's training iterations (the loader's `iterations`): with the rows of a batch, what the
  /// policy and critic plan their learning-rate schedules over (DS-Chat's num_total_iters).
  int64_t iterations = 0;
  /// The policy version (updates so far) to generate with: the controller
  /// stamps it, the generator waits until it holds weights of that version.
  int64_t policy_version = 0;
  /// Step-3 checkpoints: the trainers save after training on this batch's experience and
  /// the controller commits the iteration (docs/rlhf.md, models/rlhf/ppo_checkpoint.h).
  bool checkpoint = false;
  /// The controller's max_staleness (0: the synchronous loop) and staleness_policy ("drop":
  /// drop_stale), carried to the generator and, through the rollouts and the experience, to
  /// the trainers (docs/rlhf.md "Asynchronous RLHF").
  int64_t max_staleness = 0;
  bool drop_stale = false;
  /// Per row: the data's reference answer (the row's `chosen`), for rule rewards
  /// (reward_function); empty when the loader has none.
  std::vector<std::string> references;
  /// A drain's save (ppo_controller::awaits_feedback): nothing to generate. The generator passes it
  /// on as rollouts without rows (rollout_msg::save_only), the experience maker as an empty,
  /// stamped experience batch, and the policy and critic save after iteration `iteration`, the last
  /// they trained, without training, and report; the controller then commits that iteration.
  bool save_only = false;
};

struct rollout_msg {
  std::shared_ptr<const ppo::experience> exp;  ///< prompts, seq, attention_mask, answer_len; null if all dropped
  int64_t iteration = 0;
  bool eval = false;
  double generate_seconds = 0;
  int64_t generated_tokens = 0;
  /// Names this batch among all the generators' batches (emitted * replicas + replica):
  /// the experience maker joins the four scores of a batch by it, also when the
  /// scores come from other processes (each with its own copy of the rollouts).
  int64_t batch = 0;
  bool checkpoint = false;  ///< the prompt batch's
  /// Rows per prompt (the generator's num_generations; 1 for held-out batches): rows
  /// g·group_size .. (g+1)·group_size − 1 answer the same prompt.
  int64_t group_size = 1;
  /// The run's training iterations (prompt_msg::iterations) and the rows generated for this
  /// batch before any drop (its prompts x group_size): the trainers' schedule length.
  int64_t iterations = 0, generated_rows = 0;
  /// Per generated row before any drop (exp->source_rows indexes it): the reference answer.
  std::vector<std::string> references;
  int64_t policy_version = 0;  ///< the version of the weights the rows were sampled with
  double weights_wait_seconds = 0;  ///< how long the batch waited for weights of its stamped version
  int64_t max_staleness = 0;   ///< the prompt batch's (prompt_msg)
  bool drop_stale = false;     ///< the prompt batch's
  bool save_only = false;      ///< the prompt batch's (prompt_msg::save_only): no rows, a save
};

struct score_msg {
  std::shared_ptr<const rollout_msg> rollouts;
  tensor value;  ///< logprobs / ref_logprobs / values (B, L) or reward scores (B,)
};

struct experience_msg {
  std::shared_ptr<const ppo::experience> exp;
  tensor advantages, returns;  ///< (B, n)
  int64_t iteration = 0;
  int64_t policy_version = 0;  ///< the version of the weights its rows were sampled with
};

/// What the trainers train on: the experiences of `generation_batches` generation
/// batches (DS-Chat's exp_dataset, trained on once it is full).
struct experience_batch {
  std::vector<experience_msg> items;
  int64_t iteration = 0;  ///< the last batch's iteration
  bool checkpoint = false;  ///< save after training on it (a batch of it was stamped so)
  /// The controller's max_staleness and staleness_policy (prompt_msg): with max_staleness >= 1
  /// the trainers check each item's staleness (their version - its policy_version) and, with
  /// drop_stale, leave out the items staler than max_staleness; the policy trains with the
  /// decoupled loss (the generator's behaviour log-probs) and publishes weight snapshots.
  int64_t max_staleness = 0;
  bool drop_stale = false;
};

struct stats_msg {
  int64_t iteration = 0;
  double loss = 0, grad_norm = 0, seconds = 0;
  double unsup_loss = 0;  ///< the ptx LM loss of the last update (0: no ptx)
  double lr = 0;          ///< the learning rate of the last update (its schedule's; ptx's too)
  bool scheduled = false; ///< the learning rate follows a schedule (not constant): printed with the loss
  int64_t tokens = 0;  ///< tokens trained on (for tokens/s)
  /// The hybrid engine at ZeRO stage 3: bytes this rank sent gathering the policy's blocks for
  /// the generator after the update (0 below stage 3: rank 0 holds every weight).
  int64_t gather_bytes = 0;
  /// ... and what a ring all-gather of the padded f32 blocks sends: (N - 1) · Σ_b ceil(n_b / N) · 4.
  int64_t gather_theory_bytes = 0;
  /// max_staleness >= 1: whether the trainer updated (false: every item was staler than
  /// max_staleness and dropped), the items dropped so, the largest staleness trained on
  /// (its version at train time - the item's policy_version), its version after the update,
  /// and the bytes it copied into the generator's weight snapshot.
  bool updated = true;
  int64_t stale_dropped = 0, staleness = 0, policy_version = 0, snapshot_bytes = 0;
};

struct summary_msg {
  int64_t iteration = 0;
  bool eval = false;
  bool dropped = false;  ///< every answer was too short: nothing to train on
  bool trains = false;   ///< this batch completed an experience batch: the trainers will report
  /// The run's last iteration trained nothing (dropped, or kept for generation_batches > 1) and a
  /// checkpoint was due: the trainers save without training and report (stats_msg::updated false),
  /// and the controller commits after it, as after the last iteration of any run
  bool saves = false;
  bool with_critic = true;  ///< the estimator is GAE: the critic trains and reports too
  double reward_mean = 0, kl_mean = 0, answer_len_mean = 0;
  double reward_stderr = 0;  ///< the standard error of reward_mean: sample std / sqrt(rows)
  int64_t groups = 0, groups_kept = 0;  ///< DAPO's filter (filter_groups): groups seen, groups trained on
  double generate_seconds = 0;
  int64_t generated_tokens = 0;
  int64_t rows = 0;
  int64_t policy_version = 0;       ///< the version of the weights the batch was sampled with
  double weights_wait_seconds = 0;  ///< how long the generator waited for that version
};

}  // namespace flowrun::actors
