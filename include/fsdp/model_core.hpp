#pragma once
// model_core<B, C>: the part of every Model<Policy> that does the work, compiled once per backend and
// communicator (the layers: fsdp/model.hpp). Composed of:
//
//   core/unit_index.hpp              the units by index and by name
//   detail/schedule/config.hpp       the schedule's facts, built once from the policy and model_options
//   detail/schedule/pass_cursor.hpp  the execution order and where the pass in progress is
//   detail/schedule/scheduler.hpp    the decisions (gather, prefetch, wait, release, reduce) and every unit's state
//   detail/exec/unit_executor.hpp    runs the step program (plan/detail/program.hpp) for the decisions on the
//                                    backend and the communicator; owns the buffers
//   memory/cost.hpp                  what every buffer costs, for the executor and the planners alike
//   unit/fsdp_unit.hpp               the view a trainer gets of a unit (basic_unit here; typed in
//                                    fsdp/basic_model.hpp)
//   agree/agree.hpp                  the ranks compare a fingerprint of spec, policy, options and layout at
//                                    construction (one 16-byte all_gather per rank), before anything is allocated
//
// The class and its constructor are here; its passes are defined in fsdp/model_core.passes.hpp, its whole-model
// operations and set-up in fsdp/model_core.step.hpp (included at the end).
//
// The core wires them: a pass moves the cursor and hands each unit's entry and exit to the scheduler, whose
// decisions the executor carries out; an optimizer step (model_access::step) closes the accumulation window.
//
// Observability (fsdp/observe/): the trace stamper notes and stamps what happens when a recorder is given, and
// flushes events timed with the backend's timing marks in synchronize(), before a pass once many are pending, and
// in the destructor; a backend with profiler ranges (NVTX on backend::cuda) gets a range per unit per pass and one
// per optimizer step, whatever the recorder.
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/agree/agree.hpp"
#include "fsdp/backend/concept.hpp"
#include "fsdp/can_implement.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/detail/exec/unit_executor.hpp"
#include "fsdp/detail/schedule/config.hpp"
#include "fsdp/detail/schedule/pass_cursor.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"
#include "fsdp/init/init.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/model_access.hpp"
#include "fsdp/observe/ranges.hpp"
#include "fsdp/observe/stamp.hpp"
#include "fsdp/observe/trace.hpp"
#include "fsdp/options/model_options.hpp"
#include "fsdp/plan/collectives.hpp"
#include "fsdp/plan/memory_plan.hpp"
#include "fsdp/policy.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/unit/fsdp_unit.hpp"

namespace fsdp {

/// The part of every Model<Policy> that depends on the policy's types only through its backend and its
/// communicator: the strategy, prefetch, precision and offload reach it as values (policy_facts), and the compute
/// dtype only in the units' typed views (basic_model, below). Every Model whose policies share those two types
/// shares this code, so a file with many policies (a trainer that picks its strategy and precision from flags)
/// compiles it once per backend and communicator rather than once per policy. A trainer names Model<Policy>;
/// optimizers (fsdp/optim/) and fsdp/instances.hpp are over the core.
///
/// Its destructor is virtual, so a trainer that picks its policy at run time (fsdp::select) can own the model as
/// std::unique_ptr<basic_model<B, C, T>> (any Model<P> with that backend, communicator and compute dtype) beside an
/// optimizer of the core's type (optim::adamw<model_core<B, C>>: what `optim::adamw opt(model, ...)` deduces from
/// it), declared after the model so that it goes first (docs/porting.md, step 3).
template <class B, class C>
class model_core {
 public:
  using core_type = model_core;
  using communicator = C;
  using backend_type = B;
  using stream = typename backend_type::stream;
  static_assert(CollectivePolicy<communicator>, "fsdp::Model: the policy's communicator is not a CollectivePolicy");
  static_assert(Backend<backend_type>,
                "fsdp::Model: the policy's backend does not model fsdp::Backend (backend/concept.hpp)");

