#pragma once
// The step program's vocabulary (fsdp/plan/detail/program.hpp): where an action happens (lane), the executor's slot
// rings (ring), its per-unit events (signal), the trainer's views (views), the work (job), each with its printable
// name, and what a trace event carries (payload_of). The executor, the planners, the listing and the trace read these
// names; only program.hpp puts them in order.
#include <cstddef>
#include <cstdint>

#include "fsdp/comm/concept.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/observe/trace.hpp"

namespace fsdp::plan {

/// What a trace event of a unit with costs `c` carries: a gather's events the all-gather's bytes; a reduction's the
/// reduction's bytes and collective (`reduction`: reduction_of the facts); the others nothing. The executor's
/// stamps and the time reading's events both ask this.
struct stamp_payload {
  std::int64_t bytes = 0;
  collective coll = collective::all_gather;
};
inline stamp_payload payload_of(trace::kind k, const unit_costs& c, collective reduction) noexcept {
  switch (k) {
    case trace::kind::gather_issued:
    case trace::kind::gather_begin:
    case trace::kind::gather_end: return {c.gather_bytes(), collective::all_gather};
    case trace::kind::reduce_issued:
    case trace::kind::reduce_begin:
    case trace::kind::reduce_end: return {c.reduce_bytes(), reduction};
    default: return {};
  }
}

/// Where an action happens: the issuing thread or one of the backend's streams. host_work carries offloading's
/// host functions (host gradient additions, the host optimizer, host zeroing) and nothing else, so that the copy
/// streams, whose events give device slots back, never wait behind the CPU.
enum class lane : std::uint8_t { host, compute, gather, reduce, upload, download, host_work };
inline constexpr std::size_t lanes = 7;

constexpr const char* name_of(lane l) noexcept {
  switch (l) {
    case lane::host: return "host";
    case lane::compute: return "compute";
    case lane::gather: return "all_gather";
    case lane::reduce: return "reduce";
    case lane::upload: return "upload";
    case lane::download: return "download";
    case lane::host_work: return "host_work";
  }
  return "?";
}

/// The executor's slot rings (detail/exec/slot_ring.hpp).
enum class ring : std::uint8_t {
  gathered,
  grad,
  reduce_input,
  reduce_output,
  upload,
  download,
  stage_grad,
  stage_state,
  wire
};
inline constexpr std::size_t rings = 9;

/// The executor's per-unit events (unit/detail/unit_buffers.hpp).
enum class signal : std::uint8_t {
  shard_ready,
  uploaded,
  gathered,
  grad_ready,
  collected,
  downloaded,
  reduced,
  staged,
  stepped,
  state_saved
};
inline constexpr std::size_t signals = 10;

/// What a view of the trainer's points into.
enum class views : std::uint8_t { params, grad };

/// Work.
enum class job : std::uint8_t {
  upload_master,      ///< upload: offloaded master shard to its upload slot
  gather,             ///< gather: cast into the slot (when the gather dtype differs from the master's) and all-gather
  widen,              ///< gather: the wire slot's gathered parameters widened into the gathered slot (a gather dtype
                      ///< narrower than the compute dtype)
  zero_grad,          ///< compute: the unsharded gradient slot zeroed
  compute,            ///< compute: the trainer's forward or backward of the unit
  start_accumulator,  ///< compute (no-sync): the first micro-batch's gradient copied into the accumulator just made
  accumulate,         ///< compute (no-sync) or reduce (the last micro-batch): gradient added into the accumulator
  cast_reduce_input,  ///< reduce: the source cast (and pre-divided) into the reduce input
  prescale,           ///< reduce: the source pre-divided in place (grad_division::pre_post, no reduce input)
  reduce_collective,  ///< reduce: reduce-scatter in the shard group (all-reduce when replicated)
  replica_reduce,     ///< reduce: hybrid sharding's all-reduce of the reduced shard across the replicate group
  add_into_shard,     ///< reduce: the reduced values added into the fp32 gradient shard
  download_grad,      ///< download: the reduced gradient copied to its host download slot
  host_add,           ///< host_work: the download slot added into the host gradient shard (a host function)
  optimizer_device,   ///< compute: the optimizer's kernels for the unit
  optimizer_host,     ///< host_work: the optimizer's host update of the unit (a host function)
  stage_master,       ///< upload: a staged device step's master shard to the device
  stage_grad,         ///< upload: its gradient shard
  stage_state,        ///< upload: its optimizer state
  unstage_master,     ///< download: the master shard back to the host
  unstage_state,      ///< download: the optimizer state back
  zero_shard,         ///< compute: the fp32 gradient shard zeroed (zero_grad)
  zero_shard_host,    ///< host_work: a host gradient shard zeroed (zero_grad; a host function)
  tensor_reduce,      ///< compute: the unit's partial gradients (tp::partial_grad) all-reduced over the tensor group
                      ///< when its backward ends, in issue order with the trainer's own tensor collectives
  commit,             ///< compute: the step's commit (plan::commits), a one-element all-reduce over the world before
                      ///< the first update, in gradient slot 0; of no unit (npos)
};
inline constexpr std::size_t jobs = 26;

constexpr const char* name_of(job j) noexcept {
  switch (j) {
    case job::upload_master: return "upload";
    case job::gather: return "all_gather";
    case job::widen: return "widen";
    case job::zero_grad: return "zero grad";
    case job::compute: return "compute";
    case job::start_accumulator: return "start accumulator";
    case job::accumulate: return "accumulate";
    case job::cast_reduce_input: return "cast for reduction";
    case job::prescale: return "pre-division";
    case job::reduce_collective: return "reduction";
    case job::replica_reduce: return "replica all_reduce";
    case job::add_into_shard: return "add into shard";
    case job::download_grad: return "download";
    case job::host_add: return "host add";
    case job::optimizer_device: return "optimizer";
    case job::optimizer_host: return "host optimizer";
    case job::stage_master: return "stage master";
    case job::stage_grad: return "stage grad";
    case job::stage_state: return "stage state";
    case job::unstage_master: return "master back";
    case job::unstage_state: return "state back";
    case job::zero_shard: return "zero grad shard";
    case job::zero_shard_host: return "zero host grad shard";
    case job::tensor_reduce: return "tensor all_reduce";
    case job::commit: return "commit all_reduce";
  }
  return "?";
}

constexpr const char* name_of(ring r) noexcept {
  switch (r) {
    case ring::gathered: return "gathered";
    case ring::grad: return "grad";
    case ring::reduce_input: return "reduce_input";
    case ring::reduce_output: return "reduce_output";
    case ring::upload: return "upload";
    case ring::download: return "download";
    case ring::stage_grad: return "stage_grad";
    case ring::stage_state: return "stage_state";
    case ring::wire: return "wire";
  }
  return "?";
}

constexpr const char* name_of(signal s) noexcept {
  switch (s) {
    case signal::shard_ready: return "shard_ready";
    case signal::uploaded: return "uploaded";
    case signal::gathered: return "gathered";
    case signal::grad_ready: return "grad_ready";
    case signal::collected: return "collected";
    case signal::downloaded: return "downloaded";
    case signal::reduced: return "reduced";
    case signal::staged: return "staged";
    case signal::stepped: return "stepped";
    case signal::state_saved: return "state_saved";
  }
  return "?";
}

}  // namespace fsdp::plan
