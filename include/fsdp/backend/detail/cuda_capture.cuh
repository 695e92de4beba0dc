#pragma once
// backend::cuda's capture of a step into a CUDA graph (fsdp/step_graph.hpp): stream capture on the compute stream
// with every other stream of the backend forked into it and joined back, the graph instantiated once, and each
// replay a launch ordered after all earlier work of the backend's streams and before all later work.
//
//   begin:  cudaStreamBeginCapture(compute, thread-local); an event recorded on compute, every other stream waits
//           on it (a stream that waits on an event recorded in a capture joins it);
//   issue:  the backend's calls as always; an event recorded in the capture is noted, and a wait on an event whose
//           last record came before the capture is dropped (CUDA refuses such a dependency across the capture's
//           boundary, cudaErrorStreamCaptureIsolation; a replay follows all earlier work anyway); a host function's
//           payload belongs to the graph, which calls it at every launch;
//   end:    every other stream joined back to compute (an event recorded on it, compute waits), cudaStreamEndCapture,
//           cudaGraphInstantiate; the events recorded in the capture are recorded again on compute, so that their
//           last record is a real one (CUDA refuses queries and waits on an event last recorded in a capture,
//           cudaErrorCapturedEvent), which later waits find passed once the work before the capture has run;
//   replay: compute waits for every other stream, the graph is launched on compute, every other stream waits for
//           compute: a replay follows everything issued before it and precedes everything issued after it, on every
//           stream of the backend, as backend::host's replay does.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/backend/detail/capture_rules.hpp"
#include "fsdp/backend/detail/cuda_handles.cuh"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/error.cuh"

namespace fsdp::backend::detail {

/// A captured step: the instantiated CUDA graph and the host functions' payloads it calls at each launch. Copies
/// share them; the last one destroys the graph (after the streams are done with it: Model synchronizes first).
class cuda_graph {
 public:
  /// The graph's nodes: kernels, copies, memsets, host functions, event records and waits the capture turned into
  /// dependencies are not nodes.
  std::size_t size() const noexcept { return state_ ? state_->nodes : 0; }

 private:
  friend class cuda_capture;
  struct state {
    cudaGraphExec_t exec = nullptr;
    std::size_t nodes = 0;
    std::vector<std::unique_ptr<std::function<void()>>> payloads;
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (exec) FSDP_CUDA_LOG(cudaGraphExecDestroy(exec));
    }
  };
  std::shared_ptr<state> state_;
};

/// The capture's state between begin() and end(), and the replays' count (see the top of this header).
class cuda_capture {
 public:
  using streams = std::span<const cudaStream_t>;

  bool active() const noexcept { return open_ != nullptr; }
  std::uint64_t replays() const noexcept { return replays_; }

  void begin(cudaStream_t origin, streams others) {
    FSDP_CUDA_CHECK(cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal));
    open_ = std::make_shared<cuda_graph::state>();
    recorded_.clear();
    try {
      FSDP_CUDA_CHECK(cudaEventRecord(edge_.get(), origin));
      for (cudaStream_t s : others) FSDP_CUDA_CHECK(cudaStreamWaitEvent(s, edge_.get(), 0));
    } catch (...) {
      abandon(origin);
      throw;
    }
  }

  /// Notes an event recorded in the capture.
  void recorded(cudaEvent_t e) { recorded_.recorded(e); }
  /// Whether a wait on `e` belongs in the capture (its last record was made in it).
  bool in_capture(cudaEvent_t e) const { return recorded_.in_capture(e); }
  /// Keeps a host function's payload for as long as the graph lives; the pointer is what the host function gets.
  std::function<void()>* keep(std::function<void()> fn) {
    open_->payloads.push_back(std::make_unique<std::function<void()>>(std::move(fn)));
    return open_->payloads.back().get();
  }

  /// Joins the other streams back and instantiates the graph. cuda_error (its hint naming `who`) where CUDA refused
  /// the capture: a call it does not allow while capturing, or a stream forked into it and not joined back.
  cuda_graph end(cudaStream_t origin, streams others, const std::string& who) {
    cudaError_t joined = cudaSuccess;
    for (cudaStream_t s : others) {
      if (joined == cudaSuccess) joined = cudaEventRecord(edge_.get(), s);
      if (joined == cudaSuccess) joined = cudaStreamWaitEvent(origin, edge_.get(), 0);
    }
    cudaGraph_t g = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(origin, &g);
    std::shared_ptr<cuda_graph::state> st = std::move(open_);
    rerecord(origin);
    const cudaError_t rc = ended != cudaSuccess ? ended : joined;
    if (rc != cudaSuccess) {
      if (g) FSDP_CUDA_LOG(cudaGraphDestroy(g));
      (void)cudaGetLastError();
      throw cuda_error(
          rc, "cudaStreamEndCapture(compute stream, &graph)", __FILE__, __LINE__,
          fsdp::detail::cat(who,
                            ": the step's capture failed: CUDA refused a call inside it (a stream synchronized or "
                            "queried, memory taken or given back on the capturing thread, a wait on work outside "
                            "the capture) or a stream that joined it was not joined back; nothing of it runs"));
    }
    cuda_graph out;
    out.state_ = std::move(st);
    try {
      FSDP_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &out.state_->nodes));
      FSDP_CUDA_CHECK(cudaGraphInstantiate(&out.state_->exec, g, 0));
    } catch (...) {
      FSDP_CUDA_LOG(cudaGraphDestroy(g));
      throw;
    }
    FSDP_CUDA_CHECK(cudaGraphDestroy(g));
    return out;
  }

  /// Ends a capture that failed on the host (an exception inside the captured step): nothing is instantiated.
  void abandon(cudaStream_t origin) noexcept {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(origin, &g) == cudaSuccess && g) FSDP_CUDA_LOG(cudaGraphDestroy(g));
    (void)cudaGetLastError();
    open_.reset();
    rerecord(origin);
  }

  void replay(const cuda_graph& g, cudaStream_t origin, streams others) {
    for (cudaStream_t s : others) {
      FSDP_CUDA_CHECK(cudaEventRecord(edge_.get(), s));
      FSDP_CUDA_CHECK(cudaStreamWaitEvent(origin, edge_.get(), 0));
    }
    FSDP_CUDA_CHECK(cudaGraphLaunch(g.state_->exec, origin));
    FSDP_CUDA_CHECK(cudaEventRecord(edge_.get(), origin));
    for (cudaStream_t s : others) FSDP_CUDA_CHECK(cudaStreamWaitEvent(s, edge_.get(), 0));
    ++replays_;
  }

  static bool empty(const cuda_graph& g) noexcept { return !g.state_; }

 private:
  void rerecord(cudaStream_t origin) noexcept {
    for (cudaEvent_t e : recorded_.all()) FSDP_CUDA_LOG(cudaEventRecord(e, origin));
    recorded_.clear();
  }

  std::shared_ptr<cuda_graph::state> open_;               // while capturing: the graph's payloads so far
  capture_rules::captured_events<cudaEvent_t> recorded_;  // events recorded in the capture
  cuda_event edge_;                                       // the fork, the joins, and a replay's edges
  std::uint64_t replays_ = 0;
};

}  // namespace fsdp::backend::detail
