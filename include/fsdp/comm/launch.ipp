#pragma once
// The launch environment's and the file rendezvous' definitions (fsdp/comm/launch.hpp): included by that header,
// or compiled once by fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>
#include <utility>

#include <unistd.h>

#include "fsdp/comm/launch.hpp"

namespace fsdp::comm {

FSDP_DECL launch_env launch_env::read(const lookup& get) {
  if (std::optional<launch_env> e = find(get)) return *std::move(e);
  std::string tried;
  for (const convention& c : conventions)
    tried += fsdp::detail::cat(tried.empty() ? "" : "; ", c.rank, "/", c.world, "/", c.local, " (", c.name, ")");
  fsdp::detail::fail_usage("launch environment: no launcher variables found (tried ", tried,
                     "); start the program with torchrun, mpirun or srun, or set RANK, WORLD_SIZE and LOCAL_RANK");
}

FSDP_DECL std::optional<launch_env> launch_env::find(const lookup& get) {
  for (const convention& c : conventions) {
    const char* r = get(c.rank);
    const char* w = get(c.world);
    const char* l = get(c.local);
    if (!r && !w && !l) continue;
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
    e.local_rank_var = c.local;
    e.world_var = c.world;
    if (e.world <= 0)
      fsdp::detail::fail_usage("launch environment (", c.name, "): ", c.world, "=", w, " must be positive");
    if (e.rank < 0 || e.rank >= e.world)
      fsdp::detail::fail_usage("launch environment (", c.name, "): ", c.rank, "=", r, " is outside [0, ", c.world, "=",
                         e.world, ")");
    if (e.local_rank < 0)
      fsdp::detail::fail_usage("launch environment (", c.name, "): ", c.local, "=", l, " must not be negative");
    return e;
  }
  return std::nullopt;
}

FSDP_DECL int launch_env::parse(const char* var, const char* text) {
  int v = 0;
  const std::string_view s(text);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || s.empty())
    fsdp::detail::fail_usage("launch environment: ", var, "='", text, "' is not an integer");
  return v;
}

FSDP_DECL std::string mpi_launch_mismatch(int mpi_world, const launch_env::lookup& get) {
  if (mpi_world != 1 || get("OMPI_COMM_WORLD_SIZE") || get("PMI_SIZE")) return {};
  const std::optional<launch_env> e = launch_env::find(get);
  if (!e || e->world <= 1) return {};
  const std::string head = fsdp::detail::cat("comm::mpi: ", e->world_var, "=", e->world, " (", e->source,
                                             ") says this process is one of several, but MPI sees a world of 1: ");
  if (e->source == "srun")
    return head + fsdp::detail::cat(
                      "srun started it without a process-management interface this MPI library can use, so every "
                      "process initialised MPI alone. Start it with srun --mpi=pmix (an MPI built with PMIx support; "
                      "srun --mpi=list shows what Slurm offers), or with mpirun -np ",
                      e->world);
  return head + fsdp::detail::cat(
                    "without MPI's launcher every process initialises MPI alone. Start the program with "
                    "mpirun -np ",
                    e->world, " (comm::mpi needs MPI's own launcher), or use comm::nccl with ", e->source);
}

