// Parity tests of the CPU backend's vector kernels (runtime/kernels/cpu/simd_kernels.h):
// every path this CPU can run (simd::available_targets(): AVX3, AVX2, SSE4 and
// the scalar fallback on an AVX-512 x86 machine; NEON and the fallback on ARM64)
// is forced in turn and each kernel checked against a float64 reference written
// here, at lengths that leave every tail size of 1, 4, 8 and 16-lane vectors.
// (dot_f and axpy_f are inline loops, the same on every path; checked here too.)
//
// Tolerances: exp is a degree-6 polynomial with ~2 ulp error (Cephes expf.c), so
// exp and what is built from it (sigmoid, GELU, softmax) get 8 ulp = 1e-6
// relative at the element and 1e-5 relative (+ a small absolute floor where
// the formula cancels: GELU' and SiLU' cross zero) for the composite formulas;
// f32 reductions (dot, GEMM) get 1e-5 of the sum of |terms| (n rounding steps
// of 6e-8 each for n up to ~150, in a tree); the double-accumulated sums
// (exp_sum, the norms' moments) 1e-6 relative.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/simd_kernels.h"

using namespace flowrun;

namespace {

const std::vector<int64_t> k_lengths = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 100, 771};

std::vector<float> randv(int64_t n, double sd, uint64_t seed, double mean = 0.0) {
  std::mt19937_64 r(seed);
  std::normal_distribution<double> nd(mean, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(nd(r));
  return v;
}

/// |got - want| <= atol + rtol |want| for every element (NaN fails).
void close(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol,
           const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      FAIL_CHECK(what << " [" << i << "] of " << got.size() << ": got " << got[i] << " want " << want[i]);
      return;
    }
  }
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

/// Runs body(path) once per path this CPU supports, forced; resets afterwards.
template <class F>
void for_each_path(F&& body) {
  const auto paths = simd::available_targets();
  REQUIRE(!paths.empty());
  for (const auto& p : paths) {
    simd::force_target(p);
    CAPTURE(p);
    CHECK(simd::active_target() == p);
    body(p);
  }
  simd::reset_target();
}

}  // namespace

TEST_CASE("simd dispatch: the best path by default, each one forced, unknown names refused") {
  const auto paths = simd::available_targets();
  REQUIRE(!paths.empty());
  MESSAGE("simd paths on this CPU, best first: " << [&] {
    std::string s;
    for (const auto& p : paths) s += p + " ";
    return s;
  }());
  CHECK(simd::active_target() == paths.front());
  for (const auto& p : paths) {
    simd::force_target(p);
    CHECK(simd::active_target() == p);
  }
  simd::reset_target();
  CHECK(simd::active_target() == paths.front());
  CHECK_THROWS_AS(simd::force_target("NOT_A_PATH"), std::invalid_argument);
  CHECK(simd::active_target() == paths.front());
#if defined(__x86_64__)
  // every x86-64 CPU this runs on has at least SSE4 (or gets the scalar fallback), and both are compiled
  CHECK(paths.back() == "SCALAR");
#endif
}

TEST_CASE("simd exp: within 2 ulp of double exp over [-87.3, 88.7], special values") {
  for_each_path([](const std::string& path) {
    std::vector<float> x;
    for (double v = -87.3; v <= 88.7; v += 0.0137) x.push_back(static_cast<float>(v));
    for (float v : randv(1001, 3.0, 7)) x.push_back(v);
    std::vector<float> y(x.size());
    simd::exp_f(y.data(), x.data(), static_cast<int64_t>(x.size()));
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(static_cast<double>(x[i]));
      // ulp of the double result rounded to f32 (its exponent), so a correctly rounded value is <= 0.5 ulp
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
      worst = std::max(worst, std::fabs(y[i] - want) / ulp);
    }
    MESSAGE(path << ": exp worst error " << worst << " ulp over " << x.size() << " points");
    CHECK(worst <= 2.0);

    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> s = {0.0f, -inf, inf, nan, -88.0f, -87.4f, -1000.0f, 88.5f, 88.72f, 88.8f, 89.0f, 1000.0f, 1.0f};
    std::vector<float> o(s.size());
    simd::exp_f(o.data(), s.data(), static_cast<int64_t>(s.size()));
    CHECK(o[0] == 1.0f);
    CHECK(o[1] == 0.0f);
    CHECK(o[2] == inf);
    CHECK(std::isnan(o[3]));
    CHECK(o[4] == 0.0f);  // would be denormal: 0 by design
    CHECK(o[5] == 0.0f);
    CHECK(o[6] == 0.0f);
    CHECK(o[7] == doctest::Approx(std::exp(88.5)).epsilon(3e-7));  // n = 128: 2^n split in two factors
    CHECK(o[8] == doctest::Approx(std::exp(static_cast<double>(88.72f))).epsilon(3e-7));
    CHECK(o[9] == inf);
    CHECK(o[10] == inf);
    CHECK(o[11] == inf);
    CHECK(o[12] == doctest::Approx(M_E).epsilon(3e-7));
  });
}

