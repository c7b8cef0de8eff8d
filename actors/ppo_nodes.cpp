// DeepSpeed-Chat's step 3 (PPO) as node kinds (docs/rlhf.md), each declared next to its class:
//
//   prompt_loader     step 3's prompts, one batch per `tick` from the controller
//   ppo_controller    owns the loop (actors/ppo_controller.{h,cpp}): the phases of each PPO
//                     iteration, the prints, the checkpoint commits
//   rollout_generator the hybrid engine: generates with the policy's current weights
//   reference_model, reward_model   frozen scorers
//   policy, critic    trainers: score the rollouts and train through the engine, on
//                     `replicas` ranks (actors/rank_group.h)
//   experience_maker  rewards (KL-penalised, clipped score) and GAE
//
// The controller's loop is DS-Chat's main loop (step3 main.py): for each prompt
// batch, generate_experience, then train_rlhf, then print. Phases are ordered by
// messages: the controller asks for the next batch only when the policy and the
// critic have reported, so the generator never runs while the policy trains.
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/dschat_common.h"
#include "actors/ppo_controller.h"
#include "actors/rank_group.h"
#include "actors/register.h"
#include "actors/resume_check.h"
#include "actors/reward_function.h"
#include "actors/rlhf_types.h"
#include "actors/trainer_order.h"
#include "models/adapter.h"
#include "models/train/engine_checkpoint.h"
#include "models/lm_data.h"
#include "models/rlhf/ppo.h"
#include "models/rlhf/ppo_checkpoint.h"
#include "models/train/shard_checkpoint.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

namespace {

// ---------------------------------------------------------------- step 3: prompts

/// Step 3's prompts: first a held-out batch (iteration -1), then one training
/// batch per tick, then the held-out batch again (iteration -2).
class prompt_loader final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    dschat::dschat_settings d;
    d.seed = static_cast<uint64_t>(ctx.spec().get_int("seed"));
    d.data_split = ctx.spec().get_string("data_split");
    auto tok = load_tok(ctx);
    auto rows = load_step_rows(ctx, 2, d);
    dschat::tokenize_settings ts;
    ts.max_prompt_seq_len = ctx.spec().get_int("max_prompt_seq_len");
    const std::string overflow = ctx.spec().get_string("prompt_overflow");
    ts.overflow = overflow == "drop" ? dschat::prompt_overflow::drop : dschat::prompt_overflow::keep_end;
    ts.chat = chat_template_setting(ctx);
    print_chat_row(ctx, "[step 3 prompts]", rows, ts, true);
    dschat::process_report train_report, eval_report;
    train_ = dschat::make_prompt_examples(rows.train, *tok, ts, &train_report);
    eval_ = dschat::make_prompt_examples(rows.eval, *tok, ts, &eval_report);
    // said, not silent: how many prompts were longer than max_prompt_seq_len, and what became of them
    for (const auto& [what, r] : {std::pair<const char*, const dschat::process_report&>{"train", train_report},
                                  std::pair<const char*, const dschat::process_report&>{"held-out", eval_report}})
      if (r.truncated > 0 || r.filtered > 0)
        ctx.log().info("[step 3 prompts] {} prompts: {} of {} longer than max_prompt_seq_len = {}: {}", what,
                       r.truncated + r.filtered, r.input, ts.max_prompt_seq_len,
                       r.filtered > 0 ? "dropped (prompt_overflow = \"drop\", DS-Chat's filter)"
                                      : "cut to their last tokens (prompt_overflow = \"keep_end\")");
    for (const auto* set : {&train_, &eval_})
      for (const auto& e : *set) longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(e.ids.size()));
    B_ = ctx.spec().get_int("per_device_generation_batch_size");
    if (train_report.filtered > 0 && static_cast<int64_t>(train_.size()) < B_)  // the drop, not the share, left too few
      throw std::invalid_argument(fmt::format(
          "node '{}': prompt_overflow = \"drop\" dropped {} of the share's {} training prompts (longer than "
          "max_prompt_seq_len = {}), leaving {}, too few for a batch of {}: raise max_prompt_seq_len, or set "
          "prompt_overflow = \"keep_end\"",
          ctx.name(), train_report.filtered, train_report.input, ts.max_prompt_seq_len, train_.size(), B_));
    iterations_ = ctx.spec().get_int("iterations");
    eval_rows_ = std::min<int64_t>(ctx.spec().get_int("eval_prompts"), static_cast<int64_t>(eval_.size()));
    order_ = batch_cycle(static_cast<int64_t>(train_.size()), B_, d.seed + 2, /*full_only=*/true);
    order_.check(ctx.name(), "per_device_generation_batch_size");
    // step-3 resume: the held-out "before" batch was scored and J batches trained on before the
    // commit; the order is a function of the batches drawn, so draw them again
    const auto rp = ppo::find_step3_resume(ctx.checkpoint_dir());
    // which prompts an uninterrupted run draws next hangs on these settings (the split, the batch
    // size, the seed, the prompts' tokens), and eval_prompts too: the held-out figure before
    // training, kept in step3.json, is compared with the one after. A longer run may come.
    check_step3_settings(ctx, {"iterations"});
    if (rp && rp->point.iteration > iterations_)
      throw std::invalid_argument(fmt::format(
          "node '{}': {} holds step 3 after iteration {} ({} iterations done), more than iterations = {}: a resume "
          "only runs longer; set iterations >= {}, or delete {} to start step 3 afresh",
          ctx.name(), ctx.checkpoint_dir(), rp->point.iteration - 1, rp->point.iteration, iterations_,
          rp->point.iteration, ctx.checkpoint_dir()));
    if (rp) {
      for (int64_t i = 0; i < std::min(rp->point.iteration, iterations_); ++i) order_.next(ctx.name());
      next_ = 1 + rp->point.iteration;
    }
    if (eval_rows_ > 0 && eval_rows_ < ctx.spec().get_int("eval_prompts"))
      ctx.print(fmt::format("[step 3 prompts] eval_prompts = {}, but the held-out split has {} rows: the held-out "
                            "passes score those {}",
                            ctx.spec().get_int("eval_prompts"), eval_.size(), eval_rows_));
    if (eval_rows_ == 0)
      ctx.print(fmt::format("[step 3 prompts] no held-out prompts (eval_prompts = {}, {} held-out rows): the "
                            "held-out passes before and after training are skipped",
                            ctx.spec().get_int("eval_prompts"), eval_.size()));
  }

  void on_message(actor::node_context&, std::string_view, actor::payload) override {
    ready_ = true;
    ticked_ = true;
  }
  bool produce(actor::node_context& ctx) override {
    if (!ready_) {
      ctx.wait_for_input();
      return true;
    }
    if (eval_rows_ == 0 && (next_ == 0 || next_ == iterations_ + 1)) ++next_;  // no held-out pass
    if (next_ > iterations_ + 1) return false;
    prompt_msg m;
    std::vector<int64_t> idx;
    const bool eval = next_ == 0 || next_ == iterations_ + 1;
    if (eval) {
      for (int64_t i = 0; i < eval_rows_; ++i) idx.push_back(i);
    } else {
      idx = order_.next(ctx.name());
    }
    const auto& rows = eval ? eval_ : train_;
    auto pb = dschat::prompt_batch(rows, idx);
    m.ids = pb.ids;
    m.mask = pb.mask;
    m.iteration = eval ? (next_ == 0 ? -1 : -2) : next_ - 1;
    m.eval = eval;
    m.last = next_ == iterations_ + 1 || (eval_rows_ == 0 && next_ == iterations_);
    m.longest_prompt = longest_;
    m.iterations = iterations_;
    for (auto i : idx) m.references.push_back(rows[static_cast<size_t>(i)].reference);
    ++next_;
    ready_ = false;
    ctx.emit("batch", actor::payload::make("prompt_batch", std::move(m)));
    // iterations done: batch next_ - 1 went out (0: held-out before, k: iteration k - 1, iterations + 1: after).
    // The phase appears once the controller has asked for a batch (step 3's loop runs): the first
    // batch goes out at the job's start, while steps 1 and 2 may still be training, and "step 3 ppo
    // 0/N" on the status line then would name a phase that has not started.
    if (ticked_) ctx.progress("step 3 ppo", std::clamp<int64_t>(next_ - 2, 0, iterations_), iterations_);
    return true;
  }

 private:
  std::vector<dschat::prompt_example> train_, eval_;
  batch_cycle order_;
  int64_t B_ = 4, iterations_ = 0, eval_rows_ = 0, next_ = 0;
  int64_t longest_ = 0;  // the longest prompt, training and held-out rows (tokens)
  bool ready_ = true;
  bool ticked_ = false;  // a tick has come: the controller runs step 3's loop
};

void register_prompt_loader(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"prompt_loader", "DS-Chat step 3 prompts: a held-out batch, one batch per tick, held-out again"};
  for (const char* flag : {"enable_test_mode", "test_stop_step"})
    k.known_as(flag, "DS-Chat's --enable_test_mode --test_stop_step N is iterations = N here (the run's length)");
  k.known_as("num_train_epochs", "DS-Chat's step-3 --num_train_epochs (passes over the prompts) is iterations here, "
                                 "in prompt batches: epochs x training prompts / per_device_generation_batch_size")
      .known_as("max_prompt_length", "TRL's and veRL's max_prompt_length is max_prompt_seq_len here (DS-Chat's name)")
      .known_as("train_batch_size", "veRL's data.train_batch_size (prompts per step) is "
                                    "per_device_generation_batch_size here, all ranks together");
  k.input("next", "tick", "the controller asks for the next batch", true, true)
      .output("batch", "prompt_batch", "left-padded prompts")
      .require("tokenizer", T::path, "SentencePiece .model")
      .require("data", T::path, "DS-Chat JSONL with prompts")
      .option("mix_data", T::path_list, std::vector<std::string>{}, "more datasets blended with data")
      .option("data_split", T::string, std::string("2,4,4"), "DS-Chat's --data_split")
      .option("eval_fraction", T::float_, 0.1, "held-out share").in_range(0, 1, false, /*high_open=*/true)
      .option("max_prompt_seq_len", T::int_, std::int64_t{48}, "prompt tokens at most (prompt_overflow: what "
              "becomes of a longer prompt)").at_least(1)
      .option("prompt_overflow", T::string, std::string("keep_end"),
              "a prompt longer than max_prompt_seq_len: keep_end (its BOS and last tokens) or drop (DS-Chat's "
              "create_dataset_split: train_phase 3 keeps a prompt only when it fits, counting the others as "
              "filtered)")
      .option("apply_chat_template", T::bool_, false,
              "render prompts with the chat template of the tokenizer's HF folder (HH-RLHF turns or a GSM8K "
              "question as messages, add_generation_prompt = true; TRL's name)")
      .option("per_device_generation_batch_size", T::int_, std::int64_t{8}, "prompts per PPO iteration").at_least(1)
      .option("iterations", T::int_, std::int64_t{20}, "PPO iterations").at_least(1)
      .because("0 iterations train nothing (to compare models without training: flowrun eval prompts)")
      .option("eval_prompts", T::int_, std::int64_t{32},
              "held-out prompts scored before and after (0: no held-out passes)").at_least(0)
      .option("seed", T::int_, std::int64_t{1234}, "data split and order")
      .in_range(0, 4294967295.0)
      .because("the data split shuffles as DS-Chat's get_shuffle_idx, with numpy's RandomState, whose seed is 32-bit");
  k.check = [](const graph::node_spec& n, const graph::graph_spec& g) {
    auto problems = split_overlap_problems(n, g);
    if (const auto o = n.get_string("prompt_overflow"); o != "keep_end" && o != "drop")
      problems.push_back({"prompt_overflow", "prompt_overflow = \"" + o + "\" is not a way to treat a long prompt",
                          "use \"keep_end\" (its last tokens) or \"drop\" (DS-Chat's filter)"});
    return problems;
  };
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new prompt_loader); });
}

// ---------------------------------------------------------------- step 3: generation

