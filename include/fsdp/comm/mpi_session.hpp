#pragma once
// comm::mpi's session (fsdp/comm/mpi.hpp): MPI initialised with MPI_THREAD_MULTIPLE for the length of a program.
// Not included by <fsdp/fsdp.hpp>: it needs MPI's headers.
#include <mpi.h>

#include <atomic>

#include "fsdp/comm/detail/mpi_group.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm {

/// MPI for the length of a program: MPI_Init_thread with MPI_THREAD_MULTIPLE on construction (a usage_error when
/// the library cannot provide it, or MPI is already initialised), MPI_Finalize on destruction. Create it first in
/// main; destroy every communicator and Model before it.
///
/// After a comm::mpi collective of this process has failed, the destructor does not call MPI_Finalize: Open MPI's
/// MPI_Finalize waits (a PMIx fence, with no time limit) for every process of the job, and a peer that died never
/// comes (seen with Open MPI 4.1.4 under mpirun --enable-recovery: survivors stuck in MPI_Finalize about one run in
/// three). The process then ends without finalising: under plain mpirun that ends the whole job with an error, as a
/// failed collective should; under --enable-recovery the other processes run on.
class mpi_session {
 public:
  mpi_session() : mpi_session(nullptr, nullptr) {}
  mpi_session(int& argc, char**& argv) : mpi_session(&argc, &argv) {}
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !finalize_skipped()) MPI_Finalize();
  }

  /// Whether the destructor will skip MPI_Finalize because a collective of this process failed.
  static bool finalize_skipped() noexcept { return detail::failed_in_process().load(std::memory_order_acquire); }

  /// This process's rank in MPI_COMM_WORLD and the world size.
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_; }

 private:
  mpi_session(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized)
      fsdp::detail::fail_usage(
          "mpi_session: MPI is already initialised; create one mpi_session at the start of main "
          "and no other MPI_Init");
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      fsdp::detail::fail_usage("mpi_session: MPI_Init_thread failed: ", detail::error_string(rc),
                               "; start the program with mpirun");
    if (provided != MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      fsdp::detail::fail_usage("mpi_session: this MPI library provides only ", detail::thread_level_name(provided),
                               ", and comm::mpi needs MPI_THREAD_MULTIPLE; use an MPI built with thread support "
                               "(Open MPI: --enable-mpi-thread-multiple, the default since 3.0; `ompi_info | grep "
                               "THREAD_MULTIPLE` shows it)");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
  }

  int rank_ = 0;
  int world_ = 1;
};

}  // namespace fsdp::comm
