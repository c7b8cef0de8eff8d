// DeepSpeed-Chat's step-3 loop as a node (actors/ppo_controller.h: the phases and what
// ends each). The class reads as the loop: on_message only records what arrived, advance()
// runs the phases in order, one handler per phase.
#include "actors/ppo_controller.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "actors/dschat_common.h"
#include "actors/rank_group.h"
#include "actors/resume_check.h"
#include "actors/rlhf_types.h"
#include "models/rlhf/ppo_checkpoint.h"

namespace flowrun::actors {

namespace {

/// v for a figure printed with 4 decimals: 0 when it rounds to zero, so that a tiny negative KL
/// (the k1 estimate's mean over tokens can be -1e-6 right after a step) or loss (REINFORCE++'s
/// whitened advantages sum to about 0 at the first, on-policy update) prints 0.0000, not -0.0000.
double shown4(double v) { return std::fabs(v) < 5e-5 ? 0.0 : v; }

class ppo_controller final : public actor::node {
 public:
  /// The phases of one iteration, in order (ppo_controller.h).
  enum class phase { wait_prompts, generate_experience, train, report };

  void start(actor::node_context& ctx) override {
    t0_ = clk::now();
    dir_ = ctx.checkpoint_dir();
    save_every_ = ctx.spec().get_int("save_checkpoint_steps");
    if (save_every_ > 0 && dir_.empty())  // as the DS-Chat trainers say it
      ctx.log().warn("save_checkpoint_steps = {} but the graph has no [graph] checkpoint_dir: no checkpoints",
                     save_every_);
    keep_ = static_cast<int>(ctx.spec().get_int("keep_checkpoints"));
    S_ = ctx.spec().get_int("max_staleness");
    drop_ = ctx.spec().get_string("staleness_policy") == "drop";
    if (!drop_ && ctx.spec().get_string("staleness_policy") != "wait")
      throw std::invalid_argument("node '" + ctx.name() + "': staleness_policy must be \"wait\" or \"drop\"");
    // the schedule; staleness_policy acts only at max_staleness >= 1 (a change at 0 changes nothing)
    std::set<std::string> safe{"save_checkpoint_steps", "keep_checkpoints"};
    if (S_ == 0) {
      safe.insert("staleness_policy");
      if (drop_)
        ctx.log().warn("staleness_policy = \"drop\" has no effect at max_staleness = 0 (the synchronous loop): "
                       "set max_staleness >= 1 for it to act");
    }
    check_step3_settings(ctx, std::move(safe));
    if (const auto rp = ppo::find_step3_resume(dir_)) {  // the same answer every node gets
      for (const auto& why : rp->refused) ctx.print("[step 3 ppo] checkpoint " + why);
      commit_.eval_before = eval_before_ = rp->commit.eval_before;
      commit_.eval_before_stderr = eval_before_se_ = rp->commit.eval_before_stderr;
      for (const auto& pt : rp->commit.committed)
        if (pt.iteration <= rp->point.iteration) commit_.committed.push_back(pt);
      updates_ = rp->point.policy_version;
      last_committed_ = last_trained_it_ = rp->point.iteration - 1;
      // numbered as the "iter K" and "checkpoint after iteration K" lines: the last one done
      ctx.print(fmt::format("[step 3 ppo] resuming after iteration {} from {} (policy version {})",
                            rp->point.iteration - 1, dir_, updates_));
    }
    enter(ctx, phase::wait_prompts);
  }

