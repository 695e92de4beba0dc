#pragma once
// A GPT-2-style trainer on the host backend, written the way a user of the library writes one: the layer kernels
// (host loops standing in for the user's CUDA kernels), the activations and the training loop are the trainer's;
// the library gathers each block's parameters just in time, reduces its gradients into shards and steps AdamW on
// the local shards. Shared by main.cc and tests/gpt.
//
// Precision: weights are read in the policy's compute type W (fp32 or bf16) and widened to fp32; activations and
// every accumulation are fp32; each parameter's gradient is summed in fp32 and stored into its W gradient buffer
// once per backward (as a bf16 GEMM with fp32 accumulation does).
//
// Activation checkpointing (config::checkpoint_activations): forward keeps only each block's input; backward,
// while the block is gathered for its own backward, runs the block's forward again from that input and then its
// backward. No parameter is gathered for the recomputation, so the collectives are those of a run without it, and
// the recomputation is the same code on the same inputs, so the losses and the trained parameters are the same
// bits. (Under tensor parallelism the recomputed forward sums its two row-parallel products over the tensor group
// again: the trainer's collectives, not the library's.)
//
// Tensor parallelism (model_options::tensor_parallel = T, gpt_loop.hpp): each tensor rank holds make_spec's slices
// (its H / T heads of q, k and v, its 4C / T rows of the MLP's first product, the matching columns of both
// projections), computes with them, and sums the projections' partial products in forward and the norms' input
// gradients in backward over the group; everything else (norms, embeddings, the head, the loss) every tensor rank
// computes whole, alike.
//
// The root unit (wte, wpe, ln_f, the head tied to wte) is used first and last in forward and first and last in
// backward: as the first unit of the forward pass it stays gathered from its forward to its backward (the library's
// default for the root, model_options::reshard_after_forward). The head's gradients are
// computed before the blocks' backward, kept in fp32 by the trainer and stored, with the embeddings' gradients,
// when the root unit is current in backward (the last unit of the pass).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fsdp/fsdp.hpp>

#include "examples/04_gpt_host/gpt_loop.hpp"

namespace gpt {

namespace kernels {

/// fp32 copy of a parameter in the compute type.
template <class W>
std::vector<float> widen(const fsdp::tensor_view<W>& v) {
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  for (std::size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(v.data()[k]);
  return out;
}
/// Adds an fp32 gradient into a parameter's gradient buffer (zeroed when its unit's backward began), rounding once.
template <class W>
void store(const fsdp::tensor_view<W>& g, const std::vector<float>& v) {
  for (std::size_t k = 0; k < v.size(); ++k) g.data()[k] = W(static_cast<float>(g.data()[k]) + v[k]);
}

/// out[n, O] = inp[n, I] w[O, I]^T (+ b[O]).
inline void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int I, int O) {
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < O; ++o) {
      float acc = b ? b[o] : 0.0f;
      const float* x = inp + static_cast<std::size_t>(n) * I;
      const float* wr = w + static_cast<std::size_t>(o) * I;
      for (int i = 0; i < I; ++i) acc += x[i] * wr[i];
      out[static_cast<std::size_t>(n) * O + o] = acc;
    }
}
/// dinp += dout w; dw += dout^T inp; db += sum over rows of dout (db may be null).
inline void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                            int N, int I, int O) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<std::size_t>(n) * I;
    float* dx = dinp + static_cast<std::size_t>(n) * I;
    for (int o = 0; o < O; ++o) {
      const float d = dout[static_cast<std::size_t>(n) * O + o];
      if (db) db[o] += d;
      float* dwr = dw + static_cast<std::size_t>(o) * I;
      const float* wr = w + static_cast<std::size_t>(o) * I;
      for (int i = 0; i < I; ++i) {
        dwr[i] += d * x[i];
        dx[i] += d * wr[i];
      }
    }
  }
}

inline constexpr float ln_eps = 1e-5f;
inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                              int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    float m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= static_cast<float>(C);
    float v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<float>(C);
    const float r = 1.0f / std::sqrt(v + ln_eps);
    for (int c = 0; c < C; ++c) out[static_cast<std::size_t>(n) * C + c] = (x[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}
/// dinp += ...; dw += ...; db += ...
inline void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    const float* d = dout + static_cast<std::size_t>(n) * C;
    float dmean = 0, dnorm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - mean[n]) * rstd[n], dnorm = w[c] * d[c];
      dmean += dnorm;
      dnorm_mean += dnorm * norm;
    }
    dmean /= static_cast<float>(C);
    dnorm_mean /= static_cast<float>(C);
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - mean[n]) * rstd[n], dnorm = w[c] * d[c];
      db[c] += d[c];
      dw[c] += norm * d[c];
      dinp[static_cast<std::size_t>(n) * C + c] += (dnorm - dmean - norm * dnorm_mean) * rstd[n];
    }
  }
}

