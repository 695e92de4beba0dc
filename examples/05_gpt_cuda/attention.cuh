#pragma once
// The CUDA GPT trainer's causal attention, FlashAttention-2's algorithm: a block takes 64 query rows of one (batch
// row, head), 16 to a warp, and walks the key tiles its rows can see, keeping for each row a running maximum and sum
// of the softmax and the output so far, rescaled as the maximum grows; it stores the output and each row's
// log-sum-exp, never the [B, heads, T, T] probabilities. The backward recomputes the probabilities from the
// log-sum-exp in two kernels that each own what they write (no atomics, every sum in a fixed order, so activation
// checkpointing changes no bit): one per 64 keys that walks the queries for dK and dV, one per 64 queries that walks
// the keys for dQ, after a kernel that takes each row's dO . O.
//
// Every product is a warp's 16 x 8 x 16 tile product in the register layout of PTX's mma.m16n8k16 (`product`):
// on tensor cores (mma.sync with bf16 operands and fp32 sums: HMMA in SASS), or its twin, the same product by the
// warp's own lanes (shuffles and fused multiply-adds, in any element type), which is what runs where mma.sync
// cannot: in fp32, and on the simulated GPU (whose PTX reader has no mma; examples built with -DEXAMPLES_NO_MMA
// leave the instruction out of the program). Everything but the innermost product (tiles, masks, the online
// softmax, the register reuse of a product's output as the next product's input) is one code for both.
//
// In bf16 (E = fsdp::bfloat16) the operands are rounded to bf16 where FlashAttention rounds them under PyTorch's
// bf16 autocast: Q, K, V and dO as they enter a tile, the probabilities and dS before their products; the softmax
// statistics, the sums and the outputs stay fp32. Sequence packing: query t sees keys [starts[b, t], t] (starts
// may be null: the whole row); a block skips the key tiles before its first row's document.
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <fsdp/fsdp.cuh>

#include "examples/05_gpt_cuda/gpt_kernels.cuh"

