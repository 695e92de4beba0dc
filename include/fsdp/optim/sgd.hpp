#pragma once
// SGD with momentum over the local shards: each rank updates only the parameter elements it owns. Parameters
// flagged no_decay get no weight decay. Gradient clipping, non-finite checks and loss scaling: sgd_options::grad.
#include <cmath>

#include "fsdp/core/error.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/optim/detail/shard_optimizer.hpp"
#include "fsdp/optim/detail/update.hpp"

namespace fsdp::optim {

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
      float* buf = this->states_per_element() ? this->state(unit.index(), 0) + piece.offset : nullptr;
      site.sgd_step(unit.master_shard() + piece.offset, unit.grad_shard() + piece.offset, buf, piece.numel, c, piece.mask);
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
