// The step-3 controller (actors/ppo_controller.cpp) on CAF's deterministic test scheduler
// (the runtime's own: caf::scheduler::test_coordinator, as tests/test_actor_runtime.cpp).
// The real ppo_controller runs in a real graph between two scripted stand-ins:
//
//   script_loader.batch -> ppo_controller.prompts          the prompt loader: sends the scripted
//   ppo_controller.next -> script_loader.next              batches, one per tick
//   ppo_controller.generate -> script_rollout.prompts      everything between generate and the
//   script_rollout.{summary,actor_stats,critic_stats}      stats: answers each batch with the
//     -> ppo_controller.{summary,actor_stats,critic_stats}  scripted summary and trainer stats
//
// The tests assert every message the controller sent (the generate batches with their
// policy_version and checkpoint stamps, the ticks), every line it printed (standard output,
// captured), its console signals and phases, and the step-3 commit it wrote.
#include <doctest/doctest.h>

#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <nlohmann/json.hpp>

#include "actors/ppo_controller.h"
#include "actors/rlhf_types.h"
#include "actors/trainer_order.h"
#include "models/rlhf/ppo_checkpoint.h"
#include "models/train/shard_checkpoint.h"
#include "runtime/actor/job.h"
#include "runtime/actor/node.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"
#include "stdout_capture.h"

using namespace flowrun;
using namespace flowrun::actors;
namespace fs = std::filesystem;

namespace {

// -- the script: what the stand-ins send, and what they got ------------------------------

/// How the stand-in for generate -> score -> experience -> train answers one batch.
struct turn {
  summary_msg summary;
  bool stats = false;        ///< the trainers report (the batch completed an experience batch)
  bool stats_first = false;  ///< the stats arrive before the summary
  stats_msg actor, critic;   ///< the critic's only when summary.with_critic (GAE)
};

struct script_state {
  std::mutex m;
  std::vector<prompt_msg> batches;  // the loader's batches, in order
  std::map<int64_t, turn> turns;    // iteration -> the answer to its generate
  std::vector<int64_t> ticks;       // what the loader got on `next`
  std::vector<prompt_msg> generate; // what the controller sent on `generate`
  bool loader_waits = true;         // false: a loader that sends every batch at once
  int64_t save_version = 0;         // a drain's save (prompt_msg::save_only): the version the trainers report
  void reset() {
    batches.clear();
    turns.clear();
    ticks.clear();
    generate.clear();
    loader_waits = true;
    save_version = 0;
  }
};
script_state script;

class script_loader final : public actor::node {
 public:
  bool produce(actor::node_context& ctx) override {
    std::lock_guard<std::mutex> lock(script.m);
    if (next_ >= script.batches.size()) return false;
    ctx.emit("batch", actor::payload::make("prompt_batch", script.batches[next_++]));
    if (script.loader_waits) ctx.wait_for_input();  // the next batch when the controller ticks
    return true;
  }
  void on_message(actor::node_context&, std::string_view, actor::payload msg) override {
    std::lock_guard<std::mutex> lock(script.m);
    script.ticks.push_back(msg.as<int64_t>());
  }

 private:
  std::size_t next_ = 0;
};

// A drain's save (prompt_msg::save_only), answered as the graph answers it: the experience maker's summary that
// saves, and the policy's and critic's stats of a save without training (ppo_nodes.cpp save_untrained), at `version`.
void answer_save(actor::node_context& ctx, int64_t iteration, int64_t version) {
  summary_msg s;
  s.iteration = iteration;
  s.saves = true;
  ctx.emit("summary", actor::payload::make("summary", s));
  stats_msg st;
  st.iteration = iteration;
  st.updated = false;
  st.policy_version = version;
  ctx.emit("actor_stats", actor::payload::make("stats", st));
  ctx.emit("critic_stats", actor::payload::make("stats", st));
}

class script_rollout final : public actor::node {
 public:
  void on_message(actor::node_context& ctx, std::string_view, actor::payload msg) override {
    std::lock_guard<std::mutex> lock(script.m);
    const auto& p = msg.as<prompt_msg>();
    script.generate.push_back(p);
    if (p.save_only) {
      answer_save(ctx, p.iteration, script.save_version);
      return;
    }
    const turn& t = script.turns.at(p.iteration);
    auto stats = [&] {
      ctx.emit("actor_stats", actor::payload::make("stats", t.actor));
      if (t.summary.with_critic) ctx.emit("critic_stats", actor::payload::make("stats", t.critic));
    };
    if (t.stats && t.stats_first) stats();
    ctx.emit("summary", actor::payload::make("summary", t.summary));
    if (t.stats && !t.stats_first) stats();
  }
};

void register_script_kinds(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  actor::register_node_kind(kinds, factories,
                            graph::node_kind{"script_loader", "scripted prompt batches"}
                                .input("next", "tick", "", true, true)
                                .output("batch", "prompt_batch"),
                            [] { return std::unique_ptr<actor::node>(new script_loader); });
  actor::register_node_kind(kinds, factories,
                            graph::node_kind{"script_rollout", "scripted summaries and stats"}
                                .input("prompts", "prompt_batch")
                                .output("summary", "summary")
                                .output("actor_stats", "stats")
                                .output("critic_stats", "stats"),
                            [] { return std::unique_ptr<actor::node>(new script_rollout); });
}

// -- standard output, captured (the controller prints through node_context::print) -----------

using test::stdout_capture;  // tests/stdout_capture.h

// -- fixture: the graph on the deterministic scheduler ---------------------------------------

const char* graph_toml = R"(
edges = [
  "loader.batch -> ppo_controller.prompts",
  "ppo_controller.generate -> rollout.prompts",
  "rollout.summary -> ppo_controller.summary",
  "rollout.actor_stats -> ppo_controller.actor_stats",
  "rollout.critic_stats -> ppo_controller.critic_stats",
  "ppo_controller.next -> loader.next",
]
[graph]
checkpoint_dir = "DIR"
[node.loader]
kind = "script_loader"
[node.rollout]
kind = "script_rollout"
[node.ppo_controller]
kind = "ppo_controller"
save_checkpoint_steps = 2
)";

