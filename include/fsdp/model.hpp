#pragma once
// Model<Policy>: the units of one rank and the executor of the scheduler's decisions.
//
// The decisions (which unit to gather, prefetch, wait for, release, reduce, and when) are made by
// sched::scheduler (fsdp/schedule/scheduler.hpp) from the policy's facts and model_options; this class carries
// them out on the backend and the communicator: all-gathers on the backend's gather stream, reductions on its
// reduce stream, events ordering both with the compute stream. The host thread never waits inside a step except
// where the backend's compute stream is the host thread itself (host backend).
//
// Execution order: the forward order of the units is declared (model_options::forward_order), the wrapping order
// by default, or recorded from the first forward pass (model_options::record_order). Backward runs it in reverse.
// Range iteration follows it; units entered by name (pass_range::enter) are checked against it, and the first
// unit out of place is a usage_error.
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
#include "fsdp/observe/trace.hpp"
#include "fsdp/policy.hpp"
#include "fsdp/schedule/scheduler.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/unit/fsdp_unit.hpp"
#include "fsdp/wrap/wrap.hpp"

namespace fsdp {

struct model_options {
  layout_options layout{};
  /// How gradients are combined across ranks: avg (each rank's loss is a mean over its own samples) or sum.
  reduce_op grad_reduce = reduce_op::avg;
  /// The forward order of the units, by name (backward runs it in reverse). Empty: the wrapping order.
  std::vector<std::string> forward_order;
  /// Record the forward order from the first forward pass (units entered by name with pass_range::enter) and
  /// check every later pass against it. Not together with forward_order.
  bool record_order = false;
  /// Per unit name: override the strategy's reshard_after_forward (false keeps the unit gathered from its
  /// forward to its backward; the root unit, last in forward and first in backward, usually should).
  std::map<std::string, bool> reshard_after_forward;
  /// Units gathered or gathering at once, on demand and by prefetch; 0 = no limit. A prefetch waits for a free
  /// slot (it is issued at a later unit); a unit needed for compute with no slot free is a usage_error.
  int gather_slots = 0;
  /// The schedule of prefetch::explicit_schedule: which units to gather when a unit's forward/backward starts.
  prefetch_schedule prefetch;
  /// Where to record the trace and the memory timeline (null: nothing is recorded).
  trace::recorder* recorder = nullptr;
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
      : comm_(&comm), spec_(spec), opt_(std::move(opt)), backend_(make_backend(comm)) {
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
      names_.push_back(plans[i].name);
    }
    init_order();
    sched_ = std::make_unique<sched::scheduler>(names_, schedule_facts());
    check_slots();
    if (auto* rec = opt_.recorder) {
      rec->set_unit_names(names_);
      const int rank = comm.rank();
      backend_->memory().set_listener([rec, rank](const memory_figures& f) { rec->memory(rank, f); });
    }
    reserve_memory(0);
    for (auto& u : units_) materialise(*u, default_init);
  }

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  ~Model() {
    // Streams may still read or write unit buffers (the compute stream too, when it is asynchronous): let them
    // finish before the buffers go. Never throws.
    try {
      backend_->synchronize(backend_->compute_stream());
    } catch (...) {
    }
    try {
      backend_->synchronize(backend_->gather_stream());
    } catch (...) {
    }
    try {
      backend_->synchronize(backend_->reduce_stream());
    } catch (...) {
    }
    backend_->memory().set_listener({});
    units_.clear();
  }

  // ---- iteration ---------------------------------------------------------------------------------------------
  class pass_range;
  /// The forward pass: iterate it (units in the forward order, each gathered while it is current), or enter the
  /// units by name with enter() and close it with finish().
  pass_range forward() { return pass_range(this, pass_kind::forward); }
  /// The backward pass, in reverse forward order: each unit gathered and with a zeroed gradient buffer while it
  /// is current; a unit's gradient is reduced into its shard as the pass moves past it.
  pass_range backward() { return pass_range(this, pass_kind::backward); }

