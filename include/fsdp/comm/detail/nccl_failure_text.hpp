#pragma once
// How comm::nccl tells of a failure, one sentence per kind: what a failure did to the communicators (aborted, or
// revoked under nccl_failure::revoke) and what to do then, an NCCL error with the collectives pending, a grouped()
// that was abandoned, and the lines logged at shutdown. nccl_core (nccl_logic.hpp) decides when; these say it.
// tests/comm/nccl_logic_test.cc compares each message whole. Host-only.
#include <cstddef>
#include <string>
#include <string_view>

#include "fsdp/comm/nccl_failure.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

/// Who is speaking: the group's name, this rank and the group's size ("comm::nccl on rank 2 of 4").
struct nccl_speaker {
  std::string_view name;
  int rank = 0;
  int world = 0;
};

/// How a failure left the communicators: "aborted" or "revoked".
inline const char* nccl_ended(bool revoked) noexcept { return revoked ? "revoked" : "aborted"; }

/// What a failure is about to do, and what then: " aborted (<cause>; <advice>)", or under nccl_failure::revoke
/// " revoked (<cause>; the survivors name the ranks that failed and call shrink())".
inline std::string nccl_ending(nccl_failure on_failure, const char* cause, const char* advice = nullptr) {
  return on_failure == nccl_failure::revoke
             ? fsdp::detail::cat(" revoked (", cause, "; the survivors name the ranks that failed and call shrink())")
             : fsdp::detail::cat(" aborted (", cause, advice ? "; " : "", advice ? advice : "", ")");
}

/// An NCCL failure (`described`: the result as Api::describe says it) during `during` (empty: an asynchronous
/// error), with the collectives pending on the family.
inline std::string nccl_failure_message(const nccl_speaker& who, nccl_failure on_failure, std::string_view described,
                                        std::string_view during, std::string_view pending) {
  return fsdp::detail::cat(
      "NCCL reported ", described, " on rank ", who.rank, " of ", who.world,
      during.empty() ? std::string() : fsdp::detail::cat(" during ", during), "; pending: ", pending, "; ", who.name,
      " on rank ", who.rank, " of ", who.world,
      on_failure == nccl_failure::revoke
          ? std::string(" revoked (NCCL_DEBUG=WARN on every rank shows which peer or resource failed; the survivors "
                        "name the ranks that failed and call shrink())")
          : std::string(" aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource "
                        "failed)"));
}

/// A wait that ran out of time (`what`), with the collectives pending.
inline std::string nccl_timeout_message(const nccl_speaker& who, nccl_failure on_failure, std::string_view what,
                                        std::string_view pending) {
  return fsdp::detail::cat(
      what, "; pending: ", pending, "; ", who.name, " on rank ", who.rank, " of ", who.world,
      nccl_ending(on_failure, "a rank that died or issued a different collective sequence leaves the others waiting"));
}

/// grouped() abandoned: its function threw `why` after `queued` (the collectives' names, `n` of them) were queued.
inline std::string nccl_abandoned_group_message(const nccl_speaker& who, nccl_failure on_failure, std::size_t n,
                                                std::string_view queued, std::string_view why) {
  return fsdp::detail::cat(
      who.name, " on rank ", who.rank, " of ", who.world, ": grouped() abandoned after ", n, " queued collective",
      n == 1 ? "" : "s", n ? fsdp::detail::cat(" (", queued, ")") : std::string(), " because its function threw: ", why,
      "; the group was not launched and the communicator was",
      nccl_ending(on_failure, "the other ranks fail at their timeout", "restart every rank"));
}

/// What shutdown and the failure paths log (one line each; `described`: a result as Api::describe says it).
inline std::string nccl_finalize_timeout_log(const nccl_speaker& who, long long timeout_ms) {
  return fsdp::detail::cat("fsdp: ", who.name, " on rank ", who.rank, " of ", who.world,
                           ": ncclCommFinalize did not complete within ", timeout_ms,
                           " ms at shutdown (a rank that exited without finalizing, or still has collectives "
                           "to run, keeps the others waiting); the communicator was aborted instead of destroyed");
}
inline std::string nccl_finalize_error_log(const nccl_speaker& who, std::string_view described) {
  return fsdp::detail::cat("fsdp: ", who.name, " on rank ", who.rank, " of ", who.world, ": ncclCommFinalize reported ",
                           described, " at shutdown; the communicator was aborted instead of destroyed");
}
inline std::string nccl_call_log(const nccl_speaker& who, std::string_view call, std::string_view described,
                                 std::string_view then = {}) {
  return fsdp::detail::cat("fsdp: ", who.name, " on rank ", who.rank, " of ", who.world, ": ", call, " reported ",
                           described, then);
}

}  // namespace fsdp::comm::detail
