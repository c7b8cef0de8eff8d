// The decoder on a CUDA device (issue #7): stories260K's teacher-forced loss, logits
// and gradient norms on the GPU against the float64 reference (the tolerances of
// test_llama.cpp), greedy generation from BOS on the GPU against the CPU's tokens,
// AdamW training on device parameters against the same steps on the CPU, and small
// GPT-2 / OPT shapes (learned positions, LayerNorm with bias, post-norm, projections)
// forward and backward against the CPU.
//
// Built only with FLOWRUN_HAVE_CUDA. Without a GPU every case prints
// "test_cuda_model: no CUDA device: skipped" and passes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>

#include "models/decoder.h"
#include "models/generate.h"
#include "models/llama2c.h"
#include "models/train/zero.h"
#include "runtime/kernels/ops.h"
#include "runtime/tensor/device_memory.h"
#include "runtime/util/npy.h"
#include "test_util.h"

using namespace flowrun;

namespace {

const device gpu = test::test_gpu();

bool need_gpu() { return test::need_gpu("test_cuda_model"); }


double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;  // NaN never passes
    w = std::max(w, d);
  }
  return w;
}

double max_abs(const std::vector<float>& a) {
  double w = 0;
  for (float x : a) w = std::max(w, static_cast<double>(std::fabs(x)));
  return w;
}

}  // namespace

TEST_CASE("cuda model: decoder::to moves every buffer and back, bit for bit") {
  if (!need_gpu()) return;
  auto m = load_llama2c(test::model_path());
  const auto before = m.w().flat.to_floats();
  m.zero_grad();
  m.to(gpu);
  CHECK(m.dev() == gpu);
  CHECK(m.w().flat.dev() == gpu);
  CHECK(m.w().wte.dev() == gpu);
  CHECK(m.w().lm_head.dev() == gpu);
  CHECK(m.w().layers[0].wq.dev() == gpu);
  CHECK(m.grads().flat.dev() == gpu);
  CHECK(m.param("model.layers.4.mlp.down_proj.weight").dev() == gpu);
  m.to(device::cpu());
  const auto after = m.w().flat.to_floats();
  CHECK(std::memcmp(before.data(), after.data(), before.size() * 4) == 0);
}

