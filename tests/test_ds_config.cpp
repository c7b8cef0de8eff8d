// DeepSpeed's JSON config (models/train/ds_config.h): DS-Chat's own configs, the
// batch triple, the lr schedules and fp16 loss scaling against numbers that
// DeepSpeed 0.19.8 produced (tests/fixtures/ds/make_ds_reference.py), and the
// error reports for bad inputs.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "models/train/ds_config.h"

using namespace flowrun;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path fixture(const std::string& name) { return fs::path(FLOWRUN_FIXTURES_DIR) / "ds" / name; }

json read_json(const std::string& name) {
  std::ifstream f(fixture(name));
  REQUIRE_MESSAGE(f.good(), "missing fixture " << fixture(name));
  return json::parse(f);
}

/// The message of the std::invalid_argument that `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace

TEST_CASE("ds_config: DS-Chat stage-3 training config from get_train_ds_config with offload off in fp16") {
  const std::string path = fixture("dschat_train_stage3.json").string();
  ds_config c = load_ds_config(path, 8);
  CHECK(c.where == path);
  CHECK(c.train_batch_size == 32);
  CHECK(c.train_micro_batch_size_per_gpu == 4);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.zero_stage == 3);
  CHECK(c.fp16);
  CHECK_FALSE(c.bf16);
  CHECK(c.loss_scale == 0);
  CHECK(c.loss_scale_window == 100);
  CHECK(c.initial_scale_power == 16);
  CHECK(c.hysteresis == 2);
  CHECK(c.min_loss_scale == 1);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.offload_optimizer_device == "none");
  CHECK(c.offload_param_device == "none");
  // no optimizer / scheduler sections: DS-Chat passes its own (flowrun: AdamW defaults, constant lr)
  CHECK_FALSE(c.optimizer_given);
  CHECK(c.optimizer_type == "AdamW");
  CHECK(c.scheduler.type.empty());
  CHECK(c.lr_at(0) == c.lr);
  CHECK(c.lr_at(12345) == c.lr);

  const std::vector<std::string> ignored = {"steps_per_print",
                                            "zero_optimization.overlap_comm",
                                            "zero_optimization.offload_param",
                                            "zero_optimization.offload_optimizer",
                                            "zero_optimization.stage3_param_persistence_threshold",
                                            "zero_optimization.stage3_max_live_parameters",
                                            "zero_optimization.stage3_prefetch_bucket_size",
                                            "zero_optimization.memory_efficient_linear",
                                            "prescale_gradients",
                                            "wall_clock_breakdown",
                                            "hybrid_engine",
                                            "tensorboard"};
  CHECK(c.ignored_keys == ignored);  // in file order
  CHECK(c.warnings.empty());
  std::string w = c.ignored_keys_warning();
  CHECK(contains(w, path));
  CHECK(contains(w, "zero_optimization.stage3_max_live_parameters"));
  CHECK(contains(c.summary(), "ZeRO stage 3"));

  // DS-Chat's main.py then sets the micro batch and train_batch_size = micro * world * gas
  ds_parse_options o;
  o.overrides = {{"train_micro_batch_size_per_gpu", "8"}, {"train_batch_size", "64"}};
  ds_config c2 = load_ds_config(path, 4, o);
  CHECK(c2.train_micro_batch_size_per_gpu == 8);
  CHECK(c2.gradient_accumulation_steps == 2);

  // 32 samples in micro batches of 4 cannot be split over 3 ranks
  std::string e = error_of([&] { load_ds_config(path, 3); });
  CHECK(contains(e, path + ":2:3: train_batch_size 32 != train_micro_batch_size_per_gpu 4 * "
                           "gradient_accumulation_steps 2 * world_size 3 = 24"));
  CHECK(contains(e, "32 // 4 // 3 = 2"));
}

TEST_CASE("ds_config: DS-Chat stage-3 eval config in bf16 uses the old bfloat16 section") {
  ds_config c = load_ds_config(fixture("dschat_eval_stage3_bf16.json").string(), 1);
  CHECK(c.bf16);
  CHECK_FALSE(c.fp16);
  CHECK(c.zero_stage == 3);
  CHECK(c.gradient_accumulation_steps == 8);  // 32 = 4 * 8 * 1
  CHECK(has(c.ignored_keys, "zero_optimization.stage3_param_persistence_threshold"));
  CHECK_FALSE(has(c.ignored_keys, "bfloat16"));
  dynamic_loss_scaler s(c);  // bf16: no loss scaling
  CHECK(s.scale() == 1.0);
  CHECK_FALSE(s.dynamic());
  CHECK(s.update(true));
  CHECK(s.scale() == 1.0);

  // with a "bf16" section as well, DeepSpeed reads only that one
  ds_config c2 = parse_ds_config(R"({"train_batch_size": 4, "bf16": {"enabled": false}, "bfloat16": {"enabled": true}})", 1);
  CHECK_FALSE(c2.bf16);
  CHECK(has(c2.ignored_keys, "bfloat16"));
}

