#pragma once
// The GPT-2-style model of the GPT examples, apart from any backend: its configuration, parameter names and
// shapes (the ModelSpec), its wrapping (one FSDP unit per block, the rest in the root unit), the generated data,
// the learning-rate schedule, the AdamW decay rule and the FLOP count. The host trainer (gpt_host.hpp) and the
// PyTorch peer (bench/peer/gpt_fsdp2.py) implement this same description; the peer's copy of the data generator
// and the schedule must stay bit-identical to this one (tests/gpt compares them through the program's output).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <fsdp/fsdp.hpp>

namespace gpt {

/// Architecture, data and optimisation settings. Every rank must use the same values.
struct shape {
  int vocab = 64;    ///< tokens 0 .. vocab-1
  int context = 32;  ///< sequence length T
  int width = 64;    ///< channels C
  int heads = 4;     ///< C % heads == 0
  int layers = 4;    ///< blocks, one FSDP unit each
  /// A mixture of experts in place of each block's MLP (0: none): `experts` MLPs of the same shape, a router [experts,
  /// C] choosing `top_k` of them a token (their softmax probabilities renormalised over the chosen as the gates),
  /// dropless, with a load-balancing loss (aux_weight x experts x sum_i f_i P_i, Switch Transformer's: f_i the share
  /// of the rank's token choices that went to expert i, P_i its mean probability). The experts are a unit of their
  /// own a block (h.L.experts), split over model_options::expert_parallel ranks.
  int experts = 0;
  int top_k = 2;
  float aux_weight = 0.01f;
};

struct schedule {
  float lr = 3e-3f;            ///< peak learning rate
  float min_lr_ratio = 0.1f;   ///< the cosine ends at lr * min_lr_ratio
  int warmup = 5;              ///< linear warm-up steps
  int total = 50;              ///< steps of the cosine (the run's length)
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;   ///< matrices only: biases, norms and embeddings are not decayed
  float max_norm = 1.0f;       ///< global gradient-norm clipping (0: none)
};

struct data_options {
  std::uint64_t seed = 1234;
  /// Each next token is the permutation's image of the current one with this probability, a uniform draw
  /// otherwise: every token is equally frequent (entropy ln(vocab)), but the next one is predictable.
  double follow = 0.75;
};

/// Throws fsdp::usage_error naming the first setting that cannot work (`tensor`: the degree of tensor parallelism,
/// model_options::tensor_parallel, which splits the heads and the MLP's hidden dimension).
inline void validate(const shape& s, int tensor = 1) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw fsdp::usage_error("gpt: " + what);
  };
  need(s.vocab >= 2, "vocab must be at least 2, got " + std::to_string(s.vocab));
  need(s.context >= 1, "context must be positive, got " + std::to_string(s.context));
  need(s.heads >= 1 && s.width >= 1 && s.width % s.heads == 0,
       "width " + std::to_string(s.width) + " must be a positive multiple of heads " + std::to_string(s.heads));
  need(s.layers >= 1, "layers must be positive, got " + std::to_string(s.layers));
  need(tensor >= 1 && s.heads % tensor == 0, std::to_string(s.heads) + " heads do not split over tensor groups of " +
                                                 std::to_string(tensor) + " ranks (each takes whole heads)");
  need(s.experts >= 0, "experts must not be negative, got " + std::to_string(s.experts));
  need(s.experts == 0 || (s.top_k >= 1 && s.top_k <= s.experts),
       "top_k must be between 1 and the " + std::to_string(s.experts) + " experts, got " + std::to_string(s.top_k));
  need(s.experts == 0 || tensor == 1, "the examples' experts do not split over tensor groups (tensor_parallel " +
                                          std::to_string(tensor) + "): use expert_parallel instead");
}

/// What one tensor rank computes with under Megatron-style tensor parallelism of degree `tensor` (1: the whole
/// model): its heads, their channels (the attention projection's input) and its slice of the MLP's hidden
/// dimension. validate(s, tensor) first.
struct local_dims {
  int heads, attention, hidden;
};
inline local_dims local(const shape& s, int tensor) {
  return {s.heads / tensor, s.width / tensor, 4 * s.width / tensor};
}

// ---- names: GPT-2's, with nn.Linear's [out, in] weights -------------------------------------------------------
inline std::string block(int l) { return "h." + std::to_string(l); }
inline std::string pname(int l, const char* leaf) { return block(l) + "." + leaf; }

