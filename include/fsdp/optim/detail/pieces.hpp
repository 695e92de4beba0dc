#pragma once
// Splits a flat shard into the pieces one fused optimizer kernel launch covers: each piece carries the
// no-decay ranges inside it as a decay_mask (offsets relative to the piece). Padding between and after
// parameters is stepped too; it holds zeros with zero gradients and stays zero under SGD and AdamW.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fsdp/optim/detail/decay_mask.hpp"

namespace fsdp::optim::detail {

struct shard_piece {
  std::int64_t offset = 0;  ///< first element of the piece in the shard
  std::int64_t numel = 0;
  decay_mask mask;          ///< no-decay ranges, relative to offset
};

/// `views`: the unit's ShardedTensor views (shard_offset, local_numel(), flags.no_decay).
template <class Views>
std::vector<shard_piece> masked_pieces(const Views& views, std::int64_t shard_numel) {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;  // [begin, end) with no decay
  for (const auto& v : views)
    if (!v.empty() && v.flags.no_decay) ranges.emplace_back(v.shard_offset, v.shard_offset + v.local_numel());
  std::sort(ranges.begin(), ranges.end());
  std::vector<shard_piece> out;
  if (shard_numel <= 0) return out;
  std::size_t k = 0;
  std::int64_t begin = 0;
  do {
    shard_piece p;
    p.offset = begin;
    const std::size_t last = std::min(ranges.size(), k + decay_mask::capacity);
    for (; k < last; ++k) {
      p.mask.begin[p.mask.count] = ranges[k].first - begin;
      p.mask.end[p.mask.count] = ranges[k].second - begin;
      ++p.mask.count;
    }
    const std::int64_t end = k < ranges.size() ? ranges[k].first : shard_numel;
    p.numel = end - begin;
    out.push_back(p);
    begin = end;
  } while (begin < shard_numel);
  return out;
}

}  // namespace fsdp::optim::detail
