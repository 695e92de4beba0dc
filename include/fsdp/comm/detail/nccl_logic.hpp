#pragma once
// The decisions of comm::nccl (nccl.cuh) that need neither NCCL nor CUDA to be made: when a call has settled, what
// an error says, in which order a group is launched and its completions recorded, how a group is abandoned, and how
// the communicator is shut down. nccl_core<Api> makes them over an "API" object: nccl.cuh's nccl_api calls NCCL and
// CUDA; the host tests (tests/comm/nccl_logic_test.cc) pass a fake that records the calls and scripts the answers.
// Host-only: no CUDA or NCCL header is included here. Beside it: the version gates (nccl_versions.hpp), a
// collective as messages name it (nccl_op.hpp), the ledger of collectives pending completion (nccl_pending.hpp), how
// a failure is told (nccl_failure_text.hpp) and what shrink() and connect() ask for (nccl_requests.hpp). This file
// declares nccl_core; its definitions are by job: the communicators and their family (nccl_logic.family.hpp), the
// collectives (nccl_logic.issue.hpp) and the failures (nccl_logic.failure.hpp), included at the end.
//
// What Api provides (nccl_api in nccl.cuh is the production one):
//   using result = ...;  static constexpr result success, in_progress, internal_error;
//                                                     ncclResult_t: ncclSuccess, ncclInProgress, ncclInternalError
//   using stream = ...;  using event = ...;  using comm = ...;              cudaStream_t, cudaEvent_t, ncclComm_t
//   using data_type = ...;  data_type type_of(dtype)  ncclDataType_t; a usage_error for a dtype this NCCL lacks
//                                                (resolved before any NCCL call of the collective is made)
//   result get_async_error(comm, result& state)  ncclCommGetAsyncError
//   result split(comm, int color, int key, comm& out)  ncclCommSplit, non-blocking like its parent
//   result comm_abort(comm)                      ncclCommAbort (the communicator is gone afterwards)
//   result revoke(comm)                          ncclCommRevoke (NCCL 2.28.7 or later; nccl_failure::revoke only)
//   result shrink(comm, const std::vector<int>& exclude, comm& out)
//                                                ncclCommShrink, non-blocking like its parent (2.28.7 or later)
//   int version()                                ncclGetVersion: the NCCL library's NCCL_VERSION_CODE
//   result finalize(comm);  result destroy(comm) ncclCommFinalize, ncclCommDestroy
//   result group_start();  result group_end()    ncclGroupStart, ncclGroupEnd
//   result fail_group(comm)                      a call NCCL rejects inside the open group (see grouped())
//   std::string describe(result, comm)           "ncclRemoteError (remote process exited or ...)"; comm{} allowed
//   event new_event();  void record(event, stream);  bool complete(event);  void destroy_event(event) noexcept
//   void wait(stream, event)                     cudaStreamWaitEvent
//   bool capturing(stream)                       cudaStreamIsCapturing: a collective issued on a stream being captured
//                                                (a CUDA graph) is not pending: it runs at each launch of the graph
//   stream new_stream();  void destroy_stream(stream) noexcept
//                                                a non-blocking stream at the device's most urgent priority (the
//                                                family's collective stream: see join_family)
//   void* device_alloc(std::size_t);  void device_free(void*) noexcept
//                                                cudaMalloc, zeroed (throws when either fails), and cudaFree:
//                                                connect()'s scratch
//   std::chrono::steady_clock::time_point now();  void sleep(std::chrono::microseconds)
//   void log(const std::string&) noexcept        one line on stderr (destructors only log)
//   std::int64_t free_device_bytes()             cudaMemGetInfo's free bytes (what a communicator's creation takes
//                                                is measured as the drop across it)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/detail/nccl_failure_text.hpp"
#include "fsdp/comm/detail/nccl_op.hpp"
#include "fsdp/comm/detail/nccl_pending.hpp"
#include "fsdp/comm/detail/nccl_requests.hpp"
#include "fsdp/comm/detail/nccl_versions.hpp"
#include "fsdp/comm/detail/stats_tally.hpp"
#include "fsdp/comm/nccl_channels.hpp"
#include "fsdp/comm/nccl_failure.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm {

