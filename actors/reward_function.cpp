// The `reward_function` node kind: rule-based ("verifiable") rewards for the rollouts of
// step 3, in place of a reward model (docs/rlhf.md, GRPO). Built-in rules are the pure
// functions of models/rlhf/rule_rewards.h; a user's own scorer is a child process that
// answers JSON lines (runtime/util/line_process.h), so a Python function works unchanged:
//
//   import json, sys
//   for line in sys.stdin:
//       s = json.loads(line)          # {"prompt", "completion", "reference", "iteration", "row"}
//       print(my_score(s["completion"], s["reference"]))   # a number, or {"reward": number}
//
// Ports: in `rollouts` (rollouts), out `scored` (scores: (B,) f32, one reward per row), joined
// by the experience maker like a reward model's scores.
#include <cmath>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/dschat_common.h"
#include "actors/resume_check.h"
#include "actors/reward_function.h"
#include "actors/rlhf_types.h"
#include "models/rlhf/rule_rewards.h"
#include "runtime/util/line_process.h"

namespace flowrun::actors {

namespace {

// The pass a rollout batch belongs to, for messages (prompt_msg: held-out batches are -1 and -2).
std::string pass_name(int64_t iteration) {
  if (iteration == -1) return "held-out pass before training";
  if (iteration == -2) return "held-out pass after training";
  return fmt::format("iteration {}", iteration);
}

/// Scores each rollout row: decodes its prompt and answer, then applies the rule (or asks the
/// command) and adds the overlong penalty when it is on.
class reward_function final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    tok_ = load_tok(ctx);
    reward_ = s.get_string("reward");
    format_score_ = s.get_float("format_score");
    overlong_max_ = s.get_int("overlong_max_length");
    overlong_cache_ = s.get_int("overlong_cache_length");
    on_error_ = s.get_string("on_error");
    max_in_a_row_ = s.get_int("max_consecutive_errors");
    timeout_ = std::chrono::milliseconds(static_cast<int64_t>(s.get_float("timeout_s") * 1000.0));
    startup_ = std::chrono::milliseconds(static_cast<int64_t>(s.get_float("startup_timeout_s") * 1000.0));
    if (reward_ == "command") proc_ = std::make_unique<line_process>(s.get_string("command"));
    // the rule and its scores (the held-out reward before training, kept in step3.json, is
    // compared with the one after: another format_score made a gain of nothing but the scale)
    // (on_error changes no reward a run without errors gets; the stop message advises it)
    check_step3_settings(ctx, {"timeout_s", "startup_timeout_s", "on_error", "max_consecutive_errors"});
  }

  void on_message(actor::node_context& ctx, std::string_view, actor::payload msg) override {
    auto r = msg.shared<rollout_msg>();
    ctx.phase("scoring");
    score_msg out;
    out.rollouts = r;
    if (r->exp) {
      const auto& e = *r->exp;
      const int64_t B = e.seq.size(0);
      out.value = tensor::empty({B});
      for (int64_t b = 0; b < B; ++b) {
        const auto [prompt, answer] = ppo::rollout_row_ids(e, b);
        const int64_t src = e.source_rows.empty() ? b : e.source_rows[static_cast<size_t>(b)];
        const std::string reference =
            src < static_cast<int64_t>(r->references.size()) ? r->references[static_cast<size_t>(src)] : "";
        double v = score(ctx, *r, b, tok_->decode(prompt), tok_->decode(answer), reference);
        if (overlong_max_ > 0) v += rlhf::overlong_penalty(e.answer_len[static_cast<size_t>(b)], overlong_max_,
                                                           overlong_cache_);
        out.value.data<float>()[b] = static_cast<float>(v);
      }
      if (proc_ && !ctx.stop_requested()) check_in_step(ctx, *r, out.value);
      ctx.metric("samples", B);
    }
    ctx.emit("scored", actor::payload::make("scores", std::move(out)));
  }

