// bench_core: training-step and decode throughput of the CPU backend beside the
// limits measured, in the same run, on this machine.
//
//   build/bin/bench_core [--quick] [--profile] [--threads N] [--only ITEMS] [--json FILE] [--seconds S]
//                        [--simd PATH]
//
// --profile: after each training figure, one more step with the op profiler on
// (ops::profile_start): time per op and what is left outside the ops.
// --simd PATH: run the vector kernels' PATH (AVX3, AVX2, SSE4, SCALAR, NEON, ...;
// runtime/kernels/cpu/simd_kernels.h) instead of the CPU's best; the header
// line names the path taken and those available.
//
// ITEMS (comma separated; default all but the extra shapes):
//   machine          FMA peak (AVX-512 or AVX2 loop), memory read bandwidth, the GEMM library
//   train_260k       stories260K (llama2.c weights from the assets), B=8, T=64
//   train_gpt2       GPT-2 124M shape (random weights), B=4, T=64 (llm.c's train_gpt2 default)
//   train_gpt2_large GPT-2 124M shape, B=8, T=256
//   train_llama124m, train_opt125m   extra shapes (not in the default set)
//   kernels          the non-GEMM kernels of a GPT-2 124M step at B=4, T=64 (AdamW over
//                    2^25 parameters), ms per call (best of 5), not in the default set
//   decode           greedy decode with the KV cache, batch 1 and 16: stories260K and a
//                    stories15M-shaped model (dim 288, 6 layers, 6 heads, vocab 32000, seq 256)
//   ppo              one PPO iteration of graphs/ppo.graph's phases (models/rlhf/ppo.h) without the
//                    actors, at bench/trl_ppo.py's shapes (8 prompts x 48 tokens, 32-token answers at
//                    temperature 1, one mini-batch of 8): the 6.1 M random LLaMA (dim 288, 6 layers,
//                    vocab 512) as policy, reference, reward model and critic; seconds per phase
//                    (median of 5 iterations after a warm-up), and with --profile the ops of each
//                    phase. Not in the default set.
//   ppo_260k         the same at stories260K's shape (random weights; median of 20 iterations).
//                    Not in the default set.
//
// A training step is forward + backward + AdamW. For each training shape the
// table gives tokens/s, the sgemm rate measured through the backend at the
// model's own Linear shapes (forward x·Wᵀ, backward dout·W and doutᵀ·x, each
// layer shape weighted by n_layers and the LM head by 1), the bound that rate
// puts on a step at 6·N FLOPs per token (N = parameters), and the bound the
// FMA peak puts on it. --json writes one JSON object per line (bench/run_bench.sh
// merges them with PyTorch's, bench/torch_ref.py).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's own _mm512_reduce_* trip -Wuninitialized (GCC bug 105593)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

#include "models/decoder.h"
#include "models/generate.h"
#include "models/llama2c.h"
#include "models/rlhf/ppo.h"
#include "models/rlhf/rlhf_math.h"
#include "models/sampler.h"
#include "models/train/zero.h"
#include "runtime/kernels/backend.h"
#include "runtime/kernels/cpu/simd_kernels.h"
#include "runtime/kernels/ops.h"
#include "runtime/util/assets.h"

using namespace flowrun;
using clk = std::chrono::steady_clock;

static double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

static FILE* g_json = nullptr;
static bool g_profile = false;  // --profile: per-op times of one extra step
static void json_line(const std::string& s) {
  if (!g_json) return;
  std::fprintf(g_json, "%s\n", s.c_str());
  std::fflush(g_json);
}

// ------------------------------------------------------------------ machine limits

