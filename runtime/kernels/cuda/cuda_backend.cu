// The CUDA backend: every op of runtime/kernels/backend.h on device memory,
// with the semantics of the CPU backend (runtime/kernels/cpu/cpu_backend.cpp,
// the reference; contract in runtime/kernels/ops.h).
//
//  - GEMMs: cuBLAS. fp32 via cublasSgemm / cublasSgemmStridedBatched in
//    CUBLAS_DEFAULT_MATH (no TF32); row-major products by the usual swap
//    (C^T = op(B)^T op(A)^T in cuBLAS's column-major view). Under
//    ops::matmul_precision::bf16 the inputs are rounded to bf16 in scratch
//    memory and multiplied by cublasGemmEx with fp32 output and accumulation.
//  - Row ops (norms, softmax, cross-entropy, attention rows): one thread block
//    per row, block reductions in shared memory; the statistics the CPU keeps
//    in double (norm sums, softmax / logsumexp sums, sum of squares, column
//    sums of dw / dbias, the loss total) are accumulated in double here too.
//  - Column sums (dw, db, dbias): per-split partial sums in double, then one
//    pass adding them in a fixed order: deterministic, no atomics. Embedding
//    backward uses atomicAdd (repeated ids), so its summation order varies.
//  - Attention, from 16 query rows (prefill, training): Q K^T, P V and the
//    backward products dout V^T, dS K, dS^T Q, P^T dout as cuBLAS strided-batched
//    GEMMs per (batch, head in the kv group), following the bf16 matmul switch;
//    one fused kernel per row for mask + causal limit + softmax (sum in double),
//    one for dS = P (dP - rowsum(P dP)). Below 16 rows (decode): one block per
//    (batch, head, query row) does scores, mask, softmax and P V; backward one
//    block per row for dP, D, dS, dq and one per (batch, key, kv head) for dk, dv.
//  - Data-dependent errors (token ids, cross-entropy targets) are checked by
//    ops.cpp for every backend before dispatch (device ids are read back to the
//    host there: one small copy and stream synchronisation per call).
//  - All work runs on the calling thread's current stream of the tensors'
//    device (runtime/kernels/cuda/cuda_api.h); ops returning a value to the host
//    (cross_entropy_forward, sum_squares) synchronise that stream.
//  - Aliasing as the CPU backend: elementwise ops, softmax and the cross-entropy
//    gradient read each element before writing it (the same thread reads and
//    writes an element), so they may run in place.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernels/backend.h"
#include "runtime/kernels/cuda/cuda_common.cuh"

namespace flowrun::cuda::detail {
namespace {

constexpr int k_threads = 256;  // elementwise kernels and row blocks (a multiple of 32)

// GELU, tanh approximation (as the CPU backend).
constexpr float k_gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float k_gelu_cube = 0.044715f;

unsigned grid_for(int64_t n, int threads = k_threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(b, int64_t{1} << 20));  // grid-stride loops cover the rest
}

/// The device ordinal of a device pointer (raw-pointer GEMMs carry no device).
int device_of(const void* p) {
  cudaPointerAttributes attr{};
  check(cudaPointerGetAttributes(&attr, p), "cudaPointerGetAttributes");
  if (attr.type != cudaMemoryTypeDevice)
    throw std::invalid_argument("CUDA backend: gemm operand is not device memory");
  return attr.device;
}

/// The device and current stream of an op, with the device made current.
struct op_ctx {
  int dev;
  device_guard guard;
  cudaStream_t s;
  explicit op_ctx(int d) : dev(d), guard(d), s(stream(d)) {}
  explicit op_ctx(const tensor& t) : op_ctx(t.dev().index) {}
};

// ---------------------------------------------------------------- reductions

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32), returned to every thread.
/// Must be reached by all threads of the block. `sh` holds 32 values.
template <class T>
__device__ T block_sum(T v, T* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T r = lane < nw ? sh[lane] : T(0);
    r = warp_sum(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

/// Maximum over the block, as block_sum.
__device__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < nw ? sh[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

#define FLOWRUN_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---------------------------------------------------------------- elementwise kernels

__global__ void add_k(float* o, const float* a, const float* b, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) o[i] = a[i] + b[i];
}
__global__ void axpy_k(float* y, const float* x, float alpha, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}
__global__ void scale_k(float* x, float s, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) x[i] *= s;
}
__global__ void fill_k(float* x, float v, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) x[i] = v;
}
/// C (rows, cols) with row stride ldc, `batch` matrices stride_c apart: C = beta C
/// (beta == 0 writes zeros, ignoring NaN in C).
__global__ void scale_matrix_k(float* C, int64_t rows, int64_t cols, int64_t ldc, int64_t stride_c, int64_t batch,
                               float beta) {
  const int64_t per = rows * cols;
  FLOWRUN_GRID_STRIDE(i, per * batch) {
    const int64_t bt = i / per, r = (i % per) / cols, c = i % cols;
    float* p = C + bt * stride_c + r * ldc + c;
    *p = beta == 0.0f ? 0.0f : *p * beta;
  }
}
__global__ void to_bf16_k(__nv_bfloat16* o, const float* x, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) o[i] = __float2bfloat16_rn(x[i]);
}
__global__ void add_bias_k(float* o, const float* b, int64_t C, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) o[i] += b[i % C];
}

// ---------------------------------------------------------------- column sums

// out[c] += sum over rows n of f(n, c), in double. Pass 1: block (32 columns x 8
// row lanes) per (column tile, row split) writes partial[split][c]; pass 2 adds
// the partials in split order. Deterministic.
constexpr int k_col_tile = 32, k_row_lanes = 8;

template <class F>
__global__ void colsum_partial_k(F f, int64_t N, int64_t C, int64_t rows_per_split, double* partial) {
  __shared__ double sh[k_row_lanes][k_col_tile + 1];
  const int64_t c = blockIdx.x * static_cast<int64_t>(k_col_tile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_split;
  const int64_t r1 = min(N, r0 + rows_per_split);
  double acc = 0.0;
  if (c < C)
    for (int64_t n = r0 + threadIdx.y; n < r1; n += k_row_lanes) acc += f(n, c);
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double s = 0.0;
    for (int y = 0; y < k_row_lanes; ++y) s += sh[y][threadIdx.x];
    partial[blockIdx.y * C + c] = s;
  }
}

__global__ void colsum_finish_k(float* out, const double* partial, int64_t nsplit, int64_t C) {
  FLOWRUN_GRID_STRIDE(c, C) {
    double s = 0.0;
    for (int64_t k = 0; k < nsplit; ++k) s += partial[k * C + c];
    out[c] += static_cast<float>(s);
  }
}

