#pragma once
// The CollectivePolicy concept: what the unit executor and the optimizers need from a communicator.
// Implementations: comm::local (ranks as threads of one process, over host memory: comm/local.hpp, or one GPU:
// comm/local_cuda.cuh), comm::mpi (comm/mpi.hpp) and comm::nccl (comm/nccl.cuh). Buffers are the backend's memory;
// every collective is issued on a stream of the backend and runs in that stream's order. Reductions of f32, bf16 and
// f16 are supported; an average is NCCL's (each value pre-multiplied by 1 / ranks rounded to the element dtype, then
// summed).
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {

enum class reduce_op : std::uint8_t { sum, avg };

constexpr std::string_view name_of(reduce_op op) noexcept { return op == reduce_op::sum ? "sum" : "avg"; }

/// all_to_all_v: an all_to_all whose blocks differ in size, per pair of ranks (a mixture of experts' token dispatch);
/// the library's own plans never issue it.
enum class collective : std::uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, all_to_all, all_to_all_v };
inline constexpr std::size_t collective_kinds = 6;

constexpr std::string_view name_of(collective c) noexcept {
  switch (c) {
    case collective::all_gather: return "all_gather";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_reduce: return "all_reduce";
    case collective::broadcast: return "broadcast";
    case collective::all_to_all: return "all_to_all";
    case collective::all_to_all_v: return "all_to_all_v";
  }
  return "?";
}

/// Collectives issued by one rank, by kind, and the bytes each moved (the unsharded size, as nccl-tests count).
struct collective_stats {
  std::uint64_t count[collective_kinds] = {};
  std::uint64_t bytes[collective_kinds] = {};
  std::uint64_t operator[](collective c) const noexcept { return count[static_cast<std::size_t>(c)]; }
};

/// One collective a plan will issue, known before the first step: its kind, its `count` (as the collective's own
/// argument: per rank for all_gather and reduce_scatter, per pair for all_to_all, the whole buffer otherwise) and
/// its dtype. A communicator with connect() (comm::nccl) is handed the list of its group before the memory plan is
/// reserved, to make what those collectives need first (fsdp/plan/collectives.hpp).
struct collective_use {
  collective kind = collective::all_gather;
  std::int64_t count = 0;
  dtype type = dtype::f32;

  friend constexpr bool operator==(const collective_use&, const collective_use&) noexcept = default;
  friend constexpr auto operator<=>(const collective_use&, const collective_use&) noexcept = default;
};

/// Requirements on a communicator. `count` is in elements: per rank for all_gather (send count) and
/// reduce_scatter (receive count), whole buffer for all_reduce and broadcast. Two aliasings must work, as they do
/// in NCCL (MPI needs MPI_IN_PLACE for them): an in-place all_gather whose send buffer is this rank's slice of the
/// receive buffer (send == recv + rank * count elements), and an in-place all_reduce (send == recv). The unit
/// executor issues both.
template <class C>
concept CollectivePolicy = requires(C& c, const C& cc, const void* send, void* recv, std::int64_t count, dtype t,
                                    reduce_op op, int root, typename C::backend_type::stream& s) {
  typename C::backend_type;
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.all_gather(send, recv, count, t, s);
  c.reduce_scatter(send, recv, count, t, op, s);
  c.all_reduce(send, recv, count, t, op, s);
  c.broadcast(send, recv, count, t, root, s);
  c.barrier();
  { cc.stats() } -> std::same_as<collective_stats>;
};

/// A communicator that also has all_to_all (comm::local on the host or one GPU, comm::mpi, and comm::nccl as grouped
/// ncclSend / ncclRecv, NCCL having no all-to-all of its own). `count` is in elements per pair of ranks: `send`
/// holds size() blocks of `count`, block q for rank q; `recv` receives size() blocks, block q from rank q. The two
/// buffers must not overlap (require_apart refuses them, naming the rank and the sizes).
template <class C>
concept AllToAllCollective = CollectivePolicy<C> && requires(C& c, const void* send, void* recv, std::int64_t count,
                                                             dtype t, typename C::backend_type::stream& s) {
  c.all_to_all(send, recv, count, t, s);
};