/// Causal self-attention of qkv [B, T, 3C] (q, k, v side by side, heads of C / NH channels): out [B, T, C] and the
/// attention weights att [B, NH, T, T]. Token t of a row attends to t2 in [starts[t], t] (its document, with
/// sequence packing; starts may be null: the whole row); the weights are zero elsewhere.
inline void attention_forward(float* out, float* att, const float* qkv, const int* starts, int B, int T, int C,
                              int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + (static_cast<std::size_t>(b) * T + t) * C3 + h * hs;
        float* a = att + ((static_cast<std::size_t>(b) * NH + h) * T + t) * T;
        const int t0 = starts ? starts[static_cast<std::size_t>(b) * T + t] : 0;
        float maxv = -INFINITY;
        for (int t2 = t0; t2 <= t; ++t2) {
          const float* k = qkv + (static_cast<std::size_t>(b) * T + t2) * C3 + C + h * hs;
          float s = 0;
          for (int i = 0; i < hs; ++i) s += q[i] * k[i];
          a[t2] = s * scale;
          maxv = std::max(maxv, a[t2]);
        }
        float sum = 0;
        for (int t2 = t0; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - maxv);
          sum += a[t2];
        }
        for (int t2 = 0; t2 < T; ++t2) a[t2] = t2 >= t0 && t2 <= t ? a[t2] / sum : 0.0f;
        float* o = out + (static_cast<std::size_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int t2 = t0; t2 <= t; ++t2) {
          const float* v = qkv + (static_cast<std::size_t>(b) * T + t2) * C3 + 2 * C + h * hs;
          for (int i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
}
/// dqkv += the gradient of attention_forward's out given dout.
inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, const int* starts,
                               int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  std::vector<float> datt(static_cast<std::size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const std::size_t row = (static_cast<std::size_t>(b) * T + t) * C3 + h * hs;
        const float* a = att + ((static_cast<std::size_t>(b) * NH + h) * T + t) * T;
        const float* d = dout + (static_cast<std::size_t>(b) * T + t) * C + h * hs;
        const int t0 = starts ? starts[static_cast<std::size_t>(b) * T + t] : 0;
        float dot = 0;
        for (int t2 = t0; t2 <= t; ++t2) {
          const std::size_t r2 = (static_cast<std::size_t>(b) * T + t2) * C3 + h * hs;
          float s = 0;
          for (int i = 0; i < hs; ++i) {
            s += d[i] * qkv[r2 + 2 * C + i];
            dqkv[r2 + 2 * C + i] += a[t2] * d[i];  // dv
          }
          datt[static_cast<std::size_t>(t2)] = s;
          dot += a[t2] * s;
        }
        for (int t2 = t0; t2 <= t; ++t2) {
          const std::size_t r2 = (static_cast<std::size_t>(b) * T + t2) * C3 + h * hs;
          const float dpre = a[t2] * (datt[static_cast<std::size_t>(t2)] - dot) * scale;
          for (int i = 0; i < hs; ++i) {
            dqkv[row + i] += dpre * qkv[r2 + C + i];      // dq
            dqkv[r2 + C + i] += dpre * qkv[row + i];      // dk
          }
        }
      }
}

/// GELU, tanh approximation (GPT-2's).
inline constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi)
inline void gelu_forward(float* out, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float t = std::tanh(gelu_k * (x[i] + 0.044715f * x[i] * x[i] * x[i]));
    out[i] = 0.5f * x[i] * (1.0f + t);
  }
}
inline void gelu_backward(float* dx, const float* x, const float* dout, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float t = std::tanh(gelu_k * (x[i] + 0.044715f * x[i] * x[i] * x[i]));
    const float sech2 = 1.0f - t * t;
    dx[i] = (0.5f * (1.0f + t) + 0.5f * x[i] * sech2 * gelu_k * (1.0f + 3.0f * 0.044715f * x[i] * x[i])) * dout[i];
  }
}

/// Cross-entropy of logits [N, V] against targets, summed over the rows the mask keeps (mask may be null: every
/// row) and divided by `denominator`; writes dlogits = (softmax - onehot) * dscale on kept rows, 0 elsewhere.
inline float cross_entropy(float* dlogits, const float* logits, const int* targets, const std::uint8_t* mask, int N,
                           int V, float dscale, double denominator) {
  double loss = 0;
  for (int n = 0; n < N; ++n) {
    const float* l = logits + static_cast<std::size_t>(n) * V;
    float* d = dlogits + static_cast<std::size_t>(n) * V;
    if (mask && !mask[n]) {
      std::fill(d, d + V, 0.0f);
      continue;
    }
    float maxv = -INFINITY;
    for (int v = 0; v < V; ++v) maxv = std::max(maxv, l[v]);
    float sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - maxv);
    const float logsum = std::log(sum) + maxv;
    loss += logsum - l[targets[n]];
    for (int v = 0; v < V; ++v) d[v] = (std::exp(l[v] - logsum) - (v == targets[n] ? 1.0f : 0.0f)) * dscale;
  }
  return static_cast<float>(loss / denominator);
}

}  // namespace kernels

