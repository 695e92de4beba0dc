#pragma once
// What every optimizer's per-element update shares: the no-decay mask of a shard piece. The updates themselves
// live with their optimizers (optim/sgd.hpp, adamw.hpp, lion.hpp: each an element function that Backend::for_each
// runs on the host or in a kernel, every operation rounded once through fsdp/core/rounding.hpp), so both backends
// give the same bits and no backend knows an optimizer.
#include <cstdint>

#include "fsdp/core/config.hpp"

namespace fsdp::optim::detail {

/// The per-parameter weight-decay mask of one flat shard: element i gets no weight decay when it lies in one of
/// the ranges [begin[k], end[k]) (shard-local offsets, sorted, disjoint). A fixed-size value, so it travels as a
/// CUDA kernel parameter; a shard with more no-decay ranges is stepped in pieces (see optim::detail::masked_pieces).
struct decay_mask {
  static constexpr int capacity = 16;
  int count = 0;
  std::int64_t begin[capacity] = {};
  std::int64_t end[capacity] = {};

  /// The ranges are sorted and disjoint: the search stops at the first range that ends after i.
  FSDP_HD bool no_decay(std::int64_t i) const {
    for (int k = 0; k < count; ++k)
      if (i < end[k]) return i >= begin[k];
    return false;
  }
};

}  // namespace fsdp::optim::detail