// FMA peak: 12 independent accumulator chains per thread (enough to cover the
// FMA latency on 2 ports), all OpenMP threads at once, best of 6 (~0.1 s each:
// on a shared host the rate of the second vCPU varies from run to run).
static double fma_peak_gflops() {
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    const long iters = 4000000;
    auto t = clk::now();
    double sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
#if defined(__AVX512F__)
      __m512 a[12];
      for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
      const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
      for (long i = 0; i < iters; ++i)
        for (int j = 0; j < 12; ++j) a[j] = _mm512_fmadd_ps(a[j], b, c);
      __m512 s = a[0];
      for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
      sink += _mm512_reduce_add_ps(s);
#elif defined(__AVX2__) && defined(__FMA__)
      __m256 a[12];
      for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
      const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
      for (long i = 0; i < iters; ++i)
        for (int j = 0; j < 12; ++j) a[j] = _mm256_fmadd_ps(a[j], b, c);
      // every chain feeds the result: with a[0] alone the compiler dropped the other 11 and the
      // "peak" was one latency-bound chain times 12 (96.5 GFLOP/s on a Zen 3 vCPU that does 40)
      __m256 s = a[0];
      for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
      float f[8];
      _mm256_storeu_ps(f, s);
      sink += f[0];
#endif
    }
    const double dt = seconds_since(t);
#if defined(__AVX512F__)
    const double lanes = 16;
#elif defined(__AVX2__) && defined(__FMA__)
    const double lanes = 8;
#else
    const double lanes = 0;
#endif
    const double gf = omp_get_max_threads() * double(iters) * 12 * lanes * 2 / dt / 1e9;
    best = std::max(best, gf + 0 * sink);
  }
  return best;
}

// Read bandwidth: sum of a buffer of `bytes`, all threads, best of `reps`
// (4 independent vector sums per thread, so the adds never limit it).
static double read_gbs(size_t bytes, int reps) {
  const size_t n = bytes / sizeof(float) / 64 * 64;
  std::vector<float> buf(n, 1.0f);
  const float* p = buf.data();
  double best = 0, sink = 0;
  for (int r = 0; r < reps; ++r) {
    auto t = clk::now();
    float s = 0;
#pragma omp parallel reduction(+ : s)
    {
#if defined(__AVX512F__)
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#pragma omp for schedule(static)
      for (size_t i = 0; i < n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
      }
      s += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#else
#pragma omp for schedule(static)
      for (size_t i = 0; i < n; ++i) s += p[i];
#endif
    }
    best = std::max(best, n * sizeof(float) / seconds_since(t) / 1e9);
    sink += s;
  }
  return best + 0 * sink;
}

static double g_peak = 0;  // GFLOP/s, measured by the "machine" item (or lazily)

static double peak() {
  if (g_peak == 0) g_peak = fma_peak_gflops();
  return g_peak;
}

// ------------------------------------------------------------------ training

// sgemm GFLOP/s over the Linear shapes of one training step of `c` at `rows` = B*T
// rows, through the CPU backend (its library and kernels).
static double sgemm_rate(const model_config& c, int64_t rows, int reps) {
  struct shp { int64_t out, in, count; };
  const int64_t hs = c.head_dim(), L = c.n_layers;
  std::vector<shp> shapes = {{c.dim, c.dim, L},        {c.n_kv_heads * hs, c.dim, L}, {c.n_kv_heads * hs, c.dim, L},
                             {c.dim, c.dim, L},        {c.hidden_dim, c.dim, L},      {c.dim, c.hidden_dim, L},
                             {c.vocab_size, c.dim, 1}};
  if (c.gated_mlp) shapes.push_back({c.hidden_dim, c.dim, L});
  backend& be = cpu_backend();
  double flops = 0, secs = 0;
  for (auto [O, I, count] : shapes) {
    std::vector<float> x(rows * I, 0.01f), w(O * I, 0.02f), y(rows * O), dx(rows * I), dw(O * I);
    auto run = [&] {
      be.gemm(false, true, rows, O, I, 1.f, x.data(), I, w.data(), I, 0.f, y.data(), O);
      be.gemm(false, false, rows, I, O, 1.f, y.data(), O, w.data(), I, 0.f, dx.data(), I);
      be.gemm(true, false, O, I, rows, 1.f, y.data(), O, x.data(), I, 1.f, dw.data(), I);
    };
    run();  // warm-up
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      auto t = clk::now();
      run();
      best = std::min(best, seconds_since(t));
    }
    secs += count * best;
    flops += count * 3.0 * 2.0 * rows * O * I;
  }
  return flops / secs / 1e9;
}

