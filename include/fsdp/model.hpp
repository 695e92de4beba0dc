#pragma once
// Model<Policy>: the units of one rank and the scheduler that moves them through their states.
//
// Scheduling (shared by every backend; the backend only supplies memory, streams, events and kernels):
//  - forward, entering unit i: gather i if it is sharded, then prefetch the next forward_depth units, then make
//    the compute stream wait for i's gather. Leaving i: release it if the strategy reshards after forward.
//  - backward, entering unit i (reverse order): it must have run forward; gather it if sharded, prefetch the
//    next backward_depth units in backward order, wait, allocate its zeroed unsharded gradient buffer. Leaving
//    i: the reduce stream waits for compute, reduce-scatters (sharded) or all-reduces (no_shard) the gradient,
//    accumulates it into the fp32 gradient shard, and the unit's parameters are released.
//  - all-gathers run on the backend's gather stream, reductions on its reduce stream; events order them with
//    the compute stream. The host thread never waits inside a step except where the backend's compute stream
//    is the host thread itself (host backend).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/init/init.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/plan/memory_plan.hpp"
#include "fsdp/policy.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/unit/fsdp_unit.hpp"
#include "fsdp/wrap/wrap.hpp"

namespace fsdp {

struct model_options {
  layout_options layout{};
  /// How gradients are combined across ranks: avg (each rank's loss is a mean over its own samples) or sum.
  reduce_op grad_reduce = reduce_op::avg;
};

template <class Policy>
class Model {
 public:
  using policy_type = Policy;
  using strategy = typename Policy::sharding;
  using prefetch = typename Policy::prefetch;
  using communicator = typename Policy::communicator;
  using backend_type = typename Policy::backend_type;
  using unit_type = FsdpUnit<backend_type>;
  using stream = typename backend_type::stream;
  static_assert(CollectivePolicy<communicator>, "fsdp::Model: the policy's communicator is not a CollectivePolicy");

  template <WrappingPolicy W>
  Model(communicator& comm, const ModelSpec& spec, const W& wrap, init::rule default_init = init::normal{},
        model_options opt = {})
      : comm_(&comm), spec_(spec), opt_(opt), backend_(std::make_unique<backend_type>(comm.rank())) {
    const int world = comm.size();
    if (world <= 0) detail::fail_usage("world size must be positive, got ", world);
    shard_world_ = strategy::shard_group_size(world);
    if (shard_world_ <= 0 || world % shard_world_ != 0)
      detail::fail_usage("sharding strategy ", strategy::name, " gives a shard group of ", shard_world_,
                         " ranks, which does not divide the world of ", world);
    const int shard_rank = comm.rank() % shard_world_;
    for (const auto& p : spec_.params())
      if (p.compute_dtype != dtype_of_v<typename Policy::precision::compute_type>)
        detail::fail_usage("parameter '", p.name, "' asks for compute dtype ", name_of(p.compute_dtype),
                           " but the precision policy computes in ",
                           name_of(dtype_of_v<typename Policy::precision::compute_type>));
    const std::vector<unit_plan> plans = make_units(spec_, wrap);
    units_.reserve(plans.size());
    for (std::size_t i = 0; i < plans.size(); ++i) {
      FlatLayout layout = FlatLayout::build(spec_, plans[i], shard_world_, opt_.layout);
      units_.push_back(std::unique_ptr<unit_type>(new unit_type(plans[i].name, i, std::move(layout), shard_rank)));
      by_name_.emplace(plans[i].name, i);
    }
    for (auto& u : units_) materialise(*u, default_init);
  }

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  ~Model() {
    // Streams may still read or write unit buffers: let them finish before the buffers go. Never throws.
    try {
      backend_->synchronize(backend_->gather_stream());
    } catch (...) {
    }
    try {
      backend_->synchronize(backend_->reduce_stream());
    } catch (...) {
    }
    units_.clear();
  }

  // ---- iteration ---------------------------------------------------------------------------------------------
  class pass_range;
  /// Iterates the units in forward order, each gathered while it is current.
  pass_range forward() { return pass_range(this, pass_kind::forward); }
  /// Iterates the units in reverse order, each gathered and with a zeroed gradient buffer while it is current;
  /// a unit's gradient is reduced into its shard as the loop moves past it.
  pass_range backward() { return pass_range(this, pass_kind::backward); }

