#pragma once
// The step program: what a training step does, on which stream, in what order. For each of the scheduler's
// decisions, for a unit's compute, for the optimizer step and for zero_grad: slots taken and given back, buffers
// made and freed, events recorded and waited for, the work (casts, collectives, accumulation, copies, the
// optimizer's updates and host functions), trace stamps and the ends of the trainer's views. It is written once,
// here, and three interpreters give the actions a meaning:
//
//   the unit executor (fsdp/detail/exec/interpreter.hpp)  the backend's memory, streams, events, kernels and
//                                                         copies, the communicator's collectives: the step itself
//   the memory planner (fsdp/plan/memory_plan.hpp)        a slot's bytes count from the take that makes it (or
//                                                         makes it larger)
//   the timeline planner (fsdp/plan/timeline.hpp)         streams advance through waits and work in modelled time
//
// and a fourth writes it down as text (fsdp/plan/listing.hpp: one step, action by action, per stream).
//
// All three are driven by the scheduler's own decisions (the executor through Model, the planners through
// run_step in fsdp/plan/detail/drive.hpp), so the planners predict the order the executor runs, by construction:
// tests/model/memory_test.cc holds the memory reading to the executor's measured peaks byte for byte,
// tests/plan/timeline_test.cc the time reading to hand-worked timelines. The program keeps the state the order depends
// on (which slot each unit holds, the slot ledgers, no-sync accumulators, shards written on the host), so one instance
// serves one model (the executor's, for its lifetime) or one plan. Its vocabulary (lanes, rings, signals, jobs) is
// fsdp/plan/detail/actions.hpp; what drives it through a step, fsdp/plan/detail/drive.hpp.
//
// Not in the planners' step (run_step): the trainer's zero_grad() between steps (memory-bound work only, no
// memory), model_options::check_collectives' comparisons and check_views' NaN fills (the executor's debug modes),
// and the optimizer's gradient inspection (its norms, all-reduce and host synchronize; the memory planner counts
// its buffer in run_step's `between`).
//
// An interpreter `I` provides:
//   take(lane, ring, slot_ledger::pick, const buffer_cost& each, unit)   a slot taken on `lane` for the unit's
//                                                                        buffer `each` (a reused slot: after the
//                                                                        event of its give; a fresh one, or one
//                                                                        that grows, is made at `each`)
//   give(lane, ring, slot, unit)                                         the slot may be taken again after this point
//   buffer(lane, const buffer_cost&, bool made, unit)                    a buffer made (or freed) outside the rings
//   wait(lane, signal, unit) / record(lane, signal, unit)                the events between streams
//   work(lane, job, unit, pass)                                          work on `lane`
//   stamp(lane, trace::kind, pass, unit[, ahead])                        a trace event (lane::host: on the host)
//   views_end(lane, views, unit)                                         the trainer's views of the unit's gathered
//                                                                        parameters or gradient end at this point of
//                                                                        `lane` (their memory is handed over)
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/unit_state.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"
#include "fsdp/detail/schedule/slot_ledger.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/observe/trace.hpp"
#include "fsdp/plan/collectives.hpp"  // reduction_of: which collective a reduction is
#include "fsdp/plan/detail/actions.hpp"
#include "fsdp/policy/offload.hpp"

namespace fsdp::plan::detail {

namespace sched = fsdp::detail::sched;  // the scheduler (fsdp/detail/schedule/)

/// The step program over units with these costs and offload facts (per unit index). `replicas`: hybrid sharding's
/// replicate group, whose all-reduce of each reduced shard the program issues only when it has more than one rank
/// (1: no replicate group; 0: not known, the all-reduce issued wherever hybrid sharding would issue it: a plan made
/// without the world's size). `prescales`: reductions are pre-divided (cost_facts::prescales).
class step_program {
 public:
  step_program(std::vector<unit_costs> costs, std::vector<offload_facts> offload, int grad_slots, int optimizer_states,
               int replicas, bool prescales = false);

