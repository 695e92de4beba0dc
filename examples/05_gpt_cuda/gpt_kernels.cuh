#pragma once
// The CUDA GPT trainer's own kernels: embeddings, layernorm, GELU, cross-entropy, bias and residual adds, and the
// casts between the compute type W (float or fsdp::bfloat16) and fp32 (attention is attention.cuh's). Laid out as a
// CUDA engineer writes them: a row's reductions (layernorm, cross-entropy) by one warp
// (32 lanes a stride of 32 elements apart, so that a warp's loads are coalesced) or one block (cross-entropy over
// the vocabulary); a column's sums over rows (bias and layernorm parameter gradients) in two passes, 64-row
// partials then their sum, so that thousands of threads share the rows. Every reduction has a fixed order
// (shuffles in a butterfly, whose lanes all end with the same bits since addition commutes; partials summed in
// chunk order; no atomics): a step's bits do not depend on scheduling, so activation checkpointing changes none.
// The order is not the host trainer's row order: the comparison with the host holds within a tolerance
// (main.cu).
#include <cuda_runtime_api.h>

#include <type_traits>

namespace gpt_cuda::kernels {

// Casts through the library's element types (fsdp::bfloat16's conversions are FSDP_HD bit operations): the same
// bits as the host trainer's casts, and no bf16 conversion instruction (which the simulated GPU lacks).
template <class W>
__device__ __forceinline__ float to_f(W x) {
  return static_cast<float>(x);
}
template <class W>
__device__ __forceinline__ W from_f(float x) {
  return W(x);
}
/// tanh from expf (the simulated GPU's PTX parser has no copysign, which tanhf uses): 1 - 2 / (e^2x + 1), exact
/// at the limits (e^2x = inf gives 1, 0 gives -1), within a few ulps of 1 elsewhere in absolute terms.
__device__ inline float tanh_exp(float x) {
  return __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(expf(__fmul_rn(2.0f, x)), 1.0f)));
}

