// bench_gemm: the GEMM libraries side by side in ONE process, at the Linear
// shapes of one GPT-2 124M training step (forward x·Wᵀ, backward dout·W and
// doutᵀ·x), and the small-M shapes of decoding (stories15M, batch 1 and 16).
// This is how the CPU backend's GEMM library was chosen (docs/performance.md).
//
//   build/bin/bench_gemm [--rows N] [--reps R] [--threads N]
//   build/bin/bench_gemm --row-invariance [--threads N]
//   build/bin/bench_gemm --small [--threads N]
//
// --small: the products of the small models' steps (stories260K at B=8, T=64: 512 rows, dim 64,
// hidden 172, vocab 512, head size 8; the 6.1 M LLaMA's 288 x 288 layers at 640 rows; decoding's
// products at 2-8 rows), each timed per call (median of 7 timings of enough calls to last ~20 ms),
// flowrun's own gemm against each library, interleaved shape by shape. What flowrun's packed and
// small-M kernels are measured by. Then one decode step of the 6.1 M LLaMA at 8 rows through every
// layer's own weights (streamed) and through one weight per shape (cache-resident): decode_6m.
//
// --row-invariance: whether a row's result depends on how many rows share the call (PPO's first
// ratio is exactly 1 only if it does not: test_ppo, docs/performance.md "GEMM per ISA"). Per
// library, C = A·Bᵀ (K = 64, N = 512) is computed for all 152 rows, then for rows [s, s + M) alone
// at several M and starts s; it prints the number of elements whose bits differ from the full call.
// Exit code 1 when flowrun's own gemm gives a row other bits for another M on the same side of its
// small-M threshold (16 rows; across it the kernels differ: see row_invariance below).
//
// Libraries, each only when CMake found it (cmake/deps.cmake):
//  - flowrun: the CPU backend's own gemm (the library it was built with, plus
//    its small-M kernel), through ops::matmul;
//  - OpenBLAS (Debian 0.3.21, its own core detection: the environment is left alone);
//  - BLIS (Debian 0.9.0), the sandybridge..skx kernels: "detected" is what BLIS's
//    own detection picks, "skx" is its AVX-512 context chosen explicitly (on CPUs with AVX-512F);
//  - oneDNN (Debian 2.6.3) dnnl_sgemm.
// Every library's result is compared against the first one's (max relative error).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/backend.h"
#include "runtime/kernels/ops.h"

#ifdef FLOWRUN_BENCH_OPENBLAS
#include <cblas.h>
#endif
#ifdef FLOWRUN_BENCH_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef FLOWRUN_BENCH_BLIS
#include <blis.h>
extern "C" cntx_t* bli_gks_lookup_nat_cntx(arch_t id);  // in libblis.a (hidden in the .so)
#endif

using namespace flowrun;
using clk = std::chrono::steady_clock;
using gemm_fn = std::function<void(bool, bool, int, int, int, float, const float*, int, const float*, int, float,
                                   float*, int)>;

struct lib {
  std::string name;
  gemm_fn f;
};

static std::vector<lib> libraries() {
  std::vector<lib> ls;
  ls.push_back({std::string("flowrun (") + ops::cpu_gemm_library() + ")",
                [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb,
                   float be, float* C, int ldc) {
                  cpu_backend().gemm(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc);
                }});
#ifdef FLOWRUN_BENCH_OPENBLAS
  ls.push_back({std::string("OpenBLAS ") + openblas_get_corename(),
                [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb,
                   float be, float* C, int ldc) {
                  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                              al, A, lda, B, ldb, be, C, ldc);
                }});
