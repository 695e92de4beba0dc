#pragma once
// comm::mpi's group engine (fsdp/comm/mpi.hpp, whose header says what it does): the state a communicator shares
// with the collectives it handed to streams (one MPI communicator per stream name, set up on first use; the
// non-blocking operations and their deadlines; the first failure, which aborts the group), MPI's error texts and
// wire types, and the process-wide failure flag that mpi_session reads.
#include <mpi.h>

#include <algorithm>
#include <array>
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

namespace detail {

inline std::string error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(len));
}

inline std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
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
  /// After the busy polls, polls with a yield between them for this long; past it, a sleep between polls of an
  /// eighth of the time waited so far, at most `longest_sleep`. A rank that waits long (for a slow peer, or for a
  /// failure's timeout) then leaves the cores to the work beside it (a thread-rank test or a build sharing them, a
  /// data loader), and a wait ends at most an eighth of its time, or 1 ms, after its collective completed.
  static constexpr std::chrono::microseconds yield_for{1000};
  static constexpr std::chrono::microseconds longest_sleep{1000};

  /// Polls `req` until it completes. Past the deadline, or when another stream of this group has failed, the
  /// group fails, `keep` (the request's scratch buffers) is kept alive, and comm_error names `what`.
  template <class What>
  void wait(MPI_Request& req, std::chrono::steady_clock::time_point deadline, const What& what, const char* phase,
            std::shared_ptr<void> keep = nullptr) {
    std::chrono::steady_clock::time_point idle_since{};
    for (unsigned polls = 1;; ++polls) {
      int done = 0;
      const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        const std::string msg = what() + " failed" + during(phase) + ": " + error_string(rc);
        fail(msg, std::move(keep));
        throw comm_error(msg);
      }
      if (done) return;
      if (polls < busy_polls) continue;
      const auto now = std::chrono::steady_clock::now();
      if (failed()) {
        const std::string msg = what() + " aborted: " + reason();
        fail(msg, std::move(keep));
        throw comm_error(msg);
      }
      if (now > deadline) {
        const std::string msg =
            what() + " timed out after " + std::to_string(timeout_.count()) + " ms" + during(phase) +
            ": the other ranks did not complete it (a peer process died, or does not issue the same collectives in "
            "the same order; raise mpi_options::timeout if a peer is only slow)";
        fail(msg, std::move(keep));
        throw comm_error(msg);
      }
      if (polls == busy_polls) idle_since = now;
      const auto idle = now - idle_since;
      if (idle < yield_for)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(idle / 8, longest_sleep));
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
      case collective::all_to_all_v: {
        // The counts first, one per pair (what each rank sends this one), then the first pair that disagrees over
        // the group (by receiving rank, then sending rank: MPI_MIN of p * world + q) and, only when there is one,
        // its two counts: every rank names the same pair and leaves, the communicator still usable, instead of
        // waiting in an exchange that cannot match.
        auto plan = std::make_shared<uneven_plan>(d.counts, world);
        check(MPI_Ialltoall(plan->send64.data(), 1, MPI_INT64_T, plan->got.data(), 1, MPI_INT64_T, c, &req),
              "MPI_Ialltoall");
        wait(req, deadline, what, "(exchanging the counts)", plan);
        for (int q = 0; q < world && plan->first_bad == INT64_MAX; ++q)
          if (plan->got[static_cast<std::size_t>(q)] != plan->recv64[static_cast<std::size_t>(q)]) {
            plan->first_bad = std::int64_t(rank_) * world + q;
            plan->pair = {plan->recv64[static_cast<std::size_t>(q)], plan->got[static_cast<std::size_t>(q)]};
          }
        check(MPI_Iallreduce(MPI_IN_PLACE, &plan->first_bad, 1, MPI_INT64_T, MPI_MIN, c, &req), "MPI_Iallreduce");
        wait(req, deadline, what, "(checking the counts)", plan);
        if (plan->first_bad != INT64_MAX) {
          const int p = static_cast<int>(plan->first_bad / world), q = static_cast<int>(plan->first_bad % world);
          if (p != rank_) plan->pair = {INT64_MIN, INT64_MIN};  // the receiving rank's two counts, by MPI_MAX
          check(MPI_Iallreduce(MPI_IN_PLACE, plan->pair.data(), 2, MPI_INT64_T, MPI_MAX, c, &req), "MPI_Iallreduce");
          wait(req, deadline, what, "(naming the counts)", plan);
          throw comm_error(what() + ": " + comm::detail::uneven_pair_text(p, q, plan->pair[0], plan->pair[1]));
        }
        check(MPI_Ialltoallv(send, plan->send_counts.data(), plan->send_displs.data(), type, recv,
                             plan->recv_counts.data(), plan->recv_displs.data(), type, c, &req),
              "MPI_Ialltoallv");
        wait(req, deadline, what, "", plan);
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

  /// An all_to_all_v's counts as MPI takes them (ints: issue() checked the totals), kept until it completes.
  struct uneven_plan {
    std::vector<std::int64_t> send64, recv64, got;
    std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
    std::int64_t first_bad = INT64_MAX;  ///< receiving rank * world + sending rank of the first pair that disagrees
    std::array<std::int64_t, 2> pair{};  ///< that pair's counts: what the receiver expects, what the sender sends
    uneven_plan(const std::vector<std::int64_t>& counts, int world)
        : send64(counts.begin(), counts.begin() + world),
          recv64(counts.begin() + world, counts.end()),
          got(static_cast<std::size_t>(world)) {
      const comm::detail::uneven_blocks in_elements(counts, world, 1);
      for (int q = 0; q < world; ++q) {
        send_counts.push_back(static_cast<int>(in_elements.send_count(q)));
        send_displs.push_back(static_cast<int>(in_elements.send_at(q)));
        recv_counts.push_back(static_cast<int>(in_elements.recv_count(q)));
        recv_displs.push_back(static_cast<int>(in_elements.recv_at(q)));
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

}  // namespace fsdp::comm
