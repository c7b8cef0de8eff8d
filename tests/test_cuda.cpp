// Tests of the CUDA backend (runtime/kernels/cuda): the caching allocator, the
// streams, and every backend op forward and backward against the CPU backend.
//
// Parity: each op runs on the CPU and on cuda:0 from identical random inputs
// (never all zeros; odd sizes such as B=3, T=7, C=37, V=101, GQA with H=6,
// KV=2, padding masks, ignore_index rows). Outputs that ops.h says are
// accumulated (dx +=, dw +=) start from identical random values on both sides;
// outputs that are overwritten start as NaN, so a missing write fails.
// Error measure (fp32): max over elements of |cuda - cpu| / max(|cpu|, rms(cpu), 1)
// with rms(cpu) the root mean square of the CPU result; it must be < 1e-5. That
// is the relative error of each element, floored at the typical magnitude of the
// tensor (an element that cancels to near zero still carries the rounding error
// of its terms, which are as large as the typical element: a K = 257 dot product
// of N(0, 1) values has |c| ~ 16 and absolute rounding differences ~1e-5) and at
// 1 (absolute error for tensors of small values such as probabilities). Both
// backends round differently (summation order, exp, FMA), which stays ~1e-6 at
// these sizes; a wrong index or formula gives O(1). Any NaN or Inf in either
// result fails. The bf16 matmul path is measured norm-wise
// (||cuda - cpu||_2 / ||cpu||_2 < 1e-2 against the fp32 CPU product) because
// bf16 rounds each input to 8 significant bits; it is also compared elementwise
// (< 1e-3) against the CPU product of the bf16-rounded inputs.
//
// Without a CUDA device (or without the driver) every case prints one line
// ("no CUDA device: CUDA parity skipped") and passes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/kernels/backend.h"
#include "runtime/kernels/cuda/cuda_api.h"
#include "runtime/kernels/ops.h"
#include "runtime/tensor/device_memory.h"

using namespace flowrun;

namespace {

const device k_gpu = device::cuda(0);
constexpr double k_tol = 1e-5;

/// True (after printing why) when this machine has no CUDA device.
bool no_gpu() {
  if (cuda_device_present()) return false;
  MESSAGE("no CUDA device: CUDA parity skipped (cudaGetDeviceCount found none)");
  return true;
}

std::mt19937_64& rng() {
  static std::mt19937_64 r(20261130);
  return r;
}

/// f32 CPU tensor of N(mean, stddev^2) values.
tensor randn(const shape_t& s, double stddev = 1.0, double mean = 0.0) {
  std::normal_distribution<double> nd(mean, stddev);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = static_cast<float>(nd(rng()));
  return tensor::from_floats(s, v);
}

/// i32 CPU tensor of uniform ints in [lo, hi].
tensor randint(const shape_t& s, int lo, int hi) {
  std::uniform_int_distribution<int> ud(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = ud(rng());
  return tensor::from_ints(s, v);
}

tensor nan_filled(const shape_t& s) {
  auto t = tensor::empty(s);
  t.fill_(std::numeric_limits<float>::quiet_NaN());
  return t;
}

/// A copy on cuda:0.
tensor gpu(const tensor& t) { return t.to(k_gpu); }

/// max |cuda - cpu| / max(|cpu|, rms(cpu), 1) over elements; NaN/Inf anywhere fails.
/// The largest error seen per check name over the whole run, printed when the program
/// ends ("parity: NAME max error E over N checks"), so a GPU run's log shows the margins.
struct worst_errors {
  std::map<std::string, std::pair<double, int>> by_name;
  ~worst_errors() {
    if (by_name.empty()) return;
    std::printf("CUDA vs CPU, the largest error per check (error = |cuda - cpu| / max(|cpu|, rms(cpu), 1)):\n");
    for (const auto& [name, e] : by_name)
      std::printf("  parity: %-40s max error %.3g over %d checks\n", name.c_str(), e.first, e.second);
  }
};
worst_errors g_worst;

void expect_close(const tensor& cpu, const tensor& cuda, const std::string& what, double tol = k_tol) {
  REQUIRE_MESSAGE(cuda.dev() == k_gpu, what << ": result is on " << cuda.dev().str());
  REQUIRE_MESSAGE(cpu.shape() == cuda.shape(), what << ": shapes " << cpu.str() << " vs " << cuda.str());
  const std::vector<float> a = cpu.to_floats(), b = cuda.to(device::cpu()).to_floats();
  double ss = 0.0;
  for (float x : a)
    if (std::isfinite(x)) ss += static_cast<double>(x) * x;
  const double scale_floor = std::max(1.0, a.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(a.size())));
  double worst = 0.0;
  size_t at = 0, nonfinite = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      if (nonfinite++ == 0) at = i;
      continue;
    }
    const double ref = std::fabs(static_cast<double>(a[i]));
    const double err = std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(scale_floor, ref);
    if (err > worst && nonfinite == 0) worst = err, at = i;
  }
  {
    // the check's name without its shape details ("attention T=40 KV=2 out" -> "attention out")
    std::string key, word;
    std::istringstream words(what);
    while (words >> word)
      if (word.find_first_of("=0123456789") == std::string::npos) key += (key.empty() ? "" : " ") + word;
    auto& w = g_worst.by_name[key];
    w.first = std::max(w.first, nonfinite ? INFINITY : worst);
    ++w.second;
  }
  CHECK_MESSAGE(nonfinite == 0, what << ": " << nonfinite << " NaN/Inf values, first at [" << at << "] cpu "
                                     << a[at] << " cuda " << b[at]);
  CHECK_MESSAGE(worst < tol, what << ": max error " << worst << " at [" << at << "] cpu "
                                  << (a.empty() ? 0.f : a[at]) << " cuda " << (b.empty() ? 0.f : b[at])
                                  << " (tolerance " << tol << ")");
}

