#pragma once
// The unit executor's stream program, for the planners. For each of the scheduler's decisions, and for a unit's
// compute and the optimizer step, what the executor (fsdp/exec/unit_executor.hpp, fsdp/model.hpp) does on which
// stream, in its order: slots taken and given back, events recorded and waited for, timed work. An interpreter
// gives the actions a meaning:
//
//   the memory planner (fsdp/plan/memory_plan.hpp)     a slot's bytes count from the take that makes it
//   the timeline planner (fsdp/plan/timeline.hpp)      streams advance through waits and work in modelled time
//
// So the two planners read one description of the executor's order, and both drive it with the scheduler's own
// decisions (walk_passes below). The executor's order is thus written twice: in the executor, which runs it, and
// here, for the planners. tests/model/memory_test.cc holds this copy's slot order to the executor's measured peaks,
// byte for byte; its streams, waits and records are held only by the hand-worked timelines of
// tests/plan/timeline_test.cc and by bench:overlap's comparison with measured host runs. Change both together.
//
// Not in the program (no time, no memory the planners count): zero_grad() between steps, the in-place
// pre-division of a reduction without a reduce input slot, model_options::check_collectives' comparisons, and the
// optimizer's gradient inspection (its norms, all-reduce and host synchronize; the memory planner counts its
// buffer in run_step's `between`).
//
// An interpreter `I` provides:
//   take(lane, ring, slot_ledger::pick, const buffer_cost& each, unit)   a slot taken on `lane` (a reused slot:
//                                                                        after the event of its give)
//   give(lane, ring, slot, unit)                                         the slot may be taken again after this point
//   buffer(lane, const buffer_cost&, bool made, unit)                    a buffer made (or freed) outside the rings
//   wait(lane, signal, unit) / record(lane, signal, unit)                the events between streams
//   work(lane, job, unit, pass)                                          timed work on `lane`
//   stamp(lane, trace::kind, pass, unit)                                 a trace event (lane::host: on the host)
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "fsdp/observe/trace.hpp"
#include "fsdp/offload/offload.hpp"
#include "fsdp/plan/cost.hpp"
#include "fsdp/schedule/scheduler.hpp"
#include "fsdp/schedule/slot_ledger.hpp"
#include "fsdp/unit/state.hpp"

namespace fsdp::plan {

/// Where an action happens: the issuing thread or one of the backend's streams.
enum class lane : std::uint8_t { host, compute, gather, reduce, upload, download };
inline constexpr std::size_t lanes = 6;

constexpr const char* name_of(lane l) noexcept {
  switch (l) {
    case lane::host: return "host";
    case lane::compute: return "compute";
    case lane::gather: return "all_gather";
    case lane::reduce: return "reduce";
    case lane::upload: return "upload";
    case lane::download: return "download";
  }
  return "?";
}

/// The executor's slot rings (exec/slot_ring.hpp).
enum class ring : std::uint8_t { gathered, grad, reduce_input, reduce_output, upload, download, stage_grad, stage_state };
inline constexpr std::size_t rings = 8;

/// The executor's per-unit events (unit/unit_buffers.hpp).
enum class signal : std::uint8_t { shard_ready, uploaded, gathered, grad_ready, collected, reduced, staged, stepped, state_saved };
inline constexpr std::size_t signals = 9;

/// Timed work.
enum class job : std::uint8_t {
  upload_master,      ///< upload: offloaded master shard to its upload slot
  gather,             ///< gather: cast into the slot (when the compute dtype differs) and all-gather
  zero_grad,          ///< compute: the unsharded gradient slot zeroed
  compute,            ///< compute: the trainer's forward or backward of the unit
  accumulate,         ///< compute (no-sync) or reduce (the last micro-batch): gradient added into the accumulator
  cast_reduce_input,  ///< reduce: the source cast (and pre-divided) into the reduce input
  reduce_collective,  ///< reduce: reduce-scatter in the shard group (all-reduce when replicated)
  replica_reduce,     ///< reduce: hybrid sharding's all-reduce of the reduced shard across the replicate group
  add_into_shard,     ///< reduce: the reduced values added into the fp32 gradient shard
  download_grad,      ///< download: the reduced gradient copied to its host download slot
  host_add,           ///< download: the download slot added into the host gradient shard (a host function)
  optimizer_device,   ///< compute: the optimizer's kernels for the unit
  optimizer_host,     ///< download: the optimizer's host update of the unit (a host function)
  stage_master,       ///< upload: a staged device step's master shard to the device
  stage_grad,         ///< upload: its gradient shard
  stage_state,        ///< upload: its optimizer state
  unstage_master,     ///< download: the master shard back to the host
  unstage_state,      ///< download: the optimizer state back
};
inline constexpr std::size_t jobs = 18;

/// The executor's program over units with these costs and offload facts (per unit index).
class step_program {
 public:
  step_program(std::vector<unit_costs> costs, std::vector<offload_facts> offload, int grad_slots, int optimizer_states)
      : cost_(std::move(costs)), offload_(std::move(offload)), states_(optimizer_states),
        slots_(slot_costs_of(cost_)), staging_(staging_slots_of(cost_, offload_, optimizer_states)),
        ledger_{sched::slot_ledger(1), sched::slot_ledger(grad_slots), sched::slot_ledger(1), sched::slot_ledger(1),
                sched::slot_ledger(offload_slots), sched::slot_ledger(offload_slots),
                sched::slot_ledger(offload_slots), sched::slot_ledger(offload_slots)},
        held_(cost_.size()), accumulating_(cost_.size(), false), written_on_host_(cost_.size(), false) {}

