#pragma once
// A model of a stream-ordered memory pool (cudaMallocAsync / cudaFreeAsync with a release threshold of "never"),
// for the host backend: how much memory such a pool would have to take from the device for the same sequence of
// allocations, frees, event records and event waits. The host backend's own memory is ordinary heap memory; this
// model only counts.
//
// The rules, as CUDA states them for a pool (cudaMemPoolReuseFollowEventDependencies and
// cudaMemPoolReuseAllowOpportunistic, both on by default), decided when the allocation is issued:
//   - memory freed on stream S can be reused at once by a later allocation on S (stream order);
//   - memory freed on stream T can be reused by an allocation on S once S has been made to wait (cudaStreamWaitEvent,
//     directly or through other streams) on an event recorded on T after the free;
//   - otherwise only once the free has actually happened (T reached it) by the time the allocation is issued.
// Anything else takes fresh memory, which the pool keeps. The model has no fragmentation and no rounding: freed
// bytes that may be reused are reused whatever their block sizes. What holds, then: for the same sequence with
// the same timing, the figure is what an ideal pool would take. A real pool can take more (it reserves in whole
// units of its allocation granularity, and a free block too small for the next request stays unused) and, for
// opportunistic reuse, less or more (whether a free has happened when an allocation is issued depends on the
// device's timing, not the host's). Within a step the executor's slots (fsdp/detail/exec/slot_ring.hpp) reuse their own
// blocks, so the persistent buffers, the no-sync accumulators and a slot made larger in the first steps (its old
// block freed, a larger one taken) are where the two can differ;
// on a lent GPU, tests/cuda/model_test checks that a real pool stops growing after the first step (never run yet).
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "fsdp/core/config.hpp"

namespace fsdp::backend::detail {

class pool_model {
 public:
  /// Streams are numbered 0..streams-1; `any` frees memory at once (a buffer destroyed outside stream order).
  static constexpr int streams = 6;
  static constexpr int any = -1;
  /// Per stream: how many frees of each stream it is ordered after.
  using clock = std::array<std::uint64_t, streams>;

  struct figures {
    std::int64_t in_use = 0;    ///< bytes allocated and not freed (in issue order)
    std::int64_t reserved = 0;  ///< bytes the pool has taken from the device so far (never given back)
  };

  /// An allocation of `bytes` issued on stream `s`: reuses what the rules allow, takes fresh memory for the rest.
  void allocate(int s, std::int64_t bytes);
  /// A free of `bytes` issued on stream `s` (or `any`: done now). Returns the flag the stream sets when it reaches
  /// the free (null for `any`).
  std::shared_ptr<std::atomic<bool>> free(int s, std::int64_t bytes);
  /// What an event recorded now on stream `s` carries. Lock-free, as wait() is (an event is recorded and waited on
  /// several times per unit and step): the clocks are atomics that only grow, so a record made while another thread
  /// issues a wait on the same stream sees each entry before or after that wait, never a torn value.
  clock record(int s) const;
  /// Stream `s` waits for an event that carries `c`.
  void wait(int s, const clock& c);
  figures stats() const;

 private:
  struct chunk {
    std::int64_t bytes;
    int stream;
    std::uint64_t seq;                        ///< the free's number among its stream's frees
    std::shared_ptr<std::atomic<bool>> done;  ///< the stream reached the free
  };
  bool reusable(const chunk& c, int s) const;

  mutable std::mutex mu_;
  figures f_;
  std::vector<chunk> free_;
  // Per stream: its frees issued so far, and the frees of each stream it has been made to wait for (atomics: record()
  // and wait() read and raise them without the mutex, which guards the free list and the figures)
  std::array<std::atomic<std::uint64_t>, streams> issued_{};
  std::array<std::array<std::atomic<std::uint64_t>, streams>, streams> seen_{};
};

}  // namespace fsdp::backend::detail

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/backend/detail/pool_model.ipp"
#endif