/// The hybrid engine: generates with the policy's weights (a handle, never reloaded from
/// disk); buffers prompt batches until the policy has sent weights of their stamped version.
/// With max_staleness = 0 (the synchronous loop) the handle is the policy's live model, read
/// only while the policy waits for this batch's experience. With max_staleness >= 1 the policy
/// trains while this generates, so it generates only from snapshots: copies the policy made on
/// its own thread between its updates (double-buffered, ppo_trainer::publish_weights), taken up
/// here between batches, never mid-sequence. staleness_policy = "wait": a batch waits for
/// weights of the version the controller stamped; "drop": it is sampled with the newest weights
/// here, never waiting (a batch that proves too stale is dropped by the trainers).
class rollout_generator final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    ps_.max_answer_seq_len = s.get_int("max_answer_seq_len");  // >= 2: refused when the graph is checked
    ps_.temperature = static_cast<float>(s.get_float("temperature"));
    ps_.top_k = static_cast<int>(s.get_int("top_k"));
    ps_.top_p = static_cast<float>(s.get_float("top_p"));
    num_generations_ = s.get_int("num_generations");
    print_answers_ = s.get_bool("print_answers") ? s.get_int("print_answers_interval") : 0;
    tok_ = load_tok(ctx);
    // sampling shapes every answer a resume trains on; printing them changes none
    check_step3_settings(ctx, {"print_answers", "print_answers_interval"});
    // the log-probs are taken under logits / temperature: near 0 every sampled token's probability is 1 (the
    // ratio is 1 and the update vanishes) or another token's is ~0 (the KL to the reference explodes)
    if (ps_.temperature > 0 && ps_.temperature < 0.1 && ctx.replica() == 0)
      ctx.log().warn("temperature = {:g}: the rollouts' log-probs are taken under logits / temperature (as TRL and "
                     "veRL take them), which near 0 saturate: the update vanishes or the KL diverges; use 0 for "
                     "greedy rollouts (log-probs at 1), or 0.5-1.0 to explore",
                     ps_.temperature);
  }
  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    if (port == "weights") {
      const int64_t before = weights_.model ? weights_.version : 0;
      weights_ = msg.as<model_msg>();
      ctx.metric("policy_version", weights_.version - before);  // the console's version of this node
    } else {
      pending_.push_back(msg);
    }
    // A batch waits for the policy version the controller stamped on it: on
    // another node the weights are a copy that arrives on its own path, and
    // may come after the prompts that need it.
    while (weights_.model && !pending_.empty()) {
      const auto& p = pending_.front().as<prompt_msg>();
      if (p.save_only) {  // a drain's save (prompt_msg::save_only): no rows, on to the trainers through the scorers
        rollout_msg r;
        r.iteration = p.iteration;
        r.iterations = p.iterations;
        r.batch = emitted_++ * static_cast<int64_t>(ctx.replicas()) + static_cast<int64_t>(ctx.replica());
        r.checkpoint = true;
        r.save_only = true;
        r.policy_version = weights_.version;
        r.max_staleness = p.max_staleness;
        r.drop_stale = p.drop_stale;
        ctx.emit("rollouts", actor::payload::make("rollouts", std::move(r)));
        pending_.pop_front();
        continue;
      }
      if (p.max_staleness > 0 && !weights_.snapshot)  // ppo_trainer publishes snapshots from init on
        throw std::logic_error("node '" + ctx.name() + "': max_staleness >= 1 and the policy's weights are its live "
                               "model, which it trains while this generates");
      if (!(p.max_staleness > 0 && p.drop_stale) && weights_.version < p.policy_version) {
        if (!waiting_since_) waiting_since_ = clk::now();
        break;  // the batch's weights are on their way
      }
      // the scorers and trainers take P + max_answer_seq_len tokens per row: refused at the first
      // batch (the held-out one), before any step-3 update, rather than in the scorers when the
      // longest prompt comes
      if (const int64_t P = std::max<int64_t>(p.ids.size(1), p.longest_prompt),
          ctx_len = weights_.model->config().max_seq_len;
          P + ps_.max_answer_seq_len > ctx_len)
        throw std::invalid_argument(fmt::format(
            "node '{}': the longest prompt, {} tokens (at most the prompt loader's max_prompt_seq_len), + "
            "max_answer_seq_len {} = {} exceed the policy's context, max_seq_len {}: {}",
            ctx.name(), P, ps_.max_answer_seq_len, P + ps_.max_answer_seq_len, ctx_len,
            P + 2 <= ctx_len ? fmt::format("lower max_answer_seq_len to {} or max_prompt_seq_len", ctx_len - P)
                             : fmt::format("lower max_prompt_seq_len to at most {}", ctx_len - 2)));
      ppo::ppo_settings s = ps_;
      if (p.eval) s.temperature = 0.0f;  // held-out answers are greedy, so before/after compare like with like
      // GRPO / RLOO: each prompt's num_generations samples are adjacent rows, a group kept whole
      const int64_t G = p.eval ? 1 : num_generations_;
      // DS-Chat drops training answers of at most one token; a held-out pass scores every prompt, so that before
      // and after are the same prompts (an empty answer to a rule is a wrong one: a policy that stopped at once on
      // the hard prompts read as more accurate)
      s.drop_short_answers = G == 1 && !p.eval;
      tensor ids = p.ids, mask = p.mask;
      std::vector<std::string> refs = p.references;
      if (G > 1) {
        ids = repeat_rows(p.ids, G);
        mask = repeat_rows(p.mask, G);
        refs.clear();
        for (const auto& x : p.references) refs.insert(refs.end(), static_cast<size_t>(G), x);
      }
      ctx.phase("generation");
      auto t = clk::now();
      auto e = ppo::generate_rollouts(*weights_.model, ids, mask, s, stop_ids(), 0,
                                      ctx.seed() + static_cast<uint64_t>(p.iteration + 10));
      rollout_msg r;
      r.iteration = p.iteration;
      r.eval = p.eval;
      r.group_size = G;
      r.iterations = p.iterations;
      r.generated_rows = ids.size(0);
      r.references = std::move(refs);
      r.batch = emitted_++ * static_cast<int64_t>(ctx.replicas()) + static_cast<int64_t>(ctx.replica());
      r.checkpoint = p.checkpoint;
      r.policy_version = weights_.version;
      r.weights_wait_seconds = waiting_since_ ? std::chrono::duration<double>(t - *waiting_since_).count() : 0.0;
      waiting_since_.reset();
      r.max_staleness = p.max_staleness;
      r.drop_stale = p.drop_stale;
      r.generate_seconds = since(t);
      if (e) {
        for (auto n : e->answer_len) r.generated_tokens += n;
        r.exp = std::make_shared<const ppo::experience>(std::move(*e));
        if (print_answers_ > 0 && !p.eval && p.iteration % print_answers_ == 0) print_answers(ctx, p.iteration, *r.exp);
      }
      ctx.metric("tokens", r.generated_tokens);
      ctx.emit("rollouts", actor::payload::make("rollouts", std::move(r)));
      pending_.pop_front();
    }
  }

 private:
  ppo::ppo_settings ps_;
  std::unique_ptr<tokenizer> tok_;
  model_msg weights_;
  // Each row of t (B, P) repeated g times in place: (B·g, P), row b·g + i = row b.
  static tensor repeat_rows(const tensor& t, int64_t g) {
    const int64_t B = t.size(0);
    auto out = tensor::empty({B * g, t.size(1)}, t.type());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < g; ++i) out.rows(b * g + i, b * g + i + 1).copy_from(t.rows(b, b + 1));
    return out;
  }

  // The ids that end an answer: the tokenizer's EOS, and for a policy from a Hugging Face folder its
  // generation config's eos_token_id list, as DS-Chat's generate() and flowrun generate stop (stop_ids_for;
  // an Instruct model's <|im_end|> beside <|endoftext|> ran every rollout to max_answer_seq_len)
  const std::vector<int32_t>& stop_ids() {
    if (stops_.empty() || stops_source_ != weights_.source) {
      stops_source_ = weights_.source;
      stops_ = weights_.source.empty() ? std::vector<int32_t>{tok_->eos_id()}
                                       : stop_ids_for(weights_.source, -1, tok_->eos_id());
    }
    return stops_;
  }
  std::vector<int32_t> stops_;
  std::string stops_source_;

  std::deque<actor::payload> pending_;
  std::optional<clk::time_point> waiting_since_;  // the front batch has waited for its weights since
  // DS-Chat's --print_answers (ppo_trainer.py _generate_sequence): each row's prompt and answer of
  // every print_answers_interval-th training batch, as text (JSON-quoted: one line each)
  void print_answers(actor::node_context& ctx, int64_t iteration, const ppo::experience& e) const {
    auto quoted = [](const std::string& s) {
      return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    for (int64_t b = 0; b < e.seq.size(0); ++b) {
      const auto [prompt, answer] = ppo::rollout_row_ids(e, b);
      ctx.print(fmt::format("--- prompt --> iter={}, row={}: {}", iteration, b, quoted(tok_->decode(prompt))));
      ctx.print(fmt::format("--- ans    --> iter={}, row={}: {}", iteration, b, quoted(tok_->decode(answer))));
    }
  }

  int64_t print_answers_ = 0;  // print_answers_interval when print_answers is on, else 0
  int64_t emitted_ = 0, num_generations_ = 1;
};

void register_rollout_generator(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"rollout_generator",
                     "the hybrid engine: answers prompts with the policy's weights (live, or a snapshot with the "
                     "controller's max_staleness >= 1)"};
  k.input("prompts", "prompt_batch", "prompts to answer")
      .input("weights", "model", "the policy's model handle (or snapshot), after each update", true, true)
      .output("rollouts", "rollouts", "prompt + answer sequences", true)
      .require("tokenizer", T::path, "SentencePiece .model (EOS id)")
      .option("max_answer_seq_len", T::int_, std::int64_t{32},
              "answer tokens at most (2 or more with num_generations = 1: DS-Chat drops answers of one token)")
      .at_least(1)
      .option("temperature", T::float_, 1.0, "sampling temperature for training rollouts (held-out: greedy); the rollouts' log-probs "
              "(policy, reference, loss) are taken under logits / temperature, as TRL and veRL take them")
      .at_least(0)
      .option("top_k", T::int_, std::int64_t{0}, "top-k filter (0: off)").at_least(0)
      .option("top_p", T::float_, 1.0, "nucleus threshold (1: off)").in_range(0, 1, /*low_open=*/true)
      .option("num_generations", T::int_, std::int64_t{1},
              "answers sampled per training prompt, adjacent rows forming the prompt's group (TRL/veRL's name; "
              "GRPO and RLOO need >= 2); held-out prompts are answered once, greedily. Above 1, answers of one "
              "token are kept (a group stays whole)")
      .in_range(1, 4096)
      .because("published GRPO runs use 4-64; a larger group is most likely a typo, and 3e9 ran out of memory")
      .option("print_answers", T::bool_, false,
              "print each training row's prompt and answer as text (DS-Chat's --print_answers), every "
              "print_answers_interval-th iteration")
      .option("print_answers_interval", T::int_, std::int64_t{1},
              "print_answers: every this many iterations (DS-Chat's --print_answers_interval)")
      .at_least(1);
  // The prompt loader's token ids reach the generator, and its answers a rule reward, which decodes them, and
  // the models trained in the same graph (steps 1-2) read them too: all must read ids alike (another tokenizer on the reward scored every answer 0 without a word, and one
  // on the loader failed in the embedding at the first batch)
  // other tools' names for these settings: the hint an unknown setting of that name gets
  add_hybrid_engine_hints(k);
  for (const char* flag : {"end_of_conversation_token", "add_eot_token"})
    k.known_as(flag, "DS-Chat's end-of-conversation token is the tokenizer's EOS here: generation stops at it");
  k.known_as("n", "veRL's rollout.n is num_generations here")
      .known_as("n_samples_per_prompt", "OpenRLHF's --n_samples_per_prompt is num_generations here")
      .known_as("max_completion_length", "TRL's max_completion_length is max_answer_seq_len here")
      .known_as("response_length", "veRL's data.max_response_length is max_answer_seq_len here")
      .known_as("max_response_length", "veRL's data.max_response_length is max_answer_seq_len here")
      .known_as("max_new_tokens", "transformers' max_new_tokens is max_answer_seq_len here");
  k.check = [](const graph::node_spec& n, const graph::graph_spec& g) {
    std::vector<graph::node_kind::problem> problems;
    // the controller, the experience maker and the trainers follow one rollout batch per prompt batch, in
    // order: two generators split each batch in halves (a run at max_staleness 0 trained on half batches and
    // held out 4 prompts before and 32 after; at 1 the controller failed on a summary not in flight)
    if (n.replicas > 1)
      problems.push_back({"replicas",
                          fmt::format("node '{}': replicas = {}: step 3 rolls out each prompt batch on one generator "
                                      "(the controller, the experience maker and the trainers follow one rollout "
                                      "batch per prompt batch, in order)",
                                      n.name, n.replicas),
                          "set replicas = 1; give the generator more cores with `threads`"});
    // one answer per prompt (PPO's): DS-Chat drops training answers of at most one token, so 1 would train on nothing
    // (a group's answers are all kept: GRPO and RLOO train on one-token answers)
    if (n.get_int("max_answer_seq_len") < 2 && n.get_int("num_generations") == 1)
      problems.push_back({"max_answer_seq_len",
                          fmt::format("node '{}': max_answer_seq_len = {} with num_generations = 1: DS-Chat drops "
                                      "answers of at most one token, so 1 would train on nothing",
                                      n.name, n.get_int("max_answer_seq_len")),
                          "set max_answer_seq_len to 2 or more (DS-Chat's default is 256)"});
    // logits / T overflow a float below ~1e-6 (NaN log-probs at 1e-38; 1e-50 rounds to 0, greedy unasked)
    if (const double t = n.get_float("temperature"); t > 0 && t < 1e-6)
      problems.push_back({"temperature",
                          fmt::format("node '{}': temperature = {:g} is above 0 but below 1e-6: the logits divided by "
                                      "it overflow a float",
                                      n.name, t),
                          "use 0 for greedy rollouts, or a temperature of 0.1 or more"});
    // a prompt of max_prompt_seq_len tokens and its answer must fit the policy's context: refused here, as the
    // generator refuses it at its first batch, which comes after steps 1-2 have trained (DS-Chat pads every
    // prompt to max_prompt_seq_len and needs the sum within the model's positions too); `model` is the one the
    // node `from` sends policy.init (the init-edge loop below)
    const auto context_problems = [&](const std::string& model, const graph::node_spec& from) {
      int64_t C = 0;
      try {
        C = inspect_model(model).context;
      } catch (const std::exception&) {  // unreadable: the node's start names it
      }
      const int64_t A = n.get_int("max_answer_seq_len");
      for (const auto& pl : g.nodes) {
        if (pl.kind != "prompt_loader" || C <= 0) continue;
        const int64_t P = pl.get_int("max_prompt_seq_len");
        if (P + A <= C) continue;
        problems.push_back(
            {"max_answer_seq_len",
             fmt::format("node '{}': max_prompt_seq_len {} (node '{}') + max_answer_seq_len {} = {} exceed the "
                         "policy's context, {} positions ({}, from node '{}'): {}",
                         n.name, P, pl.name, A, P + A, C, model, from.name,
                         C - A >= 1 ? fmt::format("a prompt of more than {} tokens would stop step 3 at its batch", C - A)
                                    : std::string("the answers alone leave no room for a prompt")),
             C - P >= 2 && C - A >= 1
                 ? fmt::format("lower max_answer_seq_len to {} or max_prompt_seq_len to {}", C - P, C - A)
             : C - P >= 2 ? fmt::format("lower max_answer_seq_len to {}", C - P)
             : C - A >= 1 ? fmt::format("lower max_prompt_seq_len to {}", C - A)
                          : fmt::format("lower both, to a sum of at most {}", C)});
      }
    };
    const std::string mine = n.get_string("tokenizer");
    std::unique_ptr<tokenizer> tok;
    for (const auto& other : g.nodes) {
      // the loop's readers, and the trainers in the same graph whose models it runs (the policy from sft, the
      // reward model from rm: they read the loop's token ids as they were trained to)
      static const std::set<std::string> readers = {"prompt_loader", "reward_function", "sft_trainer", "rm_trainer",
                                                    "dpo_trainer"};
      if (!readers.count(other.kind)) continue;
      const auto* s = other.find_setting("tokenizer");
      const auto* theirs = s ? std::get_if<std::string>(&s->value) : nullptr;
      if (!theirs || theirs->empty() || *theirs == mine) continue;
      try {
        if (!tok) tok = load_tokenizer(mine);
        const std::string why = tokenizer_difference(*load_tokenizer(*theirs), *tok);
        if (!why.empty())
          problems.push_back({"tokenizer",
                              fmt::format("node '{}' reads token ids with the tokenizer {}, and node '{}' ({}) with "
                                          "{}: they differ ({})",
                                          n.name, mine, other.name, other.kind, *theirs, why),
                              "give every node of the loop the policy's tokenizer"});
      } catch (const std::exception&) {  // an unreadable tokenizer: its node's start names it
      }
    }
    // ... and the models that read them: the node that sends policy.init (reward.init, critic.init) its
    // weights (model_source, sft_trainer, dpo_trainer, rm_trainer) names each. A tokenizer with more ids than its
    // embedding failed mid-run ("embedding_forward: token id 421 ... is outside [0, 400)"); a foreign one with
    // fewer trained on another vocabulary and stopped at its EOS, which is another token to the model, without a
    // word. DS-Chat, TRL and veRL take the actor's own tokenizer.
    for (const auto& e : g.edges) {
      const auto* to = g.find_node(e.to_node);
      const auto* from = g.find_node(e.from_node);
      // the reward model and the critic score the same ids (DS-Chat step 3 feeds them the actor's tokens)
      static const std::set<std::string> scorers = {"policy", "reward_model", "critic"};
      static const std::set<std::string> sources = {"model_source", "sft_trainer", "dpo_trainer", "rm_trainer"};
      if (!to || !from || !scorers.count(to->kind) || (!e.to_port.empty() && e.to_port != "init") ||
          !sources.count(from->kind))
        continue;
      const auto* ms = from->find_setting("model");
      const auto* model = ms ? std::get_if<std::string>(&ms->value) : nullptr;
      if (!model || model->empty()) continue;
      if (const std::string why = tokenizer_model_mismatch(mine, *model); !why.empty())
        problems.push_back({"tokenizer",
                            fmt::format("node '{}' reads token ids with {} (the model of node '{}', from node '{}')",
                                        n.name, why, to->name, from->name),
                            "give every node of the loop the model's own tokenizer (for a Hugging Face folder: the "
                            "folder)"});
      if (to->kind == "policy") context_problems(*model, *from);
    }
    return problems;
  };
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new rollout_generator); });
}

