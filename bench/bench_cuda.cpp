// bench_cuda: the CUDA backend's benchmark table (issue #7, tools/device_check.sh).
//
//   bench_cuda [--out FILE] [--quick] [--no-opt] [--opt 350m|1.3b] [--gpt2-batch B] [--seq T] [--cpu]
//
// Rows:
//  - SFT step = forward + backward + AdamW (one optimizer step) on random weights, for the
//    GPT-2 124M shape (12 layers, 768 wide, 12 heads, vocab 50257) at B x T = 8 x 1024 and an
//    OPT shape (OPT-1.3B: 24 layers, 2048 wide, 32 heads, ffn 8192, vocab 50272, B x T =
//    4 x 1024; or OPT-350M with --opt 350m), each with matmul precision fp32 and bf16
//    (ops::set_matmul_precision; bf16 inputs, fp32 accumulation, fp32 master weights).
//    tokens/s = B*T / step time. Model FLOPs per token = 6*N + 12*L*T*C (N = all parameters,
//    tied embeddings once; the second term is the attention score and value matmuls, PaLM
//    appendix B); MFU = FLOPs/s / peak, peak = the device's dense bf16 tensor-core peak
//    (989 TFLOP/s for H100/H200 SXM, 756 for H100 PCIe, 312 for A100), also for the fp32 rows.
//    An unknown device gets TFLOP/s only.
//  - Generation tokens/s, GPT-2 124M shape, random weights, greedy, KV cache (models/generate.h,
//    as the CPU generator), prompt 16 tokens, 128 new tokens, batch 1 and 32; tokens/s counts
//    the new tokens of all sequences over the whole generate() call (prefill included).
// Timing: one warm-up step (or call), then timed steps until 10 steps or ~6 s (at least 2),
// between cudaDeviceSynchronize calls. "peak GiB" is the caching allocator's peak of allocated
// bytes for the shape (runtime/kernels/cuda/cuda_api.h). Order: GPT-2 SFT, generation, then the
// OPT shape (the slowest last). Each row catches its own errors (out of memory, ...) and prints
// them in the table. The tables are Markdown on stdout and, with --out, in FILE, appended line
// by line (a run stopped by a time limit keeps the finished rows).
// Without a CUDA device it prints "bench_cuda: no CUDA device: skipped" (also into FILE)
// and exits 0.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "models/train/zero.h"
#include "models/config.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "runtime/kernels/cuda/cuda_api.h"
#include "runtime/kernels/ops.h"
#include "runtime/tensor/device_memory.h"

using namespace flowrun;

namespace {

// --cpu (a smoke test of this program without a GPU): everything on the CPU, small sizes.
bool g_cpu = false;
device gpu = device::cuda(0);

struct options {
  std::string out;
  bool quick = false;
  bool opt = true;
  std::string opt_size = "1.3b";
  int64_t gpt2_batch = 8;
  int64_t seq = 1024;
  bool profile = false;  // --profile: per-op times of one GPT-2 SFT step (run with CUDA_LAUNCH_BLOCKING=1)
};

/// GPT-2 124M (models/config.h) with room for T positions.
model_config gpt2_124m(int64_t T) {
  model_config c = gpt2_124m_config();
  c.max_seq_len = std::max<int64_t>(c.max_seq_len, T);
  return c;
}

// facebook/opt-1.3b and facebook/opt-350m (config.json): ReLU, learned positions from 2,
// pre-norm (350m: post-norm with project_in/out 512 <-> 1024).
model_config opt_shape(const std::string& size, int64_t T) {
  model_config c;
  c.family = model_family::opt;
  c.vocab_size = 50272;
  c.max_seq_len = std::max<int64_t>(2048, T);
  c.norm = norm_kind::layernorm;
  c.use_rope = false;
  c.position_offset = 2;
  c.gated_mlp = false;
  c.act = ops::activation::relu;
  c.bias = true;
  c.tied_embeddings = true;
  if (size == "350m") {
    c.dim = 1024;
    c.hidden_dim = 4096;
    c.n_layers = 24;
    c.n_heads = 16;
    c.embed_dim = 512;
    c.post_norm = true;
  } else {
    c.dim = 2048;
    c.hidden_dim = 8192;
    c.n_layers = 24;
    c.n_heads = 32;
  }
  c.n_kv_heads = c.n_heads;
  return c;
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void device_sync() {
  if (!g_cpu) check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// Random weights without init_random's per-element Box-Muller on the host (minutes at 1.3B):
// a 1M-element N(0, 0.02) block tiled over the flat buffer, norm weights 1, biases 0.
void fast_random_init(decoder& m, uint64_t seed) {
  const int64_t chunk = int64_t{1} << 20;
  std::vector<float> h(chunk);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&] {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) >> 11;
  };
  for (auto& x : h) {
    double u1 = std::max(next() * (1.0 / 9007199254740992.0), 1e-300), u2 = next() * (1.0 / 9007199254740992.0);
    x = static_cast<float>(0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  auto host = tensor::from_floats({chunk}, h);
  tensor flat = m.w().flat;
  const int64_t n = flat.numel();
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t k = std::min(chunk, n - off);
    flat.flat_view(off, {k}).copy_from(host.flat_view(0, {k}));
  }
  for (auto& e : m.params()) {
    const bool norm_w = e.name.find("layernorm.weight") != std::string::npos || e.name == "model.norm.weight";
    const bool bias = e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
    if (norm_w || bias) {
      tensor v = m.w().flat.flat_view(e.offset, {e.numel});
      ops::fill(v, norm_w ? 1.0f : 0.0f);
    }
  }
  device_sync();
}

tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> v(B * T);
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(V));
  }
  return tensor::from_ints({B, T}, v);
}

