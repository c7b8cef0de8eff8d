// flowrun ops: shape/dtype/device validation, then dispatch to the backend of
// the tensors' device (runtime/kernels/backend.h). Contract: ops.h.
//
// matmul, matmul_batched and linear_* are built here on the backend's raw GEMM
// (+ add_bias / bias_backward); global_norm and clip_grad_norm on sum_squares
// and scale; rope_forward / rope_backward on rope(..., inverse).
#include "runtime/kernels/ops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernels/backend.h"
#include "runtime/kernels/compute_scope.h"

namespace flowrun {

namespace detail {
// Defined in runtime/kernels/cpu/cpu_backend.cpp.
backend& cpu_backend_instance();
}  // namespace detail

namespace {
// Indexed by device_kind. Zero-initialised before any dynamic initialiser runs,
// so a backend may register itself from a static constructor.
std::atomic<backend*> g_backends[2] = {};
}  // namespace

backend& cpu_backend() { return detail::cpu_backend_instance(); }

void register_backend(device_kind k, backend* b) { g_backends[static_cast<int>(k)].store(b); }

backend& backend_for(device d) {
  if (backend* b = g_backends[static_cast<int>(d.kind)].load()) return *b;
  if (d.kind == device_kind::cpu) return cpu_backend();
  throw std::runtime_error("no kernel backend for device " + d.str() +
                           ": this build has no CUDA support (configure with -DFLOWRUN_CUDA=ON)");
}

namespace ops {
namespace {

// ---- the op profiler (ops::profile_start / profile_stop): off by default, when
// off an op costs one relaxed atomic load more. Only the outermost op of a
// thread is timed (global_norm's sum_squares calls are part of global_norm).
std::atomic<bool> g_profiling{false};
std::mutex g_profile_mutex;
std::map<std::string, op_time> g_profile;
thread_local int t_op_depth = 0;

void profile_add(const char* op, double seconds) {
  std::lock_guard<std::mutex> lock(g_profile_mutex);
  auto& e = g_profile[op];
  e.op = op;
  e.calls += 1;
  e.seconds += seconds;
}

/// Argument checks for one op; every failure throws std::invalid_argument
/// "<op>: expected <name> <shape/dtype>, got <tensor::str()>". Also times the
/// op while the profiler is on (from the check to the end of the op's scope).
struct check {
  const char* op;
  bool counted = false, timed = false;
  std::chrono::steady_clock::time_point t0;

