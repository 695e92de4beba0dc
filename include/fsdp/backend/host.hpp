#pragma once
// The host backend: host memory, streams as in-order work queues on worker threads, events as completion
// markers. It lets the shared scheduler's ordering be exercised (and broken, and caught) on machines without a
// GPU, ThreadSanitizer included. The compute stream is inline: work submitted to it runs on the calling thread,
// so the user's layer code runs where the training loop runs, exactly like kernels launched on a CUDA stream.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/backend/detail/accounted_buffer.hpp"
#include "fsdp/backend/detail/capture_rules.hpp"
#include "fsdp/backend/detail/pinned_blocks.hpp"
#include "fsdp/backend/detail/pool_model.hpp"
#include "fsdp/backend/detail/work_queue.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/kernels/elementwise.hpp"
#include "fsdp/kernels/host_loops.hpp"
#include "fsdp/memory/memory.hpp"

namespace fsdp::backend {

struct host_options {
  /// Longest any wait on an event may block before it is reported as a hang.
  std::chrono::milliseconds wait_timeout{300000};
  /// false: the all-gather and reduce streams run their work inline on the issuing thread too. Nothing then
  /// overlaps, and every event happens in program order: a deterministic mode for tests of event order.
  bool threaded_streams = true;
  /// true: the compute stream is a worker thread too, like a GPU's: work submitted to it runs asynchronously
  /// and the host runs ahead. Only for trainers that submit all their work to compute_stream() (timing models
  /// such as bench/overlap_bench.cc); code that reads param() or writes grad() directly on the host needs the
  /// default inline compute stream.
  bool threaded_compute = false;
  /// How long a stream's idle worker keeps checking for new work, and a thread waiting on an event or in
  /// synchronize() keeps checking, before sleeping (yielding the CPU between checks): a hand-off within that time
  /// costs no thread wake-up. 0: sleep at once (for ranks that share cores: docs/benchmarks.md).
  std::chrono::microseconds spin{50};
  /// Delay injection: how long each library kernel ("accumulate", "for_each": an optimizer's update) sleeps on its
  /// stream before it runs. Results must not change: tests use it to prove that every wait is in place.
  std::function<std::chrono::microseconds(std::string_view kernel)> kernel_delay;
  /// Delay injection on the offload streams (upload: host to device, download: device to host, host_work: host
  /// functions; see fsdp/policy/offload.hpp): how long each copy (`bytes` > 0) and each host function (`bytes` 0)
  /// issued on `stream` ("upload", "download" or "host_work") sleeps before it runs. Tests use it to prove every
  /// wait is in place; the offload benchmark uses it as a modelled link (bytes / bandwidth + latency).
  std::function<std::chrono::microseconds(std::string_view stream, std::int64_t bytes)> copy_delay;
};

/// What was issued on a stream, call by call, as the CUDA backend makes one runtime call for each: a kernel launch
/// (convert, accumulate, for_each; squared_norm, which is CUB's two), a memory operation (cudaMemsetAsync or
/// cudaMemcpyAsync: fill_zero, copy, upload, download), a host function (cudaLaunchHostFunc), an event record
/// (cudaEventRecord), a stream wait (cudaStreamWaitEvent) or a host synchronize; and device memory taken and
/// given back in stream order (allocate: cudaMallocFromPoolAsync on the stream of first use; release_after:
/// cudaFreeAsync), which a step after the first issues only for no-sync accumulators. Calls that issue nothing
/// (empty ranges) are not counted, on either backend.
struct issue_counts {
  std::uint64_t kernels = 0;
  std::uint64_t memory_ops = 0;
  std::uint64_t host_functions = 0;
  std::uint64_t records = 0;
  std::uint64_t waits = 0;
  std::uint64_t synchronizes = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  friend bool operator==(const issue_counts&, const issue_counts&) = default;
  /// a + sign * b, field by field (sign 1 or -1: counts only grow, so a difference of two readings is >= 0).
  static issue_counts combine(issue_counts a, const issue_counts& b, int sign) {
    for (auto f :
         {&issue_counts::kernels, &issue_counts::memory_ops, &issue_counts::host_functions, &issue_counts::records,
          &issue_counts::waits, &issue_counts::synchronizes, &issue_counts::allocations, &issue_counts::frees})
      a.*f = sign > 0 ? a.*f + b.*f : a.*f - b.*f;
    return a;
  }
  friend issue_counts operator+(const issue_counts& a, const issue_counts& b) { return combine(a, b, 1); }
  friend issue_counts operator-(const issue_counts& a, const issue_counts& b) { return combine(a, b, -1); }
};

class host {
 public:
  using stream = detail::work_queue;
  static constexpr std::string_view name = "host";
  /// Its buffers are host memory: code that would stage a copy on the host (checkpoint saves) uses them directly,
  /// once the streams that write them are synchronized.
  static constexpr bool host_addressable = true;

