#pragma once
// backend::cuda's timing marks (the optional hook trace::TimingMarks, fsdp/observe/stamp.hpp): CUDA events with
// timing, made on demand and reused, each living until the backend goes; a reference recorded on an idle stream at
// a known host time, and the time from it to a mark. With them the trace stamper times stream-side events without a
// host function on the stream.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/cuda/error.cuh"

namespace fsdp::backend::detail {

/// A CUDA event with timing, from a timing_marks pool, recorded by record_mark() or record_reference(). A handle:
/// the pool owns the event (until the pool goes); release() gives it back for reuse.
class timing_mark {
 public:
  timing_mark() = default;
  cudaEvent_t get() const noexcept { return e_; }

 private:
  friend class timing_marks;
  explicit timing_mark(cudaEvent_t e) noexcept : e_(e) {}
  cudaEvent_t e_ = nullptr;
};

/// A mark known to have completed at host time `at` (steady clock).
struct timing_reference {
  timing_mark mark;
  std::chrono::steady_clock::time_point at;
};

class timing_marks {
 public:
  timing_marks() = default;
  timing_marks(const timing_marks&) = delete;
  timing_marks& operator=(const timing_marks&) = delete;
  ~timing_marks() {
    for (cudaEvent_t e : made_) FSDP_CUDA_LOG(cudaEventDestroy(e));
  }

  /// Records a mark on `timer`, a stream with no other work, and spins until it completes; `at` is read once it
  /// has, so it is late by at most that round trip and never early. Past `timeout` (a device that processes
  /// nothing) a comm_error names the stream.
  timing_reference record_reference(cudaStream_t timer, const std::string& timer_name,
                                    std::chrono::milliseconds timeout) {
    const timing_mark m = take();
    const cudaError_t rc = cudaEventRecord(m.get(), timer);
    if (rc != cudaSuccess) {
      release(m);
      fsdp::detail::throw_cuda_error(rc, "cudaEventRecord(reference, timer)", __FILE__, __LINE__);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const cudaError_t q = cudaEventQuery(m.get());
      const auto now = std::chrono::steady_clock::now();
      if (q == cudaSuccess) return {m, now};
      if (q != cudaErrorNotReady) {
        release(m);
        fsdp::detail::throw_cuda_error(q, "cudaEventQuery(reference)", __FILE__, __LINE__);
      }
      if (now > deadline) {  // the event stays with the pool: the device may still record it
        throw comm_error(fsdp::detail::cat("stream '", timer_name,
                                           "': the trace's timing reference did not complete within ", timeout.count(),
                                           " ms"));
      }
    }
  }

  /// Records a mark on `s` (named `name` in messages): it completes when `s` reaches this point.
  timing_mark record_mark(cudaStream_t s, const std::string& name) {
    const timing_mark m = take();
    const cudaError_t rc = cudaEventRecord(m.get(), s);
    if (rc != cudaSuccess) {
      release(m);
      (void)cudaGetLastError();
      throw cuda_error(rc, "cudaEventRecord(mark, s)", __FILE__, __LINE__,
                       fsdp::detail::cat("recording a trace mark on stream '", name, "'"));
    }
    return m;
  }

  /// Time from the reference to `m` (cudaEventElapsedTime, rounded to ns), or nullopt while `m` has not completed
  /// (cudaEventQuery); never waits. A failed stream throws cuda_error.
  static std::optional<std::chrono::nanoseconds> elapsed_since(const timing_reference& ref, const timing_mark& m) {
    const cudaError_t q = cudaEventQuery(m.get());
    if (q == cudaErrorNotReady) return std::nullopt;
    if (q != cudaSuccess) fsdp::detail::throw_cuda_error(q, "cudaEventQuery(mark)", __FILE__, __LINE__);
    float ms = 0.0f;
    FSDP_CUDA_CHECK(cudaEventElapsedTime(&ms, ref.mark.get(), m.get()));
    return std::chrono::nanoseconds(std::llround(double(ms) * 1e6));
  }

  /// Gives a mark back for reuse; a mark of no event (default-made) is ignored.
  void release(const timing_mark& m) {
    if (m.get()) free_.push_back(m.get());
  }

  /// Events made (each lives until the pool goes).
  std::size_t made() const noexcept { return made_.size(); }

  /// Leaves the events to the process (backend::cuda's teardown after a stream that did not finish: the device may
  /// still record them).
  void leave_to_process() noexcept {
    made_.clear();
    free_.clear();
  }

 private:
  timing_mark take() {
    if (!free_.empty()) {
      const cudaEvent_t e = free_.back();
      free_.pop_back();
      return timing_mark(e);
    }
    cudaEvent_t e = nullptr;
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));  // timing enabled
    try {
      made_.push_back(e);
    } catch (...) {
      FSDP_CUDA_LOG(cudaEventDestroy(e));
      throw;
    }
    return timing_mark(e);
  }

  std::vector<cudaEvent_t> made_;  // every timing event made (destroyed with the pool)
  std::vector<cudaEvent_t> free_;  // those given back
};

}  // namespace fsdp::backend::detail
