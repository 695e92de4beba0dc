#pragma once
// The pass cursor's definitions (fsdp/detail/schedule/pass_cursor.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/detail/schedule/pass_cursor.hpp"

namespace fsdp::detail::sched {

FSDP_DECL std::vector<std::size_t> pass_cursor::declared_order(const unit_index& units,
                                                               const std::vector<std::string>& forward_order,
                                                               bool record_order, problems& p) {
  const std::size_t n = units.size();
  std::vector<std::size_t> order;
  if (record_order && !forward_order.empty())
    p.add("model_options: forward_order and record_order are exclusive (declare the order or record it)");
  if (forward_order.empty()) return order;
  std::vector<bool> seen(n, false);
  for (const auto& name : forward_order) {
    const auto i = units.find(name);
    if (!i) {
      p.add("model_options::forward_order names '", name, "', which is not a unit (units: ", units.list(), ")");
    } else if (seen[*i]) {
      p.add("model_options::forward_order lists unit '", name, "' twice");
    } else {
      seen[*i] = true;
      order.push_back(*i);
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!seen[i]) p.add("model_options::forward_order leaves out unit '", units.name(i), "'");
  return order;
}

FSDP_DECL pass_cursor::pass_cursor(const unit_index& units, const std::vector<std::string>& forward_order,
                                   bool record_order)
    : units_(&units) {
  problems p;
  order_ = declared_order(units, forward_order, record_order, p);
  p.require();
  if (forward_order.empty()) {
    source_ = record_order ? "recorded" : "wrapping";
    known_ = !record_order;
    if (known_)
      for (std::size_t i = 0; i < units.size(); ++i) order_.push_back(i);
    return;
  }
  known_ = true;
  source_ = "declared";
}

FSDP_DECL std::vector<std::string> pass_cursor::execution_order() const {
  std::vector<std::string> out;
  if (known_)
    for (std::size_t i : order_) out.push_back(units_->name(i));
  return out;
}

FSDP_DECL void pass_cursor::require_idle(const char* what, restores restoring) const {
  if (!torn_.empty()) {
    if (restoring == restores::nothing)
      detail::fail_usage(what, " after ", torn_, "; load a checkpoint first (checkpoint::load",
                         torn_state_ ? ", with the optimizer)" : ")");
    if (torn_state_ && restoring == restores::shards)
      detail::fail_usage(what, " without the optimizer after ", torn_,
                         "; the optimizer's state is torn too: load a checkpoint with the optimizer");
  }
  if (!failed_step_.empty()) detail::fail_usage(what, " after a failed optimizer step: ", failed_step_);
  if (!broken_.empty()) detail::fail_usage(what, " after an abandoned pass: ", broken_);
  if (pass_ != pass_kind::none)
    detail::fail_usage(what, " while model.", name_of(pass_), "() is at unit '", units_->name(current()),
                       "'; finish the pass first");
}

FSDP_DECL void pass_cursor::begin(pass_kind k, const std::string_view* name) {
  require_idle(k == pass_kind::forward ? "model.forward()" : "model.backward()");
  recording_ = k == pass_kind::forward && !known_;
  if (recording_) order_.clear();
  pass_ = k;
  pos_ = 0;
  try {
    place(name);
  } catch (...) {
    pass_ = pass_kind::none;
    if (recording_) order_.clear();
    recording_ = false;
    throw;
  }
}

FSDP_DECL void pass_cursor::check_advance(const std::string_view* name) const {
  if (pass_ == pass_kind::none)
    detail::fail_usage("a model pass was advanced after it ended or was abandoned", broken_.empty() ? "" : ": ",
                       broken_);
  if (name && at_last())
    detail::fail_usage("model.", name_of(pass_), "(): enter('", *name, "') after all ", units_->size(),
                       " units were entered; call finish()");
}

FSDP_DECL bool pass_cursor::next(const std::string_view* name) {
  ++pos_;
  if (pos_ >= units_->size()) {
    end();
    return false;
  }
  try {
    place(name);
  } catch (const std::exception& e) {
    broken_ = detail::cat("model.", name_of(pass_), "() stopped at position ", pos_, ": ", detail::unprefixed(e));
    pass_ = pass_kind::none;
    if (recording_) order_.clear();
    recording_ = false;
    throw;
  }
  return true;
}

FSDP_DECL void pass_cursor::check_finish() const {
  if (pass_ == pass_kind::none)
    detail::fail_usage("a model pass was finished after it ended or was abandoned", broken_.empty() ? "" : ": ",
                       broken_);
  if (!at_last()) {
    const std::string missing =
        recording_ ? first_unrecorded() : units_->name(scheduler::unit_at(pass_, order_, pos_ + 1));
    detail::fail_usage("model.", name_of(pass_), "().finish() after ", pos_ + 1, " of ", units_->size(),
                       " units: unit '", missing, "' was not entered");
  }
}

FSDP_DECL void pass_cursor::end() {
  if (recording_) {
    known_ = true;
    recording_ = false;
  }
  pass_ = pass_kind::none;
}

FSDP_DECL void pass_cursor::fail_step(const std::string& why, bool updating) noexcept {
  update_failed_ = update_failed_ || updating;
  try {
    failed_step_ = why;
  } catch (...) {
  }
}

FSDP_DECL void pass_cursor::require_committed(const char* what) const {
  if (!torn_.empty()) detail::fail_usage(what, " after ", torn_, ": this rank's shards are torn, not its last step's");
  if (update_failed_)
    detail::fail_usage(what, " after an optimizer step that failed during its update (", failed_step_,
                       "): this rank's state may be partly updated, not its last step's");
  if (pass_ != pass_kind::none && broken_.empty())
    detail::fail_usage(what, " while model.", name_of(pass_), "() is at unit '", units_->name(current()),
                       "'; finish the pass first");
}

FSDP_DECL void pass_cursor::tear(const std::string& what, bool with_state) noexcept {
  try {
    torn_ = what;
  } catch (...) {
    torn_ = "a failed load";  // fits the small-string buffer: no allocation
  }
  torn_state_ = with_state;
}

FSDP_DECL void pass_cursor::abandon_with(const std::string& why) {
  broken_ = detail::cat("model.", name_of(pass_), "() stopped at unit '", units_->name(current()), "': ", why);
  if (recording_) {
    order_.clear();
    recording_ = false;
  }
  pass_ = pass_kind::none;
}

FSDP_DECL void pass_cursor::abandon(bool named) noexcept {
  try {
    broken_ =
        detail::cat("model.", name_of(pass_), "() was left at unit '", units_->name(current()), "' (",
                    named ? "finish() was not called" : "the loop exited early", "); every pass must visit all units");
  } catch (...) {
  }
  if (recording_) {
    order_.clear();
    recording_ = false;
  }
  pass_ = pass_kind::none;
}

FSDP_DECL void pass_cursor::place(const std::string_view* name) {
  if (recording_) {
    std::size_t i = pos_;  // range iteration records the wrapping order
    if (name) {
      i = units_->at(*name);
      for (std::size_t j : order_)
        if (j == i)
          detail::fail_usage("model.forward() entered unit '", *name, "' twice while recording the execution order");
    }
    order_.push_back(i);
    return;
  }
  if (!name) return;
  const std::size_t want = scheduler::unit_at(pass_, order_, pos_);
  const std::size_t got = units_->at(*name);
  if (got != want) {
    const std::string where = detail::cat("model.", name_of(pass_), "() entered unit '", *name, "' at position ", pos_,
                                          ", where the ", source_, " order has '", units_->name(want), "'");
    detail::fail_usage("execution order differs from the ", source_, " order: ", where,
                       " (forward order: ", order_text(), ")");
  }
}

FSDP_DECL std::string pass_cursor::order_text() const {
  std::string s;
  for (std::size_t i : order_) s += (s.empty() ? "" : ", ") + units_->name(i);
  return s;
}

FSDP_DECL std::string pass_cursor::first_unrecorded() const {
  std::vector<bool> seen(units_->size(), false);
  for (std::size_t i : order_) seen[i] = true;
  for (std::size_t i = 0; i < seen.size(); ++i)
    if (!seen[i]) return units_->name(i);
  return {};
}

}  // namespace fsdp::detail::sched
