#pragma once
// A constructed Model's plans: the planners of fsdp/plan/ (pure functions of names, layouts and inputs) run on what
// the model holds, its schedule, its recorded or declared order, its costs and its world, with an optimizer's state.
// Free functions beside the planners, not Model members: a file that never plans does not read the timeline planner
// or the listing.
//
//   fsdp::plan_memory(model, optimizer)             this rank's peak by category and in total (plan/memory_plan.hpp)
//   fsdp::plan_memory(model, states, norm_rows)     the same from an optimizer's state count and inspection rows
//   fsdp::plan_timeline(model, time_model, states)  this rank's step in time (plan/timeline.hpp)
//   fsdp::list_step(model, optimizer | states)      this rank's step program as text (plan/listing.hpp)
//   fsdp::memory_row(model, optimizer)              the measured peak beside the planned one (memory/memory_table.hpp)
//
// Any Model<Policy> (each is a model_core<Backend, Communicator>), and any optimizer with states_per_element() and
// norm_rows() (fsdp::optim's).
#include <concepts>
#include <cstdint>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/hash.hpp"
#include "fsdp/memory/memory_table.hpp"
#include "fsdp/model_access.hpp"
#include "fsdp/model_core.hpp"
#include "fsdp/plan/listing.hpp"
#include "fsdp/plan/memory_plan.hpp"
#include "fsdp/plan/timeline.hpp"

namespace fsdp {

/// An optimizer as the plans read it: the fp32 values it keeps per parameter element and its gradient inspection
/// rows (0 without inspection).
template <class O>
concept PlannedOptimizer = requires(const O& o) {
  { o.states_per_element() } -> std::convertible_to<int>;
  { o.norm_rows() } -> std::convertible_to<int>;
};

/// The memory planner's prediction for this rank: peak bytes by category and in total, with a printable table.
/// `optimizer_states`: fp32 values per parameter element the optimizer keeps (its states_per_element());
/// `norm_rows`: its gradient inspection rows (its norm_rows(), 0 without inspection). What the communicators took
/// from the device beside the plan (comm::nccl's buffers) is in outside_plan_bytes, of that connecting's in
/// outside_plan_connect_bytes.
template <class B, class C>
memory_plan plan_memory(const model_core<B, C>& model, int optimizer_states, int norm_rows = 0) {
  memory_plan p = plan_memory(model_access::unit_names(model), model_access::layouts(model),
                              model_access::plan_inputs(model, optimizer_states, norm_rows));
  for (const C* c : model_access::communicators(model)) {
    p.outside_plan_bytes += comm::device_bytes(*c);
    p.outside_plan_connect_bytes += comm::connect_bytes(*c);
  }
  return p;
}

/// The plan with an optimizer's state and gradient inspection.
template <class B, class C, PlannedOptimizer Optimizer>
memory_plan plan_memory(const model_core<B, C>& model, const Optimizer& opt) {
  return plan_memory(model, opt.states_per_element(), opt.norm_rows());
}

/// The timeline planner's prediction of this rank's step with the durations of `t`, whose world, tensor and expert
/// degrees the model sets (its mesh), and whose serial_collectives is its communicator's (comm::serial_collectives:
/// comm::nccl true under its default one communicator; comm::local, and a communicator that does not say, false), so
/// that the plan models what runs here. `optimizer_states` as for plan_memory.
template <class B, class C>
timeline plan_timeline(const model_core<B, C>& model, time_model t, int optimizer_states) {
  t.world = model.mesh().data_parallel();
  t.tensor = model.mesh().tensor;
  t.expert = model.mesh().expert;
  t.serial_collectives = comm::serial_collectives(*model_access::communicators(model).front());
  return plan_timeline(model_access::unit_names(model), model_access::layouts(model),
                       model_access::plan_inputs(model, optimizer_states, 0), t);
}

/// The step program of this rank as text, action by action on each stream: what the executor issues, for debugging
/// overlap. `optimizer_states` as for plan_memory.
template <class B, class C>
step_listing list_step(const model_core<B, C>& model, int optimizer_states) {
  return list_step(model_access::unit_names(model), model_access::layouts(model),
                   model_access::plan_inputs(model, optimizer_states, 0), model.mesh().data_parallel(),
                   model.mesh().expert);
}

/// The listing with an optimizer's state.
template <class B, class C, class Optimizer>
  requires requires(const Optimizer& o) {
    { o.states_per_element() } -> std::convertible_to<int>;
  }
step_listing list_step(const model_core<B, C>& model, const Optimizer& opt) {
  return list_step(model, opt.states_per_element());
}

/// This rank's row of fsdp::memory_table: the model's measured peak (Model::memory().peak), the plan's
/// (plan_memory(model, opt).peak, with the optimizer's state and inspection rows), and what the plan leaves out under
/// the model's debug options (model_options::check_collectives' comparison scratch).
template <class B, class C, PlannedOptimizer Optimizer>
rank_memory memory_row(model_core<B, C>& model, const Optimizer& opt) {
  const std::int64_t scratch =
      model.options().check_collectives ? agree::agreement_scratch_bytes(model.comm().size()) : 0;
  return {model.comm().rank(), model.memory().peak, plan_memory(model, opt).peak, scratch};
}

}  // namespace fsdp
