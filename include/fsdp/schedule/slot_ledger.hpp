#pragma once
// Which of a purpose's reusable buffers ("slots") a use takes: the decision alone, shared by the unit executor
// (fsdp/exec/slot_ring.hpp, which adds the memory and the events) and the memory planner (which adds byte
// counters). So device memory for gathered parameters and unsharded gradients is what the planner counts, by
// construction: the library makes at most as many slots as the ledger asks for, and reuses a slot only after the
// stream that takes it waits for the event recorded where it was given back (no pool can add memory behind it).
//
//   take()   a slot given back earlier (the one given back longest ago), once `keep` slots exist; otherwise a
//            new slot. `keep` > 1 lets a slot's last user (a reduction on another stream) run on while the next
//            `keep - 1` uses go ahead in fresh slots: the depth of overlap that memory buys.
//   give(i)  slot i may be taken again (its event is recorded where the caller gives it back)
#include <cstddef>
#include <deque>

#include "fsdp/core/error.hpp"

namespace fsdp::sched {

class slot_ledger {
 public:
  struct pick {
    int slot = 0;
    bool fresh = false;  ///< a new slot: nothing to wait for, memory to make
  };

  explicit slot_ledger(int keep = 1) : keep_(keep) {
    if (keep_ < 1) detail::fail_usage("slot_ledger: keep must be >= 1, got ", keep_);
  }

  pick take() {
    if (count_ >= keep_ && !free_.empty()) {
      const int s = free_.front();
      free_.pop_front();
      return {s, false};
    }
    return {count_++, true};
  }
  void give(int slot) { free_.push_back(slot); }
  /// Slots made so far.
  int count() const noexcept { return count_; }
  /// Slots made before one is reused.
  int keep() const noexcept { return keep_; }

 private:
  int keep_;
  int count_ = 0;
  std::deque<int> free_;
};

}  // namespace fsdp::sched