namespace gpt_cuda::attention {

/// How a warp's 16 x 8 x 16 tile products are made.
enum class product {
  tensor,  ///< mma.sync on tensor cores (bf16 only; absent from a build with EXAMPLES_NO_MMA)
  twin,    ///< the same product from the warp's lanes: shuffles and fused multiply-adds
};
inline const char* name_of(product p) { return p == product::tensor ? "tensor cores (mma.sync)" : "twin (lanes)"; }

/// Whether this build has the tensor-core product.
constexpr bool have_tensor_cores =
#ifdef EXAMPLES_NO_MMA
    false;
#else
    true;
#endif

constexpr int warps = 4, threads = 32 * warps;
constexpr int rows_per_block = 16 * warps;  ///< query rows of a forward and dQ block; key rows of a dK/dV block
constexpr int tile = 32;                    ///< rows of the tile a block walks: keys (forward, dQ) or queries (dK/dV)
constexpr int pad = 8;                      ///< elements after each shared-memory row (fewer bank conflicts)

/// A warp's fragments, as PTX's mma.m16n8k16 lays them out over lanes (g = lane / 4, t = lane % 4):
/// A (16 x 16): x[0..1] row g, columns 2t and 2t + 1; x[2..3] row g + 8, the same columns; x[4..7] the same rows,
/// columns 2t + 8 and 2t + 9. B (16 x 8): x[0..1] rows 2t and 2t + 1, column g; x[2..3] rows 2t + 8, 2t + 9.
/// C (16 x 8, fp32): x[0..1] row g, columns 2t, 2t + 1; x[2..3] row g + 8.
template <class E>
struct afrag {
  E x[8];
};
template <class E>
struct bfrag {
  E x[4];
};
struct cfrag {
  float x[4] = {0, 0, 0, 0};
};

using kernels::from_f;  // the trainer's casts (gpt_kernels.cuh): the library's element types, the host's bits
using kernels::to_f;

#ifndef EXAMPLES_NO_MMA
__device__ __forceinline__ std::uint32_t pack(fsdp::bfloat16 lo, fsdp::bfloat16 hi) {
  return std::uint32_t(lo.bits) | (std::uint32_t(hi.bits) << 16);  // the lower column in the lower half
}
#endif

/// c += a b, one warp's tile product (every lane of the warp calls it).
template <product P, class E>
__device__ __forceinline__ void mma(cfrag& c, const afrag<E>& a, const bfrag<E>& b) {
  if constexpr (P == product::tensor) {
#ifndef EXAMPLES_NO_MMA
    static_assert(std::is_same_v<E, fsdp::bfloat16>, "attention: the tensor-core product takes bf16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
        : "r"(pack(a.x[0], a.x[1])), "r"(pack(a.x[2], a.x[3])), "r"(pack(a.x[4], a.x[5])), "r"(pack(a.x[6], a.x[7])),
          "r"(pack(b.x[0], b.x[1])), "r"(pack(b.x[2], b.x[3])));
#else
    static_assert(P != product::tensor, "attention: built without the tensor-core product (EXAMPLES_NO_MMA)");
#endif
  } else {
    // The twin: element (r, n) of the output sums a[r, k] b[k, n] over k in order; lane 4r' + (k % 8) / 2 holds
    // a[r', k] and lane 4n + (k % 8) / 2 holds b[k, n], each in a register that depends on k alone.
    // k = 8 hi + 2 src + odd in order; the loop over src is kept rolled (unrolled, the twin's instantiations took
    // ptxas minutes each), hi and odd unrolled so that every register is named at compile time (a register chosen
    // at run time would be a local-memory array).
    const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi)
#pragma unroll 1
      for (int src = 0; src < 4; ++src)
#pragma unroll
        for (int odd = 0; odd < 2; ++odd) {
          const float a0 = __shfl_sync(0xffffffffu, to_f(a.x[4 * hi + odd]), 4 * g + src);
          const float a1 = __shfl_sync(0xffffffffu, to_f(a.x[4 * hi + 2 + odd]), 4 * g + src);
          const float b0 = __shfl_sync(0xffffffffu, to_f(b.x[2 * hi + odd]), 4 * (2 * t) + src);
          const float b1 = __shfl_sync(0xffffffffu, to_f(b.x[2 * hi + odd]), 4 * (2 * t + 1) + src);
          c.x[0] = __fmaf_rn(a0, b0, c.x[0]);
          c.x[1] = __fmaf_rn(a0, b1, c.x[1]);
          c.x[2] = __fmaf_rn(a1, b0, c.x[2]);
          c.x[3] = __fmaf_rn(a1, b1, c.x[3]);
        }
  }
}

/// The A fragment of rows [row0, row0 + 16) and columns [col0, col0 + 16) of a row-major matrix of X (fp32 or the
/// compute type; row r at m + r * ld), rounded to E; rows from `rows` on and columns from `cols` on read as 0.
template <class E, class X>
__device__ __forceinline__ afrag<E> load_a(const X* m, long long ld, int row0, int rows, int col0, int cols) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  afrag<E> a;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = row0 + g + 8 * ((i / 2) % 2), c = col0 + 2 * t + i % 2 + 8 * (i / 4);
    a.x[i] = from_f<E>(r < rows && c < cols ? to_f(m[r * ld + c]) : 0.0f);
  }
  return a;
}
/// Rows [row0, row0 + R) of a row-major matrix of X into a shared tile of R rows of D (+ pad), rounded to E; rows
/// from `rows` on and columns from `cols` on as 0. Every thread of the block calls it.
template <class E, int R, int D, class X>
__device__ __forceinline__ void load_tile(E (*s)[D + pad], const X* m, long long ld, int row0, int rows, int cols) {
  for (int e = int(threadIdx.x); e < R * D; e += threads) {
    const int r = e / D, c = e % D;
    s[r][c] = from_f<E>(row0 + r < rows && c < cols ? to_f(m[(row0 + r) * ld + c]) : 0.0f);
  }
}
/// The B fragment b[k, n] = s[n0 + n][k0 + k] (the tile's rows are the product's columns: K for Q K^T).
template <class E, int D>
__device__ __forceinline__ bfrag<E> b_rows_n(const E (*s)[D + pad], int n0, int k0) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  return {{s[n0 + g][k0 + 2 * t], s[n0 + g][k0 + 2 * t + 1], s[n0 + g][k0 + 2 * t + 8], s[n0 + g][k0 + 2 * t + 9]}};
}
/// The B fragment b[k, n] = s[k0 + k][n0 + n] (the tile's rows are the sum's index: V for P V).
template <class E, int D>
__device__ __forceinline__ bfrag<E> b_rows_k(const E (*s)[D + pad], int k0, int n0) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  return {{s[k0 + 2 * t][n0 + g], s[k0 + 2 * t + 1][n0 + g], s[k0 + 2 * t + 8][n0 + g], s[k0 + 2 * t + 9][n0 + g]}};
}
/// The outputs of two neighbouring 16 x 8 products (columns 16s..16s+15) as the A fragment of the next product,
/// rounded to E: the register layouts line up, so no lane exchanges anything.
template <class E>
__device__ __forceinline__ afrag<E> to_a(const cfrag& lo, const cfrag& hi) {
  return {{from_f<E>(lo.x[0]), from_f<E>(lo.x[1]), from_f<E>(lo.x[2]), from_f<E>(lo.x[3]), from_f<E>(hi.x[0]),
           from_f<E>(hi.x[1]), from_f<E>(hi.x[2]), from_f<E>(hi.x[3])}};
}
/// The maximum (sum) over the 4 lanes of a quad, which hold one row's elements: every lane the same bits.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