struct fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  graph::node_kind_registry kinds;
  actor::node_factory_registry factories;
  fs::path dir;
  std::vector<std::string> printed;  // the controller's lines ("[step 3 ppo] ...") of the last run()

  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    c.set("logger.inline-output", true);
    return c;
  }
  fixture() : sys(init(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    register_script_kinds(kinds, factories);
    register_ppo_controller(kinds, factories);
    dir = fs::temp_directory_path() / ("flowrun_test_ppo_controller_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);  // in a real run the trainers have written their shards there
  }
  ~fixture() {
    sched.run();
    fs::remove_all(dir);
  }

  /// Runs the graph to its end (every job in order), capturing what it prints; the job, for
  /// its signals. `ok`: it must exit 0. `sigterm_at` >= 0: a SIGTERM the moment the stand-in has
  /// answered the batch of that iteration (its summary and stats not yet handled by the controller).
  actor::job run(bool ok = true, int64_t sigterm_at = -1, bool checkpoint_dir = true) {
    std::string toml = graph_toml;
    toml.replace(toml.find("DIR"), 3, dir.string());
    if (!checkpoint_dir) toml.erase(toml.find("[graph]"), toml.find("[node.loader]") - toml.find("[graph]"));
    auto parsed = graph::parse_graph_string(toml, "test.graph");
    INFO(graph::format_errors(parsed.errors));
    REQUIRE(parsed.ok());
    graph::validate_options vo;
    vo.check_files = false;
    auto v = graph::validate(parsed.spec, kinds, vo);
    INFO(graph::format_errors(v.errors));
    REQUIRE(v.ok());
    actor::run_options o;
    o.progress = false;
    o.summary = false;
    std::optional<actor::job> j;
    {
      stdout_capture out;  // no assertion inside: doctest reports on standard output too
      auto launched = actor::launch(sys, v.spec, kinds, factories, o);
      if (launched) {
        j = *launched;
        if (sigterm_at < 0) {
          sched.run();
        } else {
          auto answered = [&] {
            std::lock_guard<std::mutex> lock(script.m);
            return std::any_of(script.generate.begin(), script.generate.end(),
                               [&](const prompt_msg& p) { return !p.eval && p.iteration == sigterm_at; });
          };
          bool sent = false;
          while (sched.try_run_once())
            if (!sent && answered()) {
              actor::interrupt(*j, SIGTERM);
              sent = true;
            }
        }
      }
      printed = out.lines("[step 3 ppo]");
    }
    REQUIRE(j.has_value());
    REQUIRE(j->state->finished());
    if (ok) {
      INFO(j->state->error());
      CHECK(j->state->exit_code() == 0);
    }
    return *j;
  }
};

prompt_msg batch(int64_t iteration, bool eval = false) {
  prompt_msg p;
  p.iteration = iteration;
  p.eval = eval;
  return p;
}

summary_msg summary(int64_t iteration, double reward, double kl, double answer_len, int64_t tokens, double seconds) {
  summary_msg s;
  s.iteration = iteration;
  s.reward_mean = reward;
  s.kl_mean = kl;
  s.answer_len_mean = answer_len;
  s.generated_tokens = tokens;
  s.generate_seconds = seconds;
  s.rows = 8;
  return s;
}

stats_msg stats(double loss, int64_t tokens, double seconds) {
  stats_msg s;
  s.loss = loss;
  s.tokens = tokens;
  s.seconds = seconds;
  return s;
}

/// The controller's signals named `name`, in order.
std::vector<double> series(const actor::job& j, const std::string& name) {
  std::vector<double> v;
  for (const auto& s : j.live->signals_since(0))
    if (s.node == "ppo_controller" && s.name == name) v.push_back(s.value);
  return v;
}

/// The steps of the controller's signals named `name`, in order.
std::vector<int64_t> steps_of(const actor::job& j, const std::string& name) {
  std::vector<int64_t> v;
  for (const auto& s : j.live->signals_since(0))
    if (s.node == "ppo_controller" && s.name == name) v.push_back(s.step);
  return v;
}

std::vector<std::string> phases(const actor::job& j) {
  std::vector<std::string> v;
  for (const auto& s : j.live->signals_since(0))
    if (s.node == "ppo_controller" && s.name == "phase") v.push_back(s.text);
  return v;
}

}  // namespace

