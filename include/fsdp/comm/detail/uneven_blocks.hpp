#pragma once
// An all_to_all_v's blocks (UnevenAllToAllCollective, fsdp/comm/concept.hpp), written once for every communicator:
// where each rank's blocks lie in its buffers, and the pair of ranks whose counts disagree, with the message that
// names it. Host-only.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

/// An all_to_all_v's blocks on one rank, from its op_desc::counts in a group of `world`: each block's elements and
/// where it starts (bytes) in the send and the receive buffer, blocks in rank order. Every communicator lays the
/// buffers out by it.
class uneven_blocks {
 public:
  uneven_blocks(const std::vector<std::int64_t>& counts, int world, std::size_t element_bytes)
      : counts_(&counts), world_(static_cast<std::size_t>(world)), at_(2 * world_ + 2, 0) {
    for (std::size_t q = 0; q < world_; ++q) {  // send offsets at [0, world], receive offsets after them
      at_[q + 1] = at_[q] + static_cast<std::size_t>(counts[q]) * element_bytes;
      at_[world_ + 2 + q] = at_[world_ + 1 + q] + static_cast<std::size_t>(counts[world_ + q]) * element_bytes;
    }
  }
  /// It keeps a pointer to `counts`: not from a temporary.
  uneven_blocks(std::vector<std::int64_t>&&, int, std::size_t) = delete;
  std::int64_t send_count(int q) const { return (*counts_)[static_cast<std::size_t>(q)]; }
  std::int64_t recv_count(int q) const { return (*counts_)[world_ + static_cast<std::size_t>(q)]; }
  std::size_t send_at(int q) const { return at_[static_cast<std::size_t>(q)]; }
  std::size_t recv_at(int q) const { return at_[world_ + 1 + static_cast<std::size_t>(q)]; }
  std::size_t recv_bytes() const { return at_[2 * world_ + 1]; }

 private:
  const std::vector<std::int64_t>* counts_;
  std::size_t world_;
  std::vector<std::size_t> at_;
};

/// An all_to_all_v whose counts disagree (every communicator's message): rank `rank` receives `expected` elements
/// from rank `q`, which sends it `sent`.
inline std::string uneven_pair_text(int rank, int q, std::int64_t expected, std::int64_t sent) {
  return fsdp::detail::cat("rank ", rank, " receives ", expected, " elements from rank ", q, " (its recv_counts[", q,
                           "]) but rank ", q, " sends it ", sent, " (its send_counts[", rank,
                           "]); rank p's recv_counts[q] must be rank q's send_counts[p]");
}

/// The first pair of ranks whose all_to_all_v counts disagree (`counts(q)`: rank q's op_desc::counts, send then
/// receive), by receiving rank and then sending rank, as every rank of a group finds it: the message, or empty when
/// every pair agrees.
template <class Counts>
std::string uneven_mismatch(int world, Counts&& counts) {
  for (int p = 0; p < world; ++p)
    for (int q = 0; q < world; ++q) {
      const std::int64_t expected = counts(p)[static_cast<std::size_t>(world + q)];
      const std::int64_t sent = counts(q)[static_cast<std::size_t>(p)];
      if (expected != sent) return uneven_pair_text(p, q, expected, sent);
    }
  return {};
}

}  // namespace fsdp::comm::detail