/// ||cuda - cpu||_2 / ||cpu||_2 (NaN/Inf fail).
double normwise_error(const tensor& cpu, const tensor& cuda) {
  const std::vector<float> a = cpu.to_floats(), b = cuda.to(device::cpu()).to_floats();
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE_MESSAGE(std::isfinite(a[i]), "cpu NaN/Inf at " << i);
    REQUIRE_MESSAGE(std::isfinite(b[i]), "cuda NaN/Inf at " << i);
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

/// CPU tensor with every f32 value rounded to bf16 (and back).
tensor bf16_rounded(const tensor& t) {
  std::vector<float> v = t.to_floats();
  for (auto& x : v) x = bf16_to_float(float_to_bf16(x));
  return tensor::from_floats(t.shape(), v);
}

}  // namespace

// ====================================================================== runtime

TEST_CASE("cuda: backend registered, tensors round-trip") {
  if (no_gpu()) return;
  CHECK(std::string(backend_for(k_gpu).name()) == "cuda");
  CHECK(cuda::device_count() >= 1);
  auto x = randn({3, 7, 37});
  auto g = gpu(x);
  CHECK(g.dev() == k_gpu);
  CHECK(g.to(device::cpu()).to_floats() == x.to_floats());
  auto c = g.clone();  // device to device
  CHECK(c.to(device::cpu()).to_floats() == x.to_floats());
  auto z = tensor::zeros({1001}, dtype::f32, k_gpu);
  for (float v : z.to_floats()) REQUIRE(v == 0.0f);
  CHECK(g.item(5) == x.item(5));
  // to(dtype) on device memory is refused with a clear error (it converts on the host)
  CHECK_THROWS_AS(g.to(dtype::bf16), std::logic_error);
}

TEST_CASE("cuda: caching allocator reuses freed blocks, keeps stats, empties its cache") {
  if (no_gpu()) return;
  CHECK(cuda::round_size(1) == 512);
  CHECK(cuda::round_size(512) == 512);
  CHECK(cuda::round_size(513) == 1024);
  CHECK(cuda::round_size((1u << 20) - 1) == (1u << 20));
  CHECK(cuda::round_size(1u << 20) == (2u << 20));
  CHECK(cuda::round_size(3u << 20) == (4u << 20));

  cuda::empty_cache();
  const cuda::memory_stats s0 = cuda::get_memory_stats(0);
  CHECK(s0.reserved == s0.allocated);  // nothing cached after empty_cache
  { auto t = tensor::empty({1000}, dtype::f32, k_gpu); }  // 4000 B -> a 4096 B block, then cached
  const cuda::memory_stats s1 = cuda::get_memory_stats(0);
  CHECK(s1.cuda_malloc_calls == s0.cuda_malloc_calls + 1);
  CHECK(s1.allocated == s0.allocated);
  CHECK(s1.reserved == s0.reserved + 4096);
  CHECK(s1.peak_allocated >= s0.allocated + 4096);
  {
    auto t = tensor::empty({1000}, dtype::f32, k_gpu);  // same rounded size: served from the cache
    const cuda::memory_stats s2 = cuda::get_memory_stats(0);
    CHECK(s2.cuda_malloc_calls == s1.cuda_malloc_calls);
    CHECK(s2.cache_hits == s1.cache_hits + 1);
    CHECK(s2.allocated == s0.allocated + 4096);
    CHECK(s2.reserved == s1.reserved);
    auto u = tensor::empty({990}, dtype::f32, k_gpu);  // 3960 B rounds to 4096 too, but that block is in use
    CHECK(cuda::get_memory_stats(0).cuda_malloc_calls == s1.cuda_malloc_calls + 1);
  }
  {
    auto big = tensor::empty({3 << 18}, dtype::f32, k_gpu);  // 3 MiB -> 4 MiB block
    const cuda::memory_stats s3 = cuda::get_memory_stats(0);
    CHECK(s3.allocated == s0.allocated + (4u << 20));
    cuda::reset_peak_memory(0);
    CHECK(cuda::get_memory_stats(0).peak_allocated == s3.allocated);
  }
  cuda::empty_cache();
  const cuda::memory_stats s4 = cuda::get_memory_stats(0);
  CHECK(s4.reserved == s4.allocated);
  CHECK(s4.allocated == s0.allocated);
  CHECK(s4.cuda_free_calls >= s0.cuda_free_calls + 3);

  // out of memory: retried after emptying the cache, then std::bad_alloc naming the sizes
  { auto t = tensor::empty({1000}, dtype::f32, k_gpu); }  // something cached to release
  const int64_t huge = int64_t{1} << 48;                  // 1 PiB of floats
  bool thrown = false;
  try {
    auto t = tensor::empty({huge}, dtype::f32, k_gpu);
  } catch (const std::bad_alloc& e) {
    thrown = true;
    const std::string msg = e.what();
    CHECK_MESSAGE(msg.find(std::to_string(huge * 4)) != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("bytes free") != std::string::npos, msg);
  }
  CHECK(thrown);
  const cuda::memory_stats s5 = cuda::get_memory_stats(0);
  CHECK(s5.oom_retries >= s4.oom_retries + 1);
  CHECK(s5.reserved == s5.allocated);  // the retry emptied the cache
  // and the device still works
  auto x = randn({333});
  auto g = gpu(x);
  ops::scale(g, 2.0f);
  ops::scale(x, 2.0f);
  expect_close(x, g, "scale after OOM");
}

