#pragma once
// The unit executor: runs the step program (fsdp/plan/detail/program.hpp) for the scheduler's decisions, on a backend
// and a communicator. It decides nothing and describes no order of its own: it composes the parts that do the work,
//
//   detail/exec/unit_storage.hpp  each unit's layout, costs, offload facts and buffers; materialising, the export
//                                 gather
//   detail/exec/interpreter.hpp   the program's actions on the backend and the communicator (the step itself)
//   detail/exec/groups.hpp        the world, shard and replicate communicators
//   detail/exec/diagnostics.hpp   memory errors that name the unit; model_options::check_collectives
//   plan/detail/program.hpp       the one description of the order, which the planners read too
//
// and owns the backend (destroyed last) and the program's state (which slots units hold, the ledgers, no-sync
// accumulators). Model hands it the scheduler's decisions (operator()), the bounds of each unit's compute, and the
// optimizer step, zero_grad and shard replacements, each of which is a part of the program.
//
// The issue of each gather and reduction is a profiler range ("all_gather layers.3", "reduce_scatter layers.3") on a
// backend with the hook (fsdp/observe/ranges.hpp); the trace stamps go through the model's stamper.
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/detail/exec/diagnostics.hpp"
#include "fsdp/detail/exec/groups.hpp"
#include "fsdp/detail/exec/interpreter.hpp"
#include "fsdp/detail/exec/reduction.hpp"
#include "fsdp/detail/exec/unit_storage.hpp"
#include "fsdp/detail/exec/update_site.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/observe/ranges.hpp"
#include "fsdp/observe/stamp.hpp"
#include "fsdp/plan/detail/drive.hpp"

namespace fsdp::detail::exec {

template <Backend B, CollectivePolicy C>
class unit_executor {
 public:
  using backend_type = B;
  using stream = typename B::stream;

  /// `units`, `comm` and `stamp` must outlive the executor. `layouts` in unit-index order; `places`: this rank's
  /// place in the dense and the expert units' shard groups and their divisions; `grad_slots`: gradient slots made
  /// before one is reused; `check_collectives`: model_options::check_collectives; `unit_offload`: each unit's offload
  /// facts (empty: the facts' own for every unit).
  unit_executor(const unit_index& units, C& comm, std::unique_ptr<B> backend, std::vector<FlatLayout> layouts,
                const unit_places& places, const plan::cost_facts& facts, int grad_slots, trace::stamper<B>& stamp,
                bool check_collectives = false, std::vector<offload_facts> unit_offload = {})
      : be_(std::move(backend)),
        st_(std::move(layouts), places, facts, std::move(unit_offload)),
        groups_(comm),
        diag_(units, st_.layouts(), comm.rank(), check_collectives),
        ranges_(units.names()),
        prog_(st_.costs(), st_.offload(), grad_slots, 0, 1, facts.prescales),
        in_(*be_, st_, groups_, diag_, stamp, prog_, grad_slots) {}
  unit_executor(const unit_executor&) = delete;
  unit_executor& operator=(const unit_executor&) = delete;

  /// Waits for every stream before the buffers go (the compute stream too, when it is asynchronous). Never throws.
  ~unit_executor() { synchronize_quietly(); }

  B& backend() noexcept { return *be_; }
  const B& backend() const noexcept { return *be_; }
  /// Hybrid sharding or tensor parallelism: the collectives on the groups a split made (groups::use) from now on.
  /// They must outlive the executor.
  void use_groups(split_groups<C>& g) {
    groups_.use(g);
    prog_.set_replicas(groups_.replicas() ? groups_.replicas()->size() : 1);
  }
  /// Whether each reduced shard is all-reduced across a replicate group (the step program's decision).
  bool replicates() const noexcept { return prog_.replicates(); }
  std::size_t size() const noexcept { return st_.size(); }
  const std::vector<FlatLayout>& layouts() const noexcept { return st_.layouts(); }
  const FlatLayout& layout(std::size_t u) const { return st_.layout(u); }
  const plan::unit_costs& costs(std::size_t u) const { return st_.costs(u); }
  /// The parts unit u keeps in host memory.
  const offload_facts& offload(std::size_t u) const { return st_.offload(u); }
  const plan::cost_facts& facts() const noexcept { return st_.facts(); }
  const unit_buffers<B>& buffers(std::size_t u) const { return st_.buffers(u); }
  /// This rank's place in unit u's shard group (the expert shard group's for an expert unit).
  int shard_rank(std::size_t u) const noexcept { return st_.shard_rank(u); }
  /// The profiler ranges of this rank's units (no-ops on a backend without the hook).
  const trace::ranges<B>& ranges() const noexcept { return ranges_; }
  /// model_options::check_views, from now on (fsdp/unit/tensor_view.hpp).
  void check_views() { st_.check_views(); }

