// Tests of runtime/kernels/ops.h on the CPU backend.
//
// Every forward is checked against a naive float64 reference written here;
// every backward against central finite differences (in float64) of the scalar
// loss L = sum(ref_forward(inputs) * R) for a random R, so the gradients are
// checked against the forward's definition, not against a second derivation.
// "Large" cases (sizes that take the OpenMP paths) check gradients through
// directional derivatives <grad, U> = dL(x + hU)/dh instead.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <latch>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <omp.h>

#include "runtime/kernels/backend.h"
#include "runtime/kernels/compute_scope.h"
#include "runtime/kernels/ops.h"

using namespace flowrun;
using vecd = std::vector<double>;

namespace {

// ------------------------------------------------------------------ helpers

std::mt19937_64& rng() {
  static std::mt19937_64 r(20240611);
  return r;
}

/// f32 tensor of N(0, stddev^2) values.
tensor randn(const shape_t& s, double stddev = 1.0, double mean = 0.0) {
  std::normal_distribution<double> nd(mean, stddev);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = static_cast<float>(nd(rng()));
  return tensor::from_floats(s, v);
}

tensor nan_filled(const shape_t& s) {
  auto t = tensor::empty(s);
  t.fill_(std::numeric_limits<float>::quiet_NaN());
  return t;
}

vecd dvec(const tensor& t) {
  auto f = t.to_floats();
  return vecd(f.begin(), f.end());
}

std::vector<int> ivec(const tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int>(p, p + t.numel());
}

double dot(const vecd& a, const vecd& b) {
  REQUIRE(a.size() == b.size());
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

vecd add_v(const vecd& a, const vecd& b) {
  vecd r(a);
  for (size_t i = 0; i < r.size(); ++i) r[i] += b[i];
  return r;
}

/// Elementwise |got - want| <= atol + rtol |want| (NaN fails).
void check_close(const std::vector<float>& got, const vecd& want, double rtol, double atol, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what << ": size " << got.size() << " vs " << want.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = atol + rtol * std::fabs(want[i]);
    const double ratio = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / tol;
    if (!(err <= tol)) ++bad;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size() << " elements off; worst [" << worst
                                << "] got " << (got.empty() ? 0.0f : got[worst]) << " want "
                                << (want.empty() ? 0.0 : want[worst]));
}
void check_close(const tensor& got, const vecd& want, double rtol, double atol, const std::string& what) {
  check_close(got.to_floats(), want, rtol, atol, what);
}

/// Central finite differences of f at x, in double.
vecd fd_grad(const std::function<double(const vecd&)>& f, vecd x, double h = 1e-5) {
  vecd g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + h;
    const double fp = f(x);
    x[i] = xi - h;
    const double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

/// Directional derivative of f at x along u, central differences in double.
double fd_dir(const std::function<double(const vecd&)>& f, const vecd& x, const vecd& u, double h = 1e-5) {
  vecd xp(x), xm(x);
  for (size_t i = 0; i < x.size(); ++i) xp[i] += h * u[i], xm[i] -= h * u[i];
  return (f(xp) - f(xm)) / (2 * h);
}

/// <grad, u> from the op vs the finite-difference directional derivative.
void check_dir(const tensor& grad, const std::function<double(const vecd&)>& f, const vecd& x, const std::string& what,
               double rtol = 1e-4) {
  vecd u = dvec(randn(grad.shape()));
  const vecd g = dvec(grad);
  const double got = dot(g, u);
  const double want = fd_dir(f, x, u);
  double mag = 0;
  for (size_t i = 0; i < g.size(); ++i) mag += std::fabs(g[i] * u[i]);
  CHECK_MESSAGE(std::fabs(got - want) <= rtol * mag + 1e-9,
                what << ": <grad, u> = " << got << ", finite difference " << want << " (scale " << mag << ")");
}

// Tolerances: forward vs float64 reference; gradients vs finite differences.
constexpr double k_rtol = 1e-5, k_atol = 1e-5;
constexpr double k_grad_rtol = 1e-3, k_grad_atol = 2e-4;

// ------------------------------------------------------------------ float64 references

// C (M, N) = op(A) op(B); A (M, K) or (K, M) if ta; B (K, N) or (N, K) if tb.
vecd matmul_ref(const vecd& a, const vecd& b, int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
  vecd c(static_cast<size_t>(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += (ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
      c[i * N + j] = s;
    }
  return c;
}

// out (N, OC) = x (N, IC) w^T + b
vecd linear_ref(const vecd& x, const vecd& w, const vecd* b, int64_t N, int64_t IC, int64_t OC) {
  vecd o(static_cast<size_t>(N * OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o_ = 0; o_ < OC; ++o_) {
      double s = b ? (*b)[o_] : 0.0;
      for (int64_t i = 0; i < IC; ++i) s += x[n * IC + i] * w[o_ * IC + i];
      o[n * OC + o_] = s;
    }
  return o;
}

vecd rmsnorm_ref(const vecd& x, const vecd& w, int64_t N, int64_t C, double eps, vecd* rstd = nullptr) {
  vecd o(x.size());
  if (rstd) rstd->assign(static_cast<size_t>(N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[n * C + c] * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) o[n * C + c] = x[n * C + c] * r * w[c];
    if (rstd) (*rstd)[n] = r;
  }
  return o;
}

vecd layernorm_ref(const vecd& x, const vecd& w, const vecd* b, int64_t N, int64_t C, double eps,
                   vecd* mean = nullptr, vecd* rstd = nullptr) {
  vecd o(x.size());
  if (mean) mean->assign(static_cast<size_t>(N), 0.0);
  if (rstd) rstd->assign(static_cast<size_t>(N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    double v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + eps);
    for (int64_t c = 0; c < C; ++c) o[n * C + c] = (x[n * C + c] - m) * r * w[c] + (b ? (*b)[c] : 0.0);
    if (mean) (*mean)[n] = m;
    if (rstd) (*rstd)[n] = r;
  }
  return o;
}

double act_ref1(double x, ops::activation a) {
  switch (a) {
    case ops::activation::silu: return x / (1 + std::exp(-x));
    case ops::activation::gelu_tanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case ops::activation::relu: return x > 0 ? x : 0;
  }
  return 0;
}
vecd act_ref(const vecd& x, ops::activation a) {
  vecd o(x.size());
  for (size_t i = 0; i < x.size(); ++i) o[i] = act_ref1(x[i], a);
  return o;
}

vecd swiglu_ref(const vecd& g, const vecd& u) {
  vecd o(g.size());
  for (size_t i = 0; i < g.size(); ++i) o[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  return o;
}

// x (B, T, NH, hs), pos (B, T); angle pos * theta^(-2i/hs), in double.
vecd rope_ref(const vecd& x, const std::vector<int>& pos, int64_t BT, int64_t NH, int64_t hs, double theta,
              ops::rope_layout layout, bool inverse = false) {
  vecd o(x);
  const int64_t half = hs / 2;
  for (int64_t bt = 0; bt < BT; ++bt)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < half; ++i) {
        double ang = pos[bt] * std::pow(theta, -2.0 * i / hs);
        if (inverse) ang = -ang;
        const int64_t base = (bt * NH + h) * hs;
        const int64_t i0 = layout == ops::rope_layout::adjacent ? base + 2 * i : base + i;
        const int64_t i1 = layout == ops::rope_layout::adjacent ? base + 2 * i + 1 : base + i + half;
        o[i0] = x[i0] * std::cos(ang) - x[i1] * std::sin(ang);
        o[i1] = x[i0] * std::sin(ang) + x[i1] * std::cos(ang);
      }
  return o;
}

struct attn_dims {
  int64_t B, Tq, H, hs, S, KV, n_keys;
};

// Causal GQA attention with optional padding mask (row stride mstride), as ops.h.
vecd attention_ref(const vecd& q, const vecd& k, const vecd& v, const std::vector<int>* mask, int64_t mstride,
                   const attn_dims& d, vecd* att = nullptr) {
  const auto [B, Tq, H, hs, S, KV, n_keys] = d;
  vecd out(static_cast<size_t>(B * Tq * H * hs), 0.0);
  if (att) att->assign(static_cast<size_t>(B * H * Tq * n_keys), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / (H / KV);
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t qpos = n_keys - Tq + i;
        vecd s(static_cast<size_t>(n_keys), 0.0);
        std::vector<bool> vis(static_cast<size_t>(n_keys), false);
        double mx = -INFINITY;
        for (int64_t j = 0; j < n_keys; ++j) {
          vis[j] = j <= qpos && (!mask || (*mask)[b * mstride + j] != 0);
          if (!vis[j]) continue;
          double t = 0;
          for (int64_t c = 0; c < hs; ++c) t += q[((b * Tq + i) * H + h) * hs + c] * k[((b * S + j) * KV + kvh) * hs + c];
          s[j] = t * scale;
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (int64_t j = 0; j < n_keys; ++j)
          if (vis[j]) sum += std::exp(s[j] - mx);
        for (int64_t j = 0; j < n_keys; ++j) {
          if (!vis[j]) continue;
          const double p = std::exp(s[j] - mx) / sum;
          if (att) (*att)[((b * H + h) * Tq + i) * n_keys + j] = p;
          for (int64_t c = 0; c < hs; ++c)
            out[((b * Tq + i) * H + h) * hs + c] += p * v[((b * S + j) * KV + kvh) * hs + c];
        }
      }
    }
  return out;
}

vecd softmax_ref(const vecd& x, int64_t N, int64_t V, bool log) {
  vecd o(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, x[n * V + i]);
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += std::exp(x[n * V + i] - mx);
    for (int64_t i = 0; i < V; ++i)
      o[n * V + i] = log ? x[n * V + i] - mx - std::log(s) : std::exp(x[n * V + i] - mx) / s;
  }
  return o;
}

// per-row losses (0 for ignored rows)
vecd ce_ref(const vecd& x, const std::vector<int>& t, int64_t N, int64_t V, int ignore = -100) {
  vecd l(static_cast<size_t>(N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (t[n] == ignore) continue;
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, x[n * V + i]);
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += std::exp(x[n * V + i] - mx);
    l[n] = mx + std::log(s) - x[n * V + t[n]];
  }
  return l;
}

}  // namespace

// ====================================================================== backend registry

TEST_CASE("backend registry: cpu backend is present") {
  CHECK(std::string(cpu_backend().name()) == "cpu");
  CHECK(std::string(backend_for(device::cpu()).name()) == "cpu");
}

// ====================================================================== basics

TEST_CASE("add / axpy / scale / fill") {
  for (int64_t n : {7, 200003}) {  // small (serial) and large (OpenMP) paths
    CAPTURE(n);
    auto a = randn({n}), b = randn({n});
    auto out = nan_filled({n});
    ops::add(out, a, b);
    check_close(out, add_v(dvec(a), dvec(b)), 1e-7, 0, "add");

    // in place: a = a + b
    auto a2 = a.clone();
    ops::add(a2, a2, b);
    check_close(a2, add_v(dvec(a), dvec(b)), 1e-7, 0, "add in place");

    auto y = a.clone();
    ops::axpy(y, b, -0.75f);
    vecd want(static_cast<size_t>(n));
    auto av = dvec(a), bv = dvec(b);
    for (int64_t i = 0; i < n; ++i) want[i] = av[i] - 0.75 * bv[i];
    check_close(y, want, 1e-6, 1e-6, "axpy");

    auto s = a.clone();
    ops::scale(s, 2.5f);
    for (int64_t i = 0; i < n; ++i) want[i] = av[i] * 2.5;
    check_close(s, want, 1e-7, 0, "scale");

    ops::fill(s, -3.25f);
    check_close(s, vecd(static_cast<size_t>(n), -3.25), 0, 0, "fill");
  }
  // axpy only needs equal numel
  auto y = tensor::zeros({2, 3});
  auto x = tensor::from_floats({6}, {1, 2, 3, 4, 5, 6});
  ops::axpy(y, x, 2.0f);
  check_close(y, {2, 4, 6, 8, 10, 12}, 0, 0, "axpy flat");
}

// ====================================================================== matmul

TEST_CASE("matmul: all transposes, alpha/beta, flattened leading dims") {
  const int64_t M = 5, N = 7, K = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      CAPTURE(ta);
      CAPTURE(tb);
      auto a = randn(ta ? shape_t{K, M} : shape_t{M, K});
      auto b = randn(tb ? shape_t{N, K} : shape_t{K, N});
      auto ab = matmul_ref(dvec(a), dvec(b), M, N, K, ta, tb);

      // beta = 0 ignores old contents (even NaN)
      auto out = nan_filled({M, N});
      ops::matmul(out, a, b, ta, tb);
      check_close(out, ab, k_rtol, k_atol, "matmul beta=0");

      auto out0 = randn({M, N});
      auto out2 = out0.clone();
      ops::matmul(out2, a, b, ta, tb, 0.7f, 0.3f);
      auto o0 = dvec(out0);
      vecd want(ab.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = 0.7 * ab[i] + 0.3 * o0[i];
      check_close(out2, want, k_rtol, k_atol, "matmul alpha/beta");
    }

  // a (2, 3, K) seen as (6, K), out (2, 3, N); bigger K for the BLAS kernels
  const int64_t K2 = 67;
  auto a = randn({2, 3, K2}), b = randn({N, K2});
  auto out = tensor::empty({2, 3, N});
  ops::matmul(out, a, b, false, true);
  check_close(out, matmul_ref(dvec(a), dvec(b), 6, N, K2, false, true), k_rtol, 1e-4, "matmul flattened");

  // dW-style: a^T with a (B, T, C) flattened to (B*T, C)
  auto x = randn({2, 3, 4}), d = randn({2, 3, 5});
  auto dw = tensor::empty({5, 4});
  ops::matmul(dw, d, x, true, false);
  check_close(dw, matmul_ref(dvec(d), dvec(x), 5, 4, 6, true, false), k_rtol, k_atol, "matmul a^T flattened");
}

TEST_CASE("matmul_batched: all transposes, alpha/beta, small and large matrices") {
  struct sz {
    int64_t Bt, M, N, K;
  };
  for (sz s : {sz{3, 5, 7, 3}, sz{2, 70, 65, 66}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        CAPTURE(s.M);
        CAPTURE(ta);
        CAPTURE(tb);
        auto a = randn(ta ? shape_t{s.Bt, s.K, s.M} : shape_t{s.Bt, s.M, s.K});
        auto b = randn(tb ? shape_t{s.Bt, s.N, s.K} : shape_t{s.Bt, s.K, s.N});
        auto out0 = randn({s.Bt, s.M, s.N});
        auto out = out0.clone();
        ops::matmul_batched(out, a, b, ta, tb, 1.3f, 0.5f);
        auto av = dvec(a), bv = dvec(b), o0 = dvec(out0);
        vecd want;
        for (int64_t i = 0; i < s.Bt; ++i) {
          vecd ai(av.begin() + i * s.M * s.K, av.begin() + (i + 1) * s.M * s.K);
          vecd bi(bv.begin() + i * s.K * s.N, bv.begin() + (i + 1) * s.K * s.N);
          auto ci = matmul_ref(ai, bi, s.M, s.N, s.K, ta, tb);
          for (int64_t j = 0; j < s.M * s.N; ++j) want.push_back(1.3 * ci[j] + 0.5 * o0[i * s.M * s.N + j]);
        }
        check_close(out, want, 1e-5, 1e-4, "matmul_batched");
      }
  }
}

// ====================================================================== linear

TEST_CASE("linear forward/backward with and without bias") {
  const int64_t B = 2, T = 5, IC = 7, OC = 4, N = B * T;
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    auto x = randn({B, T, IC}), w = randn({OC, IC}, 0.5), bias = with_bias ? randn({OC}) : tensor();
    auto out = nan_filled({B, T, OC});
    ops::linear_forward(out, x, w, bias);
    const vecd xv = dvec(x), wv = dvec(w), bv = with_bias ? dvec(bias) : vecd();
    check_close(out, linear_ref(xv, wv, with_bias ? &bv : nullptr, N, IC, OC), k_rtol, k_atol, "linear_forward");

    // backward: L = sum(out * R); accumulates into dx, dw, dbias
    auto R = randn({B, T, OC});
    const vecd Rv = dvec(R);
    auto dx = randn({B, T, IC}), dw = randn({OC, IC}), db = with_bias ? randn({OC}) : tensor();
    const vecd dx0 = dvec(dx), dw0 = dvec(dw), db0 = with_bias ? dvec(db) : vecd();
    ops::linear_backward(dx, dw, db, R, x, w);

    auto gx = fd_grad([&](const vecd& X) { return dot(linear_ref(X, wv, with_bias ? &bv : nullptr, N, IC, OC), Rv); }, xv);
    auto gw = fd_grad([&](const vecd& W) { return dot(linear_ref(xv, W, with_bias ? &bv : nullptr, N, IC, OC), Rv); }, wv);
    check_close(dx, add_v(dx0, gx), k_grad_rtol, k_grad_atol, "linear dx (+=)");
    check_close(dw, add_v(dw0, gw), k_grad_rtol, k_grad_atol, "linear dw (+=)");
    if (with_bias) {
      auto gb = fd_grad([&](const vecd& Bv) { return dot(linear_ref(xv, wv, &Bv, N, IC, OC), Rv); }, bv);
      check_close(db, add_v(db0, gb), k_grad_rtol, k_grad_atol, "linear dbias (+=)");
    }

    // dx undefined: only dw accumulates
    tensor no_dx, no_db;
    auto dw2 = tensor::zeros({OC, IC});
    ops::linear_backward(no_dx, dw2, no_db, R, x, w);
    check_close(dw2, gw, k_grad_rtol, k_grad_atol, "linear dw without dx");
  }
}

// ====================================================================== embedding

TEST_CASE("embedding forward/backward") {
  const int64_t V = 13, C = 7;
  auto wte = randn({V, C});
  auto ids = tensor::from_ints({2, 5}, {3, 0, 12, 3, 7, 7, 7, 1, 12, 5});
  auto out = nan_filled({2, 5, C});
  ops::embedding_forward(out, ids, wte);
  const vecd wv = dvec(wte);
  const auto iv = ivec(ids);
  vecd want;
  for (int id : iv)
    for (int64_t c = 0; c < C; ++c) want.push_back(wv[id * C + c]);
  check_close(out, want, 0, 0, "embedding_forward");

  // (N, C) output for (N) ids works too
  auto out2 = tensor::empty({10, C});
  ops::embedding_forward(out2, ids.view({10}), wte);
  check_close(out2, want, 0, 0, "embedding_forward flat");

  // backward: += with repeated ids; negative ids skipped
  auto ids_b = tensor::from_ints({10}, {3, 0, 12, 3, -1, 7, 7, 1, -100, 3});
  auto dout = randn({10, C});
  auto dwte = randn({V, C});
  vecd wantd = dvec(dwte);
  const vecd dv = dvec(dout);
  const auto ib = ivec(ids_b);
  for (int64_t n = 0; n < 10; ++n)
    if (ib[n] >= 0)
      for (int64_t c = 0; c < C; ++c) wantd[ib[n] * C + c] += dv[n * C + c];
  ops::embedding_backward(dwte, dout, ids_b);
  check_close(dwte, wantd, 1e-6, 1e-6, "embedding_backward");

  // out-of-range ids throw std::out_of_range naming the id
  auto bad = tensor::from_ints({3}, {1, 13, 2});
  auto o3 = tensor::empty({3, C});
  CHECK_THROWS_AS(ops::embedding_forward(o3, bad, wte), std::out_of_range);
  try {
    ops::embedding_forward(o3, bad, wte);
  } catch (const std::out_of_range& e) {
    CHECK(std::string(e.what()).find("13") != std::string::npos);
  }
  auto neg = tensor::from_ints({3}, {1, -1, 2});
  CHECK_THROWS_AS(ops::embedding_forward(o3, neg, wte), std::out_of_range);
  auto dw3 = tensor::zeros({V, C});
  auto d3 = randn({3, C});
  CHECK_THROWS_AS(ops::embedding_backward(dw3, d3, bad), std::out_of_range);
  // ids must be i32
  auto fids = tensor::from_floats({3}, {1, 2, 3});
  CHECK_THROWS_AS(ops::embedding_forward(o3, fids, wte), std::invalid_argument);
}

// ====================================================================== norms

TEST_CASE("rmsnorm forward/backward") {
  const int64_t B = 2, T = 5, C = 7, N = B * T;
  const float eps = 1e-5f;
  auto x = randn({B, T, C}), w = randn({C}, 0.3, 1.0);
  auto out = nan_filled({B, T, C}), rstd = nan_filled({B, T});
  ops::rmsnorm_forward(out, rstd, x, w, eps);
  const vecd xv = dvec(x), wv = dvec(w);
  vecd rs;
  check_close(out, rmsnorm_ref(xv, wv, N, C, eps, &rs), k_rtol, k_atol, "rmsnorm out");
  check_close(rstd, rs, k_rtol, 0, "rmsnorm rstd");

  auto R = randn({B, T, C});
  const vecd Rv = dvec(R);
  auto dx = randn({B, T, C}), dw = randn({C});
  const vecd dx0 = dvec(dx), dw0 = dvec(dw);
  ops::rmsnorm_backward(dx, dw, R, x, w, rstd);
  auto gx = fd_grad([&](const vecd& X) { return dot(rmsnorm_ref(X, wv, N, C, eps), Rv); }, xv);
  auto gw = fd_grad([&](const vecd& W) { return dot(rmsnorm_ref(xv, W, N, C, eps), Rv); }, wv);
  check_close(dx, add_v(dx0, gx), k_grad_rtol, k_grad_atol, "rmsnorm dx (+=)");
  check_close(dw, add_v(dw0, gw), k_grad_rtol, k_grad_atol, "rmsnorm dw (+=)");
}

TEST_CASE("layernorm forward/backward with and without bias") {
  const int64_t B = 2, T = 5, C = 7, N = B * T;
  const float eps = 1e-5f;
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    auto x = randn({B, T, C}, 2.0, 0.5), w = randn({C}, 0.3, 1.0), b = with_bias ? randn({C}) : tensor();
    auto out = nan_filled({B, T, C}), mean = nan_filled({N}), rstd = nan_filled({N});
    ops::layernorm_forward(out, mean, rstd, x, w, b, eps);
    const vecd xv = dvec(x), wv = dvec(w), bv = with_bias ? dvec(b) : vecd();
    const vecd* bp = with_bias ? &bv : nullptr;
    vecd ms, rs;
    check_close(out, layernorm_ref(xv, wv, bp, N, C, eps, &ms, &rs), k_rtol, k_atol, "layernorm out");
    check_close(mean, ms, k_rtol, 1e-6, "layernorm mean");
    check_close(rstd, rs, k_rtol, 0, "layernorm rstd");

    auto R = randn({B, T, C});
    const vecd Rv = dvec(R);
    auto dx = randn({B, T, C}), dw = randn({C}), db = with_bias ? randn({C}) : tensor();
    const vecd dx0 = dvec(dx), dw0 = dvec(dw), db0 = with_bias ? dvec(db) : vecd();
    ops::layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
    auto gx = fd_grad([&](const vecd& X) { return dot(layernorm_ref(X, wv, bp, N, C, eps), Rv); }, xv);
    auto gw = fd_grad([&](const vecd& W) { return dot(layernorm_ref(xv, W, bp, N, C, eps), Rv); }, wv);
    check_close(dx, add_v(dx0, gx), k_grad_rtol, k_grad_atol, "layernorm dx (+=)");
    check_close(dw, add_v(dw0, gw), k_grad_rtol, k_grad_atol, "layernorm dw (+=)");
    if (with_bias) {
      auto gb = fd_grad([&](const vecd& Bv) { return dot(layernorm_ref(xv, wv, &Bv, N, C, eps), Rv); }, bv);
      check_close(db, add_v(db0, gb), k_grad_rtol, k_grad_atol, "layernorm db (+=)");
    }
  }
}

// ====================================================================== activations

TEST_CASE("activations silu / gelu_tanh / relu forward and backward") {
  for (auto a : {ops::activation::silu, ops::activation::gelu_tanh, ops::activation::relu}) {
    CAPTURE(std::string(ops::activation_name(a)));
    auto x = randn({3, 11}, 2.0);
    {  // keep relu's inputs off its kink
      float* p = x.data<float>();
      for (int64_t i = 0; i < x.numel(); ++i)
        if (std::fabs(p[i]) < 1e-2f) p[i] = 0.5f;
    }
    auto out = nan_filled({3, 11});
    ops::activation_forward(out, x, a);
    const vecd xv = dvec(x);
    check_close(out, act_ref(xv, a), k_rtol, 1e-6, "activation_forward");

    auto R = randn({3, 11});
    const vecd Rv = dvec(R);
    auto dx = nan_filled({3, 11});  // overwritten
    ops::activation_backward(dx, R, x, a);
    auto g = fd_grad([&](const vecd& X) { return dot(act_ref(X, a), Rv); }, xv);
    check_close(dx, g, k_grad_rtol, k_grad_atol, "activation_backward");
  }
  CHECK(std::string(ops::activation_name(ops::activation::gelu_tanh)) == "gelu_tanh");
}

TEST_CASE("swiglu forward/backward") {
  auto g = randn({2, 5, 9}, 1.5), u = randn({2, 5, 9});
  auto out = nan_filled({2, 5, 9});
  ops::swiglu_forward(out, g, u);
  const vecd gv = dvec(g), uv = dvec(u);
  check_close(out, swiglu_ref(gv, uv), k_rtol, 1e-6, "swiglu_forward");

  auto R = randn({2, 5, 9});
  const vecd Rv = dvec(R);
  auto dg = nan_filled({2, 5, 9}), du = nan_filled({2, 5, 9});
  ops::swiglu_backward(dg, du, R, g, u);
  auto gg = fd_grad([&](const vecd& G) { return dot(swiglu_ref(G, uv), Rv); }, gv);
  auto gu = fd_grad([&](const vecd& U) { return dot(swiglu_ref(gv, U), Rv); }, uv);
  check_close(dg, gg, k_grad_rtol, k_grad_atol, "swiglu dgate");
  check_close(du, gu, k_grad_rtol, k_grad_atol, "swiglu dup");
}

// ====================================================================== RoPE

TEST_CASE("rope: both layouts, backward, inverse") {
  const int64_t B = 2, T = 5, NH = 3, hs = 8;
  // batch 1 is left padded: positions restart at the first real token
  auto pos = tensor::from_ints({B, T}, {0, 1, 2, 3, 4, 0, 0, 0, 1, 2});
  const auto pv = ivec(pos);
  for (auto layout : {ops::rope_layout::adjacent, ops::rope_layout::half}) {
    for (float theta : {10000.0f, 500000.0f}) {
      CAPTURE(static_cast<int>(layout));
      CAPTURE(theta);
      auto x = randn({B, T, NH, hs});
      const vecd xv = dvec(x);
      auto y = x.clone();
      ops::rope_forward(y, pos, theta, layout);
      check_close(y, rope_ref(xv, pv, B * T, NH, hs, theta, layout), k_rtol, 2e-6, "rope_forward");

      // inverse: backward(forward(x)) == x
      auto z = y.clone();
      ops::rope_backward(z, pos, theta, layout);
      check_close(z, xv, 0, 2e-6, "rope_backward(rope_forward(x))");

      // backward is the gradient of L = sum(rope(x) * R)
      auto R = randn({B, T, NH, hs});
      const vecd Rv = dvec(R);
      auto dx = R.clone();
      ops::rope_backward(dx, pos, theta, layout);
      auto g = fd_grad([&](const vecd& X) { return dot(rope_ref(X, pv, B * T, NH, hs, theta, layout), Rv); }, xv);
      check_close(dx, g, k_grad_rtol, k_grad_atol, "rope_backward");
    }
  }
}

TEST_CASE("rope: known values and llama2.c's float formula") {
  // hs = 2, pos 1: angle = 1 rad; (1, 0) -> (cos 1, sin 1)
  auto pos1 = tensor::from_ints({1, 1}, {1});
  auto x = tensor::from_floats({1, 1, 1, 2}, {1, 0});
  ops::rope_forward(x, pos1, 10000.0f, ops::rope_layout::adjacent);
  check_close(x, {std::cos(1.0), std::sin(1.0)}, 0, 1e-7, "rope hs=2");

  // half layout, hs = 4: pairs (0, 2) at freq 1 and (1, 3) at freq 10000^(-1/2) = 0.01
  auto h1 = tensor::from_floats({1, 1, 1, 4}, {1, 0, 0, 0});
  ops::rope_forward(h1, pos1, 10000.0f, ops::rope_layout::half);
  check_close(h1, {std::cos(1.0), 0, std::sin(1.0), 0}, 0, 1e-7, "rope half pair 0");
  auto h2 = tensor::from_floats({1, 1, 1, 4}, {0, 1, 0, 0});
  ops::rope_forward(h2, pos1, 10000.0f, ops::rope_layout::half);
  check_close(h2, {0, std::cos(0.01), 0, std::sin(0.01)}, 0, 1e-7, "rope half pair 1");
  // adjacent layout, hs = 4: pairs (0, 1) and (2, 3)
  auto a2 = tensor::from_floats({1, 1, 1, 4}, {0, 0, 1, 0});
  ops::rope_forward(a2, pos1, 10000.0f, ops::rope_layout::adjacent);
  check_close(a2, {0, 0, std::cos(0.01), std::sin(0.01)}, 0, 1e-7, "rope adjacent pair 1");
  // position 0 is the identity
  auto pos0 = tensor::from_ints({1, 1}, {0});
  auto i0 = randn({1, 1, 2, 6});
  auto i1 = i0.clone();
  ops::rope_forward(i1, pos0, 10000.0f, ops::rope_layout::half);
  check_close(i1, dvec(i0), 0, 0, "rope pos 0");

  // llama2.c's forward(): freq = 1/powf(10000, head_dim/(float)head_size), val = pos*freq, cosf/sinf
  const int64_t hs = 64, NH = 2, T = 3;
  auto posl = tensor::from_ints({1, T}, {5, 100, 255});
  auto xl = randn({1, T, NH, hs});
  std::vector<float> want = xl.to_floats();
  for (int64_t t = 0; t < T; ++t) {
    const int p = posl.data<int32_t>()[t];
    for (int64_t i = 0; i < NH * hs; i += 2) {
      const int head_dim = static_cast<int>(i % hs);
      const float freq = 1.0f / powf(10000.0f, head_dim / static_cast<float>(hs));
      const float val = p * freq;
      const float fcr = cosf(val), fci = sinf(val);
      float* v = want.data() + t * NH * hs + i;
      const float v0 = v[0], v1 = v[1];
      v[0] = v0 * fcr - v1 * fci;
      v[1] = v0 * fci + v1 * fcr;
    }
  }
  ops::rope_forward(xl, posl, 10000.0f, ops::rope_layout::adjacent);
  check_close(xl, vecd(want.begin(), want.end()), 0, 1e-6, "rope vs llama2.c float formula");
}

// ====================================================================== attention

namespace {
struct attn_case {
  attn_dims d;
  tensor q, k, v, mask;
};

attn_case make_attn(int64_t B, int64_t Tq, int64_t H, int64_t hs, int64_t S, int64_t KV, int64_t n_keys) {
  attn_case c{{B, Tq, H, hs, S, KV, n_keys}, randn({B, Tq, H, hs}), randn({B, S, KV, hs}), randn({B, S, KV, hs}), {}};
  return c;
}

/// Run ops::attention_forward and check out and att against the float64 reference.
void check_attention_forward(const attn_case& c, const std::string& what) {
  const auto& d = c.d;
  auto out = nan_filled({d.B, d.Tq, d.H, d.hs});
  auto att = nan_filled({d.B, d.H, d.Tq, d.n_keys});
  ops::attention_forward(out, att, c.q, c.k, c.v, c.mask, d.n_keys);
  std::vector<int> mv;
  if (c.mask.defined()) mv = ivec(c.mask);
  vecd att_ref;
  auto out_ref = attention_ref(dvec(c.q), dvec(c.k), dvec(c.v), c.mask.defined() ? &mv : nullptr,
                               c.mask.defined() ? c.mask.size(1) : 0, d, &att_ref);
  check_close(out, out_ref, k_rtol, k_atol, what + " out");
  check_close(att, att_ref, k_rtol, 1e-6, what + " att");

  // att undefined (inference): same output
  tensor none;
  auto out2 = nan_filled({d.B, d.Tq, d.H, d.hs});
  ops::attention_forward(out2, none, c.q, c.k, c.v, c.mask, d.n_keys);
  check_close(out2, dvec(out), 0, 0, what + " out without att");
}
}  // namespace

TEST_CASE("attention forward: MHA and GQA") {
  for (int64_t KV : {6, 3, 2, 1}) {
    CAPTURE(KV);
    auto c = make_attn(2, 5, 6, 8, 5, KV, 5);
    check_attention_forward(c, "attention KV=" + std::to_string(KV));
  }
}

TEST_CASE("attention forward: padding mask, fully masked rows") {
  auto c = make_attn(2, 5, 6, 8, 5, 2, 5);
  // batch 0 left padded (first two tokens padding), batch 1 right padded
  c.mask = tensor::from_ints({2, 5}, {0, 0, 1, 1, 1, 1, 1, 1, 1, 0});
  check_attention_forward(c, "masked attention");

  tensor out = tensor::empty({2, 5, 6, 8}), att = tensor::empty({2, 6, 5, 5});
  ops::attention_forward(out, att, c.q, c.k, c.v, c.mask);
  auto ov = out.to_floats(), av = att.to_floats();
  for (int64_t h = 0; h < 6; ++h)
    for (int64_t i = 0; i < 5; ++i) {
      double rowsum = 0;
      for (int64_t j = 0; j < 5; ++j) rowsum += av[((0 * 6 + h) * 5 + i) * 5 + j];
      if (i < 2) {  // left-padded queries see no key: zero output, zero att row
        CHECK(rowsum == 0.0);
        for (int64_t cc = 0; cc < 8; ++cc) CHECK(ov[((0 * 5 + i) * 6 + h) * 8 + cc] == 0.0f);
      } else {
        CHECK(rowsum == doctest::Approx(1.0).epsilon(1e-6));
        CHECK(av[((0 * 6 + h) * 5 + i) * 5 + 0] == 0.0f);  // padded keys get no weight
        CHECK(av[((0 * 6 + h) * 5 + i) * 5 + 1] == 0.0f);
      }
      // causal: nothing above the diagonal
      for (int64_t j = i + 1; j < 5; ++j) CHECK(av[((1 * 6 + h) * 5 + i) * 5 + j] == 0.0f);
    }
}

TEST_CASE("attention forward: decode (Tq < n_keys) matches the last rows of the full computation") {
  const int64_t B = 2, T = 6, H = 6, KV = 3, hs = 8;
  auto full = make_attn(B, T, H, hs, T, KV, T);
  full.mask = tensor::from_ints({B, T}, {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  auto out_full = tensor::empty({B, T, H, hs}), att_full = tensor::empty({B, H, T, T});
  ops::attention_forward(out_full, att_full, full.q, full.k, full.v, full.mask);
  for (int64_t Tq : {1, 2, 6}) {
    CAPTURE(Tq);
    // q for the last Tq positions
    auto q = tensor::empty({B, Tq, H, hs});
    for (int64_t b = 0; b < B; ++b)
      q.rows(b, b + 1).copy_from(full.q.rows(b, b + 1).view({T, H * hs}).rows(T - Tq, T));
    auto out = tensor::empty({B, Tq, H, hs}), att = tensor::empty({B, H, Tq, T});
    ops::attention_forward(out, att, q, full.k, full.v, full.mask, T);
    auto of = out_full.to_floats(), af = att_full.to_floats();
    vecd want_o, want_a;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = T - Tq; i < T; ++i)
        for (int64_t e = 0; e < H * hs; ++e) want_o.push_back(of[(b * T + i) * H * hs + e]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = T - Tq; i < T; ++i)
          for (int64_t j = 0; j < T; ++j) want_a.push_back(af[((b * H + h) * T + i) * T + j]);
    check_close(out, want_o, 1e-6, 1e-7, "decode out");
    check_close(att, want_a, 1e-6, 1e-7, "decode att");
  }
}

TEST_CASE("attention forward: n_keys < S (KV cache), mask (B, S) and (B, n_keys)") {
  const int64_t B = 2, S = 7, H = 4, KV = 2, hs = 6, n_keys = 5;
  for (int64_t Tq : {5, 2, 1}) {
    CAPTURE(Tq);
    auto c = make_attn(B, Tq, H, hs, S, KV, n_keys);
    check_attention_forward(c, "n_keys<S no mask");
    c.mask = tensor::from_ints({B, S}, {0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1});
    check_attention_forward(c, "n_keys<S mask (B,S)");
    c.mask = tensor::from_ints({B, n_keys}, {0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
    check_attention_forward(c, "n_keys<S mask (B,n_keys)");
  }
}

TEST_CASE("attention backward vs finite differences (GQA, padding)") {
  const int64_t B = 2, T = 5, H = 6, hs = 4;
  for (int64_t KV : {2, 3, 6}) {
    for (bool masked : {false, true}) {
      CAPTURE(KV);
      CAPTURE(masked);
      auto c = make_attn(B, T, H, hs, T, KV, T);
      if (masked) c.mask = tensor::from_ints({B, T}, {0, 0, 1, 1, 1, 1, 1, 1, 0, 1});
      std::vector<int> mv;
      if (masked) mv = ivec(c.mask);
      const std::vector<int>* mp = masked ? &mv : nullptr;
      auto out = tensor::empty({B, T, H, hs}), att = tensor::empty({B, H, T, T});
      ops::attention_forward(out, att, c.q, c.k, c.v, c.mask);

      auto R = randn({B, T, H, hs});
      const vecd Rv = dvec(R), qv = dvec(c.q), kv = dvec(c.k), vv = dvec(c.v);
      auto dq = nan_filled(c.q.shape()), dk = nan_filled(c.k.shape()), dv = nan_filled(c.v.shape());
      ops::attention_backward(dq, dk, dv, R, c.q, c.k, c.v, att);
      auto gq = fd_grad([&](const vecd& X) { return dot(attention_ref(X, kv, vv, mp, T, c.d), Rv); }, qv);
      auto gk = fd_grad([&](const vecd& X) { return dot(attention_ref(qv, X, vv, mp, T, c.d), Rv); }, kv);
      auto gv = fd_grad([&](const vecd& X) { return dot(attention_ref(qv, kv, X, mp, T, c.d), Rv); }, vv);
      check_close(dq, gq, k_grad_rtol, k_grad_atol, "attention dq");
      check_close(dk, gk, k_grad_rtol, k_grad_atol, "attention dk");
      check_close(dv, gv, k_grad_rtol, k_grad_atol, "attention dv");
    }
  }
}

// ====================================================================== softmax, losses

TEST_CASE("softmax and log_softmax forward/backward") {
  const int64_t N = 4, V = 13;
  for (bool log : {false, true}) {
    CAPTURE(log);
    auto x = randn({N, V}, 2.0);
    const vecd xv = dvec(x);
    auto out = nan_filled({N, V});
    if (log)
      ops::log_softmax_forward(out, x);
    else
      ops::softmax_forward(out, x);
    check_close(out, softmax_ref(xv, N, V, log), k_rtol, 1e-6, "softmax forward");

    // shift invariance / stability: x + 1000
    auto xs = x.clone();
    for (int64_t i = 0; i < xs.numel(); ++i) xs.data<float>()[i] += 1000.0f;
    auto outs = tensor::empty({N, V});
    if (log)
      ops::log_softmax_forward(outs, xs);
    else
      ops::softmax_forward(outs, xs);
    check_close(outs, softmax_ref(xv, N, V, log), 1e-4, 1e-4, "softmax stable");

    auto R = randn({N, V});
    const vecd Rv = dvec(R);
    auto dx = nan_filled({N, V});
    if (log)
      ops::log_softmax_backward(dx, R, out);
    else
      ops::softmax_backward(dx, R, out);
    auto g = fd_grad([&](const vecd& X) { return dot(softmax_ref(X, N, V, log), Rv); }, xv);
    check_close(dx, g, k_grad_rtol, k_grad_atol, "softmax backward");
  }
}

TEST_CASE("cross_entropy with ignore_index: losses, mean, n_valid, gradient") {
  const int64_t N = 6, V = 13;
  auto logits = randn({2, 3, V}, 2.0);
  auto targets = tensor::from_ints({2, 3}, {3, -100, 12, 0, -100, 7});
  const vecd xv = dvec(logits);
  const auto tv = ivec(targets);
  auto losses = nan_filled({2, 3});
  int64_t n_valid = -1;
  const double mean = ops::cross_entropy_forward(losses, logits, targets, &n_valid);
  const vecd lr = ce_ref(xv, tv, N, V);
  check_close(losses, lr, k_rtol, 1e-6, "cross_entropy losses");
  CHECK(n_valid == 4);
  double want_mean = 0;
  for (double l : lr) want_mean += l;
  want_mean /= 4;
  CHECK(mean == doctest::Approx(want_mean).epsilon(1e-6));
  CHECK(losses.item(1) == 0.0f);
  CHECK(losses.item(4) == 0.0f);

  // gradient of the mean loss
  auto dl = nan_filled({2, 3, V});
  ops::cross_entropy_backward(dl, logits, targets, 1.0f / static_cast<float>(n_valid));
  auto g = fd_grad(
      [&](const vecd& X) {
        auto l = ce_ref(X, tv, N, V);
        double s = 0;
        for (double v : l) s += v;
        return s / 4;
      },
      xv);
  check_close(dl, g, k_grad_rtol, 1e-5, "cross_entropy dlogits");
  for (int64_t i = 0; i < V; ++i) CHECK(dl.item(1 * V + i) == 0.0f);

  // in place: dlogits == logits
  auto inplace = logits.clone();
  ops::cross_entropy_backward(inplace, inplace, targets, 1.0f / static_cast<float>(n_valid));
  check_close(inplace, dvec(dl), 1e-6, 1e-9, "cross_entropy_backward in place");

  // stability with large logits
  auto big = logits.clone();
  for (int64_t i = 0; i < big.numel(); ++i) big.data<float>()[i] = big.data<float>()[i] * 50.0f + 3e4f;
  auto lb = tensor::empty({N});
  const double mb = ops::cross_entropy_forward(lb, big, targets);
  CHECK(std::isfinite(mb));
  check_close(lb, ce_ref(dvec(big), tv, N, V), 1e-4, 2e-2, "cross_entropy large logits");

  // all rows ignored
  auto all_ign = tensor::from_ints({N}, {-100, -100, -100, -100, -100, -100});
  int64_t nv = -1;
  CHECK(ops::cross_entropy_forward(lb, logits, all_ign, &nv) == 0.0);
  CHECK(nv == 0);

  // custom ignore index
  auto t2 = tensor::from_ints({N}, {3, 0, 12, 0, 0, 7});
  CHECK(ops::cross_entropy_forward(lb, logits, t2, &nv, 0) == doctest::Approx(
            (ce_ref(xv, ivec(t2), N, V, 0)[0] + ce_ref(xv, ivec(t2), N, V, 0)[2] + ce_ref(xv, ivec(t2), N, V, 0)[5]) / 3)
            .epsilon(1e-6));
  CHECK(nv == 3);

  // targets out of range
  auto bad = tensor::from_ints({N}, {3, 13, 0, 0, 0, 0});
  CHECK_THROWS_AS(ops::cross_entropy_forward(lb, logits, bad), std::out_of_range);
  CHECK_THROWS_AS(ops::cross_entropy_backward(dl, logits, bad, 1.0f), std::out_of_range);
  auto neg = tensor::from_ints({N}, {3, -1, 0, 0, 0, 0});
  CHECK_THROWS_AS(ops::cross_entropy_forward(lb, logits, neg), std::out_of_range);
}

// ====================================================================== optimizer, norms

TEST_CASE("adamw_step: 3 steps with weight decay vs float64 torch.optim.AdamW") {
  const int64_t n = 37;
  ops::adamw_config cfg;
  cfg.lr = 1e-2f;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.95f;
  cfg.eps = 1e-8f;
  cfg.weight_decay = 0.1f;
  auto p = randn({n}), m = tensor::zeros({n}), v = tensor::zeros({n});
  vecd pd = dvec(p), md(n, 0.0), vd(n, 0.0);
  const double b1 = cfg.beta1, b2 = cfg.beta2, lr = cfg.lr, eps = cfg.eps, wd = cfg.weight_decay;
  for (int64_t t = 1; t <= 3; ++t) {
    CAPTURE(t);
    auto g = randn({n});
    const vecd gd = dvec(g);
    ops::adamw_step(p, g, m, v, t, cfg);
    for (int64_t i = 0; i < n; ++i) {
      // torch: p *= 1 - lr wd; m, v updates; p -= lr mhat / (sqrt(vhat) + eps)
      pd[i] *= 1 - lr * wd;
      md[i] = b1 * md[i] + (1 - b1) * gd[i];
      vd[i] = b2 * vd[i] + (1 - b2) * gd[i] * gd[i];
      const double mhat = md[i] / (1 - std::pow(b1, t)), vhat = vd[i] / (1 - std::pow(b2, t));
      pd[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    check_close(p, pd, 1e-6, 1e-7, "adamw param");
    check_close(m, md, 1e-6, 1e-8, "adamw m");
    check_close(v, vd, 1e-6, 1e-9, "adamw v");
  }
  auto g = randn({n});
  CHECK_THROWS_AS(ops::adamw_step(p, g, m, v, 0, cfg), std::invalid_argument);
  auto short_g = randn({n - 1});
  CHECK_THROWS_AS(ops::adamw_step(p, short_g, m, v, 4, cfg), std::invalid_argument);
}

TEST_CASE("sum_squares, global_norm, clip_grad_norm") {
  auto a = randn({3, 7}), b = randn({150001});  // b spans several reduction chunks
  double want = 0;
  for (double x : dvec(a)) want += x * x;
  double sb = 0;
  for (double x : dvec(b)) sb += x * x;
  CHECK(ops::sum_squares(b) == doctest::Approx(sb).epsilon(1e-12));
  want += sb;
  std::vector<tensor> gs = {a.clone(), b.clone()};
  CHECK(ops::global_norm(gs) == doctest::Approx(std::sqrt(want)).epsilon(1e-12));

  // no clipping when under the limit (or max_norm <= 0)
  const double norm = std::sqrt(want);
  CHECK(ops::clip_grad_norm(gs, norm * 2) == doctest::Approx(norm).epsilon(1e-12));
  check_close(gs[0], dvec(a), 0, 0, "no clip");
  CHECK(ops::clip_grad_norm(gs, 0.0) == doctest::Approx(norm).epsilon(1e-12));
  check_close(gs[1], dvec(b), 0, 0, "max_norm 0: no clip");

  // clipping to max_norm: scale max_norm / (norm + 1e-6)
  const double max_norm = 1.5;
  CHECK(ops::clip_grad_norm(gs, max_norm) == doctest::Approx(norm).epsilon(1e-12));
  const double s = max_norm / (norm + 1e-6);
  vecd wa = dvec(a);
  for (auto& x : wa) x *= s;
  check_close(gs[0], wa, 1e-6, 0, "clipped a");
  CHECK(ops::global_norm(gs) == doctest::Approx(max_norm).epsilon(1e-5));
}

// ====================================================================== large shapes (OpenMP paths)

TEST_CASE("large shapes: parallel paths agree with float64 references") {
  SUBCASE("rmsnorm and layernorm") {
    const int64_t N = 96, C = 768;
    auto x = randn({N, C}), w = randn({C}, 0.3, 1.0), b = randn({C});
    const vecd xv = dvec(x), wv = dvec(w), bv = dvec(b);
    auto out = tensor::empty({N, C}), rstd = tensor::empty({N}), mean = tensor::empty({N});
    ops::rmsnorm_forward(out, rstd, x, w, 1e-5f);
    check_close(out, rmsnorm_ref(xv, wv, N, C, 1e-5), k_rtol, k_atol, "rmsnorm large");
    auto R = randn({N, C});
    const vecd Rv = dvec(R);
    auto dx = tensor::zeros({N, C}), dw = tensor::zeros({C});
    ops::rmsnorm_backward(dx, dw, R, x, w, rstd);
    check_dir(dx, [&](const vecd& X) { return dot(rmsnorm_ref(X, wv, N, C, 1e-5), Rv); }, xv, "rmsnorm large dx");
    check_dir(dw, [&](const vecd& W) { return dot(rmsnorm_ref(xv, W, N, C, 1e-5), Rv); }, wv, "rmsnorm large dw");

    ops::layernorm_forward(out, mean, rstd, x, w, b, 1e-5f);
    check_close(out, layernorm_ref(xv, wv, &bv, N, C, 1e-5), k_rtol, k_atol, "layernorm large");
    dx.zero_(), dw.zero_();
    auto db = tensor::zeros({C});
    ops::layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
    check_dir(dx, [&](const vecd& X) { return dot(layernorm_ref(X, wv, &bv, N, C, 1e-5), Rv); }, xv, "ln large dx");
    check_dir(dw, [&](const vecd& W) { return dot(layernorm_ref(xv, W, &bv, N, C, 1e-5), Rv); }, wv, "ln large dw");
    vecd colsum(static_cast<size_t>(C), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) colsum[c] += Rv[n * C + c];
    check_close(db, colsum, 1e-5, 1e-5, "ln large db");
  }
  SUBCASE("linear with bias, embedding backward") {
    const int64_t N = 128, IC = 96, OC = 300;
    auto x = randn({N, IC}), w = randn({OC, IC}, 0.1), bias = randn({OC});
    const vecd xv = dvec(x), wv = dvec(w), bv = dvec(bias);
    auto out = tensor::empty({N, OC});
    ops::linear_forward(out, x, w, bias);
    check_close(out, linear_ref(xv, wv, &bv, N, IC, OC), 1e-5, 1e-4, "linear large");
    auto R = randn({N, OC});
    auto dx = tensor::zeros({N, IC}), dw = tensor::zeros({OC, IC}), db = tensor::zeros({OC});
    ops::linear_backward(dx, dw, db, R, x, w);
    const vecd Rv = dvec(R);
    check_close(dx, matmul_ref(Rv, wv, N, IC, OC, false, false), 1e-5, 1e-4, "linear large dx");
    check_close(dw, matmul_ref(Rv, xv, OC, IC, N, true, false), 1e-5, 1e-4, "linear large dw");
    vecd colsum(static_cast<size_t>(OC), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < OC; ++c) colsum[c] += Rv[n * OC + c];
    check_close(db, colsum, 1e-5, 1e-5, "linear large dbias");

    const int64_t V = 50, C = 700;
    std::vector<int32_t> ids(N);
    for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 7) % V);
    auto idt = tensor::from_ints({N}, ids);
    auto dout = randn({N, C});
    auto dwte = tensor::zeros({V, C});
    ops::embedding_backward(dwte, dout, idt);
    const vecd dv = dvec(dout);
    vecd want(static_cast<size_t>(V * C), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) want[ids[n] * C + c] += dv[n * C + c];
    check_close(dwte, want, 1e-6, 1e-6, "embedding_backward large");
  }
  SUBCASE("softmax and cross entropy") {
    const int64_t N = 48, V = 5003;
    auto x = randn({N, V}, 3.0);
    const vecd xv = dvec(x);
    auto out = tensor::empty({N, V});
    ops::log_softmax_forward(out, x);
    check_close(out, softmax_ref(xv, N, V, true), 1e-5, 1e-5, "log_softmax large");
    ops::softmax_forward(out, x);
    check_close(out, softmax_ref(xv, N, V, false), 1e-5, 1e-8, "softmax large");

    std::vector<int32_t> t(N);
    for (int64_t n = 0; n < N; ++n) t[n] = n % 5 == 0 ? -100 : static_cast<int32_t>((n * 131) % V);
    auto tt = tensor::from_ints({N}, t);
    auto losses = tensor::empty({N});
    int64_t nv = 0;
    const double mean = ops::cross_entropy_forward(losses, x, tt, &nv);
    const std::vector<int> ti(t.begin(), t.end());
    auto lr = ce_ref(xv, ti, N, V);
    check_close(losses, lr, 1e-5, 1e-5, "cross_entropy large");
    double s = 0;
    for (double l : lr) s += l;
    CHECK(nv == N - (N + 4) / 5);
    CHECK(mean == doctest::Approx(s / nv).epsilon(1e-6));
    auto dl = tensor::empty({N, V});
    ops::cross_entropy_backward(dl, x, tt, 1.0f / nv);
    check_dir(dl,
              [&](const vecd& X) {
                double m = 0;
                for (double l : ce_ref(X, ti, N, V)) m += l;
                return m / nv;
              },
              xv, "cross_entropy large dlogits");
  }
  SUBCASE("attention") {
    const int64_t B = 2, T = 48, H = 4, KV = 2, hs = 32;
    auto c = make_attn(B, T, H, hs, T, KV, T);
    std::vector<int32_t> m(B * T, 1);
    for (int64_t j = 0; j < 7; ++j) m[j] = 0;  // batch 0 left padded by 7
    c.mask = tensor::from_ints({B, T}, m);
    check_attention_forward(c, "attention large");
    const std::vector<int> mv(m.begin(), m.end());
    auto out = tensor::empty({B, T, H, hs}), att = tensor::empty({B, H, T, T});
    ops::attention_forward(out, att, c.q, c.k, c.v, c.mask);
    auto R = randn({B, T, H, hs});
    const vecd Rv = dvec(R), qv = dvec(c.q), kv = dvec(c.k), vv = dvec(c.v);
    auto dq = tensor::empty(c.q.shape()), dk = tensor::empty(c.k.shape()), dv = tensor::empty(c.v.shape());
    ops::attention_backward(dq, dk, dv, R, c.q, c.k, c.v, att);
    check_dir(dq, [&](const vecd& X) { return dot(attention_ref(X, kv, vv, &mv, T, c.d), Rv); }, qv, "att large dq");
    check_dir(dk, [&](const vecd& X) { return dot(attention_ref(qv, X, vv, &mv, T, c.d), Rv); }, kv, "att large dk");
    check_dir(dv, [&](const vecd& X) { return dot(attention_ref(qv, kv, X, &mv, T, c.d), Rv); }, vv, "att large dv");
  }
  SUBCASE("attention on causal row blocks: a block cut short, one to three packed panels, a KV-cache offset") {
    // the GEMM path (Tq >= 32) works in blocks of 12 queries that see keys [0, kend): T = 37 ends
    // with a block of one row; hs = 8, 20 and 40 take one, two and three panels of 16 (AVX2; one
    // and two of 32 on AVX-512). B 4 x T 64 x hs 64 is above k_par_macs: the threads' own buffers.
    struct shape { int64_t B, T, H, KV, hs; };
    for (const shape sh : {shape{2, 37, 4, 2, 8}, shape{2, 37, 4, 2, 20}, shape{2, 37, 4, 2, 40}, shape{4, 64, 4, 2, 64}}) {
      const int64_t B = sh.B, T = sh.T, H = sh.H, KV = sh.KV, hs = sh.hs;
      CAPTURE(T);
      CAPTURE(hs);
      auto c = make_attn(B, T, H, hs, T, KV, T);
      std::vector<int32_t> m(B * T, 1);
      for (int64_t j = 0; j < 13; ++j) m[j] = 0;        // batch 0 left padded past the first block
      for (int64_t j = 30; j < T; ++j) m[T + j] = 0;    // batch 1 right padded
      c.mask = tensor::from_ints({B, T}, m);
      check_attention_forward(c, "attention blocks hs=" + std::to_string(hs));
      const std::vector<int> mv(m.begin(), m.end());
      auto out = tensor::empty({B, T, H, hs}), att = tensor::empty({B, H, T, T});
      ops::attention_forward(out, att, c.q, c.k, c.v, c.mask);
      // the blocks skip exact zeros only: batch 1, head 3's output is, bit for bit, the whole
      // product P V over every key (the same packed kernel through ops::matmul)
      {
        const int64_t b = 1, h = 3, kvh = h / (H / KV);
        auto P = att.view({B * H, T, T}).rows(b * H + h, b * H + h + 1).view({T, T}).clone();
        auto Vh = tensor::empty({T, hs}), want = tensor::empty({T, hs});
        for (int64_t j = 0; j < T; ++j)
          std::copy_n(c.v.data<float>() + ((b * T + j) * KV + kvh) * hs, hs, Vh.data<float>() + j * hs);
        ops::matmul(want, P, Vh, false, false);
        int64_t differ = 0;
        for (int64_t i = 0; i < T; ++i)
          for (int64_t e = 0; e < hs; ++e)
            differ += out.data<float>()[((b * T + i) * H + h) * hs + e] != want.data<float>()[i * hs + e];
        CHECK(differ == 0);
      }
      // backward reads att's causal part only: NaN above the diagonal must not reach the gradients
      float* ap = att.data<float>();
      for (int64_t r = 0; r < B * H; ++r)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = i + 1; j < T; ++j) ap[(r * T + i) * T + j] = std::numeric_limits<float>::quiet_NaN();
      auto R = randn({B, T, H, hs});
      const vecd Rv = dvec(R), qv = dvec(c.q), kv = dvec(c.k), vv = dvec(c.v);
      auto dq = nan_filled(c.q.shape()), dk = nan_filled(c.k.shape()), dv = nan_filled(c.v.shape());
      ops::attention_backward(dq, dk, dv, R, c.q, c.k, c.v, att);
      check_dir(dq, [&](const vecd& X) { return dot(attention_ref(X, kv, vv, &mv, T, c.d), Rv); }, qv, "blocks dq");
      check_dir(dk, [&](const vecd& X) { return dot(attention_ref(qv, X, vv, &mv, T, c.d), Rv); }, kv, "blocks dk");
      check_dir(dv, [&](const vecd& X) { return dot(attention_ref(qv, kv, X, &mv, T, c.d), Rv); }, vv, "blocks dv");
    }
    // a prefill after 10 cached keys (query i at position 10 + i), keys past n_keys unused
    auto c = make_attn(2, 34, 4, 8, 50, 2, 44);
    check_attention_forward(c, "attention blocks, n_keys > Tq");
    std::vector<int32_t> m(2 * 50, 1);
    for (int64_t j = 0; j < 3; ++j) m[j] = 0;
    c.mask = tensor::from_ints({2, 50}, m);
    check_attention_forward(c, "attention blocks, n_keys > Tq, padded");
  }
  SUBCASE("rope, activations, swiglu, adamw") {
    const int64_t B = 4, T = 64, NH = 8, hs = 64;
    std::vector<int32_t> pv(B * T);
    for (int64_t i = 0; i < B * T; ++i) pv[i] = static_cast<int32_t>(i % T);
    auto pos = tensor::from_ints({B, T}, pv);
    auto x = randn({B, T, NH, hs});
    auto y = x.clone();
    ops::rope_forward(y, pos, 10000.0f, ops::rope_layout::half);
    check_close(y, rope_ref(dvec(x), std::vector<int>(pv.begin(), pv.end()), B * T, NH, hs, 10000.0, ops::rope_layout::half),
                1e-5, 2e-5, "rope large");
    ops::rope_backward(y, pos, 10000.0f, ops::rope_layout::half);
    check_close(y, dvec(x), 0, 2e-5, "rope large inverse");

    auto g = randn({B * T, 300}), u = randn({B * T, 300});
    auto o = tensor::empty({B * T, 300});
    ops::swiglu_forward(o, g, u);
    check_close(o, swiglu_ref(dvec(g), dvec(u)), 1e-5, 1e-6, "swiglu large");
    ops::activation_forward(o, g, ops::activation::gelu_tanh);
    check_close(o, act_ref(dvec(g), ops::activation::gelu_tanh), 1e-5, 1e-6, "gelu large");
  }
}

// ====================================================================== errors

namespace {
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("shape, dtype and argument errors throw std::invalid_argument") {
  auto a = randn({2, 3}), b = randn({3, 2});
  auto out = tensor::empty({2, 3});
  // the message names the op and shows expected vs actual shapes
  const auto msg = error_of([&] { ops::add(out, a, b); });
  CHECK(msg.find("add") != std::string::npos);
  CHECK(msg.find("(2, 3)") != std::string::npos);
  CHECK(msg.find("(3, 2)") != std::string::npos);

  auto mo = tensor::empty({2, 2});
  CHECK_THROWS_AS(ops::matmul(mo, a, a, false, false), std::invalid_argument);  // inner dims 3 vs 2
  auto mo2 = tensor::empty({2, 4});
  CHECK_THROWS_AS(ops::matmul(mo2, a, b, false, false), std::invalid_argument);  // out shape
  CHECK(error_of([&] { ops::matmul(mo2, a, b, false, false); }).find("matmul") != std::string::npos);
  auto ba = randn({2, 3, 4}), bb = randn({3, 4, 5}), bo = tensor::empty({2, 3, 5});
  CHECK_THROWS_AS(ops::matmul_batched(bo, ba, bb, false, false), std::invalid_argument);  // batch mismatch

  auto x = randn({4, 7}), w = randn({5, 6}), lo = tensor::empty({4, 5});
  CHECK_THROWS_AS(ops::linear_forward(lo, x, w, tensor()), std::invalid_argument);
  auto w2 = randn({5, 7}), bias = randn({4});
  CHECK_THROWS_AS(ops::linear_forward(lo, x, w2, bias), std::invalid_argument);

  auto rw = randn({6}), ro = tensor::empty({4, 7}), rs = tensor::empty({4});
  CHECK_THROWS_AS(ops::rmsnorm_forward(ro, rs, x, rw, 1e-5f), std::invalid_argument);
  auto rw7 = randn({7}), rs3 = tensor::empty({3});
  CHECK_THROWS_AS(ops::rmsnorm_forward(ro, rs3, x, rw7, 1e-5f), std::invalid_argument);

  auto ao = tensor::empty({4, 6});
  CHECK_THROWS_AS(ops::activation_forward(ao, x, ops::activation::relu), std::invalid_argument);
  auto g = randn({4, 7}), u = randn({4, 6});
  CHECK_THROWS_AS(ops::swiglu_forward(ro, g, u), std::invalid_argument);

  auto rx = randn({1, 2, 3, 5});  // odd head size
  auto rp = tensor::from_ints({1, 2}, {0, 1});
  CHECK_THROWS_AS(ops::rope_forward(rx, rp, 10000.0f, ops::rope_layout::adjacent), std::invalid_argument);
  auto rx2 = randn({1, 2, 3, 4});
  auto rp2 = tensor::from_ints({2, 1}, {0, 1});
  CHECK_THROWS_AS(ops::rope_forward(rx2, rp2, 10000.0f, ops::rope_layout::adjacent), std::invalid_argument);
  auto rpf = tensor::from_floats({1, 2}, {0, 1});
  CHECK_THROWS_AS(ops::rope_forward(rx2, rpf, 10000.0f, ops::rope_layout::adjacent), std::invalid_argument);

  auto q = randn({1, 3, 6, 4}), k = randn({1, 3, 4, 4}), v = randn({1, 3, 4, 4});
  auto qo = tensor::empty({1, 3, 6, 4});
  tensor none;
  CHECK_THROWS_AS(ops::attention_forward(qo, none, q, k, v, none), std::invalid_argument);  // 6 % 4 != 0
  auto k2 = randn({1, 3, 2, 4}), v2 = randn({1, 3, 2, 4});
  CHECK_NOTHROW(ops::attention_forward(qo, none, q, k2, v2, none));
  CHECK_THROWS_AS(ops::attention_forward(qo, none, q, k2, v2, none, 4), std::invalid_argument);  // n_keys > S
  CHECK_THROWS_AS(ops::attention_forward(qo, none, q, k2, v2, none, 2), std::invalid_argument);  // Tq > n_keys
  auto badmask = tensor::from_ints({1, 2}, {1, 1});
  CHECK_THROWS_AS(ops::attention_forward(qo, none, q, k2, v2, badmask), std::invalid_argument);
  auto badatt = tensor::empty({1, 6, 3, 2});
  CHECK_THROWS_AS(ops::attention_forward(qo, badatt, q, k2, v2, none), std::invalid_argument);
  auto att = tensor::empty({1, 6, 3, 3});
  auto dq = tensor::empty(q.shape()), dk = tensor::empty(k2.shape()), dv = tensor::empty({1, 3, 2, 5});
  CHECK_THROWS_AS(ops::attention_backward(dq, dk, dv, q, q, k2, v2, att), std::invalid_argument);

  auto sx = randn({3, 5}), so = tensor::empty({5, 3});
  CHECK_THROWS_AS(ops::softmax_forward(so, sx), std::invalid_argument);
  auto losses = tensor::empty({3});
  auto tgt = tensor::from_ints({4}, {0, 1, 2, 3});
  CHECK_THROWS_AS(ops::cross_entropy_forward(losses, sx, tgt), std::invalid_argument);
  auto tgt3f = tensor::from_floats({3}, {0, 1, 2});
  CHECK_THROWS_AS(ops::cross_entropy_forward(losses, sx, tgt3f), std::invalid_argument);

  auto ids = tensor::from_ints({3}, {0, 1, 2});
  auto wte = randn({5, 4}), eo = tensor::empty({3, 5});
  CHECK_THROWS_AS(ops::embedding_forward(eo, ids, wte), std::invalid_argument);

  // dtype: i32 where f32 is expected, undefined tensors
  auto iy = tensor::from_ints({6}, {1, 2, 3, 4, 5, 6});
  auto fx = randn({6});
  CHECK_THROWS_AS(ops::axpy(iy, fx, 1.0f), std::invalid_argument);
  CHECK_THROWS_AS(ops::axpy(fx, iy, 1.0f), std::invalid_argument);
  tensor undef;
  CHECK_THROWS_AS(ops::scale(undef, 2.0f), std::invalid_argument);
  CHECK_THROWS_AS(ops::sum_squares(undef), std::invalid_argument);
}

TEST_CASE("compute_scope: threads running ops at once split the cores, and a caller left alone gets them back") {
  // Two threads inside a compute_scope at once: each op either starts runs on max(1, hw / 2)
  // OpenMP threads (its budget is hw). Alone in a scope: hw again. Outside: the budget, untouched.
  const int hw = ops::hardware_threads();
  auto x = tensor::from_floats({4}, {1, 2, 3, 4});
  std::latch both_in(2), both_ran(2);
  int team[2] = {0, 0}, alone = 0, after = 0, busy_seen[2] = {0, 0};
  auto caller = [&](int i) {
    ops::set_thread_budget(hw);
    {
      ops::compute_scope scope;
      both_in.arrive_and_wait();
      busy_seen[i] = ops::busy_compute_threads();
      ops::scale(x, 1.0f);  // an op: takes this thread's share
      team[i] = omp_get_max_threads();
      both_ran.arrive_and_wait();
      if (i == 0) {
        while (ops::busy_compute_threads() > 1) std::this_thread::yield();  // thread 1 has left its scope
        ops::scale(x, 1.0f);
        alone = omp_get_max_threads();
      }
    }
    if (i == 0) after = omp_get_max_threads();
  };
  std::thread t0(caller, 0), t1(caller, 1);
  t0.join();
  t1.join();
  CHECK(busy_seen[0] == 2);
  CHECK(busy_seen[1] == 2);
  CHECK(team[0] == std::max(1, hw / 2));
  CHECK(team[1] == std::max(1, hw / 2));
  CHECK(alone == hw);
  CHECK(after == hw);
  CHECK(ops::busy_compute_threads() == 0);
  // outside any scope an op keeps the thread's budget
  ops::set_thread_budget(1);
  ops::scale(x, 1.0f);
  CHECK(omp_get_max_threads() == 1);
  ops::set_thread_budget(hw);
  CHECK(x.data<float>()[3] == 4.0f);
}

// The largest relative error of C = c0 + A op(B) against float64 over the given rows and columns: A is (M, K) row-major,
// B is (N, K) when tb (op(B) = Bᵀ) else (K, N), C is (M, N); the error of C[i][j] is divided by |c0| + sum_k |A[i][k] op(B)[k][j]|.
static double gemm_worst_rel(const std::vector<float>& A, const std::vector<float>& B, bool tb, int64_t N, int64_t K,
                             const float* C, const std::vector<int64_t>& rows, const std::vector<int64_t>& cols, double c0) {
  double worst = 0;
  for (int64_t i : rows)
    for (int64_t j : cols) {
      double want = c0, absum = std::fabs(c0);
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
        want += p;
        absum += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(C[i * N + j] - want) / absum);
    }
  return worst;
}

TEST_CASE("cpu gemm, large op(B): every product against float64, and x·Wᵀ keeps a row's bits whatever M where split") {
  // op(B) of 1,100 x 1,000 floats (4.4 MB): above the packed kernel's 1 MiB, so dy·W and dyᵀ·x go to the
  // library (OpenBLAS or BLIS on CPUs without AVX-512, runtime/kernels/cpu/gemm.h), and x·Wᵀ, where the
  // products are split, to the packed kernel in two column chunks (4 MiB each at most: 1,040 + 60 columns on
  // AVX2, 1,024 + 76 on AVX-512; the columns checked sit on both boundaries)
  const int64_t M = 64, N = 1100, K = 1000;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> A(M * K), B(N * K), At(K * M);
  for (auto& v : A) v = nd(rng);
  for (auto& v : B) v = nd(rng);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) At[k * M + i] = A[i * K + k];
  const bool split = ops::cpu_gemm_library().find("x·Wᵀ on flowrun's packed kernel") != std::string::npos;
  for (int layout = 0; layout < 3; ++layout) {  // x·Wᵀ (N, T), dy·W (N, N), dyᵀ·x (T, N)
    const bool ta = layout == 2, tb = layout == 0;
    CAPTURE(layout);
    std::vector<float> C(M * N, 0.5f);  // beta = 1 accumulates into 0.5, as linear_backward's dx and dW do
    cpu_backend().gemm(ta, tb, M, N, K, 1.0f, ta ? At.data() : A.data(), ta ? M : K, B.data(), tb ? K : N, 1.0f,
                       C.data(), N);
    CHECK(gemm_worst_rel(A, B, tb, N, K, C.data(), {0, 17, M - 1}, {0, 1023, 1024, 1039, 1040, N - 1}, 0.5) < 1e-6);
  }
  if (!split) return;
  // the forward's rule: rows [5, 5 + 20) alone give the bits of the 64-row call, bit for bit
  std::vector<float> all(M * N), part(20 * N);
  cpu_backend().gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, all.data(), N);
  cpu_backend().gemm(false, true, 20, N, K, 1.0f, A.data() + 5 * K, K, B.data(), K, 0.0f, part.data(), N);
  int64_t differ = 0;
  for (int64_t i = 0; i < 20 * N; ++i) differ += part[i] != all[5 * N + i];
  CHECK(differ == 0);
}

TEST_CASE("cpu gemm, small op(B) (the packed kernel): a team gives the one-thread bits, rows above 16 ignore M") {
  // 512 x 128 x 128: 8.4 M multiply-adds, above the one-thread limit (cpu_gemm::k_par_macs), so a team
  // packs its shares of op(B), meets at a barrier and splits the tiles; op(B) is 64 KiB: the packed kernel
  const int64_t M = 512, N = 128, K = 128;
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> A(M * K), B(N * K);
  for (auto& v : A) v = nd(rng);
  for (auto& v : B) v = nd(rng);
  const int hw = ops::hardware_threads();
  auto run = [&](int threads, bool tb, int64_t m, int64_t row0) {
    ops::set_thread_budget(threads);
    std::vector<float> C(m * N, std::numeric_limits<float>::quiet_NaN());
    cpu_backend().gemm(false, tb, m, N, K, 1.0f, A.data() + row0 * K, K, B.data(), tb ? K : N, 0.0f, C.data(), N);
    return C;
  };
  for (bool tb : {true, false}) {
    CAPTURE(tb);
    const auto one = run(1, tb, M, 0), team = run(std::max(2, hw), tb, M, 0);
    int64_t differ = 0;
    for (int64_t i = 0; i < M * N; ++i) differ += one[i] != team[i];
    CHECK(differ == 0);
    std::vector<int64_t> every_column(N);  // against float64, a few rows
    std::iota(every_column.begin(), every_column.end(), int64_t(0));
    CHECK(gemm_worst_rel(A, B, tb, N, K, team.data(), {0, 255, M - 1}, every_column, 0.0) < 1e-6);
    for (int64_t m : {17, 100}) {  // rows [37, 37 + m) alone: the bits of the 512-row call
      CAPTURE(m);
      const auto part = run(std::max(2, hw), tb, m, 37);
      int64_t diff = 0;
      for (int64_t i = 0; i < m * N; ++i) diff += part[i] != one[37 * N + i];
      CHECK(diff == 0);
    }
  }
  ops::set_thread_budget(hw);
}

// A graph's node runs its ops on as many threads as the cores it shares allow at that moment
// (ops::compute_scope), so a product's bits must not depend on the thread count, or a run would not
// be deterministic. Checked for a Linear's backward products at the shapes of the bench's models
// (stories260K and the 6.1 M LLaMA: the packed kernel; GPT-2 at 256 rows: the library), both layouts,
// against float64 too; ctest's gemm_split_path runs it on the split of CPUs without AVX-512, where dy·W
// goes to OpenBLAS (cpu_gemm::openblas_blocks: fixed blocks, one thread each).
TEST_CASE("cpu gemm, backward products (dy·W, dyᵀ·x): the same bits at 1 and 2 threads") {
  MESSAGE("GEMM: " << ops::cpu_gemm_library());
  const int hw = ops::hardware_threads();
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // (rows, in, out) of a Linear: dy·W is (rows, in) = (rows, out)(out, in); dyᵀ·x is (out, in) = (out, rows)(rows, in)
  for (const auto [T, I, O] : {std::tuple<int64_t, int64_t, int64_t>{384, 64, 64}, {384, 64, 172}, {384, 172, 64},
                               {640, 288, 288}, {640, 288, 768}, {640, 768, 288}, {80, 288, 288}, {256, 768, 768},
                               {256, 768, 3072}})
    for (bool dw : {false, true}) {
      CAPTURE(T);
      CAPTURE(I);
      CAPTURE(O);
      CAPTURE(dw);
      std::vector<float> dy(T * O), w(O * I), x(T * I);
      for (auto* v : {&dy, &w, &x})
        for (auto& e : *v) e = nd(rng);
      const int64_t M = dw ? O : T, N = I, K = dw ? T : O;
      auto run = [&](int threads) {
        ops::set_thread_budget(threads);
        std::vector<float> C(M * N, 0.25f);  // beta = 1, as linear_backward accumulates
        cpu_backend().gemm(dw, false, M, N, K, 1.0f, dy.data(), O, dw ? x.data() : w.data(), I, 1.0f, C.data(), N);
        return C;
      };
      const auto one = run(1), team = run(std::max(2, hw));
      int64_t differ = 0;
      for (int64_t i = 0; i < M * N; ++i) differ += std::memcmp(&one[i], &team[i], sizeof(float)) != 0;
      CHECK(differ == 0);
      double worst = 0;  // a few outputs against float64
      for (int64_t i : {int64_t(0), M / 2, M - 1})
        for (int64_t j : {int64_t(0), N / 3, N - 1}) {
          double want = 0.25, mag = 0.25;
          for (int64_t k = 0; k < K; ++k) {
            const double a = dw ? dy[k * O + i] : dy[i * O + k], b = dw ? x[k * I + j] : w[k * I + j];
            want += a * b;
            mag += std::fabs(a * b);
          }
          worst = std::max(worst, std::fabs(team[i * N + j] - want) / mag);
        }
      CHECK(worst < 1e-6);
    }
  ops::set_thread_budget(hw);
}

// The float64 value of a float rounded to bf16 (round to nearest even), as the bf16 products read it.
static double bf16_of(float v) { return static_cast<double>(bf16_to_float(float_to_bf16(v))); }

TEST_CASE("cpu gemm, bf16 precision: bf16 inputs and fp32 accumulation where the CPU has bf16, fp32 elsewhere") {
  // C = alpha op(A) op(B) + beta C under ops::matmul_precision::bf16, every transpose, leading dims
  // wider than the rows, against float64 on the bf16-rounded inputs (runtime/kernels/cpu/gemm_bf16.h);
  // one product on a thread alone and one on a team (above cpu_gemm::k_par_macs)
  std::mt19937 rng(37);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const bool native = ops::cpu_bf16_matmul();
  MESSAGE("bf16 products on this CPU: " << (native ? "yes (oneDNN)" : "no: the setting is ignored"));
  const float alpha = 0.7f, beta = 0.3f;
  for (const auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{7, 9, 13}, {200, 300, 250}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(M);
        CAPTURE(ta);
        CAPTURE(tb);
        const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
        std::vector<float> A((ta ? K : M) * lda), B((tb ? N : K) * ldb), C0(M * ldc);
        for (auto* v : {&A, &B, &C0})
          for (auto& x : *v) x = nd(rng);
        auto a_at = [&](int64_t i, int64_t k) { return ta ? A[k * lda + i] : A[i * lda + k]; };
        auto b_at = [&](int64_t k, int64_t j) { return tb ? B[j * ldb + k] : B[k * ldb + j]; };
        std::vector<float> C = C0, F = C0;
        {
          ops::matmul_precision_scope bf16(ops::matmul_precision::bf16);
          cpu_backend().gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        }
        cpu_backend().gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, F.data(), ldc);
        double worst16 = 0, worst32 = 0;  // against the rounded inputs, and against the fp32 inputs
        int64_t same_as_f32 = 0;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double s16 = 0, s32 = 0, absum = std::fabs(beta * C0[i * ldc + j]);
            for (int64_t k = 0; k < K; ++k) {
              s16 += bf16_of(a_at(i, k)) * bf16_of(b_at(k, j));
              s32 += double(a_at(i, k)) * b_at(k, j);
              absum += std::fabs(alpha * double(a_at(i, k)) * b_at(k, j));
            }
            const double c0 = beta * double(C0[i * ldc + j]), got = C[i * ldc + j];
            worst16 = std::max(worst16, std::fabs(got - (alpha * s16 + c0)) / absum);
            worst32 = std::max(worst32, std::fabs(got - (alpha * s32 + c0)) / absum);
            same_as_f32 += C[i * ldc + j] == F[i * ldc + j];
          }
        for (int64_t i = 0; i < M; ++i)  // the padding between rows is left alone
          for (int64_t j = N; j < ldc; ++j) CHECK(C[i * ldc + j] == C0[i * ldc + j]);
        if (native) {
          CHECK_MESSAGE(worst16 < 1e-5, "against float64 on the bf16 inputs: " << worst16);
          CHECK_MESSAGE(worst32 > 1e-4, "looks like fp32 products (" << worst32 << "): inputs not rounded?");
        } else {
          CHECK(same_as_f32 == M * N);
        }
      }
  // batched small products run on an OpenMP team whose threads start at f32: they take the caller's setting
  auto a = randn({16, 24, 40}), b = randn({16, 40, 12});
  auto out = tensor::empty({16, 24, 12});
  {
    ops::matmul_precision_scope bf16(ops::matmul_precision::bf16);
    ops::matmul_batched(out, a, b, false, false);
  }
  const vecd av = dvec(a), bv = dvec(b), ov = dvec(out);
  double worst16 = 0, worst32 = 0;
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t i = 0; i < 24; ++i)
      for (int64_t j = 0; j < 12; ++j) {
        double s16 = 0, s32 = 0, absum = 0;
        for (int64_t k = 0; k < 40; ++k) {
          const double x = av[(t * 24 + i) * 40 + k], y = bv[(t * 40 + k) * 12 + j];
          s16 += bf16_of(static_cast<float>(x)) * bf16_of(static_cast<float>(y));
          s32 += x * y;
          absum += std::fabs(x * y);
        }
        const double got = ov[(t * 24 + i) * 12 + j];
        worst16 = std::max(worst16, std::fabs(got - s16) / absum);
        worst32 = std::max(worst32, std::fabs(got - s32) / absum);
      }
  if (native) {
    CHECK_MESSAGE(worst16 < 1e-5, "batched, against float64 on the bf16 inputs: " << worst16);
    CHECK_MESSAGE(worst32 > 1e-4, "batched: some items were fp32 products (" << worst32 << ")");
  } else {
    CHECK(worst32 < 1e-5);
  }
}
