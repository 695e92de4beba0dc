#pragma once
// The CUDA backend: device memory, streams and events, kernels. It offers the interface of backend::host
// (buffers accounted by category, compute / all-gather / reduce streams, events, stream-ordered release, host
// callbacks, copies and kernels), so Model and its scheduler run on it unchanged: no scheduling logic is written
// twice. Kernels are fsdp/cuda/kernels.cuh; they apply the per-element code the host backend uses.
//
// Memory comes from a CUDA memory pool owned by the backend (cudaMemPoolCreate) whose release threshold is
// "never": memory freed inside a step stays in the pool for the next step. Model::reserve_memory() grows the
// pool to the planner's peak before the first step (the model reserves for parameters, gradients and gathers;
// the optimizers for their state). Allocation and release are stream-ordered (cudaMallocFromPoolAsync /
// cudaFreeAsync) on the stream that first uses a buffer and the stream that last uses it.
//
// Bounded by the plan: gathered parameters, unsharded gradients and the reduce buffers live in slots the executor
// owns (fsdp/detail/exec/slot_ring.hpp), made in the first step where first used and reused only after the taking
// stream has waited for the event recorded where the slot was given back; after the first step the unit executor asks
// this pool only for the no-sync accumulators (taken in a unit's first no-sync backward, given back after its
// reduction, at the same sizes every step, each allocation ordered after the frees by the step's event waits) and
// the gradient inspection for its buffer. Every such request is stream-ordered and served from memory the pool
// already holds (the reservation covers the plan's peak): it neither synchronises the device nor asks the driver
// for memory, fragmentation aside (backend/detail/pool_model.hpp says what its model does not cover). The host
// backend counts these requests per step (issue_counts::allocations, tests/model/issue_count_test.cc) and models
// this pool's reuse rules; tests/model/memory_bound_test.cc checks there that a lagging compute stream takes no byte
// beyond the plan.
//
// Two optional hooks beyond the Backend concept: timing marks (CUDA events with timing from a pool, and a
// reference recorded on an idle stream of the backend's own at a known host time), with which the trace stamper
// times stream-side events without a host function on the stream (fsdp/observe/stamp.hpp); and profiler ranges
// (NVTX in the domain "fsdp", fsdp/cuda/nvtx.cuh) around each unit's passes, collectives and the optimizer step
// (fsdp/observe/ranges.hpp).
#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/backend/detail/accounted_buffer.hpp"
#include "fsdp/backend/detail/capture_rules.hpp"
#include "fsdp/backend/detail/cuda_capture.cuh"
#include "fsdp/backend/detail/cuda_handles.cuh"
#include "fsdp/backend/detail/device_pool.cuh"
#include "fsdp/backend/detail/timing_marks.cuh"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/error.cuh"
#include "fsdp/cuda/kernels.cuh"
#include "fsdp/cuda/nvtx.cuh"
#include "fsdp/memory/memory.hpp"

namespace fsdp::backend {

namespace cuda_kernels = fsdp::cuda::kernels;

struct cuda_options {
  /// The device this rank uses; -1 keeps the calling thread's current device.
  int device = -1;
  /// Longest synchronize() may wait for a stream before it is reported as a hang.
  std::chrono::milliseconds wait_timeout{300000};
  /// How often synchronize() checks a stream (and calls `poll`).
  std::chrono::microseconds poll_interval{50};
  /// Called on every check while synchronize() waits; may throw (comm::nccl checks ncclCommGetAsyncError).
  std::function<void()> poll;
  /// Called when a wait times out, with what timed out, before comm_error is thrown; may throw an error of its
  /// own that says more (comm::nccl aborts its communicator and names the pending collective).
  std::function<void(const std::string& what)> on_timeout;
  /// The trainer's own compute stream (the one its cuBLAS handle and kernels use), or null: the backend makes one.
  /// The backend issues the unit's compute-side work there (gradient zeroing, casts, the optimizer's kernels) and
  /// never destroys it; it must outlive the backend and belong to its device. Not the legacy or per-thread default
  /// stream (cudaStreamLegacy, cudaStreamPerThread, 0): make one with cudaStreamCreateWithFlags(...,
  /// cudaStreamNonBlocking).
  cudaStream_t compute_stream = nullptr;
};

class cuda {
 public:
  static constexpr std::string_view name = "cuda";