  // Records what arrived, then runs the loop as far as it can go.
  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    if (port == "summary" && !step3_runs_) {  // the first experience: step 3 runs, its phases show from now
      step3_runs_ = true;
      if (!shown_.empty()) ctx.phase(shown_);
    }
    if (port == "prompts" && ctx.draining()) {  // a drain generates nothing more (awaits_feedback)
      ctx.log().info("the run drains: prompt batch {} is not generated", msg.as<prompt_msg>().iteration);
      if (S_ > 0) outstanding_ = false;
      return;
    }
    if (S_ > 0) {
      on_async(ctx, port, msg);
      return;
    }
    if (port == "prompts") {
      if (phase_ != phase::wait_prompts)
        throw std::logic_error(fmt::format("node '{}': a prompt batch arrived in phase {} of iteration {} (the "
                                           "prompt loader must wait for `next`)",
                                           ctx.name(), name(phase_), it_.prompts->iteration));
      it_.prompts = msg.as<prompt_msg>();  // tensor handles: no data copy
    } else if (port == "summary") {
      it_.summary = msg.as<summary_msg>();
    } else if (port == "actor_stats") {
      it_.actor = msg.as<stats_msg>();
      if (it_.actor->updated) ++updates_;  // the policy bumps its version once per update, when it reports
    } else if (port == "critic_stats") {
      it_.critic = msg.as<stats_msg>();
    }
    advance(ctx);
  }

  // A drain (SIGINT, SIGTERM, the console's stop) ended the prompts. Without this the controller would
  // end at once and drop the feedback of the iteration in flight: its update trained, and was lost with
  // every one since the last commit. Instead: the iteration in flight reports (everything after the
  // controller still runs in a drain, and every node it waits for has started: a summary came), no new
  // batch is generated (on_message), and where a [graph] checkpoint_dir is set and the last trained
  // iteration is not committed, a save-only batch asks the policy and the critic to save it
  // (prompt_msg::save_only), and the controller commits it once both have reported, as a scheduled
  // checkpoint. Then it ends.
  bool awaits_feedback(actor::node_context& ctx) override {
    if (!ctx.draining() || !step3_runs_) return false;
    if (S_ > 0 ? !flight_.empty() : phase_ != phase::wait_prompts) return true;  // its report comes
    if (dir_.empty() || drain_save_ || last_trained_it_ <= last_committed_ || !last_batch_) return false;
    drain_save_ = true;
    ctx.print(fmt::format("[step 3 ppo] stopping after iteration {}: saving and committing it", last_trained_it_));
    prompt_msg p = *last_batch_;  // tensor handles: its ids go along, unread
    p.iteration = last_trained_it_;
    p.eval = p.last = false;
    p.references.clear();
    p.save_only = p.checkpoint = true;
    p.policy_version = updates_;
    iteration x;
    x.prompts = p;
    x.launched = clk::now();
    if (S_ > 0) {
      flight_.push_back(std::move(x));
    } else {
      it_ = std::move(x);
      enter(ctx, phase::generate_experience);
    }
    ctx.emit("generate", actor::payload::make("prompt_batch", std::move(p)));
    return true;
  }

 private:
  // ---- the loop: every transition is here

  void advance(actor::node_context& ctx) {
    for (;;) {
      switch (phase_) {
        case phase::wait_prompts:
          if (!it_.prompts) return;
          generate(ctx);
          enter(ctx, phase::generate_experience);
          break;
        case phase::generate_experience:
          if (!it_.summary) return;
          if (!it_.prompts->save_only) end_generate_experience(ctx);
          enter(ctx, trains() || it_.summary->saves ? phase::train : phase::report);
          break;
        case phase::train:
          if (!it_.actor || (it_.summary->with_critic && !it_.critic)) return;
          if (!it_.prompts->save_only) ctx.signal("phase_seconds/train", since(phase_start_), tb_step());
          enter(ctx, phase::report);
          break;
        case phase::report:
          report(ctx, it_);
          if (it_.prompts->save_only) {  // the drain's save: nothing follows it
            it_ = {};
            enter(ctx, phase::wait_prompts);
            return;
          }
          ctx.emit("next", actor::payload::make("tick", it_.prompts->iteration));
          ctx.signal("phase_seconds/report", since(phase_start_), tb_step());
          it_ = {};
          enter(ctx, phase::wait_prompts);
          return;
      }
    }
  }