FSDP_DECL int choose_device(int rank, int explicit_device, int local_rank, std::string_view local_rank_from,
                            int visible, const char* cuda_visible_devices) {
  const std::string vis = cuda_visible_devices ? fsdp::detail::cat("CUDA_VISIBLE_DEVICES='", cuda_visible_devices, "'")
                                               : std::string("CUDA_VISIBLE_DEVICES is not set");
  const auto devices = [](int n) { return fsdp::detail::cat(n, n == 1 ? " CUDA device is" : " CUDA devices are"); };
  if (visible <= 0)
    fsdp::detail::fail_usage("comm::nccl on rank ", rank, ": no CUDA device is visible to this process (", vis,
                             "); run it where a GPU is, and check what the launcher puts in CUDA_VISIBLE_DEVICES");
  if (explicit_device >= 0) {
    if (explicit_device >= visible)
      fsdp::detail::fail_usage("comm::nccl on rank ", rank, ": nccl_options::backend.device is ", explicit_device,
                               " but only ", devices(visible), " visible to this process (", vis,
                               "); CUDA numbers the visible devices from 0");
    return explicit_device;
  }
  if (visible == 1) return 0;
  if (local_rank >= visible)
    fsdp::detail::fail_usage("comm::nccl on rank ", rank, ": local rank ", local_rank, " (", local_rank_from,
                             ") but only ", devices(visible), " visible to this process (", vis,
                             "): more local ranks than visible devices; give each rank its own GPU (srun "
                             "--gpus-per-task=1, or one CUDA_VISIBLE_DEVICES per rank), start at most ",
                             visible, " ranks per node, or set nccl_options::backend.device");
  return local_rank;
}

FSDP_DECL file_rendezvous::file_rendezvous(std::filesystem::path path, int world, int rank, std::string job)
    : path_(std::move(path)), world_(world), rank_(rank), job_(std::move(job)) {
  if (path_.empty())
    fsdp::detail::fail_usage("file rendezvous: empty path (set FSDP_RENDEZVOUS_FILE or nccl_options::rendezvous_file)");
  if (world_ <= 0 || rank_ < 0 || rank_ >= world_)
    fsdp::detail::fail_usage("file rendezvous: rank ", rank_, " is outside a world of ", world_);
}

FSDP_DECL std::string file_rendezvous::default_job() {
  for (const char* k : {"FSDP_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"})
    if (const char* v = std::getenv(k)) return v;
  return {};
}

FSDP_DECL void file_rendezvous::publish(const std::vector<char>& blob, std::chrono::milliseconds timeout) const {
  if (rank_ != 0) fsdp::detail::fail_usage("file rendezvous: publish() is for rank 0, not rank ", rank_);
  remove();
  const std::string token = random_hex();
  std::string content = id_header(token) + '\n';
  content.append(blob.data(), blob.size());
  write_atomically(path_, content);
  if (world_ == 1) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  poll_backoff backoff;
  std::vector<std::string> nonce(static_cast<std::size_t>(world_));
  int missing = world_ - 1;
  for (;;) {
    for (int q = 1; q < world_; ++q) {
      auto& n = nonce[static_cast<std::size_t>(q)];
      if (!n.empty()) continue;
      const std::string ack = read_file(ack_path(q));
      const std::string prefix = ack_prefix(q, token);
      if (ack.starts_with(prefix) && ack.size() > prefix.size() && ack.back() == '\n') {
        n = ack.substr(prefix.size(), ack.size() - prefix.size() - 1);
        --missing;
      }
    }
    if (missing == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string who;
      for (int q = 1; q < world_; ++q)
        if (nonce[static_cast<std::size_t>(q)].empty()) who += (who.empty() ? "" : ", ") + std::to_string(q);
      throw comm_error(fsdp::detail::cat("file rendezvous: rank 0 published its id on '", path_.string(),
                                         "' but rank(s) ", who, " of ", world_, " did not acknowledge it within ",
                                         timeout.count(), " ms (job '", job_,
                                         "'); are they running with the same job id, and does "
                                         "every rank see the same path?"));
    }
    std::this_thread::sleep_for(backoff.next(std::chrono::steady_clock::now(), deadline));
  }
  std::string go = go_header(token) + '\n';
  for (int q = 1; q < world_; ++q) go += fsdp::detail::cat(q, ' ', nonce[static_cast<std::size_t>(q)], '\n');
  write_atomically(go_path(), go);
}

