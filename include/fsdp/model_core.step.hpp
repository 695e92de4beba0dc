#pragma once
// model_core's whole-model operations and set-up (the class: fsdp/model_core.hpp): zero_grad, synchronize, the
// committed steps, the memory reservation, the collectives' connections, the optimizer step and the groups split
// from the world. Not in the class, so not inline: a translation unit that declares the core's instance extern
// (fsdp/instances.hpp: FSDP_EXTERN_MODEL) does not compile them.
#include "fsdp/model_core.hpp"

namespace fsdp {

template <class B, class C>
void model_core<B, C>::zero_grad() {
  cursor_.require_idle("zero_grad()");
  exec_.zero_grads();
  sched_.restart_window();
}

template <class B, class C>
void model_core<B, C>::synchronize() {
  exec_.synchronize();
  stamp_.flush(backend());
}

template <class B, class C>
std::optional<std::uint64_t> model_core<B, C>::committed_steps() {
  synchronize_quietly();
  if (!cursor_.committed()) return std::nullopt;
  const std::uint64_t n = sched_.completed_steps();
  if constexpr (failing_streams) {
    if (update_marks_) {
      if (backend().failed_before(update_marks_->begun)) return n - 1;
    }
  }
  return n;
}

template <class B, class C>
bool model_core<B, C>::last_update_skipped() {
  synchronize_quietly();
  if constexpr (failing_streams)
    return update_marks_ && backend().failed_before(update_marks_->begun);
  else
    return false;
}

template <class B, class C>
void model_core<B, C>::reserve_memory(int optimizer_states, int norm_rows) {
  connect_collectives(norm_rows);
  if constexpr (ReservingBackend<backend_type>)
    backend().reserve(
        fsdp::plan_memory(units_.index.names(), exec_.layouts(), plan_inputs(optimizer_states, norm_rows)).peak.total);
}

template <class B, class C>
void model_core<B, C>::connect_collectives(int norm_rows) {
  if constexpr (ConnectingCollective<communicator>) {
    std::vector<plan::unit_costs> costs;
    std::vector<bool> expert_units;  // where the expert shard group is made
    for (std::size_t u = 0; u < size(); ++u) {
      costs.push_back(exec_.costs(u));
      expert_units.push_back(groups_.of(mesh_group::expert_shard) && exec_.layout(u).experts());
    }
    plan::group_collectives g =
        plan::step_collectives(costs, exec_.facts(), exec_.replicates(), plan::norm_count(size(), norm_rows),
                               plan::commits(opt_.commit_step, norm_rows), expert_units);
    g.tensor = plan::tensor_collectives(exec_.layouts(), costs);
    std::vector<collective_use> world = g.world;
    if (!groups_.of(mesh_group::shard)) world.insert(world.end(), g.shard.begin(), g.shard.end());  // the world's
    comm_->connect(plan::not_yet(plan::distinct(std::move(world)), connected_.world));
    for (const mesh_group_row& row : mesh_groups)
      if (communicator* c = groups_.of(row.group).get())
        c->connect(plan::not_yet(g.of(row.group), connected_.of(row.group)));
  }
}

template <class B, class C>
void model_core<B, C>::step(detail::exec::optimizer_work<backend_type>& work) {
  cursor_.require_idle("an optimizer step");
  sched_.check_step();
  // plan::detail::optimizer_phase's order; what fails from the inspection on fails the step: before the updates (an
  // inspection or commit whose all-reduce failed) nothing has changed yet; from the updates on they may be partly
  // applied (a retry would apply them twice), or applied but neither counted nor gathered again (ZeRO-1's
  // after_step)
  bool inspected = false, updating = false;
  std::optional<typename trace::ranges<backend_type>::scope> range;  // the inspection and the updates
  try {
    exec_.optimizer_phase(
        sched_, cursor_.order(), executor(),
        [&] {
          inspected = true;
          range.emplace(exec_.ranges(), backend(), trace::range_kind::optimizer, -1);
          return work.inspect ? work.inspect() : true;
        },
        plan::commits(opt_.commit_step, work.inspect ? 1 : 0),
        [&](bool apply) {
          updating = true;
          mark_update();
          exec_.optimizer_step(work, apply);
          if (work.finish) work.finish();
          range.reset();
        });
  } catch (const std::exception& e) {
    if (inspected) cursor_.fail_step(std::string(detail::unprefixed(e)), updating);
    throw;
  }
}

template <class B, class C>
void model_core<B, C>::make_groups(bool replicas) {
  if constexpr (SplittableCollective<communicator>) {
    groups_ = detail::exec::split_world(*comm_, mesh_, replicas);
    exec_.use_groups(groups_);
  }
}

}  // namespace fsdp