  std::size_t size() const noexcept { return cost_.size(); }
  const unit_costs& costs(std::size_t u) const { return cost_.at(u); }
  const offload_facts& offload(std::size_t u) const { return offload_.at(u); }
  int optimizer_states() const noexcept { return states_; }
  /// An optimizer with `states` fp32 values per element: the staging slots of a device step over host-resident
  /// state are sized for it. Only while no staging slot is held (between steps, after a synchronize: the
  /// executor's rings are made again).
  void set_optimizer_states(int states);
  /// The replicate group's size (see the constructor).
  int replicas() const noexcept { return replicas_; }
  /// Whether the program issues the replica all-reduce of each reduced shard (hybrid sharding, more than one
  /// replica or not known). plan::step_collectives' `replicas` is this.
  bool replicates() const noexcept { return replicas_ != 1; }
  /// Hybrid sharding's groups were made (the executor's use_groups): `replicas` ranks in the replicate group.
  void set_replicas(int replicas) { replicas_ = replicas; }
  /// The slot unit u (< size()) holds in ring r (-1: none).
  int held(std::size_t u, ring r) const noexcept { return held_[u].slot[static_cast<std::size_t>(r)]; }
  /// Whether unit u's (< size()) no-sync accumulator exists.
  bool accumulating(std::size_t u) const noexcept { return accumulating_[u]; }

  /// One of the scheduler's decisions.
  template <class I>
  void op(sched::op o, std::size_t u, bool ahead, pass_kind pass, I& in) {
    switch (o) {
      case sched::op::gather: gather(u, ahead, pass, in); break;
      case sched::op::wait: in.wait(lane::compute, signal::gathered, u); break;
      case sched::op::release:
        in.stamp(lane::host, trace::kind::release, pass, u);
        in.views_end(lane::compute, views::params, u);
        give(lane::compute, ring::gathered, u, in);
        break;
      case sched::op::alloc_grad:
        take(lane::compute, ring::grad, u, pass, in);
        in.work(lane::compute, job::zero_grad, u, pass);
        break;
      case sched::op::accumulate:
        in.views_end(lane::compute, views::grad, u);
        add_to_accumulator(lane::compute, u, pass, in);
        give(lane::compute, ring::grad, u, in);
        break;
      case sched::op::reduce: reduce(u, pass, in); break;
    }
  }

  /// The trainer's work for unit u begins (Model entering the unit): its forward or backward is issued on the
  /// compute stream from here.
  template <class I>
  void compute_begin(pass_kind k, std::size_t u, I& in) {
    in.stamp(lane::compute, trace::kind::compute_begin, k, u);
    in.work(lane::compute, job::compute, u, k);
  }
  /// ... and ends (Model leaving the unit): after a backward, the gradients that are partial sums across the
  /// tensor group are summed over it, on the compute stream, before anything reads the gradient.
  template <class I>
  void compute_end(pass_kind k, std::size_t u, I& in) {
    in.stamp(lane::compute, trace::kind::compute_end, k, u);
    if (k == pass_kind::backward && cost_[u].partial_grad_runs > 0) in.work(lane::compute, job::tensor_reduce, u, k);
  }

  /// Before master shards and optimizer state are written on the compute stream outside a step (a checkpoint
  /// load, a weight import): compute waits for every reduction, then for the host's last writes of offloaded
  /// masters and state (host updates, the copies back of staged steps). shards_written() follows the writes.
  template <class I>
  void before_shards_replaced(I& in) {
    wait_reductions(in);
    for (std::size_t u = 0; u < size(); ++u) {
      in.wait(lane::compute, signal::shard_ready, u);
      in.wait(lane::compute, signal::state_saved, u);
    }
  }

  /// Model::step's first action: compute waits for every unit's reduction.
  template <class I>
  void wait_reductions(I& in) {
    for (std::size_t u = 0; u < size(); ++u) in.wait(lane::compute, signal::reduced, u);
  }

