// What DeepSpeed-Chat's node kinds share (actors/dschat_trainers.cpp: steps 1-2,
// actors/ppo_nodes.cpp: step 3): loading and saving the model a node was given (every
// format load_model reads; saved in the format given: HF in, HF out), resuming a trainer
// that already saved its output, DS-Chat's settings, the data split, batch order (and its
// position, for checkpoints) and the trainers' engine (models/train/zero.h through
// dschat::engine_settings; its state for checkpoints).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "models/checkpoint.h"
#include "models/rlhf/dschat_data.h"
#include "models/rlhf/dschat_steps.h"
#include "models/tokenizer.h"
#include "models/train/ds_config.h"
#include "models/train/shard_checkpoint.h"
#include "runtime/actor/node.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actors {

using clk = std::chrono::steady_clock;
/// Seconds since `t`.
inline double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

std::shared_ptr<decoder> copy_model(const decoder& m);

/// Throws std::invalid_argument for a step-2 share whose `pairs` training pairs all have chosen equal
/// to rejected after tokenization (`ts`, `max_seq_len`): nothing to prefer (a reward model's loss stays
/// log 2 with a zero gradient; DPO's margin is 0). Names the node, the data and the fix for the truncation.
[[noreturn]] void throw_all_pairs_identical(const actor::node_context& ctx, int64_t pairs,
                                            const dschat::tokenize_settings& ts, int64_t max_seq_len);

/// Marks `out` as this node's finished output: the done marker under [graph] checkpoint_dir (a rerun
/// of the graph with the same settings takes the output instead of training) and, in a run with a
/// run id, the marker beside `out` (a restarted attempt does the same). `exact`, when given, is a
/// flowrun model folder holding the very tensors the node trained (LoRA unmerged: `out` holds them
/// merged, which reloads within rounding only); the rerun loads that instead of `out`.
void write_run_marker(const actor::node_context& ctx, const std::string& out, const std::string& exact = "");

/// The trainer's `output` loaded with `load`, when an earlier attempt of this
/// run saved it (and a line saying that training is skipped); else null.
std::shared_ptr<decoder> resume_saved(actor::node_context& ctx, const char* step);

/// A steps 1-2 trainer whose step is over removes its mid-run checkpoints, CHECKPOINT_DIR/NAME, unless that
/// folder holds a step-3 trainer's (ppo::checkpoint_owner: another graph's trainer of the same name on the
/// same checkpoint_dir), which is left, and a warning says so. Nothing without a checkpoint_dir or the folder.
void remove_step_checkpoints(actor::node_context& ctx);

/// The steps 1-2 trainers' settings that change nothing trained: printing, the checkpoint schedule,
/// the ZeRO stage, gradient checkpointing, the memory limit, the output path (compared apart) and
/// verify_output. A resume from a mid-run checkpoint may change them, and so may a rerun of a
/// finished step (its done marker leaves them out): docs/rlhf.md, "Steps 1-2 checkpoints".
const std::set<std::string>& trainer_safe_settings();

/// Before a steps 1-2 trainer that resume_saved could not take trains again, when it finished
/// before in this checkpoint_dir (its done marker): prints "STEP trains again, though it finished
/// in CHECKPOINT_DIR before: WHY", naming the settings that changed (but trainer_safe_settings),
/// the output path that moved, or the output that is gone (one changed on disk is warned about by
/// resume_saved). When settings changed and step 3 has committed a checkpoint there, throws
/// std::runtime_error naming them instead, since the new output would replace the model that
/// checkpoint continues from (step 3 refused it then, after steps 1-2 had trained and overwritten
/// their outputs); with the same settings the step trains again to the same weights, which the
/// policy compares. Nothing without a checkpoint_dir or a marker.
void check_retrain(actor::node_context& ctx, const char* step);

/// The graph check of the trainers (node_kind::check): their `output` (or another output
/// setting, e.g. the policy's ema_output) fits the format of the model they get (their `model`
/// setting, or for the policy what its init edge brings).
std::vector<graph::node_kind::problem> check_trainer_output(const graph::node_spec& n, const graph::graph_spec& g,
                                                            const char* setting = "output");

/// Refuses, before training, an `output` (or another output setting) that the model given as
/// `in` could not be written to.
void check_output(const actor::node_context& ctx, const model_file_info& in, bool value_head,
                  const char* setting = "output");

