#pragma once
// The Backend concept: what Model (its unit executor, the optimizers and the gradient inspection) needs of a
// backend. backend::host (host memory, streams as work queues) and backend::cuda (device memory, CUDA streams)
// model it; tests/static/concepts_test.cc holds an archetype that models it and nothing more.
//
//   memory      allocate(bytes, category, first-use stream) -> buffer (move-only, accounted to its category until
//               released; `bool(b)` says whether it holds anything), release_after(buffer, stream) (stream-ordered;
//               an empty or moved-from buffer is a no-op), memory() (the tracker)
//   streams     compute, all-gather and reduce streams; events recorded on and waited for by streams; host
//               callbacks at a stream's point; synchronize (blocks the host until the stream drains)
//   copies      fill_zero, copy, upload (host -> backend), download (backend -> host)
//   kernels     convert (cast with scale), accumulate (into fp32 with scale): each applies the per-element code
//               every backend shares (kernels/elementwise.hpp); squared_norm, the sum of squares into one float
//               (the backend's own: a double loop on the host, CUB's reduction on a GPU, within 1e-5 relative of
//               each other, tests/cuda/kernels_test.cu); for_each(n, f, stream): f(i) for every i in [0, n), on the
//               stream, for any ElementFunction f (the optimizers' updates are such functions: a backend knows no
//               optimizer)
//
// Optional hooks, each a concept below (a backend has any of them or none; those without get what the brackets
// say): host_addressable (a static constexpr bool: the buffers are host memory, which checkpoint saves write from
// without a staging copy) [a staging copy]; ReservingBackend, reserve(bytes) (Model::reserve_memory takes the
// plan's peak at once) [memory taken as used]; PollingBackend, done(event) (whether a stream has passed an event's
// record, without waiting: with OffloadBackend's pinned memory the optimizers learn their gradient inspection's
// decision through it, fsdp/grad/inspect.hpp) [the decision read back inside the step]; HostMappingBackend,
// host_memory_on_device() (whether the device addresses pinned host memory: the inspection reads offloaded
// gradients in place) [assumed]; timing marks (trace::TimingMarks, fsdp/observe/stamp.hpp: the trace times stream
// events with them instead of host callbacks) and profiler ranges (trace::ProfilerRanges, fsdp/observe/ranges.hpp).
// backend::cuda has them all; backend::host is host_addressable and has done(event).
#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/kernels/element_function.hpp"  // ElementFunction: what for_each runs
#include "fsdp/memory/memory.hpp"

namespace fsdp {

/// A backend's stream for one role ("compute", "all_gather", "reduce", "upload", "download", "host_work"; a
/// backend's own, such as backend::cuda's "timer") on rank `rank` is named "rank<R>.<role>": the one naming rule of
/// both backends. Traces show the names; communicators that keep one channel per stream (comm::mpi, comm::nccl)
/// key on them, so two streams of one rank must not share a role.
inline std::string stream_name(int rank, std::string_view role) {
  return "rank" + std::to_string(rank) + "." + std::string(role);
}

/// The least ElementFunction, for checking a backend's for_each.
struct element_function_archetype {
  FSDP_HD void operator()(std::int64_t) const noexcept {}
};

/// A buffer of a backend: owning, move-only, with its address, size and category.
template <class B>
concept BackendBuffer = std::is_nothrow_move_constructible_v<B> && std::is_nothrow_move_assignable_v<B> &&
                        !std::is_copy_constructible_v<B> && std::default_initializable<B> &&
                        requires(const B& b) {
                          static_cast<bool>(b);
                          { b.data() } -> std::same_as<void*>;
                          { b.template as<float>() } -> std::same_as<float*>;
                          { b.bytes() } -> std::same_as<std::int64_t>;
                          { b.category() } -> std::same_as<mem>;
                        };

template <class B>
concept Backend =
    std::constructible_from<B, int> && BackendBuffer<typename B::buffer> &&
    std::default_initializable<typename B::event> &&
    requires(B& b, typename B::stream& s, typename B::event& e, const typename B::event& ce, typename B::buffer&& buf,
             void* p, const void* cp, float* f, const float* cf, std::int64_t n, float scale, dtype t, mem c,
             const element_function_archetype& ef, std::function<void()> fn) {
      { b.compute_stream() } -> std::same_as<typename B::stream&>;
      { b.gather_stream() } -> std::same_as<typename B::stream&>;
      { b.reduce_stream() } -> std::same_as<typename B::stream&>;
      b.record(e, s);
      b.wait(s, ce);
      b.host_callback(s, std::move(fn));
      b.synchronize(s);
      { b.allocate(n, c, s) } -> std::same_as<typename B::buffer>;
      b.release_after(std::move(buf), s);
      { b.memory() } -> std::same_as<MemoryTracker&>;
      b.fill_zero(p, n, s);
      b.copy(p, cp, n, s);
      b.upload(p, cp, n, s);
      b.download(p, cp, n, s);
      b.convert(p, t, cp, t, n, scale, s);
      b.accumulate(f, cp, t, n, scale, s);
      b.squared_norm(cf, n, f, s);
      b.for_each(n, ef, s);
    };

/// A backend that can hold offloaded buffers (fsdp/policy/offload.hpp): host memory accounted apart
/// (allocate_host, host_memory), two copy streams, host to device (upload) and device to host (download), and a
/// stream for host-side work on offloaded buffers (host_work: host_callback only), so that no copy waits behind the
/// CPU. backend::host and backend::cuda model it.
template <class B>
concept OffloadBackend = Backend<B> && requires(B& b, std::int64_t n, mem c) {
  { b.allocate_host(n, c) } -> std::same_as<typename B::buffer>;
  { b.host_memory() } -> std::same_as<MemoryTracker&>;
  { b.upload_stream() } -> std::same_as<typename B::stream&>;
  { b.download_stream() } -> std::same_as<typename B::stream&>;
  { b.host_work_stream() } -> std::same_as<typename B::stream&>;
};

/// Optional: reserve(bytes) takes what the memory plan's peak needs up front (backend::cuda's pool).
template <class B>
concept ReservingBackend = Backend<B> && requires(B& b, std::int64_t bytes) { b.reserve(bytes); };

/// Optional: done(event) says, without waiting, whether the event's stream has passed its record (and rethrows the
/// stream's error where it failed).
template <class B>
concept PollingBackend = Backend<B> && requires(const B& b, const typename B::event& e) {
  { b.done(e) } -> std::convertible_to<bool>;
};

/// Optional: capturing() says whether the backend is recording a step to replay (backend::host's begin_capture, a
/// CUDA graph's capture) instead of running what is issued.
template <class B>
concept CapturingBackend = Backend<B> && requires(const B& b) {
  { b.capturing() } -> std::convertible_to<bool>;
};
template <Backend B>
bool capturing(const B& b) {
  if constexpr (CapturingBackend<B>)
    return b.capturing();
  else
    return false;
}

/// Optional: host_memory_on_device() says whether the device addresses the pinned host memory allocate_host gives.
template <class B>
concept HostMappingBackend = OffloadBackend<B> && requires(const B& b) {
  { b.host_memory_on_device() } -> std::convertible_to<bool>;
};

}  // namespace fsdp
