#pragma once
// FsdpUnit: one group of parameters that is sharded, gathered and reduced together, with its state machine.
//
//   parameters:  sharded --gather issued--> gathering --first use waits--> gathered --release--> sharded
//   passes:      forward(enter..leave) marks the unit forward-done; backward requires it and clears it
//   gradients:   backward leave issues the reduction --> reduced since the last step; a step consumes it
//
// Every wrong transition throws usage_error naming the unit. The scheduler (Model) drives the transitions;
// users see the unit through param()/grad() inside model.forward() / model.backward().
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/unit/state.hpp"
#include "fsdp/unit/tensor_view.hpp"

namespace fsdp {

template <class Policy>
class Model;

template <class Backend>
class FsdpUnit {
 public:
  using backend_type = Backend;
  using buffer = typename Backend::buffer;
  using event = typename Backend::event;

  const std::string& name() const noexcept { return name_; }
  std::size_t index() const noexcept { return index_; }
  unit_state state() const noexcept { return state_; }
  /// The pass this unit is current in (none between uses).
  pass_kind active() const noexcept { return active_; }
  const FlatLayout& layout() const noexcept { return layout_; }
  /// This rank's parts of the unit's parameters (global shapes, local ranges).
  std::vector<ShardedTensor> shard_views() const { return layout_.shard_views(shard_rank_); }

  /// The gathered parameter `pname`, in the compute dtype. The unit must be gathered.
  template <class T = float>
  tensor_view<T> param(const std::string& pname) {
    const flat_entry& e = layout_.entry(pname, name_);
    check_type<T>(pname);
    if (state_ != unit_state::gathered)
      detail::fail_usage("unit '", name_, "' (index ", index_, ") is not gathered (state: ", name_of(state_),
                         "): param('", pname, "') needs its parameters gathered; use it inside model.forward() or "
                         "model.backward()");
    return tensor_view<T>(static_cast<T*>(full_params_) + e.offset, &e.shape, e.numel);
  }

  /// The unsharded gradient buffer of `pname`, zeroed when the unit's backward starts; write (or add) the
  /// parameter's gradient here. Only while the unit is current in model.backward().
  template <class T = float>
  tensor_view<T> grad(const std::string& pname) {
    const flat_entry& e = layout_.entry(pname, name_);
    check_type<T>(pname);
    if (active_ != pass_kind::backward)
      detail::fail_usage("unit '", name_, "' (index ", index_, "): grad('", pname,
                         "') is only available while the unit is current in model.backward() (now: ",
                         active_ == pass_kind::none ? "not current" : "current in forward", ")");
    return tensor_view<T>(full_grad_.template as<T>() + e.offset, &e.shape, e.numel);
  }

  /// This rank's fp32 master shard and gradient shard (shard_numel elements each).
  float* master_shard() const noexcept { return master_.template as<float>(); }
  float* grad_shard() const noexcept { return grad_shard_.template as<float>(); }

 private:
  template <class P>
  friend class Model;

  FsdpUnit(std::string name, std::size_t index, FlatLayout layout, int shard_rank)
      : name_(std::move(name)), index_(index), layout_(std::move(layout)), shard_rank_(shard_rank) {}

  template <class T>
  void check_type(const std::string& pname) const {
    if (!std::is_same_v<T, float>)
      detail::fail_usage("unit '", name_, "': parameter '", pname, "' is computed in f32; ask for it as float");
  }

  // ---- transitions (called by the scheduler) -------------------------------------------------------------------
  void to_gathering() {
    if (state_ != unit_state::sharded)
      detail::fail_usage("unit '", name_, "' (index ", index_, "): gather issued twice (state: ", name_of(state_),
                         ")");
    state_ = unit_state::gathering;
  }
  void to_gathered() {
    if (state_ != unit_state::gathering)
      detail::fail_usage("unit '", name_, "' (index ", index_, "): waited for a gather that was not issued (state: ",
                         name_of(state_), ")");
    state_ = unit_state::gathered;
  }
  void to_sharded() {
    if (state_ != unit_state::gathered)
      detail::fail_usage("unit '", name_, "' (index ", index_, "): released while ", name_of(state_));
    state_ = unit_state::sharded;
  }
  void enter(pass_kind p) {
    if (active_ != pass_kind::none)
      detail::fail_usage("unit '", name_, "' (index ", index_, ") entered ", name_of(p), " while current in ",
                         name_of(active_));
    if (p == pass_kind::backward && !forward_done_)
      detail::fail_usage("unit '", name_, "' (index ", index_,
                         "): backward before forward: run model.forward() over it first");
    active_ = p;
  }
  void leave() {
    if (active_ == pass_kind::forward) forward_done_ = true;
    if (active_ == pass_kind::backward) {
      forward_done_ = false;
      reduced_since_step_ = true;
    }
    active_ = pass_kind::none;
  }

  std::string name_;
  std::size_t index_;
  FlatLayout layout_;
  int shard_rank_;

  unit_state state_ = unit_state::sharded;
  pass_kind active_ = pass_kind::none;
  bool forward_done_ = false;
  bool reduced_since_step_ = false;

  buffer master_;      // fp32 master shard (sharded params)
  buffer grad_shard_;  // fp32 gradient shard (grads)
  buffer gathered_;    // unsharded parameters while gathered (gathered params)
  buffer full_grad_;   // unsharded gradient during the unit's backward (comm buffers)
  void* full_params_ = nullptr;  // gathered_'s data, or the master itself when parameters are not sharded

  event shard_ready_;  // the last write to the master shard (materialisation, optimizer step) is done
  event gathered_ev_;  // all-gather into gathered_ complete
  event grad_ready_;   // compute stream finished writing full_grad_
  event reduced_ev_;   // reduction accumulated into grad_shard_
};

}  // namespace fsdp
