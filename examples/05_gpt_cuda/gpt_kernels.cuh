#pragma once
// The CUDA GPT trainer's own kernels: embeddings, layernorm, causal attention, GELU, cross-entropy, bias and
// residual adds, and the casts between the compute type W (float or fsdp::bfloat16) and fp32. Every reduction is a
// loop in a fixed order (one thread per output, no atomics), in the order the host trainer's loops sum: a step's
// bits do not depend on scheduling, so activation checkpointing changes none, and only the GEMMs (cuBLAS or the
// plain GEMM) sum in another order than the host. Written for clarity, not speed: attention is one thread per
// query row, fine for the example's contexts, not a flash-attention.
#include <cuda_runtime_api.h>

namespace gpt_cuda::kernels {

// Casts through the library's element types (fsdp::bfloat16's conversions are FSDP_HD bit operations): the same
// bits as the host trainer's casts, and no bf16 conversion instruction (which the simulated GPU lacks).
template <class W>
__device__ inline float to_f(W x) {
  return static_cast<float>(x);
}
template <class W>
__device__ inline W from_f(float x) {
  return W(x);
}
/// tanh from expf (the simulated GPU's PTX parser has no copysign, which tanhf uses): 1 - 2 / (e^2x + 1), exact
/// at the limits (e^2x = inf gives 1, 0 gives -1), within a few ulps of 1 elsewhere in absolute terms.
__device__ inline float tanh_exp(float x) { return __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(expf(__fmul_rn(2.0f, x)), 1.0f))); }

#define GPT_FOR(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

/// dst = float(src)
template <class W>
__global__ void widen(float* dst, const W* src, long long n) {
  GPT_FOR(k, n) dst[k] = to_f(src[k]);
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
/// g_wte[tok[n], c] += dx[n, c] over n in order (one thread per channel); g_wpe[t, c] = sum over n with pos[n] == t.
template <int = 0>
__global__ void embed_backward(float* g_wte, float* g_wpe, const float* dx, const int* tok, const int* pos, int N,
                               int C) {
  GPT_FOR(c, C) {
    for (int n = 0; n < N; ++n) {
      const float d = dx[(long long)n * C + c];
      g_wte[(long long)tok[n] * C + c] = __fadd_rn(g_wte[(long long)tok[n] * C + c], d);
      g_wpe[(long long)pos[n] * C + c] = __fadd_rn(g_wpe[(long long)pos[n] * C + c], d);
    }
  }
}
/// y[n, o] += b[o]
template <int = 0>
__global__ void add_bias(float* y, const float* b, int N, int O) {
  GPT_FOR(e, (long long)N * O) y[e] = __fadd_rn(y[e], b[e % O]);
}
/// db[o] += sum over rows of dy, in row order
template <int = 0>
__global__ void bias_grad(float* db, const float* dy, int N, int O) {
  GPT_FOR(o, O) {
    float acc = db[o];
    for (int n = 0; n < N; ++n) acc = __fadd_rn(acc, dy[(long long)n * O + o]);
    db[o] = acc;
  }
}
/// y += x
template <int = 0>
__global__ void add(float* y, const float* x, long long n) {
  GPT_FOR(k, n) y[k] = __fadd_rn(y[k], x[k]);
}

constexpr float ln_eps = 1e-5f;
template <int = 0>
__global__ void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                  const float* b, int N, int C) {
  GPT_FOR(n, N) {
    const float* x = inp + n * C;
    float m = 0;
    for (int c = 0; c < C; ++c) m = __fadd_rn(m, x[c]);
    m = __fdiv_rn(m, float(C));
    float v = 0;
    for (int c = 0; c < C; ++c) v = __fadd_rn(v, __fmul_rn(__fsub_rn(x[c], m), __fsub_rn(x[c], m)));
    v = __fdiv_rn(v, float(C));
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(v, ln_eps)));
    for (int c = 0; c < C; ++c)
      out[n * C + c] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[c], m), r), w[c]), b[c]);
    mean[n] = m;
    rstd[n] = r;
  }
}
/// dinp += ... (one thread per row)
template <int = 0>
__global__ void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                                         const float* mean, const float* rstd, int N, int C) {
  GPT_FOR(n, N) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    float dmean = 0, dnorm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const float norm = __fmul_rn(__fsub_rn(x[c], mean[n]), rstd[n]), dnorm = __fmul_rn(w[c], d[c]);
      dmean = __fadd_rn(dmean, dnorm);
      dnorm_mean = __fadd_rn(dnorm_mean, __fmul_rn(dnorm, norm));
    }
    dmean = __fdiv_rn(dmean, float(C));
    dnorm_mean = __fdiv_rn(dnorm_mean, float(C));
    for (int c = 0; c < C; ++c) {
      const float norm = __fmul_rn(__fsub_rn(x[c], mean[n]), rstd[n]), dnorm = __fmul_rn(w[c], d[c]);
      const float g = __fmul_rn(__fsub_rn(__fsub_rn(dnorm, dmean), __fmul_rn(norm, dnorm_mean)), rstd[n]);
      dinp[n * C + c] = __fadd_rn(dinp[n * C + c], g);
    }
  }
}
/// dw += sum over rows of norm * dout, db += sum of dout (one thread per channel, rows in order)
template <int = 0>
__global__ void layernorm_backward_params(float* dw, float* db, const float* dout, const float* inp,
                                          const float* mean, const float* rstd, int N, int C) {
  GPT_FOR(c, C) {
    float gw = dw[c], gb = db[c];
    for (int n = 0; n < N; ++n) {
      const float d = dout[(long long)n * C + c];
      const float norm = __fmul_rn(__fsub_rn(inp[(long long)n * C + c], mean[n]), rstd[n]);
      gb = __fadd_rn(gb, d);
      gw = __fadd_rn(gw, __fmul_rn(norm, d));
    }
    dw[c] = gw;
    db[c] = gb;
  }
}

