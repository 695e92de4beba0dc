#pragma once
// AdamW (decoupled weight decay) over the local shards. Parameters flagged no_decay get no weight decay.
#include <cmath>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/optim/detail/pieces.hpp"
#include "fsdp/optim/detail/update.hpp"

namespace fsdp::optim {

struct adamw_options {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

template <class ModelT>
class adamw {
 public:
  using backend_type = typename ModelT::backend_type;

  adamw(ModelT& model, adamw_options opt) : model_(model), opt_(opt) {
    if (!(opt.lr >= 0.0f) || !std::isfinite(opt.lr)) fsdp::detail::fail_usage("adamw: lr must be finite and >= 0, got ", opt.lr);
    if (!(opt.beta1 >= 0.0f && opt.beta1 < 1.0f)) fsdp::detail::fail_usage("adamw: beta1 must be in [0, 1), got ", opt.beta1);
    if (!(opt.beta2 >= 0.0f && opt.beta2 < 1.0f)) fsdp::detail::fail_usage("adamw: beta2 must be in [0, 1), got ", opt.beta2);
    if (!(opt.eps > 0.0f)) fsdp::detail::fail_usage("adamw: eps must be > 0, got ", opt.eps);
    model.reserve_memory(states_per_element());
    auto& be = model.backend();
    for (std::size_t i = 0; i < model.size(); ++i) {
      const auto n = model.unit(i).layout().shard_numel();
      pieces_.push_back(detail::masked_pieces(model.unit(i).shard_views(), n));
      m_.push_back(be.allocate(n * 4, mem::optimizer_state, be.compute_stream()));
      v_.push_back(be.allocate(n * 4, mem::optimizer_state, be.compute_stream()));
      be.fill_zero(m_.back().data(), n * 4, be.compute_stream());
      be.fill_zero(v_.back().data(), n * 4, be.compute_stream());
    }
  }

  /// Waits for the optimizer's kernels on the compute stream before its state buffers go (the compute stream
  /// may be asynchronous). The model must outlive the optimizer. Never throws.
  ~adamw() {
    try {
      model_.backend().synchronize(model_.backend().compute_stream());
    } catch (...) {
    }
  }
  adamw(const adamw&) = delete;
  adamw& operator=(const adamw&) = delete;

  int states_per_element() const noexcept { return 2; }
  const adamw_options& options() const noexcept { return opt_; }
  void set_lr(float lr) noexcept { opt_.lr = lr; }
  long steps() const noexcept { return t_; }

  void step() {
    auto& be = model_.backend();
    const long t = t_ + 1;
    const detail::adamw_coeffs c{opt_.lr,
                                 opt_.beta1,
                                 opt_.beta2,
                                 opt_.eps,
                                 opt_.weight_decay,
                                 1.0f - static_cast<float>(std::pow(double(opt_.beta1), double(t))),
                                 1.0f - static_cast<float>(std::pow(double(opt_.beta2), double(t)))};
    model_.step([&](auto& unit, const auto&) {
      float* m = m_[unit.index()].template as<float>();
      float* v = v_[unit.index()].template as<float>();
      for (const detail::shard_piece& piece : pieces_[unit.index()]) {
        const auto off = piece.offset;
        be.adamw_step(unit.master_shard() + off, unit.grad_shard() + off, m + off, v + off, piece.numel, c,
                      piece.mask, be.compute_stream());
      }
    });
    t_ = t;
  }
  void zero_grad() { model_.zero_grad(); }

 private:
  ModelT& model_;
  adamw_options opt_;
  long t_ = 0;
  std::vector<typename backend_type::buffer> m_, v_;
  std::vector<std::vector<detail::shard_piece>> pieces_;  // per unit: one fused launch each
};

template <class ModelT>
adamw(ModelT&, adamw_options) -> adamw<ModelT>;

}  // namespace fsdp::optim