TEST_CASE("cuda: to(cpu) right after kernels sees their results") {
  if (no_gpu()) return;
  const int64_t n = (int64_t{1} << 22) + 3;  // long enough that the kernels are still running when the copy is asked
  auto g = tensor::empty({n}, dtype::f32, k_gpu);
  ops::fill(g, 1.5f);
  ops::scale(g, 2.0f);
  auto h = tensor::empty({n}, dtype::f32, k_gpu);
  ops::fill(h, 0.25f);
  ops::axpy(g, h, 4.0f);  // 3 + 1 = 4
  const std::vector<float> v = g.to(device::cpu()).to_floats();
  size_t bad = 0;
  for (float x : v) bad += x != 4.0f;
  CHECK(bad == 0);
  CHECK(g.item(n - 1) == 4.0f);
  auto c = g.clone();  // device to device, ordered on the stream
  ops::scale(c, 0.5f);
  CHECK(c.item(7) == 2.0f);
  g.zero_();
  CHECK(g.item(n / 2) == 0.0f);
}

TEST_CASE("cuda: another thread gets its own cuBLAS handle and shares the default stream") {
  if (no_gpu()) return;
  void* s_main = cuda::current_stream(0);
  CHECK(s_main != nullptr);
  auto a = randn({19, 23}), b = randn({23, 29});
  auto want = nan_filled({19, 29});
  ops::matmul(want, a, b, false, false);
  tensor got;
  void* s_thread = nullptr;
  std::thread t([&] {
    s_thread = cuda::current_stream(0);
    auto ag = gpu(a), bg = gpu(b);
    got = gpu(nan_filled({19, 29}));
    ops::matmul(got, ag, bg, false, false);
    cuda::synchronize(0);
  });
  t.join();
  CHECK(s_thread == s_main);  // the default stream of a device is shared
  expect_close(want, got, "matmul from another thread");
  cuda::set_current_stream(0, nullptr);  // back to the default: a no-op here
  CHECK(cuda::current_stream(0) == s_main);
}

// ====================================================================== basics

TEST_CASE("cuda parity: add / axpy / scale / fill, in place") {
  if (no_gpu()) return;
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{3 * 7 * 37}, int64_t{1 << 20} + 7}) {
    CAPTURE(n);
    auto a = randn({n}), b = randn({n});
    auto ag = gpu(a), bg = gpu(b);
    auto o = nan_filled({n});
    auto og = gpu(o);
    ops::add(o, a, b);
    ops::add(og, ag, bg);
    expect_close(o, og, "add");
    ops::add(a, a, b);  // in place
    ops::add(ag, ag, bg);
    expect_close(a, ag, "add in place");
    ops::axpy(a, b, -0.75f);
    ops::axpy(ag, bg, -0.75f);
    expect_close(a, ag, "axpy");
    ops::scale(a, 1.25f);
    ops::scale(ag, 1.25f);
    expect_close(a, ag, "scale");
    ops::fill(b, 3.25f);
    ops::fill(bg, 3.25f);
    expect_close(b, bg, "fill");
  }
}

// ====================================================================== matmul

namespace {
/// out = alpha op(a) op(b) + beta out for op(a) (M, K), op(b) (K, N).
void matmul_case(int64_t M, int64_t N, int64_t K, bool ta, bool tb, float alpha, float beta) {
  auto a = ta ? randn({K, M}) : randn({M, K});
  auto b = tb ? randn({N, K}) : randn({K, N});
  auto out = beta == 0.0f ? nan_filled({M, N}) : randn({M, N});
  auto ag = gpu(a), bg = gpu(b), og = gpu(out);
  ops::matmul(out, a, b, ta, tb, alpha, beta);
  ops::matmul(og, ag, bg, ta, tb, alpha, beta);
  std::ostringstream w;
  w << "matmul M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb << " alpha=" << alpha
    << " beta=" << beta;
  expect_close(out, og, w.str());
}
}  // namespace

TEST_CASE("cuda parity: matmul, all transposes, alpha/beta, beta 0 over NaN, K 0, flattened dims") {
  if (no_gpu()) return;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      matmul_case(21, 37, 101, ta, tb, 1.0f, 0.0f);
      matmul_case(3, 7, 37, ta, tb, 0.5f, 1.0f);
      matmul_case(1, 101, 64, ta, tb, 1.0f, -0.5f);
      matmul_case(130, 67, 257, ta, tb, 1.0f, 0.0f);
    }
  matmul_case(5, 6, 7, false, true, 0.0f, 0.5f);  // alpha 0: out = beta out
  matmul_case(5, 6, 7, false, false, 0.0f, 0.0f);  // alpha 0, beta 0 over NaN: zeros
  {  // K = 0
    auto a = tensor::empty({4, 0}), b = tensor::empty({0, 5});
    auto out = randn({4, 5});
    auto og = gpu(out);
    ops::matmul(out, a, b, false, false, 1.0f, 2.0f);
    ops::matmul(og, gpu(a), gpu(b), false, false, 1.0f, 2.0f);
    expect_close(out, og, "matmul K=0");
  }
  {  // flattened leading dims: dW (C, C2) = x^T (B T, C)^T dy (B T, C2), and x (B, T, C) @ w
    auto x = randn({3, 7, 37}), dy = randn({3, 7, 29});
    auto dw = nan_filled({37, 29});
    auto dwg = gpu(dw);
    ops::matmul(dw, x, dy, true, false);
    ops::matmul(dwg, gpu(x), gpu(dy), true, false);
    expect_close(dw, dwg, "matmul flattened dW");
  }
}

