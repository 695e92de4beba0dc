#pragma once
// comm::nccl's version gates, each one decision over NCCL_VERSION_CODE (and the environment it reads): whether
// nccl_channels::per_stream, nccl_failure::revoke with shrink(), growing a communicator, and several ranks on one
// GPU can be used with the NCCL a program runs with, and the refusal that says why not. nccl_core (nccl_logic.hpp) and
// comm::nccl (nccl.cuh) ask these; tests/comm/nccl_logic_test.cc holds each to its versions
// (tests/comm/launch_test.cc the multi-rank one). Host-only.
#include <string>
#include <string_view>

#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

/// "2.28.3" from NCCL_VERSION_CODE 22803.
inline std::string nccl_version_name(int version_code) {
  return fsdp::detail::cat(version_code / 10000, ".", version_code / 100 % 100, ".", version_code % 100);
}

/// Why nccl_channels::per_stream cannot be used with NCCL `version_code` (NCCL_VERSION_CODE, e.g. 22809 for 2.28.9)
/// and this value of $NCCL_LAUNCH_ORDER_IMPLICIT (null: unset); empty when it can.
inline std::string per_stream_refusal(int version_code, const char* launch_order_implicit) {
  if (version_code < 22600)
    return fsdp::detail::cat(
        "comm::nccl: nccl_channels::per_stream needs NCCL 2.26 or later (NCCL_LAUNCH_ORDER_IMPLICIT "
        "orders the launches of its communicators), but this NCCL is ",
        nccl_version_name(version_code), "; use nccl_channels::one (the default)");
  if (!launch_order_implicit || std::string_view(launch_order_implicit) != "1")
    return fsdp::detail::cat(
        "comm::nccl: nccl_channels::per_stream issues collectives on several communicators at "
        "once, which NCCL runs in one order on every rank only with NCCL_LAUNCH_ORDER_IMPLICIT=1 "
        "(it is ",
        launch_order_implicit ? fsdp::detail::cat("'", launch_order_implicit, "'") : std::string("unset"),
        "): set it on every rank before the first NCCL call, or use nccl_channels::one (the "
        "default)");
  return {};
}

/// Why nccl_failure::revoke and shrink() cannot be used with NCCL `version_code`; empty when they can.
inline std::string shrink_refusal(int version_code) {
  if (version_code >= 22807) return {};
  return fsdp::detail::cat(
      "comm::nccl: nccl_failure::revoke and shrink() need ncclCommRevoke and ncclCommShrink (NCCL 2.28.7 or later), "
      "but this NCCL is ",
      nccl_version_name(version_code),
      ": use nccl_failure::abort (the default) and restart every rank from the last checkpoint after a lost rank, or "
      "run with NCCL 2.28.7 or later");
}

/// Why a comm::nccl communicator cannot take newcomers with NCCL `version_code` (always: growing is not built).
inline std::string grow_refusal(int version_code) {
  if (version_code < 22902)
    return fsdp::detail::cat(
        "comm::nccl: growing a communicator needs ncclCommGrow (NCCL 2.29.2 or later), but this "
        "NCCL is ",
        nccl_version_name(version_code), ": replacements join at a restart of every rank from the last checkpoint");
  return fsdp::detail::cat("comm::nccl: growing a communicator (ncclCommGrow, in this NCCL ",
                           nccl_version_name(version_code),
                           ") is not built yet: replacements join at a restart of every rank from the last checkpoint");
}

/// Why ranks `a` and `b` cannot share device `device` in one NCCL world with NCCL `version_code` and this value of
/// $NCCL_MULTI_RANK_GPU_ENABLE (null: unset); empty when they can. NCCL up to 2.29 refuses several ranks on one GPU
/// ("Duplicate GPU detected"); 2.30 allows it only with NCCL_MULTI_RANK_GPU_ENABLE=1. Such a world proves
/// correctness, not speed: its ranks share the GPU's SMs and memory bandwidth.
inline std::string multi_rank_gpu_refusal(int version_code, const char* multi_rank_gpu_enable, int a, int b,
                                          int device) {
  if (version_code < 23000)
    return fsdp::detail::cat("comm::nccl: ranks ", a, " and ", b, " are both on device ", device,
                             ": several ranks on one GPU need NCCL 2.30 or later (with NCCL_MULTI_RANK_GPU_ENABLE=1), "
                             "but this NCCL is ",
                             nccl_version_name(version_code),
                             ", which refuses them; give each rank a device of its own, or load NCCL 2.30 or later");
  if (!multi_rank_gpu_enable || std::string_view(multi_rank_gpu_enable) != "1")
    return fsdp::detail::cat(
        "comm::nccl: ranks ", a, " and ", b, " are both on device ", device, ": NCCL ", nccl_version_name(version_code),
        " allows several ranks on one GPU only with NCCL_MULTI_RANK_GPU_ENABLE=1 (it is ",
        multi_rank_gpu_enable ? fsdp::detail::cat("'", multi_rank_gpu_enable, "'") : std::string("unset"),
        "): set it before the first NCCL call, or give each rank a device of its own");
  return {};
}

}  // namespace fsdp::comm::detail
