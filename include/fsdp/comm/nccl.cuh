#pragma once
// comm::nccl: the production communicator, NCCL over the CUDA backend's device memory and streams.
//
//   auto comm = fsdp::comm::nccl::from_env();   // RANK/WORLD_SIZE/LOCAL_RANK (torchrun, mpirun, srun: launch.hpp)
//   fsdp::Model<Policy> model(comm, spec, wrap); // Policy's communicator: fsdp::comm::nccl
//
// The unique id travels through a file rendezvous (from_env) or MPI (nccl_mpi.cuh). The communicator is created
// non-blocking, so no NCCL call can hang the host: every call that reports ncclInProgress, and every
// synchronize() of the backend, polls ncclCommGetAsyncError under a timeout; on an error or a timeout the
// communicator is aborted (ncclCommAbort) and the error names the collective, the unit it was issued for and its
// sequence number.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/backend/cuda.cuh"
#include "fsdp/comm/concept.hpp"
#include "fsdp/comm/launch.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/error.cuh"

namespace fsdp::comm {

struct nccl_options {
  /// Longest any wait (communicator set-up, a collective's completion seen through synchronize(), a barrier)
  /// may take before the communicator is aborted and an error names what was pending.
  std::chrono::milliseconds timeout{300000};
  /// The file through which rank 0's unique id reaches the others (from_env). Empty: $FSDP_RENDEZVOUS_FILE.
  std::string rendezvous_file;
  /// Options of this rank's CUDA backend; device -1 means LOCAL_RANK.
  backend::cuda_options backend{};
};

namespace nccl_detail {
inline ncclDataType_t type_of(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f16: return ncclFloat16;
  }
  fsdp::detail::fail_usage("no NCCL type for dtype ", static_cast<int>(t));
}
inline ncclRedOp_t op_of(reduce_op op) { return op == reduce_op::avg ? ncclAvg : ncclSum; }
}  // namespace nccl_detail

/// One rank's NCCL communicator. Not copyable or movable: a Model keeps a reference to it.
class nccl_communicator {
 public:
  using backend_type = backend::cuda;
  using stream = backend_type::stream;

