#pragma once
// The communicator concept's definitions (fsdp/comm/concept.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include "fsdp/comm/concept.hpp"

namespace fsdp::comm::detail {

FSDP_DECL void require_apart(const void* send, const void* recv, std::int64_t count, dtype t, int rank, int ranks) {
  const std::int64_t total = count * ranks;
  const auto* a = static_cast<const unsigned char*>(send);
  const auto* b = static_cast<const unsigned char*>(recv);
  const std::size_t span = static_cast<std::size_t>(total > 0 ? total : 0) * size_of(t);
  if (span && a < b + span && b < a + span)
    fsdp::detail::fail_usage("all_to_all(count=", count, ", ", name_of(t), ") on rank ", rank,
                             ": the send and receive buffers overlap; give it two buffers of ", span, " bytes each");
}

FSDP_DECL void require_color(int color, int rank) {
  if (color < 0) fsdp::detail::fail_usage("split on rank ", rank, ": color must be >= 0, got ", color);
}

}  // namespace fsdp::comm::detail