/// A communicator with an all_to_all whose blocks differ in size (comm::local on the host or one GPU, comm::mpi as
/// MPI_Alltoallv, comm::nccl as grouped ncclSend / ncclRecv): a mixture of experts' dispatch of tokens to the ranks
/// that hold their experts, and the combine that brings them back. `send` holds size() blocks in rank order, block q
/// (send_counts[q] elements) for rank q; `recv` receives size() blocks in rank order, block q (recv_counts[q]
/// elements) from rank q. Both spans have one count per rank; rank p's recv_counts[q] must be rank q's
/// send_counts[p] (the trainer usually learns them with an all_to_all of one count per pair first). The counts are
/// read at the call (they need not outlive it); the buffers as for all_to_all. What each communicator checks of the
/// counts across ranks: docs/policies.md, "Uneven all_to_all".
template <class C>
concept UnevenAllToAllCollective =
    CollectivePolicy<C> &&
    requires(C& c, const void* send, void* recv, std::span<const std::int64_t> counts, dtype t,
             typename C::backend_type::stream& s) { c.all_to_all_v(send, counts, recv, counts, t, s); };

/// Optional capabilities: a communicator has any of them or none, and the library asks for each where the list
/// says (those without it get the behaviour in brackets). "Add a communicator" is CollectivePolicy, then whichever
/// of these it can offer; each of the library's communicators asserts in its header which it has.
///
///   LabelledCollective      label(unit): names the unit the next collectives are for, so that a timeout or an
///                           error names it (exec::groups, the gradient inspection) [errors name no unit]
///   SplittableCollective    split(color, key) -> C: the ranks of one color as a group (Model makes hybrid
///                           sharding's groups with it) [can_implement refuses a strategy whose groups split the
///                           world]
///   ConfiguringCollective   backend_options(): what the Model's backend is made with, B(rank, options) (its waits
///                           bounded as the communicator's are) [B(rank)]
///   SerialCollective        serial_collectives(): whether all its groups' collectives run one at a time (the
///                           timeline planner models it: fsdp::plan_timeline(model, ...)) [false]
///   DeviceMeasuredCollective device_bytes(): the device memory it took, beside the plan (Model::plan_memory's
///                           NCCL row) [0]
///   ConnectingCollective    connect(uses), connect_bytes(): makes what the listed collectives need before they
///                           first run, handed each group's list before the memory reservation (Model,
///                           fsdp/plan/collectives.hpp), and says what that took (the NCCL row's "of it, connect")
///                           [nothing made ahead, 0]
template <class C>
concept LabelledCollective = CollectivePolicy<C> && requires(C& c, std::string_view unit) { c.label(unit); };

template <class C>
concept SplittableCollective = CollectivePolicy<C> && requires(C& c, int color, int key) {
  { c.split(color, key) } -> std::same_as<C>;
};

template <class C>
concept ConfiguringCollective = CollectivePolicy<C> && requires(C& c) {
  requires std::constructible_from<typename C::backend_type, int, decltype(c.backend_options())>;
};

template <class C>
concept SerialCollective = CollectivePolicy<C> && requires(const C& c) {
  { c.serial_collectives() } -> std::convertible_to<bool>;
};

template <class C>
concept DeviceMeasuredCollective = CollectivePolicy<C> && requires(const C& c) {
  { c.device_bytes() } -> std::convertible_to<std::int64_t>;
};

template <class C>
concept ConnectingCollective =
    CollectivePolicy<C> && requires(C& c, const C& cc, const std::vector<collective_use>& uses) {
  c.connect(uses);
  { cc.connect_bytes() } -> std::convertible_to<std::int64_t>;
};

namespace comm {
/// The capabilities above as calls that do what brackets say where the communicator lacks one.
template <CollectivePolicy C>
void label_next(C& c, std::string_view unit) {
  if constexpr (LabelledCollective<C>) c.label(unit);
}
template <CollectivePolicy C>
bool serial_collectives(const C& c) {
  if constexpr (SerialCollective<C>)
    return c.serial_collectives();
  else
    return false;
}
template <CollectivePolicy C>
std::int64_t device_bytes(const C& c) {
  if constexpr (DeviceMeasuredCollective<C>)
    return c.device_bytes();
  else
    return 0;
}
template <CollectivePolicy C>
std::int64_t connect_bytes(const C& c) {
  if constexpr (ConnectingCollective<C>)
    return c.connect_bytes();
  else
    return 0;
}
}  // namespace comm

