#pragma once
// Which of a purpose's reusable buffers ("slots") a use takes, and how large each slot is: the decision alone,
// shared by the unit executor (fsdp/detail/exec/slot_ring.hpp, which adds the memory and the events) and the memory
// planner (which adds byte counters). So device memory for gathered parameters and unsharded gradients is what the
// planner counts, by construction: the library makes at most as many slots as the ledger asks for, each of the size
// the ledger gives it, and reuses a slot only after the stream that takes it waits for the event recorded where it
// was given back (no pool can add memory behind it).
//
//   take(bytes, use)  `bytes` for `use` (the caller's name for a use that recurs: a unit's gather in forward).
//                Once `keep` slots exist and one has been given back: the slot `use` took last time, when it has
//                been given back and holds `bytes`; else the smallest slot given back that holds `bytes` (of equal
//                ones, the one given back longest ago); when none holds it, the largest given back (ditto), made
//                again at `bytes` after the wait (its memory freed in the taking stream's order, the new memory
//                taken there). Otherwise a new slot of `bytes`. So a slot is as large as the largest use it served,
//                units of different sizes each find a slot of their own size where the schedule lets them, a step
//                takes the slots the one before took (the first step's fresh slots were made to measure), and the
//                ledger makes as many slots as it would if each were of the largest unit's size: never more memory
//                than that. `keep` > 1 lets a slot's last user (a reduction on another stream) run on while the
//                next `keep - 1` uses go ahead in fresh slots: the depth of overlap that memory buys.
//   give(i)      slot i may be taken again (its event is recorded where the caller gives it back)
//
// A slot made again happens in the first steps only: sizes only grow, up to the largest use, and a step repeats
// the last one's takes and gives, so the ledger settles (the memory planner runs steps until it has, and plans
// what they made).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "fsdp/core/error.hpp"

namespace fsdp::detail::sched {

class slot_ledger {
 public:
  struct pick {
    int slot = 0;
    bool fresh = false;  ///< a new slot: nothing to wait for, memory to make
    bool grows = false;  ///< a slot given back but too small: after the wait, its memory is made again, larger
  };

  explicit slot_ledger(int keep = 1) : keep_(keep) {
    if (keep_ < 1) detail::fail_usage("slot_ledger: keep must be >= 1, got ", keep_);
  }

  pick take(std::int64_t bytes, std::size_t use) {
    if (last_.size() <= use) last_.resize(use + 1, -1);
    pick p{count(), true, false};
    if (count() >= keep_ && !free_.empty()) {
      auto it = std::find(free_.begin(), free_.end(), last_[use]);
      if (it == free_.end() || size(*it) < bytes) {
        it = free_.end();
        for (auto f = free_.begin(); f != free_.end(); ++f)  // the smallest that holds it
          if (size(*f) >= bytes && (it == free_.end() || size(*f) < size(*it))) it = f;
      }
      p.fresh = false;
      p.grows = it == free_.end();
      if (p.grows)  // the largest, made larger
        for (auto f = free_.begin(); f != free_.end(); ++f)
          if (it == free_.end() || size(*f) > size(*it)) it = f;
      p.slot = *it;
      free_.erase(it);
      if (p.grows) bytes_[static_cast<std::size_t>(p.slot)] = bytes;
    } else {
      bytes_.push_back(bytes);
    }
    last_[use] = p.slot;
    return p;
  }
  void give(int slot) { free_.push_back(slot); }
  /// Slots made so far.
  int count() const noexcept { return static_cast<int>(bytes_.size()); }
  /// Slots made before one is reused.
  int keep() const noexcept { return keep_; }
  /// Slot i's size.
  std::int64_t size(int slot) const noexcept { return bytes_[static_cast<std::size_t>(slot)]; }

  /// The same slots, sizes, order of the slots given back and last slot of each use: the same picks from here on.
  friend bool operator==(const slot_ledger&, const slot_ledger&) = default;

 private:
  int keep_;
  std::vector<std::int64_t> bytes_;  // per slot: its size
  std::deque<int> free_;             // the slots given back, longest ago first
  std::vector<int> last_;            // per use: the slot it took last (-1: none yet)
};

}  // namespace fsdp::detail::sched
