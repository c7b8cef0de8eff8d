// DeepSpeed-Chat's steps 1 and 2 as node kinds (docs/rlhf.md), each declared next to its class:
//
//   sft_trainer   step 1: SFT on prompt + chosen, emits the trained model
//   rm_trainer    step 2: reward model (base + value head), emits it
//   model_source  loads a model file or folder and emits it once (ppo.graph's start)
//
// Both trainers train through the one engine (models/train/zero.h) with DS-Chat's
// settings (dschat::engine_settings); what they share is in actors/dschat_common.h, their
// skeleton (the dschat_trainer base class and add_trainer_settings) in actors/dschat_trainer.h.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/node_models.h"
#include "actors/dschat_common.h"
#include "actors/dschat_trainer.h"
#include "actors/resume_check.h"
#include "actors/register.h"
#include "actors/rlhf_types.h"
#include "models/adapter.h"
#include "models/train/engine_checkpoint.h"
#include "models/train/shard_checkpoint.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

void add_trainer_settings(graph::node_kind& k, double lr, int64_t steps) {
  using T = graph::setting_type;
  k.single_replica = "its copies would each train on every row and write the same output and checkpoint files "
                     "(it is not data-parallel; ZeRO stages run inside its one engine)";
  k.require("model", T::path, "initial weights: llama2.c .bin, a flowrun model folder, or a HF folder (LLaMA, OPT, GPT-2)")
      .require("tokenizer", T::path, "SentencePiece .model, GPT-2 BPE vocab.json, tokenizer.json, or a folder holding one")
      .require("data", T::path, "JSONL: DS-Chat's {prompt, chosen, rejected} or {prompt, chosen}, raw HH-RLHF, GSM8K's "
                                "{question, answer}, TRL's {prompt, completion} or {messages} (docs/rlhf.md)")
      .option("mix_data", T::path_list, std::vector<std::string>{}, "more datasets blended with data (each split alike)")
      .option("data_split", T::string, std::string("2,4,4"), "DS-Chat's --data_split: each step's share")
      .option("eval_fraction", T::float_, 0.1, "held-out share of this step's rows").in_range(0, 1, false, /*high_open=*/true)
      .option("per_device_train_batch_size", T::int_, std::int64_t{8}, "rows per micro-batch").at_least(1)
      .option("gradient_accumulation_steps", T::int_, std::int64_t{1}, "micro-batches per optimizer step").at_least(1)
      .option("learning_rate", T::float_, lr, "AdamW peak learning rate").at_least(0)
      .option("weight_decay", T::float_, 0.0, "AdamW decoupled weight decay").at_least(0)
      .option("lr_scheduler_type", T::string, std::string("cosine"), "transformers.get_scheduler's cosine, linear, constant or constant_with_warmup; a "
              "deepspeed_config with a scheduler section replaces it (DeepSpeed's configured scheduler wins)")
      .option("num_warmup_steps", T::int_, std::int64_t{0}, "linear warmup steps").at_least(0)
      .option("max_seq_len", T::int_, std::int64_t{128}, "prompt + answer tokens, EOS kept when cut").at_least(2)
      .option("truncation", T::string, std::string("prompt_start"),
              "over max_seq_len: prompt_start drops the oldest prompt tokens; end cuts the end, as DS-Chat does, "
              "but keeps EOS last (DS-Chat's cut drops it)")
      .option("apply_chat_template", T::bool_, false,
              "render rows with the chat template of the tokenizer's HF folder (tokenizer_config.json): "
              "HH-RLHF turns as user/assistant messages, the answer as the assistant's reply (TRL's name)")
      .option("steps", T::int_, steps, "optimizer updates, each of gradient_accumulation_steps micro-batches").at_least(1)
      .option("zero_stage", T::int_, std::int64_t{0}, "ZeRO stage 0-3 of the trainer's engine (DS-Chat's --zero_stage)").in_range(0, 3)
      .option("dtype", T::string, std::string("fp32"),
              "fp32, bf16 or fp16 (fp32 masters; fp16 with dynamic loss scaling): DS-Chat's --dtype")
      .option("deepspeed_config", T::path, std::string(""),
              "a DeepSpeed JSON whose zero_optimization.stage, bf16/fp16, gradient_clipping, batch triple and "
              "optimizer override these settings")
      .option("only_optimize_lora", T::bool_, false, "train only the LoRA weights (DS-Chat's --only_optimize_lora)")
      .option("lora_dim", T::int_, std::int64_t{0}, "LoRA rank (0: full fine-tuning)").at_least(0)
      .option("lora_module_name", T::string, std::string("decoder.layers."), lora_module_name_doc())
      .option("lora_learning_rate", T::float_, 5e-4,
              "the LoRA weights' peak learning rate, on learning_rate's schedule (DS-Chat's --lora_learning_rate)")
      .at_least(0)
      .option("gradient_checkpointing", T::bool_, false,
              "recompute each layer's activations in backward (less memory, one more forward per layer)")
      .option("seed", T::int_, std::int64_t{1234},
              "DS-Chat's --seed: the data split and order and LoRA's initial weights ([graph] seed does not "
              "change them; it seeds the runtime's per-node seeds: the value head's initial weights, sampling)")
      .in_range(0, 4294967295.0)
      .because("the data split shuffles as DS-Chat's get_shuffle_idx, with numpy's RandomState, whose seed is 32-bit")
      .option("print_every", T::int_, std::int64_t{10}, "print the loss every N steps").at_least(1)
      .option("memory_limit_gb", T::float_, 0.0,
              "refuse at start a plan (weights, gradients, AdamW states, activations, logits) over this many GB "
              "(0: 90% of the available memory)").at_least(0)
      .option("verify_output", T::bool_, false, "reload the saved output and print its largest output difference")
      .option("save_checkpoint_steps", T::int_, std::int64_t{0},
              "with [graph] checkpoint_dir: commit a checkpoint into CHECKPOINT_DIR/NAME every N updates (0: never); "
              "the same command resumes from the last one").at_least(0)
      .option("keep_checkpoints", T::int_, std::int64_t{2}, "committed checkpoints kept (the older ones removed)")
      .at_least(1);
  actor::add_tensorboard_settings(k);
  // DS-Chat's and HF Trainer's flags that are another setting here, or a node or edge of the graph
  k.known_as("model_name_or_path", "DS-Chat's --model_name_or_path is model here (a file or a folder)")
      .known_as("data_path", "DS-Chat's --data_path is data here (more files: mix_data)")
      .known_as("num_train_epochs",
                "DS-Chat's --num_train_epochs is steps here: optimizer updates (an epoch is the step's training rows / "
                "(per_device_train_batch_size x gradient_accumulation_steps); the run prints its row counts)")
      .known_as("per_device_eval_batch_size",
                "the held-out pass batches as training does (per_device_train_batch_size); eval_fraction sets its rows")
      .known_as("output_dir", "DS-Chat's --output_dir is output here (a file, or a folder for an HF model)")
      .known_as("lora_r", "DS-Chat's LoRA rank is lora_dim here (TencentPretrain's lora_r)")
      .known_as("lora_alpha", "DS-Chat's LoRA scales by 1 / lora_dim (its lora_scaling 1: PEFT's lora_alpha = 1, as the "
                              "saved adapter_config.json says); lora_alpha is zero_rank's (TencentPretrain's)")
      .known_as("lora_dropout", "DS-Chat's LoRA has no dropout (its lora_droppout 0); lora_dropout is zero_rank's "
                                "(TencentPretrain's)")
      .known_as("max_length", "TRL's max_length is max_seq_len here (prompt + answer tokens)")
      .known_as("eval_interval", "DS-Chat's --eval_interval has no setting here: the held-out pass runs before and "
                                 "after training (eval_fraction sets its rows)");
  add_schedule_hints(k);
  add_dschat_flag_hints(k, "dropout");
  k.check = [](const graph::node_spec& n, const graph::graph_spec& g) {
    auto problems = check_trainer_output(n, g);
    for (auto& p : dtype_problems(n)) problems.push_back(std::move(p));
    for (auto& p : ds_config_problems(n, 1)) problems.push_back(std::move(p));  // one rank (common_settings)
    for (auto& p : lr_scheduler_problems(n)) problems.push_back(std::move(p));
    for (auto& p : trainer_choice_problems(n, "lora_dim", "learning_rate", "lora_learning_rate"))
      problems.push_back(std::move(p));
    for (auto& p : lora_module_problems(n, "lora_dim", "lora_module_name")) problems.push_back(std::move(p));
    for (auto& p : split_overlap_problems(n, g)) problems.push_back(std::move(p));
    for (auto& p : save_lora_problems(n)) problems.push_back(std::move(p));
    for (auto& p : tokenizer_model_problems(n)) problems.push_back(std::move(p));
    return problems;
  };
}

