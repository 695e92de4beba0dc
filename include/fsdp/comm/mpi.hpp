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
#include "fsdp/comm/detail/stats_tally.hpp"
#include "fsdp/comm/launch.hpp"
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

namespace detail {

inline std::string error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(len));
}

inline std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "thread level " + std::to_string(level);
}

/// The MPI type that moves elements of `t` unchanged: unsigned integers of its width (the bits are copied, never
/// interpreted; reductions are the library's own, kernels::reduce_add).
inline MPI_Datatype wire_type(dtype t) {
  switch (size_of(t)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
  }
  fsdp::detail::fail_usage("comm::mpi: no MPI type moves elements of dtype ", name_of(t), " (", size_of(t), " bytes)");
}

/// Set once any comm::mpi collective of this process has failed: mpi_session then skips MPI_Finalize, whose fence
/// would wait for a peer that may be dead.
inline std::atomic<bool>& failed_in_process() {
  static std::atomic<bool> flag{false};
  return flag;
}

/// Keeps `p` alive until the process ends (the buffers of a collective that never completed: MPI may still write
/// them if the missing peer comes back).
inline void keep_forever(std::shared_ptr<void> p) {
  static std::mutex* mu = new std::mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>;  // never destroyed
  std::lock_guard lk(*mu);
  kept->push_back(std::move(p));
}

/// State shared by a communicator and the work it has submitted to streams (which may outlive it by a little).
class group {
 public:
  /// A stream's own duplicate of the communicator; `ready` once MPI_Comm_idup has completed. `mu` is held for the
  /// whole of each collective, which may use the scratch buffer (kept between collectives: no allocation, no page
  /// faults per call).
  struct stream_comm {
    std::string name;
    std::mutex mu;
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Request setup = MPI_REQUEST_NULL;
    bool ready = false;
    std::shared_ptr<unsigned char[]> scratch;
    std::size_t scratch_bytes = 0;

    unsigned char* scratch_of(std::size_t bytes) {
      if (scratch_bytes < bytes || !scratch) {
        scratch.reset(new unsigned char[bytes ? bytes : 1]);
        scratch_bytes = bytes;
      }
      return scratch.get();
    }
  };

  /// Takes ownership of `base` (a communicator of its own, with MPI_ERRORS_RETURN set).
  group(MPI_Comm base, int rank, int world, std::chrono::milliseconds timeout, std::string members)
      : base_(base), rank_(rank), world_(world), timeout_(timeout), members_(std::move(members)) {}
  group(const group&) = delete;
  group& operator=(const group&) = delete;