template <class F>
void colsum_add(float* out, F f, int64_t N, int64_t C, const op_ctx& ctx) {
  if (C == 0 || N == 0) return;
  const int64_t rows_per_split = std::max<int64_t>(64, (N + 4095) / 4096);
  const int64_t nsplit = (N + rows_per_split - 1) / rows_per_split;
  scratch partial(static_cast<size_t>(nsplit * C) * sizeof(double), ctx.dev);
  const dim3 grid(static_cast<unsigned>((C + k_col_tile - 1) / k_col_tile), static_cast<unsigned>(nsplit));
  colsum_partial_k<<<grid, dim3(k_col_tile, k_row_lanes), 0, ctx.s>>>(f, N, C, rows_per_split,
                                                                        partial.as<double>());
  check_launch("colsum_partial_k");
  colsum_finish_k<<<grid_for(C), k_threads, 0, ctx.s>>>(out, partial.as<double>(), nsplit, C);
  check_launch("colsum_finish_k");
}

struct col_plain {  // dout[n, c]
  const float* d;
  int64_t C;
  __device__ double operator()(int64_t n, int64_t c) const { return d[n * C + c]; }
};
struct col_rms_dw {  // dy x r (CPU: double(dy) * x * double(r))
  const float *dy, *x, *rs;
  int64_t C;
  __device__ double operator()(int64_t n, int64_t c) const {
    return static_cast<double>(dy[n * C + c]) * x[n * C + c] * static_cast<double>(rs[n]);
  }
};
struct col_ln_dw {  // dy ((x - m) r), the normalised value in float as the CPU
  const float *dy, *x, *mean, *rs;
  int64_t C;
  __device__ double operator()(int64_t n, int64_t c) const {
    const float norm = (x[n * C + c] - mean[n]) * rs[n];
    return static_cast<double>(dy[n * C + c]) * norm;
  }
};

// ---------------------------------------------------------------- embedding

__global__ void embedding_fwd_k(float* o, const int32_t* ids, const float* w, int64_t C, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) o[i] = w[static_cast<int64_t>(ids[i / C]) * C + i % C];
}
__global__ void embedding_bwd_k(float* dw, const float* d, const int32_t* ids, int64_t C, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) {
    const int32_t id = ids[i / C];
    if (id >= 0) atomicAdd(dw + static_cast<int64_t>(id) * C + i % C, d[i]);
  }
}

// ---------------------------------------------------------------- norms (one block per row)

__global__ void rmsnorm_fwd_k(float* o, float* rs, const float* x, const float* w, int64_t C, float eps) {
  __shared__ double sh[32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;
  float* orow = o + n * C;
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += static_cast<double>(xr[c]) * xr[c];
  ss = block_sum(ss, sh);
  const double r = 1.0 / sqrt(ss / static_cast<double>(C) + eps);
  const float rf = static_cast<float>(r);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) orow[c] = xr[c] * rf * w[c];
  if (threadIdx.x == 0) rs[n] = rf;
}

// dx += r w dy - r^3 x / C sum_k(dy_k w_k x_k)
__global__ void rmsnorm_bwd_k(float* dx, const float* dout, const float* x, const float* w, const float* rs,
                              int64_t C) {
  __shared__ double sh[32];
  const int64_t n = blockIdx.x;
  const float* dy = dout + n * C;
  const float* xr = x + n * C;
  float* dxr = dx + n * C;
  const double r = rs[n];
  double dot = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += static_cast<double>(dy[c]) * w[c] * xr[c];
  dot = block_sum(dot, sh);
  const float a = static_cast<float>(r);
  const float b = static_cast<float>(r * r * r * dot / static_cast<double>(C));
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dxr[c] += a * w[c] * dy[c] - b * xr[c];
}

__global__ void layernorm_fwd_k(float* o, float* mean, float* rs, const float* x, const float* w, const float* b,
                                int64_t C, float eps) {
  __shared__ double sh[32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;
  float* orow = o + n * C;
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
  s = block_sum(s, sh);
  const double m = s / static_cast<double>(C);
  double v = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const double d = xr[c] - m;
    v += d * d;
  }
  v = block_sum(v, sh);
  const double r = 1.0 / sqrt(v / static_cast<double>(C) + eps);
  const float mf = static_cast<float>(m), rf = static_cast<float>(r);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float y = (xr[c] - mf) * rf * w[c];
    orow[c] = b ? y + b[c] : y;
  }
  if (threadIdx.x == 0) {
    mean[n] = mf;
    rs[n] = rf;
  }
}

// dx += rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)), dnorm = w dy
__global__ void layernorm_bwd_k(float* dx, const float* dout, const float* x, const float* w, const float* mean,
                                const float* rs, int64_t C) {
  __shared__ double sh[32];
  const int64_t n = blockIdx.x;
  const float* dy = dout + n * C;
  const float* xr = x + n * C;
  float* dxr = dx + n * C;
  const float m = mean[n], r = rs[n];
  double s1 = 0.0, s2 = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const double dn = static_cast<double>(w[c]) * dy[c];
    s1 += dn;
    s2 += dn * ((xr[c] - m) * r);
  }
  s1 = block_sum(s1, sh);
  s2 = block_sum(s2, sh);
  const float mean_dn = static_cast<float>(s1 / static_cast<double>(C));
  const float mean_dnn = static_cast<float>(s2 / static_cast<double>(C));
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (xr[c] - m) * r;
    dxr[c] += r * (w[c] * dy[c] - mean_dn - norm * mean_dnn);
  }
}

// ---------------------------------------------------------------- activations

__device__ __forceinline__ float sigmoidf_d(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void activation_fwd_k(float* o, const float* x, int act, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) {
    const float v = x[i];
    float y;
    if (act == static_cast<int>(ops::activation::silu)) {
      y = v * sigmoidf_d(v);
    } else if (act == static_cast<int>(ops::activation::gelu_tanh)) {
      const float u = k_gelu_scale * (v + k_gelu_cube * v * v * v);
      y = v / (1.0f + expf(-2.0f * u));
    } else {
      y = v > 0.0f ? v : 0.0f;
    }
    o[i] = y;
  }
}

__global__ void activation_bwd_k(float* dx, const float* dout, const float* x, int act, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) {
    const float v = x[i], dy = dout[i];
    float g;
    if (act == static_cast<int>(ops::activation::silu)) {
      const float s = sigmoidf_d(v);
      g = dy * s * (1.0f + v * (1.0f - s));
    } else if (act == static_cast<int>(ops::activation::gelu_tanh)) {
      const float u = k_gelu_scale * (v + k_gelu_cube * v * v * v);
      const float s = 1.0f / (1.0f + expf(-2.0f * u));
      g = (s + v * 2.0f * s * (1.0f - s) * k_gelu_scale * (1.0f + 3.0f * k_gelu_cube * v * v)) * dy;
    } else {
      g = v > 0.0f ? dy : 0.0f;
    }
    dx[i] = g;
  }
}

