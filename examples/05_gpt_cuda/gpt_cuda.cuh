#pragma once
// The GPT example's trainer on the CUDA backend: the user's own kernels (gpt_kernels.cuh) for embeddings,
// layernorm, attention, GELU and cross-entropy, cuBLAS (or the examples' plain GEMM, for the simulated GPU) for the
// matrix products, and the training loop of examples/04_gpt_host/gpt_loop.hpp, the same code the host trainer
// runs. The matrix products run in the compute type: in bf16, on the gathered bf16 weights and bf16 activations,
// accumulated in fp32 (PyTorch's bf16 autocast); in fp32, fp32 throughout. The activations that only products read
// (each layernorm's output, attention's output, GELU's) are written in bf16 by the kernels that make them and kept
// so, and so are the QKV product and the MLP's first (written by cuBLAS in bf16, their biases added in bf16, as
// autocast keeps them; attention and GELU read them so), and the gradients of those bf16 tensors inside a block:
// the MLP's two inner ones (GELU's output gradient, written by the second product's backward, and its input
// gradient, written by GELU's backward) and attention's (its output's, written by the projection's backward, and
// dQ, dK, dV, summed by its backward): bf16 in autocast, and the products and bias sums read them so; and the
// norms' output gradients too (written by the products after them, summed over a tensor group in bf16, read by the
// norms' backward), and the two projections' products into the residual stream (written in bf16 as autocast writes
// a linear layer's output, widened by the residual kernels, which add the bias and the residual in fp32; summed over
// a tensor group in bf16). The residual stream and its gradient, the logits and their gradient, the layernorm
// statistics and the loss stay fp32 (the fp32 output gradients, the residual's and the logits', are rounded to bf16
// for the products). The other parameters (layernorm, biases) are widened into fp32 scratch copies; each gradient is
// summed in fp32 and stored once into the compute-type gradient buffer. The trainer's buffers are made in the first
// step and reused: a later step that would allocate one is an error (trainer::begin_step), so no step after the first
// calls cudaMalloc or cudaFree, each a device-wide synchronisation.
//
// Tensor parallelism (model_options::tensor_parallel, gpt_loop.hpp): each rank's products, attention and element-wise
// kernels run on its slices (its heads, its MLP slice); the projections' products are summed over the tensor group
// before the kernels that add their biases (so the replicated bias is added once, to the sum), and the norms' input
// gradients before the norms' backward: gpt::tp_group's all-reduces, on the compute stream in the kernels' order.
//
// A mixture of experts (gpt::shape::experts, model_options::expert_parallel): the router and the token exchanges are
// experts.cuh's kernels and gpt::ep_group's all_to_all_v on the model's expert group; each of the rank's experts runs
// over its rows as the dense MLP runs over the batch (the same products, bias_gelu and gelu_backward; the second
// product in fp32 with add_bias); each block's routing is read back to the host once a forward, for the exchange's
// counts.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fsdp/fsdp.cuh>

#include "examples/04_gpt_host/gpt_loop.hpp"
#include "examples/05_gpt_cuda/attention.cuh"
#include "examples/05_gpt_cuda/buffer_plan.hpp"
#include "examples/05_gpt_cuda/experts.cuh"
#include "examples/05_gpt_cuda/gpt_kernels.cuh"
#include "examples/05_gpt_cuda/step_work.hpp"
#include "examples/common/gemm.cuh"