#endif
#ifdef FLOWRUN_BENCH_BLIS
  bli_init();
  for (arch_t id : {bli_arch_query_id(), BLIS_ARCH_SKX}) {
    // the skx context runs AVX-512 kernels: only where the CPU has them (SIGILL on Zen 3), and not twice
    if (id == BLIS_ARCH_SKX && (bli_arch_query_id() == BLIS_ARCH_SKX || !__builtin_cpu_supports("avx512f"))) continue;
    cntx_t* cx = bli_gks_lookup_nat_cntx(id);
    if (!cx) continue;
    ls.push_back({std::string("BLIS ") + bli_arch_string(id),
                  [cx](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B,
                       int ldb, float be, float* C, int ldc) {
                    rntm_t r = BLIS_RNTM_INITIALIZER;
                    bli_rntm_set_num_threads(omp_get_max_threads(), &r);
                    bli_sgemm_ex(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M,
                                 N, K, &al, const_cast<float*>(A), lda, 1, const_cast<float*>(B), ldb, 1, &be, C, ldc,
                                 1, cx, &r);
                  }});
  }
#endif
#ifdef FLOWRUN_BENCH_DNNL
  ls.push_back({"oneDNN", [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B,
                             int ldb, float be, float* C, int ldc) {
                  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, al, A, lda, B, ldb, be, C, ldc);
                }});
#endif
  return ls;
}

// --row-invariance (see the top): one table row per library, the differing elements per M (start 0 and
// a shifted start), and the total. flowrun's own gemm sends x·Wᵀ with at most k_small_m (16) rows to its
// small-M kernel, whose sums run in another order than the library's: its rows there are compared with
// the full call (they differ) and, on a line of their own, with a 16-row call (the same kernel). Returns
// flowrun's differing elements that matter: above 16 rows against the full call, and within the band.
static long row_invariance(const std::vector<lib>& libs) {
  const int full = 152, K = 64, N = 512, small_m = 16;
  std::vector<float> a(size_t(full) * K), b(size_t(N) * K);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(std::sin(0.37 * double(i)) * 0.5);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(std::cos(0.11 * double(i)) * 0.02);
  const std::vector<int> ms = {1, 2, 3, 8, 13, 16, 17, 19, 25, 32, 38, 57, 128};
  std::printf("# row invariance: C = A·Bᵀ, K = %d, N = %d; elements of rows [s, s+M) computed alone whose bits "
              "differ from the %d-row call, for s = 0 and s = 7\n\n| library |",
              K, N, full);
  for (int m : ms) std::printf(" M=%d |", m);
  std::printf(" total |\n|---|");
  for (size_t i = 0; i <= ms.size(); ++i) std::printf("---|");
  std::printf("\n");
  // rows [start, start + m) alone, against `ref` (rows [ref_start, ...) of a call): elements whose bits differ
  auto differing = [&](const lib& l, int start, int m, const std::vector<float>& ref, int ref_start) {
    std::vector<float> c(size_t(m) * N);
    l.f(false, true, m, N, K, 1.f, a.data() + size_t(start) * K, K, b.data(), K, 0.f, c.data(), N);
    long diff = 0;
    for (size_t i = 0; i < c.size(); ++i)
      diff += std::memcmp(&c[i], &ref[size_t(start - ref_start) * N + i], sizeof(float)) != 0;
    return diff;
  };
  long flowrun_bad = 0;
  for (size_t li = 0; li < libs.size(); ++li) {
    std::vector<float> c_full(size_t(full) * N);
    libs[li].f(false, true, full, N, K, 1.f, a.data(), K, b.data(), K, 0.f, c_full.data(), N);
    long total = 0;
    std::printf("| %s |", libs[li].name.c_str());
    for (int m : ms) {
      long diff = 0;
      for (int start : {0, 7}) diff += differing(libs[li], start, m, c_full, 0);
      total += diff;
      if (li == 0 && m > small_m) flowrun_bad += diff;
      std::printf(" %ld |", diff);
    }
    std::printf(" **%ld** |\n", total);
  }
  // flowrun's small-M band against itself: rows alone against the same rows in a 16-row call
  std::printf("| %s, M <= %d against a %d-row call |", libs[0].name.c_str(), small_m, small_m);
  long band = 0;
  for (int m : ms) {
    if (m > small_m) {
      std::printf(" |");
      continue;
    }
    long diff = 0;
    for (int start : {0, 7}) {
      std::vector<float> c16(size_t(small_m) * N);
      libs[0].f(false, true, small_m, N, K, 1.f, a.data() + size_t(start) * K, K, b.data(), K, 0.f, c16.data(), N);
      diff += differing(libs[0], start, m, c16, start);
    }
    band += diff;
    std::printf(" %ld |", diff);
  }
  std::printf(" **%ld** |\n", band);
  return flowrun_bad + band;
}

