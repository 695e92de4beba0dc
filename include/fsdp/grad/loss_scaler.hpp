#pragma once
// Dynamic loss scaling for fp16 training: the trainer multiplies its loss by scale(); the optimizer divides the
// gradients by it (inside its fused update) and, when any rank's gradients hold an inf or a NaN, skips the step
// on every rank and backs the scale off. After growth_interval steps in a row without one, the scale grows.
// The rule is torch.cuda.amp.GradScaler's.
#include <cmath>

#include "fsdp/core/error.hpp"

namespace fsdp::grad {

struct loss_scaler_options {
  float init_scale = 65536.0f;  ///< 2^16
  float growth_factor = 2.0f;   ///< > 1
  float backoff_factor = 0.5f;  ///< in (0, 1)
  int growth_interval = 2000;   ///< >= 1 steps without a non-finite gradient before the scale grows
};

class loss_scaler {
 public:
  explicit loss_scaler(loss_scaler_options o = {}) : o_(o), scale_(o.init_scale) {
    if (!(o.init_scale > 0.0f) || !std::isfinite(o.init_scale))
      detail::fail_usage("loss_scaler: init_scale must be finite and > 0, got ", o.init_scale);
    if (!(o.growth_factor > 1.0f) || !std::isfinite(o.growth_factor))
      detail::fail_usage("loss_scaler: growth_factor must be finite and > 1, got ", o.growth_factor);
    if (!(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f))
      detail::fail_usage("loss_scaler: backoff_factor must be in (0, 1), got ", o.backoff_factor);
    if (o.growth_interval < 1) detail::fail_usage("loss_scaler: growth_interval must be >= 1, got ", o.growth_interval);
  }

  /// What the loss is multiplied by this step.
  float scale() const noexcept { return scale_; }
  /// Steps in a row without a non-finite gradient since the scale last changed.
  int good_steps() const noexcept { return good_; }
  const loss_scaler_options& options() const noexcept { return o_; }

  /// A checkpoint's state replaces this one: the scale and the good steps counted since it last changed.
  void restore(float scale, int good_steps) {
    if (!(scale > 0.0f) || !std::isfinite(scale)) detail::fail_usage("loss_scaler::restore: scale must be finite and > 0, got ", scale);
    if (good_steps < 0) detail::fail_usage("loss_scaler::restore: good_steps must be >= 0, got ", good_steps);
    scale_ = scale;
    good_ = good_steps;
  }

  /// After a step: `skipped` (non-finite gradients) backs the scale off; growth_interval good steps in a row grow it.
  void update(bool skipped) noexcept {
    if (skipped) {
      scale_ *= o_.backoff_factor;
      good_ = 0;
      return;
    }
    if (++good_ >= o_.growth_interval) {
      const float grown = scale_ * o_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      good_ = 0;
    }
  }

 private:
  loss_scaler_options o_;
  float scale_;
  int good_ = 0;
};

}  // namespace fsdp::grad
