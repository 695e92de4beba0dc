#pragma once
// The scheduler's decisions, apart from their execution. Given a unit's place in a pass, it says which units to
// gather (on demand or ahead, per the prefetch facts and the gather-slot limit), when the compute stream must
// wait, which units to release, and when a unit's gradient buffer is allocated and reduced. It keeps the
// parameter state of every unit and touches no memory, stream or communicator.
//
// Two executors run the same decisions: Model (fsdp/model.hpp) runs them on a backend and a communicator; the
// memory planner (fsdp/plan/memory_plan.hpp) runs them on byte counters. So the planner predicts exactly what
// the model allocates, for every policy, without a second copy of the scheduling rules.
//
//   forward, entering unit u:   gather u if sharded; prefetch the forward window; wait for u's gather
//   forward, leaving u:         release u if it reshards after forward
//   backward, entering u:       gather u if sharded; prefetch the backward window (unless post_backward);
//                               wait for u's gather; allocate u's zeroed unsharded gradient
//   backward, leaving u:        release u; prefetch the backward window (post_backward only); reduce u's gradient
//   before an optimizer step:   release every unit still gathered (its copy would be stale after the step)
//
// A window lists candidate units in order: the next `depth` units of the pass order, or the units named for u in
// an explicit schedule. A candidate already gathered (or gathering) is skipped; the window stops at the first
// candidate that finds every gather slot taken. A unit that must be gathered for use when every slot is taken is
// a usage_error (too few slots for the units the policy keeps gathered).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/unit/state.hpp"

namespace fsdp::sched {

enum class op : std::uint8_t {
  gather,      ///< issue the unit's all-gather (`ahead` tells a prefetch from a demand gather)
  wait,        ///< the compute stream waits for the unit's all-gather
  release,     ///< the unit's gathered parameters are freed
  alloc_grad,  ///< the unit's zeroed unsharded gradient buffer is allocated
  reduce,      ///< the unit's gradient is reduced into its shard and the buffer freed
};

constexpr const char* name_of(op o) noexcept {
  switch (o) {
    case op::gather: return "gather";
    case op::wait: return "wait";
    case op::release: return "release";
    case op::alloc_grad: return "alloc_grad";
    case op::reduce: return "reduce";
  }
  return "?";
}

/// The runtime facts the scheduler decides from (built from the policy and model_options by the Model).
struct config {
  bool shards_params = true;
  /// Per unit index: released when its forward ends (else kept gathered until its backward ends).
  std::vector<bool> reshard_after_forward;
  int forward_depth = 0;
  int backward_depth = 0;
  bool post_backward = false;
  bool by_schedule = false;
  /// Per unit index, for by_schedule: the units to prefetch when that unit's forward / backward starts.
  std::vector<std::vector<std::size_t>> forward_schedule;
  std::vector<std::vector<std::size_t>> backward_schedule;
  /// Units held gathered (or gathering) at once; 0 = no limit.
  int gather_slots = 0;
};

class scheduler {
 public:
  scheduler(std::vector<std::string> names, config c)
      : names_(std::move(names)), c_(std::move(c)), state_(names_.size(), unit_state::sharded) {
    const std::size_t n = names_.size();
    if (c_.reshard_after_forward.size() != n)
      detail::fail_usage("scheduler: reshard_after_forward has ", c_.reshard_after_forward.size(),
                         " entries for ", n, " units");
    if (c_.by_schedule && (c_.forward_schedule.size() != n || c_.backward_schedule.size() != n))
      detail::fail_usage("scheduler: an explicit prefetch schedule needs one list per unit");
    if (c_.gather_slots < 0) detail::fail_usage("gather_slots must be >= 0 (0 = no limit), got ", c_.gather_slots);
    if (!c_.shards_params) state_.assign(n, unit_state::gathered);  // the master is the full parameter
  }

  std::size_t size() const noexcept { return names_.size(); }
  const config& facts() const noexcept { return c_; }
  unit_state state(std::size_t u) const { return state_.at(u); }
  /// Units currently gathering or gathered (under a sharding strategy).
  int held() const noexcept { return held_; }