static void bench_train(const char* key, const char* name, decoder& m, int64_t B, int64_t T, double min_seconds,
                        int sgemm_reps) {
  const auto& c = m.config();
  // a step of the one training engine (models/train/zero.h), one rank at stage 0
  auto comm = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  zero_settings zs;
  zs.micro_batch = B;
  zs.adamw.lr = 1e-4f;
  zero_engine eng(m, *comm, zs);
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = static_cast<int32_t>((i * 7919) % c.vocab_limit());
    tg[i] = static_cast<int32_t>((i * 104729 + 1) % c.vocab_limit());
  }
  auto tids = tensor::from_ints({B, T}, ids), ttg = tensor::from_ints({B, T}, tg);
  auto step = [&] { eng.train_step(tids, ttg); };
  step();  // warm-up (allocations)
  int steps = 0;
  auto t = clk::now();
  double dt = 0;
  do {
    step();
    ++steps;
    dt = seconds_since(t);
  } while (dt < min_seconds || steps < 2);
  const double tok_s = B * T * steps / dt;
  if (g_profile) {  // one more step, timed per op
    ops::profile_start();
    auto tp = clk::now();
    step();
    const double st = seconds_since(tp);
    auto prof = ops::profile_stop();
    double in_ops = 0;
    for (auto& e : prof) in_ops += e.seconds;
    std::printf("\nprofile of one %s step (B=%ld, T=%ld): %.1f ms\n\n| op | calls | ms | share |\n|---|---|---|---|\n",
                name, (long)B, (long)T, st * 1e3);
    for (auto& e : prof)
      if (e.seconds / st >= 0.001)
        std::printf("| %s | %ld | %.1f | %.1f%% |\n", e.op.c_str(), (long)e.calls, e.seconds * 1e3, 100 * e.seconds / st);
    std::printf("| (outside ops: zero_grad, copies, allocation) | | %.1f | %.1f%% |\n\n", (st - in_ops) * 1e3,
                100 * (st - in_ops) / st);
  }
  const double gf = sgemm_rate(c, B * T, sgemm_reps);
  const double n6 = 6.0 * static_cast<double>(m.num_parameters());
  const double bound = gf * 1e9 / n6, pbound = peak() * 1e9 / n6;
  std::printf("| %-24s | %8.2f | %4ld x %-4ld | %10.1f | %8.1f | %11.1f | %5.2f | %11.1f | %5.2f |\n", name,
              m.num_parameters() / 1e6, (long)B, (long)T, tok_s, gf, bound, tok_s / bound, pbound, tok_s / pbound);
  std::fflush(stdout);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"kind\": \"train\", \"model\": \"%s\", \"B\": %ld, \"T\": %ld, \"tok_s\": %.4f, \"params\": %ld, "
                "\"sgemm_gflops\": %.2f, \"sgemm_bound_tok_s\": %.3f, \"peak_gflops\": %.2f, \"peak_bound_tok_s\": %.3f, "
                "\"steps\": %d, \"seconds\": %.3f}",
                key, (long)B, (long)T, tok_s, (long)m.num_parameters(), gf, bound, peak(), pbound, steps, dt);
  json_line(buf);
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

// llama2.c's stories15M (dim 288, 6 layers, 6 heads, hidden 768, vocab 32000, seq 256).
static model_config stories15m_config() {
  model_config c;
  c.dim = 288;
  c.hidden_dim = 768;
  c.n_layers = 6;
  c.n_heads = 6;
  c.n_kv_heads = 6;
  c.vocab_size = 32000;
  c.max_seq_len = 256;
  return c;
}

// ------------------------------------------------------------------ decode