TEST_CASE("cuda parity: matmul_batched, all transposes, alpha/beta") {
  if (no_gpu()) return;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 0.75f}) {
        const int64_t Bt = 18, M = 7, N = 9, K = 37;
        auto a = ta ? randn({Bt, K, M}) : randn({Bt, M, K});
        auto b = tb ? randn({Bt, N, K}) : randn({Bt, K, N});
        auto out = beta == 0.0f ? nan_filled({Bt, M, N}) : randn({Bt, M, N});
        auto og = gpu(out);
        ops::matmul_batched(out, a, b, ta, tb, 1.5f, beta);
        ops::matmul_batched(og, gpu(a), gpu(b), ta, tb, 1.5f, beta);
        expect_close(out, og, "matmul_batched ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                  " beta=" + std::to_string(beta));
      }
}

TEST_CASE("cuda parity: linear forward/backward with and without bias, frozen weight") {
  if (no_gpu()) return;
  const int64_t B = 3, T = 7, IC = 37, OC = 29;
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    auto x = randn({B, T, IC}), w = randn({OC, IC}, 0.2), bias = with_bias ? randn({OC}) : tensor();
    auto out = nan_filled({B, T, OC});
    auto xg = gpu(x), wg = gpu(w), bg = with_bias ? gpu(bias) : tensor(), og = gpu(out);
    ops::linear_forward(out, x, w, bias);
    ops::linear_forward(og, xg, wg, bg);
    expect_close(out, og, "linear_forward");

    auto dout = randn({B, T, OC});
    auto dx = randn({B, T, IC}), dw = randn({OC, IC}), db = with_bias ? randn({OC}) : tensor();  // accumulated
    auto doutg = gpu(dout), dxg = gpu(dx), dwg = gpu(dw), dbg = with_bias ? gpu(db) : tensor();
    ops::linear_backward(dx, dw, db, dout, x, w);
    ops::linear_backward(dxg, dwg, dbg, doutg, xg, wg);
    expect_close(dx, dxg, "linear dx +=");
    expect_close(dw, dwg, "linear dw +=");
    if (with_bias) expect_close(db, dbg, "linear dbias +=");

    tensor none;  // frozen weight: dw undefined
    ops::linear_backward(dx, none, db, dout, x, w);
    ops::linear_backward(dxg, none, dbg, doutg, xg, wg);
    expect_close(dx, dxg, "linear dx += (frozen w)");
  }
  {  // bias_backward over many rows (several column-sum splits)
    auto dout = randn({1000, 37}), db = randn({37});
    auto dbg = gpu(db);
    auto x = randn({1000, 5}), w = randn({37, 5});
    tensor none;
    ops::linear_backward(none, none, db, dout, x, w);
    ops::linear_backward(none, none, dbg, gpu(dout), gpu(x), gpu(w));
    expect_close(db, dbg, "bias_backward, 1000 rows");
  }
}

TEST_CASE("cuda parity: bf16 matmul precision (cuBLAS bf16 inputs, fp32 accumulation)") {
  if (no_gpu()) return;
  CHECK(ops::get_matmul_precision() == ops::matmul_precision::f32);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const int64_t M = 67, N = 101, K = 130;
      auto a = ta ? randn({K, M}) : randn({M, K});
      auto b = tb ? randn({N, K}) : randn({K, N});
      auto c0 = randn({M, N});
      auto ref = c0.clone(), ref16 = c0.clone(), cpu_under_bf16 = c0.clone();
      auto og = gpu(c0);
      ops::matmul(ref, a, b, ta, tb, 1.0f, 0.5f);
      ops::matmul(ref16, bf16_rounded(a), bf16_rounded(b), ta, tb, 1.0f, 0.5f);
      {
        ops::matmul_precision_scope scope(ops::matmul_precision::bf16);
        CHECK(ops::get_matmul_precision() == ops::matmul_precision::bf16);
        ops::matmul(og, gpu(a), gpu(b), ta, tb, 1.0f, 0.5f);
        ops::matmul(cpu_under_bf16, a, b, ta, tb, 1.0f, 0.5f);  // bf16 too where the CPU has bf16, else fp32
      }
      CHECK(ops::get_matmul_precision() == ops::matmul_precision::f32);
      if (ops::cpu_bf16_matmul())
        CHECK_MESSAGE(normwise_error(ref16, cpu_under_bf16) < 1e-6, "the CPU's bf16 matmul against its fp32 one on "
                                                                   "bf16-rounded inputs");
      else
        CHECK(cpu_under_bf16.to_floats() == ref.to_floats());
      const double e = normwise_error(ref, og);
      CHECK_MESSAGE(e < 1e-2, "bf16 matmul norm-wise error vs fp32 " << e);
      CHECK_MESSAGE(e > 1e-6, "bf16 matmul looks like fp32 (error " << e << "): inputs not rounded?");
      expect_close(ref16, og, "bf16 matmul vs CPU on bf16-rounded inputs", 1e-3);
    }
  {  // batched and linear under bf16
    ops::matmul_precision_scope scope(ops::matmul_precision::bf16);
    auto a = randn({6, 7, 37}), b = randn({6, 37, 9});
    auto out = nan_filled({6, 7, 9});
    auto og = gpu(out);
    ops::matmul_batched(out, a, b, false, false);
    ops::matmul_batched(og, gpu(a), gpu(b), false, false);
    CHECK(normwise_error(out, og) < 1e-2);
    auto x = randn({3, 7, 37}), w = randn({29, 37}), bias = randn({29});
    auto lo = nan_filled({3, 7, 29});
    auto log_ = gpu(lo);
    ops::linear_forward(lo, x, w, bias);
    ops::linear_forward(log_, gpu(x), gpu(w), gpu(bias));
    CHECK(normwise_error(lo, log_) < 1e-2);
  }
  // the setting is per thread
  ops::set_matmul_precision(ops::matmul_precision::bf16);
  ops::matmul_precision other = ops::matmul_precision::bf16;
  std::thread t([&] { other = ops::get_matmul_precision(); });
  t.join();
  ops::set_matmul_precision(ops::matmul_precision::f32);
  CHECK(other == ops::matmul_precision::f32);
}

