#pragma once
// The CUDA GPT trainer's step as work: every launch the trainer (gpt_cuda.cuh) makes in one training step, by kernel,
// with the floating-point operations of its matrix products and the fewest bytes it must move through device memory
// (each input read once, each output written once, as the kernel is written: compute-type weights and the activations
// and gradients buffer_plan.hpp keeps in the compute type, the rest fp32). Over two measured ceilings, a matrix
// product's rate and a device-to-device copy's, each kernel's larger time is its floor, the time no version of that
// kernel beats; their sum is the step's floor on one stream. 05_gpt_cuda prints the table after a run beside the
// measured step, and checks that the trainer's launches in its last step equal these rows', kernel by kernel (on the
// simulated GPU in CI): the launch counts are the trainer's, checked; the FLOPs and bytes a launch is given are this
// file's arithmetic, unchecked.
// `--floor` prints the table without a GPU. Plain C++.
//
// What the rows leave out, so that the floor stays a floor: FLOPs other than the matrix products' (element-wise and
// row arithmetic runs far under its bytes here), the rows of the embedding tables the gradient touches (data-
// dependent), and of the library's step only its casts into the gathered parameters and AdamW (rows marked
// "library": no launch count, collectives not counted). Attention's products are counted over the causal half of
// whole rows (packed rows of several documents do less), as the kernels compute them: 2 in the forward, 4 in
// backward_key (scores, dP, dV, dK) and 3 in backward_query (scores, dP, dQ). Under tensor parallelism
// (buffer_settings::tensor) the rows are tensor rank 0's: its heads and MLP slice; the trainer's sums over the tensor
// group are collectives, not counted (and in a packed step the other tensor ranks zero their loss before its sum,
// one cudaMemsetAsync more).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/04_gpt_host/gpt_model.hpp"
#include "examples/05_gpt_cuda/buffer_plan.hpp"