  // Whether the trainers save after batch p's update and the controller commits it: every save_checkpoint_steps
  // iterations, and at the next batch after a console checkpoint request (POST /api/checkpoint, flowctl
  // checkpoint: it was acknowledged and never honoured in step 3). Needs a [graph] checkpoint_dir.
  bool checkpoint_due(actor::node_context& ctx, const prompt_msg& p) {
    if (p.eval || dir_.empty()) return false;
    // every save_checkpoint_steps iterations, and after the last one (the loader's iterations), so that a run
    // that finished resumes after it, as zero_rank commits its last step: one of 13 iterations at 5 resumed
    // after iteration 9 and trained 10-12 again
    const bool every = save_every_ > 0 && ((p.iteration + 1) % save_every_ == 0 || p.iteration + 1 == p.iterations);
    // polled at every batch (the console sees a node that honours it), where the console's request reaches it:
    // on main, or on a cluster node (main forwards its requests with every counter poll), not under flowrun
    // launch (each process has a console of its own, and a controller of its own)
    const bool asked = process_count() == 1 && ctx.checkpoint_requested();
    if (asked && !every) ctx.log().info("honouring the console's checkpoint request after iteration {}", p.iteration + 1);
    return every || asked;
  }

  // ---- the phases

  // wait_prompts -> generate_experience: ask the generator to roll out this batch.
  void generate(actor::node_context& ctx) {
    prompt_msg p = *it_.prompts;  // tensor handles: no data copy
    p.policy_version = updates_;  // generate with the weights of every update reported so far
    // every save_checkpoint_steps iterations the trainers save after this batch's update
    p.checkpoint = checkpoint_due(ctx, p);
    if (p.checkpoint) commit_due_ = true;  // committed after the update that trains on it
    if (!p.eval) last_batch_ = p;
    it_.launched = clk::now();
    ctx.emit("generate", actor::payload::make("prompt_batch", std::move(p)));
  }

  // generate_experience ends: the generator timed its part, the rest is scoring, rewards and GAE.
  void end_generate_experience(actor::node_context& ctx) {
    const double wall = since(phase_start_), gen = it_.summary->generate_seconds;
    ctx.signal("phase_seconds/generate", gen, tb_step());
    ctx.signal("phase_seconds/score_and_experience", std::max(0.0, wall - gen), tb_step());
  }

  // The batch completed an experience batch: the policy and the critic train on it and report.
  bool trains() const { return trains(it_); }
  struct iteration;
  static bool trains(const iteration& it) { return !it.prompts->eval && !it.summary->dropped && it.summary->trains; }