// ====================================================================== embedding

TEST_CASE("cuda parity: embedding forward/backward, repeated and negative ids, errors") {
  if (no_gpu()) return;
  const int64_t B = 3, T = 7, V = 101, C = 37;
  auto wte = randn({V, C});
  auto ids = randint({B, T}, 0, V - 1);
  ids.data<int32_t>()[3] = ids.data<int32_t>()[4];  // a repeated id
  auto out = nan_filled({B, T, C});
  auto wg = gpu(wte), idg = gpu(ids), og = gpu(out);
  ops::embedding_forward(out, ids, wte);
  ops::embedding_forward(og, idg, wg);
  expect_close(out, og, "embedding_forward");

  auto ids_b = ids.clone();
  ids_b.data<int32_t>()[5] = -1;  // skipped by backward
  auto dout = randn({B, T, C}), dwte = randn({V, C});
  auto dwg = gpu(dwte);
  ops::embedding_backward(dwte, dout, ids_b);
  ops::embedding_backward(dwg, gpu(dout), gpu(ids_b));
  expect_close(dwte, dwg, "embedding_backward +=");

  {  // many rows hitting few ids (atomics)
    auto ids2 = randint({4000}, 0, 4);
    auto d2 = randn({4000, C}), dw2 = randn({V, C});
    auto dw2g = gpu(dw2);
    ops::embedding_backward(dw2, d2, ids2);
    ops::embedding_backward(dw2g, gpu(d2), gpu(ids2));
    expect_close(dw2, dw2g, "embedding_backward, 4000 rows on 5 ids");
  }

  auto bad = ids.clone();
  bad.data<int32_t>()[6] = static_cast<int32_t>(V);
  CHECK_THROWS_WITH_AS(ops::embedding_forward(og, gpu(bad), wg), doctest::Contains("token id 101 at position 6"),
                       std::out_of_range);
  CHECK_THROWS_WITH_AS(ops::embedding_backward(dwg, gpu(dout), gpu(bad)),
                       doctest::Contains("token id 101 at position 6"), std::out_of_range);
  bad.data<int32_t>()[6] = -3;
  CHECK_THROWS_AS(ops::embedding_forward(og, gpu(bad), wg), std::out_of_range);
}

// ====================================================================== norms

TEST_CASE("cuda parity: rmsnorm forward/backward") {
  if (no_gpu()) return;
  struct dims { int64_t N, C; };
  for (dims d : {dims{21, 37}, dims{3, 1000}, dims{300, 64}, dims{1, 1}}) {
    CAPTURE(d.N);
    CAPTURE(d.C);
    auto x = randn({d.N, d.C}, 1.5, 0.3), w = randn({d.C}, 0.5, 1.0);
    auto out = nan_filled({d.N, d.C}), rstd = nan_filled({d.N});
    auto xg = gpu(x), wg = gpu(w), og = gpu(out), rg = gpu(rstd);
    ops::rmsnorm_forward(out, rstd, x, w, 1e-5f);
    ops::rmsnorm_forward(og, rg, xg, wg, 1e-5f);
    expect_close(out, og, "rmsnorm out");
    expect_close(rstd, rg, "rmsnorm rstd");

    auto dout = randn({d.N, d.C}), dx = randn({d.N, d.C}), dw = randn({d.C});
    auto dxg = gpu(dx), dwg = gpu(dw);
    ops::rmsnorm_backward(dx, dw, dout, x, w, rstd);
    ops::rmsnorm_backward(dxg, dwg, gpu(dout), xg, wg, gpu(rstd));
    expect_close(dx, dxg, "rmsnorm dx +=");
    expect_close(dw, dwg, "rmsnorm dw +=");
  }
  {  // leading dims (B, T, C), in place
    auto x = randn({3, 7, 37}), w = randn({37});
    auto rstd = nan_filled({21});
    auto xg = gpu(x), rg = gpu(rstd);
    ops::rmsnorm_forward(x, rstd, x, w, 1e-6f);
    ops::rmsnorm_forward(xg, rg, xg, gpu(w), 1e-6f);
    expect_close(x, xg, "rmsnorm in place (B, T, C)");
  }
}

