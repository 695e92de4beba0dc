#pragma once
// The buffer costs' definitions (fsdp/memory/cost.hpp): included by that header, or compiled once by fsdp/src.hpp
// under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include "fsdp/core/error.hpp"
#include "fsdp/memory/cost.hpp"

namespace fsdp::plan {

FSDP_DECL unit_costs costs_of(const FlatLayout& l, const cost_facts& f) {
  const precision_facts& p = f.precision;
  const std::int64_t S = l.shard_numel(), P = l.padded_numel();
  unit_costs c;
  c.shard_numel = S;
  c.padded_numel = P;
  const offload_facts& o = f.offload;
  c.master = {mem::sharded_params, p.master, S, o.params ? domain::host : domain::device};
  c.grad_shard = {mem::grads, dtype::f32, S, o.grads ? domain::host : domain::device};
  const bool gathers = units_gather(f.shards_params, p, o);
  c.gathered = {mem::gathered_params, p.compute, gathers ? P : 0};
  // blocks of a shard, with an fp32 scale each (kernels/quantize.hpp): a block must not cross a shard
  // (fsdp/can_implement.hpp refuses such an alignment first, naming the option)
  auto require_blocks = [&](const char* what, int block) {
    if (S % block != 0)
      fsdp::detail::fail_usage("precision: ", what, " in blocks of ", block,
                               " elements needs shards that are multiples of "
                               "the block, but a unit's shard has ",
                               S,
                               " elements: set model_options::layout.align to a "
                               "multiple of ",
                               block, " (it is ", l.align(), ")");
  };
  if (p.gather_block) {  // a scaled gather
    require_blocks("a gather scaled", p.gather_block);
    c.gather_block = p.gather_block;
  }
  c.wire = {mem::gathered_params, p.gather, gathers && p.widens() ? l.world() * c.gather_count() : 0};
  c.grad = {mem::comm_buffers, p.compute, P};
  for (const flat_run& r : l.partial_grad_runs()) {
    c.partial_grad_numel += r.numel;
    ++c.partial_grad_runs;
  }
  c.accumulator = {mem::comm_buffers, dtype::f32, f.accumulates_locally ? P : 0};
  const dtype reduce_source = f.accumulates_locally ? c.accumulator.type : c.grad.type;  // what is reduced from
  c.reduce_input = {mem::comm_buffers, p.reduce, reduce_source != p.reduce ? P : 0};
  c.reduce_output = {mem::comm_buffers, p.reduce, f.shards_params ? S : 0};
  c.upload = {mem::sharded_params, p.master, o.params ? S : 0};
  c.download = {mem::comm_buffers, p.reduce, o.grads ? (f.shards_params ? S : P) : 0, domain::host};
  if (p.reduce_block) {  // quantized: an all_to_all of one slice per rank each way (kernels/quantize.hpp)
    if (!f.shards_params)
      fsdp::detail::fail_usage(
          "precision: a reduction quantized in blocks goes through all_to_all into shards, and needs "
          "a sharding strategy that shards parameters");
    require_blocks("a reduction quantized", p.reduce_block);
    c.reduce_block = p.reduce_block;
    const std::int64_t slices = l.world() * c.reduce_count();
    c.reduce_input.numel = c.reduce_output.numel = slices;
    c.download.numel = o.grads ? slices : 0;
  }
  return c;
}

FSDP_DECL slot_costs slot_costs_of(const std::vector<unit_costs>& units) {
  slot_costs s;
  for (const unit_costs& c : units) {
    widen(s.gathered, c.gathered);
    widen(s.grad, c.grad);
    widen(s.reduce_input, c.reduce_input);
    widen(s.reduce_output, c.reduce_output);
    widen(s.upload, c.upload);
    widen(s.download, c.download);
    widen(s.wire, c.wire);
  }
  return s;
}

FSDP_DECL staging_costs staging_costs_of(const unit_costs& c, const offload_facts& o, int states) {
  staging_costs s;
  if (!o.any() || o.host_step()) return s;
  const std::int64_t S = c.shard_numel;
  s.master = {mem::sharded_params, dtype::f32, o.params ? S : 0};
  s.grad = {mem::grads, dtype::f32, o.grads ? S : 0};
  s.state = {mem::optimizer_state, dtype::f32, o.optimizer_state ? S * states : 0};
  return s;
}

FSDP_DECL staging_costs staging_slots_of(const std::vector<unit_costs>& units,
                                         const std::vector<offload_facts>& offload, int states) {
  staging_costs s;
  for (std::size_t i = 0; i < units.size(); ++i) {
    const staging_costs u = staging_costs_of(units[i], offload[i], states);
    widen(s.master, u.master);
    widen(s.grad, u.grad);
    widen(s.state, u.state);
  }
  return s;
}

FSDP_DECL link_bytes optimizer_link_bytes(const unit_costs& c, const offload_facts& o, int states, bool inspects) {
  // What the step program stages (up: stage_master, stage_grad, stage_state; back: unstage_master, unstage_state;
  // nothing when the step runs on the host), and the inspection's norm of a host gradient, read in place.
  const staging_costs s = staging_costs_of(c, o, states);
  link_bytes b{s.master.bytes() + s.grad.bytes() + s.state.bytes(), s.master.bytes() + s.state.bytes()};
  if (inspects && o.grads) b.to_device += c.shard_numel * static_cast<std::int64_t>(sizeof(float));
  return b;
}

}  // namespace fsdp::plan