  std::size_t size() const noexcept { return cost_.size(); }
  const unit_costs& costs(std::size_t u) const { return cost_.at(u); }
  const offload_facts& offload(std::size_t u) const { return offload_.at(u); }
  int optimizer_states() const noexcept { return states_; }

  /// One of the scheduler's decisions (unit_executor::operator()).
  template <class I>
  void op(sched::op o, std::size_t u, bool ahead, pass_kind pass, I& in) {
    switch (o) {
      case sched::op::gather: gather(u, ahead, pass, in); break;
      case sched::op::wait: in.wait(lane::compute, signal::gathered, u); break;
      case sched::op::release:
        in.stamp(lane::host, trace::kind::release, pass, u);
        give(lane::compute, ring::gathered, u, in);
        break;
      case sched::op::alloc_grad:
        take(lane::compute, ring::grad, u, in);
        in.work(lane::compute, job::zero_grad, u, pass);
        break;
      case sched::op::accumulate:
        add_to_accumulator(lane::compute, u, pass, in);
        give(lane::compute, ring::grad, u, in);
        break;
      case sched::op::reduce: reduce(u, pass, in); break;
    }
  }

  /// The trainer's work for unit u, between entering and leaving it (Model's enter / leave stamps).
  template <class I>
  void unit_compute(pass_kind k, std::size_t u, I& in) {
    in.stamp(lane::compute, trace::kind::compute_begin, k, u);
    in.work(lane::compute, job::compute, u, k);
    in.stamp(lane::compute, trace::kind::compute_end, k, u);
  }

  /// Model::step's first action: compute waits for every unit's reduction.
  template <class I>
  void wait_reductions(I& in) {
    for (std::size_t u = 0; u < size(); ++u) in.wait(lane::compute, signal::reduced, u);
  }

  /// Model::step after the scheduler's before_step: the optimizer step begins (before the optimizer's own work
  /// ahead of its updates, the gradient inspection: run_step's `between`).
  template <class I>
  void optimizer_begin(I& in) {
    in.stamp(lane::compute, trace::kind::optimizer_begin, pass_kind::none, npos);
  }

