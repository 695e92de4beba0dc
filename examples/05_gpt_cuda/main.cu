// The GPT example on GPUs (the model of examples/04_gpt_host; the loop is the same code). Three ways to run it:
//   local ranks on one GPU:  bazel run //examples/05_gpt_cuda -- --ranks 4 [--steps 50] [--compare-host]
//   NCCL, one GPU per rank:  mpirun -np 2 -x FSDP_RENDEZVOUS_FILE=/shared/path/run1
//                              bazel-bin/examples/05_gpt_cuda/05_gpt_cuda --nccl
//                            (or torchrun/srun: RANK, WORLD_SIZE, LOCAL_RANK and FSDP_RENDEZVOUS_FILE set). The
//                            rendezvous file is a path every rank sees; without it comm::nccl::from_env refuses a
//                            world of more than one (docs/errors.md).
//   NCCL ranks as threads:   05_gpt_cuda --nccl-threads --ranks 4 [--compare-host]: comm::run_nccl_threads, rank r on
//                            visible device r % count; several on one GPU need NCCL 2.30 and
//                            NCCL_MULTI_RANK_GPU_ENABLE=1 (such a world shows correctness, not speed).
// Options as 04_gpt_host's (--layers, --width, --heads, --context, --vocab, --batch, --lr, --warmup, --seed,
// --precision bf16|fp32, --strategy, --checkpoint-activations, --pack, --tp T, --experts N --top-k K --ep E: a
// mixture of experts, experts.cuh's kernels), and --gemm cublas|plain, --attention
// tensor|twin (attention's tile products on tensor cores, bf16 only, the default there; or their twin from the
// warp's lanes, the default in fp32 and the only one on the simulated GPU: attention.cuh), --head-rows R (the
// classifier and cross-entropy R token rows at a time; by default the rows whose fp32 logits fit 256 MiB:
// buffer_plan.hpp's head_rows), --peak-tflops X (the device's peak, for the MFU column; 989 for an H100's dense bf16
// by default), --plan (prints the trainer's buffers for one rank, buffer_plan.hpp, and exits: no GPU needed; before
// step 1 the same table is printed, and at the end the trainers' measured peak is checked against it: equal to the
// byte, or the run fails), --floor (prints the step's floor for one rank, step_work.hpp: every launch of a step, its
// matrix FLOPs and its bytes over a matrix rate and a copy rate, and exits: no GPU needed; after a run the same table
// is printed beside the measured mean step, and the trainer's launches in its last step are checked against its
// rows, kernel by kernel, or the run fails), --matrix-tflops X --copy-gbs Y (the floor's two ceilings; by default
// measured after the run where cuBLAS is built, else an H200's recorded ones). --compare-host also trains the host
// trainer with the same ranks and configuration and checks every step's loss and gradient norm: within 1e-4 relative
// in fp32, 5e-3 (loss) and 5e-2 (norm) in bf16 (the GEMMs and their bf16 operands, the kernels' sum orders and the
// device's exp, tanh and log round otherwise than the host's). --graph trains every step from the second on as a replay
// of one CUDA graph (fsdp::step_graph: the forward, backward, optimizer and the loss's all-reduce captured once; the
// batch uploaded and the loss read outside it), then the same run eager, and checks every loss and gradient norm bit
// for bit (not with --pack nor --experts; under comm::local at one rank only, whose ranks cannot be captured
// together). Without a GPU it prints why and exits with status 2 (but --plan and --floor).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "examples/04_gpt_host/gpt_host.hpp"
#include "examples/05_gpt_cuda/buffer_plan.hpp"
#include "examples/05_gpt_cuda/gpt_cuda.cuh"
#include "examples/05_gpt_cuda/step_work.hpp"

