#pragma once
// What every optimizer over the local shards shares: the pieces each unit's shard is stepped in (one fused launch
// each, with its no-decay mask), state buffers costed by fsdp/memory/cost.hpp and reserved with the model's plan,
// and the step itself:
//
//   inside Model::step (after every reduction): inspect the gradients when asked (fsdp/grad/inspect.hpp), the
//   decision made on the compute stream; run the optimizer's fused update over every piece, which reads the
//   decision there: on a non-finite gradient it changes nothing on any rank (parameters and state bit-unchanged),
//   otherwise it multiplies each gradient by the step's scale (clipping, loss-scale removal). The host learns the
//   decision later (grad::step_report), at the latest before the next step: then the step is counted or not (the
//   update number t of the next one), and the loss scaler is told whether it was skipped. No host synchronize
//   inside the step, on a backend with pinned host memory and done(event); elsewhere the decision is read back
//   in the step (one synchronize).
//
// Where the update runs, per unit, is the step program's choice (fsdp/plan/detail/program.hpp,
// fsdp/policy/offload.hpp): on the compute stream (Backend::for_each); for a unit with params, grads and optimizer
// state offloaded, on the host, in one host function for the unit (the same element function in host loops); for a unit
// with some parts offloaded, on the compute stream over device copies of those parts. The optimizers write their update
// once, as an element function they give the site (fsdp/detail/exec/update_site.hpp: site.run(n, f), their pointers
// through site.at(p)). State buffers live in host memory when the unit's optimizer state is offloaded.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/detail/exec/slot_ring.hpp"
#include "fsdp/detail/exec/update_site.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/grad/loss_scaler.hpp"
#include "fsdp/kernels/host_loops.hpp"
#include "fsdp/layout/sharded_tensor.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/model_access.hpp"
#include "fsdp/optim/detail/pieces.hpp"
#include "fsdp/optim/detail/step_block.hpp"

namespace fsdp::optim::detail {

namespace exec = fsdp::detail::exec;  // the executor (fsdp/detail/exec/)

/// The type an optimizer is over: a Model's core (fsdp::model_core, whose code every policy with the same backend
/// and communicator shares), or the type itself when it has none.
template <class M>
struct core_of {
  using type = M;
};
template <class M>
  requires requires { typename M::core_type; }
struct core_of<M> {
  using type = typename M::core_type;
};
template <class M>
using core_of_t = typename core_of<M>::type;

struct replay_access;

template <class ModelT>
class shard_optimizer {
  friend struct replay_access;

 public:
  using backend_type = typename ModelT::backend_type;
  using buffer = typename backend_type::buffer;

  /// fp32 values of optimizer state per parameter element (for the memory planner).
  int states_per_element() const noexcept { return states_; }
  /// Rows of the gradient inspection buffer (for the memory planner; 0 without inspection).
  int norm_rows() const noexcept { return grad_.rows(model_.comm().size()); }
  const grad::options& grad_options() const noexcept { return grad_; }

