#pragma once
// An optimizer's per-step values in device memory, so that a step issued once and replayed (a CUDA graph, the host
// backend's capture: fsdp/backend/host.hpp) computes each replay's own values:
//
//   updates   the updates applied so far (t - 1 for the next one), counted on the device: the step's last kernel
//             adds one unless the gradient inspection skipped the step (its verdict, in the same stream)
//   rule      this step's element rule, made by the step's first kernel from a step rule (StepRule: a trivially
//             copyable description with FSDP_HD at(t), such as AdamW's learning rate from its schedule and its bias
//             corrections) and read by every update kernel of the step
//
// 256 bytes a optimizer, in its plan (plan::step_block_cost). Both kernels are one thread (Backend::for_each over
// one element), on the compute stream.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fsdp/core/config.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/memory/cost.hpp"

namespace fsdp::optim::detail {

struct step_block {
  std::int64_t updates = 0;
  std::int64_t pad = 0;
  alignas(16) unsigned char rule[240];
};
static_assert(sizeof(step_block) == plan::step_block_slots * sizeof(float), "the step block fills its plan's slots");

/// The step's first kernel: block->rule = s.at(block->updates + 1).
template <class S, class R>
struct make_rule {
  S s;
  step_block* block;
  FSDP_HD void operator()(std::int64_t) const {
    const R r = s.at(static_cast<long>(block->updates) + 1);
    std::memcpy(block->rule, &r, sizeof r);
  }
};

/// The step's last kernel: one more update, unless the inspection's verdict (null: none) skipped the step.
struct count_update {
  step_block* block;
  const grad::verdict* decided;
  FSDP_HD void operator()(std::int64_t) const {
    if (decided == nullptr || decided->skipped == 0) block->updates += 1;
  }
};

/// Sets the count (restore_steps: a checkpoint's, a reshard's).
struct set_updates {
  step_block* block;
  std::int64_t updates;
  FSDP_HD void operator()(std::int64_t) const { block->updates = updates; }
};

}  // namespace fsdp::optim::detail
