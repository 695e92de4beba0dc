#pragma once
// Per-element optimizer updates, written once and used by every backend's kernels (host loops, CUDA kernels).
#include <cmath>

#if defined(__CUDACC__)
#define FSDP_HD __host__ __device__
#else
#define FSDP_HD
#endif

namespace fsdp::optim::detail {

/// SGD with momentum and coupled (L2) weight decay, as torch.optim.SGD with dampening 0, nesterov off.
struct sgd_coeffs {
  float lr;
  float momentum;
  float weight_decay;  ///< already 0 for no-decay parameters
};

FSDP_HD inline void sgd_update(float& p, float g, float* buf, const sgd_coeffs& c) {
  g += c.weight_decay * p;
  if (buf) {
    *buf = c.momentum * *buf + g;
    g = *buf;
  }
  p -= c.lr * g;
}

/// AdamW with decoupled weight decay, as torch.optim.AdamW.
struct adamw_coeffs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;       ///< already 0 for no-decay parameters
  float bias_correction1;   ///< 1 - beta1^t
  float bias_correction2;   ///< 1 - beta2^t
};

FSDP_HD inline void adamw_update(float& p, float g, float& m, float& v, const adamw_coeffs& c) {
  p *= 1.0f - c.lr * c.weight_decay;
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * g * g;
  const float mhat = m / c.bias_correction1;
  const float vhat = v / c.bias_correction2;
  p -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
}

}  // namespace fsdp::optim::detail
