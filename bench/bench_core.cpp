// bench_core: training-step and decode throughput of the CPU backend beside the
// sgemm rate measured, in the same run, at the model's own matrix shapes.
//
//   build/bin/bench_core [--quick]
//
// For each model: forward+backward+AdamW tokens/s, the sgemm GFLOP/s at its
// Linear shapes (forward and both backward products), the bound that sgemm rate
// puts on a step (6·N FLOPs per token, N = parameters), and the ratio.
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
static double sgemm_rate(const model_config& c, int64_t rows, int reps) {
  struct shp { int64_t out, in; };
  const int64_t hs = c.head_dim();
  std::vector<shp> shapes = {{c.dim, c.dim}, {c.n_kv_heads * hs, c.dim}, {c.n_kv_heads * hs, c.dim},
                             {c.dim, c.dim}, {c.hidden_dim, c.dim},     {c.dim, c.hidden_dim},
                             {c.vocab_size, c.dim}};
  if (c.gated_mlp) shapes.push_back({c.hidden_dim, c.dim});
  double flops = 0, secs = 0;
  for (auto [O, I] : shapes) {
    std::vector<float> x(rows * I, 0.01f), w(O * I, 0.02f), y(rows * O), dx(rows * I), dw(O * I);
    auto run = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, O, I, 1.f, x.data(), I, w.data(), I, 0.f, y.data(), O);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, I, O, 1.f, y.data(), O, w.data(), I, 0.f, dx.data(), I);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, rows, 1.f, y.data(), O, x.data(), I, 1.f, dw.data(), I);
    };
    run();  // warm-up
    auto t = clk::now();
    for (int r = 0; r < reps; ++r) run();
    secs += seconds_since(t);
    flops += 3.0 * 2.0 * rows * O * I * reps;
  }
  return flops / secs / 1e9;
}

static void bench_train(const char* name, decoder& m, int64_t B, int64_t T, int steps) {
  const auto& c = m.config();
  activations a;
  ops::adamw_config oc;
  oc.lr = 1e-4f;
  adamw_optimizer opt(m, oc);
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = static_cast<int32_t>((i * 7919) % c.vocab_size);
    tg[i] = static_cast<int32_t>((i * 104729 + 1) % c.vocab_size);
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
  double gf = sgemm_rate(c, B * T, 3);
  double bound = gf * 1e9 / (6.0 * static_cast<double>(m.num_parameters()));
  std::printf("| %-22s | %4ld x %-4ld | %10.1f | %8.1f | %10.1f | %5.2f |\n", name, (long)B, (long)T, tok_s, gf,
              bound, tok_s / bound);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const char* core = getenv("OPENBLAS_CORETYPE");
  std::printf("# bench_core\nOpenBLAS: %s, core %s (OPENBLAS_CORETYPE=%s), %d threads; OpenMP threads %d\n\n",
              openblas_get_config(), openblas_get_corename(), core ? core : "unset", openblas_get_num_threads(),
              omp_get_max_threads());
  std::printf("| model                  | B x T       |   tokens/s | sgemm GF | bound tok/s | ratio |\n");
  std::printf("|------------------------|-------------|------------|----------|-------------|-------|\n");
  {
    auto m = load_llama2c(asset_path("model/stories260K/stories260K.bin").string());
    bench_train("stories260K", m, 8, 64, quick ? 5 : 30);
  }
  {
    decoder m(llama_124m_config());
    m.init_random(1);
    bench_train("llama 124M (12L, 768)", m, 4, 64, quick ? 1 : 3);
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
