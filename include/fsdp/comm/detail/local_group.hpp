#pragma once
// Rendezvous shared by the ranks of one in-process group. Collectives are matched by the sequence number each
// rank assigns when it issues them (program order, identical on every rank), not by arrival order, so the
// all-gather and reduce streams of a rank can be inside different collectives at the same time. That is more
// than NCCL allows: NCCL runs the collectives of one communicator one after the other, in the order they were
// issued, whatever streams they were issued on (each launch waits for the communicator's previous one), so on NCCL
// two streams' collectives overlap each other only on two communicators.
// Every wait has a deadline: a rank that never arrives, or arrives with a different collective, makes every
// rank fail with an error that names the collective, its sequence number and the ranks at fault.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/detail/uneven_blocks.hpp"
#include "fsdp/comm/link.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/float16.hpp"
#include "fsdp/kernels/elementwise.hpp"

namespace fsdp::comm::detail {

/// What a rank asked for; every rank of a round must ask for the same (matches()).
struct op_desc {
  int kind = 0;  ///< a `collective`, or -1 for a barrier
  std::int64_t count = 0;  ///< all_to_all_v: the elements this rank sends in all
  dtype type = dtype::f32;
  reduce_op op = reduce_op::sum;
  int root = 0;
  /// all_to_all_v only: this rank's send counts, then its receive counts (one per rank each: uneven_blocks).
  std::vector<std::int64_t> counts{};

  /// Whether two ranks asked for the same collective: everything equal but an all_to_all_v's counts, which differ by
  /// rank and are matched pair by pair (uneven_mismatch).
  bool matches(const op_desc& o) const noexcept {
    return kind == o.kind && type == o.type && op == o.op && root == o.root &&
           (count == o.count || kind == int(collective::all_to_all_v));
  }