  // ---- access ------------------------------------------------------------------------------------------------
  std::size_t size() const noexcept { return units_.size(); }
  unit_type& unit(std::size_t i) {
    if (i >= units_.size()) detail::fail_usage("unit index ", i, " is out of range: the model has ", units_.size(), " units");
    return *units_[i];
  }
  unit_type& unit(std::string_view name) { return *units_[index_of(name)]; }
  const ModelSpec& spec() const noexcept { return spec_; }
  communicator& comm() noexcept { return *comm_; }
  backend_type& backend() noexcept { return *backend_; }
  memory_stats memory() const { return backend_->memory().stats(); }
  int shard_group_size() const noexcept { return shard_world_; }
  const model_options& options() const noexcept { return opt_; }
  /// Steps begun so far: a forward pass after an optimizer step (or the first one) begins the next.
  std::uint64_t step_count() const noexcept { return step_; }
  std::vector<FlatLayout> layouts() const {
    std::vector<FlatLayout> out;
    for (const auto& u : units_) out.push_back(u->layout());
    return out;
  }
  /// The forward order by unit name: declared, wrapping, or recorded (empty while it is still to be recorded).
  std::vector<std::string> execution_order() const {
    std::vector<std::string> out;
    if (order_known_)
      for (std::size_t i : order_) out.push_back(names_[i]);
    return out;
  }
  /// The facts the scheduler decides from (policy and options, per unit).
  const sched::config& schedule_config() const noexcept { return sched_->facts(); }