  /// An owning, non-blocking CUDA stream with a name for messages, at a CUDA stream priority; an owning CUDA event;
  /// what gives a buffer's memory back (backend/detail/cuda_handles.cuh).
  using stream = detail::cuda_stream;
  using event = detail::cuda_event;
  using buffer_free = detail::cuda_buffer_free;
  /// Device memory from the backend's pool, accounted to one category from allocation to release. Destroying it
  /// frees it in the order of the stream it was allocated on: the owner makes sure other streams are done with it
  /// (Model synchronizes its streams before its buffers go).
  using buffer = detail::accounted_buffer<buffer_free, cuda>;

  explicit cuda(int rank = 0, cuda_options opt = {})
      : opt_(std::move(opt)),
        rank_(rank),
        device_(select_device(opt_.device)),
        pool_(device_),
        compute_(make_compute(rank, opt_.compute_stream)),
        gather_(stream_name(rank, "all_gather"), most_urgent_priority()),
        reduce_(stream_name(rank, "reduce"), most_urgent_priority()),
        upload_(stream_name(rank, "upload"), most_urgent_priority()),
        download_(stream_name(rank, "download"), most_urgent_priority()),
        host_work_(stream_name(rank, "host_work")),
        timer_(stream_name(rank, "timer")) {
    refuse_flushing_build();
  }
  cuda(const cuda&) = delete;
  cuda& operator=(const cuda&) = delete;
  /// Waits for the streams, each for at most cuda_options::wait_timeout (polling, so a communicator's poll can
  /// see a dead peer). A stream that does not finish is logged and the backend's memory is left to the process:
  /// freeing it under running work would be worse than the leak.
  ~cuda() {
    for (stream* s : {&compute_, &gather_, &reduce_, &upload_, &download_, &host_work_}) {
      try {
        wait_for(
            s->get(), fsdp::detail::cat("stream '", s->name(), "' at backend::cuda teardown"), opt_.wait_timeout,
            opt_.poll_interval,
            [&] {
              if (opt_.poll) opt_.poll();
            },
            [](const std::string&) {});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s; the backend's device memory is left to the process\n", e.what());
        pool_.leave_to_process();
        marks_.leave_to_process();
        return;
      }
    }
    if (scratch_) {
      FSDP_CUDA_LOG(cudaFreeAsync(scratch_, scratch_home_));
      FSDP_CUDA_LOG(cudaStreamSynchronize(scratch_home_));
    }
  }

  int device() const noexcept { return device_; }

  // ---- streams and events -------------------------------------------------------------------------------------
  stream& compute_stream() noexcept { return compute_; }
  stream& gather_stream() noexcept { return gather_; }
  stream& reduce_stream() noexcept { return reduce_; }
  /// The copy streams of offloading (fsdp/policy/offload.hpp): host to device, and device to host.
  stream& upload_stream() noexcept { return upload_; }
  stream& download_stream() noexcept { return download_; }
  /// Offloading's host functions (cudaLaunchHostFunc: host gradient additions, the host optimizer) apart from the
  /// copies, so that a copy, and the device slots its event gives back, never waits behind the CPU.
  stream& host_work_stream() noexcept { return host_work_; }