  model_core(const model_core&) = delete;
  model_core& operator=(const model_core&) = delete;

 protected:
  /// Builds this rank's units from `bp`, the blueprint of can_implement's checks, which passed.
  /// `bp.spec` is this rank's spec (local shapes under tensor parallelism); `pf` over the data-parallel ranks.
  model_core(communicator& comm, init::rule default_init, const model_options& opt, const policy_facts& pf,
             model_blueprint bp);

 public:
  virtual ~model_core();

  // ---- access ------------------------------------------------------------------------------------------------
  std::size_t size() const noexcept { return units_.index.size(); }
  /// Unit i (or `name`) apart from its compute dtype (basic_model's unit() gives the typed view).
  basic_unit<backend_type>& unit(std::size_t i) { return units_view_[checked_unit(i)]; }
  basic_unit<backend_type>& unit(std::string_view name) { return units_view_[units_.index.at(name)]; }
  /// This rank's spec: under tensor parallelism each split parameter's local shape (its global shape: global_shape
  /// of fsdp/spec/placement.hpp with mesh().tensor).
  const ModelSpec& spec() const noexcept { return spec_; }
  communicator& comm() noexcept { return *comm_; }
  backend_type& backend() noexcept { return exec_.backend(); }
  memory_stats memory() const { return exec_.backend().memory().stats(); }
  /// The host memory domain's figures: offloaded buffers (fsdp/policy/offload.hpp); zero without offload.
  memory_stats host_memory() const {
    if constexpr (OffloadBackend<backend_type>) return exec_.backend().host_memory().stats();
    else return {};
  }
  /// Ranks a dense unit is sharded over (mesh().shards), replicated over (mesh().replicas) and tensor-parallel over
  /// (mesh().tensor; their product is the world), an expert unit's (mesh().expert_shards(), mesh().expert), and
  /// where this rank sits: (mesh().replica(rank), mesh().shard_rank(rank), mesh().tensor_rank(rank),
  /// mesh().expert_rank(rank), mesh().expert_shard_rank(rank)).
  const device_mesh& mesh() const noexcept { return mesh_; }
  /// The communicator of this rank's shard group (all-gathers and reduce-scatters): comm() unless the strategy
  /// shards over fewer ranks than the world (strategy_facts::splits_world: hybrid sharding) or the world has tensor
  /// groups (then the ranks of this tensor rank).
  communicator& shard_comm() noexcept {
    communicator* c = groups_.of(mesh_group::shard).get();
    return c ? *c : *comm_;
  }
  /// The communicator of this rank's tensor group (model_options::tensor_parallel consecutive ranks), for the
  /// trainer's own tensor-parallel collectives, issued on the compute stream so that every rank issues its and the
  /// library's collectives in one order (docs/policies.md); null without tensor parallelism.
  communicator* tensor_comm() noexcept { return groups_.of(mesh_group::tensor).get(); }
  /// The communicator of this rank's replicate group (the all-reduce of reduced shards under hybrid sharding);
  /// null unless the world is split.
  communicator* replicate_comm() noexcept { return groups_.of(mesh_group::replicate).get(); }
  /// The communicator of this rank's expert group (model_options::expert_parallel consecutive data-parallel ranks,
  /// each holding its share of the experts), for the trainer's all_to_all of tokens to their experts and back
  /// (all_to_all_v where the counts are uneven), issued on the compute stream as tensor_comm()'s are; null without
  /// expert parallelism.
  communicator* expert_comm() noexcept { return groups_.of(mesh_group::expert).get(); }
  /// The communicator of this rank's expert shard group (the ranks holding the same experts: an expert unit's
  /// gathers and reductions); null without expert parallelism.
  communicator* expert_shard_comm() noexcept { return groups_.of(mesh_group::expert_shard).get(); }
  const model_options& options() const noexcept { return opt_; }
  /// The policy's choices as values (strategy over this world, prefetch, precision, offload); at compile time they
  /// are facts_of_precision<P::precision>() and facts_of_offload<P::offload>().
  const policy_facts& facts() const noexcept { return facts_; }
  /// Unit u's offloaded parts (the policy's, unless model_options::offload_units overrides them).
  const offload_facts& unit_offload(std::size_t u) const { return exec_.offload(u); }
  /// Steps begun so far: a forward pass after an optimizer step (or the first one) begins the next.
  std::uint64_t step_count() const noexcept { return sched_.step(); }
  /// The forward order by unit name: declared, wrapping, or recorded (empty while it is still to be recorded).
  std::vector<std::string> execution_order() const { return cursor_.execution_order(); }

