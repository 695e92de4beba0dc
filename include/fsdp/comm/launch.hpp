#pragma once
// Where a process sits in a multi-process job, and how its ranks meet before NCCL exists. Host-only (no CUDA):
// comm::nccl builds on it, and it is tested on machines without a GPU.
//
// launch_env::read() takes rank, world size and local rank from the first launcher convention that is complete:
//   torchrun            RANK, WORLD_SIZE, LOCAL_RANK
//   Open MPI's mpirun   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   MPICH / Hydra       PMI_RANK, PMI_SIZE, MPI_LOCALRANKID
//   Slurm's srun        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// choose_device picks a rank's GPU from the local rank and the devices visible to it. file_rendezvous publishes
// rank 0's bytes (the NCCL unique id) through files on a path every rank sees, never trusting a file left by an
// earlier launch.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm {

struct launch_env {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string source;  ///< which convention gave the values ("torchrun", "mpirun", ...)
  std::string local_rank_var;  ///< the variable the local rank came from ("LOCAL_RANK", ...)

  using lookup = std::function<const char*(const char*)>;

  std::string world_var;        ///< the variable the world size came from ("WORLD_SIZE", ...)

  /// Reads the environment (or `get`, for tests). Throws usage_error naming the variable at fault: a value that
  /// is not an integer, a rank outside [0, world), a convention only partly set, or none set at all.
  static launch_env read(const lookup& get = [](const char* k) { return std::getenv(k); });

  /// As read(), but no launcher variables at all is not an error: nullopt.
  static std::optional<launch_env> find(const lookup& get = [](const char* k) { return std::getenv(k); });

 private:
  struct convention {
    const char* name;
    const char* rank;
    const char* world;
    const char* local;
  };
  static constexpr convention conventions[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
  };

  static int parse(const char* var, const char* text);
};

/// Why comm::mpi must not run in this process, or "" when it may. MPI sees a world of `mpi_world`; a launcher whose
/// variables say this process is one of several while MPI sees a world of one started processes that each
/// initialised MPI alone (torchrun; srun without a process-management interface this MPI library can use; a
/// script), and each would train alone. MPI's own launchers (OMPI_COMM_WORLD_SIZE, PMI_SIZE set) are believed.
FSDP_DECL std::string mpi_launch_mismatch(int mpi_world,
                                          const launch_env::lookup& get = [](const char* k) { return std::getenv(k); });

/// The CUDA device of a rank that was not given one explicitly, from what the launcher left it:
///   - `explicit_device` >= 0 (nccl_options::backend.device): that device, which must be one of the `visible` ones;
///   - one visible device: device 0, whatever the local rank. The launcher gave each rank its own GPU (srun
///     --gpus-per-task=1 or --gpu-bind, mpirun with a per-rank CUDA_VISIBLE_DEVICES, a wrapper script), and CUDA
///     numbers the visible devices from 0;
///   - several visible devices: the local rank, as torchrun's documentation has workers do
///     (torch.cuda.set_device(LOCAL_RANK)); a local rank beyond the visible devices is an error (more ranks on this
///     node than devices they can see), never a silent wrap-around onto a GPU another rank already uses (NCCL
///     refuses two ranks of a communicator on one GPU);
///   - no visible device: an error.
/// `local_rank_from` says where the local rank came from ("LOCAL_RANK (torchrun)"); `cuda_visible_devices` is the
/// variable's value (nullptr: not set). Both only serve the messages.
FSDP_DECL int choose_device(int rank, int explicit_device, int local_rank, std::string_view local_rank_from,
                            int visible, const char* cuda_visible_devices);

/// How long a file rendezvous waits between two passes over its files: 5 ms at first, twice as long after each pass,
/// at most 500 ms. A rank that arrives early finds the others within a few passes; a rank that waits long (rank 0
/// reading up to world - 1 acknowledgements a pass, every other rank two files) does not read them every 5 ms: at
/// 1024 ranks on a shared filesystem that was about 200,000 file opens a second, for as long as the slowest rank
/// took to start; with this, at most about 4,000 once every wait has reached 500 ms.
class poll_backoff {
 public:
  static constexpr std::chrono::milliseconds first{5};
  static constexpr std::chrono::milliseconds longest{500};
  /// The wait before the next pass (at least 1 ms), never past `deadline` by more than that.
  std::chrono::milliseconds next(std::chrono::steady_clock::time_point now,
                                 std::chrono::steady_clock::time_point deadline) noexcept {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    const std::chrono::milliseconds d = std::max(std::chrono::milliseconds(1), std::min(delay_, left));
    delay_ = std::min(delay_ * 2, longest);
    return d;
  }

