#pragma once
// Where a process sits in a multi-process job, and how its ranks meet before NCCL exists. Host-only (no CUDA):
// comm::nccl builds on it, and it is tested on machines without a GPU.
//
// launch_env::read() takes rank, world size and local rank from the first launcher convention that is complete:
//   torchrun            RANK, WORLD_SIZE, LOCAL_RANK
//   Open MPI's mpirun   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   MPICH / Hydra       PMI_RANK, PMI_SIZE, MPI_LOCALRANKID
//   Slurm's srun        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// file_rendezvous publishes rank 0's bytes (the NCCL unique id) through a file on a path every rank sees.
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>

#include "fsdp/core/error.hpp"

namespace fsdp::comm {

struct launch_env {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string source;  ///< which convention gave the values ("torchrun", "mpirun", ...)

  using lookup = std::function<const char*(const char*)>;

  /// Reads the environment (or `get`, for tests). Throws usage_error naming the variable at fault: a value that
  /// is not an integer, a rank outside [0, world), a convention only partly set, or none set at all.
  static launch_env read(const lookup& get = [](const char* k) { return std::getenv(k); }) {
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
    std::string tried;
    for (const convention& c : conventions) {
      const char* r = get(c.rank);
      const char* w = get(c.world);
      const char* l = get(c.local);
      if (!r && !w && !l) {
        tried += fsdp::detail::cat(tried.empty() ? "" : "; ", c.rank, "/", c.world, "/", c.local, " (", c.name, ")");
        continue;
      }
      if (!r || !w || !l) {
        const char* missing = !r ? c.rank : !w ? c.world : c.local;
        fsdp::detail::fail_usage("launch environment (", c.name, "): ", missing, " is not set while ",
                           r ? c.rank : w ? c.world : c.local, " is; set all of ", c.rank, ", ", c.world, " and ",
                           c.local);
      }
      launch_env e;
      e.rank = parse(c.rank, r);
      e.world = parse(c.world, w);
      e.local_rank = parse(c.local, l);
      e.source = c.name;
      if (e.world <= 0) fsdp::detail::fail_usage("launch environment (", c.name, "): ", c.world, "=", w, " must be positive");
      if (e.rank < 0 || e.rank >= e.world)
        fsdp::detail::fail_usage("launch environment (", c.name, "): ", c.rank, "=", r, " is outside [0, ", c.world, "=",
                           e.world, ")");
      if (e.local_rank < 0)
        fsdp::detail::fail_usage("launch environment (", c.name, "): ", c.local, "=", l, " must not be negative");
      return e;
    }
    fsdp::detail::fail_usage("launch environment: no launcher variables found (tried ", tried,
                       "); start the program with torchrun, mpirun or srun, or set RANK, WORLD_SIZE and LOCAL_RANK");
  }

 private:
  static int parse(const char* var, const char* text) {
    int v = 0;
    const std::string_view s(text);
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || end != s.data() + s.size() || s.empty())
      fsdp::detail::fail_usage("launch environment: ", var, "='", text, "' is not an integer");
    return v;
  }
};

/// Rank 0 publishes a small blob through a file; the other ranks wait for it. The file holds a header (a magic
/// word, the world size, a job id) so that a file left by another job is recognised rather than trusted.
class file_rendezvous {
 public:
  /// `job` identifies this launch (FSDP_RUN_ID, SLURM_JOB_ID or TORCHELASTIC_RUN_ID by default): a file written
  /// under another job id is ignored until rank 0 of this job replaces it.
  file_rendezvous(std::filesystem::path path, int world, std::string job = default_job())
      : path_(std::move(path)), world_(world), job_(std::move(job)) {
    if (path_.empty()) fsdp::detail::fail_usage("file rendezvous: empty path (set FSDP_RENDEZVOUS_FILE or nccl_options::rendezvous_file)");
  }

  static std::string default_job() {
    for (const char* k : {"FSDP_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"})
      if (const char* v = std::getenv(k)) return v;
    return {};
  }

  /// Rank 0: writes the blob atomically (a temporary file renamed over the path).
  void publish(const std::vector<char>& blob) const {
    const std::filesystem::path tmp = path_.string() + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) fsdp::detail::fail_usage("file rendezvous: cannot write '", tmp.string(), "': ", std::strerror(errno));
      out << header() << '\n';
      out.write(blob.data(), static_cast<std::streamsize>(blob.size()));
      if (!out.flush()) fsdp::detail::fail_usage("file rendezvous: writing '", tmp.string(), "' failed");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path_, ec);
    if (ec) fsdp::detail::fail_usage("file rendezvous: cannot rename '", tmp.string(), "' to '", path_.string(), "': ", ec.message());
  }

  /// Other ranks: waits up to `timeout` for a file of this job holding `size` bytes, and returns them.
  std::vector<char> fetch(std::size_t size, std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string seen = "no file";
    for (;;) {
      std::ifstream in(path_, std::ios::binary);
      if (in) {
        std::string head;
        std::getline(in, head);
        std::vector<char> blob(size);
        in.read(blob.data(), static_cast<std::streamsize>(size));
        if (head == header() && static_cast<std::size_t>(in.gcount()) == size) return blob;
        seen = "a file with header '" + head + "' (expected '" + header() + "')";
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw comm_error(fsdp::detail::cat("file rendezvous: '", path_.string(), "' had no id from rank 0 of this job after ",
                                     timeout.count(), " ms (found ", seen,
                                     "); is rank 0 running, and does every rank see the same path?"));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  /// Rank 0, once every rank has joined: the file is no longer needed.
  void remove() const noexcept {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::string header() const { return fsdp::detail::cat("fsdp-rendezvous v1 world=", world_, " job=", job_); }

  std::filesystem::path path_;
  int world_;
  std::string job_;
};

}  // namespace fsdp::comm