TEST_CASE("ds_config: batch triple resolution matches DeepSpeedConfig") {
  json ref = read_json("batch_reference.json");
  REQUIRE(ref["cases"].size() >= 10);
  for (const auto& cs : ref["cases"]) {
    const std::string text = cs["config"].dump();
    const int world = cs["world_size"].get<int>();
    const json& want = cs["result"];
    CAPTURE(text);
    CAPTURE(world);
    if (want.contains("error")) {
      std::string e = error_of([&] { parse_ds_config(text, world); });
      CHECK_MESSAGE(!e.empty(), "DeepSpeed: " << want["error"].get<std::string>());
    } else {
      ds_config c = parse_ds_config(text, world);
      CHECK(c.train_batch_size == want["train_batch_size"].get<int64_t>());
      CHECK(c.train_micro_batch_size_per_gpu == want["train_micro_batch_size_per_gpu"].get<int64_t>());
      CHECK(c.gradient_accumulation_steps == want["gradient_accumulation_steps"].get<int64_t>());
      CHECK(c.world_size == world);
    }
  }
}

TEST_CASE("ds_config: batch triple errors say what is wrong and where") {
  std::string e = error_of([] {
    parse_ds_config("{\n  \"train_batch_size\": 32,\n  \"train_micro_batch_size_per_gpu\": 4,\n"
                    "  \"gradient_accumulation_steps\": 2\n}",
                    2, "b.json");
  });
  CHECK(contains(e, "b.json:2:3: train_batch_size 32 != train_micro_batch_size_per_gpu 4 * "
                    "gradient_accumulation_steps 2 * world_size 2 = 16"));
  CHECK(contains(e, "give only two of the three"));

  e = error_of([] { parse_ds_config(R"({"gradient_accumulation_steps": 4})", 1); });
  CHECK(contains(e, "either train_batch_size or train_micro_batch_size_per_gpu needs to be given"));
  e = error_of([] { parse_ds_config(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 32})", 1); });
  CHECK(contains(e, "gradient_accumulation_steps comes out as 0"));
  e = error_of([] { parse_ds_config(R"({"train_micro_batch_size_per_gpu": -2})", 1); });
  CHECK(contains(e, "train_micro_batch_size_per_gpu is -2; it has to be greater than 0"));
  e = error_of([] { parse_ds_config(R"({"train_micro_batch_size_per_gpu": 2.5})", 1); });
  CHECK(contains(e, "train_micro_batch_size_per_gpu is 2.5; it must be a positive integer"));
  e = error_of([] { parse_ds_config(R"({"train_batch_size": 8})", 0, "w.json"); });
  CHECK(contains(e, "w.json: world_size must be >= 1"));
}

TEST_CASE("ds_config: lr schedules match DeepSpeed WarmupLR and WarmupDecayLR and WarmupCosineLR") {
  json ref = read_json("lr_reference.json");
  int cases = 0;
  for (const auto& cs : ref["cases"]) {
    const std::string name = cs["name"].get<std::string>();
    const double base_lr = cs["base_lr"].get<double>();
    json cfg = {{"train_batch_size", 8},
                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", base_lr}}}}},
                {"scheduler", {{"type", cs["type"]}, {"params", cs["params"]}}}};
    ds_config c = parse_ds_config(cfg.dump(), 1, name);
    CHECK(c.scheduler.type == cs["type"].get<std::string>());
    const auto& steps = cs["steps"];
    const auto& lrs = cs["lr"];
    REQUIRE(steps.size() == lrs.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      const int64_t step = steps[i].get<int64_t>();
      const double want = lrs[i].get<double>();
      const double got = c.lr_at(step);
      CAPTURE(name);
      CAPTURE(step);
      CHECK(std::fabs(got - want) <= 1e-15 + 1e-12 * std::fabs(want));
    }
    ++cases;
  }
  CHECK(cases == 11);

  // spot checks of the convention: the first two updates run at warmup_min_lr
  ds_config c = parse_ds_config(
      R"({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.5, "warmup_max_lr": 1.0, "warmup_num_steps": 4, "warmup_type": "linear"}}})",
      1);
  CHECK(c.lr_at(0) == 0.5);
  CHECK(c.lr_at(1) == 0.5);
  CHECK(c.lr_at(2) == doctest::Approx(0.625));
  CHECK(c.lr_at(5) == 1.0);
  CHECK_THROWS_AS(c.lr_at(-1), std::invalid_argument);
}

TEST_CASE("lr_schedule past_end: a decaying DeepSpeed schedule shorter than the run is named, with the lr it ends at") {
  ds_config c = parse_ds_config(
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 2, "total_num_steps": 4}}})",
      1);
  CHECK(c.scheduler.past_end(4, 1e-3).empty());  // the run ends where the schedule does
  CHECK(c.scheduler.past_end(20, 1e-3) ==
        "the DeepSpeed config's WarmupDecayLR is over at total_num_steps = 4: the steps past it train at the "
        "schedule's end (learning rate 0 at step 20)");
  // WarmupCosineLR ends at cos_min_ratio x lr (DeepSpeed's default 0.0001); WarmupLR holds its lr: no note
  ds_config cos = parse_ds_config(
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2, "total_num_steps": 10}}})",
      1);
  CHECK(cos.scheduler.past_end(12, 1e-3).find("learning rate 1e-07 at step 12") != std::string::npos);
  ds_config flat = parse_ds_config(
      R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 2}}})", 1);
  CHECK(flat.scheduler.past_end(1000, 1e-3).empty());
  CHECK(lr_schedule::transformers("cosine", 0, 10).past_end(1000, 1e-3).empty());  // transformers' types: never
}