namespace {

int usage(const std::string& why) {
  std::fprintf(
      stderr,
      "error: %s\nusage: 05_gpt_cuda [--ranks N [--nccl-threads] | --nccl] [--steps S] [--precision bf16|fp32] "
      "[--strategy full_shard|shard_grad_op|no_shard] [--checkpoint-activations] [--layers L] [--width C] "
      "[--heads H] [--context T] [--vocab V] [--batch B] [--lr X] [--warmup W] [--seed S] "
      "[--pack] [--tp T] [--experts N --top-k K --ep E] [--gemm cublas|plain] [--attention tensor|twin] "
      "[--head-rows R] [--peak-tflops X] "
      "[--compare-host] [--graph] "
      "[--plan] [--floor] [--matrix-tflops X --copy-gbs Y]\n",
      why.c_str());
  return 1;
}

/// Sequences per rank of `world`: the global batch over the data-parallel ranks (world / --tp), or 0 when it does
/// not split.
int batch_of(const gpt::config& cfg, int world) {
  const int tp = cfg.options.tensor_parallel;
  if (world <= 0 || tp <= 0 || world % tp != 0 || cfg.global_batch % (world / tp) != 0) return 0;
  return cfg.global_batch / (world / tp);
}
/// plan(sequences per rank, the trainer's settings) for one rank of `world`, or none when the batch does not split.
template <class Plan>
auto for_rank(const gpt::config& cfg, int world, bool bf16, int head_rows, Plan&& plan) -> decltype(plan(0, {})) {
  const int batch = batch_of(cfg, world);
  if (batch == 0) return {};
  return plan(batch, gpt_cuda::buffer_settings{.bf16 = bf16,
                                               .checkpoint_activations = cfg.checkpoint_activations,
                                               .packed = cfg.packing.on,
                                               .head_rows = head_rows,
                                               .tensor = cfg.options.tensor_parallel,
                                               .expert_parallel = cfg.options.expert_parallel});
}
/// The trainer's buffers for one rank of `world` (gpt_cuda::buffer_plan).
std::vector<gpt_cuda::planned_buffer> plan_for(const gpt::config& cfg, int world, bool bf16, int head_rows) {
  return for_rank(cfg, world, bf16, head_rows,
                  [&](int batch, gpt_cuda::buffer_settings o) { return gpt_cuda::buffer_plan(cfg.model, batch, o); });
}
/// The trainer's step for one rank of `world` (gpt_cuda::step_work).
std::vector<gpt_cuda::kernel_work> work_for(const gpt::config& cfg, int world, bool bf16, int head_rows) {
  return for_rank(cfg, world, bf16, head_rows, [&](int batch, gpt_cuda::buffer_settings o) {
    return gpt_cuda::step_work(cfg.model, batch, o, world);
  });
}

/// The ceilings an H200 of this project's GPU machine gave (docs/benchmarks.md): the floor's reference where none is
/// measured (a run without cuBLAS, or --floor without a GPU).
gpt_cuda::ceilings recorded_ceilings() {
  return {788e12, 4231e9,
          "recorded on an H200: a bf16 8192^3 product at 788 TFLOP/s, a 1 GiB device copy at 4231 GB/s; not measured "
          "in this run"};
}

#ifndef EXAMPLES_NO_CUBLAS
/// The two ceilings measured on this GPU: a 1 GiB device-to-device copy (bytes read plus written) and an 8192^3
/// product through the trainer's own matrix product (cuBLAS, in the compute type W, random operands), each the
/// median of 10 timed runs after 3 warm-ups, timed with events.
template <class W>
__global__ void fill_random(W* x, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    x[i] = W(static_cast<float>(h % 2001u) / 1000.0f - 1.0f);
  }
}
template <class W>
gpt_cuda::ceilings measure_ceilings() {
  cudaStream_t st;
  FSDP_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  FSDP_CUDA_CHECK(cudaEventCreate(&a));
  FSDP_CUDA_CHECK(cudaEventCreate(&b));
  auto median_ms = [&](auto&& work) {
    std::vector<float> ms;
    for (int i = 0; i < 13; ++i) {
      FSDP_CUDA_CHECK(cudaEventRecord(a, st));
      work();
      FSDP_CUDA_CHECK(cudaEventRecord(b, st));
      FSDP_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      FSDP_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      if (i >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };
  const std::size_t copy_bytes = std::size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  FSDP_CUDA_CHECK(cudaMalloc(&src, copy_bytes));
  FSDP_CUDA_CHECK(cudaMalloc(&dst, copy_bytes));
  fill_random<float><<<1024, 256, 0, st>>>(static_cast<float*>(src), copy_bytes / 4, 1u);
  const double copy_ms =
      median_ms([&] { FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st)); });
  FSDP_CUDA_CHECK(cudaFree(src));
  FSDP_CUDA_CHECK(cudaFree(dst));
  const int n = 8192;
  const std::size_t nn = std::size_t(n) * n;
  W *x = nullptr, *y = nullptr;
  float* z = nullptr;
  FSDP_CUDA_CHECK(cudaMalloc(&x, nn * sizeof(W)));
  FSDP_CUDA_CHECK(cudaMalloc(&y, nn * sizeof(W)));
  FSDP_CUDA_CHECK(cudaMalloc(&z, nn * sizeof(float)));
  fill_random<W><<<1024, 256, 0, st>>>(x, static_cast<long long>(nn), 2u);
  fill_random<W><<<1024, 256, 0, st>>>(y, static_cast<long long>(nn), 3u);
  FSDP_CUDA_CHECK(cudaGetLastError());
  examples::gemm mm(examples::gemm_kind::cublas, st);
  const double product_ms = median_ms([&] { mm(true, false, n, n, n, 1.0f, x, n, y, n, 0.0f, z, n); });
  FSDP_CUDA_CHECK(cudaFree(x));
  FSDP_CUDA_CHECK(cudaFree(y));
  FSDP_CUDA_CHECK(cudaFree(z));
  FSDP_CUDA_CHECK(cudaEventDestroy(a));
  FSDP_CUDA_CHECK(cudaEventDestroy(b));
  FSDP_CUDA_CHECK(cudaStreamDestroy(st));
  const double flops = 2.0 * n * n * n / (product_ms / 1e3), bytes = 2.0 * copy_bytes / (copy_ms / 1e3);
  char source[200];
  std::snprintf(source, sizeof source, "measured in this run: a %s 8192^3 product, a 1 GiB device copy",
                sizeof(W) == 2 ? "bf16" : "fp32");
  return {flops, bytes, source};
}
#endif

