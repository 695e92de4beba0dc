#pragma once
// The host thread pool's definitions (fsdp/kernels/host_pool.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#include "fsdp/kernels/host_pool.hpp"

namespace fsdp::kernels {

FSDP_DECL host_pool::~host_pool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

FSDP_DECL int host_pool::default_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hw, 1u, 8u));
}

FSDP_DECL int host_pool::started() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(workers_.size());
}

FSDP_DECL void host_pool::start_workers() {
  std::lock_guard lk(mu_);
  while (static_cast<int>(workers_.size()) < threads_ - 1)
    workers_.emplace_back([this, seen = generation_]() mutable { loop(seen); });
}

FSDP_DECL void host_pool::loop(std::uint64_t seen) {
  for (;;) {
    job j;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      j = job_;
      if (!j.body) continue;
      ++active_;
    }
    work_on(j);
    std::lock_guard lk(mu_);
    if (--active_ == 0) finished_.notify_all();
  }
}

FSDP_DECL void host_pool::work_on(const job& j) {
  for (;;) {
    const std::int64_t k = next_.fetch_add(1, std::memory_order_relaxed);
    if (k >= j.chunks) return;
    const std::int64_t b = j.n * k / j.chunks, e = j.n * (k + 1) / j.chunks;
    std::exception_ptr err;
    {
      std::lock_guard lk(mu_);
      err = error_;
    }
    if (!err) {
      try {
        j.body(j.fn, b, e);
      } catch (...) {
        err = std::current_exception();
      }
    }
    std::lock_guard lk(mu_);
    if (err && !error_) error_ = err;
    if (++done_ == j.chunks) finished_.notify_all();
  }
}

}  // namespace fsdp::kernels
