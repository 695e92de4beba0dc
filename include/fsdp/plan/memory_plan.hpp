#pragma once
// Memory planner: the per-rank peak of every memory category, and of their sum, known before the first step.
// It runs the scheduler's own decisions (fsdp/detail/schedule/scheduler.hpp) through training steps of every
// micro-batch on byte counters (two, or more until the slot ledgers settle), with each buffer's cost from
// fsdp/memory/cost.hpp, in the order the unit executor allocates and releases (fsdp/plan/detail/program.hpp, the step
// program the executor interprets and the timeline planner reads too), and with the executor's slot ledgers
// (fsdp/detail/schedule/slot_ledger.hpp) for what lives in slots. So every policy the scheduler knows (prefetch depth
// or schedule, gather and grad slots, per-unit resharding, recorded order, precision, gradient accumulation) is planned
// by the code that schedules it. The figures hold on the device too: within a step the executor takes no memory but
// its slots (made, or made larger, where the ledgers say), and reuses a slot only after an event
// (tests/model/memory_bound_test.cc checks this against a model of a stream-ordered pool).
//
// A schedule that cannot run (a unit needed for compute while every gather slot is held) is a plan that is not
// feasible: memory_plan::infeasible says why. Inputs that are wrong in themselves (a negative count) are
// usage_errors.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/detail/schedule/config.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/policy/offload.hpp"

namespace fsdp {

struct memory_plan_inputs {
  detail::sched::config schedule;
  /// Forward order of the units (indices); empty = index order.
  std::vector<std::size_t> order;
  plan::cost_facts costs{};
  int optimizer_states = 0;  ///< fp32 values of optimizer state per parameter element (AdamW 2)
  int norm_rows = 0;         ///< rows of the step's gradient inspection buffer (0: the step does not inspect)
  bool commit_step = true;   ///< model_options::commit_step (the step commits when it does not inspect: plan::commits)
};

/// The planner's answer: peak bytes per category and of their sum at any one moment (figures.total), per memory
/// domain: the device's (`peak`) and the host's (`host_peak`: offloaded buffers, fsdp/policy/offload.hpp).
struct memory_plan {
  memory_figures peak;
  /// What stays between steps: shards, gradient shards, optimizer state and the slots the steps made.
  memory_figures between_steps;
  memory_figures host_peak;
  memory_figures host_between_steps;
  /// What one training step (every micro-batch and the optimizer step) moves over the host link.
  plan::link_bytes link;
  std::vector<std::string> units;
  /// Gathered units held at once at the peak of gathered params.
  int max_units_gathered = 0;
  /// Empty when the schedule runs; otherwise why it cannot (the unit and the units holding every gather slot),
  /// and `peak` covers only what ran before that point.
  std::string infeasible;
  /// Device memory beside the plan that no plan holds, as measured: a Model on comm::nccl sets it to what its NCCL
  /// communicators' creation and the connections of its collectives took (nccl_communicator::device_bytes(), its
  /// shard and replicate groups' included); 0 elsewhere. Not in `peak`; the table shows it beside the device's total.
  std::int64_t outside_plan_bytes = 0;
  /// Of outside_plan_bytes, what making the connections of the plan's collectives took before the reservation
  /// (nccl_communicator::connect_bytes(), over the world and its groups); shown on a row of its own.
  std::int64_t outside_plan_connect_bytes = 0;

  bool feasible() const noexcept { return infeasible.empty(); }

  /// A printable table: one row per category and one for the total at the peak moment.
  std::string table() const;
};

namespace detail {
/// What both planners start from: the checked inputs, the forward order (index order when none is given), each
/// unit's offload (the schedule's: the policy's and model_options::offload_units'; else the costs' own) and costs.
struct prepared {
  std::vector<std::size_t> order;
  std::vector<offload_facts> offload;
  std::vector<plan::unit_costs> cost;
};

FSDP_DECL prepared prepare(const std::vector<std::string>& names, const std::vector<FlatLayout>& layouts,
                           const memory_plan_inputs& in, const char* who);

/// The ranks of a replica's shard group: a dense unit's layout's world, or (every unit of experts) an expert unit's
/// times the `expert` ranks of an expert group; 1 without units.
FSDP_DECL int shard_group_of(const std::vector<FlatLayout>& layouts, int expert = 1);

/// The ranks of hybrid sharding's replicate group at data-parallel world size `world`: the world over the shard
/// group (shard_group_of) when parameters are sharded; 1 otherwise (replicated parameters all-reduce over the whole
/// world in their one reduction). What the timeline's and the listing's readings of replica_reduce follow.
FSDP_DECL int replicas_of(int world, const std::vector<FlatLayout>& layouts, const plan::cost_facts& facts,
                          int expert = 1);

}  // namespace detail

/// Plans one rank's memory for units with these names and layouts (in unit-index order).
FSDP_DECL memory_plan plan_memory(const std::vector<std::string>& names, const std::vector<FlatLayout>& layouts,
                                  const memory_plan_inputs& in);

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/plan/memory_plan.ipp"
#endif
