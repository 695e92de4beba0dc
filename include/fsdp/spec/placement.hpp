#pragma once
// Tensor-parallel placements: where a parameter lives across the ranks of a tensor group
// (model_options::tensor_parallel ranks, consecutive in the world: device_mesh). A ModelSpec gives every
// parameter's global shape and its placement, the same on every rank; the library derives each rank's local
// tensor (split: its slice of the named dimension; replicated: the whole parameter), lays out and shards that
// local tensor over the data-parallel ranks, and reduces its gradients over those ranks only. The trainer's own
// tensor-parallel collectives (all-reduce after a row-parallel product, of input gradients after a column-parallel
// one) go to the model's tensor_comm().
//
//   Megatron's linear layers, weight [out, in]:  column-parallel  split(0) on the weight and split(0) on its bias
//                                                row-parallel     split(1) on the weight, its bias replicated
//   a fused projection [q; k; v] of [3C, C]:     split(0, 3) on the weight and its bias (each of the three blocks
//                                                split: rank t holds its rows of q, of k and of v, in that order)
//   sequence parallelism's layernorm weights:    partial_grad (replicated; each tensor rank's gradient covers its
//                                                slice of the sequence, and the library sums them over the tensor
//                                                group at the end of the unit's backward, on the compute stream,
//                                                before the unit's reduction)
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/problems.hpp"
#include "fsdp/core/text.hpp"

namespace fsdp {

/// A parameter's place in the tensor group: replicated (every tensor rank holds all of it; its gradient is each
/// rank's whole gradient, the same on every tensor rank), replicated with a partial gradient (each tensor rank's
/// gradient is a partial sum: the model all-reduces it over the tensor group when the unit's backward ends), or
/// split evenly on dimension `dim` (tensor rank t holds the t-th of `degree` equal slices of that dimension; with
/// `blocks` > 1 the dimension is that many equal blocks, each split so, and rank t holds its slice of every block,
/// in block order: a fused [q; k; v] projection).
struct tensor_placement {
  enum class kind : std::uint8_t { replicated, partial_grad, split };
  kind how = kind::replicated;
  int dim = 0;     ///< split only: the dimension of the global shape that is split
  int blocks = 1;  ///< split only: equal blocks of that dimension, each split across the tensor group

