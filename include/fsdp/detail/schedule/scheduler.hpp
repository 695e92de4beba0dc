#pragma once
// The scheduler's decisions, apart from their execution, and the one owner of every unit's state. Given a unit's
// place in a pass, it says which units to gather (on demand or ahead, per the prefetch facts and the gather-slot
// limit), when the compute stream must wait, which units to release, when a unit's gradient buffer is allocated,
// kept for a later micro-batch or reduced. It touches no memory, stream or communicator.
//
// The step program (fsdp/plan/detail/program.hpp) records these decisions once, and four readers interpret it: the
// executor (fsdp/detail/exec/interpreter.hpp) on a backend and a communicator, for Model; the memory planner
// (fsdp/plan/memory_plan.hpp) on byte counters; the timeline planner (fsdp/plan/timeline.hpp) on durations; the
// listing (fsdp/plan/listing.hpp) as text. So the planners predict exactly what the model allocates and issues,
// for every policy, without a second copy of the scheduling rules.
//
//   forward, entering unit u:   gather u if it is not gathered; prefetch the forward window; wait for u's gather
//   forward, leaving u:         release u if it reshards after forward (and units are not kept gathered); the
//                               first unit of the pass (the root) does only where model_options names it: a
//                               tied-embedding model uses its root again at the forward's end (the head) and
//                               first in backward, so it stays gathered into its backward (as PyTorch FSDP2's root)
//   backward, entering u:       gather u if needed; prefetch the backward window (unless post_backward);
//                               wait for u's gather; allocate u's zeroed unsharded gradient (entering the first
//                               unit of the pass: every early-gradient unit's too, model_options::early_grads)
//   backward, leaving u:        release u (in the last micro-batch only, when units are kept gathered; never
//                               under ZeRO-1); prefetch the backward window (post_backward only); then reduce u's
//                               gradient, or, under no-sync before the last micro-batch, accumulate it locally
//   before an optimizer step:   release every unit still gathered (its copy would be stale after the step)
//   after an optimizer step:    ZeRO-1 only (config::keep_between_steps): gather every unit again, in forward
//                               order, from its updated shard
//
// A window lists candidate units in order: the next `depth` units of the pass order, or the units named for u in
// an explicit schedule. A candidate already gathered (or gathering) is skipped; the window stops at the first
// candidate that finds every gather slot taken. A unit that must be gathered for use when every slot is taken is
// a shortage: enter() returns it (and decides nothing), and the caller says what to do about it.
//
// Unit state kept here: parameters (sharded / gathering / gathered), the pass a unit is current in, whether its
// forward ran since its last backward, whether its gradient was reduced since the last step; and per model, the
// micro-batches done since the last step and the step counter. Protocol mistakes (backward before forward, a step
// before the gradients are reduced, a micro-batch too many under no-sync) are usage_errors naming the unit.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/core/unit_state.hpp"
#include "fsdp/detail/schedule/config.hpp"

namespace fsdp::detail::sched {

enum class op : std::uint8_t {
  gather,      ///< issue the unit's all-gather (or cast copy) (`ahead` tells a prefetch from a demand gather)
  wait,        ///< the compute stream waits for the unit's gather
  release,     ///< the unit's gathered parameters are freed
  alloc_grad,  ///< the unit's zeroed unsharded gradient buffer is allocated
  accumulate,  ///< no-sync: the unit's gradient is added to its local accumulator and the buffer freed
  reduce,      ///< the unit's gradient (plus its accumulator) is reduced into its shard and the buffers freed
};

constexpr const char* name_of(op o) noexcept {
  switch (o) {
    case op::gather: return "gather";
    case op::wait: return "wait";
    case op::release: return "release";
    case op::alloc_grad: return "alloc_grad";
    case op::accumulate: return "accumulate";
    case op::reduce: return "reduce";
  }
  return "?";
}

/// A unit that had to be gathered for use while every gather slot was held.
struct shortage {
  std::size_t unit = 0;
  pass_kind pass = pass_kind::forward;
  int slots = 0;
  std::string holders;  ///< the units holding the slots: "'l0', 'l1'"

  std::string message(const unit_index& units) const;
};

class scheduler {
 public:
  /// `units` must outlive the scheduler.
  scheduler(const unit_index& units, config c);

  std::size_t size() const noexcept { return u_.size(); }
  const config& facts() const noexcept { return c_; }
  const unit_index& units() const noexcept { return *units_; }

