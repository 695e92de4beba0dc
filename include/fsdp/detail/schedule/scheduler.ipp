#pragma once
// The scheduler's definitions (fsdp/detail/schedule/scheduler.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"

namespace fsdp::detail::sched {

FSDP_DECL std::string shortage::message(const unit_index& units) const {
  return detail::cat("gather slots exhausted: unit '", units.name(unit), "' (index ", unit,
                     ") must be gathered for its ", name_of(pass), " but all ", slots, " slots are held by ", holders,
                     "; raise model_options::gather_slots or let those units reshard after forward "
                     "(model_options::reshard_after_forward)");
}

FSDP_DECL scheduler::scheduler(const unit_index& units, config c) : units_(&units), c_(std::move(c)), u_(units.size()) {
  const std::size_t n = units.size();
  if (c_.reshard_after_forward.size() != n || c_.reshard_named.size() != n)
    detail::fail_usage("scheduler: reshard_after_forward and reshard_named have ", c_.reshard_after_forward.size(),
                       " and ", c_.reshard_named.size(), " entries for ", n, " units");
  if (c_.early_grad.size() != n)
    detail::fail_usage("scheduler: early_grad has ", c_.early_grad.size(), " entries for ", n, " units");
  if (c_.by_schedule && (c_.forward_schedule.size() != n || c_.backward_schedule.size() != n))
    detail::fail_usage("scheduler: an explicit prefetch schedule needs one list per unit");
  if (c_.gather_slots < 0) detail::fail_usage("gather_slots must be >= 0 (0 = no limit), got ", c_.gather_slots);
  if (c_.micro_batches < 1) detail::fail_usage("micro_batches must be >= 1, got ", c_.micro_batches);
  if (!c_.gathers)
    for (auto& s : u_) s.params = unit_state::gathered;  // the master is the full parameter
}

FSDP_DECL void scheduler::check_begin(pass_kind k) const {
  if (k != pass_kind::backward) return;
  for (std::size_t u = 0; u < u_.size(); ++u)
    if (!u_[u].forward_done)
      detail::fail_usage("backward before forward: unit '", units_->name(u), "' (index ", u,
                         ") has not run forward since its last backward");
  if (!c_.sync_each_micro_batch && micro_batches_done_ == c_.micro_batches)
    detail::fail_usage("model.backward() would begin micro-batch ", micro_batches_done_ + 1, " of ", c_.micro_batches,
                       " (model_options::accumulation: gradients are reduced in the last micro-batch); run the "
                       "optimizer step first");
}

FSDP_DECL void scheduler::check_step() const {
  for (std::size_t u = 0; u < u_.size(); ++u) {
    if (u_[u].reduced) continue;
    std::string why;
    if (!c_.sync_each_micro_batch && micro_batches_done_ > 0)
      why = detail::cat(" (gradient accumulation: ", micro_batches_done_, " of ", c_.micro_batches,
                        " micro-batches done; gradients are reduced in the last)");
    detail::fail_usage("optimizer step before gradients are reduced: unit '", units_->name(u), "' (index ", u,
                       ") has no gradient reduced since the last step", why, "; run model.backward() to the end first");
  }
}

FSDP_DECL void scheduler::check_between_steps(std::string_view what) const {
  const std::string fix =
      detail::cat(", which ", what, " does not keep; run the optimizer step (and zero_grad()) first");
  for (std::size_t u = 0; u < u_.size(); ++u)
    if (u_[u].reduced)
      detail::fail_usage(what, " between a backward pass and its optimizer step: unit '", units_->name(u), "' (index ",
                         u, ") has a gradient reduced since the last step", fix);
  if (micro_batches_done_ > 0)
    detail::fail_usage(what, " between a backward pass and its optimizer step: ", micro_batches_done_, " of ",
                       c_.micro_batches, " micro-batches have accumulated gradients since the last step", fix);
}

FSDP_DECL std::string scheduler::held_list() const {
  std::string s;
  for (std::size_t u = 0; u < u_.size(); ++u)
    if (u_[u].params != unit_state::sharded) s += (s.empty() ? "'" : ", '") + units_->name(u) + "'";
  return s;
}

}  // namespace fsdp::detail::sched
