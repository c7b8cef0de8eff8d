// bench_core: training-step and decode throughput of the CPU backend beside the
// sgemm rate measured, in the same run, at the model's own matrix shapes.
//
//   build/bin/bench_core [--quick]
//
// For each model: forward+backward+AdamW tokens/s, the sgemm GFLOP/s at its
// Linear shapes (forward and both backward products, each layer shape weighted by
// n_layers and the LM head by 1, as in one step), the bound that sgemm rate puts
// on a step (6·N FLOPs per token, N = parameters), and the ratio.
//
// Models: stories260K (llama2.c weights from the assets), and with random weights
// a LLaMA of 124M and the shapes of GPT-2 124M (at llm.c's train_gpt2 default
// B=4, T=64) and OPT-125m, built from model_config switches (learned positions,
// LayerNorm with bias, plain MLP, biases, tied head). `--quick`: 1 step each for
// the 124M models (full: 3).
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/generate.h"
#include "models/llama2c.h"
#include "runtime/kernels/ops.h"
#include "runtime/util/assets.h"

using namespace flowrun;
using clk = std::chrono::steady_clock;

static double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

// sgemm GFLOP/s over the Linear shapes of one training step of `c` at N = B*T rows:
// forward x·Wᵀ, backward dout·W and doutᵀ·x, for q/k/v/o, MLP and lm_head.
// Each shape is timed once; the rate is (sum of count·flops) / (sum of count·seconds)
// with count = n_layers for the layer shapes and 1 for the LM head.
static double sgemm_rate(const model_config& c, int64_t rows, int reps) {
  struct shp { int64_t out, in, count; };
  const int64_t hs = c.head_dim(), L = c.n_layers;
  std::vector<shp> shapes = {{c.dim, c.dim, L},        {c.n_kv_heads * hs, c.dim, L}, {c.n_kv_heads * hs, c.dim, L},
                             {c.dim, c.dim, L},        {c.hidden_dim, c.dim, L},      {c.dim, c.hidden_dim, L},
                             {c.vocab_size, c.dim, 1}};
  if (c.gated_mlp) shapes.push_back({c.hidden_dim, c.dim, L});
  double flops = 0, secs = 0;
  for (auto [O, I, count] : shapes) {
    std::vector<float> x(rows * I, 0.01f), w(O * I, 0.02f), y(rows * O), dx(rows * I), dw(O * I);
    auto run = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, O, I, 1.f, x.data(), I, w.data(), I, 0.f, y.data(), O);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, I, O, 1.f, y.data(), O, w.data(), I, 0.f, dx.data(), I);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, rows, 1.f, y.data(), O, x.data(), I, 1.f, dw.data(), I);
    };
    run();  // warm-up
    auto t = clk::now();
    for (int r = 0; r < reps; ++r) run();
    secs += count * seconds_since(t);
    flops += count * 3.0 * 2.0 * rows * O * I * reps;
  }
  return flops / secs / 1e9;
}

static void bench_train(const char* name, decoder& m, int64_t B, int64_t T, int steps, int sgemm_reps) {
  const auto& c = m.config();
  activations a;
  ops::adamw_config oc;
  oc.lr = 1e-4f;
  adamw_optimizer opt(m, oc);
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = static_cast<int32_t>((i * 7919) % c.vocab_limit());
    tg[i] = static_cast<int32_t>((i * 104729 + 1) % c.vocab_limit());
  }
  auto tids = tensor::from_ints({B, T}, ids), ttg = tensor::from_ints({B, T}, tg);
  auto step = [&] {
    m.forward(a, tids, ttg);
    m.zero_grad();
    m.backward(a);
    opt.step();
  };
  step();  // warm-up (allocations)
  auto t = clk::now();
  for (int s = 0; s < steps; ++s) step();
  double dt = seconds_since(t) / steps;
  double tok_s = B * T / dt;
  double gf = sgemm_rate(c, B * T, sgemm_reps);
  double bound = gf * 1e9 / (6.0 * static_cast<double>(m.num_parameters()));
  std::printf("| %-22s | %8.2f | %4ld x %-4ld | %10.1f | %8.1f | %11.1f | %5.2f |\n", name,
              m.num_parameters() / 1e6, (long)B, (long)T, tok_s, gf, bound, tok_s / bound);
  std::fflush(stdout);
}

