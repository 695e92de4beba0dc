#pragma once
// AdamW (decoupled weight decay, bias correction, eps outside the square root: torch.optim.AdamW's documented
// algorithm) over the local shards. Parameters flagged no_decay get no weight decay. The bias corrections
// 1 - beta^t are evaluated in double and rounded once (optim::bias_correction); the learning rate follows
// adamw_options::schedule. Both are made from the update number t on the device, at the step's start
// (fsdp/optim/detail/step_block.hpp). Gradient clipping, non-finite checks and loss scaling:
// adamw_options::grad; a skipped step does not count (t stays). The per-element update (adamw_update) is an
// element rule (adamw_rule, fsdp/optim/elementwise.hpp: optim::adamw is an elementwise optimizer) that
// Backend::for_each runs on the host or in a kernel: every operation rounded once.
#include <cmath>
#include <cstdint>

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
struct adamw_coeffs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;       ///< for parameters not masked out (see decay_mask)
  float bias_correction1;   ///< 1 - beta1^t, computed in double and rounded once (optim::bias_correction)
  float bias_correction2;   ///< 1 - beta2^t, likewise
};

/// One element's update from its gradient g, already scaled (rule_elements applies the step's gradient scale).
FSDP_HD inline void adamw_update(float& p, float g, float& m, float& v, const adamw_coeffs& c, float weight_decay) {
  p = rn::mul(p, rn::sub(1.0f, rn::mul(c.lr, weight_decay)));
  m = rn::add(rn::mul(c.beta1, m), rn::mul(rn::sub(1.0f, c.beta1), g));
  v = rn::add(rn::mul(c.beta2, v), rn::mul(rn::mul(rn::sub(1.0f, c.beta2), g), g));
  const float mhat = rn::div(m, c.bias_correction1);
  const float vhat = rn::div(v, c.bias_correction2);
  p = rn::sub(p, rn::div(rn::mul(c.lr, mhat), rn::add(rn::sqrt(vhat), c.eps)));
}

/// AdamW as an element rule (fsdp/optim/elementwise.hpp): states exp_avg and exp_avg_sq.
struct adamw_rule {
  static constexpr int states = 2;
  adamw_coeffs c;
  FSDP_HD void operator()(float& p, float g, float* s, bool decay) const {
    adamw_update(p, g, s[0], s[1], c, decay ? c.weight_decay : 0.0f);
  }
};
/// One AdamW step over a shard piece: {p, g, exp_avg, exp_avg_sq, coefficients, mask, gradient scale} (a
/// kernels::ArrayFunction: 128-bit accesses in a kernel).
using adamw_elements = rule_elements<adamw_rule>;

/// AdamW's step rule (fsdp/optim/elementwise.hpp): update t's rule, with the schedule's learning rate and the bias
/// corrections of t, made on the device at the step's start.
struct adamw_step {
  adamw_coeffs c;  ///< the peak learning rate; the bias corrections are t's
  lr_schedule schedule;
  FSDP_HD adamw_rule at(long t) const {
    adamw_rule r{c};
    r.c.lr = schedule.at(c.lr, t);
    r.c.bias_correction1 = bias_correction(c.beta1, t);
    r.c.bias_correction2 = bias_correction(c.beta2, t);
    return r;
  }
};
}  // namespace detail

struct adamw_options {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  grad::options grad{};  ///< clipping, non-finite checks, loss scaling (none by default)
  lr_schedule schedule{};  ///< lr over the updates (fsdp/optim/schedule.hpp; by default lr at every update)
};

template <class ModelT>
class adamw : public elementwise<ModelT> {
  using base = elementwise<ModelT>;

 public:
  /// State 0: the first moment (exp_avg), state 1: the second (exp_avg_sq).
  adamw(ModelT& model, adamw_options opt)
      : base(model, (check(opt), "adamw"), {"exp_avg", "exp_avg_sq"}, opt.grad), opt_(opt) {}

  const adamw_options& options() const noexcept { return opt_; }
  /// usage_error for an lr that is negative or not finite (the step keeps the one it had).
  void set_lr(float lr) { opt_.lr = detail::checked_lr("adamw", lr); }
  /// One step over every local shard (see optim/elementwise.hpp); returns what it did with the gradients, learned
  /// without waiting for the step (grad::step_report).
  grad::step_report step();

 private:
  static void check(const adamw_options& opt) {
    detail::checked_lr("adamw", opt.lr);
    if (!(opt.beta1 >= 0.0f && opt.beta1 < 1.0f))
      fsdp::detail::fail_usage("adamw: beta1 must be in [0, 1), got ", opt.beta1);
    if (!(opt.beta2 >= 0.0f && opt.beta2 < 1.0f))
      fsdp::detail::fail_usage("adamw: beta2 must be in [0, 1), got ", opt.beta2);
    if (!(opt.eps > 0.0f)) fsdp::detail::fail_usage("adamw: eps must be > 0, got ", opt.eps);
  }

  adamw_options opt_;
};

/// `adamw opt(model, ...)` is over the model's core (fsdp::model_core): one optimizer type, and its code compiled
/// once, for every policy with the same backend and communicator.
template <class ModelT>
adamw(ModelT&, adamw_options) -> adamw<detail::core_of_t<ModelT>>;

// Out of the class, so that it is not inline: a file that declares the instance extern (fsdp/instances.hpp) does not
// compile it.
template <class ModelT>
grad::step_report adamw<ModelT>::step() {
  return base::step(
      detail::adamw_step{{opt_.lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, 1.0f, 1.0f}, opt_.schedule});
}

}  // namespace fsdp::optim
