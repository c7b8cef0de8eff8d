// The progress reports of DeepSpeed-Chat's long phases (docs/console.md, "Progress and ETA"): the
// held-out passes report each batch (dschat::sft_eval / rm_eval / dpo_eval's batch_progress_fn, and
// the trainer nodes' "step 1 sft held-out k/N"), and prompt_loader's "step 3 ppo" appears only once
// step 3's loop runs (not at the job's start, while steps 1 and 2 still train). The nodes run here
// on a context that records what they report, on stories260K and the HH-RLHF test file.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include "actors/register.h"
#include "actors/resume_check.h"
#include "models/hf.h"
#include "models/llama2c.h"
#include "models/rlhf/dpo.h"
#include "models/rlhf/dschat_data.h"
#include "models/rlhf/dschat_steps.h"
#include "models/tokenizer.h"
#include "runtime/actor/node.h"
#include "runtime/graph/graph_spec.h"
#include "runtime/graph/validate.h"
#include "runtime/util/assets.h"
#include "test_util.h"

using namespace flowrun;

namespace {

using report = std::tuple<std::string, int64_t, int64_t>;  // (what, done, total)

// A node_context that records progress reports, printed lines and emitted ports.
class recording_context final : public actor::node_context {
 public:
  explicit recording_context(graph::node_spec spec)
      : spec_(std::move(spec)), log_("test", std::make_shared<spdlog::sinks::null_sink_mt>()) {}
  const graph::node_spec& spec() const override { return spec_; }
  std::size_t replica() const override { return 0; }
  std::size_t replicas() const override { return 1; }
  std::uint64_t seed() const override { return 1234; }
  std::int64_t graph_steps() const override { return 0; }
  std::int64_t restarts() const override { return 0; }
  actor::stop_reason reason() const override { return actor::stop_reason::running; }
  void emit(std::string_view out_port, actor::payload) override { emitted.emplace_back(out_port); }
  void metric(std::string_view, std::int64_t) override {}
  void wait_for_input() override { waiting = true; }
  void print(std::string_view line) override { printed.emplace_back(line); }
  spdlog::logger& log() override { return log_; }
  void progress(std::string_view what, std::int64_t done, std::int64_t total) override {
    reports.emplace_back(std::string(what), done, total);
  }

  std::vector<report> reports;
  std::vector<std::string> printed, emitted;
  bool waiting = false;

 private:
  graph::node_spec spec_;
  spdlog::logger log_;
};

// Node `name` of the shipped graph `file` with the `--set` overrides, validated (settings filled in,
// paths resolved), and a fresh object of its kind.
std::pair<graph::node_spec, std::unique_ptr<actor::node>> shipped_node(const std::string& file, const std::string& name,
                                                                       const std::vector<std::string>& overrides) {
  static graph::node_kind_registry kinds;
  static actor::node_factory_registry factories;
  static const bool once = (actors::register_builtin_nodes(kinds, factories), true);
  (void)once;
  graph::validate_options vo;
  vo.asset_root = assets_root();  // as flowrun run: the graph's relative inputs, then the assets
  auto v = graph::load_graph(std::string(FLOWRUN_SOURCE_DIR) + "/graphs/" + file, kinds, vo, overrides);
  INFO(graph::format_errors(v.errors));
  REQUIRE(v.ok());
  for (const auto& n : v.spec.nodes)
    if (n.name == name) return {n, (*factories.find(n.kind))()};
  FAIL("no node " << name << " in " << file);
  throw 0;
}

// The reports of `what` only.
std::vector<report> of(const std::vector<report>& all, const std::string& what) {
  std::vector<report> out;
  for (const auto& r : all)
    if (std::get<0>(r) == what) out.push_back(r);
  return out;
}

// `r` is one pass: (0, N), (1, N), ..., (N, N).
void check_pass(const std::vector<report>& r, const std::string& what, int64_t n) {
  REQUIRE(r.size() == static_cast<size_t>(n + 1));
  for (int64_t k = 0; k <= n; ++k) CHECK(r[static_cast<size_t>(k)] == report{what, k, n});
}

}  // namespace