using block_cache = block_cache_of<std::vector<float>>;

/// The forward and backward of the model's pieces on one rank's B sequences, given each unit while it is gathered.
template <class W>
class trainer {
 public:
  using buffer = std::vector<float>;
  using cache = block_cache;
  static std::size_t bytes(const buffer& b) { return b.size() * sizeof(float); }

  /// A trainer of `batch` sequences a step; with a tensor group of degree T > 1 (tp_group_of(model)) it computes
  /// this rank's heads and hidden slice and sums its partial products over the group.
  trainer(const shape& s, int batch, tp_group tp = {}, ep_group ep = {})
      : s_(s), B_(batch), N_(batch * s.context), tp_(std::move(tp)), ep_(std::move(ep)), d_(local(s, tp_.degree)) {
    validate(s, tp_.degree);
    if (s.experts % ep_.degree != 0)
      throw fsdp::usage_error("gpt: " + std::to_string(s.experts) + " experts do not split over expert groups of " +
                              std::to_string(ep_.degree));
  }

  /// This rank's tokens of the step ([B * T] inputs and targets).
  void begin_step(const std::vector<int>& inputs, const std::vector<int>& targets) {
    aux_ = 0;
    inputs_ = inputs;
    targets_ = targets;
    positions_ = row_positions(inputs.size(), s_.context);
    starts_.clear(), mask_.clear();
    denominator_ = static_cast<double>(N_);
  }
  /// This rank's packed rows of the step: each token sees only its document, at its position within it; the loss
  /// is the sum over the masked-in tokens divided by the step's loss tokens (every rank's).
  void begin_packed_step(const packed_tokens& p) {
    check_packed(p, N_);
    inputs_ = p.inputs, targets_ = p.targets, positions_ = p.positions, starts_ = p.starts, mask_ = p.mask;
    denominator_ = loss_denominator(p);
  }

  /// x [N, C] = wte[tokens] + wpe[positions].
  template <class Unit>
  void embed(const Unit& root, std::vector<float>& x) const {
    const int* tokens = inputs_.data();
    const auto wte = root.template param<W>("wte"), wpe = root.template param<W>("wpe");
    const int C = s_.width;
    x.assign(static_cast<std::size_t>(N_) * C, 0.0f);
    for (int n = 0; n < N_; ++n)
      for (int c = 0; c < C; ++c)
        x[static_cast<std::size_t>(n) * C + c] =
            static_cast<float>(wte.data()[static_cast<std::size_t>(tokens[n]) * C + c]) +
            static_cast<float>(wpe.data()[static_cast<std::size_t>(positions_[static_cast<std::size_t>(n)]) * C + c]);
  }

  /// One block's forward: out = block(x); its activations into `k`.
  template <class Unit>
  void block_forward(const Unit& u, int l, const std::vector<float>& x, block_cache& k, std::vector<float>& out) const {
    namespace K = kernels;
    const int C = s_.width, N = N_;
    auto p = [&](const char* leaf) { return K::widen(u.template param<W>(pname(l, leaf))); };
    const auto ln1w = p("ln_1.w"), ln1b = p("ln_1.b"), qkvw = p("attn.qkv.w"), qkvb = p("attn.qkv.b"),
               aprojw = p("attn.proj.w"), aprojb = p("attn.proj.b"), ln2w = p("ln_2.w"), ln2b = p("ln_2.b");
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    // this rank's heads (A channels) and hidden slice (F); the whole model at tensor degree 1
    const int A = d_.attention, F = d_.hidden;
    const std::size_t NA = static_cast<std::size_t>(N) * A, NF = static_cast<std::size_t>(N) * F;
    k.ln1.resize(NC), k.ln1_mean.resize(N), k.ln1_rstd.resize(N), k.qkv.resize(3 * NA);
    k.att.resize(static_cast<std::size_t>(B_) * d_.heads * s_.context * s_.context), k.atty.resize(NA);
    k.res1.resize(NC), k.ln2.resize(NC), k.ln2_mean.resize(N), k.ln2_rstd.resize(N), k.fc.resize(NF);
    k.fc_gelu.resize(NF);
    K::layernorm_forward(k.ln1.data(), k.ln1_mean.data(), k.ln1_rstd.data(), x.data(), ln1w.data(), ln1b.data(), N, C);
    K::matmul_forward(k.qkv.data(), k.ln1.data(), qkvw.data(), qkvb.data(), N, C, 3 * A);
    K::attention_forward(k.atty.data(), k.att.data(), k.qkv.data(), starts(), B_, s_.context, A, d_.heads);
    // row-parallel: each tensor rank's partial product, the bias added once (by tensor rank 0), summed over the group
    K::matmul_forward(k.res1.data(), k.atty.data(), aprojw.data(), row_bias(aprojb), N, A, C);
    tp_.all_reduce(k.res1.data(), NC);
    for (std::size_t i = 0; i < NC; ++i) k.res1[i] += x[i];
    K::layernorm_forward(k.ln2.data(), k.ln2_mean.data(), k.ln2_rstd.data(), k.res1.data(), ln2w.data(), ln2b.data(),
                         N, C);
    if (s_.experts > 0) {  // the router here; the experts' output is added by experts_forward
      route(p("mlp.router.w"), k);
      out = k.res1;
      return;
    }
    const auto fcw = p("mlp.fc.w"), fcb = p("mlp.fc.b"), mprojw = p("mlp.proj.w"), mprojb = p("mlp.proj.b");
    K::matmul_forward(k.fc.data(), k.ln2.data(), fcw.data(), fcb.data(), N, C, F);
    K::gelu_forward(k.fc_gelu.data(), k.fc.data(), NF);
    out.resize(NC);
    K::matmul_forward(out.data(), k.fc_gelu.data(), mprojw.data(), row_bias(mprojb), N, F, C);
    tp_.all_reduce(out.data(), NC);
    for (std::size_t i = 0; i < NC; ++i) out[i] += k.res1[i];
  }

