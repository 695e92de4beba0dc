#pragma once
// The CUDA GPT trainer's mixture of experts (gpt::shape::experts > 0): the router's softmax and top-k choice, the
// rows sent to the experts (dispatch) and their outputs weighted back into the residual stream (combine), the
// experts' two products with GELU between them, and every backward. The arithmetic of
// examples/04_gpt_host/gpt_host.hpp's experts, one thread an output element, each sum in a fixed order (no atomics):
// a step's bits do not depend on scheduling.
//
// The experts' products are plain loops, not cuBLAS: each received row runs through its own expert's weights (the
// rows arrive in the senders' order, their experts mixed), one thread an output element, a weight gradient summed
// over the rows of its expert in row order. Correct and deterministic, not fast: a trainer at scale sorts the rows by
// expert and runs one grouped GEMM (CUTLASS's grouped GEMM, cuBLAS's grouped batched GEMM).
//
// Layouts (N tokens, X experts, K choices a token, C channels, H = 4 C hidden, P the rank's experts, R rows received):
//   probs [N, X] fp32; choice, gate, dgate [N K] (choice a = t K + j: token t's j-th); order [N K] the choices in the
//   order they were sent (gpt::dispatch_order), where [N K] each choice's place in that order;
//   a sent or received row [C + 1]: the token's ln_2 output, then its expert among the receiver's (a float);
//   h [R, H] the experts' pre-activations; y [R, C] their outputs; moe_y [N K, C] each choice's output back in place.
#include <cuda_runtime_api.h>

#include "examples/05_gpt_cuda/gpt_kernels.cuh"

namespace gpt_cuda::experts {

using kernels::from_f;
using kernels::gelu_grad;
using kernels::gelu_of;
using kernels::to_f;

#define GPT_EXPERTS_FOR(i, n) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

/// sum_i f(a[i]) w[i stride] over n terms in order: a row of activations or gradients (f: as it is, or through
/// GELU) against a row or column of an expert's weight matrix in W. Each of the experts' products is one of these per
/// output element.
struct as_is {
  __device__ float operator()(float x) const { return x; }
};
struct through_gelu {
  __device__ float operator()(float x) const { return gelu_of(x); }
};
template <class W, class F = as_is>
__device__ inline float expert_dot(const float* a, const W* w, long long stride, int n, F f = {}) {
  float acc = 0;
  for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(f(a[i]), to_f(w[i * stride])));
  return acc;
}

/// One thread a token: probs' row (the router's logits) turned into its softmax in place, then the K most probable
/// experts (the lower index on a tie, as a stable sort), each with its probability renormalised over the chosen as
/// its gate.
template <int = 0>
__global__ void route(float* probs, int* choice, float* gate, int N, int X, int K) {
  GPT_EXPERTS_FOR(t, N) {
    float* pr = probs + t * X;
    float top = pr[0];
    for (int e = 1; e < X; ++e) top = fmaxf(top, pr[e]);
    float sum = 0;
    for (int e = 0; e < X; ++e) {
      pr[e] = expf(__fsub_rn(pr[e], top));
      sum = __fadd_rn(sum, pr[e]);
    }
    for (int e = 0; e < X; ++e) pr[e] = __fdiv_rn(pr[e], sum);
    int* ch = choice + t * K;
    float chosen = 0;
    for (int j = 0; j < K; ++j) {  // the j-th most probable among those not chosen yet
      int best = -1;
      for (int e = 0; e < X; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || ch[i] == e;
        if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
      }
      ch[j] = best;
      chosen = __fadd_rn(chosen, pr[best]);
    }
    for (int j = 0; j < K; ++j) gate[t * K + j] = __fdiv_rn(pr[ch[j]], chosen);
  }
}

/// The rows this rank sends, in `order`: row i is choice order[i]'s token's ln_2 output (in W, widened) and its
/// expert's index among the receiver's `per`.
template <class W>
__global__ void dispatch(float* send, const W* ln2, const int* order, const int* choice, int M, int K, int C, int per) {
  GPT_EXPERTS_FOR(k, (long long)M * (C + 1)) {
    const long long i = k / (C + 1);
    const int c = int(k % (C + 1)), a = order[i];
    send[k] = c < C ? to_f(ln2[(long long)(a / K) * C + c]) : float(choice[a] % per);
  }
}