namespace {


// ---------------------------------------------------------------- step 1

/// Step 1: supervised fine-tuning (step1 main.py): the causal-LM loss on prompt + chosen.
class sft_trainer final : public dschat_trainer {
 public:
  sft_trainer() : dschat_trainer("[step 1 sft]", false) {}

 private:
  void prepare_data(actor::node_context& ctx) override {
    d_.mask_prompt = ctx.spec().get_bool("mask_prompt");
    auto rows = load_step_rows(ctx, 0, d_);
    dschat::tokenize_settings ts;
    ts.max_seq_len = d_.max_seq_len;
    ts.mask_prompt = d_.mask_prompt;
    ts.truncation = truncation_of(ctx);
    ts.chat = chat_template_setting(ctx);
    print_chat_row(ctx, "[step 1 sft]", rows, ts, false);
    dschat::process_report rep;  // how many were cut, and how many lost their whole prompt (as step 2 says)
    try {
      train_ = dschat::make_sft_examples(rows.train, *tok_, ts, &rep);
    } catch (const std::invalid_argument& e) {  // name the file: the rows are its step share
      throw std::invalid_argument(ctx.spec().get_string("data") + " (this step's training rows): " + e.what());
    }
    order_ = batch_cycle(static_cast<int64_t>(train_.size()), d_.per_device_train_batch_size, d_.seed);
    order_.check(ctx.name(), "per_device_train_batch_size");
    ctx.log().info("{}", rep.summary());
    if (d_.mask_prompt) check_answers_kept(ctx, ts);
    auto eval = dschat::make_sft_examples(rows.eval, *tok_, ts);
    n_eval_ = static_cast<int64_t>(eval.size());
    for (auto& b : dschat::epoch_batches(n_eval_, d_.per_device_train_batch_size, 0, 0, false))
      eval_.push_back(dschat::sft_batch(eval, b, d_.mask_prompt));
  }