// GPT-2 124M (Radford et al. 2019; HF gpt2, llm.c's GPT-2 small): 12 layers, 768 wide,
// 12 heads, vocabulary 50257, 1024 learned positions, pre-LayerNorm with bias,
// GELU (tanh), plain MLP 3072, biases on every Linear, head tied to the embedding.
static model_config gpt2_124m_config() {
  model_config c;
  c.family = model_family::gpt2;
  c.dim = 768;
  c.hidden_dim = 3072;
  c.n_layers = 12;
  c.n_heads = 12;
  c.n_kv_heads = 12;
  c.vocab_size = 50257;
  c.max_seq_len = 1024;
  c.norm = norm_kind::layernorm;
  c.norm_eps = 1e-5f;
  c.use_rope = false;
  c.position_offset = 0;
  c.gated_mlp = false;
  c.act = ops::activation::gelu_tanh;
  c.bias = true;
  c.tied_embeddings = true;
  return c;
}

// OPT-125m (Zhang et al. 2022; HF facebook/opt-125m): 12 layers, 768 wide, 12 heads,
// ffn 3072, 50272 embedding rows for a 50265-token tokenizer, 2048 learned positions
// stored from offset 2 (2050 rows), ReLU, biases, pre-LayerNorm, tied head.
static model_config opt_125m_config() {
  model_config c = gpt2_124m_config();
  c.family = model_family::opt;
  c.vocab_size = 50272;
  c.real_vocab_size = 50265;
  c.max_seq_len = 2048;
  c.position_offset = 2;
  c.act = ops::activation::relu;
  return c;
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const char* core = getenv("OPENBLAS_CORETYPE");
  std::printf("# bench_core\nOpenBLAS: %s, core %s (OPENBLAS_CORETYPE=%s), %d threads; OpenMP threads %d\n\n",
              openblas_get_config(), openblas_get_corename(), core ? core : "unset", openblas_get_num_threads(),
              omp_get_max_threads());
  std::printf("| model                  | params M | B x T       |   tokens/s | sgemm GF | bound tok/s | ratio |\n");
  std::printf("|------------------------|----------|-------------|------------|----------|-------------|-------|\n");
  const int big_steps = quick ? 1 : 3, big_reps = quick ? 1 : 3;
  {
    auto m = load_llama2c(asset_path("model/stories260K/stories260K.bin").string());
    bench_train("stories260K", m, 8, 64, quick ? 5 : 30, 3);
  }
  {
    decoder m(llama_124m_config());
    m.init_random(1);
    bench_train("llama 124M (12L, 768)", m, 4, 64, big_steps, big_reps);
  }
  {
    decoder m(gpt2_124m_config());
    m.init_random(1);
    bench_train("GPT-2 124M (12L, 768)", m, 4, 64, big_steps, big_reps);
  }
  {
    decoder m(opt_125m_config());
    m.init_random(1);
    bench_train("OPT-125m (12L, 768)", m, 4, 64, big_steps, big_reps);
  }
  {
    auto m = load_llama2c(asset_path("model/stories260K/stories260K.bin").string());
    generation_config g;
    g.sampling.temperature = 0.0f;
    g.max_new_tokens = 256;
    generate(m, {{1}}, g);
    auto t = clk::now();
    int reps = quick ? 2 : 10;
    int64_t n = 0;
    for (int r = 0; r < reps; ++r) n += static_cast<int64_t>(generate(m, {{1}}, g)[0].tokens.size());
    std::printf("\ngreedy decode, stories260K, batch 1: %.0f tokens/s\n", n / seconds_since(t));
  }
  return 0;
}