TEST_CASE("cuda model: stories260K loss, logits and gradient norms on the GPU match the float64 reference") {
  if (!need_gpu()) return;
  auto ref = test::load_json_asset("ref/stories260K_forward_reference.json");
  auto& tf = ref["teacher_forced"];
  auto m = load_llama2c(test::model_path());
  m.to(gpu);
  std::vector<int32_t> in = tf["input_tokens"].get<std::vector<int32_t>>();
  std::vector<int32_t> tg = tf["target_tokens"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(in.size());
  activations a;
  // host inputs: the decoder copies them to the device
  const double loss = m.forward(a, tensor::from_ints({1, T}, in), tensor::from_ints({1, T}, tg));
  m.zero_grad();
  m.backward(a);
  CHECK(a.logits.dev() == gpu);
  CHECK(a.resid[0].dev() == gpu);

  const double ref_loss = tf["mean_cross_entropy"].get<double>();
  MESSAGE(std::setprecision(10) << "GPU loss " << loss << " reference " << ref_loss);
  CHECK(std::isfinite(loss));
  CHECK(std::fabs(loss - ref_loss) / ref_loss < 1e-5);

  auto nll = tf["per_token_nll"].get<std::vector<double>>();
  auto losses = a.losses.to_floats();
  REQUIRE(losses.size() == nll.size());
  double worst_nll = 0;
  for (size_t i = 0; i < nll.size(); ++i) worst_nll = std::max(worst_nll, std::fabs(losses[i] - nll[i]));
  CHECK(worst_nll < 1e-4);

  auto ref_logits = load_npy(asset_path("ref/stories260K_forward_reference_logits.npy").string());
  const double worst = max_abs_diff(a.logits.to_floats(), ref_logits.to_floats());
  MESSAGE("GPU max |logit - reference| = " << worst);
  CHECK(worst < 1e-4);

  auto norms = test::grouped_grad_norms(m);
  for (auto& [k, v] : tf["grad_l2_norm_per_param"].items()) {
    const double want = v.get<double>();
    INFO("GPU grad norm of " << k << ": " << norms.at(k) << " reference " << want);
    CHECK(std::fabs(norms.at(k) - want) / want < 1e-4);
  }
  const double total = ops::global_norm({m.grads().flat});
  const double want_total = tf["grad_l2_norm_total"].get<double>();
  MESSAGE(std::setprecision(8) << "GPU total grad norm " << total << " reference " << want_total);
  CHECK(std::fabs(total - want_total) / want_total < 1e-4);

  auto wq0 = m.grads().by_name.at("model.layers.0.self_attn.q_proj.weight").to_floats();
  auto ref_wq0 = tf["grad_wq0_first4"].get<std::vector<double>>();
  for (size_t i = 0; i < ref_wq0.size(); ++i) CHECK(wq0[i] == doctest::Approx(ref_wq0[i]).epsilon(1e-3));
}

TEST_CASE("cuda model: greedy generation from BOS on the GPU equals the CPU's tokens and the reference") {
  if (!need_gpu()) return;
  auto ref = test::load_json_asset("ref/stories260K_forward_reference.json");
  auto want = ref["greedy_from_bos_tokens"].get<std::vector<int32_t>>();
  generation_config g;
  g.sampling.temperature = 0.0f;
  g.max_new_tokens = static_cast<int64_t>(want.size()) - 1;
  auto cpu = load_llama2c(test::model_path());
  auto dev = load_llama2c(test::model_path());
  dev.to(gpu);
  const auto on_cpu = generate(cpu, {{want[0]}}, g)[0].tokens;
  const auto on_gpu = generate(dev, {{want[0]}}, g)[0].tokens;
  CHECK(on_gpu == on_cpu);
  std::vector<int32_t> got = {want[0]};
  got.insert(got.end(), on_gpu.begin(), on_gpu.end());
  CHECK(got == want);

  // a batch of prompts of different lengths (left padding, masks, positions from the host)
  std::vector<std::vector<int32_t>> prompts = {{1, 403, 407}, {1}, {1, 365, 261, 289, 330}};
  g.max_new_tokens = 24;
  auto bc = generate(cpu, prompts, g);
  auto bg = generate(dev, prompts, g);
  for (size_t i = 0; i < prompts.size(); ++i) CHECK(bg[i].tokens == bc[i].tokens);
}

TEST_CASE("cuda model: the cached decoder on the GPU gives the training forward's logits") {
  if (!need_gpu()) return;
  auto ref = test::load_json_asset("ref/stories260K_forward_reference.json");
  auto in = ref["teacher_forced"]["input_tokens"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(in.size()), V = 512;
  auto m = load_llama2c(test::model_path());
  m.to(gpu);
  activations a;
  m.forward(a, tensor::from_ints({1, T}, in), {});
  auto full = a.logits.to_floats();
  auto cache = m.make_cache(1, T);
  CHECK(cache.k[0].dev() == gpu);
  const int64_t half = T / 2;
  std::vector<int32_t> first(in.begin(), in.begin() + half);
  auto pre = m.forward_cached(cache, tensor::from_ints({1, half}, first), {}, {}, 0, true).to_floats();
  double worst = 0;
  for (int64_t i = 0; i < half * V; ++i) worst = std::max(worst, (double)std::fabs(pre[i] - full[i]));
  for (int64_t t = half; t < T; ++t) {
    auto lg = m.forward_cached(cache, tensor::from_ints({1, 1}, {in[t]}), {}, {}, t).to_floats();
    for (int64_t v = 0; v < V; ++v) worst = std::max(worst, (double)std::fabs(lg[v] - full[t * V + v]));
  }
  MESSAGE("GPU max |cached - full| = " << worst);
  CHECK(worst < 1e-4);
}

TEST_CASE("cuda model: AdamW training steps on GPU parameters track the CPU") {
  if (!need_gpu()) return;
  auto ref = test::load_json_asset("ref/stories260K_forward_reference.json");
  auto in = ref["teacher_forced"]["input_tokens"].get<std::vector<int32_t>>();
  auto tg = ref["teacher_forced"]["target_tokens"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(in.size());
  auto ids = tensor::from_ints({1, T}, in), targets = tensor::from_ints({1, T}, tg);
  decoder cpu(stories260k_config());
  cpu.init_random(7);
  decoder dev(stories260k_config());
  dev.init_random(7);
  dev.to(gpu);
  // each through the engine on a one-rank inproc group (which takes CUDA tensors): AdamW with
  // its moments on the parameters' device, clipped to 1
  auto ccpu = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  auto cdev = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  zero_settings zs;
  zs.micro_batch = 1;
  zs.gradient_clipping = 1.0;
  zs.adamw.lr = 1e-3f;
  zs.adamw.weight_decay = 0.01f;
  zero_engine ecpu(cpu, *ccpu, zs), edev(dev, *cdev, zs);
  for (int step = 0; step < 5; ++step) {
    const step_result rc = ecpu.train_step(ids, targets), rd = edev.train_step(ids, targets);
    const double lc = rc.loss, ld = rd.loss;
    INFO("step " << step << ": CPU loss " << lc << ", GPU loss " << ld);
    CHECK(std::isfinite(ld));
    CHECK(std::fabs(ld - lc) / lc < 1e-4);
    CHECK(std::fabs(rd.grad_norm - rc.grad_norm) / rc.grad_norm < 1e-4);
  }
  CHECK(dev.w().flat.dev() == gpu);
  CHECK(dev.grads().flat.dev() == gpu);
  // Adam's first steps move every weight by about lr * sign(g): an element whose gradient is
  // rounding noise on both devices may step the other way (2 lr apart). Allow a handful.
  const auto wc = cpu.w().flat.to_floats(), wd = dev.w().flat.to_floats();
  REQUIRE(wc.size() == wd.size());
  int64_t off = 0;
  double worst = 0;
  for (size_t i = 0; i < wc.size(); ++i) {
    const double d = std::fabs(static_cast<double>(wd[i]) - wc[i]);
    if (!(d <= 1e-5)) ++off;  // NaN counts
    if (!std::isnan(d)) worst = std::max(worst, d);
  }
  MESSAGE("after 5 AdamW steps: " << off << " of " << wc.size() << " weights differ by more than 1e-5 (max "
                                  << worst << ")");
  CHECK(off <= 16);
  CHECK(worst < 1.1e-2);  // at most 5 steps of 2 lr
}

TEST_CASE("cuda model: GPT-2 and OPT shapes (learned positions, LayerNorm, post-norm, projections) match the CPU") {
  if (!need_gpu()) return;
  auto gpt2 = [] {
    model_config c;
    c.family = model_family::gpt2;
    c.dim = 64;
    c.hidden_dim = 256;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 4;
    c.vocab_size = 96;
    c.max_seq_len = 32;
    c.norm = norm_kind::layernorm;
    c.use_rope = false;
    c.gated_mlp = false;
    c.act = ops::activation::gelu_tanh;
    c.bias = true;
    c.tied_embeddings = true;
    return c;
  }();
  auto opt = gpt2;  // OPT-350M-like: ReLU, positions from 2, post-norm, project_in/out, untied
  opt.family = model_family::opt;
  opt.act = ops::activation::relu;
  opt.position_offset = 2;
  opt.post_norm = true;
  opt.embed_dim = 32;
  opt.tied_embeddings = false;
  for (const auto& cfg : {gpt2, opt}) {
    INFO(cfg.summary());
    decoder cpu(cfg), dev(cfg);
    cpu.init_random(11);
    dev.init_random(11);
    dev.to(gpu);
    const int64_t B = 3, T = 12;
    std::vector<int32_t> ids(B * T), tg(B * T), mask(B * T, 1);
    for (int64_t i = 0; i < B * T; ++i) {
      ids[i] = static_cast<int32_t>((i * 37 + 5) % cfg.vocab_size);
      tg[i] = i % 7 == 3 ? -100 : static_cast<int32_t>((i * 11 + 2) % cfg.vocab_size);
    }
    for (int64_t t = 0; t < 4; ++t) mask[1 * T + t] = 0;  // row 1 left-padded by 4
    auto I = tensor::from_ints({B, T}, ids), G = tensor::from_ints({B, T}, tg), M = tensor::from_ints({B, T}, mask);
    activations ac, ad;
    const double lc = cpu.forward(ac, I, G, M), ld = dev.forward(ad, I, G, M);
    CHECK(std::fabs(ld - lc) / lc < 1e-5);
    CHECK(max_abs_diff(ad.logits.to_floats(), ac.logits.to_floats()) < 1e-4);
    cpu.zero_grad();
    dev.zero_grad();
    cpu.backward(ac);
    dev.backward(ad);
    const auto gc = cpu.grads().flat.to_floats(), gd = dev.grads().flat.to_floats();
    const double gdiff = max_abs_diff(gd, gc), gmax = max_abs(gc);
    MESSAGE(cfg.summary() << ": max |grad_gpu - grad_cpu| = " << gdiff << " (max |grad| " << gmax << ")");
    CHECK(gdiff <= 1e-4 * std::max(1.0, gmax));
    // the learned position table's gradient in particular (embedding_backward of pos_ids)
    const auto pc = cpu.grads().wpe.to_floats(), pd = dev.grads().wpe.to_floats();
    CHECK(max_abs_diff(pd, pc) <= 1e-4 * std::max(1.0, max_abs(pc)));
    // cached decoding of the padded batch: last-position logits
    auto cc = cpu.make_cache(B, T), cd = dev.make_cache(B, T);
    const auto lcpu = cpu.forward_cached(cc, I, {}, M, 0).to_floats();
    const auto lgpu = dev.forward_cached(cd, I, {}, M, 0).to_floats();
    CHECK(max_abs_diff(lgpu, lcpu) < 1e-4);
  }
}

TEST_CASE("cuda model: LoRA adapters and a value head on the GPU match the CPU, LoRA dropout is CPU-only") {
  if (!need_gpu()) return;
  auto ref = test::load_json_asset("ref/stories260K_forward_reference.json");
  auto in = ref["teacher_forced"]["input_tokens"].get<std::vector<int32_t>>();
  auto tg = ref["teacher_forced"]["target_tokens"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(in.size());
  auto ids = tensor::from_ints({1, T}, in), targets = tensor::from_ints({1, T}, tg);
  lora_config lc;
  lc.lora_r = 4;
  lc.target_modules = {"q_proj", "v_proj", "down_proj"};
  lc.seed = 5;
  auto cpu = load_llama2c(test::model_path());
  auto dev = load_llama2c(test::model_path());
  cpu.enable_lora(lc);
  dev.enable_lora(lc);  // on the CPU, then moved: the adapter buffer moves too
  // a non-zero B, so the adapters change the output and A gets gradients
  std::vector<float> bvals(static_cast<size_t>(cpu.num_adapter_parameters()));
  for (size_t i = 0; i < bvals.size(); ++i) bvals[i] = 0.01f * static_cast<float>((i * 7919) % 23) - 0.11f;
  cpu.w().adapter_flat.copy_from(tensor::from_floats({cpu.num_adapter_parameters()}, bvals));
  dev.w().adapter_flat.copy_from(tensor::from_floats({dev.num_adapter_parameters()}, bvals));
  dev.to(gpu);
  CHECK(dev.w().adapter_flat.dev() == gpu);
  CHECK(dev.w().layers[0].lora[lm_q].A.dev() == gpu);
  activations ac, ad;
  const double lcpu = cpu.forward(ac, ids, targets), lgpu = dev.forward(ad, ids, targets);
  CHECK(std::fabs(lgpu - lcpu) / lcpu < 1e-5);
  cpu.zero_grad();
  dev.zero_grad();
  cpu.backward(ac);
  dev.backward(ad);
  const auto gc = cpu.grads().adapter_flat.to_floats(), gd = dev.grads().adapter_flat.to_floats();
  const double diff = max_abs_diff(gd, gc), gmax = max_abs(gc);
  MESSAGE("LoRA: max |dadapter_gpu - dadapter_cpu| = " << diff << " (max " << gmax << ")");
  CHECK(gmax > 0);
  CHECK(diff <= 1e-4 * std::max(1.0, gmax));
  // merged adapters give the same logits on both devices
  cpu.merge_lora();
  dev.merge_lora();
  cpu.forward(ac, ids, {});
  dev.forward(ad, ids, {});
  CHECK(max_abs_diff(ad.logits.to_floats(), ac.logits.to_floats()) < 1e-4);

  // value head (reward/critic models): values (B, T) on the device
  auto vc = load_llama2c(test::model_path()), vd = load_llama2c(test::model_path());
  vc.add_value_head(3);
  vd.add_value_head(3);
  vd.to(gpu);
  activations va, vb;
  vc.forward(va, ids, {});
  vd.forward(vb, ids, {});
  CHECK(vb.values.dev() == gpu);
  CHECK(max_abs_diff(vb.values.to_floats(), va.values.to_floats()) < 1e-4);

  // LoRA dropout builds its masks on the host: refused on a CUDA model with a clear error
  if (gpu.kind == device_kind::cuda) {
    auto m = load_llama2c(test::model_path());
    lora_config ld = lc;
    ld.lora_dropout = 0.1f;
    m.enable_lora(ld);
    m.to(gpu);
    activations a;
    CHECK_THROWS_WITH_AS(m.forward(a, ids, targets), doctest::Contains("CPU only"), std::runtime_error);
  }
}

TEST_CASE("cuda model: gradient checkpointing on the GPU gives the gradients of the plain backward") {
  if (!need_gpu()) return;
  // Checkpointing adds no error of its own: its difference from the plain backward is within
  // the run-to-run difference of two plain backward passes (the GPU's reductions may differ
  // between runs), or 1e-6 relative when those are bit-identical.
  for (auto f : {model_family::llama, model_family::opt, model_family::gpt2}) {
    const model_config cfg = test::eight_layer_config(f);
    INFO(cfg.summary());
    decoder m(cfg);
    m.init_random(13);
    lora_config lc;  // LoRA (no dropout: it is CPU-only) with the base trained too
    lc.lora_r = 4;
    lc.seed = 2;
    m.enable_lora(lc, /*freeze_base=*/false);
    m.add_value_head(1);
    m.to(gpu);
    const int64_t B = 2, T = 32;
    std::vector<int32_t> ids(B * T);
    std::vector<float> dv(B * T);
    for (int64_t i = 0; i < B * T; ++i) {
      ids[i] = static_cast<int32_t>((i * 37 + 5) % cfg.vocab_size);
      dv[i] = 0.01f * static_cast<float>((i * 13) % 17) - 0.08f;
    }
    const tensor I = tensor::from_ints({B, T}, ids), D = tensor::from_floats({B, T}, dv).to(gpu);
    auto grads = [&](bool ckpt) {
      m.set_gradient_checkpointing(ckpt);
      activations a;
      m.forward(a, I, tensor{});
      m.zero_grad();
      m.backward(a, D);
      auto g = m.grads().flat.to_floats();
      const auto ga = m.grads().adapter_flat.to_floats();
      g.insert(g.end(), ga.begin(), ga.end());
      return g;
    };
    const auto p1 = grads(false), p2 = grads(false), c = grads(true);
    const double scale = max_abs(p1), noise = max_abs_diff(p1, p2) / scale, diff = max_abs_diff(p1, c) / scale;
    MESSAGE(cfg.summary() << ": checkpointed vs plain max relative difference " << diff << " (plain vs plain "
                          << noise << ")");
    CHECK(diff <= std::max(1e-6, 2 * noise));
  }
}
