#pragma once
// nccl_core's failures (the class and its contract: nccl_logic.hpp): settling a call's result under the timeout,
// the asynchronous errors check() looks for, aborting or revoking the family, and the messages that name the call
// and every pending collective.
#include "fsdp/comm/detail/nccl_logic.hpp"

namespace fsdp::comm::detail {

template <class Api>
void nccl_core<Api>::check() {
  std::lock_guard lk(family_->mu);
  for (nccl_core* m : family_->members) m->check_own();
}

template <class Api>
[[noreturn]] void nccl_core<Api>::fail_timeout(const std::string& what) {
  const std::string msg = nccl_timeout_message(speaker(), on_failure_, what, family_pending());
  abort(msg);
  throw comm_error(msg);
}

template <class Api>
void nccl_core<Api>::abort(const std::string& reason) noexcept {
  std::lock_guard lk(family_->mu);
  for (nccl_core* m : family_->members) m->abort_own(reason);
}

template <class Api>
std::string nccl_core<Api>::pending_summary() {
  std::string s = pending_items();
  return s.empty() ? std::string("no collective pending") : s;
}

template <class Api>
void nccl_core<Api>::settle(result rc, comm c, std::string_view call, std::string_view what) {
  if (rc == Api::in_progress) {
    const auto deadline = api_.now() + timeout_;
    while (rc == Api::in_progress) {
      if (api_.now() > deadline)
        fail_timeout(fsdp::detail::cat(call, " for ", what, " on rank ", rank_, " did not complete within ",
                                       timeout_.count(), " ms"));
      api_.sleep(poll_interval);
      rc = async_state(c);
    }
  }
  if (rc != Api::success) fail_nccl(rc, c, fsdp::detail::cat(call, " for ", what));
}

template <class Api>
void nccl_core<Api>::settle_all(result rc, std::string_view call, std::string_view what) {
  state st;
  st.add(rc, base());
  if (st.rc == Api::in_progress) {
    const auto deadline = api_.now() + timeout_;
    while (st.rc == Api::in_progress) {
      if (api_.now() > deadline)
        fail_timeout(fsdp::detail::cat(call, " for ", what, " on rank ", rank_, " did not complete within ",
                                       timeout_.count(), " ms"));
      api_.sleep(poll_interval);
      st = async_state_all();
    }
  }
  if (st.rc != Api::success) fail_nccl(st.rc, st.c, fsdp::detail::cat(call, " for ", what));
}

template <class Api>
void nccl_core<Api>::check_own() {
  if (aborted_) throw comm_error(fsdp::detail::cat(name_, " on rank ", rank_, " was ", ended(), ": ", reason_));
  const state st = async_state_all();
  if (st.rc != Api::success && st.rc != Api::in_progress) fail_nccl(st.rc, st.c, {});
  pending_.retire();
}

template <class Api>
void nccl_core<Api>::abort_own(const std::string& reason) noexcept {
  if (!aborted_) {
    aborted_ = true;
    try {
      reason_ = reason;
    } catch (...) {
    }
  }
  if (open_groups_ != 0) return;
  if (on_failure_ == nccl_failure::revoke)
    revoke_now();
  else
    abort_now();
}

template <class Api>
void nccl_core<Api>::revoke_now() noexcept {
  if (revoke_tried_) return;
  revoke_tried_ = true;
  bool ok = true;
  for (auto ch = channels_.rbegin(); ch != channels_.rend(); ++ch) {
    if (!ch->live) continue;
    const result rc = api_.revoke(ch->c);
    if (rc != Api::success && rc != Api::in_progress) {
      ok = false;
      try {
        api_.log(nccl_call_log(speaker(), "ncclCommRevoke", api_.describe(rc, comm{}),
                               "; the communicators were aborted instead"));
      } catch (...) {
      }
    }
  }
  revoked_ = ok;
  if (!ok) abort_now();
}

template <class Api>
std::string nccl_core<Api>::family_pending() {
  std::lock_guard lk(family_->mu);
  if (family_->members.size() == 1) return pending_summary();
  std::string s;
  for (nccl_core* m : family_->members) {
    const std::string items = m->pending_items();
    if (!items.empty()) s += fsdp::detail::cat(s.empty() ? "" : "; ", m->name_, ": ", items);
  }
  return s.empty() ? std::string("no collective pending") : s;
}

template <class Api>
[[noreturn]] void nccl_core<Api>::fail_nccl(result st, comm c, std::string_view during) {
  const std::string msg = nccl_failure_message(speaker(), on_failure_, api_.describe(st, c), during, family_pending());
  abort(msg);
  throw comm_error(msg);
}

template <class Api>
[[noreturn]] void nccl_core<Api>::abandon_group(std::exception_ptr cause) {
  std::string why = "a non-standard exception";
  try {
    std::rethrow_exception(cause);
  } catch (const std::exception& e) {
    why = fsdp::detail::unprefixed(e);
  } catch (...) {
  }
  std::string queued;
  for (const grouped_op& g : group_) queued += (queued.empty() ? "" : ", ") + g.op.str();
  const std::size_t n = group_.size();
  group_.clear();
  // A call NCCL rejects marks the open group failed (ncclGroupEnd then launches none of it); a collective that
  // already failed inside fn did the same. Closing the group with ncclGroupEnd is still needed: the group
  // state is per thread and would capture every later NCCL call of this thread.
  (void)api_.fail_group(base());
  (void)api_.group_end();
  group_owner_ = nullptr;
  --open_groups_;
  const std::string msg = nccl_abandoned_group_message(speaker(), on_failure_, n, queued, why);
  abort(msg);  // the first reason wins when a failing collective inside fn aborted already
  throw comm_error(msg);
}

template <class Api>
void nccl_core<Api>::abort_now() noexcept {
  for (auto ch = channels_.rbegin(); ch != channels_.rend(); ++ch) {
    if (!ch->live) continue;
    ch->live = false;
    const result rc = api_.comm_abort(ch->c);
    if (rc != Api::success) {
      try {
        api_.log(nccl_call_log(speaker(), "ncclCommAbort", api_.describe(rc, comm{})));
      } catch (...) {
      }
    }
  }
}

}  // namespace fsdp::comm::detail