/// f(r, c, n, i) for each element a lane holds of a warp's 16 x 8N product (element x[i] of fragment n): its row r
/// (0: g, 1: g + 8) and its column c.
template <int N, class F>
__device__ __forceinline__ void each_element(F&& f) {
  const int t = int(threadIdx.x % 4);
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) f(i / 2, 8 * n + 2 * t + i % 2, n, i);
}
/// acc[n] += a b_n^T, where a is the warp's 16 rows over the head (D / 16 fragments) and b_n the tile's rows 8n ..
/// 8n + 7 over the head: a 16 x 32 product against the tile (scores against keys, dP against values, ...). Column
/// groups that live(8n, 8) says the warp's rows cannot see are skipped (their results are masked to 0).
template <product P, class E, int D, class Live>
__device__ __forceinline__ void against_tile(cfrag (&acc)[tile / 8], const afrag<E> (&a)[D / 16], const E (*b)[D + pad],
                                             Live&& live) {
#pragma unroll
  for (int n = 0; n < tile / 8; ++n)
    if (live(8 * n, 8))
#pragma unroll
      for (int k = 0; k < D / 16; ++k) mma<P>(acc[n], a[k], b_rows_n<E, D>(b, 8 * n, 16 * k));
}
/// acc += s b, where s is a 16 x 32 product against a tile (its outputs reused as A fragments, rounded to E) and b
/// the tile's 32 rows over the head; the 16-row steps that live(16k, 16) says are all 0 are skipped.
template <product P, class E, int D, class Live>
__device__ __forceinline__ void through_tile(cfrag (&acc)[D / 8], const cfrag (&s)[tile / 8], const E (*b)[D + pad],
                                             Live&& live) {
#pragma unroll
  for (int k = 0; k < tile / 16; ++k) {
    if (!live(16 * k, 16)) continue;
    const afrag<E> a = to_a<E>(s[2 * k], s[2 * k + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) mma<P>(acc[n], a, b_rows_k<E, D>(b, 16 * k, 8 * n));
  }
}

/// A thread's two rows' values (rows g and g + 8 of its warp's 16), chosen by a select: a two-element array indexed
/// in a loop the compiler keeps rolled would be local memory.
template <class T>
struct two {
  T lo, hi;
  __device__ __forceinline__ T operator[](int r) const { return r ? hi : lo; }
};

/// The problem: qkv [B, T, 3C] (q, k, v of head h at columns h * hs, C + h * hs, 2C + h * hs), the output and its
/// gradient [B, T, C], the log-sum-exp and dO . O [B, NH, T]. qkv and the output are in the kernels' O (fp32, or the
/// compute type), the output's gradient and dqkv in G (the same choice), the rest fp32.
struct dims {
  int B, T, C, NH;
  const int* starts;  ///< [B * T] first key of each query's document, or null
  /// 1 / sqrt(hs), correctly rounded, made on the host (a division on the device calls a slow path whose saved
  /// registers are stack memory).
  float scale = NH > 0 ? 1.0f / std::sqrt(float(C / NH)) : 0.0f;
  __host__ __device__ int hs() const { return C / NH; }
  __host__ __device__ long long row3() const { return 3LL * C; }
  /// The first key query q of batch row b may see (0 for a row beyond T: it is masked anyway).
  __device__ int start(int b, int q) const { return starts && q < T ? starts[(long long)b * T + q] : 0; }
  /// Whether query q sees key k (q < T, start(q) <= k <= q).
  __device__ bool sees(int b, int q, int k, int first) const { return q < T && k <= q && k >= first; }
};

/// The keys a warp's 16 query rows [r0, r0 + 16) can see: from the first row's document start to the last row
/// (none for a warp past T). A tile product whose keys it does not meet is skipped by the whole warp (its
/// probabilities would all be masked to 0): the diagonal's upper triangle, the rows past T, earlier documents.
struct key_span {
  int lo, hi;
  __device__ key_span(const dims& d, int b, int r0)
      : lo(r0 < d.T ? d.start(b, r0) : INT_MAX), hi(r0 < d.T ? min(r0 + 15, d.T - 1) : INT_MIN) {}
  /// Whether keys [a, a + w) meet the span.
  __device__ bool meets(int a, int w) const { return a <= hi && a + w - 1 >= lo; }
};

/// out = softmax(mask(Q K^T / sqrt(hs))) V, lse = each row's log-sum-exp of the scaled scores. Grid (ceil(T / 64),
/// NH, B), 128 threads; D = hs rounded up (16 or 64).
template <class E, int D, product P, class O = float>
__global__ void __launch_bounds__(threads, 1) forward(O* out, float* lse, const O* qkv, dims d) {
  __shared__ E ks[tile][D + pad], vs[tile][D + pad];
  const int b = int(blockIdx.z), h = int(blockIdx.y), q0 = int(blockIdx.x) * rows_per_block;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  const int hs = d.hs(), T = d.T;
  const long long ld = d.row3();
  const O* rows = qkv + (long long)b * T * ld;
  const int r0 = q0 + 16 * warp;
  const two<int> q{r0 + g, r0 + g + 8}, first{d.start(b, r0 + g), d.start(b, r0 + g + 8)};
  const key_span keys(d, b, r0);
  const float scale = d.scale;
  afrag<E> qf[D / 16];
#pragma unroll
  for (int s = 0; s < D / 16; ++s) qf[s] = load_a<E>(rows + h * hs, ld, r0, T, 16 * s, hs);
  cfrag o[D / 8];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  const int last = min(T, q0 + rows_per_block) - 1;
  const int begin = d.start(b, q0) / tile * tile;  // documents only grow along a row: the first row's is the least
  for (int j0 = begin; j0 <= last; j0 += tile) {
    __syncthreads();  // the previous tile's readers are done
    load_tile<E, tile, D>(ks, rows + d.C + h * hs, ld, j0, T, hs);
    load_tile<E, tile, D>(vs, rows + 2 * d.C + h * hs, ld, j0, T, hs);
    __syncthreads();
    const auto live = [&](int c, int w) { return keys.meets(j0 + c, w); };
    cfrag s[tile / 8];
    against_tile<P, E, D>(s, qf, ks, live);
    float top[2] = {-INFINITY, -INFINITY};
    each_element<tile / 8>([&](int r, int c, int n, int i) {
      s[n].x[i] = d.sees(b, q[r], j0 + c, first[r]) ? __fmul_rn(s[n].x[i], scale) : -INFINITY;
      top[r] = fmaxf(top[r], s[n].x[i]);
    });
    float use[2], rescale[2], sum[2] = {0, 0};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float next = fmaxf(m[r], quad_max(top[r]));
      use[r] = next == -INFINITY ? 0.0f : next;  // a row that has seen no key yet: every p is 0, not NaN
      rescale[r] = expf(__fsub_rn(m[r], use[r]));
      m[r] = next;
    }
    each_element<tile / 8>([&](int r, int, int n, int i) {
      const float x = s[n].x[i];
      s[n].x[i] = x == -INFINITY ? 0.0f : expf(__fsub_rn(x, use[r]));
      sum[r] = __fadd_rn(sum[r], s[n].x[i]);
    });
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = __fadd_rn(__fmul_rn(l[r], rescale[r]), quad_sum(sum[r]));
    each_element<D / 8>([&](int r, int, int n, int i) { o[n].x[i] = __fmul_rn(o[n].x[i], rescale[r]); });
    through_tile<P, E, D>(o, s, vs, live);
  }
  each_element<D / 8>([&](int r, int c, int n, int i) {
    if (q[r] < T && c < hs)
      out[((long long)b * T + q[r]) * d.C + h * hs + c] = kernels::from_f<O>(__fdiv_rn(o[n].x[i], l[r]));
  });
  if (t == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (q[r] < T) lse[((long long)b * d.NH + h) * T + q[r]] = __fadd_rn(m[r], logf(l[r]));
}

/// dd[b, h, t] = dO[b, t, head h] . O[b, t, head h], one warp per row (lanes along the head, a butterfly sum); dO in
/// G (fp32, or the compute type: the trainer's, as autocast keeps the gradient of a bf16 output).
template <class O = float, class G = float>
__global__ void row_dots(float* dd, const G* dout, const O* out, dims d) {
  const int lane = int(threadIdx.x % 32), hs = d.hs();
  const long long rows = (long long)d.B * d.NH * d.T;
  for (long long e = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; e < rows;
       e += (long long)gridDim.x * blockDim.x / 32) {
    const int t = int(e % d.T), h = int(e / d.T % d.NH), b = int(e / d.T / d.NH);
    const long long at = ((long long)b * d.T + t) * d.C + h * hs;
    float v = 0;
    for (int i = lane; i < hs; i += 32)
      v = __fadd_rn(v, __fmul_rn(kernels::to_f(dout[at + i]), kernels::to_f(out[at + i])));
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) dd[e] = v;
  }
}