  void record(event& e, stream& s) {
    FSDP_CUDA_CHECK(cudaEventRecord(e.get(), s.get()));
    if (capture_.active()) capture_.recorded(e.get());
  }
  /// Later work on `s` waits for the last record of `e` made before this call (none: no wait). While a step is
  /// captured, a wait on a record made before the capture is dropped: a replay follows all earlier work.
  void wait(stream& s, const event& e) {
    if (capture_.active() && !capture_.in_capture(e.get())) return;
    FSDP_CUDA_CHECK(cudaStreamWaitEvent(s.get(), e.get(), 0));
  }
  /// Whether the stream of the last record of `e` has passed it (cudaEventQuery; true when never recorded). Never
  /// waits; a device error it reports is thrown (cuda_error).
  bool done(const event& e) const {
    if (capture_.active()) refuse_in_capture("done(event)", detail::capture_rules::event_query);
    const cudaError_t rc = cudaEventQuery(e.get());
    if (rc == cudaErrorNotReady) return false;
    FSDP_CUDA_CHECK(rc);
    return true;
  }
  /// Runs `fn` on a CUDA runtime thread when `s` reaches this point (cudaLaunchHostFunc); fn must not call CUDA.
  /// In a captured step, at every replay (the graph keeps `fn`).
  void host_callback(stream& s, std::function<void()> fn) {
    if (capture_.active()) {
      FSDP_CUDA_CHECK(cudaLaunchHostFunc(s.get(), &run_kept_callback, capture_.keep(std::move(fn))));
      return;
    }
    auto* f = new std::function<void()>(std::move(fn));
    const cudaError_t rc = cudaLaunchHostFunc(s.get(), &run_callback, f);
    if (rc != cudaSuccess) {
      delete f;
      fsdp::detail::throw_cuda_error(rc, "cudaLaunchHostFunc(s, fn)", __FILE__, __LINE__);
    }
  }
  /// Blocks until all work submitted to `s` has run, polling: a stream that does not finish within
  /// cuda_options::wait_timeout is reported (comm_error, or the communicator's own error) instead of hanging.
  void synchronize(stream& s) {
    if (capture_.active())
      refuse_in_capture(fsdp::detail::cat("synchronize(stream '", s.name(), "')"), detail::capture_rules::host_wait);
    wait_for(
        s.get(), fsdp::detail::cat("stream '", s.name(), "'"), opt_.wait_timeout, opt_.poll_interval,
        [&] {
          if (opt_.poll) opt_.poll();
        },
        [&](const std::string& what) {
          stuck_ = true;  // pinned buffers are then left to the process: freeing them would wait on the device
          if (opt_.on_timeout) opt_.on_timeout(what);
        });
  }

  // ---- capture: a CUDA graph (fsdp/step_graph.hpp; backend/detail/cuda_capture.cuh) ------------------------------
  /// A captured step: its instantiated CUDA graph (size(): the graph's nodes) and the host functions' payloads.
  using graph = detail::cuda_graph;
  /// From here to end_capture(), the calls that issue work on this backend's streams are captured into a CUDA graph
  /// (stream capture on the compute stream, every other stream of the backend forked into it; thread-local mode, so
  /// other ranks' threads go on). A wait on an event recorded before the capture is dropped (a replay follows all
  /// earlier work). Refused while capturing, each with a sentence (usage_error), as backend::host refuses them:
  /// allocate, release_after, synchronize, done, squared_norm's scratch growing, a second begin_capture.
  void begin_capture() {
    if (capture_.active()) refuse_in_capture("begin_capture()", detail::capture_rules::second_begin);
    capture_.begin(compute_.get(), side_streams());
  }
  /// The graph captured since begin_capture(), instantiated; the streams issue again. cuda_error where CUDA refused
  /// the capture (a call it does not allow while capturing; nothing of it runs).
  graph end_capture() {
    if (!capture_.active())
      fsdp::detail::fail_usage("backend::cuda on rank ", rank_, ": end_capture() without a begin_capture()");
    return capture_.end(compute_.get(), side_streams(), fsdp::detail::cat("backend::cuda on rank ", rank_));
  }
  /// Ends a capture without a graph (the captured step threw on the host); never throws.
  void abandon_capture() noexcept {
    if (capture_.active()) capture_.abandon(compute_.get());
  }
  /// Launches `g` on the compute stream, after all work issued before on any stream of the backend and before all
  /// work issued after.
  void replay(const graph& g) {
    if (capture_.active()) refuse_in_capture("replay(graph)", detail::capture_rules::replay_inside);
    if (detail::cuda_capture::empty(g))
      fsdp::detail::fail_usage("backend::cuda on rank ", rank_,
                               ": replay() of a graph that end_capture() did not make");
    capture_.replay(g, compute_.get(), side_streams());
  }
  bool capturing() const noexcept { return capture_.active(); }
  /// Replays so far.
  std::uint64_t replays() const noexcept { return capture_.replays(); }