  // ---- state -----------------------------------------------------------------------------------------------
  unit_state params(std::size_t u) const { return u_.at(u).params; }
  /// The pass unit `u` is current in (none between uses).
  pass_kind active(std::size_t u) const { return u_.at(u).active; }
  bool forward_done(std::size_t u) const { return u_.at(u).forward_done; }
  /// The unit's gradient was reduced into its shard since the last optimizer step.
  bool reduced(std::size_t u) const { return u_.at(u).reduced; }
  /// Units currently gathering or gathered (when units are gathered at all).
  int held() const noexcept { return held_; }
  /// Unit u's unsharded gradient exists (from its backward's start, or from the pass's for an early-gradient unit)
  /// and has not gone to its reduction yet.
  bool grad_open(std::size_t u) const { return u_.at(u).grad_open; }
  /// Backward passes completed since the last optimizer step.
  int micro_batches_done() const noexcept { return micro_batches_done_; }
  /// Steps begun so far: a forward pass after an optimizer step (or the first one) begins the next.
  std::uint64_t step() const noexcept { return step_; }

  /// The unit at position `pos` of a pass. `order` is the forward order known so far (all units in backward).
  static std::size_t unit_at(pass_kind k, const std::vector<std::size_t>& order, std::size_t pos) {
    return k == pass_kind::backward ? order[order.size() - 1 - pos] : order[pos];
  }

  // ---- passes ----------------------------------------------------------------------------------------------
  /// Checks that a pass of kind `k` may begin (usage_error otherwise; nothing changes then).
  void check_begin(pass_kind k) const;
  /// A pass of kind `k` begins (after check_begin).
  void begin_pass(pass_kind k) {
    if (k == pass_kind::forward && !step_open_) {
      ++step_;
      step_open_ = true;
    }
  }
  /// A pass of kind `k` ended with every unit visited.
  void end_pass(pass_kind k) {
    if (k == pass_kind::backward) ++micro_batches_done_;
  }

  /// emit(op, unit, ahead) for every step of entering position `pos` of pass `k`; or, when the unit must be
  /// gathered and every slot is held, the shortage (and nothing emitted, nothing changed).
  template <class Emit>
  [[nodiscard]] std::optional<shortage> enter(pass_kind k, const std::vector<std::size_t>& order, std::size_t pos,
                                              Emit&& emit) {
    const std::size_t u = unit_at(k, order, pos);
    if (c_.gathers && u_[u].params == unit_state::sharded && !slot_free())
      return shortage{u, k, c_.gather_slots, held_list()};
    u_[u].active = k;
    if (c_.gathers) {
      if (u_[u].params == unit_state::sharded) gather(u, false, emit);
      if (k == pass_kind::forward || !c_.post_backward) prefetch(k, order, pos, u, emit);
      if (u_[u].params == unit_state::gathering) wait(u, emit);
    }
    if (k == pass_kind::backward) {
      if (pos == 0)
        for (std::size_t e = 0; e < u_.size(); ++e)
          if (c_.early_grad[e] && e != u) alloc_grad(e, emit);
      if (!u_[u].grad_open) alloc_grad(u, emit);
    }
    return std::nullopt;
  }

  /// emit(op, unit, ahead) for every step of leaving position `pos` of pass `k`.
  template <class Emit>
  void leave(pass_kind k, const std::vector<std::size_t>& order, std::size_t pos, Emit&& emit) {
    const std::size_t u = unit_at(k, order, pos);
    u_[u].active = pass_kind::none;
    if (k == pass_kind::forward) {
      u_[u].forward_done = true;
      if (c_.gathers && reshards_after_forward(u, pos) && !c_.keep_gathered && !c_.keep_between_steps) release(u, emit);
      return;
    }
    u_[u].forward_done = false;
    const bool last = micro_batches_done_ + 1 >= c_.micro_batches;
    if (c_.gathers) {
      if (!c_.keep_between_steps && (!c_.keep_gathered || last)) release(u, emit);
      if (c_.post_backward) prefetch(k, order, pos, u, emit);
    }
    u_[u].grad_open = false;
    if (c_.sync_each_micro_batch || last) {
      emit(op::reduce, u, false);
      u_[u].reduced = true;
    } else {
      emit(op::accumulate, u, false);
    }
  }

  /// Whether unit `u`, leaving position `pos` of a forward pass, is released there (units being gathered and not
  /// kept): its reshard_after_forward, but for the first unit of the pass (the root) only where model_options names it.
  bool reshards_after_forward(std::size_t u, std::size_t pos) const {
    return c_.reshard_after_forward[u] && (pos != 0 || c_.reshard_named[u]);
  }