  // ---- the step program, driven by Model ----------------------------------------------------------------------
  /// One of the scheduler's decisions.
  void operator()(sched::op o, std::size_t u, bool ahead, pass_kind pass);
  /// The trainer's work for unit u begins / ends (Model entering and leaving the unit).
  void compute_begin(pass_kind k, std::size_t u);
  void compute_end(pass_kind k, std::size_t u);
  /// Model::step: the optimizer step's order (plan::detail::optimizer_phase, which the planners run too) on this
  /// executor; `update(apply)` calls optimizer_step below.
  template <class OnOp, class Inspect, class Update>
  void optimizer_phase(sched::scheduler& s, const std::vector<std::size_t>& order, OnOp&& on_op, Inspect&& inspect,
                       bool commits, Update&& update) {
    plan::detail::optimizer_phase(s, order, prog_, in_, on_op, inspect, commits, update);
  }
  /// Model::step: the optimizer's updates of every unit where the program puts them (none unless `apply`), each
  /// unit's "shard ready" after its own update, and the step's end.
  void optimizer_step(optimizer_work<B>& work, bool apply);
  /// Model::zero_grad.
  void zero_grads();
  /// Model::replace_shards: before and after the writes.
  void before_shards_replaced();
  void shards_written();

  // ---- outside the step ---------------------------------------------------------------------------------------
  /// Allocates unit u's master and gradient shards and fills the master from the init rule (unit_storage); `spec`
  /// is this rank's (local shapes), `tensor` and `expert` its place in its tensor and expert groups.
  void materialise(std::size_t u, const ModelSpec& spec, const init::rule& default_init, bool master_serves,
                   const tensor_coords& tensor, const expert_coords& expert);
  /// Collective: unit u's full fp32 master on the host of every rank.
  std::vector<float> gather_full(std::size_t u);

  void synchronize();
  /// synchronize() without throwing (destructors).
  void synchronize_quietly() noexcept;

 private:
  std::unique_ptr<B> be_;  // first: destroyed after everything that holds its memory
  unit_storage<B> st_;
  groups<C> groups_;
  diagnostics diag_;
  trace::ranges<B> ranges_;
  plan::detail::step_program prog_;
  interpreter<B, C> in_;
};

// Defined here, not in the class, so that they are not inline: a translation unit that declares the executor's
// instance extern (fsdp/instances.hpp: FSDP_EXTERN_MODEL, separate-compilation mode) does not compile them.
template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::operator()(sched::op o, std::size_t u, bool ahead, pass_kind pass) {
  std::optional<typename trace::ranges<B>::scope> range;
  if (o == sched::op::gather) range.emplace(ranges_, *be_, trace::range_kind::all_gather, static_cast<int>(u));
  if (o == sched::op::reduce) {
    const collective c = plan::reduction_of(st_.facts());
    range.emplace(ranges_, *be_,
                  c == collective::reduce_scatter ? trace::range_kind::reduce_scatter
                  : c == collective::all_reduce   ? trace::range_kind::all_reduce
                                                  : trace::range_kind::all_to_all,
                  static_cast<int>(u));
  }
  prog_.op(o, u, ahead, pass, in_);
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::compute_begin(pass_kind k, std::size_t u) {
  prog_.compute_begin(k, u, in_);
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::compute_end(pass_kind k, std::size_t u) {
  prog_.compute_end(k, u, in_);
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::optimizer_step(optimizer_work<B>& work, bool apply) {
  if (apply && work.state_count != prog_.optimizer_states()) {  // another optimizer: its staging slots
    synchronize();                                              // nothing may still use the old ones
    prog_.set_optimizer_states(work.state_count);
    in_.remake_state_staging();
  }
  in_.use_optimizer(&work);
  try {
    prog_.optimizer_step(in_, apply);
  } catch (...) {
    in_.use_optimizer(nullptr);
    throw;
  }
  in_.use_optimizer(nullptr);
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::zero_grads() {
  prog_.zero_grads(in_);
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::before_shards_replaced() {
  prog_.before_shards_replaced(in_);
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::shards_written() {
  prog_.shards_written(in_);
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::materialise(std::size_t u, const ModelSpec& spec, const init::rule& default_init,
                                      bool master_serves, const tensor_coords& tensor, const expert_coords& expert) {
  st_.materialise(*be_, diag_, u, spec, default_init, master_serves, tensor, expert);
}

template <Backend B, CollectivePolicy C>
std::vector<float> unit_executor<B, C>::gather_full(std::size_t u) {
  return st_.gather_full(*be_, groups_, diag_, u);
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::synchronize() {
  if constexpr (OffloadBackend<B>) be_->synchronize(be_->upload_stream());
  be_->synchronize(be_->gather_stream());
  be_->synchronize(be_->reduce_stream());
  if constexpr (OffloadBackend<B>) be_->synchronize(be_->download_stream());
  if constexpr (OffloadBackend<B>) be_->synchronize(be_->host_work_stream());
  be_->synchronize(be_->compute_stream());
}

template <Backend B, CollectivePolicy C>
void unit_executor<B, C>::synchronize_quietly() noexcept {
  if (!be_) return;
  std::vector<stream*> all{&be_->compute_stream(), &be_->gather_stream(), &be_->reduce_stream()};
  if constexpr (OffloadBackend<B>) {
    all.push_back(&be_->upload_stream());
    all.push_back(&be_->download_stream());
    all.push_back(&be_->host_work_stream());
  }
  for (stream* s : all) {
    try {
      be_->synchronize(*s);
    } catch (...) {
    }
  }
}

}  // namespace fsdp::detail::exec
