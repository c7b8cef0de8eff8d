// The skeleton of DeepSpeed-Chat's trainer node kinds (steps 1-2 in
// actors/dschat_trainers.cpp, the DPO step in actors/dpo_trainer.cpp): the settings they
// share and the base class that loads, trains through the engine, checkpoints, evaluates
// before and after, and saves. A step supplies its data, its update and its evaluation.
#pragma once

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/dschat_common.h"
#include "actors/node_models.h"
#include "actors/rank_group.h"
#include "actors/register.h"
#include "actors/resume_check.h"
#include "actors/rlhf_types.h"
#include "models/adapter.h"
#include "models/train/engine_checkpoint.h"
#include "models/train/shard_checkpoint.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

/// The settings the DS-Chat trainers share (DS-Chat step1/step2 main.py arguments): model,
/// tokenizer, data and its split, the batch, AdamW and its schedule, the engine (zero_stage,
/// dtype, deepspeed_config, LoRA, gradient checkpointing), steps, printing, the memory limit
/// and mid-run checkpoints. `lr` and `steps` are the kind's defaults.
void add_trainer_settings(graph::node_kind& k, double lr, int64_t steps);

// ---------------------------------------------------------------- the trainers' skeleton

/// What steps 1 and 2 share (DS-Chat's step1/step2 main.py): a source whose start() loads the
/// model it was given (or the output an earlier run saved: then it only emits that), whose
/// produce() is one optimizer update through the engine per call, and which at the end
/// evaluates, saves `output` in the format it was given and emits the model on `model`.
/// A step supplies its data, its update and its evaluation.
class dschat_trainer : public actor::node {
 public:
  dschat_trainer(const char* tag, bool value_head) : tag_(tag), value_head_(value_head) {}

