#pragma once
// Fitting a memory budget before anything is allocated: the largest prefetch depth, and the preferred unit
// grouping, whose planned peak (all categories at once, per rank) stays within a budget; and, with offloading
// (fsdp/offload/offload.hpp), the configuration that fits a device budget while moving the fewest bytes over the
// host link. Built on the memory planner, so the answer holds for the scheduler as it runs.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/model_options.hpp"
#include "fsdp/plan/memory_plan.hpp"
#include "fsdp/precision/precision.hpp"
#include "fsdp/prefetch/prefetch.hpp"
#include "fsdp/schedule/config.hpp"
#include "fsdp/sharding/sharding.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/unit/unit_index.hpp"
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

/// Everything but the units and the depth: the strategy, precision, optimizer, slots and accumulation.
struct budget_query {
  strategy_facts strategy{};
  precision_facts precision{};
  int optimizer_states = 0;
  int gather_slots = 0;
  int grad_slots = 2;  ///< model_options::grad_slots
  int max_depth = 4;
  depth_axis axis = depth_axis::both;
  accumulation_options accumulation{};
  int norm_rows = 0;  ///< the optimizer's gradient inspection rows (0: none)
  offload_facts offload{};  ///< what lives in host memory (fit_device_budget varies it)
};

struct budget_choice {
  std::size_t candidate = 0;  ///< index into the candidates given
  int depth = 0;              ///< prefetch depth on the chosen axis
  memory_plan plan;
};

namespace plan_detail {
/// The plan of `units` at prefetch depth `depth` on the query's axis, with the schedule built by the same
/// function a Model uses (sched::build_config).
inline memory_plan plan_at(const planned_units& u, const budget_query& q, int depth) {
  const prefetch_facts pf{q.axis == depth_axis::backward ? 0 : depth, q.axis == depth_axis::forward ? 0 : depth, false,
                          false};
  model_options opt;
  opt.gather_slots = q.gather_slots;
  opt.grad_slots = q.grad_slots;
  opt.accumulation = q.accumulation;
  memory_plan_inputs in;
  in.schedule = sched::build_config(unit_index(u.names), q.strategy, pf, q.precision, opt, q.offload);
  in.costs = plan::make_cost_facts(q.precision, q.strategy.shards_params, q.accumulation, q.offload);
  in.optimizer_states = q.optimizer_states;
  in.norm_rows = q.norm_rows;
  return plan_memory(u.names, u.layouts, in);
}
}  // namespace plan_detail

/// The largest depth in [0, q.max_depth] whose plan is feasible and whose peak total is at most `budget_bytes`,
/// with its plan; nullopt when even depth 0 does not fit. Depths the gather slots cannot serve are skipped.
inline std::optional<budget_choice> largest_prefetch_depth(const planned_units& units, const budget_query& q,
                                                           std::int64_t budget_bytes) {
  if (q.max_depth < 0) detail::fail_usage("budget: max_depth must be >= 0, got ", q.max_depth);
  if (q.gather_slots < 0) detail::fail_usage("budget: gather_slots must be >= 0 (0 = no limit), got ", q.gather_slots);
  for (int d = q.max_depth; d >= 0; --d) {
    memory_plan p = plan_detail::plan_at(units, q, d);
    if (p.feasible() && p.peak.total <= budget_bytes) return budget_choice{0, d, std::move(p)};
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

/// fit_device_budget's answer: the grouping, the offload option, the prefetch depth and their plan (device and host
/// peaks, bytes a step moves over the link).
struct offload_choice {
  std::size_t candidate = 0;  ///< index into the groupings given
  std::size_t offload = 0;    ///< index into the offload options given
  int depth = 0;
  memory_plan plan;
};

/// The cheapest configuration that fits: over every grouping and offload option given (q.offload is ignored), at
/// the largest prefetch depth whose device peak is at most `device_budget` and whose host peak is at most
/// `host_budget`, the one whose step moves the fewest bytes over the host link; ties go to the earlier grouping,
/// then the earlier offload option (list the preferred first). nullopt when nothing fits.
inline std::optional<offload_choice> fit_device_budget(const std::vector<planned_units>& candidates,
                                                       const std::vector<offload_facts>& options, budget_query q,
                                                       std::int64_t device_budget,
                                                       std::int64_t host_budget = std::numeric_limits<std::int64_t>::max()) {
  if (options.empty()) detail::fail_usage("fit_device_budget: no offload options to choose from (list offload::none's facts too)");
  std::optional<offload_choice> best;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    for (std::size_t o = 0; o < options.size(); ++o) {
      q.offload = options[o];
      auto c = largest_prefetch_depth(candidates[i], q, device_budget);
      if (!c || c->plan.host_peak.total > host_budget) continue;
      if (!best || c->plan.link.total() < best->plan.link.total())
        best = offload_choice{i, o, c->depth, std::move(c->plan)};
    }
  return best;
}

}  // namespace fsdp