  /// One block's backward from its input x, cache k and dout: dx, and the block's gradients stored into u.
  template <class Unit>
  void block_backward(const Unit& u, int l, const std::vector<float>& x, const block_cache& k,
                      const std::vector<float>& dout, std::vector<float>& dx) const {
    namespace K = kernels;
    const int C = s_.width, N = N_;
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    auto p = [&](const char* leaf) { return K::widen(u.template param<W>(pname(l, leaf))); };
    auto zeros = [](std::size_t n) { return std::vector<float>(n, 0.0f); };
    const int A = d_.attention, F = d_.hidden;
    const std::size_t CA = static_cast<std::size_t>(C) * A, CF = static_cast<std::size_t>(C) * F,
                      NA = static_cast<std::size_t>(N) * A, NF = static_cast<std::size_t>(N) * F;
    std::vector<float> g_ln1w = zeros(C), g_ln1b = zeros(C), g_qkvw = zeros(3 * CA), g_qkvb = zeros(3 * A),
                       g_aprojw = zeros(CA), g_aprojb = zeros(C), g_ln2w = zeros(C), g_ln2b = zeros(C),
                       g_fcw = zeros(CF), g_fcb = zeros(F), g_mprojw = zeros(CF), g_mprojb = zeros(C);
    std::vector<float> dres1 = dout, dfc_gelu = zeros(NF), dfc = zeros(NF), dln2 = zeros(NC);
    std::vector<float> g_router;
    if (s_.experts > 0) {  // the experts' input gradient (experts_backward), and the router's
      dln2 = k.moe_dln2;
      g_router = zeros(static_cast<std::size_t>(s_.experts) * C);
      route_backward(p("mlp.router.w"), k, dln2, g_router);
    } else {
      K::matmul_backward(dfc_gelu.data(), g_mprojw.data(), g_mprojb.data(), dout.data(), k.fc_gelu.data(),
                         p("mlp.proj.w").data(), N, F, C);
      K::gelu_backward(dfc.data(), k.fc.data(), dfc_gelu.data(), NF);
      K::matmul_backward(dln2.data(), g_fcw.data(), g_fcb.data(), dfc.data(), k.ln2.data(), p("mlp.fc.w").data(), N, C,
                         F);
      tp_.all_reduce(dln2.data(), NC);  // column-parallel: the input gradient's partial sums
    }
    K::layernorm_backward(dres1.data(), g_ln2w.data(), g_ln2b.data(), dln2.data(), k.res1.data(), p("ln_2.w").data(),
                          k.ln2_mean.data(), k.ln2_rstd.data(), N, C);
    dx = dres1;
    std::vector<float> datty = zeros(NA), dqkv = zeros(3 * NA), dln1 = zeros(NC);
    K::matmul_backward(datty.data(), g_aprojw.data(), g_aprojb.data(), dres1.data(), k.atty.data(),
                       p("attn.proj.w").data(), N, A, C);
    K::attention_backward(dqkv.data(), datty.data(), k.qkv.data(), k.att.data(), starts(), B_, s_.context, A, d_.heads);
    K::matmul_backward(dln1.data(), g_qkvw.data(), g_qkvb.data(), dqkv.data(), k.ln1.data(), p("attn.qkv.w").data(), N,
                       C, 3 * A);
    tp_.all_reduce(dln1.data(), NC);
    K::layernorm_backward(dx.data(), g_ln1w.data(), g_ln1b.data(), dln1.data(), x.data(), p("ln_1.w").data(),
                          k.ln1_mean.data(), k.ln1_rstd.data(), N, C);
    auto g = [&](const char* leaf, const std::vector<float>& v) { K::store(u.template grad<W>(pname(l, leaf)), v); };
    g("ln_1.w", g_ln1w), g("ln_1.b", g_ln1b), g("attn.qkv.w", g_qkvw), g("attn.qkv.b", g_qkvb);
    g("attn.proj.w", g_aprojw), g("attn.proj.b", g_aprojb), g("ln_2.w", g_ln2w), g("ln_2.b", g_ln2b);
    if (s_.experts > 0) {
      g("mlp.router.w", g_router);
      return;
    }
    g("mlp.fc.w", g_fcw), g("mlp.fc.b", g_fcb), g("mlp.proj.w", g_mprojw), g("mlp.proj.b", g_mprojb);
  }

