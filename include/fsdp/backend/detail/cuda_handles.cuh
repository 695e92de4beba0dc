#pragma once
// The CUDA backend's handles (backend::cuda names them cuda::stream, cuda::event and cuda::buffer_free): an owning
// stream with a name and a priority, an owning event, what gives a buffer's memory back, and the polling wait on a
// stream that backend::cuda's synchronize() and comm::nccl's barrier share.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/cuda/error.cuh"

namespace fsdp::backend::detail {

/// An owning, non-blocking CUDA stream with a name for messages, created at a CUDA stream priority (0, the
/// default, is the least urgent; cudaDeviceGetStreamPriorityRange's "greatest" is the most urgent, a negative
/// number on current GPUs).
class cuda_stream {
 public:
  explicit cuda_stream(std::string name, int priority = 0) : name_(std::move(name)), priority_(priority) {
    FSDP_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
  }
  /// A stream of the caller's, used and never destroyed (its priority is reported as 0: not queried).
  cuda_stream(std::string name, cudaStream_t borrowed) : s_(borrowed), name_(std::move(name)), owned_(false) {}
  /// The priority it was created at (what cudaStreamGetPriority reports on a device with priorities).
  int priority() const noexcept { return priority_; }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() {
    if (s_ && owned_) FSDP_CUDA_LOG(cudaStreamDestroy(s_));
  }
  /// Whether the backend made it (false: the trainer's, cuda_options::compute_stream).
  bool owned() const noexcept { return owned_; }
  cudaStream_t get() const noexcept { return s_; }
  const std::string& name() const noexcept { return name_; }

 private:
  cudaStream_t s_ = nullptr;
  std::string name_;
  int priority_ = 0;
  bool owned_ = true;
};

/// An owning CUDA event (timing disabled), recorded on streams by record().
class cuda_event {
 public:
  cuda_event() { FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  cuda_event(cuda_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  cuda_event& operator=(cuda_event&& o) noexcept {
    if (this != &o) {
      destroy();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() { destroy(); }
  cudaEvent_t get() const noexcept { return e_; }

 private:
  void destroy() noexcept {
    if (e_) FSDP_CUDA_LOG(cudaEventDestroy(e_));
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

/// Gives a buffer's memory back: to the pool in the order of the stream it was allocated on, or, for pinned
/// host memory, with cudaFreeHost.
struct cuda_buffer_free {
  cudaStream_t home = nullptr;  // the stream it was allocated on
  bool pinned = false;          // pinned host memory (allocate_host), not the pool's
  const bool* stuck = nullptr;  // pinned: the backend's "a stream did not finish" (the backend outlives it)
  void operator()(void* p, std::int64_t) const noexcept {
    if (!p) return;
    // cudaFreeHost synchronises the device: after a stream failed to finish it could wait for ever, so the
    // memory is left to the process then (as ~cuda leaves the device's)
    if (pinned) {
      if (!(stuck && *stuck)) FSDP_CUDA_LOG(cudaFreeHost(p));
    } else {
      FSDP_CUDA_LOG(cudaFreeAsync(p, home));
    }
  }
};

/// Until `s` has finished, calls poll() between checks (every `interval`); past `timeout`, calls on_timeout(what) and
/// throws comm_error(what), where what = "<subject> did not finish within N ms". A failed stream throws cuda_error.
template <class Poll, class OnTimeout>
void wait_for_stream(cudaStream_t s, const std::string& subject, std::chrono::milliseconds timeout,
                     std::chrono::microseconds interval, Poll&& poll, OnTimeout&& on_timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const cudaError_t rc = cudaStreamQuery(s);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) fsdp::detail::throw_cuda_error(rc, "cudaStreamQuery(s)", __FILE__, __LINE__);
    poll();
    if (std::chrono::steady_clock::now() > deadline) {
      const std::string what = fsdp::detail::cat(subject, " did not finish within ", timeout.count(), " ms");
      on_timeout(what);
      throw comm_error(what);
    }
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace fsdp::backend::detail