  constexpr bool is_split() const noexcept { return how == kind::split; }
  constexpr bool has_partial_grad() const noexcept { return how == kind::partial_grad; }
  friend constexpr bool operator==(const tensor_placement&, const tensor_placement&) = default;
};

namespace tp {
inline constexpr tensor_placement replicated{};
/// Replicated, its gradient a partial sum on each tensor rank (sequence parallelism's layernorm weights and biases).
inline constexpr tensor_placement partial_grad{tensor_placement::kind::partial_grad, 0, 1};
/// Split on dimension `dim` of the global shape (0: a column-parallel weight [out, in]; 1: a row-parallel one), that
/// dimension taken as `blocks` equal blocks each split alike (3: a fused [q; k; v] projection).
constexpr tensor_placement split(int dim, int blocks = 1) noexcept {
  return {tensor_placement::kind::split, dim, blocks};
}
}  // namespace tp

/// "replicated", "replicated with a partial gradient", "split on dimension 1".
inline std::string describe(const tensor_placement& p) {
  if (p.is_split())
    return p.blocks == 1 ? detail::cat("split on dimension ", p.dim)
                         : detail::cat("split on dimension ", p.dim, " in ", p.blocks, " blocks");
  return p.has_partial_grad() ? "replicated with a partial gradient" : "replicated";
}

/// The placement as files write it: "replicated", "partial_grad", "split(1)", "split(0,3)".
inline std::string placement_name(const tensor_placement& p) {
  if (p.is_split())
    return p.blocks == 1 ? detail::cat("split(", p.dim, ")") : detail::cat("split(", p.dim, ",", p.blocks, ")");
  return p.has_partial_grad() ? "partial_grad" : "replicated";
}
/// placement_name's inverse; nullopt for any other text.
inline std::optional<tensor_placement> parse_placement(std::string_view s) {
  if (s == "replicated") return tp::replicated;
  if (s == "partial_grad") return tp::partial_grad;
  if (s.size() < 8 || s.substr(0, 6) != "split(" || s.back() != ')') return std::nullopt;
  const auto number = [](std::string_view digits) -> std::optional<int> {  // 0 .. 9999, no leading zero
    if (digits.empty() || digits.size() > 4 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
    int v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  const std::string_view args = s.substr(6, s.size() - 7);
  const std::size_t comma = args.find(',');
  const std::optional<int> dim = number(args.substr(0, comma));
  const std::optional<int> blocks = comma == std::string_view::npos ? 1 : number(args.substr(comma + 1));
  if (!dim || !blocks || *blocks < 1 || (comma != std::string_view::npos && *blocks == 1)) return std::nullopt;
  return tp::split(*dim, *blocks);
}

/// Where a rank sits in its tensor group: `degree` ranks, this one the `rank`-th.
struct tensor_coords {
  int degree = 1;
  int rank = 0;
};

/// Where a rank sits in its expert group (model_options::expert_parallel): `degree` ranks, this one the `rank`-th,
/// holding the rank-th of `degree` equal shares of every stacked expert parameter's dimension 0.
struct expert_coords {
  int degree = 1;
  int rank = 0;
};

/// Where a rank's share of a stacked expert parameter begins in the global parameter (row-major), given its local
/// shape (both splits applied): the shares before it, each the local elements times the tensor group's split of
/// them; 0 for a dense parameter. for_each_global_run's `base`.
inline std::int64_t expert_base(const std::vector<std::int64_t>& local, const tensor_placement& pl, bool experts,
                                const tensor_coords& t, const expert_coords& e) {
  if (!experts || e.degree == 1) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : local) n *= d;
  if (pl.is_split()) n *= t.degree;
  return n * e.rank;
}

/// What is wrong with placing a parameter of `shape` so (a dimension it does not have), or empty.
inline std::string placement_problem(const std::string& name, const std::vector<std::int64_t>& shape,
                                     const tensor_placement& p) {
  if (!p.is_split()) return {};
  if (p.dim < 0 || static_cast<std::size_t>(p.dim) >= shape.size())
    return detail::cat("parameter '", name, "' is split on dimension ", p.dim, ", which its shape ",
                       detail::shape_text(shape), " does not have (dimensions 0 to ", shape.size() - 1, ")");
  if (p.blocks < 1 || shape[static_cast<std::size_t>(p.dim)] % p.blocks != 0)
    return detail::cat("parameter '", name, "' is split on dimension ", p.dim, " in ", p.blocks,
                       " blocks, which do "
                       "not divide its ",
                       shape[static_cast<std::size_t>(p.dim)], " elements (shape ", detail::shape_text(shape), ")");
  return {};
}

/// The local shape of a parameter of global shape `global` on a tensor group of `degree` ranks; a split dimension
/// the degree does not divide goes to `p` (and the shape is then the global one).
inline std::vector<std::int64_t> local_shape(const std::string& name, const std::vector<std::int64_t>& global,
                                             const tensor_placement& pl, int degree, problems& p) {
  if (!pl.is_split() || degree == 1) return global;
  const std::int64_t d = global.at(static_cast<std::size_t>(pl.dim));
  if (d % (std::int64_t{degree} * pl.blocks) != 0) {
    if (pl.blocks == 1)
      p.add("parameter '", name, "' of shape ", detail::shape_text(global), " is split on dimension ", pl.dim,
            " across ", degree, " tensor-parallel ranks, which do not divide its ", d,
            " elements: make the "
            "dimension a multiple of model_options::tensor_parallel, or replicate the parameter");
    else
      p.add("parameter '", name, "' of shape ", detail::shape_text(global), " is split on dimension ", pl.dim, " in ",
            pl.blocks, " blocks, each across ", degree, " tensor-parallel ranks, which do not divide its ",
            d / pl.blocks,
            " elements a block: make the blocks multiples of model_options::tensor_parallel, or "
            "replicate the parameter");
    return global;
  }
  std::vector<std::int64_t> out = global;
  out[static_cast<std::size_t>(pl.dim)] = d / degree;
  return out;
}

/// The global shape of a parameter whose local shape on a tensor group of `degree` ranks is `local`.
inline std::vector<std::int64_t> global_shape(const std::vector<std::int64_t>& local, const tensor_placement& pl,
                                              int degree) {
  std::vector<std::int64_t> out = local;
  if (pl.is_split()) out.at(static_cast<std::size_t>(pl.dim)) *= degree;
  return out;
}

/// Calls f(global_first, local_offset, count) for each run of the local elements [first, first + count) (row-major
/// over `local`, this rank's slice) that is contiguous in the global parameter (row-major over its global shape):
/// one run when the parameter is replicated, one per index of the dimensions before the split one (and per block)
/// otherwise. `base`: where this rank's experts begin (expert_base; 0 for a dense parameter), added to every global
/// index (the expert dimension is outermost, so a share of the experts is the tensor split of a contiguous block).
template <class F>
void for_each_global_run(const std::vector<std::int64_t>& local, const tensor_placement& pl, const tensor_coords& t,
                         std::int64_t first, std::int64_t count, F&& f, std::int64_t base = 0) {
  if (!pl.is_split() || t.degree == 1) {
    if (count > 0) f(base + first, std::int64_t{0}, count);
    return;
  }
  std::int64_t inner = 1;  // elements per index of the split dimension
  for (std::size_t i = static_cast<std::size_t>(pl.dim) + 1; i < local.size(); ++i) inner *= local[i];
  const std::int64_t row = local[static_cast<std::size_t>(pl.dim)] * inner;  // local elements per outer index
  const std::int64_t chunk = row / pl.blocks;  // a block's local elements per outer index: contiguous globally
  for (std::int64_t done = 0; done < count;) {
    const std::int64_t i = first + done, outer = i / row, within = i % row, block = within / chunk;
    const std::int64_t at = within % chunk, n = std::min(chunk - at, count - done);
    f(base + outer * row * t.degree + (block * t.degree + t.rank) * chunk + at, done, n);
    done += n;
  }
}

}  // namespace fsdp