  // ---- access ------------------------------------------------------------------------------------------------
  std::size_t size() const noexcept { return units_.size(); }
  unit_type& unit(std::size_t i) {
    if (i >= units_.size()) detail::fail_usage("unit index ", i, " is out of range: the model has ", units_.size(), " units");
    return *units_[i];
  }
  unit_type& unit(std::string_view name) {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) detail::fail_usage("no unit named '", name, "'");
    return *units_[it->second];
  }
  const ModelSpec& spec() const noexcept { return spec_; }
  communicator& comm() noexcept { return *comm_; }
  backend_type& backend() noexcept { return *backend_; }
  memory_stats memory() const { return backend_->memory().stats(); }
  int shard_group_size() const noexcept { return shard_world_; }
  std::vector<FlatLayout> layouts() const {
    std::vector<FlatLayout> out;
    for (const auto& u : units_) out.push_back(u->layout());
    return out;
  }

  /// Peak bytes per category this rank will reach, from the layouts and the policy alone.
  memory_figures planned_memory(int optimizer_states) const {
    memory_plan_inputs in;
    in.strategy = facts_of<strategy>(comm_->size());
    in.forward_prefetch = prefetch::forward_depth;
    in.backward_prefetch = prefetch::backward_depth;
    in.optimizer_states = optimizer_states;
    in.compute_bytes = sizeof(typename Policy::precision::compute_type);
    in.reduce_bytes = sizeof(typename Policy::precision::reduce_type);
    return plan_peak_memory(layouts(), in);
  }

  // ---- whole-model operations --------------------------------------------------------------------------------
  /// Collective: every rank receives the full fp32 value of every parameter (aliases included), by name.
  std::map<std::string, std::vector<float>> gather_full_params() {
    require_idle("gather_full_params()");
    std::map<std::string, std::vector<float>> out;
    auto& ag = backend_->gather_stream();
    for (auto& up : units_) {
      unit_type& u = *up;
      const FlatLayout& l = u.layout();
      std::vector<float> full(static_cast<std::size_t>(l.padded_numel()));
      auto tmp = backend_->allocate(l.padded_numel() * 4, mem::comm_buffers);
      backend_->record(u.shard_ready_, backend_->compute_stream());
      backend_->wait(ag, u.shard_ready_);
      if (strategy::shards_params)
        comm_->all_gather(u.master_shard(), tmp.data(), l.shard_numel(), dtype::f32, ag);
      else
        backend_->copy(tmp.data(), u.master_shard(), l.padded_numel() * 4, ag);
      backend_->download(full.data(), tmp.data(), l.padded_numel() * 4, ag);
      backend_->synchronize(ag);
      for (const auto& p : spec_.params()) {
        if (!l.contains(p.name)) continue;
        const flat_entry& e = l.entry(p.name, u.name());
        out[p.name].assign(full.begin() + e.offset, full.begin() + e.offset + e.numel);
      }
    }
    return out;
  }

  /// Sets every gradient shard to zero (after pending reductions finish).
  void zero_grad() {
    require_idle("zero_grad()");
    auto& cs = backend_->compute_stream();
    for (auto& u : units_) {
      backend_->wait(cs, u->reduced_ev_);
      backend_->fill_zero(u->grad_shard(), u->layout().shard_numel() * 4, cs);
    }
  }

  /// Runs f(unit, shard_views) for every unit once all gradients of this iteration are reduced, on the compute
  /// stream's order; the optimizers use it. Throws usage_error if a unit's gradient was not reduced since the
  /// last step (backward missing or unfinished).
  template <class F>
  void step(F&& f) {
    require_idle("an optimizer step");
    for (auto& u : units_)
      if (!u->reduced_since_step_)
        detail::fail_usage("optimizer step before gradients are reduced: unit '", u->name(), "' (index ",
                           u->index(), ") has no gradient reduced since the last step; run model.backward() to "
                           "the end first");
    auto& cs = backend_->compute_stream();
    for (auto& u : units_) backend_->wait(cs, u->reduced_ev_);
    for (auto& u : units_) {
      f(*u, u->shard_views());
      u->reduced_since_step_ = false;
    }
  }

  /// Blocks until all work issued by this rank has finished; rethrows stream errors.
  void synchronize() {
    backend_->synchronize(backend_->gather_stream());
    backend_->synchronize(backend_->reduce_stream());
    backend_->synchronize(backend_->compute_stream());
  }