TEST_CASE("simd reductions: max, exp_sum, dot, axpy, scale, log-softmax backward row vs float64") {
  for_each_path([](const std::string&) {
    for (int64_t n : k_lengths) {
      CAPTURE(n);
      const auto x = randv(n, 3.0, 11 + n), y = randv(n, 1.0, 13 + n);
      // max
      float want_max = -std::numeric_limits<float>::infinity();
      for (float v : x) want_max = std::max(want_max, v);
      CHECK(simd::max_f(x.data(), n) == want_max);
      // exp_sum with and without out, in place too
      const float shift = n ? want_max : 0.0f;
      double want_sum = 0;
      std::vector<double> want_e(static_cast<size_t>(n));
      // x - shift is one f32 rounding in the kernel: the reference takes the same f32 difference
      for (int64_t i = 0; i < n; ++i) want_sum += want_e[i] = std::exp(static_cast<double>(float(x[i] - shift)));
      CHECK(simd::exp_sum(x.data(), shift, n, nullptr) == doctest::Approx(want_sum).epsilon(1e-6));
      std::vector<float> e(x);
      CHECK(simd::exp_sum(e.data(), shift, n, e.data()) == doctest::Approx(want_sum).epsilon(1e-6));
      close(e, want_e, 1e-6, 1e-30, "exp_sum out");
      // dot (f32 accumulation): 1e-5 of the sum of |terms|
      double want_dot = 0, abs_dot = 0;
      for (int64_t i = 0; i < n; ++i) want_dot += double(x[i]) * y[i], abs_dot += std::fabs(double(x[i]) * y[i]);
      CHECK(std::fabs(simd::dot_f(x.data(), y.data(), n) - want_dot) <= 1e-5 * abs_dot + 1e-30);
      // axpy, scale: one f32 rounding (or one fma) per element
      std::vector<float> a(y);
      simd::axpy_f(a.data(), x.data(), 0.37f, n);
      std::vector<double> want_a(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want_a[i] = y[i] + 0.37f * double(x[i]);
      close(a, want_a, 1e-6, 1e-6, "axpy");
      simd::scale_f(a.data(), -1.5f, n);
      for (auto& v : want_a) v *= -1.5;
      close(a, want_a, 1e-6, 1.5e-6, "scale");
      // log-softmax backward: dx = dy - exp(y) sum(dy), y a log-probability (<= 0)
      std::vector<float> ly(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ly[i] = -std::fabs(x[i]);
      simd::log_softmax_backward_row(dx.data(), y.data(), ly.data(), 0.8f, n);
      std::vector<double> want_dx(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want_dx[i] = y[i] - std::exp(double(ly[i])) * 0.8;
      close(dx, want_dx, 1e-5, 1e-6, "log_softmax_backward_row");
    }
  });
}

TEST_CASE("simd argmax_f is std::max_element's index (ties, tails, NaN), log_softmax_at vs float64") {
  for_each_path([](const std::string&) {
    for (int64_t n : k_lengths) {
      CAPTURE(n);
      auto x = randv(n, 3.0, 17 + n);
      auto want = [&] { return n ? std::max_element(x.begin(), x.end()) - x.begin() : -1; };
      CHECK(simd::argmax_f(x.data(), n) == want());
      if (n == 0) continue;
      // the max at every position in turn, with a tie later in the row: the first one wins
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        auto t = x;
        t[at] = 1e3f;
        if (at + 1 < n) t[n - 1] = 1e3f;
        CHECK(simd::argmax_f(t.data(), n) == at);
      }
      // all equal: 0; all -inf: 0 (max_element's answer)
      std::vector<float> flat(static_cast<size_t>(n), -2.5f), ninf(static_cast<size_t>(n), -INFINITY);
      CHECK(simd::argmax_f(flat.data(), n) == 0);
      CHECK(simd::argmax_f(ninf.data(), n) == 0);
      // a NaN anywhere: whatever std::max_element answers
      for (int64_t at : {int64_t{0}, n - 1}) {
        auto t = x;
        t[at] = NAN;
        CHECK(simd::argmax_f(t.data(), n) == std::max_element(t.begin(), t.end()) - t.begin());
      }
      // log-softmax at each of a few indices: x[i] - m - log sum exp(x - m), in double
      double m = -INFINITY, s = 0;
      for (float v : x) m = std::max(m, double(v));
      for (float v : x) s += std::exp(double(v) - m);
      for (int64_t i : {int64_t{0}, n / 3, n - 1}) {
        const double want_lp = double(x[i]) - m - std::log(s);
        CHECK(std::fabs(simd::log_softmax_at(x.data(), n, i) - want_lp) <= 2e-6 * (1.0 + std::fabs(want_lp)));
      }
    }
    // a vocabulary-sized row (a 32000-token model's logits)
    const auto big = randv(32000, 4.0, 5);
    CHECK(simd::argmax_f(big.data(), 32000) == std::max_element(big.begin(), big.end()) - big.begin());
  });
}

TEST_CASE("simd activations: silu, gelu (tanh), swiglu forward and backward vs float64") {
  for_each_path([](const std::string&) {
    for (int64_t n : k_lengths) {
      CAPTURE(n);
      const auto x = randv(n, 3.0, 21 + n), u = randv(n, 1.0, 23 + n), dy = randv(n, 1.0, 25 + n);
      const size_t sz = static_cast<size_t>(n);
      std::vector<float> o(sz), d(sz), d2(sz);
      std::vector<double> w(sz), w2(sz);
      simd::silu_forward(o.data(), x.data(), n);
      for (size_t i = 0; i < sz; ++i) w[i] = x[i] * sigmoid(x[i]);
      close(o, w, 1e-5, 1e-6, "silu");
      simd::silu_backward(d.data(), dy.data(), x.data(), n);
      for (size_t i = 0; i < sz; ++i) {
        const double s = sigmoid(x[i]);
        w[i] = dy[i] * s * (1.0 + x[i] * (1.0 - s));
      }
      close(d, w, 1e-5, 1e-6, "silu backward");
      simd::gelu_forward(o.data(), x.data(), n);
      for (size_t i = 0; i < sz; ++i) w[i] = gelu(x[i]);
      close(o, w, 1e-5, 1e-6, "gelu");
      std::vector<float> inplace(x);
      simd::gelu_forward(inplace.data(), inplace.data(), n);
      CHECK(inplace == o);
      simd::gelu_backward(d.data(), dy.data(), x.data(), n);
      for (size_t i = 0; i < sz; ++i) w[i] = dy[i] * gelu_grad(x[i]);
      close(d, w, 1e-5, 1e-6, "gelu backward");
      simd::swiglu_forward(o.data(), x.data(), u.data(), n);
      for (size_t i = 0; i < sz; ++i) w[i] = x[i] * sigmoid(x[i]) * u[i];
      close(o, w, 1e-5, 1e-6, "swiglu");
      simd::swiglu_backward(d.data(), d2.data(), dy.data(), x.data(), u.data(), n);
      for (size_t i = 0; i < sz; ++i) {
        const double s = sigmoid(x[i]);
        w[i] = dy[i] * u[i] * s * (1.0 + x[i] * (1.0 - s));
        w2[i] = dy[i] * x[i] * s;
      }
      close(d, w, 1e-5, 1e-6, "swiglu dgate");
      close(d2, w2, 1e-5, 1e-6, "swiglu dup");
    }
  });
}

TEST_CASE("simd adamw: 3 steps vs the float64 formula of torch.optim.AdamW") {
  for_each_path([](const std::string&) {
    for (int64_t n : k_lengths) {
      CAPTURE(n);
      auto p = randv(n, 0.5, 31 + n);
      std::vector<float> m(static_cast<size_t>(n), 0.0f), v(m);
      std::vector<double> pd(p.begin(), p.end()), md(m.begin(), m.end()), vd(md);
      const double b1 = 0.9, b2 = 0.95, eps = 1e-8, lr = 1e-2, wd = 0.1;
      for (int t = 1; t <= 3; ++t) {
        const auto g = randv(n, 0.01, 37 + n + t);
        const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
        simd::adamw_scalars s{float(b1), float(b2), float(1 - b1), float(1 - b2), float(1 / bc1),
                              float(1 / std::sqrt(bc2)), float(eps), float(lr), float(lr * wd)};
        simd::adamw(p.data(), g.data(), m.data(), v.data(), n, s);
        for (int64_t i = 0; i < n; ++i) {
          // the f32 constants, as the kernel receives them (b1 = 0.9f is not 0.9)
          const double fb1 = float(b1), fb2 = float(b2);
          md[i] = fb1 * md[i] + (1 - fb1) * g[i];
          vd[i] = fb2 * vd[i] + (1 - fb2) * double(g[i]) * g[i];
          pd[i] = pd[i] - lr * wd * pd[i] - lr * (md[i] / bc1) / (std::sqrt(vd[i] / bc2) + eps);
        }
      }
      close(p, pd, 1e-6, 1e-7, "adamw param");
      close(m, md, 1e-5, 1e-9, "adamw m");
      close(v, vd, 1e-5, 1e-12, "adamw v");
    }
  });
}

TEST_CASE("simd norms: rmsnorm and layernorm rows forward and backward vs float64") {
  for_each_path([](const std::string&) {
    for (int64_t C : k_lengths) {
      if (C == 0) continue;
      CAPTURE(C);
      const size_t sz = static_cast<size_t>(C);
      const auto x = randv(C, 2.0, 41 + C, 0.5), w = randv(C, 0.3, 43 + C, 1.0), b = randv(C, 1.0, 45 + C),
                 dy = randv(C, 1.0, 47 + C), dx0 = randv(C, 1.0, 49 + C);
      const double eps = 1e-5;
      // rmsnorm
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const double r = 1.0 / std::sqrt(ss / C + eps);
      std::vector<float> o(sz);
      const float rf = simd::rmsnorm_row_forward(o.data(), x.data(), w.data(), C, float(eps));
      CHECK(rf == doctest::Approx(r).epsilon(1e-6));
      std::vector<double> want(sz);
      for (size_t i = 0; i < sz; ++i) want[i] = x[i] * r * w[i];
      close(o, want, 1e-5, 1e-6, "rmsnorm forward");
      double dot = 0;
      for (size_t i = 0; i < sz; ++i) dot += double(dy[i]) * w[i] * x[i];
      std::vector<float> dx(dx0);
      simd::rmsnorm_row_backward(dx.data(), dy.data(), x.data(), w.data(), rf, C);
      for (size_t i = 0; i < sz; ++i) want[i] = dx0[i] + rf * w[i] * dy[i] - double(rf) * rf * rf * x[i] / C * dot;
      close(dx, want, 1e-5, 1e-5, "rmsnorm backward");
      // layernorm, with and without bias
      double s = 0, v = 0;
      for (float e : x) s += e;
      const double m = s / C;
      for (float e : x) v += (e - m) * (e - m);
      const double rs = 1.0 / std::sqrt(v / C + eps);
      for (const float* bp : {b.data(), static_cast<const float*>(nullptr)}) {
        float mean = 0, rstd = 0;
        simd::layernorm_row_forward(o.data(), &mean, &rstd, x.data(), w.data(), bp, C, float(eps));
        CHECK(mean == doctest::Approx(m).epsilon(1e-6));
        CHECK(rstd == doctest::Approx(rs).epsilon(1e-6));
        for (size_t i = 0; i < sz; ++i) want[i] = (x[i] - m) * rs * w[i] + (bp ? bp[i] : 0.0);
        close(o, want, 1e-5, 1e-5, bp ? "layernorm forward" : "layernorm forward, no bias");
      }
      float mean = 0, rstd = 0;
      simd::layernorm_row_forward(o.data(), &mean, &rstd, x.data(), w.data(), b.data(), C, float(eps));
      double s1 = 0, s2 = 0;
      for (size_t i = 0; i < sz; ++i) {
        const double dn = double(w[i]) * dy[i], nrm = (x[i] - double(mean)) * rstd;
        s1 += dn;
        s2 += dn * nrm;
      }
      dx = dx0;
      simd::layernorm_row_backward(dx.data(), dy.data(), x.data(), w.data(), mean, rstd, C);
      for (size_t i = 0; i < sz; ++i) {
        const double nrm = (x[i] - double(mean)) * rstd;
        want[i] = dx0[i] + rstd * (double(w[i]) * dy[i] - s1 / C - nrm * s2 / C);
      }
      close(dx, want, 1e-5, 1e-5, "layernorm backward");
    }
  });
}

TEST_CASE("simd small-M GEMM: C = alpha A Bᵀ + beta C for M = 1..8 and 16, every N and K tail, vs float64") {
  for_each_path([](const std::string&) {
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 16})
      for (int64_t N : {1, 2, 3, 5, 8, 9, 16, 19, 36})
        for (int64_t K : {1, 7, 16, 33, 100}) {
          CAPTURE(M);
          CAPTURE(N);
          CAPTURE(K);
          const int64_t lda = K + 3, ldb = K + 1, ldc = N + 2;
          const auto A = randv(M * lda, 1.0, 51 + M * 100 + K), B = randv(N * ldb, 1.0, 53 + N * 100 + K);
          const auto C0 = randv(M * ldc, 1.0, 55 + M + N);
          for (float beta : {0.0f, 0.5f}) {
            std::vector<float> C(C0);
            if (beta == 0.0f)
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
            simd::gemm_small_nt(M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < ldc; ++j) {
                if (j >= N) {  // outside the N columns: untouched
                  CHECK(C[i * ldc + j] == C0[i * ldc + j]);
                  continue;
                }
                double want = 0, absum = 0;
                for (int64_t k = 0; k < K; ++k) {
                  want += double(A[i * lda + k]) * B[j * ldb + k];
                  absum += std::fabs(double(A[i * lda + k]) * B[j * ldb + k]);
                }
                want = 0.75 * want + (beta != 0.0f ? beta * double(C0[i * ldc + j]) : 0.0);
                const double tol = 1e-5 * (0.75 * absum + std::fabs(beta * C0[i * ldc + j])) + 1e-30;
                if (!(std::fabs(C[i * ldc + j] - want) <= tol)) {
                  FAIL_CHECK("C[" << i << "," << j << "] = " << C[i * ldc + j] << " want " << want << " beta " << beta);
                  return;
                }
              }
          }
        }
  });
}