 private:
  std::chrono::milliseconds delay_ = first;
};

/// Rank 0 publishes a small blob (the NCCL unique id) through files on a path every rank sees; the others fetch it.
///
/// A file is trusted only once rank 0 of this launch has confirmed it to the reader, so that a file left by an
/// earlier launch that crashed (same path, same or empty job id) is never used, whatever the launcher:
///   1. rank 0 removes whatever an earlier launch left (PATH, PATH.go, PATH.ack.<rank>), then writes PATH atomically
///      (a temporary file renamed over it): a header with the world size, the job id and a fresh random token, then
///      the blob;
///   2. every other rank reads PATH and answers with PATH.ack.<rank>: the token it read and a fresh random nonce of
///      its own. A rank that started before rank 0 may read a stale PATH and acknowledge a stale token; when PATH
///      changes, it acknowledges the new token;
///   3. once every rank has acknowledged rank 0's token, rank 0 writes PATH.go: its token and every rank's nonce;
///   4. a rank accepts the blob only when PATH.go carries the token it acknowledged and its own nonce. Its nonce is
///      new in this launch, so no file of an earlier launch can carry it.
/// No clock, process id or launcher variable is compared, so clock skew between nodes and job ids that repeat
/// (torchrun's default run id, an unset FSDP_RUN_ID) do not matter. The job id still keeps apart two jobs that
/// share a path one after the other; two launches that use one path at the same time are not supported.
/// Rank 0 removes the files once every rank has joined (remove()); all waits are bounded by a timeout, and each
/// rank reads its files less and less often while it waits (poll_backoff).
class file_rendezvous {
 public:
  /// `rank` of `world` ranks; `job` identifies the job (FSDP_RUN_ID, SLURM_JOB_ID or TORCHELASTIC_RUN_ID by
  /// default): files written under another job id are ignored.
  file_rendezvous(std::filesystem::path path, int world, int rank, std::string job = default_job());

  static std::string default_job();

  /// Rank 0: replaces any earlier files, publishes `blob`, and returns once every other rank has acknowledged it
  /// (at most `timeout`; then comm_error names the ranks that did not).
  void publish(const std::vector<char>& blob, std::chrono::milliseconds timeout) const;

  /// Other ranks: waits up to `timeout` until rank 0 of this launch has confirmed a blob of `size` bytes to this
  /// rank, and returns it.
  std::vector<char> fetch(std::size_t size, std::chrono::milliseconds timeout) const;

  /// Rank 0, once every rank has joined (or before publishing): removes the files of the rendezvous.
  void remove() const noexcept;

  const std::filesystem::path& path() const noexcept { return path_; }
  /// Files this rank has read so far (each pass reads the id file, the acknowledgements still missing, or the
  /// confirmation): what a shared filesystem serves it.
  std::size_t files_read() const noexcept { return reads_; }

 private:
  std::string id_header(std::string_view token) const;
  std::string ack_prefix(int rank, std::string_view token) const;
  std::string go_header(std::string_view token) const;
  std::filesystem::path ack_path(int rank) const;
  std::filesystem::path go_path() const;

  /// 128 random bits in hex: a token (rank 0) or a nonce (other ranks), new in every launch.
  static std::string random_hex();

  /// The whole file, or "" when it does not exist (yet); counted in files_read().
  std::string read_file(const std::filesystem::path& p) const;

  /// Writes a temporary file next to `p` and renames it over `p`, so that a reader sees all of it or nothing.
  static void write_atomically(const std::filesystem::path& p, const std::string& content);

  std::filesystem::path path_;
  int world_;
  int rank_;
  std::string job_;
  mutable std::size_t reads_ = 0;
};

}  // namespace fsdp::comm

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/comm/launch.ipp"
#endif