/// dQ += dS K / sqrt(hs) for 64 query rows a block, walking the key tiles as the forward does; dS = P * (dP - dd),
/// P recomputed from lse, dP = dO V^T. dO and dQKV in G (the sum rounded to G once). Grid and threads as forward.
template <class E, int D, product P, class O = float, class G = float>
__global__ void __launch_bounds__(threads, 1)
    backward_query(G* dqkv, const G* dout, const O* qkv, const float* lse, const float* dd, dims d) {
  __shared__ E ks[tile][D + pad], vs[tile][D + pad];
  const int b = int(blockIdx.z), h = int(blockIdx.y), q0 = int(blockIdx.x) * rows_per_block;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4;
  const int hs = d.hs(), T = d.T;
  const long long ld = d.row3();
  const O* rows = qkv + (long long)b * T * ld;
  const int r0 = q0 + 16 * warp;
  const two<int> q{r0 + g, r0 + g + 8}, first{d.start(b, r0 + g), d.start(b, r0 + g + 8)};
  const long long stat = ((long long)b * d.NH + h) * T;
  const two<float> row_lse{q.lo < T ? lse[stat + q.lo] : 0.0f, q.hi < T ? lse[stat + q.hi] : 0.0f};
  const two<float> row_dd{q.lo < T ? dd[stat + q.lo] : 0.0f, q.hi < T ? dd[stat + q.hi] : 0.0f};
  const key_span keys(d, b, r0);
  const float scale = d.scale;
  afrag<E> qf[D / 16], df[D / 16];
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    qf[s] = load_a<E>(rows + h * hs, ld, r0, T, 16 * s, hs);
    df[s] = load_a<E>(dout + (long long)b * T * d.C + h * hs, d.C, r0, T, 16 * s, hs);
  }
  cfrag dq[D / 8];
  const int last = min(T, q0 + rows_per_block) - 1;
  for (int j0 = d.start(b, q0) / tile * tile; j0 <= last; j0 += tile) {
    __syncthreads();
    load_tile<E, tile, D>(ks, rows + d.C + h * hs, ld, j0, T, hs);
    load_tile<E, tile, D>(vs, rows + 2 * d.C + h * hs, ld, j0, T, hs);
    __syncthreads();
    const auto live = [&](int c, int w) { return keys.meets(j0 + c, w); };
    cfrag s[tile / 8], dp[tile / 8];
    against_tile<P, E, D>(s, qf, ks, live);
    against_tile<P, E, D>(dp, df, vs, live);
    each_element<tile / 8>([&](int r, int c, int n, int i) {
      const float p =
          d.sees(b, q[r], j0 + c, first[r]) ? expf(__fsub_rn(__fmul_rn(s[n].x[i], scale), row_lse[r])) : 0.0f;
      s[n].x[i] = __fmul_rn(p, __fsub_rn(dp[n].x[i], row_dd[r]));  // dS
    });
    through_tile<P, E, D>(dq, s, ks, live);
  }
  each_element<D / 8>([&](int r, int c, int n, int i) {
    if (q[r] < T && c < hs) {
      G& g_q = dqkv[((long long)b * T + q[r]) * ld + h * hs + c];
      g_q = from_f<G>(__fadd_rn(to_f(g_q), __fmul_rn(dq[n].x[i], scale)));
    }
  });
}

