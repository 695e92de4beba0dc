#pragma once
// The GPT examples' training loop, written once for every backend: each rank's batch, the forward over the units
// (the root unit first, then h.0 .. h.L-1), the head, the backward in reverse with activation checkpointing, the
// optimizer step with the learning-rate schedule, the global loss. The arithmetic is a Trainer's (the host one in
// gpt_host.hpp, the CUDA one in examples/05_gpt_cuda); a Trainer provides
//
//   buffer, cache                              activations ([N, C] floats) and what one block's forward keeps
//   begin_step(inputs, targets)                this rank's tokens of the step
//   begin_packed_step(packed_tokens)           or, with sequence packing, its packed rows (a trainer may lack it)
//   embed(root, x0)                            x0 = wte[tokens] + wpe
//   block_forward(unit, l, x, cache, out)      out = block l (x), keeping what its backward needs
//   head(root, xL, dx)                         final norm, tied head, loss; dx = d loss / d xL; head gradients kept
//   block_backward(unit, l, x, cache, dout, dx)   stores block l's gradients into unit, dx = d loss / d x
//   root_backward(root, dx0)                   stores the embeddings' and the head's gradients into root
//   global_loss(model)                         the mean loss over all ranks (a collective)
//   capturable, reduce_loss(model), read_loss()   optional (the CUDA trainer): its work is all issued on the
//                                              backend's streams, so config::graph may capture its step; the global
//                                              loss's collective inside the step, and its read after
//   bytes(buffer), cache.bytes(), head_bytes() activation bytes it holds
//
// Tensor parallelism (model_options::tensor_parallel = T > 1, make_spec's placements): the ranks of a tensor group
// read the same sequences (the batch is split over the data-parallel ranks), each computes its heads and its slice
// of the MLP, and the trainer sums the row-parallel products in forward and the column-parallel products' input
// gradients in backward over the group (tp_group: Megatron's g and f), on the compute stream.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fsdp/fsdp.hpp>

#include "examples/04_gpt_host/gpt_model.hpp"

