#pragma once
// A packer on a background thread: it packs steps ahead of the trainer into a bounded queue of `depth` steps, and
// the trainer takes its rank's share of the next one. While the queue holds a step, next() returns it at once;
// next() waits only when the worker has fallen behind (counted by waits()). The worker stops when the queue is
// full, so at most `depth` steps are packed ahead.
//
// Each queued step carries the packer's state after it (a snapshot: shared pieces, no tokens copied), so state()
// is the state after the last step the trainer took: saved with a checkpoint and given back to the constructor, it
// resumes the same data, whatever the worker had packed ahead. A packing error (an empty document, say) reaches
// the trainer from next() at the step it happened in, after the steps before it. The destructor stops the worker
// and waits for it, so a source must return (one that blocks on its input holds the destructor until it does).
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/data/packing.hpp"

namespace fsdp::data {

template <DocumentSource Source>
class async_packer {
 public:
  /// Rank `rank` of `world`'s packer (`world` divides o.rows_per_step), `depth` steps ahead, from `state`.
  async_packer(packing_options o, Source source, int world, int rank, std::size_t depth = 4, packer_state state = {})
      : world_(world), rank_(rank), depth_(depth), packer_(o, std::move(source), state) {
    taken_ = packer_.snapshot();
    if (depth_ == 0)
      fsdp::detail::fail_usage("packing: an async_packer's queue depth is 0; it must hold at least one step");
    check_world(o.rows_per_step, world);
    check_rank(world, rank);
    worker_ = std::thread([this] { run(); });
  }
  async_packer(const async_packer&) = delete;
  async_packer& operator=(const async_packer&) = delete;
  ~async_packer() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  /// This rank's share of the next step, or nothing once the stream is packed; rethrows a packing error.
  std::optional<rank_batch> next() {
    std::unique_lock lock(m_);
    if (queue_.empty()) {
      if (!finished_) ++waits_;
      cv_.wait(lock, [&] { return !queue_.empty() || finished_; });
    }
    if (queue_.empty()) {
      if (error_) std::rethrow_exception(error_);
      return std::nullopt;
    }
    item it = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    cv_.notify_all();
    taken_ = std::move(it.after);
    return std::move(it.batch);
  }

  /// The packer's state after the last step next() returned (the constructor's state before the first).
  packer_state state() const { return taken_.value(); }
  const packing_options& options() const { return packer_.options(); }
  /// Steps packed and waiting.
  std::size_t queued() const {
    std::lock_guard lock(m_);
    return queue_.size();
  }
  /// Calls of next() that found no step ready and waited for the worker.
  std::uint64_t waits() const {
    std::lock_guard lock(m_);
    return waits_;
  }

 private:
  struct item {
    rank_batch batch;
    packer_snapshot after;
  };

  void run() {
    for (;;) {
      {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return stop_ || queue_.size() < depth_; });
        if (stop_) return;
      }
      std::optional<item> it;
      std::exception_ptr error;
      bool end = false;
      try {
        if (std::optional<packed_step> s = packer_.next())
          it = item{rank_share(*s, world_, rank_), packer_.snapshot()};
        else
          end = true;
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(m_);
        try {
          if (it) queue_.push_back(std::move(*it));
        } catch (...) {  // no memory for the queue: the trainer gets the error at this step
          error = std::current_exception();
        }
        if (end || error) finished_ = true, error_ = error;
      }
      cv_.notify_all();
      if (end || error) return;
    }
  }

  const int world_, rank_;
  const std::size_t depth_;
  packer_snapshot taken_;  // the trainer's thread only
  packer<Source> packer_;  // the worker's only, after construction
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<item> queue_;
  bool stop_ = false, finished_ = false;
  std::exception_ptr error_;
  std::uint64_t waits_ = 0;
  std::thread worker_;
};

}  // namespace fsdp::data
