#pragma once
// The host backend's stream and event definitions (fsdp/backend/detail/work_queue.hpp): included by that header, or
// compiled once by fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "fsdp/backend/detail/work_queue.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::backend::detail {

FSDP_DECL work_queue::work_queue(std::string name, bool threaded, std::chrono::microseconds spin)
    : name_(std::move(name)), threaded_(threaded), spin_(spin) {
  if (threaded_) worker_ = std::thread([this] { loop(); });
}

FSDP_DECL work_queue::~work_queue() {
  if (!threaded_) return;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    stopping_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  worker_.join();  // drains the queue first: deferred frees still run
}

FSDP_DECL std::exception_ptr work_queue::error() const {
  if (!failed()) return nullptr;
  std::lock_guard lk(mu_);
  return error_;
}

FSDP_DECL void work_queue::set_error(std::exception_ptr e) {
  std::lock_guard lk(mu_);
  if (!error_) error_ = std::move(e);
  failed_.store(true, std::memory_order_release);
}

FSDP_DECL bool work_queue::wait_idle(std::chrono::milliseconds timeout) {
  if (!threaded_) return true;
  std::unique_lock lk(mu_);
  return wait_done(lk, submitted_locked(), timeout);
}

FSDP_DECL void work_queue::drain(std::chrono::milliseconds timeout) {
  if (threaded_) {
    std::unique_lock lk(mu_);
    if (!wait_done(lk, submitted_locked(), timeout))
      throw comm_error(fsdp::detail::cat("stream '", name_, "' did not drain within ", timeout.count(), " ms"));
  }
  if (auto e = error()) std::rethrow_exception(e);
}

FSDP_DECL bool work_queue::wait_done(std::unique_lock<std::mutex>& lk, std::uint64_t target,
                                     std::chrono::milliseconds timeout) {
  if (done_.load() >= target) return true;
  if (spin_.count() > 0) {
    lk.unlock();
    const auto until = std::chrono::steady_clock::now() + spin_;
    while (done_.load(std::memory_order_acquire) < target && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    lk.lock();
    if (done_.load() >= target) return true;
  }
  ++drainers_;  // the worker wakes the drainers only once one of their targets is reached, not after every task
  wake_at_ = std::min(wake_at_, target);
  const bool reached = cv_.wait_for(lk, timeout, [&] { return done_.load() >= target; });
  if (--drainers_ == 0) wake_at_ = no_target;
  return reached;
}

// [[gnu::noinline]] here and on wait_slow, not on their declarations: g++ rejects an inline definition that follows a
// noinline declaration.
[[gnu::noinline]] FSDP_DECL void work_queue::enqueue(task t) {
  bool sleeping;
  {
    std::lock_guard lk(mu_);
    q_.push_back(std::move(t));
    queued_.store(q_.size(), std::memory_order_release);
    sleeping = parked_;
  }
  if (sleeping) cv_.notify_all();  // a spinning worker sees queued_ without a wake-up
}

FSDP_DECL void work_queue::run_one(task t) {
  if (!t.always && failed()) return;
  try {
    t.fn();
  } catch (...) {
    set_error(std::current_exception());
  }
}

FSDP_DECL void work_queue::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    if (q_.empty() && !stop_ && spin_.count() > 0) {  // spin a while before sleeping
      lk.unlock();
      const auto until = std::chrono::steady_clock::now() + spin_;
      while (queued_.load(std::memory_order_acquire) == 0 && !stopping_.load(std::memory_order_acquire) &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      lk.lock();
    }
    parked_ = true;  // under mu_: a submit after this point sees it and notifies
    cv_.wait(lk, [&] { return !busy_ && (stop_ || !q_.empty()); });  // busy_ here: run_if_idle's task runs
    parked_ = false;
    if (q_.empty()) return;  // stop_ and drained
    task t = std::move(q_.front());
    q_.pop_front();
    queued_.store(q_.size(), std::memory_order_release);
    busy_ = true;
    lk.unlock();
    run_one(std::move(t));
    lk.lock();
    busy_ = false;
    const std::uint64_t done = done_.fetch_add(1) + 1;
    if (drainers_ > 0 && done >= wake_at_) cv_.notify_all();
  }
}

FSDP_DECL void event_state::complete(std::uint64_t target, std::exception_ptr e) {
  if (e) {
    std::lock_guard lk(mu);
    if (!error) error = std::move(e);
    failed.store(true);
  }
  std::uint64_t seen = completed.load();
  while (seen < target && !completed.compare_exchange_weak(seen, target)) {
  }
  if (sleepers.load() > 0) {
    { std::lock_guard lk(mu); }  // a sleeper between its check and its sleep holds mu: wait until it sleeps
    cv.notify_all();
  }
}

[[gnu::noinline]] FSDP_DECL std::exception_ptr event_state::wait_slow(std::uint64_t target,
                                                                     std::chrono::milliseconds timeout,
                                                                     const std::string& stream_name,
                                                                     std::chrono::microseconds spin) {
  if (spin.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + spin;
    while (completed.load() < target && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    if (completed.load() >= target && !failed.load()) return nullptr;
  }
  std::unique_lock lk(mu);
  sleepers.fetch_add(1);
  const bool reached = cv.wait_for(lk, timeout, [&] { return completed.load() >= target; });
  sleepers.fetch_sub(1);
  if (!reached)
    throw comm_error(fsdp::detail::cat("stream '", stream_name, "' waiting on an event: event not reached within ",
                                       timeout.count(), " ms (a collective or stream upstream of it is stuck)"));
  return error;
}

}  // namespace fsdp::backend::detail
