#pragma once
// What every optimizer over the local shards shares: the pieces each unit's shard is stepped in (one fused launch
// each, with its no-decay mask), state buffers costed by fsdp/plan/cost.hpp and reserved with the model's plan,
// and the step itself:
//
//   inside Model::step (after every reduction): inspect the gradients when asked (fsdp/grad/inspect.hpp); on a
//   non-finite gradient skip the update on every rank (parameters and state bit-unchanged); otherwise run the
//   optimizer's fused update over every piece with the gradient scale (clipping, loss-scale removal);
//   afterwards tell the loss scaler whether the step was skipped.
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/grad/loss_scaler.hpp"
#include "fsdp/optim/detail/pieces.hpp"
#include "fsdp/plan/cost.hpp"

namespace fsdp::optim::detail {

template <class ModelT>
class shard_optimizer {
 public:
  using backend_type = typename ModelT::backend_type;
  using buffer = typename backend_type::buffer;

  /// fp32 values of optimizer state per parameter element (for the memory planner).
  int states_per_element() const noexcept { return states_; }
  /// Rows of the gradient inspection buffer (for the memory planner; 0 without inspection).
  int norm_rows() const noexcept { return grad_.rows(model_.comm().size()); }
  const grad::options& grad_options() const noexcept { return grad_; }
  /// State buffer k of unit u (backend memory: shard_numel fp32 values), for inspection and checkpoints.
  const float* state(std::size_t u, int k) const {
    if (u >= state_.size() || k < 0 || k >= states_)
      fsdp::detail::fail_usage("optimizer state ", k, " of unit ", u, " does not exist (", state_.size(), " units, ",
                               states_, " states per element)");
    return state_[u][static_cast<std::size_t>(k)].template as<float>();
  }
  void zero_grad() { model_.zero_grad(); }

 protected:
  /// Allocates and zeroes `states` fp32 buffers per unit, after reserving the model's planned peak with them.
  shard_optimizer(ModelT& model, int states, const grad::options& g) : model_(model), states_(states), grad_(g) {
    grad::check(g);
    model.reserve_memory(states_, norm_rows());
    auto& be = model.backend();
    for (std::size_t u = 0; u < model.size(); ++u) {
      pieces_.push_back(masked_pieces(model.unit(u).shard_views(), model.unit(u).layout().shard_numel()));
      const plan::buffer_cost c = plan::optimizer_state_cost(model.unit(u).layout(), 1);
      std::vector<buffer> s;
      for (int k = 0; k < states_; ++k) {
        s.push_back(be.allocate(c.bytes(), c.category, be.compute_stream()));
        be.fill_zero(s.back().data(), c.bytes(), be.compute_stream());
      }
      state_.push_back(std::move(s));
    }
  }
  /// Waits for the optimizer's kernels on the compute stream before its state buffers go (the compute stream may
  /// be asynchronous). The model must outlive the optimizer. Never throws.
  ~shard_optimizer() {
    try {
      model_.backend().synchronize(model_.backend().compute_stream());
    } catch (...) {
    }
  }
  shard_optimizer(const shard_optimizer&) = delete;
  shard_optimizer& operator=(const shard_optimizer&) = delete;

  float* state_of(std::size_t u, int k) { return state_[u][static_cast<std::size_t>(k)].template as<float>(); }

  /// One step: update(unit, piece, grad_scale) for every piece of every unit, unless the inspection skips it.
  template <class Update>
  grad::report run_step(Update&& update) {
    grad::report r;
    model_.step([&] {
      if (grad_.inspects()) {
        std::vector<std::size_t> backward = model_.forward_order();
        std::reverse(backward.begin(), backward.end());
        r = grad::inspect(model_, grad_, backward);
      }
      if (r.skipped) return;
      for (std::size_t u = 0; u < model_.size(); ++u)
        for (const shard_piece& piece : pieces_[u]) update(model_.unit(u), piece, r.grad_scale);
    });
    if (grad_.scaler) grad_.scaler->update(r.skipped);
    return r;
  }

  ModelT& model_;

 private:
  int states_;
  grad::options grad_;
  std::vector<std::vector<shard_piece>> pieces_;  // per unit: one fused launch each
  std::vector<std::vector<buffer>> state_;        // per unit: states_ buffers of shard_numel fp32 values
};

}  // namespace fsdp::optim::detail