  /// The optimizer's update of every unit (shard_optimizer::run_step: on the host, staged, or on the device), then
  /// "shard ready" for the units written on the compute stream, and the step's end.
  template <class I>
  void optimizer_step(I& in) {
    for (std::size_t u = 0; u < size(); ++u) {
      const offload_facts& o = offload_[u];
      if (o.host_step()) {  // unit_executor::host_update
        in.wait(lane::download, signal::shard_ready, u);
        in.wait(lane::download, signal::reduced, u);
        in.wait(lane::download, signal::uploaded, u);
        in.work(lane::download, job::optimizer_host, u, pass_kind::none);
        in.record(lane::download, signal::shard_ready, u);
        written_on_host_[u] = true;
      } else if (o.any()) {  // stage_step, the kernels, unstage_step
        const staging_costs c = staging_costs_of(cost_[u], o, states_);
        in.wait(lane::upload, signal::shard_ready, u);
        in.wait(lane::upload, signal::reduced, u);
        in.wait(lane::upload, signal::state_saved, u);
        if (c.master) take(lane::upload, ring::upload, u, in), in.work(lane::upload, job::stage_master, u, pass_kind::none);
        if (c.grad) take(lane::upload, ring::stage_grad, u, in), in.work(lane::upload, job::stage_grad, u, pass_kind::none);
        if (c.state) take(lane::upload, ring::stage_state, u, in), in.work(lane::upload, job::stage_state, u, pass_kind::none);
        in.record(lane::upload, signal::staged, u);
        in.wait(lane::compute, signal::staged, u);
        in.work(lane::compute, job::optimizer_device, u, pass_kind::none);
        in.record(lane::compute, signal::stepped, u);
        in.wait(lane::download, signal::stepped, u);
        if (c.master) {
          in.work(lane::download, job::unstage_master, u, pass_kind::none);
          give(lane::download, ring::upload, u, in);
        }
        if (c.grad) give(lane::download, ring::stage_grad, u, in);
        if (c.state) {
          in.work(lane::download, job::unstage_state, u, pass_kind::none);
          give(lane::download, ring::stage_state, u, in);
          in.record(lane::download, signal::state_saved, u);
        }
        if (c.master) {
          in.record(lane::download, signal::shard_ready, u);
          written_on_host_[u] = true;
        }
      } else {
        in.work(lane::compute, job::optimizer_device, u, pass_kind::none);
      }
    }
    for (std::size_t u = 0; u < size(); ++u) {  // unit_executor::shards_written
      if (!written_on_host_[u]) in.record(lane::compute, signal::shard_ready, u);
      written_on_host_[u] = false;
    }
    in.stamp(lane::compute, trace::kind::optimizer_end, pass_kind::none, npos);
  }

  /// The slot size of a ring: its largest buffer.
  const buffer_cost& slot_cost(ring r) const noexcept {
    switch (r) {
      case ring::gathered: return slots_.gathered;
      case ring::grad: return slots_.grad;
      case ring::reduce_input: return slots_.reduce_input;
      case ring::reduce_output: return slots_.reduce_output;
      case ring::upload: return slots_.upload;
      case ring::download: return slots_.download;
      case ring::stage_grad: return staging_.grad;
      case ring::stage_state: return staging_.state;
    }
    return slots_.gathered;
  }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

 private:
  template <class I>
  void gather(std::size_t u, bool ahead, pass_kind pass, I& in) {
    const unit_costs& c = cost_[u];
    in.stamp(lane::host, trace::kind::gather_issued, pass, u, ahead);
    if (c.upload) {  // offloaded params: the host master shard to the device first
      in.wait(lane::upload, signal::shard_ready, u);
      take(lane::upload, ring::upload, u, in);
      in.work(lane::upload, job::upload_master, u, pass);
      in.record(lane::upload, signal::uploaded, u);
      in.wait(lane::gather, signal::uploaded, u);
    } else {
      in.wait(lane::gather, signal::shard_ready, u);
    }
    take(lane::gather, ring::gathered, u, in);
    in.stamp(lane::gather, trace::kind::gather_begin, pass, u);
    in.work(lane::gather, job::gather, u, pass);
    if (c.upload) give(lane::gather, ring::upload, u, in);
    in.stamp(lane::gather, trace::kind::gather_end, pass, u);
    in.record(lane::gather, signal::gathered, u);
  }

  template <class I>
  void reduce(std::size_t u, pass_kind pass, I& in) {
    const unit_costs& c = cost_[u];
    in.stamp(lane::host, trace::kind::reduce_issued, pass, u);
    in.record(lane::compute, signal::grad_ready, u);
    in.wait(lane::reduce, signal::grad_ready, u);
    in.stamp(lane::reduce, trace::kind::reduce_begin, pass, u);
    const bool accumulated = accumulating_[u];
    if (accumulated) {  // the last gradient into the accumulator, its slot given back
      add_to_accumulator(lane::reduce, u, pass, in);
      give(lane::reduce, ring::grad, u, in);
    }
    if (c.reduce_input) {
      take(lane::reduce, ring::reduce_input, u, in);
      in.work(lane::reduce, job::cast_reduce_input, u, pass);
    }
    if (c.reduce_output) take(lane::reduce, ring::reduce_output, u, in);
    in.work(lane::reduce, job::reduce_collective, u, pass);
    if (c.reduce_output) in.work(lane::reduce, job::replica_reduce, u, pass);
    lane gives = lane::reduce;  // the stream that read the reduction's slots last
    if (c.download) {
      in.stamp(lane::reduce, trace::kind::reduce_end, pass, u);
      in.record(lane::reduce, signal::collected, u);
      in.wait(lane::download, signal::collected, u);
      take(lane::download, ring::download, u, in);
      in.work(lane::download, job::download_grad, u, pass);
      gives = lane::download;
    } else {
      in.work(lane::reduce, job::add_into_shard, u, pass);
      in.stamp(lane::reduce, trace::kind::reduce_end, pass, u);
    }
    if (c.reduce_output) give(gives, ring::reduce_output, u, in);
    if (c.reduce_input) give(gives, ring::reduce_input, u, in);
    if (accumulated) {
      in.buffer(gives, c.accumulator, false, u);
      accumulating_[u] = false;
    } else {
      give(gives, ring::grad, u, in);
    }
    if (c.download) {
      in.wait(lane::download, signal::shard_ready, u);
      in.work(lane::download, job::host_add, u, pass);
      give(lane::download, ring::download, u, in);
    }
    in.record(gives, signal::reduced, u);
  }