  // ---- whole-model operations --------------------------------------------------------------------------------
  /// Discards every gradient accumulated since the last step: the gradient shards are set to zero (after pending
  /// reductions finish), no-sync accumulators are freed, and the count of micro-batches starts again.
  void zero_grad();

  /// Blocks until all work issued by this rank has finished; rethrows stream errors. With a recorder, the
  /// stream-side events timed with the backend's timing marks (backend::cuda) enter it here.
  void synchronize();

 private:
  friend struct model_access;  // the optimizers' and checkpoints' protocol (fsdp/model_access.hpp)

  // ---- for fsdp/model_access.hpp --------------------------------------------------------------------------
  /// usage_error unless the model is between optimizer steps: no pass in progress and no gradient reduced (or
  /// accumulated) since the last step; for an operation that overwrites what `r` says, a model that a failed load
  /// left torn is accepted when `r` restores all that was torn (pass_cursor::require_idle). `what` names the
  /// operation in the message ("a checkpoint save").
  void require_between_steps(const char* what, detail::sched::restores r) const {
    cursor_.require_idle(what, r);
    sched_.check_between_steps(what);
  }
  /// usage_error naming `what` unless the master shards and optimizer state are the last completed step's (a pass
  /// abandoned by a failure is accepted): pass_cursor::require_committed.
  void require_committed(const char* what) const { cursor_.require_committed(what); }
  /// The completed steps whose master shards and optimizer state this model holds, once its streams have drained
  /// (a survivor of a failure: fsdp/elastic), or nullopt when they are no completed step's (require_committed
  /// fails). On a backend whose streams can fail (the host's: failed_before), the last step counts only when its
  /// compute stream got to its updates: one that failed before them (a reduction it waited for failed; every
  /// update skipped) leaves the step before.
  std::optional<std::uint64_t> committed_steps();
  /// Whether the last optimizer step's updates never ran (committed_steps left that step out): its optimizer's
  /// count then leaves it out too (steps_if_last_skipped).
  bool last_update_skipped();
  /// Waits for every stream (the copy streams too) without throwing: what an owner of buffers the streams use
  /// (an optimizer's state) calls before they go.
  void synchronize_quietly() noexcept { exec_.synchronize_quietly(); }
  /// usage_error naming `what` while a pass is in progress (or the model is torn: pass_cursor::require_idle).
  void require_idle(const char* what) const { cursor_.require_idle(what); }
  /// Collective: unit u's full fp32 flat values (its master shards all-gathered), on every rank.
  std::vector<float> gather_full(std::size_t u) { return exec_.gather_full(checked_unit(u)); }
  /// What unit u's buffers cost (category, dtype, elements).
  const plan::unit_costs& costs(std::size_t u) const { return exec_.costs(u); }
  /// The facts the scheduler decides from (policy and options, per unit).
  const detail::sched::config& schedule_config() const noexcept { return sched_.facts(); }
  /// The forward order by unit index (the wrapping order while a recorded order is still unknown).
  std::vector<std::size_t> forward_order() const {
    if (cursor_.order_known()) return cursor_.order();
    std::vector<std::size_t> out(size());
    for (std::size_t u = 0; u < out.size(); ++u) out[u] = u;
    return out;
  }

