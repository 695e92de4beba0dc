// Launch environment and file rendezvous (comm/launch.hpp): the host-only part of comm::nccl's set-up; and
// comm::run_nccl_threads's decisions (comm/detail/nccl_world.hpp: ranks as threads of one process over NCCL) against a
// fake NCCL.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/comm/detail/nccl_world.hpp>
#include <fsdp/comm/launch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/support.hpp"

namespace {

fsdp::comm::launch_env read(std::map<std::string, std::string> env) {
  return fsdp::comm::launch_env::read([env](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}
std::string read_error(std::map<std::string, std::string> env) {
  try {
    (void)read(std::move(env));
  } catch (const fsdp::usage_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("launch environment: torchrun, mpirun, MPICH and srun conventions, first complete one wins") {
  auto t = read({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}});
  CHECK(t.rank == 3);
  CHECK(t.world == 8);
  CHECK(t.local_rank == 1);
  CHECK(t.source == "torchrun");
  CHECK(t.local_rank_var == "LOCAL_RANK");
  auto m = read({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}});
  CHECK(m.source == "mpirun");
  CHECK(m.rank == 2);
  auto h = read({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "0"}});
  CHECK(h.source == "mpich");
  auto s = read({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}});
  CHECK(s.source == "srun");
  CHECK(s.local_rank_var == "SLURM_LOCALID");
  CHECK(s.world == 16);
  // torchrun inside an srun allocation: torchrun's variables describe this process.
  auto both = read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}});
  CHECK(both.source == "torchrun");
  CHECK(both.rank == 1);
}

TEST_CASE(
    "comm::mpi's launch check: a launcher that says several processes while MPI sees one is refused, naming what to "
    "use") {
  const auto mismatch = [](int mpi_world, std::map<std::string, std::string> env) {
    return fsdp::comm::mpi_launch_mismatch(mpi_world, [env](const char* k) -> const char* {
      auto it = env.find(k);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  const std::map<std::string, std::string> torchrun{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}};
  const std::map<std::string, std::string> srun{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}};
  CHECK(mismatch(1, torchrun) ==
        "comm::mpi: WORLD_SIZE=2 (torchrun) says this process is one of several, but MPI sees a world of 1: without "
        "MPI's launcher every process initialises MPI alone. Start the program with mpirun -np 2 (comm::mpi needs "
        "MPI's own launcher), or use comm::nccl with torchrun");
  CHECK(mismatch(1, srun) ==
        "comm::mpi: SLURM_NTASKS=4 (srun) says this process is one of several, but MPI sees a world of 1: srun "
        "started it without a process-management interface this MPI library can use, so every process initialised "
        "MPI alone. Start it with srun --mpi=pmix (an MPI built with PMIx support; srun --mpi=list shows what Slurm "
        "offers), or with mpirun -np 4");
  // srun with PMIx: MPI sees the whole world; mpirun -np 1 (MPI's own launcher) is believed; no launcher at all,
  // or a launcher of one process, is a world of one.
  CHECK(mismatch(4, srun) == "");
  auto mpirun_one = torchrun;
  mpirun_one["OMPI_COMM_WORLD_SIZE"] = "1";
  CHECK(mismatch(1, mpirun_one) == "");
  CHECK(mismatch(1, {}) == "");
  CHECK(mismatch(1, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}}) == "");
  // A launcher's variables that are wrong are still named.
  CHECK_THROWS_WITH_AS(mismatch(1, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "x"}, {"SLURM_LOCALID", "0"}}),
                       "fsdp: launch environment: SLURM_NTASKS='x' is not an integer", fsdp::usage_error);
}

