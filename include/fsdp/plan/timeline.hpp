#pragma once
// Timeline planner: one rank's training step in modelled time, known before the first step. It runs the
// scheduler's own decisions (fsdp/detail/schedule/scheduler.hpp) through the step program
// (fsdp/plan/detail/program.hpp, which the executor interprets and the memory planner reads too) and gives every action
// a time: each stream runs its work in issue order, a wait holds a stream until the event it waits for, a reused slot
// is taken only after the point it was given back, and the host issues everything at once (a trainer on a GPU, or on
// the host backend's threaded compute stream, runs ahead of its streams). Each step ends with a synchronize, as a
// trainer that reads its loss does. Two steps are run; the second (all slots made, every unit sharded at its start) is
// reported.
//
// The durations (time_model):
//   compute       the unit's forward and backward, given per unit (or from FLOPs and a throughput: flops_model)
//   collectives   comm::link_model (fsdp/comm/link.hpp, the rule comm::local's modelled link sleeps for): latency
//                 + unsharded bytes x the ring factor / bandwidth, in the shard group (the layouts' world; the
//                 whole world for no_shard's all-reduce) and, under hybrid sharding, across the replicas on their
//                 own link. Concurrent collectives on the gather and reduce streams do not share bandwidth.
//                 time_model::serial_collectives: every collective, of every group, runs one at a time in the order
//                 it was issued, whatever its stream (comm::nccl's default: one NCCL communicator per group, and
//                 under hybrid sharding the groups' collectives on one stream), so a prefetched all-gather waits for
//                 a reduce-scatter issued before it, a replica all-reduce for a shard group's gather, and the other
//                 way round; its cast runs just before it. Off: each stream's collectives run when their stream gets
//                 there (comm::local, comm::nccl with nccl_channels::per_stream: fsdp/comm/nccl_channels.hpp).
//   memory-bound  casts, zeroing, accumulation, the addition into the shard and the optimizer's kernels: bytes
//                 read and written / the device's memory bandwidth (0: free); host functions / the host's
//   copies        offload uploads, downloads and staging: bytes / the host link's bandwidth (0: free)
//
// The answer: the step time (start to synchronize), compute, communication and exposed communication (collective
// time not covered by compute, by trace::intervals_of, the rules trace::summarize measures with), exposed time per
// unit, the critical path, and the predicted timeline as trace events (rank 0, step 1, nanoseconds from the
// step's start) that fsdp/observe/chrome_trace.hpp writes for Perfetto. Integer nanoseconds throughout, each
// duration computed once from doubles and truncated: the same inputs give the same prediction, bit for bit, on
// every machine with IEEE-754 double arithmetic (x86-64's SSE2, AArch64; not x87, not -ffast-math).
//
// Left out (time a real step spends that this model does not): the gradient inspection (norms, their all-reduce
// and the decision's kernel and copy: clipping, non-finite checks, loss scaling), zero_grad(), check_collectives'
// comparisons and check_views' fills, kernel launch and host issue overheads, and contention: concurrent collectives on
// the gather and reduce streams each get the whole link, and compute does not slow while they run.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/comm/link.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/observe/trace.hpp"
#include "fsdp/plan/detail/drive.hpp"
#include "fsdp/plan/memory_plan.hpp"
#include "fsdp/policy/sharding.hpp"

namespace fsdp {

/// A unit's modelled compute, per pass; under tensor parallelism, the bytes the trainer's own tensor-parallel
/// all-reduces move in it (each pass's, summed), and with experts the bytes its token exchanges send from this rank
/// (each pass's all_to_all_v, dispatch and combine, summed), which run on the compute stream: timed on
/// time_model::tensor_link over time_model::tensor ranks, and on time_model::expert_link as all_to_alls over
/// time_model::expert ranks, and added to the pass's compute.
struct unit_time {
  std::chrono::nanoseconds forward{0};
  std::chrono::nanoseconds backward{0};
  std::int64_t tensor_forward_bytes = 0;
  std::int64_t tensor_backward_bytes = 0;
  std::int64_t expert_forward_bytes = 0;
  std::int64_t expert_backward_bytes = 0;
};

/// Compute from FLOPs: forward `forward_flops` and backward `backward_flops` per parameter element per token (2 and
/// 4: a matrix product and its two gradients), `tokens` per rank per micro-batch, at `flops_per_second`.
/// Parameters named in `lookups` (embedding tables) cost nothing: their forward is a lookup.
struct flops_model {
  double tokens = 0;
  double flops_per_second = 0;
  double forward_flops = 2;
  double backward_flops = 4;
  std::vector<std::string> lookups;