/// The sum (max) of v over the warp's 32 lanes, every lane getting the same bits.
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/// The sum (max) of v over a block of 256 threads, every thread getting the same bits; `part` is 8 floats of shared
/// memory, free again on return.
template <bool Max>
__device__ inline float block_reduce(float v, float* part) {
  v = Max ? warp_max(v) : warp_sum(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  const float identity = Max ? -INFINITY : 0.0f;
  float r = threadIdx.x % 32 < blockDim.x / 32 ? part[threadIdx.x % 32] : identity;
  r = Max ? warp_max(r) : warp_sum(r);  // every warp the same inputs in the same order: the same bits
  __syncthreads();
  return r;
}

#define GPT_FOR(i, n) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)
/// One warp per row r of n < 2^31 (every lane of a warp the same r; launch rows * 32 threads, blocks of a multiple
/// of 32). An int: offsets are (long long)r * width.
#define GPT_FOR_WARP(r, n)                                                            \
  for (int r = int((blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32); r < (n); \
       r += int((long long)gridDim.x * blockDim.x / 32))
#define GPT_LANE int(threadIdx.x % 32)

/// Four consecutive elements of a 16-bit type, for one 64-bit access.
template <class X>
struct alignas(4 * sizeof(X)) quad_of {
  X x, y, z, w;
};
/// v stored as out[4j .. 4j + 3] in O: one 128-bit store for fp32, one 64-bit store of four for a 16-bit O (the
/// activations kept in the compute type). out starts on 16 bytes.
template <class O>
__device__ __forceinline__ void store4(O* out, long long j, float4 v) {
  if constexpr (std::is_same_v<O, float>)
    reinterpret_cast<float4*>(out)[j] = v;
  else
    reinterpret_cast<quad_of<O>*>(out)[j] = {from_f<O>(v.x), from_f<O>(v.y), from_f<O>(v.z), from_f<O>(v.w)};
}
/// x[4j .. 4j + 3] as floats: one 128-bit load for fp32, one 64-bit load of four for a 16-bit X.
template <class X>
__device__ __forceinline__ float4 load4(const X* x, long long j) {
  if constexpr (std::is_same_v<X, float>) {
    return reinterpret_cast<const float4*>(x)[j];
  } else {
    const quad_of<X> q = reinterpret_cast<const quad_of<X>*>(x)[j];
    return {to_f(q.x), to_f(q.y), to_f(q.z), to_f(q.w)};
  }
}
/// dst = float(src)
template <class W>
__global__ void widen(float* dst, const W* src, long long n) {
  GPT_FOR(k, n) dst[k] = to_f(src[k]);
}
/// dst = W(src): an activation rounded to the compute type for a GEMM in it.
template <class W>
__global__ void narrow(W* dst, const float* src, long long n) {
  GPT_FOR(k, n) dst[k] = from_f<W>(src[k]);
}
/// g += v, rounded once to W (g is a gradient buffer in the compute type).
template <class W>
__global__ void store(W* g, const float* v, long long n) {
  GPT_FOR(k, n) g[k] = from_f<W>(__fadd_rn(to_f(g[k]), v[k]));
}
/// x[n, c] = wte[tok[n], c] + wpe[pos[n], c]
template <class W>
__global__ void embed(float* x, const W* wte, const W* wpe, const int* tok, const int* pos, int N, int C) {
  GPT_FOR(e, (long long)N * C) {
    const int n = int(e / C), c = int(e % C);
    x[e] = __fadd_rn(to_f(wte[(long long)tok[n] * C + c]), to_f(wpe[(long long)pos[n] * C + c]));
  }
}
/// The embeddings' gradients, a row of the table per group of tokens that share it (row_groups: the rows n of one
/// token id, or one position, in increasing n): g[key[j], c] += dx[n, c] over the group's n in order. One block a
/// group, threads along the channels (coalesced), so every distinct token and position sums in parallel; each
/// element adds its rows in n order, as one thread walking every token did before: the same bits. The groups are
/// those j with first[j] < N (the first G; the rest of `first` holds N): read from the device, so that a captured
/// step (a CUDA graph) serves every batch.
template <int = 0>
__global__ void grouped_row_sum(float* g, const float* dx, const int* order, const int* first, const int* key, int N,
                                int C) {
  for (int j = blockIdx.x; j < N && first[j] < N; j += gridDim.x) {
    float* out = g + (long long)key[j] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = out[c];
      for (int i = first[j]; i < first[j + 1]; ++i) acc = __fadd_rn(acc, dx[(long long)order[i] * C + c]);
      out[c] = acc;
    }
  }
}
/// y[n, o] += b[o], y in Y (fp32, or the compute type: a product's output kept so), four columns a thread (a 128-bit
/// or 64-bit access; O % 4 == 0).
template <class Y = float>
__global__ void add_bias(Y* y, const float* b, int N, int O) {
  GPT_FOR(i, (long long)N * O / 4) {
    const float4 v = load4(y, i), c = reinterpret_cast<const float4*>(b)[i % (O / 4)];
    store4(y, i, {__fadd_rn(v.x, c.x), __fadd_rn(v.y, c.y), __fadd_rn(v.z, c.z), __fadd_rn(v.w, c.w)});
  }
}
/// Rows per partial of a column sum.
constexpr int column_chunk = 64;
__host__ __device__ inline int column_chunks(int N) { return (N + column_chunk - 1) / column_chunk; }
/// part[k, o] = the sum of dy[n, o] over the k-th 64 rows, in row order, in fp32 (a thread per k and four columns:
/// coalesced over o; O % 4 == 0), dy in D: fp32 in 128-bit loads, or the compute type (the gradients the trainer keeps
/// so) in 64-bit.
template <class D = float>
__global__ void column_partials(float* part, const D* dy, int N, int O) {
  const int O4 = O / 4;
  GPT_FOR(e, (long long)column_chunks(N) * O4) {
    const int k = int(e / O4), o4 = int(e % O4), end = min(N, (k + 1) * column_chunk);
    float4 acc = {0, 0, 0, 0};
    for (int n = k * column_chunk; n < end; ++n) {
      const float4 d = load4(dy + (long long)n * O, o4);
      acc = {__fadd_rn(acc.x, d.x), __fadd_rn(acc.y, d.y), __fadd_rn(acc.z, d.z), __fadd_rn(acc.w, d.w)};
    }
    reinterpret_cast<float4*>(part)[e] = acc;
  }
}
/// db[o] += the sum of part[k, o] over the K partials, in order.
template <int = 0>
__global__ void column_total(float* db, const float* part, int K, int O) {
  GPT_FOR(o, O) {
    float acc = 0;
    for (int k = 0; k < K; ++k) acc = __fadd_rn(acc, part[(long long)k * O + o]);
    db[o] = __fadd_rn(db[o], acc);
  }
}

constexpr float ln_eps = 1e-5f;
/// The sum of a float4's lanes in order, after acc.
__device__ __forceinline__ float add4(float acc, float4 v) {
  return __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc, v.x), v.y), v.z), v.w);
}
/// Layernorm of row n (x: the row), by the warp's lanes, four columns at a time in 128-bit accesses (lane i reads and
/// writes columns 4i .. 4i + 3, then 4(i + 32) ..., so that a warp's loads are coalesced; C % 4 == 0 and rows start on
/// 16 bytes: the trainer's widths and buffers).
/// `sum`: the lane's add4 of its columns in order (row_sum), which the caller may have taken as it wrote them.
template <class O>
__device__ __forceinline__ void layernorm_row(O* out, float* mean, float* rstd, const float* x, const float* w,
                                              const float* b, long long n, int C, int lane, float sum) {
  const auto *x4 = reinterpret_cast<const float4*>(x), *w4 = reinterpret_cast<const float4*>(w),
             *b4 = reinterpret_cast<const float4*>(b);
  const int C4 = C / 4;
  const float m = __fdiv_rn(warp_sum(sum), float(C));
  float v = 0;
  for (int j = lane; j < C4; j += 32) {
    const float4 q = x4[j];
    v = add4(v, {__fmul_rn(__fsub_rn(q.x, m), __fsub_rn(q.x, m)), __fmul_rn(__fsub_rn(q.y, m), __fsub_rn(q.y, m)),
                 __fmul_rn(__fsub_rn(q.z, m), __fsub_rn(q.z, m)), __fmul_rn(__fsub_rn(q.w, m), __fsub_rn(q.w, m))});
  }
  v = __fdiv_rn(warp_sum(v), float(C));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(v, ln_eps)));
  O* row = out + n * C;
  auto norm = [&](float q, float wc, float bc) { return __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(q, m), r), wc), bc); };
  for (int j = lane; j < C4; j += 32) {
    const float4 q = x4[j], wj = w4[j], bj = b4[j];
    store4(row, j, {norm(q.x, wj.x, bj.x), norm(q.y, wj.y, bj.y), norm(q.z, wj.z, bj.z), norm(q.w, wj.w, bj.w)});
  }
  if (lane == 0) mean[n] = m, rstd[n] = r;
}
/// The lane's part of a row's sum: add4 of its columns 4j .. 4j + 3, j = lane, lane + 32, ..., in that order.
__device__ __forceinline__ float row_sum(const float* x, int C, int lane) {
  float m = 0;
  for (int j = lane; j < C / 4; j += 32) m = add4(m, reinterpret_cast<const float4*>(x)[j]);
  return m;
}
/// One warp per row; out in O (fp32, or the compute type when only matrix products read it).
template <class O = float>
__global__ void layernorm_forward(O* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                  int N, int C) {
  const int lane = GPT_LANE;
  GPT_FOR_WARP(n, N) {
    const float* x = inp + (long long)n * C;
    layernorm_row(out, mean, rstd, x, w, b, n, C, lane, row_sum(x, C, lane));
  }
}
/// y = (proj + bias) + res, then out = layernorm(y), one warp per row: a linear layer's bias, the residual add and
/// the next layernorm in one pass. proj is the projection's product in P (fp32, or the compute type as autocast
/// writes a linear layer's output: four bf16 in one 64-bit load), widened and added in fp32; y, the residual stream,
/// is fp32 (out in O, as layernorm_forward's). Each lane reads back only the columns it wrote.
template <class O = float, class P = float>
__global__ void bias_residual_layernorm(float* y, O* out, float* mean, float* rstd, const P* proj, const float* bias,
                                        const float* res, const float* w, const float* b, int N, int C) {
  const int lane = GPT_LANE;
  GPT_FOR_WARP(n, N) {
    float* row = y + (long long)n * C;
    auto* row4 = reinterpret_cast<float4*>(row);
    const P* prow = proj + (long long)n * C;
    const auto *bias4 = reinterpret_cast<const float4*>(bias),
               *res4 = reinterpret_cast<const float4*>(res + (long long)n * C);
    float sum = 0;  // row_sum's, taken as the columns are written (no pass to read them back for it)
// Not unrolled: unrolled, the loads of two iterations in flight take 44 registers, under 75% occupancy (sass-check).
#pragma unroll 1
    for (int j = lane; j < C / 4; j += 32) {
      const float4 v = load4(prow, j), bj = bias4[j], rj = res4[j];
      const float4 s = {__fadd_rn(__fadd_rn(v.x, bj.x), rj.x), __fadd_rn(__fadd_rn(v.y, bj.y), rj.y),
                        __fadd_rn(__fadd_rn(v.z, bj.z), rj.z), __fadd_rn(__fadd_rn(v.w, bj.w), rj.w)};
      row4[j] = s;
      sum = add4(sum, s);
    }
    layernorm_row(out, mean, rstd, row, w, b, n, C, lane, sum);  // the same lane reads back the columns it wrote
  }
}
/// y[n, o] = (proj[n, o] + bias[o]) + res[n, o]: a linear layer's bias and the residual add in one pass, proj in P
/// (as bias_residual_layernorm's), y fp32. O % 4 == 0: four columns a thread (see bias_gelu).
template <class P = float>
__global__ void bias_residual(float* y, const P* proj, const float* bias, const float* res, int N, int O) {
  auto* y4 = reinterpret_cast<float4*>(y);
  GPT_FOR(i, (long long)N * O / 4) {
    const float4 v = load4(proj, i), b = reinterpret_cast<const float4*>(bias)[i % (O / 4)],
                 r = reinterpret_cast<const float4*>(res)[i];
    y4[i] = {__fadd_rn(__fadd_rn(v.x, b.x), r.x), __fadd_rn(__fadd_rn(v.y, b.y), r.y),
             __fadd_rn(__fadd_rn(v.z, b.z), r.z), __fadd_rn(__fadd_rn(v.w, b.w), r.w)};
  }
}
/// dinp += the gradient of layernorm's input, one warp per row, four columns a lane in 128-bit accesses (as
/// layernorm_row); dout in D: fp32, or the compute type (the trainer's, four bf16 in one 64-bit load).
template <class D = float>
__global__ void layernorm_backward_input(float* dinp, const D* dout, const float* inp, const float* w,
                                         const float* mean, const float* rstd, int N, int C) {
  const int lane = GPT_LANE, C4 = C / 4;
  const auto* w4 = reinterpret_cast<const float4*>(w);
  GPT_FOR_WARP(n, N) {
    const auto* x4 = reinterpret_cast<const float4*>(inp + (long long)n * C);
    const D* drow = dout + (long long)n * C;
    const float m = mean[n], r = rstd[n];
    float dmean = 0, dnorm_mean = 0;
    for (int j = lane; j < C4; j += 32) {
      const float4 x = x4[j], d = load4(drow, j), wj = w4[j];
      const float4 dn = {__fmul_rn(wj.x, d.x), __fmul_rn(wj.y, d.y), __fmul_rn(wj.z, d.z), __fmul_rn(wj.w, d.w)};
      dmean = add4(dmean, dn);
      dnorm_mean =
          add4(dnorm_mean,
               {__fmul_rn(dn.x, __fmul_rn(__fsub_rn(x.x, m), r)), __fmul_rn(dn.y, __fmul_rn(__fsub_rn(x.y, m), r)),
                __fmul_rn(dn.z, __fmul_rn(__fsub_rn(x.z, m), r)), __fmul_rn(dn.w, __fmul_rn(__fsub_rn(x.w, m), r))});
    }
    dmean = __fdiv_rn(warp_sum(dmean), float(C));
    dnorm_mean = __fdiv_rn(warp_sum(dnorm_mean), float(C));
    auto g = [&](float x, float d, float wc, float acc) {
      const float norm = __fmul_rn(__fsub_rn(x, m), r), dnorm = __fmul_rn(wc, d);
      return __fadd_rn(acc, __fmul_rn(__fsub_rn(__fsub_rn(dnorm, dmean), __fmul_rn(norm, dnorm_mean)), r));
    };
    auto* o4 = reinterpret_cast<float4*>(dinp + (long long)n * C);
// Not unrolled: unrolled, the loads of two iterations in flight take 48 registers, under 75% occupancy (sass-check).
#pragma unroll 1
    for (int j = lane; j < C4; j += 32) {
      const float4 x = x4[j], d = load4(drow, j), wj = w4[j], o = o4[j];
      o4[j] = {g(x.x, d.x, wj.x, o.x), g(x.y, d.y, wj.y, o.y), g(x.z, d.z, wj.z, o.z), g(x.w, d.w, wj.w, o.w)};
    }
  }
}
/// The partials of dw and db (column_partials' layout, two arrays): the k-th 64 rows' sums of norm * dout and of
/// dout, four columns a thread in 128-bit accesses (C % 4 == 0; dout in D, as layernorm_backward_input's); column_total
/// adds them into dw and db.
template <class D = float>
__global__ void layernorm_param_partials(float* pw, float* pb, const D* dout, const float* inp, const float* mean,
                                         const float* rstd, int N, int C) {
  const int C4 = C / 4;
  GPT_FOR(e, (long long)column_chunks(N) * C4) {
    const int n0 = int(e / C4) * column_chunk, end = min(N, n0 + column_chunk);
    const D* d4 = dout + (long long)n0 * C + 4 * (e % C4);  // row n0, the thread's 4
    const auto* x4 = reinterpret_cast<const float4*>(inp) + (long long)n0 * C4 + e % C4;
    float4 gw = {0, 0, 0, 0}, gb = {0, 0, 0, 0};
    for (int n = n0; n < end; ++n, d4 += C, x4 += C4) {
      const float4 d = load4(d4, 0), x = *x4;
      const float m = mean[n], r = rstd[n];
      gb = {__fadd_rn(gb.x, d.x), __fadd_rn(gb.y, d.y), __fadd_rn(gb.z, d.z), __fadd_rn(gb.w, d.w)};
      gw = {__fadd_rn(gw.x, __fmul_rn(__fmul_rn(__fsub_rn(x.x, m), r), d.x)),
            __fadd_rn(gw.y, __fmul_rn(__fmul_rn(__fsub_rn(x.y, m), r), d.y)),
            __fadd_rn(gw.z, __fmul_rn(__fmul_rn(__fsub_rn(x.z, m), r), d.z)),
            __fadd_rn(gw.w, __fmul_rn(__fmul_rn(__fsub_rn(x.w, m), r), d.w))};
    }
    reinterpret_cast<float4*>(pw)[e] = gw;
    reinterpret_cast<float4*>(pb)[e] = gb;
  }
}

constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi)
__device__ __forceinline__ float gelu_of(float x) {
  const float x3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
  const float t = tanh_exp(__fmul_rn(gelu_k, __fadd_rn(x, x3)));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
}
/// d gelu(x) / dx times d.
__device__ __forceinline__ float gelu_grad(float x, float d) {
  const float x3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
  const float t = tanh_exp(__fmul_rn(gelu_k, __fadd_rn(x, x3)));
  const float sech2 = __fsub_rn(1.0f, __fmul_rn(t, t));
  const float inner = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), sech2), gelu_k),
                                __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * 0.044715f, x), x)));
  return __fmul_rn(__fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, t)), inner), d);
}
// The element-wise kernels below take four consecutive elements a thread, in 128-bit accesses for fp32 and 64-bit
// ones for four bf16 (checked in SASS by tools/sass-check): the trainer's widths are multiples of 4 (its constructor
// refuses others) and its buffers start 256-byte aligned, so every [N, 4C] or [N, C] row and bias starts on 16 bytes
// in fp32 and on 8 in bf16.

/// x[n, o] += bias[o], then out = gelu(x): the MLP's first bias and its activation in one pass, both in W (fp32, or
/// the compute type: the product's output and GELU's, as PyTorch's autocast keeps them). x with its bias, rounded to
/// W once, is what GELU reads here and what the backward reads. O % 4 == 0.
template <class W = float>
__global__ void bias_gelu(W* out, W* x, const float* bias, int N, int O) {
  const auto* b4 = reinterpret_cast<const float4*>(bias);
  GPT_FOR(i, (long long)N * O / 4) {
    float4 v = load4(x, i);
    const float4 b = b4[i % (O / 4)];
    v = {__fadd_rn(v.x, b.x), __fadd_rn(v.y, b.y), __fadd_rn(v.z, b.z), __fadd_rn(v.w, b.w)};
    if constexpr (!std::is_same_v<W, float>)
      v = {to_f(from_f<W>(v.x)), to_f(from_f<W>(v.y)), to_f(from_f<W>(v.z)), to_f(from_f<W>(v.w))};
    store4(x, i, v);
    store4(out, i, {gelu_of(v.x), gelu_of(v.y), gelu_of(v.z), gelu_of(v.w)});
  }
}
/// dx = gelu'(x) * dout, all three in W (x bias_gelu's; dout as the MLP's second product writes it, dx as its first
/// product's backward reads it: autocast keeps both gradients in the compute type), computed in fp32 and rounded
/// once; n % 4 == 0.
template <class W = float>
__global__ void gelu_backward(W* dx, const W* x, const W* dout, long long n) {
  GPT_FOR(i, n / 4) {
    const float4 v = load4(x, i), d = load4(dout, i);
    store4(dx, i, {gelu_grad(v.x, d.x), gelu_grad(v.y, d.y), gelu_grad(v.z, d.z), gelu_grad(v.w, d.w)});
  }
}