  /// Reserves the planned peak in the backend's memory pool, so that no step allocates from the device (CUDA
  /// backend); nothing to do on the host backend. The constructor reserves for parameters, gradients and
  /// gathers; the optimizers call it with their state count and inspection rows. First, what the collectives of
  /// the step need is made (connect_collectives), so that the pool, which never gives memory back, is taken
  /// after it and not before.
  void reserve_memory(int optimizer_states, int norm_rows = 0);

  /// Hands each group's collectives (fsdp/plan/collectives.hpp: the units' gathers and reductions, the replicas'
  /// all-reduces, the world's one-element all-reduce, the step's commit and, with `norm_rows`, the gradient norms'
  /// all-reduce) to a communicator with connect() (comm::nccl), each list once and only what was not handed over
  /// before: NCCL connects what a collective needs at its first use, which would otherwise be inside step 1, after
  /// the reservation. Collective: every rank calls it at the same point (construction, an optimizer's construction).
  void connect_collectives(int norm_rows);

  /// An optimizer step (through fsdp/model_access.hpp: the optimizers' protocol): once every unit's gradient
  /// is reduced, in the compute stream's order, the optimizer's inspection, then its update of every unit where the
  /// step program puts it (fsdp/detail/exec/update_site.hpp: on the device, at staged copies of host-resident parts, or
  /// in a host function). Units still gathered are released first (their copies would be stale); under ZeRO-1 each is
  /// gathered again right after the update. Throws usage_error if
  /// a unit's gradient was not reduced since the last step (backward missing or unfinished, or micro-batches
  /// missing under no-sync).
  void step(detail::exec::optimizer_work<backend_type>& work);

  /// Between optimizer steps: runs `write()`, which overwrites master shards (and optimizer state) on the compute
  /// stream, after every pending reduction and with every unit released (gathered copies would be stale); later
  /// gathers wait for it. Gradient shards are zeroed and no-sync accumulators freed, as by zero_grad().
  /// `r`: a load that restores every master shard (and the optimizer's state) may repair a torn model
  /// (tear_shards, mend_shards).
  template <class F>
  void replace_shards(const char* what, F&& write, detail::sched::restores r = detail::sched::restores::nothing) {
    require_between_steps(what, r);
    exec_.before_shards_replaced();  // reductions, host updates and copies back of offloaded masters and state
    sched_.before_step(executor());
    std::forward<F>(write)();
    exec_.shards_written();
    exec_.zero_grads();
    sched_.restart_window();
  }
  /// A load that wrote into the shards (and the optimizer's state, `with_state`) failed part way: every later use
  /// but a restoring load reports `what` (pass_cursor::tear).
  void tear_shards(const std::string& what, bool with_state) noexcept { cursor_.tear(what, with_state); }
  /// A restoring load succeeded.
  void mend_shards() noexcept { cursor_.mend(); }
  /// A checkpoint's step count (step_count()) replaces this model's, between steps.
  void restore_step_count(std::uint64_t step) {
    require_between_steps("restore_step_count()", detail::sched::restores::nothing);
    sched_.restore_step(step);
  }

  struct built_units {
    unit_index index;
    std::vector<FlatLayout> layouts;
  };

  // ---- set-up ------------------------------------------------------------------------------------------------
  /// Hybrid sharding (a shard group smaller than the world, of one rank included: `replicas`) or tensor
  /// parallelism: the shard group (ranks of this replica, or all data-parallel ranks, at this tensor rank), the
  /// replicate group (ranks at this shard position and tensor rank) and the tensor group, split from the world in
  /// that order on every rank (detail/exec/groups.hpp); the executor issues on the first two from now on.
  void make_groups(bool replicas);

  static std::unique_ptr<backend_type> make_backend(communicator& comm) {
    static_assert(ConfiguringCollective<communicator> || !requires { comm.backend_options(); },
                  "fsdp::Model: the communicator's backend_options() gives what its backend_type cannot be made from "
                  "(backend_type(rank, options)): return that backend's options, or no backend_options() at all "
                  "(fsdp/comm/concept.hpp's optional capabilities)");
    if constexpr (ConfiguringCollective<communicator>)
      return std::make_unique<backend_type>(comm.rank(), comm.backend_options());
    else
      return std::make_unique<backend_type>(comm.rank());
  }

