#pragma once
// Fitting a memory budget before anything is allocated: the largest prefetch depth, and the preferred unit
// grouping, whose planned peak (all categories at once, per rank) stays within a budget; and, with offloading
// (fsdp/policy/offload.hpp), the configuration that fits a device budget while moving the fewest bytes over the
// host link; and ranking configurations by predicted step time among those that fit (rank_by_time, on the
// timeline planner). Built on the planners, so the answer holds for the scheduler as it runs.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/mesh.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/options/model_options.hpp"
#include "fsdp/plan/memory_plan.hpp"
#include "fsdp/plan/timeline.hpp"
#include "fsdp/policy/precision.hpp"
#include "fsdp/policy/prefetch.hpp"
#include "fsdp/policy/sharding.hpp"
#include "fsdp/policy/wrap.hpp"
#include "fsdp/spec/model_spec.hpp"

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

/// The units of `spec` (global shapes) wrapped by `wrap` and laid out as a Model on `mesh` lays them out: this rank's
/// local spec (ModelSpec::tensor_local, expert_local), dense units over mesh.shards ranks, units of experts over
/// mesh.expert_shards() (layout_on). A usage_error names what cannot be laid out: an expert degree that divides
/// neither the shards nor (with one shard) the replicas, a split the mesh's tensor or expert degree does not divide,
/// a unit holding expert and dense parameters.
template <WrappingPolicy W>
planned_units plan_units(std::string label, const ModelSpec& spec, const W& wrap, const device_mesh& mesh,
                         layout_options opt = {}) {
  problems p;
  if (mesh.expert < 1 || (!mesh::experts_from_shards(mesh) && (mesh.shards != 1 || mesh.replicas % mesh.expert != 0)))
    p.add("plan_units: an expert degree of ", mesh.expert, " divides neither the ", mesh.shards,
          " shards nor, with one "
          "shard, the ",
          mesh.replicas, " replicas of the mesh");
  else {
    const ModelSpec local = spec.tensor_local(mesh.tensor, p).expert_local(mesh.expert, p);
    planned_units out;
    out.label = std::move(label);
    for (const unit_plan& u : make_units(spec, wrap)) {
      if (std::string why = mixed_unit_problem(spec, u); !why.empty()) p.add(why);
      out.names.push_back(u.name);
      out.layouts.push_back(layout_on(local, u, mesh, opt));
    }
    p.require();
    return out;
  }
  p.require();
  return {};
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
  /// Under a strategy that reshards after forward, each candidate's first unit in forward (its wrapping order's
  /// first) is released after its forward too, as model_options::reshard_after_forward[its name] = true does. By
  /// default it is kept from its forward to its backward, as a Model keeps its root.
  bool root_reshards = false;
  /// Device memory a step needs that no plan holds, left beside every plan's peak: NCCL's communicators
  /// (comm::nccl's device_bytes(), measured at construction: add each group's, a hybrid Model's shard and replicate
  /// groups included), the CUDA context's and libraries' workspaces (cuBLAS). 0 by default: the plans alone.
  std::int64_t outside_plan_bytes = 0;
};

struct budget_choice {
  std::size_t candidate = 0;  ///< index into the candidates given
  int depth = 0;              ///< prefetch depth on the chosen axis
  memory_plan plan;
};

/// The planners' inputs (plan_memory, plan_timeline) for `units` under the query with these prefetch facts, with the
/// schedule built by the same function a Model uses (sched::build_config).
FSDP_DECL memory_plan_inputs planner_inputs(const planned_units& u, const budget_query& q, const prefetch_facts& pf);

namespace detail {
/// The plan of `units` at prefetch depth `depth` on the query's axis.
FSDP_DECL memory_plan plan_at(const planned_units& u, const budget_query& q, int depth);
}  // namespace detail

/// The largest depth in [0, q.max_depth] whose plan is feasible and whose peak total, with q.outside_plan_bytes
/// beside it, is at most `budget_bytes`, with its plan; nullopt when even depth 0 does not fit. Depths the gather
/// slots cannot serve are skipped.
FSDP_DECL std::optional<budget_choice> largest_prefetch_depth(const planned_units& units, const budget_query& q,
                                                              std::int64_t budget_bytes);