namespace gpt {

/// Sequence packing (fsdp::data): documents of varied lengths (gpt::document) packed into rows of the context
/// length, attention kept inside each document, every rank given the same real tokens; global_batch is then the
/// rows of a step.
struct packing_config {
  bool on = false;
  std::int64_t lookahead = 256;     ///< pieces of documents the packer may reorder
  std::size_t depth = 4;            ///< steps packed ahead on the background thread
  fsdp::data::packer_state resume;  ///< where the data starts (its step must be run_steps' first step)
};

/// One rank's packed rows as a trainer takes them, each [rows * T]: the tokens, their targets, their positions
/// within their document, the row position where each token's document (segment) starts (padding: itself), the
/// loss mask; and the loss tokens of the whole step, every rank's (the loss's denominator).
struct packed_tokens {
  std::vector<int> inputs, targets, positions, starts;
  std::vector<std::uint8_t> mask;
  std::int64_t rank_real_tokens = 0, step_real_tokens = 0, step_loss_tokens = 0;
};

/// A usage_error unless `p` holds N tokens in each of its arrays.
inline void check_packed(const packed_tokens& p, int N) {
  const auto n = static_cast<std::size_t>(N);
  if (p.inputs.size() != n || p.targets.size() != n || p.positions.size() != n || p.starts.size() != n ||
      p.mask.size() != n)
    throw fsdp::usage_error("gpt: packed rows of " + std::to_string(p.inputs.size()) + " inputs, " +
                            std::to_string(p.targets.size()) + " targets, " + std::to_string(p.positions.size()) +
                            " positions, " + std::to_string(p.starts.size()) + " starts and " +
                            std::to_string(p.mask.size()) + " mask entries for a trainer of " + std::to_string(N) +
                            " tokens (its rows times the context)");
}

/// The rules both trainers follow. Positions of an unpacked batch of n tokens in rows of T: 0 .. T-1 in each row.
inline std::vector<int> row_positions(std::size_t n, int T) {
  std::vector<int> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<int>(i % static_cast<std::size_t>(T));
  return p;
}
/// What a packed step's loss sum is divided by: the step's loss tokens, every rank's, or 1 for a step without a
/// target (1-token documents only: a loss of 0 and no gradient).
inline double loss_denominator(const packed_tokens& p) {
  return static_cast<double>(std::max<std::int64_t>(1, p.step_loss_tokens));
}
/// How the ranks' losses make the global one: means of equal batches are averaged, packed shares summed.
inline fsdp::reduce_op loss_reduction(bool packed) { return packed ? fsdp::reduce_op::sum : fsdp::reduce_op::avg; }

inline packed_tokens to_tokens(const fsdp::data::rank_batch& b, int T) {
  packed_tokens p;
  for (const fsdp::data::packed_row& r : b.rows) {
    const std::size_t at = p.inputs.size();
    p.inputs.insert(p.inputs.end(), r.tokens.begin(), r.tokens.end());
    p.targets.insert(p.targets.end(), r.targets.begin(), r.targets.end());
    p.positions.insert(p.positions.end(), r.positions.begin(), r.positions.end());
    p.mask.insert(p.mask.end(), r.loss_mask.begin(), r.loss_mask.end());
    p.starts.resize(at + static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t) p.starts[at + static_cast<std::size_t>(t)] = t;  // padding: itself
    for (const fsdp::data::segment& g : r.segments)
      for (int k = 0; k < g.length; ++k) p.starts[at + static_cast<std::size_t>(g.start + k)] = g.start;
  }
  p.rank_real_tokens = b.real_tokens;
  p.step_real_tokens = b.step_real_tokens;
  p.step_loss_tokens = b.step_loss_tokens;
  return p;
}

/// The documents of gpt::document as an fsdp::data source (endless).
struct document_source {
  data_options data;
  std::vector<int> perm;
  int context = 0;
  std::optional<std::vector<fsdp::data::token>> operator()(std::uint64_t i) const {
    return document(data, perm, context, i);
  }
};

struct config {
  shape model{};
  schedule opt{};
  data_options data{};
  int global_batch = 8;       ///< sequences (packed: rows) per step, split evenly over the ranks
  packing_config packing{};
  int steps = 50;
  std::uint64_t seed = 1;     ///< of the initial weights
  bool checkpoint_activations = false;
  bool verbose = false;       ///< rank 0 prints a line per step
  double peak_flops = 0;      ///< the device's peak FLOP/s: with verbose, each line gives the model FLOPs utilisation
  /// Scheduling options (slots, recorder, ...). The root unit, first in forward, stays gathered into its backward by
  /// default (model_options::reshard_after_forward).
  fsdp::model_options options{};
  /// Called on every rank before each phase of each step ("forward", "backward", "optimizer") with the step's
  /// number: where a rank can fail on purpose (04_gpt_host --fail-at). Empty: nothing is called.
  std::function<void(int step, const char* phase)> before;
  /// The step as a captured graph (fsdp::step_graph): the first step eager, the second captured and every step from
  /// the second on a replay, the batch uploaded and the loss read outside it. A trainer whose work is all issued on
  /// the backend's streams (the CUDA one: Trainer::capturable); not with packing, experts or `before`.
  bool graph = false;
};

struct result {
  std::vector<float> losses;  ///< global mean loss per step
  std::vector<double> norms;  ///< global gradient norm per step, before clipping
  std::vector<float> lrs;     ///< learning rate per step
  std::vector<double> step_seconds;  ///< wall time of each step on this rank, through the global loss
  std::vector<std::int64_t> step_tokens;  ///< real tokens of each step, every rank's (packing: padding excluded)
  fsdp::data::packer_state data_state;    ///< packing: where the data stands after the last step
  fsdp::memory_stats memory;  ///< this rank's accounting after training
  fsdp::memory_figures planned;
  /// Bytes of activations the trainer held at the end of the last forward pass (its peak), and how many of them
  /// are kept per block (the block's input under activation checkpointing, its whole cache otherwise).
  std::size_t activation_bytes = 0, activation_bytes_per_block = 0;
  fsdp::collective_stats shard_group;  ///< this rank's collectives (gathers, reductions, the loss average)
  fsdp::collective_stats tensor_group;  ///< its tensor group's (the trainer's sums), with tensor parallelism
  fsdp::collective_stats expert_group;  ///< its expert group's (the trainer's token exchanges), with experts
  double seconds = 0;
  std::map<std::string, std::vector<float>>
      params;  ///< final parameters, whole (with tensor parallelism: this rank's slices)
};

/// What one block's forward keeps for its backward, in a trainer's buffer type (anything with size() in floats).
/// `att` is what attention keeps: the host trainer's [B, heads, T, T] probabilities, the CUDA trainer's [B, heads,
/// T] log-sum-exp of each query row (its backward recomputes the probabilities from it).
/// With experts (shape::experts): the router's probabilities [N, X], each of the N K choices' expert and gate, the
/// choices in the order they were sent (dispatch_order) with the rows each rank and each of its experts was sent and
/// sent back (moe_sent, moe_received: a count a rank; moe_sent_experts, moe_received_experts: a count a rank's
/// expert), the rows this rank's experts received (the host trainer's [R, C + 1]: the input, the local expert; the
/// CUDA trainer's [R, C] in the compute type, sorted by expert), their hidden pre-activations [R, 4C] (and the CUDA
/// trainer's GELU outputs, moe_act), each choice's expert output [N K, C] back in place, and from the experts'
/// backward the ln_2 output's gradient [N, C] and each choice's gate gradient. The CUDA trainer keeps the choices'
/// experts, their order, each one's place in it (moe_where) and the received rows' order by expert on the device too
/// (moe_index: 3 N K ints, and one a row it can receive).
template <class Buffer>
struct block_cache_of {
  Buffer ln1, ln1_mean, ln1_rstd, qkv, att, atty, res1, ln2, ln2_mean, ln2_rstd, fc, fc_gelu;
  Buffer moe_probs, moe_gate, moe_in, moe_h, moe_act, moe_y, moe_dln2, moe_dgate, moe_index;
  std::vector<int> moe_choice, moe_order, moe_where;
  std::vector<std::int64_t> moe_sent, moe_received, moe_sent_experts, moe_received_experts;
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const Buffer* v :
         {&ln1,     &ln1_mean,  &ln1_rstd, &qkv,    &att,   &atty,    &res1,  &ln2,      &ln2_mean,  &ln2_rstd, &fc,
          &fc_gelu, &moe_probs, &moe_gate, &moe_in, &moe_h, &moe_act, &moe_y, &moe_dln2, &moe_dgate, &moe_index})
      n += v->size() * sizeof(float);
    return n;
  }
};

