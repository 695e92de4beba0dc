#pragma once
// comm::local: ranks as threads of one process, over host memory (the host backend). Every collective is
// issued on a stream and runs in that stream's order on its worker; see detail/local_group.hpp for matching
// and timeouts. `comm::run_local(world, fn)` starts one thread per rank and joins them.
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/backend/host.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/detail/collective_front.hpp"
#include "fsdp/comm/detail/local_group.hpp"
#include "fsdp/comm/detail/stats_tally.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm {

using detail::collective_delay;
using detail::collective_fault;
using detail::collective_site;

struct local_options {
  /// Longest a rank waits for the others inside one collective before the whole group fails.
  std::chrono::milliseconds timeout{60000};
  /// A modelled link bandwidth and latency (off by default): see fsdp/comm/link.hpp.
  link_model link{};
  /// Modelled nodes instead (`link` is then not used): rank r sits on node r / gpus_per_node, and every group
  /// (the world, each split, shrunk or grown group) times its collectives on cluster->placed(where its ranks sit):
  /// the rule the timeline planner's place_on_cluster follows, so a prediction and a host run on the same cluster
  /// agree collective by collective. set_link() replaces it with one link for every group.
  std::optional<cluster_links> cluster{};
  /// Delay injection before each rank's part of each collective (off when empty).
  collective_delay delay{};
  /// Fault injection before each rank's part of each collective, after its delay (off when empty): what it throws
  /// fails that rank's part there, as a rank that died inside the collective (collective_fault).
  collective_fault fault{};
  /// Options of each rank's host backend (a Model built on this communicator uses them).
  backend::host_options backend{};
};

/// Where ranks from outside a group take their places in it as it grows (local_communicator::grow makes it, the
/// caller hands it to the newcomers' threads: comm::start_joining). Like NCCL's unique id for ncclCommGrow.
struct local_invitation {
  std::shared_ptr<detail::local_group> group;  ///< the grown group
  int first = 0;                               ///< the first newcomer's rank in it
  int newcomers = 0;
};

/// One rank's handle on an in-process group of thread ranks.
class local_communicator : public detail::collective_front<local_communicator, backend::host::stream> {
 public:
  using backend_type = backend::host;
  using stream = backend_type::stream;

  local_communicator(std::shared_ptr<detail::local_group> g, int rank, backend::host_options backend = {});

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return g_->size(); }
  /// Collectives on different streams are not serialised: each stream's runs when the stream gets there
  /// (fsdp::plan_timeline(model, ...) models this).
  static constexpr bool serial_collectives() noexcept { return false; }
  std::chrono::milliseconds timeout() const noexcept { return g_->timeout(); }
  /// The options a backend made for this rank should use.
  const backend::host_options& backend_options() const noexcept { return backend_opt_; }

  /// Collective (every rank of the group calls it, in the same order as its other collectives): the ranks that
  /// pass the same `color` (>= 0) form a new group, ranked by (key, rank), as MPI_Comm_split does. Runs on the
  /// calling thread and is not counted in stats(). The new group shares the timeout, link model and delay
  /// injection (whose rank is then the rank in the new group); an abort of this group, or a rank of it returning,
  /// reaches it.
  local_communicator split(int color, int key);

  /// Collective of the survivors, after a rank of this group has returned or thrown (its function ended: a rank that
  /// failed; every collective still waiting for it fails at once, naming it, and the group is aborted): the ranks that
  /// have not returned form a new group, ranked as here, not aborted. `survivors`, when given, receives their ranks in
  /// this group. Every surviving rank must call it (the same number of times); one that neither calls it nor returns
  /// within the timeout fails it on every caller, named. A rank that hangs without returning cannot be left
  /// behind: threads cannot be killed, and that is what the timeout names.
  local_communicator shrink(std::vector<int>* survivors = nullptr);

  /// Collective (every rank of the group calls it, with the same number): a group of size() + `newcomers` ranks,
  /// this group's ranks first, ranked as here; the newcomers take ranks size(), ... with join(). `invitation`
  /// receives what they need (hand it to them: comm::start_joining). Aborts of this group, and its ranks returning,
  /// reach the new one; the newcomers' collectives wait for them like any rank's, within the timeout.
  local_communicator grow(int newcomers, local_invitation* invitation);
  /// Newcomer `newcomer` (0, 1, ...) of `invitation`'s: its handle on the grown group (rank invitation.first +
  /// newcomer).
  static local_communicator join(const local_invitation& invitation, int newcomer, backend::host_options backend = {});

  /// The modelled link (fsdp/comm/link.hpp) of this rank's group and its sub-groups, for every collective whose
  /// first rank arrives from now on. For timing studies that make a Model on a link that moves data (its
  /// construction compares the ranks' fingerprints through collectives, which a link moving no data would garble)
  /// and then time its steps on one that does not. One rank's call sets it for the group: call it between
  /// collectives, with every rank between barriers and its model synchronized.
  void set_link(const link_model& link) { g_->set_link(link); }
  /// The link this group's collectives are timed on (local_options::link, cluster, or set_link's).
  link_model link() const { return g_->link(); }

  /// Blocks the calling thread until every rank has reached its matching barrier.
  void barrier() { g_->run(seq_++, rank_, detail::op_desc{-1, 0, dtype::f32, reduce_op::sum, 0}, nullptr, nullptr); }

  collective_stats stats() const { return stats_.get(); }
  void reset_stats() { stats_.reset(); }
  /// Makes every rank's pending and future collectives fail (used when a rank dies).
  void abort(const std::string& reason) noexcept { g_->abort(reason); }

 private:
  friend class detail::collective_front<local_communicator, backend::host::stream>;
  void issue(const detail::op_desc& d, const void* send, void* recv, stream& s, std::int64_t total_elems);

  std::shared_ptr<detail::local_group> g_;
  int rank_;
  backend::host_options backend_opt_;
  std::uint64_t seq_ = 0;
  std::uint64_t splits_ = 0;
  std::uint64_t shrinks_ = 0;
  std::uint64_t grows_ = 0;
  detail::stats_tally stats_;
};