/// The node's `model`, inspected: what it is and where it resolves.
std::pair<std::string, model_file_info> given_model(const actor::node_context& ctx);

/// Learned positions (OPT, GPT-2) stop at the model's max_position_embeddings.
void check_seq_len(const actor::node_context& ctx, const model_config& c, int64_t T, const char* setting);

dschat::dschat_settings common_settings(const actor::node_context& ctx);

/// The node's `dtype` setting (DS-Chat's --dtype: fp32, bf16 or fp16), read when the node starts.
/// Throws std::invalid_argument naming the node, the value and the choices on anything else, so a
/// typo on a step-3 node is refused before steps 1 and 2 train.
std::string dtype_setting(const actor::node_context& ctx);
/// The same check of `dtype` when the graph is checked, before any node starts (a kind's check):
/// no problem, or one at the setting.
std::vector<graph::node_kind::problem> dtype_problems(const graph::node_spec& n);
/// The node's lr_scheduler_type when the graph is checked (a kind's check): a name that
/// transformers.get_scheduler (lr_schedule::transformers) does not take is one problem at the setting,
/// refused before any node starts, where it failed the node's start after the steps before it trained.
/// Also warns (no problem) when num_warmup_steps is written beside lr_scheduler_type "constant", whose
/// transformers schedule has no warmup: the warmup a DS-Chat user meant did nothing.
std::vector<graph::node_kind::problem> lr_scheduler_problems(const graph::node_spec& n);

/// A DS-Chat trainer's settings that failed only in the node's start, after the data was tokenized (and the
/// steps before it had trained), refused when the graph is checked: truncation other than end and
/// prompt_start; apply_chat_template with a tokenizer that has no chat template; only_optimize_lora with
/// `lora_dim_setting` 0 (nothing would train). Warns (no problem) when `lr_setting` is written beside
/// only_optimize_lora with LoRA on: only the LoRA weights train, at `lora_lr_setting`.
std::vector<graph::node_kind::problem> trainer_choice_problems(const graph::node_spec& n,
                                                               const std::string& lora_dim_setting,
                                                               const std::string& lr_setting,
                                                               const std::string& lora_lr_setting);

/// The hints an unknown setting named as HF Trainer, TRL or veRL name the learning-rate schedule gets
/// on every DS-Chat trainer kind (warmup_ratio, warmup_steps, lr_scheduler, lr_warmup_steps_ratio).
void add_schedule_hints(graph::node_kind& k);

/// The hints of DS-Chat's flags that have no setting here (the reason is a fact of flowrun's models and
/// engine): `dropout_flag` (--dropout, --actor_dropout, --critic_dropout: the models have no dropout
/// layers), --offload, --compute_fp32_loss (the losses are fp32 in every dtype) and, with `eot`,
/// --end_of_conversation_token / --add_eot_token (the tokenizer's EOS ends each answer). An empty
/// dropout_flag adds none of it.
void add_dschat_flag_hints(graph::node_kind& k, const std::string& dropout_flag, bool eot = true);

/// DS-Chat's --num_padding_at_beginning, for the nodes that score with a value head: flowrun reads
/// each row's score at its last real token by its length (rlhf::pairwise_loss), searching no pad id.
void add_padding_hint(graph::node_kind& k);

/// DS-Chat's hybrid-engine flags (--enable_hybrid_engine, --inference_tp_size, --tp_gather_partition_size,
/// --release_inference_cache, --unpin_actor_parameters), for the policy and the generator: the generator
/// always reads the policy's current weights.
void add_hybrid_engine_hints(graph::node_kind& k);

/// A DeepSpeed JSON with a scheduler section replaces lr_scheduler_type and num_warmup_steps (DeepSpeed
/// prefers a configured scheduler): a warning naming the ones written on the node, on rank 0.
void warn_scheduler_replaced(const actor::node_context& ctx, const ds_config& c);
/// The node's deepspeed_config, when set, loaded for `world` ranks when the graph is checked: a JSON that
/// does not load (a key DeepSpeed refuses, a misspelt params, a batch triple that contradicts itself) is one
/// problem at the setting, appended to `problems` and reported once, rather than by each replica's start().
/// Returns the config when it loads (nullopt when unset or refused), for checks that compare with it.
std::optional<ds_config> check_ds_config(const graph::node_spec& n, int world,
                                         std::vector<graph::node_kind::problem>& problems);