// ---- a mixture of experts' routing bookkeeping, the same for the host and the CUDA trainer --------------------------

/// The order in which a rank sends its N K token choices (`choice`: each one's expert, of degree x per) to the ranks
/// of its expert group, rank q holding experts [q per, (q + 1) per): by expert, so by destination rank and within a
/// rank's rows by its local expert (a receiver finds each expert's rows from the counts alone), each expert's choices
/// in increasing index; by_expert[e] the choices for expert e, sent[q] those for rank q.
inline void dispatch_order(const std::vector<int>& choice, int per, int degree, std::vector<int>& order,
                           std::vector<std::int64_t>& by_expert, std::vector<std::int64_t>& sent) {
  const std::size_t X = static_cast<std::size_t>(degree) * static_cast<std::size_t>(per);
  by_expert.assign(X, 0);
  sent.assign(static_cast<std::size_t>(degree), 0);
  for (int e : choice) {
    ++by_expert[static_cast<std::size_t>(e)];
    ++sent[static_cast<std::size_t>(e / per)];
  }
  std::vector<std::size_t> at(X, 0);  // where each expert's choices begin in the order (a stable counting sort)
  for (std::size_t e = 1; e < X; ++e) at[e] = at[e - 1] + static_cast<std::size_t>(by_expert[e - 1]);
  order.resize(choice.size());
  for (std::size_t a = 0; a < choice.size(); ++a)
    order[at[static_cast<std::size_t>(choice[a])]++] = static_cast<int>(a);
}