// Each eval helper reports (0, N) first and then every batch, and the figures are the ones it gives
// without a callback (the report changes nothing).
TEST_CASE("held-out progress: the eval helpers report each batch, figures unchanged") {
  auto tok = load_tokenizer(asset_path("model/stories260K/tok512.model").string());
  auto model = load_llama2c(asset_path("model/stories260K/stories260K.bin").string());
  auto src = dschat::load_sources({asset_path("data/hh-rlhf/harmless-base-test.dschat.jsonl").string()});
  dschat::split_settings sp;
  auto rows = dschat::rows_for_step(src, 1, sp);
  rows.eval.resize(std::min<size_t>(rows.eval.size(), 20));
  dschat::tokenize_settings ts;
  ts.max_seq_len = 64;

  auto sft_ex = dschat::make_sft_examples(rows.eval, *tok, ts);
  std::vector<dschat::sft_batch_data> sft_batches;
  for (auto& b : dschat::epoch_batches(static_cast<int64_t>(sft_ex.size()), 6, 0, 0, false))
    sft_batches.push_back(dschat::sft_batch(sft_ex, b, false));
  const auto n_sft = static_cast<int64_t>(sft_batches.size());
  REQUIRE(n_sft == (static_cast<int64_t>(sft_ex.size()) + 5) / 6);
  std::vector<report> got;
  auto rec = [&got](int64_t done, int64_t total) { got.emplace_back("", done, total); };
  const auto plain = dschat::sft_eval(model, sft_batches);
  const auto reported = dschat::sft_eval(model, sft_batches, rec);
  check_pass(got, "", n_sft);
  CHECK(reported.loss == plain.loss);
  CHECK(reported.tokens == plain.tokens);
  CHECK(std::isfinite(plain.loss));

  auto rm_ex = dschat::make_rm_examples(rows.eval, *tok, ts);
  std::vector<dschat::rm_batch_data> rm_batches;
  for (auto& b : dschat::epoch_batches(static_cast<int64_t>(rm_ex.size()), 4, 0, 0, false))
    rm_batches.push_back(dschat::rm_batch(rm_ex, b));
  const auto n_rm = static_cast<int64_t>(rm_batches.size());
  REQUIRE(n_rm >= 3);
  decoder rm = clone_decoder(model);
  rm.add_value_head(7);
  got.clear();
  const auto rm_plain = dschat::rm_eval(rm, rm_batches);
  const auto rm_reported = dschat::rm_eval(rm, rm_batches, rec);
  check_pass(got, "", n_rm);
  CHECK(rm_reported.pairs == rm_plain.pairs);
  CHECK(rm_reported.accuracy == rm_plain.accuracy);
  CHECK(rm_reported.chosen_mean == rm_plain.chosen_mean);

  decoder ref = clone_decoder(model);
  got.clear();
  dschat::dpo_settings ds;
  const auto dpo_plain = dschat::dpo_eval(model, ref, rm_batches, ds);
  const auto dpo_reported = dschat::dpo_eval(model, ref, rm_batches, ds, rec);
  check_pass(got, "", n_rm);
  CHECK(dpo_reported.pairs == dpo_plain.pairs);
  CHECK(dpo_reported.loss == dpo_plain.loss);
  CHECK(dpo_plain.loss == doctest::Approx(std::log(2.0)).epsilon(1e-5));  // policy == reference
}