// Held-out before; a normal iteration; a dropped batch (stamped for a checkpoint); a batch kept
// for the next update (generation_batches > 1); an update whose stats arrive before the summary
// (stamped: committed); the last iteration (with ptx and the hybrid engine's gather); held-out
// after. Then the same command again: it resumes after the commit.
TEST_CASE_FIXTURE(fixture, "ppo_controller: held-out before, update, dropped, kept, commit, last iteration, held-out after") {
  {
    std::lock_guard<std::mutex> lock(script.m);
    script.reset();
    script.batches = {batch(-1, true), batch(0), batch(1), batch(2), batch(3), batch(4), batch(-2, true)};
    auto& t = script.turns;
    t[-1].summary = summary(-1, 0.5, 0.0, 7.25, 256, 2.0);
    t[-1].summary.eval = true;
    t[-1].summary.reward_stderr = 0.125;
    t[0] = {summary(0, 0.25, 0.0125, 6.5, 64, 0.5), true, false, stats(0.75, 100, 0.25), stats(1.5, 60, 0.15)};
    t[0].summary.trains = true;
    t[1].summary = summary(1, 0, 0, 0, 16, 0.25);
    t[1].summary.dropped = true;
    t[2].summary = summary(2, -0.125, 0.03125, 3.0, 48, 0.5);  // kept: trains = false
    t[3] = {summary(3, 1.0625, 0.0625, 4.0, 80, 0.25), true, /*stats_first=*/true, stats(0.5, 300, 0.5),
            stats(0.25, 100, 0.5)};
    t[3].summary.trains = true;
    t[4] = {summary(4, 0.375, 0.09375, 5.5, 100, 0.5), true, false, stats(-0.0625, 50, 0.125), stats(2.0, 50, 0.125)};
    t[4].summary.trains = true;
    t[4].actor.unsup_loss = 2.0625;
    t[4].actor.gather_bytes = 1500000;
    t[4].actor.gather_theory_bytes = 3000000;
    t[-2].summary = summary(-2, 0.875, 0.125, 6.0, 300, 1.5);
    t[-2].summary.eval = true;
    t[-2].summary.reward_stderr = 0.0625;
  }
  actor::job j = run();
  const auto& lines = printed;

  // what it asked the generator for: the policy version = updates reported so far (0, 1 after
  // iteration 0, 2 after iteration 3, 3 after iteration 4); a checkpoint every 2nd training batch
  std::lock_guard<std::mutex> lock(script.m);
  REQUIRE(script.generate.size() == 7);
  const std::vector<int64_t> it = {-1, 0, 1, 2, 3, 4, -2}, version = {0, 0, 1, 1, 1, 2, 3};
  const std::vector<bool> eval = {true, false, false, false, false, false, true},
                          stamped = {false, false, true, false, true, false, false};
  for (std::size_t i = 0; i < 7; ++i) {
    INFO("generate message " << i);
    CHECK(script.generate[i].iteration == it[i]);
    CHECK(script.generate[i].eval == eval[i]);
    CHECK(script.generate[i].policy_version == version[i]);
    CHECK(script.generate[i].checkpoint == stamped[i]);
  }
  // one tick per reported iteration, naming it
  CHECK(script.ticks == it);

  // what it printed. gen tok/s = generated_tokens / generate_seconds (64 / 0.5 = 128);
  // train tok/s = (actor + critic tokens) / (actor + critic seconds): (100 + 60) / 0.4 = 400,
  // 400 / 1 = 400, 100 / 0.25 = 400; the gather in MB = bytes / 1e6
  const std::string d = dir.string();
  REQUIRE(lines.size() == 9);
  CHECK(lines[0] == "[step 3 ppo] held-out before: mean reward 0.5000 ± 0.1250, KL to reference 0.0000, answer "
                    "length 7.2 (8 prompts)");
  CHECK(lines[1] == "[step 3 ppo] iter 0 reward 0.2500 kl 0.0125 actor_loss 0.7500 critic_loss 1.5000 answer_len 6.5 "
                    "gen 128 tok/s train 400 tok/s");
  CHECK(lines[2] == "[step 3 ppo] iter 1: every answer was too short, batch dropped (as DS-Chat)");
  CHECK(lines[3] == "[step 3 ppo] iter 2 reward -0.1250 kl 0.0312 answer_len 3.0 gen 96 tok/s (experience kept for "
                    "the next update)");
  CHECK(lines[4] == "[step 3 ppo] iter 3 reward 1.0625 kl 0.0625 actor_loss 0.5000 critic_loss 0.2500 answer_len 4.0 "
                    "gen 320 tok/s train 400 tok/s");
  // the dropped batch 1 asked for a save; the trainers made it after the update of batch 3
  CHECK(lines[5] == "[step 3 ppo] checkpoint after iteration 3 -> " + d);
  CHECK(lines[6] == "[step 3 ppo] iter 4 reward 0.3750 kl 0.0938 actor_loss -0.0625 critic_loss 2.0000 unsup_loss "
                    "2.0625 answer_len 5.5 gen 200 tok/s train 400 tok/s hybrid-engine gather 1.500 MB/rank (theory "
                    "3.000)");
  CHECK(lines[7] == "[step 3 ppo] held-out after: mean reward 0.8750 ± 0.0625, KL to reference 0.1250, answer "
                    "length 6.0 (8 prompts)");
  // the gain in standard errors of the difference: 0.375 / sqrt(0.125² + 0.0625²) = 0.375 / 0.13975 = 2.68
  CHECK_MESSAGE(std::regex_match(lines[8], std::regex(R"(\[step 3 ppo\] held-out mean reward 0\.5000 -> 0\.8750 )"
                                                      R"(\(\+0\.3750, 2\.7 standard errors\), [0-9]+\.[0-9] s)")),
                lines[8]);

  // the commit: iterations done 4 (the next to run), policy version 2, the held-out reward before
  std::ifstream f(dir / "step3.json");
  REQUIRE(f.good());
  const auto c = nlohmann::json::parse(f);
  CHECK(c.at("eval_before").get<double>() == 0.5);
  REQUIRE(c.at("committed").size() == 1);
  CHECK(c.at("committed")[0].at("iteration").get<int64_t>() == 4);
  CHECK(c.at("committed")[0].at("policy_version").get<int64_t>() == 2);

  // the console: training batches' reward and kl, updates' losses, and each phase's seconds
  CHECK(series(j, "reward") == std::vector<double>{0.25, -0.125, 1.0625, 0.375});
  CHECK(series(j, "kl") == std::vector<double>{0.0125, 0.03125, 0.0625, 0.09375});
  CHECK(series(j, "generation_tokens_per_s") == std::vector<double>{128, 96, 320, 200});
  CHECK(series(j, "actor_loss") == std::vector<double>{0.75, 0.5, -0.0625});
  CHECK(series(j, "critic_loss") == std::vector<double>{1.5, 0.25, 2.0});
  CHECK(series(j, "training_tokens_per_s") == std::vector<double>{400, 400, 400});
  // each trained iteration's waits, the run's first too (since its batch went to the generator)
  CHECK(steps_of(j, "wait_seconds/generate") == steps_of(j, "actor_loss"));
  CHECK(steps_of(j, "wait_seconds/train") == steps_of(j, "actor_loss"));
  CHECK(steps_of(j, "actor_loss").size() == 3);
  // the held-out passes (step -1), before then after
  CHECK(series(j, "held_out/reward") == std::vector<double>{0.5, 0.875});
  CHECK(series(j, "held_out/kl") == std::vector<double>{0.0, 0.125});
  CHECK(series(j, "held_out/answer_len") == std::vector<double>{7.25, 6.0});
  // the generator's own time, from the summary; the controller's wall times are >= 0
  CHECK(series(j, "phase_seconds/generate") == std::vector<double>{2.0, 0.5, 0.25, 0.5, 0.25, 0.5, 1.5});
  CHECK(series(j, "phase_seconds/score_and_experience").size() == 7);
  CHECK(series(j, "phase_seconds/train").size() == 3);  // iterations 0, 3 and 4
  CHECK(series(j, "phase_seconds/report").size() == 7);
  for (const char* name : {"phase_seconds/score_and_experience", "phase_seconds/train", "phase_seconds/report"})
    for (double s : series(j, name)) CHECK((std::isfinite(s) && s >= 0));
  // the phases, in order: a batch that does not train goes from generate_experience to report; none
  // shows before the first summary (steps 1 and 2 may still train then), so the first is that batch's
  // generate_experience, not the wait_prompts the controller starts in
  std::vector<std::string> want;
  for (int64_t i : it) {
    want.push_back("generate_experience");
    if (i == 0 || i == 3 || i == 4) want.push_back("train");
    want.push_back("report");
    want.push_back("wait_prompts");
  }
  CHECK(phases(j) == want);
  const auto snap = j.metrics->snapshot();
  REQUIRE(snap.node("ppo_controller") != nullptr);
  CHECK(snap.node("ppo_controller")->counters.at("steps") == 3);
}

TEST_CASE_FIXTURE(fixture, "ppo_controller: the same command resumes after the last commit") {
  // a commit as the first run left it: 4 iterations done, policy version 2, held-out before 0.5
  std::ofstream(dir / "step3.json")
      << R"({"format": "flowrun-step3", "eval_before": 0.5, "committed": [{"iteration": 4, "policy_version": 2}]})";
  {
    std::lock_guard<std::mutex> lock(script.m);
    script.reset();
    script.batches = {batch(4), batch(5), batch(-2, true)};  // the loader resumes at iteration 4, no held-out before
    auto& t = script.turns;
    t[4] = {summary(4, 0.375, 0.09375, 5.5, 100, 0.5), true, false, stats(-0.0625, 50, 0.125), stats(2.0, 50, 0.125)};
    t[4].summary.trains = true;
    t[5] = {summary(5, 0.625, 0.1875, 5.0, 64, 0.5), true, false, stats(0.125, 30, 0.1), stats(0.5, 10, 0.1)};
    t[5].summary.trains = true;
    t[-2].summary = summary(-2, 0.875, 0.125, 6.0, 300, 1.5);
    t[-2].summary.eval = true;
  }
  const auto j = run();
  // a resumed run's first trained iteration has its waits: TensorBoard's START marker drops the
  // older run's points from iteration 4 on, and nothing replaced iteration 4's
  CHECK(steps_of(j, "wait_seconds/generate") == std::vector<int64_t>{4, 5});
  CHECK(steps_of(j, "wait_seconds/train") == std::vector<int64_t>{4, 5});
  const auto& lines = printed;
  std::lock_guard<std::mutex> lock(script.m);
  REQUIRE(script.generate.size() == 3);
  CHECK(script.generate[0].policy_version == 2);  // the committed version
  CHECK(script.generate[1].policy_version == 3);
  CHECK(script.generate[1].checkpoint);  // (5 + 1) % 2 == 0
  CHECK(script.generate[2].policy_version == 4);
  CHECK(script.ticks == std::vector<int64_t>{4, 5, -2});
  REQUIRE(lines.size() == 6);
  CHECK(lines[0] == "[step 3 ppo] resuming after iteration 3 from " + dir.string() + " (policy version 2)");
  CHECK(lines[1].rfind("[step 3 ppo] iter 4 reward 0.3750 ", 0) == 0);
  CHECK(lines[2] == "[step 3 ppo] iter 5 reward 0.6250 kl 0.1875 actor_loss 0.1250 critic_loss 0.5000 answer_len 5.0 "
                    "gen 128 tok/s train 200 tok/s");
  CHECK(lines[3] == "[step 3 ppo] checkpoint after iteration 5 -> " + dir.string());
  CHECK(lines[4].rfind("[step 3 ppo] held-out after: mean reward 0.8750", 0) == 0);
  // the held-out reward before training comes from the commit
  CHECK(lines[5].rfind("[step 3 ppo] held-out mean reward 0.5000 -> 0.8750 (+0.3750), ", 0) == 0);
  // keep_checkpoints = 2: both commits are listed
  std::ifstream f(dir / "step3.json");
  const auto c = nlohmann::json::parse(f);
  REQUIRE(c.at("committed").size() == 2);
  CHECK(c.at("committed")[1].at("iteration").get<int64_t>() == 6);
  CHECK(c.at("committed")[1].at("policy_version").get<int64_t>() == 4);
}

