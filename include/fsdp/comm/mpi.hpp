#pragma once
// comm::mpi: ranks as processes started by mpirun, over host memory (the host backend), through Open MPI (or any
// MPI-3 library with MPI_THREAD_MULTIPLE). Not included by <fsdp/fsdp.hpp>: include <fsdp/comm/mpi.hpp> and link
// MPI (Bazel: @mpi//:mpi; CMake: MPI's C library).
//
//   int main(int argc, char** argv) {
//     fsdp::comm::mpi_session mpi(argc, argv);           // MPI_Init_thread(MPI_THREAD_MULTIPLE) ... MPI_Finalize
//     fsdp::comm::mpi_communicator comm;                  // MPI_COMM_WORLD
//     fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full,
//                              fsdp::comm::mpi<>>> model(comm, spec, wrap);
//   }
//   mpirun -np 4 ./trainer
//
// Stream order. A collective is issued on a host stream and runs when the stream reaches it, on the stream's worker
// thread (on the calling thread for the inline compute stream). issue() counts it in stats() on the calling
// thread, as comm::local does; the worker starts non-blocking MPI operations and polls MPI_Test until they complete
// or the timeout passes. A small collective (mpi_options::inline_max_bytes, 64 KiB) issued on a stream with nothing
// queued or running, once every stream's communicator this rank started is set up (group::settled), runs at once
// on the calling thread instead, which blocks until it completes: the stream's order is the same, the hand-off to
// the worker, which costs more than the collective, is saved, and its failure is the stream's, reported where the
// worker's would be. Since issue() may then wait for the peers, every rank must issue the collectives of its
// streams in one order (the Model does): ranks that issued on two streams in different orders would each wait
// inline for a collective the other has not issued.
//
// One MPI communicator per stream. MPI matches the collectives of one communicator by the order in which each rank
// starts them, so two streams must not share one: the gather and reduce streams run concurrently, and their
// collectives would start in a different order on different ranks. Each stream therefore gets its own duplicate of
// the communicator (MPI_Comm_idup), made the first time a collective is issued on it, on the issuing thread, so the
// k-th stream a rank uses gets the k-th duplicate on every rank (issue order is program order, the same on every
// rank). A stream is known by its name: streams of one name (the Model's "rankN.all_gather", "rankN.reduce",
// "rankN.compute") share one duplicate, which is what a later Model on the same communicator needs; two streams of
// one name must not have collectives in flight at the same time. barrier() and split() use a duplicate of their
// own, on the calling thread.
//
// Results are bit-identical to comm::local's (detail/local_group.hpp): MPI only moves data, never adds it (no
// MPI_SUM). all_gather and broadcast copy; a reduction is the sum over ranks in rank order, rounded to the dtype
// after every addition, an average pre-multiplied by 1/world rounded to the dtype (detail::reduce_in_rank_order, the
// function comm::local uses):
//   reduce_scatter  MPI_Ialltoall of the ranks' chunks, then the rank-ordered reduction of this rank's chunk;
//   all_reduce      up to 32 KiB: MPI_Iallgather of every rank's buffer, then the reduction of all of it; larger:
//                   MPI_Ialltoallv of uneven chunks (count / world, the first count % world chunks one longer),
//                   the reduction of this rank's chunk, then MPI_Iallgatherv (in place) of the reduced chunks.
//
// Failure. Every wait has a deadline (mpi_options::timeout, from the moment the stream reaches the collective): a
// peer process that died or never issues the collective makes this rank fail with a comm_error that names the
// collective, its sequence number, the unit label, the rank and the world, e.g.
//   "mpi all_gather(count=8, f32) #3 for unit 'h.1' on rank 0 of 4 timed out after 2000 ms: ..."
// MPI cannot cancel a started collective, so after a failure the communicator is aborted: its pending and later
// collectives fail at once ("... aborted: <first failure>"), its scratch buffers are kept alive (a late peer may
// still write them) and its MPI communicators are not freed. The process should then report and end; a buffer
// given to the failed collective may still be written if the missing peer comes back. Under mpirun, a process
// that dies (or exits non-zero) makes mpirun kill every other process at once by default; start mpirun with
// --enable-recovery to let the survivors report their own errors (docs/mpi.md).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/backend/host.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/detail/collective_front.hpp"
#include "fsdp/comm/detail/local_group.hpp"
#include "fsdp/comm/detail/mpi_group.hpp"
#include "fsdp/comm/detail/stats_tally.hpp"
#include "fsdp/comm/launch.hpp"
#include "fsdp/comm/mpi_session.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm {

