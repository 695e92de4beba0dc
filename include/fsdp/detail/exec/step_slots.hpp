#pragma once
// The slots of a step on a backend: one ring (detail/exec/slot_ring.hpp) per purpose of the step program (plan::ring),
// each slot as large as the program's ledger makes it (the download ring's, made ahead: the program's slot cost of that
// ring), made before reuse as many times as the program's ledger keeps (gathered, reduce input and output, wire: 1;
// grad: model_options::grad_slots; the offload and staging rings: 2). The program's ledgers pick which slot a take gets
// and know which slot each unit holds; these rings add the memory and the events.
#include <cstddef>
#include <string_view>

#include "fsdp/backend/concept.hpp"
#include "fsdp/detail/exec/slot_ring.hpp"
#include "fsdp/plan/detail/program.hpp"

namespace fsdp::detail::exec {

template <Backend B>
class step_slots {
 public:
  using stream = typename B::stream;

  step_slots(B& be, const plan::detail::step_program& prog, int grad_slots) : be_(be), prog_(prog) {
    const int keep[plan::rings] = {
        1, grad_slots, 1, 1, plan::offload_slots, plan::offload_slots, plan::offload_slots, plan::offload_slots, 1};
    for (std::size_t r = 0; r < plan::rings; ++r) rings_[r] = slot_ring<B>(prog.slot_cost(plan::ring(r)), keep[r]);
    if constexpr (OffloadBackend<B>)  // pinned host memory now: pinning may synchronise the device mid-step
      ring(plan::ring::download).make_all(be_, be_.download_stream());
  }
  step_slots(const step_slots&) = delete;
  step_slots& operator=(const step_slots&) = delete;

  /// The state slots of a device step over host-resident optimizer state, made again for the program's state count
  /// (the caller synchronized: nothing uses the old ones).
  void remake_state_staging() {
    ring(plan::ring::stage_state) = slot_ring<B>(prog_.slot_cost(plan::ring::stage_state), plan::offload_slots);
  }

  /// The slot `p` of ring r, for use on `s`: made, or waited for (the event of its last give).
  void take(plan::ring r, const sched::slot_ledger::pick& p, const plan::buffer_cost& each, stream& s) {
    ring(r).take(p, each, be_, s);
  }
  void give(plan::ring r, int slot, stream& s) { ring(r).give(be_, slot, s); }
  void* data(plan::ring r, int slot) const { return rings_[static_cast<std::size_t>(r)].data(slot); }
  /// Whether slot `slot` of ring r was made.
  bool made(plan::ring r, int slot) const noexcept { return rings_[static_cast<std::size_t>(r)].made(slot); }
  /// The memory of the slot unit u holds in ring r.
  void* held(std::size_t u, plan::ring r) const { return data(r, prog_.held(u, r)); }

  /// How messages name a slot of ring r ("could not allocate the gather slot of unit ...").
  static constexpr std::string_view name_of(plan::ring r) noexcept {
    switch (r) {
      case plan::ring::gathered: return "the gather slot";
      case plan::ring::grad: return "the gradient slot";
      case plan::ring::reduce_input: return "the reduce input slot";
      case plan::ring::reduce_output: return "the reduce output slot";
      case plan::ring::upload: return "the upload slot";
      case plan::ring::download: return "the download slot";
      case plan::ring::stage_grad: return "the gradient's staging slot";
      case plan::ring::stage_state: return "the optimizer state's staging slot";
      case plan::ring::wire: return "the wire slot";
    }
    return "a slot";
  }

 private:
  slot_ring<B>& ring(plan::ring r) { return rings_[static_cast<std::size_t>(r)]; }

  B& be_;
  const plan::detail::step_program& prog_;
  slot_ring<B> rings_[plan::rings];
};

}  // namespace fsdp::detail::exec