  void stop(actor::node_context& ctx) override {
    if (proc_) proc_->stop();
    if (errors_ > 0)
      ctx.print(fmt::format("[reward_function] {}: {} sample(s) scored 0 after an error of the command (on_error = "
                            "\"zero\")",
                            ctx.name(), errors_));
  }

 private:
  double score(actor::node_context& ctx, const rollout_msg& r, int64_t row, const std::string& prompt,
               const std::string& completion, const std::string& reference) {
    if (reward_ == "gsm8k") {
      if (reference.empty() && !warned_) {
        warned_ = true;
        ctx.log().warn("the prompts carry no reference answers (the data's `chosen`): every gsm8k score is 0");
      } else if (!warned_ && !rlhf::gsm8k_reference_answer(reference)) {
        warned_ = true;  // once: the data's answers are of one kind
        auto cut = [](const std::string& s) { return s.size() > 60 ? s.substr(0, 60) + "..." : s; };
        ctx.log().warn("the reference answer \"{}\" of the prompt \"{}\" holds no number (gsm8k wants \"#### N\" or "
                       "a bare number): no answer can score 1 against it, a well-formed one scores format_score",
                       cut(reference), cut(prompt));
      }
      return rlhf::gsm8k_exact_match(completion, reference, format_score_);
    }
    if (reward_ == "format") return rlhf::final_answer_format(completion);
    // the user's command: one JSON line out, one number back
    if (ctx.stop_requested()) return 0.0;  // the run is stopping: nothing scored now is used
    const nlohmann::json q = {{"prompt", prompt}, {"completion", completion}, {"reference", reference},
                              {"iteration", r.iteration}, {"row", row}};
    // the first answer of a fresh command also waits for its start-up (imports, a model to load)
    const bool fresh = !proc_->running();
    const auto a = proc_->ask(q.dump(), fresh ? timeout_ + startup_ : timeout_, [&ctx] { return ctx.stop_requested(); });
    if (!a.line && ctx.stop_requested()) return 0.0;
    std::string why;
    double v = 0;
    if (!a.line) {
      why = "the command " + a.error;
      if (a.error.find("gave no answer") != std::string::npos && fresh)
        why += fmt::format(" (its first answer, which includes its start-up: timeout_s + startup_timeout_s = {:g} s; "
                           "raise startup_timeout_s for a scorer that loads a model, or check that it answers each "
                           "line as it arrives and flushes)",
                           std::chrono::duration<double>(timeout_ + startup_).count());
      else if (a.error.find("gave no answer") != std::string::npos)
        why += " (a command must answer each line as it arrives, on one line, and flush its output: Python's "
               "print flushes here, PYTHONUNBUFFERED is set; awk needs fflush(), sed -u)";
      if (!a.stderr_tail.empty()) why += "; its stderr ends:\n" + a.stderr_tail;
    } else {
      try {
        const auto j = nlohmann::json::parse(*a.line);
        const auto& num = j.is_object() && j.contains("reward") ? j.at("reward") : j;
        if (!num.is_number()) throw std::invalid_argument("not a number");
        v = num.get<double>();
        if (!std::isfinite(v) || !std::isfinite(static_cast<float>(v))) {
          why = "the command answered " + a.line->substr(0, 200) +
                ", which is not finite as a 32-bit float (rewards are f32: at most about 3.4e38 in magnitude)";
        } else {
          in_a_row_ = 0;
          return v;
        }
      } catch (const std::exception&) {
        why = "the command answered \"" + a.line->substr(0, 200) +
              "\", which is not a number (expected a JSON number, or {\"reward\": number}, on one line)";
      }
    }
    const std::string where =
        fmt::format("node '{}' (reward_function, command `{}`), {}, sample {} (completion \"{}\"): {}", ctx.name(),
                    proc_->command(), pass_name(r.iteration), row, completion.substr(0, 80), why);
    if (on_error_ == "stop")
      throw std::runtime_error(where + "\n(on_error = \"zero\" scores such samples 0 and goes on)");
    ++errors_;
    // a scorer that fails every sample trains on nothing: with a timeout, each failure waited timeout_s +
    // startup_timeout_s (70 s by default), hours per batch, and a run of nothing but errors ended with exit 0
    if (++in_a_row_ >= max_in_a_row_ && max_in_a_row_ > 0)
      throw std::runtime_error(fmt::format("{}\n(the command failed on {} samples in a row, max_consecutive_errors: "
                                           "on_error = \"zero\" scores a failing sample 0, but a scorer that fails "
                                           "every one trains on nothing; fix the command, or raise "
                                           "max_consecutive_errors, 0 for no limit)",
                                           where, in_a_row_));
    ctx.log().warn("{}; scored 0 (on_error = \"zero\")", where);
    ctx.metric("errors");
    return 0.0;
  }