  /// Joins the communicator of `world` ranks identified by `id` as `rank`, on `device`. `rendezvous`, when given,
  /// is removed by rank 0 once every rank has joined.
  nccl_communicator(int rank, int world, int device, const ncclUniqueId& id, nccl_options opt = {},
                    const file_rendezvous* rendezvous = nullptr)
      : rank_(rank), world_(world), opt_(std::move(opt)) {
    if (world <= 0 || rank < 0 || rank >= world)
      fsdp::detail::fail_usage("comm::nccl: rank ", rank, " is outside a world of ", world);
    if (opt_.backend.device < 0) opt_.backend.device = device;
    FSDP_CUDA_CHECK(cudaSetDevice(opt_.backend.device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, world, id, rank, &config);
    settle(rc, "ncclCommInitRankConfig", "communicator set-up");
    if (rendezvous && rank == 0) rendezvous->remove();  // every rank has joined: nobody reads the file any more
    barrier_stream_ = std::make_unique<stream>("rank" + std::to_string(rank) + ".nccl_barrier");
    FSDP_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() {
    std::lock_guard lk(mu_);
    for (auto& p : pending_) FSDP_CUDA_LOG(cudaEventDestroy(p.done));
    for (cudaEvent_t e : spare_) FSDP_CUDA_LOG(cudaEventDestroy(e));
    if (barrier_buf_) FSDP_CUDA_LOG(cudaFree(barrier_buf_));
    if (comm_ && !aborted_) {
      FSDP_NCCL_LOG(ncclCommFinalize(comm_));
      ncclResult_t st = ncclInProgress;
      const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
      while (st == ncclInProgress && std::chrono::steady_clock::now() < deadline) (void)ncclCommGetAsyncError(comm_, &st);
      if (st != ncclSuccess) {
        FSDP_NCCL_LOG(ncclCommAbort(comm_));
        return;
      }
      FSDP_NCCL_LOG(ncclCommDestroy(comm_));
    } else if (comm_) {
      FSDP_NCCL_LOG(ncclCommAbort(comm_));
    }
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_; }
  int device() const noexcept { return opt_.backend.device; }
  ncclComm_t native() const noexcept { return comm_; }

  /// The backend a Model builds on this communicator: this rank's device, and waits that watch NCCL.
  backend::cuda_options backend_options() {
    backend::cuda_options o = opt_.backend;
    o.wait_timeout = opt_.timeout;
    o.poll = [this] { check(); };
    o.on_timeout = [this](const std::string& what) { fail_timeout(what); };
    return o;
  }

  /// Names the unit the next collectives are for (Model calls it), so that an error can say so.
  void label(std::string_view unit) { label_.assign(unit); }

  void all_gather(const void* send, void* recv, std::int64_t count, dtype t, stream& s) {
    issue(collective::all_gather, count, t, count * world_, s, [&] {
      return ncclAllGather(send, recv, static_cast<std::size_t>(count), nccl_detail::type_of(t), comm_, s.get());
    });
  }
  void reduce_scatter(const void* send, void* recv, std::int64_t count, dtype t, reduce_op op, stream& s) {
    issue(collective::reduce_scatter, count, t, count * world_, s, [&] {
      return ncclReduceScatter(send, recv, static_cast<std::size_t>(count), nccl_detail::type_of(t),
                               nccl_detail::op_of(op), comm_, s.get());
    });
  }
  void all_reduce(const void* send, void* recv, std::int64_t count, dtype t, reduce_op op, stream& s) {
    issue(collective::all_reduce, count, t, count, s, [&] {
      return ncclAllReduce(send, recv, static_cast<std::size_t>(count), nccl_detail::type_of(t), nccl_detail::op_of(op),
                           comm_, s.get());
    });
  }
  void broadcast(const void* send, void* recv, std::int64_t count, dtype t, int root, stream& s) {
    if (root < 0 || root >= world_) fsdp::detail::fail_usage("broadcast root ", root, " is outside the group of ", world_);
    issue(collective::broadcast, count, t, count, s, [&] {
      return ncclBroadcast(send, recv, static_cast<std::size_t>(count), nccl_detail::type_of(t), root, comm_, s.get());
    });
  }
  /// Blocks until every rank has reached its barrier (a one-element all-reduce), under the timeout.
  void barrier() {
    label("(barrier)");
    all_reduce(barrier_buf_, barrier_buf_, 1, dtype::f32, reduce_op::sum, *barrier_stream_);
    wait(*barrier_stream_, "barrier");
  }

  /// Runs fn() with its collectives grouped into one NCCL launch (ncclGroupStart / ncclGroupEnd):
  ///   comm.grouped([&] { comm.all_gather(...); comm.reduce_scatter(...); });
  /// A function (not a guard object) so that a failing ncclGroupEnd can throw without throwing from a destructor.
  template <class F>
  void grouped(F&& fn) {
    FSDP_NCCL_CHECK(ncclGroupStart());
    try {
      std::forward<F>(fn)();
    } catch (...) {
      FSDP_NCCL_LOG(ncclGroupEnd());
      throw;
    }
    settle(ncclGroupEnd(), "ncclGroupEnd", fsdp::detail::cat("grouped collectives up to #", seq_ == 0 ? 0 : seq_ - 1));
  }

  /// Blocks until `s` has finished, watching NCCL (errors and the timeout abort the communicator).
  void wait(stream& s, std::string_view what) {
    backend::cuda::wait_for(s.get(), fsdp::detail::cat(what, " on stream '", s.name(), "'"), opt_.timeout,
                            std::chrono::microseconds(50), [&] { check(); },
                            [&](const std::string& msg) { fail_timeout(msg); });
  }

  /// Throws (after aborting the communicator) if NCCL reports an asynchronous error.
  void check() {
    if (aborted_) throw comm_error(fsdp::detail::cat("comm::nccl on rank ", rank_, " was aborted: ", abort_reason_));
    ncclResult_t st = ncclSuccess;
    FSDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
    if (st != ncclSuccess && st != ncclInProgress) {
      const std::string what = fsdp::detail::cat("NCCL reported ", fsdp::detail::nccl_result_name(st), " (", ncclGetErrorString(st),
                                           ") on rank ", rank_, " of ", world_, " while ", oldest_pending());
      abort(what);
      throw nccl_error(st, "ncclCommGetAsyncError(comm, &state)", __FILE__, __LINE__);
    }
    retire_completed();
  }

  /// Aborts the communicator: every pending and later operation fails. Never throws.
  void abort(const std::string& reason) noexcept {
    if (aborted_) return;
    aborted_ = true;
    try {
      abort_reason_ = reason;
    } catch (...) {
    }
    if (comm_) FSDP_NCCL_LOG(ncclCommAbort(comm_));
    comm_ = nullptr;
  }

  collective_stats stats() const {
    std::lock_guard lk(mu_);
    return stats_;
  }
  /// Collectives issued so far (the sequence number of the next one).
  std::uint64_t issued() const noexcept { return seq_; }

 private:
  struct pending {
    std::uint64_t seq;
    collective kind;
    std::int64_t count;
    dtype type;
    std::string unit;
    std::chrono::steady_clock::time_point issued;
    cudaEvent_t done;
  };

  template <class Call>
  void issue(collective kind, std::int64_t count, dtype t, std::int64_t total_elems, stream& s, Call&& call) {
    if (count < 0) fsdp::detail::fail_usage(name_of(kind), " on rank ", rank_, ": negative count ", count);
    if (aborted_) throw comm_error(fsdp::detail::cat(name_of(kind), " on rank ", rank_, " after comm::nccl was aborted: ",
                                               abort_reason_));
    const std::uint64_t seq = seq_++;
    const std::string where = fsdp::detail::cat(name_of(kind), "(count=", count, ", ", name_of(t), ") #", seq, " for unit '",
                                          label_, "'");
    settle(call(), name_of(kind).data(), where);
    cudaEvent_t e = take_event();
    FSDP_CUDA_CHECK(cudaEventRecord(e, s.get()));
    std::lock_guard lk(mu_);
    stats_.count[static_cast<std::size_t>(kind)] += 1;
    stats_.bytes[static_cast<std::size_t>(kind)] += static_cast<std::uint64_t>(total_elems) * size_of(t);
    pending_.push_back({seq, kind, count, t, label_, std::chrono::steady_clock::now(), e});
    if (pending_.size() > 64) retire_completed_locked();
  }

  /// A call's result: success, or (non-blocking communicator) in progress until ncclCommGetAsyncError settles.
  void settle(ncclResult_t rc, const char* call, std::string_view what) {
    const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
    while (rc == ncclInProgress) {
      if (std::chrono::steady_clock::now() > deadline)
        fail_timeout(fsdp::detail::cat(call, " for ", what, " on rank ", rank_, " did not complete within ",
                                 opt_.timeout.count(), " ms"));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      FSDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &rc));
    }
    if (rc != ncclSuccess) {
      abort(fsdp::detail::cat(call, " failed for ", what));
      throw nccl_error(rc, call, __FILE__, __LINE__);
    }
  }