  // ---- the optimizer's state, for checkpoints and tools ---------------------------------------------------------
  /// "adamw", "sgd", or a user's optimizer's own name (optim::elementwise): what a checkpoint records and a load
  /// checks.
  std::string_view name() const noexcept { return name_; }
  /// The states' names, in state order ("exp_avg", "exp_avg_sq" for adamw; "momentum_buffer" for sgd with momentum).
  const std::vector<std::string>& state_names() const noexcept { return names_; }
  /// Updates applied so far (steps the gradient inspection skipped are not counted). The last step's decision is
  /// learned first (waiting for it when the compute stream has not passed it yet).
  long steps() const {
    settle_pending();
    learn_replays();
    return steps_;
  }
  /// State buffer k of unit u: backend memory of the unit's shard_numel fp32 values, laid out as the master shard
  /// (model.unit(u).shard_views() says which elements of which parameter sit where; padding stays zero).
  const float* state(std::size_t u, int k) const {
    return state_[checked(u, k)][static_cast<std::size_t>(k)].template as<float>();
  }
  float* state(std::size_t u, int k) { return state_[checked(u, k)][static_cast<std::size_t>(k)].template as<float>(); }
  /// This rank's part of state `state_name` of parameter `param` (an alias resolves to its target): which global
  /// elements ([view.begin, view.end), possibly none; under tensor parallelism, of the rank's local tensor:
  /// for_each_global_run maps them) and where they are (backend memory, view.local_numel() values).
  struct state_part {
    ShardedTensor view;
    float* data = nullptr;
  };
  state_part state(std::string_view param, std::string_view state_name) {
    const auto k = std::find(names_.begin(), names_.end(), state_name);
    if (k == names_.end())
      fsdp::detail::fail_usage(name_, " has no state named '", state_name, "' (", states_text(), ")");
    for (std::size_t u = 0; u < model_.size(); ++u) {
      const FlatLayout& l = model_.unit(u).layout();
      if (!l.contains(std::string(param))) continue;
      const std::string& stored = l.entry(std::string(param)).name;
      for (const ShardedTensor& v : model_.unit(u).shard_views())
        if (v.name == stored) return {v, state(u, static_cast<int>(k - names_.begin())) + v.shard_offset};
    }
    fsdp::detail::fail_usage("no parameter named '", param, "' in the model");
  }
  /// The update count when the last step's updates never ran (its compute stream failed before them:
  /// model_access::last_update_skipped; a survivor of a failure, fsdp/elastic): without that step, and without
  /// waiting for its decision, which never arrives.
  long steps_if_last_skipped() const noexcept {
    return deferred && pending_ && pending_->settled ? steps_ : steps_ - 1;  // a replay's report counts nothing
  }
  /// A checkpoint's update count replaces this optimizer's (the loader also writes the state buffers).
  void restore_steps(long steps) {
    if (steps < 0) fsdp::detail::fail_usage(name_, ": restore_steps(", steps, "): the count must be >= 0");
    settle_pending();
    auto& be = model_.backend();
    be.for_each(1, set_updates{block(), steps}, be.compute_stream());
    steps_ = steps;
  }
  void zero_grad() { model_.zero_grad(); }
  /// With a loss scaler: the step's loss scale in the backend's memory, which a trainer whose step is captured
  /// (fsdp::step_graph) multiplies its loss gradient by in a kernel (each replay's own); null without one. An eager
  /// trainer may read the host scaler's scale() instead: the same value.
  const float* loss_scale_on_device() const noexcept {
    return grad_.scaler ? &step_block_.template as<step_block>()->loss_scale : nullptr;
  }

 protected:
  /// Allocates and zeroes `states` fp32 buffers per unit, after reserving the model's planned peak with them.
  shard_optimizer(ModelT& model, std::string name, std::vector<std::string> state_names, const grad::options& g)
      : model_(model), states_(static_cast<int>(state_names.size())), grad_(g), name_(std::move(name)),
        names_(std::move(state_names)) {
    grad::check(g);
    model_access::reserve_memory(model, states_, norm_rows());
    auto& be = model.backend();
    if constexpr (deferred) {
      if (grad_.inspects()) {
        const plan::buffer_cost n = plan::norm_buffer_cost(model.size(), norm_rows());
        norms_ = exec::allocate(be, n, be.compute_stream());
        const plan::buffer_cost c = plan::decision_copy_cost(model.size(), norm_rows());
        decision_copy_ = be.allocate_host(c.bytes(), c.category);
      }
    }
    step_block_ = exec::allocate(be, plan::step_block_cost(), be.compute_stream());
    exec::zero_new(be, step_block_, plan::step_block_cost(), be.compute_stream());
    if (g.scaler) be.for_each(1, set_scale{block(), {g.scaler->scale(), g.scaler->good_steps()}}, be.compute_stream());
    for (std::size_t u = 0; u < model.size(); ++u) {
      pieces_.push_back(masked_pieces(model.unit(u).shard_views(), model.unit(u).layout().shard_numel()));
      const plan::buffer_cost c = plan::optimizer_state_cost(model.unit(u).layout(), 1, model.unit_offload(u));
      std::vector<buffer> s;
      for (int k = 0; k < states_; ++k) {
        s.push_back(exec::allocate(be, c, be.compute_stream()));
        exec::zero_new(be, s.back(), c, be.compute_stream());
      }
      state_.push_back(std::move(s));
    }
    require_device_access(model, g);
  }
  /// Waits for every stream of the model before its state buffers go: the compute stream may be asynchronous,
  /// and offloaded state is used on the copy streams after step() returns. A step_report still waiting gets its
  /// report now (its host copy goes with the optimizer). The model must outlive the optimizer.
  ~shard_optimizer() {
    model_access::synchronize_quietly(model_);
    try {
      settle_pending();
    } catch (...) {  // the streams failed: the report says nothing more than their errors did (settle_pending)
    }
  }
  shard_optimizer(const shard_optimizer&) = delete;
  shard_optimizer& operator=(const shard_optimizer&) = delete;


