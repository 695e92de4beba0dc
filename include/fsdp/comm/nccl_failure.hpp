#pragma once
// What comm::nccl does with its communicators when NCCL reports a failure (nccl_options::on_failure,
// fsdp/comm/nccl.cuh), public and host-compilable: the decisions over it are made in fsdp/comm/detail/nccl_logic.hpp.

namespace fsdp::comm {

/// On a failure (an asynchronous error, a call that fails, a wait past the timeout), every communicator of the
/// group's family (the world and the groups split from it) is
///
///   abort    ended with ncclCommAbort (the default): every pending and later operation fails; after a lost rank,
///            every rank restarts from the last checkpoint.
///   revoke   stopped with ncclCommRevoke (NCCL 2.28.7 or later; refused at construction below): every pending and
///            later collective fails alike, but the communicators stay, so that the survivors can make one of their
///            own with nccl_communicator::shrink (ncclCommShrink) and train on (docs/reliability.md).
enum class nccl_failure { abort, revoke };

}  // namespace fsdp::comm