// sft_trainer: the held-out pass before training and the one after each report every batch of the
// held-out examples (ceil(examples / per_device_train_batch_size) of them, the count its first line
// prints), around the updates' "step 1 sft k/N".
TEST_CASE("held-out progress: sft_trainer reports each held-out batch, before and after training") {
  auto [spec, node] = shipped_node("sft.graph", "sft",
                                   {"node.sft.steps=2", "node.sft.output=", "node.sft.per_device_train_batch_size=8",
                                    "node.sft.eval_fraction=0.2"});
  recording_context ctx(spec);
  node->start(ctx);
  while (node->produce(ctx)) {
  }
  // "[step 1 sft] T train / E held-out examples; ..."
  REQUIRE(!ctx.printed.empty());
  int64_t train = 0, held = 0;
  REQUIRE(std::sscanf(ctx.printed.front().c_str(), "[step 1 sft] %ld train / %ld held-out", &train, &held) == 2);
  const int64_t n = (held + 7) / 8;
  REQUIRE(n >= 2);  // a pass of several batches, so each is seen
  const auto passes = of(ctx.reports, "step 1 sft held-out");
  REQUIRE(passes.size() == static_cast<size_t>(2 * (n + 1)));
  check_pass({passes.begin(), passes.begin() + n + 1}, "step 1 sft held-out", n);
  check_pass({passes.begin() + n + 1, passes.end()}, "step 1 sft held-out", n);
  CHECK(of(ctx.reports, "step 1 sft") == std::vector<report>{{"step 1 sft", 1, 2}, {"step 1 sft", 2, 2}});
  // the order: the pass before, the updates, the pass after
  CHECK(std::get<0>(ctx.reports[static_cast<size_t>(n)]) == "step 1 sft held-out");
  CHECK(ctx.reports[static_cast<size_t>(n + 1)] == report{"step 1 sft", 1, 2});
  CHECK(ctx.emitted == std::vector<std::string>{"model"});
}

// prompt_loader: the held-out batch goes out at the job's start (the generator holds it until the
// policy's weights come), but "step 3 ppo" is reported only once the controller's first tick says
// step 3's loop runs: a phase shows once it has started.
TEST_CASE("step 3 progress: prompt_loader reports its phase once the controller asks for a batch") {
  auto [spec, node] = shipped_node("rlhf.graph", "prompts", {"node.prompts.iterations=3"});
  recording_context ctx(spec);
  node->start(ctx);
  CHECK(node->produce(ctx));  // the held-out "before" batch
  CHECK(ctx.emitted.size() == 1);
  CHECK(ctx.reports.empty());  // nothing of step 3 yet: steps 1 and 2 may still be training
  CHECK(node->produce(ctx));   // no tick yet: it waits
  CHECK(ctx.waiting);
  CHECK(ctx.emitted.size() == 1);
  CHECK(ctx.reports.empty());
  std::vector<report> want;
  for (int64_t k = 0; k <= 3; ++k) {  // a tick per batch: iterations 0, 1, 2, then the held-out "after"
    node->on_message(ctx, "next", actor::payload{});
    CHECK(node->produce(ctx));
    want.emplace_back("step 3 ppo", k, 3);
  }
  CHECK(ctx.emitted.size() == 5);
  CHECK(ctx.reports == want);  // 0/3 as iteration 0's prompts go out ... 3/3 with the held-out "after"
  node->on_message(ctx, "next", actor::payload{});
  CHECK_FALSE(node->produce(ctx));  // all batches out
}

// actors/resume_check.h: the data split took DS-Chat's own row order on 2026-12-05 (dschat::shuffle_indices),
// so a finished step or a checkpoint recorded before then trained on other rows. Its record lacks
// data_split_order, which must read as a change (a rerun trains again; a resume is refused), not as the same rows.
TEST_CASE("settings record: a node with data_split records the split's row order, and an older record reads as a change") {
  auto [sft, sft_node] = shipped_node("rlhf.graph", "sft", {});
  const auto now = actors::settings_record(sft, {});
  REQUIRE(now.contains("data_split_order"));
  CHECK(now["data_split_order"] == std::string(dschat::split_order));
  CHECK(actors::settings_changes(actors::with_newer_defaults(now, now, sft), now).empty());
  auto then = now;
  then.erase("data_split_order");
  CHECK(actors::settings_changes(actors::with_newer_defaults(then, now, sft), now) ==
        std::vector<std::string>{"data_split_order (not set) -> DS-Chat get_shuffle_idx (numpy RandomState)"});
  // the prompts of step 3 too; a node without data_split (pretraining's ranks) records none
  auto [prompts, prompts_node] = shipped_node("rlhf.graph", "prompts", {});
  CHECK(actors::settings_record(prompts, {}).contains("data_split_order"));
  auto [ranks, ranks_node] = shipped_node("pretrain.graph", "ranks", {});
  CHECK_FALSE(actors::settings_record(ranks, {}).contains("data_split_order"));
}