// ---------------------------------------------------------------- step 3: scoring on ranks

/// Rank r of `g` runs `score` on rows micro_slice_of(B, N, r) of the rollouts `e` (a rank whose
/// share is empty runs the last row, so that its ZeRO-3 gathers match the others') and the
/// group all-gathers the results: (B, L) log-probs or values, or (B,) reward scores, on every rank.
tensor score_on_ranks(rank_group& g, const ppo::experience& e,
                      const std::function<tensor(const tensor& seq, const tensor& mask)>& score) {
  const int64_t B = e.seq.size(0), N = g.world;
  const auto m = ppo::micro_slice_of(B, N, g.rank);
  tensor mine = score(e.seq.rows(m.a, m.b), e.attention_mask.rows(m.a, m.b));  // (rows, ...) f32
  if (N == 1) return mine;
  const int64_t per_row = mine.numel() / mine.size(0), c = (B + N - 1) / N;
  auto send = tensor::zeros({c, per_row});
  if (!m.empty) send.rows(0, m.b - m.a).copy_from(mine.view({m.b - m.a, per_row}));
  auto all = tensor::empty({N * c, per_row});
  g.comm->all_gather(send, all);
  shape_t shape = mine.shape();
  shape[0] = B;
  return all.rows(0, B).clone().view(shape);
}

// ---------------------------------------------------------------- step 3: frozen scorers

/// The reference model (log-probs) or the reward model (end scores): frozen, scores each
/// rollout batch with the model it got on `init` (a copy: DS-Chat loads each role's model).
/// `replicas = N` splits each batch's rows over N ranks; `zero_stage = 3` also shards the
/// weights over them (ZeRO-3 inference: each layer gathered just before it runs, freed after),
/// as DS-Chat runs its reference and reward models when actor_/critic_zero_stage is 3.
class frozen_scorer final : public actor::node {
 public:
  explicit frozen_scorer(bool reward) : reward_(reward) {}

  void start(actor::node_context& ctx) override {
    group_ = join_rank_group(ctx);
    // a rank that refuses now fails its peers' first collective now, not at comm_timeout_s
    aborting_on_failure(group_.comm.get(), [&] {
      if (group_.local_ranks > 1) ctx.thread_budget(std::max(1, ops::hardware_threads() / group_.local_ranks));
      stage_ = static_cast<int>(ctx.spec().get_int("zero_stage"));
      const std::string dt = dtype_setting(ctx);
      precision_ = dt == "bf16" ? dtype::bf16 : dt == "fp16" ? dtype::f16 : dtype::f32;
      check_step3_settings(ctx, {"zero_stage"});  // the dtype moves every score a resume trains on; the stage not
    });
  }

  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    aborting_on_failure(group_.comm.get(), [&] { handle(ctx, port, std::move(msg)); });
  }

  void handle(actor::node_context& ctx, std::string_view port, actor::payload msg) {
    if (port == "init") {
      const auto& m = msg.as<model_msg>();
      model_ = copy_model(*m.model);
      if (m.model->has_value_head()) {
        model_->add_value_head();
        model_->w().v_head.copy_from(m.model->w().v_head);
      }
      if (reward_ && !model_->has_value_head())
        throw std::invalid_argument("node '" + ctx.name() + "': the reward model needs a value head (rm_trainer's output)");
      if (stage_ == 3) {  // the engine only partitions and gathers (in the working precision): nothing trains
        model_->set_base_trainable(false);
        zero_settings zs;
        zs.stage = 3;
        zs.precision = precision_;
        engine_ = std::make_unique<zero_engine>(*model_, *group_.comm, zs);
      } else if (precision_ != dtype::f32) {  // DS-Chat's eval engine in bf16 / fp16: the base weights rounded
        round_through(model_->w().flat, precision_);  // (the engine's rule: the adapter buffer, v_head, stays fp32)
      }
      if (group_.rank == 0)
        ctx.log().info("model ready: {} ({} rank(s), ZeRO stage {}, {})", model_->config().summary(), group_.world,
                       stage_, ctx.spec().get_string("dtype"));
    } else if (port == "rollouts") {
      pending_.push_back(msg);
    }
    while (model_ && !pending_.empty()) {
      auto r = pending_.front().shared<rollout_msg>();
      pending_.pop_front();
      ctx.phase("scoring");
      score_msg out;
      out.rollouts = r;
      if (r->exp) {
        // the reference's log-probs come from the policy's own path (sequence_logprobs), bit for bit: a
        // policy that is the reference then has a KL of exactly 0 and no KL-loss gradient. Scoring each
        // GRPO prompt once (change 26) differed by rounding (3e-8), which AdamW turned into full steps:
        // with every reward 0, the held-out KL reached 0.158 in two updates (change 39, docs/performance.md)
        // bf16: the products' inputs in bf16 too (ops::matmul_precision; fp16 computes in fp32)
        ops::matmul_precision_scope gemm(precision_ == dtype::bf16 ? ops::matmul_precision::bf16
                                                                   : ops::get_matmul_precision());
        // the answer's positions only (keep_from): the experience reads nothing before them
        const int64_t keep = r->exp->start();
        out.value = score_on_ranks(group_, *r->exp, [&](const tensor& seq, const tensor& mask) {
          return reward_ ? ppo::reward_scores(*model_, acts_, seq, mask, keep)
                         : ppo::sequence_logprobs(*model_, acts_, seq, mask, r->exp->temperature, keep);
        });
        rlhf::check_finite(out.value, fmt::format("{}, iteration {}", ctx.name(), r->iteration),
                           reward_ ? "reward_score" : "ref_logprobs");
      }
      if (group_.rank == 0) ctx.emit("scored", actor::payload::make("scores", std::move(out)));
    }
  }

  void stop(actor::node_context& ctx) override {
    if (engine_ && group_.rank == 0 && ctx.reason() == actor::stop_reason::completed)
      ctx.print(fmt::format("[step 3 ppo] {} memory {}", ctx.name(), engine_->memory().str()));
  }

 private:
  bool reward_;
  int stage_ = 0;
  dtype precision_ = dtype::f32;  // the dtype setting: the weights' working precision
  rank_group group_;
  std::shared_ptr<decoder> model_;
  std::unique_ptr<zero_engine> engine_;
  activations acts_;  // every batch's forward: reallocated only when the rollouts' shape changes
  std::deque<actor::payload> pending_;
};

void register_frozen_scorers(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  auto frozen_kind = [&](const char* name, const char* doc, bool reward) {
    graph::node_kind k{name, doc};
    k.blocking = true;  // ranks block in collectives: a thread each
    k.option("zero_stage", T::int_, std::int64_t{0},
             "0-2: every replica holds the whole model (a frozen model has no gradients or optimizer state to "
             "shard); 3: the weights are sharded over the replicas and each layer gathered when it runs "
             "(DS-Chat's reference / reward model under ZeRO-3)")
        .in_range(0, 3);
    k.option("dtype", T::string, std::string("fp32"),
             "fp32, bf16 or fp16: the weights rounded to it, and bf16 products in bf16 (DS-Chat runs the reference "
             "and reward models in its --dtype, as the policy and critic)");
    add_rank_group_settings(k);
    k.check = [](const graph::node_spec& n, const graph::graph_spec&) { return dtype_problems(n); };
    if (reward) add_padding_hint(k);
    for (const char* flag : {"offload", "offload_reference_model", "offload_reward_model"})
      k.known_as(flag, std::string("DS-Chat's --") + flag + " has no setting here: a frozen model's weights stay where "
                       "its backend runs; zero_stage = 3 over its replicas shards them");
    k.input("init", "model", "the model this node starts from (copied)")
        .input("rollouts", "rollouts", "sequences to score")
        .output("scored", "scores", reward ? "per-row reward scores" : "per-token log-probs", true);
    actor::register_node_kind(kinds, factories, k,
                              [reward] { return std::unique_ptr<actor::node>(new frozen_scorer(reward)); });
  };
  frozen_kind("reference_model", "frozen copy of the step-1 model: reference log-probs", false);
  frozen_kind("reward_model", "frozen step-2 model: the reward score at each answer's end", true);
}

// ---------------------------------------------------------------- step 3: trainers

