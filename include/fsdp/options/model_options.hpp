#pragma once
// model_options: the runtime choices of a Model beside its compile-time policy. The schedule configuration
// (detail/schedule/config.hpp) is built from them once; the budget helpers build theirs from the same fields.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/policy/offload.hpp"
#include "fsdp/policy/prefetch.hpp"

namespace fsdp {

namespace trace {
class recorder;
}

/// When gradients leave the rank during gradient accumulation.
enum class grad_sync : std::uint8_t {
  every_micro_batch,  ///< each unit's gradient is reduced into its shard at every backward (least memory)
  last_micro_batch,   ///< no-sync: each rank keeps its unsharded fp32 gradients and reduces once, in the last
                      ///< micro-batch's backward (fewer collectives, the unsharded gradients in memory)
};

/// Gradient accumulation: `micro_batches` forward and backward passes per optimizer step.
struct accumulation_options {
  /// Backward passes per optimizer step. With grad_sync::last_micro_batch the step requires exactly this many;
  /// with every_micro_batch it is what the planner plans for (more passes only add to the gradient shards).
  int micro_batches = 1;
  grad_sync sync = grad_sync::every_micro_batch;
  /// Each unit is gathered once per step and kept until the last micro-batch's backward ends (no release after
  /// forward or after the other backward passes): fewer all-gathers, every unit's gathered parameters in memory.
  bool keep_gathered = false;
};

/// How the reduced gradient is divided by the number of ranks it sums over.
struct grad_division {
  enum class mode : std::uint8_t {
    average,   ///< the collective averages (each rank's loss is a mean over its own samples)
    sum,       ///< no division (the loss is already scaled by the global batch)
    pre_post,  ///< divide by `pre_factor` before the reduction and by ranks / pre_factor after: the sum stays
               ///< small enough for fp16 (PyTorch FSDP's gradient pre- and post-division)
  };
  mode how = mode::average;
  /// pre_post only: the pre-division factor, > 0; 0 picks it as PyTorch FSDP does: f = 1, doubled while
  /// ranks % f == 0 and ranks / f > f (2 for 3 or 4 ranks, 4 for 8, 8 for 64).
  float pre_factor = 0.0f;
};

struct model_options {
  layout_options layout{};
  /// Ranks of one tensor group (device_mesh::tensor: consecutive world ranks). 1: no tensor parallelism. Otherwise
  /// the world is tensor_parallel x the strategy's data-parallel ranks (world / tensor_parallel); each parameter is
  /// placed by its ParamSpec::tensor (fsdp/spec/placement.hpp); the model shards every rank's local tensor over
  /// the data-parallel ranks, reduces gradients over them only, and gives the trainer the tensor group's
  /// communicator (tensor_comm()). Needs a communicator with split(color, key).
  int tensor_parallel = 1;
  /// Ranks of one expert group (device_mesh::expert: consecutive data-parallel ranks). 1: every rank holds every
  /// expert. Otherwise each parameter declared with param_options::experts (a stack [n_experts, ...]) is split on
  /// dimension 0 over the expert group, each rank holding n_experts / expert_parallel experts, which are sharded
  /// and reduced over the ranks holding the same experts (the expert shard group); dense parameters as without
  /// experts. It must divide the shard group (or, for a strategy that keeps whole parameters, the data-parallel
  /// ranks). The trainer's all_to_all of tokens goes to the model's expert_comm(). Needs a communicator with
  /// split(color, key).
  int expert_parallel = 1;
  /// How gradients are combined across ranks (average by default).
  grad_division division{};
  /// Gradient accumulation over micro-batches (one micro-batch, synchronised every time, by default).
  accumulation_options accumulation{};
  /// The forward order of the units, by name (backward runs it in reverse). Empty: the wrapping order.
  std::vector<std::string> forward_order;
  /// Record the forward order from the first forward pass (units entered by name with pass_range::enter) and
  /// check every later pass against it. Not together with forward_order.
  bool record_order = false;
  /// Per unit name: override the strategy's reshard_after_forward (false keeps the unit gathered from its
  /// forward to its backward; true releases it when its forward ends). A unit the forward pass uses again after
  /// leaving it must stay gathered. By default the first unit of the forward pass (the root: embeddings first, the
  /// tied head last in forward, then first in backward) stays gathered into its backward whatever the strategy, as
  /// PyTorch FSDP2 keeps its root; naming it here with true releases it after its forward.
  std::map<std::string, bool> reshard_after_forward;
  /// Units whose unsharded gradient exists from the start of every backward pass (zeroed there), not only while
  /// the unit is current: the trainer may write it through grad() before the unit's own backward, as a tied
  /// head's gradient is computed first in backward and belongs to the root, whose backward comes last. It is
  /// reduced with the rest of the unit's gradient when its backward ends. Each holds a gradient slot for the
  /// whole backward pass, so with grad_slots = 2 the other units' backward waits for the previous reduction; 3
  /// keeps one reduction overlapping. The memory planner counts it.
  std::vector<std::string> early_grads;
  /// Per unit name: the parts this unit keeps in host memory, instead of the offload policy's
  /// (fsdp/policy/offload.hpp), e.g. {"root", fsdp::offload::none::facts} to keep the embeddings on the device, or
  /// {"h.0", fsdp::offload::all::facts} to offload one unit. A unit with all three on the host steps its optimizer
  /// on the host; the others on the device. Needs a backend that models fsdp::OffloadBackend when any unit
  /// offloads, and units that gather (not no_shard in fp32) for per-unit params.
  std::map<std::string, offload_facts> offload_units;
  /// Units gathered or gathering at once, on demand and by prefetch; 0 = no limit. A prefetch waits for a free
  /// slot (it is issued at a later unit); a unit needed for compute with no slot free is a usage_error.
  int gather_slots = 0;
  /// Unsharded gradient buffers that exist at once (>= 1). The gradient of a unit's backward goes into a buffer
  /// whose last reduction has finished; with 2 (the default) one unit's reduction overlaps the next unit's
  /// backward; 1 saves a gradient buffer and serialises them.
  int grad_slots = 2;
  /// The schedule of prefetch::explicit_schedule: which units to gather when a unit's forward/backward starts.
  prefetch_schedule prefetch;
  /// Debug mode: before each collective of a unit (every gather and reduction, and gather_full_params), the
  /// ranks compare its sequence number, unit, operation, count and dtype (fsdp/agree/agree.hpp), and every rank
  /// throws a usage_error naming the first difference and both ranks, instead of running mismatched collectives.
  /// Costs a 16-byte all_gather per rank and a wait for the gather stream per collective; its scratch buffers
  /// (mem::comm_buffers, 16 * (world + 1) bytes at a time) are not in the memory plan. Every rank must set it alike.
  bool check_collectives = false;
  /// Debug mode: gathered parameters and unsharded gradients live in reused slots, so a param() or grad() view
  /// kept after its unit gave the slot back would silently read (or write) the unit that takes it next. With
  /// check_views, a released gather slot is first filled with NaN (on the compute stream, host and device alike),
  /// and a view used once the stream has passed its unit's release (params) or the hand-over of its gradient to
  /// the reduction (grads) is a usage_error naming the unit and the parameter (fsdp/unit/tensor_view.hpp). Costs
  /// a NaN fill per release and a host function per release and per gradient hand-over on the compute stream (on
  /// the CUDA backend the check sees only the hand-overs the GPU has passed; the NaN shows the rest); not in the
  /// timeline planner's times. Memory: none. Ranks may differ in it.
  bool check_views = false;
  /// The step's commit: once the compute stream has waited for every reduction, and before the first update, one
  /// all-reduce of one fp32 value over the world on the compute stream (plan::commits). A rank reaches it only once
  /// its own reductions completed, and the updates are queued behind it: a failure anywhere in the step (a rank
  /// lost in its last replica all-reduce) fails it on every survivor before any of them updates, so all of them
  /// hold the same whole step (fsdp/elastic: the step before). An optimizer that inspects its gradients (clipping,
  /// non-finite checks, a loss scaler) commits with its norms' world-wide all-reduce and issues none. Off: replica
  /// groups whose reductions did not involve the failed rank update while the others cannot, and the survivors may
  /// hold no step whole (elastic::agree refuses; load the last checkpoint). Costs one latency-bound collective a step
  /// on the compute stream, exposed (docs/benchmarks.md), and a 4-byte buffer while it runs. Every rank must set it
  /// alike.
  bool commit_step = true;
  /// Where to record the trace and the memory timeline (null: nothing is recorded).
  trace::recorder* recorder = nullptr;
};

}  // namespace fsdp