TEST_CASE("launch environment: bad values are errors that name the variable") {
  CHECK(read_error({{"RANK", "x1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}) ==
        "fsdp: launch environment: RANK='x1' is not an integer");
  CHECK(read_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}) ==
        "fsdp: launch environment (torchrun): RANK=2 is outside [0, WORLD_SIZE=2)");
  CHECK(read_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"LOCAL_RANK", "0"}}) ==
        "fsdp: launch environment (torchrun): WORLD_SIZE=0 must be positive");
  CHECK(read_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "-1"}}) ==
        "fsdp: launch environment (torchrun): LOCAL_RANK=-1 must not be negative");
  CHECK(read_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}) ==
        "fsdp: launch environment (torchrun): LOCAL_RANK is not set while RANK is; set all of RANK, WORLD_SIZE "
        "and LOCAL_RANK");
  CHECK(read_error({}) ==
        "fsdp: launch environment: no launcher variables found (tried RANK/WORLD_SIZE/LOCAL_RANK (torchrun); "
        "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE/OMPI_COMM_WORLD_LOCAL_RANK (mpirun); "
        "PMI_RANK/PMI_SIZE/MPI_LOCALRANKID (mpich); SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun)); start the "
        "program with torchrun, mpirun or srun, or set RANK, WORLD_SIZE and LOCAL_RANK");
}

TEST_CASE(
    "device choice: one visible device is device 0, else the local rank; more local ranks than devices is an error") {
  using fsdp::comm::choose_device;
  auto error = [](auto&& fn) { return fsdp_test::error_of<fsdp::usage_error>(fn); };
  // srun --gpus-per-task=1 / mpirun with a CUDA_VISIBLE_DEVICES per rank: every rank sees one device, numbered 0.
  CHECK(choose_device(5, -1, 3, "SLURM_LOCALID, srun", 1, "3") == 0);
  CHECK(choose_device(0, -1, 0, "SLURM_LOCALID, srun", 1, "0") == 0);
  // torchrun on a node of 4 GPUs: LOCAL_RANK.
  CHECK(choose_device(6, -1, 2, "LOCAL_RANK, torchrun", 4, nullptr) == 2);
  CHECK(choose_device(7, -1, 3, "LOCAL_RANK, torchrun", 4, "0,1,2,3") == 3);
  // An explicit device wins, and must be visible.
  CHECK(choose_device(1, 1, 3, "LOCAL_RANK, torchrun", 4, nullptr) == 1);
  CHECK(choose_device(1, 0, 3, "LOCAL_RANK, torchrun", 1, "5") == 0);
  CHECK(
      error([] { (void)choose_device(1, 1, 0, "LOCAL_RANK, torchrun", 1, "5"); }) ==
      "fsdp: comm::nccl on rank 1: nccl_options::backend.device is 1 but only 1 CUDA device is visible to this process "
      "(CUDA_VISIBLE_DEVICES='5'); CUDA numbers the visible devices from 0");
  CHECK(error([] { (void)choose_device(9, -1, 5, "LOCAL_RANK, torchrun", 4, nullptr); }) ==
        "fsdp: comm::nccl on rank 9: local rank 5 (LOCAL_RANK, torchrun) but only 4 CUDA devices are visible to this "
        "process (CUDA_VISIBLE_DEVICES is not set): more local ranks than visible devices; give each rank its own GPU "
        "(srun --gpus-per-task=1, or one CUDA_VISIBLE_DEVICES per rank), start at most 4 ranks per node, or set "
        "nccl_options::backend.device");
  CHECK(
      error([] { (void)choose_device(2, -1, 2, "node-local rank from MPI_Comm_split_type", 2, "0,1"); }) ==
      "fsdp: comm::nccl on rank 2: local rank 2 (node-local rank from MPI_Comm_split_type) but only 2 CUDA devices are "
      "visible to this process (CUDA_VISIBLE_DEVICES='0,1'): more local ranks than visible devices; give each rank its "
      "own GPU (srun --gpus-per-task=1, or one CUDA_VISIBLE_DEVICES per rank), start at most 2 ranks per node, or set "
      "nccl_options::backend.device");
  CHECK(
      error([] { (void)choose_device(0, -1, 0, "LOCAL_RANK, torchrun", 0, ""); }) ==
      "fsdp: comm::nccl on rank 0: no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES=''); run it where a "
      "GPU is, and check what the launcher puts in CUDA_VISIBLE_DEVICES");
}

