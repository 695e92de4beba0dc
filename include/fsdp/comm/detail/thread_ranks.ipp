#pragma once
// Definitions of fsdp/comm/detail/thread_ranks.hpp; fsdp/src.hpp compiles them once in separate mode.
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/comm/detail/thread_ranks.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

/// The reason a rank's failure stops its world with. Never throws: where memory for the sentence ran out, a shorter
/// one that needs none.
inline std::string rank_failure(int r, const char* what) noexcept {
  try {
    return "rank " + std::to_string(r) + " failed: " + what;
  } catch (const std::bad_alloc&) {
    return "out of memory";  // short enough for the string's own storage: no allocation
  }
}

FSDP_DECL void run_thread_ranks(int world, int from, const std::function<void(int)>& rank,
                                const thread_ranks_hooks& hooks) {
  std::mutex mu;
  std::exception_ptr first;
  bool first_saw_stop = true;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world));
  // What stops the started ranks when another cannot start, made while memory is had: the stop needs no more.
  const std::string not_started = "a rank's thread could not start: the world is stopped";
  const auto failed = [&](int r, const char* what) {
    const bool stopped_before = hooks.stopped && hooks.stopped();
    if (hooks.stop) hooks.stop(rank_failure(r, what));
    if (hooks.returned) hooks.returned(r);  // a failed rank, as one that returns: the survivors' shrink() leaves it out
    std::lock_guard lk(mu);
    // Prefer the root cause over errors of ranks that only saw the stop.
    if (!first || (first_saw_stop && !stopped_before)) {
      first = std::current_exception();
      first_saw_stop = stopped_before;
    }
  };
  for (int r = from; r < from + world; ++r) {
    try {
      threads.emplace_back([&, r] {
        try {
          rank(r);
          if (hooks.returned) hooks.returned(r);  // anything still waiting for this rank fails now, naming it
        } catch (const std::exception& e) {
          failed(r, e.what());
        } catch (...) {
          failed(r, "a non-standard exception");
        }
      });
    } catch (const std::exception& e) {
      // No thread for rank r: the system refused one (std::system_error), or memory for its state ran out
      // (std::bad_alloc). Stop the ranks started and join them (their stacks are given back), then say why.
      if (hooks.stop) hooks.stop(not_started);
      for (auto& t : threads) t.join();
      throw comm_error(fsdp::detail::cat(
          "could not start the thread of rank ", r, " of ", hooks.size, " (", e.what(), "); the ", r - from,
          " rank(s) already started ", hooks.started_then,
          ". Lower the world size or raise the process's thread or address-space limit (ulimit -u / -v)"));
    }
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace fsdp::comm::detail
