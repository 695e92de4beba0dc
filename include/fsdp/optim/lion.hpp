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
#include "fsdp/optim/detail/shard_optimizer.hpp"

namespace fsdp::optim {

namespace detail {
struct lion_coeffs {
  float lr;
  float beta1;
  float beta2;
  float weight_decay;       ///< for parameters not masked out (see decay_mask)
  float grad_scale = 1.0f;  ///< the gradient is multiplied by this first (clipping, loss-scale removal)
};

FSDP_HD inline float lion_sign(float x) { return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x; }  // 0 and NaN as they are

FSDP_HD inline void lion_update(float& p, float g, float& m, const lion_coeffs& c, float weight_decay) {
  if (c.grad_scale != 1.0f) g = rn::mul(g, c.grad_scale);
  const float u = rn::add(rn::mul(c.beta1, m), rn::mul(rn::sub(1.0f, c.beta1), g));
  p = rn::mul(p, rn::sub(1.0f, rn::mul(c.lr, weight_decay)));
  p = rn::sub(p, rn::mul(c.lr, lion_sign(u)));
  m = rn::add(rn::mul(c.beta2, m), rn::mul(rn::sub(1.0f, c.beta2), g));
}

/// One Lion step over a shard piece (a kernels::ArrayFunction over p, g, m: 128-bit accesses in a kernel).
struct lion_elements {
  float* p;
  const float* g;
  float* m;
  lion_coeffs c;
  decay_mask mask;
  static constexpr int array_count = 3;
  FSDP_HD kernels::fp32_arrays<3> arrays() const { return {{p, const_cast<float*>(g), m}, 0b101u}; }
  FSDP_HD void update(float* x, std::int64_t i) const { lion_update(x[0], x[1], x[2], c, mask.weight_decay(i, c.weight_decay)); }
  FSDP_HD void operator()(std::int64_t i) const { kernels::apply_at(*this, i); }
};
}  // namespace detail

struct lion_options {
  float lr = 1e-4f;  ///< about 3-10x smaller than AdamW's for the same problem, as the authors advise
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;  ///< about 3-10x larger than AdamW's, likewise
  grad::options grad{};       ///< clipping, non-finite checks, loss scaling (none by default)
};

template <class ModelT>
class lion : public detail::shard_optimizer<ModelT> {
  using base = detail::shard_optimizer<ModelT>;

 public:
  /// State 0: the momentum (exp_avg).
  lion(ModelT& model, lion_options opt) : base(model, (check(opt), "lion"), {"exp_avg"}, opt.grad), opt_(opt) {}

  const lion_options& options() const noexcept { return opt_; }
  void set_lr(float lr) noexcept { opt_.lr = lr; }
  /// One step over every local shard (see detail/shard_optimizer.hpp); returns what it did with the gradients.
  grad::report step() {
    return this->run_step([&](auto& unit, const detail::shard_piece& piece, float grad_scale, auto& site) {
      const detail::lion_coeffs c{opt_.lr, opt_.beta1, opt_.beta2, opt_.weight_decay, grad_scale};
      const auto off = piece.offset;
      site.run(piece.numel, detail::lion_elements{site.at(unit.master_shard() + off), site.at(unit.grad_shard() + off),
                                                  site.at(this->state(unit.index(), 0) + off), c, piece.mask});
    });
  }

 private:
  static void check(const lion_options& opt) {
    if (!(opt.lr >= 0.0f) || !std::isfinite(opt.lr)) fsdp::detail::fail_usage("lion: lr must be finite and >= 0, got ", opt.lr);
    if (!(opt.beta1 >= 0.0f && opt.beta1 <= 1.0f)) fsdp::detail::fail_usage("lion: beta1 must be in [0, 1], got ", opt.beta1);
    if (!(opt.beta2 >= 0.0f && opt.beta2 <= 1.0f)) fsdp::detail::fail_usage("lion: beta2 must be in [0, 1], got ", opt.beta2);
    if (!std::isfinite(opt.weight_decay)) fsdp::detail::fail_usage("lion: weight_decay must be finite, got ", opt.weight_decay);
  }

  lion_options opt_;
};

template <class ModelT>
lion(ModelT&, lion_options) -> lion<ModelT>;

}  // namespace fsdp::optim