TEST_CASE("settings record: a restart policy added after a crash is no change to what trains") {
  // restart = "on-failure" added to the command after a crash was refused as a changed setting (and the refusal
  // retried max_restarts times), and a finished step trained again; the supervision settings are not recorded
  for (const char* graph_node : {"sft.graph:sft", "pretrain.graph:ranks", "pretrain.graph:data", "rlhf.graph:policy"}) {
    const std::string g(graph_node), gf = g.substr(0, g.find(':')), name = g.substr(g.find(':') + 1);
    CAPTURE(g);
    auto [then_spec, then_node] = shipped_node(gf, name, {});
    auto [now_spec, now_node] =
        shipped_node(gf, name, {"node." + name + ".restart=on-failure", "node." + name + ".max_restarts=5"});
    const auto then = actors::settings_record(then_spec, {}), now = actors::settings_record(now_spec, {});
    CHECK_FALSE(now.contains("restart"));
    CHECK_FALSE(now.contains("max_restarts"));
    CHECK(actors::settings_changes(then, now).empty());
    // a record written before (with "restart" in it) reads as the same settings too
    auto older = then;
    older["restart"] = "\"never\"";
    older["max_restarts"] = "3";
    CHECK(actors::settings_changes(actors::with_newer_defaults(older, now, now_spec), now).empty());
  }
}

