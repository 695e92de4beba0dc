#pragma once
// Dynamic loss scaling for fp16 training: the trainer multiplies its loss by scale(); the optimizer divides the
// gradients by it (inside its fused update) and, when any rank's gradients hold an inf or a NaN, skips the step
// on every rank and backs the scale off. After growth_interval steps in a row without one, the scale grows.
// The rule is torch.cuda.amp.GradScaler's. The optimizer decides a step on the device and learns the decision
// later (fsdp/grad/inspect.hpp): scale() and good_steps() learn the last step's first (waiting for it if the
// compute stream has not passed it; a trainer that read its loss has made it pass).
#include <functional>

#include "fsdp/core/config.hpp"

namespace fsdp::grad {

struct loss_scaler_options {
  float init_scale = 65536.0f;  ///< 2^16
  float growth_factor = 2.0f;   ///< > 1
  float backoff_factor = 0.5f;  ///< in (0, 1)
  int growth_interval = 2000;   ///< >= 1 steps without a non-finite gradient before the scale grows
};

/// A loss scaler's state: the scale and the good steps in a row since it last changed.
struct scale_state {
  float scale;
  int good;
};

/// The state after a step (`skipped`: non-finite gradients): the one rule, run by loss_scaler::update on the host and
/// by the optimizer's last kernel of a step on the device (fsdp/optim/detail/step_block.hpp), where a replayed step
/// moves it. A scale that would grow past fp32's range stays.
FSDP_HD inline scale_state next_scale(scale_state s, bool skipped, const loss_scaler_options& o) {
  if (skipped) return {s.scale * o.backoff_factor, 0};
  if (s.good + 1 < o.growth_interval) return {s.scale, s.good + 1};
  const float grown = s.scale * o.growth_factor;
  return {grown - grown == 0.0f ? grown : s.scale, 0};  // finite: grown
}

class loss_scaler {
 public:
  explicit loss_scaler(loss_scaler_options o = {});

  /// What the loss is multiplied by this step.
  float scale() const {
    learn();
    return scale_;
  }
  /// Steps in a row without a non-finite gradient since the scale last changed.
  int good_steps() const {
    learn();
    return good_;
  }
  const loss_scaler_options& options() const noexcept { return o_; }

  /// A checkpoint's state replaces this one: the scale and the good steps counted since it last changed (after the
  /// last step's decision is learned).
  void restore(float scale, int good_steps);

  /// After a step: `skipped` (non-finite gradients) backs the scale off; growth_interval good steps in a row grow it.
  void update(bool skipped) noexcept;

  /// The optimizer's: `learn` resolves its last step's decision (which then calls update()); scale() and
  /// good_steps() call it first. Empty: nothing pending.
  void await(std::function<void()> learn) { pending_ = std::move(learn); }

 private:
  void learn() const {
    if (!pending_) return;
    const std::function<void()> f = std::move(pending_);
    pending_ = {};
    f();
  }
  mutable std::function<void()> pending_;
  loss_scaler_options o_;
  float scale_;
  int good_ = 0;
};

}  // namespace fsdp::grad

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/grad/loss_scaler.ipp"
#endif
