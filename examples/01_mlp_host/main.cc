// Trains a 4-layer MLP with N thread ranks on the host backend and prints per-step progress and, at the end,
// every rank's peak memory by category next to the planner's prediction.
//   bazel run //examples/01_mlp_host -- --ranks 4 [--steps 50] [--strategy full_shard|shard_grad_op|no_shard]
//                                        [--optimizer adamw|sgd] [--batch 48]
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "examples/01_mlp_host/mlp.hpp"

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "error: %s\nusage: mlp_host [--ranks N] [--steps S] [--batch B] "
               "[--strategy full_shard|shard_grad_op|no_shard] [--optimizer adamw|sgd] [--lr X]\n",
               why);
  std::exit(2);
}

int to_int(const char* s, const char* flag) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end || v <= 0 || v > 1 << 20) usage((std::string(flag) + " needs a positive integer").c_str());
  return static_cast<int>(v);
}

template <class Strategy>
int run(int ranks, const mlp::config& cfg) {
  using Policy = fsdp::policy<Strategy, fsdp::prefetch::next>;
  std::vector<mlp::result> results(static_cast<std::size_t>(ranks));
  std::printf("MLP %d", cfg.dims[0]);
  for (std::size_t i = 1; i < cfg.dims.size(); ++i) std::printf("-%d", cfg.dims[i]);
  std::printf(", %s, %d thread ranks, global batch %d, %s\n", std::string(Strategy::name).c_str(), ranks,
              cfg.global_batch, cfg.optimizer.c_str());
  fsdp::comm::run_local(ranks, [&](fsdp::comm::local_communicator& comm) {
    results[static_cast<std::size_t>(comm.rank())] = mlp::train<Policy>(comm, cfg);
  });
  const auto& r0 = results[0];
  std::printf("trained %d steps in %.3f s: loss %.6f -> %.6f\n", cfg.steps, r0.seconds, r0.losses.front(),
              r0.losses.back());
  std::printf("\npeak memory per rank (KiB), measured / planned\n%-6s", "rank");
  for (std::size_t c = 0; c < fsdp::mem_categories; ++c)
    std::printf(" %24s", std::string(fsdp::name_of(static_cast<fsdp::mem>(c))).c_str());
  std::printf(" %10s\n", "total");
  for (int r = 0; r < ranks; ++r) {
    const auto& res = results[static_cast<std::size_t>(r)];
    std::printf("%-6d", r);
    for (std::size_t c = 0; c < fsdp::mem_categories; ++c) {
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.2f / %.2f", res.memory.peak.bytes[c] / 1024.0, res.planned.bytes[c] / 1024.0);
      std::printf(" %24s", cell);
    }
    std::printf(" %10.2f\n", res.memory.peak.total / 1024.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4;
  std::string strategy = "full_shard";
  mlp::config cfg;
  cfg.steps = 50;
  cfg.verbose = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--ranks") ranks = to_int(value(), "--ranks");
    else if (a == "--steps") cfg.steps = to_int(value(), "--steps");
    else if (a == "--batch") cfg.global_batch = to_int(value(), "--batch");
    else if (a == "--strategy") strategy = value();
    else if (a == "--optimizer") cfg.optimizer = value();
    else if (a == "--lr") cfg.lr = std::strtof(value(), nullptr);
    else usage(("unknown argument " + a).c_str());
  }
  try {
    if (strategy == "full_shard") return run<fsdp::sharding::full_shard>(ranks, cfg);
    if (strategy == "shard_grad_op") return run<fsdp::sharding::shard_grad_op>(ranks, cfg);
    if (strategy == "no_shard") return run<fsdp::sharding::no_shard>(ranks, cfg);
    usage(("unknown strategy " + strategy).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