// A row's result must not depend on the other rows of the call (cpu_gemm::small_m_nt's contract
// for M <= k_small_m; PPO's generation and bench_gemm --row-invariance rely on it): the tiles'
// row count differs per path (4 rows, or 2 on x86's 16-register paths), the reduction groups
// must not. N a multiple of 4 (a 2-column tail pairs rows: see SmallRows).
TEST_CASE("simd small-M GEMM: each row's bits are the same in a call of 1..16 rows, from any start row") {
  for_each_path([](const std::string&) {
    for (int64_t N : {4, 16, 20, 36})
      for (int64_t K : {7, 64, 100}) {
        CAPTURE(N);
        CAPTURE(K);
        const int64_t R = 16;
        const auto A = randv(R * K, 1.0, 71 + K), B = randv(N * K, 1.0, 73 + N);
        std::vector<float> full(R * N);
        simd::gemm_small_nt(R, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, full.data(), N);
        int bad = 0;
        for (int64_t M = 1; M < R; ++M)
          for (int64_t s0 : {int64_t(0), int64_t(1), R - M}) {
            if (s0 + M > R) continue;
            std::vector<float> part(M * N);
            simd::gemm_small_nt(M, N, K, 1.0f, A.data() + s0 * K, K, B.data(), K, 0.0f, part.data(), N);
            for (int64_t i = 0; i < M * N; ++i) bad += part[i] != full[s0 * N + i];
          }
        CHECK(bad == 0);
      }
  });
}

