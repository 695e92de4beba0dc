#pragma once
// The decisions of comm::nccl (nccl.cuh) that need neither NCCL nor CUDA to be made: when a call has settled, what
// an error says, in which order a group is launched and its completions recorded, how a group is abandoned, and how
// the communicator is shut down. nccl_core<Api> makes them over an "API" object: nccl.cuh's nccl_api calls NCCL and
// CUDA; the host tests (tests/comm/nccl_logic_test.cc) pass a fake that records the calls and scripts the answers.
// Host-only: no CUDA or NCCL header is included here.
//
// What Api provides (nccl_api in nccl.cuh is the production one):
//   using result = ...;  static constexpr result success, in_progress, internal_error;
//                                                     ncclResult_t: ncclSuccess, ncclInProgress, ncclInternalError
//   using stream = ...;  using event = ...;  using comm = ...;              cudaStream_t, cudaEvent_t, ncclComm_t
//   result get_async_error(comm, result& state)  ncclCommGetAsyncError
//   result split(comm, int color, int key, comm& out)  ncclCommSplit, non-blocking like its parent
//   result comm_abort(comm)                      ncclCommAbort (the communicator is gone afterwards)
//   result finalize(comm);  result destroy(comm) ncclCommFinalize, ncclCommDestroy
//   result group_start();  result group_end()    ncclGroupStart, ncclGroupEnd
//   result fail_group(comm)                      a call NCCL rejects inside the open group (see grouped())
//   std::string describe(result, comm)           "ncclRemoteError (remote process exited or ...)"; comm{} allowed
//   event new_event();  void record(event, stream);  bool complete(event);  void destroy_event(event) noexcept
//   std::chrono::steady_clock::time_point now();  void sleep(std::chrono::microseconds)
//   void log(const std::string&) noexcept        one line on stderr (destructors only log)
//   std::int64_t free_device_bytes()             cudaMemGetInfo's free bytes (what a communicator's creation takes
//                                                is measured as the drop across it)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/detail/stats_tally.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm {

/// Which NCCL communicators a comm::nccl group issues its collectives on (nccl_options::channels).
///
///   one          every collective on the group's one communicator (the default). NCCL runs a communicator's
///                collectives in the order they were issued, whatever the stream, and every rank issues in program
///                order: one order on every rank, by construction. The gather and reduce streams' collectives then
///                run one after the other (each still overlaps compute), as PyTorch FSDP2's do on its one process
///                group. No communicator is made after construction.
///   per_stream   one communicator per stream name, split from the group's on the stream's first collective, so that
///                a prefetched all-gather never queues behind a reduce-scatter. NCCL's guide ("Using multiple NCCL
///                communicators concurrently") requires operations on different communicators to be ordered the
///                same on every rank, and each rank's GPU order here depends on its own event waits: safe only where
///                NCCL orders the launches of one device's communicators by their host order, which NCCL 2.26 and
///                later do with NCCL_LAUNCH_ORDER_IMPLICIT=1 (NCCL 2.28.9's environment variables,
///                NCCL_LAUNCH_ORDER_IMPLICIT; off by default). comm::nccl refuses it otherwise (per_stream_refusal).
///                Its communicators are split during the first step, outside the memory plan.
enum class nccl_channels { one, per_stream };

namespace detail {

/// Why nccl_channels::per_stream cannot be used with NCCL `version_code` (NCCL_VERSION_CODE, e.g. 22809 for 2.28.9)
/// and this value of $NCCL_LAUNCH_ORDER_IMPLICIT (null: unset); empty when it can.
inline std::string per_stream_refusal(int version_code, const char* launch_order_implicit) {
  if (version_code < 22600)
    return fsdp::detail::cat("comm::nccl: nccl_channels::per_stream needs NCCL 2.26 or later (NCCL_LAUNCH_ORDER_IMPLICIT "
                             "orders the launches of its communicators), but this NCCL is ", version_code / 10000, ".",
                             version_code / 100 % 100, ".", version_code % 100,
                             "; use nccl_channels::one (the default)");
  if (!launch_order_implicit || std::string_view(launch_order_implicit) != "1")
    return fsdp::detail::cat("comm::nccl: nccl_channels::per_stream issues collectives on several communicators at "
                             "once, which NCCL runs in one order on every rank only with NCCL_LAUNCH_ORDER_IMPLICIT=1 "
                             "(it is ",
                             launch_order_implicit ? fsdp::detail::cat("'", launch_order_implicit, "'") : std::string("unset"),
                             "): set it on every rank before the first NCCL call, or use nccl_channels::one (the "
                             "default)");
  return {};
}

/// One collective as messages name it.
struct nccl_op {
  std::uint64_t seq = 0;
  collective kind = collective::all_gather;
  std::int64_t count = 0;
  dtype type = dtype::f32;
  std::string unit;
  std::chrono::steady_clock::time_point issued{};

