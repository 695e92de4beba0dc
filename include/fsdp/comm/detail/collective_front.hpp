#pragma once
// The four collectives of the CollectivePolicy concept, all_to_all (AllToAllCollective) and all_to_all_v
// (UnevenAllToAllCollective), written once for the communicators that turn each into an op_desc request (comm::local,
// comm::local on one GPU, comm::mpi, comm::nccl): Derived provides rank(), size() and issue(desc, send, recv, stream,
// unsharded_elements), and befriends this class.
#include <cstdint>
#include <span>

#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/detail/local_group.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

template <class Derived, class Stream>
class collective_front {
 public:
  /// recv[q * count ...] = send of rank q; `count` elements per rank. `send` may be recv's own slice.
  void all_gather(const void* send, void* recv, std::int64_t count, dtype t, Stream& s) {
    self().issue({int(collective::all_gather), count, t, reduce_op::sum, 0}, send, recv, s, count * self().size());
  }
  /// recv (count elements) = reduction over ranks of send[rank * count ...].
  void reduce_scatter(const void* send, void* recv, std::int64_t count, dtype t, reduce_op op, Stream& s) {
    self().issue({int(collective::reduce_scatter), count, t, op, 0}, send, recv, s, count * self().size());
  }
  /// recv = reduction over ranks of send (count elements); in place when send == recv.
  void all_reduce(const void* send, void* recv, std::int64_t count, dtype t, reduce_op op, Stream& s) {
    self().issue({int(collective::all_reduce), count, t, op, 0}, send, recv, s, count);
  }
  /// recv = send of `root`, on the root too (as NCCL: a copy unless send == recv).
  void broadcast(const void* send, void* recv, std::int64_t count, dtype t, int root, Stream& s) {
    if (root < 0 || root >= self().size())
      fsdp::detail::fail_usage("broadcast root ", root, " is outside the group of ", self().size());
    self().issue({int(collective::broadcast), count, t, reduce_op::sum, root}, send, recv, s, count);
  }
  /// recv[q * count ...] = rank q's send[rank * count ...]; `count` elements per pair of ranks. The buffers must not
  /// overlap.
  void all_to_all(const void* send, void* recv, std::int64_t count, dtype t, Stream& s) {
    require_apart(send, recv, count, t, self().rank(), self().size());
    self().issue({int(collective::all_to_all), count, t, reduce_op::sum, 0}, send, recv, s, count * self().size());
  }
  /// recv's block q (recv_counts[q] elements, blocks in rank order) = rank q's block for this rank; send's block q
  /// (send_counts[q] elements) goes to rank q (UnevenAllToAllCollective). The counts are copied at the call.
  void all_to_all_v(const void* send, std::span<const std::int64_t> send_counts, void* recv,
                    std::span<const std::int64_t> recv_counts, dtype t, Stream& s) {
    const std::int64_t sent = require_uneven(send, send_counts, recv, recv_counts, t, self().rank(), self().size());
    op_desc d{int(collective::all_to_all_v), sent, t, reduce_op::sum, 0};
    d.counts.reserve(send_counts.size() + recv_counts.size());
    d.counts.insert(d.counts.end(), send_counts.begin(), send_counts.end());
    d.counts.insert(d.counts.end(), recv_counts.begin(), recv_counts.end());
    self().issue(d, send, recv, s, sent);
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

}  // namespace fsdp::comm::detail