// The epilogue with beta != 0 is fma(beta, c, s), s = alpha (A Bᵀ) rounded (the packed kernel's
// form), in every tile shape: it was left to the compiler's contraction, which fused some tile
// shapes into fma(alpha, sum, beta c) and not others. And K <= 8 (on paths wider than 8 lanes,
// vectors of 8 lanes) gives the bits of the same product with K padded by zeros to 16 (the full
// width): adding zero products changes no sum. beta = 0.3: beta c is not exact, so each of the
// three forms rounds differently.
TEST_CASE("simd small-M GEMM: beta != 0 is fma(beta, c, alpha A Bᵀ) in every tile, and K <= 8 has the bits of K padded to 16") {
  for_each_path([](const std::string&) {
    int bad_beta = 0, bad_pad = 0;
    for (int64_t M : {1, 2, 3, 4, 5, 8, 16})
      for (int64_t N : {1, 2, 3, 4, 7, 8, 9, 16, 17, 33})
        for (int64_t K : {1, 3, 4, 5, 8, 16, 48}) {
          const auto A = randv(M * K, 1.0, 81 + M * 100 + K), B = randv(N * K, 1.0, 83 + N * 100 + K);
          const auto C0 = randv(M * N, 1.0, 85 + M + N);
          std::vector<float> S(M * N), C(C0);
          simd::gemm_small_nt(M, N, K, 0.75f, A.data(), K, B.data(), K, 0.0f, S.data(), N);
          simd::gemm_small_nt(M, N, K, 0.75f, A.data(), K, B.data(), K, 0.3f, C.data(), N);
          for (int64_t i = 0; i < M * N; ++i) bad_beta += C[i] != std::fma(0.3f, C0[i], S[i]);
          if (K > 8) continue;
          std::vector<float> Ap(M * 16, 0.0f), Bp(N * 16, 0.0f), P(M * N);
          for (int64_t i = 0; i < M; ++i) std::copy_n(A.data() + i * K, K, Ap.data() + i * 16);
          for (int64_t j = 0; j < N; ++j) std::copy_n(B.data() + j * K, K, Bp.data() + j * 16);
          simd::gemm_small_nt(M, N, 16, 0.75f, Ap.data(), 16, Bp.data(), 16, 0.0f, P.data(), N);
          for (int64_t i = 0; i < M * N; ++i) bad_pad += std::memcmp(&P[i], &S[i], sizeof(float)) != 0;
        }
    CHECK(bad_beta == 0);
    CHECK(bad_pad == 0);
  });
}