  /// Gives a buffer's memory back: operator delete, the pool model's free outside stream order, and the end of a
  /// pinned block.
  struct buffer_free {
    static constexpr std::size_t alignment = 256;
    detail::pool_model* pool = nullptr;       // the pool model it was counted in (device memory), or none
    detail::pinned_blocks* pinned = nullptr;  // allocate_host's blocks, where it is one
    void operator()(void* p, std::int64_t bytes) const noexcept;
  };
  /// An owning allocation, accounted to one memory category from allocation to release.
  using buffer = detail::accounted_buffer<buffer_free, host>;

  /// A completion marker recorded on a stream.
  class event {
   public:
    event();

   private:
    friend class host;
    std::shared_ptr<detail::event_state> s_;
    detail::pool_model::clock frees_{};  // the pool model's frees ordered before the last record
  };

  explicit host(int rank = 0, host_options opt = {});
  host(const host&) = delete;
  host& operator=(const host&) = delete;

  // ---- streams and events -------------------------------------------------------------------------------------
  stream& compute_stream() noexcept { return compute_; }
  stream& gather_stream() noexcept { return gather_; }
  stream& reduce_stream() noexcept { return reduce_; }
  /// The copy streams of offloading (fsdp/policy/offload.hpp): host to device, and device to host.
  stream& upload_stream() noexcept { return upload_; }
  stream& download_stream() noexcept { return download_; }
  /// Offloading's host functions (host gradient additions, the host optimizer), apart from the copies.
  stream& host_work_stream() noexcept { return host_work_; }

  void record(event& e, stream& s);
  /// Later work on `s` waits for the last record of `e` made before this call.
  void wait(stream& s, const event& e);
  /// Whether the stream of the last record of `e` has passed it (true when it was never recorded). Never waits;
  /// rethrows the error of a stream that failed before it got there.
  bool done(const event& e) const;
  /// Whether the stream of the last record of `e` failed before it got there (false while it has not got there).
  /// Never waits or throws.
  bool failed_before(const event& e) const noexcept;
  /// Runs `fn` on the host when `s` reaches this point (cudaLaunchHostFunc on the CUDA backend). Skipped when
  /// the stream has failed.
  void host_callback(stream& s, std::function<void()> fn);
  /// Blocks the calling thread until all work submitted to `s` has run; rethrows its error.
  void synchronize(stream& s);
  /// What has been issued on `s` so far (see issue_counts), or on every stream.
  issue_counts issued(const stream& s) const { return issued_[static_cast<std::size_t>(index_of(s))].get(); }
  issue_counts issued() const;

  // ---- capture: a CUDA graph's counterpart ----------------------------------------------------------------------
  /// What begin_capture() to end_capture() recorded: the calls that issue work on this backend's streams, in their
  /// order.
  class graph {
   public:
    /// Calls recorded: kernels, copies, event records and waits, host functions, and the collectives a
    /// communicator issued on the streams.
    std::size_t size() const noexcept { return calls_.size(); }