/// wte [V, C], wpe [T, C], per block h.L.{ln_1, attn.qkv, attn.proj, ln_2, mlp.fc, mlp.proj}.{w, b}, ln_f.{w, b}
/// and lm_head.w tied to wte. GPT-2's initialisation: N(0, 0.02) for the blocks' matrices and wte, N(0, 0.01) for
/// wpe, N(0, 0.02 / sqrt(2 L)) for the projections into the residual stream, zeros for biases, ones for norm gains.
/// Placed for tensor parallelism as Megatron-LM splits a block (used when model_options::tensor_parallel > 1): the
/// fused [q; k; v] projection column-parallel, each of q, k and v split on its output rows (tp::split(0, 3): a
/// tensor rank's heads), the MLP's first product column-parallel (tp::split(0)), both projections into the residual
/// stream row-parallel (tp::split(1)) with their biases replicated (added once, after the sum over the group);
/// embeddings and norms replicated.
inline fsdp::ModelSpec make_spec(const shape& s, std::uint64_t seed) {
  validate(s);
  const std::int64_t V = s.vocab, T = s.context, C = s.width;
  const float resid_std = 0.02f / std::sqrt(2.0f * static_cast<float>(s.layers));
  const fsdp::param_flags no_decay{.no_decay = true};
  const fsdp::tensor_placement column = fsdp::tp::split(0), qkv = fsdp::tp::split(0, 3), row = fsdp::tp::split(1);
  auto normal = [&](float std, fsdp::tensor_placement t) {
    return fsdp::param_options{.init = fsdp::init::normal{std, seed}, .tensor = t};
  };
  auto flat = [&](fsdp::init::rule r, fsdp::tensor_placement t = fsdp::tp::replicated) {
    return fsdp::param_options{.flags = no_decay, .init = r, .tensor = t};
  };
  fsdp::ModelSpec spec;
  spec.add("wte", {V, C}, flat(fsdp::init::normal{0.02f, seed}));
  spec.add("wpe", {T, C}, flat(fsdp::init::normal{0.01f, seed}));
  const std::int64_t X = s.experts;
  for (int l = 0; l < s.layers; ++l) {
    spec.add(pname(l, "ln_1.w"), {C}, flat(fsdp::init::ones));
    spec.add(pname(l, "ln_1.b"), {C}, flat(fsdp::init::zeros));
    spec.add(pname(l, "attn.qkv.w"), {3 * C, C}, normal(0.02f, qkv));
    spec.add(pname(l, "attn.qkv.b"), {3 * C}, flat(fsdp::init::zeros, qkv));
    spec.add(pname(l, "attn.proj.w"), {C, C}, normal(resid_std, row));
    spec.add(pname(l, "attn.proj.b"), {C}, flat(fsdp::init::zeros));
    spec.add(pname(l, "ln_2.w"), {C}, flat(fsdp::init::ones));
    spec.add(pname(l, "ln_2.b"), {C}, flat(fsdp::init::zeros));
    if (X == 0) {
      spec.add(pname(l, "mlp.fc.w"), {4 * C, C}, normal(0.02f, column));
      spec.add(pname(l, "mlp.fc.b"), {4 * C}, flat(fsdp::init::zeros, column));
      spec.add(pname(l, "mlp.proj.w"), {C, 4 * C}, normal(resid_std, row));
      spec.add(pname(l, "mlp.proj.b"), {C}, flat(fsdp::init::zeros));
      continue;
    }
    // the router in the block's unit; the experts, stacked, in h.L.experts (wrapping(): wrap::experts_apart)
    spec.add(pname(l, "mlp.router.w"), {X, C}, normal(0.02f, fsdp::tp::replicated));
    auto expert = [](fsdp::param_options o) {
      o.experts = true;
      return o;
    };
    spec.add(pname(l, "moe.fc.w"), {X, 4 * C, C}, expert(normal(0.02f, fsdp::tp::replicated)));
    spec.add(pname(l, "moe.fc.b"), {X, 4 * C}, expert(flat(fsdp::init::zeros)));
    spec.add(pname(l, "moe.proj.w"), {X, C, 4 * C}, expert(normal(resid_std, fsdp::tp::replicated)));
    spec.add(pname(l, "moe.proj.b"), {X, C}, expert(flat(fsdp::init::zeros)));
  }
  spec.add("ln_f.w", {C}, flat(fsdp::init::ones));
  spec.add("ln_f.b", {C}, flat(fsdp::init::zeros));
  spec.tie("lm_head.w", "wte");
  return spec;
}

/// One unit per block (h.0 .. h.L-1), with experts a block's experts one more (h.L.experts, after it); wte, wpe, ln_f
/// and the tied head form the root unit, first in the wrapping order (so first in forward, last in backward).
inline fsdp::wrap::experts_apart<fsdp::wrap::by_prefix> wrapping() { return {fsdp::wrap::by_prefix{"h."}}; }

/// Parameters of the model (the tie counted once).
inline std::int64_t parameters(const shape& s) { return make_spec(s, 0).numel(); }
/// Parameters one rank of a tensor group of `tensor` holds: its slices of the split ones and the replicated ones.
inline std::int64_t parameters(const shape& s, int tensor) {
  validate(s, tensor);
  fsdp::problems p;
  const fsdp::ModelSpec local = make_spec(s, 0).tensor_local(tensor, p);
  p.require();
  return local.numel();
}