  void start(actor::node_context& ctx) final {
    if (process_count() > 1)  // flowrun launch runs the graph in every process: P copies on the same files
      throw std::invalid_argument(fmt::format(
          "node '{}' runs as one replica, and flowrun launch --nproc {} runs the graph in every process: its copies "
          "would each train on every row and write the same output and checkpoint files; run it without launch "
          "(launch is for zero_rank's ranks; step 3's policy and critic ranks go over processes as a cluster: "
          "docs/rlhf.md \"Across processes\")",
          ctx.name(), process_count()));
    const auto [model_path, given] = given_model(ctx);
    format_ = saved_format(given.format, value_head_);
    check_output(ctx, given, value_head_);
    tokenizer_ = resolve_user_path(ctx.spec().get_string("tokenizer"), "tokenizer").string();
    if (given.format == model_format::hf) source_ = model_path;  // its stop ids go with the output
    if ((model_ = resume_saved(ctx, tag_))) {
      resumed_ = true;
      return;
    }
    check_retrain(ctx, tag_);  // before anything trains or is overwritten
    d_ = common_settings(ctx);
    steps_ = ctx.spec().get_int("steps");
    if (steps_ < 1) throw std::invalid_argument("node '" + ctx.name() + "': steps must be >= 1");
    tok_ = load_tok(ctx);
    prepare_data(ctx);
    model_ = std::make_shared<decoder>(load_node_model(ctx, model_path));
    if (value_head_ && !model_->has_value_head()) model_->add_value_head(ctx.seed());
    if (!value_head_ && model_->has_value_head())  // its loss would fail at the first step, after the held-out pass
      throw std::invalid_argument("node '" + ctx.name() + "': " + ctx.spec().get_string("model") +
                                  " has a value head (a reward model), and " + phase_name() +
                                  " trains a language model: give a language model (the base model, or "
                                  "sft_trainer's output)");
    // DeepSpeed converts the module to bf16 / fp16 before it makes the fp32 master from it: the
    // master starts from the rounded weights, and so do DPO's reference (model_loaded copies it)
    // and the held-out pass before training, whose products run in the step's precision too
    // (DS-Chat evaluates its bf16 engine in bf16). The value head stays fp32, as the engine keeps it.
    const zero_settings zs = dschat::engine_settings(*model_, d_);
    if (zs.precision != dtype::f32) round_through(model_->w().flat, zs.precision);
    if (zs.precision == dtype::bf16 && zs.bf16_matmul) held_out_precision_ = ops::matmul_precision::bf16;
    model_loaded(ctx);
    check_seq_len(ctx, model_->config(), d_.max_seq_len, "max_seq_len");
    dschat::apply_lora(*model_, d_);
    model_->set_gradient_checkpointing(d_.gradient_checkpointing);
    // the memory plan, before the engine's state or any activation exists: one rank; the RM's
    // micro-batch holds chosen and rejected rows, its loss gives dvalues
    memory_plan plan;
    // the rows a batch holds: fewer than per_device_train_batch_size where the share has fewer (a batch of
    // 100,000 on 14 pairs was refused for 848 GB)
    plan.micro_batch = (value_head_ ? 2 : 1) * std::max<int64_t>(1, order().batch_rows());
    if (order().batch_rows() < d_.per_device_train_batch_size)
      ctx.log().warn("per_device_train_batch_size = {} but this step's share has {} training rows: every batch holds "
                     "all of them",
                     d_.per_device_train_batch_size, order().batch_rows());
    plan.seq_len = d_.max_seq_len;
    plan.stage = d_.zero_stage;
    plan.precision = zs.precision;
    plan.dout = value_head_ ? memory_plan::loss_grad::dvalues : memory_plan::loss_grad::model_cross_entropy;
    plan_memory(plan);
    const memory_report est = check_memory_plan(
        ctx, *model_, plan, 1, {"per_device_train_batch_size", "max_seq_len", "zero_stage", "lora_dim", "gradient_checkpointing"});
    ctx.log().info("memory plan: {}", est.str());
    ckpt_dir_ = ctx.checkpoint_dir().empty() ? "" : (std::filesystem::path(ctx.checkpoint_dir()) / ctx.name()).string();
    save_every_ = ctx.spec().get_int("save_checkpoint_steps");
    if (save_every_ > 0 && ckpt_dir_.empty())
      ctx.log().warn("save_checkpoint_steps = {} but the graph has no [graph] checkpoint_dir: no checkpoints",
                     save_every_);
    const std::string from = resume_point(ctx);
    const std::string before = from.empty() ? held_out_pass(ctx, true, 0) : "";
    engine_.make(*model_, d_, steps_);
    const lr_schedule& sc = engine_.schedule;
    if (const std::string past = sc.past_end(steps_, d_.learning_rate); !past.empty())
      ctx.log().warn("{} updates but {}, as in DeepSpeed; set scheduler.params.total_num_steps to {} in {}", steps_,
                     past, steps_, ctx.spec().get_string("deepspeed_config"));
    else if (const std::string warm = sc.all_warmup(steps_, d_.learning_rate); !warm.empty())
      ctx.log().warn("{} of learning_rate; lower num_warmup_steps", warm);
    if (from.empty()) ctx.print(before);
    else restore(ctx, from);
    t0_ = clk::now();
  }

  bool produce(actor::node_context& ctx) final {
    if (done_) return false;
    if (!resumed_ && step_ < steps_) {  // one update: gradient_accumulation_steps micro-batches
      ctx.phase(phase_name());  // the console's and status header's phase (said once: node_context dedups)
      update(ctx, ++step_);
      ctx.metric("steps");
      ctx.progress(phase_name(), step_, steps_);
      if (!ckpt_dir_.empty() && save_every_ > 0 && step_ % save_every_ == 0 && step_ < steps_) save(ctx);
      return true;
    }
    // only the LoRA weights, as PEFT saves them (TRL's save_model of a peft model), beside the merged output;
    // an HF source is the adapter's base_model_name_or_path
    const std::string lora_dir = ctx.spec().find_setting("save_lora") ? ctx.spec().get_string("save_lora") : "";
    if (!resumed_) {
      engine_.finish();
      ctx.print(held_out_pass(ctx, false, since(t0_)));
      const std::string& out = ctx.spec().get_string("output");
      if (!out.empty()) save_output(ctx, tag_, *model_, format_, tokenizer_, source_, d_.dtype);
      if (!lora_dir.empty()) {
        save_adapter(*model_, lora_dir, source_);
        ctx.print(fmt::format("{} LoRA adapter (only the LoRA weights, PEFT format) -> {}", tag_, lora_dir));
      }
      // the done marker once every output is on disk: written before the adapter, a save_lora that failed
      // (a full disk) was never written by the rerun, which skipped training and exited 0
      if (!out.empty()) {
        // llama2.c and HF files hold the merged weights: bit-exact on reload only without LoRA;
        // a flowrun folder keeps every tensor in f32, LoRA and v_head included
        if (!model_->has_lora() || format_ == model_format::flowrun) {
          write_run_marker(ctx, out);
        } else if (!ctx.checkpoint_dir().empty()) {  // the trained tensors, LoRA unmerged, for a rerun
          const std::string exact = (std::filesystem::path(ctx.checkpoint_dir()) / (ctx.name() + ".final")).string();
          save_model(*model_, exact, model_format::flowrun, "");
          write_run_marker(ctx, out, exact);
        }
      }
    } else if (!lora_dir.empty() && model_->has_lora() &&
               !std::filesystem::exists(std::filesystem::path(lora_dir) / "adapter_model.safetensors")) {
      // an adapter removed since the run (only the merged output and the marker are checked): written again
      // from the trained tensors the rerun loaded (the exact copy keeps LoRA unmerged); it was never written
      save_adapter(*model_, lora_dir, source_);
      ctx.print(fmt::format("{} LoRA adapter (only the LoRA weights, PEFT format) -> {} (it was missing: written "
                            "from the trained weights)",
                            tag_, lora_dir));
    }
    // the step is over (its outputs and done marker, when it has them, are on disk): its mid-run checkpoints are
    // of no more use, nor those a run stopped before their removal left
    remove_step_checkpoints(ctx);
    model_msg msg{model_, 0, format_, tokenizer_, /*snapshot=*/false, source_};
    ctx.emit("model", actor::payload::make("model", std::move(msg)));
    done_ = true;
    return false;
  }