/// dK += dS^T Q / sqrt(hs) and dV += P^T dO for 64 keys a block (16 a warp), walking the query tiles that can see
/// them. dO and dQKV in G, as backward_query. Grid (ceil(T / 64), NH, B), 128 threads.
template <class E, int D, product P, class O = float, class G = float>
__global__ void __launch_bounds__(threads, 1)
    backward_key(G* dqkv, const G* dout, const O* qkv, const float* lse, const float* dd, dims d) {
  __shared__ E qs[tile][D + pad], ds_[tile][D + pad];
  __shared__ float tile_lse[tile], tile_dd[tile];
  __shared__ int tile_first[tile];
  const int b = int(blockIdx.z), h = int(blockIdx.y), k0 = int(blockIdx.x) * rows_per_block;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4;
  const int hs = d.hs(), T = d.T;
  const long long ld = d.row3();
  const O* rows = qkv + (long long)b * T * ld;
  const G* drows = dout + (long long)b * T * d.C;
  const long long stat = ((long long)b * d.NH + h) * T;
  const int r0 = k0 + 16 * warp, key_hi = min(r0 + 15, T - 1);
  const two<int> key{r0 + g, r0 + g + 8};
  const float scale = d.scale;
  afrag<E> kf[D / 16], vf[D / 16];
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    kf[s] = load_a<E>(rows + d.C + h * hs, ld, r0, T, 16 * s, hs);
    vf[s] = load_a<E>(rows + 2 * d.C + h * hs, ld, r0, T, 16 * s, hs);
  }
  cfrag dk[D / 8], dv[D / 8];
  const int last_key = min(T, k0 + rows_per_block) - 1;
  for (int i0 = k0 / tile * tile; i0 < T; i0 += tile) {
    if (d.start(b, i0) > last_key) break;  // this tile's queries and every later one are in later documents
    __syncthreads();
    load_tile<E, tile, D>(qs, rows + h * hs, ld, i0, T, hs);
    load_tile<E, tile, D>(ds_, drows + h * hs, d.C, i0, T, hs);
    for (int r = int(threadIdx.x); r < tile; r += threads) {
      const int q = i0 + r;
      tile_lse[r] = q < T ? lse[stat + q] : 0.0f;
      tile_dd[r] = q < T ? dd[stat + q] : 0.0f;
      tile_first[r] = d.start(b, q);
    }
    __syncthreads();
    // Queries [i0 + c, i0 + c + w) meet this warp's keys [r0, r0 + 16): some of them are at or after its first
    // key, before T, and their first document starts at or before its last key (a skipped product's
    // probabilities would all be masked to 0).
    auto meets = [&](int c, int w) { return r0 < T && i0 + c < T && i0 + c + w - 1 >= r0 && tile_first[c] <= key_hi; };
    cfrag s[tile / 8], dp[tile / 8];  // transposed: rows are this warp's keys, columns the tile's queries
    against_tile<P, E, D>(s, kf, qs, meets);
    against_tile<P, E, D>(dp, vf, ds_, meets);
    each_element<tile / 8>([&](int r, int c, int n, int i) {
      const bool seen = key[r] < T && d.sees(b, i0 + c, key[r], tile_first[c]);
      const float p = seen ? expf(__fsub_rn(__fmul_rn(s[n].x[i], scale), tile_lse[c])) : 0.0f;
      s[n].x[i] = p;                                                 // P^T
      dp[n].x[i] = __fmul_rn(p, __fsub_rn(dp[n].x[i], tile_dd[c]));  // dS^T
    });
    through_tile<P, E, D>(dv, s, ds_, meets);
    through_tile<P, E, D>(dk, dp, qs, meets);
  }
  each_element<D / 8>([&](int r, int c, int n, int i) {
    if (key[r] < T && c < hs) {
      G* g_k = dqkv + ((long long)b * T + key[r]) * ld + d.C + h * hs + c;
      *g_k = from_f<G>(__fadd_rn(to_f(*g_k), __fmul_rn(dk[n].x[i], scale)));
      g_k[d.C] = from_f<G>(__fadd_rn(to_f(g_k[d.C]), dv[n].x[i]));
    }
  });
}