TEST_CASE_FIXTURE(fixture, "ppo_controller: a prompt batch before the last one is reported is an error naming the node") {
  {
    std::lock_guard<std::mutex> lock(script.m);
    script.reset();
    script.loader_waits = false;  // two batches in a row: the second arrives while the first is generated
    script.batches = {batch(0), batch(1)};
    script.turns[0].summary = summary(0, 0.25, 0.0125, 6.5, 64, 0.5);
    script.turns[1].summary = summary(1, 0.25, 0.0125, 6.5, 64, 0.5);
  }
  actor::job j = run(/*ok=*/false);
  CHECK(j.state->exit_code() != 0);
  CHECK_MESSAGE(j.state->error().find("node 'ppo_controller'") != std::string::npos, j.state->error());
  CHECK_MESSAGE(j.state->error().find("a prompt batch arrived in phase generate_experience of iteration 0") !=
                    std::string::npos,
                j.state->error());
}

// A critic-free estimator (GRPO): the summary says so, only the policy reports, and the lines name
// no critic; DAPO's filter can drop a whole batch, which then trains nothing.
TEST_CASE_FIXTURE(fixture, "ppo_controller: critic-free, the policy alone reports, a batch filtered to nothing") {
  {
    std::lock_guard<std::mutex> lock(script.m);
    script.reset();
    script.batches = {batch(0), batch(1), batch(2)};
    auto& t = script.turns;
    t[0] = {summary(0, 0.25, 0.0125, 6.5, 64, 0.5), true, false, stats(0.75, 100, 0.25), {}};
    t[0].summary.trains = true;
    t[0].summary.with_critic = false;
    t[0].summary.groups = 8;
    t[0].summary.groups_kept = 6;
    t[1].summary = summary(1, 0.5, -2e-6, 7.0, 64, 0.5);  // every group's rewards equal; a KL of -2e-6 prints 0.0000
    t[1].summary.with_critic = false;
    t[1].summary.dropped = true;
    t[1].summary.groups = 8;
    t[2] = {summary(2, 0.375, 0.025, 6.0, 64, 0.5), true, /*stats_first=*/true, stats(0.5, 100, 0.5), {}};
    t[2].summary.trains = true;
    t[2].summary.with_critic = false;
    t[2].summary.groups = 8;
    t[2].summary.groups_kept = 8;
  }
  actor::job j = run();
  const auto& lines = printed;
  std::lock_guard<std::mutex> lock(script.m);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "[step 3 ppo] iter 0 reward 0.2500 kl 0.0125 actor_loss 0.7500 answer_len 6.5 groups 6/8 gen 128 "
                    "tok/s train 400 tok/s");
  CHECK(lines[1] == "[step 3 ppo] iter 1 reward 0.5000 kl 0.0000 answer_len 7.0: every group's rewards were equal, "
                    "batch dropped (filter_groups)");
  CHECK(lines[2] == "[step 3 ppo] iter 2 reward 0.3750 kl 0.0250 actor_loss 0.5000 answer_len 6.0 gen 128 tok/s train "
                    "200 tok/s");
  // the filtered batch 1 was stamped for a save: made after the next update, as a dropped batch's
  CHECK(lines[3] == "[step 3 ppo] checkpoint after iteration 2 -> " + dir.string());
  CHECK(script.generate[1].policy_version == 1);  // one update reported before the filtered batch
  CHECK(script.generate[2].policy_version == 1);  // the filtered batch updated nothing
  CHECK(series(j, "actor_loss") == std::vector<double>{0.75, 0.5});
  CHECK(series(j, "critic_loss").empty());
  // the dropped batch's scores are in the curves (TensorBoard, --metrics) at full precision (the print rounds -2e-6 to 0.0000)
  CHECK(series(j, "reward") == std::vector<double>{0.25, 0.5, 0.375});
  CHECK(series(j, "kl") == std::vector<double>{0.0125, -2e-6, 0.025});
  CHECK(series(j, "answer_len") == std::vector<double>{6.5, 7.0, 6.0});
}

// The run's last iteration filtered to nothing while a checkpoint is due: there is no next update to carry
// the save, so the trainers save without training and report (summary_msg::saves, stats with updated =
// false), and the controller waits for them and commits after the last iteration. A GRPO run whose last
// batch filter_groups dropped had no commit after it, and the same command trained it again (a break-it
// review, 2026-12-07).
TEST_CASE_FIXTURE(fixture, "ppo_controller: a last iteration that trains nothing is committed after the trainers save") {
  for (const bool stats_first : {false, true}) {
    {
      std::lock_guard<std::mutex> lock(script.m);
      script.reset();
      script.batches = {batch(0), batch(1)};
      for (auto& b : script.batches) b.iterations = 2;
      auto& t = script.turns;
      t[0] = {summary(0, 0.25, 0.0125, 6.5, 64, 0.5), true, false, stats(0.75, 100, 0.25), {}};
      t[0].summary.trains = true;
      t[0].summary.with_critic = false;
      t[1] = {summary(1, 0.5, 0.0, 7.0, 64, 0.5), true, stats_first, stats(0, 0, 0), {}};
      t[1].summary.with_critic = false;
      t[1].summary.dropped = true;
      t[1].summary.groups = 8;
      t[1].summary.saves = true;
      t[1].actor.updated = false;
      t[1].actor.policy_version = 1;
    }
    fs::remove_all(dir);
    fs::create_directories(dir);
    run();
    const auto& lines = printed;
    std::lock_guard<std::mutex> lock(script.m);
    REQUIRE(lines.size() == 3);
    CHECK(lines[1] == "[step 3 ppo] iter 1 reward 0.5000 kl 0.0000 answer_len 7.0: every group's rewards were equal, "
                      "batch dropped (filter_groups)");
    // (1 + 1) % 2 == 0 and the last: stamped, saved by the trainers on the marker, committed with version 1
    CHECK(script.generate[1].checkpoint);
    CHECK(lines[2] == "[step 3 ppo] checkpoint after iteration 1 -> " + dir.string());
    std::ifstream f(dir / "step3.json");
    REQUIRE(f.good());
    const auto j = nlohmann::json::parse(f);
    INFO(j.dump());
    CHECK(j.dump().find("\"iteration\":2") != std::string::npos);
    CHECK(j.dump().find("\"policy_version\":1") != std::string::npos);
  }
}