  // ---- a mixture of experts (shape::experts > 0) -----------------------------------------------------------------
  static constexpr bool supports_experts = true;

  /// Block l's experts' forward: each of the block's token choices (route) sent with its ln_2 output to the rank of
  /// its expert, the experts' MLPs run there, their outputs sent back; out += each choice's gate x its output.
  template <class Unit>
  void experts_forward(const Unit& u, int l, block_cache& k, std::vector<float>& out) const {
    namespace K = kernels;
    const int C = s_.width, N = N_, KK = s_.top_k, H = 4 * C, per = s_.experts / ep_.degree;
    auto p = [&](const char* leaf) { return K::widen(u.template param<W>(pname(l, leaf))); };
    const auto fcw = p("moe.fc.w"), fcb = p("moe.fc.b"), projw = p("moe.proj.w"), projb = p("moe.proj.b");
    // the choices by destination rank, each row its token's ln_2 output and its expert there
    dispatch_order(k.moe_choice, per, ep_.degree, k.moe_order, k.moe_sent_experts, k.moe_sent);
    k.moe_received = k.moe_sent;
    if (ep_.degree > 1) ep_.counts(k.moe_sent.data(), k.moe_received.data(), 1);
    std::vector<float> send;
    send.reserve(k.moe_order.size() * static_cast<std::size_t>(C + 1));
    for (int a : k.moe_order) {
      const float* x = k.ln2.data() + static_cast<std::size_t>(a / KK) * C;
      send.insert(send.end(), x, x + C);
      send.push_back(static_cast<float>(k.moe_choice[static_cast<std::size_t>(a)] % per));
    }
    exchange(send, k.moe_sent, k.moe_in, k.moe_received, C + 1);
    const std::size_t R = k.moe_in.size() / static_cast<std::size_t>(C + 1);
    k.moe_h.assign(R * H, 0.0f);
    std::vector<float> y(R * C), act(H);
    for (std::size_t r = 0; r < R; ++r) {
      const float* x = k.moe_in.data() + r * (C + 1);
      const auto e = static_cast<std::size_t>(x[C]);
      float* h = k.moe_h.data() + r * H;
      K::matmul_forward(h, x, fcw.data() + e * H * C, fcb.data() + e * H, 1, C, H);
      K::gelu_forward(act.data(), h, static_cast<std::size_t>(H));
      K::matmul_forward(y.data() + r * C, act.data(), projw.data() + e * C * H, projb.data() + e * C, 1, H, C);
    }
    std::vector<float> back;
    exchange(y, k.moe_received, back, k.moe_sent, C);
    k.moe_y.assign(static_cast<std::size_t>(N) * KK * C, 0.0f);
    for (std::size_t i = 0; i < k.moe_order.size(); ++i)
      std::copy_n(back.begin() + static_cast<std::ptrdiff_t>(i * C), C,
                  k.moe_y.begin() + static_cast<std::ptrdiff_t>(k.moe_order[i]) * C);
    for (int a = 0; a < N * KK; ++a)
      for (int c = 0; c < C; ++c)
        out[static_cast<std::size_t>(a / KK) * C + c] +=
            k.moe_gate[static_cast<std::size_t>(a)] * k.moe_y[static_cast<std::size_t>(a) * C + c];
  }