  // A drain (the first SIGINT or SIGTERM, the console's stop) ends the step between two updates: the updates since
  // the last commit are committed here, so that the same command resumes after the last one trained. Before, a
  // preempted job's SIGTERM (a scheduler's, ahead of its SIGKILL) lost every update since save_checkpoint_steps'
  // last, as DeepSpeed's does. After the last update (the held-out pass and the output not yet made) the commit
  // is of it, and the resume makes them. Needs a [graph] checkpoint_dir (save_checkpoint_steps may be 0); a
  // second signal stops without a drain or this call, and keeps the last commit.
  void finish(actor::node_context& ctx) final {
    if (!ctx.draining() || done_ || resumed_ || ckpt_dir_.empty() || step_ < 1 || step_ > steps_ ||
        step_ == committed_)
      return;
    ctx.print(fmt::format("{} stopping at update {} of {}: committing it", tag_, step_, steps_));
    save(ctx);
  }

  void stop(actor::node_context& ctx) final {
    if (ctx.reason() != actor::stop_reason::interrupted || done_ || resumed_) return;  // SIGINT: say what is kept
    std::string last;
    try {
      last = ckpt_dir_.empty() || !std::filesystem::exists(ckpt_dir_) ? "" : latest_checkpoint(ckpt_dir_);
    } catch (const std::exception&) {  // a damaged `latest`: the next start names it
    }
    if (ckpt_dir_.empty())
      ctx.print(fmt::format("{} interrupted at update {} of {}: no checkpoint was saved (set [graph] checkpoint_dir: a "
                            "drain then commits the update it stopped at, and save_checkpoint_steps adds scheduled "
                            "ones); the same command trains this step again",
                            tag_, step_, steps_));
    else if (last.empty() && step_ == 0)  // at start or in the held-out pass before training
      ctx.print(fmt::format("{} interrupted before its first update: the same command trains this step", tag_));
    else if (last.empty())  // no commit at the stop (a second signal)
      ctx.print(fmt::format("{} interrupted at update {} of {}, before its first checkpoint in {} (nothing committed "
                            "at the stop: a second signal stops without the drain's commit): the same command trains "
                            "this step again",
                            tag_, step_, steps_, ckpt_dir_));
    else
      ctx.print(fmt::format("{} interrupted at update {} of {}: the last committed checkpoint is {}; the same "
                            "command resumes there",
                            tag_, step_, steps_, last));
  }