// The script of a 4-iteration run: held-out before, iterations 0-3 training (rewards 0, 0.25, 0.5, 0.75), held-out after.
void script_four_iterations() {
  std::lock_guard<std::mutex> lock(script.m);
  script.reset();
  script.batches = {batch(-1, true), batch(0), batch(1), batch(2), batch(3), batch(-2, true)};
  for (auto& b : script.batches) b.iterations = 4;
  auto& t = script.turns;
  t[-1].summary = summary(-1, 0.5, 0.0, 7.0, 256, 2.0);
  t[-1].summary.eval = true;
  for (int64_t k = 0; k < 4; ++k) {
    t[k] = {summary(k, 0.25 * static_cast<double>(k), 0.0625, 4.0, 64, 0.5), true, false, stats(0.5, 100, 0.25),
            stats(1.0, 100, 0.25)};
    t[k].summary.trains = true;
  }
  t[-2].summary = summary(-2, 0.875, 0.125, 6.0, 300, 1.5);
  t[-2].summary.eval = true;
}

// SIGTERM as iteration 2 is being trained (commits after 1 and 3): the drain lets iteration 2 report,
// generates nothing more, has the trainers save it (a save-only batch) and commits it. The binary before
// ended with the prompts and dropped iteration 2's report: the commit after iteration 1 was all that was kept.
TEST_CASE_FIXTURE(fixture, "ppo_controller: a drain reports the iteration in flight and commits it") {
  script_four_iterations();
  {
    std::lock_guard<std::mutex> lock(script.m);
    script.save_version = 3;  // the updates of iterations 0-2
  }
  const auto j = run(/*ok=*/false, /*sigterm_at=*/2);
  CHECK(j.state->exit_code() == actor::exit_sigterm);
  const auto& lines = printed;
  std::lock_guard<std::mutex> lock(script.m);
  // generated: held-out, 0, 1, 2, then the save of iteration 2 (not iteration 3, nor the held-out pass after)
  REQUIRE(script.generate.size() == 5);
  CHECK(script.generate[3].iteration == 2);
  CHECK(!script.generate[3].checkpoint);  // no commit was due after iteration 2
  CHECK(script.generate[4].save_only);
  CHECK(script.generate[4].checkpoint);
  CHECK(script.generate[4].iteration == 2);
  CHECK(script.generate[4].policy_version == 3);
  REQUIRE(lines.size() == 7);
  CHECK(lines[3] == "[step 3 ppo] checkpoint after iteration 1 -> " + dir.string());
  CHECK(lines[4].rfind("[step 3 ppo] iter 2 reward 0.5000 ", 0) == 0);  // its report was not dropped
  CHECK(lines[5] == "[step 3 ppo] stopping after iteration 2: saving and committing it");
  CHECK(lines[6] == "[step 3 ppo] checkpoint after iteration 2 -> " + dir.string());
  // the commit: 3 iterations done (the loader resumes at iteration 3), policy version 3
  std::ifstream f(dir / "step3.json");
  const auto c = nlohmann::json::parse(f);
  REQUIRE(c.at("committed").size() == 2);
  CHECK(c.at("committed")[1].at("iteration").get<int64_t>() == 3);
  CHECK(c.at("committed")[1].at("policy_version").get<int64_t>() == 3);
  // the save has no points of its own: one per trained iteration
  CHECK(steps_of(j, "phase_seconds/train") == std::vector<int64_t>{0, 1, 2});
}

// Without a [graph] checkpoint_dir a drain generates nothing more and saves nothing; the iteration in flight
// reports (on this scheduler its stats come before the prompts' end either way: ppo_resume_small case 5b shows
// the line the controller dropped when it did not wait).
TEST_CASE_FIXTURE(fixture, "ppo_controller: without a checkpoint_dir a drain reports the iteration in flight") {
  script_four_iterations();
  const auto j = run(/*ok=*/false, /*sigterm_at=*/2, /*checkpoint_dir=*/false);
  CHECK(j.state->exit_code() == actor::exit_sigterm);
  std::lock_guard<std::mutex> lock(script.m);
  REQUIRE(script.generate.size() == 4);  // held-out, 0, 1, 2: no save
  CHECK_FALSE(script.generate[3].save_only);
  REQUIRE(printed.size() == 4);
  CHECK(printed[3].rfind("[step 3 ppo] iter 2 reward 0.5000 ", 0) == 0);
  CHECK_FALSE(fs::exists(dir / "step3.json"));
}

// ---- max_staleness >= 1: the pipelined loop ----------------------------------------------
//
// script_async stands in for generate -> score -> experience -> train as an asynchronous graph
// runs them: each batch's summary comes as soon as it is generated, but a training batch's stats
// only when the generator is `lag` batches further (the trainers are busy), or at once for the
// iterations in `flush`. With `hold_summary` a training batch's summary (its experience) comes
// only when the next batch reaches the generator (or at once for held-out batches and the
// iterations in `flush`): scoring that outlasts the next batch's generation. Every message it got
// or sent goes to one event log, in order.

namespace {

struct async_script {
  std::mutex m;
  std::vector<std::string> events;     // "gen K vV", "summary K", "stats K", "tick K"
  std::map<int64_t, turn> turns;
  std::vector<int64_t> flush;          // iterations whose stats come at once
  std::size_t lag = 1;
  std::vector<int64_t> held;           // training batches whose stats are not sent yet
  std::vector<prompt_msg> batches;
  bool hold_summary = false;
  std::optional<turn> pending;         // hold_summary: the summary not sent yet
  void reset() {
    hold_summary = false;
    pending.reset();
    events.clear();
    turns.clear();
    flush.clear();
    held.clear();
    batches.clear();
    lag = 1;
  }
};
async_script as;

class async_loader final : public actor::node {
 public:
  bool produce(actor::node_context& ctx) override {
    std::lock_guard<std::mutex> lock(as.m);
    if (next_ >= as.batches.size()) return false;
    ctx.emit("batch", actor::payload::make("prompt_batch", as.batches[next_++]));
    ctx.wait_for_input();
    return true;
  }
  void on_message(actor::node_context&, std::string_view, actor::payload msg) override {
    std::lock_guard<std::mutex> lock(as.m);
    as.events.push_back("tick " + std::to_string(msg.as<int64_t>()));
  }

 private:
  std::size_t next_ = 0;
};

class async_rollout final : public actor::node {
 public:
  void on_message(actor::node_context& ctx, std::string_view, actor::payload msg) override {
    std::lock_guard<std::mutex> lock(as.m);
    const auto& p = msg.as<prompt_msg>();
    as.events.push_back(std::string(p.save_only ? "save " : "gen ") + std::to_string(p.iteration) + " v" +
                        std::to_string(p.policy_version));
    CHECK(p.max_staleness == 1);
    if (p.save_only) {
      answer_save(ctx, p.iteration, p.policy_version);
      return;
    }
    turn t = as.turns.at(p.iteration);
    t.summary.policy_version = p.policy_version;  // the generator had the stamped weights
    const bool flush = std::find(as.flush.begin(), as.flush.end(), p.iteration) != as.flush.end();
    if (as.pending) {
      send_summary(ctx, *as.pending);
      as.pending.reset();
    }
    if (as.hold_summary && !p.eval && !flush)
      as.pending = t;
    else
      send_summary(ctx, t);
    while (!as.held.empty() && (flush || as.held.size() > as.lag)) {
      const int64_t k = as.held.front();
      as.held.erase(as.held.begin());
      const turn& h = as.turns.at(k);
      ctx.emit("actor_stats", actor::payload::make("stats", h.actor));
      if (h.summary.with_critic) ctx.emit("critic_stats", actor::payload::make("stats", h.critic));
      as.events.push_back("stats " + std::to_string(k));
    }
  }