// The small-M kernel's arithmetic, written out lane by lane (simd_kernels.cpp, SmallTile and
// SumsOfLanes): each output keeps one accumulator of L lanes (L = the path's floats per vector, 8
// where K <= 8 on a wider path), lane l the fma chain over k = l, l + L, ... (zeros past K); each
// 128-bit block of 4 lanes x0..x3 sums as (x0 + x2) + (x1 + x3), the blocks in order ((b0 + b1) +
// b2) + b3; then s = alpha sum rounded, and c = s, or fma(beta, c, s). N a multiple of 4, where every
// output of every tile goes through these 4-output reduction groups. The bits must not depend on the
// tile an output falls in (1 x 16, 1 x 8, 4 x 4, 2 x 4, ...), which this pins for every shape here.
TEST_CASE("simd small-M GEMM: every output has the bits of its written-out lane arithmetic, in every tile shape") {
  for_each_path([](const std::string& path) {
    int bad = 0, checked = 0;
    for (int64_t M : {1, 2, 3, 5, 8, 16})
      for (int64_t N : {4, 8, 12, 16, 20, 36})
        for (int64_t K : {3, 8, 16, 48, 100, 288}) {
          const int64_t vec = simd::gemm_panel_width() / 2;  // floats per vector on this path
          const int64_t L = K <= 8 && vec > 8 ? 8 : vec;
          const int64_t lda = K + 1, ldb = K + 3;
          const auto A = randv(M * lda, 1.0, 91 + M * 100 + K), B = randv(N * ldb, 1.0, 93 + N * 100 + K);
          const auto C0 = randv(M * N, 1.0, 95 + M + N);
          for (float beta : {0.0f, 0.3f}) {
            std::vector<float> C(C0);
            simd::gemm_small_nt(M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), N);
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) {
                std::vector<float> acc(static_cast<size_t>(L), 0.0f);
                for (int64_t k0 = 0; k0 < K; k0 += L)
                  for (int64_t l = 0; l < L && k0 + l < K; ++l)
                    acc[l] = std::fma(A[i * lda + k0 + l], B[j * ldb + k0 + l], acc[l]);
                float sum = acc[0];
                if (L >= 4) {
                  sum = 0.0f;
                  for (int64_t b = 0; b < L / 4; ++b) {
                    const float* x = acc.data() + 4 * b;
                    const float block = (x[0] + x[2]) + (x[1] + x[3]);
                    sum = b == 0 ? block : sum + block;
                  }
                }
                const float s = 0.75f * sum;
                const float want = beta == 0.0f ? s : std::fma(beta, C0[i * N + j], s);
                bad += std::memcmp(&want, &C[i * N + j], sizeof(float)) != 0;
                ++checked;
              }
          }
        }
    CAPTURE(path);
    CHECK(checked > 0);
    CHECK(bad == 0);
  });
}