  /// The memory planner's prediction for this rank: peak bytes by category and in total, with a printable
  /// table. `optimizer_states`: fp32 values per parameter element the optimizer keeps (its
  /// states_per_element()); `micro_batches`: forward+backward passes per optimizer step.
  memory_plan plan_memory(int optimizer_states, int micro_batches = 1) const {
    memory_plan_inputs in;
    in.schedule = sched_->facts();
    if (order_known_) in.order = order_;
    in.optimizer_states = optimizer_states;
    in.compute_bytes = sizeof(typename Policy::precision::compute_type);
    in.reduce_bytes = sizeof(typename Policy::precision::reduce_type);
    in.micro_batches = micro_batches;
    return fsdp::plan_memory(names_, layouts(), in);
  }
  /// Peak bytes per category (and in total) this rank will reach: plan_memory(...).peak.
  memory_figures planned_memory(int optimizer_states) const { return plan_memory(optimizer_states).peak; }
  /// Reserves the planned peak (plan_memory(optimizer_states, micro_batches).peak.total) in the backend's memory
  /// pool, so that no step allocates from the device (CUDA backend); nothing to do on the host backend. The
  /// constructor reserves for parameters, gradients and gathers; the optimizers call it with their state count.
  void reserve_memory(int optimizer_states, int micro_batches = 1) {
    if constexpr (requires(backend_type& b) { b.reserve(std::int64_t{}); })
      backend_->reserve(plan_memory(optimizer_states, micro_batches).peak.total);
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
      auto tmp = backend_->allocate(l.padded_numel() * 4, mem::comm_buffers, ag);
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
  /// stream's order; the optimizers use it. Units still gathered are released first (their copies would be
  /// stale). Throws usage_error if a unit's gradient was not reduced since the last step (backward missing or
  /// unfinished).
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
    sched_->before_step(executor());
    stamp(cs, trace::kind::optimizer_begin, pass_kind::none, -1);
    for (auto& u : units_) {
      f(*u, u->shard_views());
      u->reduced_since_step_ = false;
      // Gathers wait for this, not for everything on the compute stream: the host may run ahead of compute
      // (a GPU, or a threaded compute stream) and issue the next gathers while earlier units still compute.
      backend_->record(u->shard_ready_, cs);
    }
    stamp(cs, trace::kind::optimizer_end, pass_kind::none, -1);
    step_open_ = false;
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
      unit_type& operator*() const { return m_->current(); }
      unit_type* operator->() const { return &**this; }
      iterator& operator++() {
        m_->advance(nullptr);
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

    /// Range iteration: the units in the pass order.
    iterator begin() {
      if (mode_ != mode::unused) detail::fail_usage("a model.", name_of(kind_), "() range can be iterated once");
      m_->begin_pass(kind_, nullptr);
      mode_ = mode::iterated;
      owns_pass_ = true;  // only a range whose pass began may abandon it
      return iterator(m_, 0);
    }
    sentinel end() const noexcept { return {}; }

    /// Explicit entry: leaves the current unit (if any) and enters `name`, which must be the next unit of the
    /// pass order (declared, wrapping or recorded); while the order is being recorded, any unit not yet entered.
    unit_type& enter(std::string_view name) {
      if (mode_ == mode::iterated)
        detail::fail_usage("model.", name_of(kind_), "(): enter('", name, "') on a range that is being iterated");
      if (mode_ == mode::finished)
        detail::fail_usage("model.", name_of(kind_), "(): enter('", name, "') after finish()");
      if (mode_ == mode::unused) {
        m_->begin_pass(kind_, &name);
        mode_ = mode::named;
        owns_pass_ = true;
      } else {
        m_->advance(&name);
      }
      return m_->current();
    }
    /// Leaves the last unit and ends the pass; every unit must have been entered.
    void finish() {
      if (mode_ != mode::named)
        detail::fail_usage("model.", name_of(kind_), "(): finish() ends a pass whose units were entered by name");
      m_->finish_pass();
      mode_ = mode::finished;
    }

    pass_range(const pass_range&) = delete;
    pass_range& operator=(const pass_range&) = delete;
    ~pass_range() {
      if (owns_pass_ && m_->pass_ == kind_) m_->abandon_pass(mode_ == mode::named);
    }

   private:
    friend class Model;
    enum class mode : std::uint8_t { unused, iterated, named, finished };
    pass_range(Model* m, pass_kind k) : m_(m), kind_(k) {}
    Model* m_;
    pass_kind kind_;
    mode mode_ = mode::unused;
    bool owns_pass_ = false;
  };

 private:
  // ---- set-up ------------------------------------------------------------------------------------------------
  static std::unique_ptr<backend_type> make_backend(communicator& comm) {
    if constexpr (requires { comm.backend_options(); })
      return std::make_unique<backend_type>(comm.rank(), comm.backend_options());
    else
      return std::make_unique<backend_type>(comm.rank());
  }

  std::size_t index_of(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) detail::fail_usage("no unit named '", name, "' (units: ", unit_list(), ")");
    return it->second;
  }
  std::string unit_list() const {
    std::string s;
    for (const auto& n : names_) s += (s.empty() ? "" : ", ") + n;
    return s;
  }

  void init_order() {
    const std::size_t n = units_.size();
    if (opt_.record_order && !opt_.forward_order.empty())
      detail::fail_usage("model_options: forward_order and record_order are exclusive (declare the order or record it)");
    if (opt_.forward_order.empty()) {
      for (std::size_t i = 0; i < n; ++i) order_.push_back(i);
      order_known_ = !opt_.record_order;
      order_source_ = opt_.record_order ? "recorded" : "wrapping";
      if (opt_.record_order) order_.clear();
      return;
    }
    std::vector<bool> seen(n, false);
    for (const auto& name : opt_.forward_order) {
      auto it = by_name_.find(name);
      if (it == by_name_.end())
        detail::fail_usage("model_options::forward_order names '", name, "', which is not a unit (units: ", unit_list(), ")");
      if (seen[it->second]) detail::fail_usage("model_options::forward_order lists unit '", name, "' twice");
      seen[it->second] = true;
      order_.push_back(it->second);
    }
    for (std::size_t i = 0; i < n; ++i)
      if (!seen[i]) detail::fail_usage("model_options::forward_order leaves out unit '", names_[i], "'");
    order_known_ = true;
    order_source_ = "declared";
  }