// One decode step of the 6.1 M LLaMA (dim 288, hidden 768, 6 layers, 6 kv heads, vocab 512) at
// M = 8 rows, as the PPO bench's generation runs it: x·Wᵀ through every Linear layer and the head,
// each with its own weights (24.5 MB a step, streamed from L3 or memory), against the same
// products all on one weight of each shape (0.9 MB at most: L2-resident). The ratio of the two
// says whether the small-M kernel or the weights' bandwidth bounds decoding. Median of 7.
static void decode_6m(const std::vector<lib>& libs) {
  struct shp {
    int O, I;
  };
  std::vector<shp> seq;
  for (int l = 0; l < 6; ++l)
    for (shp s : {shp{288, 288}, shp{288, 288}, shp{288, 288}, shp{288, 288}, shp{768, 288}, shp{768, 288},
                  shp{288, 768}})
      seq.push_back(s);
  seq.push_back({512, 288});
  std::vector<std::vector<float>> own;  // each call its own weight
  std::vector<std::vector<float>> one;  // one weight per shape
  double bytes = 0, flop = 0;
  const int M = 8;
  for (auto s : seq) own.emplace_back(size_t(s.O) * s.I, 0.02f), bytes += 4.0 * s.O * s.I, flop += 2.0 * M * s.O * s.I;
  auto shape_slot = [](shp s) { return s.O == 288 && s.I == 288 ? 0 : s.O == 768 ? 1 : s.I == 768 ? 2 : 3; };
  const shp slots[4] = {{288, 288}, {768, 288}, {288, 768}, {512, 288}};
  for (auto s : slots) one.emplace_back(size_t(s.O) * s.I, 0.02f);
  std::vector<float> x(size_t(M) * 768, 0.01f), y(size_t(M) * 768);
  std::printf("\n| decode step of the 6.1 M LLaMA at M = %d (%.1f MB of weights, %.0f MFLOP) | per-layer weights us "
              "(GB/s, GFLOP/s) | one weight per shape us (GFLOP/s) | ratio |\n|---|---|---|---|\n",
              M, bytes / 1e6, flop / 1e6);
  for (auto& l : libs) {
    auto run = [&](bool hot) {
      for (size_t i = 0; i < seq.size(); ++i) {
        const float* w = hot ? one[shape_slot(seq[i])].data() : own[i].data();
        l.f(false, true, M, seq[i].O, seq[i].I, 1.f, x.data(), seq[i].I, w, seq[i].I, 0.f, y.data(), seq[i].O);
      }
    };
    std::vector<double> cold, hot;
    run(false), run(true);
    for (int r = 0; r < 7; ++r)  // interleaved
      for (int h = 0; h < 2; ++h) {
        auto t = clk::now();
        run(h == 1);
        (h ? hot : cold).push_back(std::chrono::duration<double>(clk::now() - t).count());
      }
    std::sort(cold.begin(), cold.end()), std::sort(hot.begin(), hot.end());
    const double c = cold[3], h = hot[3];
    std::printf("| %s | %.0f (%.1f, %.0f) | %.0f (%.0f) | %.2fx |\n", l.name.c_str(), c * 1e6, bytes / c / 1e9,
                flop / c / 1e9, h * 1e6, flop / h / 1e9, c / h);
  }
}

