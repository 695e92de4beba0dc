#pragma once
// The in-process group's ranks (fsdp/comm/detail/local_group.hpp): making it, its links, and the groups split,
// shrunk or grown from it. Included by that header, or compiled once by fsdp/src.hpp under
// FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp); its collectives are in local_group.ipp.
#include <algorithm>

#include "fsdp/comm/detail/local_group.hpp"

namespace fsdp::comm::detail {

FSDP_DECL local_group::local_group(int world, std::chrono::milliseconds timeout, link_model link,
                                   collective_delay delay)
    : world_(world), timeout_(timeout), link_(link), delay_(std::move(delay)) {
  if (world <= 0) fsdp::detail::fail_usage("world size must be positive, got ", world);
  if (link_.bytes_per_second < 0) fsdp::detail::fail_usage("link bandwidth must be >= 0, got ", link_.bytes_per_second);
  returned_.assign(static_cast<std::size_t>(world), false);
  board_ = std::make_shared<wait_board>();
  board_->next_id = world;
  ids_.resize(static_cast<std::size_t>(world));
  for (int q = 0; q < world; ++q) ids_[static_cast<std::size_t>(q)] = q;
}

FSDP_DECL void local_group::join_board_locked(local_group& child, const std::vector<int>& members,
                                              int newcomers) const {
  child.board_ = board_;
  child.fault_ = fault_;
  child.ids_.clear();
  for (int m : members) child.ids_.push_back(ids_.at(static_cast<std::size_t>(m)));
  std::lock_guard b(board_->mu);
  for (int i = 0; i < newcomers; ++i) child.ids_.push_back(board_->next_id++);
}

FSDP_DECL void local_group::set_link(const link_model& link) {
  if (link.bytes_per_second < 0) fsdp::detail::fail_usage("link bandwidth must be >= 0, got ", link.bytes_per_second);
  {
    std::lock_guard lk(mu_);
    link_ = link;
    cluster_.reset();
    places_.clear();
  }
  for (const auto& c : children()) c.group->set_link(link);
}

FSDP_DECL void local_group::place(std::shared_ptr<const cluster_links> cluster, std::vector<int> places) {
  if (!cluster) fsdp::detail::fail_usage("local group: place() needs a cluster");
  if (static_cast<int>(places.size()) != world_)
    fsdp::detail::fail_usage("local group: place() got ", places.size(), " places for ", world_, " ranks");
  const link_model l = cluster->placed(places);
  std::lock_guard lk(mu_);
  link_ = l;
  cluster_ = std::move(cluster);
  places_ = std::move(places);
}

FSDP_DECL link_model local_group::link() const {
  std::lock_guard lk(mu_);
  return link_;
}

FSDP_DECL void local_group::place_child_locked(local_group& child, const std::vector<int>& members,
                                               int newcomers) const {
  if (!cluster_) return;
  std::vector<int> places;
  for (int m : members) places.push_back(places_.at(static_cast<std::size_t>(m)));
  int next = places_.empty() ? 0 : *std::max_element(places_.begin(), places_.end()) + 1;
  for (int i = 0; i < newcomers; ++i) places.push_back(next++);
  child.link_ = cluster_->placed(places);  // the child is not yet shared: no other thread sees it
  child.cluster_ = cluster_;
  child.places_ = std::move(places);
}

FSDP_DECL std::pair<std::shared_ptr<local_group>, int> local_group::sub_group(
    std::uint64_t split, int rank, const std::vector<std::pair<int, int>>& all) {
  const int color = all.at(static_cast<std::size_t>(rank)).first;
  const std::vector<int> members = split_members(all, color);
  const int place = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  std::lock_guard lk(mu_);
  pending_split& p = splits_[{split, color}];
  if (!p.group) {
    p.group = std::make_shared<local_group>(static_cast<int>(members.size()), timeout_, link_, delay_);
    p.group->label_ = members_label(members);
    place_child_locked(*p.group, members, 0);
    join_board_locked(*p.group, members, 0);
    adopt_locked(p.group, members);
  }
  std::shared_ptr<local_group> g = p.group;
  if (++p.taken == static_cast<int>(members.size())) splits_.erase({split, color});
  return {g, place};
}

FSDP_DECL local_group::shrunk local_group::shrink(std::uint64_t number, int rank) {
  std::unique_lock lk(mu_);
  pending_shrink& s = shrinks_[number];
  s.arrived.resize(static_cast<std::size_t>(world_), false);
  s.arrived.at(static_cast<std::size_t>(rank)) = true;
  auto missing = [&] {
    std::vector<int> out;
    for (int q = 0; q < world_; ++q)
      if (!s.arrived[static_cast<std::size_t>(q)] && !returned_[static_cast<std::size_t>(q)]) out.push_back(q);
    return out;
  };
  cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!s.group && !missing().empty())
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !s.group && !missing().empty()) {
      std::string who;
      for (int q : missing()) who += (who.empty() ? "" : ", ") + std::to_string(q);
      throw comm_error(fsdp::detail::cat("local", label_, " shrink #", number, " on rank ", rank, ": rank(s) ", who,
                                         " neither called shrink() nor returned within ", timeout_.count(),
                                         " ms (every surviving rank must call it)"));
    }
  if (!s.group) {  // the last survivor to arrive makes the group
    for (int q = 0; q < world_; ++q)
      if (s.arrived[static_cast<std::size_t>(q)]) s.members.push_back(q);
    s.group = std::make_shared<local_group>(static_cast<int>(s.members.size()), timeout_, link_, delay_);
    s.group->label_ = members_label(s.members);
    place_child_locked(*s.group, s.members, 0);
    join_board_locked(*s.group, s.members, 0);
    children_.push_back({s.group, s.members});
  }
  shrunk out{s.group, 0, s.members};
  out.place = static_cast<int>(std::find(s.members.begin(), s.members.end(), rank) - s.members.begin());
  if (++s.taken == static_cast<int>(s.members.size())) shrinks_.erase(number);
  return out;
}

FSDP_DECL void local_group::adopt_locked(const std::shared_ptr<local_group>& child, const std::vector<int>& members) {
  children_.push_back({child, members});
  for (std::size_t i = 0; i < members.size(); ++i)  // what happened before the child was made holds in it too
    if (returned_[static_cast<std::size_t>(members[i])]) {
      child->returned_[i] = true;
      ++child->returned_count_;
    }
  if (aborted_) {
    child->aborted_ = true;
    child->reason_ = reason_;
  }
}

FSDP_DECL std::shared_ptr<local_group> local_group::grown(std::uint64_t number, int size) {
  std::lock_guard lk(mu_);
  pending_split& p = grows_[number];
  if (!p.group) {
    p.group = std::make_shared<local_group>(size, timeout_, link_, delay_);
    std::vector<int> members(static_cast<std::size_t>(world_));
    for (int q = 0; q < world_; ++q) members[static_cast<std::size_t>(q)] = q;
    place_child_locked(*p.group, members, size - world_);
    join_board_locked(*p.group, members, size - world_);
    adopt_locked(p.group, members);
  }
  std::shared_ptr<local_group> g = p.group;
  if (++p.taken == world_) grows_.erase(number);
  return g;
}

}  // namespace fsdp::comm::detail