  // A command that wrote more lines than it was asked answered out of step: its last extra line
  // shows only after the batch's last question (ask() catches the earlier ones). The batch's
  // rewards are not used: the run stops, or with on_error = "zero" they are all 0.
  void check_in_step(actor::node_context& ctx, const rollout_msg& r, tensor& rewards) {
    const auto extra = proc_->extra_output(std::chrono::milliseconds(20));
    if (!extra) return;
    const std::string where = fmt::format(
        "node '{}' (reward_function, command `{}`), {}: the command wrote \"{}\" after the batch's last answer: "
        "it answers more than one line per question, so its answers were out of step with the samples",
        ctx.name(), proc_->command(), pass_name(r.iteration), *extra);
    if (on_error_ == "stop") throw std::runtime_error(where + "\n(on_error = \"zero\" scores such a batch 0 and goes on)");
    errors_ += rewards.numel();
    ctx.log().warn("{}; the batch's {} samples scored 0 (on_error = \"zero\")", where, rewards.numel());
    ctx.metric("errors", rewards.numel());
    for (int64_t i = 0; i < rewards.numel(); ++i) rewards.data<float>()[i] = 0.0f;
  }

  std::unique_ptr<tokenizer> tok_;
  std::string reward_, on_error_;
  double format_score_ = 0;
  int64_t overlong_max_ = 0, overlong_cache_ = 0, errors_ = 0;
  int64_t in_a_row_ = 0, max_in_a_row_ = 10;  // the command's failures since its last good answer; the limit
  std::chrono::milliseconds timeout_{10000};
  std::chrono::milliseconds startup_{60000};  // added to the first answer of a fresh command
  std::unique_ptr<line_process> proc_;
  bool warned_ = false;
};

}  // namespace