// --small: microseconds per call of each library at the small models' shapes, then decode_6m.
static void small_shapes(const std::vector<lib>& libs) {
  struct prod {
    const char* what;
    bool ta, tb;
    int M, N, K, count;  // count: calls per training step (forward + backward of every layer)
  };
  // stories260K (dim 64, hidden 172, 5 layers, 8 heads of 8, 4 kv heads, vocab 512), B=8 T=64;
  // the attention products per (batch, head), as attention_forward_gemm / attention_backward_gemm
  const int R = 512;
  const std::vector<prod> ps = {
      {"260K wq/wo x·Wᵀ (512x64x64)", false, true, R, 64, 64, 10},
      {"260K wk/wv x·Wᵀ (512x32x64)", false, true, R, 32, 64, 10},
      {"260K w1/w3 x·Wᵀ (512x172x64)", false, true, R, 172, 64, 10},
      {"260K w2 x·Wᵀ (512x64x172)", false, true, R, 64, 172, 5},
      {"260K head x·Wᵀ (512x512x64)", false, true, R, 512, 64, 1},
      {"260K w1 dy·W (512x64x172)", false, false, R, 64, 172, 10},
      {"260K head dy·W (512x64x512)", false, false, R, 64, 512, 1},
      {"260K w1 dyᵀ·x (172x64x512)", true, false, 172, 64, R, 10},
      {"260K head dyᵀ·x (512x64x512)", true, false, 512, 64, R, 1},
      {"260K attn Q·Kᵀ (64x64x8)", false, true, 64, 64, 8, 320},
      {"260K attn P·V (64x8x64)", false, false, 64, 8, 64, 320},
      {"260K attn Pᵀ·dO (64x8x64)", true, false, 64, 8, 64, 320},
      {"6.1M wq x·Wᵀ (640x288x288)", false, true, 640, 288, 288, 24},
      {"6.1M wq dy·W (640x288x288)", false, false, 640, 288, 288, 24},
      {"6.1M wq dyᵀ·x (288x288x640)", true, false, 288, 288, 640, 24},
      {"6.1M w1/w3 x·Wᵀ (640x768x288)", false, true, 640, 768, 288, 12},
      {"6.1M w2 x·Wᵀ (640x288x768)", false, true, 640, 288, 768, 6},
      {"6.1M decode wq x·Wᵀ (8x288x288)", false, true, 8, 288, 288, 0},
      {"6.1M decode w1 x·Wᵀ (8x768x288)", false, true, 8, 768, 288, 0},
      {"260K decode scores q·Kᵀ (2x16x8)", false, true, 2, 16, 8, 0},
      {"GQA decode scores q·Kᵀ (4x16x128)", false, true, 4, 16, 128, 0},
  };
  std::printf("| product (M x N x K) | calls / step |");
  for (auto& l : libs) std::printf(" %s us |", l.name.c_str());
  std::printf(" others / flowrun |\n|---|---|");
  for (size_t i = 0; i <= libs.size(); ++i) std::printf("---|");
  std::printf("\n");
  std::vector<double> step(libs.size(), 0.0);
  for (auto& p : ps) {
    std::vector<float> a(size_t(p.M) * p.K), b(size_t(p.N) * p.K), c(size_t(p.M) * p.N);
    for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37 * i) * 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11 * i) * 0.2f;
    const int lda = p.ta ? p.M : p.K, ldb = p.tb ? p.K : p.N;
    std::vector<double> us(libs.size());
    for (size_t li = 0; li < libs.size(); ++li) {
      auto call = [&] { libs[li].f(p.ta, p.tb, p.M, p.N, p.K, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), p.N); };
      call();
      auto t = clk::now();
      int n = 0;
      while (std::chrono::duration<double>(clk::now() - t).count() < 0.02) call(), ++n;
      std::vector<double> ts;
      for (int r = 0; r < 7; ++r) {
        auto t0 = clk::now();
        for (int i = 0; i < n; ++i) call();
        ts.push_back(std::chrono::duration<double>(clk::now() - t0).count() / n);
      }
      std::sort(ts.begin(), ts.end());
      us[li] = ts[3] * 1e6;
      step[li] += us[li] * p.count;
    }
    std::printf("| %s | %d |", p.what, p.count);
    for (double u : us) std::printf(" %.2f |", u);
    for (size_t li = 1; li < libs.size(); ++li) std::printf(" %.2fx", us[li] / us[0]);
    std::printf(" |\n");
  }
  std::printf("| **these products, weighted by calls per step (ms)** | |");
  for (double s : step) std::printf(" **%.2f** |", s / 1e3);
  std::printf(" |\n");
  decode_6m(libs);
}