  /// The unit at position `pos` of a pass. `order` is the forward order known so far (all units in backward).
  static std::size_t unit_at(pass_kind k, const std::vector<std::size_t>& order, std::size_t pos) {
    return k == pass_kind::backward ? order[order.size() - 1 - pos] : order[pos];
  }

  /// emit(op, unit, ahead) for every step of entering position `pos` of pass `k`.
  template <class Emit>
  void enter(pass_kind k, const std::vector<std::size_t>& order, std::size_t pos, Emit&& emit) {
    const std::size_t u = unit_at(k, order, pos);
    if (c_.shards_params) {
      if (state_[u] == unit_state::sharded) {
        if (!slot_free())
          detail::fail_usage("gather slots exhausted: unit '", names_[u], "' (index ", u, ") must be gathered for its ",
                             name_of(k), " but all ", c_.gather_slots, " slots are held by ", held_list(),
                             "; raise model_options::gather_slots or let those units reshard after forward");
        gather(u, false, emit);
      }
      if (k == pass_kind::forward || !c_.post_backward) prefetch(k, order, pos, u, emit);
      if (state_[u] == unit_state::gathering) wait(u, emit);
    }
    if (k == pass_kind::backward) emit(op::alloc_grad, u, false);
  }

  /// emit(op, unit, ahead) for every step of leaving position `pos` of pass `k`.
  template <class Emit>
  void leave(pass_kind k, const std::vector<std::size_t>& order, std::size_t pos, Emit&& emit) {
    const std::size_t u = unit_at(k, order, pos);
    if (k == pass_kind::forward) {
      if (c_.shards_params && c_.reshard_after_forward[u]) release(u, emit);
      return;
    }
    if (c_.shards_params) {
      release(u, emit);
      if (c_.post_backward) prefetch(k, order, pos, u, emit);
    }
    emit(op::reduce, u, false);
  }

  /// Releases every unit still gathered (waiting first for gathers in flight): after an optimizer step their
  /// gathered copies would be stale.
  template <class Emit>
  void before_step(Emit&& emit) {
    if (!c_.shards_params) return;
    for (std::size_t u = 0; u < state_.size(); ++u) {
      if (state_[u] == unit_state::gathering) wait(u, emit);
      if (state_[u] == unit_state::gathered) release(u, emit);
    }
  }

 private:
  bool slot_free() const noexcept { return c_.gather_slots == 0 || held_ < c_.gather_slots; }

  std::string held_list() const {
    std::string s;
    for (std::size_t u = 0; u < state_.size(); ++u)
      if (state_[u] != unit_state::sharded) s += (s.empty() ? "'" : ", '") + names_[u] + "'";
    return s;
  }

  template <class Emit>
  void prefetch(pass_kind k, const std::vector<std::size_t>& order, std::size_t pos, std::size_t u, Emit& emit) {
    auto try_one = [&](std::size_t c) {  // false: stop the window
      if (state_[c] != unit_state::sharded) return true;
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
    const std::size_t known = k == pass_kind::forward ? order.size() : names_.size();
    for (int d = 1; d <= depth; ++d) {
      const std::size_t p = pos + static_cast<std::size_t>(d);
      if (p >= known) return;
      if (!try_one(unit_at(k, order, p))) return;
    }
  }

  template <class Emit>
  void gather(std::size_t u, bool ahead, Emit& emit) {
    state_[u] = unit_state::gathering;
    ++held_;
    emit(op::gather, u, ahead);
  }
  template <class Emit>
  void wait(std::size_t u, Emit& emit) {
    state_[u] = unit_state::gathered;
    emit(op::wait, u, false);
  }
  template <class Emit>
  void release(std::size_t u, Emit& emit) {
    state_[u] = unit_state::sharded;
    --held_;
    emit(op::release, u, false);
  }

  std::vector<std::string> names_;
  config c_;
  std::vector<unit_state> state_;
  int held_ = 0;
};

}  // namespace fsdp::sched
