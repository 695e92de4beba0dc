#pragma once
// A fixed pool of host threads for the library's host loops (fsdp/kernels/host_loops.hpp) where they run inside a
// host function: offloading's host optimizer step and host gradient additions (fsdp/policy/offload.hpp), which
// would otherwise run on the one thread of their stream. for_each(n, f) splits [0, n) into contiguous chunks that
// the pool's threads and the calling thread take in turn; each element is still f(i), once, so the bits are those
// of the single-threaded loop (the library's element functions touch element i alone).
//
// Threads are started on the first loop large enough to split (`grain` elements a chunk at least), not before;
// one loop at a time per pool (a second caller waits for the first). An exception from f is rethrown by for_each
// once every chunk has finished or been skipped.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/kernels/host_loops.hpp"

namespace fsdp::kernels {

class host_pool {
 public:
  /// `threads`: how many threads a loop may use, the caller's included (at least 1); `grain`: the fewest elements a
  /// chunk has (a loop of fewer than 2 * grain runs on the caller alone).
  explicit host_pool(int threads = default_threads(), std::int64_t grain = std::int64_t{1} << 15)
      : threads_(std::max(1, threads)), grain_(std::max<std::int64_t>(1, grain)) {}
  host_pool(const host_pool&) = delete;
  host_pool& operator=(const host_pool&) = delete;
  ~host_pool();

  /// Up to 8 threads, no more than the machine has.
  static int default_threads();
  int threads() const noexcept { return threads_; }
  /// Threads started so far besides callers (0 until a loop was large enough to split).
  int started() const;

  /// f(i) for every i in [0, n), each once, in contiguous chunks on the pool's threads and the caller.
  template <class F>
  void for_each(std::int64_t n, const F& f) {
    const std::int64_t chunks = std::min<std::int64_t>(threads_ * 4, n / grain_);
    if (chunks < 2 || threads_ == 1) {
      host_loops::for_each(n, f);
      return;
    }
    const std::lock_guard one_loop(loop_mu_);
    start_workers();
    {
      std::lock_guard lk(mu_);
      job_ = {&range_of<F>, &f, n, chunks};
      next_.store(0, std::memory_order_relaxed);
      done_ = 0;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work_on(job_);
    std::unique_lock lk(mu_);
    // every chunk done, and every worker out of this loop (none can then take a chunk of the next one with this body)
    finished_.wait(lk, [&] { return done_ == job_.chunks && active_ == 0; });
    job_ = {};
    if (error_) std::rethrow_exception(error_);
  }

 private:
  /// f over [b, e), `fn` pointing at f: one function per element function (a std::function would be several).
  template <class F>
  static void range_of(const void* fn, std::int64_t b, std::int64_t e) {
    host_loops::for_range(b, e, *static_cast<const F*>(fn));
  }

  struct job {
    void (*body)(const void* fn, std::int64_t b, std::int64_t e) = nullptr;  ///< runs `fn` over [b, e)
    const void* fn = nullptr;
    std::int64_t n = 0;
    std::int64_t chunks = 0;
  };

  void start_workers();

  void loop(std::uint64_t seen);

  /// Takes chunks of `j` until none is left.
  void work_on(const job& j);

  int threads_;
  std::int64_t grain_;
  std::mutex loop_mu_;  // one loop at a time
  mutable std::mutex mu_;
  std::condition_variable cv_, finished_;
  std::vector<std::thread> workers_;
  job job_{};
  std::atomic<std::int64_t> next_{0};
  std::int64_t done_ = 0;
  int active_ = 0;  // workers inside the current loop
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace fsdp::kernels

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/kernels/host_pool.ipp"
#endif