TEST_CASE("lr_schedule all_warmup: a transformers warmup as long as the run is named, with the rate it ends at") {
  // linear, W = 10, 2 updates: update 1 runs at 1/10 of base_lr (transformers: k / max(1, W))
  CHECK(lr_schedule::transformers("linear", 10, 2).all_warmup(2, 1e-3) ==
        "num_warmup_steps = 10 and the run has 2 updates: every update is in warmup, the last at 1.00e-04, 10%");
  CHECK(lr_schedule::transformers("cosine", 4, 4).all_warmup(4, 1e-3).find("the last at 7.50e-04, 75%") !=
        std::string::npos);
  CHECK(lr_schedule::transformers("cosine", 3, 4).all_warmup(4, 1e-3).empty());     // update 3 is past the warmup
  CHECK(lr_schedule::transformers("constant", 100, 4).all_warmup(4, 1e-3).empty());  // constant has no warmup
  CHECK(lr_schedule::transformers("linear", 10, 2).all_warmup(2, 0).empty());       // no rate to reach
  CHECK(lr_schedule::transformers("linear", 10, 0).all_warmup(0, 1e-3).empty());    // no updates
  ds_config ds = parse_ds_config(
      R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 50}}})", 1);
  CHECK(ds.scheduler.all_warmup(4, 1e-3).empty());  // DeepSpeed's types: its JSON says the warmup
}

TEST_CASE("ds_config: DeepSpeed's TensorBoard monitor turned on is named, with the node settings that write event files") {
  auto has_tb_warning = [](const ds_config& c) {
    for (const auto& w : c.warnings)
      if (w.find("DeepSpeed's TensorBoard monitor is not read here: set enable_tensorboard = true") != std::string::npos)
        return true;
    return false;
  };
  CHECK(has_tb_warning(parse_ds_config(
      R"({"train_batch_size": 8, "tensorboard": {"enabled": true, "output_path": "tb/", "job_name": "x"}})", 1)));
  CHECK_FALSE(has_tb_warning(parse_ds_config(R"({"train_batch_size": 8, "tensorboard": {"enabled": false}})", 1)));
  CHECK_FALSE(has_tb_warning(parse_ds_config(R"({"train_batch_size": 8})", 1)));
}

