#pragma once
// can_implement's definitions (fsdp/can_implement.hpp): included by that header, or compiled once by fsdp/src.hpp
// under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <string_view>
#include <utility>

#include "fsdp/can_implement.hpp"
#include "fsdp/detail/exec/reduction.hpp"
#include "fsdp/detail/schedule/pass_cursor.hpp"
#include "fsdp/memory/cost.hpp"

namespace fsdp {

FSDP_DECL std::string implementability::text() const {
  std::string out;
  for (const refusal& r : refusals) out += r.sentence + "\n";
  return out;
}

namespace detail {
FSDP_DECL implementability can_implement(const policy_shape& shape, const ModelSpec& spec,
                                         const std::vector<unit_plan>& plans, const problems& wrapping,
                                         const model_options& opt, int world, const implementation_limits& limits) {
  const strategy_facts& sf = shape.facts.strategy;
  const precision_facts& pf = shape.facts.precision;
  const std::string_view strategy_name = sf.name;
  implementability out;
  auto refuse = [&](std::string_view part, const problems& p) {
    for (const std::string& s : p.list()) out.refusals.push_back({std::string(part), s});
  };

  // the tensor dimension first: the strategy's groups are over what is left of the world
  const int tensor = opt.tensor_parallel;
  problems tensor_problems;
  if (tensor < 1)
    tensor_problems.add("model_options::tensor_parallel must be at least 1 (no tensor parallelism), got ", tensor);
  else if (world > 0 && world % tensor != 0)
    tensor_problems.add("model_options::tensor_parallel = ", tensor, " does not divide the world of ", world,
                        " ranks: the mesh is ", fsdp::mesh::names_text(), ", and its size must be the world");
  else
    out.blueprint.spec = spec.tensor_local(tensor, tensor_problems);
  refuse("tensor", tensor_problems);
  const int dp_world = data_parallel_ranks(world, tensor);

  const problems& strat = shape.mesh_problems;
  device_mesh mesh = shape.mesh;
  if (tensor_problems.empty()) mesh.tensor = tensor;
  refuse("strategy", strat);

  // the expert dimension, out of the data-parallel ranks (fsdp/core/mesh.hpp): the shards', or the replicas' where
  // the strategy keeps whole parameters
  const int expert = opt.expert_parallel;
  problems expert_problems;
  if (expert < 1) {
    expert_problems.add("model_options::expert_parallel must be at least 1 (every rank holds every expert), got ",
                        expert);
  } else if (expert > 1 && tensor_problems.empty() && strat.empty()) {
    if (sf.splits_world() && mesh.shards % expert != 0)
      expert_problems.add("model_options::expert_parallel = ", expert, " does not divide the shard group of ",
                          mesh.shards, " ranks (sharding strategy ", strategy_name, " over ", mesh.replicas,
                          " replicas): an expert group is ranks of one replica");
    else if (!sf.splits_world() && dp_world % expert != 0)
      expert_problems.add("model_options::expert_parallel = ", expert, " does not divide the ", dp_world,
                          " data-parallel ranks (the world of ", world,
                          " over model_options::tensor_parallel = ", tensor, ")");
    else if (!shape.splittable)
      expert_problems.add("model_options::expert_parallel = ", expert,
                          " needs a communicator with split(color, key) to make the expert groups; this policy's "
                          "communicator has none (comm::local on the host, comm::mpi and comm::nccl do)");
    else
      out.blueprint.spec = out.blueprint.spec.expert_local(expert, expert_problems);
    if (expert_problems.empty()) mesh.expert = expert;
  }
  // a unit holds experts or dense parameters: their gathers and reductions go to different groups
  for (const unit_plan& p : plans)
    if (std::string why = mixed_unit_problem(spec, p); !why.empty()) expert_problems.add(why);
  refuse("experts", expert_problems);
  out.blueprint.mesh = mesh;
  if (tensor > 1 && !shape.splittable)
    out.refusals.push_back(
        {"communicator", fsdp::detail::cat("model_options::tensor_parallel = ", tensor,
                                           " needs a communicator with "
                                           "split(color, key) to make the tensor and data-parallel groups; this "
                                           "policy's communicator has none (comm::local on the host, comm::mpi and "
                                           "comm::nccl do)")});
  else if (strat.empty() && !shape.splittable && sf.splits_world())
    out.refusals.push_back(
        {"communicator", fsdp::detail::cat("sharding strategy ", strategy_name, " shards over ", mesh.shards, " of ",
                                           world, " ranks and replicates over ", mesh.replicas,
                                           " (hybrid sharding), which needs a communicator with split(color, key) to "
                                           "make the shard and replicate groups; this policy's communicator has none "
                                           "(comm::local on the host, comm::mpi and comm::nccl do)")});

  if (pf.quantizes_reduction()) {
    // qgZ: the quantized slices go through all_to_all into shards, and the sum is this rank's shard
    const std::string what = fsdp::detail::cat("the precision reduces gradients quantized to ", name_of(pf.reduce),
                                               " in blocks of ", pf.reduce_block, " (all_to_all, then a sum in fp32)");
    if (!sf.shards_params)
      out.refusals.push_back({"precision", fsdp::detail::cat(what, ", which reduces into shards; sharding strategy ",
                                                             strategy_name, " keeps whole replicas: reduce in a "
                                                             "plain dtype (float or fsdp::bfloat16) or shard")});
    else if (strat.empty() && sf.splits_world())
      out.refusals.push_back(
          {"precision", fsdp::detail::cat(what, ", within one shard group; sharding strategy ", strategy_name,
                                          " also all-reduces across ", mesh.replicas, " replicas, which a quantized "
                                          "reduction does not do: reduce in a plain dtype, or shard over the world")});
    if (!shape.all_to_all)
      out.refusals.push_back({"communicator", fsdp::detail::cat(what, ", and this policy's communicator has no "
                                                                "all_to_all (fsdp::AllToAllCollective: comm::local, "
                                                                "comm::mpi and comm::nccl have it)")});
  }

  const dtype compute = shape.compute;
  for (const ParamSpec& p : spec.params())
    if (p.compute_dtype && *p.compute_dtype != compute)
      out.refusals.push_back({"precision", fsdp::detail::cat("parameter '", p.name, "' asks for compute dtype ",
                                                             name_of(*p.compute_dtype),
                                                             " but the precision policy computes in ",
                                                             name_of(compute))});

  refuse("wrapping", wrapping);
  problems layout;
  if (opt.layout.align <= 0) layout.add("layout alignment must be positive, got ", opt.layout.align);
  if (const int block = pf.reduce_block;
      block > 0 && block != pf.gather_block && opt.layout.align > 0 && opt.layout.align % block != 0)
    layout.add("the precision reduces gradients in blocks of ", block, " elements with a scale each, and a block must "
               "not cross a shard: shards are multiples of model_options::layout.align, which is ", opt.layout.align,
               "; set it to a multiple of ", block);
  if (const int block = pf.gather_block; block > 0 && opt.layout.align > 0 && opt.layout.align % block != 0)
    layout.add("the precision gathers in blocks of ", block, " elements with a scale each, and a block must not "
               "cross a shard: shards are multiples of model_options::layout.align, which is ", opt.layout.align,
               "; set it to a multiple of ", block);
  refuse("layout", layout);
  if (!tensor_problems.empty() || !strat.empty() || !expert_problems.empty() || !wrapping.empty() || !layout.empty())
    return out;  // nothing to lay out

  std::vector<std::string> names;
  for (const unit_plan& p : plans) {
    names.push_back(p.name);
    out.blueprint.layouts.push_back(layout_on(out.blueprint.spec, p, mesh, opt.layout));
  }
  out.blueprint.units = unit_index(names);
  const unit_index& units = out.blueprint.units;

  problems options;
  const std::vector<std::size_t> order =
      detail::sched::pass_cursor::declared_order(units, opt.forward_order, opt.record_order, options);
  const offload_facts policy_offload = shape.facts.offload;
  detail::sched::config cfg =
      detail::sched::build_config(units, sf, shape.facts.prefetch, pf, opt, policy_offload, options);
  const detail::exec::reduce_facts division = detail::exec::division_facts(opt.division, dp_world, options);
  refuse("options", options);
  if (!shape.offload_backend)
    for (std::size_t u = 0; u < units.size(); ++u)
      if (cfg.offload[u].any())
        out.refusals.push_back(
            {"offload", fsdp::detail::cat("model_options::offload_units keeps parts of unit '", units.name(u),
                                          "' in host memory, but the policy's backend has no host memory domain or "
                                          "copy streams (it does not model fsdp::OffloadBackend)")});
  if (!out.refusals.empty()) return out;

  memory_plan_inputs in;
  in.schedule = cfg;
  in.order = order;
  in.costs = plan::make_cost_facts(pf, sf.shards_params, opt.accumulation, policy_offload, division.prescale != 1.0f);
  in.optimizer_states = limits.optimizer_states;
  in.norm_rows = limits.norm_rows;
  out.plan = plan_memory(names, out.blueprint.layouts, in);
  out.blueprint.schedule = std::move(cfg);
  const memory_plan& plan = *out.plan;
  if (opt.gather_slots > 0 && !plan.feasible())
    out.refusals.push_back({"slots", fsdp::detail::cat("model_options::gather_slots = ", opt.gather_slots,
                                                       " is too few for this policy: ", plan.infeasible)});
  if (limits.device_budget > 0 && plan.peak.total > limits.device_budget)
    out.refusals.push_back({"budget", fsdp::detail::cat("the planned device peak of ", plan.peak.total,
                                                        " bytes per rank passes the budget of ", limits.device_budget,
                                                        " bytes")});
  if (limits.host_budget > 0 && plan.host_peak.total > limits.host_budget)
    out.refusals.push_back({"budget", fsdp::detail::cat("the planned host peak of ", plan.host_peak.total,
                                                        " bytes per rank passes the host budget of ",
                                                        limits.host_budget, " bytes")});
  return out;
}
}  // namespace detail

}  // namespace fsdp
