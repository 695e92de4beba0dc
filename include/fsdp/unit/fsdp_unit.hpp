#pragma once
// FsdpUnit: a view of one group of parameters that is sharded, gathered and reduced together, as a trainer sees
// it inside model.forward() and model.backward(). It owns nothing: the unit's state is the scheduler's
// (fsdp/detail/schedule/scheduler.hpp), its buffers the unit executor's (fsdp/detail/exec/unit_executor.hpp).
//
//   parameters:  sharded --gather issued--> gathering --first use waits--> gathered --release--> sharded
//   passes:      forward(enter..leave) marks the unit forward-done; backward requires it and clears it
//   gradients:   backward leave reduces (or, under no-sync, keeps) the gradient; a step consumes it
//
// param<T>() and grad<T>() are typed views in the compute dtype (T defaults to the precision policy's compute
// type; any T with the same dtype is accepted, such as __nv_bfloat16 for fsdp::bfloat16 under nvcc). A view
// asked for outside its time is a usage_error naming the unit and the parameter; under model_options::check_views,
// so is a view used after its unit gave its memory back (fsdp/unit/tensor_view.hpp).
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/unit_state.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/unit/detail/unit_buffers.hpp"
#include "fsdp/unit/tensor_view.hpp"

namespace fsdp {

/// What a unit is apart from its compute dtype: its name, state, layout and shards. The optimizers and checkpoints
/// see units as this (fsdp::model_core); a trainer sees FsdpUnit, which adds the typed views.
template <class Backend>
class basic_unit {
 public:
  using backend_type = Backend;

  /// Made by Model, one per unit; `sched` and `bufs` must outlive the view.
  basic_unit(std::size_t index, const FlatLayout& layout, int shard_rank, const detail::sched::scheduler& sched,
             const detail::unit_buffers<Backend>& bufs)
      : index_(index), layout_(&layout), shard_rank_(shard_rank), sched_(&sched), bufs_(&bufs) {}

  const std::string& name() const { return sched_->units().name(index_); }
  std::size_t index() const noexcept { return index_; }
  unit_state state() const { return sched_->params(index_); }
  /// The pass this unit is current in (none between uses).
  pass_kind active() const { return sched_->active(index_); }
  const FlatLayout& layout() const noexcept { return *layout_; }
  /// This rank's parts of the unit's parameters (global shapes, local ranges).
  std::vector<ShardedTensor> shard_views() const { return layout_->shard_views(shard_rank_); }
  /// This rank's place in the unit's shard group (an expert unit's: its expert shard group).
  int shard_rank() const noexcept { return shard_rank_; }

  /// This rank's fp32 master shard and gradient shard (shard_numel elements each), to read (on the backend's
  /// memory: device memory under backend::cuda). Only the library writes them, between the steps' collectives and
  /// in stream order (an optimizer, a checkpoint load, a weight import): through fsdp::model_access.
  const float* master_shard() const noexcept { return writable_master(); }
  const float* grad_shard() const noexcept { return writable_grad(); }

 private:
  friend struct model_access;  // the writable shards (model_access::master_shard, grad_shard)
  float* writable_master() const noexcept { return bufs_->master.template as<float>(); }
  float* writable_grad() const noexcept { return bufs_->grad_shard.template as<float>(); }

 protected:
  /// A view's check under model_options::check_views (none otherwise): stale once the streams pass a hand-over
  /// issued after now.
  view_check checked(const handover_count* h, const flat_entry& e, bool grad) const {
    if (!h) return {};
    return {&h->passed, h->issued, &name(), &e.name, grad};
  }
  std::size_t index_;
  const FlatLayout* layout_;
  int shard_rank_;
  const detail::sched::scheduler* sched_;
  const detail::unit_buffers<Backend>* bufs_;
};

template <class Backend, class Compute = float>
class FsdpUnit : public basic_unit<Backend> {
  using base = basic_unit<Backend>;
  using base::bufs_;
  using base::checked;
  using base::index_;
  using base::layout_;

 public:
  using compute_type = Compute;
  using base::active;
  using base::name;
  using base::state;

  /// The typed view of a unit (fsdp::basic_model makes one per unit).
  explicit FsdpUnit(const base& b) : base(b) {}

  /// The gathered parameter `pname`, in the compute dtype. The unit must be gathered.
  template <class T = Compute>
  tensor_view<T> param(const std::string& pname) const {
    static_assert(same_dtype<T, Compute>(),
                  "FsdpUnit::param<T>: T must have the precision policy's compute dtype");
    const flat_entry& e = layout_->entry(pname, name());
    if (state() != unit_state::gathered) not_gathered(pname);
    return tensor_view<T>(static_cast<T*>(bufs_->params) + e.offset, &e.shape, e.numel,
                          checked(bufs_->param_handovers, e, false));
  }

  /// The unsharded gradient buffer of `pname` in the compute dtype, zeroed when the unit's backward starts; write
  /// (or add) the parameter's gradient here. Only while the unit is current in model.backward().
  template <class T = Compute>
  tensor_view<T> grad(const std::string& pname) const {
    static_assert(same_dtype<T, Compute>(),
                  "FsdpUnit::grad<T>: T must have the precision policy's compute dtype");
    const flat_entry& e = layout_->entry(pname, name());
    if (active() != pass_kind::backward && !this->sched_->grad_open(index_))
      detail::fail_usage("unit '", name(), "' (index ", index_, "): grad('", pname,
                         "') is only available while the unit is current in model.backward() (now: ",
                         active() == pass_kind::none ? "not current" : "current in forward",
                         "); to write it earlier in the backward pass (a tied head's gradient), name the unit in "
                         "model_options::early_grads");
    return tensor_view<T>(static_cast<T*>(bufs_->grad) + e.offset, &e.shape, e.numel,
                          checked(bufs_->grad_handovers, e, true));
  }

 private:
  [[noreturn]] void not_gathered(const std::string& pname) const {
    const std::string what = detail::cat("unit '", name(), "' (index ", index_,
                                         ") is not gathered (state: ", name_of(state()), "): param('", pname, "') ");
    if (state() == unit_state::sharded && active() == pass_kind::none && this->sched_->forward_done(index_))
      detail::fail_usage(what,
                         "was asked for after the unit's forward released it (it reshards after forward). A "
                         "unit used again later in the forward pass, or before its own backward (a tied head), must "
                         "stay gathered: set model_options::reshard_after_forward[\"",
                         name(), "\"] = false");
    detail::fail_usage(what, "needs its parameters gathered; use it inside model.forward() or model.backward()");
  }
};

}  // namespace fsdp