/// One block's load-balancing loss (shape::aux_weight, Switch Transformer's): aux_weight X sum_e f_e P_e over the X
/// experts, f_e the share of the rank's N K choices that went to expert e, P_e its mean probability over the N
/// tokens (`probs` [N, X], softmax rows).
inline float load_balance_loss(const float* probs, const std::vector<int>& choice, int N, int X, int K,
                               float aux_weight) {
  std::vector<double> f(static_cast<std::size_t>(X), 0.0), P(static_cast<std::size_t>(X), 0.0);
  for (int c : choice) f[static_cast<std::size_t>(c)] += 1.0;
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < X; ++e) P[static_cast<std::size_t>(e)] += probs[static_cast<std::size_t>(t) * X + e];
  double aux = 0;
  for (int e = 0; e < X; ++e) aux += f[static_cast<std::size_t>(e)] / (N * K) * (P[static_cast<std::size_t>(e)] / N);
  return static_cast<float>(aux_weight * X * aux);
}

/// That loss's gradient with respect to a token's probability of expert e (the same for every token):
/// aux_weight X f_e / N, f_e as above.
inline std::vector<float> load_balance_gradient(const std::vector<int>& choice, int N, int X, int K, float aux_weight) {
  std::vector<float> f(static_cast<std::size_t>(X), 0.0f);
  for (int c : choice) f[static_cast<std::size_t>(c)] += 1.0f;
  const float scale = aux_weight * static_cast<float>(X) / (static_cast<float>(N) * K) / static_cast<float>(N);
  for (float& v : f) v *= scale;
  return f;
}

/// A trainer's tensor group: its degree, this rank's place in it, and the in-place sum of n fp32 or bf16 values (host
/// or device memory, as the model's backend keeps them) over the group, issued on the model's compute stream; at
/// degree 1 there is no sum to make.
struct tp_group {
  int degree = 1, rank = 0;
  std::function<void(void*, std::size_t, fsdp::dtype)> sum;
  void all_reduce(float* v, std::size_t n) const {
    if (degree > 1) sum(v, n, fsdp::dtype::f32);
  }
  /// Values kept in bf16 (the CUDA trainer's projections' products and norms' output gradients), summed as bf16.
  void all_reduce(fsdp::bfloat16* v, std::size_t n) const {
    if (degree > 1) sum(v, n, fsdp::dtype::bf16);
  }
};
/// The model's tensor group (model.tensor_comm()), for a trainer.
template <class ModelT>
tp_group tp_group_of(ModelT& model) {
  const fsdp::device_mesh& mesh = model.mesh();
  tp_group g{mesh.tensor, mesh.tensor_rank(model.comm().rank()), {}};
  if (auto* tc = model.tensor_comm())
    g.sum = [tc, cs = &model.backend().compute_stream()](void* v, std::size_t n, fsdp::dtype t) {
      tc->all_reduce(v, v, static_cast<std::int64_t>(n), t, fsdp::reduce_op::sum, *cs);
    };
  return g;
}
/// A trainer's expert group: its degree, this rank's place in it, and the exchanges of a mixture of experts over it
/// (in the memory the model's backend computes in: the host trainer's host memory, the CUDA trainer's device memory;
/// on the model's compute stream, waited for): `counts(send, recv, n)` sends n counts to each rank and receives n from
/// each, `exchange` sends send_counts[q] fp32 values to rank q and receives recv_counts[q] from it (all_to_all_v). At
/// degree 1 there is no group: the values stay here.
struct ep_group {
  int degree = 1, rank = 0;
  std::function<void(const std::int64_t*, std::int64_t*, std::size_t)> counts;
  std::function<void(const float*, const std::vector<std::int64_t>&, float*, const std::vector<std::int64_t>&)>
      exchange;
};
/// The model's expert group (model.expert_comm()), for a trainer.
template <class ModelT>
ep_group ep_group_of(ModelT& model) {
  const fsdp::device_mesh& mesh = model.mesh();
  ep_group g{mesh.expert, mesh.expert_rank(model.comm().rank()), {}, {}};
  if (auto* ec = model.expert_comm()) {
    auto* be = &model.backend();
    g.counts = [ec, be](const std::int64_t* send, std::int64_t* recv, std::size_t n) {
      ec->all_to_all(send, recv, static_cast<std::int64_t>(n * sizeof(std::int64_t)), fsdp::dtype::i8,
                     be->compute_stream());
      be->synchronize(be->compute_stream());
    };
    g.exchange = [ec, be](const float* send, const std::vector<std::int64_t>& sc, float* recv,
                          const std::vector<std::int64_t>& rc) {
      ec->all_to_all_v(send, sc, recv, rc, fsdp::dtype::f32, be->compute_stream());
      be->synchronize(be->compute_stream());
    };
  }
  return g;
}