void register_reward_function(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  graph::node_kind k{"reward_function",
                     "rule-based rewards for rollouts (GSM8K exact match, answer format, your own scorer command) in "
                     "place of a reward model"};
  k.blocking = true;  // a command's answers are waited for
  k.known_as("reward_funcs", "TRL's reward_funcs is reward here: a rule (gsm8k, format) or your own scorer "
                             "(reward = \"command\" with command = ...: several rewards summed by one scorer)");
  k.input("rollouts", "rollouts", "sequences to score")
      .output("scored", "scores", "one reward per row", true)
      .require("tokenizer", T::path, "the policy's tokenizer (decodes prompts and answers)")
      .option("reward", T::string, std::string("gsm8k"),
              "gsm8k: 1 when the answer's last \"#### N\" equals the reference's (numbers normalised: \"1,080\" = "
              "\"1080\", \"42.0\" = \"42\"), else format_score for a well-formed wrong answer, else 0; format: 1 when "
              "the answer ends with a \"#### N\" line; command: ask `command`")
      .option("format_score", T::float_, 0.0,
              "gsm8k: the reward of a well-formed wrong answer (veRL's), below a right answer's 1 (at 1 or more a "
              "wrong answer scores as much or more, and training learns the format only: reward = \"format\" "
              "says so)")
      .below(1)
      .option("overlong_max_length", T::int_, std::int64_t{0},
              "DAPO's soft overlong punishment: answers near and over this many tokens lose up to 1 (0: off)")
      .at_least(0)
      .option("overlong_cache_length", T::int_, std::int64_t{0},
              "the length of the punishment's ramp before overlong_max_length (DAPO's L_cache)")
      .at_least(0)
      .option("command", T::string, std::string(""),
              "reward = command: a shell command that reads one JSON object per line on stdin ({\"prompt\", "
              "\"completion\", \"reference\", \"iteration\" (-1: the held-out pass before training, -2: after), "
              "\"row\"}) and answers each with one line, a number or {\"reward\": number}, flushed as it is "
              "asked; it runs under /bin/sh -c in flowrun's working directory, with PYTHONUNBUFFERED=1, in a "
              "process group of its own (killed whole on a timeout, and when flowrun dies, even by kill -9)")
      .option("timeout_s", T::float_, 10.0, "the longest wait for one answer of the command").above(0)
      .option("startup_timeout_s", T::float_, 60.0,
              "added to timeout_s for the first answer of a command just started (or restarted): its imports "
              "and model loading")
      .at_least(0)
      .option("on_error", T::string, std::string("stop"),
              "when the command crashes, times out, answers something that is not a finite number, or answers "
              "more lines than it was asked: stop (the run fails with the node, the sample and the command's "
              "stderr) or zero (the sample scores 0, a warning is logged, the command is restarted)")
      .option("max_consecutive_errors", T::int_, std::int64_t{10},
              "on_error = zero: the run stops when the command fails on this many samples in a row (a broken "
              "scorer, not a flaky sample); 0: no limit")
      .at_least(0);
  k.check = [](const graph::node_spec& n, const graph::graph_spec&) {
    std::vector<graph::node_kind::problem> problems;
    const auto& r = n.get_string("reward");
    if (r != "gsm8k" && r != "format" && r != "command")
      problems.push_back({"reward", "reward = \"" + r + "\" is not a rule here", "use gsm8k, format or command"});
    if (r == "command" && n.get_string("command").empty())
      problems.push_back({"command", "reward = \"command\" needs the command to run",
                          "set command, e.g. \"python3 my_reward.py\""});
    if (r != "command" && !n.get_string("command").empty())  // the user's scorer would never run
      problems.push_back({"command", "command is set, but reward = \"" + r + "\" scores with the built-in rule",
                          "set reward = \"command\" to score with the command, or remove command"});
    // settings of another rule, written, do nothing: said, not refused (a graph file may carry them for one rule
    // and a --set pick another)
    auto idle = [&](const char* key, const char* why) {
      if (const auto* w = n.find_setting(key); w && !w->from_default)
        spdlog::warn("node '{}': {} = {} changes nothing with reward = \"{}\": {}", n.name, key,
                     graph::to_string(w->value), r, why);
    };
    if (r != "gsm8k") idle("format_score", "it is the gsm8k rule's score for a well-formed wrong answer");
    if (r != "command")
      for (const char* key : {"timeout_s", "startup_timeout_s", "on_error", "max_consecutive_errors"})
        idle(key, "it is about the command's answers (reward = \"command\")");
    const auto& e = n.get_string("on_error");
    if (e != "stop" && e != "zero")
      problems.push_back({"on_error", "on_error = \"" + e + "\" is not a policy here", "use stop or zero"});
    const int64_t cache = n.get_int("overlong_cache_length"), max = n.get_int("overlong_max_length");
    if (cache > 0 && max == 0)
      problems.push_back({"overlong_cache_length",
                          fmt::format("overlong_cache_length = {} has no effect: the overlong penalty is off "
                                      "(overlong_max_length = 0)", cache),
                          "set overlong_max_length to the answer length where the penalty reaches -1"});
    else if (cache > max)
      problems.push_back({"overlong_cache_length",
                          fmt::format("overlong_cache_length = {} is longer than overlong_max_length = {}", cache, max),
                          "make overlong_cache_length at most overlong_max_length"});
    return problems;
  };
  actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new reward_function); });
}

}  // namespace flowrun::actors