  /// Where an update finds the step's gradient scale: a value (no inspection, or a decision read back on the host),
  /// or the decision itself (grad::verdict), in the backend's memory for the device and in its pinned host copy for
  /// a host step, which the update functions read (and do nothing when it skipped the step).
  struct gradient_scale {
    float value = 1.0f;
    const grad::verdict* device = nullptr;
    const grad::verdict* host = nullptr;
  };

  /// One step: update(unit, piece, scale, site) for every piece of every unit, unless the inspection skips it. `site`
  /// (exec::update_site: on the device, at staged copies of host-resident parts, or on the host, as the step program
  /// puts the unit) runs the optimizer's element function: site.run(n, f), its pointers through site.at(p). The
  /// last step's decision is learned first: its count (the t this step's make() gets) and the loss scaler's scale.
  template <class Update>
  grad::step_report run_step(Update&& update) {
    settle_pending();
    // An eager step's loss scale is the host scaler's (a checkpoint may have restored it), written where the
    // inspection and the count read it; a captured one carries the device's from replay to replay.
    if (grad_.scaler && !fsdp::capturing(model_.backend())) {
      auto& be = model_.backend();
      be.for_each(1, set_scale{block(), {grad_.scaler->scale(), grad_.scaler->good_steps()}}, be.compute_stream());
    }
    if (!grad_.inspects()) {
      exec::optimizer_work<backend_type> work = work_for();
      work.update = [&](std::size_t u, exec::update_site<backend_type>& site) {
        for (const shard_piece& piece : pieces_[u]) update(model_.unit(u), piece, gradient_scale{}, site);
      };
      model_access::step(model_, work);
      issue_count(nullptr);
      if (fsdp::capturing(model_.backend())) {
        grad::report r;
        r.captured = true;
        return grad::step_report(r);
      }
      ++steps_;
      return grad::step_report(grad::report{});
    }
    if constexpr (deferred) {
      return deferred_step(std::forward<Update>(update));
    } else {
      grad::report r;
      exec::optimizer_work<backend_type> work = work_for();
      work.inspect = [this, &r] {
        r = grad::inspect(model_, grad_, backward_order());
        return !r.skipped;
      };
      work.update = [&](std::size_t u, exec::update_site<backend_type>& site) {
        for (const shard_piece& piece : pieces_[u]) update(model_.unit(u), piece, gradient_scale{r.grad_scale}, site);
      };
      model_access::step(model_, work);
      issue_count(nullptr, r.skipped);
      if (!r.skipped) ++steps_;
      if (grad_.scaler) grad_.scaler->update(r.skipped);
      return grad::step_report(std::move(r));
    }
  }

  ModelT& model_;

  /// The step block (fsdp/optim/detail/step_block.hpp): backend memory.
  step_block* block() noexcept { return step_block_.template as<step_block>(); }

 private:
  /// The step's last kernel: the device's count of updates, one more unless `decided` (null: `skipped`, known on the
  /// host) skipped the step. After every update that reads the step's rule, in the compute stream's order.
  void issue_count(const grad::verdict* decided, bool skipped = false) {
    auto& be = model_.backend();
    detail::count_update f{block(), decided, skipped};
    if (grad_.scaler) {
      f.scales = true;
      f.scaling = grad_.scaler->options();
    }
    be.for_each(1, f, be.compute_stream());
  }

  /// Decides on the device and learns later: a backend with pinned host memory and done(event).
  static constexpr bool deferred = OffloadBackend<backend_type> && PollingBackend<backend_type>;

  std::vector<std::size_t> backward_order() const {
    std::vector<std::size_t> backward = model_access::forward_order(model_);
    std::reverse(backward.begin(), backward.end());
    return backward;
  }