namespace detail {

/// One rank's view of one NCCL group (the world, or a group split from it): its base communicator (barrier(),
/// split(), and every collective under nccl_channels::one), and under nccl_channels::per_stream one more per stream
/// name, split from the base on the stream's first collective, so that the gather stream's collectives never queue
/// behind the reduce stream's (NCCL runs the collectives of one communicator in the order they were issued, whatever
/// the stream). Every rank issues its collectives in program order, so the k-th new stream name on one rank is the
/// k-th on every rank, and the ncclCommSplit calls on the base match. Collectives are numbered across all of them
/// (#seq in messages). The device memory each communicator's creation took (free memory before and after) is kept:
/// device_bytes().
///
/// A family is a world core and the cores split from it (Model's shard and replicate groups): check() looks at
/// every member, and any failure aborts every member and names every member's pending collectives, because the
/// CUDA backend's waits watch the world communicator only. A family is used from one thread (the one that issues
/// its collectives and waits on its streams): abort() from another thread is not safe.
template <class Api>
class nccl_core {
 public:
  using result = typename Api::result;
  using stream = typename Api::stream;
  using event = typename Api::event;
  using comm = typename Api::comm;

  /// At most this many pending collectives are named in a message; the rest are counted.
  static constexpr std::size_t named_pending = 4;
  /// How often a call that answered in_progress is polled (ncclCommGetAsyncError).
  static constexpr std::chrono::microseconds poll_interval{20};
  /// How often ncclCommFinalize is polled at shutdown.
  static constexpr std::chrono::microseconds shutdown_poll_interval{1000};

  /// `name` is how messages call the group: "comm::nccl" for the world, longer for a split group. `on_failure`:
  /// what a failure does to this core's communicators (nccl_failure; revoke is refused below NCCL 2.28.7).
  nccl_core(Api api, int rank, int world, std::chrono::milliseconds timeout, std::string name = "comm::nccl",
            nccl_channels channels = nccl_channels::one, nccl_failure on_failure = nccl_failure::abort)
      : api_(std::move(api)),
        rank_(rank),
        world_(world),
        timeout_(timeout),
        name_(std::move(name)),
        channels_mode_(channels),
        on_failure_(on_failure),
        family_(std::make_shared<family>(api_)) {
    if (on_failure == nccl_failure::revoke)
      if (const std::string why = shrink_refusal(api_.version()); !why.empty()) throw usage_error(why);
    family_->members.push_back(this);
  }
  nccl_core(const nccl_core&) = delete;
  nccl_core& operator=(const nccl_core&) = delete;
  /// A core whose owner never called shutdown() (a constructor that threw after init()) aborts what it still has.
  ~nccl_core() {
    leave_family();
    release_events();
    abort_now();
  }

  Api& api() noexcept { return api_; }
  const Api& api() const noexcept { return api_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_; }
  const std::string& name() const noexcept { return name_; }
  /// Whether a failure has ended this core's collectives (aborted, or revoked under nccl_failure::revoke).
  bool aborted() const noexcept { return aborted_; }
  /// Whether its communicators were revoked rather than aborted: they are still there, for shrink().
  bool revoked() const noexcept { return revoked_; }
  const std::string& abort_reason() const noexcept { return reason_; }
  /// Collectives issued so far (the sequence number of the next one).
  std::uint64_t issued() const noexcept { return seq_; }
  /// The base communicator; comm{} before init() and once it is destroyed or aborted.
  comm base() const noexcept { return !channels_.empty() && channels_.front().live ? channels_.front().c : comm{}; }
  /// Communicators this core owns and has not ended: the base and one per stream name used so far.
  std::size_t live_communicators() const noexcept {
    std::size_t n = 0;
    for (const channel& ch : channels_) n += ch.live;
    return n;
  }

