#pragma once
// The narrow interface through which optimizers and checkpoints reach a Model: what a trainer never calls is kept
// off Model's surface (the trainer's: passes, units, views, memory, plans, gather_full_params, zero_grad,
// synchronize). fsdp::optim's optimizers and fsdp::checkpoint use it; a user's own optimizer or weights format may
// too:
//
//   step(model, work)                   an optimizer step: work's inspection, then its update of every unit where
//                                       the step program puts it (fsdp/exec/update_site.hpp)
//   reserve_memory(model, states, rows) the planned peak with an optimizer's state and inspection rows reserved in
//                                       the backend's pool (CUDA), so that no step allocates from the device
//   replace_shards(model, what, write)  between steps, write() overwrites master shards (and optimizer state) on the
//                                       compute stream, after every pending reduction and copy back; gradients are
//                                       zeroed (a checkpoint load, a weight import)
//   restore_step_count(model, step)     a checkpoint's step count replaces the model's
#include <cstdint>
#include <utility>

#include "fsdp/exec/update_site.hpp"

namespace fsdp {

struct model_access {
  template <class M>
  static void step(M& m, exec::optimizer_work<typename M::backend_type>& work) {
    m.step(work);
  }
  template <class M>
  static void reserve_memory(M& m, int optimizer_states, int norm_rows = 0) {
    m.reserve_memory(optimizer_states, norm_rows);
  }
  template <class M, class F>
  static void replace_shards(M& m, const char* what, F&& write) {
    m.replace_shards(what, std::forward<F>(write));
  }
  template <class M>
  static void restore_step_count(M& m, std::uint64_t step) {
    m.restore_step_count(step);
  }
};

}  // namespace fsdp