/// Equal, kernel by kernel, or the lines that differ: the trainer's counted launches in its last step against
/// step_work's rows.
std::string launches_differ(const std::vector<gpt_cuda::kernel_work>& work,
                            const std::unordered_map<const char*, std::size_t>& tally) {
  std::map<std::string, std::size_t> counted;
  for (const auto& [name, n] : tally) counted[name] += n;
  std::string out;
  for (const auto& k : work) {
    if (k.library) continue;
    const auto it = counted.find(k.name);
    const std::size_t got = it == counted.end() ? 0 : it->second;
    if (got != k.launches)
      out += "  " + k.name + ": planned " + std::to_string(k.launches) + ", counted " + std::to_string(got) + "\n";
    if (it != counted.end()) counted.erase(it);
  }
  for (const auto& [name, n] : counted) out += "  " + name + ": planned 0, counted " + std::to_string(n) + "\n";
  return out;
}

void print_plan(const std::vector<gpt_cuda::planned_buffer>& plan, int batch) {
  std::printf("the trainer's buffers, planned for one rank (%d sequences):\n%s", batch,
              gpt_cuda::buffer_table(plan).c_str());
}

template <class Sharding, class Precision, class Comm>
using policy = fsdp::policy<Sharding, fsdp::prefetch::backward_pre<1>, Precision, Comm>;

