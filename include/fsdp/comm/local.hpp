#pragma once
// comm::local: ranks as threads of one process, over host memory (the host backend). Every collective is
// issued on a stream and runs in that stream's order on its worker; see detail/local_group.hpp for matching
// and timeouts. `comm::run_local(world, fn)` starts one thread per rank and joins them.
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "fsdp/backend/host.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/detail/collective_front.hpp"
#include "fsdp/comm/detail/local_group.hpp"
#include "fsdp/comm/detail/stats_tally.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm {

using detail::collective_delay;

struct local_options {
  /// Longest a rank waits for the others inside one collective before the whole group fails.
  std::chrono::milliseconds timeout{60000};
  /// A modelled link bandwidth and latency (off by default): see fsdp/comm/link.hpp.
  link_model link{};
  /// Delay injection before each rank's part of each collective (off when empty).
  collective_delay delay{};
  /// Options of each rank's host backend (a Model built on this communicator uses them).
  backend::host_options backend{};
};

/// One rank's handle on an in-process group of thread ranks.
class local_communicator : public detail::collective_front<local_communicator, backend::host::stream> {
 public:
  using backend_type = backend::host;
  using stream = backend_type::stream;

  local_communicator(std::shared_ptr<detail::local_group> g, int rank, backend::host_options backend = {})
      : g_(std::move(g)), rank_(rank), backend_opt_(std::move(backend)) {
    if (rank < 0 || rank >= g_->size())
      fsdp::detail::fail_usage("rank ", rank, " is outside the local group of size ", g_->size());
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return g_->size(); }
  /// Collectives on different streams are not serialised: each stream's runs when the stream gets there
  /// (Model::plan_timeline models this).
  static constexpr bool serial_collectives() noexcept { return false; }
  std::chrono::milliseconds timeout() const noexcept { return g_->timeout(); }
  /// The options a backend made for this rank should use.
  const backend::host_options& backend_options() const noexcept { return backend_opt_; }

  /// Collective (every rank of the group calls it, in the same order as its other collectives): the ranks that
  /// pass the same `color` (>= 0) form a new group, ranked by (key, rank), as MPI_Comm_split does. Runs on the
  /// calling thread and is not counted in stats(). The new group shares the timeout, link model and delay
  /// injection (whose rank is then the rank in the new group); an abort of this group, or a rank of it returning,
  /// reaches it.
  local_communicator split(int color, int key) {
    if (color < 0) fsdp::detail::fail_usage("split on rank ", rank_, ": color must be >= 0, got ", color);
    const std::int32_t mine[2] = {color, key};
    std::vector<std::int32_t> all(static_cast<std::size_t>(2 * size()));
    // an all_gather of 2 x 4 bytes per rank, on this thread (the count is in f32 elements of the same size)
    g_->run(seq_++, rank_, detail::op_desc{int(collective::all_gather), 2, dtype::f32, reduce_op::sum, 0}, mine, all.data());
    std::vector<std::pair<int, int>> pairs;
    for (int q = 0; q < size(); ++q) pairs.emplace_back(all[2 * q], all[2 * q + 1]);
    auto [group, place] = g_->sub_group(splits_++, rank_, pairs);
    return local_communicator(std::move(group), place, backend_opt_);
  }

  /// The modelled link (fsdp/comm/link.hpp) of this rank's group and its sub-groups, for every collective whose
  /// first rank arrives from now on. For timing studies that make a Model on a link that moves data (its
  /// construction compares the ranks' fingerprints through collectives, which a link moving no data would garble)
  /// and then time its steps on one that does not. One rank's call sets it for the group: call it between
  /// collectives, with every rank between barriers and its model synchronized.
  void set_link(const link_model& link) { g_->set_link(link); }

  /// Blocks the calling thread until every rank has reached its matching barrier.
  void barrier() { g_->run(seq_++, rank_, detail::op_desc{-1, 0, dtype::f32, reduce_op::sum, 0}, nullptr, nullptr); }