TEST_CASE("ds_config: scheduler defaults and warnings and errors") {
  // WarmupLR without warmup_max_lr warms up to the optimizer's lr (DeepSpeed 0.19.8 lr_schedules.py)
  ds_config c = parse_ds_config(
      R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.002}}, "scheduler": {"type": "WarmupLR"}})",
      1);
  CHECK(c.scheduler.warmup_max_lr_from_optimizer);
  CHECK(c.scheduler.warmup_num_steps == 1000);
  CHECK(c.scheduler.warmup_type == "log");
  CHECK(c.lr_at(5000) == 0.002);
  // WarmupDecayLR defaults warmup_max_lr to 0.001 whatever the optimizer's lr
  c = parse_ds_config(
      R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.002}}, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}}})",
      1);
  CHECK_FALSE(c.scheduler.warmup_max_lr_from_optimizer);
  CHECK(c.lr_at(11) == doctest::Approx(0.001));

  // an unknown warmup_type is log, with DeepSpeed's warning; total < warmup warns
  c = parse_ds_config(
      R"({"train_batch_size": 1, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5, "warmup_num_steps": 10, "warmup_type": "cosine"}}})",
      1, "s.json");
  CHECK(c.scheduler.warmup_type == "log");
  REQUIRE(c.warnings.size() == 2);
  CHECK(contains(c.warnings[0], "s.json:1:"));
  CHECK(contains(c.warnings[0], "unknown warmup_type \"cosine\""));
  CHECK(contains(c.warnings[1], "total_num_steps 5 is less than the warmup's 10 steps (warmup_num_steps)"));
  // DeepSpeed's warmup is 2 steps at least: a run of 1 update with warmup_num_steps 0 said "1 is less than 0"
  c = parse_ds_config(
      R"({"train_batch_size": 1, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 1, "warmup_num_steps": 0}}})",
      1, "s.json");
  REQUIRE(c.warnings.size() == 1);
  CHECK(contains(c.warnings[0], "total_num_steps 1 is less than the warmup's 2 steps (warmup_num_steps 0, which "
                                "DeepSpeed raises to 2)"));

  std::string e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 1, "scheduler": {"type": "OneCycle", "params": {}}})", 1, "s.json");
  });
  CHECK(contains(e, "s.json:1:"));
  CHECK(contains(e, "scheduler.type is \"OneCycle\"; flowrun runs WarmupLR, WarmupDecayLR or WarmupCosineLR"));
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}})", 1);
  });
  CHECK(contains(e, "scheduler.params.total_num_steps is required for WarmupDecayLR"));
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": -1}}})", 1);
  });
  CHECK(contains(e, "scheduler.params.warmup_num_steps is -1; it must be an integer >= 0"));
  // 0 (HF Trainer's default warmup): DeepSpeed's WarmupLR warms up over max(2, 0) = 2 steps
  CHECK(parse_ds_config(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})", 1)
            .scheduler.warmup_num_steps == 0);
  e = error_of([] {
    parse_ds_config(
        R"({"train_batch_size": 1, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_max_lr": 0.1}}})",
        1);
  });
  CHECK(contains(e, "scheduler.params.warmup_max_lr is not a WarmupCosineLR parameter"));
  CHECK(contains(e, "warmup_min_ratio"));
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": [0.1, 0.2]}}})", 1);
  });
  CHECK(contains(e, "per-parameter-group values are not supported"));
}

TEST_CASE("ds_config: fp16 loss scaling matches DeepSpeed DynamicLossScaler with ZeRO and FP16_Optimizer without") {
  json ref = read_json("loss_scale_reference.json");
  int cases = 0;
  for (const auto& cs : ref["cases"]) {
    const std::string name = cs["name"].get<std::string>();
    json fp16 = cs["fp16"];
    fp16["enabled"] = true;
    json cfg = {{"train_batch_size", 4}, {"zero_optimization", {{"stage", cs["zero_stage"]}}}, {"fp16", fp16}};
    ds_config c = parse_ds_config(cfg.dump(), 1, name);
    dynamic_loss_scaler s(c);
    CAPTURE(name);
    CHECK(s.dynamic());
    CHECK(s.uses_hysteresis() == (cs["zero_stage"].get<int>() > 0));
    const auto& ov = cs["overflows"];
    const auto& trace = cs["trace"];
    const bool raises = !cs["raised_at"].is_null();
    const size_t n = raises ? cs["raised_at"].get<size_t>() : ov.size();
    REQUIRE(trace.size() == n);
    for (size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      const bool overflow = ov[i].get<int>() != 0;
      CHECK(s.scale() == trace[i]["scale_used"].get<double>());
      CHECK(s.update(overflow) == overflow);
      CHECK(s.scale() == trace[i]["scale_after"].get<double>());
      if (!trace[i]["hysteresis_after"].is_null())
        CHECK(s.hysteresis_left() == trace[i]["hysteresis_after"].get<int64_t>());
    }
    if (raises) {
      CHECK_THROWS_AS(s.update(ov[n].get<int>() != 0), std::runtime_error);
    }
    ++cases;
  }
  CHECK(cases == 7);
}

