#pragma once
// Driving the step program (fsdp/plan/detail/program.hpp) through the scheduler's decisions, as a trainer does: the
// passes (walk_passes), the optimizer step's order (optimizer_phase, which Model::step runs on the executor too) and
// one whole step (run_step, which the memory planner, the timeline planner and the listing run).
#include <cstddef>
#include <optional>
#include <vector>

#include "fsdp/core/unit_state.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"
#include "fsdp/plan/detail/program.hpp"

namespace fsdp::plan::detail {

namespace sched = fsdp::detail::sched;  // the scheduler (fsdp/detail/schedule/)

/// Drives one step's passes (every micro-batch, forward then backward) through the scheduler, as a trainer does:
/// on_op(op, unit, ahead, pass) for each decision, on_compute(pass, unit) between entering and leaving a unit.
/// Returns the shortage that stops the schedule (nothing after it ran), or nullopt.
template <class OnOp, class OnCompute>
std::optional<sched::shortage> walk_passes(sched::scheduler& s, const std::vector<std::size_t>& order, OnOp&& on_op,
                                           OnCompute&& on_compute) {
  const std::size_t n = order.size();
  for (int mb = 0; mb < s.facts().micro_batches; ++mb) {
    for (pass_kind k : {pass_kind::forward, pass_kind::backward}) {
      auto emit = [&](sched::op o, std::size_t u, bool ahead) { on_op(o, u, ahead, k); };
      s.begin_pass(k);
      for (std::size_t p = 0; p < n; ++p) {
        if (auto short_of = s.enter(k, order, p, emit)) return short_of;
        on_compute(k, sched::scheduler::unit_at(k, order, p));
        s.leave(k, order, p, emit);
      }
      s.end_pass(k);
    }
  }
  return std::nullopt;
}

/// The optimizer step's order, written once (Model::step runs it on the executor, run_step below in the planners):
/// compute waits for every unit's reduction, the scheduler's before_step (`on_op` carries out its decisions), the
/// step's begin stamp, `inspect()` (the optimizer's gradient inspection, before any update; true: the updates
/// apply), the step's commit when `commits` (plan::commits: there is no inspection), `update(apply)` (the updates,
/// step_program::optimizer_step, with what the caller does around them), then the scheduler's after_step (ZeRO-1's
/// gathers).
template <class I, class OnOp, class Inspect, class Update>
void optimizer_phase(sched::scheduler& s, const std::vector<std::size_t>& order, step_program& prog, I& in,
                     OnOp&& on_op, Inspect&& inspect, bool commits, Update&& update) {
  prog.wait_reductions(in);
  s.before_step(on_op);
  prog.optimizer_begin(in);
  const bool apply = inspect();
  if (commits) prog.commit(in);
  update(apply);
  s.after_step(order, on_op);
}

/// One training step through the program: the passes, then the optimizer step (optimizer_phase). The optimizer's
/// inspection takes no memory of its own in a step (its buffer is the optimizer's, for its whole life).
template <class I>
std::optional<sched::shortage> run_step(sched::scheduler& s, const std::vector<std::size_t>& order, step_program& prog,
                                        I& in, bool commits) {
  auto on_op = [&](sched::op o, std::size_t u, bool ahead, pass_kind k) { prog.op(o, u, ahead, k, in); };
  auto on_compute = [&](pass_kind k, std::size_t u) {
    prog.compute_begin(k, u, in);
    prog.compute_end(k, u, in);
  };
  if (auto short_of = walk_passes(s, order, on_op, on_compute)) return short_of;
  optimizer_phase(
      s, order, prog, in, [&](sched::op o, std::size_t u, bool ahead) { prog.op(o, u, ahead, pass_kind::none, in); },
      [] { return true; }, commits, [&](bool apply) { prog.optimizer_step(in, apply); });
  return std::nullopt;
}

}  // namespace fsdp::plan::detail
