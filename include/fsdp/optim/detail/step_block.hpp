#pragma once
// An optimizer's per-step values in device memory, so that a step issued once and replayed (a CUDA graph, the host
// backend's capture: fsdp/backend/host.hpp) computes each replay's own values:
//
//   updates   the updates applied so far (t - 1 for the next one), counted on the device: the step's last kernel
//             adds one unless the gradient inspection skipped the step (its verdict, in the same stream)
//   scale     with a loss scaler: the step's loss scale and its good steps in a row, moved by the step's last kernel
//             (grad::next_scale), so that a replay's backward and inspection read its own; an eager step first
//             writes the host scaler's (which a checkpoint may have restored)
//   rule      this step's element rule, made by the step's first kernel from a step rule (StepRule: a trivially
//             copyable description with FSDP_HD at(t), such as AdamW's learning rate from its schedule and its bias
//             corrections) and read by every update kernel of the step
//
// 256 bytes an optimizer, in its plan (plan::step_block_cost). Both kernels are one thread (Backend::for_each over
// one element), on the compute stream.
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>

#include "fsdp/core/config.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/grad/loss_scaler.hpp"
#include "fsdp/memory/cost.hpp"

namespace fsdp::optim::detail {

/// The largest rule a step block holds.
inline constexpr std::size_t step_rule_bytes = 240;

struct step_block {
  std::int64_t updates = 0;
  float loss_scale = 0.0f;
  std::int32_t good_steps = 0;
  alignas(16) unsigned char rule[step_rule_bytes];
};
static_assert(sizeof(step_block) == plan::step_block_slots * sizeof(float), "the step block fills its plan's slots");

/// The step's first kernel: block->rule = s.at(block->updates + 1).
template <class S, class R>
struct make_rule {
  S s;
  step_block* block;
  FSDP_HD void operator()(std::int64_t) const {
    ::new (static_cast<void*>(block->rule)) R(s.at(static_cast<long>(block->updates) + 1));
  }
};

/// The step's last kernel: one more update, unless the inspection's verdict (null: `skipped`, which the host knew)
/// skipped the step; with a loss scaler (`scales`), its state moved by the verdict.
struct count_update {
  step_block* block;
  const grad::verdict* decided;
  bool skipped_on_host = false;
  bool scales = false;
  grad::loss_scaler_options scaling{};
  FSDP_HD void operator()(std::int64_t) const {
    const bool skipped = decided != nullptr ? decided->skipped != 0 : skipped_on_host;
    if (!skipped) block->updates += 1;
    if (scales) {
      const grad::scale_state next = grad::next_scale({block->loss_scale, block->good_steps}, skipped, scaling);
      block->loss_scale = next.scale;
      block->good_steps = next.good;
    }
  }
};

/// The host scaler's state into the block (an eager step's, before anything reads it).
struct set_scale {
  step_block* block;
  grad::scale_state state;
  FSDP_HD void operator()(std::int64_t) const {
    block->loss_scale = state.scale;
    block->good_steps = state.good;
  }
};

/// Sets the count (restore_steps: a checkpoint's, a reshard's).
struct set_updates {
  step_block* block;
  std::int64_t updates;
  FSDP_HD void operator()(std::int64_t) const { block->updates = updates; }
};

}  // namespace fsdp::optim::detail
