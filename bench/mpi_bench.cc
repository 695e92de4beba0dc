// comm::mpi's all_gather and reduce_scatter (f32, sum) next to raw MPI_Allgather and MPI_Reduce_scatter_block
// (MPI_FLOAT, MPI_SUM) on the same sizes, in the same run, in nccl-tests' table form:
//   bazel build -c opt //bench:mpi_bench   (a manual target: `bazel test //...` does not build it)
//   mpirun --allow-run-as-root --oversubscribe -np 4 bazel-bin/bench/mpi_bench [--max-mib 64] [--spin-us N]
// (--spin-us: the host backend's host_options::spin for the stream the collectives are issued on; 0: no spin)
//
// size is the unsharded buffer (the all-gather's output, the reduce-scatter's input), count its f32 elements.
// time: each rank's mean over `iters` back-to-back collectives (ours: issued on a host stream, then one
// synchronize; raw: blocking calls in a loop), the slowest rank's, best of 3 runs. algbw = size / time,
// busbw = algbw * (n - 1) / n (nccl-tests' factor for both). ours/raw compares the times (goal <= 1.05).
//
// comm::mpi moves the data with non-blocking MPI and reduces on the host in rank order (bit-identical to comm::local),
// so its reduce-scatter is an MPI_Ialltoall plus a local reduction, where MPI_Reduce_scatter_block may reduce as the
// data moves; its all-gather is MPI_Iallgather polled with MPI_Test from the stream's worker thread.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fsdp/comm/mpi.hpp>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct row {
  std::size_t bytes = 0;
  double ours_us = 0, raw_us = 0;
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

/// The slowest rank's mean time per call of `fn` (which runs `iters` collectives), in microseconds; best of `runs`.
template <class F>
double time_us(MPI_Comm world, int iters, int runs, F&& fn) {
  double best = 1e300;
  for (int r = 0; r < runs; ++r) {
    MPI_Barrier(world);
    const auto t0 = clock_type::now();
    fn(iters);
    double us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / iters;
    double slowest = 0;
    MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, world);
    best = std::min(best, slowest);
  }
  return best;
}