  /// "all_gather(count=8, f32) #3 for unit 'h.1'"
  std::string str() const {
    return fsdp::detail::cat(name_of(kind), "(count=", count, ", ", name_of(type), ") #", seq, " for unit '", unit, "'");
  }
};

/// The NCCL function behind a collective, for messages.
constexpr std::string_view nccl_function(collective c) noexcept {
  switch (c) {
    case collective::all_gather: return "ncclAllGather";
    case collective::reduce_scatter: return "ncclReduceScatter";
    case collective::all_reduce: return "ncclAllReduce";
    case collective::broadcast: return "ncclBroadcast";
    case collective::all_to_all: return "ncclSend/ncclRecv";  // grouped, one pair per rank
  }
  return "?";
}

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

  /// `name` is how messages call the group: "comm::nccl" for the world, longer for a split group.
  nccl_core(Api api, int rank, int world, std::chrono::milliseconds timeout, std::string name = "comm::nccl",
            nccl_channels channels = nccl_channels::one)
      : api_(std::move(api)), rank_(rank), world_(world), timeout_(timeout), name_(std::move(name)),
        channels_mode_(channels), family_(std::make_shared<family>()) {
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
  bool aborted() const noexcept { return aborted_; }
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
  void init(comm c, result rc, std::string_view call, std::string_view what, std::int64_t free_before = -1) {
    if (!channels_.empty()) fsdp::detail::fail_usage(name_, " on rank ", rank_, ": init() called twice");
    channels_.push_back({std::string(), c, true, 0});
    settle(rc, c, call, what);
    channels_.front().device_bytes = taken_since(free_before);
  }
  /// The device's free memory now (cudaMemGetInfo), for init()'s `free_before`.
  std::int64_t free_device_bytes() { return api_.free_device_bytes(); }
  /// What the creation of this core's communicators took from the device, measured as the drop in free memory
  /// across each (other allocations at the same moment would count too).
  std::int64_t device_bytes() const noexcept {
    std::int64_t n = 0;
    for (const channel& ch : channels_) n += ch.device_bytes;
    return n;
  }
  nccl_channels channels() const noexcept { return channels_mode_; }

  /// Joins `parent`'s family: from now on a failure of either aborts both, and a check() of either looks at both.
  void join_family(nccl_core& parent) {
    leave_family();
    family_ = parent.family_;
    std::lock_guard lk(family_->mu);
    family_->members.push_back(this);
  }

  /// A new communicator of the ranks that pass the same `color`, ranked by `key` (ncclCommSplit on the base, a
  /// collective of the base's ranks), settled. The caller owns it (a nccl_core of its own, usually joined to this
  /// one's family).
  comm split(int color, int key) {
    return split_base(color, key, fsdp::detail::cat("split(color=", color, ", key=", key, ")"));
  }

  /// Names the unit the next collectives are for, so that an error can say so.
  void label(std::string_view unit) { label_.assign(unit); }

  collective_stats stats() const { return stats_.get(); }

  /// Issues one collective: `call(c)` makes the NCCL call on communicator `c` and stream `s`, and returns its
  /// result. `c` is the communicator of stream name `key` (split from the base on the name's first collective),
  /// or the base when `key` is empty. Once NCCL has accepted the call, an event recorded on `s` tracks its
  /// completion (inside grouped(): once the group is launched).
  template <class Call>
  void issue(collective kind, std::int64_t count, dtype t, std::int64_t total_elems, stream s, std::string_view key,
             Call&& call) {
    if (count < 0) fsdp::detail::fail_usage(name_of(kind), " on rank ", rank_, ": negative count ", count);
    if (aborted_)
      throw comm_error(fsdp::detail::cat(name_of(kind), " on rank ", rank_, " after ", name_, " was aborted: ", reason_));
    const comm c = channel_for(key);
    nccl_op op{seq_++, kind, count, t, label_, api_.now()};
    const std::string where = op.str();
    settle(call(c), c, nccl_function(kind), where);
    if (in_group_) {
      group_.push_back({std::move(op), s, total_elems});
      return;
    }
    record({std::move(op), s, total_elems});
  }

  /// Runs fn() with its collectives grouped into one NCCL launch. Completion events are recorded only once
  /// ncclGroupEnd has launched the group. If fn throws, the group is abandoned: nothing of it is launched (a call
  /// that NCCL rejects inside the group makes ncclGroupEnd discard the whole group) and the communicator is aborted,
  /// because this rank's collective sequence no longer matches the other ranks'. ncclCommAbort is called only
  /// once the group is closed: inside an open group NCCL would merely queue it until ncclGroupEnd, which would then
  /// free the communicator before the queued collectives are prepared. A stream's first collective cannot be
  /// grouped (its communicator is split on that collective; see channel_for).
  template <class F>
  void grouped(F&& fn) {
    if (aborted_)
      throw comm_error(fsdp::detail::cat("grouped() on rank ", rank_, " after ", name_, " was aborted: ", reason_));
    if (in_group_) {  // nested: part of the enclosing group
      std::forward<F>(fn)();
      return;
    }
    const std::uint64_t first = seq_;
    const result rc = api_.group_start();
    if (rc != Api::success) fail_nccl(rc, base(), "ncclGroupStart");
    in_group_ = true;
    ++open_groups_;
    group_.clear();
    try {
      std::forward<F>(fn)();
    } catch (...) {
      abandon_group(std::current_exception());
    }
    in_group_ = false;
    std::vector<grouped_op> launched = std::move(group_);
    group_.clear();
    const result end = api_.group_end();
    --open_groups_;
    settle_all(end, "ncclGroupEnd",
               first == seq_ ? std::string("an empty group")
                             : fsdp::detail::cat("grouped collectives #", first, " to #", seq_ - 1));
    for (grouped_op& g : launched) record(std::move(g));
  }

  /// Throws (after aborting the family) if NCCL reports an asynchronous error on any communicator of the family;
  /// the backend's synchronize() calls it while it waits.
  void check() {
    std::lock_guard lk(family_->mu);
    for (nccl_core* m : family_->members) m->check_own();
  }

  /// A wait that ran out of time: aborts the family and throws comm_error naming what timed out and what is
  /// pending.
  [[noreturn]] void fail_timeout(const std::string& what) {
    const std::string msg = fsdp::detail::cat(what, "; pending: ", family_pending(), "; ", name_, " on rank ", rank_,
                                              " of ", world_,
                                              " aborted (a rank that died or issued a different collective "
                                              "sequence leaves the others waiting)");
    abort(msg);
    throw comm_error(msg);
  }

  /// Aborts every communicator of the family: every pending and later operation fails. Never throws. While this
  /// thread has a group open (grouped()), the ncclCommAbort calls wait until it is closed: NCCL's group state is
  /// per thread, and an abort queued in a group that ncclGroupEnd then discards would never run.
  void abort(const std::string& reason) noexcept {
    std::lock_guard lk(family_->mu);
    for (nccl_core* m : family_->members) m->abort_own(reason);
  }

  /// The end of the communicators when they are not aborted: ncclCommFinalize on each (the streams' first, the
  /// base last), whose ncclInProgress is the normal answer of a non-blocking communicator, polled (with a short
  /// sleep) until all settle or the timeout passes, then ncclCommDestroy on each; an error or the timeout aborts
  /// them instead (ncclCommAbort). Only real failures are logged. Never throws; called once, by the owner's
  /// destructor.
  void shutdown() noexcept {
    release_events();
    if (live_communicators() == 0) return;
    if (aborted_) {
      abort_now();
      return;
    }
    try {
      state st;
      for (auto ch = channels_.rbegin(); ch != channels_.rend(); ++ch)
        if (ch->live) st.add(api_.finalize(ch->c), ch->c);
      if (st.rc == Api::in_progress) {
        const auto deadline = api_.now() + timeout_;
        while (st.rc == Api::in_progress && api_.now() <= deadline) {
          api_.sleep(shutdown_poll_interval);
          st = async_state_all();
        }
      }
      if (st.rc == Api::in_progress) {
        api_.log(fsdp::detail::cat("fsdp: ", name_, " on rank ", rank_, " of ", world_,
                                   ": ncclCommFinalize did not complete within ", timeout_.count(),
                                   " ms at shutdown (a rank that exited without finalizing, or still has collectives "
                                   "to run, keeps the others waiting); the communicator was aborted instead of destroyed"));
        abort_now();
        return;
      }
      if (st.rc != Api::success) {
        api_.log(fsdp::detail::cat("fsdp: ", name_, " on rank ", rank_, " of ", world_, ": ncclCommFinalize reported ",
                                   api_.describe(st.rc, st.c),
                                   " at shutdown; the communicator was aborted instead of destroyed"));
        abort_now();
        return;
      }
      for (auto ch = channels_.rbegin(); ch != channels_.rend(); ++ch) {
        if (!ch->live) continue;
        ch->live = false;
        const result d = api_.destroy(ch->c);
        if (d != Api::success)
          api_.log(fsdp::detail::cat("fsdp: ", name_, " on rank ", rank_, " of ", world_, ": ncclCommDestroy reported ",
                                     api_.describe(d, comm{}), " at shutdown"));
      }
    } catch (...) {  // a message could not be built: still end the communicators
      abort_now();
    }
  }

  /// The collectives issued and not yet complete, oldest first: "all_gather(count=8, f32) #3 for unit 'h.1', issued
  /// 12 ms ago and not complete; ..." (at most named_pending, then "and N more"), or "no collective pending".
  std::string pending_summary() {
    std::string s = pending_items();
    return s.empty() ? std::string("no collective pending") : s;
  }

 private:
  struct family {
    std::recursive_mutex mu;  ///< a member's failure inside check() aborts the family from the same thread
    std::vector<nccl_core*> members;
  };
  struct channel {
    std::string key;  ///< the stream name; empty for the base
    comm c;
    bool live;                      ///< neither destroyed nor aborted
    std::int64_t device_bytes = 0;  ///< what its creation took (measured)
  };
  struct grouped_op {
    nccl_op op;
    stream s;
    std::int64_t total_elems;
  };
  struct pending_op {
    nccl_op op;
    event done;
  };
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

  void leave_family() noexcept {
    if (!family_) return;
    std::lock_guard lk(family_->mu);
    auto& m = family_->members;
    for (auto it = m.begin(); it != m.end(); ++it)
      if (*it == this) {
        m.erase(it);
        break;
      }
  }

  /// The communicator of stream name `key`: the base for an empty key or under nccl_channels::one; else split from
  /// the base on the name's first collective.
  comm channel_for(std::string_view key) {
    if (channels_.empty())
      fsdp::detail::fail_usage(name_, " on rank ", rank_, ": a collective was issued before the communicator was set up");
    if (key.empty() || channels_mode_ == nccl_channels::one) return channels_.front().c;
    for (const channel& ch : channels_)
      if (ch.key == key) return ch.c;
    if (open_groups_ != 0)
      fsdp::detail::fail_usage(name_, " on rank ", rank_, ": the first collective on stream '", key,
                               "' is inside grouped(); a stream's communicator is split from the base one "
                               "(ncclCommSplit) on its first collective, which cannot run inside a group. Issue one "
                               "collective on the stream before grouping its collectives");
    const std::int64_t before = api_.free_device_bytes();
    const comm c = split_base(0, rank_, fsdp::detail::cat("the communicator of stream '", key, "'"));
    channels_.push_back({std::string(key), c, true, taken_since(before)});
    return c;
  }

  std::int64_t taken_since(std::int64_t free_before) {
    return free_before < 0 ? 0 : std::max<std::int64_t>(0, free_before - api_.free_device_bytes());
  }

  comm split_base(int color, int key, const std::string& what) {
    if (aborted_)
      throw comm_error(fsdp::detail::cat("ncclCommSplit for ", what, " on rank ", rank_, " after ", name_,
                                         " was aborted: ", reason_));
    if (open_groups_ != 0)
      fsdp::detail::fail_usage(name_, " on rank ", rank_, ": ncclCommSplit for ", what,
                               " inside grouped(): a split cannot be grouped with collectives; split before grouping");
    const comm parent = base();
    comm out{};
    const result rc = api_.split(parent, color, key, out);
    try {
      // A non-blocking split answers in_progress and runs as a job of the parent, whose state says when it has
      // settled; NCCL fills `out` (it is null until then). The new communicator's own state is then settled too.
      settle(rc, parent, "ncclCommSplit", what);
      if (out == comm{})
        fail_nccl(Api::internal_error, parent, fsdp::detail::cat("ncclCommSplit for ", what, " (it settled, but gave no communicator)"));
      settle(async_state(out), out, "ncclCommSplit", what);
    } catch (...) {
      if (out != comm{}) (void)api_.comm_abort(out);
      throw;
    }
    return out;
  }

  result async_state(comm c) {
    result st = Api::in_progress;
    const result q = api_.get_async_error(c, st);
    return q != Api::success ? q : st;
  }
  state async_state_all() {
    state st;
    for (const channel& ch : channels_)
      if (ch.live) st.add(async_state(ch.c), ch.c);
    return st;
  }

  /// A call's result: success, or in_progress (non-blocking communicator) until ncclCommGetAsyncError on `c`
  /// settles, under the timeout. A failure aborts the family and throws comm_error naming the call, what it was
  /// for and the collectives still pending.
  void settle(result rc, comm c, std::string_view call, std::string_view what) {
    if (rc == Api::in_progress) {
      const auto deadline = api_.now() + timeout_;
      while (rc == Api::in_progress) {
        if (api_.now() > deadline)
          fail_timeout(fsdp::detail::cat(call, " for ", what, " on rank ", rank_, " did not complete within ",
                                         timeout_.count(), " ms"));
        api_.sleep(poll_interval);
        rc = async_state(c);
      }
    }
    if (rc != Api::success) fail_nccl(rc, c, fsdp::detail::cat(call, " for ", what));
  }
  /// settle() for a call that concerns every communicator of this core (ncclGroupEnd).
  void settle_all(result rc, std::string_view call, std::string_view what) {
    state st;
    st.add(rc, base());
    if (st.rc == Api::in_progress) {
      const auto deadline = api_.now() + timeout_;
      while (st.rc == Api::in_progress) {
        if (api_.now() > deadline)
          fail_timeout(fsdp::detail::cat(call, " for ", what, " on rank ", rank_, " did not complete within ",
                                         timeout_.count(), " ms"));
        api_.sleep(poll_interval);
        st = async_state_all();
      }
    }
    if (st.rc != Api::success) fail_nccl(st.rc, st.c, fsdp::detail::cat(call, " for ", what));
  }

  void check_own() {
    if (aborted_) throw comm_error(fsdp::detail::cat(name_, " on rank ", rank_, " was aborted: ", reason_));
    const state st = async_state_all();
    if (st.rc != Api::success && st.rc != Api::in_progress) fail_nccl(st.rc, st.c, {});
    retire_completed();
  }

  void abort_own(const std::string& reason) noexcept {
    if (!aborted_) {
      aborted_ = true;
      try {
        reason_ = reason;
      } catch (...) {
      }
    }
    if (open_groups_ == 0) abort_now();
  }

  /// The pending collectives of every member of the family; a member's are prefixed with its name when the
  /// family has more than one.
  std::string family_pending() {
    std::lock_guard lk(family_->mu);
    if (family_->members.size() == 1) return pending_summary();
    std::string s;
    for (nccl_core* m : family_->members) {
      const std::string items = m->pending_items();
      if (!items.empty()) s += fsdp::detail::cat(s.empty() ? "" : "; ", m->name_, ": ", items);
    }
    return s.empty() ? std::string("no collective pending") : s;
  }

  std::string pending_items() {
    std::lock_guard lk(mu_);
    retire_completed_locked();
    const auto now = api_.now();
    std::string s;
    std::size_t n = 0;
    for (const auto& p : pending_) {
      if (n == named_pending) {
        s += fsdp::detail::cat("; and ", pending_.size() - n, " more");
        break;
      }
      const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.op.issued);
      s += fsdp::detail::cat(n ? "; " : "", p.op.str(), ", issued ", age.count(), " ms ago and not complete");
      ++n;
    }
    return s;
  }