   private:
    friend class host;
    std::vector<std::function<void()>> calls_;
  };
  /// From here to end_capture(), every call that would issue work on one of this backend's streams (kernels, copies,
  /// event records and waits, host functions, a communicator's collectives) is recorded instead of issued, as a
  /// stream capturing a CUDA graph records it; replay() issues the recorded calls again, in their order, with the
  /// same arguments: the same addresses, element functions and sizes. A wait on an event whose last record was made
  /// before the capture is dropped: a replay starts after everything issued before it (a CUDA graph's launch is
  /// ordered after all earlier work of its stream, and the capture helper synchronizes every stream before the
  /// capture; here replay() waits for every stream first). Refused while capturing, each with a sentence
  /// (usage_error): taking or giving back memory (allocate, release_after), waiting on the host (synchronize, a copy
  /// from or to pageable memory), asking an event (done), and a second begin_capture.
  void begin_capture();
  /// The calls recorded since begin_capture(); the streams issue again.
  graph end_capture();
  /// Ends a capture without a graph (the captured step threw on the host); never throws.
  void abandon_capture() noexcept;
  /// Issues `g`'s calls again, in order (outside a capture), once every stream has run what was issued before.
  void replay(const graph& g);
  bool capturing() const noexcept { return capture_ != nullptr; }
  /// Replays so far: work the host issued once and the streams ran again (an optimizer learns its update count from
  /// the device after them).
  std::uint64_t replays() const noexcept { return replays_; }

  // ---- memory -------------------------------------------------------------------------------------------------
  /// `first_use` is the stream that uses the buffer first: host memory is ready at once, but the pool model
  /// (pool()) counts the allocation as a stream-ordered one on that stream, as the CUDA backend makes it.
  buffer allocate(std::int64_t bytes, mem category, stream& first_use);
  /// Host memory for offloaded buffers (fsdp/policy/offload.hpp), accounted to `category` in host_memory(), not
  /// memory(); pinned on the CUDA backend. Ready at once; released like any buffer.
  buffer allocate_host(std::int64_t bytes, mem category);
  /// Stream-ordered release: the accounting drops now, the memory is freed once `s` reaches this point.
  void release_after(buffer&& b, stream& s);
  /// What a stream-ordered pool (the CUDA backend's) would hold for the same allocations, frees and event waits:
  /// `reserved` is the memory it would have taken from the device (see backend/detail/pool_model.hpp).
  detail::pool_model::figures pool() const { return pool_.stats(); }
  MemoryTracker& memory() noexcept { return memory_; }
  const MemoryTracker& memory() const noexcept { return memory_; }
  /// The host domain's tracker: what allocate_host() holds.
  MemoryTracker& host_memory() noexcept { return host_memory_; }
  const MemoryTracker& host_memory() const noexcept { return host_memory_; }

  // ---- copies -------------------------------------------------------------------------------------------------
 private:
  static void* take_bytes(std::int64_t bytes);
  buffer take(std::int64_t bytes, mem category);

 public:
  void fill_zero(void* dst, std::int64_t bytes, stream& s);
  void copy(void* dst, const void* src, std::int64_t bytes, stream& s);
  /// Host memory in, backend memory out (the same thing here; a transfer on the CUDA backend). As on the CUDA
  /// backend, a copy from or to pageable memory (anything but allocate_host()'s blocks) returns only once `s` has
  /// run it: see pageable_wait.
  void upload(void* dst, const void* host_src, std::int64_t bytes, stream& s);
  void download(void* host_dst, const void* src, std::int64_t bytes, stream& s);

  // ---- kernels ------------------------------------------------------------------------------------------------
  // The per-element logic is fsdp/kernels/elementwise.hpp and the element functions for_each runs, shared with
  // the CUDA backend's kernels: both backends give the same bits.