/// The floats of a row of V split for 128-bit accesses: `head` single floats up to the first 16-byte boundary, then
/// `body` float4s, then single floats to V.
struct row_split {
  int head, body;
  __device__ explicit row_split(const float* row, int V)
      : head(min(V, int((16 - (reinterpret_cast<unsigned long long>(row) & 15)) & 15) / 4)), body((V - head) / 4) {}
};
/// f(v, row[v]) for every v of the row by the block's threads (each a fixed set of v, in a fixed order), the row's
/// 16-byte-aligned middle in 128-bit loads.
template <class F>
__device__ __forceinline__ void each_in_row(const float* row, int V, F&& f) {
  const row_split p(row, V);
  for (int v = int(threadIdx.x); v < p.head; v += int(blockDim.x)) f(v, row[v]);
  const auto* r4 = reinterpret_cast<const float4*>(row + p.head);
  for (int j = int(threadIdx.x); j < p.body; j += int(blockDim.x)) {
    const float4 q = r4[j];
    const int v = p.head + 4 * j;
    f(v, q.x), f(v + 1, q.y), f(v + 2, q.z), f(v + 3, q.w);
  }
  for (int v = p.head + 4 * p.body + int(threadIdx.x); v < V; v += int(blockDim.x)) f(v, row[v]);
}
/// out[v] = g(v, row[v]) for every v of the row (out may be row: each thread writes only what it read), in 128-bit
/// loads and stores where out and row are equally aligned (the trainer's in-place use), single floats otherwise.
template <class G>
__device__ __forceinline__ void map_row(float* out, const float* row, int V, G&& g) {
  if (((reinterpret_cast<unsigned long long>(out) ^ reinterpret_cast<unsigned long long>(row)) & 15) != 0) {
    for (int v = int(threadIdx.x); v < V; v += int(blockDim.x)) out[v] = g(v, row[v]);
    return;
  }
  const row_split p(row, V);
  for (int v = int(threadIdx.x); v < p.head; v += int(blockDim.x)) out[v] = g(v, row[v]);
  const auto* r4 = reinterpret_cast<const float4*>(row + p.head);
  auto* o4 = reinterpret_cast<float4*>(out + p.head);
  for (int j = int(threadIdx.x); j < p.body; j += int(blockDim.x)) {
    const float4 q = r4[j];
    const int v = p.head + 4 * j;
    o4[j] = {g(v, q.x), g(v + 1, q.y), g(v + 2, q.z), g(v + 3, q.w)};
  }
  for (int v = p.head + 4 * p.body + int(threadIdx.x); v < V; v += int(blockDim.x)) out[v] = g(v, row[v]);
}