  /// Block l's experts' backward from the block output's gradient: each choice's output gradient (its gate x dout)
  /// sent to its expert, the experts' gradients stored into u, their input gradients sent back and summed per token
  /// into k.moe_dln2; each choice's gate gradient into k.moe_dgate (for the router: block_backward).
  template <class Unit>
  void experts_backward(const Unit& u, int l, block_cache& k, const std::vector<float>& dout) const {
    namespace K = kernels;
    const int C = s_.width, N = N_, KK = s_.top_k, H = 4 * C, per = s_.experts / ep_.degree;
    auto p = [&](const char* leaf) { return K::widen(u.template param<W>(pname(l, leaf))); };
    const auto fcw = p("moe.fc.w"), projw = p("moe.proj.w");
    k.moe_dgate.assign(static_cast<std::size_t>(N) * KK, 0.0f);
    std::vector<float> send;
    send.reserve(k.moe_order.size() * static_cast<std::size_t>(C));
    for (int a : k.moe_order) {
      const float* d = dout.data() + static_cast<std::size_t>(a / KK) * C;
      const float* y = k.moe_y.data() + static_cast<std::size_t>(a) * C;
      float dg = 0;
      for (int c = 0; c < C; ++c) {
        dg += d[c] * y[c];
        send.push_back(k.moe_gate[static_cast<std::size_t>(a)] * d[c]);
      }
      k.moe_dgate[static_cast<std::size_t>(a)] = dg;
    }
    std::vector<float> dy;
    exchange(send, k.moe_sent, dy, k.moe_received, C);
    const std::size_t R = dy.size() / static_cast<std::size_t>(C), P = static_cast<std::size_t>(per);
    std::vector<float> g_fcw(P * H * C, 0.0f), g_fcb(P * H, 0.0f), g_projw(P * C * H, 0.0f), g_projb(P * C, 0.0f);
    std::vector<float> dz(R * C, 0.0f), act(H), dact(H), dh(H);
    for (std::size_t r = 0; r < R; ++r) {
      const float* x = k.moe_in.data() + r * (C + 1);
      const auto e = static_cast<std::size_t>(x[C]);
      const float* h = k.moe_h.data() + r * H;
      K::gelu_forward(act.data(), h, static_cast<std::size_t>(H));
      std::fill(dact.begin(), dact.end(), 0.0f);
      K::matmul_backward(dact.data(), g_projw.data() + e * C * H, g_projb.data() + e * C, dy.data() + r * C, act.data(),
                         projw.data() + e * C * H, 1, H, C);
      K::gelu_backward(dh.data(), h, dact.data(), static_cast<std::size_t>(H));
      K::matmul_backward(dz.data() + r * C, g_fcw.data() + e * H * C, g_fcb.data() + e * H, dh.data(), x,
                         fcw.data() + e * H * C, 1, C, H);
    }
    std::vector<float> back;
    exchange(dz, k.moe_received, back, k.moe_sent, C);
    k.moe_dln2.assign(static_cast<std::size_t>(N) * C, 0.0f);
    for (std::size_t i = 0; i < k.moe_order.size(); ++i)
      for (int c = 0; c < C; ++c)
        k.moe_dln2[static_cast<std::size_t>(k.moe_order[i] / KK) * C + c] += back[i * C + static_cast<std::size_t>(c)];
    auto g = [&](const char* leaf, const std::vector<float>& v) { K::store(u.template grad<W>(pname(l, leaf)), v); };
    g("moe.fc.w", g_fcw), g("moe.fc.b", g_fcb), g("moe.proj.w", g_projw), g("moe.proj.b", g_projb);
  }