/// Tries the groupings in the order given (list the preferred first: usually the coarsest, whose larger units
/// mean fewer, more efficient collectives) and returns the first that fits the budget, at the largest depth
/// that fits; nullopt when none fits even without prefetch.
FSDP_DECL std::optional<budget_choice> fit_memory_budget(const std::vector<planned_units>& candidates,
                                                         const budget_query& q, std::int64_t budget_bytes);

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
FSDP_DECL std::optional<offload_choice> fit_device_budget(
    const std::vector<planned_units>& candidates, const std::vector<offload_facts>& options, budget_query q,
    std::int64_t device_budget, std::int64_t host_budget = std::numeric_limits<std::int64_t>::max());

/// One configuration to rank by time (the rest is the query's): a prefetch policy's facts, the gather slots and the
/// precision.
struct time_variant {
  std::string label;
  prefetch_facts prefetch{};
  int gather_slots = 0;
  precision_facts precision{};
};

/// A configuration that fits, with its memory plan and predicted step.
struct timed_choice {
  std::size_t candidate = 0;  ///< index into the groupings given
  std::size_t variant = 0;    ///< index into the variants given
  std::string label;          ///< "grouping / variant"
  memory_plan plan;
  timeline time;
};

/// rank_by_time's answer: the configurations that fit, fastest first, and the ones left out with the reason.
struct time_ranking {
  std::vector<timed_choice> ranked;
  std::vector<std::string> left_out;  ///< "'grouping / variant': why"
  std::int64_t budget = 0;

  const timed_choice* best() const noexcept { return ranked.empty() ? nullptr : &ranked.front(); }

  /// Why the best configuration wins, in a sentence or two: its predicted step and exposed communication, its
  /// peak against the budget, and how much slower the next fastest is and how much of that is communication left
  /// exposed.
  std::string why() const;
};

/// Ranks every grouping x variant that fits `device_budget` (the planned device peak, all categories at once) and
/// `host_budget` (the host peak, with offloading) by predicted step time, fastest first; ties go to the smaller
/// peak, then to the order given. `t`'s compute is ignored: `compute` gives each unit's from its layout (a
/// flops_model, or any callable of a FlatLayout), the same for every variant: precision variants differ in the
/// bytes they move, not in compute time. The query gives the rest (strategy, optimizer, grad slots,
/// accumulation, offload).
template <class Compute>
time_ranking rank_by_time(const std::vector<planned_units>& groupings, const std::vector<time_variant>& variants,
                          budget_query q, time_model t, const Compute& compute, std::int64_t device_budget,
                          std::int64_t host_budget = std::numeric_limits<std::int64_t>::max()) {
  if (variants.empty()) detail::fail_usage("rank_by_time: no variants to rank (give at least one)");
  time_ranking out;
  out.budget = device_budget;
  for (std::size_t g = 0; g < groupings.size(); ++g) {
    const planned_units& u = groupings[g];
    t.compute.clear();
    for (const FlatLayout& l : u.layouts) t.compute.push_back(compute(l));
    for (std::size_t v = 0; v < variants.size(); ++v) {
      const time_variant& var = variants[v];
      q.gather_slots = var.gather_slots;
      q.precision = var.precision;
      const memory_plan_inputs in = planner_inputs(u, q, var.prefetch);
      const std::string label = detail::cat(u.label, " / ", var.label);
      memory_plan plan = plan_memory(u.names, u.layouts, in);
      if (!plan.feasible()) {
        out.left_out.push_back(detail::cat("'", label, "': ", plan.infeasible));
        continue;
      }
      if (plan.peak.total + q.outside_plan_bytes > device_budget) {
        out.left_out.push_back(detail::cat("'", label, "': its peak of ", plan.peak.total, " bytes",
                                           q.outside_plan_bytes ? detail::cat(" and ", q.outside_plan_bytes,
                                                                              " outside the plan") : std::string(),
                                           " is over the budget of ", device_budget));
        continue;
      }
      if (plan.host_peak.total > host_budget) {
        out.left_out.push_back(detail::cat("'", label, "': its host peak of ", plan.host_peak.total,
                                           " bytes is over the host budget of ", host_budget));
        continue;
      }
      timeline time = plan_timeline(u.names, u.layouts, in, t);
      if (!time.feasible()) {  // the memory plan ran the same schedule: not expected, but never ranked as free
        out.left_out.push_back(detail::cat("'", label, "': ", time.infeasible));
        continue;
      }
      out.ranked.push_back({g, v, label, std::move(plan), std::move(time)});
    }
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [](const timed_choice& a, const timed_choice& b) {
    if (a.time.step_ns != b.time.step_ns) return a.time.step_ns < b.time.step_ns;
    return a.plan.peak.total < b.plan.peak.total;
  });
  return out;
}

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/plan/budget.ipp"
#endif