__global__ void swiglu_fwd_k(float* o, const float* g, const float* u, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) {
    const float gv = g[i];
    o[i] = gv * sigmoidf_d(gv) * u[i];
  }
}

__global__ void swiglu_bwd_k(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n) {
  FLOWRUN_GRID_STRIDE(i, n) {
    const float gv = g[i], uv = u[i], d = dout[i];
    const float s = sigmoidf_d(gv);
    const float a = d * uv * s * (1.0f + gv * (1.0f - s));
    const float b = d * gv * s;
    dg[i] = a;
    du[i] = b;
  }
}

// ---------------------------------------------------------------- RoPE

constexpr int k_rope_table = 256;  // head sizes up to 512 use the host-computed frequencies
struct rope_freqs {
  float f[k_rope_table];
};

// one thread per (b t, head, pair i)
__global__ void rope_k(float* x, const int32_t* pos, rope_freqs fr, bool table, int64_t BT, int64_t NH, int64_t hs,
                       float theta, bool adjacent, bool inverse) {
  const int64_t half = hs / 2;
  FLOWRUN_GRID_STRIDE(idx, BT * NH * half) {
    const int64_t i = idx % half;
    const int64_t bth = idx / half;  // bt * NH + h
    const int64_t bt = bth / NH;
    const float freq = table ? fr.f[i] : 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(hs));
    const float val = static_cast<float>(pos[bt]) * freq;
    const float cs = cosf(val);
    const float sn = inverse ? -sinf(val) : sinf(val);
    float* row = x + bth * hs;
    const int64_t i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
    const float v0 = row[i0], v1 = row[i1];
    row[i0] = v0 * cs - v1 * sn;
    row[i1] = v0 * sn + v1 * cs;
  }
}

// ---------------------------------------------------------------- attention

/// out[c] = sum_{j in [j0, j1)} w[j] rows[j * ld + c] for c < hs, by the whole block
/// (blockDim.x == k_threads): with hs <= blockDim.x, G = blockDim.x / hs groups of hs
/// threads each sum every G-th j, then the G partials are added in group order
/// (deterministic). `w` may be global memory written by this block before a barrier.
/// Must be reached by all threads of the block. `part` holds blockDim.x floats.
__device__ void channel_sums(float* out, const float* w, const float* rows, int64_t ld, int64_t j0, int64_t j1,
                             int64_t hs, float* part) {
  if (hs == 0) return;     // uniform over the block
  if (hs <= blockDim.x) {  // uniform over the block
    const int64_t G = blockDim.x / hs;
    const int64_t c = threadIdx.x % hs, g = threadIdx.x / hs;
    float acc = 0.0f;
    if (g < G)
      for (int64_t j = j0 + g; j < j1; j += G) acc += w[j] * rows[j * ld + c];
    part[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < hs) {
      float s = 0.0f;
      for (int64_t gg = 0; gg < G; ++gg) s += part[gg * hs + threadIdx.x];
      out[threadIdx.x] = s;
    }
  } else {
    for (int64_t c = threadIdx.x; c < hs; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = j0; j < j1; ++j) acc += w[j] * rows[j * ld + c];
      out[c] = acc;
    }
  }
}

// One block per (b, h, query i): row = (b H + h) Tq + i. att row (n_keys) holds the
// raw scores, then the probabilities. Dynamic shared memory: hs floats (q_i).
__global__ void attention_fwd_k(float* out, float* att, const float* q, const float* k, const float* v,
                                const int32_t* mask, int64_t mstride, int64_t Tq, int64_t H, int64_t hs, int64_t S,
                                int64_t KV, int64_t n_keys, float scale) {
  extern __shared__ float qs[];
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ float part[k_threads];
  const int64_t row = blockIdx.x;
  const int64_t i = row % Tq, h = (row / Tq) % H, b = row / (Tq * H);
  const int64_t kvh = h / (H / KV);
  const int64_t nvis = n_keys - Tq + i + 1;  // keys [0, nvis) are causally visible
  const float* qi = q + ((b * Tq + i) * H + h) * hs;
  float* a = att + row * n_keys;
  float* o = out + ((b * Tq + i) * H + h) * hs;
  const int32_t* m = mask ? mask + b * mstride : nullptr;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;

  for (int64_t c = threadIdx.x; c < hs; c += blockDim.x) qs[c] = qi[c];
  __syncthreads();
  // scores: a warp per key
  for (int64_t j = warp; j < nvis; j += nwarps) {
    const float* kj = k + ((b * S + j) * KV + kvh) * hs;
    float d = 0.0f;
    for (int64_t c = lane; c < hs; c += 32) d += qs[c] * kj[c];
    d = warp_sum(d);
    if (lane == 0) a[j] = (m && m[j] == 0) ? -INFINITY : d * scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x) mx = fmaxf(mx, a[j]);
  mx = block_max(mx, shf);
  if (mx == -INFINITY) {  // no visible key (uniform over the block): zero probabilities and output
    for (int64_t j = threadIdx.x; j < n_keys; j += blockDim.x) a[j] = 0.0f;
    for (int64_t c = threadIdx.x; c < hs; c += blockDim.x) o[c] = 0.0f;
    return;
  }
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x) {
    const float e = expf(a[j] - mx);  // masked keys: exp(-inf) = 0
    a[j] = e;
    sum += e;
  }
  sum = block_sum(sum, shd);
  const double inv = 1.0 / sum;
  for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x) a[j] = static_cast<float>(a[j] * inv);
  for (int64_t j = nvis + threadIdx.x; j < n_keys; j += blockDim.x) a[j] = 0.0f;
  __syncthreads();
  // out = sum_j p_j v_j
  const float* v0 = v + (b * S * KV + kvh) * hs;
  channel_sums(o, a, v0, KV * hs, 0, nvis, hs, part);
}

// Backward pass 1, one block per row (b, h, i) (T == S == n_keys):
// dP_ij = dout_i . v_j; D = sum_j P_ij dP_ij (double); dS_ij = P_ij (dP_ij - D) scale
// (stored in ds, causal part only); dq_i = sum_j dS_ij k_j (overwrite).
__global__ void attention_bwd_rows_k(float* dq, float* ds, const float* dout, const float* k, const float* v,
                                     const float* att, int64_t T, int64_t H, int64_t hs, int64_t KV, float scale) {
  extern __shared__ float dos[];
  __shared__ double shd[32];
  __shared__ float part[k_threads];
  const int64_t row = blockIdx.x;
  const int64_t i = row % T, h = (row / T) % H, b = row / (T * H);
  const int64_t kvh = h / (H / KV);
  const float* a = att + row * T;
  float* d = ds + row * T;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t qoff = ((b * T + i) * H + h) * hs;
  for (int64_t c = threadIdx.x; c < hs; c += blockDim.x) dos[c] = dout[qoff + c];
  __syncthreads();
  for (int64_t j = warp; j <= i; j += nwarps) {
    const float* vj = v + ((b * T + j) * KV + kvh) * hs;
    float p = 0.0f;
    for (int64_t c = lane; c < hs; c += 32) p += dos[c] * vj[c];
    p = warp_sum(p);
    if (lane == 0) d[j] = p;
  }
  __syncthreads();
  double D = 0.0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) D += static_cast<double>(a[j]) * d[j];
  D = block_sum(D, shd);
  const float Df = static_cast<float>(D);
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) d[j] = a[j] * (d[j] - Df) * scale;
  __syncthreads();
  channel_sums(dq + qoff, d, k + (b * T * KV + kvh) * hs, KV * hs, 0, i + 1, hs, part);
}