template <class Sharding, class Precision>
int run(int ranks, bool use_nccl, bool nccl_threads, bool compare, const gpt::config& cfg, gpt_cuda::kernel_choice kind,
        const gpt_cuda::ceilings& given) {
  gpt::result r0;
  std::vector<fsdp::rank_memory> table;  // every local rank's (NCCL: this process's rank 0 only)
  std::mutex mu;
  std::unordered_map<const char*, std::size_t> tally;  // rank 0's trainer's launches in its last step
  const auto& s = cfg.model;
  const auto pf = fsdp::facts_of_precision<Precision>();
  const bool bf16 = pf.compute == fsdp::dtype::bf16;
  auto header = [&](int world) {
    std::printf(
        "GPT on CUDA: %d layers, width %d, %d heads, context %d, vocabulary %d: %lld parameters; %s, %d "
        "rank(s)%s, %s compute, global batch %d %s%s; attention on %s\n",
        s.layers, s.width, s.heads, s.context, s.vocab, static_cast<long long>(gpt::parameters(s)),
        std::string(Sharding::name).c_str(), world,
        cfg.options.tensor_parallel > 1
            ? (" in tensor groups of " + std::to_string(cfg.options.tensor_parallel)).c_str()
            : "",
        std::string(fsdp::name_of(pf.compute)).c_str(), cfg.global_batch,
        cfg.packing.on ? "packed rows of documents" : "sequences",
        cfg.checkpoint_activations ? ", activation checkpointing" : "", gpt_cuda::attention::name_of(kind.attention));
    if (const auto plan = plan_for(cfg, world, bf16, kind.head_rows); !plan.empty())
      print_plan(plan, batch_of(cfg, world));
  };
  int ranks_here = ranks;  // the ranks whose trainers this process holds
  // Trains `conf` on the ranks of the chosen launch: rank 0's result into r0, every local rank's memory into the table,
  // rank 0's trainer's launches in its last step into the tally. Returns false where this process is not rank 0's.
  auto train_all = [&](const gpt::config& conf, bool announce) {
    if (use_nccl) {
      auto comm = fsdp::comm::nccl::from_env();
      if (announce && comm.rank() == 0) header(comm.size());
      if (announce && comm.rank() == 0)
        std::printf("NCCL %s: one process a rank\n", fsdp::comm::nccl::version().c_str());
      r0 = gpt_cuda::train<policy<Sharding, Precision, fsdp::comm::nccl>>(comm, conf, kind);
      tally = gpt_cuda::launch_tally();
      if (comm.rank() != 0) return false;
      table.assign(1, {comm.rank(), r0.memory.peak, r0.planned});
      ranks = comm.size();
      ranks_here = 1;
    } else if (nccl_threads) {  // every rank a thread of this process with its own NCCL communicator
      if (announce) header(ranks);
      if (announce)
        std::printf("NCCL %s: %d ranks as threads of this process\n", fsdp::comm::nccl::version().c_str(), ranks);
      table.assign(static_cast<std::size_t>(ranks), {});
      fsdp::comm::run_nccl_threads(ranks, [&](fsdp::comm::nccl_communicator& c) {
        auto r = gpt_cuda::train<policy<Sharding, Precision, fsdp::comm::nccl>>(c, conf, kind);
        std::lock_guard lk(mu);
        table[static_cast<std::size_t>(c.rank())] = {c.rank(), r.memory.peak, r.planned};
        if (c.rank() == 0) r0 = std::move(r), tally = gpt_cuda::launch_tally();  // rank 0's thread
      });
    } else {
      if (announce) header(ranks);
      table.assign(static_cast<std::size_t>(ranks), {});
      fsdp::comm::run_local_cuda(ranks, [&](fsdp::comm::local_cuda_communicator& c) {
        auto r = gpt_cuda::train<policy<Sharding, Precision, fsdp::comm::local<fsdp::backend::cuda>>>(c, conf, kind);
        std::lock_guard lk(mu);
        table[static_cast<std::size_t>(c.rank())] = {c.rank(), r.memory.peak, r.planned};
        if (c.rank() == 0) r0 = std::move(r), tally = gpt_cuda::launch_tally();  // rank 0's thread
      });
    }
    return true;
  };
  const bool rank0_here = train_all(cfg, true);
  if (cfg.graph) {  // the same run with every step eager: the losses bit for bit, and the launches of a step counted
    gpt::result replayed = std::move(r0);
    gpt::config eager = cfg;
    eager.graph = false;
    eager.verbose = false;
    train_all(eager, false);  // in every process, as the first run (under --nccl every rank trains it)
    if (!rank0_here) return 0;
    // the replays' gradient norms are their own decisions', read back from the device after each replay
    const bool same = replayed.losses.size() == r0.losses.size() && replayed.norms.size() == r0.norms.size() &&
                      std::memcmp(replayed.losses.data(), r0.losses.data(), r0.losses.size() * sizeof(float)) == 0 &&
                      std::memcmp(replayed.norms.data(), r0.norms.data(), r0.norms.size() * sizeof(double)) == 0;
    std::printf(
        "graph: step 0 eager, step 1 captured, steps 1..%d replayed; every loss and gradient norm equal to an eager "
        "run's bit for bit: %s\n",
        cfg.steps - 1, same ? "yes" : "NO");
    if (!same) return 1;
    r0 = std::move(replayed);  // the figures below are the replayed run's; the launches the eager run's last step's
  }
  if (!rank0_here) return 0;
  double tokens = 0;
  for (std::int64_t n : r0.step_tokens) tokens += static_cast<double>(n);
  std::printf("trained %d steps on %d rank(s) in %.3f s (%.0f tokens/s): loss %.6f -> %.6f\n", cfg.steps, ranks,
              r0.seconds, tokens / r0.seconds, r0.losses.front(), r0.losses.back());
  const gpt::throughput t = gpt::mean_throughput(cfg, r0);
  // Peak memory as PyTorch's max_memory_allocated counts it (allocations, no context or cuBLAS workspace): the
  // library's peak (its pool holds exactly the plan) plus the most the trainer's buffers held (kept across steps).
  // With local ranks both figures are every rank's on this GPU together (the trainers' counter is the process's).
  double lib = 0, planned = 0;
  for (const auto& m : table) lib += m.measured.total / 1048576.0, planned += m.planned.total / 1048576.0;
  const double mine = gpt_cuda::dbuf::peak_bytes() / 1048576.0;
  std::printf("mean step %.4f s over steps %d..%d, %.0f tokens/s, MFU %.2f%% of %.0f TFLOP/s; peak memory %.1f MiB "
              "(library %.1f MiB, planned %.1f MiB; trainer buffers %.1f MiB)%s\n",
              t.step_s, t.first, t.first + t.steps - 1, t.tokens_per_s, 100.0 * t.mfu, cfg.peak_flops / 1e12,
              lib + mine, lib, planned, mine, table.size() > 1 ? ", all local ranks together" : "");
  std::printf("\n%s", fsdp::memory_table(table).c_str());
  std::printf("activations held by the trainer at the end of forward: %.1f MiB\n", r0.activation_bytes / 1048576.0);
  // The trainers' measured peak against their plan: equal to the byte, or the plan (buffer_plan.hpp) is wrong.
  const std::size_t want = gpt_cuda::total_bytes(plan_for(cfg, ranks, bf16, kind.head_rows)) *
                           static_cast<std::size_t>(ranks_here),
                    got = gpt_cuda::dbuf::peak_bytes();
  std::printf("trainer buffers: planned %zu bytes (%d rank(s) here), measured peak %zu bytes: %s\n", want, ranks_here,
              got, want == got ? "equal" : "DIFFER");
  if (want != got) return 1;
  // The step's floor (step_work.hpp) against the measured mean step, and its launches against the trainer's.
  const auto work = work_for(cfg, ranks, bf16, kind.head_rows);
  gpt_cuda::ceilings ceil = given.flops_per_s > 0 ? given : recorded_ceilings();
#ifndef EXAMPLES_NO_CUBLAS
  if (given.flops_per_s <= 0) ceil = bf16 ? measure_ceilings<fsdp::bfloat16>() : measure_ceilings<float>();
#endif
  const double floor_s = gpt_cuda::floor_seconds(work, ceil);
  std::printf("\n%s", gpt_cuda::floor_table(work, ceil).c_str());
  std::printf("measured mean step %.3f ms, floor %.3f ms: the step is %.2f times its floor\n", 1e3 * t.step_s,
              1e3 * floor_s, t.step_s / floor_s);
  const std::string differ = launches_differ(work, tally);
  std::size_t planned_launches = 0;
  for (const auto& k : work) planned_launches += k.launches;
  std::printf("trainer launches in the last step: planned %zu, by kernel: %s\n%s", planned_launches,
              differ.empty() ? "equal to those counted" : "DIFFER", differ.c_str());
  if (!differ.empty()) return 1;
  if (!compare) return 0;
  gpt::config host_cfg = cfg;
  host_cfg.verbose = false;
  host_cfg.graph = false;  // the host trainer computes outside the streams: eager, the losses the same
  gpt::result host;
  fsdp::comm::run_local(ranks, [&](fsdp::comm::local_communicator& c) {
    auto r = gpt::train<fsdp::policy<Sharding, fsdp::prefetch::backward_pre<1>, Precision>>(c, host_cfg);
    std::lock_guard lk(mu);
    if (c.rank() == 0) host = std::move(r);
  });
  // The losses, and the gradient norms before clipping: a gradient a little off moves the next losses by less than
  // it moves the norm (AdamW's update does not change with a gradient's scale).
  auto relative = [](double a, double b) { return std::fabs(a - b) / std::max(1e-12, std::fabs(b)); };
  const bool same_steps = r0.losses.size() == host.losses.size() && r0.norms.size() == host.norms.size() &&
                          host.norms.size() == host.losses.size();
  double worst = 0, worst_norm = 0;
  for (std::size_t i = 0; same_steps && i < host.losses.size(); ++i) {
    worst = std::max(worst, relative(r0.losses[i], host.losses[i]));
    worst_norm = std::max(worst_norm, relative(r0.norms[i], host.norms[i]));
  }
  const bool fp32 = pf.compute == fsdp::dtype::f32;
  const double tolerance = fp32 ? 1e-4 : 5e-3, norm_tolerance = fp32 ? 1e-4 : 5e-2;
  const bool ok = same_steps && worst <= tolerance && worst_norm <= norm_tolerance;
  std::printf(
      "compare with the host backend: largest relative loss difference %.3g and gradient norm difference %.3g "
      "over %zu steps (tolerances %g, %g): %s\n",
      worst, worst_norm, host.losses.size(), tolerance, norm_tolerance, ok ? "agree" : "DIFFER");
  return ok ? 0 : 1;
}