  // ---- the range returned by forward() / backward() ------------------------------------------------------------
  class pass_range {
   public:
    struct sentinel {};
    class iterator {
     public:
      unit_type& operator*() const { return m_->unit(m_->order_at(pos_)); }
      unit_type* operator->() const { return &**this; }
      iterator& operator++() {
        m_->advance();
        ++pos_;
        return *this;
      }
      bool operator==(sentinel) const noexcept { return pos_ >= m_->size(); }

     private:
      friend class pass_range;
      iterator(Model* m, std::size_t pos) : m_(m), pos_(pos) {}
      Model* m_;
      std::size_t pos_;
    };

    iterator begin() {
      if (started_) detail::fail_usage("a model.", name_of(kind_), "() range can be iterated once");
      started_ = true;
      m_->begin_pass(kind_);
      owns_pass_ = true;  // only a range whose pass began may abandon it
      return iterator(m_, 0);
    }
    sentinel end() const noexcept { return {}; }

    pass_range(const pass_range&) = delete;
    pass_range& operator=(const pass_range&) = delete;
    ~pass_range() {
      if (owns_pass_ && m_->pass_ == kind_) m_->abandon_pass();
    }

   private:
    friend class Model;
    pass_range(Model* m, pass_kind k) : m_(m), kind_(k) {}
    Model* m_;
    pass_kind kind_;
    bool started_ = false;
    bool owns_pass_ = false;
  };

 private:
  // ---- set-up ------------------------------------------------------------------------------------------------
  /// Computes this rank's shard of every parameter on the host (each element from its global index) and
  /// uploads it; allocates the zeroed gradient shard.
  void materialise(unit_type& u, const init::rule& default_init) {
    const FlatLayout& l = u.layout();
    auto& cs = backend_->compute_stream();
    u.master_ = backend_->allocate(l.shard_numel() * 4, mem::sharded_params);
    u.grad_shard_ = backend_->allocate(l.shard_numel() * 4, mem::grads);
    std::vector<float> staging(static_cast<std::size_t>(l.shard_numel()), 0.0f);
    for (const ShardedTensor& v : u.shard_views()) {
      if (v.empty()) continue;
      const ParamSpec& p = spec_.at(v.name);
      init::fill(p.init ? *p.init : default_init, v.name, static_cast<std::uint64_t>(v.begin),
                 static_cast<std::size_t>(v.local_numel()), staging.data() + v.shard_offset);
    }
    backend_->upload(u.master_.data(), staging.data(), l.shard_numel() * 4, cs);
    backend_->fill_zero(u.grad_shard(), l.shard_numel() * 4, cs);
    backend_->synchronize(cs);  // staging goes out of scope
    if (!strategy::shards_params) {  // the master is the full parameter: permanently gathered
      u.full_params_ = u.master_.data();
      u.state_ = unit_state::gathered;
    }
  }

  // ---- passes ------------------------------------------------------------------------------------------------
  std::size_t order_at(std::size_t pos) const noexcept {
    return cur_pass_kind_ == pass_kind::backward ? units_.size() - 1 - pos : pos;
  }

  void require_idle(const char* what) const {
    if (!broken_.empty()) detail::fail_usage(what, " after an abandoned pass: ", broken_);
    if (pass_ != pass_kind::none)
      detail::fail_usage(what, " while model.", name_of(pass_), "() is at unit '", units_[order_at(pos_)]->name(),
                         "'; finish the loop first");
  }

  void begin_pass(pass_kind k) {
    require_idle(k == pass_kind::forward ? "model.forward()" : "model.backward()");
    if (k == pass_kind::backward)
      for (auto& u : units_)
        if (!u->forward_done_)
          detail::fail_usage("backward before forward: unit '", u->name(), "' (index ", u->index(),
                             ") has not run forward since its last backward");
    pass_ = k;
    cur_pass_kind_ = k;
    pos_ = 0;
    enter(order_at(0));
  }

  void advance() {
    if (pass_ == pass_kind::none)
      detail::fail_usage("a model pass iterator was advanced after its pass ended or was abandoned: ", broken_);
    leave(order_at(pos_));
    ++pos_;
    if (pos_ < units_.size())
      enter(order_at(pos_));
    else
      pass_ = pass_kind::none;
  }

