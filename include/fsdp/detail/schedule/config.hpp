#pragma once
// The schedule configuration: the facts the scheduler decides from, built once from the policy's facts and the
// model options. Model builds it at construction; the budget helpers build theirs with the same function for every
// candidate they plan, so a plan and a model with the same inputs schedule alike.
#include <cstddef>
#include <string>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/options/model_options.hpp"
#include "fsdp/policy/precision.hpp"
#include "fsdp/policy/prefetch.hpp"
#include "fsdp/policy/sharding.hpp"

namespace fsdp::detail::sched {

struct config {
  /// Units are gathered before use and released after: their parameters are sharded, the compute dtype is not
  /// the master's (a cast copy), or the master is on the host (offloaded). false: the fp32 master is the full
  /// parameter (no_shard in fp32) and every unit is always gathered.
  bool gathers = true;
  /// Per unit index: released when its forward ends (else kept gathered until its backward ends): the strategy's
  /// reshard_after_forward, or model_options::reshard_after_forward's value for the unit. The scheduler keeps the
  /// first unit of the forward pass (the root) gathered into its backward all the same, unless `reshard_named`.
  std::vector<bool> reshard_after_forward;
  /// Per unit index: model_options::reshard_after_forward names the unit, so its value holds for it even as the
  /// first unit of the forward pass.
  std::vector<bool> reshard_named;
  int forward_depth = 0;
  int backward_depth = 0;
  bool post_backward = false;
  bool by_schedule = false;
  /// Per unit index, for by_schedule: the units to prefetch when that unit's forward / backward starts.
  std::vector<std::vector<std::size_t>> forward_schedule;
  std::vector<std::vector<std::size_t>> backward_schedule;
  /// Units held gathered (or gathering) at once; 0 = no limit.
  int gather_slots = 0;
  /// Per unit index: its unsharded gradient is made when the backward pass begins (model_options::early_grads).
  std::vector<bool> early_grad;
  /// Unsharded gradient buffers made before one is reused (model_options::grad_slots).
  int grad_slots = 2;
  /// Backward passes per optimizer step (accumulation_options::micro_batches).
  int micro_batches = 1;
  /// Reduce every micro-batch (else: accumulate locally, reduce in the last one).
  bool sync_each_micro_batch = true;
  /// Keep every gathered unit until the last micro-batch's backward ends.
  bool keep_gathered = false;
  /// ZeRO-1 (strategy_facts::keeps_params_gathered): no unit is released in forward or backward; an optimizer
  /// step releases every unit (stale) and gathers each again right after it, so full parameters are kept between
  /// steps.
  bool keep_between_steps = false;
  /// Per unit index: the parts it keeps in host memory (the policy's, or model_options::offload_units').
  std::vector<offload_facts> offload;
};

/// The schedule configuration of `units` under these facts and options. Every option that names a unit is
/// checked here; each mistake goes to `p`, naming the option and the unit and listing the units (what it would
/// have set is left as the policy has it).
FSDP_DECL config build_config(const unit_index& units, const strategy_facts& strategy, const prefetch_facts& prefetch,
                              const precision_facts& precision, const model_options& opt, const offload_facts& offload,
                              problems& p);

/// build_config, throwing the first mistake as a usage_error.
FSDP_DECL config build_config(const unit_index& units, const strategy_facts& strategy, const prefetch_facts& prefetch,
                              const precision_facts& precision, const model_options& opt,
                              const offload_facts& offload = {});

}  // namespace fsdp::detail::sched

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/detail/schedule/config.ipp"
#endif
