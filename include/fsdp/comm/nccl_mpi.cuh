#pragma once
// comm::nccl over MPI: rank, world and local rank from an MPI communicator (the device from them as in from_env:
// choose_device, launch.hpp), rank 0's NCCL unique id broadcast with MPI_Bcast. Needs <mpi.h> (link with MPI; in
// Bazel, @mpi//:mpi). MPI must be initialised by the caller.
#include <mpi.h>

#include "fsdp/comm/nccl.cuh"

namespace fsdp::comm {

inline nccl_communicator nccl_from_mpi(MPI_Comm world_comm = MPI_COMM_WORLD, nccl_options opt = {}) {
  auto check = [](int rc, const char* call) {
    if (rc != MPI_SUCCESS) throw comm_error(fsdp::detail::cat(call, " failed with MPI error ", rc));
  };
  int rank = 0, world = 0, local = 0;
  check(MPI_Comm_rank(world_comm, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(world_comm, &world), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(world_comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  check(MPI_Comm_rank(node, &local), "MPI_Comm_rank(node)");
  MPI_Comm_free(&node);
  const int device = nccl::visible_device(rank, opt.backend.device, local, "node-local rank from MPI_Comm_split_type");
  ncclUniqueId id{};
  if (rank == 0) FSDP_NCCL_CHECK(ncclGetUniqueId(&id));
  check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world_comm), "MPI_Bcast(ncclUniqueId)");
  return nccl_communicator(rank, world, device, id, std::move(opt));
}

}  // namespace fsdp::comm