/// The padded head width the kernels are built for: 16 or 64 (a head of width 4 pads to 16; a head wider than 64
/// is refused by refusal()).
inline int padded(int hs) { return hs <= 16 ? 16 : 64; }

/// Why the attention cannot run this shape and product, or "".
inline std::string refusal(int head_width, bool bf16, product p) {
  if (head_width > 64)
    return "attention: a head of width " + std::to_string(head_width) +
           " is wider than the kernels' 64 (width / heads must be at most 64, as in every GPT-2; a wider head needs "
           "kernels that keep fewer rows in registers)";
  if (p == product::tensor && !bf16)
    return "attention: the tensor-core product takes bf16 operands; fp32 attention runs the twin (--attention twin)";
  if (p == product::tensor && !have_tensor_cores)
    return "attention: built without the tensor-core product (EXAMPLES_NO_MMA, the simulated GPU's build): use "
           "--attention twin";
  return "";
}

/// The launches, on stream s: forward(out, lse); backward(dqkv += ..., dd as scratch [B * NH * T]).
template <class E, product P>
struct launch {
  static dim3 grid(const dims& d) { return dim3(unsigned((d.T + rows_per_block - 1) / rows_per_block), d.NH, d.B); }
  template <class F>
  static void by_width(int hs, F&& f) {
    if (padded(hs) == 16)
      f(std::integral_constant<int, 16>{});
    else
      f(std::integral_constant<int, 64>{});
  }
  /// qkv and out in O: fp32, or the compute type (the trainer's: a product makes qkv; only a product and row_dots
  /// read out).
  template <class O>
  static void forward(O* out, float* lse, const O* qkv, const dims& d, cudaStream_t s) {
    by_width(d.hs(), [&](auto w) {
      attention::forward<E, decltype(w)::value, P, O><<<grid(d), threads, 0, s>>>(out, lse, qkv, d);
    });
  }
  /// dout and dqkv in G: fp32, or the compute type (the trainer's; dqkv zeroed, each sum then rounded once).
  template <class O, class G>
  static void backward(G* dqkv, float* dd, const G* dout, const O* out, const O* qkv, const float* lse, const dims& d,
                       cudaStream_t s) {
    const long long warps_blocks = ((long long)d.B * d.NH * d.T * 32 + 255) / 256;  // a warp a row, 256 threads
    row_dots<O, G><<<int(warps_blocks < 1024 ? warps_blocks : 1024), 256, 0, s>>>(dd, dout, out, d);
    by_width(d.hs(), [&](auto w) {
      backward_key<E, decltype(w)::value, P, O, G><<<grid(d), threads, 0, s>>>(dqkv, dout, qkv, lse, dd, d);
      backward_query<E, decltype(w)::value, P, O, G><<<grid(d), threads, 0, s>>>(dqkv, dout, qkv, lse, dd, d);
    });
  }
};

}  // namespace gpt_cuda::attention
