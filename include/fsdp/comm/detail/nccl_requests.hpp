#pragma once
// What two of comm::nccl's requests ask for, decided before any NCCL call: the ranks a shrink() excludes (checked
// and named), and the scratch connect() makes for the plan's collectives. nccl_core (nccl_logic.hpp) makes the
// calls. Host-only.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

/// shrink(exclude) on rank `rank` of a group of `world` named `name`: sorts `exclude` and returns what the call is
/// for in messages ("shrink(excluding ranks 0, 3)"); a usage_error for an empty list, a rank outside the group,
/// this rank (an excluded rank does not call it) or a rank named twice.
inline std::string shrink_request(std::vector<int>& exclude, int rank, int world, std::string_view name) {
  std::sort(exclude.begin(), exclude.end());
  std::string listed;
  for (std::size_t i = 0; i < exclude.size(); ++i) {
    const int r = exclude[i];
    if (r < 0 || r >= world)
      fsdp::detail::fail_usage(name, " on rank ", rank, ": shrink() excludes rank ", r, ", which is not a rank of ",
                               world);
    if (r == rank)
      fsdp::detail::fail_usage(name, " on rank ", rank,
                               ": shrink() excludes this rank; a rank that is excluded does not call it");
    if (i > 0 && exclude[i - 1] == r)
      fsdp::detail::fail_usage(name, " on rank ", rank, ": shrink() excludes rank ", r, " twice");
    listed += fsdp::detail::cat(i ? ", " : "", r);
  }
  if (exclude.empty())
    fsdp::detail::fail_usage(name, " on rank ", rank, ": shrink() with no rank to exclude (split() keeps them all)");
  return fsdp::detail::cat("shrink(excluding rank", exclude.size() > 1 ? "s " : " ", listed, ")");
}

/// The scratch connect() makes, the largest send and receive buffers of the uses over a group of `world` ranks.
struct connect_scratch {
  std::size_t send = 0, recv = 0;
};
inline connect_scratch connect_scratch_for(const std::vector<collective_use>& uses, int world) {
  connect_scratch s;
  for (const collective_use& u : uses) {
    const std::size_t one = static_cast<std::size_t>(std::max<std::int64_t>(u.count, 0)) * size_of(u.type);
    const std::size_t all = one * static_cast<std::size_t>(world);
    connect_scratch b{all, all};
    switch (u.kind) {
      case collective::all_gather: b = {one, all}; break;
      case collective::reduce_scatter: b = {all, one}; break;
      case collective::all_to_all:
      case collective::all_to_all_v: b = {all, all}; break;  // all_to_all_v: refused by connect() before this
      case collective::all_reduce:
      case collective::broadcast: b = {one, one}; break;
    }
    s.send = std::max(s.send, b.send);
    s.recv = std::max(s.recv, b.recv);
  }
  return s;
}

}  // namespace fsdp::comm::detail