/// What a rank gives the global loss's all-reduce over the world (loss_reduction): a tensor group's ranks hold the
/// same loss, so an average over the world is theirs, but a sum of packed shares counts it once, from tensor rank 0.
inline float loss_contribution(float local, bool packed, const tp_group& t) {
  return packed && t.rank != 0 ? 0.0f : local;
}

/// The packer's options for a config: rows of the context length, global_batch rows a step.
inline fsdp::data::packing_options packing_options(const config& c) {
  return {.row_tokens = c.model.context, .rows_per_step = c.global_batch, .lookahead = c.packing.lookahead};
}

/// Sequences per data-parallel rank: the global batch split evenly over the mesh's data-parallel ranks (every rank
/// without tensor parallelism), or a usage_error.
inline int batch_per_rank(const config& c, const fsdp::device_mesh& mesh) {
  const int dp = mesh.data_parallel();
  if (c.global_batch % dp != 0)
    throw fsdp::usage_error("gpt: global batch " + std::to_string(c.global_batch) + " sequences do not split over " +
                            (mesh.tensor == 1
                                 ? std::to_string(dp) + " ranks"
                                 : std::to_string(dp) + " data-parallel ranks (" + std::to_string(mesh.world()) +
                                       " ranks in tensor groups of " + std::to_string(mesh.tensor) + ")"));
  return c.global_batch / dp;
}

/// This rank's sequences of step `step`: inputs and targets [B * T], global samples step * G + rank * B + b.
inline void make_batch(const config& c, const std::vector<int>& perm, int step, int rank, int B,
                       std::vector<int>& inputs, std::vector<int>& targets) {
  const int T = c.model.context;
  inputs.resize(static_cast<std::size_t>(B) * T), targets.resize(inputs.size());
  std::vector<int> seq(static_cast<std::size_t>(T) + 1);
  for (int b = 0; b < B; ++b) {
    const auto g = static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(c.global_batch) +
                   static_cast<std::uint64_t>(rank * B + b);
    sequence(c.data, perm, T, g, seq.data());
    std::copy(seq.begin(), seq.end() - 1, inputs.begin() + static_cast<std::ptrdiff_t>(b) * T);
    std::copy(seq.begin() + 1, seq.end(), targets.begin() + static_cast<std::ptrdiff_t>(b) * T);
  }
}

/// The model train() builds.
/// With sequence packing each rank's loss is its share of the step's mean (its tokens' losses over the step's loss
/// tokens), so the gradients are summed over the ranks, not averaged.
template <class Policy>
fsdp::Model<Policy> make_model(typename Policy::communicator& comm, const config& c) {
  fsdp::model_options o = c.options;
  if (c.packing.on) o.division.how = fsdp::grad_division::mode::sum;
  return fsdp::Model<Policy>(comm, make_spec(c.model, c.seed), wrapping(), fsdp::init::normal{}, o);
}

/// AdamW as GPT-2 trains: decay on the blocks' matrices only (the spec's no_decay flags: biases, norms and both
/// embeddings are not decayed), betas (0.9, 0.95), clipping.
/// AdamW with lr_at's schedule as the optimizer's own (the learning rate at update t computed where the update runs,
/// so a replayed step has its own): lr_at(c.opt, step) at update step + 1, every step updating.
template <class ModelT>
auto make_optimizer(ModelT& model, const config& c) {
  return fsdp::optim::adamw(model, {.lr = c.opt.lr,
                                    .beta1 = c.opt.beta1,
                                    .beta2 = c.opt.beta2,
                                    .eps = c.opt.eps,
                                    .weight_decay = c.opt.weight_decay,
                                    .grad = {.max_norm = c.opt.max_norm},
                                    .schedule = {c.opt.warmup, c.opt.total, c.opt.min_lr_ratio}});
}