TEST_CASE("ds_config: loss scaler static scale and good_steps and restore") {
  ds_config c = parse_ds_config(
      R"({"train_batch_size": 4, "zero_optimization": {"stage": 1}, "fp16": {"enabled": true, "initial_scale_power": 4, "loss_scale_window": 3, "hysteresis": 2}})",
      1);
  dynamic_loss_scaler a(c);
  CHECK(a.scale() == 16);
  CHECK(a.good_steps() == 0);
  CHECK_FALSE(a.update(false));
  CHECK_FALSE(a.update(false));
  CHECK(a.good_steps() == 2);
  CHECK(a.update(true));  // hysteresis 2 -> 1, scale kept
  CHECK(a.scale() == 16);
  CHECK(a.good_steps() == 0);
  CHECK(a.hysteresis_left() == 1);
  CHECK_FALSE(a.update(false));
  CHECK_FALSE(a.update(false));

  // a copy restored from (scale, good_steps, hysteresis_left) behaves the same from here on
  dynamic_loss_scaler b(c);
  b.restore(a.scale(), a.good_steps(), a.hysteresis_left());
  const int pattern[] = {0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  for (int ov : pattern) {
    CHECK(a.update(ov != 0) == b.update(ov != 0));
    CHECK(a.scale() == b.scale());
    CHECK(a.good_steps() == b.good_steps());
    CHECK(a.hysteresis_left() == b.hysteresis_left());
  }
  CHECK_THROWS_AS(b.restore(0.0, 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(b.restore(8.0, -1, 1), std::invalid_argument);

  // static scale: constant, an overflow still skips the update
  ds_config st = parse_ds_config(R"({"train_batch_size": 4, "fp16": {"enabled": true, "loss_scale": 128}})", 1);
  dynamic_loss_scaler s(st);
  CHECK_FALSE(s.dynamic());
  CHECK(s.scale() == 128);
  CHECK(s.update(true));
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 128);
}

TEST_CASE("ds_config: optimizer Adam is AdamW unless adam_w_mode is false and DeepSpeed defaults") {
  ds_config c = parse_ds_config(R"({"train_batch_size": 1, "optimizer": {"type": "Adam"}})", 1);
  CHECK(c.optimizer_given);
  CHECK(c.optimizer_type == "AdamW");
  CHECK(c.lr == 1e-3);
  CHECK(c.beta1 == 0.9);
  CHECK(c.beta2 == 0.999);
  CHECK(c.eps == 1e-8);
  CHECK(c.weight_decay == 0.0);  // FusedAdam's default
  CHECK(c.bias_correction);

  c = parse_ds_config(
      R"({"train_batch_size": 1, "optimizer": {"type": "adam", "params": {"adam_w_mode": false, "weight_decay": 0.1}}})", 1);
  CHECK(c.optimizer_type == "Adam");
  CHECK(c.weight_decay == 0.1);

  c = parse_ds_config(R"({"train_batch_size": 1, "optimizer": {"type": "ADAMW", "params": {"adam_w_mode": false}}})", 1);
  CHECK(c.optimizer_type == "AdamW");  // "AdamW" is always decoupled

  c = parse_ds_config(
      R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"torch_adam": true, "lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6, "fused": true}}})",
      1);
  CHECK(c.torch_adam);
  CHECK(c.weight_decay == 0.01);  // torch.optim.AdamW's default
  CHECK(c.lr == 3e-4);
  CHECK(c.beta2 == 0.95);
  CHECK(c.eps == 1e-6);
  CHECK(has(c.ignored_keys, "optimizer.params.fused"));

  std::string e = error_of([] {
    parse_ds_config("{\n \"train_batch_size\": 1,\n \"optimizer\": {\"type\": \"Lamb\", \"params\": {\"lr\": 0.1}}\n}", 1,
                    "o.json");
  });
  CHECK(contains(e, "o.json:3:16: optimizer.type is \"Lamb\"; flowrun runs \"AdamW\" or \"Adam\""));
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})", 1);
  });
  CHECK(contains(e, "use the top-level \"gradient_clipping\""));
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})", 1);
  });
  CHECK(contains(e, "optimizer.params.momentum is not an Adam/AdamW parameter"));
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})", 1);
  });
  CHECK(contains(e, "optimizer.params.betas is [0.9]; it must be [beta1, beta2]"));
}