  /// The step with its decision made on the compute stream (grad::issue_inspection) into the inspection's buffer
  /// (the optimizer's, for its whole life), which the updates read; the decision copied to the pinned host copy, and
  /// an event recorded after it (a host step's updates wait for it; the host learns from it). A captured step
  /// (Backend::capturing) reports nothing: its replays decide on the device, and the host learns their count after
  /// them (learn_replays).
  template <class Update>
  grad::step_report deferred_step(Update&& update) {
    auto& be = model_.backend();
    auto& cs = be.compute_stream();
    const plan::buffer_cost cost = plan::norm_buffer_cost(model_.size(), norm_rows());
    const bool captured = fsdp::capturing(be);
    exec::optimizer_work<backend_type> work = work_for();
    work.inspect = [&] {
      grad::issue_inspection(model_, grad_, norms_.data(), &block()->loss_scale);
      be.download(decision_copy_.data(), norms_.data(), cost.bytes(), cs);  // pinned: asynchronous
      be.record(decided_, cs);
      // A failure the stream already knows (its collective aborted, on a stream that runs as it is issued) fails
      // the step here, as a wait would have; done() never waits.
      if (!captured) (void)be.done(decided_);
      return true;  // every update runs, and reads the decision
    };
    work.decided = &decided_;
    work.finish = [&] { issue_count(norms_.template as<grad::verdict>()); };  // after every update that reads it
    work.update = [&](std::size_t u, exec::update_site<backend_type>& site) {
      const gradient_scale g{1.0f, norms_.template as<grad::verdict>(), decision_copy_.template as<grad::verdict>()};
      for (const shard_piece& piece : pieces_[u]) update(model_.unit(u), piece, g, site);
    };
    model_access::step(model_, work);
    if (captured) {  // each replay decides on the device (replayed())
      grad::report r;
      r.inspected = true;
      r.captured = true;
      return grad::step_report(r);
    }
    std::shared_ptr<grad::pending_decision> p = decision_on_its_way();
    p->settled = [this](const grad::report& r) {
      if (!r.skipped) ++steps_;
      if (grad_.scaler) grad_.scaler->update(r.skipped);
    };
    pending_ = p;
    if (grad_.scaler) grad_.scaler->await([p] { p->resolve(); });
    return grad::step_report(std::move(p));
  }

  /// The decision of the step last issued on the compute stream, from the host copy once the stream has passed
  /// `decided_` (recorded after the copy); the units' order and names as they are now.
  std::shared_ptr<grad::pending_decision> decision_on_its_way() {
    auto p = std::make_shared<grad::pending_decision>();
    p->arrived = [this] { return model_.backend().done(decided_); };
    p->wait = [this] { model_.backend().synchronize(model_.backend().compute_stream()); };
    p->read = [this, n = model_.size(), rows = norm_rows(), world = model_.comm().size(), backward = backward_order()] {
      grad::verdict v;
      std::memcpy(&v, decision_copy_.data(), sizeof v);
      std::vector<std::string> names;
      for (std::size_t u = 0; u < n; ++u) names.push_back(model_.unit(u).name());
      return grad::report_of(v, decision_copy_.template as<float>() + plan::verdict_slots, rows, world, n, backward,
                             names);
    };
    return p;
  }

  /// Before a replay of a captured step (fsdp::step_graph): the replay overwrites the host copy of the decision, so
  /// the last step's report is read now (waiting for its decision) where it must be: an eager step's (it counts the
  /// step), or a replay's that a trainer still holds. A replay's that nobody holds is let go unread.
  void before_replay() {
    if (pending_ && !pending_->settled && pending_.use_count() == 1)
      pending_.reset();
    else
      settle_pending();
  }

  /// After a replay was issued: its report, on its way as an eager step's (ready() once the compute stream has passed
  /// the decision). The replay counted itself and moved the loss scale on the device, which the host learns from the
  /// device (learn_replays), so reading the report changes nothing here.
  grad::step_report replayed() {
    if (!grad_.inspects()) return grad::step_report(grad::report{});
    static_assert(deferred,
                  "fsdp::step_graph: a backend that captures steps decides on the device and lets the host learn the "
                  "decision later: it needs pinned host memory and done(event) (OffloadBackend, PollingBackend)");
    auto& be = model_.backend();
    be.record(decided_, be.compute_stream());  // after the whole replay, its copy of the decision included
    pending_ = decision_on_its_way();
    return grad::step_report(pending_);
  }