  // report: DS-Chat's per-iteration print, the console's signals, the checkpoint commit (then
  // the caller sends `next`, or with max_staleness >= 1 the pipeline asks when it may).
  void report(actor::node_context& ctx, const iteration& it) {
    const prompt_msg& p = *it.prompts;
    const summary_msg& s = *it.summary;
    if (p.save_only) {  // a drain's save (awaits_feedback): the trainers saved after iteration p.iteration
      commit(ctx, p.iteration, it.actor->policy_version);
      return;
    }
    if (trains(it)) last_trained_it_ = p.iteration;
    if (S_ > 0 && p.checkpoint) commit_due_ = true;  // the synchronous loop sets it when it generates
    if (S_ > 0 && s.weights_wait_seconds > 0) ++waited_;  // the generator waited for this batch's weights
    const double gen_tps = s.generate_seconds > 0 ? s.generated_tokens / s.generate_seconds : 0;
    // a batch filter_groups dropped was scored (its groups' rewards were equal): its reward belongs in the
    // curves, else they skip exactly the all-0 and all-1 batches; a batch of too-short answers has no scores
    if (!p.eval && (!s.dropped || s.groups > 0)) {
      ctx.signal("reward", s.reward_mean, p.iteration);
      ctx.signal("kl", s.kl_mean, p.iteration);
      ctx.signal("answer_len", s.answer_len_mean, p.iteration);
      ctx.signal("generation_tokens_per_s", gen_tps, p.iteration);
    }
    if (p.eval) {
      // held-out passes: no step (-1), before then after (`flowrun report`); TensorBoard at the last iteration written
      ctx.signal("held_out/reward", s.reward_mean);
      ctx.signal("held_out/kl", s.kl_mean);
      ctx.signal("held_out/answer_len", s.answer_len_mean);
      ctx.print(fmt::format("[step 3 ppo] held-out {}: mean reward {:.4f} ± {:.4f}, KL to reference {:.4f}, answer "
                            "length {:.1f} ({} prompts)",
                            p.iteration == -1 ? "before" : "after", s.reward_mean, s.reward_stderr, shown4(s.kl_mean),
                            s.answer_len_mean, s.rows));
      if (p.iteration == -1) {
        eval_before_ = s.reward_mean;
        eval_before_se_ = s.reward_stderr;
      } else {
        const double se = std::sqrt(eval_before_se_ * eval_before_se_ + s.reward_stderr * s.reward_stderr);
        // the difference in standard errors of the difference (the two held-out passes are independent samples)
        ctx.print(fmt::format("[step 3 ppo] held-out mean reward {:.4f} -> {:.4f} ({:+.4f}{}), {:.1f} s", eval_before_,
                              s.reward_mean, s.reward_mean - eval_before_,
                              se > 0 ? fmt::format(", {:.1f} standard errors", (s.reward_mean - eval_before_) / se) : "",
                              since(t0_)));
      }
    } else if (s.dropped && s.groups > 0) {
      ctx.print(fmt::format("[step 3 ppo] iter {} reward {:.4f} kl {:.4f} answer_len {:.1f}: every group's rewards "
                            "were equal, batch dropped (filter_groups)",
                            p.iteration, s.reward_mean, shown4(s.kl_mean), s.answer_len_mean));
      commit_untrained(ctx, it);
    } else if (s.dropped) {
      ctx.print(fmt::format("[step 3 ppo] iter {}: every answer was too short, batch dropped (as DS-Chat)",
                            p.iteration));
      commit_untrained(ctx, it);
    } else if (!s.trains) {
      ctx.print(fmt::format("[step 3 ppo] iter {} reward {:.4f} kl {:.4f} answer_len {:.1f} gen {:.0f} tok/s "
                            "(experience kept for the next update)",
                            p.iteration, s.reward_mean, shown4(s.kl_mean), s.answer_len_mean, gen_tps));
      commit_untrained(ctx, it);
    } else if (S_ > 0 && !it.actor->updated) {  // max_staleness >= 1, drop: every item was too stale
      const stats_msg& a = *it.actor;
      stale_dropped_ += a.stale_dropped;
      ctx.signal("staleness", static_cast<double>(a.staleness), p.iteration);
      ctx.signal("stale_dropped", static_cast<double>(stale_dropped_), p.iteration);
      ctx.signal("stale_waited", static_cast<double>(waited_), p.iteration);
      ctx.print(fmt::format("[step 3 ppo] iter {} reward {:.4f} kl {:.4f} answer_len {:.1f}: sampled with policy "
                            "version {}, {} updates behind at training (max_staleness {}), batch dropped "
                            "(staleness_policy = \"drop\"; {} dropped so far)",
                            p.iteration, s.reward_mean, shown4(s.kl_mean), s.answer_len_mean, s.policy_version, a.staleness,
                            S_, stale_dropped_));
      if (commit_due_) commit(ctx, p.iteration, a.policy_version);
    } else {
      const stats_msg& a = *it.actor;
      const stats_msg c = s.with_critic ? *it.critic : stats_msg{};  // critic-free: no critic
      const double train_tps = (a.tokens + c.tokens) / std::max(1e-9, a.seconds + c.seconds);
      if (S_ > 0) stale_dropped_ += a.stale_dropped;  // generation batches of a multi-batch update too stale
      ctx.signal("actor_loss", a.loss, p.iteration);
      if (s.with_critic) ctx.signal("critic_loss", c.loss, p.iteration);
      ctx.signal("training_tokens_per_s", train_tps, p.iteration);
      if (a.scheduled) ctx.signal("actor_lr", a.lr, p.iteration);  // a rate that moves (lr_scheduler_type)
      if (s.with_critic && c.scheduled) ctx.signal("critic_lr", c.lr, p.iteration);
      ctx.print(fmt::format("[step 3 ppo] iter {} reward {:.4f} kl {:.4f} actor_loss {:.4f}{}{}{} "
                            "answer_len {:.1f}{} gen {:.0f} tok/s train {:.0f} tok/s{}{}",
                            p.iteration, s.reward_mean, shown4(s.kl_mean), shown4(a.loss),
                            a.scheduled ? fmt::format(" lr {:.2e}", a.lr) : "",
                            s.with_critic ? fmt::format(" critic_loss {:.4f}{}", shown4(c.loss),
                                                        c.scheduled ? fmt::format(" critic_lr {:.2e}", c.lr) : "")
                                          : "",
                            a.unsup_loss > 0 ? fmt::format(" unsup_loss {:.4f}", a.unsup_loss) : "",
                            s.answer_len_mean,
                            s.groups_kept < s.groups ? fmt::format(" groups {}/{}", s.groups_kept, s.groups) : "",
                            gen_tps, train_tps,
                            a.gather_theory_bytes > 0
                                ? fmt::format(" hybrid-engine gather {:.3f} MB/rank (theory {:.3f})",
                                              a.gather_bytes / 1e6, a.gather_theory_bytes / 1e6)
                                : "",
                            S_ > 0 ? async_suffix(s, a) : ""));
      ctx.metric("steps");
      // the time each phase's actor waited in this iteration: the interval since the last
      // trained batch's report (the run's first: since the batch went to the generator) less the
      // generator's and the policy's own time on the batch. Every trained iteration has its point:
      // a resumed run's first one replaces the point its START marker drops from the older run
      const double cycle = since(last_trained_ ? *last_trained_ : it.launched);
      ctx.signal("wait_seconds/generate", std::max(0.0, cycle - s.generate_seconds), p.iteration);
      ctx.signal("wait_seconds/train", std::max(0.0, cycle - a.seconds), p.iteration);
      last_trained_ = clk::now();
      if (S_ > 0) {  // the running counts at every trained batch, 0 included: a dashboard finds their series
        ctx.signal("staleness", static_cast<double>(a.staleness), p.iteration);
        ctx.signal("stale_dropped", static_cast<double>(stale_dropped_), p.iteration);
        ctx.signal("stale_waited", static_cast<double>(waited_), p.iteration);
      }
      if (commit_due_) commit(ctx, p.iteration, S_ > 0 ? a.policy_version : updates_);
    }
  }