 private:
  static void send_summary(actor::node_context& ctx, const turn& t) {
    ctx.emit("summary", actor::payload::make("summary", t.summary));
    as.events.push_back("summary " + std::to_string(t.summary.iteration));
    if (t.stats) as.held.push_back(t.summary.iteration);
  }
};

const char* async_graph_toml = R"(
edges = [
  "loader.batch -> ppo_controller.prompts",
  "ppo_controller.generate -> rollout.prompts",
  "rollout.summary -> ppo_controller.summary",
  "rollout.actor_stats -> ppo_controller.actor_stats",
  "rollout.critic_stats -> ppo_controller.critic_stats",
  "ppo_controller.next -> loader.next",
]
[node.loader]
kind = "async_loader"
[node.rollout]
kind = "async_rollout"
[node.ppo_controller]
kind = "ppo_controller"
max_staleness = 1
staleness_policy = "POLICY"
)";

struct async_fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  graph::node_kind_registry kinds;
  actor::node_factory_registry factories;
  std::vector<std::string> printed;

  async_fixture() : sys(fixture::init(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    actor::register_node_kind(kinds, factories,
                              graph::node_kind{"async_loader", "scripted prompt batches"}
                                  .input("next", "tick", "", true, true)
                                  .output("batch", "prompt_batch"),
                              [] { return std::unique_ptr<actor::node>(new async_loader); });
    actor::register_node_kind(kinds, factories,
                              graph::node_kind{"async_rollout", "scripted summaries, stats that lag"}
                                  .input("prompts", "prompt_batch")
                                  .output("summary", "summary")
                                  .output("actor_stats", "stats")
                                  .output("critic_stats", "stats"),
                              [] { return std::unique_ptr<actor::node>(new async_rollout); });
    register_ppo_controller(kinds, factories);
  }
  ~async_fixture() { sched.run(); }

  /// `sigterm_at` >= 0: a SIGTERM the moment the stand-in has answered that iteration's batch; `dir`: the
  /// graph's checkpoint_dir (none when empty).
  actor::job run(const std::string& policy, int64_t sigterm_at = -1, const std::string& dir = "") {
    std::string toml = async_graph_toml;
    toml.replace(toml.find("POLICY"), 6, policy);
    if (!dir.empty()) toml.insert(toml.find("[node.loader]"), "[graph]\ncheckpoint_dir = \"" + dir + "\"\n");
    auto parsed = graph::parse_graph_string(toml, "test.graph");
    REQUIRE(parsed.ok());
    graph::validate_options vo;
    vo.check_files = false;
    auto v = graph::validate(parsed.spec, kinds, vo);
    INFO(graph::format_errors(v.errors));
    REQUIRE(v.ok());
    actor::run_options o;
    o.progress = false;
    o.summary = false;
    std::optional<actor::job> j;
    {
      stdout_capture out;
      auto launched = actor::launch(sys, v.spec, kinds, factories, o);
      if (launched) {
        j = *launched;
        if (sigterm_at < 0) {
          sched.run();
        } else {
          auto answered = [&] {
            std::lock_guard<std::mutex> lock(as.m);
            const std::string want = "gen " + std::to_string(sigterm_at) + " ";
            return std::any_of(as.events.begin(), as.events.end(),
                               [&](const std::string& e) { return e.rfind(want, 0) == 0; });
          };
          bool sent = false;
          while (sched.try_run_once())
            if (!sent && answered()) {
              actor::interrupt(*j, SIGTERM);
              sent = true;
            }
        }
      }
      printed = out.lines("[step 3 ppo]");
    }
    REQUIRE(j.has_value());
    REQUIRE(j->state->finished());
    INFO(j->state->error());
    if (sigterm_at < 0) CHECK(j->state->exit_code() == 0);
    return *j;
  }
};

// A training turn: its summary, and the trainers' stats naming it (the policy's version after
// the update, the staleness it trained at).
turn train_turn(int64_t k, double reward, int64_t version_after, int64_t staleness) {
  turn t{summary(k, reward, 0.0625, 4.0, 64, 0.5), true, false, stats(0.5, 100, 0.25), stats(1.0, 100, 0.25)};
  t.summary.trains = true;
  for (stats_msg* s : {&t.actor, &t.critic}) {
    s->iteration = k;
    s->policy_version = version_after;
    s->staleness = staleness;
  }
  return t;
}

/// The most training batches between their generation and their stats, over the event log.
std::size_t most_in_flight(const std::vector<std::string>& events) {
  std::set<std::string> open;
  std::size_t most = 0;
  for (const auto& e : events) {
    if (e.rfind("gen -", 0) == 0) continue;  // held-out batches do not train
    if (e.rfind("gen ", 0) == 0) open.insert(e.substr(4, e.find(' ', 4) - 4));
    if (e.rfind("stats ", 0) == 0) open.erase(e.substr(6));
    most = std::max(most, open.size());
  }
  return most;
}

}  // namespace

