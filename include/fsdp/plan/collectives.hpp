#pragma once
// The collectives a model issues, written once: which collective a unit's gather, reduction and (hybrid sharding)
// replica all-reduce issue, with what count and dtype. The executor's transfers (detail/exec/transfers.hpp) issue
// exactly these, and before the memory plan is reserved a Model hands each group's list to a communicator that can make
// what they need ahead of time (comm::nccl's connect(): NCCL connects an algorithm's buffers, and a peer's, at the
// first collective that uses them).
//
//   gather_use(c, f)       unit c's all-gather in its shard group: its shard (or its scaled slice, as bytes) in the
//                          gather dtype; none when parameters are not sharded (the gather is a cast alone)
//   reduction_use(c, f)    its reduction in the shard group: a reduce-scatter of its shard in the reduce dtype, an
//                          all_to_all of its quantized slices, or an all-reduce of the whole buffer (no_shard)
//   replica_use(c)         under hybrid sharding, the all-reduce of its reduced shard across the replicate group
//   tensor_use(run, c)     under tensor parallelism, the all-reduce of a run of its partial gradients
//                          (tp::partial_grad) across the tensor group, in the gradient's dtype
//   tensor_collectives(...) the tensor group's distinct uses (the partial gradients' all-reduces)
//   step_collectives(...)  every group's distinct uses, sorted (the same list on every rank of a group), with the
//                          world's one-element all-reduce (barrier(), a trainer's loss), the step's commit (one
//                          element of the gradient's dtype) and, for an optimizer that inspects gradients, its
//                          norms' all-reduce
//
// Not listed: the agreement's all-gathers at construction (they run before any list is handed over, and connect
// what they need themselves), model_options::check_collectives' comparisons, gather_full_params and a checkpoint's
// collectives (outside the step), and a trainer's own collectives beyond the one-element all-reduce.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/mesh.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/cost.hpp"