/// One block of 256 threads per row: row_loss[n] = logsumexp - logit of the target; dlogits = (softmax - onehot) *
/// dscale. Rows the mask leaves out (mask may be null: none) get a loss and a gradient of 0. dlogits may be logits
/// (in place: each thread writes only what it has read, and the target's logit is read before the barriers). The
/// row's aligned middle in 128-bit accesses (each_in_row, map_row). Launch with row_blocks(N).
template <int = 0>
__global__ void cross_entropy(float* dlogits, float* row_loss, const float* logits, const int* targets,
                              const int* mask, int N, int V, float dscale) {
  __shared__ float part[8];
  for (long long n = blockIdx.x; n < N; n += gridDim.x) {  // the same n in every thread of the block
    const float* l = logits + n * V;
    float* d = dlogits + n * V;
    if (mask && !mask[n]) {
      if (threadIdx.x == 0) row_loss[n] = 0.0f;
      for (int v = threadIdx.x; v < V; v += blockDim.x) d[v] = 0.0f;
      continue;
    }
    const int target = targets[n];
    const float target_logit = l[target];  // before the reductions' barriers: no thread has written yet
    float maxv = -INFINITY;
    each_in_row(l, V, [&](int, float x) { maxv = fmaxf(maxv, x); });
    maxv = block_reduce<true>(maxv, part);
    float sum = 0;
    each_in_row(l, V, [&](int, float x) { sum = __fadd_rn(sum, expf(__fsub_rn(x, maxv))); });
    sum = block_reduce<false>(sum, part);
    const float logsum = __fadd_rn(logf(sum), maxv);
    if (threadIdx.x == 0) row_loss[n] = __fsub_rn(logsum, target_logit);
    map_row(d, l, V, [&](int v, float x) {
      return __fmul_rn(__fsub_rn(expf(__fsub_rn(x, logsum)), v == target ? 1.0f : 0.0f), dscale);
    });
  }
}
/// *loss = the sum of row_loss over `denominator`, summed in double in row order by one thread (N is a batch's
/// tokens: small).
template <int = 0>
__global__ void mean_loss(float* loss, const float* row_loss, int N, double denominator) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    double acc = 0;
    for (int n = 0; n < N; ++n) acc += row_loss[n];
    *loss = float(acc / denominator);
  }
}

#undef GPT_FOR
#undef GPT_FOR_WARP
#undef GPT_LANE

}  // namespace gpt_cuda::kernels