  /// With mask_prompt the loss is the answer's alone: an example cut inside its prompt (truncation "end" at a
  /// short max_seq_len) keeps only the forced EOS as its target, so the model learns to end mid-prompt (it trained
  /// on that alone, loss 25.8, without a word). Refused when every example is so, said when some are.
  void check_answers_kept(actor::node_context& ctx, const dschat::tokenize_settings& ts) const {
    int64_t lost = 0;
    for (const auto& e : train_) lost += e.truncated && static_cast<int64_t>(e.ids.size()) - e.prompt_len <= 1;
    if (lost == 0) return;
    const std::string fix = ts.truncation == dschat::truncation_mode::end
                                ? "raise max_seq_len, or set truncation = \"prompt_start\" so that long prompts do not "
                                  "cut the answers away"
                                : "raise max_seq_len";
    if (lost == static_cast<int64_t>(train_.size()))
      throw std::invalid_argument(fmt::format(
          "node '{}': every one of the {} training examples lost its whole answer at max_seq_len {} (truncation "
          "\"{}\"), and mask_prompt = true leaves the loss only the forced EOS: {}",
          ctx.name(), lost, d_.max_seq_len, ctx.spec().get_string("truncation"), fix));
    ctx.log().warn("{} of the {} training examples lost their whole answer at max_seq_len {}: with mask_prompt their "
                   "only target is the forced EOS; {}",
                   lost, train_.size(), d_.max_seq_len, fix);
  }

  void update(actor::node_context& ctx, int64_t step) override {
    std::vector<dschat::sft_batch_data> micro;
    int64_t tokens = 0;
    for (int64_t g = 0; g < d_.gradient_accumulation_steps; ++g) {
      micro.push_back(dschat::sft_batch(train_, order_.next(ctx.name()), d_.mask_prompt));
      tokens += micro.back().n_target_tokens;
    }
    const auto t = clk::now();
    const step_result r = dschat::sft_update(*engine_.engine, micro, engine_.next_lr(d_));
    engine_.report_overflows(ctx, fmt::format("[step 1 sft] step {}:", step));
    const double tps = tokens / since(t);
    ctx.signal("loss", r.loss, step);
    ctx.signal("lr", r.lr, step);
    ctx.signal("grad_norm", r.grad_norm, step);
    ctx.signal("tokens_per_s", tps, step);
    ctx.metric("tokens", tokens);
    if (prints(ctx, step))
      ctx.print(fmt::format("[step 1 sft] step {}/{} loss {:.4f} lr {} ({:.0f} tokens/s)", step, steps_, r.loss,
                            engine_.shown_lr(d_, r.lr), tps));
  }