TEST_CASE("cuda parity: layernorm forward/backward with and without bias") {
  if (no_gpu()) return;
  struct dims { int64_t N, C; };
  for (bool with_bias : {true, false})
    for (dims d : {dims{21, 37}, dims{3, 1000}, dims{300, 64}}) {
      CAPTURE(with_bias);
      CAPTURE(d.N);
      CAPTURE(d.C);
      auto x = randn({d.N, d.C}, 2.0, 0.7), w = randn({d.C}, 0.5, 1.0), b = with_bias ? randn({d.C}) : tensor();
      auto out = nan_filled({d.N, d.C}), mean = nan_filled({d.N}), rstd = nan_filled({d.N});
      auto xg = gpu(x), wg = gpu(w), bg = with_bias ? gpu(b) : tensor();
      auto og = gpu(out), mg = gpu(mean), rg = gpu(rstd);
      ops::layernorm_forward(out, mean, rstd, x, w, b, 1e-5f);
      ops::layernorm_forward(og, mg, rg, xg, wg, bg, 1e-5f);
      expect_close(out, og, "layernorm out");
      expect_close(mean, mg, "layernorm mean");
      expect_close(rstd, rg, "layernorm rstd");

      auto dout = randn({d.N, d.C}), dx = randn({d.N, d.C}), dw = randn({d.C}), db = with_bias ? randn({d.C}) : tensor();
      auto dxg = gpu(dx), dwg = gpu(dw), dbg = with_bias ? gpu(db) : tensor();
      ops::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
      ops::layernorm_backward(dxg, dwg, dbg, gpu(dout), xg, wg, gpu(mean), gpu(rstd));
      expect_close(dx, dxg, "layernorm dx +=");
      expect_close(dw, dwg, "layernorm dw +=");
      if (with_bias) expect_close(db, dbg, "layernorm db +=");
    }
}

// ====================================================================== activations

TEST_CASE("cuda parity: activations silu / gelu_tanh / relu forward and backward") {
  if (no_gpu()) return;
  for (auto a : {ops::activation::silu, ops::activation::gelu_tanh, ops::activation::relu}) {
    CAPTURE(ops::activation_name(a));
    auto x = randn({3, 7, 37}, 3.0);
    auto out = nan_filled(x.shape());
    auto xg = gpu(x), og = gpu(out);
    ops::activation_forward(out, x, a);
    ops::activation_forward(og, xg, a);
    expect_close(out, og, std::string(ops::activation_name(a)) + " forward");
    auto dout = randn(x.shape()), dx = nan_filled(x.shape());
    auto dxg = gpu(dx);
    ops::activation_backward(dx, dout, x, a);
    ops::activation_backward(dxg, gpu(dout), xg, a);
    expect_close(dx, dxg, std::string(ops::activation_name(a)) + " backward");
    ops::activation_forward(x, x, a);  // in place
    ops::activation_forward(xg, xg, a);
    expect_close(x, xg, std::string(ops::activation_name(a)) + " forward in place");
  }
}

TEST_CASE("cuda parity: swiglu forward/backward") {
  if (no_gpu()) return;
  auto g = randn({3, 7, 101}, 2.0), u = randn({3, 7, 101});
  auto out = nan_filled(g.shape());
  auto gg = gpu(g), ug = gpu(u), og = gpu(out);
  ops::swiglu_forward(out, g, u);
  ops::swiglu_forward(og, gg, ug);
  expect_close(out, og, "swiglu forward");
  auto dout = randn(g.shape()), dgate = nan_filled(g.shape()), dup = nan_filled(g.shape());
  auto dgg = gpu(dgate), dug = gpu(dup);
  ops::swiglu_backward(dgate, dup, dout, g, u);
  ops::swiglu_backward(dgg, dug, gpu(dout), gg, ug);
  expect_close(dgate, dgg, "swiglu dgate");
  expect_close(dup, dug, "swiglu dup");
}

// ====================================================================== RoPE

TEST_CASE("cuda parity: rope forward/backward, both layouts, left-padded positions") {
  if (no_gpu()) return;
  const int64_t B = 3, T = 7, NH = 6, hs = 12;
  auto pos = randint({B, T}, 0, 4000);
  for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = static_cast<int32_t>(t);  // batch 0: 0..T-1
  for (auto layout : {ops::rope_layout::adjacent, ops::rope_layout::half}) {
    for (float theta : {10000.0f, 500000.0f}) {
      CAPTURE(static_cast<int>(layout));
      CAPTURE(theta);
      auto x = randn({B, T, NH, hs});
      auto xg = gpu(x), pg = gpu(pos);
      ops::rope_forward(x, pos, theta, layout);
      ops::rope_forward(xg, pg, theta, layout);
      expect_close(x, xg, "rope forward");
      ops::rope_backward(x, pos, theta, layout);
      ops::rope_backward(xg, pg, theta, layout);
      expect_close(x, xg, "rope backward");
    }
  }
  {  // head size 640 (> the frequency table: computed on the device)
    auto x = randn({1, 3, 2, 640});
    auto p = randint({1, 3}, 0, 20);
    auto xg = gpu(x);
    ops::rope_forward(x, p, 10000.0f, ops::rope_layout::half);
    ops::rope_forward(xg, gpu(p), 10000.0f, ops::rope_layout::half);
    expect_close(x, xg, "rope forward hs=640", 2e-5);
  }
}

// ====================================================================== attention

