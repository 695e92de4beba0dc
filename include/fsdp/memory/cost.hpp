#pragma once
// What each buffer of a unit costs: its memory category, dtype and element count, from the unit's layout and the
// precision, sharding and accumulation facts. The one place these are computed: the unit executor allocates
// exactly these buffers and the memory planner counts exactly these bytes, so they cannot disagree.
//
// Per unit with padded size P and shard size S elements (S = P when the shard group is one rank):
//
//   buffer          category          dtype     elements  lives
//   master          sharded params    master    S         always (the fp32 master shard)
//   grad shard      grads             f32       S         always (the fp32 gradient shard)
//   gathered        gathered params   compute   P         from a gather to its release; none when the fp32 master
//                                                         itself serves compute (no_shard in fp32)
//   wire            gathered params   gather    P         during a gather whose dtype is narrower than the compute
//                                                         dtype (precision_facts::widens): the all-gather's buffer,
//                                                         widened into the gathered buffer and given back on the
//                                                         gather stream; else none (the gather writes the gathered
//                                                         buffer itself). A scaled gather (fp8 in blocks of B with
//                                                         an fp32 scale each): P + 4 P / B one-byte elements, each
//                                                         rank's values then its scales (kernels/quantize.hpp)
//   grad            comm buffers      compute   P         a backward: the unsharded gradient the trainer writes
//   accumulator     comm buffers      f32       P         no-sync, from the first micro-batch's backward of the
//                                                         unit to its reduction in the last
//   reduce input    comm buffers      reduce    P         during a reduction, when the source (grad, or the
//                                                         accumulator) has another dtype; else none (the source
//                                                         is reduced, scaled in place if it must be)
//   reduce output   comm buffers      reduce    S         during a reduce-scatter; none for an all-reduce (in place)
//
// A quantized reduction (precision_facts::quantizes_reduction: int8 or fp8 in blocks of B) has both, each one slice
// of S + 4 S / B one-byte elements per rank of the shard group (kernels/quantize.hpp): the input the gradient
// quantized per destination rank, the output what the all_to_all brought from every rank.
//
// Offloading (fsdp/policy/offload.hpp) moves buffers to the host domain and adds two:
//
//   master          host when params are offloaded; grad shard: host when grads are; optimizer state: host when it is
//   upload          sharded params    f32       S         params offloaded: the master shard's device copy, from
//                   (device)                              its upload to the end of its gather (a gather always
//                                                         happens then, no_shard in fp32 too)
//   download        comm buffers      reduce    S (P for  grads offloaded: a reduced gradient on the host, from its
//                   (host)                      all-reduce) copy to its addition into the host gradient shard
//                                                         (a quantized reduction: the reduce output's slices, which
//                                                         the host dequantizes and sums)
//
// A reduction allocates its input, then its output, and frees them in reverse order before it frees the grad and
// the accumulator (the reduction's takes and gives in fsdp/plan/detail/program.hpp, which the executor and the memory
// planner both read).
//
// The buffers that come and go within a step (gathered, grad, reduce input and output) do not come from the
// allocator one by one: they live in slots the library owns (fsdp/detail/exec/slot_ring.hpp), one ring per purpose,
// each slot as large as the largest unit's buffer it served (fsdp/detail/schedule/slot_ledger.hpp: at most
// slot_costs_of's). A slot, once made, stays until the model goes.
#include <cstdint>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/options/model_options.hpp"
#include "fsdp/policy/offload.hpp"
#include "fsdp/policy/precision.hpp"