  // max_staleness >= 1: the version the batch was sampled with, how stale it was when trained,
  // the weight snapshot the policy copied for the generator, the wait for weights (wait
  // policy), and the stale batches of a multi-batch update that were dropped (drop policy).
  std::string async_suffix(const summary_msg& s, const stats_msg& a) const {
    std::string out = fmt::format(" policy v{} staleness {}", s.policy_version, a.staleness);
    if (a.snapshot_bytes > 0) out += fmt::format(" snapshot {:.3f} MB", a.snapshot_bytes / 1e6);
    if (s.weights_wait_seconds > 0) out += fmt::format(" waited {:.3f} s for weights", s.weights_wait_seconds);
    if (a.stale_dropped > 0)
      out += fmt::format(" ({} stale generation batches dropped; {} so far)", a.stale_dropped, stale_dropped_);
    return out;
  }

  // ---- max_staleness = S >= 1: the pipelined loop. Batch k + 1 is asked for as soon as batch k is
  // sent to the generator, while at most S + 1 batches are between the start of their generation
  // and the end of their training (the report), so the generator works on k + 1 while k is scored
  // and trained (veRL's one-step-off at S = 1); reports stay in order. A held-out
  // batch is generated only when nothing else is in flight (after every update before it), and
  // the next batch is asked for only after it is reported: held-out passes stay synchronous.