  explicit check(const char* name) : op(name) {
    share_cores();  // inside a compute_scope: this thread's share of the cores (compute_scope.h)
    if (!g_profiling.load(std::memory_order_relaxed)) return;
    counted = true;
    if (t_op_depth++ == 0) {
      timed = true;
      t0 = std::chrono::steady_clock::now();
    }
  }
  ~check() {
    if (!counted) return;
    --t_op_depth;
    if (timed) profile_add(op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  check(const check&) = delete;
  check& operator=(const check&) = delete;

  [[noreturn]] void fail(const std::string& msg) const { throw std::invalid_argument(std::string(op) + ": " + msg); }

  void defined(const char* name, const tensor& t) const {
    if (!t.defined()) fail(std::string(name) + " is undefined");
  }
  void type(const char* name, const tensor& t, dtype dt) const {
    defined(name, t);
    if (t.type() != dt) fail(std::string("expected ") + name + " of dtype " + dtype_name(dt) + ", got " + t.str());
  }
  void f32(const char* name, const tensor& t) const { type(name, t, dtype::f32); }

  // Value checks of index tensors, done here once for every backend (a device tensor is
  // read back to the host first: one small copy, which synchronises its stream).
  static std::vector<int32_t> host_ints(const tensor& t) {
    const tensor h = t.dev().kind == device_kind::cpu ? t : t.to(device::cpu());
    const int32_t* p = h.data<int32_t>();
    return std::vector<int32_t>(p, p + h.numel());
  }
  /// Token ids in [0, V); with skip_negative, negative ids are allowed (embedding_backward skips them).
  void ids_in_range(const tensor& ids, int64_t V, bool skip_negative) const {
    const std::vector<int32_t> id = host_ints(ids);
    for (size_t n = 0; n < id.size(); ++n)
      if ((id[n] < 0 && !skip_negative) || id[n] >= V)
        throw std::out_of_range(std::string(op) + ": token id " + std::to_string(id[n]) + " at position " +
                                std::to_string(n) + " is outside [0, " + std::to_string(V) + ")");
  }
  /// Targets in [0, V) or equal to ignore_index.
  void targets_in_range(const tensor& targets, int64_t V, int32_t ignore_index) const {
    const std::vector<int32_t> tg = host_ints(targets);
    for (size_t n = 0; n < tg.size(); ++n)
      if (tg[n] != ignore_index && (tg[n] < 0 || tg[n] >= V))
        throw std::out_of_range(std::string(op) + ": target " + std::to_string(tg[n]) + " at row " +
                                std::to_string(n) + " is outside [0, " + std::to_string(V) +
                                ") and is not ignore_index " + std::to_string(ignore_index));
  }
  void shape(const char* name, const tensor& t, const shape_t& s) const {
    if (t.shape() != s) fail(std::string("expected ") + name + " " + shape_str(s) + ", got " + t.str());
  }
  void numel(const char* name, const tensor& t, int64_t n) const {
    if (t.numel() != n)
      fail(std::string("expected ") + name + " with " + std::to_string(n) + " elements, got " + t.str());
  }
  void dims(const char* name, const tensor& t, int d) const {
    if (t.dim() != d) fail(std::string("expected ") + name + " with " + std::to_string(d) + " dims, got " + t.str());
  }
  void min_dims(const char* name, const tensor& t, int d) const {
    if (t.dim() < d)
      fail(std::string("expected ") + name + " with at least " + std::to_string(d) + " dims, got " + t.str());
  }
  /// All defined tensors on the device of `first`; returns that device.
  device same_device(const tensor& first, std::initializer_list<const tensor*> others) const {
    for (const tensor* t : others)
      if (t->defined() && t->dev() != first.dev())
        fail("tensors on different devices: " + first.str() + " and " + t->str());
    return first.dev();
  }
};

/// Product of all dims but the last (the "rows" of a tensor viewed as 2-D).
int64_t leading(const tensor& t) {
  int64_t n = 1;
  for (int i = 0; i + 1 < t.dim(); ++i) n *= t.shape()[i];
  return n;
}

/// t's shape with the last dim replaced by `last`.
shape_t with_last(const tensor& t, int64_t last) {
  shape_t s = t.shape();
  s.back() = last;
  return s;
}

}  // namespace

const char* activation_name(activation a) {
  switch (a) {
    case activation::silu: return "silu";
    case activation::gelu_tanh: return "gelu_tanh";
    case activation::relu: return "relu";
  }
  return "?";
}

// ------------------------------------------------------------------ basics

void add(tensor& out, const tensor& a, const tensor& b) {
  check c{"add"};
  c.f32("out", out), c.f32("a", a), c.f32("b", b);
  c.shape("b", b, a.shape());
  c.shape("out", out, a.shape());
  backend_for(c.same_device(out, {&a, &b})).add(out, a, b);
}

void axpy(tensor& y, const tensor& x, float alpha) {
  check c{"axpy"};
  c.f32("y", y), c.f32("x", x);
  c.numel("x", x, y.numel());
  backend_for(c.same_device(y, {&x})).axpy(y, x, alpha);
}

void scale(tensor& x, float s) {
  check c{"scale"};
  c.f32("x", x);
  backend_for(x.dev()).scale(x, s);
}

void fill(tensor& x, float v) {
  check c{"fill"};
  c.f32("x", x);
  backend_for(x.dev()).fill(x, v);
}

// ------------------------------------------------------------------ matmul

namespace {
thread_local matmul_precision t_matmul_precision = matmul_precision::f32;
}  // namespace

void set_matmul_precision(matmul_precision p) { t_matmul_precision = p; }
matmul_precision get_matmul_precision() { return t_matmul_precision; }

void matmul(tensor& out, const tensor& a, const tensor& b, bool trans_a, bool trans_b, float alpha, float beta) {
  check c{"matmul"};
  c.f32("out", out), c.f32("a", a), c.f32("b", b);
  c.min_dims("a", a, 1), c.min_dims("b", b, 1), c.min_dims("out", out, 1);
  const device d = c.same_device(out, {&a, &b});
  const int64_t ar = leading(a), ac = a.size(-1), br = leading(b), bc = b.size(-1);
  const int64_t M = trans_a ? ac : ar, K = trans_a ? ar : ac;
  const int64_t Kb = trans_b ? bc : br, N = trans_b ? br : bc;
  if (K != Kb)
    c.fail("inner dims differ: op(a) is (" + std::to_string(M) + ", " + std::to_string(K) + ") from " + a.str() +
           (trans_a ? "^T" : "") + ", op(b) is (" + std::to_string(Kb) + ", " + std::to_string(N) + ") from " +
           b.str() + (trans_b ? "^T" : ""));
  if (leading(out) != M || out.size(-1) != N)
    c.fail("expected out viewable as " + shape_str({M, N}) + ", got " + out.str());
  backend_for(d).gemm(trans_a, trans_b, M, N, K, alpha, a.data<float>(), ac, b.data<float>(), bc, beta,
                      out.data<float>(), N);
}

void matmul_batched(tensor& out, const tensor& a, const tensor& b, bool trans_a, bool trans_b, float alpha,
                    float beta) {
  check c{"matmul_batched"};
  c.f32("out", out), c.f32("a", a), c.f32("b", b);
  c.dims("a", a, 3), c.dims("b", b, 3), c.dims("out", out, 3);
  const device d = c.same_device(out, {&a, &b});
  const int64_t Bt = a.size(0);
  const int64_t ar = a.size(1), ac = a.size(2), br = b.size(1), bc = b.size(2);
  const int64_t M = trans_a ? ac : ar, K = trans_a ? ar : ac;
  const int64_t Kb = trans_b ? bc : br, N = trans_b ? br : bc;
  if (b.size(0) != Bt) c.fail("batch sizes differ: a " + a.str() + ", b " + b.str());
  if (K != Kb)
    c.fail("inner dims differ: op(a[i]) is (" + std::to_string(M) + ", " + std::to_string(K) + ") from " + a.str() +
           (trans_a ? "^T" : "") + ", op(b[i]) is (" + std::to_string(Kb) + ", " + std::to_string(N) + ") from " +
           b.str() + (trans_b ? "^T" : ""));
  c.shape("out", out, {Bt, M, N});
  backend_for(d).gemm_batched(trans_a, trans_b, M, N, K, alpha, a.data<float>(), ac, ar * ac, b.data<float>(), bc,
                              br * bc, beta, out.data<float>(), N, M * N, Bt);
}

void linear_forward(tensor& out, const tensor& x, const tensor& w, const tensor& bias) {
  check c{"linear_forward"};
  c.f32("out", out), c.f32("x", x), c.f32("w", w);
  c.dims("w", w, 2), c.min_dims("x", x, 1);
  const int64_t OC = w.size(0), IC = w.size(1);
  if (x.size(-1) != IC) c.fail("expected x (..., " + std::to_string(IC) + ") for w " + w.str() + ", got " + x.str());
  c.shape("out", out, with_last(x, OC));
  if (bias.defined()) {
    c.f32("bias", bias);
    c.shape("bias", bias, {OC});
  }
  backend& be = backend_for(c.same_device(out, {&x, &w, &bias}));
  const int64_t N = leading(x);
  // out (N, OC) = x (N, IC) @ w^T (IC, OC)
  be.gemm(false, true, N, OC, IC, 1.0f, x.data<float>(), IC, w.data<float>(), IC, 0.0f, out.data<float>(), OC);
  if (bias.defined()) be.add_bias(out, bias);
}

void linear_backward(tensor& dx, tensor& dw, tensor& dbias, const tensor& dout, const tensor& x, const tensor& w) {
  check c{"linear_backward"};
  c.f32("dout", dout), c.f32("x", x), c.f32("w", w);
  c.dims("w", w, 2), c.min_dims("x", x, 1);
  const int64_t OC = w.size(0), IC = w.size(1);
  if (x.size(-1) != IC) c.fail("expected x (..., " + std::to_string(IC) + ") for w " + w.str() + ", got " + x.str());
  c.shape("dout", dout, with_last(x, OC));
  if (dx.defined()) c.f32("dx", dx), c.shape("dx", dx, x.shape());
  if (dw.defined()) c.f32("dw", dw), c.shape("dw", dw, w.shape());
  if (dbias.defined()) c.f32("dbias", dbias), c.shape("dbias", dbias, {OC});
  backend& be = backend_for(c.same_device(dout, {&x, &w, &dx, &dw, &dbias}));
  const int64_t N = leading(x);
  // dx (N, IC) += dout (N, OC) @ w (OC, IC)
  if (dx.defined())
    be.gemm(false, false, N, IC, OC, 1.0f, dout.data<float>(), OC, w.data<float>(), IC, 1.0f, dx.data<float>(), IC);
  // dw (OC, IC) += dout^T (OC, N) @ x (N, IC)
  if (dw.defined())
    be.gemm(true, false, OC, IC, N, 1.0f, dout.data<float>(), OC, x.data<float>(), IC, 1.0f, dw.data<float>(), IC);
  if (dbias.defined()) be.bias_backward(dbias, dout);
}

// ------------------------------------------------------------------ embedding

void embedding_forward(tensor& out, const tensor& ids, const tensor& wte) {
  check c{"embedding_forward"};
  c.f32("out", out), c.type("ids", ids, dtype::i32), c.f32("wte", wte);
  c.dims("wte", wte, 2);
  const int64_t C = wte.size(1);
  if (out.dim() < 1 || out.size(-1) != C || out.numel() != ids.numel() * C)
    c.fail("expected out " + shape_str({ids.numel(), C}) + " (or ids' shape + (C,)), got " + out.str());
  const device d = c.same_device(out, {&ids, &wte});
  c.ids_in_range(ids, wte.size(0), false);
  backend_for(d).embedding_forward(out, ids, wte);
}

void embedding_backward(tensor& dwte, const tensor& dout, const tensor& ids) {
  check c{"embedding_backward"};
  c.f32("dwte", dwte), c.f32("dout", dout), c.type("ids", ids, dtype::i32);
  c.dims("dwte", dwte, 2);
  const int64_t C = dwte.size(1);
  if (dout.dim() < 1 || dout.size(-1) != C || dout.numel() != ids.numel() * C)
    c.fail("expected dout " + shape_str({ids.numel(), C}) + " (or ids' shape + (C,)), got " + dout.str());
  const device d = c.same_device(dwte, {&dout, &ids});
  c.ids_in_range(ids, dwte.size(0), true);
  backend_for(d).embedding_backward(dwte, dout, ids);
}

// ------------------------------------------------------------------ norms

namespace {
/// Common checks of a row norm: x (..., C), w (C); returns N = rows.
int64_t norm_rows(const check& c, const tensor& x, const tensor& w) {
  c.f32("x", x), c.f32("w", w);
  c.dims("w", w, 1), c.min_dims("x", x, 1);
  if (x.size(-1) != w.size(0))
    c.fail("expected x (..., " + std::to_string(w.size(0)) + ") for w " + w.str() + ", got " + x.str());
  return leading(x);
}
}  // namespace

void rmsnorm_forward(tensor& out, tensor& rstd, const tensor& x, const tensor& w, float eps) {
  check c{"rmsnorm_forward"};
  const int64_t N = norm_rows(c, x, w);
  c.f32("out", out), c.f32("rstd", rstd);
  c.shape("out", out, x.shape());
  c.numel("rstd", rstd, N);
  backend_for(c.same_device(x, {&out, &rstd, &w})).rmsnorm_forward(out, rstd, x, w, eps);
}

void rmsnorm_backward(tensor& dx, tensor& dw, const tensor& dout, const tensor& x, const tensor& w,
                      const tensor& rstd) {
  check c{"rmsnorm_backward"};
  const int64_t N = norm_rows(c, x, w);
  c.f32("dx", dx), c.f32("dw", dw), c.f32("dout", dout), c.f32("rstd", rstd);
  c.shape("dout", dout, x.shape());
  c.shape("dx", dx, x.shape());
  c.shape("dw", dw, w.shape());
  c.numel("rstd", rstd, N);
  backend_for(c.same_device(x, {&dx, &dw, &dout, &w, &rstd})).rmsnorm_backward(dx, dw, dout, x, w, rstd);
}

void layernorm_forward(tensor& out, tensor& mean, tensor& rstd, const tensor& x, const tensor& w, const tensor& b,
                       float eps) {
  check c{"layernorm_forward"};
  const int64_t N = norm_rows(c, x, w);
  c.f32("out", out), c.f32("mean", mean), c.f32("rstd", rstd);
  c.shape("out", out, x.shape());
  c.numel("mean", mean, N);
  c.numel("rstd", rstd, N);
  if (b.defined()) c.f32("b", b), c.shape("b", b, w.shape());
  backend_for(c.same_device(x, {&out, &mean, &rstd, &w, &b})).layernorm_forward(out, mean, rstd, x, w, b, eps);
}

void layernorm_backward(tensor& dx, tensor& dw, tensor& db, const tensor& dout, const tensor& x, const tensor& w,
                        const tensor& mean, const tensor& rstd) {
  check c{"layernorm_backward"};
  const int64_t N = norm_rows(c, x, w);
  c.f32("dx", dx), c.f32("dw", dw), c.f32("dout", dout), c.f32("mean", mean), c.f32("rstd", rstd);
  c.shape("dout", dout, x.shape());
  c.shape("dx", dx, x.shape());
  c.shape("dw", dw, w.shape());
  if (db.defined()) c.f32("db", db), c.shape("db", db, w.shape());
  c.numel("mean", mean, N);
  c.numel("rstd", rstd, N);
  backend_for(c.same_device(x, {&dx, &dw, &db, &dout, &w, &mean, &rstd}))
      .layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
}

// ------------------------------------------------------------------ activations

void activation_forward(tensor& out, const tensor& x, activation a) {
  check c{"activation_forward"};
  c.f32("out", out), c.f32("x", x);
  c.shape("out", out, x.shape());
  backend_for(c.same_device(x, {&out})).activation_forward(out, x, a);
}

void activation_backward(tensor& dx, const tensor& dout, const tensor& x, activation a) {
  check c{"activation_backward"};
  c.f32("dx", dx), c.f32("dout", dout), c.f32("x", x);
  c.shape("dout", dout, x.shape());
  c.shape("dx", dx, x.shape());
  backend_for(c.same_device(x, {&dx, &dout})).activation_backward(dx, dout, x, a);
}

void swiglu_forward(tensor& out, const tensor& gate, const tensor& up) {
  check c{"swiglu_forward"};
  c.f32("out", out), c.f32("gate", gate), c.f32("up", up);
  c.shape("up", up, gate.shape());
  c.shape("out", out, gate.shape());
  backend_for(c.same_device(gate, {&out, &up})).swiglu_forward(out, gate, up);
}

void swiglu_backward(tensor& dgate, tensor& dup, const tensor& dout, const tensor& gate, const tensor& up) {
  check c{"swiglu_backward"};
  c.f32("dgate", dgate), c.f32("dup", dup), c.f32("dout", dout), c.f32("gate", gate), c.f32("up", up);
  c.shape("up", up, gate.shape());
  c.shape("dout", dout, gate.shape());
  c.shape("dgate", dgate, gate.shape());
  c.shape("dup", dup, gate.shape());
  backend_for(c.same_device(gate, {&dgate, &dup, &dout, &up})).swiglu_backward(dgate, dup, dout, gate, up);
}

// ------------------------------------------------------------------ RoPE

namespace {
void rope_impl(const char* op, tensor& x, const tensor& positions, float theta, rope_layout layout, bool inverse) {
  check c{op};
  c.f32("x", x), c.type("positions", positions, dtype::i32);
  c.dims("x", x, 4);
  if (x.size(3) % 2 != 0) c.fail("head size must be even, got x " + x.str());
  c.shape("positions", positions, {x.size(0), x.size(1)});
  if (!(theta > 0.0f)) c.fail("theta must be > 0, got " + std::to_string(theta));
  backend_for(c.same_device(x, {&positions})).rope(x, positions, theta, layout, inverse);
}
}  // namespace

void rope_forward(tensor& x, const tensor& positions, float theta, rope_layout layout) {
  rope_impl("rope_forward", x, positions, theta, layout, false);
}

void rope_backward(tensor& dx, const tensor& positions, float theta, rope_layout layout) {
  rope_impl("rope_backward", dx, positions, theta, layout, true);
}

// ------------------------------------------------------------------ attention

void attention_forward(tensor& out, tensor& att, const tensor& q, const tensor& k, const tensor& v,
                       const tensor& attn_mask, int64_t n_keys) {
  check c{"attention_forward"};
  c.f32("out", out), c.f32("q", q), c.f32("k", k), c.f32("v", v);
  c.dims("q", q, 4), c.dims("k", k, 4);
  const int64_t B = q.size(0), Tq = q.size(1), H = q.size(2), hs = q.size(3);
  const int64_t S = k.size(1), KV = k.size(2);
  if (k.size(0) != B || k.size(3) != hs)
    c.fail("expected k (" + std::to_string(B) + ", S, KV, " + std::to_string(hs) + ") for q " + q.str() + ", got " +
           k.str());
  if (KV <= 0 || H % KV != 0) c.fail("query heads must be a multiple of kv heads: q " + q.str() + ", k " + k.str());
  c.shape("v", v, k.shape());
  if (n_keys < 0) n_keys = S;
  if (n_keys > S) c.fail("n_keys = " + std::to_string(n_keys) + " exceeds the " + std::to_string(S) + " keys of k " + k.str());
  if (Tq > n_keys)
    c.fail("more queries (" + std::to_string(Tq) + ") than keys (n_keys = " + std::to_string(n_keys) + ")");
  c.shape("out", out, q.shape());
  if (att.defined()) c.f32("att", att), c.shape("att", att, {B, H, Tq, n_keys});
  if (attn_mask.defined()) {
    c.type("attn_mask", attn_mask, dtype::i32);
    if (attn_mask.shape() != shape_t{B, n_keys} && attn_mask.shape() != shape_t{B, S})
      c.fail("expected attn_mask " + shape_str({B, n_keys}) + " or " + shape_str({B, S}) + ", got " +
             attn_mask.str());
  }
  backend_for(c.same_device(q, {&out, &att, &k, &v, &attn_mask}))
      .attention_forward(out, att, q, k, v, attn_mask, n_keys);
}

void attention_backward(tensor& dq, tensor& dk, tensor& dv, const tensor& dout, const tensor& q, const tensor& k,
                        const tensor& v, const tensor& att) {
  check c{"attention_backward"};
  c.f32("dq", dq), c.f32("dk", dk), c.f32("dv", dv), c.f32("dout", dout);
  c.f32("q", q), c.f32("k", k), c.f32("v", v), c.f32("att", att);
  c.dims("q", q, 4), c.dims("k", k, 4);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), hs = q.size(3);
  const int64_t KV = k.size(2);
  if (k.size(0) != B || k.size(1) != T || k.size(3) != hs)
    c.fail("expected k (" + std::to_string(B) + ", " + std::to_string(T) + ", KV, " + std::to_string(hs) +
           ") (backward needs Tq == S == n_keys), got " + k.str());
  if (KV <= 0 || H % KV != 0) c.fail("query heads must be a multiple of kv heads: q " + q.str() + ", k " + k.str());
  c.shape("v", v, k.shape());
  c.shape("att", att, {B, H, T, T});
  c.shape("dout", dout, q.shape());
  c.shape("dq", dq, q.shape());
  c.shape("dk", dk, k.shape());
  c.shape("dv", dv, k.shape());
  backend_for(c.same_device(q, {&dq, &dk, &dv, &dout, &k, &v, &att})).attention_backward(dq, dk, dv, dout, q, k, v, att);
}

// ------------------------------------------------------------------ softmax, losses

namespace {
void softmax_fwd(const char* op, tensor& out, const tensor& x, bool log) {
  check c{op};
  c.f32("out", out), c.f32("x", x);
  c.min_dims("x", x, 1);
  c.shape("out", out, x.shape());
  backend_for(c.same_device(x, {&out})).softmax_forward(out, x, log);
}
void softmax_bwd(const char* op, tensor& dx, const tensor& dout, const tensor& out, bool log) {
  check c{op};
  c.f32("dx", dx), c.f32("dout", dout), c.f32("out", out);
  c.min_dims("out", out, 1);
  c.shape("dout", dout, out.shape());
  c.shape("dx", dx, out.shape());
  backend_for(c.same_device(out, {&dx, &dout})).softmax_backward(dx, dout, out, log);
}
}  // namespace

void softmax_forward(tensor& out, const tensor& x) { softmax_fwd("softmax_forward", out, x, false); }
void softmax_backward(tensor& dx, const tensor& dout, const tensor& out) {
  softmax_bwd("softmax_backward", dx, dout, out, false);
}
void log_softmax_forward(tensor& out, const tensor& x) { softmax_fwd("log_softmax_forward", out, x, true); }
void log_softmax_backward(tensor& dx, const tensor& dout, const tensor& out) {
  softmax_bwd("log_softmax_backward", dx, dout, out, true);
}

double cross_entropy_forward(tensor& losses, const tensor& logits, const tensor& targets, int64_t* n_valid,
                             int32_t ignore_index) {
  check c{"cross_entropy_forward"};
  c.f32("losses", losses), c.f32("logits", logits), c.type("targets", targets, dtype::i32);
  c.min_dims("logits", logits, 1);
  const int64_t N = leading(logits);
  c.numel("targets", targets, N);
  c.numel("losses", losses, N);
  const device d = c.same_device(logits, {&losses, &targets});
  c.targets_in_range(targets, logits.size(-1), ignore_index);
  return backend_for(d).cross_entropy_forward(losses, logits, targets, n_valid, ignore_index);
}

void cross_entropy_backward(tensor& dlogits, const tensor& logits, const tensor& targets, float dloss,
                            int32_t ignore_index) {
  check c{"cross_entropy_backward"};
  c.f32("dlogits", dlogits), c.f32("logits", logits), c.type("targets", targets, dtype::i32);
  c.min_dims("logits", logits, 1);
  c.numel("targets", targets, leading(logits));
  c.shape("dlogits", dlogits, logits.shape());
  const device d = c.same_device(logits, {&dlogits, &targets});
  c.targets_in_range(targets, logits.size(-1), ignore_index);
  backend_for(d).cross_entropy_backward(dlogits, logits, targets, dloss, ignore_index);
}

// ------------------------------------------------------------------ optimizer

void adamw_step(tensor& param, const tensor& grad, tensor& m, tensor& v, int64_t t, const adamw_config& cfg) {
  check c{"adamw_step"};
  c.f32("param", param), c.f32("grad", grad), c.f32("m", m), c.f32("v", v);
  c.numel("grad", grad, param.numel());
  c.numel("m", m, param.numel());
  c.numel("v", v, param.numel());
  if (t < 1) c.fail("step t is 1-based, got " + std::to_string(t));
  backend_for(c.same_device(param, {&grad, &m, &v})).adamw_step(param, grad, m, v, t, cfg);
}

double sum_squares(const tensor& x) {
  check c{"sum_squares"};
  c.f32("x", x);
  return backend_for(x.dev()).sum_squares(x);
}

double global_norm(const std::vector<tensor>& xs) {
  double s = 0.0;
  for (const tensor& x : xs)
    if (x.defined()) s += sum_squares(x);
  return std::sqrt(s);
}

double clip_grad_norm(std::vector<tensor>& grads, double max_norm) {
  const double norm = global_norm(grads);
  if (max_norm > 0.0 && norm > max_norm) {
    const float s = static_cast<float>(max_norm / (norm + 1e-6));
    for (tensor& g : grads)
      if (g.defined()) scale(g, s);
  }
  return norm;
}

}  // namespace ops
}  // namespace flowrun

namespace flowrun::ops {

void profile_start() {
  std::lock_guard<std::mutex> lock(g_profile_mutex);
  g_profile.clear();
  g_profiling.store(true);
}

std::vector<op_time> profile_stop() {
  g_profiling.store(false);
  std::lock_guard<std::mutex> lock(g_profile_mutex);
  std::vector<op_time> out;
  for (auto& [k, v] : g_profile) out.push_back(v);
  std::sort(out.begin(), out.end(), [](const op_time& a, const op_time& b) { return a.seconds > b.seconds; });
  g_profile.clear();
  return out;
}

}  // namespace flowrun::ops