/// The policy (old log-probs; the clipped policy loss, + ptx) or the critic (values; the
/// clipped value loss) of step 3, trained through the engine (models/train/zero.h) like every
/// trainer. `replicas = N` makes N ranks of one data-parallel group (rank_group.h): every
/// rank gets every rollout and experience batch, scores and trains on its 1/N of the rows,
/// and the gradients meet in the communicator; at actor_zero_stage / critic_zero_stage 3 the
/// ranks own 1/N of the parameters and AdamW moments. Rank 0 speaks for the group (scores,
/// stats, the generator's weights, the saved output).
class ppo_trainer final : public actor::node {
 public:
  explicit ppo_trainer(bool policy) : policy_(policy) {}

  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    const std::string who = policy_ ? "actor" : "critic";
    ps_.ppo_epochs = s.get_int("ppo_epochs");
    if (policy_) ps_.ppo.cliprange = static_cast<float>(s.get_float("cliprange"));  // each node's own clip
    else ps_.ppo.cliprange_value = static_cast<float>(s.get_float("cliprange_value"));
    ps_.per_device_training_batch_size = s.get_int("per_device_training_batch_size");
    // the engine's settings, DS-Chat's names: dschat::engine_settings is the one conversion
    d_.learning_rate = static_cast<float>(s.get_float(who + "_learning_rate"));
    d_.weight_decay = static_cast<float>(s.get_float(who + "_weight_decay"));
    d_.zero_stage = static_cast<int>(s.get_int(who + "_zero_stage"));
    d_.lora_dim = s.get_int(who + "_lora_dim");
    d_.lora_module_name = s.get_string(who + "_lora_module_name");
    d_.lora_learning_rate = static_cast<float>(s.get_float(who + "_lora_learning_rate"));
    d_.only_optimize_lora = s.get_bool("only_optimize_lora");
    d_.gradient_checkpointing = s.get_bool(who + "_gradient_checkpointing");
    d_.gradient_clipping = static_cast<float>(s.get_float("gradient_clipping"));
    d_.gradient_accumulation_steps = s.get_int("gradient_accumulation_steps");
    d_.lr_scheduler_type = s.get_string("lr_scheduler_type");
    d_.num_warmup_steps = s.get_int("num_warmup_steps");
    d_.dtype = dtype_setting(ctx);
    d_.seed = 0;  // the LoRA init: the same on every rank
    group_ = join_rank_group(ctx);
    // a rank that refuses now (a resume whose settings changed) fails its peers' first collective now
    aborting_on_failure(group_.comm.get(), [&] { start_ranked(ctx); });
  }

  // start() once this replica has joined its rank group
  void start_ranked(actor::node_context& ctx) {
    const auto& s = ctx.spec();
    const std::string who = policy_ ? "actor" : "critic";
    if (group_.local_ranks > 1) ctx.thread_budget(std::max(1, ops::hardware_threads() / group_.local_ranks));
    if (const auto& p = s.get_string("deepspeed_config"); !p.empty()) {
      const auto c = load_node_ds_config(ctx, p, group_.world, group_.rank == 0);
      const dschat::dschat_settings own = d_;
      dschat::apply_ds_config(d_, c);
      if (group_.rank == 0) warn_json_overrides(ctx, own, d_, c.where, who + "_");
      if (group_.rank == 0) warn_scheduler_replaced(ctx, c);
      ds_where_ = c.where;
      // "auto" (HF Trainer's word) for the scheduler's length: the run's updates, once known (plan_schedule)
      ds_total_auto_ = c.filled_auto("scheduler.params.total_num_steps");
    }
    check_settings_before_steps(ctx);
    if (policy_) {
      ps_.policy.clip_ratio_c = s.get_float("clip_ratio_c");
      ps_.policy.clip_ratio_high = s.get_float("clip_ratio_high");
      ps_.policy.loss_agg_mode = rlhf::parse_loss_agg_mode(s.get_string("loss_agg_mode"));
      ps_.policy.use_kl_loss = s.get_bool("use_kl_loss");
      ps_.policy.kl_loss_coef = s.get_float("kl_loss_coef");
      ps_.policy.kl_loss_type = rlhf::parse_kl_estimator(s.get_string("kl_loss_type"));
      ps_.policy.behav_imp_weight_cap = s.get_float("behav_imp_weight_cap");
      ps_.enable_ema = s.get_bool("enable_ema");
      ps_.unsup_coef = static_cast<float>(s.get_float("unsup_coef"));
      if (const auto& u = s.get_string("unsup_data"); !u.empty()) {  // ptx: DS-Chat's unsupervised mixing
        if (s.get_string("tokenizer").empty())
          throw std::invalid_argument("node '" + ctx.name() + "': unsup_data needs the tokenizer setting");
        unsup_tok_ = load_tokenizer(resolve_user_path(s.get_string("tokenizer"), "tokenizer").string());
        unsup_ = std::make_unique<lm_dataset>(resolve_user_path(u, "unsup_data").string(), *unsup_tok_,
                                              s.get_int("unsup_seq_len"));
        auto seed = tensor::empty({1}, dtype::i64);  // every rank draws the same ptx rows: rank 0's seed
        seed.data<int64_t>()[0] = static_cast<int64_t>(ctx.seed());
        group_.comm->broadcast(seed, 0);
        unsup_->set_seed(static_cast<uint64_t>(seed.data<int64_t>()[0]));
      }
    }
  }

  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    aborting_on_failure(group_.comm.get(), [&] { handle(ctx, port, std::move(msg)); });
  }

  // The work goes in trainer_order's sequence (actors/trainer_order.h): what arrived decides it,
  // not when, so the ranks of the group run the same collectives in the same order.
  void handle(actor::node_context& ctx, std::string_view port, actor::payload msg) {
    if (port == "init") {
      init(ctx, msg.as<model_msg>());
    } else if (port == "rollouts") {
      rolled_out_ = true;
      const auto& r = msg.as<rollout_msg>();
      order_.rollouts_arrived(r.iteration, r.eval, msg);
    } else if (port == "train") {
      order_.experience_arrived(msg.as<experience_batch>().iteration, msg);
    }
    using work = trainer_order<actor::payload>::work;
    for (auto w = order_.next(); engine_.engine && w != work::none; w = order_.next()) {
      const actor::payload m = order_.take(w);
      if (w == work::train) {
        const auto xb = m.shared<experience_batch>();
        if (!xb->items.empty())
          train(ctx, *xb);
        else if (xb->checkpoint)  // the last iteration trained nothing: its due save, and a report
          save_untrained(ctx, *xb);
        // else empty: dropped, or kept for generation_batches > 1
      } else {
        auto r = m.shared<rollout_msg>();
        if (!r->eval) plan_schedule(ctx, *r);  // before the first update: its learning rate is the schedule's
        if (r->exp) check_plan(ctx, r->exp->seq.size(1));  // before anything is trained on rows this long
        score(ctx, r);
      }
    }
  }

  void stop(actor::node_context& ctx) override {
    // SIGINT: say what is kept (before step 3's first rollout, the step that ran says it)
    if (policy_ && speaks() && ctx.reason() == actor::stop_reason::interrupted && rolled_out_) {
      const auto rp = ctx.checkpoint_dir().empty() ? std::nullopt : ppo::find_step3_resume(ctx.checkpoint_dir());
      if (rp)
        ctx.print(fmt::format("[step 3 ppo] interrupted: the last committed checkpoint is after iteration {} in {}; "
                              "the same command resumes there",
                              rp->point.iteration - 1, ctx.checkpoint_dir()));
      else if (ctx.checkpoint_dir().empty())
        ctx.print("[step 3 ppo] interrupted: no checkpoint was saved, nothing of step 3 is kept (set [graph] "
                  "checkpoint_dir: a drain then commits the last trained iteration, and the controller's "
                  "save_checkpoint_steps keeps commits through a crash too)");
      else
        ctx.print(fmt::format("[step 3 ppo] interrupted before step 3's first commit in {}: nothing of step 3 is "
                              "kept (a drain commits the last trained iteration, none here; the controller commits "
                              "every save_checkpoint_steps iterations)",
                              ctx.checkpoint_dir()));
    }
    if (!engine_.engine || ctx.reason() != actor::stop_reason::completed) return;
    report_schedule_end(ctx);
    if (speaks())  // DeepSpeed's see_memory_usage split, rank 0's (docs/zero.md)
      ctx.print(fmt::format("[step 3 ppo] {} memory {}", ctx.name(), engine_.engine->memory().str()));
    // the EMA's pieces whole (a collective: every rank) before the engine goes
    const bool save_ema = policy_ && ps_.enable_ema && !ctx.spec().get_string("ema_output").empty();
    const tensor ema_base = save_ema && ema_.defined() ? engine_.engine->gather_owned(ema_) : tensor();
    engine_.finish();  // every rank: at stage 3 the parameters are gathered
    if (group_.rank == 0) save_output(ctx, "[step 3 ppo]", *model_, format_, tokenizer_, source_);
    if (group_.rank == 0 && save_ema) save_ema_output(ctx, ema_base);
  }

 private:
  bool speaks() const { return group_.rank == 0; }

  /// enable_ema: the EMA one step towards the actor as it is now, ema = beta ema + (1 - beta) actor
  /// (DeepSpeed-Chat's moving_average, torch.lerp), on this rank's pieces of the base and the adapter.
  void ema_step() {
    if (ema_.defined()) rlhf::ema_update(ema_, engine_.engine->owned_params(), ps_.ema_beta);
    if (ema_adapter_.defined()) rlhf::ema_update(ema_adapter_, engine_.engine->adapter_params(), ps_.ema_beta);
  }

  /// DS-Chat's actor_ema: the EMA (ema_base, the full base; undefined where the base was frozen, which
  /// is then its own EMA; the adapter's from ema_adapter_) as a model, saved to ema_output as the
  /// actor is to output, LoRA merged into an HF folder or a llama2.c file; with verify_output, reloaded and
  /// compared as the actor's output is (save_output). Rank 0, after finish().
  void save_ema_output(actor::node_context& ctx, const tensor& ema_base) {
    decoder e(model_->config());
    e.w().flat.copy_from(ema_base.defined() ? ema_base : model_->w().flat);
    if (model_->has_lora()) {
      e.enable_lora(model_->lora(), /*freeze_base=*/false);
      if (e.w().adapter_flat.numel() != ema_adapter_.numel())
        throw std::logic_error("node '" + ctx.name() + "': the EMA's adapter does not fit the actor's");
      e.w().adapter_flat.copy_from(ema_adapter_);
    }
    const auto& out = ctx.spec().get_string("ema_output");
    save_model(e, out, format_, tokenizer_, source_);
    // verify_output checks the EMA's file as save_output checks the actor's
    const std::string verified = ctx.spec().get_bool("verify_output")
                                     ? fmt::format("; reloaded: max |output difference| {:.3g}", reload_max_diff(e, out))
                                     : std::string();
    ctx.print(fmt::format("[step 3 ppo] the actor's EMA (beta {}) saved to {}{}", ps_.ema_beta, out, verified));
  }

  void init(actor::node_context& ctx, const model_msg& m) {
    if (policy_) {  // saved as given (checked at validation too): refused before training
      check_output(ctx, {m.format, m.model->config().family, false}, false);
      check_output(ctx, {m.format, m.model->config().family, false}, false, "ema_output");
      format_ = saved_format(m.format, false);
      const auto& t = ctx.spec().get_string("tokenizer");
      tokenizer_ = t.empty() ? m.tokenizer : resolve_user_path(t, "tokenizer").string();
      source_ = m.source;
    } else if (!m.model->has_value_head()) {
      throw std::invalid_argument("node '" + ctx.name() + "': the critic starts from a model with a value head "
                                  "(the reward model of step 2)");
    } else {  // the critic saves as the reward model it got was saved: a folder with its value head
      check_output(ctx, {m.format, m.model->config().family, true}, true);
      format_ = saved_format(m.format, true);
      tokenizer_ = m.tokenizer;
      source_ = m.source;
    }
    // the model's own tokenizer path is the sender's: on another cluster node it may be missing
    if (format_ == model_format::hf && !tokenizer_.empty() && !ctx.spec().get_string("output").empty() &&
        !std::filesystem::exists(tokenizer_))
      throw std::invalid_argument("node '" + ctx.name() + "': the tokenizer of the model it got, " + tokenizer_ +
                                  ", is not on this machine, so it cannot be copied beside the output" +
                                  (policy_ ? ": set the policy's tokenizer setting to a copy here"
                                           : ": copy it there, or leave the critic's output unset"));
    // ptx rows of unsup_seq_len tokens run through the policy: refused now, before any update (the first ptx
    // step failed mid-iteration in decoder::forward)
    if (unsup_ && ctx.spec().get_int("unsup_seq_len") > m.model->config().max_seq_len)
      throw std::invalid_argument(fmt::format("node '{}': unsup_seq_len = {} exceeds the policy's context, max_seq_len "
                                              "{}: lower unsup_seq_len to at most {}",
                                              ctx.name(), ctx.spec().get_int("unsup_seq_len"),
                                              m.model->config().max_seq_len, m.model->config().max_seq_len));
    init_weights_ = weights_fingerprint(*m.model);  // recorded in the checkpoints, checked on resume
    // the step-1/2 outputs are copied: each role owns its model (DS-Chat loads them separately)
    model_ = copy_model(*m.model);
    if (m.model->has_value_head()) {
      model_->add_value_head();
      model_->w().v_head.copy_from(m.model->w().v_head);
    }
    dschat::apply_lora(*model_, d_);
    model_->set_gradient_checkpointing(d_.gradient_checkpointing);
    check_plan(ctx, 1);  // the engine's state, before it is allocated; the rows' length comes with the rollouts
    engine_.make(*model_, d_, 1, group_.comm.get());
    engine_.schedule = lr_schedule{};  // base lr until the first training rollouts give the run's length (plan_schedule)
    if (ps_.enable_ema && model_->base_trainable())
      ema_ = engine_.engine->owned_params();  // this rank's pieces (ZeRO-3: DS-Chat's EMA is sharded too)
    if (ps_.enable_ema && model_->num_adapter_parameters() > 0)
      ema_adapter_ = engine_.engine->adapter_params().clone();  // on the host it is the live buffer itself
    if (ps_.enable_ema && ctx.spec().get_string("ema_output").empty() && speaks())
      ctx.log().info("enable_ema: the EMA is kept in the checkpoints; set ema_output to save it at the end "
                     "(DS-Chat's actor_ema)");
    if (const auto rp = ppo::find_step3_resume(ctx.checkpoint_dir())) restore(ctx, rp->point.iteration);
    // a snapshot: the generator may run while the first update trains (max_staleness >= 1); with
    // max_staleness = 0 it is released after the first update, which publishes the live model
    if (policy_) publish_weights(ctx, /*snapshot=*/true);
    if (speaks())
      ctx.log().info("model ready: {} ({} rank(s), ZeRO stage {}, {})", model_->config().summary(), group_.world,
                     d_.zero_stage, d_.dtype);
  }

  // The memory plan (check_memory_plan, the trainers' one planner) of this rank for rows of T
  // tokens: micro-batches of per_device_training_batch_size / (ranks x gradient_accumulation_steps)
  // rows (rounded up, as micro_slice_of cuts them); the policy's losses (PPO, ptx) give a float
  // dlogits beside the logits, the critic's dvalues. Checked at init (T = 1: the engine's state)
  // and before scoring every rollout batch longer than any before it, so before any training on it.
  void check_plan(actor::node_context& ctx, int64_t T) {
    if (T <= planned_T_) return;
    planned_T_ = T;
    const int64_t parts = static_cast<int64_t>(group_.world) * d_.gradient_accumulation_steps;
    memory_plan plan;
    plan.micro_batch = std::max<int64_t>(1, (ps_.per_device_training_batch_size + parts - 1) / parts);
    plan.seq_len = unsup_ ? std::max(T, ctx.spec().get_int("unsup_seq_len")) : T;
    plan.world_size = group_.world;
    plan.stage = d_.zero_stage;
    plan.precision = dschat::engine_settings(*model_, d_).precision;
    plan.dout = policy_ ? memory_plan::loss_grad::dlogits : memory_plan::loss_grad::dvalues;
    plan.keep_rows = true;  // scoring and updates keep the answer's rows (ppo::actor_batch_loss)
    const std::string who = policy_ ? "actor" : "critic";
    const memory_report est = check_memory_plan(
        ctx, *model_, plan, group_.local_ranks,
        {"per_device_training_batch_size", "max_prompt_seq_len + max_answer_seq_len" + std::string(unsup_ ? " (or unsup_seq_len)" : ""),
         who + "_zero_stage", who + "_lora_dim", who + "_gradient_checkpointing"});
    if (speaks()) ctx.log().info("memory plan for {} x {} tokens per micro-batch: {}", plan.micro_batch, plan.seq_len, est.str());
  }

  // The learning-rate schedule (DS-Chat's step 3: rlhf_engine.py hands each of the actor and the
  // critic transformers.get_scheduler(lr_scheduler_type, num_warmup_steps, num_total_iters); a
  // DeepSpeed JSON's scheduler section wins, as there). The run's updates, planned from the first
  // training rollouts: iterations x ppo_epochs x the mini-batches of a generation batch's rows,
  // ceil(rows / per_device_training_batch_size), as train() cuts them (DS-Chat's main.py:
  // len(prompt_train_dataloader) x generation / training batch x ppo_epochs, its
  // gradient_accumulation_steps counting micro-batches where flowrun's mini-batch is one update).
  // Rows dropped later (short answers, stale items) make fewer updates: the schedule then ends
  // early, as DS-Chat's, planned from the loader's length, does.
  void plan_schedule(actor::node_context& ctx, const rollout_msg& r) {
    if (r.iterations <= 0 || r.generated_rows <= 0) return;  // a source that does not say: the base rate
    const int64_t mb = ps_.per_device_training_batch_size;
    const int64_t per_iteration = ps_.ppo_epochs * ((r.generated_rows + mb - 1) / mb);
    const int64_t total = r.iterations * per_iteration;
    if (total == planned_updates_) return;
    const bool first = planned_updates_ == 0;
    planned_updates_ = total;
    engine_.schedule = dschat::schedule_from(d_, total);
    if (ds_total_auto_) engine_.schedule.total_num_steps = total;
    if (!speaks() || !scheduled()) return;
    const std::string who = policy_ ? "actor" : "critic";
    const lr_schedule& sc = engine_.schedule;
    const std::string plan = fmt::format("{} updates ({} iterations x {} ppo_epochs x {} mini-batches of {} rows)",
                                         total, r.iterations, ps_.ppo_epochs, per_iteration / ps_.ppo_epochs, mb);
    if (first && d_.ds_scheduler.type.empty())
      ctx.print(fmt::format("[step 3 ppo] {}: learning rate {} over {}, {} warmup updates, peak {}_learning_rate "
                            "{:.2e}; the next update's {:.2e}",
                            ctx.name(), sc.type, plan, sc.warmup_num_steps, who, d_.learning_rate,
                            sc.lr_at(lr_steps_, d_.learning_rate)));
    else if (first)  // DeepSpeed's own: its peak and warmup are the JSON's (warmup_max_lr, max(2, warmup_num_steps))
      ctx.print(fmt::format("[step 3 ppo] {}: learning rate {} of {}{} over this run's {}; the next update's {:.2e}",
                            ctx.name(), sc.type, ds_where_,
                            sc.type == "WarmupLR" ? std::string()
                            : ds_total_auto_      ? " (total_num_steps \"auto\": the run's updates)"
                                                  : fmt::format(" (total_num_steps {})", sc.total_num_steps),
                            plan, sc.lr_at(lr_steps_, d_.learning_rate)));
    else  // the rows per batch changed within the run: rare (a generator whose num_generations differs)
      ctx.log().warn("the run's updates are now planned at {}: the learning rate follows the new plan", total);
    if (saved_plan_ > 0 && saved_plan_ != total)  // a resume with more iterations
      ctx.log().warn("the checkpoint's schedule spanned {} updates and this run's spans {} (iterations changed): "
                     "the learning rate continues at update {} of the new one ({:.2e})",
                     saved_plan_, total, lr_steps_, sc.lr_at(lr_steps_, d_.learning_rate));
    if (const std::string past = sc.past_end(total, d_.learning_rate); !past.empty())
      ctx.log().warn("{} updates but {}, as in DeepSpeed; set scheduler.params.total_num_steps to {} in {}", total,
                     past, total, ctx.spec().get_string("deepspeed_config"));
    else if (const std::string warm = sc.all_warmup(total, d_.learning_rate); !warm.empty())
      ctx.log().warn("{} of {}_learning_rate (DS-Chat's scripts warm up over 100 updates of a far longer run); "
                     "lower num_warmup_steps", warm, who);
  }
  // The end of a scheduled run whose updates were fewer than planned (rows dropped: short answers,
  // DAPO's filter_groups, stale items): the schedule stopped short of its end, said with the rate
  // the last update ran at (DS-Chat plans from the loader's length alike, and says nothing).
  void report_schedule_end(actor::node_context& ctx) const {
    if (!speaks() || !scheduled() || planned_updates_ == 0 || lr_steps_ >= planned_updates_) return;
    const double last = engine_.schedule.lr_at(std::max<int64_t>(0, lr_steps_ - 1), d_.learning_rate);
    ctx.print(fmt::format("[step 3 ppo] {}: {} of the {} updates the learning-rate schedule was planned over were "
                          "applied (the others' rows were dropped: short answers, filter_groups, staleness, or "
                          "fp16 overflows), so it stopped short of its end: the last update ran at {:.2e}, {:.0f}% "
                          "of {}_learning_rate",
                          ctx.name(), lr_steps_, planned_updates_, last, 100.0 * last / d_.learning_rate,
                          policy_ ? "actor" : "critic"));
  }

  // Whether the learning rate moves over the run (the planned schedule is not a constant one).
  bool scheduled() const { return !engine_.schedule.constant(); }

  // The hybrid engine: the generator reads the policy's current weights. Below stage 3 rank 0's
  // model holds them all (a handle, no copy), or with `snapshot` (max_staleness >= 1, when the
  // generator runs while this trains) a copy made here, between updates (take_snapshot). At
  // stage 3 every rank gathers the blocks once per update (DS-Chat's hybrid engine gathers the
  // ZeRO-3 partitions to generate) into a model that lives until the generator has used it
  // (a snapshot too); the bytes moved are counted.
  void publish_weights(actor::node_context& ctx, bool snapshot) {
    std::shared_ptr<decoder> gen = model_;
    gather_bytes_ = snapshot_bytes_ = 0;
    if (d_.zero_stage == 3) {
      snapshot = true;
      const int64_t b0 = group_.comm->stats().bytes_sent;
      // a collective: every rank; the weights the forwards use (bf16-rounded in a bf16 model, gathered
      // in bf16), as below stage 3 the generator reads the working copy
      tensor full = engine_.engine->gather_full_params(/*exact=*/false);
      gather_bytes_ = group_.comm->stats().bytes_sent - b0;
      if (speaks()) {
        gen = std::make_shared<decoder>(model_->config());
        gen->w().flat.copy_from(full);
        if (model_->has_lora()) {
          gen->enable_lora(model_->lora(), false);
          gen->w().adapter_flat.copy_from(model_->w().adapter_flat);
        }
      }
    }
    if (d_.zero_stage != 3 && snapshot && speaks()) gen = take_snapshot();
    if (speaks())
      ctx.emit("weights", actor::payload::make("model", model_msg{gen, version_, format_, tokenizer_, snapshot, source_}));
  }

  // A copy of the weights for the generator, double-buffered: into one of two buffers that no one
  // else holds (the generator has let it go: it takes up a newer one between batches), else into
  // a new one. Made on this thread between updates, so the generator never reads weights an
  // optimizer step writes. Counts the bytes copied (snapshot_bytes_).
  std::shared_ptr<decoder> take_snapshot() {
    std::shared_ptr<decoder> buf;
    for (const auto& b : snapshots_)
      if (b.use_count() == 1) {
        // the generator's release of it (an acq_rel decrement) happens before the writes below
        std::atomic_thread_fence(std::memory_order_acquire);
        buf = b;
        break;
      }
    if (!buf) {
      buf = std::make_shared<decoder>(model_->config(), model_->dev());  // where the generator runs today
      if (model_->has_lora()) buf->enable_lora(model_->lora(), false);
      if (snapshots_.size() < 2)
        snapshots_.push_back(buf);
      else
        snapshots_[static_cast<size_t>(version_ % 2)] = buf;  // the other stays with its holder until it lets go
    }
    buf->w().flat.copy_from(model_->w().flat);
    snapshot_bytes_ = buf->w().flat.numel() * static_cast<int64_t>(dtype_size(buf->w().flat.type()));
    if (model_->has_lora()) {
      buf->w().adapter_flat.copy_from(model_->w().adapter_flat);
      snapshot_bytes_ += buf->w().adapter_flat.numel() * static_cast<int64_t>(dtype_size(buf->w().adapter_flat.type()));
    }
    return buf;
  }

  // Rank r scores its rows, the group all-gathers them: (B, L) log-probs or values. The forward
  // runs in the engine's activations, so that the first update on these rows can take it over
  // (train: ppo::actor_update's `scored`) instead of running the same forward again.
  void score(actor::node_context& ctx, const std::shared_ptr<const rollout_msg>& r) {
    ctx.phase("scoring");
    score_msg out;
    out.rollouts = r;
    if (r->exp) {
      // the precision of the update whose forward this stands for (bf16 products in a bf16 model)
      ops::matmul_precision_scope gemm(engine_.engine->compute_precision());
      // at the answer's positions (keep_from), as the update's forward (ppo::actor_batch_loss) runs
      const int64_t keep = r->exp->start();
      out.value = score_on_ranks(group_, *r->exp, [&](const tensor& seq, const tensor& mask) {
        activations& a = engine_.engine->forward_activations();
        return policy_ ? ppo::sequence_logprobs(*model_, a, seq, mask, r->exp->temperature, keep)
                       : ppo::sequence_values(*model_, a, seq, mask, keep);
      });
      scored_ = r->exp->seq.raw();
      rlhf::check_finite(out.value, fmt::format("{}, iteration {}", ctx.name(), r->iteration),
                         policy_ ? "logprobs" : "values");
    }
    if (policy_) scored_with_[r->iteration] = version_;  // train() reuses them while the weights are these
    if (speaks()) ctx.emit("scored", actor::payload::make("scores", std::move(out)));
  }

  void train(actor::node_context& ctx, const experience_batch& xb) {
    ctx.phase("training");
    auto t = clk::now();
    stats_msg st;
    st.iteration = xb.iteration;
    const bool async = xb.max_staleness > 0;
    if (!async) snapshots_.clear();  // the synchronous loop hands the generator the live model
    // max_staleness >= 1: an item's staleness is this trainer's version (its updates so far: the
    // policy's and the critic's agree) minus the version it was sampled with; with
    // staleness_policy = "drop" the items staler than max_staleness are left out
    std::vector<int64_t> sampled_with;
    for (const auto& x : xb.items) sampled_with.push_back(x.policy_version);
    std::vector<const experience_msg*> items;
    for (size_t i : ppo::fresh_items(sampled_with, version_, xb.max_staleness, xb.drop_stale, st.staleness))
      items.push_back(&xb.items[i]);
    st.stale_dropped = static_cast<int64_t>(xb.items.size() - items.size());
    // Decoupled PPO (AReaL): the proximal log-probs are the policy's log-probs with the weights
    // at the start of this update; the generator's behaviour log-probs weight each token. The
    // log-probs this node scored the rollouts with (the experience's `logprobs`) are those when
    // no update came between the scoring and now (counted: proximal_reused), else they are
    // computed again here (proximal_recomputed). With trainer_order the policy scores a batch
    // only after the update before it, so they are always reused; the check stays, so that no
    // order of work can train on log-probs of other weights.
    std::vector<std::shared_ptr<const ppo::experience>> exps;
    for (const auto* x : items) {
      const auto at = scored_with_.find(x->iteration);
      const bool current = at != scored_with_.end() && at->second == version_;
      if (!(policy_ && async) || current) {
        if (policy_ && async) ctx.metric("proximal_reused");
        exps.push_back(x->exp);
        continue;
      }
      auto e = std::make_shared<ppo::experience>(*x->exp);  // tensor handles
      ctx.metric("proximal_recomputed");
      ctx.phase("proximal_logprobs");
      ops::matmul_precision_scope gemm(engine_.engine->compute_precision());
      e->logprobs = score_on_ranks(group_, *e, [&](const tensor& seq, const tensor& mask) {
        return ppo::sequence_logprobs(*model_, engine_.engine->forward_activations(), seq, mask, e->temperature,
                                      e->start());
      });
      exps.push_back(std::move(e));
      ctx.phase("training");
    }
    for (const auto& x : xb.items) scored_with_.erase(x.iteration);
    ps_.policy.decoupled = policy_ && async;
    const int64_t mb = ps_.per_device_training_batch_size;
    double loss_sum = 0;
    int64_t updates = 0, tokens = 0;
    for (const auto* x : items) tokens += x->exp->seq.numel();
    for (int64_t ep = 0; ep < ps_.ppo_epochs * static_cast<int64_t>(items.size()); ++ep) {
      const auto& x = *items[static_cast<size_t>(ep) % items.size()];  // ppo_epochs passes over the batches
      const auto& e = *exps[static_cast<size_t>(ep) % items.size()];
      const int64_t B = e.seq.size(0);
      for (int64_t a = 0; a < B; a += mb) {  // DS-Chat: one train_rlhf per mini-batch of the experience
        const int64_t b = std::min(B, a + mb);
        const ppo::experience sub = ppo::slice_rows(e, a, b);
        // the synchronous loop's first update on the batch this trainer scored last: the weights
        // are those it scored with, so the engine's activations may hold this forward already
        // (the loss checks that they are of these very rows). Not at stage 3, where a forward
        // gathers each block: ranks on other cluster nodes get copies of the batches (other
        // memory), so they would run the forward and its gathers while rank 0 skips them
        const bool scored = !async && updates == 0 && e.seq.raw() == scored_ && d_.zero_stage != 3;
        // DS-Chat's step 3: transformers.get_scheduler over the run's updates, stepped by each applied one
        // (plan_schedule); the ptx step (its own optimizer step after the update, as DS-Chat's train_unsupervised)
        // runs at the update's rate
        const double lr = engine_.schedule.lr_at(lr_steps_, d_.learning_rate);
        st.lr = lr;
        step_result r;
        try {
        if (policy_) {
          r = ppo::actor_update(*engine_.engine, sub, x.advantages.rows(a, b), ps_, lr, scored);
          if (unsup_) {  // DS-Chat train_unsupervised: unsup_coef x LM loss, its own optimizer step
            tensor ids, tg;
            unsup_->next_batch(b - a, ids, tg);
            st.unsup_loss = ppo::ptx_update(*engine_.engine, ids, tg, ps_, lr).loss;
          }
          ema_step();  // DS-Chat: moving_average after each train_rlhf (and its ptx step), skipped or not
        } else {
          r = ppo::critic_update(*engine_.engine, sub, x.returns.rows(a, b), ps_, lr, scored);
        }
        } catch (const std::runtime_error& err) {  // non-finite: nothing was updated, nothing is saved
          throw std::runtime_error(fmt::format("node '{}', iteration {}, mini-batch rows [{}, {}): {}", ctx.name(),
                                               x.iteration, a, b, err.what()));
        }
        loss_sum += r.loss;
        st.grad_norm = r.grad_norm;
        if (!r.skipped) ++lr_steps_;  // DeepSpeed steps its scheduler only after an applied update
        ++updates;
      }
    }
    scored_ = nullptr;  // the activations hold a training forward now
    st.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, updates));
    st.scheduled = scheduled();
    engine_.report_overflows(ctx, fmt::format("[step 3 ppo] {}, iteration {}:", ctx.name(), xb.iteration));
    // what reached the optimizer and what did not (the console; the drop policy's end-to-end test)
    ctx.metric("optimizer_steps", updates);
    ctx.metric("experience_trained", static_cast<int64_t>(items.size()));
    if (st.stale_dropped > 0) ctx.metric("experience_dropped", st.stale_dropped);
    st.updated = !items.empty();  // else every item was too stale: nothing trained, the weights unchanged
    if (st.updated) {
      const memory_report mem = engine_.engine->memory();
      ctx.memory({{"params", mem.param_bytes}, {"gathered_peak", mem.gathered_peak_bytes}, {"grads", mem.grad_bytes},
                  {"optimizer", mem.optimizer_bytes}, {"activations", mem.activation_bytes}});
      ++version_;
      ctx.metric("policy_version", 1);
    }
    st.policy_version = version_;
    if (xb.checkpoint && !ctx.checkpoint_dir().empty()) save(ctx, xb.iteration + 1);
    if (policy_ && st.updated) {
      publish_weights(ctx, /*snapshot=*/async);
      st.snapshot_bytes = snapshot_bytes_;
      st.gather_bytes = gather_bytes_;
      if (d_.zero_stage == 3)
        for (const auto& blk : model_->param_blocks())
          st.gather_theory_bytes += (group_.world - 1) * ((blk.numel() + group_.world - 1) / group_.world) *
                                    static_cast<int64_t>(dtype_size(engine_.engine->settings().precision));
    }
    st.seconds = since(t);
    st.tokens = tokens * ps_.ppo_epochs;
    ctx.metric("tokens", st.tokens);
    if (speaks()) ctx.emit("stats", actor::payload::make("stats", st));
  }

  // The run's last iteration trained nothing (summary_msg::saves): the save due with it, then the report the
  // controller waits for before it commits (updated = false: the weights are those of the last update).
  void save_untrained(actor::node_context& ctx, const experience_batch& xb) {
    if (!ctx.checkpoint_dir().empty()) save(ctx, xb.iteration + 1);
    stats_msg st;
    st.iteration = xb.iteration;
    st.updated = false;
    st.policy_version = version_;
    if (speaks()) ctx.emit("stats", actor::payload::make("stats", st));
  }

  // ---- step-3 checkpoints (models/rlhf/ppo_checkpoint.h): CHECKPOINT_DIR/NAME/step_J

  // Settings a resume may change (where ranks meet, how they shard, what is printed or saved
  // at the end); the optimizer, the losses, LoRA and the ptx data may not.
  static const std::set<std::string>& safe_to_change() {
    static const std::set<std::string> safe = {"actor_zero_stage", "critic_zero_stage", "actor_gradient_checkpointing",
                                               "critic_gradient_checkpointing", "output", "ema_output", "verify_output",
                                               "memory_limit_gb"};
    return safe;
  }

  std::string folder(const actor::node_context& ctx) const {
    return (std::filesystem::path(ctx.checkpoint_dir()) / ctx.name()).string();
  }
  std::string config_hash() const { return trainer_config_hash(*model_); }

  // Every rank writes its pieces (fp32 master, AdamW moments, EMA); rank 0 the replicated
  // adapter / value head; then the folder's commit (the controller commits the iteration).
  void save(actor::node_context& ctx, int64_t iteration) {
    auto& eng = *engine_.engine;
    shard_manifest m;
    m.step = iteration;
    m.world_size = group_.world;
    m.rank = group_.rank;
    m.config_hash = config_hash();
    if (unsup_) {
      m.data_epoch = unsup_->epoch();
      m.data_cursor = unsup_->cursor();
    }
    const uint64_t rng = model_->rng_state();
    m.rng_state.resize(sizeof rng);
    std::memcpy(m.rng_state.data(), &rng, sizeof rng);
    m.extra["policy_version"] = version_;
    m.extra["lr_steps"] = lr_steps_;               // the schedule's position: updates applied
    m.extra["lr_total_updates"] = planned_updates_;  // what it was planned over (0: not yet)
    m.extra["settings"] = settings_record(ctx.spec(), safe_to_change());
    m.extra["init_weights"] = init_weights_;
    std::vector<shard_group> groups = engine_state_groups(eng, *model_, group_.rank, m);
    for (auto& g : groups) {  // the EMA beside the master it follows: its pieces, the adapter on rank 0 only
      if (g.name == "base" && ema_.defined()) g.tensors["ema"] = ema_.clone();
      if (g.name == "adapter" && ema_adapter_.defined())
        g.tensors["ema"] = group_.rank == 0 ? ema_adapter_.clone() : tensor::empty({0});
    }
    for (const auto& g : groups)  // never a non-finite state over the last good checkpoint
      for (const auto& [name, t] : g.tensors)
        rlhf::check_finite(t, fmt::format("{}, checkpoint of iteration {}", ctx.name(), iteration), g.name + "." + name);
    save_shard(folder(ctx), m, groups);
    group_.comm->barrier();  // every shard on disk before the folder's commit
    if (group_.rank == 0) commit_checkpoint(folder(ctx), iteration, group_.world, /*keep=*/0);  // the controller prunes
    group_.comm->barrier();
  }

  // A resume with changed settings, refused at the job's start: restore() refused it only once the model
  // came, after steps 1 and 2 had trained again where their outputs were gone. Reads the manifest of the
  // checkpoint's rank 0 (restore() checks again, with the weights' fingerprint and the config hash).
  void check_settings_before_steps(actor::node_context& ctx) const {
    const auto rp = ppo::find_step3_resume(ctx.checkpoint_dir());
    if (!rp) return;
    const std::filesystem::path f = std::filesystem::path(folder(ctx)) / step_folder_name(rp->point.iteration);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(f, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("shard_00000-of-", 0) != 0 || e.path().extension() != ".msgpack") continue;
      const shard_manifest m = read_shard_manifest(e.path().string());
      check_resume_settings(ctx, m.extra.value("settings", nlohmann::json()), f.string(), safe_to_change(),
                            "delete " + ctx.checkpoint_dir() + " to start step 3 afresh");
      return;
    }
  }

  // Load iteration J's shards (any world size and stage: the buffers are reassembled whole).
  void restore(actor::node_context& ctx, int64_t iteration) {
    const std::string f = (std::filesystem::path(folder(ctx)) / step_folder_name(iteration)).string();
    const auto ck = load_checkpoint(f);
    const auto& m0 = ck.manifests.at(0);
    // (the settings were compared with this checkpoint's at start: check_settings_before_steps)
    if (m0.config_hash != config_hash())
      throw std::runtime_error("node '" + ctx.name() + "': checkpoint " + f +
                               " was made for another model, LoRA or value-head setting (config hash differs): "
                               "use another [graph] checkpoint_dir, or delete it to start step 3 afresh");
    // No setting shows that the model this node starts from changed (step 1 or 2 retrained since,
    // or another file under the same name): its weights' fingerprint does. A record without one
    // (an older checkpoint) is accepted.
    if (const std::string was = m0.extra.value("init_weights", std::string()); !was.empty() && was != init_weights_)
      throw std::runtime_error(fmt::format(
          "node '{}': checkpoint {} continues from other initial weights than the model this node got now "
          "(fingerprint {} then, {} now): the {} it starts from changed since, e.g. retrained with other "
          "settings; delete {} to start step 3 afresh, or give it the model it was trained from",
          ctx.name(), f, was, init_weights_, policy_ ? "step-1 model" : "step-2 reward model", ctx.checkpoint_dir()));
    auto& eng = *engine_.engine;
    restore_engine_state(eng, ck);
    if (const tensor e = checkpoint_tensor(ck, "base", "ema"); e.defined() && ema_.defined()) {  // this rank's pieces
      int64_t at = 0;
      for (const auto& [lo, hi] : eng.owned_ranges()) {
        ema_.flat_view(at, {hi - lo}).copy_from(e.flat_view(lo, {hi - lo}));
        at += hi - lo;
      }
    }
    if (const tensor e = checkpoint_tensor(ck, "adapter", "ema"); ema_adapter_.defined()) {
      if (e.defined()) {
        ema_adapter_.copy_from(e);
      } else {  // written before the adapter's EMA was kept: it starts again from the adapter restored
        ema_adapter_ = eng.adapter_params().clone();
        if (speaks())
          ctx.log().warn("checkpoint {} holds no EMA of the LoRA adapter (written by an earlier flowrun): the EMA "
                         "starts again from the adapter it restored",
                         f);
      }
    }
    const auto& mine = m0.world_size == group_.world ? ck.manifests.at(group_.rank) : m0;
    if (mine.rng_state.size() == sizeof(uint64_t)) {
      uint64_t rng;
      std::memcpy(&rng, mine.rng_state.data(), sizeof rng);
      model_->set_rng_state(rng);
    }
    if (unsup_) unsup_->set_position(m0.data_epoch, m0.data_cursor);
    version_ = m0.extra.value("policy_version", int64_t{0});
    ctx.metric("policy_version", version_);
    // a checkpoint from before step 3 scheduled its rate trained at the base rate: its updates count
    lr_steps_ = m0.extra.value("lr_steps", eng.step_count());
    saved_plan_ = m0.extra.value("lr_total_updates", int64_t{0});
    if (speaks())
      ctx.log().info("restored iteration {} from {} ({} ranks, stage {}) on {} ranks, stage {}", iteration, f,
                     m0.world_size, m0.zero_stage, group_.world, d_.zero_stage);
  }

  bool policy_;
  model_format format_ = model_format::llama2c;
  std::string source_;  // the HF folder the policy's model came from (model_msg::source)
  std::string tokenizer_;
  ppo::ppo_settings ps_;
  dschat::dschat_settings d_;
  rank_group group_;
  trainer_engine engine_;
  int64_t version_ = 0, gather_bytes_ = 0, snapshot_bytes_ = 0;  // version_: updates so far
  // the learning-rate schedule (plan_schedule): updates applied on it, the updates it spans (0: not
  // planned yet), and what the checkpoint resumed from had planned (0: none, or an older checkpoint)
  int64_t lr_steps_ = 0, planned_updates_ = 0, saved_plan_ = 0;
  bool ds_total_auto_ = false;  // the DeepSpeed JSON's scheduler.params.total_num_steps was "auto"
  std::string ds_where_;        // the DeepSpeed JSON (its path), when the node has one
  std::vector<std::shared_ptr<decoder>> snapshots_;  // the generator's weight buffers (take_snapshot)
  std::string init_weights_;  // weights_fingerprint of the model `init` brought
  std::map<int64_t, int64_t> scored_with_;  // the policy: iteration -> version_ when its rollouts were scored
  int64_t planned_T_ = 0;  // the longest rows the memory plan was checked for
  // the rollouts (their seq's memory) last scored into the engine's activations, until a train
  // call overwrites them; null: none
  const void* scored_ = nullptr;
  std::shared_ptr<decoder> model_;
  // enable_ema (DS-Chat's actor_ema, beta ps_.ema_beta): this rank's pieces of the base where it trains
  // (owned_ranges, as the master), and the LoRA adapter whole (replicated, as the engine keeps it)
  tensor ema_, ema_adapter_;
  trainer_order<actor::payload> order_;  // the rollouts to score and the experience to train on, and which goes next
  bool rolled_out_ = false;  // a rollout arrived: step 3 had begun (what SIGINT says it kept)
  std::unique_ptr<tokenizer> unsup_tok_;
  std::unique_ptr<lm_dataset> unsup_;
};

