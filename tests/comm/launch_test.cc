// Launch environment and file rendezvous (comm/launch.hpp): the host-only part of comm::nccl's set-up.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/comm/launch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
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
  auto m = read({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}});
  CHECK(m.source == "mpirun");
  CHECK(m.rank == 2);
  auto h = read({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "0"}});
  CHECK(h.source == "mpich");
  auto s = read({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}});
  CHECK(s.source == "srun");
  CHECK(s.world == 16);
  // torchrun inside an srun allocation: torchrun's variables describe this process.
  auto both = read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}});
  CHECK(both.source == "torchrun");
  CHECK(both.rank == 1);
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

TEST_CASE("file rendezvous: rank 0 publishes, others fetch; stale files of other jobs are not trusted") {
  const auto dir = std::filesystem::path(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp");
  const auto path = dir / "fsdp_rendezvous_test";
  std::filesystem::remove(path);
  const std::vector<char> id{'n', 'c', 'c', 'l', '\0', '\x7f', 'i', 'd'};

  SUBCASE("a reader started before the writer waits for it") {
    fsdp::comm::file_rendezvous writer(path, 4, "job-1"), reader(path, 4, "job-1");
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      writer.publish(id);
    });
    CHECK(reader.fetch(id.size(), std::chrono::milliseconds(5000)) == id);
    late.join();
    writer.remove();
    CHECK(!std::filesystem::exists(path));
  }
  SUBCASE("a file of another job, or of another world size, is ignored until the timeout") {
    fsdp::comm::file_rendezvous(path, 4, "job-0").publish(id);
    std::string what;
    try {
      (void)fsdp::comm::file_rendezvous(path, 4, "job-1").fetch(id.size(), std::chrono::milliseconds(100));
    } catch (const fsdp::comm_error& e) {
      what = e.what();
    }
    CHECK(what == "fsdp: file rendezvous: '" + path.string() + "' had no id from rank 0 of this job after 100 ms "
                  "(found a file with header 'fsdp-rendezvous v1 world=4 job=job-0' (expected 'fsdp-rendezvous v1 "
                  "world=4 job=job-1')); is rank 0 running, and does every rank see the same path?");
    CHECK_THROWS_AS((void)fsdp::comm::file_rendezvous(path, 2, "job-0").fetch(id.size(), std::chrono::milliseconds(20)),
                    fsdp::comm_error);
    std::filesystem::remove(path);
  }
  SUBCASE("no file at all") {
    std::string what;
    try {
      (void)fsdp::comm::file_rendezvous(path, 2, "j").fetch(id.size(), std::chrono::milliseconds(30));
    } catch (const fsdp::comm_error& e) {
      what = e.what();
    }
    CHECK(what == "fsdp: file rendezvous: '" + path.string() + "' had no id from rank 0 of this job after 30 ms "
                  "(found no file); is rank 0 running, and does every rank see the same path?");
  }
  SUBCASE("a truncated file is not accepted") {
    {
      std::ofstream out(path, std::ios::binary);
      out << "fsdp-rendezvous v1 world=2 job=j\nnc";
    }
    CHECK_THROWS_AS((void)fsdp::comm::file_rendezvous(path, 2, "j").fetch(id.size(), std::chrono::milliseconds(20)),
                    fsdp::comm_error);
    std::filesystem::remove(path);
  }
  CHECK(std::string([] {
          try {
            fsdp::comm::file_rendezvous("", 2, "j");
          } catch (const fsdp::usage_error& e) {
            return std::string(e.what());
          }
          return std::string("no error");
        }()) == "fsdp: file rendezvous: empty path (set FSDP_RENDEZVOUS_FILE or nccl_options::rendezvous_file)");
}