  /// The head: final norm, logits through the tied wte, mean cross-entropy over this rank's tokens (kept for
  /// global_loss); leaves d(x_L) in dx and the head's gradients (wte, ln_f) in the trainer's fp32 buffers.
  template <class Unit>
  void head(const Unit& root, const std::vector<float>& x, std::vector<float>& dx) {
    const int* targets = targets_.data();
    namespace K = kernels;
    const int C = s_.width, V = s_.vocab, N = N_;
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    const auto wte = K::widen(root.template param<W>("wte")), lnfw = K::widen(root.template param<W>("ln_f.w")),
               lnfb = K::widen(root.template param<W>("ln_f.b"));
    lnf_.resize(NC), lnf_mean_.resize(N), lnf_rstd_.resize(N);
    logits_.resize(static_cast<std::size_t>(N) * V), dlogits_.resize(logits_.size());
    K::layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x.data(), lnfw.data(), lnfb.data(), N, C);
    K::matmul_forward(logits_.data(), lnf_.data(), wte.data(), nullptr, N, C, V);
    loss_ = K::cross_entropy(dlogits_.data(), logits_.data(), targets, mask_.empty() ? nullptr : mask_.data(), N, V,
                             1.0f / static_cast<float>(denominator_), denominator_) +
            aux_;  // the experts' load-balancing losses (0 without experts)
    g_wte_.assign(static_cast<std::size_t>(V) * C, 0.0f), g_lnfw_.assign(C, 0.0f), g_lnfb_.assign(C, 0.0f);
    std::vector<float> dlnf(NC, 0.0f);
    K::matmul_backward(dlnf.data(), g_wte_.data(), nullptr, dlogits_.data(), lnf_.data(), wte.data(), N, C, V);
    dx.assign(NC, 0.0f);
    K::layernorm_backward(dx.data(), g_lnfw_.data(), g_lnfb_.data(), dlnf.data(), x.data(), lnfw.data(),
                          lnf_mean_.data(), lnf_rstd_.data(), N, C);
  }

  /// The root unit's backward (the last unit of the pass): the embeddings' gradients from dx0, added to the head's.
  template <class Unit>
  void root_backward(const Unit& root, const std::vector<float>& dx0) {
    const int* tokens = inputs_.data();
    const int C = s_.width, T = s_.context, N = N_;
    std::vector<float> g_wpe(static_cast<std::size_t>(T) * C, 0.0f);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        const float d = dx0[static_cast<std::size_t>(n) * C + c];
        g_wte_[static_cast<std::size_t>(tokens[n]) * C + c] += d;
        g_wpe[static_cast<std::size_t>(positions_[static_cast<std::size_t>(n)]) * C + c] += d;
      }
    kernels::store(root.template grad<W>("wte"), g_wte_);
    kernels::store(root.template grad<W>("wpe"), g_wpe);
    kernels::store(root.template grad<W>("ln_f.w"), g_lnfw_);
    kernels::store(root.template grad<W>("ln_f.b"), g_lnfb_);
  }

  /// This rank's mean loss of the last head() (packed: its share of the step's mean).
  float local_loss() const { return loss_; }
  /// The logits [N, V] of the last head().
  const std::vector<float>& logits() const { return logits_; }
  /// The mean loss over every rank's tokens: the ranks' means averaged (their batches are equal), or with packing
  /// the ranks' shares summed.
  template <class ModelT>
  float global_loss(ModelT& model) {
    float loss = loss_contribution(loss_, !mask_.empty(), tp_);
    model.comm().all_reduce(&loss, &loss, 1, fsdp::dtype::f32, loss_reduction(!mask_.empty()),
                            model.backend().compute_stream());
    return loss;
  }

  /// Bytes of the head's activations (normed input, logits and their gradient).
  std::size_t head_bytes() const {
    return (lnf_.size() + lnf_mean_.size() + lnf_rstd_.size() + logits_.size() + dlogits_.size()) * sizeof(float);
  }

 private:
  shape s_;
  int B_, N_;
  tp_group tp_;
  ep_group ep_;
  mutable float aux_ = 0;  // this step's load-balancing losses, summed over the blocks (route)
  local_dims d_;
  float loss_ = 0;
  const int* starts() const { return starts_.empty() ? nullptr : starts_.data(); }

  /// The trainer's dispatch or combine of `width` floats a row: sent[q] rows to rank q of the expert group, received[q]
  /// from it (at degree 1, to itself).
  void exchange(const std::vector<float>& send, const std::vector<std::int64_t>& sent, std::vector<float>& recv,
                const std::vector<std::int64_t>& received, int width) const {
    std::vector<std::int64_t> sc, rc;
    std::int64_t n = 0;
    for (std::size_t q = 0; q < sent.size(); ++q) {
      sc.push_back(sent[q] * width);
      rc.push_back(received[q] * width);
      n += rc.back();
    }
    if (ep_.degree == 1) {
      recv = send;
      return;
    }
    recv.assign(static_cast<std::size_t>(n), 0.0f);
    ep_.exchange(send.data(), sc, recv.data(), rc);
  }

  /// The router of a block of experts: softmax probabilities of ln_2's output times `rw` [X, C], each token's top_k
  /// experts (the most probable; the lower index on a tie) with their probabilities renormalised over the chosen as
  /// gates; the load-balancing loss added to aux_.
  void route(const std::vector<float>& rw, block_cache& k) const {
    const int C = s_.width, N = N_, X = s_.experts, KK = s_.top_k;
    k.moe_probs.assign(static_cast<std::size_t>(N) * X, 0.0f);
    kernels::matmul_forward(k.moe_probs.data(), k.ln2.data(), rw.data(), nullptr, N, C, X);
    k.moe_choice.assign(static_cast<std::size_t>(N) * KK, 0);
    k.moe_gate.assign(static_cast<std::size_t>(N) * KK, 0.0f);
    std::vector<int> idx(static_cast<std::size_t>(X));
    for (int t = 0; t < N; ++t) {
      float* pr = k.moe_probs.data() + static_cast<std::size_t>(t) * X;
      const float top = *std::max_element(pr, pr + X);
      float sum = 0;
      for (int e = 0; e < X; ++e) sum += pr[e] = std::exp(pr[e] - top);
      for (int e = 0; e < X; ++e) pr[e] /= sum;
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return pr[a] > pr[b]; });
      float chosen = 0;
      for (int j = 0; j < KK; ++j) chosen += pr[idx[static_cast<std::size_t>(j)]];
      for (int j = 0; j < KK; ++j) {
        const int e = idx[static_cast<std::size_t>(j)];
        k.moe_choice[static_cast<std::size_t>(t * KK + j)] = e;
        k.moe_gate[static_cast<std::size_t>(t * KK + j)] = pr[e] / chosen;
      }
    }
    aux_ += load_balance_loss(k.moe_probs.data(), k.moe_choice, N, X, KK, s_.aux_weight);
  }

  /// The router's backward: the gates' gradients (k.moe_dgate) through their renormalisation, and the load-balancing
  /// loss's (each probability's aux_weight X f_e / N), through the softmax; the router's gradient into g_router and
  /// ln_2's output gradient added into dln2.
  void route_backward(const std::vector<float>& rw, const block_cache& k, std::vector<float>& dln2,
                      std::vector<float>& g_router) const {
    const int C = s_.width, N = N_, X = s_.experts, KK = s_.top_k;
    std::vector<float> dlogits(static_cast<std::size_t>(N) * X, 0.0f);
    const std::vector<float> daux = load_balance_gradient(k.moe_choice, N, X, KK, s_.aux_weight);
    std::vector<float> dp(static_cast<std::size_t>(X));
    for (int t = 0; t < N; ++t) {
      const float* pr = k.moe_probs.data() + static_cast<std::size_t>(t) * X;
      dp = daux;
      float chosen = 0, dot = 0;
      for (int j = 0; j < KK; ++j) {
        const std::size_t a = static_cast<std::size_t>(t * KK + j);
        chosen += pr[k.moe_choice[a]];
        dot += k.moe_dgate[a] * k.moe_gate[a];
      }
      for (int j = 0; j < KK; ++j) {
        const std::size_t a = static_cast<std::size_t>(t * KK + j);
        dp[static_cast<std::size_t>(k.moe_choice[a])] += (k.moe_dgate[a] - dot) / chosen;
      }
      float s = 0;
      for (int e = 0; e < X; ++e) s += pr[e] * dp[static_cast<std::size_t>(e)];
      for (int e = 0; e < X; ++e)
        dlogits[static_cast<std::size_t>(t) * X + e] = pr[e] * (dp[static_cast<std::size_t>(e)] - s);
    }
    kernels::matmul_backward(dln2.data(), g_router.data(), nullptr, dlogits.data(), k.ln2.data(), rw.data(), N, C, X);
  }
  /// A row-parallel product's bias: added by tensor rank 0 only, before the sum over the group.
  const float* row_bias(const std::vector<float>& b) const { return tp_.rank == 0 ? b.data() : nullptr; }

  double denominator_ = 1;  // of the loss: this rank's tokens, or the step's loss tokens when packed
  std::vector<int> inputs_, targets_, positions_, starts_;
  std::vector<std::uint8_t> mask_;
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_, logits_, dlogits_, g_wte_, g_lnfw_, g_lnfb_;
};