  template <class I>
  void add_to_accumulator(lane l, std::size_t u, pass_kind pass, I& in) {
    if (!accumulating_[u]) in.buffer(l, cost_[u].accumulator, true, u);
    accumulating_[u] = true;
    in.work(l, job::accumulate, u, pass);
  }

  template <class I>
  void take(lane l, ring r, std::size_t u, I& in) {
    const sched::slot_ledger::pick p = ledger_[static_cast<std::size_t>(r)].take();
    held_[u][static_cast<std::size_t>(r)] = p.slot;
    in.take(l, r, p, slot_cost(r), u);
  }
  template <class I>
  void give(lane l, ring r, std::size_t u, I& in) {
    int& slot = held_[u][static_cast<std::size_t>(r)];
    ledger_[static_cast<std::size_t>(r)].give(slot);
    in.give(l, r, slot, u);
    slot = -1;
  }

  std::vector<unit_costs> cost_;
  std::vector<offload_facts> offload_;
  int states_;
  slot_costs slots_;
  staging_costs staging_;
  sched::slot_ledger ledger_[rings];
  struct held_slots {
    int slot[rings] = {-1, -1, -1, -1, -1, -1, -1, -1};
    int& operator[](std::size_t r) noexcept { return slot[r]; }
  };
  std::vector<held_slots> held_;     // per unit: the slot it holds in each ring
  std::vector<bool> accumulating_;   // per unit: its no-sync accumulator exists
  std::vector<bool> written_on_host_;
};

/// Drives one step's passes (every micro-batch, forward then backward) through the scheduler, as a trainer does:
/// on_op(op, unit, ahead, pass) for each decision, on_compute(pass, unit) between entering and leaving a unit.
/// Returns the shortage that stops the schedule (nothing after it ran), or nullopt.
template <class OnOp, class OnCompute>
std::optional<sched::shortage> walk_passes(sched::scheduler& s, const std::vector<std::size_t>& order, OnOp&& on_op,
                                           OnCompute&& on_compute) {
  const std::size_t n = order.size();
  for (int mb = 0; mb < s.facts().micro_batches; ++mb) {
    for (pass_kind k : {pass_kind::forward, pass_kind::backward}) {
      auto emit = [&](sched::op o, std::size_t u, bool ahead) { on_op(o, u, ahead, k); };
      s.begin_pass(k);
      for (std::size_t p = 0; p < n; ++p) {
        if (auto short_of = s.enter(k, order, p, emit)) return short_of;
        on_compute(k, sched::scheduler::unit_at(k, order, p));
        s.leave(k, order, p, emit);
      }
      s.end_pass(k);
    }
  }
  return std::nullopt;
}

/// One training step through the program: the passes, then Model::step's order (wait for the reductions, the
/// scheduler's before_step, the step's begin stamp, `between` (what the optimizer does before its updates: the
/// gradient inspection), the updates).
template <class I, class Between>
std::optional<sched::shortage> run_step(sched::scheduler& s, const std::vector<std::size_t>& order, step_program& prog,
                                        I& in, Between&& between) {
  auto on_op = [&](sched::op o, std::size_t u, bool ahead, pass_kind k) { prog.op(o, u, ahead, k, in); };
  if (auto short_of = walk_passes(s, order, on_op, [&](pass_kind k, std::size_t u) { prog.unit_compute(k, u, in); }))
    return short_of;
  prog.wait_reductions(in);
  s.before_step([&](sched::op o, std::size_t u, bool ahead) { prog.op(o, u, ahead, pass_kind::none, in); });
  prog.optimizer_begin(in);
  between();
  prog.optimizer_step(in);
  s.after_step();
  return std::nullopt;
}

}  // namespace fsdp::plan