  sched::config schedule_facts() const {
    const std::size_t n = units_.size();
    sched::config c;
    c.shards_params = strategy::shards_params;
    c.reshard_after_forward.assign(n, strategy::reshard_after_forward);
    for (const auto& [name, value] : opt_.reshard_after_forward) {
      auto it = by_name_.find(name);
      if (it == by_name_.end())
        detail::fail_usage("model_options::reshard_after_forward names '", name, "', which is not a unit (units: ",
                           unit_list(), ")");
      if (!strategy::shards_params)
        detail::fail_usage("model_options::reshard_after_forward is set for unit '", name, "', but ", strategy::name,
                           " never gathers or reshards parameters");
      c.reshard_after_forward[it->second] = value;
    }
    c.forward_depth = prefetch::forward_depth;
    c.backward_depth = prefetch::backward_depth;
    c.post_backward = prefetch::post_backward;
    c.by_schedule = prefetch::by_schedule;
    if constexpr (prefetch::by_schedule) {
      if (opt_.prefetch.empty())
        detail::fail_usage("prefetch::explicit_schedule needs model_options::prefetch to name the units to prefetch");
      c.forward_schedule.resize(n);
      c.backward_schedule.resize(n);
      auto fill = [&](const std::map<std::string, std::vector<std::string>>& from,
                      std::vector<std::vector<std::size_t>>& to, const char* which) {
        for (const auto& [at, list] : from) {
          if (!by_name_.count(at))
            detail::fail_usage("model_options::prefetch.", which, "['", at, "']: no unit named '", at, "' (units: ",
                               unit_list(), ")");
          for (const auto& target : list) {
            if (!by_name_.count(target))
              detail::fail_usage("model_options::prefetch.", which, "['", at, "'] names '", target,
                                 "', which is not a unit (units: ", unit_list(), ")");
            to[by_name_.at(at)].push_back(by_name_.at(target));
          }
        }
      };
      fill(opt_.prefetch.forward, c.forward_schedule, "forward");
      fill(opt_.prefetch.backward, c.backward_schedule, "backward");
    } else if (!opt_.prefetch.empty()) {
      detail::fail_usage("model_options::prefetch names units to prefetch, but the policy's prefetch is not "
                         "prefetch::explicit_schedule (it would be ignored)");
    }
    c.gather_slots = opt_.gather_slots;
    if (c.gather_slots < 0) detail::fail_usage("model_options::gather_slots must be >= 0 (0 = no limit), got ", c.gather_slots);
    return c;
  }

  /// A slot count too small for the policy fails here, before any memory is touched.
  void check_slots() const {
    if (opt_.gather_slots == 0) return;
    try {
      (void)plan_memory(0);
    } catch (const usage_error& e) {
      detail::fail_usage("model_options::gather_slots = ", opt_.gather_slots, " is too few for this policy: ",
                         detail::unprefixed(e));
    }
  }

  /// Computes this rank's shard of every parameter on the host (each element from its global index) and
  /// uploads it; allocates the zeroed gradient shard.
  void materialise(unit_type& u, const init::rule& default_init) {
    const FlatLayout& l = u.layout();
    auto& cs = backend_->compute_stream();
    u.master_ = backend_->allocate(l.shard_numel() * 4, mem::sharded_params, cs);
    u.grad_shard_ = backend_->allocate(l.shard_numel() * 4, mem::grads, cs);
    std::vector<float> staging(static_cast<std::size_t>(l.shard_numel()), 0.0f);
    for (const ShardedTensor& v : u.shard_views()) {
      if (v.empty()) continue;
      const ParamSpec& p = spec_.at(v.name);
      init::fill(p.init ? *p.init : default_init, v.name, static_cast<std::uint64_t>(v.begin),
                 static_cast<std::size_t>(v.local_numel()), staging.data() + v.shard_offset);
    }
    backend_->upload(u.master_.data(), staging.data(), l.shard_numel() * 4, cs);
    backend_->record(u.shard_ready_, cs);
    backend_->fill_zero(u.grad_shard(), l.shard_numel() * 4, cs);
    backend_->synchronize(cs);  // staging goes out of scope
    if (!strategy::shards_params) {  // the master is the full parameter: permanently gathered
      u.full_params_ = u.master_.data();
      u.state_ = unit_state::gathered;
    }
  }

