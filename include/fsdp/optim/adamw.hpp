#pragma once
// AdamW (decoupled weight decay, bias correction, eps outside the square root: torch.optim.AdamW's documented
// algorithm) over the local shards. Parameters flagged no_decay get no weight decay. The bias corrections
// 1 - beta^t are evaluated in double and rounded once. Gradient clipping, non-finite checks and loss scaling:
// adamw_options::grad; a skipped step does not count (t stays). The per-element update (adamw_update) is an
// element function (adamw_elements) that Backend::for_each runs on the host or in a kernel: every operation
// rounded once.
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

/// One AdamW step over a shard piece (a kernels::ArrayFunction over p, g, m, v: 128-bit accesses in a kernel).
struct adamw_elements {
  float* p;
  const float* g;
  float* m;
  float* v;
  adamw_coeffs c;
  decay_mask mask;
  static constexpr int array_count = 4;
  FSDP_HD kernels::fp32_arrays<4> arrays() const { return {{p, const_cast<float*>(g), m, v}, 0b1101u}; }
  FSDP_HD void update(float* x, std::int64_t i) const {
    adamw_update(x[0], x[1], x[2], x[3], c, mask.weight_decay(i, c.weight_decay));
  }
  FSDP_HD void operator()(std::int64_t i) const { kernels::apply_at(*this, i); }
};
}  // namespace detail

struct adamw_options {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  grad::options grad{};  ///< clipping, non-finite checks, loss scaling (none by default)
};

template <class ModelT>
class adamw : public detail::shard_optimizer<ModelT> {
  using base = detail::shard_optimizer<ModelT>;

 public:
  /// State 0: the first moment (exp_avg), state 1: the second (exp_avg_sq).
  adamw(ModelT& model, adamw_options opt)
      : base(model, (check(opt), "adamw"), {"exp_avg", "exp_avg_sq"}, opt.grad), opt_(opt) {}

  const adamw_options& options() const noexcept { return opt_; }
  void set_lr(float lr) noexcept { opt_.lr = lr; }
  /// One step over every local shard (see detail/shard_optimizer.hpp); returns what it did with the gradients.
  grad::report step() {
    const long t = this->steps() + 1;
    const float bc1 = detail::adamw_bias_correction(opt_.beta1, t), bc2 = detail::adamw_bias_correction(opt_.beta2, t);
    return this->run_step([&](auto& unit, const detail::shard_piece& piece, float grad_scale, auto& site) {
      const detail::adamw_coeffs c{opt_.lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, bc1, bc2, grad_scale};
      const auto off = piece.offset;
      site.run(piece.numel, detail::adamw_elements{site.at(unit.master_shard() + off), site.at(unit.grad_shard() + off),
                                                   site.at(this->state(unit.index(), 0) + off),
                                                   site.at(this->state(unit.index(), 1) + off), c, piece.mask});
    });
  }

 private:
  static void check(const adamw_options& opt) {
    if (!(opt.lr >= 0.0f) || !std::isfinite(opt.lr)) fsdp::detail::fail_usage("adamw: lr must be finite and >= 0, got ", opt.lr);
    if (!(opt.beta1 >= 0.0f && opt.beta1 < 1.0f)) fsdp::detail::fail_usage("adamw: beta1 must be in [0, 1), got ", opt.beta1);
    if (!(opt.beta2 >= 0.0f && opt.beta2 < 1.0f)) fsdp::detail::fail_usage("adamw: beta2 must be in [0, 1), got ", opt.beta2);
    if (!(opt.eps > 0.0f)) fsdp::detail::fail_usage("adamw: eps must be > 0, got ", opt.eps);
  }

  adamw_options opt_;
};

template <class ModelT>
adamw(ModelT&, adamw_options) -> adamw<ModelT>;

}  // namespace fsdp::optim