// Greedy decode from BOS up to the model's max_seq_len (stories15M: 255 new
// tokens) for `batch` identical prompts; tokens/s summed over the batch.
static void bench_decode(const char* key, const char* name, decoder& m, int64_t batch, int reps) {
  generation_config g;
  g.sampling.temperature = 0.0f;
  g.max_new_tokens = std::min<int64_t>(255, m.config().max_seq_len - 1);
  std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>{1});
  generate(m, prompts, g);  // warm-up
  int64_t n = 0;
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t = clk::now();
    int64_t k = 0;
    for (auto& o : generate(m, prompts, g)) k += static_cast<int64_t>(o.tokens.size());
    best = std::max(best, k / seconds_since(t));
    n += k;
  }
  const double w_mb = m.num_parameters() * 4.0 / 1e6;
  if (g_profile) {
    ops::profile_start();
    auto tp = clk::now();
    int64_t k = 0;
    for (auto& o : generate(m, prompts, g)) k += static_cast<int64_t>(o.tokens.size());
    const double st = seconds_since(tp);
    auto prof = ops::profile_stop();
    double in_ops = 0;
    for (auto& e : prof) in_ops += e.seconds;
    std::printf("\nprofile of %s decode, batch %ld: %.1f ms for %ld tokens, %.1f us per step\n\n| op | calls | ms | share |\n"
                "|---|---|---|---|\n", name, (long)batch, st * 1e3, (long)k, st * 1e6 * batch / k);
    for (auto& e : prof)
      if (e.seconds / st >= 0.002)
        std::printf("| %s | %ld | %.1f | %.1f%% |\n", e.op.c_str(), (long)e.calls, e.seconds * 1e3, 100 * e.seconds / st);
    std::printf("| (outside ops: sampling, cache copies, allocation) | | %.1f | %.1f%% |\n\n", (st - in_ops) * 1e3,
                100 * (st - in_ops) / st);
  }
  std::printf("| %-24s | %5ld | %10.1f | %8.1f |\n", name, (long)batch, best, w_mb);
  std::fflush(stdout);
  char buf[256];
  std::snprintf(buf, sizeof buf, "{\"kind\": \"decode\", \"model\": \"%s\", \"batch\": %ld, \"tok_s\": %.3f, \"weights_mb\": %.2f}",
                key, (long)batch, best, w_mb);
  json_line(buf);
}

// ------------------------------------------------------------------ PPO iteration

// The 6.1 M model of bench/trl_ppo.py: stories15M's shape with tok512's vocabulary (dim 288,
// hidden 768, 6 layers, 6 heads, vocab 512, tied head).
static model_config llama6m_config() {
  model_config c = stories15m_config();
  c.vocab_size = 512;
  return c;
}