namespace {
/// C = alpha op(A) op(B) + beta C through gemm_pack_b + gemm_packed, in two tile ranges (as two threads would).
void packed(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t W = simd::gemm_panel_width();
  std::vector<float> P(static_cast<size_t>((N + W - 1) / W * W * K) + 1, -7.0f);
  const int64_t panels = (N + W - 1) / W;  // packed in two ranges, as two threads do
  simd::gemm_pack_b(tb, N, K, B, ldb, P.data(), 0, panels / 2);
  simd::gemm_pack_b(tb, N, K, B, ldb, P.data(), panels / 2, panels);
  CHECK(P.back() == -7.0f);  // the packing writes ceil(N / W) W K floats, no more
  const int64_t tiles = simd::gemm_packed_tiles(ta, M, N, K);
  simd::gemm_packed(ta, M, N, K, alpha, A, lda, P.data(), beta, C, ldc, 0, tiles / 2);
  simd::gemm_packed(ta, M, N, K, alpha, A, lda, P.data(), beta, C, ldc, tiles / 2, tiles);
}
}  // namespace

TEST_CASE("simd gemm_pack_b: the packed panels are op(B) exactly, columns past N zero, for both layouts") {
  for_each_path([](const std::string&) {
    const int64_t W = simd::gemm_panel_width();
    for (int tb = 0; tb < 2; ++tb)
      for (int64_t N : {1, 3, 4, 5, 31, 32, 33, 70})
        for (int64_t K : {1, 3, 4, 63, 64, 65, 130}) {  // 4 x 4 blocks, their tails, the 64-row k blocks
          CAPTURE(tb);
          CAPTURE(N);
          CAPTURE(K);
          const int64_t ldb = (tb ? K : N) + 5, panels = (N + W - 1) / W;
          const auto B = randv((tb ? N : K) * ldb, 1.0, 83 + N * 1000 + K);
          std::vector<float> P(static_cast<size_t>(panels * W * K), std::numeric_limits<float>::quiet_NaN());
          simd::gemm_pack_b(tb, N, K, B.data(), ldb, P.data(), 0, panels);
          int64_t bad = 0;
          for (int64_t p = 0; p < panels; ++p)
            for (int64_t k = 0; k < K; ++k)
              for (int64_t j = 0; j < W; ++j) {
                const int64_t n = p * W + j;
                const float want = n >= N ? 0.0f : tb ? B[n * ldb + k] : B[k * ldb + n];
                const float got = P[(p * K + k) * W + j];
                if (!(got == want)) ++bad;  // NaN (never written) counts too
              }
          CHECK(bad == 0);
        }
  });
}

TEST_CASE("simd packed GEMM: every transpose, M/N/K tail and beta vs float64, and on FMA paths bit for bit a fused chain") {
  for_each_path([](const std::string& path) {
    // AVX2, AVX-512 and 64-bit NEON have a fused multiply-add: there each output is exactly the chain
    // acc = fma(a_k, b_k, acc) over k in order, then alpha acc (+ fma(beta, c, .)) (simd_kernels.h)
    const bool fused = path == "AVX2" || path.rfind("AVX3", 0) == 0 || (path == "NEON" && sizeof(void*) == 8);
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int64_t M : {1, 5, 6, 7, 13, 25})
          for (int64_t N : {1, 3, 8, 9, 16, 17, 33, 40})
            for (int64_t K : {1, 7, 64, 100, 300}) {  // 300: AVX-512's wide tile for every transpose
              CAPTURE(ta);
              CAPTURE(tb);
              CAPTURE(M);
              CAPTURE(N);
              CAPTURE(K);
              const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
              const auto A = randv((ta ? K : M) * lda, 1.0, 61 + M * 100 + K);
              const auto B = randv((tb ? N : K) * ldb, 1.0, 63 + N * 100 + K);
              const auto C0 = randv(M * ldc, 1.0, 65 + M + N);
              auto a = [&](int64_t i, int64_t k) { return ta ? A[k * lda + i] : A[i * lda + k]; };
              auto b = [&](int64_t k, int64_t j) { return tb ? B[j * ldb + k] : B[k * ldb + j]; };
              for (float beta : {0.0f, 0.5f}) {
                std::vector<float> C(C0);
                if (beta == 0.0f)  // beta == 0 ignores C: NaN there must not show
                  for (int64_t i = 0; i < M; ++i)
                    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
                packed(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
                for (int64_t i = 0; i < M; ++i)
                  for (int64_t j = 0; j < ldc; ++j) {
                    const float got = C[i * ldc + j];
                    if (j >= N) {
                      if (got != C0[i * ldc + j]) FAIL_CHECK("C[" << i << "," << j << "] past N was written");
                      continue;
                    }
                    double want = 0, absum = 0;
                    float chain = 0.0f;
                    for (int64_t k = 0; k < K; ++k) {
                      want += double(a(i, k)) * b(k, j);
                      absum += std::fabs(double(a(i, k)) * b(k, j));
                      chain = std::fma(a(i, k), b(k, j), chain);
                    }
                    want = 0.75 * want + (beta != 0.0f ? beta * double(C0[i * ldc + j]) : 0.0);
                    const double tol = 1e-5 * (0.75 * absum + std::fabs(beta * C0[i * ldc + j])) + 1e-30;
                    if (!(std::fabs(got - want) <= tol)) {
                      FAIL_CHECK("C[" << i << "," << j << "] = " << got << " want " << want << " beta " << beta);
                      return;
                    }
                    float exact = 0.75f * chain;
                    if (beta != 0.0f) exact = std::fma(beta, C0[i * ldc + j], exact);
                    if (fused && got != exact) {
                      FAIL_CHECK("C[" << i << "," << j << "] = " << got << " is not the fused chain's " << exact);
                      return;
                    }
                  }
              }
            }
  });
}