  // ---- timing marks (optional hook trace::TimingMarks, fsdp/observe/stamp.hpp; backend/detail/timing_marks.cuh) --
  /// A CUDA event with timing from the backend's pool (a handle: the backend owns the event until it goes), and a
  /// mark known to have completed at a host time.
  using timing_mark = detail::timing_mark;
  using timing_reference = detail::timing_reference;
  /// Records a mark on the backend's own timing stream, which has no other work, and spins until it completes;
  /// `at` is read once it has, so it is late by at most that round trip and never early. Past wait_timeout (a
  /// device that processes nothing) a comm_error names the stream.
  timing_reference record_reference() {
    return marks_.record_reference(timer_.get(), timer_.name(), opt_.wait_timeout);
  }
  /// Records a mark on `s`: it completes when `s` reaches this point.
  timing_mark record_mark(stream& s) { return marks_.record_mark(s.get(), s.name()); }
  /// Time from the reference to `m` (cudaEventElapsedTime, rounded to ns), or nullopt while `m` has not completed
  /// (cudaEventQuery); never waits. A failed stream throws cuda_error.
  std::optional<std::chrono::nanoseconds> elapsed_since(const timing_reference& ref, const timing_mark& m) {
    return detail::timing_marks::elapsed_since(ref, m);
  }
  /// Gives a mark back to the pool; a mark of no event (default-made) is ignored.
  void release_mark(const timing_mark& m) { marks_.release(m); }
  /// Events the timing pool has made (each lives until the backend goes).
  std::size_t timing_marks_made() const noexcept { return marks_.made(); }

  // ---- profiler ranges (optional hook trace::ProfilerRanges, fsdp/observe/ranges.hpp) ---------------------------
  /// An NVTX start/end range in the domain "fsdp".
  std::uint64_t range_start(const char* name, std::uint32_t argb) { return fsdp::cuda::nvtx::range_start(name, argb); }
  void range_end(std::uint64_t id) { fsdp::cuda::nvtx::range_end(id); }

  /// The polling wait behind synchronize(), for other owners of streams (comm::nccl's barrier): until `s` has
  /// finished, calls poll() between checks; past `timeout`, calls on_timeout(what) and throws comm_error(what),
  /// where what = "<subject> did not finish within N ms". A failed stream throws cuda_error.
  template <class Poll, class OnTimeout>
  static void wait_for(cudaStream_t s, const std::string& subject, std::chrono::milliseconds timeout,
                       std::chrono::microseconds interval, Poll&& poll, OnTimeout&& on_timeout) {
    detail::wait_for_stream(s, subject, timeout, interval, std::forward<Poll>(poll),
                            std::forward<OnTimeout>(on_timeout));
  }