  // ---- optimizer steps -------------------------------------------------------------------------------------
  /// usage_error naming the first unit whose gradient was not reduced since the last step.
  void check_step() const;
  /// Releases every unit still gathered (waiting first for gathers in flight): after an optimizer step their
  /// gathered copies would be stale.
  template <class Emit>
  void before_step(Emit&& emit) {
    if (!c_.gathers) return;
    for (std::size_t u = 0; u < u_.size(); ++u) {
      if (u_[u].params == unit_state::gathering) wait(u, emit);
      if (u_[u].params == unit_state::gathered) release(u, emit);
    }
  }
  /// The step consumed the gradients: a new accumulation window begins. Under ZeRO-1 (config::keep_between_steps)
  /// every unit is gathered again from its updated shard, ahead of the next forward: the units of `order` (the
  /// forward order known so far) first, then any other in index order.
  template <class Emit>
  void after_step(const std::vector<std::size_t>& order, Emit&& emit) {
    for (auto& s : u_) s.reduced = false;
    micro_batches_done_ = 0;
    step_open_ = false;
    if (!c_.keep_between_steps) return;
    for (std::size_t u : order)
      if (u_[u].params == unit_state::sharded) gather(u, true, emit);
    for (std::size_t u = 0; u < u_.size(); ++u)
      if (u_[u].params == unit_state::sharded) gather(u, true, emit);
  }
  /// usage_error unless the model is between optimizer steps with no gradient waiting for one (no unit reduced
  /// and no micro-batch done since the last step): `what` ("a checkpoint save") would lose those gradients.
  void check_between_steps(std::string_view what) const;
  /// The steps completed: step() less the one a forward began and no optimizer step closed (a failed step's).
  std::uint64_t completed_steps() const noexcept { return step_ - (step_open_ ? 1 : 0); }
  /// A checkpoint's step count replaces this one (between steps).
  void restore_step(std::uint64_t step) noexcept {
    step_ = step;
    step_open_ = false;
  }
  /// The gradients were discarded (zero_grad): the accumulation window starts again.
  void restart_window() noexcept { micro_batches_done_ = 0; }

 private:
  struct unit_status {
    unit_state params = unit_state::sharded;
    pass_kind active = pass_kind::none;
    bool forward_done = false;
    bool reduced = false;
    bool grad_open = false;
  };

  bool slot_free() const noexcept { return c_.gather_slots == 0 || held_ < c_.gather_slots; }

  std::string held_list() const;

  template <class Emit>
  void prefetch(pass_kind k, const std::vector<std::size_t>& order, std::size_t pos, std::size_t u, Emit& emit) {
    auto try_one = [&](std::size_t c) {  // false: stop the window
      if (u_[c].params != unit_state::sharded) return true;
      if (!slot_free()) return false;
      gather(c, true, emit);
      return true;
    };
    if (c_.by_schedule) {
      for (std::size_t c : (k == pass_kind::forward ? c_.forward_schedule : c_.backward_schedule)[u])
        if (!try_one(c)) return;
      return;
    }
    const int depth = k == pass_kind::forward ? c_.forward_depth : c_.backward_depth;
    // Positions known so far: in a forward whose order is being recorded, only those already entered.
    const std::size_t known = k == pass_kind::forward ? order.size() : u_.size();
    for (int d = 1; d <= depth; ++d) {
      const std::size_t p = pos + static_cast<std::size_t>(d);
      if (p >= known) return;
      if (!try_one(unit_at(k, order, p))) return;
    }
  }

  template <class Emit>
  void gather(std::size_t u, bool ahead, Emit& emit) {
    u_[u].params = unit_state::gathering;
    ++held_;
    emit(op::gather, u, ahead);
  }
  template <class Emit>
  void wait(std::size_t u, Emit& emit) {
    u_[u].params = unit_state::gathered;
    emit(op::wait, u, false);
  }
  template <class Emit>
  void alloc_grad(std::size_t u, Emit& emit) {
    u_[u].grad_open = true;
    emit(op::alloc_grad, u, false);
  }
  template <class Emit>
  void release(std::size_t u, Emit& emit) {
    u_[u].params = unit_state::sharded;
    --held_;
    emit(op::release, u, false);
  }

  const unit_index* units_;
  config c_;
  std::vector<unit_status> u_;
  int held_ = 0;
  int micro_batches_done_ = 0;
  std::uint64_t step_ = 0;
  bool step_open_ = false;
};

}  // namespace fsdp::detail::sched

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/detail/schedule/scheduler.ipp"
#endif
