#pragma once
// A unit's storage: its buffers, where compute finds the memory of the slots it holds in the executor's rings
// (fsdp/detail/exec/slot_ring.hpp; which slot it holds is the step program's: plan::detail::step_program::held), and
// the events that order their use across streams. The unit executor (fsdp/detail/exec/unit_executor.hpp) owns and fills
// them; FsdpUnit reads them as a view. Each buffer's category, dtype and size come from fsdp/memory/cost.hpp. The
// unit's state (gathered or not, current pass, ...) is not here: the scheduler owns it.
#include "fsdp/unit/tensor_view.hpp"

namespace fsdp::detail {

template <class Backend>
struct unit_buffers {
  typename Backend::buffer master;       ///< the fp32 master shard
  typename Backend::buffer grad_shard;   ///< the fp32 gradient shard
  typename Backend::buffer accumulator;  ///< no-sync: the fp32 sum of this rank's unsharded gradients so far
  void* params = nullptr;                ///< what compute reads: the gather slot, or the master when it serves compute
  void* grad = nullptr;                  ///< the unsharded gradient in the compute dtype (the grad slot's memory)
  /// model_options::check_views: the unit's hand-overs of its gathered parameters and of its gradient (the
  /// executor's), which views check themselves against; null when views are not checked.
  handover_count* param_handovers = nullptr;
  handover_count* grad_handovers = nullptr;

  typename Backend::event shard_ready;  ///< the last write of the master shard (initialisation, optimizer step)
  typename Backend::event gathered_ev;  ///< the gather into `gathered` is complete
  typename Backend::event grad_ready;   ///< compute finished writing `grad`
  typename Backend::event reduced;      ///< the reduction is accumulated into the gradient shard
  typename Backend::event uploaded;     ///< offloaded params: the master shard's copy to the device is complete
  typename Backend::event collected;    ///< offloaded grads: the reduction's result is ready to copy to the host
  typename Backend::event downloaded;   ///< offloaded grads: copied to the host, ready for the host addition
  typename Backend::event staged;       ///< a device step over host parts: they are in their staging slots
  typename Backend::event stepped;      ///< a device step over host parts: its kernels are done with the slots
  typename Backend::event state_saved;  ///< a device step over host parts: the state is back on the host
};

}  // namespace fsdp::detail
