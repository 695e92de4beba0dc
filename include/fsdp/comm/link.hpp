#pragma once
// A modelled link: how long a collective takes from its bytes, the group size, a bandwidth and a latency. One
// rule for the two places that model time: comm::local's modelled link (the collectives of thread ranks sleep
// for it, fsdp/comm/detail/local_group.hpp) and the timeline planner (fsdp/plan/timeline.hpp), so that a
// prediction and a host run on the same link agree on every collective's duration to the nanosecond.
#include <chrono>
#include <cstdint>

#include "fsdp/comm/concept.hpp"

namespace fsdp::comm {

/// Once every rank has issued a collective, it takes latency + bytes * factor / bytes_per_second, where bytes is
/// the unsharded size and factor is (n-1)/n for all-gather, reduce-scatter and all-to-all, 2(n-1)/n for all-reduce
/// (ring) and 1 for broadcast (n = group size; a group of one takes no time). Concurrent collectives on different
/// streams do not share the bandwidth in this model.
struct link_model {
  double bytes_per_second = 0;  ///< 0: no model; a collective takes as long as its copies (the planner: no time)
  std::chrono::nanoseconds latency{0};
  /// comm::local only. false: collectives only take their modelled time and leave every buffer untouched (for
  /// timing studies of large models on small machines; training results are then meaningless).
  bool move_data = true;

  std::chrono::nanoseconds duration(collective c, std::int64_t unsharded_bytes, int world) const {
    if (bytes_per_second <= 0 || world <= 1) return std::chrono::nanoseconds{0};
    const double n = world;
    const double factor = c == collective::broadcast    ? 1.0
                          : c == collective::all_reduce ? 2.0 * (n - 1) / n
                                                        : (n - 1) / n;
    return latency + std::chrono::nanoseconds(
                         static_cast<std::int64_t>(double(unsharded_bytes) * factor / bytes_per_second * 1e9));
  }
};

}  // namespace fsdp::comm
