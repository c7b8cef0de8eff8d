// DeepSpeed-Chat's DPO step as a node kind (docs/rlhf.md, "DPO"):
//
//   dpo_trainer   step 2 the DPO way (DeepSpeedExamples applications/DeepSpeed-Chat/training/
//                 step2_dpo_finetuning/main.py): the policy, started from `model` (DS-Chat starts
//                 from the SFT model), learns step 2's chosen/rejected pairs against a frozen copy of
//                 itself (the reference); emits and saves the trained policy like sft_trainer.
//
// The skeleton (model, data split, engine, checkpoints, output) is the other DS-Chat trainers'
// (actors/dschat_trainer.h); the loss is models/rlhf/dpo.h.
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "actors/dschat_trainer.h"
#include "models/rlhf/dpo.h"

namespace flowrun::actors {

namespace {

class dpo_trainer final : public dschat_trainer {
 public:
  dpo_trainer() : dschat_trainer("[step 2 dpo]", false) {}

 private:
  void prepare_data(actor::node_context& ctx) override {
    s_.loss.beta = ctx.spec().get_float("beta");
    s_.loss.label_smoothing = ctx.spec().get_float("label_smoothing");
    try {
      s_.loss.loss_type = rlhf::parse_dpo_loss_type(ctx.spec().get_string("loss_type"));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("node '" + ctx.name() + "': " + e.what());
    }
    if (s_.loss.loss_type == rlhf::dpo_loss_type::ipo && s_.loss.label_smoothing != 0)
      throw std::invalid_argument("node '" + ctx.name() + "': label_smoothing applies to loss_type \"sigmoid\" only; "
                                  "set it to 0 for \"ipo\"");
    s_.mask_before_divergence = ctx.spec().get_bool("mask_before_divergence");
    auto rows = load_step_rows(ctx, 1, d_);  // DS-Chat's DPO reads step 2's share (train_phase = 2)
    dschat::tokenize_settings ts;
    ts.max_seq_len = d_.max_seq_len;
    ts.truncation = truncation_of(ctx);
    ts.skip_identical = true;  // no preference to learn: the DPO margin of such a pair is 0 whatever the model
    ts.chat = chat_template_setting(ctx);
    print_chat_row(ctx, "[step 2 dpo]", rows, ts, false);
    dschat::process_report rep;
    try {
      train_ = dschat::make_rm_examples(rows.train, *tok_, ts, &rep);
    } catch (const std::invalid_argument& e) {  // name the file: the rows are its step share
      throw std::invalid_argument(ctx.spec().get_string("data") + " (this step's training rows): " + e.what());
    }
    ctx.print(fmt::format("[step 2 dpo] train pairs: {}", rep.summary()));
    // no rows at all is the share's size (batch_cycle::check says so), not identical pairs
    if (train_.empty() && rep.input > 0) throw_all_pairs_identical(ctx, rep.input, ts, d_.max_seq_len);
    order_ = batch_cycle(static_cast<int64_t>(train_.size()), d_.per_device_train_batch_size, d_.seed + 1);
    order_.check(ctx.name(), "per_device_train_batch_size");
    dschat::process_report erep;
    auto eval = dschat::make_rm_examples(rows.eval, *tok_, ts, &erep);
    if (erep.identical) ctx.print(fmt::format("[step 2 dpo] held-out pairs: {}", erep.summary()));
    for (auto& b : dschat::epoch_batches(static_cast<int64_t>(eval.size()), d_.per_device_train_batch_size, 0, 0, false))
      eval_.push_back(dschat::rm_batch(eval, b));
  }

  void model_loaded(actor::node_context& ctx) override {
    reference_ = copy_model(*model_);  // frozen: DS-Chat's ref_model, the starting weights
    reference_->set_training(false);
  }

  void plan_memory(memory_plan& p) const override {
    p.micro_batch = 2 * std::max<int64_t>(1, order_.batch_rows());  // chosen and rejected rows, one forward
    p.dout = memory_plan::loss_grad::dlogits;            // gather_log_probs_backward's (2B, T, V)
    p.keep_rows = true;  // forward_pairs keeps the positions from the earliest counted log-prob
  }