  /// Takes `c` as the base communicator, whose creation call answered `rc` (ncclCommInitRankConfig, or a split
  /// that has settled already), and settles it. `free_before`: free_device_bytes() just before the creation call
  /// (negative: not measured), so that device_bytes() counts what it took.
  void init(comm c, result rc, std::string_view call, std::string_view what, std::int64_t free_before = -1);
  /// The device's free memory now (cudaMemGetInfo), for init()'s `free_before`.
  std::int64_t free_device_bytes() { return api_.free_device_bytes(); }
  /// What the creation of this core's communicators, and connect(), took from the device, measured as the drop in
  /// free memory across each (other allocations at the same moment would count too).
  std::int64_t device_bytes() const noexcept {
    std::int64_t n = connect_bytes_;
    for (const channel& ch : channels_) n += ch.device_bytes;
    return n;
  }
  nccl_channels channels() const noexcept { return channels_mode_; }

  /// Joins `parent`'s family: from now on a failure of either aborts both, and a check() of either looks at both.
  ///
  /// One order for every communicator of the family. NCCL runs one communicator's collectives in the order they
  /// were issued, whatever the stream, but nothing orders two communicators' (NCCL's guide, "Using multiple NCCL
  /// communicators concurrently": operations on different communicators must be ordered the same on every rank, or
  /// they may deadlock). Hybrid sharding's groups issue on up to three at once: the shard group's gathers on the
  /// gather stream, its reductions and the replicas' all-reduce on the reduce stream, the world's loss and norm
  /// all-reduces on the compute stream. So once a family has a second communicator under nccl_channels::one,
  /// every collective of every member is issued on one stream of the family's, in the order the host issues them,
  /// which every rank shares (route()): the issuing stream's work so far is waited for (an event), the collective
  /// runs on the family's stream, and the issuing stream waits for it. At the join, that stream first waits for
  /// every collective still pending on any member, so the ones issued before the split come first too. Under
  /// nccl_channels::per_stream, NCCL_LAUNCH_ORDER_IMPLICIT=1 (which it requires) orders the launches of every
  /// communicator of the device by their host order already, and nothing is added.
  void join_family(nccl_core& parent);
  /// Whether the family's collectives go through one stream (see join_family).
  bool ordered() const noexcept { return family_->ordered; }

  /// A new communicator of the ranks that pass the same `color`, ranked by `key` (ncclCommSplit on the base, a
  /// collective of the base's ranks), settled. The caller owns it (a nccl_core of its own, usually joined to this
  /// one's family).
  comm split(int color, int key);

  /// The communicator of this group's ranks but `exclude` (ranks of this group, the same list on every survivor:
  /// NCCL does not say which rank failed, the survivors agree on it outside NCCL, e.g. through their launcher):
  /// ncclCommShrink on the base communicator, a collective of the survivors, settled under the timeout, ranked as
  /// here with the gaps closed. After a failure under nccl_failure::revoke, the revoked communicators are first
  /// waited for until NCCL says they are quiescent (their state ncclSuccess); on a healthy group (ranks that leave
  /// in order) it shrinks at once. Refused below NCCL 2.28.7, after a failure that aborted (nccl_failure::abort),
  /// inside grouped(), and for a list that excludes this rank, names a rank twice or one outside the group. The
  /// caller owns the new communicator (a family of its own); this core's communicators are aborted at its shutdown.
  comm shrink(std::vector<int> exclude);

  /// Names the unit the next collectives are for, so that an error can say so.
  void label(std::string_view unit) { label_.assign(unit); }

  collective_stats stats() const { return stats_.get(); }