  unit_time operator()(const FlatLayout& l) const;
};

/// What time each piece of a step takes (see the top of this file).
struct time_model {
  /// Per unit index: its compute. plan_timeline needs one entry per unit.
  std::vector<unit_time> compute;
  /// The data-parallel ranks. The shard group is the layouts' world; the replicas (hybrid sharding) are world /
  /// shard group; no_shard all-reduces over the world.
  int world = 1;
  comm::link_model link{};          ///< the shard group's collectives
  comm::link_model replica_link{};  ///< hybrid sharding: the all-reduce across replicas (bandwidth 0: free)
  /// Ranks of a tensor group (model_options::tensor_parallel; the model sets it) and their link: the all-reduce of
  /// partial gradients (tp::partial_grad) at the end of a unit's backward, and the trainer's own tensor-parallel
  /// all-reduces (unit_time's bytes), both on the compute stream (bandwidth 0: free).
  int tensor = 1;
  comm::link_model tensor_link{};
  /// Ranks of an expert group (model_options::expert_parallel; the model sets it) and its link: the trainer's token
  /// exchanges (unit_time's expert bytes; bandwidth 0: free). The expert shard group's link, where an expert unit's
  /// (FlatLayout::experts) gathers and reductions go (empty: `link`'s): its ranks are the layout's world when
  /// parameters are sharded, world / expert when they are all-reduced.
  int expert = 1;
  comm::link_model expert_link{};
  std::optional<comm::link_model> expert_shard_link;
  /// The world communicator's link (every rank: world x tensor): the step's commit, an all-reduce of one element of
  /// the gradient's dtype on the compute stream before the first update (model_options::commit_step; bandwidth 0:
  /// free).
  comm::link_model world_link{};
  double memory_bytes_per_second = 0;  ///< device memory (0: memory-bound work takes no time)
  double host_bytes_per_second = 0;    ///< host memory: host functions of offloading (0: free)
  double pcie_bytes_per_second = 0;    ///< the host link: offload copies (0: free)
  /// Every collective (of every group) one at a time in issue order, whatever its stream (comm::nccl's default,
  /// nccl_channels::one); false: each stream's when the stream gets there (comm::local; nccl_channels::per_stream).
  bool serial_collectives = false;
};

/// Sets t's links, world, tensor and expert degrees for the mesh `m` on the cluster `c` (comm::cluster_links::group,
/// ranks placed as device_mesh places them): `link`, the shard group's (m.shards ranks, m.tensor apart; the whole
/// data-parallel group when m.shards is 1: no_shard's all-reduce); `replica_link`, the replicate group's (m.replicas
/// ranks, m.shards x m.tensor apart); `tensor_link`, the tensor group's (consecutive ranks); `expert_link`, the
/// expert group's (m.expert ranks, m.tensor apart); `expert_shard_link`, the expert shard group's when m.expert > 1
/// (m.expert_shards() ranks, m.expert x m.tensor apart; the data-parallel ranks holding the same experts when m.shards
/// is 1). usage_error, from cluster_links::group, for a group that does not tile the nodes.
FSDP_DECL void place_on_cluster(time_model& t, const comm::cluster_links& c, const device_mesh& m);

/// A piece of work on the critical path.
struct path_step {
  plan::lane lane = plan::lane::compute;
  plan::job what = plan::job::compute;
  std::string unit;  ///< empty for none
  pass_kind pass = pass_kind::none;
  std::int64_t begin_ns = 0, end_ns = 0;  ///< from the step's start
};

/// A unit's collectives in the predicted step.
struct unit_exposure {
  std::string unit;
  std::int64_t gather_ns = 0;   ///< its all-gathers (and casts, widenings too), summed
  std::int64_t reduce_ns = 0;   ///< its reductions
  std::int64_t exposed_ns = 0;  ///< of those, not covered by compute
};

/// The planner's answer.
struct timeline {
  std::vector<std::string> units;
  std::int64_t step_ns = 0;     ///< from the step's first issue to the synchronize at its end
  std::int64_t compute_ns = 0;  ///< union of compute intervals (units and optimizer)
  std::int64_t comm_ns = 0;     ///< union of collective intervals
  std::int64_t exposed_ns = 0;  ///< collective time not covered by compute
  /// The step's commit (model_options::commit_step, on time_model::world_link): all of it exposed, since the compute
  /// stream waits for it before the updates. Counted in step_ns and, inside the optimizer step, in compute_ns, not
  /// in comm_ns or exposed_ns (the trace has no event of its own for it).
  std::int64_t commit_ns = 0;
  std::vector<unit_exposure> by_unit;  ///< per unit index
  std::vector<path_step> critical_path;  ///< first to last: each piece waited for the one before it
  std::vector<trace::event> events;      ///< the predicted step: rank 0, step 1, ns from its start
  /// Empty when the schedule runs; otherwise why it cannot (memory_plan::infeasible's sentence).
  std::string infeasible;

  bool feasible() const noexcept { return infeasible.empty(); }
  double exposed_fraction() const noexcept { return step_ns > 0 ? double(exposed_ns) / double(step_ns) : 0.0; }

  /// The critical path, one piece per line: "compute   h.0 forward   1.000 - 3.000 ms".
  std::string critical_path_text() const;

  /// A printable summary: the step, its parts, each unit's collectives and the critical path.
  std::string report() const;
};

/// Predicts one rank's training step for units with these names and layouts (unit-index order), scheduled and
/// costed as `in` says (the memory planner's inputs), with the durations of `t`. usage_error for a time model that
/// does not fit the units (naming what is wrong); a schedule that cannot run is a timeline that is not feasible.
FSDP_DECL timeline plan_timeline(const std::vector<std::string>& names, const std::vector<FlatLayout>& layouts,
                                 const memory_plan_inputs& in, const time_model& t);

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/plan/timeline.ipp"
#endif