namespace {

std::filesystem::path rendezvous_path() {
  const auto dir = std::filesystem::path(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp");
  return dir / "fsdp_rendezvous_test";
}
void remove_files(const std::filesystem::path& path) {
  for (const auto& e : std::filesystem::directory_iterator(path.parent_path()))
    if (e.path().filename().string().starts_with(path.filename().string())) std::filesystem::remove(e.path());
}
std::string text(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }
std::string first_line(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string line;
  std::getline(in, line);
  return line;
}
std::string fetch_error(const std::filesystem::path& path, int world, int rank, const std::string& job,
                        std::size_t size, std::chrono::milliseconds timeout) {
  return fsdp_test::error_of<fsdp::comm_error>(
      [&] { (void)fsdp::comm::file_rendezvous(path, world, rank, job).fetch(size, timeout); });
}

/// One launch of `world` ranks: rank 0 publishes `id` after `delay`, the others fetch; returns what each got.
std::vector<std::string> launch(const std::filesystem::path& path, int world, const std::string& job,
                                const std::vector<char>& id, std::chrono::milliseconds delay) {
  std::vector<std::string> got(static_cast<std::size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 1; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        got[r] =
            text(fsdp::comm::file_rendezvous(path, world, r, job).fetch(id.size(), std::chrono::milliseconds(5000)));
      } catch (const std::exception& e) {
        got[r] = e.what();
      }
    });
  std::this_thread::sleep_for(delay);
  fsdp::comm::file_rendezvous(path, world, 0, job).publish(id, std::chrono::milliseconds(5000));
  got[0] = text(id);
  for (auto& t : ranks) t.join();
  return got;
}

}  // namespace