  // ---- passes ------------------------------------------------------------------------------------------------
  unit_type& current() { return *units_[sched::scheduler::unit_at(pass_, order_, pos_)]; }

  void require_idle(const char* what) const {
    if (!broken_.empty()) detail::fail_usage(what, " after an abandoned pass: ", broken_);
    if (pass_ != pass_kind::none)
      detail::fail_usage(what, " while model.", name_of(pass_), "() is at unit '",
                         names_[sched::scheduler::unit_at(pass_, order_, pos_)], "'; finish the pass first");
  }

  void begin_pass(pass_kind k, const std::string_view* name) {
    require_idle(k == pass_kind::forward ? "model.forward()" : "model.backward()");
    if (k == pass_kind::backward)
      for (auto& u : units_)
        if (!u->forward_done_)
          detail::fail_usage("backward before forward: unit '", u->name(), "' (index ", u->index(),
                             ") has not run forward since its last backward");
    if (k == pass_kind::forward && !step_open_) {
      ++step_;
      step_open_ = true;
    }
    recording_ = k == pass_kind::forward && !order_known_;
    if (recording_) order_.clear();
    pass_ = k;
    pos_ = 0;
    try {
      place(name);
    } catch (...) {  // nothing has happened yet: the model stays usable
      pass_ = pass_kind::none;
      if (recording_) order_.clear();
      recording_ = false;
      throw;
    }
    enter_current();
  }

  /// Fixes which unit is at pos_: checks a named entry against the order, or records it.
  void place(const std::string_view* name) {
    if (recording_) {
      std::size_t i = pos_;  // range iteration records the wrapping order
      if (name) {
        i = index_of(*name);
        for (std::size_t j : order_)
          if (j == i)
            detail::fail_usage("model.forward() entered unit '", *name, "' twice while recording the execution order");
      }
      order_.push_back(i);
      return;
    }
    if (!name) return;
    const std::size_t want = sched::scheduler::unit_at(pass_, order_, pos_);
    const std::size_t got = index_of(*name);
    if (got != want) {
      const std::string where = detail::cat("model.", name_of(pass_), "() entered unit '", *name, "' at position ",
                                            pos_, ", where the ", order_source_, " order has '", names_[want], "'");
      detail::fail_usage("execution order differs from the ", order_source_, " order: ", where,
                         " (forward order: ", order_text(), ")");
    }
  }

  std::string order_text() const {
    std::string s;
    for (std::size_t i : order_) s += (s.empty() ? "" : ", ") + names_[i];
    return s;
  }

  void advance(const std::string_view* name) {
    if (pass_ == pass_kind::none)
      detail::fail_usage("a model pass was advanced after it ended or was abandoned", broken_.empty() ? "" : ": ",
                         broken_);
    if (name && pos_ + 1 >= units_.size())
      detail::fail_usage("model.", name_of(pass_), "(): enter('", *name, "') after all ", units_.size(),
                         " units were entered; call finish()");
    leave_current();
    ++pos_;
    if (pos_ < units_.size()) {
      try {
        place(name);
      } catch (const std::exception& e) {  // the pass is half done: it cannot go on
        broken_ = detail::cat("model.", name_of(pass_), "() stopped at position ", pos_, ": ", detail::unprefixed(e));
        pass_ = pass_kind::none;
        if (recording_) order_.clear();
        recording_ = false;
        throw;
      }
      enter_current();
    } else {
      end_pass();
    }
  }

