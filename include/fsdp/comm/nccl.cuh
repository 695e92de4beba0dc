#pragma once
// comm::nccl: the production communicator, NCCL over the CUDA backend's device memory and streams.
//
//   auto comm = fsdp::comm::nccl::from_env();   // RANK/WORLD_SIZE/LOCAL_RANK (torchrun, mpirun, srun: launch.hpp)
//   fsdp::Model<Policy> model(comm, spec, wrap); // Policy's communicator: fsdp::comm::nccl
//
// The unique id travels through a file rendezvous (from_env) or MPI (nccl_mpi.cuh); the device is chosen by
// choose_device (launch.hpp). The communicator is created non-blocking, so no NCCL call that waits on other ranks
// can hang the host (ncclCommAbort and ncclCommDestroy block, as NCCL runs them blocking whatever the config, but
// wait on no other rank): every call that reports ncclInProgress, and every synchronize() of the backend, polls
// ncclCommGetAsyncError under a timeout; on an asynchronous error or a timeout the communicator is aborted
// (ncclCommAbort) and the comm_error names the pending collectives, the units they were issued for and their sequence
// numbers. The decisions
// (settling, messages, groups, shutdown) are made by detail::nccl_core (detail/nccl_logic.hpp), tested on the host.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
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
#include "fsdp/comm/detail/collective_front.hpp"
#include "fsdp/comm/detail/nccl_logic.hpp"
#include "fsdp/comm/launch.hpp"
#include "fsdp/comm/nccl_failure.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/error.cuh"

namespace fsdp::comm {

struct nccl_options {
  /// Longest any wait (communicator set-up, a collective's completion seen through synchronize(), a barrier)
  /// may take before the communicator is aborted and an error names what was pending.
  std::chrono::milliseconds timeout{300000};
  /// The file through which rank 0's unique id reaches the others (from_env). Empty: $FSDP_RENDEZVOUS_FILE.
  std::string rendezvous_file;
  /// Options of this rank's CUDA backend; device -1 lets from_env / nccl_from_mpi choose (choose_device in
  /// launch.hpp: device 0 when one device is visible, else the local rank).
  backend::cuda_options backend{};
  /// One communicator for every stream (the default), or one per stream name (needs NCCL 2.26+ and
  /// NCCL_LAUNCH_ORDER_IMPLICIT=1): see fsdp/comm/nccl_channels.hpp.
  nccl_channels channels = nccl_channels::one;
  /// What a failure does to the communicators: abort them (the default), or revoke them so that the survivors can
  /// shrink() (NCCL 2.28.7 or later, refused at construction below): see fsdp/comm/nccl_failure.hpp.
  nccl_failure on_failure = nccl_failure::abort;
};

namespace detail {
/// NCCL has the fp8 types from 2.24 (reductions in them on sm_90 and later GPUs only: NCCL refuses the others).
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
inline constexpr bool has_fp8 = true;
static_assert(row_of(dtype::f8e4m3).nccl == ncclFloat8e4m3 && row_of(dtype::f8e5m2).nccl == ncclFloat8e5m2,
              "fsdp: core/dtype.hpp's fp8 NCCL codes differ from this nccl.h's");
#else
inline constexpr bool has_fp8 = false;
#endif
/// The NCCL type of `t`: its row's code (core/dtype.hpp), which nccl.h's enumerators must match.
inline ncclDataType_t type_of(dtype t) {
  if (!is_dtype(t)) fsdp::detail::fail_usage("no NCCL type for dtype ", static_cast<int>(t));
  if ((t == dtype::f8e4m3 || t == dtype::f8e5m2) && !has_fp8)
    fsdp::detail::fail_usage("comm::nccl: dtype ", name_of(t), " needs NCCL 2.24 or later; this nccl.h is ",
                             NCCL_MAJOR, ".", NCCL_MINOR);
  return static_cast<ncclDataType_t>(row_of(t).nccl);
}
static_assert(row_of(dtype::f32).nccl == ncclFloat32 && row_of(dtype::bf16).nccl == ncclBfloat16 &&
                  row_of(dtype::f16).nccl == ncclFloat16 && row_of(dtype::i8).nccl == ncclInt8,
              "fsdp: core/dtype.hpp's NCCL codes differ from this nccl.h's");
inline ncclRedOp_t op_of(reduce_op op) { return op == reduce_op::avg ? ncclAvg : ncclSum; }

/// Every communicator's configuration, written once: non-blocking, and sharing no resources with its parent
/// (splitShare 0: NCCL 2.28 reads a split's splitShare from the parent's config, src/init.cc's
/// ncclCommInitChildComm, so a world made with this config and its splits made with it agree).
inline ncclConfig_t communicator_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = 0;
  return config;
}
}  // namespace detail

