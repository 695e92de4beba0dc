// Trains a 4-layer MLP with N thread ranks on the host backend and prints per-step progress and, at the end,
// every rank's peak memory by category next to the planner's prediction. With --trace FILE it also records the
// run, writes a Chrome-trace timeline to FILE and prints where rank 0's last step spent its time.
//   bazel run //examples/01_mlp_host -- --ranks 4 [--steps 50]
//       [--strategy full_shard|shard_grad_op|zero1|no_shard|hybrid_shard|hybrid_shard_zero2 [--shard-group 2|4]]
//       [--optimizer adamw|sgd] [--batch 48] [--precision fp32|bf16|bf16-reduce|fp16] [--micro-batches K]
//       [--no-sync] [--keep-gathered] [--clip MAX_NORM] [--tp T] [--trace trace.json]
// --tp T: tensor groups of T consecutive ranks, the layers Megatron's column- and row-parallel pairs (mlp.hpp).
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <fsdp/observe/chrome_trace.hpp>

#include "examples/01_mlp_host/mlp.hpp"

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(
      stderr,
      "error: %s\nusage: mlp_host [--ranks N] [--steps S] [--batch B] "
      "[--strategy full_shard|shard_grad_op|zero1|no_shard|hybrid_shard|hybrid_shard_zero2] [--shard-group 2|4] "
      "[--optimizer adamw|sgd] [--lr X] "
      "[--precision fp32|bf16|bf16-reduce|fp16] [--micro-batches K] [--no-sync] [--keep-gathered] "
      "[--clip MAX_NORM] [--tp T] [--trace FILE]\n",
      why);
  std::exit(2);
}

int to_int(const char* s, const char* flag) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end || v <= 0 || v > 1 << 20) usage((std::string(flag) + " needs a positive integer").c_str());
  return static_cast<int>(v);
}

/// The run's first line. Apart from run(), as print_results: these compile once, not once per policy.
void print_header(int ranks, const mlp::config& cfg, std::string_view strategy, const fsdp::precision_facts& pf,
                  const fsdp::device_mesh& mesh) {
  std::printf("MLP %d", cfg.dims[0]);
  for (std::size_t i = 1; i < cfg.dims.size(); ++i) std::printf("-%d", cfg.dims[i]);
  const auto& acc = cfg.model.accumulation;
  std::printf(", %s, %d thread ranks", std::string(strategy).c_str(), ranks);
  if (mesh.hybrid()) std::printf(" (%d replicas x %d shards)", mesh.replicas, mesh.shards);
  if (const int t = cfg.model.tensor_parallel; t > 1) std::printf(", tensor groups of %d", t);
  std::printf(", global batch %d, %s, %s compute, %s reduction", cfg.global_batch, cfg.optimizer.c_str(),
              std::string(fsdp::name_of(pf.compute)).c_str(), std::string(fsdp::name_of(pf.reduce)).c_str());
  if (acc.micro_batches > 1)
    std::printf(", %d micro-batches (%s%s)", acc.micro_batches,
                acc.sync == fsdp::grad_sync::last_micro_batch ? "no-sync" : "reduced each",
                acc.keep_gathered ? ", kept gathered" : "");
  if (cfg.grad.max_norm > 0) std::printf(", clipped at %g", cfg.grad.max_norm);
  std::printf("\n");
}

/// The losses, the memory table and the trace's summary.
int print_results(const mlp::config& cfg, const std::vector<mlp::result>& results, const fsdp::trace::recorder& rec,
                  const std::string& trace_path) {
  const auto& r0 = results[0];
  std::printf("trained %d steps in %.3f s: loss %.6f -> %.6f\n", cfg.steps, r0.seconds, r0.losses.front(),
              r0.losses.back());
  if (!r0.reports.empty() && r0.reports.back().inspected) {
    int skipped = 0;
    for (const auto& r : r0.reports) skipped += r.skipped ? 1 : 0;
    std::printf("last step: %s; %d of %d steps skipped\n", r0.reports.back().message().c_str(), skipped,
                int(r0.reports.size()));
  }
  std::vector<fsdp::rank_memory> table;
  for (std::size_t r = 0; r < results.size(); ++r)
    table.push_back({int(r), results[r].memory.peak, results[r].planned});
  std::printf("\n%s", fsdp::memory_table(table).c_str());
  if (!trace_path.empty()) {
    const auto s = fsdp::trace::summarize(rec.events(0), 0, static_cast<std::uint64_t>(cfg.steps));
    std::printf("\nrank 0, last step: %.3f ms, compute %.3f ms, communication %.3f ms, exposed %.3f ms (%.1f%%), "
                "%zu collectives\n",
                s.wall_s * 1e3, s.compute_s * 1e3, s.comm_s * 1e3, s.exposed_comm_s * 1e3,
                100.0 * s.exposed_fraction(), s.collectives.size());
    fsdp::trace::write_chrome_trace(rec, trace_path);
    std::printf("trace written to %s (open it in https://ui.perfetto.dev)\n", trace_path.c_str());
  }
  return 0;
}

