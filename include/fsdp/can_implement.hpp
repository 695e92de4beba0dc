#pragma once
// Whether a Model<Policy> can be built from a spec, a wrapping policy and options over a world (or a mesh), asked
// before any memory or communicator exists: every refusal the constructor would make, each with its sentence, as a
// value. The constructor asks the same question and builds from the answer's blueprint, so nothing else refuses a
// model (but ranks that disagree, which only the ranks together can see: fsdp/agree/agree.hpp).
//
//   part            refused when
//   tensor          model_options::tensor_parallel is not positive or does not divide the world, or a parameter's
//                   split dimension is not a multiple of it (fsdp/spec/placement.hpp)
//   strategy        its groups do not tile the data-parallel ranks (world / tensor_parallel;
//                   fsdp/policy/sharding.hpp), or the mesh given is not its mesh
//   communicator    the world must be split into groups (hybrid sharding, tensor parallelism) and the communicator has
//                   no split
//   experts         model_options::expert_parallel is not positive, does not divide the shard group (or the
//                   data-parallel ranks) or a stack of experts, the communicator has no split, or a unit holds
//                   experts and dense parameters
//   precision       a parameter asks for a compute dtype other than the policy's
//   wrapping        the spec is empty, a unit name is empty or not UTF-8, a tie is split across units
//   layout          the alignment is not positive
//   options         model_options name a unit that is not one, or hold a value out of range (order, resharding,
//                   prefetch schedule, slots, micro-batches, per-unit offload, division)
//   offload         a unit keeps parts in host memory on a backend without a host domain (not an OffloadBackend)
//   slots           model_options::gather_slots are too few for the schedule (the memory plan is not feasible)
//   budget          the planned peak passes limits.device_budget or limits.host_budget (when given)
//
//   auto r = fsdp::can_implement<Policy>(spec, fsdp::wrap::by_prefix{"h."}, options, 8, {.optimizer_states = 2});
//   if (!r) std::puts(r.text().c_str());   // one sentence per refusal, in the order the constructor meets them
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/detail/schedule/config.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/options/model_options.hpp"
#include "fsdp/plan/memory_plan.hpp"
#include "fsdp/policy/sharding.hpp"
#include "fsdp/policy/wrap.hpp"
#include "fsdp/policy_facts.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp {

/// One reason a model cannot be built: the part at fault (see the table above) and the sentence a usage_error
/// would carry (without the "fsdp: " prefix).
struct refusal {
  std::string part;
  std::string sentence;
  friend bool operator==(const refusal&, const refusal&) = default;
};

/// What the checks built on the way, which the constructor starts from: the mesh, this rank's spec (local shapes
/// under tensor parallelism: ModelSpec::tensor_local), the units and their layouts, and the schedule's facts
/// (present only when nothing was refused).
struct model_blueprint {
  device_mesh mesh{};
  ModelSpec spec;
  unit_index units;
  std::vector<FlatLayout> layouts;
  std::optional<detail::sched::config> schedule;
};

struct implementation_limits {
  int optimizer_states = 0;       ///< fp32 values of optimizer state per element the plan counts (AdamW: 2)
  int norm_rows = 0;              ///< the optimizer's gradient inspection rows (0: none)
  std::int64_t device_budget = 0; ///< bytes; 0: no limit
  std::int64_t host_budget = 0;   ///< bytes of host memory (offloaded parts); 0: no limit
};

/// can_implement's answer: true when nothing is refused.
struct implementability {
  std::vector<refusal> refusals;
  model_blueprint blueprint;
  /// The memory plan (with limits' optimizer states and rows), when units and schedule could be built.
  std::optional<memory_plan> plan;

  explicit operator bool() const noexcept { return refusals.empty(); }
  /// Every refusal's sentence, one per line.
  std::string text() const;
};

namespace detail {
/// What can_implement asks of a policy's types, as values, so that its checks compile once rather than per policy.
struct policy_shape {
  policy_facts facts;       ///< over the data-parallel ranks (1 when they are not a positive whole number)
  device_mesh mesh;         ///< the strategy's mesh over them ({1, 1} when it has problems), tensor 1
  problems mesh_problems;   ///< why the strategy's groups do not tile the world
  bool splittable;          ///< the communicator has split(color, key)
  bool all_to_all;          ///< the communicator is an AllToAllCollective
  bool offload_backend;     ///< the backend is an OffloadBackend
  dtype compute;            ///< the compute dtype
};

/// The ranks among which the strategy shards and replicates: the world over the tensor groups (the world itself
/// when `tensor` does not divide it: can_implement refuses that).
constexpr int data_parallel_ranks(int world, int tensor) noexcept {
  return tensor > 0 && world % tensor == 0 ? world / tensor : world;
}

template <class Policy>
policy_shape shape_of(int world, int tensor) {
  const int dp = data_parallel_ranks(world, tensor);
  policy_shape s{facts_of_policy<Policy>(dp > 0 ? dp : 1),
                 {},
                 {},
                 SplittableCollective<typename Policy::communicator>,
                 AllToAllCollective<typename Policy::communicator>,
                 OffloadBackend<typename Policy::backend_type>,
                 dtype_of_v<typename Policy::precision::compute_type>};
  s.mesh = mesh_of<typename Policy::sharding>(dp, s.mesh_problems);
  return s;
}

/// can_implement's checks, given the policy's shape and the wrapping's units (and their problems).
FSDP_DECL implementability can_implement(const policy_shape& shape, const ModelSpec& spec,
                                         const std::vector<unit_plan>& plans, const problems& wrapping,
                                         const model_options& opt, int world, const implementation_limits& limits);
}  // namespace detail

/// Every refusal Model<Policy>(comm, spec, wrap, init, opt) would make on a communicator of `world` ranks.
template <class Policy, WrappingPolicy W>
implementability can_implement(const ModelSpec& spec, const W& wrap, const model_options& opt, int world,
                               const implementation_limits& limits = {}) {
  problems wrapping;
  const std::vector<unit_plan> plans = make_units(spec, wrap, wrapping);
  return detail::can_implement(detail::shape_of<Policy>(world, opt.tensor_parallel), spec, plans, wrapping, opt, world,
                               limits);
}

/// can_implement on a given mesh: also refused when it is not the strategy's mesh over its world.
template <class Policy, WrappingPolicy W>
implementability can_implement(const ModelSpec& spec, const W& wrap, const model_options& opt, const device_mesh& mesh,
                               const implementation_limits& limits = {}) {
  implementability out = can_implement<Policy>(spec, wrap, opt, mesh.world(), limits);
  const bool strategy_refused =
      !out.refusals.empty() && (out.refusals.front().part == "tensor" || out.refusals.front().part == "strategy");
  if (!strategy_refused && out.blueprint.mesh != mesh)
    out.refusals.insert(
        out.refusals.begin(),
        {"strategy",
         fsdp::detail::cat("sharding strategy ", Policy::sharding::name, " over ", mesh.world(),
                           " ranks with model_options::tensor_parallel = ", opt.tensor_parallel, " makes a mesh of ",
                           fsdp::mesh::sizes_text(out.blueprint.mesh), " (", fsdp::mesh::names_text(), "), not the ",
                           fsdp::mesh::sizes_text(mesh), " asked for")});
  return out;
}

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/can_implement.ipp"
#endif