void register_ppo_trainers(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  auto trainer_kind = [&](const char* name, const char* doc, bool policy) {
    graph::node_kind k{name, doc};
    const std::string who = policy ? "actor" : "critic";
    k.blocking = true;  // ranks block in collectives: a thread each
    k.input("init", "model", "the model this node starts from (copied)")
        .input("rollouts", "rollouts", "sequences to score")
        .input("train", "experience", "experience to train on", true, true)
        .output("scored", "scores", policy ? "per-token log-probs (the old policy)" : "per-token values", true)
        .output("stats", "stats", "the update's loss and gradient norm", true)
        .option(who + "_learning_rate", T::float_, 1e-4, "AdamW learning rate").at_least(0)
        .option("per_device_training_batch_size", T::int_, std::int64_t{8},
                "rollouts per PPO update, all ranks together (the experience is cut into mini-batches of this "
                "size; each of the N ranks trains on 1/N of one)").at_least(1)
        .option("gradient_accumulation_steps", T::int_, std::int64_t{1},
                "micro-batches per rank per PPO update (the mini-batch is cut into ranks x this)").at_least(1)
        .option("ppo_epochs", T::int_, std::int64_t{1}, "passes over each experience batch").at_least(1)
        .option("gradient_clipping", T::float_, 1.0, "global gradient-norm clip (0: off)").at_least(0)
        .option(who + "_zero_stage", T::int_, std::int64_t{0},
                "ZeRO stage 0-3 of this model's engine over its replicas (DS-Chat's --" + who + "_zero_stage)")
        .in_range(0, 3)
        .option("dtype", T::string, std::string("fp32"),
                "fp32, bf16 or fp16 (fp32 masters; fp16 with dynamic loss scaling): DS-Chat's --dtype")
        .option("deepspeed_config", T::path, std::string(""),
                "a DeepSpeed JSON whose zero_optimization.stage, bf16/fp16, gradient_clipping, "
                "gradient_accumulation_steps and optimizer override these settings")
        .option(who + "_lora_dim", T::int_, std::int64_t{0}, "LoRA rank (0: full fine-tuning)").at_least(0)
        .option("only_optimize_lora", T::bool_, false, "train only the LoRA weights (DS-Chat's --only_optimize_lora)")
        .option(who + "_weight_decay", T::float_, 0.0, "AdamW decoupled weight decay (DS-Chat's default 0)").at_least(0)
        .option(who + "_lora_module_name", T::string, std::string("decoder.layers."), lora_module_name_doc())
        .option(who + "_lora_learning_rate", T::float_, 5e-4,
                "the LoRA weights' peak learning rate beside " + who + "_learning_rate (DS-Chat's --" + who +
                    "_lora_learning_rate)")
        .at_least(0)
        .option("lr_scheduler_type", T::string, std::string("constant"),
                "transformers.get_scheduler's constant, constant_with_warmup, linear or cosine over the run's "
                "updates (iterations x ppo_epochs x mini-batches per generation batch), as DS-Chat's step 3 (whose "
                "default is cosine, with num_warmup_steps 100); a deepspeed_config with a scheduler section "
                "replaces it")
        .option("num_warmup_steps", T::int_, std::int64_t{0},
                "linear warmup updates of lr_scheduler_type (DS-Chat's --num_warmup_steps)")
        .at_least(0)
        .option(who + "_gradient_checkpointing", T::bool_, false,
                "recompute each layer's activations in backward (less memory, one more forward per layer)")
        .option("memory_limit_gb", T::float_, 0.0,
                "refuse a plan (weights, gradients, AdamW states, activations, logits and their float gradient) "
                "over this many GB per process, at init and before the first rollouts of a new length are "
                "trained on (0: 90% of the available memory)").at_least(0);
    add_rank_group_settings(k);
    k.known_as("ppo_mini_batch_size",
               "veRL's ppo_mini_batch_size counts prompts (its workers multiply it by rollout.n): "
               "per_device_training_batch_size here counts rows, ppo_mini_batch_size x num_generations, all ranks "
               "together")
        .known_as("learning_rate", "the " + std::string(policy ? "policy" : "critic") + "'s rate is " + who +
                                       "_learning_rate here (DS-Chat's --" + who + "_learning_rate; TRL's learning_rate)")
        .known_as("num_ppo_epochs", "TRL's num_ppo_epochs is ppo_epochs here")
        .known_as("lora_dim", "step 3's LoRA rank is " + who + "_lora_dim here (DS-Chat's --" + who + "_lora_dim)")
        .known_as("num_mini_batches", "TRL's num_mini_batches is per_device_training_batch_size here: the rows of one "
                                      "update (a generation batch's rows / num_mini_batches), all ranks together")
        .known_as("max_grad_norm", "HF Trainer's and TRL's max_grad_norm is gradient_clipping here (DeepSpeed's name)")
        .known_as("zero_stage", "DS-Chat's --" + who + "_zero_stage is " + who + "_zero_stage here")
        .known_as("ppo_micro_batch_size_per_gpu",
                  "veRL's ppo_micro_batch_size_per_gpu is set through gradient_accumulation_steps here: each rank cuts "
                  "its share of per_device_training_batch_size into that many micro-batches");
    add_schedule_hints(k);
    add_dschat_flag_hints(k, who + "_dropout", policy);
    if (!policy) {
      add_padding_hint(k);
      k.option("cliprange_value", T::float_, 0.2,
               "value clip: the new values are kept within cliprange_value of the old (DS-Chat's critic_loss_fn)")
          .above(0)
          .known_as("cliprange", "cliprange clips the policy's ratio: set it on the policy node (DS-Chat's "
                                 "--cliprange, used by the actor loss only)");
    }
    if (policy) {
      k.known_as("disable_actor_dropout", "flowrun's models have no dropout layers: there is none to disable")
          .known_as("offload_reference_model", "DS-Chat's --offload_reference_model has no setting here: the "
                                               "reference's weights stay where its backend runs (zero_stage = 3 on "
                                               "the reference node shards them)");
      add_hybrid_engine_hints(k);
      k.known_as("unsupervised_dataset_name", "DS-Chat's --unsupervised_dataset_name is unsup_data here (a text file "
                                              "read with tokenizer, rows of unsup_seq_len tokens), mixed in by unsup_coef")
          .known_as("unsupervised_dataset_config_name", "DS-Chat's --unsupervised_dataset_config_name has no setting "
                                                        "here: unsup_data names the text file itself");
      k.known_as("clip_ratio", "veRL's clip_ratio is cliprange here (clip_ratio_c is the dual clip)")
          .known_as("epsilon", "TRL's epsilon (the ratio clip) is cliprange here")
          .known_as("clip_ratio_low", "veRL's clip_ratio_low is cliprange here (the floor 1 - cliprange)")
          .known_as("epsilon_high", "TRL's epsilon_high is clip_ratio_high here")
          .known_as("beta", "TRL's beta is kl_loss_coef with use_kl_loss = true here (or the experience maker's "
                            "kl_ctl, which puts the KL in the reward)")
          .known_as("loss_type", "TRL's loss_type is loss_agg_mode here: grpo is seq-mean-token-mean, dapo token-mean "
                                 "(over the whole mini-batch; bnpo's is per micro-batch, the same with one rank and "
                                 "gradient_accumulation_steps 1), dr_grpo seq-mean-token-sum (TRL also divides it by "
                                 "max_completion_length, a constant factor)")
          .known_as("num_iterations", "TRL's num_iterations (the updates on each generated batch, GRPO's mu) is "
                                      "ppo_epochs here")
          .known_as("kl_estimator", "OpenRLHF's --kl_estimator is kl_loss_type here for the KL loss (k1 = kl, k2 = "
                                    "mse, k3 = low_var_kl; with use_kl_loss = true); the KL in the reward (kl_ctl) is "
                                    "k1, as DS-Chat's")
          .known_as("entropy_coeff", "veRL's entropy_coeff (an entropy bonus in the actor loss) has no setting here: "
                                     "the loss has no entropy term, as with entropy_coeff = 0")
          .known_as("align_overflow", "DS-Chat's --align_overflow (in fp16, skip both updates when either overflows) "
                                      "has no setting here: the policy and the critic each skip their own overflowed "
                                      "update");
      // each clip on the node whose loss it clips (both nodes took both, and ignored the other's)
      k.option("cliprange", T::float_, 0.2, "policy ratio clip: the ratio is kept in [1 - cliprange, 1 + cliprange]")
          .above(0)
          .below(1)
          .because("a ratio floor 1 - cliprange of 0 or less bounds nothing; veRL calls it clip_ratio, TRL epsilon")
          .known_as("cliprange_value", "cliprange_value clips the critic's values: set it on the critic node "
                                       "(DS-Chat's --cliprange_value, used by the critic loss only)");
      k.output("weights", "model", "the live policy for the generator (hybrid engine)", true)
          .option("clip_ratio_high", T::float_, 0.0,
                  "DAPO's clip-higher (Yu et al. 2025): the ratio ceiling 1 + clip_ratio_high, the floor staying "
                  "1 - cliprange (veRL's clip_ratio_high, TRL's epsilon_high; DAPO uses 0.28); 0: cliprange")
          .at_least(0)
          .option("clip_ratio_c", T::float_, 0.0,
                  "dual clip: for negative advantages the loss is at most -A x clip_ratio_c (Ye et al. 2020; veRL's "
                  "default 3); above 1, or 0: off, as DS-Chat and TRL")
          .option("loss_agg_mode", T::string, std::string("token-mean"),
                  "how per-token losses become the loss (veRL's names): token-mean over the mini-batch (DS-Chat, "
                  "veRL's default), seq-mean-token-mean (GRPO as published), seq-mean-token-sum (each answer's token "
                  "sum averaged over rows: no length normalisation; Dr. GRPO's loss, TRL's dr_grpo, also divides it "
                  "by the maximum answer length, a constant that only scales the step)")
          .option("use_kl_loss", T::bool_, false,
                  "add kl_loss_coef x the KL to the reference as a loss term (GRPO; veRL's actor.use_kl_loss); the "
                  "experience maker's kl_ctl puts it inside the reward instead")
          .option("kl_loss_coef", T::float_, 0.001, "weight of the KL loss term (veRL's default)").at_least(0)
          .option("kl_loss_type", T::string, std::string("low_var_kl"),
                  "the KL estimator of the loss term: kl (k1), mse (k2), low_var_kl (k3, clamped to +-10), abs")
          .option("behav_imp_weight_cap", T::float_, 0.0,
                  "the controller's max_staleness >= 1 (decoupled PPO): tokens whose behaviour importance weight "
                  "exp(proximal - behaviour log-prob) exceeds this are left out of the loss (AReaL's name and "
                  "default: no cap, 0); else above 1")
          .at_least(0)
          .option("enable_ema", T::bool_, false, "keep an EMA of the actor (beta 0.992)")
          .option("unsup_coef", T::float_, 27.8, "weight of the unsupervised (ptx) LM loss").at_least(0)
          .option("unsup_data", T::path, std::string(""), "text for ptx mixing (empty: off), e.g. TinyStories")
          .option("unsup_seq_len", T::int_, std::int64_t{64}, "ptx instance length").at_least(2)
          .option("tokenizer", T::path, std::string(""),
                  "tokenizer for unsup_data (needed with it); also copied beside a HF output (default there: the "
                  "model's own)")
          .option("output", T::output, std::string(""),
                  "save the trained actor here at the end, in the format of the model it got (llama2.c file, or "
                  "a HF folder with the tokenizer)")
          .option("ema_output", T::output, std::string(""),
                  "with enable_ema, save the EMA of the actor here at the end, as output is saved, LoRA merged "
                  "(DS-Chat's OUTPUT_DIR/actor_ema)");
    } else {
      k.option("output", T::output, std::string(""),
               "save the trained critic (the value model) here at the end, as the reward model it got was saved: a "
               "folder with its value head (an HF folder with the tokenizer); DS-Chat's OUTPUT_DIR/critic");
    }
    k.option("verify_output", T::bool_, false, "reload the saved output and print its largest output difference");
    // a plan that leaves a rank no rows of a mini-batch trains nothing there: refused when the graph is checked
    k.check = [policy](const graph::node_spec& n, const graph::graph_spec& g) {
      auto problems = check_trainer_output(n, g);
      for (auto& p : dtype_problems(n)) problems.push_back(std::move(p));
      const int world = static_cast<int>(n.replicas) * process_count();
      // the JSON's batch triple is the update's rows, as DeepSpeed reads it: one that contradicts the node's
      // per_device_training_batch_size was taken in part (its accumulation) and silently (3-row updates cut
      // into 4 micro-batches, one empty)
      if (const auto ds = check_ds_config(n, world, problems);
          ds && ds->train_batch_size != n.get_int("per_device_training_batch_size"))
        problems.push_back(
            {"deepspeed_config",
             fmt::format("node '{}': {} resolves train_batch_size to {} (train_micro_batch_size_per_gpu {} x "
                         "gradient_accumulation_steps {} x {} rank(s)), but per_device_training_batch_size = {} (the "
                         "rows of one update, all ranks together)",
                         n.name, ds->where, ds->train_batch_size, ds->train_micro_batch_size_per_gpu,
                         ds->gradient_accumulation_steps, world, n.get_int("per_device_training_batch_size")),
             fmt::format("make them equal: set per_device_training_batch_size = {}, or the JSON's batch keys to "
                         "\"auto\" (filled from the node)",
                         ds->train_batch_size)});
      for (auto& p : lr_scheduler_problems(n)) problems.push_back(std::move(p));
      const std::string who = policy ? "actor" : "critic";
      for (auto& p : trainer_choice_problems(n, who + "_lora_dim", who + "_learning_rate", who + "_lora_learning_rate"))
        problems.push_back(std::move(p));
      if (policy && problems.empty()) warn_mixed_dtypes(g);
      for (auto& p : lora_module_problems(n, who + "_lora_dim", who + "_lora_module_name"))
        problems.push_back(std::move(p));
      if (policy && !n.get_string("unsup_data").empty() && n.get_string("tokenizer").empty()) {
        // the ptx text is read with the policy's tokenizer setting: refused here (it failed at the node's start)
        std::string theirs;  // the loop's own tokenizer, to name in the hint
        for (const auto& other : g.nodes)
          if ((other.kind == "rollout_generator" || other.kind == "prompt_loader") && theirs.empty())
            if (const auto* t = other.find_setting("tokenizer"); t && std::get_if<std::string>(&t->value))
              theirs = std::get<std::string>(t->value);
        problems.push_back({"unsup_data",
                            fmt::format("node '{}': unsup_data is read with the node's tokenizer setting, which is "
                                        "empty",
                                        n.name),
                            theirs.empty() ? std::string("set tokenizer = the policy model's tokenizer")
                                           : "set tokenizer = \"" + theirs + "\" (the rollouts' tokenizer)"});
      }
      if (policy) {
        try {
          (void)rlhf::parse_loss_agg_mode(n.get_string("loss_agg_mode"));
        } catch (const std::invalid_argument& e) {
          problems.push_back({"loss_agg_mode", e.what(), "use one of the values named"});
        }
        try {
          (void)rlhf::parse_kl_estimator(n.get_string("kl_loss_type"));
        } catch (const std::invalid_argument& e) {
          problems.push_back({"kl_loss_type", e.what(), "use one of the values named"});
        }
        // the KL loss's own settings, written with the loss off, do nothing: said, not refused (a graph file
        // that sets both, with use_kl_loss = false given by --set, is how the loss is turned off for one run)
        if (!n.get_bool("use_kl_loss"))
          for (const char* k : {"kl_loss_coef", "kl_loss_type"})
            if (const auto* set = n.find_setting(k); set && !set->from_default)
              spdlog::warn("node '{}': {} = {} changes nothing: use_kl_loss = false turns the KL loss off (set "
                           "use_kl_loss = true to train with it, veRL's actor.use_kl_loss)",
                           n.name, k, graph::to_string(set->value));
        if (const double w = n.get_float("behav_imp_weight_cap"); w != 0 && w <= 1)
          problems.push_back({"behav_imp_weight_cap",
                              fmt::format("behav_imp_weight_cap = {} would leave out tokens of an on-policy batch "
                                          "(whose weights are all 1)", w),
                              "use a cap above 1, or 0 for none"});
        // DS-Chat's actor_ema: saved when enable_ema keeps one
        if (const auto& e = n.get_string("ema_output"); !e.empty()) {
          if (!n.get_bool("enable_ema"))  // (the same path as another output is refused with every output's)
            problems.push_back({"ema_output",
                                fmt::format("node '{}': ema_output = \"{}\" but enable_ema = false: no EMA is kept", n.name,
                                            e),
                                "set enable_ema = true (DS-Chat's --enable_ema), or remove ema_output"});
          for (auto& p : check_trainer_output(n, g, "ema_output")) problems.push_back(std::move(p));
        }
        const double c = n.get_float("clip_ratio_c");
        if (c != 0 && c <= 1)
          problems.push_back({"clip_ratio_c", fmt::format("clip_ratio_c = {} must be above 1 (a bound on -A x ratio "
                                                          "for A < 0 that is below the unclipped loss), or 0 (off)", c),
                              "use 3 (veRL's default), or 0 to turn the dual clip off"});
      }
      const int64_t mb = n.get_int("per_device_training_batch_size"), gas = n.get_int("gradient_accumulation_steps");
      if (mb < n.replicas * gas)
        problems.push_back({"per_device_training_batch_size",
                            fmt::format("per_device_training_batch_size = {} rows cannot fill replicas ({}) x "
                                        "gradient_accumulation_steps ({}) = {} micro-batches: some would train on "
                                        "nothing",
                                        mb, n.replicas, gas, n.replicas * gas),
                            fmt::format("raise per_device_training_batch_size to at least {}, or lower replicas or "
                                        "gradient_accumulation_steps",
                                        n.replicas * gas)});
      return problems;
    };
    actor::register_node_kind(kinds, factories, k,
                              [policy] { return std::unique_ptr<actor::node>(new ppo_trainer(policy)); });
  };
  trainer_kind("critic", "value model (from the reward model): values, trained on the clipped value loss", false);
  trainer_kind("policy", "the actor (from step 1): old log-probs, trained on the clipped policy loss", true);
}

