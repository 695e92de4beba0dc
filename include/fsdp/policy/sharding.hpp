#pragma once
// Sharding strategies: small tag types that report facts about where parameters and gradients live. The
// scheduler reads only these facts, so a new strategy is a new set of facts, not new scheduling code.
#include <concepts>
#include <string_view>

#include "fsdp/core/error.hpp"
#include "fsdp/core/mesh.hpp"  // fsdp::device_mesh, which mesh_of makes
#include "fsdp/core/problems.hpp"

namespace fsdp {

struct sharding_tag {};

/// A sharding strategy opts in with `using sharding_concept = fsdp::sharding_tag;` and reports:
/// - `shards_params`: parameters live sharded between uses (gathered for compute, released after);
/// - `reshard_after_forward`: a unit's gathered parameters are released when its forward ends (else they are
///   kept until its backward ends);
/// - `shard_group_size(world)` / `replicate_group_size(world)`: ranks a unit is sharded over / replicated over
///   (their product is the world; device_mesh says which rank is where). Gradients are reduce-scattered over the
///   shard group and all-reduced over the replicate group.
/// And, optionally (false where a strategy does not say):
/// - `keeps_params_gathered`: a unit's gathered parameters are kept between uses and between steps; an optimizer
///   step releases them (they are stale) and all-gathers the updated shards right after it (ZeRO-1). Only with
///   `shards_params` and no `reshard_after_forward`.
template <class S>
concept ShardingStrategy = requires(int world) {
  typename S::sharding_concept;
  requires std::same_as<typename S::sharding_concept, sharding_tag>;
  { S::name } -> std::convertible_to<std::string_view>;
  { S::shards_params } -> std::convertible_to<bool>;
  { S::reshard_after_forward } -> std::convertible_to<bool>;
  { S::shard_group_size(world) } -> std::convertible_to<int>;
  { S::replicate_group_size(world) } -> std::convertible_to<int>;
};

/// The strategy's optional keeps_params_gathered fact (false when it has none).
template <ShardingStrategy S>
constexpr bool keeps_params_gathered() {
  if constexpr (requires {
                  { S::keeps_params_gathered } -> std::convertible_to<bool>;
                }) {
    static_assert(!S::keeps_params_gathered || (S::shards_params && !S::reshard_after_forward),
                  "fsdp::sharding: a strategy that keeps parameters gathered between steps must shard them "
                  "(shards_params) and not reshard after forward");
    return S::keeps_params_gathered;
  } else {
    return false;
  }
}

namespace sharding {

/// ZeRO-3: parameters, gradients and optimizer state sharded; gathered for forward, released, gathered again for
/// backward.
struct full_shard {
  using sharding_concept = sharding_tag;
  static constexpr std::string_view name = "full_shard";
  static constexpr bool shards_params = true;
  static constexpr bool reshard_after_forward = true;
  static constexpr int shard_group_size(int world) { return world; }
  static constexpr int replicate_group_size(int) { return 1; }
};

/// ZeRO-2: like full_shard, but a unit's parameters stay gathered from its forward until its backward ends
/// (no second all-gather, more memory).
struct shard_grad_op {
  using sharding_concept = sharding_tag;
  static constexpr std::string_view name = "shard_grad_op";
  static constexpr bool shards_params = true;
  static constexpr bool reshard_after_forward = false;
  static constexpr int shard_group_size(int world) { return world; }
  static constexpr int replicate_group_size(int) { return 1; }
};

/// ZeRO-1: master shards, gradient shards and optimizer state sharded, as under shard_grad_op; full parameters kept
/// gathered between steps. Gradients are reduce-scattered; after each optimizer step the updated shards are
/// all-gathered (one all-gather per unit and step, issued right after the step, and none in forward or backward
/// from the second step on). Memory: every unit's full parameters at all times, like no_shard, with the
/// optimizer state and fp32 masters of full_shard.
struct zero1 {
  using sharding_concept = sharding_tag;
  static constexpr std::string_view name = "zero1";
  static constexpr bool shards_params = true;
  static constexpr bool reshard_after_forward = false;
  static constexpr bool keeps_params_gathered = true;
  static constexpr int shard_group_size(int world) { return world; }
  static constexpr int replicate_group_size(int) { return 1; }
};

/// DDP: every rank holds everything; gradients are all-reduced.
struct no_shard {
  using sharding_concept = sharding_tag;
  static constexpr std::string_view name = "no_shard";
  static constexpr bool shards_params = false;
  static constexpr bool reshard_after_forward = false;
  static constexpr int shard_group_size(int) { return 1; }
  static constexpr int replicate_group_size(int world) { return world; }
};

/// The group facts both hybrid strategies share: sharded over `ShardGroup` consecutive ranks (a node), replicated
/// across world / ShardGroup groups. Gradients are reduce-scattered inside the shard group, then all-reduced
/// across the replicas. Needs a SplittableCollective (split(color, key): comm::local, comm::mpi, comm::nccl); one
/// without it is refused when the Model is built.
template <int ShardGroup>
struct hybrid_groups {
  static_assert(ShardGroup >= 1, "fsdp::sharding: a hybrid strategy's shard group must have at least one rank");
  using sharding_concept = sharding_tag;
  static constexpr bool shards_params = true;
  static constexpr int shard_group_size(int) { return ShardGroup; }
  static constexpr int replicate_group_size(int world) { return world / ShardGroup; }
};

/// HSDP: full_shard inside each shard group, gradients all-reduced across the replicas.
template <int ShardGroup>
struct hybrid_shard : hybrid_groups<ShardGroup> {
  static constexpr std::string_view name = "hybrid_shard";
  static constexpr bool reshard_after_forward = true;
};

/// hybrid_shard with shard_grad_op inside the shard group: parameters stay gathered from a unit's forward until
/// its backward ends.
template <int ShardGroup>
struct hybrid_shard_zero2 : hybrid_groups<ShardGroup> {
  static constexpr std::string_view name = "hybrid_shard_zero2";
  static constexpr bool reshard_after_forward = false;
};

/// zero1 inside each shard group, gradients all-reduced across the replicas: full parameters kept between steps,
/// optimizer state and masters sharded over the group.
template <int ShardGroup>
struct hybrid_shard_zero1 : hybrid_groups<ShardGroup> {
  static constexpr std::string_view name = "hybrid_shard_zero1";
  static constexpr bool reshard_after_forward = false;
  static constexpr bool keeps_params_gathered = true;
};

}  // namespace sharding

/// The strategy's facts as values, for code that is not a template (planner, reports).
struct strategy_facts {
  std::string_view name;
  bool shards_params;
  bool reshard_after_forward;
  int shard_group;
  int replicate_group;
  bool keeps_params_gathered = false;  ///< ZeRO-1: full parameters kept between steps, refreshed after each
  /// Whether the world is split into shard groups and replicate groups (sub-group communicators): parameters are
  /// sharded over a group smaller than the world. A shard group of one rank is such a group (hybrid_shard<1>:
  /// every rank holds whole parameters, gathers and reduce-scatters run in a group of one, the replicas
  /// all-reduce); a collective of the world in its place would move world-times the buffer.
  constexpr bool splits_world() const noexcept { return shards_params && replicate_group > 1; }
};

/// The mesh of strategy S over `world` ranks; what is wrong with it (its groups do not tile the world) goes to `p`,
/// and the mesh is then {1, 1}.
template <ShardingStrategy S>
device_mesh mesh_of(int world, problems& p) {
  if (world <= 0) {
    p.add("world size must be positive, got ", world);
    return {};
  }
  const int g = S::shard_group_size(world), r = S::replicate_group_size(world);
  if (g <= 0 || world % g != 0)
    p.add("sharding strategy ", S::name, " gives a shard group of ", g, " ranks, which does not divide the world of ",
          world);
  else if (g * r != world)
    p.add("sharding strategy ", S::name, " gives a shard group of ", g, " and a replicate group of ", r,
          " ranks, whose product is not the world of ", world);
  else if (!S::shards_params && g != 1)
    p.add("sharding strategy ", S::name,
          " does not shard parameters (shards_params is false) but gives a shard "
          "group of ",
          g, " ranks; a strategy that keeps whole parameters on every rank has a shard group of 1");
  else
    return {r, g};
  return {};
}
/// The mesh of strategy S over `world` ranks; usage_error when its groups do not tile the world.
template <ShardingStrategy S>
device_mesh mesh_of(int world) {
  problems p;
  const device_mesh m = mesh_of<S>(world, p);
  p.require();
  return m;
}

template <ShardingStrategy S>
constexpr strategy_facts facts_of(int world) {
  return {S::name,
          S::shards_params,
          S::reshard_after_forward,
          S::shard_group_size(world),
          S::replicate_group_size(world),
          keeps_params_gathered<S>()};
}

}  // namespace fsdp