  void finish_pass() {
    if (pass_ == pass_kind::none)
      detail::fail_usage("a model pass was finished after it ended or was abandoned", broken_.empty() ? "" : ": ",
                         broken_);
    if (pos_ + 1 != units_.size()) {
      const std::string missing = recording_ ? first_unrecorded() : names_[sched::scheduler::unit_at(pass_, order_, pos_ + 1)];
      detail::fail_usage("model.", name_of(pass_), "().finish() after ", pos_ + 1, " of ", units_.size(),
                         " units: unit '", missing, "' was not entered");
    }
    leave_current();
    end_pass();
  }

  std::string first_unrecorded() const {
    std::vector<bool> seen(units_.size(), false);
    for (std::size_t i : order_) seen[i] = true;
    for (std::size_t i = 0; i < seen.size(); ++i)
      if (!seen[i]) return names_[i];
    return {};
  }

  void end_pass() {
    if (recording_) {
      order_known_ = true;
      recording_ = false;
    }
    pass_ = pass_kind::none;
  }

  void abandon_pass(bool named) noexcept {
    try {
      broken_ = detail::cat("model.", name_of(pass_), "() was left at unit '", current().name(), "' (",
                            named ? "finish() was not called" : "the loop exited early",
                            "); every pass must visit all units");
    } catch (...) {
    }
    if (recording_) {
      order_.clear();
      recording_ = false;
    }
    pass_ = pass_kind::none;
  }

  void enter_current() {
    sched_->enter(pass_, order_, pos_, executor());
    unit_type& u = current();
    u.enter(pass_);
    stamp(backend_->compute_stream(), trace::kind::compute_begin, pass_, int(u.index()));
  }

  void leave_current() {
    unit_type& u = current();
    stamp(backend_->compute_stream(), trace::kind::compute_end, pass_, int(u.index()));
    u.leave();
    sched_->leave(pass_, order_, pos_, executor());
  }

  // ---- execution of the scheduler's decisions ----------------------------------------------------------------
  auto executor() {
    return [this](sched::op o, std::size_t i, bool ahead) {
      unit_type& u = *units_[i];
      switch (o) {
        case sched::op::gather: issue_gather(u, ahead); break;
        case sched::op::wait:
          backend_->wait(backend_->compute_stream(), u.gathered_ev_);
          u.to_gathered();
          break;
        case sched::op::release: release(u); break;
        case sched::op::alloc_grad:
          u.full_grad_ = backend_->allocate(u.layout().padded_numel() * 4, mem::comm_buffers, backend_->compute_stream());
          backend_->fill_zero(u.full_grad_.data(), u.full_grad_.bytes(), backend_->compute_stream());
          break;
        case sched::op::reduce: reduce(u); break;
      }
    };
  }

  void issue_gather(unit_type& u, bool ahead) {
    u.to_gathering();
    const FlatLayout& l = u.layout();
    auto& ag = backend_->gather_stream();
    u.gathered_ = backend_->allocate(l.padded_numel() * 4, mem::gathered_params, ag);
    u.full_params_ = u.gathered_.data();
    const std::int64_t bytes = l.padded_numel() * 4;
    note(trace::kind::gather_issued, pass_, int(u.index()), bytes, ahead);
    backend_->wait(ag, u.shard_ready_);  // the last write of the master shard (init or optimizer step)
    stamp(ag, trace::kind::gather_begin, pass_, int(u.index()), bytes);
    label(u);
    comm_->all_gather(u.master_shard(), u.gathered_.data(), l.shard_numel(), dtype::f32, ag);
    stamp(ag, trace::kind::gather_end, pass_, int(u.index()), bytes);
    backend_->record(u.gathered_ev_, ag);
  }