  /// The step's commit (plan::commits; Model::step, at the gradient inspection's place, when there is none): the
  /// compute stream, which has waited for every reduction, all-reduces one element over the world in gradient slot
  /// 0 (idle now: no memory of its own), and every update is queued behind it (a host step's update waits for it:
  /// the interpreter). A failure anywhere in the step fails it on every rank before any update.
  template <class I>
  void commit(I& in) {
    in.work(lane::compute, job::commit, npos, pass_kind::none);
  }

  /// Model::step after the scheduler's before_step: the optimizer step begins (before the optimizer's own work
  /// ahead of its updates, the gradient inspection: run_step's `between`).
  template <class I>
  void optimizer_begin(I& in) {
    in.stamp(lane::compute, trace::kind::optimizer_begin, pass_kind::none, npos);
  }

  /// The optimizer's update of every unit (on the host, staged, or on the device; none when `apply` is false: a
  /// step the gradient inspection skipped), each unit's "shard ready" right after its own update (the next step's
  /// gather of a unit waits for that unit's update only, not for the whole step), then the step's end.
  template <class I>
  void optimizer_step(I& in, bool apply = true) {
    for (std::size_t u = 0; apply && u < size(); ++u) {
      const offload_facts& o = offload_[u];
      if (o.host_step()) {  // one host function for the unit
        in.wait(lane::host_work, signal::shard_ready, u);
        in.wait(lane::host_work, signal::reduced, u);
        in.wait(lane::host_work, signal::uploaded, u);
        in.work(lane::host_work, job::optimizer_host, u, pass_kind::none);
        in.record(lane::host_work, signal::shard_ready, u);
        ready_[u] = true;
      } else if (o.any()) {  // the host parts staged through device slots, the kernels, the copies back
        const staging_costs c = staging_costs_of(cost_[u], o, states_);
        in.wait(lane::upload, signal::shard_ready, u);
        in.wait(lane::upload, signal::reduced, u);
        in.wait(lane::upload, signal::state_saved, u);
        if (c.master)
          take(lane::upload, ring::upload, u, pass_kind::none, in),
              in.work(lane::upload, job::stage_master, u, pass_kind::none);
        if (c.grad)
          take(lane::upload, ring::stage_grad, u, pass_kind::none, in),
              in.work(lane::upload, job::stage_grad, u, pass_kind::none);
        if (c.state)
          take(lane::upload, ring::stage_state, u, pass_kind::none, in),
              in.work(lane::upload, job::stage_state, u, pass_kind::none);
        in.record(lane::upload, signal::staged, u);
        in.wait(lane::compute, signal::staged, u);
        in.work(lane::compute, job::optimizer_device, u, pass_kind::none);
        in.record(lane::compute, signal::stepped, u);
        if (!c.master) {  // the master lives on the device: written by the kernels just issued
          in.record(lane::compute, signal::shard_ready, u);
          ready_[u] = true;
        }
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
          ready_[u] = true;
        }
      } else {
        in.work(lane::compute, job::optimizer_device, u, pass_kind::none);
        in.record(lane::compute, signal::shard_ready, u);
        ready_[u] = true;
      }
    }
    shards_written(in);
    in.stamp(lane::compute, trace::kind::optimizer_end, pass_kind::none, npos);
  }

  /// Every master shard was written (an optimizer step, a checkpoint load): "shard ready" on the compute stream
  /// for the units whose update did not record it already, so later gathers wait for this point only (the host
  /// may run ahead of compute: a GPU, or a threaded compute stream).
  template <class I>
  void shards_written(I& in) {
    for (std::size_t u = 0; u < size(); ++u) {
      if (!ready_[u]) in.record(lane::compute, signal::shard_ready, u);
      ready_[u] = false;
    }
  }

