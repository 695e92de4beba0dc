#pragma once
// comm::local's definitions (fsdp/comm/local.hpp): included by that header, or compiled once by fsdp/src.hpp under
// FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/detail/thread_ranks.hpp"
#include "fsdp/comm/local.hpp"

namespace fsdp::comm {

FSDP_DECL local_communicator::local_communicator(std::shared_ptr<detail::local_group> g, int rank,
                                                 backend::host_options backend)
    : g_(std::move(g)), rank_(rank), backend_opt_(std::move(backend)) {
  if (rank < 0 || rank >= g_->size())
    fsdp::detail::fail_usage("rank ", rank, " is outside the local group of size ", g_->size());
}

FSDP_DECL local_communicator local_communicator::split(int color, int key) {
  detail::require_color(color, rank_);
  const std::int32_t mine[2] = {color, key};
  std::vector<std::int32_t> all(static_cast<std::size_t>(2 * size()));
  // an all_gather of 2 x 4 bytes per rank, on this thread (the count is in f32 elements of the same size)
  g_->run(seq_++, rank_, detail::op_desc{int(collective::all_gather), 2, dtype::f32, reduce_op::sum, 0}, mine,
          all.data());
  std::vector<std::pair<int, int>> pairs;
  for (int q = 0; q < size(); ++q) pairs.emplace_back(all[2 * q], all[2 * q + 1]);
  auto [group, place] = g_->sub_group(splits_++, rank_, pairs);
  return local_communicator(std::move(group), place, backend_opt_);
}

FSDP_DECL local_communicator local_communicator::shrink(std::vector<int>* survivors) {
  detail::local_group::shrunk s = g_->shrink(shrinks_++, rank_);
  if (survivors) *survivors = s.members;
  return local_communicator(std::move(s.group), s.place, backend_opt_);
}

FSDP_DECL local_communicator local_communicator::grow(int newcomers, local_invitation* invitation) {
  if (newcomers < 1) fsdp::detail::fail_usage("grow: rank ", rank_, " asks for ", newcomers, " newcomers; at least 1");
  // every rank must ask for the same number: an all_gather of it, on this thread
  const std::int32_t mine = newcomers;
  std::vector<std::int32_t> all(static_cast<std::size_t>(size()));
  g_->run(seq_++, rank_, detail::op_desc{int(collective::all_gather), 1, dtype::f32, reduce_op::sum, 0}, &mine,
          all.data());
  for (int q = 0; q < size(); ++q)
    if (all[static_cast<std::size_t>(q)] != newcomers)
      fsdp::detail::fail_usage("grow: rank ", rank_, " asks for ", newcomers, " newcomers and rank ", q, " for ",
                               all[static_cast<std::size_t>(q)], ": every rank of the group passes the same number");
  std::shared_ptr<detail::local_group> group = g_->grown(grows_++, size() + newcomers);
  if (invitation) *invitation = local_invitation{group, size(), newcomers};
  return local_communicator(std::move(group), rank_, backend_opt_);
}

FSDP_DECL local_communicator local_communicator::join(const local_invitation& invitation, int newcomer,
                                                      backend::host_options backend) {
  if (!invitation.group) fsdp::detail::fail_usage("join: the invitation is empty (local_communicator::grow makes it)");
  if (newcomer < 0 || newcomer >= invitation.newcomers)
    fsdp::detail::fail_usage("join: newcomer ", newcomer, " of an invitation for ", invitation.newcomers);
  return local_communicator(invitation.group, invitation.first + newcomer, std::move(backend));
}

FSDP_DECL void local_communicator::issue(const detail::op_desc& d, const void* send, void* recv, stream& s,
                                        std::int64_t total_elems) {
  detail::require_count(d.count, [&] { return fsdp::detail::cat(d.str(), " on rank ", rank_); });
  if (std::vector<std::function<void()>>* calls = s.capture()) {  // captured (backend::host::begin_capture): each
    calls->emplace_back([this, d, send, recv, &s, total_elems] {  // replay issues it again, in the world's order
      issue(d, send, recv, s, total_elems);
    });
    return;
  }
  const std::uint64_t seq = seq_++;
  stats_.add(static_cast<std::size_t>(d.kind), d.type, total_elems);
  auto g = g_;
  const int rank = rank_;
  s.submit([g, seq, rank, d, send, recv] { g->run(seq, rank, d, send, recv); });
}

namespace detail {
FSDP_DECL void run_ranks(int world, const std::shared_ptr<local_group>& group, const std::function<void(int)>& rank,
                         int from) {
  thread_ranks_hooks hooks;
  hooks.size = group->size();
  hooks.stop = [&](const std::string& reason) { group->abort(reason); };
  hooks.stopped = [&] { return group->aborted(); };
  hooks.returned = [&](int r) { group->rank_returned(r); };
  run_thread_ranks(world, from, rank, hooks);
}
}  // namespace detail

}  // namespace fsdp::comm