namespace {
struct attn_inputs {
  tensor q, k, v, mask;
};
attn_inputs make_attn(int64_t B, int64_t Tq, int64_t H, int64_t hs, int64_t S, int64_t KV) {
  return {randn({B, Tq, H, hs}), randn({B, S, KV, hs}), randn({B, S, KV, hs}), tensor()};
}

void attention_forward_case(const attn_inputs& c, int64_t n_keys, const std::string& what) {
  const int64_t B = c.q.size(0), Tq = c.q.size(1), H = c.q.size(2), hs = c.q.size(3);
  const int64_t nk = n_keys < 0 ? c.k.size(1) : n_keys;
  auto out = nan_filled({B, Tq, H, hs}), att = nan_filled({B, H, Tq, nk});
  auto og = gpu(out), ag = gpu(att);
  auto qg = gpu(c.q), kg = gpu(c.k), vg = gpu(c.v), mg = c.mask.defined() ? gpu(c.mask) : tensor();
  ops::attention_forward(out, att, c.q, c.k, c.v, c.mask, n_keys);
  ops::attention_forward(og, ag, qg, kg, vg, mg, n_keys);
  expect_close(out, og, what + " out");
  expect_close(att, ag, what + " att");
  tensor none;  // inference: no att
  auto og2 = gpu(nan_filled({B, Tq, H, hs}));
  ops::attention_forward(og2, none, qg, kg, vg, mg, n_keys);
  expect_close(out, og2, what + " out without att");
}
}  // namespace

TEST_CASE("cuda parity: attention forward, MHA and GQA, short and long (CPU GEMM path)") {
  if (no_gpu()) return;
  for (int64_t T : {7, 40})
    for (int64_t KV : {6, 2, 1})
      for (int64_t hs : {12, 64}) {
        CAPTURE(T);
        CAPTURE(KV);
        CAPTURE(hs);
        auto c = make_attn(3, T, 6, hs, T, KV);
        attention_forward_case(c, -1, "attention T=" + std::to_string(T) + " KV=" + std::to_string(KV));
      }
}

TEST_CASE("cuda parity: attention forward with padding masks and fully masked rows") {
  if (no_gpu()) return;
  for (int64_t T : {7, 40}) {
    CAPTURE(T);
    auto c = make_attn(3, T, 6, 12, T, 2);
    std::vector<int32_t> m(static_cast<size_t>(3 * T), 1);
    m[0] = m[1] = m[2] = 0;              // batch 0: left padding (queries 0..2 see no key)
    m[T + T - 1] = m[T + T - 2] = 0;     // batch 1: right padding
    m[2 * T + 3] = 0;                    // batch 2: a hole
    c.mask = tensor::from_ints({3, T}, m);
    attention_forward_case(c, -1, "masked attention T=" + std::to_string(T));
  }
}

TEST_CASE("cuda parity: attention forward, decode (Tq < n_keys) and n_keys < S with masks") {
  if (no_gpu()) return;
  const int64_t B = 3, S = 11, H = 6, KV = 2, hs = 12;
  for (int64_t n_keys : {int64_t{11}, int64_t{8}})
    for (int64_t Tq : {int64_t{1}, int64_t{3}, n_keys}) {
      CAPTURE(n_keys);
      CAPTURE(Tq);
      auto c = make_attn(B, Tq, H, hs, S, KV);
      attention_forward_case(c, n_keys, "decode, no mask");
      std::vector<int32_t> m(static_cast<size_t>(B * S), 1);
      m[0] = m[1] = 0;
      m[S + 4] = 0;
      c.mask = tensor::from_ints({B, S}, m);
      attention_forward_case(c, n_keys, "decode, mask (B, S)");
      std::vector<int32_t> m2(static_cast<size_t>(B * n_keys), 1);
      m2[0] = m2[n_keys + 1] = 0;
      c.mask = tensor::from_ints({B, n_keys}, m2);
      attention_forward_case(c, n_keys, "decode, mask (B, n_keys)");
    }
}

TEST_CASE("cuda parity: attention backward, GQA, padding, short and long") {
  if (no_gpu()) return;
  for (int64_t T : {7, 40})
    for (int64_t KV : {6, 2})
      for (bool masked : {false, true}) {
        CAPTURE(T);
        CAPTURE(KV);
        CAPTURE(masked);
        const int64_t B = 3, H = 6, hs = 12;
        auto c = make_attn(B, T, H, hs, T, KV);
        if (masked) {
          std::vector<int32_t> m(static_cast<size_t>(B * T), 1);
          m[0] = m[1] = 0;
          m[2 * T - 1] = 0;
          c.mask = tensor::from_ints({B, T}, m);
        }
        auto out = tensor::empty({B, T, H, hs}), att = tensor::empty({B, H, T, T});
        ops::attention_forward(out, att, c.q, c.k, c.v, c.mask);  // the same att on both sides
        auto dout = randn({B, T, H, hs});
        auto dq = nan_filled(c.q.shape()), dk = nan_filled(c.k.shape()), dv = nan_filled(c.v.shape());
        auto dqg = gpu(dq), dkg = gpu(dk), dvg = gpu(dv);
        ops::attention_backward(dq, dk, dv, dout, c.q, c.k, c.v, att);
        ops::attention_backward(dqg, dkg, dvg, gpu(dout), gpu(c.q), gpu(c.k), gpu(c.v), gpu(att));
        expect_close(dq, dqg, "attention dq");
        expect_close(dk, dkg, "attention dk");
        expect_close(dv, dvg, "attention dv");
      }
}

// ====================================================================== softmax, losses

TEST_CASE("cuda parity: softmax and log_softmax forward/backward, in place") {
  if (no_gpu()) return;
  for (bool log : {false, true})
    for (int64_t V : {int64_t{101}, int64_t{5000}}) {
      CAPTURE(log);
      CAPTURE(V);
      auto x = randn({3, 7, V}, 3.0);
      auto out = nan_filled(x.shape());
      auto xg = gpu(x), og = gpu(out);
      if (log) {
        ops::log_softmax_forward(out, x);
        ops::log_softmax_forward(og, xg);
      } else {
        ops::softmax_forward(out, x);
        ops::softmax_forward(og, xg);
      }
      expect_close(out, og, "softmax forward");
      auto dout = randn(x.shape()), dx = nan_filled(x.shape());
      auto dxg = gpu(dx);
      if (log) {
        ops::log_softmax_backward(dx, dout, out);
        ops::log_softmax_backward(dxg, gpu(dout), og);
      } else {
        ops::softmax_backward(dx, dout, out);
        ops::softmax_backward(dxg, gpu(dout), og);
      }
      expect_close(dx, dxg, "softmax backward");
      if (log) {  // in place
        ops::log_softmax_forward(x, x);
        ops::log_softmax_forward(xg, xg);
      } else {
        ops::softmax_forward(x, x);
        ops::softmax_forward(xg, xg);
      }
      expect_close(x, xg, "softmax forward in place");
    }
}