  ~group() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || failed() || base_ == MPI_COMM_NULL)
      return;  // after a failure, requests may still be pending
               // on them: leave them be
    for (const auto& s : streams_) {
      if (!s->ready && s->setup != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Test(&s->setup, &done, MPI_STATUS_IGNORE);
        s->ready = done != 0;
      }
      if (s->ready) MPI_Comm_free(&s->comm);
    }
    MPI_Comm_free(&base_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_; }
  MPI_Comm base() const noexcept { return base_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  const std::string& members() const noexcept { return members_; }

  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// Whether every stream's duplicate this rank started has been set up. Until then no collective runs on the
  /// issuing thread: blocked there, this rank would not start the next stream's MPI_Comm_idup, which the other
  /// ranks may have started, and Open MPI completes the duplications of one communicator only together (a run of
  /// mpi_test hung so, the gather and reduce streams' first collectives inline on some ranks and not on others).
  bool settled() const noexcept { return setting_up_.load(std::memory_order_acquire) == 0; }
  std::string reason() const {
    std::lock_guard lk(mu_);
    return reason_;
  }
  /// Marks the group failed (the first reason wins); `keep` stays alive as long as the process.
  void fail(const std::string& reason, std::shared_ptr<void> keep = nullptr) {
    {
      std::lock_guard lk(mu_);
      if (!failed_.load(std::memory_order_relaxed)) {
        reason_ = reason;
        failed_.store(true, std::memory_order_release);
        failed_in_process().store(true, std::memory_order_release);
      }
    }
    if (keep) keep_forever(std::move(keep));
  }

  /// The duplicate for stream `name`, started (MPI_Comm_idup on the calling thread) when the name is new.
  std::shared_ptr<stream_comm> stream_for(const std::string& name) {
    std::lock_guard lk(mu_);
    for (const auto& s : streams_)
      if (s->name == name) return s;
    auto s = std::make_shared<stream_comm>();
    s->name = name;
    if (!failed_.load(std::memory_order_relaxed)) {
      const int rc = MPI_Comm_idup(base_, &s->comm, &s->setup);
      if (rc != MPI_SUCCESS)
        fsdp::detail::fail_usage("comm::mpi on rank ", rank_, " of ", world_, ": MPI_Comm_idup for stream '", name,
                                 "' failed: ", error_string(rc));
      setting_up_.fetch_add(1, std::memory_order_acq_rel);
    }
    streams_.push_back(s);
    return s;
  }

  /// "mpi all_gather(count=8, f32) #3 for unit 'h.1' on rank 0 of 4"; a split group says which ranks of the group
  /// it was split from it holds: "mpi[ranks 2, 3] ...".
  std::string describe(std::string_view what, std::uint64_t seq, std::string_view unit) const {
    std::string s = "mpi" + members_ + " " + std::string(what) + " #" + std::to_string(seq);
    if (!unit.empty()) s += " for unit '" + std::string(unit) + "'";
    return s + " on rank " + std::to_string(rank_) + " of " + std::to_string(world_);
  }

  static std::string during(const char* phase) { return *phase ? std::string(" ") + phase : std::string(); }

  /// MPI_Test calls made back to back before each further one yields the CPU: about 20 us, in which a small
  /// collective completes. A yield between every two polls made an all-gather of 1 to 16 KiB 1.02 to 1.19 times as
  /// slow as a blocking MPI_Allgather on the development machine (4 processes on 2 cores); polling alone, 0.77 to 1.12.
  static constexpr unsigned busy_polls = 256;

  /// Polls `req` until it completes. Past the deadline, or when another stream of this group has failed, the
  /// group fails, `keep` (the request's scratch buffers) is kept alive, and comm_error names `what`.
  template <class What>
  void wait(MPI_Request& req, std::chrono::steady_clock::time_point deadline, const What& what, const char* phase,
            std::shared_ptr<void> keep = nullptr) {
    for (unsigned spin = 0;; ++spin) {
      int done = 0;
      const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        const std::string msg = what() + " failed" + during(phase) + ": " + error_string(rc);
        fail(msg, std::move(keep));
        throw comm_error(msg);
      }
      if (done) return;
      if ((spin & 63) == 63) {
        if (failed()) {
          const std::string msg = what() + " aborted: " + reason();
          fail(msg, std::move(keep));
          throw comm_error(msg);
        }
        if (std::chrono::steady_clock::now() > deadline) {
          const std::string msg =
              what() + " timed out after " + std::to_string(timeout_.count()) + " ms" + during(phase) +
              ": the other ranks did not complete it (a peer process died, or does not issue the same collectives in "
              "the same order; raise mpi_options::timeout if a peer is only slow)";
          fail(msg, std::move(keep));
          throw comm_error(msg);
        }
      }
      if (spin >= busy_polls) std::this_thread::yield();
    }
  }

  /// Rank `rank_`'s part of collective #seq, on the stream's worker (or the calling thread of an inline stream).
  void run(stream_comm& sc, const comm::detail::op_desc& d, std::uint64_t seq, const std::string& unit,
           const void* send, void* recv) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    const auto what = [&] { return describe(d.str(), seq, unit); };
    if (failed()) throw comm_error(what() + " aborted: " + reason());
    std::lock_guard lk(sc.mu);
    if (!sc.ready) {
      if (sc.setup == MPI_REQUEST_NULL) throw comm_error(what() + " aborted: " + reason());
      wait(sc.setup, deadline, what, "while setting up this stream's communicator (MPI_Comm_idup)");
      sc.ready = true;
      setting_up_.fetch_sub(1, std::memory_order_acq_rel);
    }
    MPI_Comm c = sc.comm;
    const auto kind = static_cast<collective>(d.kind);
    const MPI_Datatype type = wire_type(d.type);
    const std::size_t esize = size_of(d.type);
    const std::size_t n = static_cast<std::size_t>(d.count);
    const int count = static_cast<int>(d.count);  // issue() checked the range
    const int world = world_;
    auto check = [&](int rc, const char* call) {
      if (rc != MPI_SUCCESS) {
        const std::string msg = what() + ": " + call + " failed: " + error_string(rc);
        fail(msg);
        throw comm_error(msg);
      }
    };
    MPI_Request req = MPI_REQUEST_NULL;
    switch (kind) {
      case collective::all_gather: {
        const bool in_place = send == static_cast<const char*>(recv) + static_cast<std::size_t>(rank_) * n * esize;
        check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count, type, recv, count, type, c, &req),
              "MPI_Iallgather");
        wait(req, deadline, what, "");
        return;
      }
      case collective::all_to_all: {
        check(MPI_Ialltoall(send, count, type, recv, count, type, c, &req), "MPI_Ialltoall");
        wait(req, deadline, what, "");
        return;
      }
      case collective::broadcast: {
        if (rank_ == d.root && send != recv && n) std::memcpy(recv, send, n * esize);
        check(MPI_Ibcast(recv, count, type, d.root, c, &req), "MPI_Ibcast");
        wait(req, deadline, what, "");
        return;
      }
      case collective::reduce_scatter: {
        // rank q's chunk for this rank lands at q * n: then the rank-ordered reduction of the n chunks
        unsigned char* tmp = sc.scratch_of(static_cast<std::size_t>(world) * n * esize);
        check(MPI_Ialltoall(send, count, type, tmp, count, type, c, &req), "MPI_Ialltoall");
        wait(req, deadline, what, "", sc.scratch);
        comm::detail::reduce_in_rank_order(
            d.type, d.op, world, n, [&](int q) { return tmp + static_cast<std::size_t>(q) * n * esize; }, recv);
        return;
      }
      case collective::all_reduce: {
        if (n * esize <= small_all_reduce_bytes) {  // every rank's whole buffer, then the whole reduction
          unsigned char* tmp = sc.scratch_of(static_cast<std::size_t>(world) * n * esize);
          check(MPI_Iallgather(send, count, type, tmp, count, type, c, &req), "MPI_Iallgather");
          wait(req, deadline, what, "", sc.scratch);
          comm::detail::reduce_in_rank_order(
              d.type, d.op, world, n, [&](int q) { return tmp + static_cast<std::size_t>(q) * n * esize; }, recv);
          return;
        }
        // chunk q: [displs[q], displs[q] + counts[q]); rank q reduces chunk q, then every rank gathers every chunk
        auto plan = std::make_shared<all_reduce_plan>(world, count, rank_);
        const int mine = plan->counts[static_cast<std::size_t>(rank_)];
        unsigned char* tmp = sc.scratch_of(static_cast<std::size_t>(world) * static_cast<std::size_t>(mine) * esize);
        plan->scratch = sc.scratch;  // kept with the counts if the collective never completes
        check(MPI_Ialltoallv(send, plan->counts.data(), plan->displs.data(), type, tmp, plan->mine.data(),
                             plan->mine_displs.data(), type, c, &req),
              "MPI_Ialltoallv");
        wait(req, deadline, what, "(reduce-scatter phase)", plan);
        // Every rank has received this rank's chunks (the request completed): recv may now be written, even when
        // it is send.
        char* out =
            static_cast<char*>(recv) + static_cast<std::size_t>(plan->displs[static_cast<std::size_t>(rank_)]) * esize;
        comm::detail::reduce_in_rank_order(
            d.type, d.op, world, static_cast<std::size_t>(mine),
            [&](int q) { return tmp + static_cast<std::size_t>(q) * static_cast<std::size_t>(mine) * esize; }, out);
        check(MPI_Iallgatherv(MPI_IN_PLACE, 0, type, recv, plan->counts.data(), plan->displs.data(), type, c, &req),
              "MPI_Iallgatherv");
        wait(req, deadline, what, "(all-gather phase)", plan);
        return;
      }
    }
  }

  /// Blocks the calling thread until every rank has reached its barrier #seq (MPI_Ibarrier on `c`).
  void barrier(MPI_Comm c, std::uint64_t seq) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    const auto what = [&] { return describe("barrier", seq, {}); };
    if (failed()) throw comm_error(what() + " aborted: " + reason());
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Ibarrier(c, &req);
    if (rc != MPI_SUCCESS) {
      const std::string msg = what() + ": MPI_Ibarrier failed: " + error_string(rc);
      fail(msg);
      throw comm_error(msg);
    }
    wait(req, deadline, what, "");
  }

  /// An all_reduce above this size (bytes per rank) takes the two-phase path.
  static constexpr std::size_t small_all_reduce_bytes = 32 * 1024;

 private:
  struct all_reduce_plan {
    std::vector<int> counts, displs, mine, mine_displs;  // MPI reads them until the collective completes
    std::shared_ptr<unsigned char[]> scratch;
    all_reduce_plan(int world, int count, int rank) {
      const int base = count / world, extra = count % world;
      for (int q = 0, at = 0; q < world; ++q) {
        counts.push_back(base + (q < extra ? 1 : 0));
        displs.push_back(at);
        at += counts.back();
      }
      const int m = counts[static_cast<std::size_t>(rank)];
      for (int q = 0; q < world; ++q) {
        mine.push_back(m);
        mine_displs.push_back(q * m);
      }
    }
  };

  MPI_Comm base_;
  const int rank_;
  const int world_;
  const std::chrono::milliseconds timeout_;
  const std::string members_;
  mutable std::mutex mu_;
  std::atomic<bool> failed_{false};
  std::atomic<int> setting_up_{0};  // duplicates started by stream_for and not yet set up (settled())
  std::string reason_;
  std::vector<std::shared_ptr<stream_comm>> streams_;
};

