#pragma once
// The step program's definitions (fsdp/plan/program.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <utility>

#include "fsdp/plan/program.hpp"

namespace fsdp::plan {

FSDP_DECL step_program::step_program(std::vector<unit_costs> costs, std::vector<offload_facts> offload, int grad_slots,
                                     int optimizer_states, int replicas, bool prescales)
    : cost_(std::move(costs)), offload_(std::move(offload)), states_(optimizer_states), replicas_(replicas),
      prescales_(prescales),
      slots_(slot_costs_of(cost_)), staging_(staging_slots_of(cost_, offload_, optimizer_states)),
      ledger_{sched::slot_ledger(1), sched::slot_ledger(grad_slots), sched::slot_ledger(1), sched::slot_ledger(1),
              sched::slot_ledger(offload_slots), sched::slot_ledger(offload_slots),
              sched::slot_ledger(offload_slots), sched::slot_ledger(offload_slots), sched::slot_ledger(1)},
      held_(cost_.size()), accumulating_(cost_.size(), false), ready_(cost_.size(), false) {}

FSDP_DECL void step_program::set_optimizer_states(int states) {
  states_ = states;
  staging_ = staging_slots_of(cost_, offload_, states);
  ledger_[static_cast<std::size_t>(ring::stage_state)] = sched::slot_ledger(offload_slots);
}

FSDP_DECL void step_program::set_replicas(int replicas) { replicas_ = replicas; }

}  // namespace fsdp::plan