  bool has_held_out() const override { return !eval_.empty(); }
  std::string evaluate(actor::node_context& ctx, bool before, double seconds,
                       const dschat::batch_progress_fn& progress) override {
    const auto e = dschat::sft_eval(*model_, eval_, progress);
    // held-out values: no step (the report's before -> after; TensorBoard at the node's last step)
    ctx.signal("held_out/loss", e.loss);
    ctx.signal("held_out/perplexity", e.perplexity);
    if (before) {
      before_ = e;
      return fmt::format("[step 1 sft] {} train / {} held-out examples; held-out loss {:.4f} (ppl {:.2f}) before",
                         train_.size(), n_eval_, e.loss, e.perplexity);
    }
    return fmt::format("[step 1 sft] held-out loss {:.4f} -> {:.4f} (ppl {:.2f} -> {:.2f}), {:.1f} s", before_.loss,
                       e.loss, before_.perplexity, e.perplexity, seconds);
  }

  nlohmann::json state() const override {
    return {{"before_loss", before_.loss}, {"before_perplexity", before_.perplexity}};
  }
  void set_state(const nlohmann::json& j) override {
    before_.loss = j.value("before_loss", 0.0);
    before_.perplexity = j.value("before_perplexity", 0.0);
  }
  batch_cycle& order() override { return order_; }

  std::vector<dschat::sft_example> train_;
  std::vector<dschat::sft_batch_data> eval_;
  int64_t n_eval_ = 0;
  batch_cycle order_;
  dschat::sft_eval_result before_;
};

void register_sft_trainer(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"sft_trainer", "DS-Chat step 1: supervised fine-tuning on prompt + chosen"};
  add_trainer_settings(k, 1e-3, 150);
  k.output("model", "model", "the fine-tuned model, when training ends")
      .option("mask_prompt", T::bool_, false, "no loss on prompt tokens")
      .option("save_lora", T::output, std::string(""), save_lora_doc())
      .option("output", T::output, std::string(""),
              "also save the model here, in the format of `model`: a llama2.c file, or a folder (HF: with the "
              "tokenizer)");
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new sft_trainer); });
}

// ---------------------------------------------------------------- step 2

/// Step 2: the reward model (step2 main.py): base + v_head, the pairwise loss.
class rm_trainer final : public dschat_trainer {
 public:
  rm_trainer() : dschat_trainer("[step 2 rm]", true) {}

 private:
  void prepare_data(actor::node_context& ctx) override {
    auto rows = load_step_rows(ctx, 1, d_);
    dschat::tokenize_settings ts;
    ts.max_seq_len = d_.max_seq_len;
    ts.truncation = truncation_of(ctx);
    ts.chat = chat_template_setting(ctx);
    print_chat_row(ctx, "[step 2 rm]", rows, ts, false);
    dschat::process_report rep;
    try {
      train_ = dschat::make_rm_examples(rows.train, *tok_, ts, &rep);
    } catch (const std::invalid_argument& e) {  // name the file: the rows are its step share
      throw std::invalid_argument(ctx.spec().get_string("data") + " (this step's training rows): " + e.what());
    }
    // DS-Chat keeps a pair whose answers tokenize alike (its loss is log 2, its gradient 0); a share of
    // nothing else would train nothing
    if (!train_.empty() && rep.identical == static_cast<int64_t>(train_.size()))
      throw_all_pairs_identical(ctx, rep.input, ts, d_.max_seq_len);
    order_ = batch_cycle(static_cast<int64_t>(train_.size()), d_.per_device_train_batch_size, d_.seed + 1);
    order_.check(ctx.name(), "per_device_train_batch_size");
    ctx.log().info("{}", rep.summary());
    auto eval = dschat::make_rm_examples(rows.eval, *tok_, ts);
    for (auto& b : dschat::epoch_batches(static_cast<int64_t>(eval.size()), d_.per_device_train_batch_size, 0, 0, false))
      eval_.push_back(dschat::rm_batch(eval, b));
  }

  void update(actor::node_context& ctx, int64_t step) override {
    std::vector<dschat::rm_batch_data> micro;
    int64_t tokens = 0;
    for (int64_t g = 0; g < d_.gradient_accumulation_steps; ++g) {
      micro.push_back(dschat::rm_batch(train_, order_.next(ctx.name())));
      tokens += 2 * micro.back().B * micro.back().T;
    }
    const auto r = dschat::rm_update(*engine_.engine, micro, engine_.next_lr(d_));
    engine_.report_overflows(ctx, fmt::format("[step 2 rm] step {}:", step));
    ctx.signal("loss", r.loss, step);
    ctx.signal("accuracy", r.accuracy, step);
    ctx.signal("chosen_mean", r.chosen_mean, step);
    ctx.signal("rejected_mean", r.rejected_mean, step);
    ctx.signal("lr", r.lr, step);
    ctx.signal("grad_norm", r.grad_norm, step);
    ctx.metric("tokens", tokens);
    acc_sum_ += r.accuracy;
    ++acc_n_;
    if (prints(ctx, step)) {
      ctx.print(fmt::format("[step 2 rm] step {}/{} loss {:.4f} acc {:.3f} chosen {:.3f} rejected {:.3f}", step,
                            steps_, r.loss, acc_sum_ / acc_n_, r.chosen_mean, r.rejected_mean));
      acc_sum_ = 0;
      acc_n_ = 0;
    }
  }

