#pragma once
// Memory planner: the per-rank peak of every memory category, known before the first step from the layouts,
// the strategy's facts, the prefetch depths and the optimizer's state count. It models the scheduler's
// allocation order (see model.hpp): gathers issued on unit entry plus prefetch, releases on leave per the
// strategy, one unsharded gradient buffer (and its reduce-scatter output) live at a time.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/sharding/sharding.hpp"

namespace fsdp {

struct memory_plan_inputs {
  strategy_facts strategy;
  int forward_prefetch = 0;
  int backward_prefetch = 0;
  int optimizer_states = 0;        ///< fp32 values of optimizer state per parameter element (AdamW 2)
  std::int64_t compute_bytes = 4;  ///< bytes per element of gathered parameters
  std::int64_t reduce_bytes = 4;   ///< bytes per element of unsharded gradients
};

/// Peak bytes per category for one rank (memory_figures::total is left 0: the planner reports categories).
inline memory_figures plan_peak_memory(const std::vector<FlatLayout>& units, const memory_plan_inputs& in) {
  memory_figures f;
  const auto n = static_cast<std::int64_t>(units.size());
  std::int64_t shard = 0;
  for (const auto& u : units) shard += u.shard_numel();
  f[mem::sharded_params] = shard * 4;
  f[mem::grads] = shard * 4;
  f[mem::optimizer_state] = shard * 4 * in.optimizer_states;

  std::int64_t comm = 0;
  for (const auto& u : units) {
    const std::int64_t live = in.strategy.shards_params ? u.padded_numel() + u.shard_numel() : u.padded_numel();
    comm = std::max(comm, live * in.reduce_bytes);
  }
  f[mem::comm_buffers] = comm;

  if (in.strategy.shards_params) {
    auto sum = [&](std::int64_t lo, std::int64_t hi) {  // units [lo, hi], clamped
      std::int64_t s = 0;
      for (std::int64_t j = std::max<std::int64_t>(lo, 0); j <= std::min(hi, n - 1); ++j)
        s += units[static_cast<std::size_t>(j)].padded_numel();
      return s;
    };
    std::int64_t peak = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      // Forward, at unit i: released units are behind it (or none are, if kept after forward).
      const std::int64_t lo = in.strategy.reshard_after_forward ? i : 0;
      peak = std::max(peak, sum(lo, i + in.forward_prefetch));
      // Backward, at unit i: units after it are released; units before it are prefetched (or kept).
      const std::int64_t blo = in.strategy.reshard_after_forward ? i - in.backward_prefetch : 0;
      peak = std::max(peak, sum(blo, i));
    }
    f[mem::gathered_params] = peak * in.compute_bytes;
  }
  return f;
}

}  // namespace fsdp