TEST_CASE("simd packed GEMM: a row's bits do not depend on M, on where the row starts, nor on N's tiling") {
  for_each_path([](const std::string&) {
    const int64_t M = 40;
    for (int64_t K : {64, 300})  // 300: AVX-512's 12-row tiles
      for (int64_t N : {8, 9, 50}) {  // one-vector tiles (N <= 8 on AVX2), two-vector ones, and (N = 9, its
                                       // first 5 columns alone) one against the other
        CAPTURE(K);
        CAPTURE(N);
        const auto A = randv(M * K, 1.0, 71), B = randv(N * K, 1.0, 73);
        std::vector<float> full(M * N);
        packed(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, full.data(), N);
        for (int64_t s : {0, 3, 11})
          for (int64_t m : {1, 2, 5, 6, 7, 12, 13, 17}) {
            if (s + m > M) continue;
            CAPTURE(s);
            CAPTURE(m);
            std::vector<float> part(m * N);
            packed(false, true, m, N, K, 1.0f, A.data() + s * K, K, B.data(), K, 0.0f, part.data(), N);
            for (int64_t i = 0; i < m * N; ++i)
              if (part[i] != full[s * N + i]) {
                FAIL_CHECK("row " << s + i / N << " col " << i % N << " differs");
                break;
              }
            // columns [0, n) alone: the same bits as in the N-column call
            const int64_t n = N / 2 + 1;
            std::vector<float> cols(m * n);
            packed(false, true, m, n, K, 1.0f, A.data() + s * K, K, B.data(), K, 0.0f, cols.data(), n);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j)
                if (cols[i * n + j] != full[(s + i) * N + j]) {
                  FAIL_CHECK("row " << s + i << " col " << j << " differs with " << n << " columns");
                  return;
                }
          }
      }
  });
}