  /// An NCCL failure (a call's result or an asynchronous error, seen on communicator `c`): aborts the family and
  /// throws comm_error naming the call (if any) and every pending collective with its unit and sequence number.
  [[noreturn]] void fail_nccl(result st, comm c, std::string_view during) {
    const std::string msg = fsdp::detail::cat(
        "NCCL reported ", api_.describe(st, c), " on rank ", rank_, " of ", world_,
        during.empty() ? std::string() : fsdp::detail::cat(" during ", during), "; pending: ", family_pending(), "; ",
        name_, " on rank ", rank_, " of ", world_,
        " aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
    abort(msg);
    throw comm_error(msg);
  }

  /// fn threw inside grouped(): discard the group, abort, and say so.
  [[noreturn]] void abandon_group(std::exception_ptr cause) {
    std::string why = "a non-standard exception";
    try {
      std::rethrow_exception(cause);
    } catch (const std::exception& e) {
      why = fsdp::detail::unprefixed(e);
    } catch (...) {
    }
    std::string queued;
    for (const grouped_op& g : group_) queued += (queued.empty() ? "" : ", ") + g.op.str();
    const std::size_t n = group_.size();
    group_.clear();
    // A call NCCL rejects marks the open group failed (ncclGroupEnd then launches none of it); a collective that
    // already failed inside fn did the same. Closing the group with ncclGroupEnd is still needed: the group
    // state is per thread and would capture every later NCCL call of this thread.
    (void)api_.fail_group(base());
    (void)api_.group_end();
    in_group_ = false;
    --open_groups_;
    const std::string msg = fsdp::detail::cat(
        name_, " on rank ", rank_, " of ", world_, ": grouped() abandoned after ", n, " queued collective",
        n == 1 ? "" : "s", n ? fsdp::detail::cat(" (", queued, ")") : std::string(), " because its function threw: ", why,
        "; the group was not launched and the communicator was aborted (the other ranks fail at their timeout; "
        "restart every rank)");
    abort(msg);  // the first reason wins when a failing collective inside fn aborted already
    throw comm_error(msg);
  }

  /// ncclCommAbort on every communicator still live (the streams' first, the base last).
  void abort_now() noexcept {
    for (auto ch = channels_.rbegin(); ch != channels_.rend(); ++ch) {
      if (!ch->live) continue;
      ch->live = false;
      const result rc = api_.comm_abort(ch->c);
      if (rc != Api::success) {
        try {
          api_.log(fsdp::detail::cat("fsdp: ", name_, " on rank ", rank_, " of ", world_, ": ncclCommAbort reported ",
                                     api_.describe(rc, comm{})));
        } catch (...) {
        }
      }
    }
  }

  void record(grouped_op g) {
    event e = take_event();
    try {
      api_.record(e, g.s);
    } catch (...) {
      std::lock_guard lk(mu_);
      spare_.push_back(e);
      throw;
    }
    stats_.add(static_cast<std::size_t>(g.op.kind), g.op.type, g.total_elems);
    std::lock_guard lk(mu_);
    pending_.push_back({std::move(g.op), e});
    if (pending_.size() > 64) retire_completed_locked();
  }

  void retire_completed() {
    std::lock_guard lk(mu_);
    retire_completed_locked();
  }
  void retire_completed_locked() {
    while (!pending_.empty() && api_.complete(pending_.front().done)) {
      spare_.push_back(pending_.front().done);
      pending_.pop_front();
    }
  }

  event take_event() {
    {
      std::lock_guard lk(mu_);
      if (!spare_.empty()) {
        event e = spare_.back();
        spare_.pop_back();
        return e;
      }
    }
    return api_.new_event();
  }

  void release_events() noexcept {
    std::lock_guard lk(mu_);
    for (auto& p : pending_) api_.destroy_event(p.done);
    for (event e : spare_) api_.destroy_event(e);
    pending_.clear();
    spare_.clear();
  }

  Api api_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  nccl_channels channels_mode_;
  std::shared_ptr<family> family_;
  std::vector<channel> channels_;  ///< [0]: the base communicator; then one per stream name, in first-use order
  bool aborted_ = false;
  bool in_group_ = false;  ///< this core's grouped() is running (its collectives are queued in group_)
  /// Groups open on this thread, over every core: NCCL's group state (ncclGroupStart / ncclGroupEnd) is per thread.
  static inline thread_local int open_groups_ = 0;
  std::string reason_;
  std::string label_ = "(none)";
  std::uint64_t seq_ = 0;
  std::vector<grouped_op> group_;  ///< issued inside grouped(), recorded once the group is launched
  mutable std::mutex mu_;
  std::deque<pending_op> pending_;
  std::vector<event> spare_;
  stats_tally stats_;
};

}  // namespace detail
}  // namespace fsdp::comm
