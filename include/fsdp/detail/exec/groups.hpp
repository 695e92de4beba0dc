#pragma once
// Which communicator a unit's collectives go to: the world (what ranks compare over: the agreement checks and
// model_options::check_collectives), the shard group (all-gathers and reduce-scatters; all-reduces when whole
// parameters are replicated) and, under hybrid sharding (strategy_facts::splits_world), the replicate group (the
// all-reduce of each reduce-scattered shard). Until use_groups() the shard group is the world and there are no
// replicas. Under tensor parallelism the shard and replicate groups hold the ranks of one tensor rank; the tensor
// group carries the trainer's own collectives (the model's tensor_comm()) and, on the compute stream in issue
// order with them, the executor's all-reduce of partial gradients (tp::partial_grad).
#include <array>
#include <cstddef>
#include <memory>
#include <string_view>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/mesh.hpp"

namespace fsdp::detail::exec {

/// The sub-groups of the world as `mesh` places this rank (rank order within each: the world's), by role
/// (fsdp/core/mesh.hpp's mesh_groups); null where the Model makes no such group.
template <class C>
struct split_groups {
  std::array<std::unique_ptr<C>, mesh_group_count> by_group;
  std::unique_ptr<C>& of(mesh_group g) noexcept { return by_group[static_cast<std::size_t>(g)]; }
};

/// Splits `world` by `mesh` (SplittableCollective: comm::local, comm::mpi, comm::nccl): every group of mesh_groups
/// the Model makes (`split`: strategy_facts::splits_world), in that order on every rank. Collective over the world.
template <SplittableCollective C>
split_groups<C> split_world(C& world, const device_mesh& m, bool split) {
  const int r = world.rank();
  split_groups<C> g;
  for (const mesh_group_row& row : mesh_groups)
    if (row.made(m, split))  // new C(prvalue): a communicator need not be movable (split returns it, elided)
      g.of(row.group).reset(new C(world.split(mesh::group_color(m, r, mesh::spans(row.group, split)), r)));
  return g;
}

/// Whether the Model splits its world at all.
inline bool splits_any(const device_mesh& m, bool split) noexcept {
  for (const mesh_group_row& row : mesh_groups)
    if (row.made(m, split)) return true;
  return false;
}

template <class C>
class groups {
 public:
  explicit groups(C& world) : world_(&world) {}

  /// The groups a split made (split_world): gathers and reduce-scatters on the shard group from now on, each
  /// reduce-scattered shard all-reduced on the replicate group (none: no replicas), partial gradients on the tensor
  /// group (none: no tensor group). They must outlive this.
  void use(split_groups<C>& g) {
    for (std::size_t k = 0; k < mesh_group_count; ++k) by_group_[k] = g.by_group[k].get();
  }

  C& world() const noexcept { return *world_; }
  /// The group of role `g`, or null where none was made (the shard group: the world then).
  C* of(mesh_group g) const noexcept { return by_group_[static_cast<std::size_t>(g)]; }
  C& shard() const noexcept { return of(mesh_group::shard) ? *of(mesh_group::shard) : *world_; }
  /// A unit's shard group: an expert unit's (FlatLayout::experts) is the expert shard group where there is one (the
  /// shard group when every rank holds every expert).
  C& shard(bool expert_unit) const noexcept {
    return expert_unit && of(mesh_group::expert_shard) ? *of(mesh_group::expert_shard) : shard();
  }
  C* replicas() const noexcept { return of(mesh_group::replicate); }
  C* tensor() const noexcept { return of(mesh_group::tensor); }

  /// Tells communicators that keep one (comm::nccl, comm::mpi) which unit the next collective is for, so that a
  /// timeout names it.
  void label(std::string_view unit, bool expert_unit = false) const {
    comm::label_next(shard(expert_unit), unit);
    if (replicas()) comm::label_next(*replicas(), unit);
  }

 private:
  C* world_;
  std::array<C*, mesh_group_count> by_group_{};
};

}  // namespace fsdp::detail::exec