// ---------------------------------------------------------------- step 3: experience maker

/// Joins the scores of a rollout batch and computes its advantages: DS-Chat's rewards
/// (KL-penalised, clipped score) and GAE with the critic's values (ppo_trainer.py
/// compute_rewards, get_advantages_and_returns), or a critic-free estimator (GRPO, RLOO,
/// REINFORCE++: ppo::critic_free_advantages) from the policy's, the reference's and the reward's
/// scores alone. With filter_groups (DAPO's dynamic sampling) the groups whose rewards are all
/// equal are dropped before the advantages. Emits the experience to the trainers and a summary
/// to the controller.
class experience_maker final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    cfg_.kl_ctl = static_cast<float>(s.get_float("kl_ctl"));
    cfg_.clip_reward_value = static_cast<float>(s.get_float("clip_reward_value"));
    cfg_.gamma = static_cast<float>(s.get_float("gamma"));
    cfg_.lam = static_cast<float>(s.get_float("lam"));
    generation_batches_ = std::max<int64_t>(1, s.get_int("generation_batches"));
    cf_.estimator = ppo::parse_advantage_estimator(s.get_string("advantage_estimator"));
    cf_.scale_rewards = rlhf::parse_reward_scaling(s.get_string("scale_rewards"));
    cf_.epsilon = s.get_float("epsilon");
    cf_.ppo = cfg_;
    filter_groups_ = s.get_bool("filter_groups");
    check_step3_settings(ctx, {});  // the rewards, the KL penalty and the advantages
    reference_ = s.get_bool("reference");
  }
  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    const auto& sm = msg.as<score_msg>();
    ctx.phase("experience");
    // Joined by the batch's id, not the rollouts' address: scores from other
    // processes each bring their own copy of the rollouts.
    auto& slot = joins_[sm.rollouts->batch];
    if (!slot.rollouts) slot.rollouts = sm.rollouts;
    slot.parts[std::string(port)] = sm.value;
    if (slot.parts.size() < 2u + (ppo::needs_critic(cf_.estimator) ? 1u : 0u) + (reference_ ? 1u : 0u)) return;
    auto j = std::move(slot);
    joins_.erase(sm.rollouts->batch);
    const auto& r = *j.rollouts;
    summary_msg sum;
    sum.iteration = r.iteration;
    sum.eval = r.eval;
    sum.with_critic = ppo::needs_critic(cf_.estimator);
    sum.generate_seconds = r.generate_seconds;
    sum.generated_tokens = r.generated_tokens;
    sum.policy_version = r.policy_version;
    sum.weights_wait_seconds = r.weights_wait_seconds;
    if (r.checkpoint) pending_.checkpoint = true;  // kept past a dropped batch, to the next update
    // a training batch that sends the trainers no experience sends them this: they score the next
    // rollouts only once every earlier batch's experience, or this, is through (ppo_trainer::handle).
    // At the run's last iteration there is no next update: a save still due is made on the marker (the
    // trainers save and report without training) and committed, so a finished run resumes after its
    // last iteration (GRPO's last batch, filtered away by filter_groups, left the run without a commit
    // after it: the same command trained the last iterations again). A drain's save (prompt_msg::save_only, no
    // rows) is such a marker too: the trainers save after r.iteration, the last they trained, and report
    const auto nothing_to_train = [&] {
      experience_batch marker;
      marker.iteration = r.iteration;
      if (r.save_only || (pending_.checkpoint && r.iterations > 0 && r.iteration + 1 >= r.iterations)) {
        marker.checkpoint = true;
        pending_.checkpoint = false;
        sum.saves = true;
      }
      ctx.emit("experience", actor::payload::make("experience", std::move(marker)));
    };
    if (!r.exp) {
      sum.dropped = true;
      if (!r.eval) nothing_to_train();
      ctx.emit("summary", actor::payload::make("summary", sum));
      return;
    }
    auto e = std::make_shared<ppo::experience>(*r.exp);
    e->logprobs = j.parts.at("logprobs");
    if (reference_) e->ref_logprobs = j.parts.at("ref_logprobs");
    if (sum.with_critic) e->values = j.parts.at("values");
    e->reward_score = j.parts.at("reward");
    const int64_t B = e->seq.size(0);
    double sq = 0;
    for (int64_t b = 0; b < B; ++b) {
      sum.reward_mean += e->reward_score.item(b) / static_cast<double>(B);
      sum.answer_len_mean += static_cast<double>(e->answer_len[b]) / static_cast<double>(B);
    }
    for (int64_t b = 0; b < B; ++b) sq += std::pow(e->reward_score.item(b) - sum.reward_mean, 2);
    sum.reward_stderr = B > 1 ? std::sqrt(sq / static_cast<double>(B - 1) / static_cast<double>(B)) : 0.0;
    sum.kl_mean = ppo::mean_kl(*e);
    sum.rows = B;
    if (r.eval) {
      ctx.emit("summary", actor::payload::make("summary", sum));
      return;
    }
    // DAPO's dynamic sampling: a group of equal rewards has no signal (its advantages are 0)
    const int64_t G = std::max<int64_t>(1, r.group_size);
    sum.groups = B / G;
    sum.groups_kept = sum.groups;
    if (filter_groups_ && G > 1) {
      std::vector<int64_t> keep;
      const auto signal = rlhf::groups_with_signal(e->reward_score, G);
      for (int64_t g = 0; g < sum.groups; ++g)
        if (signal[static_cast<size_t>(g)])
          for (int64_t i = 0; i < G; ++i) keep.push_back(g * G + i);
      sum.groups_kept = static_cast<int64_t>(keep.size()) / G;
      if (keep.empty()) {  // nothing to learn from: as a dropped batch (the stamp goes to the next update)
        sum.dropped = true;
        nothing_to_train();
        ctx.emit("summary", actor::payload::make("summary", sum));
        return;
      }
      if (sum.groups_kept < sum.groups) e = std::make_shared<ppo::experience>(ppo::take_rows(*e, keep));
    }
    experience_msg x;
    x.iteration = r.iteration;
    x.policy_version = r.policy_version;
    pending_.max_staleness = r.max_staleness;
    pending_.drop_stale = r.drop_stale;
    if (sum.with_critic) {
      ppo::make_advantages(*e, cfg_, x.advantages, x.returns);
    } else {
      cf_.num_generations = G;
      x.advantages = ppo::critic_free_advantages(*e, cf_);
    }
    rlhf::check_finite(x.advantages, fmt::format("{}, iteration {}", ctx.name(), r.iteration), "advantages");
    x.exp = e;
    pending_.items.push_back(std::move(x));
    pending_.iteration = r.iteration;
    if (static_cast<int64_t>(pending_.items.size()) == generation_batches_) {
      sum.trains = true;
      ctx.emit("experience", actor::payload::make("experience", std::move(pending_)));
      pending_ = experience_batch{};
    } else {
      nothing_to_train();  // kept for the next update (generation_batches > 1)
    }
    ctx.emit("summary", actor::payload::make("summary", sum));
  }

  // a run that ends with experience kept for the next update (generation_batches > 1, and filter_groups
  // dropped a batch of the last group, so the update never came) says so: those batches never trained
  void stop(actor::node_context& ctx) override {
    if (pending_.items.empty() || ctx.reason() != actor::stop_reason::completed) return;
    ctx.log().warn("the run ended with {} generated batch(es) kept for the next update (generation_batches = {}), "
                   "the last at iteration {}: never trained{}",
                   pending_.items.size(), generation_batches_, pending_.iteration,
                   filter_groups_ ? " (filter_groups dropped batches of their group, so the group never filled)" : "");
  }

 private:
  struct join {
    std::shared_ptr<const rollout_msg> rollouts;
    std::map<std::string, tensor> parts;
  };
  rlhf::ppo_config cfg_;
  ppo::critic_free_config cf_;
  bool filter_groups_ = false;
  bool reference_ = true;  // the reference's log-probs come to ref_logprobs (else no KL anywhere)
  int64_t generation_batches_ = 1;
  experience_batch pending_;
  std::map<int64_t, join> joins_;  // by rollout_msg::batch
};