 protected:
  // ---- passes (for basic_model's pass ranges) -------------------------------------------------------------------
  std::size_t checked_unit(std::size_t i) const {
    if (i >= size()) detail::fail_usage("unit index ", i, " is out of range: the model has ", size(), " units");
    return i;
  }
  /// The unit at the cursor.
  std::size_t current_unit() const { return cursor_.current(); }
  /// A range whose pass began is destroyed while its pass is still the cursor's: the pass is abandoned (entered by
  /// name or iterated).
  void abandon_pass(pass_kind k, bool named);

  void begin_pass(pass_kind k, const std::string_view* name);

  void advance(const std::string_view* name);

  void finish_pass();

 private:
  /// Enters the unit at the cursor. A shortage of gather slots, or a failure of the backend or communicator
  /// (an allocation, an aborted collective), abandons the pass with the reason: what was scheduled before cannot be
  /// undone, and every later use of the model says why.
  void enter_current();

  void leave_current();

  /// Closes the current unit's profiler range, if one is open.
  void end_unit_range() noexcept {
    exec_.ranges().end(backend(), unit_range_);
    unit_range_.reset();
  }

  // ---- for fsdp/model_plans.hpp, through model_access -------------------------------------------------------------
  /// What the planners and the listing read of this model beside its units' names and layouts: its schedule, the
  /// recorded or declared order, its costs, and the optimizer's state and inspection rows.
  memory_plan_inputs plan_inputs(int optimizer_states, int norm_rows) const {
    memory_plan_inputs in;
    in.schedule = sched_.facts();
    if (cursor_.order_known()) in.order = cursor_.order();
    in.costs = exec_.facts();
    in.optimizer_states = optimizer_states;
    in.norm_rows = norm_rows;
    in.commit_step = opt_.commit_step;
    return in;
  }

  const std::vector<std::string>& unit_names() const noexcept { return units_.index.names(); }
  const std::vector<FlatLayout>& layouts() const noexcept { return exec_.layouts(); }
  /// The communicators this rank holds (the world's, then the shard, replicate and tensor groups' where made).
  std::vector<const communicator*> communicators() const {
    std::vector<const communicator*> all{comm_};
    for (const auto& c : groups_.by_group)
      if (c) all.push_back(c.get());
    return all;
  }

  auto executor() {
    return [this](detail::sched::op o, std::size_t u, bool ahead) { exec_(o, u, ahead, cursor_.pass()); };
  }