  void on_async(actor::node_context& ctx, std::string_view port, const actor::payload& msg) {
    if (port == "prompts") {
      if (!outstanding_)
        throw std::logic_error(fmt::format("node '{}': a prompt batch arrived that was not asked for (the prompt "
                                           "loader must wait for `next`)",
                                           ctx.name()));
      outstanding_ = false;
      const auto& p = msg.as<prompt_msg>();
      if (p.eval && !flight_.empty())
        held_eval_ = p;  // after the updates of every batch in flight
      else
        launch(ctx, p);
    } else if (port == "summary") {
      const auto& s = msg.as<summary_msg>();
      auto x = std::find_if(flight_.begin(), flight_.end(),
                            [&](const iteration& f) { return !f.summary && f.prompts->iteration == s.iteration; });
      if (x == flight_.end())
        throw std::logic_error(fmt::format("node '{}': a summary of iteration {}, which is not in flight", ctx.name(),
                                           s.iteration));
      x->summary = s;
      x->summarised = clk::now();
      if (x->prompts->save_only) {
        pump(ctx);
        return;
      }
      const int64_t step = x->prompts->eval ? -1 : s.iteration;
      ctx.signal("phase_seconds/generate", s.generate_seconds, step);
      ctx.signal("phase_seconds/score_and_experience", std::max(0.0, since(x->launched) - s.generate_seconds), step);
    } else {  // the trainers' stats name the training batch (the last of their experience batch)
      const bool actor = port == "actor_stats";
      const auto& st = msg.as<stats_msg>();
      auto x = std::find_if(flight_.begin(), flight_.end(), [&](const iteration& f) {
        return !f.prompts->eval && f.prompts->iteration == st.iteration && !(actor ? f.actor : f.critic);
      });
      if (x == flight_.end())
        throw std::logic_error(fmt::format("node '{}': {} of iteration {}, which is not in flight", ctx.name(), port,
                                           st.iteration));
      (actor ? x->actor : x->critic) = st;
      if (actor && st.updated) ++updates_;
    }
    pump(ctx);
  }

  static bool complete(const iteration& x) {
    return x.summary && ((!trains(x) && !x.summary->saves) || (x.actor && (!x.summary->with_critic || x.critic)));
  }

  // Reports what is complete, oldest first; then asks for the next batch if it may.
  void pump(actor::node_context& ctx) {
    while (!flight_.empty() && complete(flight_.front())) {
      const iteration& x = flight_.front();
      if (trains(x)) ctx.signal("phase_seconds/train", since(x.summarised), x.prompts->iteration);
      report(ctx, x);
      flight_.pop_front();
      if (flight_.empty() && held_eval_) {
        prompt_msg p = std::move(*held_eval_);
        held_eval_.reset();
        if (ctx.draining())  // a drain generates nothing more (awaits_feedback)
          ctx.log().info("the run drains: the held-out batch is not generated");
        else
          launch(ctx, std::move(p));
      }
    }
    if (!outstanding_ && !held_eval_ && !newest_.ticked && (!newest_.ends_stream || flight_.empty()) &&
        static_cast<int64_t>(flight_.size()) < S_ + 1) {
      newest_.ticked = true;
      outstanding_ = true;
      ctx.emit("next", actor::payload::make("tick", newest_.iteration));
    }
    const char* ph = flight_.empty() ? "wait_prompts" : flight_.front().summary ? "train" : "generate_experience";
    if (ph != async_phase_) show_phase(ctx, async_phase_ = ph);
  }

  // Stamps the batch with the updates reported so far and the staleness settings, and asks the
  // generator to roll it out.
  void launch(actor::node_context& ctx, prompt_msg p) {
    p.policy_version = updates_;
    p.max_staleness = S_;
    p.drop_stale = drop_;
    p.checkpoint = checkpoint_due(ctx, p);
    if (!p.eval) last_batch_ = p;
    newest_ = {p.iteration, p.eval || p.last, false};
    iteration x;
    x.prompts = p;
    x.launched = clk::now();
    flight_.push_back(std::move(x));
    ctx.emit("generate", actor::payload::make("prompt_batch", std::move(p)));
  }

  // The last iteration trained nothing, and the trainers saved the checkpoint due with it before they
  // reported (summary_msg::saves): commit it.
  void commit_untrained(actor::node_context& ctx, const iteration& it) {
    if (!it.summary->saves || !commit_due_) return;
    commit(ctx, it.prompts->iteration, S_ > 0 ? it.actor->policy_version : updates_);
  }