/// The NCCL and CUDA calls behind nccl_core (detail/nccl_logic.hpp), which makes every decision about them.
struct nccl_api {
  using result = ncclResult_t;
  static constexpr result success = ncclSuccess;
  static constexpr result in_progress = ncclInProgress;
  static constexpr result internal_error = ncclInternalError;
  using stream = cudaStream_t;
  using event = cudaEvent_t;
  using comm = ncclComm_t;
  using data_type = ncclDataType_t;

  data_type type_of(dtype t) const { return detail::type_of(t); }

  result get_async_error(comm c, result& state) { return ncclCommGetAsyncError(c, &state); }
  /// The new communicator is configured as every communicator here (detail::communicator_config). A non-blocking
  /// split answers ncclSuccess while it still runs: nccl_core polls the parent's state before it reads `out`.
  result split(comm parent, int color, int key, comm& out) {
    ncclConfig_t config = detail::communicator_config();
    return ncclCommSplit(parent, color, key, &out, &config);
  }
  result comm_abort(comm c) { return ncclCommAbort(c); }
  /// ncclCommRevoke and ncclCommShrink (NCCL 2.28.7) are looked up in the loaded library, not linked, so that a
  /// binary built against a newer nccl.h still loads with an older libnccl (the GPU machine's is 2.28.3); nccl_core
  /// refuses both below 2.28.7 (version()) before calling them. Not yet run on hardware.
  result revoke(comm c) {
    using fn = ncclResult_t (*)(ncclComm_t, int);
    static const fn f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
    return f ? f(c, 0 /* NCCL_REVOKE_DEFAULT */) : ncclInvalidUsage;
  }
  /// The new communicator inherits its parent's config (non-blocking, no shared resources).
  result shrink(comm parent, const std::vector<int>& exclude, comm& out) {
    using fn = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
    static const fn f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "ncclCommShrink"));
    if (!f) return ncclInvalidUsage;
    std::vector<int> list(exclude);
    return f(parent, list.data(), static_cast<int>(list.size()), &out, nullptr, 0 /* NCCL_SHRINK_DEFAULT */);
  }
  /// The loaded library's NCCL_VERSION_CODE (0 when NCCL cannot say).
  int version() const {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
  }
  result finalize(comm c) { return ncclCommFinalize(c); }
  result destroy(comm c) { return ncclCommDestroy(c); }
  result group_start() { return ncclGroupStart(); }
  result group_end() { return ncclGroupEnd(); }
  /// A broadcast from root -1: NCCL rejects it (ncclInvalidArgument) before touching any buffer or stream, and a
  /// call rejected inside a group makes the group fail as a whole, so ncclGroupEnd launches none of it.
  result fail_group(comm c) { return ncclBroadcast(nullptr, nullptr, 0, ncclFloat32, -1, c, nullptr); }
  std::string describe(result r, comm c) const {
    std::string s = fsdp::detail::cat(fsdp::detail::nccl_result_name(r), " (", ncclGetErrorString(r), ")");
    // NCCL keeps one last message per process, never cleared: it may be about an earlier call, so it is labelled.
    if (const char* last = ncclGetLastError(c); last && *last)
      s += fsdp::detail::cat(" [NCCL's last message, maybe from an earlier call: ", last, "]");
    return s;
  }
  event new_event() {
    cudaEvent_t e = nullptr;
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void record(event e, stream s) { FSDP_CUDA_CHECK(cudaEventRecord(e, s)); }
  void wait(stream s, event e) { FSDP_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0)); }
  bool capturing(stream s) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FSDP_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
    return status != cudaStreamCaptureStatusNone;
  }
  stream new_stream() {
    cudaStream_t s = nullptr;
    FSDP_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, backend::cuda::most_urgent_priority()));
    return s;
  }
  void destroy_stream(stream s) noexcept { FSDP_CUDA_LOG(cudaStreamDestroy(s)); }
  /// Zeroed, so that no collective reads memory nothing wrote: at world size 1 NCCL copies an all-gather's input
  /// with cudaMemcpy, which compute-sanitizer's initcheck counted as reads of uninitialized memory (H200,
  /// 2026-11-28).
  void* device_alloc(std::size_t bytes) {
    void* p = nullptr;
    FSDP_CUDA_CHECK(cudaMalloc(&p, bytes));
    try {
      FSDP_CUDA_CHECK(cudaMemset(p, 0, bytes));
    } catch (...) {
      FSDP_CUDA_LOG(cudaFree(p));
      throw;
    }
    return p;
  }
  void device_free(void* p) noexcept { FSDP_CUDA_LOG(cudaFree(p)); }
  bool complete(event e) {
    const cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaErrorNotReady) return false;
    if (rc != cudaSuccess) (void)cudaGetLastError();  // reported by the stream's own checks
    return true;
  }
  void destroy_event(event e) noexcept { FSDP_CUDA_LOG(cudaEventDestroy(e)); }
  std::chrono::steady_clock::time_point now() const { return std::chrono::steady_clock::now(); }
  void sleep(std::chrono::microseconds d) const { std::this_thread::sleep_for(d); }
  void log(const std::string& line) const noexcept {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
  std::int64_t free_device_bytes() const {
    std::size_t free = 0, total = 0;
    FSDP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<std::int64_t>(free);
  }
};

