#pragma once
// The CUDA GPT trainer's own device memory, planned: every buffer it and the training loop (gpt_loop.hpp) hold after
// the first step, by name and size, for a shape, a batch per rank and the trainer's settings. The trainer allocates
// each buffer in its first step at the size it keeps (a later allocation is an error: gpt_cuda::trainer), so its
// peak is the sum of these rows; 05_gpt_cuda prints the table before step 1 and checks the measured peak against it
// at the end (on the simulated GPU in CI, where they must be equal to the byte). Plain C++: no GPU needed to plan.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/04_gpt_host/gpt_model.hpp"

namespace gpt_cuda {

/// One buffer: its name, how many there are, and the floats of each.
struct planned_buffer {
  std::string name;
  std::size_t count, floats;
  std::size_t bytes() const { return count * floats * sizeof(float); }
};

/// Rows of the classifier and cross-entropy at a time: `requested` when positive, else the rows whose fp32 logits fit
/// in 256 MiB; at least 1, at most the batch's tokens. The logits of one chunk are made, turned into their gradient in
/// place and used for the head's backward products before the next chunk's (never the whole batch's [N, V] at once).
inline int head_rows(const gpt::shape& s, int batch, int requested) {
  const long long tokens = static_cast<long long>(batch) * s.context;
  const long long r = requested > 0 ? requested : (256LL << 20) / (4LL * s.vocab);
  return static_cast<int>(std::clamp<long long>(r, 1, tokens));
}

/// What shapes the trainer's buffers besides the model's shape and the batch.
struct buffer_settings {
  bool bf16 = true;                     ///< bf16 compute: the GEMMs' operands are rounded into scratch buffers
  bool checkpoint_activations = false;  ///< one block cache and a recomputed output instead of a cache per block
  bool packed = false;                  ///< packed rows: document starts and the loss mask on the device
  int head_rows = 0;                    ///< the classifier's rows at a time as asked (head_rows())
  int tensor = 1;                       ///< tensor-parallel degree: the rank's heads and MLP slice (gpt::local)
  int expert_parallel = 1;              ///< the expert group's ranks, with gpt::shape::experts (the rank's experts)
};

/// The rows, in the order the table prints them. N = batch * T tokens, C the width, V the vocabulary; under tensor
/// parallelism H the rank's heads, A their channels (C / tensor) and F its slice of the MLP (4 C / tensor).
inline std::vector<planned_buffer> buffer_plan(const gpt::shape& s, int batch, buffer_settings o) {
  const gpt::local_dims d = gpt::local(s, o.tensor);
  const std::size_t B = std::size_t(batch), T = std::size_t(s.context), C = std::size_t(s.width),
                    V = std::size_t(s.vocab), H = std::size_t(d.heads), L = std::size_t(s.layers),
                    A = std::size_t(d.attention), F = std::size_t(d.hidden);
  const std::size_t N = B * T, NC = N * C, NA = N * A, NF = N * F, K = (N + 63) / 64;  // K: 64-row partials
  const std::size_t R = std::size_t(head_rows(s, batch, o.head_rows));
  const auto half = [](std::size_t n) { return (n + 1) / 2; };           // bf16 elements, two to a float
  const auto act = [&](std::size_t n) { return o.bf16 ? half(n) : n; };  // activations kept in the compute type
  // A mixture of experts (the CUDA trainer's): X experts, P of them this rank's, M = N K choices, at most E M rows
  // received (dropless), each expert's hidden 4C; the experts' column sums over as many rows.
  const std::size_t X = std::size_t(s.experts), E = std::size_t(o.expert_parallel), P = X / E,
                    M = N * std::size_t(s.top_k), most = E * M, HX = 4 * C;
  const bool moe = X > 0;
  const std::size_t partials = moe ? std::max(K, (most + 63) / 64) : K;
  // gpt::block_cache_of (see "block cache" below): res1 in fp32; ln1, qkv, atty, ln2, fc, fc_gelu in the compute type;
  // with experts no fc, fc_gelu, but the router's probabilities, the choices' gates, their experts, order and places,
  // the received rows' order by expert, the rows received (in the compute type, by expert), their pre-activations
  // and GELU outputs (the compute type), each choice's expert output, ln_2's output gradient from the experts and the
  // gates' gradients
  const std::size_t cache =
      NC + 2 * act(NC) + act(NA) + act(3 * NA) + 4 * N + B * H * T +
      (moe ? N * X + M + 3 * M + most + act(most * C) + 2 * act(most * HX) + M * C + NC + M : 2 * act(NF));
  std::vector<planned_buffer> p = {
      {"block inputs x_0 .. x_L [N, C]", L + 1, NC},
      {o.tensor == 1 ? "block cache (res1: NC fp32; ln1, qkv, attention out, ln2, fc, fc_gelu: 14 NC in the compute "
                       "type; 4 row statistics; row log-sum-exp)"
                     : "block cache (res1: NC fp32; ln1, ln2: 2 NC, qkv, attention out: 4 NA, fc, fc_gelu: 2 NF in "
                       "the compute type; 4 row statistics; row log-sum-exp of the rank's heads)",
       o.checkpoint_activations ? 1 : L, cache},
      {"recomputed block output (checkpointing) [N, C]", o.checkpoint_activations ? 1u : 0u, NC},
      {"gradient of the block input and of the next [N, C]", 2, NC},
      {"tokens, targets, positions [N]", 3, N},
      {"row groups of the tokens and of the positions, for the embeddings' gradients [3N + 1] ints", 2, 3 * N + 1},
      {"document starts, loss mask [N] (packed rows)", o.packed ? 2u : 0u, N},
      {"final layernorm output [N, C] in the compute type", 1, act(NC)},
      {"final layernorm mean, rstd [N]", 2, N},
      {"logits of a chunk of rows, then their gradient in place [head rows, V]", 1, R * V},
      {"row losses [N]", 1, N},
      {"loss", 1, 1},
      {"wte gradient (fp32) [V, C]", 1, V * C},
      {"ln_f weight and bias gradients [C]", 2, C},
      {"wpe gradient (fp32) [T, C]", 1, T * C},
      {"backward scratch: residual gradient [N, C]", 1, NC},
      {"scratch: a projection's product, then a norm's output gradient (dln2, dln1, dln_f) [N, C] in the compute type",
       1, act(NC)},
      {"backward scratch: datty [N, A] in the compute type", 1, act(NA)},
      {"backward scratch: dfc_gelu, dfc [N, F] in the compute type", moe ? 0u : 2u, act(NF)},
      {"backward scratch: dqkv [N, 3A] in the compute type", 1, act(3 * NA)},
      {"attention backward: dO . O per row [B, heads, T]", 1, B * H * T},
      {moe ? "column-sum partials [ceil(E N K / 64), 4C]" : "column-sum partials [ceil(N / 64), 4C]", 1,
       partials * 4 * C},
      // The GEMMs' bf16 output-gradient operand, for the fp32 output gradients: the wider of a chunk's logits', head
      // rows x V, and a projection's N x C (the MLP's and attention's inner gradients are kept in bf16), two bf16 to
      // a float; fp32 GEMMs take the fp32 buffers themselves (their inputs are kept in bf16 already).
      // (with experts also the router logits' gradient, N x X, and the most rows the experts can receive, E N K x C)
      {"bf16 GEMM output-gradient operand", o.bf16 ? 1u : 0u,
       std::max({half(R * V), half(NC), moe ? half(N * X) : 0, moe ? half(most * C) : 0})},
      // fp32 copies of the gathered small parameters, one per name (shared by the blocks in stream order): the norms'
      // 6 C, the projections' biases 2 C, the QKV bias 3 A and the MLP's F (15 C without tensor parallelism; with
      // experts 10 C and the rank's experts' biases, P 5 C).
      {"fp32 copies: ln_1, ln_2, ln_f weights and biases, the linear biases", 1,
       moe ? 7 * C + 3 * A + P * (HX + C) : 8 * C + 3 * A + F},
      // fp32 gradient sums of one block's parameters, stored once into the compute-type gradient buffers.
      {moe ? "fp32 block gradient sums [4 C^2 + 8 C + the router's X C + the rank's experts' P (8 C^2 + 5 C)]"
           : "fp32 block gradient sums [12 C^2 + 13 C at one tensor rank]",
       1,
       moe ? 4 * A * C + 5 * C + 3 * A + X * C + P * (2 * HX * C + HX + C) : 4 * A * C + 2 * F * C + 6 * C + 3 * A + F},
  };
  if (moe) {
    p[1].name =
        "block cache (res1: NC fp32; ln1, qkv, attention out, ln2: 6 NC in the compute type; 4 row statistics; "
        "row log-sum-exp; the router's and the experts': N X + 5 N K + E N K + N K C + N C fp32, E N K 9 C in the "
        "compute type)";
    const std::vector<planned_buffer> experts = {
        {"experts: rows sent, then their outputs or input gradients sent back [max(N K, E N K), C]", 1,
         std::max(M, most) * C},
        {"experts: rows received, then the experts' input gradients [E N K, C]", 1, most * C},
        {"experts: rows come back [N K, C]", 1, M * C},
        {"experts: the received rows' outputs, then their gradients, in the experts' order [E N K, C]", 1, most * C},
        {"experts: the GELU outputs' and pre-activations' gradients [E N K, 4C] in the compute type", 2,
         act(most * HX)},
        {"experts: the router logits' gradient [N, X]", 1, N * X},
        {"experts: the router's part of ln_2's output gradient [N, C]", 1, NC},
        {"experts: the exchanged counts, 2 E P int64", E > 1 ? 1u : 0u, 4 * E * P},
        {"experts: the load-balancing loss's gradient [X]", 1, X},
    };
    p.insert(p.end(), experts.begin(), experts.end());
  }
  return p;
}

inline std::size_t total_bytes(const std::vector<planned_buffer>& p) {
  std::size_t n = 0;
  for (const auto& b : p) n += b.bytes();
  return n;
}

/// The table: one line a buffer (count x size), and the total.
inline std::string buffer_table(const std::vector<planned_buffer>& p) {
  std::string out;
  char line[320];
  for (const auto& b : p) {
    if (b.count == 0) continue;
    std::snprintf(line, sizeof line, "  %10.3f MiB  %3zu x %12zu floats  %s\n", b.bytes() / 1048576.0, b.count,
                  b.floats, b.name.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %10.3f MiB  in all (%zu bytes)\n", total_bytes(p) / 1048576.0, total_bytes(p));
  return out + line;
}

}  // namespace gpt_cuda
