// The MLP example on GPUs. Two ways to run it:
//   local ranks on one GPU:  bazel run //examples/02_mlp_cuda -- --ranks 4 [--steps 20] [--compare-host]
//   NCCL, one GPU per rank:  mpirun -np 2 -x FSDP_RENDEZVOUS_FILE=/shared/path/run1
//                              bazel-bin/examples/02_mlp_cuda/02_mlp_cuda --nccl
//                            (or torchrun/srun: RANK, WORLD_SIZE, LOCAL_RANK and FSDP_RENDEZVOUS_FILE set). The
//                            rendezvous file is a path every rank sees; without it comm::nccl::from_env refuses a
//                            world of more than one (docs/errors.md).
// --compare-host also trains the host example (01_mlp_host) with the same ranks and configuration and checks
// that every step's loss agrees to 1e-4 relative (cuBLAS sums in another order than the host loops).
// Without a GPU it prints why and exits with status 2.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "examples/02_mlp_cuda/mlp_cuda.cuh"

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "error: %s\nusage: 02_mlp_cuda [--ranks N | --nccl] [--steps S] [--batch B] "
               "[--strategy full_shard|shard_grad_op|no_shard] [--optimizer adamw|sgd] [--gemm cublas|plain] "
               "[--compare-host]\n",
               why);
  return 1;
}

template <class Sharding, class Comm>
using policy = fsdp::policy<Sharding, fsdp::prefetch::backward_pre<1>, fsdp::precision::full, Comm>;

template <class Sharding>
int run(int ranks, bool use_nccl, bool compare, const mlp::config& cfg, mlp_cuda::gemm_kind kind) {
  mlp::result r0;
  std::mutex mu;
  if (use_nccl) {
    auto comm = fsdp::comm::nccl::from_env();
    r0 = mlp_cuda::train<policy<Sharding, fsdp::comm::nccl>>(comm, cfg, kind);
    if (comm.rank() != 0) return 0;
    ranks = comm.size();
  } else {
    fsdp::comm::run_local_cuda(ranks, [&](fsdp::comm::local_cuda_communicator& c) {
      auto r = mlp_cuda::train<policy<Sharding, fsdp::comm::local<fsdp::backend::cuda>>>(c, cfg, kind);
      std::lock_guard lk(mu);
      if (c.rank() == 0) r0 = std::move(r);
    });
  }
  std::printf("trained %d steps on %d rank(s) in %.3f s; loss %.6f -> %.6f\n", cfg.steps, ranks, r0.seconds,
              r0.losses.front(), r0.losses.back());
  std::printf("rank 0 peak memory: %lld bytes, planned %lld\n", static_cast<long long>(r0.memory.peak.total),
              static_cast<long long>(r0.planned.total));
  if (!compare) return 0;
  mlp::result host;
  fsdp::comm::run_local(ranks, [&](fsdp::comm::local_communicator& c) {
    auto r = mlp::train<fsdp::policy<Sharding, fsdp::prefetch::backward_pre<1>>>(c, cfg);
    std::lock_guard lk(mu);
    if (c.rank() == 0) host = std::move(r);
  });
  double worst = 0;
  for (std::size_t s = 0; s < host.losses.size(); ++s)
    worst = std::max(
        worst, std::fabs(double(r0.losses[s]) - host.losses[s]) / std::max(1e-12, std::fabs(double(host.losses[s]))));
  const bool ok = worst <= 1e-4;
  std::printf("compare with the host backend: largest relative loss difference %.3g over %zu steps: %s\n", worst,
              host.losses.size(), ok ? "agree" : "DIFFER");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  mlp::config cfg;
  int ranks = 4;
  bool use_nccl = false, compare = false;
  std::string strategy = "full_shard";
#ifdef EXAMPLES_NO_CUBLAS
  mlp_cuda::gemm_kind kind = mlp_cuda::gemm_kind::plain;
#else
  mlp_cuda::gemm_kind kind = mlp_cuda::gemm_kind::cublas;
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--nccl") use_nccl = true;
    else if (a == "--compare-host") compare = true;
    else if (a == "--ranks" && (v = value())) ranks = std::atoi(v);
    else if (a == "--steps" && (v = value())) cfg.steps = std::atoi(v);
    else if (a == "--batch" && (v = value())) cfg.global_batch = std::atoi(v);
    else if (a == "--strategy" && (v = value())) strategy = v;
    else if (a == "--optimizer" && (v = value())) cfg.optimizer = v;
    else if (a == "--gemm" && (v = value()) && (std::string(v) == "cublas" || std::string(v) == "plain"))
      kind = std::string(v) == "plain" ? mlp_cuda::gemm_kind::plain : mlp_cuda::gemm_kind::cublas;
    else return usage(("unknown or incomplete argument '" + a + "'").c_str());
  }
  if (ranks <= 0 || cfg.steps <= 0) return usage("--ranks and --steps must be positive");
  const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
  if (p.count == 0) {
    std::printf("skipped: no CUDA device (%s); the host example runs everywhere: bazel run //examples/01_mlp_host\n",
                p.reason.c_str());
    return 2;
  }
  cfg.verbose = true;
  try {
    namespace sh = fsdp::sharding;
    return fsdp::select(
        "--strategy", strategy,
        [&](auto s) { return run<typename decltype(s)::type>(ranks, use_nccl, compare, cfg, kind); },
        fsdp::by_name<sh::full_shard, sh::shard_grad_op, sh::no_shard>());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