namespace fsdp::plan {

/// Unit c's all-gather under facts f; none when parameters are not sharded.
inline std::optional<collective_use> gather_use(const unit_costs& c, const cost_facts& f) {
  if (!f.shards_params) return std::nullopt;
  return collective_use{collective::all_gather, c.gather_count(), c.gather_type()};
}

/// The collective a reduction issues under these facts: a reduce-scatter into shards, an all-reduce of replicas, or
/// (a quantized reduction) an all_to_all of the quantized slices. The executor, the time reading, the traces and
/// reduction_use ask this: the one place it is decided.
inline collective reduction_of(const cost_facts& f) noexcept {
  if (f.precision.quantizes_reduction()) return collective::all_to_all;
  return f.shards_params ? collective::reduce_scatter : collective::all_reduce;
}

/// Unit c's reduction in its shard group under facts f: reduction_of's collective, over the quantized slices, the
/// shard, or the whole padded buffer.
inline collective_use reduction_use(const unit_costs& c, const cost_facts& f) {
  const collective k = reduction_of(f);
  const std::int64_t count = k == collective::all_to_all       ? c.reduce_count()
                             : k == collective::reduce_scatter ? c.shard_numel
                                                               : c.padded_numel;
  return {k, count, c.reduce_output.type};
}

/// Unit c's all-reduce across the replicate group (hybrid sharding: a reduced shard to all-reduce); none when the
/// reduction leaves no shard (an all-reduce in place already covered the whole world).
inline std::optional<collective_use> replica_use(const unit_costs& c) {
  if (!c.reduce_output) return std::nullopt;
  return collective_use{collective::all_reduce, c.shard_numel, c.reduce_output.type};
}

/// The all-reduce over the tensor group of run `r` of unit c's partial gradients (FlatLayout::partial_grad_runs).
inline collective_use tensor_use(const flat_run& r, const unit_costs& c) {
  return {collective::all_reduce, r.numel, c.grad.type};
}

/// The distinct collectives of each group of a model.
struct group_collectives {
  std::vector<collective_use> world;     ///< the world communicator's own
  std::vector<collective_use> shard;     ///< the shard group's (the world's when it is not split)
  std::vector<collective_use> replicas;  ///< the replicate group's (hybrid sharding); empty otherwise
  std::vector<collective_use> tensor;    ///< the tensor group's partial-gradient all-reduces (not the trainer's)
  std::vector<collective_use> expert_shard;  ///< the expert units' gathers and reductions (expert_parallel > 1)
  std::vector<collective_use> expert;        ///< the expert group's (the trainer's all_to_all only: none listed)
  /// The list of group `g` (fsdp/core/mesh.hpp).
  std::vector<collective_use>& of(mesh_group g) noexcept {
    switch (g) {
      case mesh_group::shard: return shard;
      case mesh_group::replicate: return replicas;
      case mesh_group::tensor: return tensor;
      case mesh_group::expert_shard: return expert_shard;
      case mesh_group::expert: return expert;
    }
    return shard;
  }
};

/// Sorted, without duplicates: the same list on every rank that has the same uses.
inline std::vector<collective_use> distinct(std::vector<collective_use> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

/// Every group's collectives for units with these costs (unit-index order) under facts f. `replicas`: hybrid
/// sharding's replicate group exists. `norms`: the gradient inspection's squared norms (plan::norm_count; 0: none),
/// all-reduced over the world in fp32. `commits`: the step's commit (plan::commits), one element of the gradient's
/// dtype all-reduced over the world. `expert_units`: the units whose gathers and reductions go to the expert shard
/// group (FlatLayout::experts, where the model has one; empty: none).
inline group_collectives step_collectives(const std::vector<unit_costs>& units, const cost_facts& f, bool replicas,
                                          std::int64_t norms = 0, bool commits = false,
                                          const std::vector<bool>& expert_units = {}) {
  group_collectives g;
  g.world.push_back({collective::all_reduce, 1, dtype::f32});
  if (norms > 0) g.world.push_back({collective::all_reduce, norms, dtype::f32});
  if (commits && !units.empty()) g.world.push_back({collective::all_reduce, 1, units.front().grad.type});
  for (std::size_t k = 0; k < units.size(); ++k) {
    const unit_costs& c = units[k];
    std::vector<collective_use>& shard = k < expert_units.size() && expert_units[k] ? g.expert_shard : g.shard;
    if (auto u = gather_use(c, f)) shard.push_back(*u);
    shard.push_back(reduction_use(c, f));
    if (replicas)
      if (auto u = replica_use(c)) g.replicas.push_back(*u);
  }
  g.world = distinct(std::move(g.world));
  g.shard = distinct(std::move(g.shard));
  g.expert_shard = distinct(std::move(g.expert_shard));
  g.replicas = distinct(std::move(g.replicas));
  return g;
}

/// The tensor group's collectives for units with these layouts and costs (unit-index order): every run of partial
/// gradients' all-reduce (group_collectives::tensor).
inline std::vector<collective_use> tensor_collectives(const std::vector<FlatLayout>& layouts,
                                                      const std::vector<unit_costs>& units) {
  std::vector<collective_use> out;
  for (std::size_t u = 0; u < layouts.size() && u < units.size(); ++u)
    for (const flat_run& r : layouts[u].partial_grad_runs()) out.push_back(tensor_use(r, units[u]));
  return distinct(std::move(out));
}

/// The uses in `want` not in `have` (both sorted, as distinct() makes them), which are then added to `have`.
inline std::vector<collective_use> not_yet(const std::vector<collective_use>& want, std::vector<collective_use>& have) {
  std::vector<collective_use> out;
  std::set_difference(want.begin(), want.end(), have.begin(), have.end(), std::back_inserter(out));
  have = distinct([&] {
    std::vector<collective_use> all = have;
    all.insert(all.end(), out.begin(), out.end());
    return all;
  }());
  return out;
}

}  // namespace fsdp::plan
