#pragma once
// The budget helpers' definitions (fsdp/plan/budget.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <iomanip>
#include <utility>

#include "fsdp/core/unit_index.hpp"
#include "fsdp/detail/schedule/config.hpp"
#include "fsdp/plan/budget.hpp"

namespace fsdp {

FSDP_DECL memory_plan_inputs planner_inputs(const planned_units& u, const budget_query& q, const prefetch_facts& pf) {
  model_options opt;
  opt.gather_slots = q.gather_slots;
  opt.grad_slots = q.grad_slots;
  opt.accumulation = q.accumulation;
  if (q.root_reshards && q.strategy.reshard_after_forward && !u.names.empty())
    opt.reshard_after_forward[u.names.front()] = true;
  memory_plan_inputs in;
  in.schedule = detail::sched::build_config(unit_index(u.names), q.strategy, pf, q.precision, opt, q.offload);
  in.costs = plan::make_cost_facts(q.precision, q.strategy.shards_params, q.accumulation, q.offload);
  in.optimizer_states = q.optimizer_states;
  in.norm_rows = q.norm_rows;
  return in;
}

namespace detail {
FSDP_DECL memory_plan plan_at(const planned_units& u, const budget_query& q, int depth) {
  const prefetch_facts pf{q.axis == depth_axis::backward ? 0 : depth, q.axis == depth_axis::forward ? 0 : depth, false,
                          false};
  return plan_memory(u.names, u.layouts, planner_inputs(u, q, pf));
}
}  // namespace detail

FSDP_DECL std::optional<budget_choice> largest_prefetch_depth(const planned_units& units, const budget_query& q,
                                                              std::int64_t budget_bytes) {
  if (q.max_depth < 0) detail::fail_usage("budget: max_depth must be >= 0, got ", q.max_depth);
  if (q.gather_slots < 0) detail::fail_usage("budget: gather_slots must be >= 0 (0 = no limit), got ", q.gather_slots);
  for (int d = q.max_depth; d >= 0; --d) {
    memory_plan p = detail::plan_at(units, q, d);
    if (p.feasible() && p.peak.total + q.outside_plan_bytes <= budget_bytes) return budget_choice{0, d, std::move(p)};
  }
  return std::nullopt;
}

FSDP_DECL std::optional<budget_choice> fit_memory_budget(const std::vector<planned_units>& candidates,
                                                         const budget_query& q, std::int64_t budget_bytes) {
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (auto c = largest_prefetch_depth(candidates[i], q, budget_bytes)) {
      c->candidate = i;
      return c;
    }
  return std::nullopt;
}

FSDP_DECL std::optional<offload_choice> fit_device_budget(const std::vector<planned_units>& candidates,
                                                          const std::vector<offload_facts>& options, budget_query q,
                                                          std::int64_t device_budget, std::int64_t host_budget) {
  if (options.empty())
    detail::fail_usage("fit_device_budget: no offload options to choose from (list offload::none's facts too)");
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

FSDP_DECL std::string time_ranking::why() const {
  auto ms = [](std::int64_t ns) { return detail::cat(std::fixed, std::setprecision(3), double(ns) * 1e-6, " ms"); };
  auto mib = [](std::int64_t b) {
    if (b < (std::int64_t{1} << 20)) return detail::cat(b, " B");
    return detail::cat(std::fixed, std::setprecision(1), double(b) / (1024.0 * 1024.0), " MiB");
  };
  if (ranked.empty())
    return detail::cat("no configuration fits the budget of ", mib(budget), " (", left_out.size(), " left out)");
  const timed_choice& a = ranked[0];
  const bool unbounded = budget == std::numeric_limits<std::int64_t>::max();
  std::string s =
      detail::cat("'", a.label, "' wins: predicted step ", ms(a.time.step_ns), ", ", ms(a.time.exposed_ns),
                  " of it exposed communication; peak ", mib(a.plan.peak.total),
                  unbounded ? std::string(" (no budget)") : detail::cat(" of the ", mib(budget), " budget"));
  if (ranked.size() == 1) return s + "; it is the only configuration that fits";
  const timed_choice& b = ranked[1];
  s += detail::cat(". The next fastest, '", b.label, "', takes ", ms(b.time.step_ns), " (", ms(b.time.exposed_ns),
                   " exposed)");
  const std::int64_t d_step = b.time.step_ns - a.time.step_ns;
  const std::int64_t d_exposed = b.time.exposed_ns - a.time.exposed_ns;
  if (d_step == 0)
    return s + (a.plan.peak.total < b.plan.peak.total
                    ? detail::cat(": the same step, and the winner needs less memory (", mib(b.plan.peak.total), ")")
                    : std::string(": the same step and peak; the winner is listed first"));
  s += detail::cat(": ", ms(d_step), " slower");
  if (d_exposed > 0) return s + detail::cat(", with ", ms(d_exposed), " more communication left exposed");
  return s + ", with no more communication exposed: the difference is other work (compute waiting for slots, "
             "offload copies, host updates)";
}

}  // namespace fsdp