TEST_CASE("ds_config: HF Trainer auto values are an error naming the key or come from auto_values") {
  const std::string path = fixture("hf_trainer_auto.json").string();
  std::string e = error_of([&] { load_ds_config(path, 2); });
  // every "auto" key read is named in one error, each with its place (they were refused one per try)
  CHECK(contains(e, path + ": 14 keys are \"auto\": fp16.enabled (5:5), bf16.enabled (13:5), optimizer.params.lr "
                           "(18:7), optimizer.params.betas (19:7)"));
  // the scheduler's missing total_num_steps stopped the reading; the keys after it are named too
  CHECK(contains(e, "scheduler.params.total_num_steps (30:7), gradient_accumulation_steps (46:3), gradient_clipping "
                    "(47:3), train_batch_size (49:3), train_micro_batch_size_per_gpu (50:3)."));
  CHECK(contains(e, "write a value for each in the file"));
  CHECK_FALSE(contains(e, "reduce_bucket_size"));  // "auto" at a key flowrun does not read is fine
  // one key: its place first; with some filled, the fix names those
  e = error_of([] { parse_ds_config(R"({"train_batch_size": 8, "gradient_clipping": "auto"})", 1, "g.json"); });
  CHECK(contains(e, "g.json:1:25: gradient_clipping is \"auto\": HF Trainer's DeepSpeed integration fills \"auto\" in "
                    "from its own arguments, and nothing here gives a value for it: write a value for it in the file"));
  {
    ds_parse_options partial;
    partial.auto_values = {{"train_batch_size", "8"}};
    e = error_of([&] {
      parse_ds_config(R"({"train_batch_size": "auto", "gradient_clipping": "auto"})", 1, "g.json", partial);
    });
    CHECK(contains(e, "gradient_clipping is \"auto\""));
    CHECK(contains(e, "(\"auto\" is filled here only for train_batch_size)"));
  }

  ds_parse_options o;
  o.auto_values = {{"fp16.enabled", "false"},
                   {"bf16.enabled", "true"},
                   {"optimizer.params.lr", "2e-5"},
                   {"optimizer.params.betas", "[0.9, 0.98]"},
                   {"optimizer.params.eps", "1e-8"},
                   {"optimizer.params.weight_decay", "0.0"},
                   {"scheduler.params.warmup_min_lr", "0"},
                   {"scheduler.params.warmup_max_lr", "2e-5"},
                   {"scheduler.params.warmup_num_steps", "100"},
                   {"scheduler.params.total_num_steps", "1000"},
                   {"gradient_accumulation_steps", "4"},
                   {"gradient_clipping", "1.0"},
                   {"train_batch_size", "64"},
                   {"train_micro_batch_size_per_gpu", "8"}};
  ds_config c = load_ds_config(path, 2, o);
  CHECK(c.bf16);
  CHECK_FALSE(c.fp16);
  CHECK(c.lr == 2e-5);
  CHECK(c.beta2 == 0.98);
  CHECK(c.scheduler.type == "WarmupDecayLR");
  CHECK(c.scheduler.total_num_steps == 1000);
  CHECK(c.gradient_accumulation_steps == 4);
  CHECK(c.zero_stage == 2);
  CHECK(c.offload_optimizer_device == "cpu");
  CHECK(has(c.ignored_keys, "zero_optimization.reduce_bucket_size"));  // "auto" there is fine: ignored

  // a bad auto value is reported against auto_values
  o.auto_values["train_batch_size"] = "60";
  e = error_of([&] { load_ds_config(path, 2, o); });
  CHECK(contains(e, path + ": auto_values train_batch_size=60: train_batch_size 60 != "));
}

