#pragma once
// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2) over the local shards: the
// update is the sign of an interpolation of the momentum and the gradient, with decoupled weight decay; the
// momentum then moves toward the gradient at another rate:
//
//   c = beta1 m + (1 - beta1) g
//   p = p - lr (sign(c) + wd p)           computed as p (1 - lr wd) - lr sign(c), as the authors' code does
//   m = beta2 m + (1 - beta2) g
//
// One state per element (the momentum, "exp_avg"), no bias correction. sign(0) is 0 and a NaN stays NaN (as
// torch.sign). Parameters flagged no_decay get no weight decay. Gradient clipping, non-finite checks and loss
// scaling: lion_options::grad. The per-element update is an element function that Backend::for_each runs on the
// host or in a kernel, every operation rounded once, so every backend and world size gives the same bits.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/rounding.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/kernels/array_function.hpp"
#include "fsdp/optim/detail/decay_mask.hpp"
#include "fsdp/optim/elementwise.hpp"
#include "fsdp/optim/schedule.hpp"

namespace fsdp::optim {

namespace detail {
struct lion_coeffs {
  float lr;
  float beta1;
  float beta2;
  float weight_decay;  ///< for parameters not masked out (see decay_mask)
};

FSDP_HD inline float lion_sign(float x) { return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x; }  // 0 and NaN as they are

/// One element's update from its gradient g, already scaled (rule_elements applies the step's gradient scale).
FSDP_HD inline void lion_update(float& p, float g, float& m, const lion_coeffs& c, float weight_decay) {
  const float u = rn::add(rn::mul(c.beta1, m), rn::mul(rn::sub(1.0f, c.beta1), g));
  p = rn::mul(p, rn::sub(1.0f, rn::mul(c.lr, weight_decay)));
  p = rn::sub(p, rn::mul(c.lr, lion_sign(u)));
  m = rn::add(rn::mul(c.beta2, m), rn::mul(rn::sub(1.0f, c.beta2), g));
}

/// Lion as an element rule (fsdp/optim/elementwise.hpp): state exp_avg.
struct lion_rule {
  static constexpr int states = 1;
  lion_coeffs c;
  FSDP_HD void operator()(float& p, float g, float* s, bool decay) const {
    lion_update(p, g, s[0], c, decay ? c.weight_decay : 0.0f);
  }
};
/// One Lion step over a shard piece: {p, g, exp_avg, coefficients, mask, gradient scale} (a kernels::ArrayFunction:
/// 128-bit accesses in a kernel).
using lion_elements = rule_elements<lion_rule>;
}  // namespace detail

struct lion_options {
  float lr = 1e-4f;  ///< about 3-10x smaller than AdamW's for the same problem, as the authors advise
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;  ///< about 3-10x larger than AdamW's, likewise
  grad::options grad{};       ///< clipping, non-finite checks, loss scaling (none by default)
  lr_schedule schedule{};     ///< lr over the updates (fsdp/optim/schedule.hpp; by default lr at every update)
};

template <class ModelT>
class lion : public elementwise<ModelT> {
  using base = elementwise<ModelT>;

 public:
  /// State 0: the momentum (exp_avg).
  lion(ModelT& model, lion_options opt) : base(model, (check(opt), "lion"), {"exp_avg"}, opt.grad), opt_(opt) {}

  const lion_options& options() const noexcept { return opt_; }
  /// usage_error for an lr that is negative or not finite (the step keeps the one it had).
  void set_lr(float lr) { opt_.lr = detail::checked_lr("lion", lr); }
  /// One step over every local shard (see optim/elementwise.hpp); returns what it did with the gradients, learned
  /// without waiting for the step (grad::step_report).
  grad::step_report step();

 private:
  static void check(const lion_options& opt) {
    detail::checked_lr("lion", opt.lr);
    if (!(opt.beta1 >= 0.0f && opt.beta1 <= 1.0f))
      fsdp::detail::fail_usage("lion: beta1 must be in [0, 1], got ", opt.beta1);
    if (!(opt.beta2 >= 0.0f && opt.beta2 <= 1.0f))
      fsdp::detail::fail_usage("lion: beta2 must be in [0, 1], got ", opt.beta2);
    if (!std::isfinite(opt.weight_decay))
      fsdp::detail::fail_usage("lion: weight_decay must be finite, got ", opt.weight_decay);
  }

  lion_options opt_;
};

/// `lion opt(model, ...)` is over the model's core (fsdp::model_core): one optimizer type, and its code compiled
/// once, for every policy with the same backend and communicator.
template <class ModelT>
lion(ModelT&, lion_options) -> lion<detail::core_of_t<ModelT>>;

// Out of the class, so that it is not inline: a file that declares the instance extern (fsdp/instances.hpp) does not
// compile it.
template <class ModelT>
grad::step_report lion<ModelT>::step() {
  return base::step(
      detail::lr_scheduled<detail::lion_rule>{{{opt_.lr, opt_.beta1, opt_.beta2, opt_.weight_decay}}, opt_.schedule});
}

}  // namespace fsdp::optim