namespace gpt_cuda {

using examples::blocks;
using examples::gemm;
using examples::gemm_kind;

/// Device floats owned by the trainer (activations and scratch; the library's memory figures do not include
/// them). Contents are undefined after a resize that changes the size.
class dbuf {
 public:
  dbuf() = default;
  dbuf(dbuf&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  dbuf& operator=(dbuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~dbuf() {
    if (p_) {
      FSDP_CUDA_LOG(cudaFree(p_));
      live() -= n_ * sizeof(float);
    }
  }
  void resize(std::size_t n) {
    if (n == n_) return;
    ++made();
    if (float* old = std::exchange(p_, nullptr)) {  // cleared first: a failed free must not be freed again
      live() -= std::exchange(n_, 0) * sizeof(float);
      FSDP_CUDA_CHECK(cudaFree(old));
    }
    FSDP_CUDA_CHECK(cudaMalloc(&p_, (n ? n : 1) * sizeof(float)));
    n_ = n;
    const std::size_t now = live() += n * sizeof(float);
    std::size_t seen = peak().load();
    while (now > seen && !peak().compare_exchange_weak(seen, now)) {
    }
  }
  /// resize(n) when n is larger than the size: a scratch buffer shared by uses of several sizes.
  void grow(std::size_t n) {
    if (n > n_) resize(n);
  }
  float* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  /// The most bytes that trainers' buffers held at once in this process (every local rank's together).
  static std::size_t peak_bytes() noexcept { return peak().load(); }
  /// How many buffers this thread has (re)allocated (each rank trains on a thread of its own).
  static std::size_t allocations() noexcept { return made(); }

 private:
  static std::atomic<std::size_t>& live() noexcept {
    static std::atomic<std::size_t> bytes{0};
    return bytes;
  }
  static std::atomic<std::size_t>& peak() noexcept {
    static std::atomic<std::size_t> bytes{0};
    return bytes;
  }
  static std::size_t& made() noexcept {
    thread_local std::size_t count = 0;
    return count;
  }
  float* p_ = nullptr;
  std::size_t n_ = 0;
};

using block_cache = gpt::block_cache_of<dbuf>;

/// The launches this thread's trainer made in its current (after a run: its last) step, by step_work.hpp's
/// launch_names (keyed by their addresses): what 05_gpt_cuda compares with step_work's rows.
inline std::unordered_map<const char*, std::size_t>& launch_tally() {
  thread_local std::unordered_map<const char*, std::size_t> tally;
  return tally;
}

/// The trainer's choice of kernels: the matrix products' (cuBLAS or the plain kernel), attention's tile product
/// (tensor cores or their twin), and the classifier's rows at a time (0: buffer_plan.hpp's head_rows decides).
struct kernel_choice {
  gemm_kind gemm = gemm_kind::cublas;
  attention::product attention = attention::product::twin;
  int head_rows = 0;
};
/// The default attention product for a compute type: tensor cores in bf16 where built, the twin otherwise.
inline attention::product default_product(bool bf16) {
  return bf16 && attention::have_tensor_cores ? attention::product::tensor : attention::product::twin;
}

/// The Trainer of gpt_loop.hpp on a CUDA model: every kernel on the model's compute stream.
template <class ModelT>
class trainer {
  using DW = typename ModelT::compute_type;  // float or fsdp::bfloat16, whose casts are the host's bits
  static_assert(std::is_same_v<DW, float> || std::is_same_v<DW, fsdp::bfloat16>,
                "gpt_cuda::trainer: fp32 or bf16 compute");

 public:
  using buffer = dbuf;
  using cache = block_cache;
  static std::size_t bytes(const buffer& b) { return b.size() * sizeof(float); }

  trainer(ModelT& model, const gpt::shape& s, int batch, kernel_choice k)
      : s_(s),
        B_(batch),
        N_(batch * s.context),
        R_(head_rows(s, batch, k.head_rows)),
        tp_(gpt::tp_group_of(model)),
        ep_(gpt::ep_group_of(model)),
        d_((gpt::validate(s, tp_.degree), gpt::local(s, tp_.degree))),
        be_(&model.backend()),
        cs_(&model.backend().compute_stream()),
        mm_(std::make_unique<gemm>(k.gemm, cs_->get())),
        product_(k.attention) {
    if (s.width % 4 != 0)
      throw fsdp::usage_error("gpt_cuda::trainer: width " + std::to_string(s.width) +
                              " is not a multiple of 4 (the element-wise kernels take four columns a thread, in "
                              "128-bit accesses)");
    if (d_.attention % 4 != 0)
      throw fsdp::usage_error("gpt_cuda::trainer: width " + std::to_string(s.width) + " over tensor groups of " +
                              std::to_string(tp_.degree) + " leaves " + std::to_string(d_.attention) +
                              " channels of attention a rank, not a multiple of 4 (the element-wise kernels take four "
                              "columns a thread, in 128-bit accesses)");
    if (const std::string why = attention::refusal(s.width / s.heads, std::is_same_v<DW, fsdp::bfloat16>, k.attention);
        !why.empty())
      throw fsdp::usage_error("gpt_cuda::trainer: " + why);
    if (s.experts % ep_.degree != 0)
      throw fsdp::usage_error("gpt_cuda::trainer: " + std::to_string(s.experts) +
                              " experts do not split over expert groups of " + std::to_string(ep_.degree));
  }

  void begin_step(const std::vector<int>& inputs, const std::vector<int>& targets) {
    next_step();
    aux_ = 0;
    upload(inputs, targets, gpt::row_positions(inputs.size(), s_.context));
    packed_ = false;
    denominator_ = static_cast<double>(N_);
  }
  /// Packed rows (gpt::packed_tokens): attention within each document, positions restarting, the loss summed over
  /// the masked-in tokens and divided by the step's loss tokens.
  void begin_packed_step(const gpt::packed_tokens& p) {
    gpt::check_packed(p, N_);
    next_step();
    aux_ = 0;
    upload(p.inputs, p.targets, p.positions);
    mask_.assign(p.mask.begin(), p.mask.end());
    starts_ = p.starts;  // kept, as the others: the copies may still be in flight
    to_device(starts_d_, starts_);
    to_device(mask_d_, mask_);
    packed_ = true;
    denominator_ = gpt::loss_denominator(p);
  }

  template <class Unit>
  void embed(const Unit& root, dbuf& x) {
    x.resize(nc());
    go(launch_names::embed, blocks(nc()), kernels::embed<DW>, x.data(), root.template param<DW>("wte").data(),
       root.template param<DW>("wpe").data(), tok(), pos(), N_, s_.width);
    check();
  }

  template <class Unit>
  void block_forward(const Unit& u, int l, const dbuf& x, cache& k, dbuf& out) {
    namespace K = kernels;
    const int C = s_.width, N = N_, A = d_.attention, F = d_.hidden;  // this rank's heads' channels, MLP slice
    auto p = [&](const char* leaf) { return weight(u, gpt::pname(l, leaf), leaf); };
    auto w = [&](const char* leaf) { return matrix(u, gpt::pname(l, leaf)); };
    const std::size_t NC = nc(), NA = std::size_t(N) * A, NF = std::size_t(N) * F;
    // ln1, atty, ln2 and fc_gelu are read only by matrix products (and atty by attention's row_dots): kept in the
    // compute type, as the kernels that make them write them (the products' operands, no cast in between); so are
    // qkv and fc, products read by attention and by GELU (their biases added in the compute type, as autocast keeps
    // a linear layer's output).
    k.ln1.resize(act(NC)), k.ln1_mean.resize(N), k.ln1_rstd.resize(N), k.qkv.resize(act(3 * NA)), k.att.resize(rows());
    k.atty.resize(act(NA)), k.res1.resize(NC), k.ln2.resize(act(NC)), k.ln2_mean.resize(N), k.ln2_rstd.resize(N);
    out.resize(NC);
    go(launch_names::layernorm_forward, blocks(32LL * N), K::layernorm_forward<DW>, as_dw(k.ln1), k.ln1_mean.data(),
       k.ln1_rstd.data(), x.data(), p("ln_1.w"), p("ln_1.b"), N, C);
    linear_forward(as_dw(k.qkv), as_dw(k.ln1), w("attn.qkv.w"), p("attn.qkv.b"), N, C, 3 * A);
    ++launch_tally()[launch_names::attention_forward];
    attend([&](auto run) { run.forward(as_dw(k.atty), k.att.data(), as_dw(k.qkv), att_dims(), s()); });
    // Each linear layer's bias is added by the kernel after its product: with the residual add and the next
    // layernorm, with GELU, with the residual add.
    // The projections write their products in the compute type, as autocast writes a linear layer's output; the
    // kernels after them widen each, add its bias and the fp32 residual in fp32, and write the fp32 residual stream
    // (autocast rounds the product with its bias added; here the bias is added after the rounding, in fp32).
    DW* proj = projection();
    linear_forward(proj, as_dw(k.atty), w("attn.proj.w"), nullptr, N, A, C);
    tp_.all_reduce(proj, NC);  // row-parallel: the partial products summed, the bias added to the sum
    go(launch_names::bias_residual_layernorm, blocks(32LL * N), K::bias_residual_layernorm<DW, DW>, k.res1.data(),
       as_dw(k.ln2), k.ln2_mean.data(), k.ln2_rstd.data(), proj, p("attn.proj.b"), x.data(), p("ln_2.w"), p("ln_2.b"),
       N, C);
    if (s_.experts > 0) {  // the router here; the experts' output is added by experts_forward
      route(u, l, k);
      copy(out, k.res1);
      check();
      return;
    }
    k.fc.resize(act(NF)), k.fc_gelu.resize(act(NF));
    linear_forward(as_dw(k.fc), as_dw(k.ln2), w("mlp.fc.w"), nullptr, N, C, F);
    go(launch_names::bias_gelu, blocks(NF), K::bias_gelu<DW>, as_dw(k.fc_gelu), as_dw(k.fc), p("mlp.fc.b"), N, F);
    linear_forward(proj, as_dw(k.fc_gelu), w("mlp.proj.w"), nullptr, N, F, C);
    tp_.all_reduce(proj, NC);
    go(launch_names::bias_residual, blocks(NC), K::bias_residual<DW>, out.data(), proj, p("mlp.proj.b"), k.res1.data(),
       N, C);
    check();
  }

  template <class Unit>
  void block_backward(const Unit& u, int l, const dbuf& x, const cache& k, const dbuf& dout, dbuf& dx) {
    namespace K = kernels;
    const int C = s_.width, N = N_, A = d_.attention, F = d_.hidden;
    const std::size_t NC = nc(), NA = std::size_t(N) * A, NF = std::size_t(N) * F, CA = std::size_t(C) * A,
                      CF = std::size_t(C) * F;
    auto p = [&](const char* leaf) { return weight(u, gpt::pname(l, leaf), leaf); };
    auto w = [&](const char* leaf) { return matrix(u, gpt::pname(l, leaf)); };
    // Sums by columns (layernorm and bias gradients) add into zeroed buffers; the weight gradients and the products'
    // input gradients are written by one product each (beta 0): no memset.
    auto g = [&](const char* leaf, std::size_t n) { return zeroed(gscratch_[leaf], n); };
    auto gw = [&](const char* leaf, std::size_t n) { return sized(gscratch_[leaf], n); };
    float *g_ln1w = g("ln_1.w", C), *g_ln1b = g("ln_1.b", C), *g_qkvw = gw("attn.qkv.w", 3 * CA),
          *g_qkvb = g("attn.qkv.b", 3 * A), *g_aprojw = gw("attn.proj.w", CA), *g_aprojb = g("attn.proj.b", C),
          *g_ln2w = g("ln_2.w", C), *g_ln2b = g("ln_2.b", C);
    dres1_.resize(NC);
    copy(dres1_, dout);
    DW* dln2 = norm_gradient();
    if (s_.experts > 0) {  // the experts' input gradient (experts_backward, run before) and the router's
      route_backward(u, l, k, dln2);
    } else {
      float *g_fcw = gw("mlp.fc.w", CF), *g_fcb = g("mlp.fc.b", F), *g_mprojw = gw("mlp.proj.w", CF),
            *g_mprojb = g("mlp.proj.b", C);
      // The MLP's inner gradients in the compute type, as autocast keeps them: the second product writes dfc_gelu
      // so, GELU's backward reads it and writes dfc so, and the first product's backward and its bias sum read dfc
      // as it is.
      t4a_.resize(act(NF)), t4b_.resize(act(NF));
      DW *dfc_gelu = as_dw(t4a_), *dfc = as_dw(t4b_);
      linear_backward(dfc_gelu, g_mprojw, g_mprojb, dout.data(), as_dw(k.fc_gelu), w("mlp.proj.w"), N, F, C);
      go(launch_names::gelu_backward, blocks(NF), K::gelu_backward<DW>, dfc, as_dw(k.fc), dfc_gelu, NF);
      linear_backward(dln2, g_fcw, g_fcb, dfc, as_dw(k.ln2), w("mlp.fc.w"), N, C, F);
      tp_.all_reduce(dln2, NC);  // column-parallel: the input gradient's partial sums
    }
    layernorm_backward(dres1_.data(), g_ln2w, g_ln2b, dln2, k.res1.data(), p("ln_2.w"), k.ln2_mean.data(),
                       k.ln2_rstd.data());
    dx.resize(NC);
    copy(dx, dres1_);
    // Attention's gradients in the compute type, as autocast keeps them: the projection's backward writes datty so,
    // attention's backward reads it and sums dQ, dK, dV into a zeroed dqkv so (each rounded once), and the QKV
    // product's backward and its bias sum read dqkv as it is.
    tnc_b_.resize(act(NA));
    DW* datty = as_dw(tnc_b_);
    linear_backward(datty, g_aprojw, g_aprojb, dres1_.data(), as_dw(k.atty), w("attn.proj.w"), N, A, C);
    DW* dqkv = reinterpret_cast<DW*>(zeroed(t3nc_, act(3 * NA)));
    rowdots_.resize(rows());
    for (const char* name : {launch_names::row_dots, launch_names::backward_key, launch_names::backward_query})
      ++launch_tally()[name];  // attention::launch::backward's three kernels
    attend([&](auto run) {
      run.backward(dqkv, rowdots_.data(), datty, as_dw(k.atty), as_dw(k.qkv), k.att.data(), att_dims(), s());
    });
    DW* dln1 = norm_gradient();
    linear_backward(dln1, g_qkvw, g_qkvb, dqkv, as_dw(k.ln1), w("attn.qkv.w"), N, C, 3 * A);
    tp_.all_reduce(dln1, NC);
    layernorm_backward(dx.data(), g_ln1w, g_ln1b, dln1, x.data(), p("ln_1.w"), k.ln1_mean.data(), k.ln1_rstd.data());
    for (const char* leaf :
         {"ln_1.w", "ln_1.b", "attn.qkv.w", "attn.qkv.b", "attn.proj.w", "attn.proj.b", "ln_2.w", "ln_2.b"})
      store(u, gpt::pname(l, leaf), gscratch_[leaf].data());
    if (s_.experts > 0)
      store(u, gpt::pname(l, "mlp.router.w"), gscratch_["mlp.router.w"].data());
    else
      for (const char* leaf : {"mlp.fc.w", "mlp.fc.b", "mlp.proj.w", "mlp.proj.b"})
        store(u, gpt::pname(l, leaf), gscratch_[leaf].data());
    check();
  }

  // ---- a mixture of experts (gpt::shape::experts > 0; experts.cuh's kernels) --------------------------------------
  static constexpr bool supports_experts = true;

  /// Block l's experts' forward: each of the block's token choices (route) sent with its ln_2 output to the rank of
  /// its expert, put in its experts' order there and run through the experts' MLPs, one GEMM an expert and matrix
  /// (the first bias and GELU by the dense MLP's bias_gelu, the products' operands in the compute type), the outputs
  /// sent back; out += each choice's gate x its output.
  template <class Unit>
  void experts_forward(const Unit& u, int l, cache& k, dbuf& out) {
    namespace E = experts;
    const int C = s_.width, N = N_, KK = s_.top_k, H = 4 * C, M = N * KK, P = s_.experts / ep_.degree;
    const std::size_t most = max_rows();
    k.moe_in.resize(act(most * C)), k.moe_h.resize(act(most * H)), k.moe_act.resize(act(most * H));
    k.moe_y.resize(std::size_t(M) * C), k.moe_index.resize(3 * std::size_t(M) + most);
    send_.resize(std::max(std::size_t(M), most) * C), recv_.resize(most * C), back_.resize(std::size_t(M) * C);
    ey_.resize(most * C);
    exchange_counts(l, k);
    go(launch_names::dispatch, blocks(static_cast<long long>(M) * C), E::dispatch<DW>, send_.data(), as_dw(k.ln2),
       order_of(k), M, KK, C);
    const int R = exchange(send_, k.moe_sent, recv_, k.moe_received, C);
    DW *x = as_dw(k.moe_in), *h = as_dw(k.moe_h), *a = as_dw(k.moe_act);
    go(launch_names::gather_rows, blocks(static_cast<long long>(R) * C), E::gather_rows<DW>, x, recv_.data(),
       perm_of(k), R, C);
    const DW *fcw = matrix(u, gpt::pname(l, "moe.fc.w")), *projw = matrix(u, gpt::pname(l, "moe.proj.w"));
    const float *fcb = weight(u, gpt::pname(l, "moe.fc.b"), "moe.fc.b"),
                *projb = weight(u, gpt::pname(l, "moe.proj.b"), "moe.proj.b");
    const std::vector<int> rows = expert_rows(k);
    for (int e = 0, first = 0; e < P; first += rows[std::size_t(e)], ++e) {
      const int n = rows[std::size_t(e)];
      const std::size_t rh = std::size_t(first) * H, rc = std::size_t(first) * C;
      linear_forward(h + rh, x + rc, fcw + std::size_t(e) * H * C, nullptr, n, C, H);
      go(launch_names::bias_gelu, blocks(static_cast<long long>(n) * H), kernels::bias_gelu<DW>, a + rh, h + rh,
         fcb + std::size_t(e) * H, n, H);
      linear_forward(ey_.data() + rc, a + rh, projw + std::size_t(e) * C * H, projb + std::size_t(e) * C, n, H, C);
    }
    go(launch_names::scatter_rows, blocks(static_cast<long long>(R) * C), E::scatter_rows<>, send_.data(), ey_.data(),
       perm_of(k), R, C);
    exchange(send_, k.moe_received, back_, k.moe_sent, C);
    go(launch_names::scatter_rows, blocks(static_cast<long long>(M) * C), E::scatter_rows<>, k.moe_y.data(),
       back_.data(), order_of(k), M, C);
    go(launch_names::combine, blocks(static_cast<long long>(nc())), E::combine<>, out.data(), k.moe_y.data(),
       k.moe_gate.data(), N, KK, C);
    check();
  }

  /// Block l's experts' backward from the block output's gradient: each choice's output gradient (its gate x dout)
  /// sent to its expert, the experts' backward one GEMM pair an expert and matrix (the dense MLP's), their gradients
  /// stored into u, their input gradients sent back and summed per token into k.moe_dln2; each choice's gate gradient
  /// into k.moe_dgate (for the router: block_backward).
  template <class Unit>
  void experts_backward(const Unit& u, int l, cache& k, const dbuf& dout) {
    namespace E = experts;
    const int C = s_.width, N = N_, KK = s_.top_k, H = 4 * C, M = N * KK, P = s_.experts / ep_.degree;
    const std::size_t most = max_rows();
    k.moe_dgate.resize(std::size_t(M)), k.moe_dln2.resize(nc()), dact_.resize(act(most * H)), dh_.resize(act(most * H));
    // the widest of the experts' column sums and output-gradient operands, whatever this step's rows: sized once
    colpart_.grow(static_cast<std::size_t>(kernels::column_chunks(static_cast<int>(most))) * 4 * C);
    if constexpr (!std::is_same_v<DW, float>) hout_.grow((most * C + 1) / 2);
    go(launch_names::choice_gradients, blocks(M), E::choice_gradients<>, send_.data(), k.moe_dgate.data(), dout.data(),
       k.moe_y.data(), k.moe_gate.data(), order_of(k), M, KK, C);
    const int R = exchange(send_, k.moe_sent, recv_, k.moe_received, C);  // the experts' output gradients
    go(launch_names::gather_rows, blocks(static_cast<long long>(R) * C), E::gather_rows<float>, ey_.data(),
       recv_.data(), perm_of(k), R, C);
    const DW *x = as_dw(k.moe_in), *h = as_dw(k.moe_h), *a = as_dw(k.moe_act);
    const DW *fcw = matrix(u, gpt::pname(l, "moe.fc.w")), *projw = matrix(u, gpt::pname(l, "moe.proj.w"));
    auto g = [&](const char* leaf, std::size_t n) { return zeroed(gscratch_[leaf], n); };
    auto gw = [&](const char* leaf, std::size_t n) { return sized(gscratch_[leaf], n); };
    float *g_fcw = gw("moe.fc.w", std::size_t(P) * H * C), *g_fcb = g("moe.fc.b", std::size_t(P) * H),
          *g_projw = gw("moe.proj.w", std::size_t(P) * C * H), *g_projb = g("moe.proj.b", std::size_t(P) * C);
    DW *dact = as_dw(dact_), *dh = as_dw(dh_);
    const std::vector<int> rows = expert_rows(k);
    for (int e = 0, first = 0; e < P; first += rows[std::size_t(e)], ++e) {
      const int n = rows[std::size_t(e)];
      const std::size_t rh = std::size_t(first) * H, rc = std::size_t(first) * C, wc = std::size_t(e) * C * H;
      linear_backward(dact + rh, g_projw + wc, g_projb + std::size_t(e) * C, ey_.data() + rc, a + rh, projw + wc, n, H,
                      C);
      go(launch_names::gelu_backward, blocks(static_cast<long long>(n) * H), kernels::gelu_backward<DW>, dh + rh,
         h + rh, dact + rh, static_cast<long long>(n) * H);
      linear_backward(recv_.data() + rc, g_fcw + wc, g_fcb + std::size_t(e) * H, dh + rh, x + rc, fcw + wc, n, C, H);
    }
    go(launch_names::scatter_rows, blocks(static_cast<long long>(R) * C), E::scatter_rows<>, send_.data(), recv_.data(),
       perm_of(k), R, C);
    exchange(send_, k.moe_received, back_, k.moe_sent, C);
    go(launch_names::gather_input_gradient, blocks(static_cast<long long>(nc())), E::gather_input_gradient<>,
       k.moe_dln2.data(), back_.data(), where_of(k), N, KK, C);
    for (const char* leaf : {"moe.fc.w", "moe.fc.b", "moe.proj.w", "moe.proj.b"})
      store(u, gpt::pname(l, leaf), gscratch_[leaf].data());
    check();
  }

  template <class Unit>
  void head(const Unit& root, const dbuf& x, dbuf& dx) {
    namespace K = kernels;
    const int C = s_.width, V = s_.vocab, N = N_;
    const DW* wte = matrix(root, "wte");
    const float *lnfw = weight(root, "ln_f.w", "ln_f.w"),
                *lnfb = weight(root, "ln_f.b", "ln_f.b");
    lnf_.resize(act(nc())), lnf_mean_.resize(N), lnf_rstd_.resize(N);  // read only by the classifier's products
    logits_.resize(static_cast<std::size_t>(R_) * V), row_loss_.resize(N);
    loss_.resize(1);
    go(launch_names::layernorm_forward, blocks(32LL * N), K::layernorm_forward<DW>, as_dw(lnf_), lnf_mean_.data(),
       lnf_rstd_.data(), x.data(), lnfw, lnfb, N, C);
    float* g_wte = sized(g_wte_, static_cast<std::size_t>(V) * C);  // written by the first chunk's product
    DW* dlnf = norm_gradient();                                     // each chunk's rows written by its product
    // The classifier, the cross-entropy and the head's backward products R_ rows at a time (buffer_plan.hpp's
    // head_rows): one chunk's logits at once, turned into their gradient in place.
    const int* targets = ints(targets_d_);
    const int* mask = packed_ ? ints(mask_d_) : nullptr;
    for (int r0 = 0; r0 < N; r0 += R_) {
      const int R = std::min(R_, N - r0);
      const DW* in = as_dw(lnf_) + static_cast<std::size_t>(r0) * C;
      linear_forward(logits_.data(), in, wte, nullptr, R, C, V);
      go(launch_names::cross_entropy, row_blocks(R), K::cross_entropy<>, logits_.data(), row_loss_.data() + r0,
         logits_.data(), targets + r0, mask ? mask + r0 : nullptr, R, V, 1.0f / static_cast<float>(denominator_));
      linear_backward(dlnf + static_cast<std::size_t>(r0) * C, g_wte, nullptr, logits_.data(), in, wte, R, C, V,
                      /*add_dw=*/r0 > 0);
    }
    go(launch_names::mean_loss, 1, K::mean_loss<>, loss_.data(), row_loss_.data(), N, denominator_);
    if (s_.experts > 0)  // the blocks' load-balancing losses (route), as the host trainer adds them
      go(launch_names::add_to_loss, 1, experts::add_to_loss<>, loss_.data(), aux_);
    zeroed(dx, nc());
    layernorm_backward(dx.data(), zeroed(g_lnfw_, C), zeroed(g_lnfb_, C), dlnf, x.data(), lnfw, lnf_mean_.data(),
                       lnf_rstd_.data());
    check();
  }

  template <class Unit>
  void root_backward(const Unit& root, const dbuf& dx0) {
    float* g_wpe = zeroed(g_wpe_, static_cast<std::size_t>(s_.context) * s_.width);
    // One block a distinct token (position), its rows in order: the groups made on the host with the batch.
    const int* grouped = ints(groups_d_);
    for (int which = 0; which < 2; ++which) {
      const int* base = grouped + static_cast<std::size_t>(which) * (3 * static_cast<std::size_t>(N_) + 1);
      go(launch_names::grouped_row_sum, std::min(N_, 1024), kernels::grouped_row_sum<>,
         which == 0 ? g_wte_.data() : g_wpe, dx0.data(), base, base + N_, base + 2 * N_ + 1, N_, s_.width);
    }
    store(root, "wte", g_wte_.data());
    store(root, "wpe", g_wpe);
    store(root, "ln_f.w", g_lnfw_.data());
    store(root, "ln_f.b", g_lnfb_.data());
    check();
  }

  /// The mean loss over every rank's tokens: an all-reduce of the ranks' means (packed: of their shares, summed, a
  /// tensor group's counted once: gpt::loss_contribution) on the compute stream.
  float global_loss(ModelT& model) {
    reduce_loss(model);
    return read_loss();
  }
  /// Every piece of the trainer's work is issued on the backend's streams (config::graph may capture a step): the
  /// batch goes in before the step (begin_step), the loss comes out after it (read_loss).
  static constexpr bool capturable = true;
  /// global_loss's collective, on the compute stream.
  void reduce_loss(ModelT& model) {
    if (gpt::loss_contribution(1.0f, packed_, tp_) == 0.0f) zeroed(loss_, 1);
    model.comm().all_reduce(loss_.data(), loss_.data(), 1, fsdp::dtype::f32, gpt::loss_reduction(packed_), *cs_);
  }
  /// The loss reduce_loss left, read back once the compute stream has passed it.
  float read_loss() {
    float loss = 0;
    be_->synchronize(*cs_);  // the watched wait first: a copy into pageable memory blocks until the stream drains
    be_->download(&loss, loss_.data(), sizeof(float), *cs_);
    be_->synchronize(*cs_);
    return loss;
  }

  std::size_t head_bytes() const {
    return (lnf_.size() + lnf_mean_.size() + lnf_rstd_.size() + logits_.size()) * sizeof(float);
  }

 private:
  cudaStream_t s() const { return cs_->get(); }
  /// Blocks for a kernel with one block per row (at most 1024; the kernels stride).
  static int row_blocks(int rows) { return rows < 1024 ? rows : 1024; }
  /// Counts the steps; from the second on, a buffer the trainer (re)allocated since the second began is an error.
  void next_step() {
    launch_tally().clear();
    if (++steps_ == 2) allocations_ = dbuf::allocations();
    if (steps_ > 2 && dbuf::allocations() != allocations_)
      throw std::logic_error("gpt_cuda::trainer allocated " + std::to_string(dbuf::allocations() - allocations_) +
                             " device buffer(s) after its first step (every buffer must keep its first step's size: "
                             "cudaMalloc and cudaFree synchronise the device)");
  }
  std::size_t nc() const { return static_cast<std::size_t>(N_) * s_.width; }
  /// Floats that hold n activations in the compute type (two bf16 to a float).
  static std::size_t act(std::size_t n) { return std::is_same_v<DW, float> ? n : (n + 1) / 2; }
  /// A buffer of activations kept in the compute type (act()).
  static DW* as_dw(const dbuf& b) { return reinterpret_cast<DW*>(b.data()); }
  long long rows() const { return static_cast<long long>(B_) * d_.heads * s_.context; }
  attention::dims att_dims() const { return {B_, s_.context, d_.attention, d_.heads, starts()}; }
  /// f(attention::launch<DW, P>{}) for the trainer's product P.
  template <class F>
  void attend(F&& f) const {
    if constexpr (std::is_same_v<DW, fsdp::bfloat16> && attention::have_tensor_cores) {
      if (product_ == attention::product::tensor) return f(attention::launch<DW, attention::product::tensor>{});
    }
    f(attention::launch<DW, attention::product::twin>{});
  }
  const int* tok() const { return ints(tokens_); }
  const int* pos() const { return ints(positions_d_); }
  const int* starts() const { return packed_ ? ints(starts_d_) : nullptr; }
  static const int* ints(const dbuf& b) { return reinterpret_cast<const int*>(b.data()); }
  /// Copies ints into a device buffer (of as many floats: the same size) on the compute stream.
  void to_device(dbuf& d, const std::vector<int>& v) {
    d.resize(v.size());
    be_->upload(d.data(), v.data(), static_cast<std::int64_t>(v.size() * sizeof(int)), *cs_);
  }
  void upload(const std::vector<int>& inputs, const std::vector<int>& targets, const std::vector<int>& positions) {
    inputs_ = inputs, targets_ = targets, positions_ = positions;  // kept: the copies may still be in flight
    to_device(tokens_, inputs_);
    to_device(targets_d_, targets_);
    to_device(positions_d_, positions_);
    groups_.clear();
    row_groups(inputs_, groups_);
    row_groups(positions_, groups_);
    to_device(groups_d_, groups_);
  }
  /// Appends the row groups of keys (N of them) to out, 3N + 1 ints: order (the rows sorted by key, each key's rows
  /// in increasing n), first (G + 1 offsets into order, then N to fill N + 1) and key (G keys, then 0 to fill N),
  /// G the distinct keys: a fixed size, so that the device copy is made once, and G read from it by the kernel.
  static void row_groups(const std::vector<int>& keys, std::vector<int>& out) {
    const std::size_t N = keys.size(), at = out.size();
    out.resize(at + 3 * N + 1);
    int* order = out.data() + at;
    int *first = order + N, *key = first + N + 1;
    for (std::size_t n = 0; n < N; ++n) order[n] = static_cast<int>(n);
    std::stable_sort(order, order + N, [&](int a, int b) { return keys[std::size_t(a)] < keys[std::size_t(b)]; });
    int G = 0;
    for (std::size_t i = 0; i < N; ++i)
      if (i == 0 || keys[std::size_t(order[i])] != keys[std::size_t(order[i - 1])])
        first[G] = static_cast<int>(i), key[G] = keys[std::size_t(order[i])], ++G;
    std::fill(first + G, first + N + 1, static_cast<int>(N));
    std::fill(key + G, key + N, 0);
  }
  void check() const { FSDP_CUDA_CHECK(cudaGetLastError()); }

  // ---- the experts' routing and exchanges ---------------------------------------------------------------------
  /// k.moe_index's parts: N K ints each for each choice's expert, the choices in the order they are sent, each
  /// choice's place in that order; then max_rows() for the received row at each place of the experts' order.
  int* choice_of(const cache& k) const { return reinterpret_cast<int*>(k.moe_index.data()); }
  int* order_of(const cache& k) const { return choice_of(k) + static_cast<std::size_t>(N_) * s_.top_k; }
  int* where_of(const cache& k) const { return choice_of(k) + 2 * static_cast<std::size_t>(N_) * s_.top_k; }
  int* perm_of(const cache& k) const { return choice_of(k) + 3 * static_cast<std::size_t>(N_) * s_.top_k; }
  /// The rows each of this rank's experts received (from k.moe_received_experts: a count a sender and expert).
  std::vector<int> expert_rows(const cache& k) const {
    const std::size_t P = static_cast<std::size_t>(s_.experts / ep_.degree);
    std::vector<int> rows(P, 0);
    for (std::size_t i = 0; i < k.moe_received_experts.size(); ++i) rows[i % P] += int(k.moe_received_experts[i]);
    return rows;
  }
  /// The most rows this rank's experts can receive: every choice of every rank of its expert group (dropless). The
  /// buffers of received rows have this size from the first step on (no allocation after it).
  std::size_t max_rows() const { return static_cast<std::size_t>(ep_.degree) * N_ * s_.top_k; }

  /// The router of block l: ln_2's output times its weight [X, C], each row's softmax, each token's top_k experts
  /// and their gates (experts::route). Then on the host, since the token exchange's counts are the collective's host
  /// arguments: the choices and probabilities read back (a wait for the compute stream, once a block), the
  /// load-balancing loss added to aux_ (gpt::load_balance_loss), the order the choices are sent in and each one's
  /// place in it (gpt::dispatch_order), uploaded.
  template <class Unit>
  void route(const Unit& u, int l, cache& k) {
    const int C = s_.width, N = N_, X = s_.experts, KK = s_.top_k, M = N * KK;
    k.moe_probs.resize(std::size_t(N) * X), k.moe_gate.resize(std::size_t(M));
    k.moe_index.resize(3 * std::size_t(M) + max_rows());
    linear_forward(k.moe_probs.data(), as_dw(k.ln2), matrix(u, gpt::pname(l, "mlp.router.w")), nullptr, N, C, X);
    go(launch_names::route, blocks(N), experts::route<>, k.moe_probs.data(), choice_of(k), k.moe_gate.data(), N, X, KK);
    k.moe_choice.resize(std::size_t(M)), probs_host_.resize(std::size_t(N) * X);
    be_->synchronize(*cs_);  // the watched wait first: a copy into pageable memory blocks until the stream drains
    be_->download(k.moe_choice.data(), choice_of(k), std::int64_t(M) * 4, *cs_);
    be_->download(probs_host_.data(), k.moe_probs.data(), std::int64_t(N) * X * 4, *cs_);
    be_->synchronize(*cs_);
    aux_ += gpt::load_balance_loss(probs_host_.data(), k.moe_choice, N, X, KK, s_.aux_weight);
    gpt::dispatch_order(k.moe_choice, X / ep_.degree, ep_.degree, k.moe_order, k.moe_sent_experts, k.moe_sent);
    k.moe_where.resize(std::size_t(M));
    for (int i = 0; i < M; ++i) k.moe_where[std::size_t(k.moe_order[std::size_t(i)])] = i;
    be_->upload(order_of(k), k.moe_order.data(), std::int64_t(M) * 4, *cs_);  // the cache keeps the host copies
    be_->upload(where_of(k), k.moe_where.data(), std::int64_t(M) * 4, *cs_);
  }

  /// The router's backward: the gates' gradients (k.moe_dgate) through their renormalisation and the load-balancing
  /// loss's (gpt::load_balance_gradient), through the softmax (experts::route_backward); the router's weight gradient,
  /// and ln_2's output gradient: the experts' part (k.moe_dln2) plus the router's, into dln2 in the compute type.
  template <class Unit>
  void route_backward(const Unit& u, int l, const cache& k, DW* dln2) {
    const int C = s_.width, N = N_, X = s_.experts, KK = s_.top_k;
    std::vector<float>& daux = daux_host_[l];  // kept: the upload may still be in flight
    daux = gpt::load_balance_gradient(k.moe_choice, N, X, KK, s_.aux_weight);
    daux_d_.resize(std::size_t(X)), dlogits_.resize(std::size_t(N) * X), dtmp_.resize(nc());
    be_->upload(daux_d_.data(), daux.data(), std::int64_t(X) * 4, *cs_);
    go(launch_names::route_backward, blocks(N), experts::route_backward<>, dlogits_.data(), k.moe_probs.data(),
       choice_of(k), k.moe_gate.data(), k.moe_dgate.data(), daux_d_.data(), N, X, KK);
    linear_backward(dtmp_.data(), sized(gscratch_["mlp.router.w"], std::size_t(X) * C), nullptr, dlogits_.data(),
                    as_dw(k.ln2), matrix(u, gpt::pname(l, "mlp.router.w")), N, C, X);
    go(launch_names::add_into, blocks(static_cast<long long>(nc())), experts::add_into<DW>, dln2, k.moe_dln2.data(),
       dtmp_.data(), static_cast<long long>(nc()));
  }

  /// The rows each rank of the expert group sends each of this rank's experts (k.moe_received_experts, a sender's P
  /// counts after another's; k.moe_received, a count a sender) for the rows this rank sends each of theirs: an
  /// all_to_all of P counts a pair, through the device. Then the received rows' places in the experts' order (each
  /// expert's rows from sender 0, then 1, ...), uploaded (perm_of; the host copy kept by block while in flight).
  void exchange_counts(int l, cache& k) {
    const std::size_t E = static_cast<std::size_t>(ep_.degree), P = static_cast<std::size_t>(s_.experts) / E;
    k.moe_received_experts = k.moe_sent_experts;
    if (E > 1) {
      cnt_.resize(4 * E * P);  // E P int64 counts sent, then E P received
      auto* d = reinterpret_cast<std::int64_t*>(cnt_.data());
      be_->upload(d, k.moe_sent_experts.data(), std::int64_t(E * P) * 8, *cs_);
      ep_.counts(d, d + E * P, P);  // waited for
      be_->download(k.moe_received_experts.data(), d + E * P, std::int64_t(E * P) * 8, *cs_);
      be_->synchronize(*cs_);
    }
    k.moe_received.assign(E, 0);
    std::vector<std::size_t> at(E * P + 1, 0);  // where sender q's rows for expert e begin among the received rows
    for (std::size_t i = 0; i < E * P; ++i) {
      k.moe_received[i / P] += k.moe_received_experts[i];
      at[i + 1] = at[i] + static_cast<std::size_t>(k.moe_received_experts[i]);
    }
    std::vector<int>& perm = perm_host_[l];
    perm.clear();
    for (std::size_t e = 0; e < P; ++e)
      for (std::size_t q = 0; q < E; ++q)
        for (std::size_t r = at[q * P + e]; r < at[q * P + e + 1]; ++r) perm.push_back(static_cast<int>(r));
    be_->upload(perm_of(k), perm.data(), std::int64_t(perm.size()) * 4, *cs_);
  }
  /// The trainer's dispatch or combine of `width` floats a row: sent[q] rows of `send` to rank q of the expert group,
  /// received[q] rows into `recv` from it (all_to_all_v; at degree 1 a copy to itself). Returns the rows received.
  int exchange(const dbuf& send, const std::vector<std::int64_t>& sent, dbuf& recv,
               const std::vector<std::int64_t>& received, int width) {
    std::vector<std::int64_t> sc, rc;
    std::int64_t rows = 0, out = 0;
    for (std::size_t q = 0; q < sent.size(); ++q) {
      sc.push_back(sent[q] * width), rc.push_back(received[q] * width);
      rows += received[q], out += sent[q];
    }
    if (ep_.degree == 1) {
      ++launch_tally()[launch_names::memcpy];
      FSDP_CUDA_CHECK(cudaMemcpyAsync(recv.data(), send.data(), static_cast<std::size_t>(out) * width * sizeof(float),
                                      cudaMemcpyDeviceToDevice, s()));
    } else {
      ep_.exchange(send.data(), sc, recv.data(), rc);
    }
    return static_cast<int>(rows);
  }
  /// Launches kernel k over `grid` blocks of 256 threads on the compute stream, counted under `name`; at least one
  /// block (an expert may receive no row: its kernels then run over none, and the launches stay step_work's).
  template <class... P, class... A>
  void go(const char* name, long long grid, void (*k)(P...), A&&... a) {
    ++launch_tally()[name];
    k<<<static_cast<unsigned>(std::max(grid, 1LL)), 256, 0, s()>>>(static_cast<P>(a)...);
  }
  /// The matrix product (one cuBLAS call, or the plain kernel), counted.
  template <class... A>
  void product(A&&... a) {
    ++launch_tally()[launch_names::product];
    (*mm_)(std::forward<A>(a)...);
  }

  /// fp32 copy of a gathered parameter, in the scratch buffer `key` (shared by the blocks: stream order).
  template <class Unit>
  const float* weight(const Unit& u, const std::string& name, const std::string& key) {
    const auto v = u.template param<DW>(name);
    dbuf& d = wscratch_[key];
    d.resize(static_cast<std::size_t>(v.numel()));
    go(launch_names::widen, blocks(v.numel()), kernels::widen<DW>, d.data(), v.data(), v.numel());
    check();
    return d.data();
  }
  /// A gathered weight matrix in the compute type, for a GEMM in that type.
  template <class Unit>
  const DW* matrix(const Unit& u, const std::string& name) const {
    return u.template param<DW>(name).data();
  }
  /// Adds the fp32 gradient g into the parameter's gradient buffer, rounded once to the compute type.
  template <class Unit>
  void store(const Unit& u, const std::string& name, const float* g) {
    const auto v = u.template grad<DW>(name);
    go(launch_names::store, blocks(v.numel()), kernels::store<DW>, v.data(), g, v.numel());
  }
  /// b at n floats, its contents left as they are (what a product with beta 0 writes whole).
  static float* sized(dbuf& b, std::size_t n) {
    b.resize(n);
    return b.data();
  }
  float* zeroed(dbuf& b, std::size_t n) {
    b.resize(n);
    ++launch_tally()[launch_names::memset];
    FSDP_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, n * sizeof(float), s()));
    return b.data();
  }
  void copy(dbuf& dst, const dbuf& src) {
    ++launch_tally()[launch_names::memcpy];
    FSDP_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.size() * sizeof(float), cudaMemcpyDeviceToDevice, s()));
  }
  /// x rounded to bf16 in `scratch` (fp32: x itself), the GEMMs' other operand.
  const DW* operand(const float* x, std::size_t n, dbuf& scratch) {
    if constexpr (std::is_same_v<DW, float>) {
      return x;
    } else {
      scratch.grow((n + 1) / 2);  // floats hold two bf16 each
      auto* h = reinterpret_cast<DW*>(scratch.data());
      go(launch_names::narrow, blocks(static_cast<long long>(n)), kernels::narrow<DW>, h, x, static_cast<long long>(n));
      return h;
    }
  }
  /// out[N, O] = x[N, I] w[O, I]^T (+ b): x in the compute type, as the kernels before the products write it; out
  /// in fp32, or in the compute type (Y = DW).
  template <class Y>
  void linear_forward(Y* out, const DW* x, const DW* w, const float* b, int N, int I, int O) {
    product(true, false, O, N, I, 1.0f, w, I, x, I, 0.0f, out, O);
    if (b) go(launch_names::add_bias, blocks(static_cast<long long>(N) * O / 4), kernels::add_bias<Y>, out, b, N, O);
  }
  /// dinp[N, I] = dout[N, O] w[O, I]; dw[O, I] = dout^T x (+= with add_dw); db += the columns of dout. dout in fp32
  /// is rounded to the compute type for the products (one in the compute type is read as it is); dinp is written in
  /// fp32 or in the compute type (Din = DW). dinp and dw (unless add_dw) need no zeroing: beta 0.
  template <class Din, class Dout>
  void linear_backward(Din* dinp, float* dw, float* db, const Dout* dout, const DW* x, const DW* w, int N, int I, int O,
                       bool add_dw = false) {
    static_assert(std::is_same_v<Dout, float> || std::is_same_v<Dout, DW>, "an output gradient in fp32 or DW");
    const DW* dy = nullptr;
    if constexpr (std::is_same_v<Dout, DW>)
      dy = dout;
    else
      dy = operand(dout, static_cast<std::size_t>(N) * O, hout_);
    product(false, false, I, N, O, 1.0f, w, I, dy, O, 0.0f, dinp, I);
    product(false, true, I, O, N, 1.0f, x, I, dy, O, add_dw ? 1.0f : 0.0f, dw, I);
    if (db) column_sum(db, dout, N, O);
  }
  /// db[o] += the sum of dy[n, o] over the N rows (dy in fp32 or DW): 64-row partials, then their sum.
  template <class D>
  void column_sum(float* db, const D* dy, int N, int O) {
    const int K = kernels::column_chunks(N);
    colpart_.grow(static_cast<std::size_t>(K) * 4 * s_.width);  // the widest: the MLP's 4C
    go(launch_names::column_partials, blocks(static_cast<long long>(K) * O / 4), kernels::column_partials<D>,
       colpart_.data(), dy, N, O);
    go(launch_names::column_total, blocks(O), kernels::column_total<>, db, colpart_.data(), K, O);
  }
  /// A norm's output gradient [N, C] in the compute type (tnc_a_, shared by the norms in stream order): written by
  /// the product after it (in the head, chunk by chunk), summed over the tensor group, read by the norm's backward.
  DW* norm_gradient() {
    tnc_a_.resize(act(nc()));
    return as_dw(tnc_a_);
  }
  /// A projection's product [N, C] in the compute type, read by the residual kernel after it: tnc_a_ as well, as
  /// no norm's output gradient lives during a block's forward (a recomputed forward runs between two blocks'
  /// backwards, the head's before them).
  DW* projection() { return norm_gradient(); }
  void layernorm_backward(float* dinp, float* dw, float* db, const DW* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd) {
    const int C = s_.width, K = kernels::column_chunks(N_);
    go(launch_names::layernorm_backward_input, blocks(32LL * N_), kernels::layernorm_backward_input<DW>, dinp, dout,
       inp, w, mean, rstd, N_, C);
    colpart_.grow(static_cast<std::size_t>(K) * 4 * C);  // two partials of C: within column_sum's size
    float *pw = colpart_.data(), *pb = pw + static_cast<std::size_t>(K) * C;
    go(launch_names::layernorm_param_partials, blocks(static_cast<long long>(K) * C / 4),
       kernels::layernorm_param_partials<DW>, pw, pb, dout, inp, mean, rstd, N_, C);
    go(launch_names::column_total, blocks(C), kernels::column_total<>, dw, pw, K, C);
    go(launch_names::column_total, blocks(C), kernels::column_total<>, db, pb, K, C);
  }

  gpt::shape s_;
  int B_, N_, R_;  // sequences, tokens, and the head's rows at a time
  gpt::tp_group tp_;
  gpt::ep_group ep_;   // the expert group (model.expert_comm()): the experts' token exchanges
  gpt::local_dims d_;  // this rank's heads, their channels and its MLP slice (the whole model at tensor degree 1)
  typename ModelT::backend_type* be_;
  typename ModelT::backend_type::stream* cs_;
  std::unique_ptr<gemm> mm_;
  attention::product product_;
  int steps_ = 0;
  std::size_t allocations_ = 0;  // dbuf::allocations() when the second step began
  bool packed_ = false;
  double denominator_ = 1;  // of the loss: this rank's tokens, or the step's loss tokens when packed
  std::vector<int> inputs_, targets_, positions_, mask_, starts_;
  dbuf positions_d_, starts_d_, mask_d_, groups_d_;
  std::vector<int> groups_;  // row_groups of the tokens, then of the positions (kept: the copy may be in flight)
  dbuf tokens_, targets_d_, lnf_, lnf_mean_, lnf_rstd_, logits_, row_loss_, loss_, g_wte_, g_lnfw_, g_lnfb_;
  // backward scratch, reused by every block (tnc_a_ also the forward's projections: projection())
  dbuf g_wpe_, dres1_, rowdots_, t4a_, t4b_, t3nc_, tnc_a_, tnc_b_;
  dbuf hout_, colpart_;  // the products' bf16 output-gradient operand (unused in fp32), column sums' partials
  std::map<std::string, dbuf> wscratch_, gscratch_;
  // a mixture of experts: the step's load-balancing losses (route), the rows sent (and the gradients sent back),
  // the rows come back, the experts' outputs (and their gradients), their pre-activations' gradients, the router's
  // logits' gradient, the router's part of ln_2's output gradient, the exchanged counts, the load-balancing loss's
  // gradient a probability; on the host, a block's probabilities read back and its loss's gradient (kept by block:
  // the upload may be in flight)
  float aux_ = 0;
  dbuf send_, recv_, back_, ey_, dact_, dh_, dlogits_, dtmp_, cnt_, daux_d_;
  std::vector<float> probs_host_;
  std::map<int, std::vector<float>> daux_host_;
  std::map<int, std::vector<int>> perm_host_;
};

/// gpt::train with the CUDA trainer; Policy's backend is CUDA.
template <class Policy, class Before>
gpt::result train(typename Policy::communicator& comm, const gpt::config& c, kernel_choice k, Before&& before) {
  auto make = [k](auto& model, const gpt::shape& s, int batch) {
    return trainer<std::remove_reference_t<decltype(model)>>(model, s, batch, k);
  };
  return gpt::train<Policy>(comm, c, make, before);
}
template <class Policy>
gpt::result train(typename Policy::communicator& comm, const gpt::config& c, kernel_choice k) {
  return gpt_cuda::train<Policy>(comm, c, k, [](auto&) {});  // qualified: not gpt::train by ADL
}

}  // namespace gpt_cuda
