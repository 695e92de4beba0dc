#pragma once
// Ranks as threads of one process: one thread a rank, started in order and joined before the call returns, the
// first failure rethrown. comm::run_local (comm::local's groups) and comm::run_nccl_threads (one NCCL world, one
// communicator a thread) run their ranks through it; what a failure does to the other ranks is theirs to say
// (thread_ranks_hooks). Host-only.
#include <functional>
#include <string>

#include "fsdp/core/config.hpp"

namespace fsdp::comm::detail {

/// What the ranks' world does when one of them fails or cannot start.
struct thread_ranks_hooks {
  /// The world's size, for the message of a rank whose thread cannot start.
  int size = 0;
  /// Stops the other ranks (comm::local: aborts the group, so that their waits fail at once), with the reason; must
  /// not throw. Empty: nothing can stop them (NCCL's calls of another thread), they end at their timeout.
  std::function<void(const std::string&)> stop;
  /// Whether the ranks were stopped already: a rank that fails then saw the stop, and its error is not the root
  /// cause. Empty: never (the first error is the root cause).
  std::function<bool()> stopped;
  /// Rank r has ended, returning or throwing (comm::local marks it gone: its peers' waits for it fail at once).
  std::function<void(int)> returned;
  /// What happens to the ranks already started when another cannot start, for the message ("were stopped").
  std::string started_then = "were stopped";
};

/// Runs rank(r) for r in [from, from + world), each on a thread of its own, and joins them. A rank that throws
/// stops the others (hooks.stop, with "rank r failed: <what>"), and once every rank has ended the root cause is
/// rethrown: the first error of a rank that did not merely see the stop. A rank whose thread cannot be started
/// (the system refuses one, or memory for its state runs out) stops and joins the ranks started, then throws a
/// comm_error naming the rank, the reason and what to raise.
FSDP_DECL void run_thread_ranks(int world, int from, const std::function<void(int)>& rank,
                                const thread_ranks_hooks& hooks);

}  // namespace fsdp::comm::detail

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/comm/detail/thread_ranks.ipp"
#endif
