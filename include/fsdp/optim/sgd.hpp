#pragma once
// SGD with momentum over the local shards: each rank updates only the parameter elements it owns. Parameters
// flagged no_decay get no weight decay. Gradient clipping, non-finite checks and loss scaling: sgd_options::grad.
// The per-element update (sgd_update, as torch.optim.SGD with dampening 0, nesterov off) is an element function
// (sgd_elements) that Backend::for_each runs on the host or in a kernel: every operation rounded once.
#include <cmath>
#include <cstdint>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/rounding.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/kernels/array_function.hpp"
#include "fsdp/optim/detail/decay_mask.hpp"
#include "fsdp/optim/detail/shard_optimizer.hpp"

namespace fsdp::optim {

namespace detail {
/// SGD with momentum and coupled (L2) weight decay.
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

/// One SGD step over a shard piece (buf null: no momentum; a kernels::ArrayFunction over p, g, buf: 128-bit
/// accesses in a kernel).
struct sgd_elements {
  float* p;
  const float* g;
  float* buf;
  sgd_coeffs c;
  decay_mask mask;
  static constexpr int array_count = 3;
  FSDP_HD kernels::fp32_arrays<3> arrays() const { return {{p, const_cast<float*>(g), buf}, 0b101u}; }
  FSDP_HD void update(float* x, std::int64_t i) const {
    sgd_update(x[0], x[1], buf ? &x[2] : nullptr, c, mask.weight_decay(i, c.weight_decay));
  }
  FSDP_HD void operator()(std::int64_t i) const { kernels::apply_at(*this, i); }
};
}  // namespace detail

struct sgd_options {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  ///< L2, added to the gradient (torch.optim.SGD); 0 for no_decay parameters
  grad::options grad{};       ///< clipping, non-finite checks, loss scaling (none by default)
};

template <class ModelT>
class sgd : public detail::shard_optimizer<ModelT> {
  using base = detail::shard_optimizer<ModelT>;

 public:
  /// State 0 (with momentum only): the momentum buffer.
  sgd(ModelT& model, sgd_options opt)
      : base(model, "sgd", checked(opt).momentum != 0.0f ? std::vector<std::string>{"momentum_buffer"}
                                                         : std::vector<std::string>{},
             opt.grad),
        opt_(opt) {}

  const sgd_options& options() const noexcept { return opt_; }
  void set_lr(float lr) noexcept { opt_.lr = lr; }

  /// One step over every local shard (see detail/shard_optimizer.hpp); returns what it did with the gradients.
  grad::report step() {
    return this->run_step([&](auto& unit, const detail::shard_piece& piece, float grad_scale, auto& site) {
      const detail::sgd_coeffs c{opt_.lr, opt_.momentum, opt_.weight_decay, grad_scale};
      float* buf = this->states_per_element() ? site.at(this->state(unit.index(), 0) + piece.offset) : nullptr;
      site.run(piece.numel, detail::sgd_elements{site.at(unit.master_shard() + piece.offset),
                                                 site.at(unit.grad_shard() + piece.offset), buf, c, piece.mask});
    });
  }

 private:
  static const sgd_options& checked(const sgd_options& opt) {
    if (!(opt.lr >= 0.0f) || !std::isfinite(opt.lr)) fsdp::detail::fail_usage("sgd: lr must be finite and >= 0, got ", opt.lr);
    if (!(opt.momentum >= 0.0f && opt.momentum < 1.0f))
      fsdp::detail::fail_usage("sgd: momentum must be in [0, 1), got ", opt.momentum);
    return opt;
  }

  sgd_options opt_;
};

template <class ModelT>
sgd(ModelT&, sgd_options) -> sgd<ModelT>;

}  // namespace fsdp::optim