namespace gpt_cuda {

/// One kernel's share of a step: its launches, its matrix FLOPs and its bytes, summed over the step.
struct kernel_work {
  std::string name;
  std::size_t launches = 0;
  double flops = 0, bytes = 0;
  bool library = false;  ///< the library's, not the trainer's: not counted by the trainer's launch tally
};

/// The names the trainer counts its launches under (gpt_cuda::trainer's tally): one per kernel, the matrix product
/// (one cuBLAS call, or the plain kernel), and the memory operations it queues.
namespace launch_names {
inline constexpr const char *embed = "embed", *widen = "widen", *narrow = "narrow", *store = "store",
                            *product = "matrix product", *add_bias = "add_bias",
                            *layernorm_forward = "layernorm_forward",
                            *bias_residual_layernorm = "bias_residual_layernorm", *bias_gelu = "bias_gelu",
                            *bias_residual = "bias_residual", *attention_forward = "attention forward",
                            *row_dots = "attention row_dots", *backward_key = "attention backward_key",
                            *backward_query = "attention backward_query", *gelu_backward = "gelu_backward",
                            *layernorm_backward_input = "layernorm_backward_input",
                            *layernorm_param_partials = "layernorm_param_partials",
                            *column_partials = "column_partials", *column_total = "column_total",
                            *cross_entropy = "cross_entropy", *mean_loss = "mean_loss",
                            *grouped_row_sum = "grouped_row_sum", *memset = "cudaMemsetAsync",
                            *memcpy = "cudaMemcpyAsync (device to device)", *route = "experts route",
                            *dispatch = "experts dispatch", *gather_rows = "experts gather_rows",
                            *scatter_rows = "experts scatter_rows", *combine = "experts combine",
                            *choice_gradients = "experts choice_gradients",
                            *gather_input_gradient = "experts gather_input_gradient",
                            *route_backward = "experts route_backward", *add_into = "experts add_into",
                            *add_to_loss = "experts add_to_loss";
}  // namespace launch_names

/// The rows of one step of one rank (`batch` sequences) of `world`, in the order of their first launch. H, A and F:
/// the rank's heads, their channels and its MLP slice (gpt::local; the whole model at tensor degree 1).
inline std::vector<kernel_work> step_work(const gpt::shape& s, int batch, buffer_settings o, int world = 1) {
  namespace n = launch_names;
  const gpt::local_dims ld = gpt::local(s, o.tensor);
  const double B = batch, T = s.context, C = s.width, V = s.vocab, H = ld.heads, A = ld.attention, F = ld.hidden,
               D = A / H, N = B * T, NC = N * C, NA = N * A, NF = N * F, w = o.bf16 ? 2 : 4, f = 4,
               K = (N + 63) / 64;  // K: 64-row partials of a column sum
  std::vector<kernel_work> rows;
  auto add = [&](const char* name, double launches, double flops, double bytes) {
    auto it = std::find_if(rows.begin(), rows.end(), [&](const kernel_work& r) { return r.name == name; });
    if (it == rows.end()) it = rows.insert(rows.end(), kernel_work{name});
    it->launches += static_cast<std::size_t>(launches), it->flops += flops, it->bytes += bytes;
  };
  auto widen = [&](double count) { add(n::widen, 1, 0, count * (w + f)); };
  auto store = [&](double count) { add(n::store, 1, 0, count * (2 * w + f)); };
  auto memset = [&](double floats) { add(n::memset, 1, 0, floats * f); };
  auto narrow = [&](double count) {
    if (o.bf16) add(n::narrow, 1, 0, count * (f + w));
  };
  // out[R, O] = x[R, I] W[O, I]^T (+ bias): x kept in the compute type by the kernel that made it; out in fp32, or
  // in the compute type (y = w: QKV, the MLP's first product and the two projections).
  auto linear_forward = [&](double R, double I, double O, bool bias, double y = 4) {
    add(n::product, 1, 2 * R * I * O, (R * I + O * I) * w + R * O * y);
    if (bias) add(n::add_bias, 1, 0, 2 * R * O * y + O * f);
  };
  auto column_sum = [&](double R, double O, double dy) {
    add(n::column_partials, 1, 0, R * O * dy + K * O * f);
    add(n::column_total, 1, 0, (K * O + 2 * O) * f);
  };
  // dinp[R, I] = dy W; dW[O, I] = dy^T x (+= with add_dw); db += the columns of dy. dy in fp32 (dy = f: rounded
  // first in bf16) or kept in the compute type (dy = w); dinp written in fp32 or in the compute type (dx = w).
  auto linear_backward = [&](double R, double I, double O, bool bias, bool add_dw = false, double dy = 4,
                             double dx = 4) {
    if (dy == f) narrow(R * O);
    add(n::product, 1, 2 * R * I * O, (R * O + O * I) * w + R * I * dx);
    add(n::product, 1, 2 * R * I * O, (R * I + R * O) * w + (add_dw ? 2 : 1) * O * I * f);
    if (bias) column_sum(R, O, dy);
  };
  auto layernorm_forward = [&] { add(n::layernorm_forward, 1, 0, NC * w + (NC + 2 * N + 2 * C) * f); };
  // the output gradient in the compute type (the product before it wrote it so), the input and dinp fp32
  auto layernorm_backward = [&] {
    add(n::layernorm_backward_input, 1, 0, NC * w + (3 * NC + 2 * N + C) * f);
    add(n::layernorm_param_partials, 1, 0, NC * w + (NC + 2 * N + 2 * K * C) * f);
    add(n::column_total, 2, 0, 2 * (K * C + 2 * C) * f);
  };
  const double pairs = B * H * T * (T + 1) / 2, tile_product = 2 * pairs * D;  // one product over the causal half
  // A mixture of experts (experts.cuh and the trainer's products): X experts, P of them this rank's, M = N K
  // choices; the rows the rank's experts receive counted as M, M / P an expert (balanced routing: the data decide),
  // each expert's hidden 4C. At one expert rank the exchanges are device copies; at more, collectives (not counted).
  const double X = s.experts, P = X / o.expert_parallel, M = N * s.top_k, HX = 4 * C, Re = M / P;
  const bool moe = s.experts > 0, self = o.expert_parallel == 1;
  auto exchange = [&](double floats) {
    if (self) add(n::memcpy, 1, 0, 2 * floats * f);
  };
  auto experts_forward = [&] {
    add(n::dispatch, 1, 0, M * C * w + M * f + M * C * f);
    exchange(M * C);
    add(n::gather_rows, 1, 0, M * C * f + M * f + M * C * w);  // the operand in the compute type
    widen(P * HX), widen(P * C);                               // the experts' biases
    for (int e = 0; e < P; ++e) {                              // as the dense MLP's, over the expert's rows
      linear_forward(Re, C, HX, false, w);
      add(n::bias_gelu, 1, 0, 3 * Re * HX * w + HX * f);
      linear_forward(Re, HX, C, true);
    }
    add(n::scatter_rows, 1, 0, 2 * M * C * f + M * f);
    exchange(M * C);
    add(n::scatter_rows, 1, 0, 2 * M * C * f + M * f);  // the outputs in place
    add(n::combine, 1, 0, (2 * NC + M * C + M) * f);
  };
  auto experts_backward = [&] {
    memset(P * HX), memset(P * C);  // the experts' bias gradients, summed by columns
    add(n::choice_gradients, 1, 0, (NC + 2 * M * C + 3 * M) * f);
    exchange(M * C);
    add(n::gather_rows, 1, 0, 2 * M * C * f + M * f);
    for (int e = 0; e < P; ++e) {
      linear_backward(Re, HX, C, true, false, f, w);  // the output gradient in fp32; the GELU output's in W
      add(n::gelu_backward, 1, 0, 3 * Re * HX * w);
      linear_backward(Re, C, HX, true, false, w, f);  // the input gradient in fp32, sent back
    }
    add(n::scatter_rows, 1, 0, 2 * M * C * f + M * f);
    exchange(M * C);
    add(n::gather_input_gradient, 1, 0, (M * C + M + NC) * f);
    for (double g : {P * HX * C, P * HX, P * C * HX, P * C}) store(g);
  };
  auto block_forward = [&] {
    widen(C), widen(C);  // ln_1
    layernorm_forward();
    widen(3 * A);
    linear_forward(N, C, 3 * A, true, w);
    add(n::attention_forward, 1, 2 * tile_product, 4 * NA * w + B * H * T * f);
    linear_forward(N, A, C, false, w);  // the projection's product in the compute type
    widen(C), widen(C), widen(C);       // attn.proj.b, ln_2
    // the product and ln2 in the compute type; the residual, the stream written and the statistics fp32
    add(n::bias_residual_layernorm, 1, 0, 2 * NC * w + (2 * NC + 2 * N + 3 * C) * f);
    if (moe) {  // the router, the residual copied into the output, the experts' unit
      linear_forward(N, C, X, false);
      add(n::route, 1, 0, (2 * N * X + 2 * M) * f);
      add(n::memcpy, 1, 0, 2 * NC * f);
      experts_forward();
      return;
    }
    linear_forward(N, C, F, false, w);
    widen(F);
    add(n::bias_gelu, 1, 0, 3 * NF * w + F * f);
    linear_forward(N, F, C, false, w);
    widen(C);
    add(n::bias_residual, 1, 0, NC * w + (2 * NC + C) * f);
  };
  auto block_backward = [&] {
    if (moe) experts_backward();                        // the experts' unit, before its block
    for (double g : {C, C, 3 * A, C, C, C}) memset(g);  // the gradients summed by columns
    if (!moe) memset(F), memset(C);
    add(n::memcpy, 1, 0, 2 * NC * f);
    if (moe) {  // the router's backward; ln_2's output gradient the experts' part plus the router's
      add(n::route_backward, 1, 0, (2 * N * X + 3 * M + X) * f);
      linear_backward(N, C, X, false, false, f, f);
      add(n::add_into, 1, 0, 2 * NC * f + NC * w);
    } else {
      linear_backward(N, F, C, true, false, f, w);  // the residual gradient in; dfc_gelu out in the compute type
      add(n::gelu_backward, 1, 0, 3 * NF * w);      // x, dfc_gelu and dfc, all in the compute type
      linear_backward(N, C, F, true, false, w, w);  // dfc read as it is; dln2 out in the compute type
    }
    widen(C);  // ln_2.w
    layernorm_backward();
    add(n::memcpy, 1, 0, 2 * NC * f);
    linear_backward(N, A, C, true, false, f, w);  // the residual gradient in; datty out in the compute type
    memset(3 * NA * w / f);                       // dqkv, in the compute type
    add(n::row_dots, 1, 0, 2 * NA * w + B * H * T * f);
    // Q, K, V and dO read and two of dQ, dK, dV written, all in the compute type; lse and dd fp32
    add(n::backward_key, 1, 4 * tile_product, (3 * NA + NA + 2 * NA) * w + 2 * B * H * T * f);
    add(n::backward_query, 1, 3 * tile_product, (3 * NA + NA + 2 * NA) * w + 2 * B * H * T * f);
    linear_backward(N, C, 3 * A, true, false, w, w);  // dqkv read as it is; dln1 out in the compute type
    widen(C);                                         // ln_1.w
    layernorm_backward();
    for (double g : {C, C, 3 * A * C, 3 * A, C * A, C, C, C}) store(g);
    if (moe)
      store(X * C);
    else
      for (double g : {F * C, F, C * F, C}) store(g);
  };
  // The step, in the trainer's order: embed, the blocks, the head, the blocks' backward, the root's.
  add(n::embed, 1, 0, NC * f + 2 * NC * w + 2 * N * f);
  const int L = s.layers;
  for (int l = 0; l < L; ++l) block_forward();
  widen(C), widen(C);  // ln_f
  layernorm_forward();
  const double R = head_rows(s, batch, o.head_rows);
  for (double r0 = 0; r0 < N; r0 += R) {
    const double r = std::min(R, N - r0);
    linear_forward(r, C, V, false);
    add(n::cross_entropy, 1, 0, (2 * r * V + 3 * r) * f);
    linear_backward(r, C, V, false, r0 > 0, f, w);  // dln_f's rows out in the compute type
  }
  add(n::mean_loss, 1, 0, (N + 1) * f);
  if (moe) add(n::add_to_loss, 1, 0, 2 * f);
  memset(NC), memset(C), memset(C);
  layernorm_backward();
  for (int l = 0; l < L; ++l) {
    if (o.checkpoint_activations) block_forward();
    block_backward();
  }
  memset(T * C);
  add(n::grouped_row_sum, 2, 0, 2 * (NC + 3 * N) * f);
  store(V * C), store(T * C), store(C), store(C);
  // The library's step on this rank's shard (mixed precision, AdamW): the cast of the fp32 shard into the gathered
  // compute type, and AdamW's 28 bytes a parameter (p, g, m, v read; p, m, v written).
  const double shard = std::ceil(static_cast<double>(gpt::parameters(s, o.tensor)) / (world / o.tensor));
  rows.push_back({"library: the shard cast into the gather", 0, 0, shard * (f + w), true});
  rows.push_back({"library: AdamW", 0, 0, shard * 28, true});
  return rows;
}

/// The two ceilings the floor is measured against, and where they come from.
struct ceilings {
  double flops_per_s = 0;  ///< a large matrix product's rate in the compute type
  double bytes_per_s = 0;  ///< a large device-to-device copy's, bytes read plus bytes written
  std::string source;
};

/// A kernel's floor: the larger of its FLOPs at the matrix rate and its bytes at the copy rate.
inline double floor_seconds(const kernel_work& k, const ceilings& c) {
  return std::max(k.flops / c.flops_per_s, k.bytes / c.bytes_per_s);
}
/// The step's floor: its kernels' floors, one after another on one stream.
inline double floor_seconds(const std::vector<kernel_work>& rows, const ceilings& c) {
  double t = 0;
  for (const auto& k : rows) t += floor_seconds(k, c);
  return t;
}

/// The table: a line a kernel (launches, GFLOP, GB, the two times, the floor and which bound it), then the step.
inline std::string floor_table(const std::vector<kernel_work>& rows, const ceilings& c) {
  std::string out;
  char line[400];
  std::snprintf(line, sizeof line,
                "the step's floor: %.0f TFLOP/s for matrix products, %.0f GB/s for bytes read and written (%s)\n"
                "  %-42s %8s %10s %10s %10s %10s %10s\n",
                c.flops_per_s / 1e12, c.bytes_per_s / 1e9, c.source.c_str(), "kernel", "launches", "GFLOP", "GB",
                "ms FLOPs", "ms bytes", "floor ms");
  out += line;
  double flops = 0, bytes = 0;
  std::size_t launches = 0;
  for (const auto& k : rows) {
    char count[24] = "-";
    if (!k.library) std::snprintf(count, sizeof count, "%zu", k.launches);
    std::snprintf(line, sizeof line, "  %-42s %8s %10.3f %10.3f %10.3f %10.3f %10.3f\n", k.name.c_str(), count,
                  k.flops / 1e9, k.bytes / 1e9, 1e3 * k.flops / c.flops_per_s, 1e3 * k.bytes / c.bytes_per_s,
                  1e3 * floor_seconds(k, c));
    out += line;
    flops += k.flops, bytes += k.bytes, launches += k.launches;
  }
  std::snprintf(line, sizeof line, "  %-42s %8zu %10.3f %10.3f %10.3f %10.3f %10.3f\n", "the step", launches,
                flops / 1e9, bytes / 1e9, 1e3 * flops / c.flops_per_s, 1e3 * bytes / c.bytes_per_s,
                1e3 * floor_seconds(rows, c));
  return out + line;
}

}  // namespace gpt_cuda