  void update(actor::node_context& ctx, int64_t step) override {
    std::vector<dschat::rm_batch_data> micro;
    int64_t tokens = 0;
    for (int64_t g = 0; g < d_.gradient_accumulation_steps; ++g) {
      micro.push_back(dschat::rm_batch(train_, order_.next(ctx.name())));
      tokens += 2 * micro.back().B * micro.back().T;
    }
    const auto r = dschat::dpo_update(*engine_.engine, *reference_, micro, s_, engine_.next_lr(d_));
    engine_.report_overflows(ctx, fmt::format("[step 2 dpo] step {}:", step));
    ctx.signal("loss", r.loss, step);
    ctx.signal("accuracy", r.accuracy, step);
    ctx.signal("rewards/chosen", r.chosen_reward, step);
    ctx.signal("rewards/rejected", r.rejected_reward, step);
    ctx.signal("rewards/margins", r.chosen_reward - r.rejected_reward, step);  // TRL's, beside its chosen/rejected
    ctx.signal("lr", r.lr, step);
    ctx.signal("grad_norm", r.grad_norm, step);
    ctx.metric("tokens", tokens);
    // every figure of the line is its mean over the steps since the last line (TRL averages each
    // logged metric over the logging interval); the rewards were the last step's beside the others' means
    acc_sum_ += r.accuracy;
    loss_sum_ += r.loss;
    chosen_sum_ += r.chosen_reward;
    rejected_sum_ += r.rejected_reward;
    ++acc_n_;
    if (prints(ctx, step)) {
      ctx.print(fmt::format("[step 2 dpo] step {}/{} loss {:.4f} acc {:.3f} rewards chosen {:.3f} rejected {:.3f} "
                            "lr {}",
                            step, steps_, loss_sum_ / acc_n_, acc_sum_ / acc_n_, chosen_sum_ / acc_n_,
                            rejected_sum_ / acc_n_, engine_.shown_lr(d_, r.lr)));
      acc_sum_ = loss_sum_ = chosen_sum_ = rejected_sum_ = 0;
      acc_n_ = 0;
    }
  }

  bool has_held_out() const override { return !eval_.empty(); }
  std::string evaluate(actor::node_context& ctx, bool before, double seconds,
                       const dschat::batch_progress_fn& progress) override {
    const auto e = dschat::dpo_eval(*model_, *reference_, eval_, s_, progress);
    // TRL's eval_* values: no step (the report's before -> after; TensorBoard at the node's last step)
    ctx.signal("held_out/loss", e.loss);
    ctx.signal("held_out/accuracy", e.accuracy);
    ctx.signal("held_out/rewards/chosen", e.chosen_reward);
    ctx.signal("held_out/rewards/rejected", e.rejected_reward);
    // IPO's loss compares per-token log-ratios (TRL divides each side's by its length), and so does this accuracy
    // there; the preference accuracy and rewards are of the sums under every loss, as TRL's rewards/*
    const char* logp = s_.loss.loss_type == rlhf::dpo_loss_type::ipo ? "per-token log-prob accuracy" : "log-prob accuracy";
    const std::string line =
        fmt::format("preference accuracy {:.3f} ± {:.3f}, {} {:.3f} ± {:.3f}, DPO loss {:.4f} over {} pairs", e.accuracy,
                    e.accuracy_stderr, logp, e.logp_accuracy, e.logp_accuracy_stderr, e.loss, e.pairs);
    if (before) {
      before_ = e;
      return fmt::format("[step 2 dpo] {} train / {} held-out pairs; held-out {} before (policy = reference: every "
                         "margin is 0)",
                         train_.size(), e.pairs, line);
    }
    return fmt::format("[step 2 dpo] held-out {} after; rewards chosen {:.3f} rejected {:.3f}; {} "
                       "{:.3f} -> {:.3f}, loss {:.4f} -> {:.4f}; {:.1f} s",
                       line, e.chosen_reward, e.rejected_reward, logp, before_.logp_accuracy, e.logp_accuracy,
                       before_.loss, e.loss, seconds);
  }

  nlohmann::json state() const override {
    return {{"acc_sum", acc_sum_},         {"loss_sum", loss_sum_},  // since the last print
            {"chosen_sum", chosen_sum_},   {"rejected_sum", rejected_sum_},
            {"acc_n", acc_n_},
            {"before_logp_accuracy", before_.logp_accuracy}, {"before_loss", before_.loss}};
  }
  void set_state(const nlohmann::json& j) override {
    acc_sum_ = j.value("acc_sum", 0.0);
    loss_sum_ = j.value("loss_sum", 0.0);
    chosen_sum_ = j.value("chosen_sum", 0.0);
    rejected_sum_ = j.value("rejected_sum", 0.0);
    acc_n_ = j.value("acc_n", int64_t{0});
    before_.logp_accuracy = j.value("before_logp_accuracy", 0.0);
    before_.loss = j.value("before_loss", 0.0);
  }
  batch_cycle& order() override { return order_; }

