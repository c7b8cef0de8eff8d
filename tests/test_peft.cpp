// PEFT-format LoRA adapters (models/adapter.h) against huggingface/peft:
// tests/fixtures/peft/llama_lora is a LoRA adapter (r 4, alpha 8, q_proj and
// v_proj, random A and B) of tests/fixtures/hf/llama saved by peft's
// save_pretrained, with PEFT's logits and the merged model's logits
// (tests/fixtures/make_peft_fixture.py); opt_lora and gpt2_lora the same for
// tests/fixtures/hf/opt (every Linear: q/k/v/out_proj, fc1, fc2) and
// tests/fixtures/hf/gpt2 (c_attn, c_proj, c_fc: Conv1D, fan_in_fan_out).
// Here: base + adapter give PEFT's logits, merged too, and save_adapter writes
// PEFT's file back (same names and values).
//
// With FLOWRUN_PEFT_SAVE_DIR set, the adapter folders flowrun writes are kept there
// (OPT's and GPT-2's in its subfolders opt/ and gpt2/) for make_peft_fixture.py
// --check-saved (PeftModel.from_pretrained on them).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "models/adapter.h"
#include "models/checkpoint.h"
#include "models/hf.h"
#include "models/safetensors.h"
#include "test_util.h"

using namespace flowrun;
namespace fs = std::filesystem;

