#pragma once
// The narrow interface through which optimizers and checkpoints reach a Model: what a trainer never calls is kept
// off Model's surface (the trainer's: passes, units, views, memory, plans, zero_grad, synchronize). fsdp::optim's
// optimizers and fsdp::checkpoint use it; a user's own optimizer or weights format may too:
//
//   step(model, work)                   an optimizer step: work's inspection, then its update of every unit where
//                                       the step program puts it (fsdp/detail/exec/update_site.hpp)
//   reserve_memory(model, states, rows) the planned peak with an optimizer's state and inspection rows reserved in
//                                       the backend's pool (CUDA), so that no step allocates from the device
//   replace_shards(model, what, write)  between steps, write() overwrites master shards (and optimizer state) on the
//                                       compute stream, after every pending reduction and copy back; gradients are
//                                       zeroed (a checkpoint load, a weight import)
//                                       (with `restores`, a load that overwrites every master shard, and the
//                                       optimizer's state, and so may repair a model that a failed load tore)
//   require_between_steps(model, what)  usage_error naming `what` unless the model is between optimizer steps
//   require_restorable(model, what, r)  the model is between steps, or torn and `r` restores what was torn
//   require_idle(model, what)           usage_error naming `what` while a pass is in progress (or a load tore it)
//   gather_full(model, u)               collective: unit u's full fp32 flat values on every rank
//                                       (fsdp::weights::gather_full_params)
//   synchronize_quietly(model)          waits for every stream without throwing (an optimizer's state going away)
//   require_committed(model, what)      the master shards and optimizer state are the last step's (a survivor's)
//   committed_steps(model)              how many steps that state is (nullopt: none), its streams drained
//   last_update_skipped(model)          the last step's updates never ran (a stream failed before them)
//   forward_order(model)                the forward order by unit index (the wrapping order until one is recorded)
//   costs(model, u)                     what unit u's buffers cost (category, dtype, elements: plan::costs_of)
//   schedule_config(model)              the facts the scheduler decides from (policy and options, per unit)
//   tear_shards(model, what, state)     a load failed after writing part of the shards (and the optimizer's
//                                       state): every later use but a restoring load reports `what`
//   mend_shards(model)                  a restoring load succeeded
//   restore_step_count(model, step)     a checkpoint's step count replaces the model's
//   plan_inputs(model, states, rows),   what the planners read of the model (fsdp/model_plans.hpp: its plans): the
//   unit_names(model), layouts(model)   schedule, order and costs with an optimizer's state and inspection rows; the
//                                       units' names and flat layouts
//   communicators(model)                the communicators the rank holds (world, then shard, replicate, tensor groups)
//   master_shard(unit), grad_shard(unit)
//                                       a unit's fp32 master and gradient shards, writable (a unit gives them to
//                                       anyone to read): the optimizer's update, a load, an import, a reshard
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/detail/exec/update_site.hpp"
#include "fsdp/detail/schedule/pass_cursor.hpp"

namespace fsdp {

struct model_access {
  template <class Unit>
  static float* master_shard(const Unit& u) noexcept {
    return u.writable_master();
  }
  template <class Unit>
  static float* grad_shard(const Unit& u) noexcept {
    return u.writable_grad();
  }
  template <class M>
  static void step(M& m, detail::exec::optimizer_work<typename M::backend_type>& work) {
    m.step(work);
  }
  template <class M>
  static void reserve_memory(M& m, int optimizer_states, int norm_rows = 0) {
    m.reserve_memory(optimizer_states, norm_rows);
  }
  template <class M, class F>
  static void replace_shards(M& m, const char* what, F&& write,
                             detail::sched::restores r = detail::sched::restores::nothing) {
    m.replace_shards(what, std::forward<F>(write), r);
  }
  template <class M>
  static void require_between_steps(const M& m, const char* what) {
    m.require_between_steps(what, detail::sched::restores::nothing);
  }
  template <class M>
  static void require_restorable(const M& m, const char* what, detail::sched::restores r) {
    m.require_between_steps(what, r);
  }
  template <class M>
  static void require_idle(const M& m, const char* what) {
    m.require_idle(what);
  }
  template <class M>
  static std::vector<float> gather_full(M& m, std::size_t u) {
    return m.gather_full(u);
  }
  template <class M>
  static void require_committed(const M& m, const char* what) {
    m.require_committed(what);
  }
  template <class M>
  static std::optional<std::uint64_t> committed_steps(M& m) {
    return m.committed_steps();
  }
  template <class M>
  static bool last_update_skipped(M& m) {
    return m.last_update_skipped();
  }
  template <class M>
  static void synchronize_quietly(M& m) noexcept {
    m.synchronize_quietly();
  }
  template <class M>
  static std::vector<std::size_t> forward_order(const M& m) {
    return m.forward_order();
  }
  template <class M>
  static const auto& costs(const M& m, std::size_t u) {
    return m.costs(u);
  }
  template <class M>
  static const auto& schedule_config(const M& m) noexcept {
    return m.schedule_config();
  }
  template <class M>
  static void tear_shards(M& m, const std::string& what, bool with_state) noexcept {
    m.tear_shards(what, with_state);
  }
  template <class M>
  static void mend_shards(M& m) noexcept {
    m.mend_shards();
  }
  template <class M>
  static void restore_step_count(M& m, std::uint64_t step) {
    m.restore_step_count(step);
  }
  template <class M>
  static auto plan_inputs(const M& m, int optimizer_states, int norm_rows) {
    return m.plan_inputs(optimizer_states, norm_rows);
  }
  template <class M>
  static const auto& unit_names(const M& m) noexcept {
    return m.unit_names();
  }
  template <class M>
  static const auto& layouts(const M& m) noexcept {
    return m.layouts();
  }
  template <class M>
  static auto communicators(const M& m) {
    return m.communicators();
  }
};

}  // namespace fsdp