TEST_CASE("ds_config: overrides set keys before reading and errors name them") {
  ds_parse_options o;
  o.overrides = {{"scheduler.type", "WarmupLR"}, {"scheduler.params.warmup_num_steps", "4"}, {"zero_optimization.stage", "2"}};
  ds_config c = parse_ds_config(R"({"train_micro_batch_size_per_gpu": 2})", 2, "<string>", o);
  CHECK(c.scheduler.type == "WarmupLR");
  CHECK(c.scheduler.warmup_num_steps == 4);
  CHECK(c.zero_stage == 2);
  CHECK(c.train_batch_size == 4);

  o.overrides = {{"zero_optimization.stage", "7"}};
  std::string e = error_of([&] { parse_ds_config(R"({"train_batch_size": 2})", 1, "x.json", o); });
  CHECK(contains(e, "x.json: override zero_optimization.stage=7: zero_optimization.stage is 7"));
  o.overrides = {{"fp16.enabled.x", "1"}};
  e = error_of([&] { parse_ds_config(R"({"train_batch_size": 2, "fp16": {"enabled": true}})", 1, "x.json", o); });
  CHECK(contains(e, "fp16.enabled is true, not an object"));
}

TEST_CASE("ds_config: bad inputs malformed JSON and stage 5 and fp16 with bf16 and duplicates and missing file") {
  // malformed JSON: line:column of the syntax error, and the file
  std::string e = error_of([] {
    parse_ds_config("{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\"stage\": 2,}\n}\n", 1, "bad.json");
  });
  CHECK(contains(e, "bad.json:3:36: not valid JSON: syntax error"));
  e = error_of([] { parse_ds_config("", 1, "empty.json"); });
  CHECK(contains(e, "empty.json:1:1: not valid JSON"));
  e = error_of([] { parse_ds_config("[1, 2]", 1, "arr.json"); });
  CHECK(contains(e, "arr.json: a DeepSpeed config is a JSON object"));
  // a number past a double (tests/fuzz/fuzz_ds_config: nlohmann's out_of_range escaped, naming no file)
  e = error_of([] { parse_ds_config("1111e1110556", 1, "big.json"); });
  CHECK(contains(e, "big.json: not valid JSON: number overflow parsing '1111e1110556' (larger than a double can hold)"));
  e = error_of([] { parse_ds_config(R"({"train_batch_size": 8, "gradient_clipping": 1e999})", 1, "clip.json"); });
  CHECK(contains(e, "clip.json: not valid JSON: number overflow"));
  {
    ds_parse_options o;  // the same number in an override is a string, refused by the key's type check
    o.overrides = {{"gradient_clipping", "1e999"}};
    e = error_of([&] { parse_ds_config(R"({"train_batch_size": 8})", 1, "o.json", o); });
    CHECK(contains(e, "override gradient_clipping=1e999"));
  }

  // comments are fine (DeepSpeed reads hjson)
  ds_config c = parse_ds_config("// comment\n{\"train_batch_size\": 8 /* eight */}", 2);
  CHECK(c.train_micro_batch_size_per_gpu == 4);

  e = error_of([] {
    parse_ds_config("{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\n    \"stage\": 5\n  }\n}", 1, "z.json");
  });
  CHECK(contains(e, "z.json:4:5: zero_optimization.stage is 5; zero_optimization.stage must be 0, 1, 2 or 3"));
  // a stage past int64_t's range: refused the same way (the cast came first: undefined, found by fuzz_ds_config)
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 8, "zero_optimization": {"stage": 33333333333333333333333333333333333333}})",
                    1, "z.json");
  });
  CHECK(contains(e, "zero_optimization.stage must be 0, 1, 2 or 3"));
  // a misspelt zero_optimization key: DeepSpeed refuses it (its config models forbid extras); it fell back to
  // stage 0 with an info line. Its other keys (overlap_comm, the stage3_ aliases) are accepted and ignored.
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 8, "zero_optimization": {"stgae": 3, "overlap_comm": true}})", 1, "t.json");
  });
  CHECK(contains(e, "t.json:1:47: zero_optimization.stgae is not a zero_optimization setting (DeepSpeed rejects it "
                    "too): did you mean \"stage\"?"));
  // a misspelt key inside offload_optimizer / offload_param: DeepSpeed's offload configs forbid extras too
  e = error_of([] {
    parse_ds_config(
        R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memroy": true}}})",
        1, "f.json");
  });
  CHECK(contains(e, "f.json:1:98: zero_optimization.offload_optimizer.pin_memroy is not an offload_optimizer setting "
                    "(DeepSpeed rejects it too): did you mean \"pin_memory\"?"));
  e = error_of([] {
    parse_ds_config(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "ratio": 0.5}}})",
                    1, "p.json");
  });
  CHECK(contains(e, "zero_optimization.offload_param.ratio is not an offload_param setting"));
  {
    ds_config z = parse_ds_config(
        R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": true, "max_in_cpu": 1e9}, "offload_optimizer": {"device": "cpu", "ratio": 0.3, "fast_init": false}}})", 1);
    CHECK(z.offload_param_device == "cpu");
    CHECK(z.offload_optimizer_device == "cpu");
  }
  {
    ds_config z = parse_ds_config(
        R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9, "sub_group_size": 1e9}})", 1);
    CHECK(z.zero_stage == 3);
    // a top-level key a letter from one read here is kept as a likely typo; other unread sections are not
    ds_config t =
        parse_ds_config(R"({"train_batch_size": 8, "gradient_clippin": 1.0, "steps_per_print": 10})", 1, "g.json");
    REQUIRE(t.likely_typos.size() == 1);
    CHECK(t.likely_typos[0] == ds_config::typo{"gradient_clippin", "gradient_clipping", "g.json:1:25"});
    // bfloat16 beside bf16 is ignored as the older spelling of a section given, not as a typo of itself
    ds_config b = parse_ds_config(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "bfloat16": {"enabled": true}})", 1);
    CHECK(b.likely_typos.empty());
    // a batch triple that does not resolve names the misspelt batch key
    e = error_of([] { parse_ds_config(R"({"train_micro_batch_size_per_gpu_": 4, "gradient_accumulation_steps": 1})", 1, "m.json"); });
    CHECK(contains(e, "m.json:1:2: \"train_micro_batch_size_per_gpu_\" is not read: did you mean "
                      "\"train_micro_batch_size_per_gpu\"?"));
  }
  {
    // an optimizer or scheduler key a letter from "params" or "type": DeepSpeed ignores it and trains at the
    // section's defaults ("param" ran at lr 1e-3 instead of 3e-5)
    std::string e = error_of([] {
      parse_ds_config(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "param": {"lr": 3e-5}}})", 1, "o.json");
    });
    CHECK(contains(e, "o.json:1:56: optimizer.param is not read (DeepSpeed ignores it too, and the optimizer would run "
                      "at its defaults (lr 1e-3)): did you mean \"optimizer.params\"?"));
    e = error_of([] {
      parse_ds_config(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "parmas": {}}})", 1, "s.json");
    });
    CHECK(contains(e, "scheduler.parmas is not read (DeepSpeed ignores it too, and the schedule would run at its "
                      "defaults): did you mean \"scheduler.params\"?"));
  }

  e = error_of([] {
    parse_ds_config("{\"train_batch_size\": 8,\n \"fp16\": {\"enabled\": true},\n \"bf16\": {\"enabled\": true}}", 1,
                    "p.json");
  });
  CHECK(contains(e, "p.json:3:11: fp16.enabled and bf16.enabled are both true"));

  e = error_of([] { parse_ds_config("{\"train_batch_size\": 8,\n \"fp16\": {\"enabled\": true, \"loss_scale\": -1}}", 1); });
  CHECK(contains(e, "fp16.loss_scale is -1; it must be >= 0"));
  e = error_of([] { parse_ds_config(R"({"train_batch_size": 8, "fp16": {"enabled": true, "hysteresis": 0}})", 1); });
  CHECK(contains(e, "fp16.hysteresis is 0; it must be >= 1"));
  e = error_of([] { parse_ds_config(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_windw": 10}})", 1); });
  CHECK(contains(e, "fp16.loss_scale_windw is not an fp16 setting"));

  e = error_of([] { parse_ds_config("{\"train_batch_size\": 8,\n\"train_batch_size\": 16}", 1, "d.json"); });
  CHECK(contains(e, "d.json:2:1: duplicate key \"train_batch_size\""));

  const std::string missing = (fs::temp_directory_path() / ("flowrun_no_such_ds_" + std::to_string(::getpid()) + ".json")).string();
  e = error_of([&] { load_ds_config(missing, 1); });
  CHECK(contains(e, missing + ": cannot open DeepSpeed config file"));

  // the deprecated boolean zero_optimization
  c = parse_ds_config(R"({"train_batch_size": 8, "zero_optimization": true})", 1);
  CHECK(c.zero_stage == 1);
  CHECK(c.warnings.size() == 1);
  // gradient_clipping: DeepSpeed 0.19.8's default is 1.0; 0 turns it off
  CHECK(parse_ds_config(R"({"train_batch_size": 8})", 1).gradient_clipping == 1.0);
  CHECK(parse_ds_config(R"({"train_batch_size": 8, "gradient_clipping": 0})", 1).gradient_clipping == 0.0);
}