  // ---- memory -------------------------------------------------------------------------------------------------
  /// Stream-ordered allocation from the pool: the buffer is ready on `first_use` at once, on other streams after
  /// they wait for an event recorded on `first_use` later.
  buffer allocate(std::int64_t bytes, mem category, stream& first_use) {
    if (bytes < 0)
      fsdp::detail::fail_usage("backend::cuda::allocate: negative size ", bytes, " bytes for ", name_of(category));
    if (capture_.active())
      refuse_in_capture(fsdp::detail::cat("allocate(", bytes, " bytes of ", name_of(category), ")"),
                        detail::capture_rules::memory_taken);
    void* p = nullptr;
    if (bytes > 0) {
      const cudaError_t rc = cudaMallocFromPoolAsync(&p, static_cast<std::size_t>(bytes), pool_.get(), first_use.get());
      if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        const std::string held = fsdp::detail::cat(" (accounted now: ", memory_.stats().current.total,
                                                   " bytes; pool reserved: ", pool_reserved_bytes(), " bytes)");
        if (rc == cudaErrorMemoryAllocation)  // out of memory: the error a Model adds the unit to
          throw memory_error(fsdp::detail::cat("backend::cuda on device ", device_, ": could not allocate ", bytes,
                                               " bytes of ", name_of(category), ": cudaErrorMemoryAllocation", held));
        throw cuda_error(
            rc, "cudaMallocFromPoolAsync(&p, bytes, pool, stream)", __FILE__, __LINE__,
            fsdp::detail::cat("allocating ", bytes, " bytes of ", name_of(category), " on device ", device_, held));
      }
    }
    return buffer(p, bytes, category, &memory_, buffer_free{first_use.get()});
  }
  /// Pinned host memory for offloaded buffers (fsdp/policy/offload.hpp), accounted to `category` in
  /// host_memory(): cudaHostAlloc, portable and mapped, so that copies are asynchronous and device kernels may read
  /// it where the policy steps the optimizer on the device (with unified addressing: the same pointer on both
  /// sides; host_memory_on_device() says whether every such buffer so far has it).
  buffer allocate_host(std::int64_t bytes, mem category) {
    if (bytes < 0)
      fsdp::detail::fail_usage("backend::cuda::allocate_host: negative size ", bytes, " bytes for ", name_of(category));
    void* p = nullptr;
    if (bytes > 0) {
      // One rank's thread at a time: pinning takes the driver's locks anyway, and the simulated GPU's runtime keeps
      // the table of pinned blocks that cudaHostGetDevicePointer reads without a lock (ranks as threads allocating
      // at once there lost entries from it: an assertion in cudaHostGetDevicePointer).
      static std::mutex pinning;
      const std::lock_guard<std::mutex> one_at_a_time(pinning);
      const cudaError_t rc =
          cudaHostAlloc(&p, static_cast<std::size_t>(bytes), cudaHostAllocPortable | cudaHostAllocMapped);
      if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        throw memory_error(
            fsdp::detail::cat("backend::cuda on device ", device_, ": could not allocate ", bytes,
                              " bytes of pinned host memory for ", name_of(category), ": ", cudaGetErrorName(rc),
                              " (host memory held now: ", host_memory_.stats().current.total, " bytes)"));
      }
      void* on_device = nullptr;
      if (cudaHostGetDevicePointer(&on_device, p, 0) != cudaSuccess) (void)cudaGetLastError();
      if (on_device != p) host_mapped_ = false;
    }
    return buffer(p, bytes, category, &host_memory_, buffer_free{nullptr, true, &stuck_});
  }
  /// Stream-ordered release: the accounting drops now, the memory returns to the pool once `s` reaches this point
  /// (pinned host memory: once `s` has drained, which blocks).
  void release_after(buffer&& b, stream& s) {
    if (!b) return;
    if (capture_.active())
      refuse_in_capture(fsdp::detail::cat("release_after(", b.bytes(), " bytes of ", name_of(b.category()), ")"),
                        detail::capture_rules::memory_given_back);
    if (b.free_.pinned) {
      synchronize(s);  // watched: a stream that does not finish is reported, not waited for
      b.reset();
      return;
    }
    b.stop_accounting();
    if (b.ptr_) FSDP_CUDA_CHECK(cudaFreeAsync(b.ptr_, s.get()));
    b.ptr_ = nullptr;
    b.bytes_ = 0;
    b.free_ = {};
  }
  /// Makes the pool hold at least `bytes` in all (buffers in use included), so that later allocations up to that
  /// total take no memory from the device. Blocks once, outside any step. Free memory is trimmed first and
  /// replaced by one block, so successive reservations (model, then optimizer) do not add up.
  void reserve(std::int64_t bytes) { pool_.reserve(bytes, compute_.get()); }
  /// Bytes of device memory the pool holds (cudaMemPoolAttrReservedMemCurrent) and hands out now.
  std::int64_t pool_reserved_bytes() const { return pool_.reserved_bytes(); }
  std::int64_t pool_used_bytes() const { return pool_.used_bytes(); }
  MemoryTracker& memory() noexcept { return memory_; }
  const MemoryTracker& memory() const noexcept { return memory_; }
  /// The host domain's tracker: what allocate_host() holds.
  MemoryTracker& host_memory() noexcept { return host_memory_; }
  const MemoryTracker& host_memory() const noexcept { return host_memory_; }
  /// Device kernels can read and write the memory of allocate_host() at its host address (unified addressing;
  /// false on a device without it, and on the simulated GPU, which copies to and from it but cannot map it).
  bool host_memory_on_device() const noexcept { return host_mapped_; }

  // ---- copies -------------------------------------------------------------------------------------------------
  void fill_zero(void* dst, std::int64_t bytes, stream& s) {
    if (bytes > 0) FSDP_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(bytes), s.get()));
  }
  void copy(void* dst, const void* src, std::int64_t bytes, stream& s) {
    if (bytes > 0 && dst != src)
      FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDefault, s.get()));
  }
  /// Host memory in / out (cudaMemcpyDefault: either side may be pinned host memory of allocate_host). Pageable
  /// host memory: the call returns once the source is consumed (upload) and the destination is valid only after
  /// synchronize(s) (download); pinned: asynchronous both ways.
  void upload(void* dst, const void* host_src, std::int64_t bytes, stream& s) {
    if (bytes > 0)
      FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, static_cast<std::size_t>(bytes), cudaMemcpyDefault, s.get()));
  }
  void download(void* host_dst, const void* src, std::int64_t bytes, stream& s) {
    if (bytes > 0)
      FSDP_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDefault, s.get()));
  }

  // ---- kernels (fsdp/cuda/kernels.cuh) ------------------------------------------------------------------------
  void convert(void* dst, dtype dst_type, const void* src, dtype src_type, std::int64_t n, float scale, stream& s) {
    cuda_kernels::convert(dst, dst_type, src, src_type, n, scale, s.get());
  }
  void accumulate(float* dst, const void* src, dtype src_type, std::int64_t n, float scale, stream& s) {
    cuda_kernels::accumulate(dst, src, src_type, n, scale, s.get());
  }
  /// *out (device memory) = sum of x[i]^2, in fp32 with CUB. CUB's temporary storage (a few KB at most: for the
  /// largest n seen) is the backend's own: it comes from the device's default pool, not from the backend's pool,
  /// so that pool holds exactly the planned peak; it lives on the one stream norms run on and is freed there.
  void squared_norm(const float* x, std::int64_t n, float* out, stream& s) {
    if (scratch_ && scratch_home_ != s.get())
      fsdp::detail::fail_usage("squared_norm: the CUDA backend's scratch space is used on stream '", s.name(),
                               "' but was made for another stream; use one stream for norms");
    const std::size_t need = cuda_kernels::squared_norm_temp_bytes(n);
    if (need > scratch_bytes_) {  // grows to the largest n, then reused
      if (capture_.active())
        refuse_in_capture(fsdp::detail::cat("squared_norm(", n, " elements)"),
                          "its scratch space would grow inside the captured step (memory outside the plan); run an "
                          "eager step first, which grows it to the step's largest norm");
      if (scratch_) FSDP_CUDA_CHECK(cudaFreeAsync(scratch_, s.get()));
      scratch_ = nullptr;
      FSDP_CUDA_CHECK(cudaMallocAsync(&scratch_, need, s.get()));
      scratch_bytes_ = need;
      scratch_home_ = s.get();
    }
    cuda_kernels::squared_norm(x, n, out, scratch_, scratch_bytes_, s.get());
  }
  /// f(i) for every i in [0, n), in a kernel on `s` (any order within it).
  template <ElementFunction F>
  void for_each(std::int64_t n, const F& f, stream& s) {
    cuda_kernels::for_each(n, f, s.get());
  }

 private:
  static void CUDART_CB run_kept_callback(void* data) noexcept {  // a captured one: the graph keeps the payload
    try {
      (*static_cast<std::function<void()>*>(data))();
    } catch (...) {  // nothing can be thrown into the CUDA runtime
    }
  }
  static void CUDART_CB run_callback(void* data) noexcept {
    auto* f = static_cast<std::function<void()>*>(data);
    try {
      (*f)();
    } catch (...) {  // nothing can be thrown into the CUDA runtime
    }
    delete f;
  }

  /// The kernels must keep subnormals, as the host backend does: nvcc --use_fast_math (or -ftz=true) flushes them
  /// in __fadd_rn and breaks bit equality with the host (and small gradients vanish). Such a build stops here.
  void refuse_flushing_build() {
    void* scratch = nullptr;
    FSDP_CUDA_CHECK(cudaMalloc(&scratch, 2 * sizeof(float)));
    bool keeps = false;
    try {
      keeps = cuda_kernels::kernels_keep_subnormals(static_cast<float*>(scratch), compute_.get());
    } catch (...) {
      FSDP_CUDA_LOG(cudaFree(scratch));
      throw;
    }
    FSDP_CUDA_CHECK(cudaFree(scratch));
    if (!keeps)
      fsdp::detail::fail_usage(
          "backend::cuda: this program's CUDA kernels flush subnormal floats to zero (built with nvcc "
          "--use_fast_math or -ftz=true), so they would not match the host backend bit for bit and small gradients "
          "would vanish; build the translation units that include fsdp without --use_fast_math (keep -ftz=false, "
          "-prec-div=true and -prec-sqrt=true, nvcc's defaults)");
  }

 public:
  /// The device's most urgent stream priority: the gather, reduce and copy streams run at it (and comm::nccl's
  /// collective stream), so that their collectives, casts and copies take SMs ahead of the compute kernels queued
  /// at the default priority (the trainer's compute stream keeps the default).
  static int most_urgent_priority() {
    int least = 0, greatest = 0;
    FSDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    return greatest;
  }

 private:

  /// The compute stream: the trainer's (cuda_options::compute_stream), or one of the backend's own.
  static stream make_compute(int rank, cudaStream_t trainers) {
    std::string name = stream_name(rank, "compute");
    if (!trainers) return stream(std::move(name));
    if (trainers == cudaStreamLegacy || trainers == cudaStreamPerThread)
      fsdp::detail::fail_usage(
          "backend::cuda on rank ", rank, ": cuda_options::compute_stream is the ",
          trainers == cudaStreamLegacy ? "legacy" : "per-thread",
          " default stream, which synchronizes with the device's other work; pass a stream made "
          "with cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) (null: the backend makes one)");
    return stream(std::move(name), trainers);
  }

  std::array<cudaStream_t, 5> side_streams() const noexcept {  // every stream of a step but compute
    return {gather_.get(), reduce_.get(), upload_.get(), download_.get(), host_work_.get()};
  }
  [[noreturn]] void refuse_in_capture(std::string_view call, std::string_view why) const {
    detail::capture_rules::refuse("cuda", rank_, call, why);
  }

  static int select_device(int device) {
    if (device >= 0) FSDP_CUDA_CHECK(cudaSetDevice(device));
    int current = 0;
    FSDP_CUDA_CHECK(cudaGetDevice(&current));
    return current;
  }

  cuda_options opt_;
  int rank_;
  int device_;
  detail::device_pool pool_;  // backend/detail/device_pool.cuh
  MemoryTracker memory_;
  MemoryTracker host_memory_;
  bool host_mapped_ = true;  // every allocate_host() buffer so far is at the same address on the device
  bool stuck_ = false;       // a synchronize() timed out: a stream may never finish
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  cudaStream_t scratch_home_ = nullptr;
  detail::timing_marks marks_;  // backend/detail/timing_marks.cuh
  stream compute_;
  stream gather_;
  stream reduce_;
  stream upload_;
  stream download_;
  stream host_work_;
  stream timer_;  // nothing but timing references: idle whenever one is recorded
  detail::cuda_capture capture_;
};

static_assert(Backend<cuda>, "backend::cuda must model fsdp::Backend (backend/concept.hpp)");
static_assert(OffloadBackend<cuda>, "backend::cuda must model fsdp::OffloadBackend (backend/concept.hpp)");
static_assert(ReservingBackend<cuda> && PollingBackend<cuda> && HostMappingBackend<cuda>,
              "backend::cuda has every optional hook of backend/concept.hpp");

}  // namespace fsdp::backend
