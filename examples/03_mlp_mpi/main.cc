// Trains the 4-layer MLP of examples/01_mlp_host (mlp.hpp) with one MPI process per rank: comm::mpi over the host
// backend. Every process takes its slice of each global batch; rank 0 prints the global mean loss of every step.
//   mpirun --allow-run-as-root --oversubscribe -np 4 bazel-bin/examples/03_mlp_mpi/03_mlp_mpi [--steps 50]
//       [--batch 48] [--strategy full_shard|shard_grad_op|no_shard|hybrid_shard] [--optimizer adamw|sgd] [--lr X]
//       [--precision fp32|bf16|bf16-reduce] [--timeout-ms 60000]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fsdp/comm/mpi.hpp>
#include <string>

#include "examples/01_mlp_host/mlp.hpp"

namespace {

/// Thrown after a bad command line has been explained (by rank 0: every process parses the same arguments).
struct bad_usage {};

[[noreturn]] void usage(int rank, const std::string& why) {
  if (rank == 0)
    std::fprintf(stderr,
                 "error: %s\nusage: mpirun -np N 03_mlp_mpi [--steps S] [--batch B] "
                 "[--strategy full_shard|shard_grad_op|no_shard|hybrid_shard] [--optimizer adamw|sgd] [--lr X] "
                 "[--precision fp32|bf16|bf16-reduce] [--timeout-ms T]\n",
                 why.c_str());
  throw bad_usage{};
}

int to_int(int rank, const char* s, const std::string& flag) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end || v <= 0 || v > 1 << 30) usage(rank, flag + " needs a positive integer");
  return static_cast<int>(v);
}

template <class Strategy, class Precision>
void run(fsdp::comm::mpi_communicator& comm, const mlp::config& cfg) {
  using Policy = fsdp::policy<Strategy, fsdp::prefetch::next, Precision, fsdp::comm::mpi<>>;
  const auto pf = fsdp::facts_of_precision<Precision>();
  if (comm.rank() == 0) {
    std::printf("MLP %d", cfg.dims[0]);
    for (std::size_t i = 1; i < cfg.dims.size(); ++i) std::printf("-%d", cfg.dims[i]);
    std::printf(", %s, %d MPI processes, global batch %d, %s, %s compute, %s reduction\n",
                std::string(Strategy::name).c_str(), comm.size(), cfg.global_batch, cfg.optimizer.c_str(),
                std::string(fsdp::name_of(pf.compute)).c_str(), std::string(fsdp::name_of(pf.reduce)).c_str());
    std::fflush(stdout);
  }
  const mlp::result r = mlp::train<Policy>(comm, cfg);  // rank 0 prints each step's loss
  const auto s = comm.stats();
  if (comm.rank() == 0) {
    std::printf("trained %d steps in %.3f s: loss %.6f -> %.6f\n", cfg.steps, r.seconds, r.losses.front(),
                r.losses.back());
    std::printf("rank 0 issued %llu all_gather, %llu reduce_scatter, %llu all_reduce (%.2f MiB in all)\n",
                static_cast<unsigned long long>(s[fsdp::collective::all_gather]),
                static_cast<unsigned long long>(s[fsdp::collective::reduce_scatter]),
                static_cast<unsigned long long>(s[fsdp::collective::all_reduce]),
                double(s.bytes[0] + s.bytes[1] + s.bytes[2] + s.bytes[3]) / (1 << 20));
    const fsdp::device_mesh mesh = fsdp::mesh_of<Strategy>(comm.size());
    if (mesh.hybrid())  // the step's collectives went to the groups: the world carried the agreement and the losses
      std::printf("mesh %d replicas x %d shards; rank 0's shard group issued %llu all_gather, %llu reduce_scatter; "
                  "its replicate group %llu all_reduce\n",
                  mesh.replicas, mesh.shards,
                  static_cast<unsigned long long>(r.shard_group[fsdp::collective::all_gather]),
                  static_cast<unsigned long long>(r.shard_group[fsdp::collective::reduce_scatter]),
                  static_cast<unsigned long long>(r.replicate_group[fsdp::collective::all_reduce]));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0;
  try {
    fsdp::comm::mpi_session mpi(argc, argv);
    rank = mpi.rank();
    std::string strategy = "full_shard", precision = "fp32";
    int timeout_ms = 60000;
    mlp::config cfg;
    cfg.steps = 50;
    cfg.verbose = true;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> const char* {
        if (i + 1 >= argc) usage(rank, a + " needs a value");
        return argv[++i];
      };
      if (a == "--steps")
        cfg.steps = to_int(rank, value(), a);
      else if (a == "--batch")
        cfg.global_batch = to_int(rank, value(), a);
      else if (a == "--strategy")
        strategy = value();
      else if (a == "--optimizer")
        cfg.optimizer = value();
      else if (a == "--lr")
        cfg.lr = std::strtof(value(), nullptr);
      else if (a == "--precision")
        precision = value();
      else if (a == "--timeout-ms")
        timeout_ms = to_int(rank, value(), a);
      else
        usage(rank, "unknown argument " + a);
    }
    try {
      fsdp::comm::mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(timeout_ms)});
      namespace sh = fsdp::sharding;
      using fsdp::bfloat16;
      using fsdp::named;
      using fsdp::precision::mixed;
      fsdp::select(
          "--precision", precision,
          [&](auto p) {
            using P = typename decltype(p)::type;
            fsdp::select(
                "--strategy", strategy, [&](auto s) { run<typename decltype(s)::type, P>(comm, cfg); },
                named<sh::full_shard>{"full_shard"}, named<sh::shard_grad_op>{"shard_grad_op"},
                named<sh::no_shard>{"no_shard"}, named<sh::hybrid_shard<2>>{"hybrid_shard"});  // shard groups of 2
          },
          named<fsdp::precision::full>{"fp32"}, named<mixed<bfloat16>>{"bf16"},
          named<mixed<bfloat16, float, bfloat16>>{"bf16-reduce"});
    } catch (const std::exception& e) {  // a failed collective: every process says what it saw
      std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
      return 1;
    }
    return 0;
  } catch (const bad_usage&) {
    return 2;
  } catch (const std::exception& e) {  // MPI could not start, or a bad argument
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 1;
  }
}