/// h[r, j] = fc.b[e, j] + sum_c x[r, c] fc.w[e, j, c] for each received row r of expert e = x[r, C].
template <class W>
__global__ void expert_fc(float* h, const float* in, const W* fcw, const W* fcb, int R, int C, int H) {
  GPT_EXPERTS_FOR(k, (long long)R * H) {
    const long long r = k / H;
    const int j = int(k % H);
    const float* x = in + r * (C + 1);
    const long long e = (long long)x[C];
    h[k] = __fadd_rn(expert_dot(x, fcw + (e * H + j) * C, 1, C), to_f(fcb[e * H + j]));
  }
}

/// y[r, c] = proj.b[e, c] + sum_j gelu(h[r, j]) proj.w[e, c, j].
template <class W>
__global__ void expert_proj(float* y, const float* h, const float* in, const W* projw, const W* projb, int R, int C,
                            int H) {
  GPT_EXPERTS_FOR(k, (long long)R * C) {
    const long long r = k / C;
    const int c = int(k % C);
    const long long e = (long long)in[r * (C + 1) + C];
    y[k] = __fadd_rn(expert_dot(h + r * H, projw + (e * C + c) * H, 1, H, through_gelu{}), to_f(projb[e * C + c]));
  }
}

/// moe_y[order[i], :] = back[i, :]: each choice's expert output, come back in the order it was sent, put in place.
template <int = 0>
__global__ void place(float* moe_y, const float* back, const int* order, int M, int C) {
  GPT_EXPERTS_FOR(k, (long long)M * C) moe_y[(long long)order[k / C] * C + k % C] = back[k];
}

/// out[t, c] += sum_j gate[t K + j] moe_y[t K + j, c], j in order.
template <int = 0>
__global__ void combine(float* out, const float* moe_y, const float* gate, int N, int K, int C) {
  GPT_EXPERTS_FOR(k, (long long)N * C) {
    const long long t = k / C;
    const int c = int(k % C);
    float acc = out[k];
    for (int j = 0; j < K; ++j) acc = __fadd_rn(acc, __fmul_rn(gate[t * K + j], moe_y[(t * K + j) * C + c]));
    out[k] = acc;
  }
}

/// One thread a choice sent (i in order): the gradient of its expert output, gate x dout of its token, into send
/// row i, and its gate's gradient, dout . its expert output, into dgate.
template <int = 0>
__global__ void choice_gradients(float* send, float* dgate, const float* dout, const float* moe_y, const float* gate,
                                 const int* order, int M, int K, int C) {
  GPT_EXPERTS_FOR(i, M) {
    const int a = order[i];
    const float* d = dout + (long long)(a / K) * C;
    const float* y = moe_y + (long long)a * C;
    float dg = 0;
    for (int c = 0; c < C; ++c) {
      dg = __fadd_rn(dg, __fmul_rn(d[c], y[c]));
      send[i * C + c] = __fmul_rn(gate[a], d[c]);
    }
    dgate[a] = dg;
  }
}

/// dh[r, j] = gelu'(h[r, j]) sum_c dy[r, c] proj.w[e, c, j].
template <class W>
__global__ void expert_proj_backward(float* dh, const float* dy, const float* h, const float* in, const W* projw, int R,
                                     int C, int H) {
  GPT_EXPERTS_FOR(k, (long long)R * H) {
    const long long r = k / H;
    const int j = int(k % H);
    const long long e = (long long)in[r * (C + 1) + C];
    dh[k] = gelu_grad(h[k], expert_dot(dy + r * C, projw + e * C * H + j, H, C));
  }
}

/// dz[r, c] = sum_j dh[r, j] fc.w[e, j, c]: the gradient of the row's input, sent back to its token's rank.
template <class W>
__global__ void expert_fc_backward(float* dz, const float* dh, const float* in, const W* fcw, int R, int C, int H) {
  GPT_EXPERTS_FOR(k, (long long)R * C) {
    const long long r = k / C;
    const int c = int(k % C);
    const long long e = (long long)in[r * (C + 1) + C];
    dz[k] = expert_dot(dh + r * H, fcw + e * H * C + c, C, H);
  }
}

