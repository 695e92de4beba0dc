#pragma once
// AdamW (decoupled weight decay, bias correction, eps outside the square root: torch.optim.AdamW's documented
// algorithm) over the local shards. Parameters flagged no_decay get no weight decay. The bias corrections
// 1 - beta^t are evaluated in double and rounded once. Gradient clipping, non-finite checks and loss scaling:
// adamw_options::grad; a skipped step does not count (t stays).
#include <cmath>

#include "fsdp/core/error.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/optim/detail/shard_optimizer.hpp"
#include "fsdp/optim/detail/update.hpp"

namespace fsdp::optim {

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
    const grad::report r =
        this->run_step([&](auto& unit, const detail::shard_piece& piece, float grad_scale, auto& site) {
          const detail::adamw_coeffs c{opt_.lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, bc1, bc2, grad_scale};
          const auto off = piece.offset;
          site.adamw_step(unit.master_shard() + off, unit.grad_shard() + off, this->state(unit.index(), 0) + off,
                          this->state(unit.index(), 1) + off, piece.numel, c, piece.mask);
        });
    return r;
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
