#pragma once
// SGD with momentum over the local shards: each rank updates only the parameter elements it owns. Parameters
// flagged no_decay get no weight decay. Gradient clipping, non-finite checks and loss scaling: sgd_options::grad.
// The per-element update (sgd_update, as torch.optim.SGD with dampening 0, nesterov off) is an element rule
// (sgd_rule, sgd_momentum_rule, fsdp/optim/elementwise.hpp: optim::sgd is an elementwise optimizer) that
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
/// SGD with momentum and coupled (L2) weight decay.
struct sgd_coeffs {
  float lr;
  float momentum;
  float weight_decay;  ///< for parameters not masked out (see decay_mask)
};

/// One element's update from its gradient g, already scaled (rule_elements applies the step's gradient scale).
FSDP_HD inline void sgd_update(float& p, float g, float* buf, const sgd_coeffs& c, float weight_decay) {
  g = rn::add(g, rn::mul(weight_decay, p));
  if (buf) {
    *buf = rn::add(rn::mul(c.momentum, *buf), g);
    g = *buf;
  }
  p = rn::sub(p, rn::mul(c.lr, g));
}

/// SGD as element rules (fsdp/optim/elementwise.hpp): with momentum, one state (the momentum buffer), used when
/// c.momentum is not 0 (sgd_elements with a null buffer and momentum 0 is plain SGD); without, no state.
struct sgd_momentum_rule {
  static constexpr int states = 1;
  sgd_coeffs c;
  FSDP_HD void operator()(float& p, float g, float* s, bool decay) const {
    sgd_update(p, g, c.momentum != 0.0f ? s : nullptr, c, decay ? c.weight_decay : 0.0f);
  }
};
struct sgd_rule {
  static constexpr int states = 0;
  sgd_coeffs c;
  FSDP_HD void operator()(float& p, float g, float*, bool decay) const {
    sgd_update(p, g, nullptr, c, decay ? c.weight_decay : 0.0f);
  }
};
/// One SGD step over a shard piece: {p, g, momentum buffer (or null), coefficients, mask, gradient scale} (a
/// kernels::ArrayFunction: 128-bit accesses in a kernel).
using sgd_elements = rule_elements<sgd_momentum_rule>;
}  // namespace detail

struct sgd_options {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  ///< L2, added to the gradient (torch.optim.SGD); 0 for no_decay parameters
  grad::options grad{};       ///< clipping, non-finite checks, loss scaling (none by default)
  lr_schedule schedule{};     ///< lr over the updates (fsdp/optim/schedule.hpp; by default lr at every update)
};

template <class ModelT>
class sgd : public elementwise<ModelT> {
  using base = elementwise<ModelT>;

 public:
  /// State 0 (with momentum only): the momentum buffer.
  sgd(ModelT& model, sgd_options opt)
      : base(model, "sgd", checked(opt).momentum != 0.0f ? std::vector<std::string>{"momentum_buffer"}
                                                         : std::vector<std::string>{},
             opt.grad),
        opt_(opt) {}

  const sgd_options& options() const noexcept { return opt_; }
  /// usage_error for an lr that is negative or not finite (the step keeps the one it had).
  void set_lr(float lr) { opt_.lr = detail::checked_lr("sgd", lr); }

  /// One step over every local shard (see optim/elementwise.hpp); returns what it did with the gradients, learned
  /// without waiting for the step (grad::step_report).
  grad::step_report step();

 private:
  static const sgd_options& checked(const sgd_options& opt) {
    detail::checked_lr("sgd", opt.lr);
    if (!(opt.momentum >= 0.0f && opt.momentum < 1.0f))
      fsdp::detail::fail_usage("sgd: momentum must be in [0, 1), got ", opt.momentum);
    return opt;
  }

  sgd_options opt_;
};

/// `sgd opt(model, ...)` is over the model's core (fsdp::model_core): one optimizer type, and its code compiled
/// once, for every policy with the same backend and communicator.
template <class ModelT>
sgd(ModelT&, sgd_options) -> sgd<detail::core_of_t<ModelT>>;

// Out of the class, so that it is not inline: a file that declares the instance extern (fsdp/instances.hpp) does not
// compile it.
template <class ModelT>
grad::step_report sgd<ModelT>::step() {
  const detail::sgd_coeffs c{opt_.lr, opt_.momentum, opt_.weight_decay};
  if (this->states_per_element() == 0) return base::step(detail::lr_scheduled<detail::sgd_rule>{{c}, opt_.schedule});
  return base::step(detail::lr_scheduled<detail::sgd_momentum_rule>{{c}, opt_.schedule});
}

}  // namespace fsdp::optim