  /// Issues one collective: `call(c, on, type)` makes the NCCL call on communicator `c` and stream `on` with the
  /// NCCL data type of `t` (Api::type_of, resolved first: a dtype this NCCL lacks is a usage_error before anything
  /// is issued), and returns its result. `c` is the communicator of stream name `key` (split from the base on the
  /// name's first collective), or the base when `key` is empty. `on` is `s`, or the family's collective stream once
  /// the family has several communicators (see join_family): `s`'s work so far comes first, and `s` waits for the
  /// collective. Once NCCL has accepted the call, an event recorded on `on` tracks its completion (inside
  /// grouped(): once the group is launched).
  template <class Call>
  void issue(collective kind, std::int64_t count, dtype t, std::int64_t total_elems, stream s, std::string_view key,
             Call&& call);

  /// An all-to-all of `count` elements of `t` per pair of ranks: NCCL has none of its own, so one group of a send
  /// and a receive per rank (this one included), `send(c, on, type, q)` and `recv(c, on, type, q)` making the NCCL
  /// calls for rank q, issued, settled and tracked as one collective. The group is always closed: a failed call
  /// inside it fails it as a whole (ncclGroupEnd launches none of it). Inside grouped() it joins the enclosing
  /// launch.
  template <class Send, class Recv>
  void all_to_all(std::int64_t count, dtype t, stream s, std::string_view key, Send&& send, Recv&& recv);

  /// An all_to_all_v (UnevenAllToAllCollective): `counts` this rank's send counts, then its receive counts
  /// (uneven_blocks), one group as all_to_all's, with `send(c, on, type, q, at, n)` and `recv(...)` called for each
  /// block that is not empty (`at` its first byte in the buffer, `n` its elements); stats count the elements this
  /// rank sends. NCCL is not told what the peers send, and does not say what counts that disagree do
  /// (docs/policies.md, "Uneven all_to_all").
  template <class Send, class Recv>
  void all_to_all_v(const std::vector<std::int64_t>& counts, dtype t, stream s, std::string_view key, Send&& send,
                    Recv&& recv);

  /// Makes what the collectives `uses` need before they are first issued, so that it is taken from the device
  /// now rather than inside a step: NCCL 2.28 connects an algorithm's ring, tree or NVLS buffers at the first
  /// collective that uses the algorithm (NCCL_RUNTIME_CONNECT, on by default wherever cuMem is: src/init.cc, and
  /// src/enqueue.cc's algoNeedConnect), which depends on the collective's kind and size, and a peer's send and
  /// receive buffers at the first ncclSend / ncclRecv with it (every peer, for an all-to-all). Each use runs once,
  /// in order, on the base communicator through `issue_one(use, send, recv)` (the caller's collective calls, on a
  /// stream of its own) over scratch buffers made for the largest (Api::device_alloc), not counted in stats() nor named
  /// as any unit's; all are waited for under the timeout, the scratch is freed, and the drop in free device memory
  /// across it all is added to connect_bytes() and device_bytes(). Every rank of the group calls it with the same
  /// uses (they are the plan's). A failure aborts the family, as any collective's does; the scratch is then left
  /// to the process (a collective may still hold it).
  template <class Issue>
  void connect(const std::vector<collective_use>& uses, Issue&& issue_one);
  /// What connect() took from the device (measured), and how many collectives it ran.
  std::int64_t connect_bytes() const noexcept { return connect_bytes_; }
  std::size_t connected() const noexcept { return connected_; }

  /// Runs fn() with its collectives grouped into one NCCL launch. Completion events are recorded only once
  /// ncclGroupEnd has launched the group, those of every core this thread issues on inside fn (NCCL's group is
  /// the thread's: another member of the family joins it). If fn throws, the group is abandoned: nothing of it is
  /// launched (a call that NCCL rejects inside the group makes ncclGroupEnd discard the whole group) and the
  /// communicator is aborted, because this rank's collective sequence no longer matches the other ranks'. ncclCommAbort
  /// is called only once the group is closed: inside an open group NCCL would merely queue it until ncclGroupEnd, which
  /// would then free the communicator before the queued collectives are prepared. A stream's first collective cannot be
  /// grouped (its communicator is split on that collective; see channel_for).
  template <class F>
  void grouped(F&& fn);