/// Fails with a usage_error unless MPI is initialised (and not finalised) with MPI_THREAD_MULTIPLE.
inline void require_thread_multiple(const char* who) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    fsdp::detail::fail_usage(who, ": MPI is ", finalized ? "already finalised" : "not initialised",
                             "; create an fsdp::comm::mpi_session (or call MPI_Init_thread with MPI_THREAD_MULTIPLE) "
                             "at the start of main, before any communicator, and keep it alive until they are gone");
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided != MPI_THREAD_MULTIPLE)
    fsdp::detail::fail_usage(who, ": MPI was initialised with ", thread_level_name(provided),
                             ", but comm::mpi calls MPI from several threads (each stream's worker) and needs "
                             "MPI_THREAD_MULTIPLE; initialise MPI with MPI_Init_thread(&argc, &argv, "
                             "MPI_THREAD_MULTIPLE, &provided) or an fsdp::comm::mpi_session instead of MPI_Init");
}

}  // namespace detail

/// MPI for the length of a program: MPI_Init_thread with MPI_THREAD_MULTIPLE on construction (a usage_error when
/// the library cannot provide it, or MPI is already initialised), MPI_Finalize on destruction. Create it first in
/// main; destroy every communicator and Model before it.
///
/// After a comm::mpi collective of this process has failed, the destructor does not call MPI_Finalize: Open MPI's
/// MPI_Finalize waits (a PMIx fence, with no time limit) for every process of the job, and a peer that died never
/// comes (seen with Open MPI 4.1.4 under mpirun --enable-recovery: survivors stuck in MPI_Finalize about one run in
/// three). The process then ends without finalising: under plain mpirun that ends the whole job with an error, as a
/// failed collective should; under --enable-recovery the other processes run on.
class mpi_session {
 public:
  mpi_session() : mpi_session(nullptr, nullptr) {}
  mpi_session(int& argc, char**& argv) : mpi_session(&argc, &argv) {}
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !finalize_skipped()) MPI_Finalize();
  }

  /// Whether the destructor will skip MPI_Finalize because a collective of this process failed.
  static bool finalize_skipped() noexcept { return detail::failed_in_process().load(std::memory_order_acquire); }

  /// This process's rank in MPI_COMM_WORLD and the world size.
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_; }

 private:
  mpi_session(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized)
      fsdp::detail::fail_usage(
          "mpi_session: MPI is already initialised; create one mpi_session at the start of main "
          "and no other MPI_Init");
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      fsdp::detail::fail_usage("mpi_session: MPI_Init_thread failed: ", detail::error_string(rc),
                               "; start the program with mpirun");
    if (provided != MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      fsdp::detail::fail_usage("mpi_session: this MPI library provides only ", detail::thread_level_name(provided),
                               ", and comm::mpi needs MPI_THREAD_MULTIPLE; use an MPI built with thread support "
                               "(Open MPI: --enable-mpi-thread-multiple, the default since 3.0; `ompi_info | grep "
                               "THREAD_MULTIPLE` shows it)");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
  }

  int rank_ = 0;
  int world_ = 1;
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

static_assert(CollectivePolicy<mpi_communicator> && AllToAllCollective<mpi_communicator>);
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
