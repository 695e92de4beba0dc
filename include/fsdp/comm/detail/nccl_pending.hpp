#pragma once
// The collectives one comm::nccl core (nccl_logic.hpp) has issued and not yet seen complete, each with the event
// recorded after it on the stream it runs on, oldest first, and the spare events that completed ones leave for the
// next collectives (an event per collective would be made and destroyed thousands of times a step). The core asks
// it whether everything completed (drain), names what is pending in its failure messages, and makes its family's
// collective stream wait for it (join_family). Another member of the family may read it, so it locks. Host-only,
// over the same Api as nccl_core (nccl_logic.hpp lists it: new_event, record, complete, destroy_event, wait, now).
#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/detail/nccl_op.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

template <class Api>
class nccl_pending {
 public:
  using event = typename Api::event;
  using stream = typename Api::stream;

  /// `api` must outlive the ledger (its core's).
  explicit nccl_pending(Api& api) : api_(&api) {}
  nccl_pending(const nccl_pending&) = delete;
  nccl_pending& operator=(const nccl_pending&) = delete;

  /// An event for the next collective: a spare one, or a new one.
  event take() {
    {
      std::lock_guard lk(mu_);
      if (!spare_.empty()) {
        event e = spare_.back();
        spare_.pop_back();
        return e;
      }
    }
    return api_->new_event();
  }
  /// `e`, taken and never recorded (recording it failed), is spare again.
  void give_back(event e) {
    std::lock_guard lk(mu_);
    spare_.push_back(e);
  }
  /// `op` was issued and `done` recorded after it.
  void add(nccl_op op, event done) {
    std::lock_guard lk(mu_);
    pending_.push_back({std::move(op), done});
    if (pending_.size() > 64) retire_locked();
  }
  /// Forgets the collectives that completed, oldest first, up to the first that has not.
  void retire() {
    std::lock_guard lk(mu_);
    retire_locked();
  }
  /// Whether none is pending (the completed ones not retired yet count as pending).
  bool empty() const {
    std::lock_guard lk(mu_);
    return pending_.empty();
  }
  /// `s` waits for every pending collective.
  void wait_all(stream s) {
    std::lock_guard lk(mu_);
    for (const pending_op& p : pending_) api_->wait(s, p.done);
  }
  /// The pending collectives once the completed ones are retired, oldest first: "all_gather(count=8, f32) #3 for
  /// unit 'h.1', issued 12 ms ago and not complete; ..." (at most `named` of them, then "; and N more"); empty
  /// when none is.
  std::string items(std::size_t named) {
    std::lock_guard lk(mu_);
    retire_locked();
    const auto now = api_->now();
    std::string s;
    std::size_t n = 0;
    for (const auto& p : pending_) {
      if (n == named) {
        s += fsdp::detail::cat("; and ", pending_.size() - n, " more");
        break;
      }
      const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.op.issued);
      s += fsdp::detail::cat(n ? "; " : "", p.op.str(), ", issued ", age.count(), " ms ago and not complete");
      ++n;
    }
    return s;
  }
  /// Destroys every event, pending or spare (the core is going, or its communicators are).
  void release() noexcept {
    std::lock_guard lk(mu_);
    for (auto& p : pending_) api_->destroy_event(p.done);
    for (event e : spare_) api_->destroy_event(e);
    pending_.clear();
    spare_.clear();
  }

 private:
  struct pending_op {
    nccl_op op;
    event done;
  };
  void retire_locked() {
    while (!pending_.empty() && api_->complete(pending_.front().done)) {
      spare_.push_back(pending_.front().done);
      pending_.pop_front();
    }
  }

  Api* api_;
  mutable std::mutex mu_;
  std::deque<pending_op> pending_;
  std::vector<event> spare_;
};

}  // namespace fsdp::comm::detail