/// One rank's NCCL communicator. Not copyable or movable: a Model keeps a reference to it.
///
/// By default (nccl_channels::one) one NCCL communicator, made at construction, carries every collective: one
/// order on every rank, and nothing made during a step. Under nccl_channels::per_stream (NCCL 2.26+ with
/// NCCL_LAUNCH_ORDER_IMPLICIT=1, else refused at construction) one more per stream name is split from it
/// (ncclCommSplit) on the first collective issued on a stream of that name, so that a prefetched all-gather on the
/// gather stream never waits behind a reduce-scatter on the reduce stream inside NCCL. Every rank issues in program
/// order, so the splits match. Two streams of one name share a communicator and must not have collectives in
/// flight at once (the Model's streams are "rankN.all_gather", "rankN.reduce", "rankN.compute"). device_bytes()
/// is what the creation of its communicators took from the device, measured.
///
/// split(color, key) makes the communicator of a sub-group (hybrid sharding's shard and replicate groups). The
/// sub-group belongs to this communicator's family: the CUDA backend's waits, which watch this communicator, see
/// its errors too, and a failure of either aborts both.
class nccl_communicator : public detail::collective_front<nccl_communicator, backend::cuda::stream> {
 public:
  using backend_type = backend::cuda;
  using stream = backend_type::stream;

