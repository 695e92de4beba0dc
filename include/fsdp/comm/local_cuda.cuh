#pragma once
// comm::local on the CUDA backend: several ranks as host threads of one process, each with its own backend
// (streams, pool) on one GPU, so that multi-rank behaviour is testable on a single device (NCCL refuses two
// ranks on one GPU). Matching, timeouts and aborts are the host local group's (detail/local_group.hpp); the data
// moves on the issuing rank's stream:
//   1. each rank records a "ready" event on its stream and meets the others on the host (same collective, or
//      a comm_error naming both);
//   2. each rank's stream waits for every rank's ready event, then gathers (cudaMemcpyAsync) or reduces (a kernel
//      that reduces the ranks' inputs in rank order with kernels::reduce_add, as the host communicator does, in
//      f32, bf16 or f16) into its own output;
//   3. each rank records a "done" event (the end of its reads of the others' inputs) and publishes it (part());
//      once every rank has, each rank's stream waits for every rank's done event, so no rank overwrites an input
//      another rank still reads;
//   4. a rank leaves the collective only once every rank's stream has enqueued those waits: until then no rank
//      re-records its events for the next collective, or destroys them with its communicator.
// On a failure after step 1 (this rank's or another's: the group is aborted), a rank still records its done event
// after whatever it enqueued, publishes it (abandon(), or part() on an abort), and waits on the host until the done
// events of every rank that met have completed (bounded by the group timeout) before it throws: so its buffers are
// not released (its backend destroyed) while copies already enqueued by other ranks still read them.
// The host thread blocks in steps 1, 3 and 4 until every rank has got there (at most the group timeout), and on
// the GPU only on the failure path.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/backend/cuda.cuh"
#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/detail/collective_front.hpp"
#include "fsdp/comm/detail/local_group.hpp"
#include "fsdp/comm/detail/stats_tally.hpp"
#include "fsdp/comm/local.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/error.cuh"
#include "fsdp/cuda/kernels.cuh"

namespace fsdp::comm {

struct local_cuda_options {
  /// Longest a rank waits for the others inside one collective before the whole group fails.
  std::chrono::milliseconds timeout{60000};
  /// Options of each rank's CUDA backend; device -1 means device 0 for every rank.
  backend::cuda_options backend{};
};

/// One rank's handle on an in-process group of thread ranks sharing one GPU.
class local_cuda_communicator : public detail::collective_front<local_cuda_communicator, backend::cuda::stream> {
 public:
  using backend_type = backend::cuda;
  using stream = backend_type::stream;

  local_cuda_communicator(std::shared_ptr<detail::local_group> g, int rank, backend::cuda_options backend = {})
      : g_(checked(std::move(g), rank)), rank_(rank), backend_opt_(on_device(std::move(backend))) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return g_->size(); }
  /// Collectives on different streams are not serialised: each stream's runs when the stream gets there
  /// (fsdp::plan_timeline(model, ...) models this).
  static constexpr bool serial_collectives() noexcept { return false; }
  const backend::cuda_options& backend_options() const noexcept { return backend_opt_; }

  /// Collective (every rank of the group calls it, in the same order as its other collectives): the ranks that
  /// pass the same `color` (>= 0) form a new group on the same GPU, ranked by (key, rank), as MPI_Comm_split does
  /// (hybrid sharding's shard and replicate groups). Runs on the host, reading the other ranks' (color, key) in
  /// place between meeting and parting; not counted in stats(). The new group shares the timeout; an abort of this
  /// group, or a rank of it returning, reaches it.
  local_cuda_communicator split(int color, int key) {
    detail::require_color(color, rank_);
    const std::int32_t mine[2] = {color, key};
    const detail::op_desc d{int(collective::all_gather), 2, dtype::f32, reduce_op::sum, 0};
    const std::uint64_t seq = seq_++;
    const std::vector<const void*> all = g_->meet(seq, rank_, d, mine);
    std::vector<std::pair<int, int>> pairs;
    for (const void* p : all) {
      const auto* ck = static_cast<const std::int32_t*>(p);
      pairs.emplace_back(ck[0], ck[1]);
    }
    g_->part(seq, rank_, d, nullptr);  // no rank's `mine` goes out of scope before every rank has read it
    auto [group, place] = g_->sub_group(splits_++, rank_, pairs);
    return local_cuda_communicator(std::move(group), place, backend_opt_);
  }