TEST_CASE("settings record: the trainers record the model they start from and a tokenizer folder by their contents") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_model_contents_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "hf");
  const std::string file = (dir / "base.bin").string();
  fs::copy_file(assets_root() / "model" / "stories260K" / "stories260K.bin", file);
  auto flip_last_byte = [](const fs::path& p) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 1));
  };
  for (const char* graph_node : {"sft.graph:sft", "dpo.graph:dpo"}) {
    const std::string g(graph_node), gf = g.substr(0, g.find(':')), name = g.substr(g.find(':') + 1);
    CAPTURE(g);
    auto record = [&](const std::string& model, const std::string& output) {
      auto [n, node] = shipped_node(gf, name, {"node." + name + ".model=" + model, "node." + name + ".output=" + output});
      return actors::settings_record(n, {});
    };
    const std::string out = (dir / "out.bin").string();
    const auto then = record(file, out);
    REQUIRE(then.contains("model (contents)"));
    CHECK(actors::settings_changes(then, record(file, out)).empty());
    flip_last_byte(file);  // the same path, other bytes (a data file's size and time key its cached fingerprint:
    fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(2));  // a replaced file has another)
    const std::string canon = fs::canonical(file).string();
    CHECK(actors::settings_changes(then, record(file, out)) ==
          std::vector<std::string>{"model: the bytes of \"" + canon + "\" changed"});
    // another file with other bytes: both paths named (it read as if the first file had changed)
    const std::string other = (dir / "other.bin").string();
    fs::copy_file(file, other, fs::copy_options::overwrite_existing);  // the bytes after the flip
    fs::last_write_time(other, fs::last_write_time(other) + std::chrono::seconds(4));
    CHECK(actors::settings_changes(then, record(other, out)) ==
          std::vector<std::string>{"model \"" + canon + "\" -> \"" + fs::canonical(other).string() + "\" (other bytes)"});
    // the same bytes elsewhere are the same model
    CHECK(actors::settings_changes(record(file, out), record(other, out)).empty());
  }
  {  // pretraining's ranks too: a LoRA checkpoint resumed on a replaced base trained on another model
    auto ranks = [&] {
      auto [n, node] = shipped_node("pretrain.graph", "ranks", {"node.ranks.model=" + file});
      return actors::settings_record(n, {});
    };
    const auto then = ranks();
    REQUIRE(then.contains("model (contents)"));
    flip_last_byte(file);
    fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(2));
    CHECK(actors::settings_changes(then, ranks()) ==
          std::vector<std::string>{"model: the bytes of \"" + fs::canonical(file).string() + "\" changed"});
  }
  // a tokenizer folder: its tokenizer files by their bytes (its path alone let another tokenizer copied in resume)
  fs::create_directories(dir / "tok");
  fs::copy_file(assets_root() / "model" / "stories260K" / "tok512.model", dir / "tok" / "tokenizer.model");
  auto tok_record = [&] {
    auto [n, node] = shipped_node("sft.graph", "sft", {"node.sft.tokenizer=" + (dir / "tok").string()});
    return actors::settings_record(n, {});
  };
  const auto tok_then = tok_record();
  REQUIRE(tok_then.contains("tokenizer (contents)"));
  std::ofstream(dir / "tok" / "README.md") << "not a tokenizer file";  // other files do not count
  CHECK(actors::settings_changes(tok_then, tok_record()).empty());
  flip_last_byte(dir / "tok" / "tokenizer.model");
  fs::last_write_time(dir / "tok" / "tokenizer.model", fs::last_write_time(dir / "tok" / "tokenizer.model") + std::chrono::seconds(2));
  CHECK(actors::settings_changes(tok_then, tok_record()) ==
        std::vector<std::string>{"tokenizer: the bytes of \"" + fs::canonical(dir / "tok").string() + "\" changed"});
  // a folder: each file a model is read from, by name; other files (a README from the Hub) are no change
  std::ofstream(dir / "hf" / "config.json") << "{\"model_type\": \"llama\"}\n";
  std::ofstream(dir / "hf" / "model.safetensors") << "weights";
  auto hf_record = [&] {
    auto [n, node] = shipped_node("sft.graph", "sft", {"node.sft.output=" + (dir / "o").string()});
    n.settings["model"].value = (dir / "hf").string();  // the record reads the setting; no load happens here
    return actors::settings_record(n, {});
  };
  const std::string hf = "\"" + fs::canonical(dir / "hf").string() + "\"";
  const auto before = hf_record();
  REQUIRE(before.at("model (contents)").is_object());
  // the record flowrun wrote before the files were named: one FNV-1a over "NAME FINGERPRINT" of every file
  auto legacy = before;
  {
    std::string lines;
    for (const auto& [name, fp] : before.at("model (contents)").items())  // name order
      lines += (lines.empty() ? "" : "\n") + name + " " + fp.get<std::string>();
    legacy["model (contents)"] = fmt::format("fnv1a:{:016x}", graph::fnv1a64(lines));
  }
  CHECK(actors::settings_changes(legacy, hf_record()).empty());
  std::ofstream(dir / "hf" / "README.md") << "# a model card\n";
  std::ofstream(dir / "hf" / ".gitattributes") << "*.safetensors filter=lfs\n";
  CHECK(actors::settings_changes(before, hf_record()).empty());
  CHECK(actors::settings_changes(legacy, hf_record()) ==  // an old record cannot tell which file: the folder's bytes
        std::vector<std::string>{"model: the bytes of " + hf + " changed"});
  std::ofstream(dir / "hf" / "model.safetensors", std::ios::app) << "!";
  fs::last_write_time(dir / "hf" / "model.safetensors", fs::last_write_time(dir / "hf" / "model.safetensors") + std::chrono::seconds(2));
  std::ofstream(dir / "hf" / "tokenizer.json") << "{}";
  fs::remove(dir / "hf" / "config.json");
  CHECK(actors::settings_changes(before, hf_record()) ==
        std::vector<std::string>{"model: " + hf + " changed (model.safetensors changed, tokenizer.json added, config.json gone)"});
  CHECK(actors::model_contents_changes(before.at("model (contents)"), actors::model_contents((dir / "hf").string())) ==
        std::vector<std::string>{"model.safetensors changed", "tokenizer.json added", "config.json gone"});
  fs::remove_all(dir);
}