  /// Joins the communicator of `world` ranks identified by `id` as `rank`, on `device`. `rendezvous`, when given,
  /// is removed by rank 0 once every rank has joined.
  nccl_communicator(int rank, int world, int device, const ncclUniqueId& id, nccl_options opt = {},
                    const file_rendezvous* rendezvous = nullptr)
      : opt_(std::move(opt)),
        core_(nccl_api{}, rank, world, opt_.timeout, "comm::nccl", opt_.channels, opt_.on_failure) {
    if (world <= 0 || rank < 0 || rank >= world)
      fsdp::detail::fail_usage("comm::nccl: rank ", rank, " is outside a world of ", world);
    if (opt_.channels == nccl_channels::per_stream)  // the loaded library's version, as nccl_core's gates read it
      if (const std::string why =
              detail::per_stream_refusal(nccl_api{}.version(), std::getenv("NCCL_LAUNCH_ORDER_IMPLICIT"));
          !why.empty())
        throw usage_error(why);
    if (opt_.backend.device < 0) opt_.backend.device = device;
    FSDP_CUDA_CHECK(cudaSetDevice(opt_.backend.device));
    ncclConfig_t config = detail::communicator_config();  // what its splits are made with too
    ncclComm_t c = nullptr;
    const std::int64_t free_before = core_.free_device_bytes();
    const ncclResult_t rc = ncclCommInitRankConfig(&c, world, id, rank, &config);
    core_.init(c, rc, "ncclCommInitRankConfig", "communicator set-up", free_before);
    if (rendezvous && rank == 0) rendezvous->remove();  // every rank has joined: nobody reads the files any more
    barrier_stream_ = std::make_unique<stream>(fsdp::stream_name(rank, "nccl_barrier"));
    FSDP_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() {
    core_.shutdown();
    if (barrier_buf_) FSDP_CUDA_LOG(cudaFree(barrier_buf_));
  }

  int rank() const noexcept { return core_.rank(); }
  int size() const noexcept { return core_.size(); }
  int device() const noexcept { return opt_.backend.device; }
  /// The base NCCL communicator (barrier() and split() use it; each stream has its own); null once aborted.
  ncclComm_t native() const noexcept { return core_.base(); }

  /// The communicator of the ranks that pass the same `color` (>= 0), ranked by (key, rank), as MPI_Comm_split
  /// does: ncclCommSplit on the base communicator, a collective of every rank of this one, settled under the
  /// timeout. The new communicator uses this one's device and options and belongs to its family (see above).
  nccl_communicator split(int color, int key) {
    detail::require_color(color, rank());
    const std::int64_t free_before = core_.free_device_bytes();
    return nccl_communicator(*this, core_.split(color, key), color, key, free_before);
  }

  /// After a failure revoked this communicator (nccl_options::on_failure = nccl_failure::revoke), or on a healthy
  /// one whose ranks `exclude` leave: the communicator of the others, ranked as here with the gaps closed
  /// (ncclCommShrink on the base communicator, a collective of every rank not excluded, settled under the timeout;
  /// NCCL 2.28.7 or later). NCCL does not say which rank failed: the survivors agree on `exclude` outside NCCL
  /// (their launcher, a store) and pass the same list. The new communicator has this one's device and options and a
  /// family of its own; models and split groups made on this one must be rebuilt on it (fsdp::elastic::reshard
  /// moves their state). Compiled, and its decisions tested against a fake NCCL (nccl_logic_test); not yet run on
  /// hardware.
  nccl_communicator shrink(std::vector<int> exclude) {
    const std::int64_t free_before = core_.free_device_bytes();
    return nccl_communicator(*this, core_.shrink(std::move(exclude)), -1, 0, free_before);
  }
  /// Refused, with the sentence that says why (detail::grow_refusal): a communicator that takes newcomers
  /// (ncclCommGrow, NCCL 2.29.2) is not built; thread ranks have one (comm::local_communicator::grow).
  [[noreturn]] void grow(int /*newcomers*/) { throw usage_error(detail::grow_refusal(core_.api().version())); }

  /// What the creation of this group's NCCL communicators took from the device (free memory before and after
  /// each: ncclCommInitRankConfig or ncclCommSplit, and the per-stream splits), outside the backend's pool and the
  /// memory plan. A split group's are its own. Leave at least this much beside a plan's peak (budget_query::
  /// outside_plan_bytes).
  std::int64_t device_bytes() const noexcept { return core_.device_bytes(); }
  /// Whether collectives on different streams run one at a time in issue order (nccl_channels::one: one NCCL
  /// communicator for every stream); Model::plan_timeline models what this says.
  bool serial_collectives() const noexcept { return opt_.channels == nccl_channels::one; }

  /// The backend a Model builds on this communicator: this rank's device, and waits that watch NCCL.
  backend::cuda_options backend_options() {
    backend::cuda_options o = opt_.backend;
    o.wait_timeout = opt_.timeout;
    o.poll = [this] { check(); };
    o.on_timeout = [this](const std::string& what) { core_.fail_timeout(what); };
    return o;
  }

  /// Names the unit the next collectives are for (Model calls it), so that an error can say so.
  void label(std::string_view unit) { core_.label(unit); }

  // all_gather, reduce_scatter, all_reduce, broadcast, all_to_all and all_to_all_v: detail::collective_front's (its
  // checks, the broadcast root and all_to_all's apart buffers, written once for every communicator), issued by
  // issue() below.
  // NCCL has no all-to-all: it is a group of one ncclSend and one ncclRecv per rank (this one included), issued and
  // settled as one collective (detail::nccl_core::all_to_all; all_to_all_v likewise, its empty blocks left out, and
  // the peers' counts not checked: docs/policies.md, "Uneven all_to_all").

  /// Makes what these collectives need on this group's communicator before they are first issued (NCCL's
  /// lazily connected ring, tree and NVLS buffers, and the per-peer buffers of an all-to-all; see
  /// detail::nccl_core::connect): each runs once, over scratch buffers, on the base communicator, and what that
  /// took from the device is added to device_bytes() (connect_bytes()). A Model calls it with its plan's
  /// collectives (fsdp/plan/collectives.hpp) before it reserves the plan's memory. Collective: every rank of the
  /// group, with the same uses.
  void connect(const std::vector<collective_use>& uses) {
    core_.connect(uses, [&](const collective_use& u, void* send, void* recv) {
      if (u.kind == collective::all_to_all) detail::require_apart(send, recv, u.count, u.type, rank(), size());
      const std::int64_t whole = u.kind == collective::all_gather || u.kind == collective::reduce_scatter ||
                                         u.kind == collective::all_to_all
                                     ? u.count * size()
                                     : u.count;
      issue_on({int(u.kind), u.count, u.type, reduce_op::sum, 0}, send, recv, *barrier_stream_, {}, whole);
    });
  }
  /// Of device_bytes(), what connect() took (measured).
  std::int64_t connect_bytes() const noexcept { return core_.connect_bytes(); }

  /// Blocks until every rank has reached its barrier (a one-element all-reduce on the base communicator), under
  /// the timeout.
  void barrier() {
    label("(barrier)");
    const detail::op_desc one{int(collective::all_reduce), 1, dtype::f32, reduce_op::sum, 0};
    issue_on(one, barrier_buf_, barrier_buf_, *barrier_stream_, {}, 1);
    wait(*barrier_stream_, "barrier");
  }

  /// Runs fn() with its collectives grouped into one NCCL launch (ncclGroupStart / ncclGroupEnd):
  ///   comm.grouped([&] { comm.all_gather(...); comm.reduce_scatter(...); });
  /// A function (not a guard object) so that a failing ncclGroupEnd can throw without throwing from a destructor.
  /// Completion is tracked from the launch on. If fn throws, nothing of the group is launched, the communicator is
  /// aborted (this rank's collective sequence no longer matches the others') and a comm_error says so.
  template <class F>
  void grouped(F&& fn) {
    core_.grouped(std::forward<F>(fn));
  }

  /// Blocks until `s` has finished, watching NCCL (errors and the timeout abort the communicator).
  void wait(stream& s, std::string_view what) {
    backend::cuda::wait_for(s.get(), fsdp::detail::cat(what, " on stream '", s.name(), "'"), opt_.timeout,
                            std::chrono::microseconds(50), [&] { check(); },
                            [&](const std::string& msg) { core_.fail_timeout(msg); });
  }

  /// Throws comm_error (after aborting the communicator) if NCCL reports an asynchronous error; the message names
  /// the pending collectives, their units and sequence numbers.
  void check() { core_.check(); }

  /// Aborts the communicator and its family: every pending and later operation fails. Never throws.
  void abort(const std::string& reason) noexcept { core_.abort(reason); }

  collective_stats stats() const { return core_.stats(); }
  /// Collectives issued so far (the sequence number of the next one).
  std::uint64_t issued() const noexcept { return core_.issued(); }

 private:
  /// A group split from `parent`: `c` is the settled result of its ncclCommSplit, `free_before` the device's free
  /// memory before it. `color` -1: the survivors' group that `parent`'s shrink() made.
  nccl_communicator(nccl_communicator& parent, ncclComm_t c, int color, int key, std::int64_t free_before)
      : nccl_communicator(parent, c, shape_of(c), color, key, free_before) {}
  nccl_communicator(nccl_communicator& parent, ncclComm_t c, std::pair<int, int> shape, int color, int key,
                    std::int64_t free_before)
      : opt_(parent.opt_),
        core_(nccl_api{}, shape.first, shape.second, opt_.timeout,
              color >= 0 ? fsdp::detail::cat(parent.core_.name(), " split(color=", color, ", key=", key, ")")
                         : fsdp::detail::cat(parent.core_.name(), " shrunk"),
              opt_.channels, opt_.on_failure) {
    core_.init(c, ncclSuccess, color >= 0 ? "ncclCommSplit" : "ncclCommShrink",
               color >= 0 ? "a split group" : "the survivors' group", free_before);
    if (color >= 0) core_.join_family(parent.core_);  // a shrunk group is a family of its own
    barrier_stream_ = std::make_unique<stream>(
        fsdp::stream_name(parent.rank(), color >= 0 ? fsdp::detail::cat("nccl_barrier.split", color)
                                                    : std::string("nccl_barrier.shrunk")));
    FSDP_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
  }

  /// (rank, ranks) of a new communicator; aborts it when NCCL cannot say.
  static std::pair<int, int> shape_of(ncclComm_t c) {
    int r = 0, n = 0;
    ncclResult_t rc = ncclCommUserRank(c, &r);
    if (rc == ncclSuccess) rc = ncclCommCount(c, &n);
    if (rc != ncclSuccess) {
      (void)ncclCommAbort(c);
      throw comm_error(fsdp::detail::cat("comm::nccl: ncclCommUserRank / ncclCommCount of a split group reported ",
                                         fsdp::detail::nccl_result_name(rc), "; the group was aborted"));
    }
    return {r, n};
  }

  friend class detail::collective_front<nccl_communicator, stream>;
  /// A collective of collective_front's on `s`, on the channel of its stream's name.
  void issue(const detail::op_desc& d, const void* send, void* recv, stream& s, std::int64_t total_elems) {
    issue_on(d, send, recv, s, s.name(), total_elems);
  }
  /// ... on the channel of `key` (empty: the base communicator, as barrier() and connect() use).
  void issue_on(const detail::op_desc& d, const void* send, void* recv, stream& s, std::string_view key,
                std::int64_t total_elems) {
    const auto kind = static_cast<collective>(d.kind);
    const auto n = static_cast<std::size_t>(d.count);
    if (kind == collective::all_to_all) {
      const std::size_t block = n * size_of(d.type);
      core_.all_to_all(
          d.count, d.type, s.get(), key,
          [&](ncclComm_t c, cudaStream_t on, ncclDataType_t nt, int q) {
            return ncclSend(static_cast<const char*>(send) + q * block, n, nt, q, c, on);
          },
          [&](ncclComm_t c, cudaStream_t on, ncclDataType_t nt, int q) {
            return ncclRecv(static_cast<char*>(recv) + q * block, n, nt, q, c, on);
          });
      return;
    }
    if (kind == collective::all_to_all_v) {  // blocks in rank order, each its own size; the empty ones not sent
      core_.all_to_all_v(
          d.counts, d.type, s.get(), key,
          [&](ncclComm_t c, cudaStream_t on, ncclDataType_t nt, int q, std::size_t at, std::int64_t count) {
            return ncclSend(static_cast<const char*>(send) + at, static_cast<std::size_t>(count), nt, q, c, on);
          },
          [&](ncclComm_t c, cudaStream_t on, ncclDataType_t nt, int q, std::size_t at, std::int64_t count) {
            return ncclRecv(static_cast<char*>(recv) + at, static_cast<std::size_t>(count), nt, q, c, on);
          });
      return;
    }
    const auto call = [&](ncclComm_t c, cudaStream_t on, ncclDataType_t nt) {
      switch (kind) {
        case collective::all_gather: return ncclAllGather(send, recv, n, nt, c, on);
        case collective::reduce_scatter: return ncclReduceScatter(send, recv, n, nt, detail::op_of(d.op), c, on);
        case collective::broadcast: return ncclBroadcast(send, recv, n, nt, d.root, c, on);
        default: return ncclAllReduce(send, recv, n, nt, detail::op_of(d.op), c, on);  // all_to_all(_v): above
      }
    };
    core_.issue(kind, d.count, d.type, total_elems, s.get(), key, call);
  }

  nccl_options opt_;
  detail::nccl_core<nccl_api> core_;
  std::unique_ptr<stream> barrier_stream_;
  void* barrier_buf_ = nullptr;
};

static_assert(CollectivePolicy<nccl_communicator> && AllToAllCollective<nccl_communicator> &&
              UnevenAllToAllCollective<nccl_communicator>);
// Which of the optional capabilities (fsdp/comm/concept.hpp) it has, and which not.
static_assert(LabelledCollective<nccl_communicator> &&
              SplittableCollective<nccl_communicator> &&
              ConfiguringCollective<nccl_communicator> &&
              SerialCollective<nccl_communicator> &&
              DeviceMeasuredCollective<nccl_communicator> &&
              ConnectingCollective<nccl_communicator>);

/// Policy tag: NCCL between processes (one GPU each). from_env() builds this process's communicator.
struct nccl {
  using backend_type = backend::cuda;
  using communicator = nccl_communicator;