/// One thread per (b, h, t) query row: att[b, h, t, :] and out[b, t, h-th head]. Query t attends to keys
/// [starts[b, t], t] (its document, with sequence packing; starts may be null: the whole row).
template <int = 0>
__global__ void attention_forward(float* out, float* att, const float* qkv, const int* starts, int B, int T, int C,
                                  int NH) {
  const int hs = C / NH;
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(float(hs)));
  const long long C3 = 3LL * C;
  GPT_FOR(e, (long long)B * NH * T) {
    const int t = int(e % T), h = int(e / T % NH), b = int(e / T / NH);
    const float* q = qkv + ((long long)b * T + t) * C3 + h * hs;
    float* a = att + e * T;
    const int t0 = starts ? starts[(long long)b * T + t] : 0;
    float maxv = -INFINITY;
    for (int t2 = t0; t2 <= t; ++t2) {
      const float* k = qkv + ((long long)b * T + t2) * C3 + C + h * hs;
      float s = 0;
      for (int i = 0; i < hs; ++i) s = __fadd_rn(s, __fmul_rn(q[i], k[i]));
      a[t2] = __fmul_rn(s, scale);
      maxv = fmaxf(maxv, a[t2]);
    }
    float sum = 0;
    for (int t2 = t0; t2 <= t; ++t2) {
      a[t2] = expf(__fsub_rn(a[t2], maxv));
      sum = __fadd_rn(sum, a[t2]);
    }
    for (int t2 = 0; t2 < T; ++t2) a[t2] = t2 >= t0 && t2 <= t ? __fdiv_rn(a[t2], sum) : 0.0f;
    float* o = out + ((long long)b * T + t) * C + h * hs;
    for (int i = 0; i < hs; ++i) {
      float acc = 0;
      for (int t2 = t0; t2 <= t; ++t2)
        acc = __fadd_rn(acc, __fmul_rn(a[t2], qkv[((long long)b * T + t2) * C3 + 2 * C + h * hs + i]));
      o[i] = acc;
    }
  }
}
/// First half of the attention backward, one thread per query row (b, h, t): dpre[b, h, t, :] (the gradient of the
/// scaled scores, times the scale) and dq.
template <int = 0>
__global__ void attention_backward_query(float* dqkv, float* dpre, const float* dout, const float* qkv,
                                         const float* att, const int* starts, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(float(hs)));
  const long long C3 = 3LL * C;
  GPT_FOR(e, (long long)B * NH * T) {
    const int t = int(e % T), h = int(e / T % NH), b = int(e / T / NH);
    const float* a = att + e * T;
    float* dp = dpre + e * T;
    const float* d = dout + ((long long)b * T + t) * C + h * hs;
    const int t0 = starts ? starts[(long long)b * T + t] : 0;
    float dot = 0;
    for (int t2 = t0; t2 <= t; ++t2) {
      const float* v = qkv + ((long long)b * T + t2) * C3 + 2 * C + h * hs;
      float s = 0;
      for (int i = 0; i < hs; ++i) s = __fadd_rn(s, __fmul_rn(d[i], v[i]));
      dp[t2] = s;  // datt, for now
      dot = __fadd_rn(dot, __fmul_rn(a[t2], s));
    }
    for (int t2 = t0; t2 <= t; ++t2) dp[t2] = __fmul_rn(__fmul_rn(a[t2], __fsub_rn(dp[t2], dot)), scale);
    float* dq = dqkv + ((long long)b * T + t) * C3 + h * hs;
    for (int i = 0; i < hs; ++i) {
      float acc = dq[i];
      for (int t2 = t0; t2 <= t; ++t2)
        acc = __fadd_rn(acc, __fmul_rn(dp[t2], qkv[((long long)b * T + t2) * C3 + C + h * hs + i]));
      dq[i] = acc;
    }
  }
}
/// Second half, one thread per key row (b, h, t2): dk and dv summed over the queries t >= t2 that attend to it
/// (starts[b, t] <= t2), in order.
template <int = 0>
__global__ void attention_backward_key(float* dqkv, const float* dpre, const float* dout, const float* qkv,
                                       const float* att, const int* starts, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const long long C3 = 3LL * C;
  GPT_FOR(e, (long long)B * NH * T) {
    const int t2 = int(e % T), h = int(e / T % NH), b = int(e / T / NH);
    float* dk = dqkv + ((long long)b * T + t2) * C3 + C + h * hs;
    float* dv = dk + C;
    for (int i = 0; i < hs; ++i) {
      float gk = dk[i], gv = dv[i];
      for (int t = t2; t < T; ++t) {
        if (starts && starts[(long long)b * T + t] > t2) continue;  // another document's query
        const long long row = ((long long)b * NH + h) * T + t;
        gk = __fadd_rn(gk, __fmul_rn(dpre[row * T + t2], qkv[((long long)b * T + t) * C3 + h * hs + i]));
        gv = __fadd_rn(gv, __fmul_rn(att[row * T + t2], dout[((long long)b * T + t) * C + h * hs + i]));
      }
      dk[i] = gk;
      dv[i] = gv;
    }
  }
}

constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi)
template <int = 0>
__global__ void gelu_forward(float* out, const float* x, long long n) {
  GPT_FOR(i, n) {
    const float x3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x[i]), x[i]), x[i]);
    const float t = tanh_exp(__fmul_rn(gelu_k, __fadd_rn(x[i], x3)));
    out[i] = __fmul_rn(__fmul_rn(0.5f, x[i]), __fadd_rn(1.0f, t));
  }
}
template <int = 0>
__global__ void gelu_backward(float* dx, const float* x, const float* dout, long long n) {
  GPT_FOR(i, n) {
    const float x3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x[i]), x[i]), x[i]);
    const float t = tanh_exp(__fmul_rn(gelu_k, __fadd_rn(x[i], x3)));
    const float sech2 = __fsub_rn(1.0f, __fmul_rn(t, t));
    const float inner = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(0.5f, x[i]), sech2), gelu_k),
                                  __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * 0.044715f, x[i]), x[i])));
    dx[i] = __fmul_rn(__fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, t)), inner), dout[i]);
  }
}

/// One thread per row: row_loss[n] = logsumexp - logit of the target; dlogits = (softmax - onehot) * dscale. Rows
/// the mask leaves out (mask may be null: none) get a loss and a gradient of 0.
template <int = 0>
__global__ void cross_entropy(float* dlogits, float* row_loss, const float* logits, const int* targets,
                              const int* mask, int N, int V, float dscale) {
  GPT_FOR(n, N) {
    const float* l = logits + (long long)n * V;
    float* d = dlogits + (long long)n * V;
    if (mask && !mask[n]) {
      row_loss[n] = 0.0f;
      for (int v = 0; v < V; ++v) d[v] = 0.0f;
      continue;
    }
    float maxv = -INFINITY;
    for (int v = 0; v < V; ++v) maxv = fmaxf(maxv, l[v]);
    float sum = 0;
    for (int v = 0; v < V; ++v) sum = __fadd_rn(sum, expf(__fsub_rn(l[v], maxv)));
    const float logsum = __fadd_rn(logf(sum), maxv);
    row_loss[n] = __fsub_rn(logsum, l[targets[n]]);
    for (int v = 0; v < V; ++v)
      d[v] = __fmul_rn(__fsub_rn(expf(__fsub_rn(l[v], logsum)), v == targets[n] ? 1.0f : 0.0f), dscale);
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

}  // namespace gpt_cuda::kernels