/// The host trainer for a model of compute type W.
struct make_host_trainer {
  template <class ModelT>
  trainer<typename ModelT::compute_type> operator()(ModelT& model, const shape& s, int batch) const {
    return trainer<typename ModelT::compute_type>(s, batch, tp_group_of(model), ep_group_of(model));
  }
};

/// Trains on thread ranks' host backends: gpt::train with the host trainer.
template <class Policy, class Before>
result train(typename Policy::communicator& comm, const config& c, Before&& before) {
  return train<Policy>(comm, c, make_host_trainer{}, before);
}
template <class Policy>
result train(typename Policy::communicator& comm, const config& c) {
  return train<Policy>(comm, c, make_host_trainer{}, [](auto&) {});
}

/// The GPT examples' --strategy and --precision flags as types: fn(s, p) with fsdp::named<Sharding> and
/// fsdp::named<Precision> (typename decltype(s)::type), or a usage_error naming the flag and the names known.
/// `extra`: more precisions by name (the host example adds "fp8", precision::scaled), beside bf16 and fp32;
/// `MoreStrategies`: more strategies, named as they name themselves, beside full_shard, shard_grad_op and no_shard
/// (the host example adds hybrid_shard<2>; each one is compiled with every precision).
template <class... MoreStrategies, class F, class... Extra>
decltype(auto) with_policy_flags(std::string_view strategy, std::string_view precision, F&& fn, Extra... extra) {
  namespace sh = fsdp::sharding;
  return fsdp::select(
      "--precision", precision,
      [&](auto p) {
        return fsdp::select(
            "--strategy", strategy, [&](auto s) { return fn(s, p); },
            fsdp::by_name<sh::full_shard, sh::shard_grad_op, sh::no_shard, MoreStrategies...>());
      },
      fsdp::named<fsdp::precision::mixed<fsdp::bfloat16>>{"bf16"}, fsdp::named<fsdp::precision::full>{"fp32"},
      extra...);
}

}  // namespace gpt