  /// Model::zero_grad: every gradient shard zeroed once its reduction is done (a host gradient shard on the host,
  /// after the last step's reads too); no-sync accumulators freed.
  template <class I>
  void zero_grads(I& in) {
    for (std::size_t u = 0; u < size(); ++u) {
      if (cost_[u].grad_shard.where == domain::host) {
        in.wait(lane::host_work, signal::reduced, u);
        in.wait(lane::host_work, signal::shard_ready, u);
        in.work(lane::host_work, job::zero_shard_host, u, pass_kind::none);
        in.record(lane::host_work, signal::reduced, u);  // later readers of the shard (a step) wait for the zeroes
      } else {
        in.wait(lane::compute, signal::reduced, u);
        in.work(lane::compute, job::zero_shard, u, pass_kind::none);
      }
      if (accumulating_[u]) {
        in.buffer(lane::compute, cost_[u].accumulator, false, u);
        accumulating_[u] = false;
      }
    }
  }

  /// What unit u (< size()) takes of ring r: its own buffer of that purpose (the slot ledger finds it a slot of that
  /// size, or makes one). The download ring, pinned host memory made before the first step, has one size, its
  /// largest buffer.
  buffer_cost need(std::size_t u, ring r) const {
    const unit_costs& c = cost_[u];
    switch (r) {
      case ring::gathered: return c.gathered;
      case ring::grad: return c.grad;
      case ring::reduce_input: return c.reduce_input;
      case ring::reduce_output: return c.reduce_output;
      case ring::upload: return c.upload;  // a staged step's master shard: the same buffer (staging_costs_of)
      case ring::download: return slots_.download;
      case ring::stage_grad: return staging_costs_of(c, offload_[u], states_).grad;
      case ring::stage_state: return staging_costs_of(c, offload_[u], states_).state;
      case ring::wire: return c.wire;
    }
    return c.gathered;
  }
  /// The largest buffer of a ring: the download ring's slot size, and the most any slot of the others grows to.
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
      case ring::wire: return slots_.wire;
    }
    return slots_.gathered;
  }

  /// The slot ledger of ring r: which slots exist, their sizes, the order of those given back, each use's last slot
  /// (the memory planner runs steps until a step leaves them as an earlier one did).
  const sched::slot_ledger& ledger(ring r) const noexcept { return ledger_[static_cast<std::size_t>(r)]; }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

 private:
  template <class I>
  void gather(std::size_t u, bool ahead, pass_kind pass, I& in) {
    const unit_costs& c = cost_[u];
    in.stamp(lane::host, trace::kind::gather_issued, pass, u, ahead);
    if (c.upload) {  // offloaded params: the host master shard to the device first
      in.wait(lane::upload, signal::shard_ready, u);
      take(lane::upload, ring::upload, u, pass, in);
      in.work(lane::upload, job::upload_master, u, pass);
      in.record(lane::upload, signal::uploaded, u);
      in.wait(lane::gather, signal::uploaded, u);
    } else {
      in.wait(lane::gather, signal::shard_ready, u);
    }
    take(lane::gather, ring::gathered, u, pass, in);
    if (c.wire) take(lane::gather, ring::wire, u, pass, in);  // the all-gather's buffer, in the narrower gather dtype
    in.stamp(lane::gather, trace::kind::gather_begin, pass, u);
    in.work(lane::gather, job::gather, u, pass);
    if (c.upload) give(lane::gather, ring::upload, u, in);
    if (c.wire) {
      in.work(lane::gather, job::widen, u, pass);
      give(lane::gather, ring::wire, u, in);
    }
    in.stamp(lane::gather, trace::kind::gather_end, pass, u);
    in.record(lane::gather, signal::gathered, u);
  }

  template <class I>
  void reduce(std::size_t u, pass_kind pass, I& in) {
    const unit_costs& c = cost_[u];
    in.stamp(lane::host, trace::kind::reduce_issued, pass, u);
    in.views_end(lane::compute, views::grad, u);
    in.record(lane::compute, signal::grad_ready, u);
    in.wait(lane::reduce, signal::grad_ready, u);
    in.stamp(lane::reduce, trace::kind::reduce_begin, pass, u);
    const bool accumulated = accumulating_[u];
    if (accumulated) {  // the last gradient into the accumulator, its slot given back
      add_to_accumulator(lane::reduce, u, pass, in);
      give(lane::reduce, ring::grad, u, in);
    }
    if (c.reduce_input) {
      take(lane::reduce, ring::reduce_input, u, pass, in);
      in.work(lane::reduce, job::cast_reduce_input, u, pass);
    } else if (prescales_) {
      in.work(lane::reduce, job::prescale, u, pass);
    }
    if (c.reduce_output) take(lane::reduce, ring::reduce_output, u, pass, in);
    in.work(lane::reduce, job::reduce_collective, u, pass);
    if (c.reduce_output && replicates()) in.work(lane::reduce, job::replica_reduce, u, pass);
    lane gives = lane::reduce;  // the stream that read the reduction's slots last
    if (c.download) {
      in.stamp(lane::reduce, trace::kind::reduce_end, pass, u);
      in.record(lane::reduce, signal::collected, u);
      in.wait(lane::download, signal::collected, u);
      take(lane::download, ring::download, u, pass, in);
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
    if (c.download) {  // the host addition on its own lane: the download stream goes on with the next copy
      in.record(lane::download, signal::downloaded, u);
      in.wait(lane::host_work, signal::downloaded, u);
      in.wait(lane::host_work, signal::shard_ready, u);
      in.work(lane::host_work, job::host_add, u, pass);
      give(lane::host_work, ring::download, u, in);
    }
    in.record(c.download ? lane::host_work : gives, signal::reduced, u);
  }

  template <class I>
  void add_to_accumulator(lane l, std::size_t u, pass_kind pass, I& in) {
    const bool first = !accumulating_[u];
    if (first) in.buffer(l, cost_[u].accumulator, true, u);
    accumulating_[u] = true;
    in.work(l, first ? job::start_accumulator : job::accumulate, u, pass);
  }

  template <class I>
  void take(lane l, ring r, std::size_t u, pass_kind pass, I& in) {
    const buffer_cost each = need(u, r);
    // a use: the unit in a pass (its forward's, its backward's, the step's)
    const std::size_t use = u * 3 + static_cast<std::size_t>(pass);
    const sched::slot_ledger::pick p = ledger_[static_cast<std::size_t>(r)].take(each.bytes(), use);
    held_[u][static_cast<std::size_t>(r)] = p.slot;
    in.take(l, r, p, each, u);
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
  int replicas_;
  bool prescales_;
  slot_costs slots_;
  staging_costs staging_;
  sched::slot_ledger ledger_[rings];
  struct held_slots {
    int slot[rings] = {-1, -1, -1, -1, -1, -1, -1, -1, -1};
    int& operator[](std::size_t r) noexcept { return slot[r]; }
  };
  std::vector<held_slots> held_;    // per unit: the slot it holds in each ring
  std::vector<char> accumulating_;  // per unit: its no-sync accumulator exists
  std::vector<char> ready_;         // per unit: this step's update recorded its "shard ready" already
};

inline step_program::step_program(std::vector<unit_costs> costs, std::vector<offload_facts> offload, int grad_slots,
                                  int optimizer_states, int replicas, bool prescales)
    : cost_(std::move(costs)),
      offload_(std::move(offload)),
      states_(optimizer_states),
      replicas_(replicas),
      prescales_(prescales),
      slots_(slot_costs_of(cost_)),
      staging_(staging_slots_of(cost_, offload_, optimizer_states)),
      ledger_{sched::slot_ledger(1),
              sched::slot_ledger(grad_slots),
              sched::slot_ledger(1),
              sched::slot_ledger(1),
              sched::slot_ledger(offload_slots),
              sched::slot_ledger(offload_slots),
              sched::slot_ledger(offload_slots),
              sched::slot_ledger(offload_slots),
              sched::slot_ledger(1)},
      held_(cost_.size()),
      accumulating_(cost_.size(), false),
      ready_(cost_.size(), false) {}

inline void step_program::set_optimizer_states(int states) {
  states_ = states;
  staging_ = staging_slots_of(cost_, offload_, states);
  ledger_[static_cast<std::size_t>(ring::stage_state)] = sched::slot_ledger(offload_slots);
}

}  // namespace fsdp::plan::detail