  bool has_held_out() const override { return !eval_.empty(); }
  std::string evaluate(actor::node_context& ctx, bool before, double seconds,
                       const dschat::batch_progress_fn& progress) override {
    const auto ev = dschat::rm_eval(*model_, eval_, progress);
    ctx.signal("held_out/accuracy", ev.accuracy);
    ctx.signal("held_out/chosen_mean", ev.chosen_mean);
    ctx.signal("held_out/rejected_mean", ev.rejected_mean);
    if (before)
      return fmt::format("[step 2 rm] {} train / {} held-out pairs; held-out accuracy {:.3f} ± {:.3f} before",
                         train_.size(), ev.pairs, ev.accuracy, ev.accuracy_stderr);
    return fmt::format("[step 2 rm] held-out accuracy {:.3f} ± {:.3f} over {} pairs; mean chosen {:.3f}, "
                       "rejected {:.3f}; {:.1f} s",
                       ev.accuracy, ev.accuracy_stderr, ev.pairs, ev.chosen_mean, ev.rejected_mean, seconds);
  }

  nlohmann::json state() const override { return {{"acc_sum", acc_sum_}, {"acc_n", acc_n_}}; }  // since the last print
  void set_state(const nlohmann::json& j) override {
    acc_sum_ = j.value("acc_sum", 0.0);
    acc_n_ = j.value("acc_n", int64_t{0});
  }
  batch_cycle& order() override { return order_; }

  double acc_sum_ = 0;
  int64_t acc_n_ = 0;
  std::vector<dschat::rm_example> train_;
  std::vector<dschat::rm_batch_data> eval_;
  batch_cycle order_;
};

void register_rm_trainer(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"rm_trainer", "DS-Chat step 2: reward model = base + v_head, pairwise loss"};
  add_trainer_settings(k, 5e-4, 300);
  k.output("model", "model", "the reward model (with its value head), when training ends")
      .option("output", T::output, std::string(""),
              "also save it into this folder: HF (with v_head.weight and the tokenizer) from a HF model, else "
              "flowrun_config.json + safetensors");
  add_padding_hint(k);
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new rm_trainer); });
}

// ---------------------------------------------------------------- model files

/// Loads a model (llama2.c .bin, a flowrun model folder, or a HF folder) and emits it once:
/// how graphs/ppo.graph starts from the outputs of sft.graph and rm.graph.
class model_source final : public actor::node {
 public:
  bool produce(actor::node_context& ctx) override {
    if (done_) return false;
    const auto [path, info] = given_model(ctx);
    auto m = std::make_shared<decoder>(load_node_model(ctx, path));
    if (ctx.spec().get_bool("value_head") && !m->has_value_head())
      throw std::runtime_error("node '" + ctx.name() + "': " + ctx.spec().get_string("model") +
                               " has no value head; give the folder written by rm_trainer's output");
    ctx.log().info("loaded {}: {}", ctx.spec().get_string("model"), m->config().summary());
    // an HF folder carries its tokenizer (a trainer that starts from it copies it on)
    const bool has_tok = info.format == model_format::hf && folder_has_tokenizer(path);
    // an HF source's stop ids go with the outputs trained from it
    model_msg msg{m, 0, info.format, has_tok ? path : "", /*snapshot=*/false,
                  info.format == model_format::hf ? path : ""};
    ctx.emit("model", actor::payload::make("model", std::move(msg)));
    done_ = true;
    return false;
  }

 private:
  bool done_ = false;
};

void register_model_source(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"model_source", "loads a model file or folder and emits it once"};
  k.output("model", "model", "the loaded model", true)
      .require("model", T::path, "llama2.c .bin, a flowrun model folder (rm_trainer output) or a HF folder")
      .option("value_head", T::bool_, false, "require a value head (reward and critic models)");
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new model_source); });
}

}  // namespace

void register_dschat_trainers(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  register_sft_trainer(kinds, factories);
  register_rm_trainer(kinds, factories);
  register_dpo_trainer(kinds, factories);
  register_model_source(kinds, factories);
}

}  // namespace flowrun::actors