static_assert(CollectivePolicy<local_communicator> && AllToAllCollective<local_communicator> &&
              UnevenAllToAllCollective<local_communicator>);
// Which of the optional capabilities (fsdp/comm/concept.hpp) it has, and which not.
static_assert(SplittableCollective<local_communicator> &&
              ConfiguringCollective<local_communicator> &&
              SerialCollective<local_communicator> &&
              !LabelledCollective<local_communicator> &&
              !DeviceMeasuredCollective<local_communicator> &&
              !ConnectingCollective<local_communicator>);

/// Policy tag: ranks as threads in one process. The nested `communicator` is the per-rank handle.
template <class Backend = backend::host>
struct local {
  static_assert(std::is_same_v<Backend, backend::host>,
                "fsdp::comm::local: no in-process communicator for this backend (the host backend's is here; "
                "include <fsdp/fsdp.cuh> for comm::local<backend::cuda>)");
  using backend_type = Backend;
  using communicator = local_communicator;
};

namespace detail {
/// Runs fn(make(r)) on `world` threads, one per rank, and joins them. When a rank throws, the group is aborted
/// so the other ranks fail fast instead of waiting, and the root cause is rethrown here once every rank has ended. A
/// rank whose function returns or throws is marked gone: a collective still waiting for it fails at once, naming it,
/// and the survivors' shrink() does not wait for it. When a rank's thread
/// cannot be started (a thread or address-space limit), the ranks already started are aborted and joined, and a
/// comm_error says which rank and why.
///
/// `rank(r)` runs rank r. Not a template over it: the threads' code compiles once, whatever the trainer's function
/// (a program that runs many policies instantiates run_local once per policy).
/// `from`: the first rank's number (a group's newcomers, comm::start_joining).
FSDP_DECL void run_ranks(int world, const std::shared_ptr<local_group>& group, const std::function<void(int)>& rank,
                         int from = 0);
/// Runs fn(make(r)) for every rank r (above).
template <class Make, class F>
  requires(!std::is_integral_v<std::remove_cvref_t<F>>)  // run_ranks(world, group, rank, from) above
void run_ranks(int world, const std::shared_ptr<local_group>& group, Make&& make, F&& fn) {
  run_ranks(world, group, std::function<void(int)>([&](int r) {
              auto c = make(r);
              fn(c);
            }));
}
}  // namespace detail

/// Runs fn(local_communicator&) on `world` threads, one per rank, and joins them. When a rank throws, the group
/// is aborted so the other ranks fail fast instead of waiting, the rank counts as gone (as one that returns: the
/// survivors may shrink() without it and go on), and once every rank has ended the first rank's error (the root
/// cause, not a survivor's sight of the abort) is rethrown here.
template <class F>
void run_local(int world, F&& fn, local_options opt = {}) {
  if (world <= 0) fsdp::detail::fail_usage("world size must be positive, got ", world);
  auto group = std::make_shared<detail::local_group>(world, opt.timeout, opt.link, opt.delay);
  if (opt.fault) group->set_fault(std::move(opt.fault));
  if (opt.cluster) {
    std::vector<int> places(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) places[static_cast<std::size_t>(r)] = r;
    group->place(std::make_shared<const cluster_links>(*opt.cluster), std::move(places));
  }
  detail::run_ranks(world, group, [&](int r) { return local_communicator(group, r, opt.backend); },
                    std::forward<F>(fn));
}

/// Starts the newcomers of `invitation` (local_communicator::grow): fn(local_communicator&) on a thread each, as
/// run_local runs ranks (a throw aborts the grown group and is the root cause; a return is marked). Returns at once;
/// the future's get() joins them and rethrows the first error (its destructor waits for them too). fn is moved to
/// the newcomers' threads, which may outlive the caller's scope: what it refers to must live until get() returns.
template <class F>
std::future<void> start_joining(const local_invitation& invitation, F fn, backend::host_options backend = {}) {
  if (!invitation.group) fsdp::detail::fail_usage("start_joining: the invitation is empty (grow makes it)");
  return std::async(std::launch::async, [invitation, fn = std::move(fn), backend]() mutable {
    detail::run_ranks(invitation.newcomers, invitation.group, std::function<void(int)>([&](int r) {
                        local_communicator c = local_communicator::join(invitation, r - invitation.first, backend);
                        fn(c);
                      }),
                      invitation.first);
  });
}

}  // namespace fsdp::comm

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/comm/local.ipp"
#endif