FSDP_DECL std::vector<char> file_rendezvous::fetch(std::size_t size, std::chrono::milliseconds timeout) const {
  if (rank_ == 0) fsdp::detail::fail_usage("file rendezvous: fetch() is for the ranks other than 0");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  poll_backoff backoff;
  const std::string nonce = random_hex();
  const std::string id_prefix = id_header("");
  std::string acked;  // the token this rank acknowledged
  std::vector<char> blob;
  std::string seen = "no file";
  for (;;) {
    const std::string content = read_file(path_);
    if (!content.empty()) {
      const std::size_t eol = content.find('\n');
      const std::string head = content.substr(0, eol);
      if (head.starts_with(id_prefix) && head.size() > id_prefix.size() && eol != std::string::npos &&
          content.size() - eol - 1 == size) {
        const std::string token = head.substr(id_prefix.size());
        if (token != acked) {
          write_atomically(ack_path(rank_), ack_prefix(rank_, token) + nonce + '\n');
          acked = token;
          blob.assign(content.begin() + static_cast<std::ptrdiff_t>(eol + 1), content.end());
        }
        seen = fsdp::detail::cat("an id with token ", token,
                                 " that rank 0 of this launch has not confirmed (left by an "
                                 "earlier launch, or rank 0 is not running)");
      } else {
        seen = fsdp::detail::cat("a file with header '", head, "' (expected '", id_prefix, "<token>' and ", size,
                                 " bytes)");
      }
    }
    if (!acked.empty()) {
      const std::string go = read_file(go_path());
      const std::string mine = fsdp::detail::cat('\n', rank_, ' ', nonce, '\n');
      if (go.starts_with(go_header(acked) + '\n') && go.find(mine) != std::string::npos) return blob;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw comm_error(fsdp::detail::cat("file rendezvous: '", path_.string(),
                                         "' had no id from rank 0 of this job after ", timeout.count(), " ms (found ",
                                         seen, "); is rank 0 running, and does every rank see the same path?"));
    std::this_thread::sleep_for(backoff.next(std::chrono::steady_clock::now(), deadline));
  }
}

FSDP_DECL void file_rendezvous::remove() const noexcept {
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  std::filesystem::remove(go_path(), ec);
  for (int q = 1; q < world_; ++q) std::filesystem::remove(ack_path(q), ec);
}

FSDP_DECL std::string file_rendezvous::id_header(std::string_view token) const {
  return fsdp::detail::cat("fsdp-rendezvous v2 world=", world_, " job=", job_, " token=", token);
}

FSDP_DECL std::string file_rendezvous::ack_prefix(int rank, std::string_view token) const {
  return fsdp::detail::cat("fsdp-rendezvous-ack v2 world=", world_, " job=", job_, " rank=", rank, " token=", token,
                           " nonce=");
}

FSDP_DECL std::string file_rendezvous::go_header(std::string_view token) const {
  return fsdp::detail::cat("fsdp-rendezvous-go v2 world=", world_, " job=", job_, " token=", token);
}

FSDP_DECL std::filesystem::path file_rendezvous::ack_path(int rank) const {
  return path_.string() + ".ack." + std::to_string(rank);
}

FSDP_DECL std::filesystem::path file_rendezvous::go_path() const { return path_.string() + ".go"; }

FSDP_DECL std::string file_rendezvous::random_hex() {
  std::random_device rd;
  std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(::getpid()),
                    static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()),
                    static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id()))};
  std::mt19937_64 gen(seq);
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(gen()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

FSDP_DECL std::string file_rendezvous::read_file(const std::filesystem::path& p) const {
  ++reads_;
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

FSDP_DECL void file_rendezvous::write_atomically(const std::filesystem::path& p, const std::string& content) {
  const std::filesystem::path tmp = fsdp::detail::cat(p.string(), ".tmp.", ::getpid(), ".",
                                                      std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fsdp::detail::fail_usage("file rendezvous: cannot write '", tmp.string(), "': ", std::strerror(errno));
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!out.flush()) fsdp::detail::fail_usage("file rendezvous: writing '", tmp.string(), "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, p, ec);
  if (ec)
    fsdp::detail::fail_usage("file rendezvous: cannot rename '", tmp.string(), "' to '", p.string(),
                             "': ", ec.message());
}

}  // namespace fsdp::comm
