#pragma once
// Sharding strategies: small tag types that report facts about where parameters and gradients live. The
// scheduler reads only these facts, so a new strategy is a new set of facts, not new scheduling code.
#include <concepts>
#include <string_view>

#include "fsdp/core/error.hpp"

namespace fsdp {

struct sharding_tag {};

/// A sharding strategy opts in with `using sharding_concept = fsdp::sharding_tag;` and reports:
/// - `shards_params`: parameters live sharded between uses (gathered for compute, released after);
/// - `reshard_after_forward`: a unit's gathered parameters are released when its forward ends (else they are
///   kept until its backward ends);
/// - `shard_group_size(world)` / `replicate_group_size(world)`: ranks a unit is sharded over / replicated over.
///   Gradients are reduce-scattered over the shard group and all-reduced over the replicate group.
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

/// DDP: every rank holds everything; gradients are all-reduced.
struct no_shard {
  using sharding_concept = sharding_tag;
  static constexpr std::string_view name = "no_shard";
  static constexpr bool shards_params = false;
  static constexpr bool reshard_after_forward = false;
  static constexpr int shard_group_size(int) { return 1; }
  static constexpr int replicate_group_size(int world) { return world; }
};

}  // namespace sharding

/// The strategy's facts as values, for code that is not a template (planner, reports).
struct strategy_facts {
  std::string_view name;
  bool shards_params;
  bool reshard_after_forward;
  int shard_group;
  int replicate_group;
};

template <ShardingStrategy S>
constexpr strategy_facts facts_of(int world) {
  return {S::name, S::shards_params, S::reshard_after_forward, S::shard_group_size(world),
          S::replicate_group_size(world)};
}

}  // namespace fsdp