  dschat::dpo_settings s_;
  std::shared_ptr<decoder> reference_;
  double acc_sum_ = 0, loss_sum_ = 0, chosen_sum_ = 0, rejected_sum_ = 0;
  int64_t acc_n_ = 0;
  dschat::dpo_eval_result before_;
  std::vector<dschat::rm_example> train_;
  std::vector<dschat::rm_batch_data> eval_;
  batch_cycle order_;
};

}  // namespace

void register_dpo_trainer(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"dpo_trainer",
                     "DS-Chat step 2 by DPO: the policy learns chosen over rejected against a frozen reference "
                     "(step2_dpo_finetuning)"};
  add_trainer_settings(k, 1e-3, 100);  // DS-Chat's DPO main.py: learning_rate 1e-3 (as its step 1)
  for (auto& d : k.settings)  // DPO learns from pairs: {prompt, chosen} rows cannot feed it
    if (d.name == "data") d.doc = "DS-Chat JSONL pairs: {prompt, chosen, rejected}, or raw HH-RLHF {chosen, rejected}";
  k.output("model", "model", "the DPO-trained policy, when training ends")
      .option("save_lora", T::output, std::string(""), save_lora_doc())
      .option("beta", T::float_, 0.1,
              "β of the DPO loss: the strength of the implicit KL to the reference (DS-Chat's and TRL's default 0.1)")
      .above(0)
      .option("label_smoothing", T::float_, 0.0,
              "conservative DPO: the share of preferences assumed flipped, in [0, 0.5) (DS-Chat's --label_smoothing; "
              "sigmoid only)")
      .in_range(0, 0.5, false, /*high_open=*/true)
      .option("loss_type", T::string, std::string("sigmoid"),
              "sigmoid: −log σ(β z) (DPO, DS-Chat); ipo: (z − 1/(2β))² over each side's log-ratio per counted token "
              "(IPO, TRL 1.12; rewards and accuracy of the sums, as TRL's)")
      .option("mask_before_divergence", T::bool_, false,
              "count the tokens from the first one where chosen and rejected differ (DS-Chat's masking); default "
              "false: the answer tokens, the prompt masked out (TRL's DPOTrainer)")
      .option("output", T::output, std::string(""),
              "also save the policy here, in the format of `model`: a llama2.c file, or a folder (HF: with the "
              "tokenizer)");
  k.known_as("max_prompt_length",
             "TRL's max_prompt_length has no separate setting here: max_seq_len bounds prompt + answer, and "
             "truncation = \"prompt_start\" drops the oldest prompt tokens first");
  add_schedule_hints(k);
  // the string settings and their combinations, refused when the graph is checked (before any model loads)
  k.check = [](const graph::node_spec& n, const graph::graph_spec& g) -> std::vector<graph::node_kind::problem> {
    std::vector<graph::node_kind::problem> problems = dtype_problems(n);
    for (auto& p : split_overlap_problems(n, g)) problems.push_back(std::move(p));
    for (auto& p : save_lora_problems(n)) problems.push_back(std::move(p));
    for (auto& p : ds_config_problems(n, 1)) problems.push_back(std::move(p));  // one rank (common_settings)
    for (auto& p : lr_scheduler_problems(n)) problems.push_back(std::move(p));
    for (auto& p : trainer_choice_problems(n, "lora_dim", "learning_rate", "lora_learning_rate"))
      problems.push_back(std::move(p));
    for (auto& p : tokenizer_model_problems(n)) problems.push_back(std::move(p));
    rlhf::dpo_loss_type type;
    try {
      type = rlhf::parse_dpo_loss_type(n.get_string("loss_type"));
    } catch (const std::invalid_argument& e) {
      problems.push_back({"loss_type", e.what(), "use sigmoid (DPO) or ipo"});
      return problems;
    }
    if (type == rlhf::dpo_loss_type::ipo && n.get_float("label_smoothing") > 0)
      problems.push_back({"label_smoothing",
                          fmt::format("label_smoothing = {} applies to the sigmoid loss only, and loss_type = \"ipo\"",
                                      n.get_float("label_smoothing")),
                          "set label_smoothing = 0 with ipo, or loss_type = \"sigmoid\""});
    return problems;
  };
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new dpo_trainer); });
}

}  // namespace flowrun::actors