  /// After replays of a captured step (a backend that counts them: backend::host::replays), which the host issued
  /// once: the update count the device kept (one synchronize of the compute stream).
  void learn_replays() const {
    if constexpr (requires(const backend_type& b) { b.replays(); }) {
      auto& be = model_.backend();
      if (be.replays() == replays_seen_) return;
      be.synchronize(be.compute_stream());
      step_block b;
      be.download(&b, step_block_.data(), sizeof b, be.compute_stream());
      be.synchronize(be.compute_stream());  // pageable: valid once the stream has passed the copy (backend::cuda)
      steps_ = static_cast<long>(b.updates);
      if (grad_.scaler) grad_.scaler->restore(b.loss_scale, b.good_steps);
      replays_seen_ = be.replays();
    }
  }

  /// Learns the last step's decision (waiting for it when it has not arrived) and lets it go. When it cannot (the
  /// stream failed first), a step_report still held is orphaned before the error goes on: asking it throws what
  /// happened, and it never reaches this optimizer again, which may be gone by then.
  void settle_pending() const {
    if (!pending_) return;
    const std::shared_ptr<grad::pending_decision> p = std::move(pending_);
    pending_.reset();
    if (grad_.scaler) grad_.scaler->await({});
    try {
      p->resolve();
    } catch (const std::exception& e) {
      p->orphan(fsdp::detail::cat("optimizer '", name_, "': its step's decision was never read (", e.what(), ")"));
      throw;
    } catch (...) {
      p->orphan(fsdp::detail::cat("optimizer '", name_, "': its step's decision was never read"));
      throw;
    }
  }

  /// A step's work but its inspection and update: the state buffers. Apart from run_step, so that this
  /// std::function target is compiled once per model type, not once per optimizer rule as well.
  exec::optimizer_work<backend_type> work_for() {
    exec::optimizer_work<backend_type> work;
    work.state_count = states_;
    work.states = [this](std::size_t u) {
      std::vector<float*> out;
      for (auto& b : state_[u]) out.push_back(b.template as<float>());
      return out;
    };
    return work;
  }

  /// The inspection's norms over offloaded gradient shards read them in place: a backend whose device addresses
  /// its host memory (every device with unified addressing; not the simulated GPU).
  static void require_device_access(ModelT& model, const grad::options& g) {
    if constexpr (HostMappingBackend<backend_type>) {
      for (std::size_t u = 0; u < model.size(); ++u)
        if (model.unit_offload(u).grads && g.inspects() && !model.backend().host_memory_on_device())
          fsdp::detail::fail_usage("unit '", model.unit(u).name(), "' offloads ", describe(model.unit_offload(u)),
                                   ": the gradient inspection's norms run on the device and read the offloaded "
                                   "gradient shards in place, but this device cannot address pinned host memory (no "
                                   "unified addressing): keep the gradients on the device, or inspect no gradients "
                                   "(no clipping, non-finite checks or loss scaling)");
    }
  }

  std::size_t checked(std::size_t u, int k) const {
    if (u >= state_.size() || k < 0 || k >= states_)
      fsdp::detail::fail_usage(name_, ": state ", k, " of unit ", u, " does not exist (", state_.size(), " units; ",
                               states_text(), ")");
    return u;
  }
  std::string states_text() const {
    if (names_.empty()) return "it keeps no state";
    std::string s = "its states: ";
    for (std::size_t k = 0; k < names_.size(); ++k) s += (k ? ", " : "") + std::to_string(k) + " '" + names_[k] + "'";
    return s;
  }

  int states_;
  grad::options grad_;
  std::string name_;
  std::vector<std::string> names_;
  mutable long steps_ = 0;                        // updates applied, as the host knows them
  mutable std::uint64_t replays_seen_ = 0;        // the backend's replays when steps_ was last learned
  std::vector<std::vector<shard_piece>> pieces_;  // per unit: one fused launch each
  std::vector<std::vector<buffer>> state_;        // per unit: states_ buffers of shard_numel fp32 values
  buffer step_block_;                             // the device's update count and the step's rule
  buffer norms_;                                  // the inspection's buffer: its decision, then the norms
  buffer decision_copy_;                          // pinned: the host's copy of the inspection's buffer
  typename backend_type::event decided_;          // on the compute stream, after that copy
  mutable std::shared_ptr<grad::pending_decision> pending_;  // the last step's decision, until it is learned
};

/// fsdp::step_graph's way to an optimizer around each replay (the optimizer's own reach, not its public surface).
struct replay_access {
  template <class M>
  static void before(shard_optimizer<M>& opt) {
    opt.before_replay();
  }
  template <class M>
  static grad::step_report after(shard_optimizer<M>& opt) {
    return opt.replayed();
  }
};

}  // namespace fsdp::optim::detail