  /// "all_gather(count=8, f32)"; "all_to_all_v(send=[2, 0, 5], recv=[1, 1, 3], f32)" (the first 16 counts of a
  /// larger group's, then "... N more").
  std::string str() const;
};

/// The modelled link (fsdp/comm/link.hpp): the rule the timeline planner uses too.
using fsdp::comm::link_model;

/// Delay injection: how long rank `rank`'s part of collective number `seq` waits before it starts.
using collective_delay = std::function<std::chrono::microseconds(collective, std::uint64_t seq, int rank)>;

/// Where a rank's part of a collective is about to begin (fault injection: collective_fault).
struct collective_site {
  collective kind = collective::all_reduce;
  std::int64_t count = 0;
  dtype type = dtype::f32;
  std::uint64_t seq = 0;   ///< the collective's number in its group
  int rank = 0;            ///< the rank in its group
  int world_rank = 0;      ///< the rank in the group run_local made (newcomers numbered after its ranks)
  std::string_view group;  ///< which ranks of the group it was split from the group holds ("[ranks 1, 3]"); empty:
                           ///< the group run_local made
};

/// Fault injection: called on the thread that runs a rank's part of each collective (its stream's), after any
/// delay and before the rank arrives. What it throws fails that part there, as a rank that died inside the
/// collective: the rank never arrives, its stream fails with that exception, and the others wait for it until it
/// is marked gone or the group aborted (its thread rethrows the failure at its next wait for the stream).
using collective_fault = std::function<void(const collective_site&)>;

/// The reduction rule of the host communicators (comm::local here, comm::mpi in comm/mpi.hpp), written once:
/// dst[i] = the reduction of src(0)[i], ..., src(world - 1)[i] by kernels::reduce_add, in rank order from 0,
/// rounded to the dtype after every addition, each value pre-multiplied by kernels::average_factor(world) for an
/// average. `src(q)` gives rank q's `n` elements. Element i of every input is read before dst[i] is written, so dst
/// may be one of the inputs. Works in blocks of elements (each element's result depends on its own inputs only).
template <class Src>
void reduce_in_rank_order(dtype type, reduce_op op, int world, std::size_t n, Src&& src, void* dst) {
  fsdp::kernels::dispatch(type, [&](auto t) {
    using elem = lowp::storage_t<t()>;
    const float premul = op == reduce_op::avg ? fsdp::kernels::average_factor<t()>(world) : 1.0f;
    constexpr std::size_t block = 2048;
    float acc[block];
    elem* out = static_cast<elem*>(dst);
    // The same operations for every element as a loop of reduce_add over the ranks from 0.0f; the loops differ only
    // in what the compiler knows: whether premul is 1 there (reduce_add's test of it leaves the loop), and, for the
    // first rank, that the running value is 0 (no zeroing pass; a world of one writes the result at once).
    const auto pass = [&](auto unit, auto first, auto last, float* acc_, const elem* in,
                          elem* out_, std::size_t m) {
      for (std::size_t i = 0; i < m; ++i) {
        const float v = fsdp::kernels::reduce_add<t()>(decltype(first)::value ? 0.0f : acc_[i], in[i],
                                                       decltype(unit)::value ? 1.0f : premul);
        if constexpr (decltype(last)::value) out_[i] = lowp::from_float<t()>(v);
        else acc_[i] = v;
      }
    };
    const auto rank_pass = [&](auto first, auto last, const elem* in, std::size_t b, std::size_t m) {
      if (premul == 1.0f) pass(std::true_type{}, first, last, acc, in, out + b, m);
      else pass(std::false_type{}, first, last, acc, in, out + b, m);
    };
    for (std::size_t b = 0; b < n; b += block) {
      const std::size_t m = n - b < block ? n - b : block;
      const auto in = [&](int q) { return static_cast<const elem*>(static_cast<const void*>(src(q))) + b; };
      if (world == 1) {
        rank_pass(std::true_type{}, std::true_type{}, in(0), b, m);
        continue;
      }
      rank_pass(std::true_type{}, std::false_type{}, in(0), b, m);
      for (int q = 1; q + 1 < world; ++q) rank_pass(std::false_type{}, std::false_type{}, in(q), b, m);
      rank_pass(std::false_type{}, std::true_type{}, in(world - 1), b, m);
    }
  });
}

/// The sub-group a split makes for the ranks that pass `color`, as MPI_Comm_split forms it: every rank q whose
/// (color, key) in `all` (in rank order) has that color, ordered by (key, q). Used by comm::local and comm::mpi.
FSDP_DECL std::vector<int> split_members(const std::vector<std::pair<int, int>>& all, int color);

/// How a sub-group's messages name its members in the group it was split from: "[ranks 2, 3]".
FSDP_DECL std::string members_label(const std::vector<int>& members);

/// What the ranks of a family of groups (the group run_local made and every group split, shrunk or grown from it)
/// are waiting for, so that a timeout can name the rank the world waits for rather than a rank that is itself
/// waiting. Keyed by a rank's id in the family: its rank in the group run_local made (newcomers numbered after, in
/// the order they joined). Locked after a group's own lock, never before one.
struct wait_board {
  struct waiting {
    std::function<std::string()> where;  ///< the collective, as the waiter's group describes it
    std::vector<int> for_ids;            ///< the ids it waits for (the ranks that have not issued it)
  };
  std::mutex mu;
  std::map<int, waiting> by_id;
  int next_id = 0;  ///< the id of the next newcomer
};

class local_group {
 public:
  local_group(int world, std::chrono::milliseconds timeout, link_model link = {}, collective_delay delay = {});

