#pragma once
// The step program as text: a fourth reading of fsdp/plan/detail/program.hpp, for a trainer who wants to see what a
// step does on which stream (debugging overlap: which wait holds a stream, where a slot is given back). It runs the
// scheduler's own decisions through the program, as the planners do (plan::detail::run_step: two steps, the second
// listed, when every slot exists and every unit starts sharded), and writes each action down in issue order:
//
//   take <ring> slot <k> [(made)]      a slot taken on the lane; "made" when the slot is new (no wait for a give)
//   give <ring> slot <k>               the slot may be taken again after this point of the lane
//   make / free accumulator            the no-sync accumulator, outside the rings
//   wait <signal> / record <signal>    the unit's events between lanes
//   <work> [pass]                      casts, collectives, copies, the trainer's compute, the optimizer's update
//   views of params|grad end           the trainer's views of the unit's memory end here (it is handed over)
//   <trace event> [pass] [ahead]       on the host lane only: where the host issues a gather, a release, a reduce
//
// The executor issues the same actions in the same order on the backend's streams (fsdp/detail/exec/interpreter.hpp);
// the listing is of one rank, in the order the host issues them, which is each stream's order.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/plan/detail/drive.hpp"
#include "fsdp/plan/memory_plan.hpp"

namespace fsdp {

/// One step of the program, action by action.
struct step_listing {
  struct action {
    std::size_t seq = 0;                         ///< issue order, from 1
    plan::lane lane = plan::lane::host;
    std::size_t unit = plan::detail::step_program::npos;  ///< npos: the step's, not a unit's
    std::string what;
  };
  std::vector<std::string> units;  ///< unit names, in unit-index order
  std::vector<action> actions;     ///< in issue order
  std::string infeasible;          ///< non-empty: the schedule cannot run (why), and nothing is listed

  /// The actions of unit `unit` (every unit's, each named, when empty), per lane, each lane in issue order, with
  /// the issue number that orders actions across lanes. usage_error for a name that is not a unit.
  std::string str(std::string_view unit = {}) const;
};

/// Lists one rank's training step for units with these names and layouts (unit-index order), scheduled and costed
/// as `in` says (the memory planner's inputs), at data-parallel world size `world` (0: not known; then hybrid
/// sharding's all-reduce across replicas is listed wherever it could happen) with `expert` ranks to an expert group
/// (model_options::expert_parallel). A schedule that cannot run is a listing with `infeasible` set.
FSDP_DECL step_listing list_step(const std::vector<std::string>& names, const std::vector<FlatLayout>& layouts,
                                 const memory_plan_inputs& in, int world = 0, int expert = 1);

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/plan/listing.ipp"
#endif
