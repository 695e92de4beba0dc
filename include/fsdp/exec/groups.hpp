#pragma once
// Which communicator a unit's collectives go to: the world (what ranks compare over: the agreement checks and
// model_options::check_collectives), the shard group (all-gathers and reduce-scatters; all-reduces when whole
// parameters are replicated) and, under hybrid sharding (strategy_facts::splits_world), the replicate group (the
// all-reduce of each reduce-scattered shard). Until use_groups() the shard group is the world and there are no
// replicas.
#include <cstddef>
#include <memory>
#include <string_view>

#include "fsdp/comm/concept.hpp"
#include "fsdp/sharding/sharding.hpp"

namespace fsdp::exec {

/// Hybrid sharding's two sub-groups of the world, as `mesh` places this rank (rank order within each: the world's).
template <class C>
struct split_groups {
  std::unique_ptr<C> shard;      ///< the ranks of this rank's replica (consecutive world ranks)
  std::unique_ptr<C> replicate;  ///< the ranks at this rank's place in every shard group
};

/// Splits `world` by `mesh` (SplittableCollective: comm::local, comm::mpi, comm::nccl). Collective over the world.
template <SplittableCollective C>
split_groups<C> split_world(C& world, const device_mesh& mesh) {
  const int r = world.rank();
  split_groups<C> g;
  // new C(prvalue): a communicator need not be movable (split returns it by value, elided)
  g.shard.reset(new C(world.split(mesh.replica(r), r)));
  g.replicate.reset(new C(world.split(mesh.shard_rank(r), r)));
  return g;
}

template <class C>
class groups {
 public:
  explicit groups(C& world) : world_(&world), shard_(&world) {}

  /// Hybrid sharding: gathers and reduce-scatters on `shard` from now on, and each reduce-scattered shard is
  /// all-reduced on `replicate` (null: no replicas). Both must outlive this.
  void use(C& shard, C* replicate) {
    shard_ = &shard;
    replicas_ = replicate;
  }

  C& world() const noexcept { return *world_; }
  C& shard() const noexcept { return *shard_; }
  C* replicas() const noexcept { return replicas_; }

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
};

}  // namespace fsdp::exec