  collective_stats stats() const { return stats_.get(); }
  void reset_stats() { stats_.reset(); }
  /// Makes every rank's pending and future collectives fail (used when a rank dies).
  void abort(const std::string& reason) noexcept { g_->abort(reason); }

 private:
  friend class detail::collective_front<local_communicator, backend::host::stream>;
  void issue(const detail::op_desc& d, const void* send, void* recv, stream& s, std::int64_t total_elems) {
    if (d.count < 0) fsdp::detail::fail_usage(d.str(), " on rank ", rank_, ": negative count");
    const std::uint64_t seq = seq_++;
    stats_.add(static_cast<std::size_t>(d.kind), d.type, total_elems);
    auto g = g_;
    const int rank = rank_;
    s.submit([g, seq, rank, d, send, recv] { g->run(seq, rank, d, send, recv); });
  }

  std::shared_ptr<detail::local_group> g_;
  int rank_;
  backend::host_options backend_opt_;
  std::uint64_t seq_ = 0;
  std::uint64_t splits_ = 0;
  detail::stats_tally stats_;
};

static_assert(CollectivePolicy<local_communicator> && AllToAllCollective<local_communicator>);

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
/// so the other ranks fail fast instead of waiting, and the root cause is rethrown here. A rank whose function
/// returns is marked so: a collective still waiting for it fails at once, naming it. When a rank's thread
/// cannot be started (a thread or address-space limit), the ranks already started are aborted and joined, and a
/// comm_error says which rank and why.
///
/// `rank(r)` runs rank r. Not a template over it: the threads' code compiles once, whatever the trainer's function
/// (a program that runs many policies instantiates run_local once per policy).
inline void run_ranks(int world, const std::shared_ptr<local_group>& group, const std::function<void(int)>& rank) {
  std::mutex mu;
  std::exception_ptr first;
  bool first_is_abort = true;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    try {
      threads.emplace_back([&, r] {
        try {
          rank(r);
          group->rank_returned(r);  // anything still waiting for this rank fails now, naming it
        } catch (const std::exception& e) {
          const bool aborted_before = group->aborted();
          group->abort("rank " + std::to_string(r) + " failed: " + e.what());
          std::lock_guard lk(mu);
          // Prefer the root cause over errors of ranks that only saw the abort.
          if (!first || (first_is_abort && !aborted_before)) {
            first = std::current_exception();
            first_is_abort = aborted_before;
          }
        } catch (...) {
          group->abort("rank " + std::to_string(r) + " failed with a non-standard exception");
          std::lock_guard lk(mu);
          if (!first) first = std::current_exception();
        }
      });
    } catch (const std::system_error& e) {  // no thread for rank r: stop the ranks started, then say why
      const std::string why = fsdp::detail::cat(
          "could not start the thread of rank ", r, " of ", world, " (", e.what(), "); the ", r,
          " rank(s) already started were stopped. Lower the world size or raise the process's thread or address-space "
          "limit (ulimit -u / -v)");
      group->abort(why);
      for (auto& t : threads) t.join();
      throw comm_error(why);
    }
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}
/// Runs fn(make(r)) for every rank r (above).
template <class Make, class F>
void run_ranks(int world, const std::shared_ptr<local_group>& group, Make&& make, F&& fn) {
  run_ranks(world, group, std::function<void(int)>([&](int r) {
              auto c = make(r);
              fn(c);
            }));
}
}  // namespace detail

/// Runs fn(local_communicator&) on `world` threads, one per rank, and joins them. When a rank throws, the group
/// is aborted so the other ranks fail fast instead of waiting, and the first rank's error is rethrown here.
template <class F>
void run_local(int world, F&& fn, local_options opt = {}) {
  if (world <= 0) fsdp::detail::fail_usage("world size must be positive, got ", world);
  auto group = std::make_shared<detail::local_group>(world, opt.timeout, opt.link, opt.delay);
  detail::run_ranks(world, group, [&](int r) { return local_communicator(group, r, opt.backend); },
                    std::forward<F>(fn));
}

}  // namespace fsdp::comm