  void release(unit_type& u) {
    u.to_sharded();
    note(trace::kind::release, pass_, int(u.index()));
    backend_->release_after(std::move(u.gathered_), backend_->compute_stream());
    u.full_params_ = nullptr;
  }

  void reduce(unit_type& u) {
    const FlatLayout& l = u.layout();
    auto& rs = backend_->reduce_stream();
    constexpr collective kind = strategy::shards_params ? collective::reduce_scatter : collective::all_reduce;
    const std::int64_t bytes = l.padded_numel() * 4;
    note(trace::kind::reduce_issued, pass_, int(u.index()), bytes, false, kind);
    backend_->record(u.grad_ready_, backend_->compute_stream());
    backend_->wait(rs, u.grad_ready_);
    stamp(rs, trace::kind::reduce_begin, pass_, int(u.index()), bytes, kind);
    label(u);
    if constexpr (strategy::shards_params) {
      auto out = backend_->allocate(l.shard_numel() * 4, mem::comm_buffers, rs);
      comm_->reduce_scatter(u.full_grad_.data(), out.data(), l.shard_numel(), dtype::f32, opt_.grad_reduce, rs);
      backend_->accumulate(u.grad_shard(), out.template as<float>(), l.shard_numel(), rs);
      backend_->release_after(std::move(out), rs);
    } else {
      comm_->all_reduce(u.full_grad_.data(), u.full_grad_.data(), l.padded_numel(), dtype::f32, opt_.grad_reduce, rs);
      backend_->accumulate(u.grad_shard(), u.full_grad_.template as<float>(), l.padded_numel(), rs);
    }
    stamp(rs, trace::kind::reduce_end, pass_, int(u.index()), bytes, kind);
    backend_->release_after(std::move(u.full_grad_), rs);
    backend_->record(u.reduced_ev_, rs);
  }

  /// Tells a communicator that keeps one (comm::nccl) which unit the next collective is for, so that a timeout
  /// names it.
  void label(const unit_type& u) {
    if constexpr (requires(communicator& c) { c.label(std::string_view{}); }) comm_->label(u.name());
  }

  // ---- trace -------------------------------------------------------------------------------------------------
  trace::event make_event(trace::kind k, pass_kind p, int unit, std::int64_t bytes, bool ahead, collective c) const {
    trace::event e;
    e.rank = comm_->rank();
    e.what = k;
    e.pass = p;
    e.unit = unit;
    e.step = step_;
    e.bytes = bytes;
    e.ahead = ahead;
    e.coll = c;
    return e;
  }
  /// A host-side event, recorded now.
  void note(trace::kind k, pass_kind p, int unit, std::int64_t bytes = 0, bool ahead = false,
            collective c = collective::all_gather) {
    if (auto* rec = opt_.recorder) rec->record(make_event(k, p, unit, bytes, ahead, c));
  }
  /// A stream-side event, recorded when `s` reaches this point.
  void stamp(stream& s, trace::kind k, pass_kind p, int unit, std::int64_t bytes = 0,
             collective c = collective::all_gather) {
    if (auto* rec = opt_.recorder)
      backend_->host_callback(s, [rec, e = make_event(k, p, unit, bytes, false, c)] { rec->record(e); });
  }

  communicator* comm_;
  ModelSpec spec_;
  model_options opt_;
  std::unique_ptr<backend_type> backend_;  // before the units: destroyed after them
  int shard_world_ = 1;
  std::vector<std::unique_ptr<unit_type>> units_;
  std::vector<std::string> names_;
  std::map<std::string, std::size_t> by_name_;
  std::unique_ptr<sched::scheduler> sched_;
  std::vector<std::size_t> order_;  // forward order (unit indices); partial while recording
  bool order_known_ = false;
  bool recording_ = false;
  const char* order_source_ = "wrapping";
  pass_kind pass_ = pass_kind::none;
  std::size_t pos_ = 0;
  std::uint64_t step_ = 0;
  bool step_open_ = false;
  std::string broken_;
};

}  // namespace fsdp