  void abandon_pass() noexcept {
    try {
      broken_ = detail::cat("model.", name_of(pass_), "() was left at unit '", units_[order_at(pos_)]->name(),
                            "' (the loop exited early); every pass must visit all units");
    } catch (...) {
    }
    pass_ = pass_kind::none;
  }

  void enter(std::size_t i) {
    unit_type& u = *units_[i];
    const bool fwd = pass_ == pass_kind::forward;  // backward's precondition was checked for every unit in begin_pass
    if constexpr (strategy::shards_params) {
      if (u.state_ == unit_state::sharded) issue_gather(u);
      const int depth = fwd ? prefetch::forward_depth : prefetch::backward_depth;
      for (int k = 1; k <= depth; ++k) {
        const std::ptrdiff_t j = fwd ? std::ptrdiff_t(i) + k : std::ptrdiff_t(i) - k;
        if (j < 0 || j >= std::ptrdiff_t(units_.size())) break;
        if (units_[j]->state_ == unit_state::sharded) issue_gather(*units_[j]);
      }
      if (u.state_ == unit_state::gathering) {
        backend_->wait(backend_->compute_stream(), u.gathered_ev_);
        u.to_gathered();
      }
    }
    if (!fwd) {
      u.full_grad_ = backend_->allocate(u.layout().padded_numel() * 4, mem::comm_buffers);
      backend_->fill_zero(u.full_grad_.data(), u.full_grad_.bytes(), backend_->compute_stream());
    }
    u.enter(pass_);
  }

  void leave(std::size_t i) {
    unit_type& u = *units_[i];
    const bool fwd = pass_ == pass_kind::forward;
    u.leave();
    if (fwd) {
      if constexpr (strategy::shards_params && strategy::reshard_after_forward) release(u);
      return;
    }
    reduce(u);
    if constexpr (strategy::shards_params) release(u);
  }

  void issue_gather(unit_type& u) {
    u.to_gathering();
    const FlatLayout& l = u.layout();
    auto& ag = backend_->gather_stream();
    u.gathered_ = backend_->allocate(l.padded_numel() * 4, mem::gathered_params);
    u.full_params_ = u.gathered_.data();
    backend_->record(u.shard_ready_, backend_->compute_stream());  // after the last optimizer step on the master
    backend_->wait(ag, u.shard_ready_);
    comm_->all_gather(u.master_shard(), u.gathered_.data(), l.shard_numel(), dtype::f32, ag);
    backend_->record(u.gathered_ev_, ag);
  }

  void release(unit_type& u) {
    u.to_sharded();
    backend_->release_after(std::move(u.gathered_), backend_->compute_stream());
    u.full_params_ = nullptr;
  }

  void reduce(unit_type& u) {
    const FlatLayout& l = u.layout();
    auto& rs = backend_->reduce_stream();
    backend_->record(u.grad_ready_, backend_->compute_stream());
    backend_->wait(rs, u.grad_ready_);
    if constexpr (strategy::shards_params) {
      auto out = backend_->allocate(l.shard_numel() * 4, mem::comm_buffers);
      comm_->reduce_scatter(u.full_grad_.data(), out.data(), l.shard_numel(), dtype::f32, opt_.grad_reduce, rs);
      backend_->accumulate(u.grad_shard(), out.template as<float>(), l.shard_numel(), rs);
      backend_->release_after(std::move(out), rs);
    } else {
      comm_->all_reduce(u.full_grad_.data(), u.full_grad_.data(), l.padded_numel(), dtype::f32, opt_.grad_reduce, rs);
      backend_->accumulate(u.grad_shard(), u.full_grad_.template as<float>(), l.padded_numel(), rs);
    }
    backend_->release_after(std::move(u.full_grad_), rs);
    backend_->record(u.reduced_ev_, rs);
  }

  communicator* comm_;
  ModelSpec spec_;
  model_options opt_;
  std::unique_ptr<backend_type> backend_;  // before the units: destroyed after them
  int shard_world_ = 1;
  std::vector<std::unique_ptr<unit_type>> units_;
  std::map<std::string, std::size_t> by_name_;
  pass_kind pass_ = pass_kind::none;
  pass_kind cur_pass_kind_ = pass_kind::none;
  std::size_t pos_ = 0;
  std::string broken_;
};

}  // namespace fsdp