// One PPO iteration's phases, in graphs/ppo.graph's order, on one thread of control (the graph
// runs the four scorers as actors at once; here they run one after the other, so each phase's
// time is its own). Shapes: B = 8 prompts of P = 48 tokens, answers of up to 32 tokens.
static void bench_ppo(int iterations, const model_config& c, const char* model_name) {
  const int64_t B = 8, P = 48;
  decoder actor(c), ref(c), rm(c), critic(c);
  actor.init_random(1234);
  ref.w().flat.copy_from(actor.w().flat);
  rm.w().flat.copy_from(actor.w().flat);
  rm.add_value_head(1);
  critic.w().flat.copy_from(actor.w().flat);
  critic.add_value_head(1);
  critic.w().v_head.copy_from(rm.w().v_head);
  auto comm_a = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  auto comm_c = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  zero_settings zs;
  zs.micro_batch = B;
  zs.gradient_clipping = 1.0;
  zs.adamw.lr = 1e-4f;
  zs.adamw.weight_decay = 0.0f;
  zero_engine ea(actor, *comm_a, zs), ec(critic, *comm_c, zs);
  ppo::ppo_settings s;
  s.per_device_training_batch_size = B;
  s.max_prompt_seq_len = P;
  s.max_answer_seq_len = 32;
  s.temperature = 1.0f;
  std::vector<int32_t> ids(B * P), ones(B * P, 1);
  const char* names[] = {"generate", "score policy", "score reference", "score reward", "score critic",
                         "advantages", "actor update", "critic update"};
  const int n_phases = 8;
  std::vector<std::vector<double>> secs(n_phases);
  std::vector<double> total;
  std::vector<std::vector<ops::op_time>> prof(n_phases);
  activations ref_acts, rm_acts;
  for (int it = 0; it <= iterations; ++it) {
    for (int64_t i = 0; i < B * P; ++i) ids[i] = static_cast<int32_t>(3 + (i * 7919 + it * 104729) % 509);
    const auto prompts = tensor::from_ints({B, P}, ids), mask = tensor::from_ints({B, P}, ones);
    const bool profiled = g_profile && it == iterations;
    double t_all = 0;
    std::optional<ppo::experience> e;
    tensor adv, ret;
    int phase = 0;
    auto timed = [&](const std::function<void()>& f) {
      if (profiled) ops::profile_start();
      auto t = clk::now();
      f();
      const double dt = seconds_since(t);
      if (profiled) prof[phase] = ops::profile_stop();
      if (it > 0) secs[phase].push_back(dt);
      t_all += dt;
      ++phase;
    };
    timed([&] { e = ppo::generate_rollouts(actor, prompts, mask, s, {2}, 0, 42 + it); });
    if (!e) {
      std::printf("ppo: every answer was dropped\n");
      return;
    }
    // as the nodes do (actors/ppo_nodes.cpp): the trainers score into their engine's activations
    // and their update takes that forward over; the frozen scorers keep theirs
    const int64_t keep = e->start();  // the answer's positions, as the graph's nodes score
    timed([&] { e->logprobs = ppo::sequence_logprobs(actor, ea.forward_activations(), e->seq, e->attention_mask, 1.0f, keep); });
    timed([&] { e->ref_logprobs = ppo::sequence_logprobs(ref, ref_acts, e->seq, e->attention_mask, 1.0f, keep); });
    timed([&] { e->reward_score = ppo::reward_scores(rm, rm_acts, e->seq, e->attention_mask, keep); });
    timed([&] { e->values = ppo::sequence_values(critic, ec.forward_activations(), e->seq, e->attention_mask, keep); });
    timed([&] { ppo::make_advantages(*e, s.ppo, adv, ret); });
    timed([&] { ppo::actor_update(ea, *e, adv, s, 1e-4, /*scored=*/true); });
    timed([&] { ppo::critic_update(ec, *e, ret, s, 1e-4, /*scored=*/true); });
    if (it > 0) total.push_back(t_all);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf("\nPPO iteration, %s (dim %d, %d layers, vocab %d), 8 x 48 prompt tokens, 32-token answers: "
              "median of %d iterations\n\n| phase | s | share |\n|---|---|---|\n",
              model_name, static_cast<int>(c.dim), static_cast<int>(c.n_layers), static_cast<int>(c.vocab_size),
              iterations);
  const double tot = median(total);
  std::string js;
  for (int p = 0; p < n_phases; ++p) {
    const double m = median(secs[p]);
    std::printf("| %s | %.4f | %.1f%% |\n", names[p], m, 100 * m / tot);
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s\"%s\": %.5f", js.empty() ? "" : ", ", names[p], m);
    js += buf;
  }
  std::printf("| iteration | %.4f | |\n", tot);
  std::fflush(stdout);
  json_line("{\"kind\": \"ppo_phases\", \"model\": \"" + std::string(model_name) + "\", \"seconds\": {" + js + "}, \"iteration_s\": " +
            std::to_string(tot) + "}");
  if (!g_profile) return;
  for (int p = 0; p < n_phases; ++p) {
    double in_ops = 0;
    for (auto& e : prof[p]) in_ops += e.seconds;
    const double st = secs[p].empty() ? 0 : secs[p].back();
    std::printf("\nprofile of phase '%s' (last iteration): %.1f ms\n\n| op | calls | ms | share |\n|---|---|---|---|\n",
                names[p], st * 1e3);
    for (auto& e : prof[p])
      if (e.seconds / st >= 0.01)
        std::printf("| %s | %ld | %.1f | %.1f%% |\n", e.op.c_str(), (long)e.calls, e.seconds * 1e3, 100 * e.seconds / st);
    std::printf("| (outside ops) | | %.1f | %.1f%% |\n", (st - in_ops) * 1e3, 100 * (st - in_ops) / st);
  }
  std::fflush(stdout);
}

// ------------------------------------------------------------------ kernels

