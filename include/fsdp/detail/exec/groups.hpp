#pragma once
// Which communicator a unit's collectives go to: the world (what ranks compare over: the agreement checks and
// model_options::check_collectives), the shard group (all-gathers and reduce-scatters; all-reduces when whole
// parameters are replicated) and, under hybrid sharding (strategy_facts::splits_world), the replicate group (the
// all-reduce of each reduce-scattered shard). Until use_groups() the shard group is the world and there are no
// replicas. Under tensor parallelism the shard and replicate groups hold the ranks of one tensor rank; the tensor
// group carries the trainer's own collectives (the model's tensor_comm()) and, on the compute stream in issue
// order with them, the executor's all-reduce of partial gradients (tp::partial_grad).
#include <cstddef>
#include <memory>
#include <string_view>

#include "fsdp/comm/concept.hpp"
#include "fsdp/policy/sharding.hpp"

namespace fsdp::detail::exec {

/// The sub-groups of the world as `mesh` places this rank (rank order within each: the world's).
template <class C>
struct split_groups {
  /// This rank's shard group: the ranks of its replica at its tensor rank; the whole data-parallel group (every
  /// rank at its tensor rank) when the world is not split into replicas.
  std::unique_ptr<C> shard;
  std::unique_ptr<C> replicate;  ///< the ranks at its shard position and tensor rank in every replica; or null
  std::unique_ptr<C> tensor;     ///< its tensor group (consecutive world ranks); null when mesh.tensor is 1
};

/// Splits `world` by `mesh` (SplittableCollective: comm::local, comm::mpi, comm::nccl), in this order on every
/// rank: the shard group, the replicate group when `replicas` (strategy_facts::splits_world), the tensor group when
/// the mesh has one. Collective over the world.
template <SplittableCollective C>
split_groups<C> split_world(C& world, const device_mesh& mesh, bool replicas) {
  const int r = world.rank(), t = mesh.tensor_rank(r);
  split_groups<C> g;
  // new C(prvalue): a communicator need not be movable (split returns it by value, elided)
  g.shard.reset(new C(world.split((replicas ? mesh.replica(r) : 0) * mesh.tensor + t, r)));
  if (replicas) g.replicate.reset(new C(world.split(mesh.shard_rank(r) * mesh.tensor + t, r)));
  if (mesh.tensor > 1) g.tensor.reset(new C(world.split(mesh.data_parallel_rank(r), r)));
  return g;
}

template <class C>
class groups {
 public:
  explicit groups(C& world) : world_(&world), shard_(&world) {}

  /// Hybrid sharding or tensor parallelism: gathers and reduce-scatters on `shard` from now on, each
  /// reduce-scattered shard all-reduced on `replicate` (null: no replicas), partial gradients on `tensor` (null: no
  /// tensor group). All must outlive this.
  void use(C& shard, C* replicate, C* tensor) {
    shard_ = &shard;
    replicas_ = replicate;
    tensor_ = tensor;
  }

  C& world() const noexcept { return *world_; }
  C& shard() const noexcept { return *shard_; }
  C* replicas() const noexcept { return replicas_; }
  C* tensor() const noexcept { return tensor_; }

  /// Tells communicators that keep one (comm::nccl, comm::mpi) which unit the next collective is for, so that a
  /// timeout names it.
  void label(std::string_view unit) const {
    comm::label_next(*shard_, unit);
    if (replicas_) comm::label_next(*replicas_, unit);
  }

 private:
  C* world_;
  C* shard_;
  C* replicas_ = nullptr;
  C* tensor_ = nullptr;
};

}  // namespace fsdp::detail::exec
