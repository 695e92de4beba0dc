#pragma once
// nccl_core's collectives (the class and its contract: nccl_logic.hpp): issuing one on its communicator and
// stream, the all-to-all as a group of sends and receives, grouped launches, connect()'s warm-up, and recording
// each one's completion.
#include "fsdp/comm/detail/nccl_logic.hpp"
#include "fsdp/comm/detail/uneven_blocks.hpp"

namespace fsdp::comm::detail {

template <class Api>
template <class Call>
void nccl_core<Api>::issue(collective kind, std::int64_t count, dtype t, std::int64_t total_elems, stream s,
                           std::string_view key, Call&& call) {
  require_count(
      count, [&] { return fsdp::detail::cat(name_of(kind), "(count=", count, ", ", name_of(t), ") on rank ", rank_); });
  if (aborted_)
    throw comm_error(
        fsdp::detail::cat(name_of(kind), " on rank ", rank_, " after ", name_, " was ", ended(), ": ", reason_));
  const auto type = api_.type_of(t);
  const comm c = channel_for(key);
  const stream on = route(s);
  nccl_op op{seq_++, kind, count, t, label_, api_.now()};
  const std::string where = op.str();
  settle(call(c, on, type), c, nccl_function(kind), where);
  if (group_owner_) {  // this thread's group (this core's, or another member's): recorded once it is launched
    group_owner_->group_.push_back({std::move(op), s, on, total_elems, this});
    return;
  }
  record({std::move(op), s, on, total_elems, this});
}

template <class Api>
template <class Send, class Recv>
void nccl_core<Api>::all_to_all(std::int64_t count, dtype t, stream s, std::string_view key, Send&& send, Recv&& recv) {
  exchange(collective::all_to_all, count, t, count * world_, s, key, std::forward<Send>(send),
           std::forward<Recv>(recv));
}

template <class Api>
template <class Send, class Recv>
void nccl_core<Api>::all_to_all_v(const std::vector<std::int64_t>& counts, dtype t, stream s, std::string_view key,
                                  Send&& send, Recv&& recv) {
  const uneven_blocks b(counts, world_, size_of(t));
  std::int64_t sent = 0;
  for (int q = 0; q < world_; ++q) sent += b.send_count(q);
  exchange(
      collective::all_to_all_v, sent, t, sent, s, key,
      [&](comm c, stream on, auto type, int q) {
        return b.send_count(q) ? send(c, on, type, q, b.send_at(q), b.send_count(q)) : Api::success;
      },
      [&](comm c, stream on, auto type, int q) {
        return b.recv_count(q) ? recv(c, on, type, q, b.recv_at(q), b.recv_count(q)) : Api::success;
      });
}

template <class Api>
template <class Send, class Recv>
void nccl_core<Api>::exchange(collective kind, std::int64_t count, dtype t, std::int64_t total, stream s,
                              std::string_view key, Send&& send, Recv&& recv) {
  issue(kind, count, t, total, s, key, [&](comm c, stream on, auto type) {
    result rc = api_.group_start();
    if (rc != Api::success) return rc;
    auto ok = [](result r) { return r == Api::success || r == Api::in_progress; };
    for (int q = 0; q < world_ && ok(rc); ++q) {
      rc = send(c, on, type, q);
      if (ok(rc)) rc = recv(c, on, type, q);
    }
    const result end = api_.group_end();
    return ok(rc) ? end : rc;
  });
}

template <class Api>
template <class Issue>
void nccl_core<Api>::connect(const std::vector<collective_use>& uses, Issue&& issue_one) {
  if (uses.empty()) return;
  if (aborted_)
    throw comm_error(fsdp::detail::cat("connect() on rank ", rank_, " after ", name_, " was ", ended(), ": ", reason_));
  for (const collective_use& u : uses)
    if (u.kind == collective::all_to_all_v)
      fsdp::detail::fail_usage("connect() on rank ", rank_,
                               ": all_to_all_v has no shape to connect ahead (its counts are each call's); list an "
                               "all_to_all of its largest block instead, which connects the same peers");
  const connect_scratch scratch = connect_scratch_for(uses, world_);
  const std::int64_t before = api_.free_device_bytes();
  void* send = api_.device_alloc(std::max<std::size_t>(scratch.send, 1));
  void* recv = nullptr;
  try {
    recv = api_.device_alloc(std::max<std::size_t>(scratch.recv, 1));
  } catch (...) {
    api_.device_free(send);
    throw;
  }
  const std::string label = std::exchange(label_, "(connections for the plan's collectives)");
  connecting_ = true;
  try {
    for (const collective_use& u : uses) issue_one(u, send, recv);
    drain(fsdp::detail::cat("connecting ", uses.size(), " collective", uses.size() == 1 ? "" : "s", " of the plan"));
  } catch (...) {
    connecting_ = false;
    label_ = label;
    throw;  // the scratch stays: a collective may still use it
  }
  connecting_ = false;
  label_ = label;
  api_.device_free(recv);
  api_.device_free(send);
  connect_bytes_ += taken_since(before);
  connected_ += uses.size();
}

template <class Api>
template <class F>
void nccl_core<Api>::grouped(F&& fn) {
  if (aborted_)
    throw comm_error(fsdp::detail::cat("grouped() on rank ", rank_, " after ", name_, " was ", ended(), ": ", reason_));
  if (group_owner_) {  // nested (in this core's group or another's): part of the enclosing group
    std::forward<F>(fn)();
    return;
  }
  const std::uint64_t first = seq_;
  const result rc = api_.group_start();
  if (rc != Api::success) fail_nccl(rc, base(), "ncclGroupStart");
  group_owner_ = this;
  ++open_groups_;
  group_.clear();
  try {
    std::forward<F>(fn)();
  } catch (...) {
    abandon_group(std::current_exception());
  }
  group_owner_ = nullptr;
  std::vector<grouped_op> launched = std::move(group_);
  group_.clear();
  const result end = api_.group_end();
  --open_groups_;
  settle_all(end, "ncclGroupEnd",
             first == seq_ ? std::string("an empty group")
                           : fsdp::detail::cat("grouped collectives #", first, " to #", seq_ - 1));
  for (grouped_op& g : launched) g.owner->record(std::move(g));
}

template <class Api>
auto nccl_core<Api>::route(stream s) -> stream {
  if (!family_->ordered) return s;
  if (!has_handoff_) {
    handoff_ = api_.new_event();
    has_handoff_ = true;
  }
  api_.record(handoff_, s);
  api_.wait(family_->serial, handoff_);
  return family_->serial;
}

template <class Api>
void nccl_core<Api>::drain(std::string_view what) {
  const auto deadline = api_.now() + timeout_;
  for (;;) {
    check();
    if (pending_.empty()) return;
    if (api_.now() > deadline)
      fail_timeout(fsdp::detail::cat(what, " on rank ", rank_, " did not complete within ", timeout_.count(), " ms"));
    api_.sleep(poll_interval);
  }
}

template <class Api>
void nccl_core<Api>::record(grouped_op g) {
  event e = pending_.take();
  try {
    api_.record(e, g.on);
    if (g.on != g.s) api_.wait(g.s, e);  // the issuing stream goes on once the collective is done
  } catch (...) {
    pending_.give_back(e);
    throw;
  }
  if (!connecting_) stats_.add(static_cast<std::size_t>(g.op.kind), g.op.type, g.total_elems);
  if (api_.capturing(g.s)) {  // into a CUDA graph: it runs at each launch, not now; no event of it is asked
    pending_.give_back(e);    // the next collective records it again (the waits above keep what they saw)
    return;
  }
  pending_.add(std::move(g.op), e);
}

template <class Api>
void nccl_core<Api>::release_events() noexcept {
  pending_.release();
  if (has_handoff_) api_.destroy_event(handoff_);
  has_handoff_ = false;
}

}  // namespace fsdp::comm::detail