/// check_ds_config's problems alone.
std::vector<graph::node_kind::problem> ds_config_problems(const graph::node_spec& n, int world);

/// HF Trainer's "auto" values of a DeepSpeed JSON, filled from node n's own settings as
/// transformers' HfTrainerDeepSpeedConfig.trainer_config_process fills them from TrainingArguments:
/// train_micro_batch_size_per_gpu (per_device_train_batch_size; a PPO trainer's
/// per_device_training_batch_size / (world x accumulation) when it divides), gradient_accumulation_steps,
/// train_batch_size (their product with `world`); for a node with a learning rate of its own
/// (learning_rate; actor_ / critic_learning_rate for step 3) optimizer.params lr / betas [0.9, 0.95] /
/// eps 1e-8 (DS-Chat's AdamW) and gradient_clipping (the node's, else DS-Chat's 1.0);
/// optimizer.params.weight_decay (weight_decay), fp16.enabled / bf16.enabled (dtype), scheduler.params
/// warmup_min_lr 0 / warmup_max_lr (the lr) / warmup_num_steps (num_warmup_steps) / total_num_steps
/// (steps; for step 3's policy and critic max(2, num_warmup_steps) + 1, a placeholder their trainer
/// replaces with the run's updates once it knows them: ppo_trainer::plan_schedule). A key the node has no
/// setting for is left out: its "auto" stays an error naming it.
std::map<std::string, std::string> hf_auto_values(const graph::node_spec& n, int world);

/// The doc of a DS-Chat trainer's LoRA module setting (lora_module_name, actor_/critic_lora_module_name).
std::string lora_module_name_doc();

/// When n's `dim_setting` (lora_dim, actor_lora_dim, ...) is above 0: the problems of its
/// `module_setting`, found from its text before any model loads: a name make_lora_config refuses, or
/// a target naming one layer's module ("layers.0.self_attn.q_proj": PEFT would adapt that layer
/// only; flowrun adapts the module in every layer; decoder::enable_lora refuses it too, later).
std::vector<graph::node_kind::problem> lora_module_problems(const graph::node_spec& n, const std::string& dim_setting,
                                                           const std::string& module_setting);
/// DS-Chat's steps share one dataset: each holds out its eval rows first (DS-Chat's fixed "9,1" eval
/// split) and splits the rest by data_split, so the steps' shares are disjoint only when they hold out
/// the same fraction. A problem on n when an earlier node of the graph (sft_trainer, rm_trainer,
/// dpo_trainer, prompt_loader) reads the same data with the same data_split and seed but another
/// eval_fraction: their training rows come from other remainders and overlap (rlhf.graph's rm at 0.2
/// trained on 143 of sft's 416 rows, and 292 of PPO's 830 prompts were its pairs). Before that, n's own
/// data_split: not three non-negative weights with one above 0, or weight 0 for the step whose share n reads
/// (sft_trainer step 1, rm_trainer and dpo_trainer step 2, prompt_loader step 3), is the problem.
std::vector<graph::node_kind::problem> split_overlap_problems(const graph::node_spec& n, const graph::graph_spec& g);
/// Why the tokenizer at `tokenizer` cannot read token ids for the model at `model`, or "" when it can:
/// "the tokenizer T (N tokens), and the model M has R embedding rows: it is not the model's tokenizer", or
/// "the tokenizer T, and the model M has a tokenizer of its own in its folder: they differ (WHY)". Also ""
/// when either cannot be read (the node's start names that). DS-Chat, TRL and veRL take the model's own
/// tokenizer; one with more ids failed mid-run in embedding_forward, a foreign one trained on another
/// vocabulary without a word. For the kinds' graph checks (a trainer's model and tokenizer; the step-3
/// loop's tokenizers against the policy's model).
std::string tokenizer_model_mismatch(const std::string& tokenizer, const std::string& model);
/// A node's own `tokenizer` against its own `model` (tokenizer_model_mismatch), as a problem of the node.
std::vector<graph::node_kind::problem> tokenizer_model_problems(const graph::node_spec& n);
/// sft_trainer's and dpo_trainer's save_lora: its documentation, and the problem of a save_lora without
/// LoRA (lora_dim 0: there is no adapter to save).
std::string save_lora_doc();
std::vector<graph::node_kind::problem> save_lora_problems(const graph::node_spec& n);
/// DS-Chat's --dtype is one setting for the four models of step 3. Warns when the graph's policy,
/// critic, reference_model and reward_model nodes set different dtypes (a reference left in fp32
/// against a bf16 policy starts PPO from a KL of about 1e-3 instead of 0), naming each node's dtype
/// and the fix; silent when they agree. Called by the policy kind's graph check, so it is printed
/// before steps 1 and 2 train. A node's deepspeed_config decides its dtype, as at the run
/// (dschat::apply_ds_config: its bf16 / fp16 sections, else fp32); otherwise its dtype setting.
void warn_mixed_dtypes(const graph::graph_spec& g);
/// After a DeepSpeed JSON replaced the node's settings (dschat::apply_ds_config): warns, naming the
/// node, the setting and the JSON's key, for each setting the JSON replaced with another value that
/// was written (in the graph or with --set; not the kind's default, which the JSON replaces as it
/// does every setting): dtype (its bf16 / fp16 sections: a dtype = fp16 trained in bf16 without a
/// word), WHO zero_stage (a zero_stage = 1 ran at the JSON's stage 3), gradient_clipping,
/// gradient_accumulation_steps, per_device_train_batch_size (steps 1-2 and DPO), WHO learning_rate
/// and WHO weight_decay (the JSON's optimizer section). `own` and `json`: the settings before and
/// after; `who`: "" or step 3's "actor_" / "critic_".
void warn_json_overrides(const actor::node_context& ctx, const dschat::dschat_settings& own,
                         const dschat::dschat_settings& json, const std::string& json_where, const std::string& who);