// ms per call of each non-GEMM kernel at GPT-2 124M's B=4, T=64 shapes (N = 256
// rows, C = 768, 4C = 3072, V = 50257), best of 5 after a warm-up call.
static void bench_kernels() {
  const int64_t N = 256, C = 768, H = 4 * C, V = 50257, P = int64_t(1) << 25;
  auto fill = [](tensor& t, float scale) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * std::sin(0.37f * static_cast<float>(i % 10007));
  };
  auto mk = [&](shape_t s, float scale) {
    auto t = tensor::empty(s);
    fill(t, scale);
    return t;
  };
  auto x = mk({N, C}, 1.0f), w = mk({C}, 1.0f), b = mk({C}, 0.1f), out = mk({N, C}, 0.f), dx = mk({N, C}, 0.f);
  auto dw = mk({C}, 0.f), db = mk({C}, 0.f), mean = mk({N}, 0.f), rstd = mk({N}, 0.f);
  auto h = mk({N, H}, 2.0f), hu = mk({N, H}, 1.0f), ho = mk({N, H}, 0.f), hd = mk({N, H}, 0.f);
  auto logits = mk({N, V}, 4.0f), dlogits = mk({N, V}, 0.f), probs = mk({N, V}, 0.f), losses = mk({N}, 0.f);
  std::vector<int32_t> tv(N);
  for (int64_t i = 0; i < N; ++i) tv[i] = static_cast<int32_t>((i * 104729) % V);
  auto targets = tensor::from_ints({N}, tv);
  auto p = mk({P}, 0.02f), g = mk({P}, 0.001f), m = mk({P}, 0.f), v = mk({P}, 0.f);
  ops::adamw_config cfg;
  cfg.weight_decay = 0.1f;
  int64_t step = 0;
  // the log-prob gather of the RLHF scorers and trainers (B, T, V) = (1, 256, 50257), and greedy
  // picks from 16 rows of a 32000-token vocabulary (one batch-16 decode step's sampling)
  auto logits3 = logits.view({1, N, V}), dlogits3 = dlogits.view({1, N, V}), lp = mk({1, N}, 0.f);
  auto dlp = mk({1, N}, 1.0f), labels = targets.view({1, N});
  sampling_config greedy;
  greedy.temperature = 0.0f;
  rng64 rng(1);
  const std::vector<int32_t> no_history;
  int64_t picked = 0;
  // attention of the 6.1 M PPO bench's scoring and updates: (B, T, H, hs) = (8, 80, 6, 48), prompts
  // left-padded (the first rows of each sequence masked), and one decode step's (8, 1) queries
  const int64_t aB = 8, aT = 80, aH = 6, ahs = 48;
  auto aq = mk({aB, aT, aH, ahs}, 0.5f), ak = mk({aB, aT, aH, ahs}, 0.5f), av = mk({aB, aT, aH, ahs}, 1.0f);
  auto ao = mk({aB, aT, aH, ahs}, 0.f), aatt = mk({aB, aH, aT, aT}, 0.f), ado = mk({aB, aT, aH, ahs}, 0.3f);
  auto adq = mk({aB, aT, aH, ahs}, 0.f), adk = mk({aB, aT, aH, ahs}, 0.f), adv = mk({aB, aT, aH, ahs}, 0.f);
  auto aq1 = mk({aB, 1, aH, ahs}, 0.5f), ao1 = mk({aB, 1, aH, ahs}, 0.f);
  std::vector<int32_t> amv(aB * aT, 1);
  for (int64_t b = 0; b < aB; ++b)
    for (int64_t t = 0; t < b; ++t) amv[b * aT + t] = 0;
  auto amask = tensor::from_ints({aB, aT}, amv);
  tensor no_att;
  struct item { const char* name; const char* shape; std::function<void()> run; };
  const std::vector<item> items = {
      {"adamw", "2^25", [&] { ops::adamw_step(p, g, m, v, ++step, cfg); }},
      {"gelu_forward", "256x3072", [&] { ops::activation_forward(ho, h, ops::activation::gelu_tanh); }},
      {"gelu_backward", "256x3072", [&] { ops::activation_backward(hd, hu, h, ops::activation::gelu_tanh); }},
      {"swiglu_forward", "256x3072", [&] { ops::swiglu_forward(ho, h, hu); }},
      {"swiglu_backward", "256x3072", [&] { ops::swiglu_backward(hd, ho, hu, h, hu); }},
      {"layernorm_forward", "256x768", [&] { ops::layernorm_forward(out, mean, rstd, x, w, b, 1e-5f); }},
      {"layernorm_backward", "256x768", [&] { ops::layernorm_backward(dx, dw, db, out, x, w, mean, rstd); }},
      {"rmsnorm_forward", "256x768", [&] { ops::rmsnorm_forward(out, rstd, x, w, 1e-5f); }},
      {"rmsnorm_backward", "256x768", [&] { ops::rmsnorm_backward(dx, dw, out, x, w, rstd); }},
      {"softmax_forward", "256x50257", [&] { ops::softmax_forward(probs, logits); }},
      {"cross_entropy_forward", "256x50257", [&] { ops::cross_entropy_forward(losses, logits, targets); }},
      {"cross_entropy_backward", "256x50257",
       [&] { ops::cross_entropy_backward(dlogits, logits, targets, 1.0f / N); }},
      {"gather_log_probs_forward", "1x256x50257", [&] { rlhf::gather_log_probs_forward(lp, logits3, labels); }},
      {"gather_log_probs_backward", "1x256x50257",
       [&] { rlhf::gather_log_probs_backward(dlogits3, dlp, logits3, labels); }},
      {"attention_forward", "8x80x6x48", [&] { ops::attention_forward(ao, aatt, aq, ak, av, amask); }},
      {"attention_backward", "8x80x6x48", [&] { ops::attention_backward(adq, adk, adv, ado, aq, ak, av, aatt); }},
      {"attention_decode", "8x1x6x48, 80 keys", [&] { ops::attention_forward(ao1, no_att, aq1, ak, av, amask); }},
      {"sample_greedy", "16x32000",
       [&] {
         for (int64_t r = 0; r < 16; ++r)
           picked += sample_token(logits.data<float>() + r * V, 32000, greedy, rng, no_history);
       }},
  };
  std::printf("\n| kernel | shape | ms per call (best of 5) |\n|---|---|---|\n");
  for (const auto& it : items) {
    it.run();  // warm-up
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      auto t = clk::now();
      it.run();
      best = std::min(best, seconds_since(t));
    }
    std::printf("| %s | %s | %.3f |\n", it.name, it.shape, best * 1e3);
    std::fflush(stdout);
    char buf[256];
    std::snprintf(buf, sizeof buf, "{\"kind\": \"kernel\", \"kernel\": \"%s\", \"simd\": \"%s\", \"ms\": %.4f}", it.name,
                  simd::active_target().c_str(), best * 1e3);
    json_line(buf);
  }
}