  communicator* comm_;
  // hybrid sharding or tensor parallelism only (fsdp/core/mesh.hpp's groups); outlive the executor
  detail::exec::split_groups<communicator> groups_;
  ModelSpec spec_;
  model_options opt_;
  policy_facts facts_;
  device_mesh mesh_;
  trace::stamper<backend_type> stamp_;
  built_units units_;
  detail::sched::pass_cursor cursor_;
  detail::sched::scheduler sched_;
  detail::exec::unit_executor<backend_type, communicator> exec_;
  std::vector<basic_unit<backend_type>> units_view_;
  std::optional<std::uint64_t> unit_range_;  // the current unit's profiler range, while one is open
  plan::group_collectives connected_;         // what connect_collectives handed over so far, per group
  // Where the compute stream stood when the last step's updates were issued, on a backend whose streams can fail
  // (the host's): committed_steps() reads it.
  static constexpr bool failing_streams = requires(const backend_type& b, const typename backend_type::event& e) {
    { b.failed_before(e) } -> std::same_as<bool>;
  };
  struct update_marks {
    typename backend_type::event begun;
  };
  std::optional<update_marks> update_marks_;
  void mark_update() {
    if constexpr (failing_streams) {
      if (!update_marks_) update_marks_.emplace();
      backend().record(update_marks_->begun, backend().compute_stream());
    }
  }
};

// Defined here, not in the class, so that they are not inline: a translation unit that declares the core's
// instance extern (fsdp/instances.hpp: FSDP_EXTERN_MODEL; separate-compilation mode) does not compile them.
template <class B, class C>
model_core<B, C>::model_core(communicator& comm, init::rule default_init, const model_options& opt,
                             const policy_facts& pf, model_blueprint bp)
    : comm_(&comm),
      spec_(std::move(bp.spec)),
      opt_(opt),
      facts_(pf),
      mesh_(bp.mesh),
      stamp_(opt_.recorder, comm.rank()),
      units_{std::move(bp.units), std::move(bp.layouts)},
      cursor_(units_.index, opt_.forward_order, opt_.record_order),
      sched_(units_.index, std::move(*bp.schedule)),
      exec_(units_.index, comm, make_backend(comm), units_.layouts,
            detail::exec::places_of(mesh_, comm.rank(), opt_.division),
            plan::make_cost_facts(pf.precision, pf.strategy.shards_params, opt_.accumulation, pf.offload,
                                  detail::exec::division_facts(opt_.division, mesh_.data_parallel()).prescale != 1.0f),
            sched_.facts().grad_slots, stamp_, opt_.check_collectives, sched_.facts().offload) {
  // Before anything is allocated or initialised: every rank built the same model (fsdp/agree/agree.hpp).
  agree::require_agreement(comm, backend(),
                           model_fingerprint(spec_, default_init, units_.index.names(), exec_.layouts(), pf.strategy,
                                             pf.prefetch, pf.precision, opt_, pf.offload),
                           "the model",
                           "Every rank must construct its Model from the same ModelSpec, wrapping policy, "
                           "fsdp::policy, default init rule and model_options");
  backend().memory().reset_peak();  // the comparison's scratch buffers are gone: not part of any step's peak
  if constexpr (OffloadBackend<backend_type>) backend().host_memory().reset_peak();
  if (detail::exec::splits_any(mesh_, pf.strategy.splits_world())) make_groups(pf.strategy.splits_world());
  if (auto* rec = opt_.recorder) {
    rec->set_unit_names(units_.index.names());
    const int rank = comm.rank();
    backend().memory().set_listener([rec, rank](const memory_figures& f) { rec->memory(rank, f); });
  }
  if (opt_.check_views) exec_.check_views();
  reserve_memory(0);
  const bool master_serves = !sched_.facts().gathers;
  const tensor_coords tensor{mesh_.tensor, mesh_.tensor_rank(comm.rank())};
  const expert_coords expert{mesh_.expert, mesh_.expert_rank(comm.rank())};
  for (std::size_t u = 0; u < size(); ++u) exec_.materialise(u, spec_, default_init, master_serves, tensor, expert);
  units_view_.reserve(size());
  for (std::size_t u = 0; u < size(); ++u)
    units_view_.emplace_back(u, exec_.layout(u), exec_.shard_rank(u), sched_, exec_.buffers(u));
}

template <class B, class C>
model_core<B, C>::~model_core() {
  exec_.synchronize_quietly();  // streams may still use unit buffers; errors were reported to whoever waited
  end_unit_range();
  // Timed stream events still pending are recorded now; marks of a stream that never finished cannot be.
  if (const std::size_t dropped = stamp_.close(backend()))
    std::fprintf(stderr,
                 "fsdp: rank %d: %zu stream-side trace events were not recorded: their streams had not reached them "
                 "when the model was destroyed\n",
                 comm_->rank(), dropped);
  backend().memory().set_listener({});
}

}  // namespace fsdp

// The core's other definitions, by job (each includes this header, so either may be included alone), defined out
// of the class for the same reason as the constructor:
#include "fsdp/model_core.passes.hpp"
#include "fsdp/model_core.step.hpp"