  /// Throws (after aborting the family) if NCCL reports an asynchronous error on any communicator of the family;
  /// the backend's synchronize() calls it while it waits.
  void check();

  /// A wait that ran out of time: aborts the family and throws comm_error naming what timed out and what is
  /// pending.
  [[noreturn]] void fail_timeout(const std::string& what);

  /// Aborts every communicator of the family: every pending and later operation fails. Never throws. While this
  /// thread has a group open (grouped()), the ncclCommAbort calls wait until it is closed: NCCL's group state is
  /// per thread, and an abort queued in a group that ncclGroupEnd then discards would never run.
  void abort(const std::string& reason) noexcept;

  /// The end of the communicators when they are not aborted: ncclCommFinalize on each (the streams' first, the
  /// base last), whose ncclInProgress is the normal answer of a non-blocking communicator, polled (with a short
  /// sleep) until all settle or the timeout passes, then ncclCommDestroy on each; an error or the timeout aborts
  /// them instead (ncclCommAbort). Only real failures are logged. Never throws; called once, by the owner's
  /// destructor.
  void shutdown() noexcept;

  /// The collectives issued and not yet complete, oldest first: "all_gather(count=8, f32) #3 for unit 'h.1', issued
  /// 12 ms ago and not complete; ..." (at most named_pending, then "and N more"), or "no collective pending".
  std::string pending_summary();

 private:
  /// all_to_all's and all_to_all_v's group: `send(c, on, type, q)` and `recv(...)` for each rank q, issued as one
  /// collective of `kind` with `count` (as messages name it) and `total` elements counted in the stats.
  template <class Send, class Recv>
  void exchange(collective kind, std::int64_t count, dtype t, std::int64_t total, stream s, std::string_view key,
                Send&& send, Recv&& recv);

  struct family {
    explicit family(const Api& a) : api(a) {}
    family(const family&) = delete;
    family& operator=(const family&) = delete;
    ~family() {
      if (ordered) api.destroy_stream(serial);
    }
    Api api;
    std::recursive_mutex mu;  ///< a member's failure inside check() aborts the family from the same thread
    std::vector<nccl_core*> members;
    bool ordered = false;  ///< every member's collectives go through `serial` (join_family)
    stream serial{};
  };
  struct channel {
    std::string key;  ///< the stream name; empty for the base
    comm c;
    bool live;                      ///< neither destroyed nor aborted
    std::int64_t device_bytes = 0;  ///< what its creation took (measured)
  };
  struct grouped_op {
    nccl_op op;
    stream s;   ///< the issuing stream
    stream on;  ///< where the collective runs: `s`, or the family's stream
    std::int64_t total_elems;
    nccl_core* owner;  ///< the core that issued it, which tracks its completion
  };
  /// The stream a collective issued on `s` runs on: `s`, or the family's (see join_family), which first waits for
  /// `s`'s work so far.
  stream route(stream s);

  /// Waits until every collective this core issued has completed, watching the family's errors, under the timeout.
  void drain(std::string_view what);
  /// The state of several communicators at once: an error wins over in_progress, which wins over success.
  struct state {
    result rc = Api::success;
    comm c{};
    void add(result r, comm from) {
      if (r == Api::success || rc == r) return;
      if (rc == Api::success || (rc == Api::in_progress && r != Api::in_progress)) {
        rc = r;
        c = from;
      }
    }
  };

  void leave_family() noexcept;

  /// The communicator of stream name `key`: the base for an empty key or under nccl_channels::one; else split from
  /// the base on the name's first collective.
  comm channel_for(std::string_view key);

  std::int64_t taken_since(std::int64_t free_before);

  comm split_base(int color, int key, const std::string& what);