  /// dst[i] = dst_type(float(src[i]) * scale): copy-in with cast, reduce-scatter input preparation.
  void convert(void* dst, dtype dst_type, const void* src, dtype src_type, std::int64_t n, float scale, stream& s);
  /// dst[i] += float(src[i]) * scale: a reduction's result accumulated into an fp32 gradient shard (scale 1: a
  /// plain sum; else the post-division of grad_division::pre_post).
  void accumulate(float* dst, const void* src, dtype src_type, std::int64_t n, float scale, stream& s);
  /// *out = sum of x[i]^2 (accumulated in double, rounded to float once).
  void squared_norm(const float* x, std::int64_t n, float* out, stream& s);
  /// f(i) for every i in [0, n), in order, on `s` (an optimizer's update over a shard piece).
  template <ElementFunction F>
  void for_each(std::int64_t n, const F& f, stream& s) {
    if (n <= 0) return;
    if (captured(s, [this, n, f, &s] { for_each(n, f, s); })) return;
    count(s, &atomic_counts::kernels);
    s.submit([=, d = delay("for_each")] {
      std::this_thread::sleep_for(d);
      kernels::host_loops::for_each(n, f);
    });
  }

 private:
  std::chrono::microseconds delay(std::string_view kernel) const {
    return opt_.kernel_delay ? opt_.kernel_delay(kernel) : std::chrono::microseconds{0};
  }

  /// cudaMemcpyAsync from or to pageable host memory returns only once its stream has reached the copy (and, to
  /// the host, finished it): the host waits there for all earlier work of the stream, a collective included, with
  /// no watchdog. This backend waits the same way; where the stream has not reached the copy within wait_timeout,
  /// it says so instead of waiting on, so that a test can show the unwatched wait that would hang on a GPU. The
  /// stream then fails with the same error: the copy still queued is skipped, never run on memory its caller has
  /// given back.
  void pageable_wait(stream& s, const char* what);

  /// The copy-stream delay of work issued on `s` (0 on the other streams).
  std::chrono::microseconds copy_delay(const stream& s, std::int64_t bytes) const;

  /// issue_counts as relaxed atomics: only the issuing thread counts, but a trainer may read them from another.
  struct atomic_counts {
    std::atomic<std::uint64_t> kernels{0}, memory_ops{0}, host_functions{0}, records{0}, waits{0}, synchronizes{0},
        allocations{0}, frees{0};
    issue_counts get() const {
      constexpr auto r = std::memory_order_relaxed;
      return {kernels.load(r),     memory_ops.load(r),   host_functions.load(r), records.load(r),
              waits.load(r),       synchronizes.load(r), allocations.load(r),    frees.load(r)};
    }
  };
  void count(const stream& s, std::atomic<std::uint64_t> atomic_counts::*field) {
    (issued_[static_cast<std::size_t>(index_of(s))].*field).fetch_add(1, std::memory_order_relaxed);
  }

  int index_of(const stream& s) const;

  /// Records `reissue` (which makes the same call again) when `s` is being captured, and says so.
  template <class F>
  bool captured(stream& s, F&& reissue) {
    std::vector<std::function<void()>>* calls = s.capture();
    if (calls == nullptr) return false;
    calls->emplace_back(std::forward<F>(reissue));
    return true;
  }
  /// usage_error: `call` is not allowed while a step is captured, because `why`.
  [[noreturn]] void refuse_in_capture(std::string_view call, std::string_view why) const;
  [[noreturn]] void refuse_pageable(const char* what) const;

  std::unique_ptr<std::vector<std::function<void()>>> capture_;  // while capturing: the calls recorded
  detail::capture_rules::captured_events<const detail::event_state*> recorded_in_capture_;
  std::uint64_t replays_ = 0;

  host_options opt_;
  int rank_;
  MemoryTracker memory_;
  MemoryTracker host_memory_;
  detail::pool_model pool_;
  detail::pinned_blocks pinned_;
  atomic_counts issued_[6];
  // Streams last: they are destroyed first, so deferred frees still find the tracker alive.
  stream compute_;
  stream gather_;
  stream reduce_;
  stream upload_;
  stream download_;
  stream host_work_;
};

}  // namespace fsdp::backend

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/backend/host.ipp"
#endif