 protected:
  /// The step's phase for node_context::progress: "step 1 sft" from the tag "[step 1 sft]".
  std::string phase_name() const { return std::string(tag_ + 1, std::strlen(tag_) - 2); }
  /// evaluate() as a phase of its own on the progress line and the console, per held-out batch
  /// ("step 1 sft held-out 3/12 ETA 0:04" while it runs, "12/12 done" after; the pass after
  /// training starts the count again, so its ETA is its own). No held-out batch: no phase.
  std::string held_out_pass(actor::node_context& ctx, bool before, double seconds) {
    if (!has_held_out())  // a loss or accuracy over no example would print as 0
      return fmt::format("{} no held-out example {}: this step's share of the data left none at eval_fraction = {}; "
                         "give more rows or raise eval_fraction",
                         tag_, before ? "before training" : "after training", ctx.spec().get_float("eval_fraction"));
    const std::string what = phase_name() + " held-out";
    ctx.phase(what);
    ops::matmul_precision_scope gemm(held_out_precision_ ? *held_out_precision_ : ops::get_matmul_precision());
    return evaluate(ctx, before, seconds, [this, &ctx, &what, before](int64_t done, int64_t total) {
      if (ctx.stop_requested()) throw actor::stopped{};  // a second Ctrl-C: the pass may take minutes
      // a drain before training (a preemption's SIGTERM) has nothing to keep: it waited for the whole pass, and the
      // scheduler's SIGKILL could come first. The pass after training goes on: the step's output follows it
      if (before && ctx.draining()) {
        ctx.print(fmt::format("{} interrupted in the held-out pass before training: nothing was trained; the same "
                              "command trains this step",
                              tag_));
        throw actor::stopped{};
      }
      if (total > 0) ctx.progress(what, done, total);
    });
  }

  /// Tokenize this step's share of the data (load_step_rows) into train and eval batches.
  virtual void prepare_data(actor::node_context& ctx) = 0;
  /// One optimizer update (the `step`-th, 1-based) through engine_; prints every print_every.
  virtual void update(actor::node_context& ctx, int64_t step) = 0;
  /// The held-out figures before (`before`) or after training (`seconds` after the start), as
  /// the line to print; `progress` goes to the step's eval helper (dschat::sft_eval, rm_eval,
  /// dpo_eval), which reports each batch done.
  virtual std::string evaluate(actor::node_context& ctx, bool before, double seconds,
                               const dschat::batch_progress_fn& progress) = 0;
  /// Whether prepare_data() left at least one held-out batch for evaluate().
  virtual bool has_held_out() const = 0;

  /// The model as loaded (a value head added when the step has one), before LoRA and the
  /// engine: e.g. the DPO step's frozen reference is a copy of it. Default: nothing.
  virtual void model_loaded(actor::node_context&) {}
  /// The step's memory plan, after the defaults above (one row per example, the model's
  /// cross-entropy, or two rows and dvalues with a value head). Default: unchanged.
  virtual void plan_memory(memory_plan&) const {}

  /// What a step keeps beyond the engine and the data order, for its checkpoints: the
  /// held-out figures before training (the final line compares with them) and any running
  /// averages of its prints.
  virtual nlohmann::json state() const = 0;
  virtual void set_state(const nlohmann::json& j) = 0;
  /// The step's batch order (its position is saved and restored).
  virtual batch_cycle& order() = 0;

  bool prints(const actor::node_context& ctx, int64_t step) const {
    return step % ctx.spec().get_int("print_every") == 0 || step == steps_;
  }

  const char* tag_;
  bool value_head_;
  dschat::dschat_settings d_;
  int64_t steps_ = 0;
  std::unique_ptr<tokenizer> tok_;
  std::shared_ptr<decoder> model_;
  trainer_engine engine_;

 private:
  // ---- mid-run checkpoints (issue 17): CHECKPOINT_DIR/NAME/step_K in the format of steps 3
  // and pretraining (models/train/shard_checkpoint.h): the engine's state (fp32 masters, AdamW
  // moments, optimizer steps = the LR schedule's position, the fp16 loss scaler), the data
  // position (epoch, batch index of the seeded order), the dropout RNG and state().

  // Settings a resume may change: what is printed or saved, how the one rank shards, memory.
  static const std::set<std::string>& safe_to_change() { return trainer_safe_settings(); }

  std::string config_hash() const { return trainer_config_hash(*model_); }

