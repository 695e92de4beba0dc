#pragma once
// What a backend refuses while a step is captured (begin_capture() to end_capture()), and why: one sentence each,
// said the same way by backend::host and backend::cuda.
#include <string_view>

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

/// usage_error: "backend::NAME on rank R: CALL while a step is captured (begin_capture() to end_capture()): WHY".
[[noreturn]] inline void refuse(std::string_view backend, int rank, std::string_view call, std::string_view why) {
  fsdp::detail::fail_usage("backend::", backend, " on rank ", rank, ": ", call,
                           " while a step is captured (begin_capture() to end_capture()): ", why);
}

}  // namespace fsdp::backend::detail::capture_rules