/// The node's deepspeed_config (the setting's value `path`, resolved as a user path) for `world` ranks:
/// load_ds_config, then, when `speaks` (the group's rank 0), its report on the node's log: the keys
/// flowrun does not act on (info), a top-level key a letter or two from one it reads as a warning with
/// "did you mean" (a "train_batch_sizee" was ignored, and the batch triple resolved without it), and
/// the config's own warnings (DeepSpeed's: an unknown warmup_type, total_num_steps < warmup_num_steps).
/// Throws as load_ds_config.
ds_config load_node_ds_config(const actor::node_context& ctx, const std::string& path, int world, bool speaks);

dschat::step_rows load_step_rows(actor::node_context& ctx, int step_index, const dschat::dschat_settings& d);

// "end" cuts the end of prompt + answer (DS-Chat); "prompt_start" drops the oldest prompt
// tokens first, so the answers survive (HH-RLHF prompts are long in tok512's pieces).
dschat::truncation_mode truncation_of(const actor::node_context& ctx);

std::unique_ptr<tokenizer> load_tok(const actor::node_context& ctx);

/// The node's `apply_chat_template` setting (TRL's and OpenRLHF's name): null when false; when true,
/// the chat template of the Hugging Face folder its `tokenizer` names (tokenizer_config.json
/// "chat_template", or chat_template.jinja beside it; chat_formatter_for_tokenizer, which `flowrun
/// eval --apply_chat_template` calls too), for dschat::tokenize_settings::chat. Logs which
/// file. Throws std::invalid_argument naming the node, the file and the fix when `tokenizer` is not a
/// folder or the folder has no template, and chat_template_error (file, line, construct) when the
/// template does not parse.
std::shared_ptr<const chat_formatter> chat_template_setting(actor::node_context& ctx);

/// With a chat template (`ts.chat`), prints what the first training row of `rows` becomes
/// (dschat::rendered_row_line: "TAG chat template FILE: data row R of PATH renders as JSON-STRING", R
/// 0-based among the file's loaded rows; the prompt with add_generation_prompt = true when
/// `prompt_only`, else the prompt and its chosen answer), so that a run shows, and
/// tests/hf_chat_small.sh checks, the exact text trained on.
void print_chat_row(actor::node_context& ctx, const char* tag, const dschat::step_rows& rows,
                    const dschat::tokenize_settings& ts, bool prompt_only);