namespace comm::detail {
/// The buffers of an all_to_all of `count` elements of `t` per pair among `ranks` ranks, on rank `rank`, must not
/// overlap: a usage_error says so otherwise.
inline void require_apart(const void* send, const void* recv, std::int64_t count, dtype t, int rank, int ranks);
/// The counts of an all_to_all_v on rank `rank` of `ranks` (UnevenAllToAllCollective), checked on this rank alone: one
/// count per rank in each span, none negative, what this rank sends itself as many as it receives from itself, and
/// buffers that do not overlap; a usage_error naming the rank and the count at fault otherwise. Returns the elements
/// this rank sends in all.
inline std::int64_t require_uneven(const void* send, std::span<const std::int64_t> send_counts, const void* recv,
                                   std::span<const std::int64_t> recv_counts, dtype t, int rank, int ranks);
/// A split's color must not be negative (MPI's and NCCL's negative colors mean "in no group"): a usage_error
/// naming the rank otherwise. Every communicator's split asks it first.
inline void require_color(int color, int rank);
/// A collective's count must not be negative: a usage_error otherwise, what() naming the collective and the rank
/// (each communicator as its other errors do). Every communicator's collectives ask it first.
template <class What>
void require_count(std::int64_t count, What&& what) {
  if (count < 0) fsdp::detail::fail_usage(what(), ": negative count");
}
}  // namespace comm::detail

}  // namespace fsdp

namespace fsdp::comm::detail {

inline void require_apart(const void* send, const void* recv, std::int64_t count, dtype t, int rank, int ranks) {
  const std::int64_t total = count * ranks;
  const auto* a = static_cast<const unsigned char*>(send);
  const auto* b = static_cast<const unsigned char*>(recv);
  const std::size_t span = static_cast<std::size_t>(total > 0 ? total : 0) * size_of(t);
  if (span && a < b + span && b < a + span)
    fsdp::detail::fail_usage("all_to_all(count=", count, ", ", name_of(t), ") on rank ", rank,
                             ": the send and receive buffers overlap; give it two buffers of ", span, " bytes each");
}

inline std::int64_t require_uneven(const void* send, std::span<const std::int64_t> send_counts, const void* recv,
                                   std::span<const std::int64_t> recv_counts, dtype t, int rank, int ranks) {
  const auto total = [&](std::span<const std::int64_t> counts, const char* name) {
    if (counts.size() != static_cast<std::size_t>(ranks))
      fsdp::detail::fail_usage("all_to_all_v on rank ", rank, ": ", name, " has ", counts.size(),
                               " counts for a group of ", ranks, " ranks; give one count per rank");
    std::int64_t sum = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (counts[q] < 0)
        fsdp::detail::fail_usage("all_to_all_v on rank ", rank, ": ", name, "[", q, "] is ", counts[q],
                                 "; a count must not be negative");
      sum += counts[q];
    }
    return sum;
  };
  const std::int64_t sent = total(send_counts, "send_counts"), received = total(recv_counts, "recv_counts");
  const auto self = static_cast<std::size_t>(rank);
  if (send_counts[self] != recv_counts[self])
    fsdp::detail::fail_usage("all_to_all_v on rank ", rank, ": it sends itself ", send_counts[self],
                             " elements (send_counts[", rank, "]) but receives ", recv_counts[self],
                             " from itself (recv_counts[", rank, "]); the two must be equal");
  const auto* a = static_cast<const unsigned char*>(send);
  const auto* b = static_cast<const unsigned char*>(recv);
  const std::size_t sent_bytes = static_cast<std::size_t>(sent) * size_of(t);
  const std::size_t received_bytes = static_cast<std::size_t>(received) * size_of(t);
  if (sent_bytes && received_bytes && a < b + received_bytes && b < a + sent_bytes)
    fsdp::detail::fail_usage("all_to_all_v on rank ", rank, ": the send buffer (", sent_bytes,
                             " bytes) and the receive buffer (", received_bytes,
                             " bytes) overlap; give it two buffers apart");
  return sent;
}

inline void require_color(int color, int rank) {
  if (color < 0) fsdp::detail::fail_usage("split on rank ", rank, ": color must be >= 0, got ", color);
}

}  // namespace fsdp::comm::detail
