// max_staleness with staleness_policy = "drop", end to end (issue 21: "a stale batch is never
// trained when the drop policy is set"). The real step-3 nodes (prompt_loader, ppo_controller,
// rollout_generator, policy, reference_model, reward_function, experience_maker) run GRPO on
// stories260K on the threaded scheduler; between the policy's weights and the generator sits a
// test node, `frozen_weights`, that passes on the policy's first weights (version 0) and holds
// back every later snapshot, as a weights copy that never arrives would. With max_staleness = 1:
//   batch 0: sampled with v0, trained at v0 (staleness 0)  -> update 1
//   batch 1: sampled with v0, trained at v1 (staleness 1)  -> update 2
//   batch k >= 2: sampled with v0, trained at v2 (staleness 2 > 1): dropped, whatever the timing.
// What the test checks, from the run's own counters and lines:
//  - the policy counted 2 experience batches trained, 3 dropped, and exactly the optimizer steps
//    of 2 batches (rows / per_device_training_batch_size each), version 2;
//  - the controller printed the three drops and counted 2 updates;
//  - the saved policy is byte for byte the one of the same run stopped after 2 iterations: the
//    dropped batches' experience never reached the weights.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/register.h"
#include "runtime/actor/node.h"
#include "runtime/actor/runtime.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"
#include "stdout_capture.h"
#include "test_util.h"

using namespace flowrun;
namespace fs = std::filesystem;

namespace {

/// Passes on the first weights it gets and holds back (counts) every later one.
class frozen_weights final : public actor::node {
 public:
  void on_message(actor::node_context& ctx, std::string_view, actor::payload msg) override {
    if (first_) {
      first_ = false;
      ctx.emit("out", std::move(msg));
    } else {
      ctx.metric("held_back");
    }
  }

 private:
  bool first_ = true;
};

/// Standard output of the run, the lines that start with a prefix (ctx.print writes there).
using test::stdout_capture;  // tests/stdout_capture.h

constexpr int64_t prompts_per_batch = 4, generations = 4, mini_batch = 8;

const char* graph_toml = R"(
edges = [
  "actor_model.model -> policy.init, reference.init",
  "prompts.batch -> controller.prompts",
  "controller.generate -> generator.prompts",
  "generator.rollouts -> policy.rollouts, reference.rollouts, reward.rollouts",
  "policy.scored -> experience.logprobs",
  "reference.scored -> experience.ref_logprobs",
  "reward.scored -> experience.reward",
  "experience.experience -> policy.train",
  "experience.summary -> controller.summary",
  "policy.stats -> controller.actor_stats",
  "policy.weights -> frozen.in",
  "frozen.out -> generator.weights",
  "controller.next -> prompts.next",
]
[graph]
name = "staleness_drop"
seed = 1234
[node.actor_model]
kind = "model_source"
model = "MODEL"
[node.prompts]
kind = "prompt_loader"
tokenizer = "TOKENIZER"
data = "DATA"
max_prompt_seq_len = 8
per_device_generation_batch_size = 4
iterations = ITERATIONS
eval_prompts = 4
[node.controller]
kind = "ppo_controller"
max_staleness = 1
staleness_policy = "drop"
[node.generator]
kind = "rollout_generator"
tokenizer = "TOKENIZER"
max_answer_seq_len = 6
temperature = 1.0
num_generations = 4
threads = 1
[node.reward]
kind = "reward_function"
tokenizer = "TOKENIZER"
reward = "command"
timeout_s = 300  # the scorer's first answer waits for Python to start, slow on a loaded machine
command = "python3 -c 'import sys\nwhile True:\n    l = sys.stdin.readline()\n    if not l: break\n    print(len(l) % 7, flush=True)'"
[node.reference]
kind = "reference_model"
threads = 1
[node.experience]
kind = "experience_maker"
advantage_estimator = "grpo"
kl_ctl = 0.0
[node.policy]
kind = "policy"
actor_learning_rate = 1e-3
per_device_training_batch_size = 8
ppo_epochs = 1
threads = 1
output = "OUTPUT"
[node.frozen]
kind = "frozen_weights"
)";

struct run_out {
  actor::run_result result;
  std::vector<std::string> lines;  // the controller's "[step 3 ppo]" lines
};

