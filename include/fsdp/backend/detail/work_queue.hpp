#pragma once
// The host backend's stream: an in-order queue of tasks. A worker stream runs them on its own thread; the
// inline stream (the caller's compute stream) runs them at once on the calling thread. A task that throws puts
// the stream in an error state (like a sticky CUDA error): later tasks are skipped, except those marked
// `always` (event completions and deferred frees), which still run so that nothing waits forever and no
// memory leaks; waiting on an event recorded after the failure rethrows the error.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "fsdp/core/error.hpp"

namespace fsdp::backend::host_detail {

class work_queue {
 public:
  struct task {
    std::function<void()> fn;
    bool always = false;  ///< runs even after an earlier task failed
  };

  /// `threaded == false` makes an inline queue: submit runs the task on the caller's thread.
  explicit work_queue(std::string name, bool threaded) : name_(std::move(name)), threaded_(threaded) {
    if (threaded_) worker_ = std::thread([this] { loop(); });
  }
  work_queue(const work_queue&) = delete;
  work_queue& operator=(const work_queue&) = delete;

  ~work_queue() {
    if (!threaded_) return;
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();  // drains the queue first: deferred frees still run
  }

  const std::string& name() const noexcept { return name_; }
  bool threaded() const noexcept { return threaded_; }

  /// Runs `fn` in the queue's order: at once on the calling thread for an inline queue (nothing allocated), else
  /// on the worker. A task that throws puts the queue in its error state; later tasks are skipped unless `always`.
  template <class F>
  void submit(F&& fn, bool always = false) {
    if (!threaded_) {
      if (!always && failed()) return;
      try {
        std::forward<F>(fn)();
      } catch (...) {
        set_error(std::current_exception());
      }
      return;
    }
    {
      std::lock_guard lk(mu_);
      q_.push_back(task{std::function<void()>(std::forward<F>(fn)), always});
    }
    cv_.notify_all();
  }

  /// Whether a task of this queue threw (or a waited-on event carried an error): a lock-free check.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// The first error a task of this queue threw, or null.
  std::exception_ptr error() const {
    if (!failed()) return nullptr;
    std::lock_guard lk(mu_);
    return error_;
  }
  /// Puts the queue in the error state (used when a waited-on event carries another stream's error).
  void set_error(std::exception_ptr e) {
    std::lock_guard lk(mu_);
    if (!error_) error_ = std::move(e);
    failed_.store(true, std::memory_order_release);
  }

  /// Blocks until every task submitted so far has run, at most `timeout`: false when it has not (the queue's
  /// error is not rethrown).
  bool wait_idle(std::chrono::milliseconds timeout) {
    if (!threaded_) return true;
    std::unique_lock lk(mu_);
    const std::uint64_t target = submitted_locked();
    return cv_.wait_for(lk, timeout, [&] { return done_ >= target; });
  }

  /// Blocks until every task submitted so far has run; rethrows the queue's error.
  void drain(std::chrono::milliseconds timeout) {
    if (threaded_) {
      std::unique_lock lk(mu_);
      const std::uint64_t target = submitted_locked();
      if (!cv_.wait_for(lk, timeout, [&] { return done_ >= target; }))
        throw comm_error(detail::cat("stream '", name_, "' did not drain within ", timeout.count(), " ms"));
    }
    if (auto e = error()) std::rethrow_exception(e);
  }

 private:
  std::uint64_t submitted_locked() const { return done_ + q_.size() + (busy_ ? 1 : 0); }

  void run_one(task t) {
    if (!t.always && failed()) return;
    try {
      t.fn();
    } catch (...) {
      set_error(std::current_exception());
    }
  }

  void loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop_ and drained
      task t = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      lk.unlock();
      run_one(std::move(t));
      lk.lock();
      busy_ = false;
      ++done_;
      cv_.notify_all();
    }
  }

  std::string name_;
  bool threaded_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<task> q_;
  std::uint64_t done_ = 0;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  std::thread worker_;
};

/// Completion marker shared by an event's handles: `recorded` counts record calls, `completed` the markers
/// that have been reached. A wait snapshots `recorded` when it is issued, as cudaStreamWaitEvent does.
///
/// A wait whose marker is reached already takes no lock (the common case: inline streams, and streams that have
/// caught up), and a completion locks and notifies only while a thread sleeps on the event. A sleeper counts itself
/// in `sleepers` and then reads `completed`; a completion stores `completed` and then reads `sleepers` (all
/// sequentially consistent): one of the two sees the other, so a completion never misses a sleeper, and its notify,
/// made under the lock the sleeper holds until it sleeps, cannot come before the sleep.
struct event_state {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<std::uint64_t> recorded{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<int> sleepers{0};
  std::atomic<bool> failed{false};  // `error` is set (under mu, before the completion that carries it)
  std::exception_ptr error;

  std::uint64_t next_target() { return recorded.fetch_add(1) + 1; }
  std::uint64_t snapshot() const { return recorded.load(); }
  void complete(std::uint64_t target, std::exception_ptr e) {
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
  /// Blocks until marker `target` is reached; returns the error carried by the event, if any. Past `timeout`,
  /// a comm_error names the waiting stream.
  std::exception_ptr wait(std::uint64_t target, std::chrono::milliseconds timeout, const std::string& stream_name) {
    if (completed.load() >= target && !failed.load()) return nullptr;
    std::unique_lock lk(mu);
    sleepers.fetch_add(1);
    const bool reached = cv.wait_for(lk, timeout, [&] { return completed.load() >= target; });
    sleepers.fetch_sub(1);
    if (!reached)
      throw comm_error(detail::cat("stream '", stream_name, "' waiting on an event: event not reached within ",
                                   timeout.count(), " ms (a collective or stream upstream of it is stuck)"));
    return error;
  }
};

}  // namespace fsdp::backend::host_detail
