#pragma once
// Fitting a memory budget before anything is allocated: the largest prefetch depth, and the preferred unit
// grouping, whose planned peak (all categories at once, per rank) stays within a budget. Built on the memory
// planner, so the answer holds for the scheduler as it runs.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/plan/memory_plan.hpp"
#include "fsdp/sharding/sharding.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/wrap/wrap.hpp"

namespace fsdp {

/// The units a wrapping policy makes of a spec, laid out for a shard group: what the planner needs.
struct planned_units {
  std::string label;  ///< how the caller names this grouping (reports)
  std::vector<std::string> names;
  std::vector<FlatLayout> layouts;
};

template <WrappingPolicy W>
planned_units plan_units(std::string label, const ModelSpec& spec, const W& wrap, int shard_group,
                         layout_options opt = {}) {
  planned_units out;
  out.label = std::move(label);
  for (const unit_plan& p : make_units(spec, wrap)) {
    out.names.push_back(p.name);
    out.layouts.push_back(FlatLayout::build(spec, p, shard_group, opt));
  }
  return out;
}

/// Which prefetch depth the budget helpers vary.
enum class depth_axis : std::uint8_t { forward, backward, both };

/// Everything but the units and the depth: the strategy, the optimizer, dtypes and slots.
struct budget_query {
  strategy_facts strategy{};
  int optimizer_states = 0;
  std::int64_t compute_bytes = 4;
  std::int64_t reduce_bytes = 4;
  int gather_slots = 0;
  int max_depth = 4;
  depth_axis axis = depth_axis::both;
};

struct budget_choice {
  std::size_t candidate = 0;  ///< index into the candidates given
  int depth = 0;              ///< prefetch depth on the chosen axis
  memory_plan plan;
};

namespace plan_detail {
inline memory_plan plan_at(const planned_units& u, const budget_query& q, int depth) {
  memory_plan_inputs in;
  in.schedule.shards_params = q.strategy.shards_params;
  in.schedule.reshard_after_forward.assign(u.layouts.size(), q.strategy.reshard_after_forward);
  in.schedule.forward_depth = q.axis == depth_axis::backward ? 0 : depth;
  in.schedule.backward_depth = q.axis == depth_axis::forward ? 0 : depth;
  in.schedule.gather_slots = q.gather_slots;
  in.optimizer_states = q.optimizer_states;
  in.compute_bytes = q.compute_bytes;
  in.reduce_bytes = q.reduce_bytes;
  return plan_memory(u.names, u.layouts, in);
}
}  // namespace plan_detail

/// The largest depth in [0, q.max_depth] whose planned peak total is at most `budget_bytes`, with its plan;
/// nullopt when even depth 0 does not fit. Depths that the gather slots cannot serve are skipped.
inline std::optional<budget_choice> largest_prefetch_depth(const planned_units& units, const budget_query& q,
                                                           std::int64_t budget_bytes) {
  if (q.max_depth < 0) detail::fail_usage("budget: max_depth must be >= 0, got ", q.max_depth);
  // checked here: below, a plan that fails for lack of gather slots only rules its depth out
  if (q.gather_slots < 0) detail::fail_usage("budget: gather_slots must be >= 0 (0 = no limit), got ", q.gather_slots);
  for (int d = q.max_depth; d >= 0; --d) {
    memory_plan p;
    try {
      p = plan_detail::plan_at(units, q, d);
    } catch (const usage_error&) {
      continue;  // too few gather slots for this policy
    }
    if (p.peak.total <= budget_bytes) return budget_choice{0, d, std::move(p)};
  }
  return std::nullopt;
}

/// Tries the groupings in the order given (list the preferred first: usually the coarsest, whose larger units
/// mean fewer, more efficient collectives) and returns the first that fits the budget, at the largest depth
/// that fits; nullopt when none fits even without prefetch.
inline std::optional<budget_choice> fit_memory_budget(const std::vector<planned_units>& candidates,
                                                      const budget_query& q, std::int64_t budget_bytes) {
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (auto c = largest_prefetch_depth(candidates[i], q, budget_bytes)) {
      c->candidate = i;
      return c;
    }
  return std::nullopt;
}

}  // namespace fsdp