// S = 1, wait: batch k + 1 is asked for when batch k is sent to the generator, generated before k
// trains; at most 2 batches between generation and training; each stamped with the updates
// reported when it was sent; the held-out passes wait for every update before them.
TEST_CASE_FIXTURE(async_fixture, "ppo_controller: max_staleness = 1 overlaps generation with training, in order") {
  {
    std::lock_guard<std::mutex> lock(as.m);
    as.reset();
    as.batches = {batch(-1, true), batch(0), batch(1), batch(2), batch(3), batch(-2, true)};
    as.turns[-1].summary = summary(-1, 0.5, 0.0, 7.0, 256, 2.0);
    as.turns[-1].summary.eval = true;
    as.turns[0] = train_turn(0, 0.25, 1, 0);
    as.turns[1] = train_turn(1, 0.375, 2, 1);  // generated at v0, trained at v1
    as.turns[2] = train_turn(2, 0.5, 3, 1);
    as.turns[3] = train_turn(3, 0.625, 4, 1);
    as.turns[3].summary.weights_wait_seconds = 0.25;  // the generator waited for its weights
    as.turns[-2].summary = summary(-2, 0.875, 0.125, 6.0, 300, 1.5);
    as.turns[-2].summary.eval = true;
    as.flush = {3};
  }
  actor::job j = run("wait");
  std::lock_guard<std::mutex> lock(as.m);
  const std::vector<std::string> want = {
      "gen -1 v0", "summary -1", "tick -1",                // held-out before: synchronous
      "gen 0 v0",  "summary 0",  "tick 0",                 // batch 1 asked for before batch 0 trains
      "gen 1 v0",  "summary 1",  "stats 0", "tick 1",      // two in flight: batch 2 waits for 0's update
      "gen 2 v1",  "summary 2",  "stats 1", "tick 2",
      "gen 3 v2",  "summary 3",  "stats 2", "stats 3", "tick 3",
      "gen -2 v4", "summary -2", "tick -2"};               // held-out after: every update before it
  CHECK(as.events == want);
  CHECK(most_in_flight(as.events) == 2);
  REQUIRE(printed.size() == 7);
  CHECK(printed[1] == "[step 3 ppo] iter 0 reward 0.2500 kl 0.0625 actor_loss 0.5000 critic_loss 1.0000 answer_len "
                      "4.0 gen 128 tok/s train 400 tok/s policy v0 staleness 0");
  CHECK(printed[2] == "[step 3 ppo] iter 1 reward 0.3750 kl 0.0625 actor_loss 0.5000 critic_loss 1.0000 answer_len "
                      "4.0 gen 128 tok/s train 400 tok/s policy v0 staleness 1");
  CHECK(printed[4] == "[step 3 ppo] iter 3 reward 0.6250 kl 0.0625 actor_loss 0.5000 critic_loss 1.0000 answer_len "
                      "4.0 gen 128 tok/s train 400 tok/s policy v2 staleness 1 waited 0.250 s for weights");
  CHECK(printed[5].rfind("[step 3 ppo] held-out after: mean reward 0.8750", 0) == 0);
  CHECK(series(j, "staleness") == std::vector<double>{0, 1, 1, 1});
  // the running counts at every trained batch, 0 included (they had no series until one was counted)
  CHECK(series(j, "stale_waited") == std::vector<double>{0, 0, 0, 1});
  CHECK(series(j, "reward") == std::vector<double>{0.25, 0.375, 0.5, 0.625});
  CHECK(series(j, "stale_dropped") == std::vector<double>{0, 0, 0, 0});
}

// S = 1 and a SIGTERM as batch 2 is generated: the batches in flight report (here the trainers' stats
// come at once, so batch 3 went out before the coordinator took the signal), the drain generates nothing
// more (the held-out batch the loader sends next is dropped), and the last batch trained is saved (no
// checkpoint was due: save_checkpoint_steps 0 here) and committed.
TEST_CASE_FIXTURE(async_fixture, "ppo_controller: max_staleness = 1, a drain commits the last batch trained") {
  const fs::path dir = fs::temp_directory_path() / ("flowrun_test_ppo_drain_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::lock_guard<std::mutex> lock(as.m);
    as.reset();
    as.batches = {batch(-1, true), batch(0), batch(1), batch(2), batch(3), batch(-2, true)};
    as.turns[-1].summary = summary(-1, 0.5, 0.0, 7.0, 256, 2.0);
    as.turns[-1].summary.eval = true;
    for (int64_t k = 0; k < 4; ++k) as.turns[k] = train_turn(k, 0.25, k + 1, 0);
    as.turns[-2].summary = summary(-2, 0.875, 0.125, 6.0, 300, 1.5);
    as.turns[-2].summary.eval = true;
    as.flush = {0, 1, 2, 3};  // the trainers' stats come at once
  }
  actor::job j = run("wait", /*sigterm_at=*/2, dir.string());
  CHECK(j.state->exit_code() == actor::exit_sigterm);
  std::lock_guard<std::mutex> lock(as.m);
  INFO(fmt::format("{}", fmt::join(as.events, " | ")));
  int64_t last = -1;  // the last batch the trainers reported
  for (const auto& e : as.events) {
    CHECK(e.rfind("gen -2", 0) != 0);
    if (e.rfind("stats ", 0) == 0) last = std::stoll(e.substr(6));
  }
  REQUIRE(last >= 2);
  CHECK(as.events.back() == fmt::format("save {} v{}", last, last + 1));  // the save comes last
  CHECK(std::find(printed.begin(), printed.end(),
                  fmt::format("[step 3 ppo] stopping after iteration {}: saving and committing it", last)) != printed.end());
  CHECK(std::find(printed.begin(), printed.end(),
                  fmt::format("[step 3 ppo] checkpoint after iteration {} -> {}", last, dir.string())) != printed.end());
  std::ifstream f(dir / "step3.json");
  const auto c = nlohmann::json::parse(f);
  REQUIRE(c.at("committed").size() == 1);
  CHECK(c.at("committed")[0].at("iteration").get<int64_t>() == last + 1);
  CHECK(c.at("committed")[0].at("policy_version").get<int64_t>() == last + 1);
  fs::remove_all(dir);
}

// S = 1 is one step off (veRL): batch k + 1 is asked for as soon as batch k goes to the
// generator, so its generation overlaps batch k's scoring as well as its training. Here each
// batch's experience comes only after the next batch reached the generator; a controller that
// waited for batch k's summary before asking for k + 1 would never finish.
TEST_CASE_FIXTURE(async_fixture, "ppo_controller: max_staleness = 1 asks for batch k + 1 before batch k is scored") {
  {
    std::lock_guard<std::mutex> lock(as.m);
    as.reset();
    as.hold_summary = true;
    as.lag = 0;  // the stats come right after their summary
    as.batches = {batch(0), batch(1), batch(2), batch(-2, true)};
    as.turns[0] = train_turn(0, 0.25, 1, 0);
    as.turns[1] = train_turn(1, 0.375, 2, 1);
    as.turns[2] = train_turn(2, 0.5, 3, 1);
    as.turns[-2].summary = summary(-2, 0.875, 0.125, 6.0, 300, 1.5);
    as.turns[-2].summary.eval = true;
    as.flush = {2};
  }
  actor::job j = run("wait");
  std::lock_guard<std::mutex> lock(as.m);
  const std::vector<std::string> want = {
      "gen 0 v0",  "tick 0",                               // batch 1 asked for while 0 is being scored
      "gen 1 v0",  "summary 0", "stats 0", "tick 1",       // 0 reported: batch 2, stamped after 0's update
      "gen 2 v1",  "summary 1", "summary 2", "stats 1", "stats 2", "tick 2",
      "gen -2 v3", "summary -2", "tick -2"};               // held-out after: every update before it
  std::string got;
  for (const auto& e : as.events) got += e + "; ";
  INFO("events: " << got);
  CHECK(as.events == want);
  CHECK(most_in_flight(as.events) == 2);
  CHECK(series(j, "staleness") == std::vector<double>{0, 1, 1});
  CHECK(series(j, "reward") == std::vector<double>{0.25, 0.375, 0.5});
}