TEST_CASE("cuda parity: cross_entropy forward/backward with ignore_index, in place, errors") {
  if (no_gpu()) return;
  for (int64_t V : {int64_t{101}, int64_t{32000}}) {
    CAPTURE(V);
    const int64_t B = 3, T = 7, N = B * T;
    auto logits = randn({B, T, V}, 2.0);
    auto targets = randint({N}, 0, static_cast<int>(V - 1));
    targets.data<int32_t>()[2] = -100;
    targets.data<int32_t>()[11] = -100;
    auto losses = nan_filled({N});
    auto lg = gpu(logits), tg = gpu(targets), lossg = gpu(losses);
    int64_t nv = -1, nvg = -1;
    const double mean = ops::cross_entropy_forward(losses, logits, targets, &nv);
    const double meang = ops::cross_entropy_forward(lossg, lg, tg, &nvg);
    CHECK(nv == N - 2);
    CHECK(nvg == nv);
    CHECK(std::fabs(mean - meang) <= 1e-6 * std::max(1.0, std::fabs(mean)));
    expect_close(losses, lossg, "cross_entropy losses");

    const float dloss = 1.0f / static_cast<float>(nv);
    auto dl = nan_filled(logits.shape());
    auto dlg = gpu(dl);
    ops::cross_entropy_backward(dl, logits, targets, dloss);
    ops::cross_entropy_backward(dlg, lg, tg, dloss);
    expect_close(dl, dlg, "cross_entropy dlogits");
    ops::cross_entropy_backward(logits, logits, targets, dloss);  // in place
    ops::cross_entropy_backward(lg, lg, tg, dloss);
    expect_close(logits, lg, "cross_entropy dlogits in place");
  }
  {  // a custom ignore_index, all rows ignored
    auto logits = randn({4, 9}), targets = tensor::from_ints({4}, {-1, -1, -1, -1});
    auto lossg = gpu(nan_filled({4}));
    int64_t nv = -1;
    CHECK(ops::cross_entropy_forward(lossg, gpu(logits), gpu(targets), &nv, -1) == 0.0);
    CHECK(nv == 0);
    for (float x : lossg.to_floats()) CHECK(x == 0.0f);
  }
  auto logits = gpu(randn({4, 9})), losses = gpu(randn({4}));
  auto bad = gpu(tensor::from_ints({4}, {1, 2, 9, 3}));
  CHECK_THROWS_WITH_AS(ops::cross_entropy_forward(losses, logits, bad), doctest::Contains("target 9 at row 2"),
                       std::out_of_range);
  CHECK_THROWS_WITH_AS(ops::cross_entropy_backward(logits, logits, bad, 1.0f), doctest::Contains("target 9 at row 2"),
                       std::out_of_range);
}

// ====================================================================== optimizer

TEST_CASE("cuda parity: adamw_step, 3 steps with weight decay") {
  if (no_gpu()) return;
  const int64_t n = 3 * 7 * 37 + 1001;
  auto p = randn({n}), m = randn({n}, 0.1), v = randn({n}, 0.1);
  {  // v must be >= 0
    float* vp = v.data<float>();
    for (int64_t i = 0; i < n; ++i) vp[i] = std::fabs(vp[i]);
  }
  auto pg = gpu(p), mg = gpu(m), vg = gpu(v);
  ops::adamw_config cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.1f;
  for (int64_t t = 1; t <= 3; ++t) {
    auto g = randn({n});
    auto gg = gpu(g);
    ops::adamw_step(p, g, m, v, t, cfg);
    ops::adamw_step(pg, gg, mg, vg, t, cfg);
  }
  expect_close(p, pg, "adamw param");
  expect_close(m, mg, "adamw m");
  expect_close(v, vg, "adamw v");
}

TEST_CASE("cuda parity: sum_squares, global_norm, clip_grad_norm") {
  if (no_gpu()) return;
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{3 * 7 * 101}, int64_t{(1 << 22) + 5}}) {
    CAPTURE(n);
    auto x = randn({n}, 1.0, 0.5);
    const double a = ops::sum_squares(x), b = ops::sum_squares(gpu(x));
    CHECK(std::fabs(a - b) <= 1e-10 * a);
  }
  std::vector<tensor> gs = {randn({37}), tensor(), randn({3, 7, 101})};
  std::vector<tensor> gg = {gpu(gs[0]), tensor(), gpu(gs[2])};
  const double na = ops::global_norm(gs), nb = ops::global_norm(gg);
  CHECK(std::fabs(na - nb) <= 1e-10 * na);
  const double ca = ops::clip_grad_norm(gs, 1.0), cb = ops::clip_grad_norm(gg, 1.0);
  CHECK(std::fabs(ca - cb) <= 1e-10 * ca);
  expect_close(gs[0], gg[0], "clipped grad 0");
  expect_close(gs[2], gg[2], "clipped grad 2");
}
