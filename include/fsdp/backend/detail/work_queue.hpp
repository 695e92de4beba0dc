#pragma once
// The host backend's stream: an in-order queue of tasks. A worker stream runs them on its own thread; the
// inline stream (the caller's compute stream) runs them at once on the calling thread. A task that throws puts
// the stream in an error state (like a sticky CUDA error): later tasks are skipped, except those marked
// `always` (event completions and deferred frees), which still run so that nothing waits forever and no
// memory leaks; waiting on an event recorded after the failure rethrows the error.
//
// Spin, then park: a worker whose queue is empty, and a thread waiting on an event, first keep checking for `spin`
// (yielding the CPU between checks, so that a runnable thread on the same core goes first), and only then sleep on
// a condition variable; so does a thread in drain() (a stream's synchronize). Work that arrives, or an event
// reached, within that time is picked up without a thread wake-up; a submit notifies only a worker that sleeps, and
// the worker wakes a sleeping drain() only once one of the targets waited for is reached, not after every task.
//
// run_if_idle runs a task on the calling thread instead when nothing is queued or running, as the worker would.
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
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/core/config.hpp"

namespace fsdp::backend::detail {

/// A task's function: the callable moved to the heap, and one function that runs or destroys it. What
/// std::function<void()> did, in two functions per callable type where std::function emits about seven (its manager,
/// invoker, creation and destruction helpers): the host backend submits a lambda type per kernel, copy and element
/// function, and a trainer's file compiled them all.
class task_fn {
 public:
  task_fn() = default;
  template <class F>
  explicit task_fn(F&& f) : obj_(new std::decay_t<F>(std::forward<F>(f))), act_(&act<std::decay_t<F>>) {}
  task_fn(task_fn&& o) noexcept : obj_(std::exchange(o.obj_, nullptr)), act_(std::exchange(o.act_, nullptr)) {}
  task_fn& operator=(task_fn&& o) noexcept {
    if (this != &o) {
      reset();
      obj_ = std::exchange(o.obj_, nullptr);
      act_ = std::exchange(o.act_, nullptr);
    }
    return *this;
  }
  task_fn(const task_fn&) = delete;
  task_fn& operator=(const task_fn&) = delete;
  ~task_fn() { reset(); }

  void operator()() { act_(obj_, true); }

 private:
  template <class F>
  static void act(void* p, bool run) {
    if (run)
      (*static_cast<F*>(p))();
    else
      delete static_cast<F*>(p);
  }
  void reset() noexcept {
    if (obj_) act_(obj_, false);
    obj_ = nullptr;
  }
  void* obj_ = nullptr;
  void (*act_)(void*, bool) = nullptr;
};

class work_queue {
 public:
  struct task {
    task_fn fn;
    bool always = false;  ///< runs even after an earlier task failed
  };

  /// `threaded == false` makes an inline queue: submit runs the task on the caller's thread. `spin`: how long an
  /// idle worker checks for work before it sleeps (0: it sleeps at once).
  explicit work_queue(std::string name, bool threaded, std::chrono::microseconds spin = {});
  work_queue(const work_queue&) = delete;
  work_queue& operator=(const work_queue&) = delete;

  ~work_queue();

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
    enqueue(task{task_fn(std::forward<F>(fn)), always});
  }

  /// Runs `fn` at once on the calling thread when the queue is idle (nothing queued, nothing running: every task
  /// submitted so far has run, so running it now keeps the queue's order), as its worker would (a throw puts the
  /// queue in its error state; after an earlier failure it is skipped) and returns true; returns false, running
  /// nothing, when the queue is busy. While it runs, the worker takes no task. For work that costs less than a
  /// hand-off to the worker (comm::mpi's small collectives): the caller blocks for as long as `fn` runs.
  template <class F>
  bool run_if_idle(F&& fn) {
    if (!threaded_) {
      submit(std::forward<F>(fn));
      return true;
    }
    {
      std::lock_guard lk(mu_);
      if (!q_.empty() || busy_) return false;
      busy_ = true;
    }
    if (!failed()) {
      try {
        std::forward<F>(fn)();
      } catch (...) {
        set_error(std::current_exception());
      }
    }
    std::lock_guard lk(mu_);
    busy_ = false;
    const std::uint64_t done = done_.fetch_add(1) + 1;
    if ((drainers_ > 0 && done >= wake_at_) || (parked_ && !q_.empty())) cv_.notify_all();
    return true;
  }

  /// While the backend captures a step (backend::host::begin_capture): where the calls that would issue work on this
  /// queue go instead, each one issuing itself again when the capture is replayed (the backend's and the
  /// communicators' calls check it); null otherwise. Read and set by the issuing thread only.
  std::vector<std::function<void()>>* capture() const noexcept { return capture_; }
  void set_capture(std::vector<std::function<void()>>* calls) noexcept { capture_ = calls; }

  /// Whether a task of this queue threw (or a waited-on event carried an error): a lock-free check.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// The first error a task of this queue threw, or null.
  std::exception_ptr error() const;
  /// Puts the queue in the error state (used when a waited-on event carries another stream's error).
  void set_error(std::exception_ptr e);

  /// Blocks until every task submitted so far has run, at most `timeout`: false when it has not (the queue's
  /// error is not rethrown).
  bool wait_idle(std::chrono::milliseconds timeout);

  /// Blocks until every task submitted so far has run; rethrows the queue's error.
  void drain(std::chrono::milliseconds timeout);

 private:
  std::uint64_t submitted_locked() const { return done_.load() + q_.size() + (busy_ ? 1 : 0); }

  /// With mu_ held in `lk`: until `target` tasks have run (spinning first, then asleep until the worker says the
  /// target is reached), at most `timeout`; false past it.
  bool wait_done(std::unique_lock<std::mutex>& lk, std::uint64_t target, std::chrono::milliseconds timeout);

  /// A threaded queue's submit, out of line so that the inline queue's stays small.
  void enqueue(task t);

  void run_one(task t);

  void loop();

  std::string name_;
  bool threaded_;
  std::vector<std::function<void()>>* capture_ = nullptr;
  std::chrono::microseconds spin_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<task> q_;
  std::atomic<std::size_t> queued_{0};  // q_.size(), for the spinning worker to read without mu_
  std::atomic<bool> stopping_{false};   // stop_, likewise
  bool parked_ = false;                 // the worker sleeps on cv_ (or is about to): a submit must notify
  static constexpr std::uint64_t no_target = ~std::uint64_t{0};
  std::atomic<std::uint64_t> done_{0};  // tasks run; written under mu_, read without it by a spinning drainer
  int drainers_ = 0;                    // threads asleep in wait_done
  std::uint64_t wake_at_ = no_target;   // the smallest target among them (no_target: none)
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
  void complete(std::uint64_t target, std::exception_ptr e);
  /// Blocks until marker `target` is reached; returns the error carried by the event, if any. Past `timeout`,
  /// a comm_error names the waiting stream.
  /// `spin`: how long to keep checking (yielding between checks) before sleeping.
  std::exception_ptr wait(std::uint64_t target, std::chrono::milliseconds timeout, const std::string& stream_name,
                          std::chrono::microseconds spin = {}) {
    if (completed.load() >= target && !failed.load()) return nullptr;  // the common case, inline
    return wait_slow(target, timeout, stream_name, spin);
  }

 private:
  std::exception_ptr wait_slow(std::uint64_t target, std::chrono::milliseconds timeout, const std::string& stream_name,
                               std::chrono::microseconds spin);
};

}  // namespace fsdp::backend::detail

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/backend/detail/work_queue.ipp"
#endif
