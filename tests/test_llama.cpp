// stories260K against the float64 reference in ref/stories260K_forward_reference.json
// (made by ref/gen_reference.py with torch): loss, logits, gradient norms.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <set>

#include <unistd.h>

#include "models/decoder.h"
#include "models/llama2c.h"
#include "runtime/kernels/ops.h"
#include "runtime/util/npy.h"
#include "test_util.h"

using namespace flowrun;

namespace {


struct reference_run {
  nlohmann::json ref;
  decoder model;
  activations acts;
  double loss = 0;
  explicit reference_run(const std::string& path) : ref(test::load_json_asset("ref/stories260K_forward_reference.json")),
                                                    model(load_llama2c(path)) {
    auto& tf = ref["teacher_forced"];
    std::vector<int32_t> in = tf["input_tokens"].get<std::vector<int32_t>>();
    std::vector<int32_t> tg = tf["target_tokens"].get<std::vector<int32_t>>();
    const int64_t T = static_cast<int64_t>(in.size());
    auto ids = tensor::from_ints({1, T}, in);
    auto targets = tensor::from_ints({1, T}, tg);
    loss = model.forward(acts, ids, targets);
    model.zero_grad();
    model.backward(acts);
  }
};

}  // namespace

TEST_CASE("stories260K: config read from the llama2.c header") {
  auto m = load_llama2c(test::model_path());
  auto ref = test::load_json_asset("ref/stories260K_forward_reference.json");
  const auto& c = m.config();
  CHECK(c.dim == ref["config"]["dim"].get<int64_t>());
  CHECK(c.hidden_dim == ref["config"]["hidden_dim"].get<int64_t>());
  CHECK(c.n_layers == ref["config"]["n_layers"].get<int64_t>());
  CHECK(c.n_heads == ref["config"]["n_heads"].get<int64_t>());
  CHECK(c.n_kv_heads == ref["config"]["n_kv_heads"].get<int64_t>());
  CHECK(c.vocab_size == ref["config"]["vocab_size"].get<int64_t>());
  CHECK(c.tied_embeddings == ref["config"]["shared_classifier"].get<bool>());
  CHECK(m.num_parameters() == ref["n_params_excluding_freqcis"].get<int64_t>());
}

TEST_CASE("stories260K: v0 and v1 files hold the same weights") {
  auto a = load_llama2c(test::model_path());
  auto b = load_llama2c(test::model_v1_path());
  REQUIRE(a.num_parameters() == b.num_parameters());
  auto va = a.w().flat.to_floats(), vb = b.w().flat.to_floats();
  CHECK(std::memcmp(va.data(), vb.data(), va.size() * 4) == 0);
}