TEST_CASE("simd softmax_row and attend_decode: probabilities and outputs vs float64, and bit for bit the separate calls they fuse") {
  // One decode task: `group` query heads sharing a kv head, `nvis` visible keys, some padding keys.
  // Reference 1 (float64): softmax of scale q.k over the non-padding keys, o = sum p v.
  // Reference 2 (the arithmetic attend_decode documents): scores from gemm_small_nt in blocks of
  // 16 keys, exp_sum in double, p = float(e / sum), o = the chain fma(p_j, v_j, o) over j (p_j = 0
  // skipped); on FMA paths equal bit for bit (on the others the chain rounds twice per step).
  for_each_path([](const std::string& path) {
    const bool fused = path == "AVX2" || path.rfind("AVX3", 0) == 0 || (path == "NEON" && sizeof(void*) == 8);
    for (int64_t group : {1, 2, 3, 5})
      for (int64_t hs : {1, 3, 4, 8, 9, 12, 13, 16, 29, 48, 128})  // 4-7, 12-15 mod 16 and 29 (16 + 8 + 4 + 1): the capped vectors
        for (int64_t nvis : {1, 2, 7, 16, 17, 40, 80}) {
          CAPTURE(group);
          CAPTURE(hs);
          CAPTURE(nvis);
          const int64_t ldq = hs + 2, ldkv = 3 * hs + 1, lda = nvis + 5, ldo = hs + 3;
          const auto q = randv(group * ldq, 1.0, 71 + group * 7 + hs);
          const auto k = randv(nvis * ldkv, 1.0, 73 + hs + nvis);
          const auto v = randv(nvis * ldkv, 1.0, 79 + hs * 3 + nvis);
          // padding keys: every third key from 1, and one past the visible ones (ignored)
          std::vector<int32_t> pad;
          for (int64_t j = 1; j < nvis; j += 3) pad.push_back(static_cast<int32_t>(j));
          pad.push_back(static_cast<int32_t>(nvis + 2));
          const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
          std::vector<float> a(group * lda, -7.0f), o(group * ldo, -7.0f);
          simd::attend_decode(group, hs, nvis, scale, q.data(), ldq, k.data(), v.data(), ldkv, pad.data(),
                              static_cast<int64_t>(pad.size()), a.data(), lda, o.data(), ldo);
          auto padded = [&](int64_t j) { return std::find(pad.begin(), pad.end(), j) != pad.end(); };
          // reference 2's scores and probabilities
          std::vector<float> s(group * nvis);
          for (int64_t n0 = 0; n0 < nvis; n0 += simd::k_small_nt_block)
            simd::gemm_small_nt(group, std::min(simd::k_small_nt_block, nvis - n0), hs, scale, q.data(), ldq, k.data() + n0 * ldkv,
                                ldkv, 0.0f, s.data() + n0, nvis);
          for (int64_t g = 0; g < group; ++g) {
            float* row = s.data() + g * nvis;
            for (int64_t j = 0; j < nvis; ++j)
              if (padded(j)) row[j] = -std::numeric_limits<float>::infinity();
            const double inv = 1.0 / simd::exp_sum(row, simd::max_f(row, nvis), nvis, row);
            for (int64_t j = 0; j < nvis; ++j) row[j] = static_cast<float>(row[j] * inv);
            // float64
            std::vector<double> sc(nvis);
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < nvis; ++j) {
              double dot = 0;
              for (int64_t c = 0; c < hs; ++c) dot += double(q[g * ldq + c]) * k[j * ldkv + c];
              sc[j] = dot * scale;
              if (!padded(j)) mx = std::max(mx, sc[j]);
            }
            for (int64_t j = 0; j < nvis; ++j) sum += padded(j) ? 0.0 : std::exp(sc[j] - mx);
            for (int64_t j = 0; j < nvis; ++j) {
              const double p = padded(j) ? 0.0 : std::exp(sc[j] - mx) / sum;
              const float got = a[g * lda + j];
              if (!(std::fabs(got - p) <= 1e-5 * p + 1e-7)) FAIL_CHECK("a[" << g << "," << j << "] " << got << " want " << p);
              if (got != row[j]) FAIL_CHECK("a[" << g << "," << j << "] is not the separate calls' " << row[j]);
            }
            for (int64_t j = nvis; j < lda; ++j)
              if (a[g * lda + j] != -7.0f) FAIL_CHECK("a[" << g << "," << j << "] past the visible keys was written");
            for (int64_t c = 0; c < ldo; ++c) {
              const float got = o[g * ldo + c];
              if (c >= hs) {
                if (got != -7.0f) FAIL_CHECK("o[" << g << "," << c << "] past hs was written");
                continue;
              }
              double want = 0, absum = 0;
              float chain = 0.0f;
              for (int64_t j = 0; j < nvis; ++j) {
                const double p = padded(j) ? 0.0 : std::exp(sc[j] - mx) / sum;
                want += p * v[j * ldkv + c];
                absum += std::fabs(p * v[j * ldkv + c]);
                if (row[j] != 0.0f) chain = std::fma(row[j], v[j * ldkv + c], chain);
              }
              if (!(std::fabs(got - want) <= 1e-5 * absum + 1e-7)) FAIL_CHECK("o[" << g << "," << c << "] " << got << " want " << want);
              if (fused && got != chain) FAIL_CHECK("o[" << g << "," << c << "] " << got << " is not the fma chain's " << chain);
            }
          }
        }
    // softmax_row alone at every tail length: bit for bit max_f, exp_sum and the double product
    for (int64_t n : k_lengths) {
      if (n == 0) continue;
      CAPTURE(n);
      auto x = randv(n, 3.0, 91 + n);
      const std::vector<int32_t> pad = {0, 5, 6, 40};
      std::vector<float> ref(x);
      for (int32_t j : pad)
        if (j < n) ref[j] = -std::numeric_limits<float>::infinity();
      const float m = simd::max_f(ref.data(), n);
      std::vector<double> want(n, 0.0);
      if (m == -std::numeric_limits<float>::infinity()) {
        std::fill(ref.begin(), ref.end(), 0.0f);
      } else {
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(double(ref[j]) - m);
        for (int64_t j = 0; j < n; ++j) want[j] = std::exp(double(ref[j]) - m) / sum;
        const double inv = 1.0 / simd::exp_sum(ref.data(), m, n, ref.data());
        for (int64_t j = 0; j < n; ++j) ref[j] = static_cast<float>(ref[j] * inv);
      }
      simd::softmax_row(x.data(), n, pad.data(), static_cast<int64_t>(pad.size()));
      CHECK(x == ref);
      close(x, want, 1e-5, 1e-7, "softmax_row");
    }
    // no visible key (every one padding): zero probabilities and outputs
    const std::vector<float> q(8, 1.0f), kv(2 * 8, 1.0f);
    const std::vector<int32_t> pad = {0, 1};
    std::vector<float> a(2, -7.0f), o(8, -7.0f);
    simd::attend_decode(1, 8, 2, 0.5f, q.data(), 8, kv.data(), kv.data(), 8, pad.data(), 2, a.data(), 2, o.data(), 8);
    CHECK(a == std::vector<float>(2, 0.0f));
    CHECK(o == std::vector<float>(8, 0.0f));
  });
}