  void save(actor::node_context& ctx) {
    shard_manifest m;
    m.step = step_;
    m.config_hash = config_hash();
    const auto pos = order().where();
    m.data_epoch = pos.epoch;
    m.data_cursor = pos.index;
    const uint64_t rng = model_->rng_state();
    m.rng_state.resize(sizeof rng);
    std::memcpy(m.rng_state.data(), &rng, sizeof rng);
    m.extra["settings"] = settings_record(ctx.spec(), safe_to_change());
    m.extra["state"] = state();
    const auto groups = engine_state_groups(*engine_.engine, *model_, 0, m);
    save_shard(ckpt_dir_, m, groups);
    commit_checkpoint(ckpt_dir_, step_, 1, static_cast<int>(ctx.spec().get_int("keep_checkpoints")));
    committed_ = step_;
    ctx.print(fmt::format("{} checkpoint at update {} -> {}", tag_, step_,
                          (std::filesystem::path(ckpt_dir_) / step_folder_name(step_)).string()));
  }

  /// The newest committed step folder of ckpt_dir_ that verifies (the one `latest` names, else
  /// the older ones, each refusal printed), or "" when nothing is committed.
  std::string resume_point(actor::node_context& ctx) {
    if (ckpt_dir_.empty() || !std::filesystem::exists(ckpt_dir_)) return "";
    std::string note;  // `latest` missing or naming a folder that is gone: which folder was taken
    const std::string latest = latest_checkpoint(ckpt_dir_, &note);
    if (latest.empty()) return "";
    if (!note.empty()) ctx.print(fmt::format("{} {}", tag_, note));
    std::vector<std::string> folders;  // newest first, from the committed one down
    for (const auto& e : std::filesystem::directory_iterator(ckpt_dir_)) {
      const auto n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step_", 0) == 0 && n <= std::filesystem::path(latest).filename().string())
        folders.push_back(e.path().string());
    }
    std::sort(folders.rbegin(), folders.rend());
    std::vector<std::string> refused;
    for (const auto& f : folders) {
      try {
        verify_checkpoint(f);
        return f;
      } catch (const checkpoint_error& e) {
        ctx.print(fmt::format("{} checkpoint refused: {}", tag_, e.what()));
        refused.push_back(e.what());
      }
    }
    throw std::runtime_error(fmt::format("node '{}': no checkpoint in {} can be used ({}); delete {} to train this "
                                         "step afresh",
                                         ctx.name(), ckpt_dir_, fmt::join(refused, "; "), ckpt_dir_));
  }

  void restore(actor::node_context& ctx, const std::string& folder) {
    const auto ck = load_checkpoint(folder);
    const auto& m0 = ck.manifests.at(0);
    const std::string afresh = "delete " + ckpt_dir_ + " to train this step afresh";
    if (m0.config_hash != config_hash())
      throw std::runtime_error("node '" + ctx.name() + "': checkpoint " + folder +
                               " was made for another model, LoRA or value-head setting (config hash differs): " +
                               afresh);
    check_resume_settings(ctx, m0.extra.value("settings", nlohmann::json()), folder, safe_to_change(), afresh);
    if (m0.step < 1 || m0.step > steps_)  // the last update's own: a drain's commit before the step's end
      throw std::runtime_error(fmt::format("node '{}': checkpoint {} is of update {}, not within this run's {} "
                                           "updates: {}",
                                           ctx.name(), folder, m0.step, steps_, afresh));
    restore_engine_state(*engine_.engine, ck);
    try {
      order().set_where({m0.data_epoch, m0.data_cursor});
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error("node '" + ctx.name() + "': checkpoint " + folder + ": " + e.what() + "; " + afresh);
    }
    if (m0.rng_state.size() == sizeof(uint64_t)) {
      uint64_t rng;
      std::memcpy(&rng, m0.rng_state.data(), sizeof rng);
      model_->set_rng_state(rng);
    }
    set_state(m0.extra.value("state", nlohmann::json::object()));
    step_ = committed_ = m0.step;
    ctx.print(fmt::format("{} resumed at update {} of {} from {}", tag_, step_, steps_, folder));
  }

  bool resumed_ = false, done_ = false;
  std::optional<ops::matmul_precision> held_out_precision_;  // bf16 in a bf16 step (as its engine's products)
  int64_t step_ = 0;
  int64_t committed_ = 0;  // the update of the last checkpoint this run committed or resumed from (0: none)
  std::string ckpt_dir_;  // CHECKPOINT_DIR/NAME, or "" without [graph] checkpoint_dir
  int64_t save_every_ = 0;
  model_format format_ = model_format::llama2c;
  std::string tokenizer_;
  std::string source_;  // the HF folder the model came from (model_msg::source)
  clk::time_point t0_;
};

}  // namespace flowrun::actors