int to_int(const char* v) {
  char* end = nullptr;
  const long x = v ? std::strtol(v, &end, 10) : 0;
  return v && end && !*end && x > 0 && x <= (1 << 20) ? static_cast<int>(x) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  gpt::config cfg;
  cfg.global_batch = 16;
  int ranks = 4;
  bool use_nccl = false, nccl_threads = false, compare = false, ranks_given = false, plan_only = false,
       floor_only = false;
  double peak_tflops = 989.0, matrix_tflops = 0, copy_gbs = 0;
  std::string strategy = "full_shard", precision = "bf16";
#ifdef EXAMPLES_NO_CUBLAS
  examples::gemm_kind kind = examples::gemm_kind::plain;
#else
  examples::gemm_kind kind = examples::gemm_kind::cublas;
#endif
  std::string attention = "default";
  int head_rows = 0;  // 0: buffer_plan.hpp's head_rows decides
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    auto positive = [&](int& out) {
      out = to_int(value());
      return out > 0;
    };
    const char* v = nullptr;
    if (a == "--nccl") use_nccl = true;
    else if (a == "--nccl-threads")
      nccl_threads = true;
    else if (a == "--plan")
      plan_only = true;
    else if (a == "--floor")
      floor_only = true;
    else if (a == "--compare-host") compare = true;
    else if (a == "--checkpoint-activations") cfg.checkpoint_activations = true;
    else if (a == "--pack") cfg.packing.on = true;
    else if (a == "--graph")
      cfg.graph = true;
    else if (a == "--ranks" && positive(ranks)) ranks_given = true;
    else if (a == "--tp" && positive(cfg.options.tensor_parallel))
      continue;
    else if (a == "--experts" && positive(cfg.model.experts))
      continue;
    else if (a == "--top-k" && positive(cfg.model.top_k))
      continue;
    else if (a == "--ep" && positive(cfg.options.expert_parallel))
      continue;
    else if (a == "--steps" && positive(cfg.steps)) continue;
    else if (a == "--batch" && positive(cfg.global_batch)) continue;
    else if (a == "--head-rows" && positive(head_rows))
      continue;
    else if (a == "--layers" && positive(cfg.model.layers)) continue;
    else if (a == "--width" && positive(cfg.model.width)) continue;
    else if (a == "--heads" && positive(cfg.model.heads)) continue;
    else if (a == "--context" && positive(cfg.model.context)) continue;
    else if (a == "--vocab" && positive(cfg.model.vocab)) continue;
    else if (a == "--warmup" && positive(cfg.opt.warmup)) continue;
    else if (a == "--seed" && (v = value()) && to_int(v) > 0) cfg.seed = static_cast<std::uint64_t>(to_int(v));
    else if (a == "--lr" && (v = value()) && (cfg.opt.lr = std::strtof(v, nullptr)) > 0) continue;
    else if (a == "--peak-tflops" && (v = value()) && (peak_tflops = std::strtod(v, nullptr)) > 0) continue;
    else if (a == "--matrix-tflops" && (v = value()) && (matrix_tflops = std::strtod(v, nullptr)) > 0)
      continue;
    else if (a == "--copy-gbs" && (v = value()) && (copy_gbs = std::strtod(v, nullptr)) > 0)
      continue;
    else if (a == "--strategy" && (v = value())) strategy = v;
    else if (a == "--precision" && (v = value())) precision = v;
    else if (a == "--gemm" && (v = value()) && (std::string(v) == "cublas" || std::string(v) == "plain"))
      kind = std::string(v) == "plain" ? examples::gemm_kind::plain : examples::gemm_kind::cublas;
    else if (a == "--attention" && (v = value()) && (std::string(v) == "tensor" || std::string(v) == "twin"))
      attention = v;
    else return usage("unknown, incomplete or non-positive argument '" + a + "'");
  }
  if (use_nccl && ranks_given) return usage("--ranks is for local ranks; under --nccl the launcher's WORLD_SIZE says");
  if (use_nccl && nccl_threads)
    return usage("--nccl (one process a rank) or --nccl-threads (one thread a rank), not both");
  cfg.opt.total = cfg.steps;
  cfg.verbose = true;
  cfg.peak_flops = peak_tflops * 1e12;
  if ((matrix_tflops > 0) != (copy_gbs > 0))
    return usage("--matrix-tflops and --copy-gbs go together (the floor's two ceilings)");
  const gpt_cuda::ceilings given{matrix_tflops * 1e12, copy_gbs * 1e9, "given: --matrix-tflops, --copy-gbs"};
  if (plan_only || floor_only) {  // the trainer's buffers or its step's floor for one of --ranks ranks, without a GPU
    try {
      gpt::validate(cfg.model, cfg.options.tensor_parallel);
      if (precision != "bf16" && precision != "fp32") return usage("--precision is bf16 or fp32");
      const auto plan = plan_for(cfg, ranks, precision == "bf16", head_rows);
      if (plan.empty()) return usage("--tp must divide --ranks, and --batch split evenly over --ranks / --tp");
      if (plan_only) print_plan(plan, batch_of(cfg, ranks));
      if (floor_only)
        std::printf("%s", gpt_cuda::floor_table(work_for(cfg, ranks, precision == "bf16", head_rows),
                                                given.flops_per_s > 0 ? given : recorded_ceilings())
                              .c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
  if (p.count == 0) {
    std::printf("skipped: no CUDA device (%s); the host trainer runs everywhere: bazel run //examples/04_gpt_host\n",
                p.reason.c_str());
    return 2;
  }
  try {
    gpt::validate(cfg.model, cfg.options.tensor_parallel);
    return gpt::with_policy_flags(strategy, precision, [&](auto s, auto p) {
      using Precision = typename decltype(p)::type;
      const bool bf16 = fsdp::facts_of_precision<Precision>().compute == fsdp::dtype::bf16;
      const gpt_cuda::kernel_choice k{kind,
                                      attention == "default"  ? gpt_cuda::default_product(bf16)
                                      : attention == "tensor" ? gpt_cuda::attention::product::tensor
                                                              : gpt_cuda::attention::product::twin,
                                      head_rows};
      return run<typename decltype(s)::type, Precision>(ranks, use_nccl, nccl_threads, compare, cfg, k, given);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