template <class Strategy, class Precision>
int run(int ranks, mlp::config cfg, const std::string& trace_path) {
  fsdp::trace::recorder rec;
  if (!trace_path.empty()) cfg.model.recorder = &rec;
  using Policy = fsdp::policy<Strategy, fsdp::prefetch::next, Precision>;
  const int tp = cfg.model.tensor_parallel;  // the strategy's mesh is over the data-parallel ranks
  print_header(ranks, cfg, Strategy::name, fsdp::facts_of_precision<Precision>(),
               fsdp::mesh_of<Strategy>(tp > 0 && ranks % tp == 0 ? ranks / tp : ranks));
  std::vector<mlp::result> results(static_cast<std::size_t>(ranks));
  fsdp::comm::run_local(ranks, [&](fsdp::comm::local_communicator& comm) {
    results[static_cast<std::size_t>(comm.rank())] = mlp::train<Policy>(comm, cfg);
  });
  return print_results(cfg, results, rec, trace_path);
}

/// A hybrid strategy family whose shard group --shard-group chooses (2 or 4).
template <template <int> class Hybrid>
struct hybrid_family {};

/// The strategies for fsdp::select: one run per strategy type, the hybrid families by their shard group.
template <class Precision>
struct trainer {
  int ranks;
  const mlp::config& cfg;
  const std::string& trace_path;
  int shard_group;
  template <class Strategy>
  int operator()(fsdp::named<Strategy>) const {
    return run<Strategy, Precision>(ranks, cfg, trace_path);
  }
  template <template <int> class Hybrid>
  int operator()(fsdp::named<hybrid_family<Hybrid>>) const {
    return fsdp::select("--shard-group", std::to_string(shard_group), *this, fsdp::named<Hybrid<2>>{"2"},
                        fsdp::named<Hybrid<4>>{"4"});
  }
};

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4;
  std::string strategy = "full_shard", precision = "fp32";
  int shard_group = 2;  // the hybrid strategies: ranks per shard group
  std::string trace_path;
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
    else if (a == "--shard-group") shard_group = to_int(value(), "--shard-group");
    else if (a == "--optimizer") cfg.optimizer = value();
    else if (a == "--lr") cfg.lr = std::strtof(value(), nullptr);
    else if (a == "--precision") precision = value();
    else if (a == "--micro-batches") cfg.model.accumulation.micro_batches = to_int(value(), "--micro-batches");
    else if (a == "--no-sync") cfg.model.accumulation.sync = fsdp::grad_sync::last_micro_batch;
    else if (a == "--keep-gathered") cfg.model.accumulation.keep_gathered = true;
    else if (a == "--tp")
      cfg.model.tensor_parallel = to_int(value(), "--tp");
    else if (a == "--clip") {
      cfg.grad.max_norm = std::strtof(value(), nullptr);
      if (!(cfg.grad.max_norm > 0)) usage("--clip needs a positive number");
    }
    else if (a == "--trace") {
      trace_path = value();
      // under `bazel run` the program runs in its runfiles: a relative path means the caller's directory
      if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY"); wd && !trace_path.empty() && trace_path[0] != '/')
        trace_path = std::string(wd) + "/" + trace_path;
    }
    else usage(("unknown argument " + a).c_str());
  }
  try {
    namespace sh = fsdp::sharding;
    using fsdp::bfloat16;
    using fsdp::float16;
    using fsdp::named;
    using fsdp::precision::mixed;
    fsdp::grad::loss_scaler scaler;
    if (precision == "fp16") {  // fp16 needs loss scaling: the trainer scales its loss, the optimizer unscales
      cfg.grad.scaler = &scaler;
      cfg.loss_scale = &scaler;
    }
    return fsdp::select(
        "--precision", precision,
        [&](auto p) {
          return fsdp::select("--strategy", strategy,
                              trainer<typename decltype(p)::type>{ranks, cfg, trace_path, shard_group},
                              named<sh::full_shard>{"full_shard"}, named<sh::shard_grad_op>{"shard_grad_op"},
                              named<sh::zero1>{"zero1"}, named<sh::no_shard>{"no_shard"},
                              named<hybrid_family<sh::hybrid_shard>>{"hybrid_shard"},
                              named<hybrid_family<sh::hybrid_shard_zero2>>{"hybrid_shard_zero2"});
        },
        named<fsdp::precision::full>{"fp32"}, named<mixed<bfloat16>>{"bf16"},
        named<mixed<bfloat16, float, bfloat16>>{"bf16-reduce"}, named<mixed<float16, float, float16>>{"fp16"});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