  [[noreturn]] void fail_timeout(const std::string& what) {
    const std::string msg = fsdp::detail::cat(what, "; pending: ", oldest_pending(), "; comm::nccl on rank ", rank_, " of ",
                                        world_, " aborted (a rank that died or issued a different collective "
                                        "sequence leaves the others waiting)");
    abort(msg);
    throw comm_error(msg);
  }

  std::string oldest_pending() {
    std::lock_guard lk(mu_);
    retire_completed_locked();
    if (pending_.empty()) return "no collective pending";
    const pending& p = pending_.front();
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - p.issued);
    return fsdp::detail::cat(name_of(p.kind), "(count=", p.count, ", ", name_of(p.type), ") #", p.seq, " for unit '", p.unit,
                       "', issued ", age.count(), " ms ago and not complete");
  }

  void retire_completed() {
    std::lock_guard lk(mu_);
    retire_completed_locked();
  }
  void retire_completed_locked() {
    while (!pending_.empty()) {
      const cudaError_t rc = cudaEventQuery(pending_.front().done);
      if (rc == cudaErrorNotReady) return;
      if (rc != cudaSuccess) (void)cudaGetLastError();  // reported by the stream's own checks
      spare_.push_back(pending_.front().done);
      pending_.pop_front();
    }
  }

  cudaEvent_t take_event() {
    {
      std::lock_guard lk(mu_);
      if (!spare_.empty()) {
        cudaEvent_t e = spare_.back();
        spare_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  int rank_;
  int world_;
  nccl_options opt_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  std::string abort_reason_;
  std::string label_ = "(none)";
  std::uint64_t seq_ = 0;
  std::unique_ptr<stream> barrier_stream_;
  void* barrier_buf_ = nullptr;
  mutable std::mutex mu_;
  std::deque<pending> pending_;
  std::vector<cudaEvent_t> spare_;
  collective_stats stats_;
};

static_assert(CollectivePolicy<nccl_communicator>);

/// Policy tag: NCCL between processes (one GPU each). from_env() builds this process's communicator.
struct nccl {
  using backend_type = backend::cuda;
  using communicator = nccl_communicator;

  /// Rank, world and device from the launcher's environment (launch_env::read); rank 0's unique id through the
  /// rendezvous file (nccl_options::rendezvous_file, else $FSDP_RENDEZVOUS_FILE). A world of one needs no file.
  static nccl_communicator from_env(nccl_options opt = {}) {
    const launch_env env = launch_env::read();
    ncclUniqueId id{};
    std::string path = opt.rendezvous_file;
    if (path.empty())
      if (const char* p = std::getenv("FSDP_RENDEZVOUS_FILE")) path = p;
    std::unique_ptr<file_rendezvous> rdv;
    if (env.world > 1) {
      if (path.empty())
        fsdp::detail::fail_usage("comm::nccl::from_env: a world of ", env.world,
                                 " needs a rendezvous file on a path every rank sees: set FSDP_RENDEZVOUS_FILE or "
                                 "nccl_options::rendezvous_file (or use comm::nccl_from_mpi (nccl_mpi.cuh) under mpirun)");
      rdv = std::make_unique<file_rendezvous>(path, env.world);
    }
    if (env.rank == 0) {
      FSDP_NCCL_CHECK(ncclGetUniqueId(&id));
      if (rdv) rdv->publish(std::vector<char>(reinterpret_cast<const char*>(&id), reinterpret_cast<const char*>(&id) + sizeof id));
    } else {
      const std::vector<char> blob = rdv->fetch(sizeof id, opt.timeout);
      std::memcpy(&id, blob.data(), sizeof id);
    }
    const int device = opt.backend.device >= 0 ? opt.backend.device : env.local_rank;
    return nccl_communicator(env.rank, env.world, device, id, std::move(opt), rdv.get());
  }
};

}  // namespace fsdp::comm