int main(int argc, char** argv) {
  int rows = 256, reps = 3;
  bool invariance = false, small = false;
  for (int i = 1; i < argc; ++i) {
    const bool valued = i + 1 < argc && std::atoi(argv[i + 1]) > 0;
    if (!std::strcmp(argv[i], "--row-invariance")) invariance = true;
    else if (!std::strcmp(argv[i], "--small")) small = true;
    else if (!std::strcmp(argv[i], "--rows") && valued) rows = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && valued) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && valued) ops::set_thread_budget(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_gemm [--rows N] [--reps R] [--threads N] | --row-invariance [--threads N] | "
                           "--small [--threads N]  (N, R positive)\n");
      return std::strcmp(argv[i], "--help") && std::strcmp(argv[i], "-h") ? 2 : 0;
    }
  }
  auto libs = libraries();
  if (invariance) {
    std::printf("# bench_gemm --row-invariance: %d OpenMP threads\n", omp_get_max_threads());
    return row_invariance(libs) == 0 ? 0 : 1;  // flowrun's own gemm: row-invariant on each side of 16 rows
  }
  if (small) {
    std::printf("# bench_gemm --small: %d OpenMP threads, us per call (median of 7)\n\n", omp_get_max_threads());
    small_shapes(libs);
    return 0;
  }
  std::printf("# bench_gemm: %d OpenMP threads, rows %d, best of %d (GFLOP/s)\n\n", omp_get_max_threads(), rows,
              reps);

  struct shp {
    const char* what;
    int O, I, count;
  };
  // GPT-2 124M training: per layer 4 (768x768) [q,k,v,o], fc (3072x768), proj (768x3072); LM head once
  const std::vector<shp> train = {{"attn 768x768", 768, 768, 48}, {"fc 3072x768", 3072, 768, 12},
                                  {"proj 768x3072", 768, 3072, 12}, {"head 50257x768", 50257, 768, 1}};
  std::vector<double> flops(libs.size()), secs(libs.size());
  std::printf("| shape (O x I) | product |");
  for (auto& l : libs) std::printf(" %s |", l.name.c_str());
  std::printf("\n|---|---|");
  for (size_t i = 0; i < libs.size(); ++i) std::printf("---|");
  std::printf("\n");
  std::vector<double> max_err(libs.size(), 0.0);
  for (auto s : train) {
    std::vector<float> x(size_t(rows) * s.I), w(size_t(s.O) * s.I), y(size_t(rows) * s.O), dx(size_t(rows) * s.I),
        dw(size_t(s.O) * s.I, 0.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * i) * 0.5f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11 * i) * 0.02f;
    for (size_t i = 0; i < y.size(); ++i) y[i] = std::sin(0.05 * i) * 0.1f;
    const char* names[3] = {"x·Wᵀ", "dy·W", "dyᵀ·x"};
    std::vector<float> ref;
    for (int p = 0; p < 3; ++p) {
      std::printf("| %s | %s |", s.what, names[p]);
      for (size_t li = 0; li < libs.size(); ++li) {
        auto& f = libs[li].f;
        std::vector<float> out(p == 0 ? y.size() : p == 1 ? dx.size() : dw.size());
        auto run = [&] {
          if (p == 0) f(false, true, rows, s.O, s.I, 1.f, x.data(), s.I, w.data(), s.I, 0.f, out.data(), s.O);
          if (p == 1) f(false, false, rows, s.I, s.O, 1.f, y.data(), s.O, w.data(), s.I, 0.f, out.data(), s.I);
          if (p == 2) f(true, false, s.O, s.I, rows, 1.f, y.data(), s.O, x.data(), s.I, 0.f, out.data(), s.I);
        };
        run();
        double best = 1e9;
        for (int r = 0; r < reps; ++r) {
          auto t = clk::now();
          run();
          best = std::min(best, std::chrono::duration<double>(clk::now() - t).count());
        }
        const double fl = 2.0 * rows * s.O * s.I;
        flops[li] += fl * s.count;
        secs[li] += best * s.count;
        std::printf(" %.0f |", fl / best / 1e9);
        if (li == 0) {
          ref = out;
        } else {
          double e = 0, m = 0;
          for (size_t i = 0; i < out.size(); ++i) e = std::max(e, double(std::fabs(out[i] - ref[i]))), m = std::max(m, double(std::fabs(ref[i])));
          max_err[li] = std::max(max_err[li], e / std::max(m, 1e-30));
        }
      }
      std::printf("\n");
    }
  }
  std::printf("| **one GPT-2 step, weighted** | |");
  for (size_t li = 0; li < libs.size(); ++li) std::printf(" **%.0f** |", flops[li] / secs[li] / 1e9);
  std::printf("\n| max rel. difference vs flowrun | |");
  for (size_t li = 0; li < libs.size(); ++li) std::printf(" %.1e |", max_err[li]);
  std::printf("\n\n");

  // decode: x·Wᵀ with few rows through every Linear of a stories15M-shaped model
  // (dim 288, hidden 768, 6 layers, vocab 32000): each layer has its own weights,
  // so they stream from memory as in decoding (61 MB per token).
  const std::vector<shp> dec = {{"288x288", 288, 288, 4}, {"768x288", 768, 288, 2}, {"288x768", 288, 768, 1}};
  std::vector<std::vector<float>> ws;
  std::vector<shp> seq;
  for (int l = 0; l < 6; ++l)
    for (auto s : dec)
      for (int c = 0; c < s.count; ++c) ws.emplace_back(size_t(s.O) * s.I, 0.02f), seq.push_back(s);
  ws.emplace_back(size_t(32000) * 288, 0.02f), seq.push_back({"32000x288", 32000, 288, 1});
  double wbytes = 0;
  for (auto& w : ws) wbytes += w.size() * 4.0;
  for (int M : {1, 16}) {
    std::printf("| decode M=%d: us per step through all stories15M Linear layers (%.0f MB of weights) |", M, wbytes / 1e6);
    std::vector<float> x(size_t(M) * 768, 0.01f), y(size_t(M) * 32000);
    for (size_t li = 0; li < libs.size(); ++li) {
      auto run = [&] {
        for (size_t i = 0; i < seq.size(); ++i)
          libs[li].f(false, true, M, seq[i].O, seq[i].I, 1.f, x.data(), seq[i].I, ws[i].data(), seq[i].I, 0.f, y.data(),
                     seq[i].O);
      };
      run();
      double best = 1e9;
      for (int r = 0; r < 3 * reps; ++r) {
        auto t = clk::now();
        run();
        best = std::min(best, std::chrono::duration<double>(clk::now() - t).count());
      }
      std::printf(" %s %.0f (%.1f GB/s) |", libs[li].name.c_str(), best * 1e6, wbytes / best / 1e9);
    }
    std::printf("\n");
  }
  return 0;
}