  int size() const noexcept { return world_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// The link of every collective whose first rank arrives from now on, in this group and its sub-groups (a
  /// collective in flight keeps the link it began with, on every rank).
  void set_link(const link_model& link);
  /// Places the group's ranks on `cluster` at `places` (their ranks in the world): its link becomes
  /// cluster->placed(places), and every sub-group made from now on (split, shrink, grow) takes its link from where
  /// its own ranks sit (newcomers after the highest place). Before any rank uses the group. set_link() ends it.
  void place(std::shared_ptr<const cluster_links> cluster, std::vector<int> places);
  link_model link() const;

  /// Fault injection (collective_fault) for this group and every group made from it from now on. Before any rank
  /// uses the group.
  void set_fault(collective_fault fault) { fault_ = std::move(fault); }

  /// Makes every current and future wait of the group, and of its sub-groups, fail with `reason` (first reason
  /// wins).
  void abort(const std::string& reason) noexcept;
  bool aborted() const;

  /// Rank `rank`'s function has returned (run_local): it will issue nothing more. A collective that still waits
  /// for it fails at once, naming it, instead of waiting out the timeout.
  void rank_returned(int rank);

  /// Rank `rank`'s part of a split (comm::local_communicator::split): the ranks that pass the same `color` form a
  /// sub-group, ordered by (key, rank); returns it and this rank's place in it. `all` holds every rank's
  /// (color, key), in rank order, as the caller gathered them (the same on every rank); `split` numbers the split
  /// (the caller's count of splits, the same on every rank). Aborts and returned ranks reach the sub-groups.
  std::pair<std::shared_ptr<local_group>, int> sub_group(std::uint64_t split, int rank,
                                                         const std::vector<std::pair<int, int>>& all);

  /// Rank `rank`'s part of a shrink (comm::local_communicator::shrink): once every rank of the group that has not
  /// returned has called it, those ranks form a new group, in rank order, whether or not this one is aborted; returns
  /// it, this rank's place in it and its members (this group's ranks). `shrink` numbers the shrinks (the caller's
  /// count, the same on every survivor). A rank that neither calls it nor returns within the timeout fails it on
  /// every caller with a comm_error naming that rank.
  struct shrunk {
    std::shared_ptr<local_group> group;
    int place = 0;
    std::vector<int> members;
  };
  shrunk shrink(std::uint64_t shrink, int rank);

  /// A rank's part of a grow (comm::local_communicator::grow): the group of `size` ranks (this group's first, as
  /// here) that grow number `grow` makes, the same for every rank of this group; aborts and returns reach it.
  std::shared_ptr<local_group> grown(std::uint64_t grow, int size);

  /// How messages name rank `rank`'s collective #seq: "local all_gather(count=8, f32) #3 on rank 1".
  /// A sub-group (split) says which ranks of the group it was split from it holds: "local[ranks 2, 3]
  /// all_gather(count=8, f32) #0 on rank 1" is rank 3's.
  std::string describe(const op_desc& d, std::uint64_t seq, int rank) const;

  /// Rendezvous for communicators whose ranks read each other's memory asynchronously (comm::local on one GPU,
  /// local_cuda.cuh), in three steps per round:
  ///   meet():    matches rank `rank`'s collective #seq with the other ranks' (a different description is a
  ///              comm_error naming both), publishes `token` and returns every rank's once all have arrived.
  ///   part():    once this rank has enqueued its reads of the others' memory, publishes a second token (what marks
  ///              the end of those reads), waits until every rank has, runs before_leaving(tokens) (this rank's
  ///              stream waits for the others' marks), and returns only once every rank has run its before_leaving.
  ///              So no rank reuses or destroys what its tokens point to while another rank may still use them.
  ///   abandon(): instead of part(), for a rank that failed after meet(): aborts the group, publishes its token,
  ///              and returns every token published by the ranks that met, once each of them has published (they
  ///              all will: a failure makes them leave through part() or abandon()) or the timeout has passed.
  ///              The caller waits for those marks before its memory can be released.
  /// When the group is aborted while a rank is in part(), that rank likewise waits until every rank that met has
  /// published, passes what was published to on_abort(tokens), and throws. Every wait is bounded by the timeout.
  using token_fn = std::function<void(const std::vector<const void*>&)>;

  std::vector<const void*> meet(std::uint64_t seq, int rank, const op_desc& d, const void* token);

  void part(std::uint64_t seq, int rank, const op_desc& d, const void* token, const token_fn& before_leaving = {},
            const token_fn& on_abort = {});

  std::vector<const void*> abandon(std::uint64_t seq, int rank, const void* token, const std::string& reason);

  /// Runs rank `rank`'s part of collective number `seq`.
  void run(std::uint64_t seq, int rank, const op_desc& d, const void* send, void* recv);

 private:
  struct child {
    std::shared_ptr<local_group> group;
    std::vector<int> members;  ///< this group's rank of each of the sub-group's ranks
  };
  struct pending_split {
    std::shared_ptr<local_group> group;
    int taken = 0;
  };
  /// The sub-groups made so far (a copy: their calls must not run under this group's lock).
  std::vector<child> children() const;
  /// Makes `child` (a split or grown group, whose rank i is this group's members[i]) a sub-group, mu_ held: this
  /// group's aborts and returned ranks reach it from now on, and those so far hold in it already.
  void adopt_locked(const std::shared_ptr<local_group>& child, const std::vector<int>& members);

  /// Names rank `rank`'s collective #seq in a message; formatted only when a message is made.
  struct who {
    const local_group& g;
    const op_desc& d;
    std::uint64_t seq;
    int rank;
    std::string str() const { return g.describe(d, seq, rank); }
  };

  struct round {
    op_desc desc;
    int first_rank = -1;
    std::vector<const void*> send;
    /// Each rank's description (all_to_all_v's counts): its caller's, alive until that rank leaves the round.
    std::vector<const op_desc*> descs;
    std::vector<const void*> parting;  ///< second-phase tokens (part(), abandon())
    std::vector<bool> present;
    std::vector<bool> published;  ///< second-phase token given
    int arrived = 0;
    std::chrono::steady_clock::time_point start;  ///< when the last rank arrived
    link_model link;  ///< the group's link when the first rank arrived: every rank of the round uses it
    int done = 0;  ///< ranks that published their second token (or finished their part, run())
    int ran = 0;   ///< ranks that ran before_leaving (part())
    int left = 0;
  };

  enum class outcome { done, aborted, timed_out };

  /// Waits until pred() or the deadline; stops early on an abort unless `stop_on_abort` is false.
  template <class Pred>
  outcome wait_until(std::unique_lock<std::mutex>& lk, Pred pred, std::chrono::steady_clock::time_point deadline,
                     bool stop_on_abort = true) {
    while (!pred()) {
      if (stop_on_abort && aborted_) return outcome::aborted;
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !pred())
        return stop_on_abort && aborted_ ? outcome::aborted : outcome::timed_out;
    }
    return outcome::done;
  }