bool set_precision(const std::string& p, std::string& why) {
#ifdef FLOWRUN_HAVE_MATMUL_PRECISION
  ops::set_matmul_precision(p == "bf16" ? ops::matmul_precision::bf16 : ops::matmul_precision::f32);
  return true;
#else
  if (p == "fp32") return true;
  why = "n/a: this build has no ops::set_matmul_precision";
  return false;
#endif
}

/// Warm-up once, then time `fn` between device syncs: at least 2 and at most `max_iters` runs,
/// stopping after ~budget_s. Returns seconds per run.
double time_it(const std::function<void()>& fn, int max_iters, double budget_s) {
  fn();
  device_sync();
  const auto t0 = std::chrono::steady_clock::now();
  int it = 0;
  double el = 0;
  while (true) {
    fn();
    ++it;
    device_sync();
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it >= max_iters || (it >= 2 && el > budget_s)) break;
  }
  return el / it;
}

std::string fmt(double x, int prec) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(prec);
  os << x;
  return os.str();
}

std::string human(double n) {
  if (n >= 1e9) return fmt(n / 1e9, 2) + "B";
  return fmt(n / 1e6, 1) + "M";
}

// Markdown lines to stdout and, appended and flushed one by one, to the --out file (so a
// run killed by a time limit still leaves the rows it finished).
struct report {
  std::string path;
  void start() {
    if (!path.empty()) std::ofstream(path, std::ios::trunc);
  }
  void line(const std::string& s) {
    std::cout << s << std::endl;
    if (path.empty()) return;
    std::ofstream f(path, std::ios::app);
    f << s << "\n";
    if (!f) std::cerr << "bench_cuda: cannot write " << path << "\n";
  }
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "bench_cuda: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--out") o.out = val();
    else if (a == "--quick") o.quick = true;
    else if (a == "--no-opt") o.opt = false;
    else if (a == "--opt") o.opt_size = val();
    else if (a == "--gpt2-batch") o.gpt2_batch = std::stoll(val());
    else if (a == "--seq") o.seq = std::stoll(val());
    else if (a == "--cpu") g_cpu = true;
    else if (a == "--profile") o.profile = true;
    else if (a == "-h" || a == "--help") {
      std::cout << "usage: bench_cuda [--out FILE] [--quick] [--no-opt] [--opt 350m|1.3b] [--gpt2-batch B] [--seq T] "
                   "[--cpu]\n  --cpu: a smoke test of this program on the CPU (small sizes, no OPT)\n";
      return 0;
    } else {
      std::cerr << "bench_cuda: unknown argument " << a << "\n";
      return 2;
    }
  }
  if (o.opt_size != "350m" && o.opt_size != "1.3b") {
    std::cerr << "bench_cuda: --opt takes 350m or 1.3b\n";
    return 2;
  }
  report r;
  r.path = o.out;
  r.start();
  if (g_cpu) {  // smoke test: small and quick
    gpu = device::cpu();
    o.quick = true;
    o.opt = false;
    o.seq = std::min<int64_t>(o.seq, 64);
    o.gpt2_batch = std::min<int64_t>(o.gpt2_batch, 2);
  } else if (!cuda_device_present()) {
    r.line("bench_cuda: no CUDA device: skipped");
    return 0;
  }
  cudaDeviceProp prop{};
  if (g_cpu) std::snprintf(prop.name, sizeof(prop.name), "CPU (--cpu smoke test)");
  else check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::string name = prop.name;
  double peak = 0;
  std::string peak_note;
  if (name.find("H100") != std::string::npos && name.find("PCIe") != std::string::npos) peak = 756e12;
  else if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos ||
           name.find("H800") != std::string::npos || name.find("GH200") != std::string::npos)
    peak = 989e12;
  else if (name.find("A100") != std::string::npos || name.find("A800") != std::string::npos)
    peak = 312e12;
  peak_note = peak > 0 ? fmt(peak / 1e12, 0) + " TFLOP/s (dense bf16, by device name)"
                       : "unknown for this device: MFU not computed";
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));

  r.line("# flowrun CUDA benchmark");
  r.line("");
  r.line("- date: " + std::string(date));
  r.line("- device: " + name + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         fmt(prop.totalGlobalMem / 1073741824.0, 1) + " GiB), CUDA runtime " + std::to_string(rt) + ", driver " +
         std::to_string(drv));
  r.line("- peak for MFU: " + peak_note);
  r.line("- SFT step = forward + backward + AdamW step, random weights and tokens; model FLOPs/token = "
         "6*N + 12*L*T*C (N = all parameters, tied embeddings once)");
  r.line("");
  const std::string sft_head = "| workload | model | params | matmul | B x T | step (ms) | tokens/s | model TFLOP/s | MFU | peak GiB |";
  const std::string sft_rule = "|---|---|---|---|---|---|---|---|---|---|";
  const int max_iters = o.quick ? 3 : 10;
  const double budget = o.quick ? 2.0 : 6.0;
  const int64_t T = o.seq;

  // One SFT shape: fp32 then bf16 on the same model (weights drift by a few steps: no matter here).
  auto run_sft = [&](const std::string& label, const model_config& cfg, int64_t B) {
    if (o.quick) B = std::max<int64_t>(1, B / 2);
    const std::string shape_cell = std::to_string(B) + " x " + std::to_string(T);
    try {
      if (!g_cpu) {
        cuda::empty_cache();
        cuda::reset_peak_memory(0);
      }
      decoder m(cfg, gpu);
      fast_random_init(m, 1);
      // a step of the one training engine (models/train/zero.h), one rank at stage 0
      auto comm = comm::inproc_communicator(comm::make_inproc_group(1), 0);
      zero_settings zs;
      zs.micro_batch = B;
      zs.adamw.lr = 1e-4f;
      zs.adamw.weight_decay = 0.1f;
      zero_engine eng(m, *comm, zs);
      auto ids = random_ids(B, T, cfg.vocab_size, 7).to(gpu);
      auto tg = random_ids(B, T, cfg.vocab_size, 8).to(gpu);
      const double N = static_cast<double>(m.num_parameters());
      const double flops_tok = 6.0 * N + 12.0 * cfg.n_layers * T * cfg.dim;
      for (std::string prec : {"fp32", "bf16"}) {
        std::string why;
        std::string row = "| SFT step | " + label + " | " + human(N) + " | " + prec + " | " + shape_cell + " | ";
        try {
          if (!set_precision(prec, why)) {
            r.line(row + why + " | | | | |");
            continue;
          }
          double loss = 0;
          const double sec = time_it(
              [&] { loss = eng.train_step(ids, tg).loss; },
              max_iters, budget);
          const double tps = static_cast<double>(B * T) / sec;
          const double fl = tps * flops_tok;
          std::string mfu = peak > 0 ? fmt(100.0 * fl / peak, 1) + "%" : "n/a";
          if (!std::isfinite(loss)) mfu += " (loss not finite!)";
          const double gib = g_cpu ? 0.0 : cuda::get_memory_stats(0).peak_allocated / 1073741824.0;
          r.line(row + fmt(sec * 1e3, 1) + " | " + fmt(tps, 0) + " | " + fmt(fl / 1e12, 1) + " | " + mfu + " | " +
                 fmt(gib, 1) + " |");
        } catch (const std::exception& e) {
          r.line(row + "error: " + std::string(e.what()).substr(0, 160) + " | | | | |");
        }
      }
    } catch (const std::exception& e) {
      r.line("| SFT step | " + label + " | | | " + shape_cell + " | error: " + std::string(e.what()).substr(0, 160) +
             " | | | | |");
    }
    std::string ignore;
    set_precision("fp32", ignore);
    device_sync();
  };

  // Greedy generation, GPT-2 124M shape, batch 1 and 32 (fp32 matmuls).
  auto run_gen = [&] {
    r.line("| workload | model | matmul | batch | prompt + new tokens | time (s) | new tokens/s |");
    r.line("|---|---|---|---|---|---|---|");
    try {
      if (!g_cpu) cuda::empty_cache();
      decoder m(gpt2_124m(T), gpu);
      fast_random_init(m, 2);
      const int64_t P = 16, NEW = o.quick ? 32 : 128;
      for (int64_t B : {int64_t{1}, int64_t{32}}) {
        std::string row = "| generation (greedy, KV cache) | GPT-2 124M | fp32 | " + std::to_string(B) + " | " +
                          std::to_string(P) + " + " + std::to_string(NEW) + " | ";
        try {
          std::vector<std::vector<int32_t>> prompts(B);
          for (int64_t b = 0; b < B; ++b) {
            auto ids = random_ids(1, P, 50257, 100 + b);
            prompts[b].assign(ids.data<int32_t>(), ids.data<int32_t>() + P);
          }
          generation_config g;
          g.sampling.temperature = 0.0f;
          g.max_new_tokens = 8;
          generate(m, prompts, g);  // warm-up
          g.max_new_tokens = NEW;
          device_sync();
          const auto t0 = std::chrono::steady_clock::now();
          auto res = generate(m, prompts, g);
          device_sync();
          const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          int64_t made = 0;
          for (auto& x : res) made += static_cast<int64_t>(x.tokens.size());
          r.line(row + fmt(sec, 3) + " | " + fmt(made / sec, 1) + " |");
        } catch (const std::exception& e) {
          r.line(row + "error: " + std::string(e.what()).substr(0, 160) + " |  |");
        }
      }
    } catch (const std::exception& e) {
      r.line("| generation | GPT-2 124M | | | | error: " + std::string(e.what()).substr(0, 160) + " | |");
    }
  };

  // --profile: where one GPT-2 SFT step spends its time, per op (ops::profile_start). The op
  // profiler times the host side of each op; kernels run asynchronously, so run this mode with
  // CUDA_LAUNCH_BLOCKING=1 to make every launch (and cuBLAS call) wait for its kernel.
  if (o.profile) {
    const int64_t B = o.quick ? std::max<int64_t>(1, o.gpt2_batch / 2) : o.gpt2_batch;
    decoder m(gpt2_124m(T), gpu);
    fast_random_init(m, 1);
    auto comm = comm::inproc_communicator(comm::make_inproc_group(1), 0);
    zero_settings zs;
    zs.micro_batch = B;
    zero_engine eng(m, *comm, zs);
    auto ids = random_ids(B, T, 50257, 7).to(gpu);
    auto tg = random_ids(B, T, 50257, 8).to(gpu);
    auto step = [&] { eng.train_step(ids, tg); };
    for (std::string prec : {"fp32", "bf16"}) {
      std::string why;
      if (!set_precision(prec, why)) continue;
      step();
      device_sync();
      ops::profile_start();
      const auto t0 = std::chrono::steady_clock::now();
      step();
      device_sync();
      const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      auto prof = ops::profile_stop();
      r.line("");
      r.line("Profile: one SFT step, GPT-2 124M, " + prec + ", B x T = " + std::to_string(B) + " x " +
             std::to_string(T) + ", " + fmt(total * 1e3, 1) + " ms" +
             (std::getenv("CUDA_LAUNCH_BLOCKING") ? " (CUDA_LAUNCH_BLOCKING=1)" : " (asynchronous: host times only)"));
      r.line("");
      r.line("| op | calls | ms | share |");
      r.line("|---|---|---|---|");
      double in_ops = 0;
      for (auto& e : prof) {
        in_ops += e.seconds;
        r.line("| " + e.op + " | " + std::to_string(e.calls) + " | " + fmt(e.seconds * 1e3, 2) + " | " +
               fmt(100.0 * e.seconds / total, 1) + "% |");
      }
      r.line("| outside ops | | " + fmt((total - in_ops) * 1e3, 2) + " | " + fmt(100.0 * (total - in_ops) / total, 1) +
             "% |");
    }
    std::string ignore;
    set_precision("fp32", ignore);
    return 0;
  }

  // The small shape and generation first: a run cut short by a time limit still has them.
  r.line(sft_head);
  r.line(sft_rule);
  run_sft("GPT-2 124M", gpt2_124m(T), o.gpt2_batch);
  r.line("");
  run_gen();
  if (o.opt) {
    r.line("");
    r.line(sft_head);
    r.line(sft_rule);
    const bool small = o.opt_size == "350m";
    run_sft(small ? "OPT-350M" : "OPT-1.3B", opt_shape(o.opt_size, T), small ? 8 : 4);
  }
  return 0;
}