/// Saves `m` to the node's `output` (when set) as `f`, with `tokenizer` beside an HF
/// folder; with verify_output, reloads it and prints the largest output difference. A steps 1-2
/// trainer's folder output also gets flowrun_data.json: its held-out split and `dtype`, the
/// precision it trained and evaluated in (after a DeepSpeed JSON's), for flowrun eval's defaults.
void save_output(actor::node_context& ctx, const char* step, const decoder& m, model_format f,
                 const std::string& tokenizer, const std::string& source, const std::string& dtype = "fp32");

/// The settings a trainer kind names when its memory plan does not fit (what to lower or set).
struct plan_settings {
  std::string batch;          ///< e.g. "per_device_train_batch_size"
  std::string seq;            ///< e.g. "max_seq_len"
  std::string zero_stage;     ///< e.g. "zero_stage", "actor_zero_stage"
  std::string lora;           ///< e.g. "lora_dim" ("" when the kind has none)
  std::string checkpointing;  ///< e.g. "gradient_checkpointing"
};

/// The one memory planner of the trainers (zero_rank, sft_trainer, rm_trainer, policy, critic):
/// estimate_memory (models/train/zero.h) of `model` as it will train under `plan`, times the
/// `local_ranks` ranks this process hosts, against the node's memory_limit_gb setting (0 or absent:
/// 90% of the memory available now). Returns the estimate; when it does not fit, throws
/// std::runtime_error naming the node, the bytes by kind and the settings to change (`names`:
/// lower the batch or the sequence length; raise the ZeRO stage below 3, set LoRA or gradient
/// checkpointing when off).
memory_report check_memory_plan(const actor::node_context& ctx, const decoder& model, const memory_plan& plan,
                                int local_ranks, const plan_settings& names);

/// Batches of row indices, epoch after epoch, in dschat::epoch_batches' seeded order.
/// With full_only, a last partial batch of an epoch is skipped.
class batch_cycle {
 public:
  batch_cycle() = default;
  batch_cycle(int64_t rows, int64_t batch, uint64_t seed, bool full_only = false)
      : rows_(rows), batch_(batch), seed_(seed), full_only_(full_only) {}
  /// Rows per batch as next() gives them: the batch size, or all the rows where there are fewer.
  int64_t batch_rows() const { return std::min(rows_, batch_); }
  /// Refuse, before training, a plan whose rows cannot fill one batch (it would train
  /// nothing): std::invalid_argument naming the node and `batch_setting`.
  void check(const std::string& node, const std::string& batch_setting = "the batch size") const {
    if (rows_ < 1)  // lowering the batch cannot help: the split left this step nothing to train on
      throw std::invalid_argument("node '" + node +
                                  "': its share of the data has no training rows: give this step a larger "
                                  "data_split share, or lower eval_fraction (the held-out part of each share)");
    if (full_only_ && rows_ < batch_)
      throw std::invalid_argument("node '" + node + "': its share of the data has " + std::to_string(rows_) +
                                  " rows, too few for a batch of " + std::to_string(batch_) + ": lower " +
                                  batch_setting + " or give this step a larger data_split share");
  }
  /// The next batch. Throws std::invalid_argument (check) when the rows cannot fill one.
  std::vector<int64_t> next(const std::string& node) {
    check(node);
    while (queue_.empty()) fill();
    auto b = std::move(queue_.front());
    queue_.pop_front();
    return b;
  }

  /// Where the cycle stands: the next batch is the `index`-th (0-based) of epoch `epoch`'s
  /// batches (counting only full ones with full_only). At an epoch's end: {epoch + 1, 0}.
  struct position {
    int64_t epoch = 0, index = 0;
    bool operator==(const position&) const = default;
  };
  position where() const {
    if (queue_.empty()) return {epoch_, 0};
    return {epoch_ - 1, epoch_size_ - static_cast<int64_t>(queue_.size())};
  }
  /// Continue from `p` (a checkpoint's where()): the batches next() returns from then on are
  /// those a cycle that had reached `p` would return. Throws std::invalid_argument when `p`
  /// is not a position of this cycle (a negative epoch, an index past the epoch's batches).
  void set_where(position p) {
    queue_.clear();
    epoch_ = p.epoch;
    epoch_size_ = 0;
    if (p.epoch < 0 || p.index < 0)
      throw std::invalid_argument("batch_cycle: position (epoch " + std::to_string(p.epoch) + ", batch " +
                                  std::to_string(p.index) + ") is negative");
    if (p.index == 0) return;
    fill();
    if (p.index > epoch_size_)
      throw std::invalid_argument("batch_cycle: batch " + std::to_string(p.index) + " of epoch " +
                                  std::to_string(p.epoch) + " is past its " + std::to_string(epoch_size_) +
                                  " batches (the data or the batch size differ from the checkpoint's)");
    for (int64_t i = 0; i < p.index; ++i) queue_.pop_front();
  }

