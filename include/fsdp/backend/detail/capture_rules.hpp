#pragma once
// What a backend refuses while a step is captured (begin_capture() to end_capture()), and why: one sentence each,
// said the same way by backend::host and backend::cuda.
#include <algorithm>
#include <string_view>
#include <vector>

#include "fsdp/core/error.hpp"

namespace fsdp::backend::detail::capture_rules {

inline constexpr std::string_view second_begin = "a capture is already under way; end_capture() it first";
inline constexpr std::string_view replay_inside =
    "a replay inside a capture is not recorded; replay after end_capture()";
inline constexpr std::string_view event_query =
    "an event query inside a captured step asks about the capture, not about a replay; ask after end_capture()";
inline constexpr std::string_view host_wait =
    "a captured step's work runs only when it is replayed, and nothing in it may wait on the host; synchronize after "
    "end_capture() or after a replay";
inline constexpr std::string_view memory_taken =
    "memory taken inside a captured step lies outside the plan (on a GPU, a graph allocation beside the pool the plan "
    "reserved); take it before the capture (an eager step first makes the step's slots)";
inline constexpr std::string_view memory_given_back =
    "memory given back inside a captured step would be given back at every replay; give it back after end_capture()";
inline constexpr std::string_view pageable_copy =
    "such a copy waits on the host for its stream (cudaMemcpyAsync from or to pageable memory); copy through "
    "allocate_host() memory";

/// The events recorded since begin_capture(). A wait on one of them belongs in the capture; a wait on any other
/// event (its last record came before the capture) is dropped: a replay follows all work issued before it.
template <class Event>
class captured_events {
 public:
  void recorded(Event e) {
    if (!in_capture(e)) events_.push_back(e);
  }
  bool in_capture(Event e) const { return std::find(events_.begin(), events_.end(), e) != events_.end(); }
  const std::vector<Event>& all() const noexcept { return events_; }
  void clear() noexcept { events_.clear(); }

 private:
  std::vector<Event> events_;
};

/// usage_error: "backend::NAME on rank R: CALL while a step is captured (begin_capture() to end_capture()): WHY".
[[noreturn]] inline void refuse(std::string_view backend, int rank, std::string_view call, std::string_view why) {
  fsdp::detail::fail_usage("backend::", backend, " on rank ", rank, ": ", call,
                           " while a step is captured (begin_capture() to end_capture()): ", why);
}

}  // namespace fsdp::backend::detail::capture_rules