  /// A new communicator from `parent` (ncclCommSplit or ncclCommShrink answered `rc`, writing `out` once its job has
  /// ended), settled: the parent's state, then the new one's; a failure aborts `out` and throws.
  comm settle_child(result rc, comm parent, comm& out, std::string_view call, const std::string& what);

  result async_state(comm c);
  state async_state_all();

  /// A call's result: success, or in_progress (non-blocking communicator) until ncclCommGetAsyncError on `c`
  /// settles, under the timeout. A failure aborts the family and throws comm_error naming the call, what it was
  /// for and the collectives still pending.
  void settle(result rc, comm c, std::string_view call, std::string_view what);
  /// settle() for a call that concerns every communicator of this core (ncclGroupEnd).
  void settle_all(result rc, std::string_view call, std::string_view what);

  void check_own();

  void abort_own(const std::string& reason) noexcept;

  /// nccl_failure::revoke: ncclCommRevoke on every communicator still live (the streams' first, the base last),
  /// once; they stay live for shrink() and are aborted at shutdown. A revoke that fails is logged and every
  /// communicator is aborted instead.
  void revoke_now() noexcept;

  /// How a failure leaves this core, for messages: "aborted" or "revoked".
  const char* ended() const noexcept { return nccl_ended(revoked_); }
  /// Who speaks in this core's messages: its name, rank and group size.
  nccl_speaker speaker() const noexcept { return {name_, rank_, world_}; }

  /// The pending collectives of every member of the family; a member's are prefixed with its name when the
  /// family has more than one.
  std::string family_pending();

  std::string pending_items() { return pending_.items(named_pending); }

  /// An NCCL failure (a call's result or an asynchronous error, seen on communicator `c`): aborts the family and
  /// throws comm_error naming the call (if any) and every pending collective with its unit and sequence number.
  [[noreturn]] void fail_nccl(result st, comm c, std::string_view during);

  /// fn threw inside grouped(): discard the group, abort, and say so.
  [[noreturn]] void abandon_group(std::exception_ptr cause);

  /// ncclCommAbort on every communicator still live (the streams' first, the base last).
  void abort_now() noexcept;

  void record(grouped_op g);

  void release_events() noexcept;

  Api api_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  nccl_channels channels_mode_;
  nccl_failure on_failure_;
  std::shared_ptr<family> family_;
  std::vector<channel> channels_;  ///< [0]: the base communicator; then one per stream name, in first-use order
  bool aborted_ = false;
  bool revoked_ = false;       ///< the failure revoked the communicators (nccl_failure::revoke): shrink() can follow
  bool revoke_tried_ = false;  ///< revoke_now() has run
  /// The core whose grouped() this thread is inside (NCCL's group state is per thread): every collective issued
  /// meanwhile, on any core, is queued in its group_ and recorded once the group is launched. Null outside.
  static inline thread_local nccl_core* group_owner_ = nullptr;
  /// Groups open on this thread, over every core: NCCL's group state (ncclGroupStart / ncclGroupEnd) is per thread.
  static inline thread_local int open_groups_ = 0;
  std::string reason_;
  std::string label_ = "(none)";
  std::uint64_t seq_ = 0;
  std::vector<grouped_op> group_;  ///< issued inside this core's grouped(), recorded once the group is launched
  nccl_pending<Api> pending_{api_};  ///< what it issued and has not seen complete, and the spare events
  stats_tally stats_;
  event handoff_{};  ///< route(): the issuing stream's work so far, for the family's stream to wait on
  bool has_handoff_ = false;
  bool connecting_ = false;  ///< connect() is issuing: not counted in stats_
  std::int64_t connect_bytes_ = 0;
  std::size_t connected_ = 0;
};

}  // namespace detail
}  // namespace fsdp::comm

// The definitions, one file per job (each includes this header, so any of them may be included alone).
#include "fsdp/comm/detail/nccl_logic.failure.hpp"
#include "fsdp/comm/detail/nccl_logic.family.hpp"
#include "fsdp/comm/detail/nccl_logic.issue.hpp"