TEST_CASE("stories260K: teacher-forced loss, logits and gradient norms match the float64 reference") {
  reference_run r(test::model_path());
  auto& tf = r.ref["teacher_forced"];
  const double ref_loss = tf["mean_cross_entropy"].get<double>();
  MESSAGE(std::setprecision(10) << "loss " << r.loss << " reference " << ref_loss);
  CHECK(std::fabs(r.loss - ref_loss) < 1e-5);

  // per-token losses
  auto nll = tf["per_token_nll"].get<std::vector<double>>();
  auto losses = r.acts.losses.to_floats();
  REQUIRE(losses.size() == nll.size());
  double worst_nll = 0;
  for (size_t i = 0; i < nll.size(); ++i) worst_nll = std::max(worst_nll, std::fabs(losses[i] - nll[i]));
  CHECK(worst_nll < 1e-4);

  // logits against the .npy
  auto ref_logits = load_npy(asset_path("ref/stories260K_forward_reference_logits.npy").string());
  auto got = r.acts.logits.to_floats();
  auto want = ref_logits.to_floats();
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
  MESSAGE("max |logit - reference| = " << worst);
  CHECK(worst < 1e-4);

  // gradient norms, per llama2.c tensor and in total
  auto norms = test::grouped_grad_norms(r.model);
  for (auto& [k, v] : tf["grad_l2_norm_per_param"].items()) {
    double want_n = v.get<double>();
    INFO("grad norm of " << k << ": " << norms.at(k) << " reference " << want_n);
    CHECK(std::fabs(norms.at(k) - want_n) / want_n < 1e-4);
  }
  double total = ops::global_norm({r.model.grads().flat});
  double want_total = tf["grad_l2_norm_total"].get<double>();
  MESSAGE(std::setprecision(8) << "total grad norm " << total << " reference " << want_total);
  CHECK(std::fabs(total - want_total) / want_total < 1e-4);

  // a few raw gradient values
  auto wq0 = r.model.grads().by_name.at("model.layers.0.self_attn.q_proj.weight").to_floats();
  auto ref_wq0 = tf["grad_wq0_first4"].get<std::vector<double>>();
  for (size_t i = 0; i < ref_wq0.size(); ++i) CHECK(wq0[i] == doctest::Approx(ref_wq0[i]).epsilon(1e-3));
  auto emb = r.model.grads().wte.rows(1, 2).to_floats();
  auto ref_emb = tf["grad_emb_row1_first4"].get<std::vector<double>>();
  for (size_t i = 0; i < ref_emb.size(); ++i) CHECK(emb[i] == doctest::Approx(ref_emb[i]).epsilon(1e-3));
}