int main(int argc, char** argv) {
  bool quick = false;
  double seconds = 3.0;
  std::set<std::string> only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--profile") g_profile = true;
    else if (a == "--only" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string it; std::getline(ss, it, ',');)
        if (!it.empty()) only.insert(it);
    } else if (a == "--json" && i + 1 < argc) {
      g_json = std::fopen(argv[++i], "a");
    } else if (a == "--threads" && i + 1 < argc) {
      ops::set_thread_budget(std::atoi(argv[++i]));
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--simd" && i + 1 < argc) {
      try {
        simd::force_target(argv[++i]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_core: --simd: %s\n", e.what());
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: bench_core [--quick] [--profile] [--threads N] [--only ITEMS] [--json FILE] [--seconds S] "
                           "[--simd PATH]\n");
      return 2;
    }
  }
  if (quick) seconds = std::min(seconds, 1.0);
  // the items: the first six run by default, the others only when --only names them
  const std::set<std::string> items = {"machine",         "train_260k",     "train_gpt2", "train_gpt2_large",
                                       "decode",          "train_llama124m", "train_opt125m", "kernels",
                                       "ppo",             "ppo_260k"};
  for (const auto& it : only)
    if (!items.count(it)) {
      std::string known;
      for (const auto& k : items) known += (known.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "bench_core: --only: no item '%s' (items: %s)\n", it.c_str(), known.c_str());
      return 2;
    }
  if (g_json == nullptr && std::find(argv, argv + argc, std::string("--json")) != argv + argc) {
    std::fprintf(stderr, "bench_core: --json: cannot open the file for appending\n");
    return 2;
  }
  auto want = [&](const char* k, bool by_default = true) { return only.empty() ? by_default : only.count(k) > 0; };

  std::string paths;
  for (const auto& t : simd::available_targets()) paths += (paths.empty() ? "" : " ") + t;
  std::printf("# bench_core\nGEMM: %s; OpenMP threads %d; SIMD path %s (available: %s)\n\n",
              ops::cpu_gemm_library().c_str(), omp_get_max_threads(), simd::active_target().c_str(), paths.c_str());
  if (want("machine")) {
    const double gf = peak();
    const double dram = read_gbs(size_t(1) << 30, quick ? 2 : 3);
    const double l3 = read_gbs(size_t(64) << 20, quick ? 3 : 6);
    std::printf("FMA peak %.1f GFLOP/s (%d threads); read bandwidth %.1f GB/s (1 GiB buffer), %.1f GB/s (64 MiB)\n\n",
                gf, omp_get_max_threads(), dram, l3);
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"kind\": \"machine\", \"threads\": %d, \"peak_gflops\": %.2f, \"read_gbs_1g\": %.2f, "
                  "\"read_gbs_64m\": %.2f, \"gemm\": \"%s\"}",
                  omp_get_max_threads(), gf, dram, l3, ops::cpu_gemm_library().c_str());
    json_line(buf);
  }
  const bool any_train = want("train_260k") || want("train_gpt2") || want("train_gpt2_large") ||
                         want("train_llama124m", false) || want("train_opt125m", false);
  if (any_train) {
    std::printf("| model                    | params M | B x T       |   tokens/s | sgemm GF | sgemm bound | ratio | FMA bound   | ratio |\n");
    std::printf("|--------------------------|----------|-------------|------------|----------|-------------|-------|-------------|-------|\n");
  }
  const int reps = quick ? 1 : 3;
  if (want("train_260k")) {
    auto m = load_llama2c(asset_path("model/stories260K/stories260K.bin").string());
    bench_train("stories260k", "stories260K", m, 8, 64, seconds, 3);
  }
  if (want("train_gpt2") || want("train_gpt2_large")) {
    decoder m(gpt2_124m_config());
    m.init_random(1);
    if (want("train_gpt2")) bench_train("gpt2_124m", "GPT-2 124M (12L, 768)", m, 4, 64, seconds, reps);
    if (want("train_gpt2_large")) bench_train("gpt2_124m", "GPT-2 124M (12L, 768)", m, 8, 256, quick ? 0 : seconds, 1);
  }
  if (want("train_llama124m", false)) {
    decoder m(llama_124m_config());
    m.init_random(1);
    bench_train("llama_124m", "llama 124M (12L, 768)", m, 4, 64, seconds, reps);
  }
  if (want("train_opt125m", false)) {
    decoder m(opt_125m_config());
    m.init_random(1);
    bench_train("opt_125m", "OPT-125m (12L, 768)", m, 4, 64, seconds, reps);
  }
  if (want("kernels", false)) bench_kernels();
  if (want("decode")) {
    std::printf("\n| greedy decode, KV cache   | batch |   tokens/s | weights MB |\n");
    std::printf("|--------------------------|-------|------------|------------|\n");
    const int dreps = quick ? 1 : 3;
    {
      auto m = load_llama2c(asset_path("model/stories260K/stories260K.bin").string());
      bench_decode("stories260k", "stories260K", m, 1, dreps);
      bench_decode("stories260k", "stories260K", m, 16, dreps);
    }
    {
      decoder m(stories15m_config());
      m.init_random(1);
      bench_decode("stories15m", "stories15M shape (random)", m, 1, dreps);
      bench_decode("stories15m", "stories15M shape (random)", m, 16, dreps);
    }
  }
  if (want("ppo", false)) bench_ppo(quick ? 2 : 5, llama6m_config(), "llama6m");
  if (want("ppo_260k", false)) bench_ppo(quick ? 2 : 20, stories260k_config(), "stories260k");
  if (g_json) std::fclose(g_json);
  return 0;
}