  /// Marks the group aborted for `reason` and wakes its waiters, mu_ held: the first reason wins (abort() and
  /// fail() come here too).
  void abort_locked(const std::string& reason) noexcept;

  void publish(round& r, int rank, const void* token);

  std::string unpublished(const round& r) const;

  /// This rank's last touch of round #seq; the last rank to leave erases it.
  void leave(std::uint64_t seq, round& r);

  /// part() failed: waits (when `drain`) until every rank that met has published, leaves the round, hands the
  /// published tokens to on_abort and throws `failure` (or rethrows the exception being handled).
  [[noreturn]] void leave_failed(std::unique_lock<std::mutex>& lk, std::uint64_t seq, round& r,
                                 const token_fn& on_abort, std::string failure, bool drain, bool rethrow = false);

  /// A group of one: the collective's result from this rank's input alone (a reduction still applies the
  /// reduction rule to it, element by element, in place when recv is send, as the general path would).
  void run_alone(const op_desc& d, const void* send, void* recv, const who& what);

  /// The reduction of every rank's input at element `offset` on, by kernels::reduce_add (rank order, rounded to
  /// the dtype after every addition; an average pre-multiplied by NCCL's scalar): every rank gets the same bits, and
  /// the CUDA local communicator's kernel does the same operations.
  std::vector<unsigned char> reduce(const round& r, const op_desc& d, std::size_t offset) const;

  [[noreturn]] void fail(std::unique_lock<std::mutex>& lk, const std::string& msg);

  std::string missing(const round& r) const;