/// Model FLOPs per token of a training step (forward and backward), as the PaLM appendix counts them for MFU: 6 per
/// matrix parameter (the blocks' 12 C^2 per layer, with experts 4 C^2, the router's X C and a token's top_k experts'
/// 8 C^2 each; the tied head's V C; the embeddings' lookups are not FLOPs)
/// plus 12 L T C for attention's two products (the causal mask's skipped half not subtracted, by convention).
inline double flops_per_token(const shape& s) {
  const double C = s.width, L = s.layers, V = s.vocab, T = s.context;
  const double mlp = s.experts ? s.experts * C + s.top_k * 8.0 * C * C : 8.0 * C * C;  // with experts: a token's
  const double matrices = L * (4.0 * C * C + mlp) + V * C;
  return 6.0 * matrices + 12.0 * L * T * C;
}

// ---- learning rate ----------------------------------------------------------------------------------------------
/// Linear warm-up from lr / warmup to lr over `warmup` steps, then a cosine from lr down to lr * min_lr_ratio at
/// step `total - 1`: the library's schedule (fsdp/optim/schedule.hpp) at update step + 1, in double, rounded once.
inline float lr_at(const schedule& s, int step) {
  return fsdp::optim::lr_schedule{s.warmup, s.total, s.min_lr_ratio}.at(s.lr, step + 1);
}

// ---- data: every sequence a pure function of (seed, global sample index) --------------------------------------
namespace detail {
using fsdp::init::detail::mix;
using fsdp::init::detail::unit;
inline double uniform(std::uint64_t seed, std::uint64_t sample, std::uint64_t i) {
  return unit(mix(mix(mix(seed) ^ sample) ^ i));
}
inline int draw(double u, int vocab) { return std::min(vocab - 1, static_cast<int>(u * vocab)); }
}  // namespace detail

/// The permutation the data follows: Fisher-Yates driven by mix(seed ^ k).
inline std::vector<int> permutation(const data_options& d, int vocab) {
  std::vector<int> p(static_cast<std::size_t>(vocab));
  std::iota(p.begin(), p.end(), 0);
  for (int k = vocab - 1; k > 0; --k) {
    const auto j = static_cast<int>(fsdp::init::detail::mix(d.seed ^ (0x5045524dULL + static_cast<std::uint64_t>(k))) %
                                    static_cast<std::uint64_t>(k + 1));
    std::swap(p[static_cast<std::size_t>(k)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

/// Tokens 0 .. T of global sample `sample` (T + 1 values: inputs are the first T, targets the last T).
inline void sequence(const data_options& d, const std::vector<int>& perm, int context, std::uint64_t sample,
                     int* out) {
  const int V = static_cast<int>(perm.size());
  out[0] = detail::draw(detail::uniform(d.seed, sample, 0), V);
  for (int i = 1; i <= context; ++i) {
    const auto k = static_cast<std::uint64_t>(i);
    out[i] = detail::uniform(d.seed, sample, 2 * k - 1) < d.follow
                 ? perm[static_cast<std::size_t>(out[i - 1])]
                 : detail::draw(detail::uniform(d.seed, sample, 2 * k), V);
  }
}

/// Documents of varied lengths for sequence packing (fsdp::data), a pure function of (seed, index) like the
/// sequences: lengths lognormal with median context / 4 and sigma 1 (one in 12 is longer than the context and is
/// split by the packer), at least 1 and at most 4 * context; the tokens follow the same chain as sequence()'s,
/// from samples apart from sequence()'s.
inline std::uint64_t document_sample(std::uint64_t index) { return 0x444f43ULL << 40 ^ index; }
inline int document_length(const data_options& d, int context, std::uint64_t index) {
  const std::uint64_t sample = document_sample(index);
  const double u1 = std::max(detail::uniform(d.seed, sample, 0x4c454e31), 1e-300),
               u2 = detail::uniform(d.seed, sample, 0x4c454e32);
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  const double len = std::round(std::exp(std::log(context / 4.0) + z));
  return static_cast<int>(std::clamp(len, 1.0, 4.0 * context));
}
inline std::vector<int> document(const data_options& d, const std::vector<int>& perm, int context,
                                 std::uint64_t index) {
  const int n = document_length(d, context, index);
  std::vector<int> tokens(static_cast<std::size_t>(n));
  sequence(d, perm, n - 1, document_sample(index), tokens.data());
  return tokens;
}

/// The entropy (nats) of the token frequencies (ln V: every token is equally frequent) and the lowest mean loss a
/// model can reach on this data: every target follows its input token with probability `follow` (or is the
/// permutation's image by chance) and is a uniform draw otherwise.
struct entropies {
  double frequencies, floor;
};
inline entropies data_entropies(const data_options& d, int vocab) {
  const double V = vocab, q = (1.0 - d.follow) / V, p = d.follow + q;
  return {std::log(V), -p * std::log(p) - (V - 1) * q * std::log(q)};
}

}  // namespace gpt
