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

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/core/unit_state.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"

namespace fsdp::detail::sched {

/// What an operation overwrites, for pass_cursor::require_idle: nothing (it reads the model or trains it), every
/// master shard, or every master shard and the optimizer's state.
enum class restores : std::uint8_t { nothing, shards, shards_and_state };

class pass_cursor {
 public:
  /// The declared forward order of `units` (model_options::forward_order, record_order): unit indices, empty when
  /// none is declared; each mistake in the options goes to `p`, naming the unit at fault.
  static std::vector<std::size_t> declared_order(const unit_index& units, const std::vector<std::string>& forward_order,
                                                 bool record_order, problems& p);

  /// `units` must outlive the cursor. Checks the order options (usage_error naming the unit at fault).
  pass_cursor(const unit_index& units, const std::vector<std::string>& forward_order, bool record_order);

  /// The forward order (unit indices) known so far: partial while it is being recorded.
  const std::vector<std::size_t>& order() const noexcept { return order_; }
  bool order_known() const noexcept { return known_; }
  /// The forward order by unit name (empty while it is still to be recorded).
  std::vector<std::string> execution_order() const;

  pass_kind pass() const noexcept { return pass_; }
  std::size_t pos() const noexcept { return pos_; }
  /// The unit at the cursor (a pass must be in progress).
  std::size_t current() const { return scheduler::unit_at(pass_, order_, pos_); }
  bool at_last() const noexcept { return pos_ + 1 >= units_->size(); }

  /// usage_error unless no pass is in progress and none was abandoned (nor an optimizer step failed, nor a load
  /// left the shards torn). `restoring`: the caller overwrites every master shard (and, with
  /// restores::shards_and_state, the optimizer's state), which a torn model accepts when it covers what was torn.
  void require_idle(const char* what, restores restoring = restores::nothing) const;

  /// Places the first unit of a pass of kind `k` (entered by `name`, or the first in the order). A mistake
  /// throws and leaves the cursor as it was: nothing has happened yet.
  void begin(pass_kind k, const std::string_view* name);

  /// Checks that the pass can move on to `name` (or the next unit): usage_error otherwise, nothing changed.
  void check_advance(const std::string_view* name) const;
  /// Moves to the next position (after the current unit was left): true with a unit placed there, false when the
  /// pass is complete (it has ended). A misplaced named unit breaks the pass: the units before it were already
  /// left, so it cannot go on.
  bool next(const std::string_view* name);

  /// usage_error unless the current unit is the pass's last (finish() of a pass entered by name).
  void check_finish() const;
  /// Ends a pass whose last unit was left.
  void end();

  /// An optimizer step failed (`updating`: after its update began, which may then be partly applied): every later
  /// use reports `why`.
  void fail_step(const std::string& why, bool updating = true) noexcept;

  /// usage_error naming `what` unless the master shards and the optimizer's state are those the last completed
  /// optimizer step left: no update failed part way, no load left them torn, and no pass is in progress (a pass
  /// abandoned by a failure is accepted: a pass touches neither). What a survivor of a failure may send
  /// (fsdp/elastic/reshard.hpp).
  void require_committed(const char* what) const;
  /// Whether require_committed would pass.
  bool committed() const noexcept {
    return torn_.empty() && !update_failed_ && (pass_ == pass_kind::none || !broken_.empty());
  }

  /// A load wrote part of the shards (and of the optimizer's state, `with_state`) and failed: `what` says which
  /// ("a checkpoint load from 'ck' that failed part way (...)"); every later use but a restoring load reports it.
  void tear(const std::string& what, bool with_state) noexcept;
  /// A restoring load succeeded: the shards are whole again.
  void mend() noexcept {
    torn_.clear();
    torn_state_ = false;
  }

  /// The pass in progress cannot go on, for the reason `why`; every later use of the model reports it.
  void abandon_with(const std::string& why);

  /// The pass in progress was left early; every later use of the model reports it. Never throws.
  void abandon(bool named) noexcept;

 private:
  /// Fixes which unit is at pos_: checks a named entry against the order, or records it.
  void place(const std::string_view* name);

  std::string order_text() const;
  std::string first_unrecorded() const;

  const unit_index* units_;
  std::vector<std::size_t> order_;
  bool known_ = false;
  bool recording_ = false;
  const char* source_ = "wrapping";
  pass_kind pass_ = pass_kind::none;
  std::size_t pos_ = 0;
  std::string broken_;
  std::string failed_step_;
  bool update_failed_ = false;  ///< the failed step's update had begun
  std::string torn_;
  bool torn_state_ = false;
};

}  // namespace fsdp::detail::sched

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/detail/schedule/pass_cursor.ipp"
#endif
