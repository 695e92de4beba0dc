#pragma once
// Which communicator a unit's collectives go to: the world (what ranks compare over: the agreement checks and
// model_options::check_collectives), the shard group (all-gathers and reduce-scatters; all-reduces when whole
// parameters are replicated) and, under hybrid sharding (strategy_facts::splits_world), the replicate group (the
// all-reduce of each reduce-scattered shard). Until use_groups() the shard group is the world and there are no
// replicas.
#include <cstddef>
#include <string_view>

#include "fsdp/comm/concept.hpp"

namespace fsdp::exec {

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