namespace {

const fs::path k_fixtures = FLOWRUN_FIXTURES_DIR;
const fs::path k_adapter = k_fixtures / "peft" / "llama_lora";
const fs::path k_base = k_fixtures / "hf" / "llama";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE_MESSAGE(f.good(), "cannot open " << p);
  return nlohmann::json::parse(f);
}

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() / ("flowrun_test_peft_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

struct expected {
  tensor ids;
  std::vector<float> logits, merged_logits;
  std::vector<std::string> names;
};

expected load_expected(const fs::path& adapter = k_adapter) {
  auto j = read_json(adapter / "expected.json");
  expected e;
  auto ids = j["input_ids"].get<std::vector<std::vector<int32_t>>>();
  std::vector<int32_t> flat;
  for (auto& r : ids) flat.insert(flat.end(), r.begin(), r.end());
  e.ids = tensor::from_ints({static_cast<int64_t>(ids.size()), static_cast<int64_t>(ids[0].size())}, flat);
  e.logits = j["logits"].get<std::vector<float>>();
  if (j.contains("merged_logits")) e.merged_logits = j["merged_logits"].get<std::vector<float>>();
  e.names = j["adapter_tensors"].get<std::vector<std::string>>();
  return e;
}

std::vector<float> logits_of(decoder& m, const tensor& ids) {
  activations a;
  m.forward(a, ids, tensor{});
  return a.logits.to(device::cpu()).to_floats();
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

// Every tensor of `ours` has PEFT's name, shape and exactly PEFT's values, and no tensor is extra.
void check_same_tensors(const fs::path& ours_file, const fs::path& peft_file) {
  auto ours = load_safetensors(ours_file.string());
  auto peft = load_safetensors(peft_file.string());
  REQUIRE(ours.size() == peft.size());
  for (auto& [name, t] : peft) {
    auto it = ours.find(name);
    REQUIRE_MESSAGE(it != ours.end(), "our adapter lacks PEFT's tensor " << name);
    CHECK_MESSAGE(it->second.shape() == t.shape(), name);
    CHECK_MESSAGE(it->second.to_floats() == t.to_floats(), name);
  }
}

}  // namespace

TEST_CASE("PEFT adapter: base + load_adapter gives PEFT's logits, merged too, save_adapter writes PEFT's file") {
  auto e = load_expected();
  auto m = load_hf(k_base.string());
  const auto base_logits = logits_of(m, e.ids);
  CHECK(max_diff(base_logits, e.logits) > 0.1);  // the adapter matters

  load_adapter(m, k_adapter.string());
  REQUIRE(m.has_lora());
  CHECK(m.lora().lora_r == 4);
  CHECK(m.lora().lora_alpha == 8.0f);
  CHECK(m.lora().scale() == 2.0f);
  CHECK(m.num_adapter_parameters() == 2 * (4 * 32 + 32 * 4) + 2 * (4 * 32 + 16 * 4));  // q (32 out), v (2 KV * 8)
  CHECK_FALSE(m.base_trainable());

  const double d = max_diff(logits_of(m, e.ids), e.logits);
  MESSAGE("max |flowrun + adapter - PEFT| = " << d);
  CHECK(d < 1e-4);

  m.merge_lora();
  const double dm = max_diff(logits_of(m, e.ids), e.logits);
  MESSAGE("merged: max |flowrun - PEFT| = " << dm << ", vs merge_and_unload: "
                                            << max_diff(logits_of(m, e.ids), e.merged_logits));
  CHECK(dm < 1e-4);
  CHECK(max_diff(logits_of(m, e.ids), e.merged_logits) < 1e-4);

  // save while merged: the adapter written is still the unmerged A and B, bit for bit PEFT's
  temp_dir tmp("save");
  save_adapter(m, tmp.str(), k_base.string());
  CHECK(m.lora_merged());
  check_same_tensors(tmp.path / "adapter_model.safetensors", k_adapter / "adapter_model.safetensors");
  auto cfg = read_json(tmp.path / "adapter_config.json");
  auto pcfg = read_json(k_adapter / "adapter_config.json");
  for (const char* k : {"peft_type", "r", "lora_alpha", "lora_dropout", "bias", "fan_in_fan_out"})
    CHECK_MESSAGE(cfg.at(k) == pcfg.at(k), k);
  auto tm = cfg["target_modules"].get<std::vector<std::string>>(), ptm = pcfg["target_modules"].get<std::vector<std::string>>();
  std::sort(tm.begin(), tm.end());
  std::sort(ptm.begin(), ptm.end());
  CHECK(tm == ptm);
  // the base, for PEFT's AutoPeftModelForCausalLM (it tried the Hub without one)
  CHECK(cfg.at("base_model_name_or_path") == k_base.string());

  // and what we wrote loads back to the same logits
  m.unmerge_lora();
  CHECK(max_diff(logits_of(m, e.ids), e.logits) < 1e-4);
  auto m2 = load_hf(k_base.string());
  load_adapter(m2, tmp.str());
  CHECK(max_diff(logits_of(m2, e.ids), e.logits) < 1e-4);

  if (const char* dir = std::getenv("FLOWRUN_PEFT_SAVE_DIR"); dir && *dir) {
    save_adapter(m2, dir);
    MESSAGE("adapter kept in " << std::string(dir) << " (check: make_peft_fixture.py --check-saved " << std::string(dir) << ")");
  }
}

TEST_CASE("PEFT adapter: every layer's full module names (PEFT's all-linear as saved) are plain LoRA on those modules") {
  // PEFT writes "all-linear" expanded, one name per layer's module; they were refused as "a module of one layer"
  auto e = load_expected();
  temp_dir tmp("full_names");
  fs::copy_file(k_adapter / "adapter_model.safetensors", tmp.path / "adapter_model.safetensors");
  auto cfg = read_json(k_adapter / "adapter_config.json");
  auto base = load_hf(k_base.string());
  const int64_t L = base.config().n_layers;
  nlohmann::json full = nlohmann::json::array();
  for (int64_t l = 0; l < L; ++l)
    for (const char* mod : {"self_attn.q_proj", "self_attn.v_proj"})
      full.push_back("model.layers." + std::to_string(l) + "." + mod);
  cfg["target_modules"] = full;
  std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
  load_adapter(base, tmp.str());
  CHECK(max_diff(logits_of(base, e.ids), e.logits) < 1e-4);  // PEFT's logits, as with ["q_proj", "v_proj"]
  // a module named in some layers only: refused, naming the layers
  full.erase(full.begin());  // layer 0's q_proj
  cfg["target_modules"] = full;
  std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
  auto m2 = load_hf(k_base.string());
  CHECK_THROWS_WITH_AS(load_adapter(m2, tmp.str()),
                       doctest::Contains("target_modules adapts self_attn.q_proj in layer(s) 1 of 2 only"),
                       std::runtime_error);
}

TEST_CASE("PEFT adapter: the tensor names are PEFT's, both ways") {
  auto e = load_expected();
  REQUIRE(e.names.size() == 8);
  const model_config llama = load_hf(k_base.string()).config();
  for (const auto& n : e.names) {
    CHECK(n.rfind("base_model.model.model.layers.", 0) == 0);
    CHECK(peft_name(llama, ours_from_peft(llama, n)) == n);
  }
  CHECK(ours_from_peft(llama, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") ==
        "model.layers.0.self_attn.q_proj.lora_A.weight");
  // in-memory state dicts carry the adapter name; files do not
  CHECK(ours_from_peft(llama, "base_model.model.model.layers.1.self_attn.v_proj.lora_B.default.weight") ==
        "model.layers.1.self_attn.v_proj.lora_B.weight");
  CHECK(peft_name(llama, "v_head.weight") == "v_head.weight");

  // OPT and GPT-2: PEFT's names (modeling_opt.py / modeling_gpt2.py module paths), both ways
  for (const char* family : {"opt", "gpt2"}) {
    const model_config c = load_hf((k_fixtures / "hf" / family).string()).config();
    auto fe = load_expected(k_fixtures / "peft" / (std::string(family) + "_lora"));
    REQUIRE(fe.names.size() == (std::string(family) == "opt" ? 24u : 16u));
    for (const auto& n : fe.names) {
      CAPTURE(n);
      const auto ours = ours_from_peft(c, n);
      CHECK(ours.rfind("model.layers.", 0) == 0);
      CHECK(peft_name(c, ours) == n);
    }
  }
  const model_config opt = load_hf((k_fixtures / "hf" / "opt").string()).config();
  CHECK(peft_name(opt, "model.layers.1.self_attn.o_proj.lora_A.weight") ==
        "base_model.model.model.decoder.layers.1.self_attn.out_proj.lora_A.weight");
  CHECK(peft_name(opt, "model.layers.0.mlp.up_proj.lora_B.weight") == "base_model.model.model.decoder.layers.0.fc1.lora_B.weight");
  CHECK(ours_from_peft(opt, "base_model.model.model.decoder.layers.0.fc2.lora_A.default.weight") ==
        "model.layers.0.mlp.down_proj.lora_A.weight");
  const model_config gpt2 = load_hf((k_fixtures / "hf" / "gpt2").string()).config();
  CHECK(peft_name(gpt2, "model.layers.0.self_attn.qkv_proj.lora_B.weight") ==
        "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight");
  CHECK(ours_from_peft(gpt2, "base_model.model.transformer.h.1.mlp.c_proj.lora_A.weight") ==
        "model.layers.1.mlp.down_proj.lora_A.weight");
  CHECK(ours_from_peft(gpt2, "base_model.model.transformer.h.1.attn.c_proj.lora_A.weight") ==
        "model.layers.1.self_attn.o_proj.lora_A.weight");
  // GPT-2 has no q_proj of its own in HF: an adapter on q alone has no PEFT name
  CHECK_THROWS_WITH_AS(peft_name(gpt2, "model.layers.0.self_attn.q_proj.lora_A.weight"), doctest::Contains("c_attn"),
                       std::invalid_argument);
}

namespace {

// OPT and GPT-2: PEFT's adapter (saved by peft) loads to PEFT's logits within 1e-5, merged too; save_adapter
// writes PEFT's tensors back bit for bit, and what it wrote reloads to the same logits.
void check_family_adapter(const std::string& family, const std::vector<std::string>& want_targets) {
  const fs::path adapter = k_fixtures / "peft" / (family + "_lora");
  const fs::path base = k_fixtures / "hf" / family;
  auto e = load_expected(adapter);
  auto m = load_hf(base.string());
  CHECK(max_diff(logits_of(m, e.ids), e.logits) > 0.1);  // the adapter matters
  load_adapter(m, adapter.string());
  REQUIRE(m.has_lora());
  CHECK(m.lora().lora_r == 4);
  CHECK(m.lora().scale() == 2.0f);
  // as many adapter numbers as PEFT's file holds
  auto peft = load_safetensors((adapter / "adapter_model.safetensors").string());
  int64_t n_peft = 0;
  for (auto& [n, t] : peft) n_peft += t.numel();
  CHECK(m.num_adapter_parameters() == n_peft);
  const double d = max_diff(logits_of(m, e.ids), e.logits);
  MESSAGE(family << ": max |flowrun + PEFT's adapter - PEFT| = " << d);
  CHECK(d < 1e-5);
  m.merge_lora();
  const double dm = max_diff(logits_of(m, e.ids), e.logits);
  MESSAGE(family << ": merged, max |flowrun - PEFT| = " << dm);
  CHECK(dm < 1e-5);

  temp_dir tmp("save_" + family);
  save_adapter(m, tmp.str());
  check_same_tensors(tmp.path / "adapter_model.safetensors", adapter / "adapter_model.safetensors");
  auto cfg = read_json(tmp.path / "adapter_config.json");
  auto pcfg = read_json(adapter / "adapter_config.json");
  for (const char* k : {"peft_type", "r", "lora_alpha", "lora_dropout", "bias", "fan_in_fan_out"})
    CHECK_MESSAGE(cfg.at(k) == pcfg.at(k), k);
  CHECK(cfg["fan_in_fan_out"] == (family == "gpt2"));
  auto tm = cfg["target_modules"].get<std::vector<std::string>>();
  CHECK(tm == want_targets);
  auto m2 = load_hf(base.string());
  load_adapter(m2, tmp.str());
  const double d2 = max_diff(logits_of(m2, e.ids), e.logits);
  MESSAGE(family << ": flowrun's saved adapter reloaded, max |logits - PEFT| = " << d2);
  CHECK(d2 < 1e-5);
  if (const char* dir = std::getenv("FLOWRUN_PEFT_SAVE_DIR"); dir && *dir) save_adapter(m2, (fs::path(dir) / family).string());
}

}  // namespace

TEST_CASE("PEFT adapter for OPT: PEFT's names (out_proj, fc1, fc2 under model.decoder.layers.N), both ways") {
  check_family_adapter("opt", {"fc1", "fc2", "self_attn.k_proj", "self_attn.out_proj", "self_attn.q_proj",
                               "self_attn.v_proj"});
}

TEST_CASE("PEFT adapter for GPT-2: c_attn is one adapter shared by q, k and v, and Conv1D's fan_in_fan_out") {
  check_family_adapter("gpt2", {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"});

  // c_attn (or all-linear) on GPT-2: q, k and v share lora_A, their lora_B are rows of one (3C, r)
  decoder m(load_hf((k_fixtures / "hf" / "gpt2").string()));
  m.enable_lora(make_lora_config(4, 8.0f, 0.0f, "c_attn", 3), true);
  REQUIRE(m.adapter_params().size() == 4u);  // 2 layers x (A, B)
  CHECK(m.adapter_params()[0].name == "model.layers.0.self_attn.qkv_proj.lora_A.weight");
  CHECK(m.adapter_params()[1].shape == shape_t{96, 4});
  const auto& lr = m.w().layers[0].lora;
  CHECK(lr[lm_q].A.raw() == lr[lm_k].A.raw());
  CHECK(lr[lm_q].A.raw() == lr[lm_v].A.raw());
  CHECK(lr[lm_k].B.raw() == static_cast<const float*>(lr[lm_q].B.raw()) + 32 * 4);
  // the shared A's gradient sums q's, k's and v's: against a central difference of the loss
  float* b = m.w().adapter_flat.data<float>();
  for (int64_t i = 0; i < m.num_adapter_parameters(); ++i) b[i] = 0.05f * static_cast<float>((i * 7919) % 13 - 6);
  auto e = load_expected(k_fixtures / "peft" / "gpt2_lora");
  std::vector<int32_t> tg(e.ids.data<int32_t>(), e.ids.data<int32_t>() + e.ids.numel());
  std::rotate(tg.begin(), tg.begin() + 1, tg.end());
  const tensor targets = tensor::from_ints(e.ids.shape(), tg);
  activations a;
  m.zero_grad();
  m.forward(a, e.ids, targets);
  m.backward(a);
  const auto g = m.grads().adapter_flat.to_floats();
  for (int64_t k : {int64_t{1}, int64_t{50}, int64_t{100}}) {  // elements of layer 0's c_attn lora_A (4 x 32)
    auto loss_at = [&](float delta) {
      const float keep = b[k];
      b[k] = keep + delta;
      activations a2;
      const double l = m.forward(a2, e.ids, targets);
      b[k] = keep;
      return l;
    };
    const float h = 1e-2f;
    const double fd = (loss_at(h) - loss_at(-h)) / (2.0 * h);
    CAPTURE(k);
    CHECK(g[static_cast<size_t>(k)] == doctest::Approx(fd).epsilon(2e-2).scale(1e-3));
  }

  // q_proj on GPT-2: PEFT has no such module, so it is refused before training (it trained, then
  // save_adapter failed at the end of the run)
  decoder q(load_hf((k_fixtures / "hf" / "gpt2").string()));
  CHECK_THROWS_WITH_AS(q.enable_lora(make_lora_config(2, 4.0f, 0.0f, "q_proj", 1), true),
                       doctest::Contains("use c_attn, c_proj, c_fc, or all-linear"), std::invalid_argument);
}

TEST_CASE("PEFT adapter on a model in llama2.c's adjacent RoPE layout: lora_B rows of q_proj follow the base") {
  // The same model with q_proj/k_proj rows permuted to the adjacent layout has the same
  // logits; the adapter's q_proj lora_B rows must be permuted alike on load, and back on save.
  auto e = load_expected();
  auto adj = to_adjacent_rope(load_hf(k_base.string()));
  REQUIRE(adj.config().rope == ops::rope_layout::adjacent);
  load_adapter(adj, k_adapter.string());
  CHECK(max_diff(logits_of(adj, e.ids), e.logits) < 1e-4);
  temp_dir tmp("adj");
  save_adapter(adj, tmp.str());
  check_same_tensors(tmp.path / "adapter_model.safetensors", k_adapter / "adapter_model.safetensors");
}

TEST_CASE("PEFT adapter: errors name the file and tensor") {
  temp_dir tmp("err");
  auto peft = load_safetensors((k_adapter / "adapter_model.safetensors").string());
  auto cfg = read_json(k_adapter / "adapter_config.json");

  SUBCASE("a missing tensor") {
    named_tensors ts;
    for (auto& [n, t] : peft)
      if (n.find("layers.1.self_attn.v_proj.lora_B") == std::string::npos) ts.emplace_back(n, t);
    save_safetensors((tmp.path / "adapter_model.safetensors").string(), ts);
    std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
    auto m = load_hf(k_base.string());
    CHECK_THROWS_WITH_AS(load_adapter(m, tmp.str()),
                         doctest::Contains("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"),
                         std::runtime_error);
  }
  SUBCASE("a rank that disagrees with the tensors") {
    named_tensors ts(peft.begin(), peft.end());
    save_safetensors((tmp.path / "adapter_model.safetensors").string(), ts);
    cfg["r"] = 8;
    std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
    auto m = load_hf(k_base.string());
    // the config's r is at fault, not the base (it said "apply it to the base model it was trained on")
    try {
      load_adapter(m, tmp.str());
      FAIL("the adapter was applied");
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find("adapter_config.json: r = 8 but tensor '") != std::string::npos);
      CHECK(what.find("has rank 4") != std::string::npos);
      CHECK(what.find("fix r in adapter_config.json (to 4)") != std::string::npos);
      CHECK(what.find("base model it was trained on") == std::string::npos);
    }
  }
  SUBCASE("a rank or alpha per module, rsLoRA or DoRA: other math, refused") {
    named_tensors ts(peft.begin(), peft.end());
    save_safetensors((tmp.path / "adapter_model.safetensors").string(), ts);
    for (auto [key, value] : {std::pair<const char*, nlohmann::json>{"rank_pattern", {{"q_proj", 8}}},
                              {"alpha_pattern", {{"v_proj", 4}}},
                              {"use_rslora", true},
                              {"use_dora", true},
                              // aLoRA: active only after its invocation tokens; it was merged into every position
                              {"alora_invocation_tokens", {403, 407}},
                              {"layers_to_transform", {0}},
                              {"exclude_modules", {"model.layers.1.self_attn.q_proj"}},
                              {"lora_bias", true},
                              {"target_parameters", {"self_attn.q_proj.weight"}},
                              {"modules_to_save", {"lm_head"}},
                              {"target_modules", ".*\\.(q|v)_proj"},  // a string is a regex in PEFT
                              // initialisations that also change the base weights (PEFT redoes them at load)
                              {"init_lora_weights", "pissa"},
                              {"init_lora_weights", "pissa_niter_4"},
                              {"init_lora_weights", "olora"},
                              {"init_lora_weights", "corda"},
                              {"init_lora_weights", "loftq"},
                              {"init_lora_weights", "a_later_init"},
                              {"a_field_of_a_later_peft", 1}}) {
      CAPTURE(key);
      auto c = cfg;
      c[key] = value;
      std::ofstream(tmp.path / "adapter_config.json") << c.dump();
      auto m = load_hf(k_base.string());
      const std::string want = std::string("adapter_config.json: ") + (std::string(key) == "target_modules" ? "" : "\"") + key;
      CHECK_THROWS_WITH_AS(load_adapter(m, tmp.str()), doctest::Contains(want.c_str()), std::runtime_error);
    }
    cfg["rank_pattern"] = nlohmann::json::object();  // PEFT writes empty ones: fine
    // unset fields as PEFT 0.21 writes them, and those that change nothing in a loaded adapter: fine
    for (const char* k : {"alora_invocation_tokens", "layers_to_transform", "exclude_modules", "target_parameters",
                          "trainable_token_indices", "layer_replication", "arrow_config"})
      cfg[k] = nullptr;
    cfg["use_qalora"] = cfg["lora_bias"] = cfg["ensure_weight_tying"] = false;
    cfg["qalora_group_size"] = 16;
    cfg["megatron_core"] = "megatron.core";
    cfg["init_lora_weights"] = true;
    cfg["runtime_config"] = {{"ephemeral_gpu_offload", false}};
    cfg["base_model_name_or_path"] = "some/base";
    std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
    auto m = load_hf(k_base.string());
    CHECK_NOTHROW(load_adapter(m, tmp.str()));
    for (const nlohmann::json& init : {nlohmann::json(false), nlohmann::json("gaussian"), nlohmann::json("eva")}) {
      CAPTURE(init.dump());  // initialisations of the adapter alone: a saved one does not depend on them
      cfg["init_lora_weights"] = init;
      std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
      auto m2 = load_hf(k_base.string());
      CHECK_NOTHROW(load_adapter(m2, tmp.str()));
    }
  }
  SUBCASE("adapter_model.bin only (PEFT's safe_serialization=False): named, with the fix") {
    std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
    std::ofstream(tmp.path / "adapter_model.bin") << "pickle";
    auto m = load_hf(k_base.string());
    CHECK_THROWS_WITH_AS(load_adapter(m, tmp.str()),
                         doctest::Contains("the folder holds adapter_model.bin (PEFT's safe_serialization=False"),
                         std::runtime_error);
  }
  SUBCASE("not a LoRA adapter") {
    named_tensors ts(peft.begin(), peft.end());
    save_safetensors((tmp.path / "adapter_model.safetensors").string(), ts);
    cfg["peft_type"] = "IA3";
    std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
    auto m = load_hf(k_base.string());
    CHECK_THROWS_WITH_AS(load_adapter(m, tmp.str()), doctest::Contains("only LORA"), std::runtime_error);
  }
}

TEST_CASE("PEFT adapter: a config that is not JSON, lacks a key or has a wrong type is refused naming the file") {
  // tests/fuzz/fuzz_adapter found it: nlohmann's bare parse_error / type_error escaped load_adapter
  temp_dir tmp("bad_config");
  fs::copy_file(k_adapter / "adapter_model.safetensors", tmp.path / "adapter_model.safetensors");
  for (const char* text :
       {"", "{\"peft_type\": \"LORA\", \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}",
        "{\"peft_type\": \"LORA\", \"r\": \"4\", \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}",
        "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [1, 2]}", "[1, 2]"}) {
    CAPTURE(text);
    std::ofstream(tmp.path / "adapter_config.json") << text;
    auto m = load_hf(k_base.string());
    CHECK_THROWS_WITH_AS(load_adapter(m, tmp.str()),
                         doctest::Contains("adapter_config.json: not a PEFT LoRA adapter config"), std::runtime_error);
  }
}

TEST_CASE("PEFT adapter: a config without lora_alpha takes PEFT's default, 8") {
  // (a break-it review: it was refused, where PEFT's LoraConfig loads it with lora_alpha 8; the fixture's is 8)
  temp_dir tmp("no_alpha");
  fs::copy_file(k_adapter / "adapter_model.safetensors", tmp.path / "adapter_model.safetensors");
  auto cfg = read_json(k_adapter / "adapter_config.json");
  REQUIRE(cfg["lora_alpha"].get<double>() == 8.0);
  cfg.erase("lora_alpha");
  std::ofstream(tmp.path / "adapter_config.json") << cfg.dump();
  auto a = load_hf(k_base.string()), b = load_hf(k_base.string());
  load_adapter(a, tmp.str());
  load_adapter(b, k_adapter.string());
  CHECK(a.lora().lora_alpha == 8.0f);
  CHECK(a.w().adapter_flat.numel() == b.w().adapter_flat.numel());
  a.merge_lora();
  b.merge_lora();
  const float* pa = a.w().flat.data<float>();
  const float* pb = b.w().flat.data<float>();
  bool same = true;
  for (int64_t i = 0; i < a.w().flat.numel(); ++i) same = same && pa[i] == pb[i];
  CHECK(same);
}

TEST_CASE("PEFT adapter: a rank, alpha or dropout that is no usable number is refused naming the file and key") {
  // tests/fuzz/fuzz_adapter found it: r = 4.4e86 was converted to an integer (undefined behaviour)
  temp_dir tmp("bad_numbers");
  fs::copy_file(k_adapter / "adapter_model.safetensors", tmp.path / "adapter_model.safetensors");
  const std::pair<const char*, const char*> cases[] = {
      {"\"r\": 444444444444444444444444444444444444444444444444444444444444444444444444444444444444444, \"lora_alpha\": 8",
       "r is"},
      {"\"r\": 4.5, \"lora_alpha\": 8", "r is"},
      {"\"r\": 0, \"lora_alpha\": 8", "r is"},
      {"\"r\": 4, \"lora_alpha\": 1e300", "lora_alpha is"},
      {"\"r\": 4, \"lora_alpha\": 8, \"lora_dropout\": 1.5", "lora_dropout is"},
  };
  for (const auto& [keys, want] : cases) {
    CAPTURE(keys);
    std::ofstream(tmp.path / "adapter_config.json")
        << "{\"peft_type\": \"LORA\", " << keys << ", \"target_modules\": [\"q_proj\"]}";
    auto m = load_hf(k_base.string());
    const std::string expected = std::string("adapter_config.json: not a PEFT LoRA adapter config (") + want;
    CHECK_THROWS_WITH_AS(load_adapter(m, tmp.str()), doctest::Contains(expected.c_str()), std::runtime_error);
  }
}

TEST_CASE("PEFT adapter: one that does not fit the model names the misfit, the base its config names, and the fix") {
  // a GPT-2 adapter on a LLaMA (c_attn is no module of LLaMA's), an OPT adapter on a LLaMA (nor is fc1), and a
  // LLaMA adapter on a model of another width: the error named the module or tensor only, not which adapter met
  // which model
  struct misfit {
    std::string adapter, model, cause;
  };
  const std::vector<misfit> cases = {
      {"gpt2_lora", (k_fixtures / "hf" / "llama").string(), "adapter_config.json: enable_lora: target module 'c_attn'"},
      {"opt_lora", (k_fixtures / "hf" / "llama").string(), "adapter_config.json: enable_lora: target module 'fc1'"},
      {"llama_lora", asset_path("model/stories260K/stories260K.bin").string(), "adapter_model.safetensors: tensor '"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.adapter);
    decoder m = load_model(c.model);
    const fs::path dir = k_fixtures / "peft" / c.adapter;
    const std::string base = nlohmann::json::parse(std::ifstream(dir / "adapter_config.json"))["base_model_name_or_path"];
    try {
      load_adapter(m, dir.string());
      FAIL("the adapter was applied");
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find(c.cause) != std::string::npos);
      CHECK(what.find("; the adapter in " + dir.string() + " does not fit the model it is applied to (" +
                      m.config().summary() + "); its adapter_config.json names its base: " + base +
                      ": apply it to the base model it was trained on") != std::string::npos);
    }
  }
}

TEST_CASE("PEFT adapter: a model folder or a ZeRO checkpoint given as the adapter says which it is and what takes it") {
  // both said only "adapter_config.json: cannot open the adapter config"
  const auto refused = [](const std::string& dir, const std::string& says) {
    auto m = load_hf(k_base.string());
    CAPTURE(dir);
    CHECK_THROWS_WITH_AS(load_adapter(m, dir), doctest::Contains(says.c_str()), std::runtime_error);
  };
  refused(k_base.string(), "is a model folder, not a LoRA adapter: a base model is `model` / --model");
  temp_dir tmp("not_adapter");
  fs::create_directories(tmp.path / "step_00000004");
  std::ofstream(tmp.path / "latest") << "step_00000004\n";
  refused(tmp.str(), "is a ZeRO checkpoint, not an adapter folder: a LoRA run's checkpoint is read by `flowrun generate "
                     "--zero_checkpoint` and `flowrun convert --from zero`");
  refused((tmp.path / "latest").string(), "is not a folder");
}