// The generator that feeds `node`'s rollouts (through the policy's scores): the graph's
// rollout_generator, when it has exactly one.
const graph::node_spec* the_generator(const graph::graph_spec& g) {
  const graph::node_spec* found = nullptr;
  for (const auto& n : g.nodes)
    if (n.kind == "rollout_generator") {
      if (found) return nullptr;
      found = &n;
    }
  return found;
}

void register_experience_maker(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"experience_maker",
                     "advantages of each rollout batch: DS-Chat's KL-penalised rewards and GAE (with a critic), or "
                     "GRPO, RLOO, REINFORCE++ (critic-free)"};
  k.input("logprobs", "scores", "the policy's log-probs")
      .input("ref_logprobs", "scores", "the reference's log-probs (none with reference = false)", false)
      .input("values", "scores", "the critic's values (gae only)", false)
      .input("reward", "scores", "the reward model's or reward_function's scores")
      .output("experience", "experience", "to the policy (and the critic)", true)
      .output("summary", "summary", "rewards and KL for the controller", true)
      .option("advantage_estimator", T::string, std::string("gae"),
              "gae (DS-Chat's PPO, needs the critic), grpo (group-normalised rewards, Shao et al. 2024), rloo "
              "(leave-one-out baseline, Ahmadian et al. 2024) or reinforce_plus_plus (batch-whitened returns, Hu "
              "2025): veRL's algorithm.adv_estimator")
      .option("kl_ctl", T::float_, 0.1,
              "KL penalty coefficient inside the reward (gae, reinforce_plus_plus: per token; grpo, rloo: summed "
              "over the answer, veRL's use_kl_in_reward). Unwritten, it follows advantage_estimator: 0.1 with gae "
              "(DS-Chat), 0 with grpo and rloo (veRL's use_kl_in_reward = false: GRPO as published puts the KL in "
              "the policy's loss, use_kl_loss), 0.001 with reinforce_plus_plus (REINFORCE++ as published puts a "
              "per-token KL in the reward; veRL's kl_ctrl.kl_coef, which it applies only with use_kl_in_reward = "
              "true, its default being false: kl_ctl = 0 for that)")
      .at_least(0)
      .default_by([](const graph::node_spec& n) -> graph::setting_value {
        return ppo::default_kl_ctl(n.get_string("advantage_estimator"));
      })
      .option("clip_reward_value", T::float_, 5.0,
              "reward score clip (gae: DS-Chat's; reinforce_plus_plus too, where veRL clips nothing: set it above "
              "the scorer's range to train as veRL does)")
      .above(0)
      .option("gamma", T::float_, 1.0, "discount (gae, reinforce_plus_plus)").in_range(0, 1)
      .option("lam", T::float_, 0.95, "GAE lambda").in_range(0, 1)
      .option("scale_rewards", T::string, std::string("group"),
              "grpo: divide the centred rewards by the std of the group (GRPO), of the batch, or none (Dr. GRPO): "
              "TRL's scale_rewards")
      .option("epsilon", T::float_, 1e-4, "grpo: added to the std (TRL's 1e-4; veRL's 1e-6)")
      .in_range(0, 0.01, /*low_open=*/true)
      .because("it only keeps a group of equal rewards from dividing by 0; TRL's GRPOConfig.epsilon (0.2) is the "
               "ratio clip, the policy's cliprange here")
      .option("filter_groups", T::bool_, false,
              "drop the groups whose rewards are all equal before training (DAPO's dynamic sampling, Yu et al. "
              "2025); a batch with no group left trains nothing")
      .option("generation_batches", T::int_, std::int64_t{1},
              "generation batches collected before each PPO update (DS-Chat's exp_dataset size)").at_least(1)
      .option("reference", T::bool_, true,
              "a reference model's log-probs come to ref_logprobs; false: the graph has none (veRL builds no "
              "reference without use_kl_in_reward and use_kl_loss, as DAPO and Dr. GRPO train): needs kl_ctl = 0, a "
              "critic-free estimator and use_kl_loss = false on the policy, and saves the reference's forward");
  // the estimator and the graph agree: GAE has a critic, GRPO and RLOO groups of >= 2
  k.known_as("norm_adv_by_std_in_grpo",
             "veRL's norm_adv_by_std_in_grpo = false is scale_rewards = \"none\" here (true: \"group\", the default)")
      .known_as("adv_estimator", "veRL's algorithm.adv_estimator is advantage_estimator here")
      .known_as("kl_coef", "veRL's algorithm.kl_ctrl.kl_coef (the KL in the reward) is kl_ctl here")
      .known_as("use_kl_in_reward", "veRL's use_kl_in_reward is kl_ctl > 0 here (0: no KL in the reward)")
      .known_as("init_kl_coef", "OpenRLHF's --init_kl_coef is kl_ctl here, the KL in the reward (a fixed "
                                "coefficient); with its --use_kl_loss it weighs the KL loss: the policy's "
                                "kl_loss_coef with use_kl_loss = true");
  // (a shipped graph that writes an estimator's settings at their defaults, run with another estimator by --set,
  // is not warned about)
  std::map<std::string, graph::setting_value> defaults;
  for (const char* s : {"clip_reward_value", "gamma", "lam", "scale_rewards", "epsilon"})
    defaults[s] = k.find_setting(s)->default_value;
  k.check = [defaults](const graph::node_spec& n, const graph::graph_spec& g) -> std::vector<graph::node_kind::problem> {
    std::vector<graph::node_kind::problem> problems;
    ppo::advantage_estimator est;
    try {
      est = ppo::parse_advantage_estimator(n.get_string("advantage_estimator"));
    } catch (const std::invalid_argument& e) {
      return {{"advantage_estimator", e.what(), "use one of the values named"}};
    }
    try {
      (void)rlhf::parse_reward_scaling(n.get_string("scale_rewards"));
    } catch (const std::invalid_argument& e) {
      const std::string v = n.get_string("scale_rewards");
      return {{"scale_rewards", e.what(),
               v == "false" || v == "False" ? "TRL's scale_rewards = False is \"none\" here (Dr. GRPO)"
               : v == "true" || v == "True" ? "TRL's scale_rewards = True is \"group\" here (the default)"
                                            : "use one of the values named"}};
    }
    // the settings of another estimator, written, do nothing: said, not refused (one graph file serves several
    // estimators, chosen by --set)
    {
      static const std::map<std::string, std::set<std::string>> used = {
          {"gae", {"clip_reward_value", "gamma", "lam"}},
          {"grpo", {"scale_rewards", "epsilon"}},
          {"rloo", {}},
          {"reinforce_plus_plus", {"clip_reward_value", "gamma"}}};
      const std::string name = n.get_string("advantage_estimator");
      if (const auto it = used.find(name); it != used.end())
        for (const char* k : {"clip_reward_value", "gamma", "lam", "scale_rewards", "epsilon"})
          if (const auto* set = n.find_setting(k);
              set && !set->from_default && !it->second.count(k) && !(set->value == defaults.at(k))) {
            std::vector<std::string> users;
            for (const auto& [e, keys] : used)
              if (keys.count(k)) users.push_back(e);
            spdlog::warn("node '{}': {} = {} changes nothing: advantage_estimator = \"{}\" does not use it (only {})",
                         n.name, k, graph::to_string(set->value), name, fmt::join(users, " and "));
          }
    }
    bool has_values = false, has_ref = false;
    for (const auto& e : g.edges) {
      has_values |= e.to_node == n.name && e.to_port == "values";
      has_ref |= e.to_node == n.name && e.to_port == "ref_logprobs";
    }
    const bool reference = n.get_bool("reference");
    if (reference && !has_ref)
      problems.push_back({"reference", "no edge brings the reference's log-probs to " + n.name + ".ref_logprobs",
                          "add \"reference.scored -> " + n.name + ".ref_logprobs\" (and a reference_model node), or "
                          "set reference = false to train without a reference model (no KL)"});
    if (!reference && has_ref)
      problems.push_back({"reference", "reference = false, but an edge brings log-probs to " + n.name + ".ref_logprobs",
                          "remove the reference model and its edges, or set reference = true"});
    if (!reference && n.get_float("kl_ctl") > 0) {
      const auto* w = n.find_setting("kl_ctl");
      const std::string whose = w && w->from_default ? fmt::format(" (unwritten: advantage_estimator {}'s default)",
                                                                   n.get_string("advantage_estimator"))
                                                     : "";
      problems.push_back({"kl_ctl", fmt::format("kl_ctl = {}{} puts a KL to the reference in the reward, and "
                                                "reference = false: there is no reference",
                                                n.get_float("kl_ctl"), whose),
                          "set kl_ctl = 0, or keep a reference model (reference = true)"});
    }
    if (!reference && ppo::needs_critic(est))
      problems.push_back({"reference", "advantage_estimator = \"gae\" (DS-Chat's PPO) keeps the reference model",
                          "set reference = true, or choose grpo, rloo or reinforce_plus_plus"});
    // the KL in the reward and in the loss at once penalises it twice (veRL prints a notice for use_kl_in_reward
    // beside use_kl_loss): a GRPO graph given kl_ctl > 0 ran so without a word
    for (const auto& m : g.nodes)
      if (reference && n.get_float("kl_ctl") > 0 && m.kind == "policy" && m.find_setting("use_kl_loss") &&
          m.get_bool("use_kl_loss"))
        spdlog::warn("node '{}': kl_ctl = {} puts the KL to the reference in the reward, and the policy '{}' has "
                     "use_kl_loss = true: the KL is penalised twice, in the reward and in the loss (veRL's "
                     "use_kl_in_reward beside use_kl_loss); set kl_ctl = 0 for GRPO's KL loss alone, or use_kl_loss "
                     "= false for DS-Chat's KL in the reward",
                     n.name, n.get_float("kl_ctl"), m.name);
    for (const auto& m : g.nodes)
      if (!reference && m.kind == "policy" && m.find_setting("use_kl_loss") && m.get_bool("use_kl_loss"))
        problems.push_back({"reference", "reference = false, and the policy '" + m.name +
                                             "' has use_kl_loss = true: its KL loss needs the reference's log-probs",
                            "set node." + m.name + ".use_kl_loss = false, or keep a reference model"});
    if (ppo::needs_critic(est) && !has_values)
      problems.push_back({"advantage_estimator", "advantage_estimator = \"gae\" needs the critic's values, and no "
                                                 "edge brings them to " + n.name + ".values",
                          "add \"critic.scored -> " + n.name + ".values\" (and a critic node), or choose a "
                          "critic-free estimator: grpo, rloo, reinforce_plus_plus"});
    if (!ppo::needs_critic(est) && has_values)
      problems.push_back({"advantage_estimator", "advantage_estimator = \"" + n.get_string("advantage_estimator") +
                                                 "\" uses no critic, but an edge brings values to " + n.name + ".values",
                          "remove the critic and its edges, or set advantage_estimator = \"gae\""});
    // DS-Chat's exp_dataset: an update every generation_batches batches; a run whose iterations
    // leave a remainder generates its last batches and never trains on them
    const int64_t gb = n.get_int("generation_batches");
    for (const auto& m : g.nodes)
      if (m.kind == "prompt_loader" && gb > 1 && m.get_int("iterations") % gb != 0)
        problems.push_back({"generation_batches",
                            fmt::format("generation_batches = {} trains once per {} batches, and the loader '{}' runs "
                                        "iterations = {}: its last {} batch(es) would be generated and never trained",
                                        gb, gb, m.name, m.get_int("iterations"), m.get_int("iterations") % gb),
                            fmt::format("make node.{}.iterations a multiple of {}", m.name, gb)});
    // DAPO's filter drops a group whose rewards are all equal: a group of one always is
    if (const auto* gen = the_generator(g); gen && n.get_bool("filter_groups") && gen->get_int("num_generations") < 2)
      problems.push_back({"filter_groups",
                          fmt::format("filter_groups drops the groups whose rewards are all equal, and the generator "
                                      "'{}' samples num_generations = {} per prompt: every group of one would be "
                                      "dropped, and nothing would train",
                                      gen->name, gen->get_int("num_generations")),
                          "set node." + gen->name + ".num_generations to 2 or more, or filter_groups = false"});
    if (est == ppo::advantage_estimator::grpo || est == ppo::advantage_estimator::rloo) {
      const auto* gen = the_generator(g);
      if (gen && gen->get_int("num_generations") < 2)
        problems.push_back({"advantage_estimator",
                            fmt::format("{} compares each answer with the other answers to the same prompt, and the "
                                        "generator '{}' samples num_generations = {} per prompt: a group of one has "
                                        "no baseline (its advantage would be 0 or undefined)",
                                        n.get_string("advantage_estimator"), gen->name, gen->get_int("num_generations")),
                            "set node." + gen->name + ".num_generations to 2 or more (GRPO papers use 8-64)"});
      // greedy sampling answers a prompt the same way every time: every group's rewards are
      // equal, every advantage 0, nothing trains (the same case as a group of one)
      if (gen && gen->get_int("num_generations") >= 2 &&
          (gen->get_float("temperature") == 0 || gen->get_int("top_k") == 1))
        problems.push_back({"advantage_estimator",
                            fmt::format("{} compares the answers to the same prompt, and the generator '{}' samples "
                                        "greedily ({}): its num_generations = {} answers are all the same, every "
                                        "advantage is 0 and nothing trains",
                                        n.get_string("advantage_estimator"), gen->name,
                                        gen->get_float("temperature") == 0 ? "temperature = 0" : "top_k = 1",
                                        gen->get_int("num_generations")),
                            "sample: set node." + gen->name + ".temperature above 0 (veRL's rollout default is "
                            "1.0) and top_k to 0 or 2 or more"});
    }
    return problems;
  };
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new experience_maker); });
}

}  // namespace

void register_ppo_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  register_prompt_loader(kinds, factories);
  register_ppo_controller(kinds, factories);
  register_rollout_generator(kinds, factories);
  register_frozen_scorers(kinds, factories);
  register_ppo_trainers(kinds, factories);
  register_experience_maker(kinds, factories);
  register_reward_function(kinds, factories);
}

void register_rlhf_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  register_rlhf_codecs();
  register_dschat_trainers(kinds, factories);
  register_ppo_nodes(kinds, factories);
}

}  // namespace flowrun::actors