TEST_CASE("stories260K: the cached decoder gives the training forward's logits") {
  auto m = load_llama2c(test::model_path());
  auto ref = test::load_json_asset("ref/stories260K_forward_reference.json");
  auto in = ref["teacher_forced"]["input_tokens"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(in.size());
  activations a;
  m.forward(a, tensor::from_ints({1, T}, in), {});
  auto full = a.logits.to_floats();
  // prefill half, then one token at a time
  auto cache = m.make_cache(1, T);
  int64_t half = T / 2;
  std::vector<int32_t> first(in.begin(), in.begin() + half);
  auto pre = m.forward_cached(cache, tensor::from_ints({1, half}, first), {}, {}, 0, true).to_floats();
  double worst = 0;
  const int64_t V = m.config().vocab_size;
  for (int64_t i = 0; i < half * V; ++i) worst = std::max(worst, (double)std::fabs(pre[i] - full[i]));
  for (int64_t t = half; t < T; ++t) {
    auto lg = m.forward_cached(cache, tensor::from_ints({1, 1}, {in[t]}), {}, {}, t).to_floats();
    for (int64_t v = 0; v < V; ++v) worst = std::max(worst, (double)std::fabs(lg[v] - full[t * V + v]));
  }
  MESSAGE("max |cached - full| = " << worst);
  CHECK(worst < 1e-4);
}

TEST_CASE("llama2.c save/load round trip, versions 0 and 1, is exact") {
  auto m = load_llama2c(test::model_path());
  auto dir = std::filesystem::temp_directory_path() / "flowrun_test_llama2c";
  std::filesystem::create_directories(dir);
  for (int version : {0, 1}) {
    auto p = (dir / ("rt_v" + std::to_string(version) + ".bin")).string();
    save_llama2c(m, p, version);
    auto back = load_llama2c(p);
    auto a = m.w().flat.to_floats(), b = back.w().flat.to_floats();
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    if (version == 0) CHECK(std::filesystem::file_size(p) == std::filesystem::file_size(test::model_path()));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("llama2.c: a model whose rope_theta or rms_norm_eps the format cannot hold is refused, not written") {
  // convert --to llama2c of an HF folder with rope_theta 500000 (Llama 3) or rms_norm_eps 1e-6 wrote a file that
  // loads with 10000 and 1e-5: another model, silently
  const auto base = load_llama2c(test::model_path());
  const auto dir = std::filesystem::temp_directory_path() / "flowrun_test_llama2c_theta";
  std::filesystem::create_directories(dir);
  const std::string p = (dir / "m.bin").string();
  for (const auto& [theta, eps] : std::vector<std::pair<float, float>>{{500000.0f, 1e-5f}, {10000.0f, 1e-6f}}) {
    model_config c = base.config();
    c.rope_theta = theta;
    c.norm_eps = eps;
    decoder m(c);
    m.w().flat.copy_from(base.w().flat);
    CAPTURE(theta);
    CAPTURE(eps);
    CHECK_THROWS_WITH(save_llama2c(m, p, 1), doctest::Contains("a llama2.c file holds neither"));
    CHECK_FALSE(std::filesystem::exists(p));
  }
  save_llama2c(base, p, 1);  // 10000 and 1e-5: written
  CHECK(std::filesystem::exists(p));
  std::filesystem::remove_all(dir);
}

// The per-tensor report `flowrun convert` draws its progress line from, for llama2.c files as for HF folders
// (test_hf "save_hf and load_hf report each tensor ..."): (0, N) first, then one report per tensor in the file's
// order with its HF name and f32 bytes, ending at the model's parameter bytes; version 0's freq_cis block is
// not counted. A report that throws stops the write and leaves neither the file nor PATH.tmp.
TEST_CASE("llama2.c: load and save report each tensor with its bytes (tensor_progress)") {
  auto dir = std::filesystem::temp_directory_path() / ("flowrun_test_llama2c_progress_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<tensor_progress> loaded;
  auto m = load_llama2c(test::model_path(), device::cpu(), [&](const tensor_progress& p) { loaded.push_back(p); });
  const auto& c = m.config();
  // stories260K (version 0, tied): the embedding, 9 tensors per layer and the final norm
  const int64_t n_tensors = 1 + 9 * c.n_layers + 1;
  const int64_t bytes = static_cast<int64_t>(c.num_parameters()) * 4;
  const auto check_reports = [&](const std::vector<tensor_progress>& r, const char* first, const char* last) {
    REQUIRE(r.size() == static_cast<size_t>(n_tensors + 1));
    CHECK(r.front().tensors_done == 0);
    CHECK(r.front().bytes_done == 0);
    std::set<std::string> seen;
    for (size_t k = 0; k < r.size(); ++k) {
      CHECK(r[k].tensors_done == static_cast<int64_t>(k));
      CHECK(r[k].tensors_total == n_tensors);
      CHECK(r[k].bytes_total == bytes);
      if (k == 0) continue;
      seen.insert(r[k].name);
      CHECK(r[k].bytes_done - r[k - 1].bytes_done == static_cast<int64_t>(m.param(r[k].name).nbytes()));
    }
    CHECK(seen.size() == static_cast<size_t>(n_tensors));  // each tensor once
    CHECK(r[1].name == first);
    CHECK(r.back().name == last);
    CHECK(r.back().bytes_done == bytes);
  };
  check_reports(loaded, "model.embed_tokens.weight", "model.norm.weight");  // run.c's order
  for (int version : {0, 1}) {
    INFO("version " << version);
    auto p = (dir / ("v" + std::to_string(version) + ".bin")).string();
    std::vector<tensor_progress> saved;
    save_llama2c(m, p, version, [&](const tensor_progress& r) { saved.push_back(r); });
    check_reports(saved, version == 0 ? "model.embed_tokens.weight" : "model.layers.0.input_layernorm.weight",
                  version == 0 ? "model.norm.weight" : ("model.layers." + std::to_string(c.n_layers - 1) +
                                                        ".mlp.up_proj.weight").c_str());
    std::vector<tensor_progress> back;
    auto m2 = load_llama2c(p, device::cpu(), [&](const tensor_progress& r) { back.push_back(r); });
    REQUIRE(back.size() == saved.size());
    for (size_t k = 1; k < back.size(); ++k) CHECK(back[k].name == saved[k].name);
    const auto a = m.w().flat.to_floats(), b = m2.w().flat.to_floats();
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    // a report that throws: the old file stays as it was and no PATH.tmp is left
    const auto before = std::filesystem::file_size(p);
    int calls = 0;
    CHECK_THROWS_WITH(save_llama2c(m, p, 1 - version,
                                   [&calls](const tensor_progress&) {
                                     if (++calls == 3) throw std::runtime_error("stop here");
                                   }),
                      "stop here");
    CHECK(calls == 3);
    CHECK(std::filesystem::file_size(p) == before);
    CHECK_FALSE(std::filesystem::exists(p + ".tmp"));
    CHECK(load_llama2c(p).config().n_layers == c.n_layers);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a truncated llama2.c file is refused with the byte counts") {
  auto dir = std::filesystem::temp_directory_path() / "flowrun_test_trunc";
  std::filesystem::create_directories(dir);
  auto p = (dir / "trunc.bin").string();
  std::filesystem::copy_file(test::model_path(), p, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 1000);
  CHECK_THROWS_WITH_AS(load_llama2c(p), doctest::Contains("truncated"), std::runtime_error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a llama2.c header that asks for more than the file holds is refused before anything is allocated") {
  // tests/fuzz/fuzz_llama2c found it: a 7-int header was trusted and the decoder (14 GB for the header it
  // made up) allocated before the file's size was compared; vocab_size INT_MIN reached std::abs (undefined).
  auto dir = std::filesystem::temp_directory_path() / ("flowrun_test_header_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, std::vector<std::int32_t> header, std::size_t floats) {
    auto p = (dir / name).string();
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
    std::vector<float> w(floats, 0.5f);
    f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * 4));
    return p;
  };
  // LLaMA-2 7B's header (dim 4096, 32 layers, vocab 32000) on 100 floats: 28 + 6,607,343,616 * 4 bytes of
  // weights + 2048 * 64 * 2 * 4 of freq_cis (run.c) = 26,430,423,068 bytes it does not hold
  const auto big = write("big.bin", {4096, 11008, 32, 32, 32, 32000, 2048}, 100);
  CHECK_THROWS_WITH_AS(load_llama2c(big), doctest::Contains("truncated llama2.c file: its header"), std::runtime_error);
  CHECK_THROWS_WITH_AS(load_llama2c(big), doctest::Contains("needs 26430423068 bytes, the file has 428"),
                       std::runtime_error);
  const auto int_min = write("int_min.bin", {8, 16, 1, 2, 2, std::numeric_limits<std::int32_t>::min(), 4}, 10);
  CHECK_THROWS_WITH_AS(load_llama2c(int_min), doctest::Contains("corrupt header"), std::runtime_error);
  const auto huge = write("huge.bin", {1 << 30, 1 << 30, 1 << 30, 1 << 10, 1 << 10, 1 << 30, 1 << 30}, 0);
  CHECK_THROWS_WITH_AS(load_llama2c(huge), doctest::Contains("more than 2^48"), std::runtime_error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("model_config::num_parameters equals the decoder's parameter count in every family") {
  // The llama2.c reader and the cluster's model codec check sizes with num_parameters() before allocating.
  model_config llama = stories260k_config();
  llama.tied_embeddings = false;
  model_config gpt2 = gpt2_124m_config();
  gpt2.dim = 16, gpt2.hidden_dim = 64, gpt2.n_layers = 2, gpt2.n_heads = 4, gpt2.n_kv_heads = 4, gpt2.vocab_size = 50,
  gpt2.max_seq_len = 8;
  model_config opt = gpt2;
  opt.family = model_family::opt;
  opt.act = ops::activation::relu;
  opt.position_offset = 2;
  opt.embed_dim = 8;
  opt.post_norm = true;
  for (const model_config& c : {stories260k_config(), llama, gpt2, opt}) {
    CAPTURE(c.summary());
    CHECK(decoder(c).num_parameters() == c.num_parameters());
  }
}