 private:
  void fill() {  // the next epoch's batches
    for (auto& b : dschat::epoch_batches(rows_, batch_, seed_, epoch_++))
      if (!full_only_ || static_cast<int64_t>(b.size()) == batch_) queue_.push_back(std::move(b));
    epoch_size_ = static_cast<int64_t>(queue_.size());
  }

  int64_t rows_ = 0, batch_ = 1;
  uint64_t seed_ = 0;
  bool full_only_ = false;
  int64_t epoch_ = 0;       // the next epoch to fill
  int64_t epoch_size_ = 0;  // batches of the epoch in queue_
  std::deque<std::vector<int64_t>> queue_;
};

/// A trainer's engine: ZeRO stage zero_stage, the DS-Chat settings' AdamW, clip, accumulation
/// and dtype (dschat::engine_settings), over the given communicator (step 3's rank group) or
/// an inproc group of one (steps 1-2).
struct trainer_engine {
  std::unique_ptr<comm::communicator> own_comm;
  std::unique_ptr<zero_engine> engine;
  lr_schedule schedule;

  void make(decoder& model, const dschat::dschat_settings& d, int64_t steps, comm::communicator* comm = nullptr) {
    if (!comm) {
      own_comm = comm::inproc_communicator(comm::make_inproc_group(1), 0);
      comm = own_comm.get();
    }
    engine = std::make_unique<zero_engine>(model, *comm, dschat::engine_settings(model, d));
    overflows_reported = 0;
    schedule = dschat::schedule_from(d, steps);
  }
  /// fp16 (a dynamic or static loss scale): on rank 0, prints "LABEL fp16 gradients overflowed: N
  /// update(s) skipped, loss scale now S" when updates were skipped since the last call (DeepSpeed's
  /// "OVERFLOW! Skipping step ... reducing to"), so a run whose updates are skipped says so on its
  /// log, not only in its grad_norm signal; nothing otherwise. No running total: the count is not
  /// checkpointed, and a resumed run's lines equal the uninterrupted run's.
  void report_overflows(actor::node_context& ctx, const std::string& label) {
    const auto& scaler = engine ? engine->settings().loss_scaler : nullptr;
    if (!scaler || scaler->overflows() == overflows_reported) return;
    const int64_t n = scaler->overflows() - overflows_reported;
    overflows_reported = scaler->overflows();
    if (engine->rank() == 0)
      ctx.print(fmt::format("{} fp16 gradients overflowed: {} update{} skipped, loss scale now {:.10g}", label, n,
                            n == 1 ? "" : "s", scaler->scale()));
  }
  int64_t overflows_reported = 0;
  /// The learning rate to print for an update at `lr`: with only_optimize_lora (only the LoRA tensors
  /// train) the LoRA group's, lr x lora_learning_rate / learning_rate (zero_settings::adapter_lr), with
  /// " (LoRA)" after it; else lr. It printed the frozen base's rate, which trained nothing.
  static std::string shown_lr(const dschat::dschat_settings& d, double lr) {
    if (d.only_optimize_lora && d.lora_dim > 0 && d.learning_rate > 0)
      return fmt::format("{:.2e} (LoRA)", lr * d.lora_learning_rate / d.learning_rate);
    return fmt::format("{:.2e}", lr);
  }
  /// The lr of the next update (transformers.get_scheduler over `steps` updates).
  double next_lr(const dschat::dschat_settings& d) const {
    return schedule.lr_at(engine->step_count(), d.learning_rate);
  }
  /// Training is over: the model whole again (for eval, save and the next step), the engine gone.
  void finish() {
    if (!engine) return;
    engine->release_model();
    engine.reset();
    own_comm.reset();
  }
};

}  // namespace flowrun::actors