TEST_CASE("file rendezvous: rank 0 publishes, every other rank fetches the same id, the files are removed afterwards") {
  const auto path = rendezvous_path();
  remove_files(path);
  const std::vector<char> id{'n', 'c', 'c', 'l', '\0', '\x7f', 'i', 'd'};
  SUBCASE("ranks that start before rank 0 wait for it") {
    const auto got = launch(path, 4, "job-1", id, std::chrono::milliseconds(50));
    for (const std::string& g : got) CHECK(g == text(id));
  }
  SUBCASE("ranks that start after rank 0") {
    std::vector<char> got;
    std::thread zero(
        [&] { fsdp::comm::file_rendezvous(path, 2, 0, "job-1").publish(id, std::chrono::milliseconds(5000)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    got = fsdp::comm::file_rendezvous(path, 2, 1, "job-1").fetch(id.size(), std::chrono::milliseconds(5000));
    zero.join();
    CHECK(text(got) == text(id));
  }
  fsdp::comm::file_rendezvous(path, 4, 0, "job-1").remove();
  CHECK(!std::filesystem::exists(path));
  CHECK(!std::filesystem::exists(path.string() + ".go"));
  for (int q = 1; q < 4; ++q) CHECK(!std::filesystem::exists(path.string() + ".ack." + std::to_string(q)));
}

TEST_CASE("file rendezvous: files left by a crashed launch with the same job id are never used") {
  const auto path = rendezvous_path();
  remove_files(path);
  const std::vector<char> old_id{'o', 'l', 'd', '-', 'n', 'c', 'c', 'l'};
  const std::vector<char> new_id{'n', 'e', 'w', '-', 'n', 'c', 'c', 'l'};

  SUBCASE("the earlier launch completed its rendezvous, then crashed before removing the files") {
    for (const std::string& g : launch(path, 2, "", old_id, std::chrono::milliseconds(0))) REQUIRE(g == text(old_id));
    REQUIRE(std::filesystem::exists(path));  // not removed: the launch crashed
    // The next launch, same (empty) job id: rank 1 starts first and finds the old files.
    std::atomic<bool> returned{false};
    std::string got;
    std::thread one([&] {
      try {
        got = text(fsdp::comm::file_rendezvous(path, 2, 1, "").fetch(new_id.size(), std::chrono::milliseconds(5000)));
      } catch (const std::exception& e) {
        got = e.what();
      }
      returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(!returned);  // still waiting for rank 0 of this launch
    fsdp::comm::file_rendezvous(path, 2, 0, "").publish(new_id, std::chrono::milliseconds(5000));
    one.join();
    CHECK(got == text(new_id));
  }
  SUBCASE("rank 0 of the earlier launch crashed after publishing: its id is never confirmed") {
    CHECK_THROWS_AS(fsdp::comm::file_rendezvous(path, 2, 0, "j").publish(old_id, std::chrono::milliseconds(10)),
                    fsdp::comm_error);
    const std::string head = first_line(path);
    const std::string token = head.substr(head.find("token=") + 6);
    CHECK(fetch_error(path, 2, 1, "j", old_id.size(), std::chrono::milliseconds(100)) ==
          "fsdp: file rendezvous: '" + path.string() + "' had no id from rank 0 of this job after 100 ms (found an id "
          "with token " + token + " that rank 0 of this launch has not confirmed (left by an earlier launch, or rank 0 "
          "is not running)); is rank 0 running, and does every rank see the same path?");
  }
  remove_files(path);
}

TEST_CASE("file rendezvous: files of another job or world size, truncated files and missing ranks") {
  const auto path = rendezvous_path();
  remove_files(path);
  const std::vector<char> id{'n', 'c', 'c', 'l', '\0', '\x7f', 'i', 'd'};
  SUBCASE("a file of another job, or of another world size, is ignored until the timeout") {
    {
      std::ofstream out(path, std::ios::binary);
      out << "fsdp-rendezvous v2 world=4 job=job-0 token=0123abcd\nncclid!!";
    }
    CHECK(fetch_error(path, 4, 1, "job-1", id.size(), std::chrono::milliseconds(100)) ==
          "fsdp: file rendezvous: '" + path.string() + "' had no id from rank 0 of this job after 100 ms (found a file "
          "with header 'fsdp-rendezvous v2 world=4 job=job-0 token=0123abcd' (expected 'fsdp-rendezvous v2 world=4 "
          "job=job-1 token=<token>' and 8 bytes)); is rank 0 running, and does every rank see the same path?");
    CHECK_THROWS_AS(
        (void)fsdp::comm::file_rendezvous(path, 2, 1, "job-0").fetch(id.size(), std::chrono::milliseconds(20)),
        fsdp::comm_error);
  }
  SUBCASE("no file at all") {
    CHECK(fetch_error(path, 2, 1, "j", id.size(), std::chrono::milliseconds(30)) ==
          "fsdp: file rendezvous: '" + path.string() + "' had no id from rank 0 of this job after 30 ms (found no "
          "file); is rank 0 running, and does every rank see the same path?");
  }
  SUBCASE("a truncated file is not accepted") {
    {
      std::ofstream out(path, std::ios::binary);
      out << "fsdp-rendezvous v2 world=2 job=j token=00\nnc";
    }
    CHECK_THROWS_AS((void)fsdp::comm::file_rendezvous(path, 2, 1, "j").fetch(id.size(), std::chrono::milliseconds(20)),
                    fsdp::comm_error);
  }
  SUBCASE("rank 0 waits for every rank's acknowledgement, at most its timeout") {
    std::thread one([&] {
      try {
        (void)fsdp::comm::file_rendezvous(path, 3, 1, "j").fetch(id.size(), std::chrono::milliseconds(300));
      } catch (const fsdp::comm_error&) {  // rank 0 gives up: rank 1 is never confirmed
      }
    });
    CHECK(fsdp_test::error_of<fsdp::comm_error>([&] {
            fsdp::comm::file_rendezvous(path, 3, 0, "j").publish(id, std::chrono::milliseconds(100));
          }) == "fsdp: file rendezvous: rank 0 published its id on '" + path.string() + "' but rank(s) 2 of 3 did not "
                "acknowledge it within 100 ms (job 'j'); are they running with the same job id, and does every rank "
                "see the same path?");
    one.join();
  }
  auto usage = [](auto&& fn) { return fsdp_test::error_of<fsdp::usage_error>(fn); };
  CHECK(usage([] { fsdp::comm::file_rendezvous("", 2, 0, "j"); }) ==
        "fsdp: file rendezvous: empty path (set FSDP_RENDEZVOUS_FILE or nccl_options::rendezvous_file)");
  CHECK(usage([&] { fsdp::comm::file_rendezvous(path, 2, 2, "j"); }) ==
        "fsdp: file rendezvous: rank 2 is outside a world of 2");
  remove_files(path);
}

TEST_CASE("file rendezvous: waits read the files less and less often (5 ms, doubling, at most 500 ms)") {
  using std::chrono::milliseconds;
  const auto t0 = std::chrono::steady_clock::time_point{};
  fsdp::comm::poll_backoff b;
  std::vector<long> waits;
  for (int i = 0; i < 10; ++i) waits.push_back(b.next(t0, t0 + std::chrono::hours(1)).count());
  CHECK(waits == std::vector<long>{5, 10, 20, 40, 80, 160, 320, 500, 500, 500});
  // never past the deadline (but at least 1 ms)
  fsdp::comm::poll_backoff c;
  CHECK(c.next(t0, t0 + milliseconds(3)).count() == 3);
  CHECK(c.next(t0, t0).count() == 1);
}

TEST_CASE("file rendezvous: rank 0 waiting 600 ms for two late ranks reads their files about ten times, not 230") {
  // At 5 ms a pass rank 0 read the two missing acknowledgements 230 times in all (tried); with the backoff the passes
  // come at 5, 15, 35, 75, 155, 315 and 635 ms: about 8 passes, 16 reads, and one confirmation written.
  const auto path = rendezvous_path();
  remove_files(path);
  const std::vector<char> id{'n', 'c', 'c', 'l', '-', 'i', 'd', '!'};
  fsdp::comm::file_rendezvous zero(path, 3, 0, "job-b");
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    std::thread two([&] {
      (void)fsdp::comm::file_rendezvous(path, 3, 2, "job-b").fetch(id.size(), std::chrono::milliseconds(5000));
    });
    fsdp::comm::file_rendezvous one(path, 3, 1, "job-b");
    CHECK(text(one.fetch(id.size(), std::chrono::milliseconds(5000))) == text(id));
    CHECK(one.files_read() <= 20);
    two.join();
  });
  zero.publish(id, std::chrono::milliseconds(5000));
  late.join();
  CHECK(zero.files_read() >= 2);
  CHECK(zero.files_read() <= 2 * 10);
  zero.remove();
}

// ---- comm::run_nccl_threads's decisions against a fake NCCL ------------------------------------------------------

namespace {

using fsdp_test::error_of;

/// The fake NCCL and CUDA of run_nccl_world: a version, a device count, and unique ids counted as they are made.
struct fake_world_api {
  int nccl_version = 23007;
  int device_count = 1;
  int ids_made = 0;
  int version() const { return nccl_version; }
  fsdp::comm::detail::visible_devices devices() const {
    return {device_count, device_count > 0 ? "" : "cudaGetDeviceCount reported 0 devices"};
  }
  int unique_id() { return 1000 + ids_made++; }
};

/// What each rank did, in the order it did it, with its thread.
struct world_log {
  std::mutex mu;
  std::map<int, std::vector<std::string>> calls;  // by rank
  std::map<int, std::vector<std::thread::id>> threads;
  void add(int rank, std::string call) {
    std::lock_guard lk(mu);
    calls[rank].push_back(std::move(call));
    threads[rank].push_back(std::this_thread::get_id());
  }
};

/// A rank's communicator in the fake: made with its rank, world, device and id, ended (its "shutdown") when it goes.
struct fake_rank_comm {
  world_log* log;
  int rank;
  fake_rank_comm(world_log& l, int r, int world, int device, int id) : log(&l), rank(r) {
    l.add(r, "init(rank " + std::to_string(r) + " of " + std::to_string(world) + ", device " + std::to_string(device) +
                 ", id " + std::to_string(id) + ")");
  }
  fake_rank_comm(const fake_rank_comm&) = delete;
  fake_rank_comm& operator=(const fake_rank_comm&) = delete;
  ~fake_rank_comm() { log->add(rank, "shutdown"); }
};

}  // namespace

TEST_CASE(
    "run_nccl_threads: one unique id for the world, each rank's communicator made, used and ended on its own "
    "thread, the devices as given (four ranks on one GPU with NCCL 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1)") {
  fake_world_api api;
  world_log log;
  fsdp::comm::detail::run_nccl_world(
      api, 4, {0}, "1", [&](int r, int world, int device, int id) { return fake_rank_comm(log, r, world, device, id); },
      [&](fake_rank_comm& c) { log.add(c.rank, "fn"); });
  CHECK(api.ids_made == 1);
  REQUIRE(log.calls.size() == 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(log.calls[r] ==
          std::vector<std::string>{"init(rank " + std::to_string(r) + " of 4, device 0, id 1000)", "fn", "shutdown"});
    const auto& t = log.threads[r];
    CHECK((t[0] == t[1] && t[1] == t[2]));      // one thread a rank, from its communicator's making to its end
    CHECK(t[0] != std::this_thread::get_id());  // not the caller's
  }
  CHECK(log.threads[0][0] != log.threads[1][0]);

  // Two GPUs, four ranks: rank r on devices[r % 2]; with no list, rank r on device r % the visible devices.
  CHECK(fsdp::comm::detail::thread_rank_devices(4, {1, 0}, {2, ""}) == std::vector<int>{1, 0, 1, 0});
  CHECK(fsdp::comm::detail::thread_rank_devices(3, {}, {8, ""}) == std::vector<int>{0, 1, 2});
  CHECK(fsdp::comm::detail::thread_rank_devices(3, {}, {2, ""}) == std::vector<int>{0, 1, 0});
}

TEST_CASE(
    "run_nccl_threads refuses, before any NCCL call, ranks sharing a GPU that the loaded NCCL cannot have, a "
    "device that is not there and an empty world") {
  world_log log;
  const auto make = [&](int r, int world, int device, int id) { return fake_rank_comm(log, r, world, device, id); };
  const auto fn = [](fake_rank_comm&) {};
  fake_world_api old{22803, 1};
  CHECK(error_of<fsdp::usage_error>([&] { fsdp::comm::detail::run_nccl_world(old, 2, {0}, "1", make, fn); }) ==
        "fsdp: comm::nccl: ranks 0 and 1 are both on device 0: several ranks on one GPU need NCCL 2.30 or later (with "
        "NCCL_MULTI_RANK_GPU_ENABLE=1), but this NCCL is 2.28.3, which refuses them; give each rank a device of its "
        "own, or load NCCL 2.30 or later");
  fake_world_api two_gpus{23007, 2};
  CHECK(error_of<fsdp::usage_error>([&] { fsdp::comm::detail::run_nccl_world(two_gpus, 3, {}, nullptr, make, fn); }) ==
        "fsdp: comm::nccl: ranks 0 and 2 are both on device 0: NCCL 2.30.7 allows several ranks on one GPU only with "
        "NCCL_MULTI_RANK_GPU_ENABLE=1 (it is unset): set it before the first NCCL call, or give each rank a device of "
        "its own");
  CHECK(error_of<fsdp::usage_error>([&] { fsdp::comm::detail::run_nccl_world(two_gpus, 2, {0}, "0", make, fn); }) ==
        "fsdp: comm::nccl: ranks 0 and 1 are both on device 0: NCCL 2.30.7 allows several ranks on one GPU only with "
        "NCCL_MULTI_RANK_GPU_ENABLE=1 (it is '0'): set it before the first NCCL call, or give each rank a device of "
        "its own");
  CHECK(error_of<fsdp::usage_error>([&] { fsdp::comm::detail::run_nccl_world(two_gpus, 2, {0, 2}, "1", make, fn); }) ==
        "fsdp: comm::run_nccl_threads: devices[1] is 2, but the visible devices are 0 to 1");
  fake_world_api none{23007, 0};
  CHECK(error_of<fsdp::usage_error>([&] { fsdp::comm::detail::run_nccl_world(none, 1, {}, nullptr, make, fn); }) ==
        "fsdp: comm::run_nccl_threads: no CUDA device is visible (cudaGetDeviceCount reported 0 devices)");
  CHECK(error_of<fsdp::usage_error>([&] { fsdp::comm::detail::run_nccl_world(two_gpus, 0, {}, nullptr, make, fn); }) ==
        "fsdp: comm::run_nccl_threads: a world of 0 ranks; at least 1");
  CHECK(log.calls.empty());  // no communicator was made
  CHECK(old.ids_made + two_gpus.ids_made + none.ids_made == 0);

  // One rank a GPU needs neither the version nor the switch.
  fake_world_api old_two_gpus{22803, 2};
  fsdp::comm::detail::run_nccl_world(old_two_gpus, 2, {}, nullptr, make, fn);
  fsdp::comm::detail::run_nccl_world(old_two_gpus, 2, {1, 0}, nullptr, make, fn);
  CHECK(log.calls[0] == std::vector<std::string>{"init(rank 0 of 2, device 0, id 1000)", "shutdown",
                                                 "init(rank 0 of 2, device 1, id 1001)", "shutdown"});
  CHECK(log.calls[1] == std::vector<std::string>{"init(rank 1 of 2, device 1, id 1000)", "shutdown",
                                                 "init(rank 1 of 2, device 0, id 1001)", "shutdown"});
}

TEST_CASE(
    "run_nccl_threads: a rank whose communicator cannot be made is the error rethrown, once every rank has "
    "ended; the others' communicators are ended on their threads") {
  fake_world_api api{23007, 1};
  world_log log;
  std::atomic<bool> rank1_failed{false};
  const std::string msg = error_of<fsdp::comm_error>([&] {
    fsdp::comm::detail::run_nccl_world(
        api, 3, {0}, "1",
        [&](int r, int world, int device, int id) {
          if (r == 1) {
            rank1_failed = true;
            throw fsdp::comm_error(
                "NCCL reported ncclSystemError on rank 1 of 3 during ncclCommInitRankConfig for "
                "communicator set-up");
          }
          return fake_rank_comm(log, r, world, device, id);
        },
        [&](fake_rank_comm& c) {
          // The survivors see the failure only at their timeout: here, a collective that fails well after rank 1's
          // set-up did
          while (!rank1_failed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          throw fsdp::comm_error("all_reduce on rank " + std::to_string(c.rank) +
                                 " did not complete within its timeout");
        });
  });
  CHECK(msg ==
        "fsdp: NCCL reported ncclSystemError on rank 1 of 3 during ncclCommInitRankConfig for communicator "
        "set-up");
  CHECK(log.calls[0] == std::vector<std::string>{"init(rank 0 of 3, device 0, id 1000)", "shutdown"});
  CHECK(log.calls[2] == std::vector<std::string>{"init(rank 2 of 3, device 0, id 1000)", "shutdown"});
  CHECK(log.calls.count(1) == 0);
}