run_out run(const fs::path& dir, int iterations, const fs::path& output) {
  graph::node_kind_registry kinds;
  actor::node_factory_registry factories;
  actors::register_builtin_nodes(kinds, factories);
  actor::register_node_kind(kinds, factories,
                            graph::node_kind{"frozen_weights", "passes on the first weights only"}
                                .input("in", "model", "the policy's weights")
                                .output("out", "model", "to the generator", true),
                            [] { return std::unique_ptr<actor::node>(new frozen_weights); });
  std::string toml = graph_toml;
  auto put = [&](const std::string& key, const std::string& value) {
    for (auto at = toml.find(key); at != std::string::npos; at = toml.find(key)) toml.replace(at, key.size(), value);
  };
  put("MODEL", test::model_path());
  put("TOKENIZER", test::tokenizer_path());
  put("DATA", (dir / "addition.jsonl").string());
  put("ITERATIONS", std::to_string(iterations));
  put("OUTPUT", output.string());
  auto parsed = graph::parse_graph_string(toml, "staleness_drop.graph");
  INFO(graph::format_errors(parsed.errors));
  REQUIRE(parsed.ok());
  auto v = graph::validate(parsed.spec, kinds);
  INFO(graph::format_errors(v.errors));
  REQUIRE(v.ok());
  actor::run_options o;
  o.progress = false;
  o.summary = false;
  o.threads = 2;
  run_out r;
  stdout_capture out;
  r.result = actor::run_graph(v.spec, kinds, factories, o);
  r.lines = out.lines("[step 3 ppo]");
  return r;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("max_staleness = 1, drop, end to end: a stale batch's experience never reaches an optimizer step") {
  const fs::path dir = fs::temp_directory_path() / ("flowrun_test_staleness_drop_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "addition.jsonl");  // one-digit additions, GSM8K's answer format
    for (int i = 0; i < 100; ++i)
      f << "{\"prompt\": \"" << i % 10 << "+" << (i * 7) % 10 << "=\", \"chosen\": \" #### " << i % 10 + (i * 7) % 10
        << "\"}\n";
  }
  const int iterations = 5;
  run_out a = run(dir, iterations, dir / "five.bin");
  INFO(a.result.error);
  REQUIRE(a.result.exit_code == 0);
  const auto* policy = a.result.metrics.node("policy");
  REQUIRE(policy != nullptr);
  const auto count = [](const actor::node_stats* n, const std::string& name) {
    auto it = n->counters.find(name);
    return it == n->counters.end() ? std::int64_t{0} : it->second;
  };
  // batches 0 and 1 trained, 2..4 dropped
  const std::int64_t steps_per_batch = prompts_per_batch * generations / mini_batch;
  CHECK(count(policy, "experience_trained") == 2);
  CHECK(count(policy, "experience_dropped") == iterations - 2);
  CHECK(count(policy, "optimizer_steps") == 2 * steps_per_batch);
  CHECK(count(policy, "policy_version") == 2);
  // the decoupled loss's proximal log-probs: batch 0's scored log-probs are them (no update came
  // before it); batch 1's are when the policy scored it after update 0, else they are computed
  // again. Which, depends on whether batch 1's rollouts reached the policy before batch 0's
  // experience (the generator works on batch 1 while batch 0 is scored): timing.
  CHECK(count(policy, "proximal_reused") >= 1);
  CHECK(count(policy, "proximal_reused") + count(policy, "proximal_recomputed") == 2);
  CHECK(count(a.result.metrics.node("controller"), "steps") == 2);
  CHECK(count(a.result.metrics.node("frozen"), "held_back") == 2);        // the snapshots of v1 and v2
  CHECK(count(a.result.metrics.node("generator"), "policy_version") == 0);  // it only ever had v0
  // the controller's lines: two updates (staleness 0, then 1), then every later batch dropped
  std::vector<std::string> iters;
  for (const auto& l : a.lines)
    if (l.find("] iter ") != std::string::npos) iters.push_back(l);
  INFO(fmt::format("{}", fmt::join(a.lines, "\n")));
  REQUIRE(iters.size() == static_cast<size_t>(iterations));
  CHECK(std::regex_search(iters[0], std::regex("^\\[step 3 ppo\\] iter 0 reward .* policy v0 staleness 0")));
  CHECK(std::regex_search(iters[1], std::regex("^\\[step 3 ppo\\] iter 1 reward .* policy v0 staleness 1")));
  for (int k = 2; k < iterations; ++k)
    CHECK(std::regex_search(
        iters[static_cast<size_t>(k)],
        std::regex(fmt::format("^\\[step 3 ppo\\] iter {} .*sampled with policy version 0, 2 updates behind at "
                               "training \\(max_staleness 1\\), batch dropped \\(staleness_policy = \"drop\"; {} "
                               "dropped so far\\)$",
                               k, k - 1))));
  // the same run stopped after the two trained batches saves the same policy, byte for byte
  run_out b = run(dir, 2, dir / "two.bin");
  INFO(b.result.error);
  REQUIRE(b.result.exit_code == 0);
  CHECK(count(b.result.metrics.node("policy"), "optimizer_steps") == 2 * steps_per_batch);
  const std::string five = bytes_of(dir / "five.bin"), two = bytes_of(dir / "two.bin");
  REQUIRE(!five.empty());
  CHECK(five == two);
  fs::remove_all(dir);
}