  /// While this rank waits for ranks of round `r` to arrive, the board says so (posted at each wake-up, cleared
  /// when the wait ends, however it ends).
  struct board_entry {
    local_group& g;
    int id;
    bool posted = false;
    void post(const who& what, const round& r);
    ~board_entry();
  };

  /// What a timeout adds about the ranks of `r` that never issued it (mu_ held): each one's world rank (in a
  /// sub-group), and what it is itself waiting for, followed to the rank the world waits for.
  std::string waiting_chain(const round& r) const;

  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lk, Pred done, const who& what, const char* phase,
            const round& r) {
    if (done()) return;  // no clock read when nothing has to wait
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    board_entry posted{*this, ids_[static_cast<std::size_t>(what.rank)]};
    while (!done()) {
      if (r.arrived < world_) posted.post(what, r);
      if (aborted_) {
        const std::string why = reason_;
        lk.unlock();
        throw comm_error(what.str() + " aborted: " + why);
      }
      if (returned_count_ > 0 && r.arrived < world_) {
        std::string gone;
        for (int q = 0; q < world_; ++q)
          if (!r.present[q] && returned_[static_cast<std::size_t>(q)])
            gone += (gone.empty() ? "" : ", ") + std::to_string(q);
        if (!gone.empty()) fail(lk, what.str() + " cannot complete: rank(s) " + gone + " returned without issuing it");
      }
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !done() && !aborted_) {
        std::string msg = what.str() + " timed out after " + std::to_string(timeout_.count()) + " ms " + phase;
        if (r.arrived < world_) msg += ": rank(s) " + missing(r) + " never issued it" + waiting_chain(r);
        fail(lk, msg);
      }
    }
  }

  round& arrive(std::uint64_t seq, int rank, const op_desc& d, const void* send, void* /*recv*/, const who& what);

  void depart(std::uint64_t seq, int rank, const void* token, const who& what,
              std::vector<const void*>* tokens = nullptr);

  const int world_;
  const std::chrono::milliseconds timeout_;
  link_model link_;  // guarded by mu_ (set_link); each round takes a copy
  std::shared_ptr<const cluster_links> cluster_;  // guarded by mu_: null, or where the ranks sit (place)
  std::vector<int> places_;                       // guarded by mu_: each rank's place on cluster_
  /// A sub-group of `members` (this group's ranks, then `newcomers` ranks from outside) placed where they sit.
  void place_child_locked(local_group& child, const std::vector<int>& members, int newcomers) const;
  const collective_delay delay_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, round> rounds_;
  bool aborted_ = false;
  std::string reason_;
  std::vector<bool> returned_;  // by rank: its function has returned (rank_returned)
  int returned_count_ = 0;
  std::string label_;  // a sub-group's members in the group it was split from: "[ranks 2, 3]"
  std::shared_ptr<wait_board> board_;  // shared by the family of groups
  std::vector<int> ids_;               // each rank's id on the board
  collective_fault fault_;             // the family's (set_fault)
  /// Calls the fault hook, if any, for rank `rank`'s part of collective #seq.
  void inject(const op_desc& d, std::uint64_t seq, int rank) const;
  /// A group made from this one (split, shrunk or grown; not yet shared) joins the family's board and fault hook:
  /// its rank i is this group's members[i], then `newcomers` ranks with new ids.
  void join_board_locked(local_group& child, const std::vector<int>& members, int newcomers) const;
  std::vector<child> children_;
  std::map<std::pair<std::uint64_t, int>, pending_split> splits_;  // by (split, color), until every member took it
  struct pending_shrink {
    std::vector<bool> arrived;
    std::shared_ptr<local_group> group;  ///< made by the last survivor to arrive
    std::vector<int> members;
    int taken = 0;
  };
  std::map<std::uint64_t, pending_shrink> shrinks_;  // by shrink number, until every member took it
  std::map<std::uint64_t, pending_split> grows_;     // by grow number, until every rank took it
};

}  // namespace fsdp::comm::detail

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/comm/detail/local_group.ipp"
#include "fsdp/comm/detail/local_group.members.ipp"
#endif
