#pragma once
// One purpose's reusable buffers on a backend: the slots the step program's sched::slot_ledger picks
// (fsdp/plan/detail/program.hpp), each made at the size the ledger gives it on first use and kept until the ring goes;
// the event recorded where each was last given back. Taking a slot that existed makes the taking stream wait for that
// event first (the rate limit of FSDP, with GPU events and no host synchronisation), so no stream writes a slot
// another stream still reads. A slot the ledger makes larger is freed and made again after that wait, in the taking
// stream's order (the first steps only: the ledger settles). A slot taken again on the stream that gave it back
// needs no wait (the stream's own order holds), and none is issued.
#include <cstdint>
#include <cstring>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/detail/schedule/slot_ledger.hpp"
#include "fsdp/memory/cost.hpp"

namespace fsdp::detail::exec {

/// A buffer of cost `c` in its domain: device memory first used on `first_use`, or host memory (pinned on CUDA)
/// on a backend that has it. The policy checks (Model) make sure a host-domain cost only reaches an OffloadBackend.
template <Backend B>
typename B::buffer allocate(B& be, const plan::buffer_cost& c, typename B::stream& first_use) {
  if (c.where == domain::host) {
    if constexpr (OffloadBackend<B>)
      return be.allocate_host(c.bytes(), c.category);
    else
      detail::fail_usage("a buffer of ", name_of(c.category),
                         " in host memory, on a backend without it (one that does not model fsdp::OffloadBackend)");
  }
  return be.allocate(c.bytes(), c.category, first_use);
}

/// Zeroes `b`, just made by allocate() with cost `c`: host memory at once (nothing uses it yet), device memory
/// on `s`.
template <Backend B>
void zero_new(B& be, typename B::buffer& b, const plan::buffer_cost& c, typename B::stream& s) {
  if (c.where == domain::host)
    std::memset(b.data(), 0, static_cast<std::size_t>(c.bytes()));
  else
    be.fill_zero(b.data(), c.bytes(), s);
}

template <Backend B>
class slot_ring {
 public:
  using stream = typename B::stream;

  slot_ring() = default;
  /// Slots of which the ledger makes `keep` before it reuses one; `ahead`: the size of those make_all() makes.
  slot_ring(const plan::buffer_cost& ahead, int keep) : ahead_(ahead), keep_(keep) {}

  /// Makes every slot the ledger will make, at the ring's one size, before they are first taken (host memory:
  /// pinning it may synchronise the device, which must not happen within a step). The ledger still counts them as
  /// made at their first take, as the planner does.
  void make_all(B& be, stream& s) {
    if (ahead_.numel <= 0) return;
    while (bufs_.size() < static_cast<std::size_t>(keep_)) make(be, ahead_, s);
  }
  /// The slot `p` picks for a buffer `each`, for use on `s`, ready there.
  void take(const sched::slot_ledger::pick& p, const plan::buffer_cost& each, B& be, stream& s) {
    const auto i = static_cast<std::size_t>(p.slot);
    if (p.fresh) {
      while (i >= bufs_.size()) make(be, each, s);  // not made ahead
      return;
    }
    if (giver_[i] != &s) be.wait(s, given_back_[i]);
    if (p.grows) {  // after the wait: no stream reads the old memory any more
      be.release_after(std::move(bufs_[i]), s);
      bufs_[i] = allocate(be, each, s);
    }
  }
  /// Slot i is free again once `s` reaches this point.
  void give(B& be, int i, stream& s) {
    be.record(given_back_[static_cast<std::size_t>(i)], s);
    giver_[static_cast<std::size_t>(i)] = &s;
  }
  void* data(int i) const { return bufs_[static_cast<std::size_t>(i)].data(); }
  /// Whether slot i was made.
  bool made(int i) const noexcept { return i >= 0 && static_cast<std::size_t>(i) < bufs_.size(); }

 private:
  void make(B& be, const plan::buffer_cost& each, stream& s) {
    bufs_.push_back(allocate(be, each, s));
    given_back_.emplace_back();
    giver_.push_back(nullptr);
  }

  plan::buffer_cost ahead_{};
  int keep_ = 1;
  std::vector<typename B::buffer> bufs_;
  std::vector<typename B::event> given_back_;
  std::vector<const stream*> giver_;  // the stream of each slot's last give
};

}  // namespace fsdp::detail::exec
