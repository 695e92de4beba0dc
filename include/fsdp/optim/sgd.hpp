#pragma once
// SGD with momentum over the local shards: each rank updates only the parameter elements it owns.
#include <cmath>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/optim/detail/pieces.hpp"
#include "fsdp/optim/detail/update.hpp"

namespace fsdp::optim {

struct sgd_options {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  ///< L2, added to the gradient (torch.optim.SGD); 0 for no_decay parameters
};

template <class ModelT>
class sgd {
 public:
  using backend_type = typename ModelT::backend_type;

  sgd(ModelT& model, sgd_options opt) : model_(model), opt_(opt) {
    if (!(opt.lr >= 0.0f) || !std::isfinite(opt.lr)) fsdp::detail::fail_usage("sgd: lr must be finite and >= 0, got ", opt.lr);
    if (!(opt.momentum >= 0.0f && opt.momentum < 1.0f))
      fsdp::detail::fail_usage("sgd: momentum must be in [0, 1), got ", opt.momentum);
    model.reserve_memory(states_per_element());
    auto& be = model.backend();
    for (std::size_t i = 0; i < model.size(); ++i) {
      const auto n = model.unit(i).layout().shard_numel();
      pieces_.push_back(detail::masked_pieces(model.unit(i).shard_views(), n));
      if (opt.momentum == 0.0f) continue;
      momentum_.push_back(be.allocate(n * 4, mem::optimizer_state, be.compute_stream()));
      be.fill_zero(momentum_.back().data(), n * 4, be.compute_stream());
    }
  }

  /// fp32 values of state per parameter element (for the memory planner).
  /// Waits for the optimizer's kernels on the compute stream before its state buffers go (the compute stream
  /// may be asynchronous). The model must outlive the optimizer. Never throws.
  ~sgd() {
    try {
      model_.backend().synchronize(model_.backend().compute_stream());
    } catch (...) {
    }
  }
  sgd(const sgd&) = delete;
  sgd& operator=(const sgd&) = delete;

  int states_per_element() const noexcept { return opt_.momentum != 0.0f ? 1 : 0; }
  const sgd_options& options() const noexcept { return opt_; }
  void set_lr(float lr) noexcept { opt_.lr = lr; }

  void step() {
    auto& be = model_.backend();
    const detail::sgd_coeffs c{opt_.lr, opt_.momentum, opt_.weight_decay};
    model_.step([&](auto& unit, const auto&) {
      float* buf = momentum_.empty() ? nullptr : momentum_[unit.index()].template as<float>();
      for (const detail::shard_piece& piece : pieces_[unit.index()])
        be.sgd_step(unit.master_shard() + piece.offset, unit.grad_shard() + piece.offset,
                    buf ? buf + piece.offset : nullptr, piece.numel, c, piece.mask, be.compute_stream());
    });
  }
  void zero_grad() { model_.zero_grad(); }

 private:
  ModelT& model_;
  sgd_options opt_;
  std::vector<typename backend_type::buffer> momentum_;
  std::vector<std::vector<detail::shard_piece>> pieces_;  // per unit: one fused launch each
};

template <class ModelT>
sgd(ModelT&, sgd_options) -> sgd<ModelT>;

}  // namespace fsdp::optim