  // The trainers saved their shards of this update before they reported: commit it. A
  // stamped batch that did not train (dropped, or kept) is committed with the next update,
  // the one whose save it asked for (the experience maker carries the stamp to it); at the
  // run's last iteration there is none, and the trainers save without one (commit_untrained).
  void commit(actor::node_context& ctx, int64_t iteration, int64_t version) {
    commit_due_ = false;
    last_committed_ = iteration;
    commit_.eval_before = eval_before_;
    commit_.eval_before_stderr = eval_before_se_;
    commit_.committed.push_back({iteration + 1, version});
    ppo::write_step3_commit(dir_, commit_);
    ppo::prune_step3(dir_, commit_, keep_);
    ctx.print(fmt::format("[step 3 ppo] checkpoint after iteration {} -> {}", iteration, dir_));
  }

  // ---- phase bookkeeping

  // The step of this iteration's signals in TensorBoard: its number, as the printed lines say
  // ("iter K"); -1 (the console only) for a held-out pass.
  int64_t tb_step() const { return it_.prompts && !it_.prompts->eval ? it_.prompts->iteration : -1; }

  void enter(actor::node_context& ctx, phase p) {
    phase_ = p;
    phase_start_ = clk::now();
    show_phase(ctx, name(p));
  }
  // The phase the console and the status header show. Until the first experience comes back the
  // controller's phases say nothing true of the job: the held-out batch reaches it at the job's
  // start, while steps 1 and 2 still train (the generator waits for their models), so they show
  // from the first summary on; until then the header shows the trainers' and the generator's.
  void show_phase(actor::node_context& ctx, const char* p) {
    shown_ = p;
    if (step3_runs_) ctx.phase(shown_);
  }
  static const char* name(phase p) {
    switch (p) {
      case phase::wait_prompts: return "wait_prompts";
      case phase::generate_experience: return "generate_experience";
      case phase::train: return "train";
      case phase::report: return "report";
    }
    return "?";
  }

  /// What arrived for the current iteration.
  struct iteration {
    std::optional<prompt_msg> prompts;
    std::optional<summary_msg> summary;
    std::optional<stats_msg> actor, critic;
    clk::time_point launched;    // when it was sent to the generator
    clk::time_point summarised;  // max_staleness >= 1: when its summary came
  };

  phase phase_ = phase::wait_prompts;
  clk::time_point phase_start_, t0_;
  iteration it_;
  int64_t updates_ = 0;     // policy updates reported so far (the policy's version)
  double eval_before_ = 0;     // the held-out reward before training
  double eval_before_se_ = 0;  // ... and its standard error
  // step-3 checkpoints (models/rlhf/ppo_checkpoint.h)
  std::string dir_;
  int64_t save_every_ = 0;
  int keep_ = 2;
  bool commit_due_ = false;
  ppo::step3_commit commit_;
  // a drain's save (awaits_feedback): the last iteration trained and the last committed (-1: none), the
  // last training batch sent to the generator (the save's template), and whether the save went out
  int64_t last_trained_it_ = -1, last_committed_ = -1;
  std::optional<prompt_msg> last_batch_;
  bool drain_save_ = false;
  // max_staleness >= 1 (on_async)
  int64_t S_ = 0;       // max_staleness
  bool drop_ = false;   // staleness_policy = "drop"
  std::deque<iteration> flight_;        // generated and not yet reported, in generation order
  std::optional<prompt_msg> held_eval_;  // a held-out batch waiting for the batches in flight
  bool outstanding_ = true;  // a batch is on its way from the loader (the first comes unasked)
  struct {
    int64_t iteration = 0;
    // a held-out batch (synchronous), or the loader's last (asked for another, the loader ends
    // its stream, which would end this node and the ones after it with batches in flight)
    bool ends_stream = false;
    bool ticked = true;
  } newest_;  // the batch launched last: `next` is sent once per batch
  int64_t stale_dropped_ = 0, waited_ = 0;
  std::optional<clk::time_point> last_trained_;  // when the last trained batch was reported
  const char* async_phase_ = nullptr;
  bool step3_runs_ = false;  // a summary has arrived: the controller's phases show (show_phase)
  std::string shown_;        // the phase it is in, shown once step3_runs_
};

}  // namespace