/// The experts' weight gradients, each element summed over its expert's rows in row order: fc.w [P, H, C] and fc.b
/// [P, H] from dh and the rows' inputs; proj.w [P, C, H] and proj.b [P, C] from dy and gelu(h).
template <int = 0>
__global__ void expert_weight_gradients(float* g_fcw, float* g_fcb, float* g_projw, float* g_projb, const float* dh,
                                        const float* dy, const float* h, const float* in, int R, int P, int C, int H) {
  const long long fc = (long long)P * H * (C + 1), proj = (long long)P * C * (H + 1);
  GPT_EXPERTS_FOR(k, fc + proj) {
    if (k < fc) {  // fc.w[e, j, c], or fc.b[e, j] at c == C
      const long long e = k / ((long long)H * (C + 1));
      const int j = int(k / (C + 1) % H), c = int(k % (C + 1));
      float acc = 0;
      for (long long r = 0; r < R; ++r) {
        const float* x = in + r * (C + 1);
        if ((long long)x[C] != e) continue;
        acc = __fadd_rn(acc, c < C ? __fmul_rn(dh[r * H + j], x[c]) : dh[r * H + j]);
      }
      if (c < C)
        g_fcw[(e * H + j) * C + c] = acc;
      else
        g_fcb[e * H + j] = acc;
    } else {  // proj.w[e, c, j], or proj.b[e, c] at j == H
      const long long q = k - fc, e = q / ((long long)C * (H + 1));
      const int c = int(q / (H + 1) % C), j = int(q % (H + 1));
      float acc = 0;
      for (long long r = 0; r < R; ++r) {
        if ((long long)in[r * (C + 1) + C] != e) continue;
        const float d = dy[r * C + c];
        acc = __fadd_rn(acc, j < H ? __fmul_rn(d, gelu_of(h[r * H + j])) : d);
      }
      if (j < H)
        g_projw[(e * C + c) * H + j] = acc;
      else
        g_projb[e * C + c] = acc;
    }
  }
}

/// dln2[t, c] = sum_j back[where[t K + j], c]: the gradients of a token's rows, come back from their experts, summed
/// in the order of its choices.
template <int = 0>
__global__ void gather_input_gradient(float* dln2, const float* back, const int* where, int N, int K, int C) {
  GPT_EXPERTS_FOR(k, (long long)N * C) {
    const long long t = k / C;
    const int c = int(k % C);
    float acc = 0;
    for (int j = 0; j < K; ++j) acc = __fadd_rn(acc, back[(long long)where[t * K + j] * C + c]);
    dln2[k] = acc;
  }
}

/// One thread a token: the router logits' gradient from its gates' (dgate, through their renormalisation) and the
/// load-balancing loss's (daux[e], the same for every token), through the softmax.
template <int = 0>
__global__ void route_backward(float* dlogits, const float* probs, const int* choice, const float* gate,
                               const float* dgate, const float* daux, int N, int X, int K) {
  GPT_EXPERTS_FOR(t, N) {
    const float* pr = probs + t * X;
    float* dl = dlogits + t * X;
    for (int e = 0; e < X; ++e) dl[e] = daux[e];  // dp, then the logits' gradient in place
    float chosen = 0, dot = 0;
    for (int j = 0; j < K; ++j) {
      chosen = __fadd_rn(chosen, pr[choice[t * K + j]]);
      dot = __fadd_rn(dot, __fmul_rn(dgate[t * K + j], gate[t * K + j]));
    }
    for (int j = 0; j < K; ++j) {
      const int e = choice[t * K + j];
      dl[e] = __fadd_rn(dl[e], __fdiv_rn(__fsub_rn(dgate[t * K + j], dot), chosen));
    }
    float s = 0;
    for (int e = 0; e < X; ++e) s = __fadd_rn(s, __fmul_rn(pr[e], dl[e]));
    for (int e = 0; e < X; ++e) dl[e] = __fmul_rn(pr[e], __fsub_rn(dl[e], s));
  }
}

/// out[k] = W(a[k] + b[k]): the ln_2 output's gradient, the experts' part and the router's, in the compute type the
/// norm's backward reads.
template <class W>
__global__ void add_into(W* out, const float* a, const float* b, long long n) {
  GPT_EXPERTS_FOR(k, n) out[k] = from_f<W>(__fadd_rn(a[k], b[k]));
}

/// *loss += aux: the blocks' load-balancing losses of the step, added to the mean cross-entropy.
template <int = 0>
__global__ void add_to_loss(float* loss, float aux) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *loss = __fadd_rn(*loss, aux);
}

#undef GPT_EXPERTS_FOR

}  // namespace gpt_cuda::experts