/// Whether a unit is a block's experts (gpt::wrapping(): "h.L.experts").
inline bool is_experts(const std::string& unit) {
  return unit.size() > 8 && unit.compare(unit.size() - 8, 8, ".experts") == 0;
}

/// Runs steps [first, first + count) on `model` with `opt` and the trainer `tr` (made for this rank's batch of
/// c.global_batch / data-parallel ranks sequences), appending to `r`. All ranks call it together.
template <class ModelT, class Opt, class Trainer>
void run_steps(ModelT& model, Opt& opt, Trainer& tr, const config& c, int first, int count, result& r) {
  const fsdp::device_mesh& mesh = model.mesh();
  const int world = mesh.data_parallel(), rank = mesh.data_parallel_rank(model.comm().rank());
  const int B = batch_per_rank(c, mesh), L = c.model.layers;
  validate(c.model, mesh.tensor);
  constexpr bool trainer_has_experts = requires { Trainer::supports_experts; };
  if (c.model.experts > 0) {
    if (!trainer_has_experts)
      throw fsdp::usage_error("gpt: this trainer has no mixture of experts; train it with shape::experts = 0");
    if (c.checkpoint_activations || c.packing.on)
      throw fsdp::usage_error("gpt: the experts run without activation checkpointing and sequence packing");
  }
  constexpr bool capturable = requires { Trainer::capturable; };
  if (c.graph) {
    if (!capturable)
      throw fsdp::usage_error(
          "gpt: this trainer computes on the host, outside the backend's streams, so its step "
          "cannot be captured; train it without graph");
    if (c.packing.on)
      throw fsdp::usage_error(
          "gpt: a captured step cannot take packed rows (each step's documents change its loss's "
          "denominator, which the graph would keep); train with graph or with packing");
    if (c.before)
      throw fsdp::usage_error(
          "gpt: `before` runs on the host between a step's phases, which a replayed step does not "
          "stop for; train with graph or with before");
    if (c.model.experts > 0)
      throw fsdp::usage_error(
          "gpt: a block's experts read its routing back to the host (the token exchange's counts are the "
          "collective's host arguments), which a replayed step does not stop for; train with graph or with experts");
  }
  const std::vector<int> perm = permutation(c.data, c.model.vocab);
  using buffer = typename Trainer::buffer;
  using cache = typename Trainer::cache;
  std::vector<int> inputs, targets;
  std::optional<fsdp::data::async_packer<document_source>> packer;
  if (c.packing.on) {
    if (model.options().division.how != fsdp::grad_division::mode::sum)
      throw fsdp::usage_error("gpt: sequence packing divides each rank's loss by the step's loss tokens, so the "
                              "gradients must be summed over ranks: build the model with gpt::make_model, or with "
                              "model_options::division.how = grad_division::mode::sum");
    if (c.packing.resume.step != static_cast<std::uint64_t>(first))
      throw fsdp::usage_error("gpt: the packing state resumes at step " + std::to_string(c.packing.resume.step) +
                              " and the run starts at step " + std::to_string(first));
    packer.emplace(packing_options(c), document_source{c.data, perm, c.model.context}, world, rank, c.packing.depth,
                   c.packing.resume);
  }
  std::vector<buffer> xs(static_cast<std::size_t>(L) + 1);  // block inputs, and x_L
  std::vector<cache> caches(c.checkpoint_activations ? 1 : static_cast<std::size_t>(L));
  buffer dx, dnext, recomputed;
  // What a step issues on the streams, from the forward through the optimizer (and, for a capturable trainer, the
  // loss's all-reduce): run eagerly, or captured once and replayed (c.graph).
  auto issue = [&](int step) {
    typename ModelT::unit_type* root = nullptr;
    int l = 0;  // blocks done
    if (c.before) c.before(step, "forward");
    for (auto& unit : model.forward()) {  // the root unit, then h.0 .. h.L-1
      if (!root) {
        if (unit.name() != "root")
          throw fsdp::usage_error("gpt: the first unit of forward is '" + unit.name() +
                                  "', not 'root': the embeddings must come first (keep gpt::wrapping() and the "
                                  "wrapping order)");
        root = &unit;
        tr.embed(unit, xs[0]);
        continue;
      }
      if (is_experts(unit.name())) {  // the block just run's experts: its MLP's output added into its output
        if constexpr (trainer_has_experts)
          tr.experts_forward(unit, l - 1, caches[static_cast<std::size_t>(l - 1)], xs[static_cast<std::size_t>(l)]);
        continue;
      }
      cache& k = caches[c.checkpoint_activations ? 0 : static_cast<std::size_t>(l)];
      tr.block_forward(unit, l, xs[static_cast<std::size_t>(l)], k, xs[static_cast<std::size_t>(l) + 1]);
      ++l;
    }
    if (l != L)
      throw fsdp::usage_error("gpt: forward passed " + std::to_string(l) + " block units for " + std::to_string(L) +
                              " layers (keep gpt::wrapping(): one unit per block, the rest in 'root')");
    tr.head(*root, xs[static_cast<std::size_t>(L)], dx);
    std::size_t kept = tr.head_bytes();
    for (const auto& x : xs) kept += Trainer::bytes(x);
    for (const auto& k : caches) kept += k.bytes();
    r.activation_bytes = std::max(r.activation_bytes, kept);
    r.activation_bytes_per_block = Trainer::bytes(xs[0]) + (c.checkpoint_activations ? 0 : caches[0].bytes());
    if (c.before) c.before(step, "backward");
    for (auto& unit : model.backward()) {  // h.L-1 .. h.0, then the root unit
      if (l == 0) {
        if (&unit != root)
          throw fsdp::usage_error("gpt: the last unit of backward is '" + unit.name() + "', not 'root'");
        tr.root_backward(unit, dx);
        continue;
      }
      if (is_experts(unit.name())) {  // before its block: the experts' gradients, and the block's MLP input gradient
        if constexpr (trainer_has_experts)
          tr.experts_backward(unit, l - 1, caches[static_cast<std::size_t>(l - 1)], dx);
        continue;
      }
      const int b = --l;
      const auto& x = xs[static_cast<std::size_t>(b)];
      if (c.checkpoint_activations) tr.block_forward(unit, b, x, caches[0], recomputed);  // same code, same bits
      tr.block_backward(unit, b, x, caches[c.checkpoint_activations ? 0 : static_cast<std::size_t>(b)], dx, dnext);
      std::swap(dx, dnext);
    }
    if (c.before) c.before(step, "optimizer");
    fsdp::grad::step_report stepped = opt.step();  // decided on the device: nothing waits here
    opt.zero_grad();
    if constexpr (capturable) tr.reduce_loss(model);
    return stepped;
  };
  std::optional<fsdp::step_graph<ModelT, Opt>> graph;  // c.graph, from the second step on
  for (int step = first; step < first + count; ++step) {
    const auto ts = std::chrono::steady_clock::now();
    const float lr = lr_at(c.opt, step);  // the optimizer's schedule at this update (make_optimizer): reported
    std::int64_t tokens = static_cast<std::int64_t>(c.global_batch) * c.model.context;
    if (packer) {
      if constexpr (requires(packed_tokens p) { tr.begin_packed_step(p); }) {
        const std::optional<fsdp::data::rank_batch> b = packer->next();
        if (!b) throw fsdp::usage_error("gpt: the document source ended at step " + std::to_string(step));
        const packed_tokens p = to_tokens(*b, c.model.context);
        tr.begin_packed_step(p);
        tokens = p.step_real_tokens;
      } else {
        throw fsdp::usage_error(
            "gpt: this trainer takes no packed rows (it has no begin_packed_step); train it "
            "without sequence packing");
      }
    } else {
      make_batch(c, perm, step, rank, B, inputs, targets);
      tr.begin_step(inputs, targets);
    }
    const fsdp::grad::step_report stepped = [&] {  // an eager step's report, or a replay's (its device's decision)
      if (!c.graph || step == first) return issue(step);
      if (!graph) graph.emplace(model, opt, [&] { (void)issue(step); });  // captured, not run: replayed below
      return graph->replay();
    }();
    // The loss read back: the step's report (an eager step's or a replay's) has arrived with it.
    if constexpr (capturable)
      r.losses.push_back(tr.read_loss());
    else
      r.losses.push_back(tr.global_loss(model));
    const double norm = stepped.get().norm;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    r.step_seconds.push_back(s);
    r.step_tokens.push_back(tokens);
    r.norms.push_back(norm);
    r.lrs.push_back(lr);
    if (c.verbose && model.comm().rank() == 0) {
      std::printf("step %3d  loss %.6f  lr %.3e  norm %.4f  %.3f s  %.0f tokens/s", step, r.losses.back(), lr, norm, s,
                  static_cast<double>(tokens) / s);
      if (c.peak_flops > 0)
        std::printf("  MFU %.1f%%",
                    100.0 * flops_per_token(c.model) * static_cast<double>(tokens) / s / c.peak_flops);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (packer) r.data_state = packer->state();
}

/// Mean step time after `warmup` steps (all steps when there are no more), tokens per second and model FLOPs
/// utilisation (0 without c.peak_flops).
struct throughput {
  double step_s = 0, tokens_per_s = 0, mfu = 0;
  int first = 0, steps = 0;  ///< the steps averaged: [first, first + steps)
};
inline throughput mean_throughput(const config& c, const result& r, int warmup = 2) {
  throughput t;
  const int n = static_cast<int>(r.step_seconds.size());
  t.first = n > warmup ? warmup : 0;
  t.steps = n - t.first;
  double tokens = 0;
  for (int i = t.first; i < n; ++i) {
    t.step_s += r.step_seconds[static_cast<std::size_t>(i)];
    tokens += static_cast<double>(r.step_tokens[static_cast<std::size_t>(i)]);
  }
  if (t.steps == 0 || !(t.step_s > 0)) return t;
  t.tokens_per_s = tokens / t.step_s;
  t.step_s /= t.steps;
  if (c.peak_flops > 0) t.mfu = flops_per_token(c.model) * t.tokens_per_s / c.peak_flops;
  return t;
}

/// Builds the model, its optimizer and (with make_trainer(model, shape, batch per rank)) the trainer, trains
/// c.steps steps and returns what happened on this rank. `before` sees the model before the first step (to export
/// the initial weights, for instance).
template <class B, class C, class T, class MakeTrainer>
result train_model(fsdp::basic_model<B, C, T>& model, const config& c, MakeTrainer& make_trainer,
                   const std::function<void()>& before);

template <class Policy, class MakeTrainer, class Before>
result train(typename Policy::communicator& comm, const config& c, MakeTrainer&& make_trainer, Before&& before) {
  auto model = make_model<Policy>(comm, c);
  return train_model(model, c, make_trainer, [&] { before(model); });
}

/// train()'s work once the model is built, over fsdp::basic_model (what a Model<P> is to its trainer's loop: its
/// backend, communicator and compute dtype, without the rest of its policy), so that it compiles once per compute
/// dtype, not once per policy. `before` runs once the optimizer and the trainer are made.
template <class B, class C, class T, class MakeTrainer>
result train_model(fsdp::basic_model<B, C, T>& model, const config& c, MakeTrainer& make_trainer,
                   const std::function<void()>& before) {
  auto opt = make_optimizer(model, c);
  auto tr = make_trainer(model, c.model, batch_per_rank(c, model.mesh()));
  before();
  result r;
  r.planned = fsdp::plan_memory(model, opt).peak;
  const auto t0 = std::chrono::steady_clock::now();
  run_steps(model, opt, tr, c, 0, c.steps, r);
  model.synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.memory = model.memory();
  r.shard_group = model.shard_comm().stats();
  if (auto* tc = model.tensor_comm()) r.tensor_group = tc->stats();
  if (auto* ec = model.expert_comm()) r.expert_group = ec->stats();
  r.params = fsdp::weights::gather_full_params(model);
  return r;
}

}  // namespace gpt
