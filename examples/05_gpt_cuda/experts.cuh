#pragma once
// The CUDA GPT trainer's mixture of experts (gpt::shape::experts > 0), the kernels around the experts' products:
// the router's softmax and top-k choice, the rows sent to the experts (dispatch) and put in their experts' order on
// arrival, their outputs put back and weighted into the residual stream (combine), and the backward of each. The
// arithmetic of examples/04_gpt_host/gpt_host.hpp's experts, one thread a token, a choice or an output element, each
// sum in a fixed order (no atomics): a step's bits do not depend on scheduling (a token's input gradient sums its
// choices' in choice order, the host trainer's in send order: the same bits at top_k 2). The experts' products are
// the trainer's (gpt_cuda.cuh: one GEMM an expert and matrix over its rows, the first bias with GELU by the dense
// MLP's bias_gelu, the second by add_bias).
//
// Layouts (N tokens, X experts, K choices a token, C channels, P the rank's experts, R rows received):
//   probs [N, X] fp32; choice, gate, dgate [N K] (choice a = t K + j: token t's j-th); order [N K] the choices in the
//   order they are sent (gpt::dispatch_order: by expert), where [N K] each choice's place in that order; a sent or
//   received row [C] fp32, the token's ln_2 output; perm [R] the received row at each place of the experts' order
//   (each expert's rows from sender 0, then sender 1, ...); moe_y [N K, C] each choice's expert output back in place.
#include <cuda_runtime_api.h>

#include "examples/05_gpt_cuda/gpt_kernels.cuh"

namespace gpt_cuda::experts {

using kernels::from_f;
using kernels::to_f;

#define GPT_EXPERTS_FOR(i, n) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

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

/// The rows this rank sends, in `order` (by expert: gpt::dispatch_order): row i is choice order[i]'s token's ln_2
/// output, widened from W.
template <class W>
__global__ void dispatch(float* send, const W* ln2, const int* order, int M, int K, int C) {
  GPT_EXPERTS_FOR(k, (long long)M * C) send[k] = to_f(ln2[(long long)(order[k / C] / K) * C + k % C]);
}

/// out[i, :] = T(in[at[i], :]) for R rows of C: the rows received put in their experts' order (at = perm), every
/// expert's rows together (in T: the compute type for the products' operand, or fp32).
template <class T>
__global__ void gather_rows(T* out, const float* in, const int* at, int R, int C) {
  GPT_EXPERTS_FOR(k, (long long)R * C) out[k] = from_f<T>(in[(long long)at[k / C] * C + k % C]);
}

/// out[at[i], :] = in[i, :] for R rows of C: rows in the experts' order put back in the order they were received
/// (at = perm), and each choice's expert output, come back in the order it was sent, put in its place (at = order).
template <int = 0>
__global__ void scatter_rows(float* out, const float* in, const int* at, int R, int C) {
  GPT_EXPERTS_FOR(k, (long long)R * C) out[(long long)at[k / C] * C + k % C] = in[k];
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