struct mpi_options {
  /// Longest a rank waits for one collective (from the moment its stream reaches it) before it fails.
  std::chrono::milliseconds timeout{60000};
  /// A collective of at most this many bytes (the unsharded buffer: an all-gather's output, a reduce-scatter's
  /// input) issued on a threaded stream with nothing queued or running runs at once on the issuing thread, which
  /// blocks until it completes, instead of being handed to the stream's worker (whose hand-off costs more than a
  /// small collective). 0: always the worker.
  std::int64_t inline_max_bytes = std::int64_t{64} << 10;
  /// Options of this rank's host backend (a Model built on this communicator uses them).
  backend::host_options backend{};
};

/// One process's handle on a group of MPI processes. Not copyable or movable: a Model keeps a reference to it.
/// Collective to construct (every process of `comm` constructs one, in the same order as its other collectives).
class mpi_communicator : public detail::collective_front<mpi_communicator, backend::host::stream> {
 public:
  using backend_type = backend::host;
  using stream = backend_type::stream;

  /// Joins the processes of `comm` (duplicated: the caller's communicator is never used for collectives). MPI must
  /// be initialised with MPI_THREAD_MULTIPLE (mpi_session).
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, mpi_options opt = {}) : opt_(std::move(opt)) {
    detail::require_thread_multiple("comm::mpi");
    if (comm == MPI_COMM_NULL) fsdp::detail::fail_usage("comm::mpi: the communicator is MPI_COMM_NULL");
    if (opt_.timeout.count() <= 0)
      fsdp::detail::fail_usage("comm::mpi: mpi_options::timeout must be positive, got ", opt_.timeout.count(), " ms");
    int rank = 0, world = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    if (world == 1 && comm == MPI_COMM_WORLD) refuse_foreign_launcher();
    MPI_Comm base = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Comm_idup(comm, &base, &req);
    if (rc != MPI_SUCCESS)
      fsdp::detail::fail_usage("comm::mpi on rank ", rank, " of ", world,
                               ": MPI_Comm_idup failed: ", detail::error_string(rc));
    // A group without a communicator yet: its wait() gives the bounded, named failure.
    auto setup = std::make_shared<detail::group>(MPI_COMM_NULL, rank, world, opt_.timeout, "");
    setup->wait(
        req, std::chrono::steady_clock::now() + opt_.timeout,
        [&] { return setup->describe("set-up (MPI_Comm_idup of the communicator)", 0, {}); }, "");
    adopt(base, rank, world, "");
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  int rank() const noexcept { return g_->rank(); }
  int size() const noexcept { return g_->size(); }
  std::chrono::milliseconds timeout() const noexcept { return opt_.timeout; }
  /// The options a backend made for this rank should use.
  const backend::host_options& backend_options() const noexcept { return opt_.backend; }
  /// This communicator's own duplicate of the MPI communicator (barrier and split use it).
  MPI_Comm native() const noexcept { return g_->base(); }

  /// Names the unit the next collectives are for (Model calls it), so that an error can say so.
  void label(std::string_view unit) { label_.assign(unit); }

  /// Blocks the calling thread until every rank has reached its matching barrier (under the timeout).
  void barrier() { g_->barrier(g_->base(), seq_++); }

  /// Collective (every rank calls it, in the same order as its other collectives): the ranks that pass the same
  /// `color` (>= 0) form a new communicator, ranked by (key, rank), as MPI_Comm_split does. Runs on the calling
  /// thread and is not counted in stats(). The ranks first meet in an all-gather of (color, key) under the timeout
  /// (so a missing peer is a named comm_error, not a hang), then MPI_Comm_split makes the group.
  mpi_communicator split(int color, int key) {
    comm::detail::require_color(color, rank());
    const std::uint64_t seq = seq_++;
    const auto what = [&] { return g_->describe("split(color=" + std::to_string(color) + ")", seq, {}); };
    if (g_->failed()) throw comm_error(what() + " aborted: " + g_->reason());
    const int mine[2] = {color, key};
    std::vector<int> all(static_cast<std::size_t>(2 * size()));
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, g_->base(), &req) != MPI_SUCCESS)
      throw comm_error(what() + ": MPI_Iallgather failed");
    g_->wait(req, std::chrono::steady_clock::now() + opt_.timeout, what, "");
    MPI_Comm sub = MPI_COMM_NULL;
    const int rc = MPI_Comm_split(g_->base(), color, key, &sub);
    if (rc != MPI_SUCCESS) throw comm_error(what() + ": MPI_Comm_split failed: " + detail::error_string(rc));
    // Which ranks of this group the new one holds, in its rank order, for its messages: "[ranks 2, 3]".
    std::vector<std::pair<int, int>> colors_keys;
    for (std::size_t q = 0; q < all.size(); q += 2) colors_keys.emplace_back(all[q], all[q + 1]);
    const std::string names = comm::detail::members_label(comm::detail::split_members(colors_keys, color));
    int sub_rank = 0, sub_world = 0;
    MPI_Comm_rank(sub, &sub_rank);
    MPI_Comm_size(sub, &sub_world);
    return mpi_communicator(adopt_tag{}, sub, sub_rank, sub_world, opt_, names);
  }

  /// What comm::local_communicator::shrink does (the survivors' communicator after a rank failed) needs MPI's fault
  /// tolerance, ULFM (MPIX_Comm_revoke, MPIX_Comm_shrink): not in the MPI standard, not in Debian's Open MPI 4.1
  /// (Open MPI 5 has it when built with --with-ft=ulfm), and not built here. Refused with that sentence: a failed
  /// rank is still named within the timeout (detection), and the job restarts from its last checkpoint.
  [[noreturn]] mpi_communicator shrink(std::vector<int>* survivors = nullptr) {
    (void)survivors;
    fsdp::detail::fail_usage(
        "comm::mpi: shrink() needs MPI's fault tolerance (ULFM: MPIX_Comm_revoke and MPIX_Comm_shrink, in Open MPI 5 "
        "built with --with-ft=ulfm), which comm::mpi does not use (Debian's Open MPI 4.1 has none): after a lost "
        "rank, restart every rank from the last checkpoint, or train on comm::local, whose shrink() keeps the "
        "survivors going");
  }

  collective_stats stats() const { return stats_.get(); }
  void reset_stats() { stats_.reset(); }
  /// Collectives issued so far (the sequence number of the next one), barriers and splits included.
  std::uint64_t issued() const noexcept { return seq_; }
  /// Whether a collective of this communicator has failed (every later one then fails at once).
  bool failed() const noexcept { return g_->failed(); }

 private:
  friend class detail::collective_front<mpi_communicator, backend::host::stream>;
  struct adopt_tag {};

  /// A process started by torchrun, or by srun without a PMI this MPI can use, initialises MPI alone, as a world
  /// of 1: the processes would each train alone. Refused, saying which launcher to use (mpi_launch_mismatch).
  static void refuse_foreign_launcher() {
    if (const std::string why = mpi_launch_mismatch(1); !why.empty()) fsdp::detail::fail_usage(why);
  }
  mpi_communicator(adopt_tag, MPI_Comm own, int rank, int world, const mpi_options& opt, std::string members)
      : opt_(opt) {
    adopt(own, rank, world, std::move(members));
  }

  void adopt(MPI_Comm own, int rank, int world, std::string members) {
    MPI_Comm_set_errhandler(own, MPI_ERRORS_RETURN);  // errors come back as codes, and become comm_errors
    g_ = std::make_shared<detail::group>(own, rank, world, opt_.timeout, std::move(members));
  }

  void issue(const comm::detail::op_desc& d, const void* send, void* recv, stream& s, std::int64_t total_elems) {
    comm::detail::require_count(d.count, [&] { return g_->describe(d.str(), seq_, label_); });
    if (d.count > INT_MAX)
      fsdp::detail::fail_usage(g_->describe(d.str(), seq_, label_), ": ", d.count,
                               " elements exceed MPI's int counts (", INT_MAX, "); split the unit into smaller ones");
    if (d.kind == int(collective::all_to_all_v)) {  // MPI_Alltoallv's displacements are ints too
      std::int64_t received = 0;
      for (std::size_t q = d.counts.size() / 2; q < d.counts.size(); ++q) received += d.counts[q];
      if (received > INT_MAX)
        fsdp::detail::fail_usage(g_->describe(d.str(), seq_, label_), ": it receives ", received,
                                 " elements, over MPI's int counts and displacements (", INT_MAX,
                                 "); send the tokens in smaller all_to_all_v calls");
    }
    if (std::vector<std::function<void()>>* calls = s.capture()) {  // captured (backend::host::begin_capture): each
      calls->emplace_back([this, d, send, recv, &s, total_elems, label = label_] {  // replay issues it again
        label_ = label;
        issue(d, send, recv, s, total_elems);
      });
      return;
    }
    const std::uint64_t seq = seq_++;
    stats_.add(static_cast<std::size_t>(d.kind), d.type, total_elems);
    auto sc = g_->stream_for(s.name());  // the stream's communicator, started here when the stream is new
    auto run = [g = g_, sc, d, seq, unit = label_, send, recv] { g->run(*sc, d, seq, unit, send, recv); };
    const std::int64_t bytes = total_elems * static_cast<std::int64_t>(size_of(d.type));
    if (opt_.inline_max_bytes > 0 && bytes <= opt_.inline_max_bytes && g_->settled() && s.run_if_idle(run)) return;
    s.submit(std::move(run));
  }

  mpi_options opt_;
  std::shared_ptr<detail::group> g_;
  std::string label_;
  std::uint64_t seq_ = 0;
  comm::detail::stats_tally stats_;
};

static_assert(CollectivePolicy<mpi_communicator> && AllToAllCollective<mpi_communicator> &&
              UnevenAllToAllCollective<mpi_communicator>);
// Which of the optional capabilities (fsdp/comm/concept.hpp) it has, and which not.
static_assert(LabelledCollective<mpi_communicator> &&
              SplittableCollective<mpi_communicator> &&
              ConfiguringCollective<mpi_communicator> &&
              !SerialCollective<mpi_communicator> &&
              !DeviceMeasuredCollective<mpi_communicator> &&
              !ConnectingCollective<mpi_communicator>);

/// Policy tag: ranks as MPI processes. The nested `communicator` is the per-process handle.
template <class Backend = backend::host>
struct mpi {
  static_assert(std::is_same_v<Backend, backend::host>,
                "fsdp::comm::mpi: MPI moves host memory, so it serves the host backend only; for GPUs use "
                "comm::nccl (fsdp/comm/nccl.cuh), with comm::nccl_from_mpi (fsdp/comm/nccl_mpi.cuh) to start it "
                "under mpirun");
  using backend_type = Backend;
  using communicator = mpi_communicator;
};

}  // namespace fsdp::comm