// Backward pass 2, one block per (b, key j, kv head): r = (b T + j) KV + kvh, the
// layout of dk / dv. dk_j = sum_{h in group, i >= j} dS_ij q_i; dv_j = sum P_ij dout_i.
// The (h, i) pairs are split over G = blockDim.x / hs groups of hs threads (when
// hs <= blockDim.x), whose partials are added in group order.
__global__ void attention_bwd_keys_k(float* dk, float* dv, const float* ds, const float* att, const float* q,
                                     const float* dout, int64_t T, int64_t H, int64_t hs, int64_t KV) {
  __shared__ float pk[k_threads], pv[k_threads];
  const int64_t r = blockIdx.x;
  const int64_t kvh = r % KV, j = (r / KV) % T, b = r / (KV * T);
  const int64_t group = H / KV;
  const int64_t n_i = T - j, pairs = group * n_i;  // (h, i) pairs: h = kvh group + t / n_i, i = j + t % n_i
  const bool split = hs <= blockDim.x;               // uniform over the block
  const int64_t G = split ? blockDim.x / hs : 1;
  const int64_t g = split ? threadIdx.x / hs : 0;
  for (int64_t c = split ? threadIdx.x % hs : threadIdx.x; c < hs; c += blockDim.x) {
    float ak = 0.0f, av = 0.0f;
    if (g < G)
      for (int64_t t = g; t < pairs; t += G) {
        const int64_t h = kvh * group + t / n_i, i = j + t % n_i;
        const int64_t prow = ((b * H + h) * T + i) * T + j;
        const int64_t off = ((b * T + i) * H + h) * hs + c;
        ak += ds[prow] * q[off];
        av += att[prow] * dout[off];
      }
    if (split) {
      pk[threadIdx.x] = ak;
      pv[threadIdx.x] = av;
      break;  // each thread has one channel when split
    }
    dk[r * hs + c] = ak;
    dv[r * hs + c] = av;
  }
  if (split) {
    __syncthreads();
    if (threadIdx.x < hs) {
      float sk = 0.0f, sv = 0.0f;
      for (int64_t gg = 0; gg < G; ++gg) {
        sk += pk[gg * hs + threadIdx.x];
        sv += pv[gg * hs + threadIdx.x];
      }
      dk[r * hs + threadIdx.x] = sk;
      dv[r * hs + threadIdx.x] = sv;
    }
  }
}


// ---------------------------------------------------------------- attention through cuBLAS (Tq >= k_attn_gemm_rows)
//
// For prefill and training the products Q K^T, P V and the four backward
// products run as cuBLAS strided-batched GEMMs (tensor cores under the bf16
// matmul switch); only the row-wise parts are kernels of their own: the causal
// and padding mask with the softmax (forward), and dS = P (dP - rowsum(P dP))
// (backward). The per-row kernels above stay for decode (few query rows),
// where one block per row beats 2 B (H/KV) GEMM launches.

/// Queries per call from which attention takes the GEMM path.
constexpr int64_t k_attn_gemm_rows = 16;

// In place over the raw scores (already scaled): row = (b H + h) Tq + i sees keys
// j < n_keys - Tq + i + 1 whose mask is 1; softmax over them (sum in double, as
// the CPU), 0 elsewhere; a row with no visible key becomes all zeros.
__global__ void attention_mask_softmax_k(float* att, const int32_t* mask, int64_t mstride, int64_t Tq, int64_t H,
                                         int64_t n_keys) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % Tq, b = row / (Tq * H);
  const int64_t nvis = n_keys - Tq + i + 1;
  float* a = att + row * n_keys;
  const int32_t* m = mask ? mask + b * mstride : nullptr;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x)
    if (!(m && m[j] == 0)) mx = fmaxf(mx, a[j]);
  mx = block_max(mx, shf);
  if (mx == -INFINITY) {  // no visible key (uniform over the block)
    for (int64_t j = threadIdx.x; j < n_keys; j += blockDim.x) a[j] = 0.0f;
    return;
  }
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x) {
    const float e = (m && m[j] == 0) ? 0.0f : expf(a[j] - mx);
    a[j] = e;
    sum += e;
  }
  sum = block_sum(sum, shd);
  const double inv = 1.0 / sum;
  for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x) a[j] = static_cast<float>(a[j] * inv);
  for (int64_t j = nvis + threadIdx.x; j < n_keys; j += blockDim.x) a[j] = 0.0f;
}

// Backward, row = (b H + h) T + i (T == n_keys): d holds dP = dout V^T; with P the
// causal part of att (keys j <= i; the rest is not read), D = sum_j P_ij dP_ij (double),
// d becomes dS_ij = P_ij (dP_ij - D) scale (0 for j > i) and pc the causal P (0 for j > i).
__global__ void attention_softmax_bwd_k(float* d, float* pc, const float* att, int64_t T, float scale) {
  __shared__ double shd[32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % T;
  const float* a = att + row * T;
  float* dr = d + row * T;
  float* pr = pc + row * T;
  double D = 0.0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) D += static_cast<double>(a[j]) * dr[j];
  D = block_sum(D, shd);
  const float Df = static_cast<float>(D);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
    const bool vis = j <= i;
    const float p = vis ? a[j] : 0.0f;
    dr[j] = vis ? p * (dr[j] - Df) * scale : 0.0f;
    pr[j] = p;
  }
}

// ---------------------------------------------------------------- softmax, cross-entropy (block per row)

__global__ void softmax_fwd_k(float* o, const float* x, int64_t V, bool log) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * V;
  float* orow = o + n * V;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, xr[i]);
  mx = block_max(mx, shf);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(xr[i] - mx);
  sum = block_sum(sum, shd);
  if (log) {
    const double lse = mx + ::log(sum);
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) orow[i] = static_cast<float>(xr[i] - lse);
  } else {
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) orow[i] = expf(xr[i] - mx) * inv;
  }
}

// softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy)
__global__ void softmax_bwd_k(float* dx, const float* dout, const float* out, int64_t V, bool log) {
  __shared__ double shd[32];
  const int64_t n = blockIdx.x;
  const float* dy = dout + n * V;
  const float* y = out + n * V;
  float* d = dx + n * V;
  double s = 0.0;
  if (log)
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += dy[i];
  else
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += static_cast<double>(dy[i]) * y[i];
  s = block_sum(s, shd);
  const float sf = static_cast<float>(s);
  if (log)
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) d[i] = dy[i] - expf(y[i]) * sf;
  else
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) d[i] = y[i] * (dy[i] - sf);
}

// losses[n] = max + log(sum exp(x - max)) - x[t] (double); row_loss keeps the double.
__global__ void cross_entropy_fwd_k(float* losses, double* row_loss, const float* logits, const int32_t* targets,
                                    int64_t V, int32_t ignore_index) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  if (t == ignore_index) {  // uniform over the block
    if (threadIdx.x == 0) {
      losses[n] = 0.0f;
      row_loss[n] = 0.0;
    }
    return;
  }
  const float* x = logits + n * V;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx, shf);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - mx);
  sum = block_sum(sum, shd);
  if (threadIdx.x == 0) {
    const double loss = mx + ::log(sum) - x[t];
    losses[n] = static_cast<float>(loss);
    row_loss[n] = loss;
  }
}

// One block: total (double) and count of the non-ignored rows, in a fixed order.
__global__ void cross_entropy_total_k(double* total, long long* count, const double* row_loss,
                                      const int32_t* targets, int64_t N, int32_t ignore_index) {
  __shared__ double shd[32];
  double s = 0.0, c = 0.0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x)
    if (targets[n] != ignore_index) {
      s += row_loss[n];
      c += 1.0;
    }
  s = block_sum(s, shd);
  c = block_sum(c, shd);
  if (threadIdx.x == 0) {
    *total = s;
    *count = static_cast<long long>(c);
  }
}

// dlogits = (softmax(x) - onehot(t)) dloss; ignored rows 0. In place allowed: every
// read of x precedes (block barrier) the writes, each element written by its reader.
__global__ void cross_entropy_bwd_k(float* dl, const float* logits, const int32_t* targets, float dloss, int64_t V,
                                    int32_t ignore_index) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  const float* x = logits + n * V;
  float* d = dl + n * V;
  if (t == ignore_index) {
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) d[i] = 0.0f;
    return;
  }
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx, shf);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - mx);
  sum = block_sum(sum, shd);
  const float sc = static_cast<float>(dloss / sum);
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) d[i] = expf(x[i] - mx) * sc;
  __syncthreads();
  if (threadIdx.x == 0) d[t] -= dloss;
}

// ---------------------------------------------------------------- optimizer, norms

__global__ void adamw_k(float* p, const float* g, float* m, float* v, int64_t n, float b1, float b2, float omb1,
                        float omb2, float inv_bc1, float inv_sqrt_bc2, float eps, float lr, float lr_wd) {
  FLOWRUN_GRID_STRIDE(i, n) {
    const float gi = g[i], pi = p[i];
    const float mi = b1 * m[i] + omb1 * gi;
    const float vi = b2 * v[i] + omb2 * gi * gi;
    const float upd = (mi * inv_bc1) / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    p[i] = (pi - lr_wd * pi) - lr * upd;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void sum_squares_partial_k(double* partial, const float* x, int64_t n) {
  __shared__ double shd[32];
  double s = 0.0;
  FLOWRUN_GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s, shd);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_k(double* out, const double* partial, int64_t n) {
  __shared__ double shd[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, shd);
  if (threadIdx.x == 0) *out = s;
}

#undef FLOWRUN_GRID_STRIDE

// ---------------------------------------------------------------- the backend

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string("CUDA gemm: ") + what + " = " + std::to_string(v) +
                                " does not fit cuBLAS's int");
  return static_cast<int>(v);
}

/// Elements spanned by `batch` row-major matrices (rows x cols, row stride ld, stride apart).
int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/// Rounds n floats to bf16 in scratch memory.
void round_bf16(const scratch& dst, const float* src, int64_t n, const op_ctx& ctx) {
  if (n == 0) return;
  to_bf16_k<<<grid_for(n), k_threads, 0, ctx.s>>>(dst.as<__nv_bfloat16>(), src, n);
  check_launch("to_bf16_k");
}

/// Launches an elementwise kernel `k(args..., n)` over n elements on the current stream
/// of `on`'s device (grid-stride, k_threads per block); nothing for n == 0.
template <class... P, class... A>
void elementwise(const char* name, const tensor& on, int64_t n, void (*k)(P...), A... args) {
  if (n == 0) return;
  op_ctx ctx(on);
  k<<<grid_for(n), k_threads, 0, ctx.s>>>(args..., n);
  check_launch(name);
}

class cuda_backend_impl final : public backend {
 public:
  const char* name() const override { return "cuda"; }

  // ---------------------------------------------------------------- basics

  void add(tensor& out, const tensor& a, const tensor& b) override {
    elementwise("add_k", out, out.numel(), add_k, out.data<float>(), a.data<float>(), b.data<float>());
  }

  void axpy(tensor& y, const tensor& x, float alpha) override {
    elementwise("axpy_k", y, y.numel(), axpy_k, y.data<float>(), x.data<float>(), alpha);
  }

  void scale(tensor& x, float s) override { elementwise("scale_k", x, x.numel(), scale_k, x.data<float>(), s); }

  void fill(tensor& x, float v) override { elementwise("fill_k", x, x.numel(), fill_k, x.data<float>(), v); }

  // ---------------------------------------------------------------- GEMM

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    gemm_batched(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
  }