// S = 1, drop: a batch the trainers found staler than max_staleness (they trained nothing and
// said so) is reported as dropped and counted; it is no update, so the stamps after it do not
// count it.
TEST_CASE_FIXTURE(async_fixture, "ppo_controller: max_staleness = 1, drop: a stale batch is counted, never an update") {
  {
    std::lock_guard<std::mutex> lock(as.m);
    as.reset();
    as.batches = {batch(0), batch(1), batch(2), batch(-2, true)};
    as.turns[0] = train_turn(0, 0.25, 1, 0);
    as.turns[1] = train_turn(1, 0.375, 1, 2);  // sampled with older weights than stamped: 2 > 1
    for (stats_msg* s : {&as.turns[1].actor, &as.turns[1].critic}) {
      s->updated = false;
      s->stale_dropped = 1;
    }
    as.turns[2] = train_turn(2, 0.5, 2, 1);
    as.turns[-2].summary = summary(-2, 0.875, 0.125, 6.0, 300, 1.5);
    as.turns[-2].summary.eval = true;
    as.flush = {2};
  }
  actor::job j = run("drop");
  std::lock_guard<std::mutex> lock(as.m);
  const std::vector<std::string> want = {"gen 0 v0",  "summary 0", "tick 0",  "gen 1 v0", "summary 1", "stats 0",
                                         "tick 1",    "gen 2 v1",  "summary 2", "stats 1", "stats 2",  "tick 2",
                                         "gen -2 v2", "summary -2", "tick -2"};
  CHECK(as.events == want);  // batch 1 updated nothing: the held-out pass has version 2, not 3
  REQUIRE(printed.size() == 5);
  CHECK(printed[1] == "[step 3 ppo] iter 1 reward 0.3750 kl 0.0625 answer_len 4.0: sampled with policy version 0, 2 "
                      "updates behind at training (max_staleness 1), batch dropped (staleness_policy = \"drop\"; 1 "
                      "dropped so far)");
  CHECK(series(j, "stale_dropped") == std::vector<double>{0, 1, 1});
  CHECK(series(j, "actor_loss") == std::vector<double>{0.5, 0.5});  // batches 0 and 2: 1 never trained
  CHECK(series(j, "staleness") == std::vector<double>{0, 2, 1});
  const auto snap = j.metrics->snapshot();
  CHECK(snap.node("ppo_controller")->counters.at("steps") == 2);
}

// ---- the trainers' order of work (actors/trainer_order.h)

namespace {

// Feeds `arrivals` to a trainer_order one by one ("R n": rollouts of iteration n, "E n": held-out
// rollouts, "X n": an experience batch ending at n, empty or not) and does all the work it allows
// after each; returns the work done, in order ("score n", "train n").
std::vector<std::string> work_done(const std::vector<std::string>& arrivals) {
  using order = flowrun::actors::trainer_order<std::string>;
  order o;
  std::vector<std::string> done;
  for (const auto& a : arrivals) {
    const int64_t n = std::stoll(a.substr(2));
    if (a[0] == 'X') o.experience_arrived(n, "train " + std::to_string(n));
    else o.rollouts_arrived(n, a[0] == 'E', "score " + std::to_string(n));
    for (auto next = o.next(); next != order::work::none; next = o.next()) done.push_back(o.take(next));
  }
  return done;
}

}  // namespace

TEST_CASE("trainer order: two ranks that got the rollouts of k + 1 and the experience of k in either order work alike") {
  // max_staleness = 1: the generator's batch k + 1 and the experience maker's batch k race to each rank.
  // Taken in arrival order, rank B scored 1 while rank A trained on 0: different collectives, the run failed.
  const auto a = work_done({"E -1", "R 0", "X 0", "R 1", "X 1", "R 2", "X 2", "E -2"});
  const auto b = work_done({"E -1", "R 0", "R 1", "X 0", "R 2", "X 1", "X 2", "E -2"});
  const std::vector<std::string> want = {"score -1", "score 0", "train 0", "score 1", "train 1",
                                         "score 2",  "train 2", "score -2"};
  CHECK(a == want);
  CHECK(b == want);
  // a batch that trains nothing (dropped, filtered to nothing, or kept for generation_batches = 2) sends an
  // empty experience batch: the next rollouts wait for it, not for an update that never comes
  const std::vector<std::string> kept = {"score 0", "train 0", "score 1", "train 1", "score 2", "train 2", "score 3",
                                         "train 3"};
  CHECK(work_done({"R 0", "R 1", "X 0", "X 1", "R 2", "R 3", "X 2", "X 3"}) == kept);
  CHECK(work_done({"R 0", "X 0", "R 1", "R 2", "X 1", "R 3", "X 2", "X 3"}) == kept);
  // the rollouts of k + 1 alone wait; the experience of k lets them through
  CHECK(work_done({"R 0", "R 1"}) == std::vector<std::string>{"score 0"});
  // held-out rollouts never train: nothing waits for them
  CHECK(work_done({"E -1", "R 0", "X 0", "E -2"}) == std::vector<std::string>{"score -1", "score 0", "train 0", "score -2"});
}

namespace {

// One trainer's 1-rank checkpoint of `step` under DIR/NAME, committed, its manifest's extra as given.
void save_trainer(const fs::path& dir, const std::string& name, int64_t step, const nlohmann::json& extra) {
  shard_manifest m;
  m.step = step;
  m.extra = extra;
  m.config_hash = "0";
  shard_group g;
  g.name = "base";
  g.full_numel = 4;
  g.ranges = {{0, 4}};
  g.tensors["fp32_master"] = tensor::zeros({4});
  save_shard((dir / name).string(), m, {g});
  commit_checkpoint((dir / name).string(), step, 1, /*keep=*/0);
}

}  // namespace

// A step-1/2 trainer checkpoints under the same [graph] checkpoint_dir, in DIR/<its name>: a folder of it left
// by a run stopped between sft's output and the removal of its mid-run checkpoints (a save_lora that filled the
// disk did so) was read as a step-3 trainer's: every commit whose iteration it had no step folder for was
// refused (the rerun of a finished run trained its last iterations again, or stopped: "no committed step-3
// checkpoint can be used"), and prune_step3 removed its folders.
TEST_CASE("step 3's resume and pruning pass over a step-1/2 trainer's checkpoint folder") {
  const fs::path dir = fs::temp_directory_path() / ("flowrun_test_step3_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (int64_t it : {2, 4})
    for (const char* t : {"critic", "policy"}) save_trainer(dir, t, it, {{"policy_version", it / 2}});
  save_trainer(dir, "sft", 3, {{"state", {{"step", 3}}}, {"settings", nlohmann::json::object()}});
  ppo::step3_commit c;
  c.committed = {{2, 1}, {4, 2}};
  ppo::write_step3_commit(dir.string(), c);
  auto r = ppo::find_step3_resume(dir.string());
  REQUIRE(r);
  CHECK(r->point.iteration == 4);
  CHECK(r->refused.empty());
  ppo::prune_step3(dir.string(), c, 1);
  CHECK_FALSE(fs::exists(dir / "policy" / step_folder_name(2)));
  CHECK_FALSE(fs::exists(dir / "critic" / step_folder_name(2)));
  CHECK(fs::exists(dir / "policy" / step_folder_name(4)));
  CHECK(fs::exists(dir / "sft" / step_folder_name(3)));  // not step 3's to prune
  // a step-3 trainer's folder that lacks the commit's step folder is still refused: the commit before is taken
  save_trainer(dir, "critic", 6, {{"policy_version", 3}});
  c.committed = {{4, 2}, {6, 3}};
  ppo::write_step3_commit(dir.string(), c);
  r = ppo::find_step3_resume(dir.string());
  REQUIRE(r);
  CHECK(r->point.iteration == 4);
  REQUIRE(r->refused.size() == 1);
  CHECK(r->refused[0].find((dir / "policy" / step_folder_name(6)).string()) != std::string::npos);
  fs::remove_all(dir);
}
