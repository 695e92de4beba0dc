#pragma once
// A learning-rate schedule as data, evaluated where the update runs: the optimizers make each step's rule from its
// update number t on the device, in the step's first kernel (fsdp/optim/detail/step_block.hpp), so that a step
// captured in a CUDA graph and replayed computes step t+1's learning rate, not step t's again. The same function runs
// on the host (a host step, the host backend), in double with one rounding per operation.
//
//   fsdp::optim::adamw opt(model, {.lr = 3e-4f, .schedule = {.warmup = 100, .total = 5000, .min_ratio = 0.1f}});
//
// Update t (from 1; a step the gradient inspection skips does not count) uses
//   lr * t / warmup                                                    for t <= warmup
//   lr * (m + (1 - m) * (1 + cos(pi * r)) / 2), r = min(1, (t - 1 - warmup) / (total - 1 - warmup))   after it
// with m = min_ratio: a linear warm-up to lr, then a cosine down to lr * min_ratio at update `total` (flat after).
// total = 0: lr after the warm-up. The default (no warm-up, total 0) is lr itself at every update.
#include <cmath>

#include "fsdp/core/config.hpp"
#include "fsdp/core/rounding.hpp"

namespace fsdp::optim {

struct lr_schedule {
  int warmup = 0;          ///< updates of linear warm-up (0: none)
  int total = 0;           ///< the update at which the cosine reaches lr * min_ratio (0: no cosine)
  float min_ratio = 0.0f;  ///< where the cosine ends, as a fraction of lr
  /// The learning rate of update t (>= 1) for a peak of `lr`: in double, rounded once.
  FSDP_HD float at(float lr, long t) const {
    const double peak = lr;
    const long s = t - 1;  // the step's index from 0
    if (s < warmup) return static_cast<float>(rn::div(rn::mul(peak, static_cast<double>(s + 1)), warmup));
    if (total <= 0) return lr;
    const double lo = rn::mul(peak, static_cast<double>(min_ratio));
    const long span = total - warmup - 1;
    double ratio = span <= 0 ? 1.0 : rn::div(static_cast<double>(s - warmup), static_cast<double>(span));
    if (ratio > 1.0) ratio = 1.0;
    const double wave = rn::mul(0.5, rn::add(1.0, ::cos(rn::mul(3.14159265358979323846, ratio))));
    return static_cast<float>(rn::add(lo, rn::mul(wave, rn::sub(peak, lo))));
  }
  /// Whether every update gets lr itself.
  FSDP_HD bool constant() const { return warmup <= 0 && total <= 0; }
};

/// 1 - beta^t for update t >= 1, in double and rounded to fp32 once (AdamW's bias corrections). Rounding beta^t to
/// fp32 first and subtracting in fp32 would lose most digits when beta^t is close to 1 (beta2 = 0.9999 early on).
/// The device's pow may differ from the host's in the last bits of the double, which the rounding to fp32 hides but
/// for a result within those bits of a rounding boundary.
FSDP_HD inline float bias_correction(float beta, long t) {
  return static_cast<float>(rn::sub(1.0, ::pow(static_cast<double>(beta), static_cast<double>(t))));
}

}  // namespace fsdp::optim