void print_table(const char* name, const std::vector<row>& rows, int world) {
  const double bus = double(world - 1) / world;
  std::printf("\n# %s, f32%s, %d processes\n", name, std::strcmp(name, "reduce_scatter") == 0 ? ", sum" : "", world);
  std::printf("#%11s %12s | %10s %8s %8s | %10s %8s %8s | %8s\n", "", "", "comm::mpi", "", "", "raw MPI", "", "", "");
  std::printf("#%11s %12s | %10s %8s %8s | %10s %8s %8s | %8s\n", "size", "count", "time", "algbw", "busbw", "time",
              "algbw", "busbw", "ours/raw");
  std::printf("#%11s %12s | %10s %8s %8s | %10s %8s %8s | %8s\n", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)",
              "(us)", "(GB/s)", "(GB/s)", "");
  for (const row& r : rows) {
    const double ours_alg = double(r.bytes) / (r.ours_us * 1e3), raw_alg = double(r.bytes) / (r.raw_us * 1e3);
    std::printf("%12zu %12zu | %10.1f %8.3f %8.3f | %10.1f %8.3f %8.3f | %8.3f\n", r.bytes, r.bytes / 4, r.ours_us,
                ours_alg, ours_alg * bus, r.raw_us, raw_alg, raw_alg * bus, r.ours_us / r.raw_us);
  }
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::comm::mpi_session mpi(argc, argv);
  int max_mib = 64;
  fsdp::backend::host_options host_opt;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--max-mib" && i + 1 < argc) max_mib = std::atoi(argv[++i]);
    if (std::string(argv[i]) == "--spin-us" && i + 1 < argc)
      host_opt.spin = std::chrono::microseconds(std::atoi(argv[++i]));
  }
  try {
    fsdp::comm::mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(300000)});
    const int rank = comm.rank(), world = comm.size();
    MPI_Comm raw = MPI_COMM_NULL;  // raw MPI on its own communicator
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    fsdp::backend::host be(rank, host_opt);
    auto& s = be.gather_stream();

    if (rank == 0) {
      char host[256] = {};
      gethostname(host, sizeof host - 1);
      char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
      int len = 0;
      MPI_Get_library_version(version, &len);
      std::string v(version);
      if (const auto nl = v.find('\n'); nl != std::string::npos) v.resize(nl);
      if (const auto comma = v.find(','); comma != std::string::npos) v.resize(comma);
      std::printf("# mpi_bench on %s: %s, %u hardware threads; %d processes (mpirun --oversubscribe); %s; the "
                  "stream's worker spins %lld us before it sleeps\n",
                  host, cpu_model().c_str(), std::thread::hardware_concurrency(), world, v.c_str(),
                  static_cast<long long>(host_opt.spin.count()));
    }

    std::vector<row> gather_rows, scatter_rows;
    const std::size_t max_bytes = std::size_t(max_mib) << 20;
    for (std::size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
      const std::size_t total = bytes / 4, per = total / std::size_t(world);
      const int iters = int(std::clamp<std::size_t>((std::size_t(256) << 20) / bytes, 4, 200));
      std::vector<float> shard(per), full(total), out(per);
      for (std::size_t i = 0; i < per; ++i) shard[i] = float(rank + 1) * 0.5f + float(i % 13);
      for (std::size_t i = 0; i < total; ++i) full[i] = float(rank + 1) * 0.25f + float(i % 7);
      const auto n = static_cast<std::int64_t>(per);

      row g{bytes}, r{bytes};
      // one untimed call of each first (set-up of the stream's communicator, first touch of the buffers)
      comm.all_gather(shard.data(), full.data(), n, fsdp::dtype::f32, s);
      comm.reduce_scatter(full.data(), out.data(), n, fsdp::dtype::f32, fsdp::reduce_op::sum, s);
      be.synchronize(s);
      MPI_Allgather(shard.data(), int(per), MPI_FLOAT, full.data(), int(per), MPI_FLOAT, raw);
      MPI_Reduce_scatter_block(full.data(), out.data(), int(per), MPI_FLOAT, MPI_SUM, raw);

      g.raw_us = time_us(MPI_COMM_WORLD, iters, 3, [&](int k) {
        for (int i = 0; i < k; ++i)
          MPI_Allgather(shard.data(), int(per), MPI_FLOAT, full.data(), int(per), MPI_FLOAT, raw);
      });
      g.ours_us = time_us(MPI_COMM_WORLD, iters, 3, [&](int k) {
        for (int i = 0; i < k; ++i) comm.all_gather(shard.data(), full.data(), n, fsdp::dtype::f32, s);
        be.synchronize(s);
      });
      r.raw_us = time_us(MPI_COMM_WORLD, iters, 3, [&](int k) {
        for (int i = 0; i < k; ++i)
          MPI_Reduce_scatter_block(full.data(), out.data(), int(per), MPI_FLOAT, MPI_SUM, raw);
      });
      r.ours_us = time_us(MPI_COMM_WORLD, iters, 3, [&](int k) {
        for (int i = 0; i < k; ++i)
          comm.reduce_scatter(full.data(), out.data(), n, fsdp::dtype::f32, fsdp::reduce_op::sum, s);
        be.synchronize(s);
      });
      gather_rows.push_back(g);
      scatter_rows.push_back(r);
    }

    if (rank == 0) {
      print_table("all_gather", gather_rows, world);
      print_table("reduce_scatter", scatter_rows, world);
      std::printf("\n{\"bench\":\"mpi\",\"world\":%d,\"rows\":[", world);
      for (std::size_t i = 0; i < gather_rows.size(); ++i)
        std::printf(
            "%s{\"bytes\":%zu,\"all_gather_us\":%.2f,\"raw_allgather_us\":%.2f,\"reduce_scatter_us\":%.2f,"
            "\"raw_reduce_scatter_block_us\":%.2f}",
            i ? "," : "", gather_rows[i].bytes, gather_rows[i].ours_us, gather_rows[i].raw_us, scatter_rows[i].ours_us,
            scatter_rows[i].raw_us);
      std::printf("]}\n");
    }
    MPI_Comm_free(&raw);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