namespace fsdp::plan {

/// One buffer's cost.
struct buffer_cost {
  mem category = mem::comm_buffers;
  dtype type = dtype::f32;
  std::int64_t numel = 0;  ///< 0: the buffer does not exist under these facts
  domain where = domain::device;
  std::int64_t bytes() const noexcept { return numel * static_cast<std::int64_t>(size_of(type)); }
  explicit operator bool() const noexcept { return numel > 0; }
};

/// The facts a unit's costs depend on, beside its layout.
struct cost_facts {
  precision_facts precision{};
  bool shards_params = true;        ///< reduce-scatter into shards (else all-reduce of replicas)
  bool accumulates_locally = false; ///< no-sync over more than one micro-batch: gradients wait in an fp32 accumulator
  offload_facts offload{};          ///< which persistent buffers live in host memory
  bool prescales = false;           ///< reductions are pre-divided (grad_division::pre_post): in place when the
                                    ///< source is reduced in its own dtype (no reduce input)
};

/// Units are gathered before use and released after when their parameters are sharded, when compute reads a
/// cast copy (a compute or gather dtype other than the master's), or when the master lives on the host (offloaded
/// params); otherwise the fp32 master itself serves compute (no_shard in fp32). The scheduler's configuration and
/// the costs below both ask this.
inline bool units_gather(bool shards_params, const precision_facts& p, const offload_facts& o = {}) noexcept {
  return shards_params || p.compute != p.master || p.gather != p.master || o.params;
}

/// The facts of a model with this precision, sharding, accumulation, offload and pre-division.
inline cost_facts make_cost_facts(const precision_facts& precision, bool shards_params,
                                  const accumulation_options& accumulation, const offload_facts& offload = {},
                                  bool prescales = false) {
  return {precision, shards_params,
          accumulation.sync == grad_sync::last_micro_batch && accumulation.micro_batches > 1, offload, prescales};
}

/// `f` with unit u's offload facts (model_options::offload_units; sched::config::offload).
inline cost_facts for_unit(cost_facts f, const std::vector<offload_facts>& per_unit, std::size_t u) {
  if (u < per_unit.size()) f.offload = per_unit[u];
  return f;
}

/// The costs of one unit's buffers.
struct unit_costs {
  buffer_cost master, grad_shard, gathered, grad, accumulator, reduce_input, reduce_output, upload, download, wire;
  std::int64_t shard_numel = 0;      ///< S: elements of the master and gradient shards
  std::int64_t padded_numel = 0;     ///< P: elements of the unsharded flat buffer
  std::int64_t gather_block = 0;     ///< a scaled gather: elements per scale (B); else 0
  std::int64_t reduce_block = 0;     ///< a quantized reduction: elements per scale (B); else 0
  /// Gradient elements that are partial sums across the tensor group (tp::partial_grad), in `partial_grad_runs`
  /// runs (FlatLayout::partial_grad_runs): each run is all-reduced over the tensor group, in the gradient's dtype,
  /// when the unit's backward ends.
  std::int64_t partial_grad_numel = 0;
  int partial_grad_runs = 0;
  /// The dtype an all-gather of the unit moves: the wire buffer's when there is one, else the compute dtype.
  dtype gather_type() const noexcept { return wire ? wire.type : gathered.type; }
  /// Elements of the gather dtype one rank contributes to an all-gather: its shard, and its scales (as bytes) when
  /// the gather is scaled. The wire slot holds one such slice per rank of the shard group (kernels/quantize.hpp).
  std::int64_t gather_count() const noexcept {
    return gather_block ? shard_numel + shard_numel / gather_block * 4 : shard_numel;
  }
  /// Elements of the reduce dtype a quantized reduction's all_to_all sends to each rank (and receives from each): a
  /// shard's values and its scales (as bytes); a plain reduction's shard otherwise.
  std::int64_t reduce_count() const noexcept {
    return reduce_block ? shard_numel + shard_numel / reduce_block * 4 : shard_numel;
  }
  /// Unsharded bytes an all-gather of the unit moves, and a reduction (as nccl-tests count, for traces; a quantized
  /// reduction's all_to_all: its whole send buffer).
  std::int64_t gather_bytes() const noexcept {
    return wire ? wire.bytes() : padded_numel * static_cast<std::int64_t>(size_of(gathered.type));
  }
  std::int64_t reduce_bytes() const noexcept {
    return reduce_block ? reduce_input.bytes() : padded_numel * static_cast<std::int64_t>(size_of(reduce_output.type));
  }
};

FSDP_DECL unit_costs costs_of(const FlatLayout& l, const cost_facts& f);

/// The largest buffer of each purpose over the units (numel 0: no ring): the most a slot of that ring grows to,
/// and the download slots' one size.
struct slot_costs {
  buffer_cost gathered, grad, reduce_input, reduce_output, upload, download, wire;
};

/// `slot` becomes `b` when `b` is larger.
inline void widen(buffer_cost& slot, const buffer_cost& b) {
  if (b.numel > slot.numel) slot = b;
}

FSDP_DECL slot_costs slot_costs_of(const std::vector<unit_costs>& units);

/// Slots of the offload rings made before one is reused: two, so that one unit's copy overlaps the last one's use.
inline constexpr int offload_slots = 2;

/// An optimizer's state for one unit: `states` fp32 values per shard element (in host memory when offloaded).
inline buffer_cost optimizer_state_cost(const FlatLayout& l, int states, const offload_facts& o = {}) {
  return {mem::optimizer_state, dtype::f32, l.shard_numel() * states,
          o.optimizer_state ? domain::host : domain::device};
}

/// A device optimizer step over unit parts that live on the host streams them through staging slots on the device
/// (fsdp/plan/detail/program.hpp's stage_master, stage_grad and stage_state work; detail/exec/update_site.hpp): the
/// master shard (in an upload slot: the same ring and size as the gathers' uploads), the gradient shard and the
/// `states` optimizer states (one slot holds them all), each when that part is offloaded and the optimizer does not
/// step on the host.
struct staging_costs {
  buffer_cost master, grad, state;
};

FSDP_DECL staging_costs staging_costs_of(const unit_costs& c, const offload_facts& o, int states);

/// The largest staging buffer of each part over the units (`offload`: each unit's facts).
FSDP_DECL staging_costs staging_slots_of(const std::vector<unit_costs>& units,
                                         const std::vector<offload_facts>& offload, int states);

/// Bytes moved over the host link (PCIe), each way.
struct link_bytes {
  std::int64_t to_device = 0;
  std::int64_t to_host = 0;
  std::int64_t total() const noexcept { return to_device + to_host; }
  link_bytes& operator+=(const link_bytes& o) noexcept {
    to_device += o.to_device;
    to_host += o.to_host;
    return *this;
  }
  friend bool operator==(const link_bytes&, const link_bytes&) = default;
};

/// What one optimizer step moves over the link for one unit: nothing when nothing is offloaded; when it steps on
/// the host, only the inspection's read of the host gradient (when `inspects`); otherwise each host-resident fp32
/// value goes to the device (the master, the gradient and each of `states` states, staged; the gradient once more,
/// read in place, for the inspection's norm when `inspects`) and the master and the states come back.
FSDP_DECL link_bytes optimizer_link_bytes(const unit_costs& c, const offload_facts& o, int states, bool inspects);

/// fp32 slots at the start of the gradient inspection's buffer for its decision (grad::verdict: 32 bytes, which
/// the update kernels read), before the norms.
inline constexpr std::int64_t verdict_slots = 8;

/// The squared norms a gradient inspection all-reduces: `rows` x `units` fp32 values (0 rows: no inspection).
inline std::int64_t norm_count(std::size_t units, int rows) { return static_cast<std::int64_t>(units) * rows; }

/// The buffer of gradient inspection (clipping, non-finite checks): its decision (verdict_slots), then `rows` x
/// `units` fp32 squared norms, all-reduced once a step (fsdp/grad/inspect.hpp). An inspecting optimizer's, for its
/// whole life (a captured step takes no memory). None without inspection.
inline buffer_cost norm_buffer_cost(std::size_t units, int rows) {
  const std::int64_t n = norm_count(units, rows);
  return {mem::comm_buffers, dtype::f32, n > 0 ? verdict_slots + n : 0};
}

/// Whether a step issues its commit (model_options::commit_step): one all-reduce of one element over the world after
/// every reduction and before the first update. An optimizer that inspects gradients (`norm_rows` > 0) commits with
/// its norms' all-reduce instead, which is over the world at the same point. The commit takes no memory of its own:
/// it all-reduces the first element of gradient slot 0 (idle once every reduction is done, its value dead: the
/// next backward zeroes it), in the gradient's dtype.
inline bool commits(bool commit_step, int norm_rows) noexcept { return commit_step && norm_rows == 0; }

/// An optimizer's step block (fsdp/optim/detail/step_block.hpp): its update count and the step's element rule, in
/// device memory for its whole life, so that a replayed step computes its own learning rate and bias corrections.
inline constexpr std::int64_t step_block_slots = 64;
inline buffer_cost step_block_cost() { return {mem::optimizer_state, dtype::f32, step_block_slots}; }

/// The host's pinned copy of that buffer, where the host learns the decision (and, locating, who holds a non-finite
/// gradient) once the compute stream has passed it: an inspecting optimizer's, for its whole life.
inline buffer_cost decision_copy_cost(std::size_t units, int rows) {
  buffer_cost c = norm_buffer_cost(units, rows);
  c.where = domain::host;
  return c;
}

}  // namespace fsdp::plan

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/memory/cost.ipp"
#endif
