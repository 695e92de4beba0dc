#pragma once
// nccl_core's communicators (the class and its contract: nccl_logic.hpp): the base taken at init(), the family
// a split group joins, the groups split or shrunk from the base, one communicator per stream name, the state of
// several at once, and their end at shutdown().
#include "fsdp/comm/detail/nccl_logic.hpp"

namespace fsdp::comm::detail {

template <class Api>
void nccl_core<Api>::init(comm c, result rc, std::string_view call, std::string_view what, std::int64_t free_before) {
  if (!channels_.empty()) fsdp::detail::fail_usage(name_, " on rank ", rank_, ": init() called twice");
  channels_.push_back({std::string(), c, true, 0});
  settle(rc, c, call, what);
  channels_.front().device_bytes = taken_since(free_before);
}

template <class Api>
void nccl_core<Api>::join_family(nccl_core& parent) {
  leave_family();
  family_ = parent.family_;
  std::lock_guard lk(family_->mu);
  family_->members.push_back(this);
  if (channels_mode_ == nccl_channels::one && parent.channels_mode_ == nccl_channels::one && !family_->ordered) {
    family_->serial = api_.new_stream();
    family_->ordered = true;
    for (nccl_core* m : family_->members) m->pending_.wait_all(family_->serial);
  }
}

template <class Api>
auto nccl_core<Api>::split(int color, int key) -> comm {
  return split_base(color, key, fsdp::detail::cat("split(color=", color, ", key=", key, ")"));
}

template <class Api>
auto nccl_core<Api>::shrink(std::vector<int> exclude) -> comm {
  if (const std::string why = shrink_refusal(api_.version()); !why.empty()) throw usage_error(why);
  if (aborted_ && !revoked_)
    throw comm_error(fsdp::detail::cat("shrink() on rank ", rank_, " after ", name_, " was aborted: ", reason_,
                                       " (with nccl_options::on_failure = nccl_failure::revoke a failure revokes "
                                       "the communicators instead, and shrink() can follow)"));
  if (open_groups_ != 0)
    fsdp::detail::fail_usage(name_, " on rank ", rank_, ": shrink() inside grouped(): shrink before grouping");
  const std::string what = shrink_request(exclude, rank_, world_, name_);
  if (revoked_) {  // NCCL stops the revoked communicators' operations; their state is ncclSuccess once quiescent
    state st = async_state_all();
    const auto deadline = api_.now() + timeout_;
    while (st.rc == Api::in_progress) {
      if (api_.now() > deadline)
        throw comm_error(fsdp::detail::cat("ncclCommRevoke on rank ", rank_, " of ", world_, " for ", what,
                                           " did not quiesce within ", timeout_.count(), " ms: ", name_,
                                           " cannot be shrunk; restart every rank from the last checkpoint"));
      api_.sleep(poll_interval);
      st = async_state_all();
    }
    if (st.rc != Api::success)
      throw comm_error(fsdp::detail::cat("NCCL reported ", api_.describe(st.rc, st.c), " on rank ", rank_, " of ",
                                         world_, " while the revoked communicators quiesced for ", what, "; ", name_,
                                         " cannot be shrunk; restart every rank from the last checkpoint"));
  }
  comm out{};
  const comm parent = base();
  const result rc = api_.shrink(parent, exclude, out);
  return settle_child(rc, parent, out, "ncclCommShrink", what);
}

template <class Api>
void nccl_core<Api>::shutdown() noexcept {
  release_events();
  if (live_communicators() == 0) return;
  if (aborted_) {
    abort_now();
    return;
  }
  try {
    state st;
    for (auto ch = channels_.rbegin(); ch != channels_.rend(); ++ch)
      if (ch->live) st.add(api_.finalize(ch->c), ch->c);
    if (st.rc == Api::in_progress) {
      const auto deadline = api_.now() + timeout_;
      while (st.rc == Api::in_progress && api_.now() <= deadline) {
        api_.sleep(shutdown_poll_interval);
        st = async_state_all();
      }
    }
    if (st.rc == Api::in_progress) {
      api_.log(nccl_finalize_timeout_log(speaker(), timeout_.count()));
      abort_now();
      return;
    }
    if (st.rc != Api::success) {
      api_.log(nccl_finalize_error_log(speaker(), api_.describe(st.rc, st.c)));
      abort_now();
      return;
    }
    for (auto ch = channels_.rbegin(); ch != channels_.rend(); ++ch) {
      if (!ch->live) continue;
      ch->live = false;
      const result d = api_.destroy(ch->c);
      if (d != Api::success)
        api_.log(nccl_call_log(speaker(), "ncclCommDestroy", api_.describe(d, comm{}), " at shutdown"));
    }
  } catch (...) {  // a message could not be built: still end the communicators
    abort_now();
  }
}

template <class Api>
void nccl_core<Api>::leave_family() noexcept {
  if (!family_) return;
  std::lock_guard lk(family_->mu);
  auto& m = family_->members;
  for (auto it = m.begin(); it != m.end(); ++it)
    if (*it == this) {
      m.erase(it);
      break;
    }
}

template <class Api>
auto nccl_core<Api>::channel_for(std::string_view key) -> comm {
  if (channels_.empty())
    fsdp::detail::fail_usage(name_, " on rank ", rank_, ": a collective was issued before the communicator was set up");
  if (key.empty() || channels_mode_ == nccl_channels::one) return channels_.front().c;
  for (const channel& ch : channels_)
    if (ch.key == key) return ch.c;
  if (open_groups_ != 0)
    fsdp::detail::fail_usage(name_, " on rank ", rank_, ": the first collective on stream '", key,
                             "' is inside grouped(); a stream's communicator is split from the base one "
                             "(ncclCommSplit) on its first collective, which cannot run inside a group. Issue one "
                             "collective on the stream before grouping its collectives");
  const std::int64_t before = api_.free_device_bytes();
  const comm c = split_base(0, rank_, fsdp::detail::cat("the communicator of stream '", key, "'"));
  channels_.push_back({std::string(key), c, true, taken_since(before)});
  return c;
}

template <class Api>
std::int64_t nccl_core<Api>::taken_since(std::int64_t free_before) {
  return free_before < 0 ? 0 : std::max<std::int64_t>(0, free_before - api_.free_device_bytes());
}

template <class Api>
auto nccl_core<Api>::split_base(int color, int key, const std::string& what) -> comm {
  if (aborted_)
    throw comm_error(fsdp::detail::cat("ncclCommSplit for ", what, " on rank ", rank_, " after ", name_, " was ",
                                       ended(), ": ", reason_));
  if (open_groups_ != 0)
    fsdp::detail::fail_usage(name_, " on rank ", rank_, ": ncclCommSplit for ", what,
                             " inside grouped(): a split cannot be grouped with collectives; split before grouping");
  const comm parent = base();
  comm out{};
  const result rc = api_.split(parent, color, key, out);
  return settle_child(rc, parent, out, "ncclCommSplit", what);
}

template <class Api>
auto nccl_core<Api>::settle_child(result rc, comm parent, comm& out, std::string_view call, const std::string& what)
    -> comm {
  try {
    // A non-blocking split runs as a job of the parent, whose state says when it has settled; NCCL fills `out`
    // from that job (it is null until then). The call's own answer does not say it has settled: NCCL 2.28's
    // ncclCommSplit returns ncclSuccess while the job still runs (src/init.cc returns its own result after
    // NCCLCHECK(ncclGroupEndInternal()), which lets the group's ncclInProgress pass, and src/group.cc has set the
    // parent's state to ncclInProgress). So after a success the parent's state is read, and polled while it is
    // in progress (ncclCommGetAsyncError on the parent then joins the job); only then is `out` read. Reading it at
    // once found it null on the H200 (2026-11-26: "it settled, but gave no communicator"), and the abort that
    // followed ended the running job ("job error 3"). The new communicator's own state is then settled too.
    // ncclCommShrink is settled alike (a job of the parent too; not yet run on hardware).
    settle(rc == Api::success ? async_state(parent) : rc, parent, call, what);
    if (out == comm{})
      fail_nccl(Api::internal_error, parent,
                fsdp::detail::cat(call, " for ", what, " (it settled, but gave no communicator)"));
    settle(async_state(out), out, call, what);
  } catch (...) {
    if (out != comm{}) (void)api_.comm_abort(out);
    throw;
  }
  return out;
}

template <class Api>
auto nccl_core<Api>::async_state(comm c) -> result {
  result st = Api::in_progress;
  const result q = api_.get_async_error(c, st);
  return q != Api::success ? q : st;
}

template <class Api>
auto nccl_core<Api>::async_state_all() -> state {
  state st;
  for (const channel& ch : channels_)
    if (ch.live) st.add(async_state(ch.c), ch.c);
  return st;
}

}  // namespace fsdp::comm::detail
