#pragma once
// Per-element optimizer updates, written once and used by every backend's kernels (host loops, CUDA kernels).
// Every operation rounds once (fsdp/core/rounding.hpp), so both backends give the same bits.
#include <cmath>
#include <cstdint>

#include "fsdp/core/config.hpp"
#include "fsdp/core/rounding.hpp"

namespace fsdp::optim::detail {

/// SGD with momentum and coupled (L2) weight decay, as torch.optim.SGD with dampening 0, nesterov off.
struct sgd_coeffs {
  float lr;
  float momentum;
  float weight_decay;       ///< for parameters not masked out (see decay_mask)
  float grad_scale = 1.0f;  ///< the gradient is multiplied by this first (clipping, loss-scale removal)
};

FSDP_HD inline void sgd_update(float& p, float g, float* buf, const sgd_coeffs& c, float weight_decay) {
  if (c.grad_scale != 1.0f) g = rn::mul(g, c.grad_scale);
  g = rn::add(g, rn::mul(weight_decay, p));
  if (buf) {
    *buf = rn::add(rn::mul(c.momentum, *buf), g);
    g = *buf;
  }
  p = rn::sub(p, rn::mul(c.lr, g));
}

/// AdamW with decoupled weight decay, as torch.optim.AdamW.
struct adamw_coeffs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;       ///< for parameters not masked out (see decay_mask)
  float bias_correction1;   ///< 1 - beta1^t, computed in double and rounded once (adamw_bias_correction)
  float bias_correction2;   ///< 1 - beta2^t, likewise
  float grad_scale = 1.0f;  ///< the gradient is multiplied by this first (clipping, loss-scale removal)
};

/// 1 - beta^t for step t >= 1, evaluated in double and rounded to fp32 once. Rounding beta^t to fp32 first and
/// subtracting in fp32 loses most digits when beta^t is close to 1 (beta2 = 0.9999 early in training).
inline float adamw_bias_correction(float beta, long t) {
  return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(t)));
}

FSDP_HD inline void adamw_update(float& p, float g, float& m, float& v, const adamw_coeffs& c, float weight_decay) {
  if (c.grad_scale != 1.0f) g = rn::mul(g, c.grad_scale);
  p = rn::mul(p, rn::sub(1.0f, rn::mul(c.lr, weight_decay)));
  m = rn::add(rn::mul(c.beta1, m), rn::mul(rn::sub(1.0f, c.beta1), g));
  v = rn::add(rn::mul(c.beta2, v), rn::mul(rn::mul(rn::sub(1.0f, c.beta2), g), g));
  const float mhat = rn::div(m, c.bias_correction1);
  const float vhat = rn::div(v, c.bias_correction2);
  p = rn::sub(p, rn::div(rn::mul(c.lr, mhat), rn::add(rn::sqrt(vhat), c.eps)));
}

/// The per-parameter weight-decay mask of one flat shard: element i gets no weight decay when it lies in one of
/// the ranges [begin[k], end[k]) (shard-local offsets, sorted, disjoint). A fixed-size value, so it travels as a
/// CUDA kernel parameter; a shard with more no-decay ranges is stepped in pieces (see optim::detail::masked_pieces).
struct decay_mask {
  static constexpr int capacity = 16;
  int count = 0;
  std::int64_t begin[capacity] = {};
  std::int64_t end[capacity] = {};

  FSDP_HD bool no_decay(std::int64_t i) const {
    for (int k = 0; k < count; ++k)
      if (i >= begin[k] && i < end[k]) return true;
    return false;
  }
  FSDP_HD float weight_decay(std::int64_t i, float wd) const { return no_decay(i) ? 0.0f : wd; }
};

}  // namespace fsdp::optim::detail
