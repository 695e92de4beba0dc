#pragma once
// The execution order of the units and the cursor of the pass in progress.
//
// The forward order is declared (model_options::forward_order), the wrapping order by default, or recorded from
// the first forward pass (model_options::record_order); backward runs it in reverse. A pass begins, advances one
// unit at a time (range iteration, or a unit entered by name, checked against the order or recorded), and
// finishes once every unit was visited. A pass left early is abandoned: the model then refuses every later use,
// naming where it was left; so does a model whose shards a load left torn (a checkpoint load in place that failed
// part way), until a load restores them. The cursor decides nothing about memory or collectives (the scheduler
// does) and keeps no unit state (the scheduler does): only which unit of which pass is current.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/schedule/scheduler.hpp"
#include "fsdp/core/unit_state.hpp"
#include "fsdp/core/unit_index.hpp"

namespace fsdp::sched {

/// What an operation overwrites, for pass_cursor::require_idle: nothing (it reads the model or trains it), every
/// master shard, or every master shard and the optimizer's state.
enum class restores : std::uint8_t { nothing, shards, shards_and_state };

class pass_cursor {
 public:
  /// The declared forward order of `units` (model_options::forward_order, record_order): unit indices, empty when
  /// none is declared; each mistake in the options goes to `p`, naming the unit at fault.
  static std::vector<std::size_t> declared_order(const unit_index& units, const std::vector<std::string>& forward_order,
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

  /// `units` must outlive the cursor. Checks the order options (usage_error naming the unit at fault).
  pass_cursor(const unit_index& units, const std::vector<std::string>& forward_order, bool record_order)
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

  /// The forward order (unit indices) known so far: partial while it is being recorded.
  const std::vector<std::size_t>& order() const noexcept { return order_; }
  bool order_known() const noexcept { return known_; }
  /// The forward order by unit name (empty while it is still to be recorded).
  std::vector<std::string> execution_order() const {
    std::vector<std::string> out;
    if (known_)
      for (std::size_t i : order_) out.push_back(units_->name(i));
    return out;
  }

  pass_kind pass() const noexcept { return pass_; }
  std::size_t pos() const noexcept { return pos_; }
  /// The unit at the cursor (a pass must be in progress).
  std::size_t current() const { return scheduler::unit_at(pass_, order_, pos_); }
  bool at_last() const noexcept { return pos_ + 1 >= units_->size(); }

  /// usage_error unless no pass is in progress and none was abandoned (nor an optimizer step failed, nor a load
  /// left the shards torn). `restoring`: the caller overwrites every master shard (and, with
  /// restores::shards_and_state, the optimizer's state), which a torn model accepts when it covers what was torn.
  void require_idle(const char* what, restores restoring = restores::nothing) const {
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

  /// Places the first unit of a pass of kind `k` (entered by `name`, or the first in the order). A mistake
  /// throws and leaves the cursor as it was: nothing has happened yet.
  void begin(pass_kind k, const std::string_view* name) {
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

  /// Checks that the pass can move on to `name` (or the next unit): usage_error otherwise, nothing changed.
  void check_advance(const std::string_view* name) const {
    if (pass_ == pass_kind::none)
      detail::fail_usage("a model pass was advanced after it ended or was abandoned", broken_.empty() ? "" : ": ",
                         broken_);
    if (name && at_last())
      detail::fail_usage("model.", name_of(pass_), "(): enter('", *name, "') after all ", units_->size(),
                         " units were entered; call finish()");
  }
  /// Moves to the next position (after the current unit was left): true with a unit placed there, false when the
  /// pass is complete (it has ended). A misplaced named unit breaks the pass: the units before it were already
  /// left, so it cannot go on.
  bool next(const std::string_view* name) {
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

  /// usage_error unless the current unit is the pass's last (finish() of a pass entered by name).
  void check_finish() const {
    if (pass_ == pass_kind::none)
      detail::fail_usage("a model pass was finished after it ended or was abandoned", broken_.empty() ? "" : ": ",
                         broken_);
    if (!at_last()) {
      const std::string missing = recording_ ? first_unrecorded() : units_->name(scheduler::unit_at(pass_, order_, pos_ + 1));
      detail::fail_usage("model.", name_of(pass_), "().finish() after ", pos_ + 1, " of ", units_->size(),
                         " units: unit '", missing, "' was not entered");
    }
  }
  /// Ends a pass whose last unit was left.
  void end() {
    if (recording_) {
      known_ = true;
      recording_ = false;
    }
    pass_ = pass_kind::none;
  }

  /// An optimizer step failed part way (its update may be partly applied): every later use reports `why`.
  void fail_step(const std::string& why) noexcept {
    try {
      failed_step_ = why;
    } catch (...) {
    }
  }

  /// A load wrote part of the shards (and of the optimizer's state, `with_state`) and failed: `what` says which
  /// ("a checkpoint load from 'ck' that failed part way (...)"); every later use but a restoring load reports it.
  void tear(const std::string& what, bool with_state) noexcept {
    try {
      torn_ = what;
    } catch (...) {
      torn_ = "a failed load";  // fits the small-string buffer: no allocation
    }
    torn_state_ = with_state;
  }
  /// A restoring load succeeded: the shards are whole again.
  void mend() noexcept {
    torn_.clear();
    torn_state_ = false;
  }

  /// The pass in progress cannot go on, for the reason `why`; every later use of the model reports it.
  void abandon_with(const std::string& why) {
    broken_ = detail::cat("model.", name_of(pass_), "() stopped at unit '", units_->name(current()), "': ", why);
    if (recording_) {
      order_.clear();
      recording_ = false;
    }
    pass_ = pass_kind::none;
  }

  /// The pass in progress was left early; every later use of the model reports it. Never throws.
  void abandon(bool named) noexcept {
    try {
      broken_ = detail::cat("model.", name_of(pass_), "() was left at unit '", units_->name(current()), "' (",
                            named ? "finish() was not called" : "the loop exited early", "); every pass must visit all units");
    } catch (...) {
    }
    if (recording_) {
      order_.clear();
      recording_ = false;
    }
    pass_ = pass_kind::none;
  }

 private:
  /// Fixes which unit is at pos_: checks a named entry against the order, or records it.
  void place(const std::string_view* name) {
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
      detail::fail_usage("execution order differs from the ", source_, " order: ", where, " (forward order: ",
                         order_text(), ")");
    }
  }

  std::string order_text() const {
    std::string s;
    for (std::size_t i : order_) s += (s.empty() ? "" : ", ") + units_->name(i);
    return s;
  }

  std::string first_unrecorded() const {
    std::vector<bool> seen(units_->size(), false);
    for (std::size_t i : order_) seen[i] = true;
    for (std::size_t i = 0; i < seen.size(); ++i)
      if (!seen[i]) return units_->name(i);
    return {};
  }

  const unit_index* units_;
  std::vector<std::size_t> order_;
  bool known_ = false;
  bool recording_ = false;
  const char* source_ = "wrapping";
  pass_kind pass_ = pass_kind::none;
  std::size_t pos_ = 0;
  std::string broken_;
  std::string failed_step_;
  std::string torn_;
  bool torn_state_ = false;
};

}  // namespace fsdp::sched