void register_ppo_controller(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"ppo_controller",
                     "owns the PPO loop: generate_experience, train, report per prompt batch; prints each iteration"};
  k.single_replica = "it owns the loop, and two would drive it twice";
  k.input("prompts", "prompt_batch", "prompt batches from the loader")
      .input("summary", "summary", "rewards and KL of a batch", true, true)
      .input("actor_stats", "stats", "the policy's update", true, true)
      .input("critic_stats", "stats", "the critic's update (none with a critic-free estimator)", false, true)
      .output("generate", "prompt_batch", "prompts for the generator", true)
      .output("next", "tick", "ask the loader for the next batch", true)
      .option("save_checkpoint_steps", T::int_, std::int64_t{0},
              "with [graph] checkpoint_dir: the policy and critic save and the controller commits every N "
              "iterations and after the last (0: never); the same command resumes from the last commit")
      .at_least(0)
      .option("keep_checkpoints", T::int_, std::int64_t{2}, "committed iterations kept (the older ones removed)")
      .at_least(2)
      .option("max_staleness", T::int_, std::int64_t{0},
              "asynchronous RLHF: the generator may run up to this many policy updates ahead of training (at most "
              "max_staleness + 1 batches between generation and the end of their training); 0: the synchronous "
              "loop of DS-Chat, bit for bit (docs/rlhf.md)")
      .in_range(0, 8)
      .option("staleness_policy", T::string, std::string("wait"),
              "max_staleness >= 1: wait (the generator waits for the weights the controller stamped, so no batch "
              "is staler than max_staleness) or drop (the generator samples with the newest weights it has, never "
              "waiting; a batch staler than max_staleness at training is dropped and counted)");
  // DS-Chat's flags that are the generator's here
  k.known_as("print_answers", "DS-Chat's --print_answers is the rollout_generator's print_answers here (with "
                              "print_answers_interval): --set node.GENERATOR.print_answers=true")
      .known_as("print_answers_interval", "DS-Chat's --print_answers_interval is the rollout_generator's here");
  for (const char* flag : {"enable_test_mode", "test_stop_step"})
    k.known_as(flag, "DS-Chat's --enable_test_mode --test_stop_step N is the prompt loader's iterations = N here "
                     "(the run's length)");
  // OpenRLHF's and veRL's names for asynchronous training
  k.known_as("async_train", "OpenRLHF's --async_train is max_staleness >= 1 here (0: the synchronous loop)")
      .known_as("staleness_threshold", "the policy updates the generator may run ahead is max_staleness here")
      .known_as("off_policy_steps", "the policy updates the generator may run ahead is max_staleness here");
  k.check = [](const graph::node_spec& n, const graph::graph_spec&) -> std::vector<graph::node_kind::problem> {
    // flowrun launch runs the whole graph in every process: P controllers, generators and prompt loaders, whose
    // policies' ranks met in one group while only rank 0 handed its generator weights, so the others' loops
    // never started and the first collective waited until comm_timeout_s (300 s, nothing printed)
    if (process_count() > 1)
      return {{"", fmt::format("node '{}': flowrun launch --nproc {} runs the whole step-3 graph in every process "
                               "(one loop, generator and prompt loader each): their ranks would wait for each other",
                               n.name, process_count()),
               "run the graph without launch; to spread the policy's and critic's ranks over processes, run it as "
               "a cluster (on = \"main,w1\" with comm_backend = \"gloo\": docs/rlhf.md \"Across processes\")"}};
    const auto p = n.get_string("staleness_policy");
    if (p != "wait" && p != "drop")
      return {{"staleness_policy", "staleness_policy = \"" + p + "\" is not a policy", "use \"wait\" or \"drop\""}};
    return {};
  };
  actor::add_tensorboard_settings(k);
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new ppo_controller); });
}

}  // namespace flowrun::actors
