#pragma once
// The loss scaler's definitions (fsdp/grad/loss_scaler.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cmath>

#include "fsdp/core/error.hpp"
#include "fsdp/grad/loss_scaler.hpp"

namespace fsdp::grad {

FSDP_DECL loss_scaler::loss_scaler(loss_scaler_options o) : o_(o), scale_(o.init_scale) {
  if (!(o.init_scale > 0.0f) || !std::isfinite(o.init_scale))
    detail::fail_usage("loss_scaler: init_scale must be finite and > 0, got ", o.init_scale);
  if (!(o.growth_factor > 1.0f) || !std::isfinite(o.growth_factor))
    detail::fail_usage("loss_scaler: growth_factor must be finite and > 1, got ", o.growth_factor);
  if (!(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f))
    detail::fail_usage("loss_scaler: backoff_factor must be in (0, 1), got ", o.backoff_factor);
  if (o.growth_interval < 1) detail::fail_usage("loss_scaler: growth_interval must be >= 1, got ", o.growth_interval);
}

FSDP_DECL void loss_scaler::restore(float scale, int good_steps) {
  if (!(scale > 0.0f) || !std::isfinite(scale))
    detail::fail_usage("loss_scaler::restore: scale must be finite and > 0, got ", scale);
  if (good_steps < 0) detail::fail_usage("loss_scaler::restore: good_steps must be >= 0, got ", good_steps);
  learn();
  scale_ = scale;
  good_ = good_steps;
}

FSDP_DECL void loss_scaler::update(bool skipped) noexcept {
  const scale_state next = next_scale({scale_, good_}, skipped, o_);
  scale_ = next.scale;
  good_ = next.good;
}

}  // namespace fsdp::grad
