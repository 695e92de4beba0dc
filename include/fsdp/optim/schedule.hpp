#pragma once
// A learning-rate schedule as data, evaluated where the update runs: the optimizers make each step's rule from its
// update number t on the device, in the step's first kernel (fsdp/optim/detail/step_block.hpp), so that a step
// captured in a CUDA graph and replayed computes step t+1's learning rate, not step t's again. The same function runs
// on the host (a host step, the host backend), in double with one rounding per operation and no libm call: the same
// bits everywhere.
//
//   fsdp::optim::adamw opt(model, {.lr = 3e-4f, .schedule = {.warmup = 100, .total = 5000, .min_ratio = 0.1f}});
//
// Update t (from 1; a step the gradient inspection skips does not count) uses
//   lr * t / warmup                                                    for t <= warmup
//   lr * (m + (1 - m) * (1 + cos(pi * r)) / 2), r = min(1, (t - 1 - warmup) / (total - 1 - warmup))   after it
// with m = min_ratio: a linear warm-up to lr, then a cosine down to lr * min_ratio at update `total` (flat after).
// total = 0: lr after the warm-up. The default (no warm-up, total 0) is lr itself at every update.
#include "fsdp/core/config.hpp"
#include "fsdp/core/rounding.hpp"

namespace fsdp::optim {

namespace detail {
/// x^n for an integer n >= 0, by squaring, in double with one rounding per operation: the same bits on the host and
/// in a kernel (a libm pow is neither, and on the device it needs a stack frame the simulated GPU cannot run).
FSDP_HD inline double pow_int(double x, long n) {
  double r = 1.0;
  while (n > 0) {
    if (n & 1) r = rn::mul(r, x);
    x = rn::mul(x, x);
    n >>= 1;
  }
  return r;
}
/// cos(pi r) for r in [0, 1]: sin(y) at y = pi (1/2 - r) in [-pi/2, pi/2], its Taylor series to the y^25 term (under
/// 1e-20 there) by Horner's rule, in double with one rounding per operation: within a few ulps of the correctly
/// rounded value, and the same bits on the host and in a kernel.
FSDP_HD inline double cos_pi(double r) {
  const double y = rn::mul(3.14159265358979323846, rn::sub(0.5, r));
  const double y2 = rn::mul(y, y);
  double s = 1.0;  // sin y = y (1 - y^2 / (2 3) (1 - y^2 / (4 5) (1 - ...)))
  for (int k = 12; k >= 1; --k) s = rn::sub(1.0, rn::div(rn::mul(y2, s), (2.0 * k) * (2.0 * k + 1.0)));
  return rn::mul(y, s);
}
}  // namespace detail

struct lr_schedule {
  int warmup = 0;          ///< updates of linear warm-up (0: none)
  int total = 0;           ///< the update at which the cosine reaches lr * min_ratio (0: no cosine)
  float min_ratio = 0.0f;  ///< where the cosine ends, as a fraction of lr
  /// The learning rate of update t (>= 1) for a peak of `lr`: in double, rounded once.
  FSDP_HD float at(float lr, long t) const {
    const double peak = lr;
    const long s = t - 1;  // the step's index from 0
    if (s < warmup) return static_cast<float>(rn::div(rn::mul(peak, rn::from_int64(s + 1)), warmup));
    if (total <= 0) return lr;
    const double lo = rn::mul(peak, static_cast<double>(min_ratio));
    const long span = total - warmup - 1;
    double ratio = span <= 0 ? 1.0 : rn::div(rn::from_int64(s - warmup), rn::from_int64(span));
    if (ratio > 1.0) ratio = 1.0;
    const double wave = rn::mul(0.5, rn::add(1.0, detail::cos_pi(ratio)));
    return static_cast<float>(rn::add(lo, rn::mul(wave, rn::sub(peak, lo))));
  }
  /// Whether every update gets lr itself.
  FSDP_HD bool constant() const { return warmup <= 0 && total <= 0; }
};

/// 1 - beta^t for update t >= 1, in double and rounded to fp32 once (AdamW's bias corrections). Rounding beta^t to
/// fp32 first and subtracting in fp32 would lose most digits when beta^t is close to 1 (beta2 = 0.9999 early on).
/// beta^t by squaring (detail::pow_int): the same bits on every backend.
FSDP_HD inline float bias_correction(float beta, long t) {
  return static_cast<float>(rn::sub(1.0, detail::pow_int(static_cast<double>(beta), t)));
}

}  // namespace fsdp::optim