  /// Rank, world and local rank from the launcher's environment (launch_env::read); the device from them and the
  /// visible devices (visible_device); rank 0's unique id through the rendezvous files (nccl_options::rendezvous_file,
  /// else $FSDP_RENDEZVOUS_FILE; see file_rendezvous). A world of one needs no file.
  static nccl_communicator from_env(nccl_options opt = {}) {
    const launch_env env = launch_env::read();
    const int device = visible_device(env.rank, opt.backend.device, env.local_rank,
                                      fsdp::detail::cat(env.local_rank_var, ", ", env.source));
    ncclUniqueId id{};
    std::string path = opt.rendezvous_file;
    if (path.empty())
      if (const char* p = std::getenv("FSDP_RENDEZVOUS_FILE")) path = p;
    std::unique_ptr<file_rendezvous> rdv;
    if (env.world > 1) {
      if (path.empty())
        fsdp::detail::fail_usage(
            "comm::nccl::from_env: a world of ", env.world,
            " needs a rendezvous file on a path every rank sees: set FSDP_RENDEZVOUS_FILE or "
            "nccl_options::rendezvous_file (or use comm::nccl_from_mpi (nccl_mpi.cuh) under mpirun)");
      rdv = std::make_unique<file_rendezvous>(path, env.world, env.rank);
    }
    if (env.rank == 0) {
      FSDP_NCCL_CHECK(ncclGetUniqueId(&id));
      if (rdv)
        rdv->publish(
            std::vector<char>(reinterpret_cast<const char*>(&id), reinterpret_cast<const char*>(&id) + sizeof id),
            opt.timeout);
    } else {
      const std::vector<char> blob = rdv->fetch(sizeof id, opt.timeout);
      std::memcpy(&id, blob.data(), sizeof id);
    }
    return nccl_communicator(env.rank, env.world, device, id, std::move(opt), rdv.get());
  }

  /// The NCCL this process runs on, as "2.30.7" (ncclGetVersion: the library loaded, which may not be the one whose
  /// header the program was built with), or "unknown" when NCCL cannot say. Several ranks on one GPU need 2.30.
  static std::string version() {
    const int code = nccl_api{}.version();
    return code > 0 ? detail::nccl_version_name(code) : std::string("unknown");
  }

  /// This rank's device: choose_device (launch.hpp) over cudaGetDeviceCount and $CUDA_VISIBLE_DEVICES.
  static int visible_device(int rank, int explicit_device, int local_rank, std::string_view local_rank_from) {
    int visible = 0;
    const cudaError_t rc = cudaGetDeviceCount(&visible);
    if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
      (void)cudaGetLastError();
      visible = 0;
    } else if (rc != cudaSuccess) {
      fsdp::detail::throw_cuda_error(rc, "cudaGetDeviceCount(&visible)", __FILE__, __LINE__);
    }
    return choose_device(rank, explicit_device, local_rank, local_rank_from, visible,
                         std::getenv("CUDA_VISIBLE_DEVICES"));
  }
};

}  // namespace fsdp::comm