  /// Blocks the calling thread until every rank has reached its matching barrier (host only).
  void barrier() {
    const detail::op_desc d{-1, 0, dtype::f32, reduce_op::sum, 0};
    const std::uint64_t seq = seq_++;
    (void)g_->meet(seq, rank_, d, nullptr);
    g_->part(seq, rank_, d, nullptr);
  }
  collective_stats stats() const { return stats_.get(); }
  void abort(const std::string& reason) noexcept { g_->abort(reason); }

 private:
  friend class detail::collective_front<local_cuda_communicator, backend::cuda::stream>;
  struct token {
    const void* send;
    cudaEvent_t ready;
    const detail::op_desc* desc;  ///< the rank's description (all_to_all_v's counts), alive until it parts
  };

  void issue(const detail::op_desc& d, const void* send, void* recv, stream& s, std::int64_t total_elems) {
    detail::require_count(d.count, [&] { return fsdp::detail::cat(d.str(), " on rank ", rank_); });
    const auto kind = static_cast<collective>(d.kind);
    const std::uint64_t seq = seq_++;
    refuse_capture_of_many(d, seq, s);
    stats_.add(static_cast<std::size_t>(d.kind), d.type, total_elems);
    const int world = size();
    const std::size_t bytes = static_cast<std::size_t>(d.count) * size_of(d.type);
    FSDP_CUDA_CHECK(cudaEventRecord(ready_.get(), s.get()));
    const token mine{send, ready_.get(), &d};
    const std::vector<const void*> all = g_->meet(seq, rank_, d, &mine);
    // From here on the other ranks may read this rank's buffers, and this rank theirs: it leaves through part() or
    // abandon(), never by simply throwing.
    auto peer = [&](int q) { return static_cast<const token*>(all[static_cast<std::size_t>(q)]); };
    if (kind == collective::all_to_all_v) {  // counts that disagree: every rank leaves, nothing enqueued, and says so
      const std::string wrong = detail::uneven_mismatch(
          world, [&](int q) -> const std::vector<std::int64_t>& { return peer(q)->desc->counts; });
      if (!wrong.empty()) {
        g_->part(seq, rank_, d, nullptr);
        throw comm_error(g_->describe(d, seq, rank_) + ": " + wrong);
      }
    }
    void* tmp = nullptr;
    try {
      for (int q = 0; q < world; ++q)
        if (q != rank_) FSDP_CUDA_CHECK(cudaStreamWaitEvent(s.get(), peer(q)->ready, 0));
      switch (kind) {
        case collective::all_gather:
          for (int q = 0; q < world; ++q) {
            char* dst = static_cast<char*>(recv) + bytes * static_cast<std::size_t>(q);
            if (bytes && dst != peer(q)->send)
              FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, peer(q)->send, bytes, cudaMemcpyDeviceToDevice, s.get()));
          }
          break;
        case collective::all_to_all:  // block `rank` of every rank's send, in rank order
          for (int q = 0; q < world; ++q)
            if (bytes)
              FSDP_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(recv) + bytes * static_cast<std::size_t>(q),
                                              static_cast<const char*>(peer(q)->send) +
                                                  bytes * static_cast<std::size_t>(rank_),
                                              bytes, cudaMemcpyDeviceToDevice, s.get()));
          break;
        case collective::all_to_all_v: {  // rank q's block for this rank, in rank order, each as long as q sends it
          const std::size_t esize = size_of(d.type);
          const detail::uneven_blocks mine(d.counts, world, esize);
          for (int q = 0; q < world; ++q) {
            const std::size_t n = static_cast<std::size_t>(mine.recv_count(q)) * esize;
            const std::size_t from = detail::uneven_blocks(peer(q)->desc->counts, world, esize).send_at(rank_);
            if (n)
              FSDP_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(recv) + mine.recv_at(q),
                                              static_cast<const char*>(peer(q)->send) + from, n,
                                              cudaMemcpyDeviceToDevice, s.get()));
          }
          break;
        }
        case collective::broadcast:
          if (bytes && recv != peer(d.root)->send)
            FSDP_CUDA_CHECK(cudaMemcpyAsync(recv, peer(d.root)->send, bytes, cudaMemcpyDeviceToDevice, s.get()));
          break;
        case collective::reduce_scatter:
        case collective::all_reduce:
          fsdp::kernels::dispatch(d.type, [&](auto t) {
            using elem = lowp::storage_t<t()>;
            cuda::kernels::reduce_ranks_params<t()> p{};
            const std::int64_t offset = kind == collective::reduce_scatter ? rank_ * d.count : 0;
            for (int q = 0; q < world; ++q) p.src[q] = static_cast<const elem*>(peer(q)->send) + offset;
            p.n = d.count;
            p.world = world;
            p.premul = d.op == reduce_op::avg ? fsdp::kernels::average_factor<t()>(world) : 1.0f;
            // All-reduce outputs may alias every rank's input: reduce into a temporary, copy after step 4.
            // A reduce-scatter output may alias only this rank's own slice, which no other rank reads; so may
            // anything at world 1 (each element is read before it is written, by the same thread).
            if (kind == collective::all_reduce && bytes && world > 1) {
              FSDP_CUDA_CHECK(cudaMallocAsync(&tmp, bytes, s.get()));
              p.dst = static_cast<elem*>(tmp);
            } else {
              p.dst = static_cast<elem*>(recv);
            }
            cuda::kernels::reduce_ranks(p, s.get());
          });
          break;
      }
      FSDP_CUDA_CHECK(cudaEventRecord(done_.get(), s.get()));
    } catch (const std::exception& e) {
      // The end of whatever this rank enqueued (null if even that fails: the context is then broken anyway).
      const bool marked = cudaEventRecord(done_.get(), s.get()) == cudaSuccess;
      if (!marked) (void)cudaGetLastError();
      if (tmp) FSDP_CUDA_LOG(cudaFreeAsync(tmp, s.get()));
      const std::vector<const void*> dones =
          g_->abandon(seq, rank_, marked ? done_.get() : nullptr, g_->describe(d, seq, rank_) + " failed: " + e.what());
      wait_on_host(dones, seq);
      throw;
    }
    g_->part(
        seq, rank_, d, done_.get(),
        [&](const std::vector<const void*>& dones) {
          for (int q = 0; q < world; ++q)
            if (q != rank_ && dones[q])
              FSDP_CUDA_CHECK(cudaStreamWaitEvent(s.get(), static_cast<cudaEvent_t>(const_cast<void*>(dones[q])), 0));
        },
        [&](const std::vector<const void*>& dones) {
          if (tmp) FSDP_CUDA_LOG(cudaFreeAsync(tmp, s.get()));
          wait_on_host(dones, seq);
        });
    if (tmp) {
      FSDP_CUDA_CHECK(cudaMemcpyAsync(recv, tmp, bytes, cudaMemcpyDeviceToDevice, s.get()));
      FSDP_CUDA_CHECK(cudaFreeAsync(tmp, s.get()));
    }
  }

  /// A captured collective at world > 1: refused before the ranks meet (every rank of a captured step refuses the
  /// same collective). Its ranks meet on the host and wait on each other's events at every collective, which a CUDA
  /// graph of one rank cannot hold.
  void refuse_capture_of_many(const detail::op_desc& d, std::uint64_t seq, stream& s) const {
    if (size() == 1) return;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FSDP_CUDA_CHECK(cudaStreamIsCapturing(s.get(), &status));
    if (status != cudaStreamCaptureStatusNone)
      fsdp::detail::fail_usage(g_->describe(d, seq, rank_), " cannot be captured into a CUDA graph: comm::local's ",
                               size(),
                               " ranks on one GPU meet on the host at every collective and wait on each "
                               "other's events, which one rank's graph cannot hold; capture at world 1, or over "
                               "comm::nccl");
  }

  /// After a failure: blocks until the other ranks' done events (the ends of their reads of this rank's buffers)
  /// have completed, at most the group timeout. Never throws (the caller is about to throw the failure).
  void wait_on_host(const std::vector<const void*>& dones, std::uint64_t seq) const noexcept {
    const auto deadline = std::chrono::steady_clock::now() + g_->timeout();
    for (int q = 0; q < static_cast<int>(dones.size()); ++q) {
      if (q == rank_ || !dones[q]) continue;
      auto e = static_cast<cudaEvent_t>(const_cast<void*>(dones[q]));
      cudaError_t rc;
      while ((rc = cudaEventQuery(e)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (rc == cudaErrorNotReady)
        std::fprintf(stderr,
                     "fsdp: comm::local on rank %d: rank %d's copies of collective #%llu did not finish within %lld ms "
                     "after the abort; they may still read this rank's buffers\n",
                     rank_, q, static_cast<unsigned long long>(seq), static_cast<long long>(g_->timeout().count()));
      else if (rc != cudaSuccess)
        (void)cudaGetLastError();
    }
  }

  static std::shared_ptr<detail::local_group> checked(std::shared_ptr<detail::local_group> g, int rank) {
    if (rank < 0 || rank >= g->size())
      fsdp::detail::fail_usage("rank ", rank, " is outside the local group of size ", g->size());
    if (g->size() > cuda::kernels::max_local_ranks)
      fsdp::detail::fail_usage("comm::local on one GPU supports at most ", cuda::kernels::max_local_ranks,
                               " ranks, got ", g->size());
    return g;
  }
  /// Makes the rank's device current before the events below are created on it.
  static backend::cuda_options on_device(backend::cuda_options o) {
    if (o.device < 0) o.device = 0;
    FSDP_CUDA_CHECK(cudaSetDevice(o.device));
    return o;
  }

  std::shared_ptr<detail::local_group> g_;
  int rank_;
  backend::cuda_options backend_opt_;
  std::uint64_t seq_ = 0;
  std::uint64_t splits_ = 0;
  // Re-recorded per collective; the other ranks' streams wait on them (step 2 and 3) before this rank leaves the
  // collective (step 4), so neither is re-recorded or destroyed before those waits are enqueued.
  backend::cuda::event ready_;
  backend::cuda::event done_;
  detail::stats_tally stats_;
};

static_assert(CollectivePolicy<local_cuda_communicator> && AllToAllCollective<local_cuda_communicator> &&
              UnevenAllToAllCollective<local_cuda_communicator>);
// Which of the optional capabilities (fsdp/comm/concept.hpp) it has, and which not.
static_assert(SplittableCollective<local_cuda_communicator> &&
              ConfiguringCollective<local_cuda_communicator> &&
              SerialCollective<local_cuda_communicator> &&
              !LabelledCollective<local_cuda_communicator> &&
              !DeviceMeasuredCollective<local_cuda_communicator> &&
              !ConnectingCollective<local_cuda_communicator>);

/// Policy tag: ranks as threads in one process, on one GPU.
template <>
struct local<backend::cuda> {
  using backend_type = backend::cuda;
  using communicator = local_cuda_communicator;
};

/// Runs fn(local_cuda_communicator&) on `world` threads sharing one GPU, and joins them (as run_local).
template <class F>
void run_local_cuda(int world, F&& fn, local_cuda_options opt = {}) {
  if (world <= 0) fsdp::detail::fail_usage("world size must be positive, got ", world);
  auto group = std::make_shared<detail::local_group>(world, opt.timeout);
  detail::run_ranks(world, group, [&](int r) { return local_cuda_communicator(group, r, opt.backend); },
                    std::forward<F>(fn));
}

}  // namespace fsdp::comm