  void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                    float* C, int64_t ldc, int64_t stride_c, int64_t batch) override {
    if (M == 0 || N == 0 || batch == 0) return;
    op_ctx ctx(device_of(C));
    ldc = std::max<int64_t>(ldc, 1);
    if (K == 0 || alpha == 0.0f) {  // C = beta C (beta == 0 ignores C's old contents, NaN included)
      scale_matrix_k<<<grid_for(M * N * batch), k_threads, 0, ctx.s>>>(C, M, N, ldc, stride_c, batch, beta);
      check_launch("scale_matrix_k");
      return;
    }
    lda = std::max<int64_t>(lda, 1);
    ldb = std::max<int64_t>(ldb, 1);
    // Row-major C (M, N) = op(A) op(B) is column-major C^T (N, M) = op(B)^T op(A)^T:
    // pass B first, A second, with the same transpose flags.
    const cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int m = to_int(N, "N"), n = to_int(M, "M"), k = to_int(K, "K");
    const int la = to_int(lda, "lda"), lb = to_int(ldb, "ldb"), lc = to_int(ldc, "ldc");
    const int nb = to_int(batch, "batch");
    cublasHandle_t h = cublas(ctx.dev);
    if (ops::get_matmul_precision() == ops::matmul_precision::bf16) {
      // op(A) is M x K: A has (trans_a ? K : M) rows of lda; B has (trans_b ? N : K) rows of ldb.
      const int64_t na = span(trans_a ? K : M, trans_a ? M : K, lda, stride_a, batch);
      const int64_t nbb = span(trans_b ? N : K, trans_b ? K : N, ldb, stride_b, batch);
      scratch a16(static_cast<size_t>(na) * sizeof(__nv_bfloat16), ctx.dev);
      scratch b16(static_cast<size_t>(nbb) * sizeof(__nv_bfloat16), ctx.dev);
      round_bf16(a16, A, na, ctx);
      round_bf16(b16, B, nbb, ctx);
      if (batch == 1)
        check_cublas(cublasGemmEx(h, opb, opa, m, n, k, &alpha, b16.as<__nv_bfloat16>(), CUDA_R_16BF, lb,
                                  a16.as<__nv_bfloat16>(), CUDA_R_16BF, la, &beta, C, CUDA_R_32F, lc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx (bf16)");
      else
        check_cublas(cublasGemmStridedBatchedEx(h, opb, opa, m, n, k, &alpha, b16.as<__nv_bfloat16>(), CUDA_R_16BF,
                                                lb, stride_b, a16.as<__nv_bfloat16>(), CUDA_R_16BF, la, stride_a,
                                                &beta, C, CUDA_R_32F, lc, stride_c, nb, CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT),
                     "cublasGemmStridedBatchedEx (bf16)");
      return;
    }
    if (batch == 1)
      check_cublas(cublasSgemm(h, opb, opa, m, n, k, &alpha, B, lb, A, la, &beta, C, lc), "cublasSgemm");
    else
      check_cublas(cublasSgemmStridedBatched(h, opb, opa, m, n, k, &alpha, B, lb, stride_b, A, la, stride_a, &beta,
                                             C, lc, stride_c, nb),
                   "cublasSgemmStridedBatched");
  }

  void add_bias(tensor& out, const tensor& bias) override {
    const int64_t C = bias.numel(), n = out.numel();
    if (C == 0 || n == 0) return;
    op_ctx ctx(out);
    add_bias_k<<<grid_for(n), k_threads, 0, ctx.s>>>(out.data<float>(), bias.data<float>(), C, n);
    check_launch("add_bias_k");
  }

  void bias_backward(tensor& dbias, const tensor& dout) override {
    const int64_t C = dbias.numel();
    const int64_t N = C ? dout.numel() / C : 0;
    op_ctx ctx(dbias);
    colsum_add(dbias.data<float>(), col_plain{dout.data<float>(), C}, N, C, ctx);
  }

  // ---------------------------------------------------------------- embedding

  void embedding_forward(tensor& out, const tensor& ids, const tensor& wte) override {
    const int64_t N = ids.numel(), C = wte.size(1);  // ids in [0, V): checked by ops.cpp
    op_ctx ctx(out);
    if (N * C == 0) return;
    embedding_fwd_k<<<grid_for(N * C), k_threads, 0, ctx.s>>>(out.data<float>(), ids.data<int32_t>(),
                                                                wte.data<float>(), C, N * C);
    check_launch("embedding_fwd_k");
  }

  void embedding_backward(tensor& dwte, const tensor& dout, const tensor& ids) override {
    const int64_t N = ids.numel(), C = dwte.size(1);  // ids < V: checked by ops.cpp (negative: skipped)
    op_ctx ctx(dwte);
    if (N * C == 0) return;
    embedding_bwd_k<<<grid_for(N * C), k_threads, 0, ctx.s>>>(dwte.data<float>(), dout.data<float>(),
                                                                ids.data<int32_t>(), C, N * C);
    check_launch("embedding_bwd_k");
  }

  // ---------------------------------------------------------------- norms

  void rmsnorm_forward(tensor& out, tensor& rstd, const tensor& x, const tensor& w, float eps) override {
    const int64_t C = w.numel();
    const int64_t N = C ? x.numel() / C : 0;
    if (N == 0) return;
    op_ctx ctx(x);
    rmsnorm_fwd_k<<<static_cast<unsigned>(N), row_threads(C), 0, ctx.s>>>(out.data<float>(), rstd.data<float>(),
                                                                         x.data<float>(), w.data<float>(), C, eps);
    check_launch("rmsnorm_fwd_k");
  }

  void rmsnorm_backward(tensor& dx, tensor& dw, const tensor& dout, const tensor& x, const tensor& w,
                        const tensor& rstd) override {
    const int64_t C = w.numel();
    const int64_t N = C ? x.numel() / C : 0;
    if (N == 0) return;
    op_ctx ctx(x);
    rmsnorm_bwd_k<<<static_cast<unsigned>(N), row_threads(C), 0, ctx.s>>>(
        dx.data<float>(), dout.data<float>(), x.data<float>(), w.data<float>(), rstd.data<float>(), C);
    check_launch("rmsnorm_bwd_k");
    colsum_add(dw.data<float>(), col_rms_dw{dout.data<float>(), x.data<float>(), rstd.data<float>(), C}, N, C, ctx);
  }

  void layernorm_forward(tensor& out, tensor& mean, tensor& rstd, const tensor& x, const tensor& w, const tensor& b,
                         float eps) override {
    const int64_t C = w.numel();
    const int64_t N = C ? x.numel() / C : 0;
    if (N == 0) return;
    op_ctx ctx(x);
    layernorm_fwd_k<<<static_cast<unsigned>(N), row_threads(C), 0, ctx.s>>>(
        out.data<float>(), mean.data<float>(), rstd.data<float>(), x.data<float>(), w.data<float>(),
        b.defined() ? b.data<float>() : nullptr, C, eps);
    check_launch("layernorm_fwd_k");
  }

  void layernorm_backward(tensor& dx, tensor& dw, tensor& db, const tensor& dout, const tensor& x, const tensor& w,
                          const tensor& mean, const tensor& rstd) override {
    const int64_t C = w.numel();
    const int64_t N = C ? x.numel() / C : 0;
    if (N == 0) return;
    op_ctx ctx(x);
    layernorm_bwd_k<<<static_cast<unsigned>(N), row_threads(C), 0, ctx.s>>>(
        dx.data<float>(), dout.data<float>(), x.data<float>(), w.data<float>(), mean.data<float>(),
        rstd.data<float>(), C);
    check_launch("layernorm_bwd_k");
    colsum_add(dw.data<float>(),
               col_ln_dw{dout.data<float>(), x.data<float>(), mean.data<float>(), rstd.data<float>(), C}, N, C, ctx);
    if (db.defined()) colsum_add(db.data<float>(), col_plain{dout.data<float>(), C}, N, C, ctx);
  }

  // ---------------------------------------------------------------- activations

  void activation_forward(tensor& out, const tensor& x, ops::activation a) override {
    elementwise("activation_fwd_k", x, x.numel(), activation_fwd_k, out.data<float>(), x.data<float>(),
                static_cast<int>(a));
  }

  void activation_backward(tensor& dx, const tensor& dout, const tensor& x, ops::activation a) override {
    elementwise("activation_bwd_k", x, x.numel(), activation_bwd_k, dx.data<float>(), dout.data<float>(),
                x.data<float>(), static_cast<int>(a));
  }

  void swiglu_forward(tensor& out, const tensor& gate, const tensor& up) override {
    elementwise("swiglu_fwd_k", out, out.numel(), swiglu_fwd_k, out.data<float>(), gate.data<float>(),
                up.data<float>());
  }

  void swiglu_backward(tensor& dgate, tensor& dup, const tensor& dout, const tensor& gate,
                       const tensor& up) override {
    elementwise("swiglu_bwd_k", dout, dout.numel(), swiglu_bwd_k, dgate.data<float>(), dup.data<float>(),
                dout.data<float>(), gate.data<float>(), up.data<float>());
  }

  // ---------------------------------------------------------------- RoPE

  // Angles as the CPU backend (llama2.c): freq_i = 1.0f / powf(theta, (float)(2i) / hs)
  // computed on the host (identical to the CPU's table), val = (float)pos * freq_i,
  // cosf / sinf on the device (CUDA's cosf/sinf: <= 2 ulp, full range reduction).
  void rope(tensor& x, const tensor& positions, float theta, ops::rope_layout layout, bool inverse) override {
    const int64_t B = x.size(0), T = x.size(1), NH = x.size(2), hs = x.size(3);
    const int64_t half = hs / 2;
    const int64_t total = B * T * NH * half;
    if (total == 0) return;
    op_ctx ctx(x);
    rope_freqs fr{};
    const bool table = half <= k_rope_table;
    if (table)
      for (int64_t i = 0; i < half; ++i)
        fr.f[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(hs));
    rope_k<<<grid_for(total), k_threads, 0, ctx.s>>>(x.data<float>(), positions.data<int32_t>(), fr, table, B * T,
                                                      NH, hs, theta, layout == ops::rope_layout::adjacent, inverse);
    check_launch("rope_k");
  }

  // ---------------------------------------------------------------- attention

  void attention_forward(tensor& out, tensor& att, const tensor& q, const tensor& k, const tensor& v,
                         const tensor& attn_mask, int64_t n_keys) override {
    const int64_t B = q.size(0), Tq = q.size(1), H = q.size(2), hs = q.size(3);
    const int64_t S = k.size(1), KV = k.size(2);
    const int64_t rows = B * H * Tq;
    if (rows == 0) return;
    op_ctx ctx(q);
    scratch tmp(att.defined() ? 0 : static_cast<size_t>(rows * std::max<int64_t>(n_keys, 1)) * sizeof(float),
                ctx.dev);
    float* ap = att.defined() ? att.data<float>() : tmp.as<float>();
    const int32_t* mp = attn_mask.defined() ? attn_mask.data<int32_t>() : nullptr;
    const int64_t mstride = attn_mask.defined() ? attn_mask.size(1) : 0;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    if (Tq < k_attn_gemm_rows || hs == 0 || n_keys == 0) {
      attention_fwd_k<<<static_cast<unsigned>(rows), k_threads, static_cast<size_t>(hs) * sizeof(float), ctx.s>>>(
          out.data<float>(), ap, q.data<float>(), k.data<float>(), v.data<float>(), mp, mstride, Tq, H, hs, S, KV,
          n_keys, scale);
      check_launch("attention_fwd_k");
      return;
    }
    // Query head h = kvh G + j reads kv head kvh. For each batch b and j < G one strided
    // batch over kvh: Q rows of head h are H hs apart, heads G hs apart; K/V rows KV hs apart.
    const int64_t G = H / KV;
    const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>();
    float* op = out.data<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < G; ++j)  // scores (Tq, n_keys) = scale Q K^T
        gemm_batched(false, true, Tq, n_keys, hs, scale, qp + b * Tq * H * hs + j * hs, H * hs, G * hs,
                     kp + b * S * KV * hs, KV * hs, hs, 0.0f, ap + (b * H + j) * Tq * n_keys, n_keys,
                     G * Tq * n_keys, KV);
    attention_mask_softmax_k<<<static_cast<unsigned>(rows), k_threads, 0, ctx.s>>>(ap, mp, mstride, Tq, H, n_keys);
    check_launch("attention_mask_softmax_k");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < G; ++j)  // out (Tq, hs) = P V
        gemm_batched(false, false, Tq, hs, n_keys, 1.0f, ap + (b * H + j) * Tq * n_keys, n_keys, G * Tq * n_keys,
                     vp + b * S * KV * hs, KV * hs, hs, 0.0f, op + b * Tq * H * hs + j * hs, H * hs, G * hs, KV);
  }

  void attention_backward(tensor& dq, tensor& dk, tensor& dv, const tensor& dout, const tensor& q, const tensor& k,
                          const tensor& v, const tensor& att) override {
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), hs = q.size(3);
    const int64_t KV = k.size(2);
    if (B * T * H == 0 || hs == 0) return;
    op_ctx ctx(q);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
    scratch ds(static_cast<size_t>(B * H * T * T) * sizeof(float), ctx.dev);
    if (T < k_attn_gemm_rows) {
      attention_bwd_rows_k<<<static_cast<unsigned>(B * H * T), k_threads, static_cast<size_t>(hs) * sizeof(float),
                             ctx.s>>>(dq.data<float>(), ds.as<float>(), dout.data<float>(), k.data<float>(),
                                      v.data<float>(), att.data<float>(), T, H, hs, KV, scale);
      check_launch("attention_bwd_rows_k");
      attention_bwd_keys_k<<<static_cast<unsigned>(B * T * KV), k_threads, 0, ctx.s>>>(
          dk.data<float>(), dv.data<float>(), ds.as<float>(), att.data<float>(), q.data<float>(), dout.data<float>(),
          T, H, hs, KV);
      check_launch("attention_bwd_keys_k");
      return;
    }
    // GEMM path (layout as in attention_forward): dP = dout V^T; the row kernel turns it
    // into dS (scale folded in) and writes the causal P; dq = dS K; dk = sum over the
    // group of dS^T Q; dv = sum over the group of P^T dout (beta 1 after the first head).
    const int64_t G = H / KV, TT = T * T;
    scratch pc(static_cast<size_t>(B * H * TT) * sizeof(float), ctx.dev);
    float *d = ds.as<float>(), *p = pc.as<float>();
    const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>(), *gp = dout.data<float>();
    float *dqp = dq.data<float>(), *dkp = dk.data<float>(), *dvp = dv.data<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < G; ++j)
        gemm_batched(false, true, T, T, hs, 1.0f, gp + b * T * H * hs + j * hs, H * hs, G * hs,
                     vp + b * T * KV * hs, KV * hs, hs, 0.0f, d + (b * H + j) * TT, T, G * TT, KV);
    attention_softmax_bwd_k<<<static_cast<unsigned>(B * H * T), k_threads, 0, ctx.s>>>(d, p, att.data<float>(), T,
                                                                                       scale);
    check_launch("attention_softmax_bwd_k");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < G; ++j) {
        const float beta = j == 0 ? 0.0f : 1.0f;
        gemm_batched(false, false, T, hs, T, 1.0f, d + (b * H + j) * TT, T, G * TT, kp + b * T * KV * hs, KV * hs,
                     hs, 0.0f, dqp + b * T * H * hs + j * hs, H * hs, G * hs, KV);
        gemm_batched(true, false, T, hs, T, 1.0f, d + (b * H + j) * TT, T, G * TT, qp + b * T * H * hs + j * hs,
                     H * hs, G * hs, beta, dkp + b * T * KV * hs, KV * hs, hs, KV);
        gemm_batched(true, false, T, hs, T, 1.0f, p + (b * H + j) * TT, T, G * TT, gp + b * T * H * hs + j * hs,
                     H * hs, G * hs, beta, dvp + b * T * KV * hs, KV * hs, hs, KV);
      }
  }

  // ---------------------------------------------------------------- softmax, losses

  void softmax_forward(tensor& out, const tensor& x, bool log) override {
    const int64_t V = x.size(-1);
    const int64_t N = V ? x.numel() / V : 0;
    if (N == 0) return;
    op_ctx ctx(x);
    softmax_fwd_k<<<static_cast<unsigned>(N), row_threads(V), 0, ctx.s>>>(out.data<float>(), x.data<float>(), V, log);
    check_launch("softmax_fwd_k");
  }

  void softmax_backward(tensor& dx, const tensor& dout, const tensor& out, bool log) override {
    const int64_t V = out.size(-1);
    const int64_t N = V ? out.numel() / V : 0;
    if (N == 0) return;
    op_ctx ctx(out);
    softmax_bwd_k<<<static_cast<unsigned>(N), row_threads(V), 0, ctx.s>>>(dx.data<float>(), dout.data<float>(),
                                                                         out.data<float>(), V, log);
    check_launch("softmax_bwd_k");
  }

  double cross_entropy_forward(tensor& losses, const tensor& logits, const tensor& targets, int64_t* n_valid,
                               int32_t ignore_index) override {
    const int64_t V = logits.size(-1);
    const int64_t N = targets.numel();
    op_ctx ctx(logits);
    if (N == 0) {
      if (n_valid) *n_valid = 0;
      return 0.0;
    }
    scratch row_loss(static_cast<size_t>(N) * sizeof(double), ctx.dev);
    scratch result(sizeof(double) + sizeof(long long), ctx.dev);
    cross_entropy_fwd_k<<<static_cast<unsigned>(N), row_threads(V), 0, ctx.s>>>(
        losses.data<float>(), row_loss.as<double>(), logits.data<float>(), targets.data<int32_t>(), V, ignore_index);
    check_launch("cross_entropy_fwd_k");
    double* total_d = result.as<double>();
    long long* count_d = reinterpret_cast<long long*>(total_d + 1);
    cross_entropy_total_k<<<1, 1024, 0, ctx.s>>>(total_d, count_d, row_loss.as<double>(), targets.data<int32_t>(), N,
                                                  ignore_index);
    check_launch("cross_entropy_total_k");
    double total = 0.0;
    long long count = 0;
    check(cudaMemcpyAsync(&total, total_d, sizeof(double), cudaMemcpyDeviceToHost, ctx.s), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(&count, count_d, sizeof(long long), cudaMemcpyDeviceToHost, ctx.s), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(ctx.s), "cudaStreamSynchronize");
    if (n_valid) *n_valid = count;
    return count ? total / static_cast<double>(count) : 0.0;
  }

  void cross_entropy_backward(tensor& dlogits, const tensor& logits, const tensor& targets, float dloss,
                              int32_t ignore_index) override {
    const int64_t V = logits.size(-1);
    const int64_t N = targets.numel();
    op_ctx ctx(logits);
    if (N == 0 || V == 0) return;
    cross_entropy_bwd_k<<<static_cast<unsigned>(N), row_threads(V), 0, ctx.s>>>(
        dlogits.data<float>(), logits.data<float>(), targets.data<int32_t>(), dloss, V, ignore_index);
    check_launch("cross_entropy_bwd_k");
  }

  // ---------------------------------------------------------------- optimizer

  // As the CPU backend: element math in f32, bias corrections in double.
  void adamw_step(tensor& param, const tensor& grad, tensor& m, tensor& v, int64_t t,
                  const ops::adamw_config& cfg) override {
    const int64_t n = param.numel();
    if (n == 0) return;
    op_ctx ctx(param);
    const ops::adamw_coeffs k = ops::adamw_coeffs::of(cfg, t);
    adamw_k<<<grid_for(n), k_threads, 0, ctx.s>>>(param.data<float>(), grad.data<float>(), m.data<float>(),
                                                   v.data<float>(), n, cfg.beta1, cfg.beta2, k.omb1, k.omb2,
                                                   k.inv_bc1, k.inv_sqrt_bc2, cfg.eps, cfg.lr, k.lr_wd);
    check_launch("adamw_k");
  }

  // Block partials in double (fixed grid for a given n: deterministic), then one block.
  double sum_squares(const tensor& x) override {
    const int64_t n = x.numel();
    if (n == 0) return 0.0;
    op_ctx ctx(x);
    const unsigned blocks = std::min<unsigned>(grid_for(n), 1024);
    scratch partial(blocks * sizeof(double) + sizeof(double), ctx.dev);
    double* part = partial.as<double>();
    sum_squares_partial_k<<<blocks, k_threads, 0, ctx.s>>>(part, x.data<float>(), n);
    check_launch("sum_squares_partial_k");
    sum_partials_k<<<1, k_threads, 0, ctx.s>>>(part + blocks, part, blocks);
    check_launch("sum_partials_k");
    double s = 0.0;
    check(cudaMemcpyAsync(&s, part + blocks, sizeof(double), cudaMemcpyDeviceToHost, ctx.s), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(ctx.s), "cudaStreamSynchronize");
    return s;
  }

 private:
  /// Threads of a row block: enough for C columns, 32 to 256 in warps.
  static unsigned row_threads(int64_t C) {
    return static_cast<unsigned>(std::clamp<int64_t>((C + 31) / 32 * 32, 32, k_threads));
  }
};

}  // namespace

backend* backend_instance() {
  static cuda_backend_impl* instance = new cuda_backend_impl;  // leaked: used until process exit
  return instance;
}

}  // namespace flowrun::cuda::detail
