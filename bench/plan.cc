// The planning command: what a GPT-shaped model costs per GPU on a cluster that is not here, from the library's
// planners (the memory planner's figures are the library's own, exact; the timeline planner's step runs the
// scheduler's decisions) and stated formulas for what the trainer itself holds and computes.
//
//   bazel run -c opt //bench:plan -- --model gpt2-124m --device h100 --nodes 1 --gpus-per-node 8
//   bazel run -c opt //bench:plan -- --model gpt3-175b --device a100-80gb --nodes 16,32,64 --micro-batch 1,2
//       --checkpointing on --strategy full_shard --prefetch backward_pre    (one line)
//
// For every configuration (strategy and mesh, micro-batch, activation checkpointing, prefetch) it plans the
// library's memory (fsdp::plan_memory) and step (fsdp::plan_timeline, links from comm::cluster_links), adds the
// trainer's activations, and ranks the configurations that fit the device's memory by tokens/s per GPU; then
// prints the best one's memory by category and where its step goes. Every figure below is a model (see
// docs/timeline.md, "Planning a run"):
//
//   trainer compute  per token, a block's forward is 2 x its matrices' parameters + 4 T C (attention's two
//                    products over the whole T x T, as PaLM's MFU convention counts them) FLOPs, its backward twice
//                    that, and a checkpointed block's backward adds its forward again; the root unit's forward is
//                    the tied classifier's 2 V C (embedding lookups are not FLOPs); all at the device's dense bf16
//                    rate x --efficiency. Beside it, each block's elementwise work (norms, GELU, softmax,
//                    residuals): its activation bytes written and read once in forward, twice in backward, at the
//                    memory bandwidth.
//   activations      bf16, per block per micro-batch of b sequences: s b C (34 + 5 a s / C) bytes (Korthikanti et
//                    al., "Reducing Activation Recomputation in Large Transformer Models", 2022, eq. 1: dropout
//                    masks included, the a x s x s attention scores kept), or s b C x 34 with --attention flash
//                    (no s x s scores); with checkpointing each block keeps only its input (2 s b C) and one
//                    block's full activations live during its backward; plus the logits in bf16 and their fp32
//                    gradient (6 s b V bytes). Added to the library's planned peak as if both peaked at once.
//   outside the plan --reserve GiB (CUDA context, cuBLAS workspace, NCCL's buffers).
//   MFU              model FLOPs per token (gpt::flops_per_token: 6 per matrix parameter + 12 L T C) x tokens/s /
//                    the peak; "hardware" TFLOP/s counts a checkpointed forward's recompute too (8 per parameter).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fsdp/fsdp.hpp>

#include "examples/04_gpt_host/gpt_model.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "plan: %s\n"
               "usage: plan [--model gpt2-124m|gpt2-1.5b|gpt3-175b] [--layers L --width C --heads A --vocab V "
               "--context T]\n"
               "            [--device a100-80gb|h100|h200] [--tflops F --efficiency E --memory-bandwidth GB/s "
               "--memory GiB]\n"
               "            [--nodes N[,N...]] [--gpus-per-node G] [--nvlink GB/s] [--network GB/s a node]\n"
               "            [--strategy all|full_shard|shard_grad_op|hybrid|no_shard] [--micro-batch B[,B...]]\n"
               "            [--checkpointing on|off|both] [--prefetch all|next|backward_pre|none] [--reduce "
               "bf16|fp32]\n"
               "            [--attention flash|eager] [--reserve GiB] [--top K]\n",
               why.c_str());
  std::exit(2);
}

std::vector<int> int_list(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1'000'000)
      usage(flag + " takes positive integers, got '" + s + "'");
    out.push_back(static_cast<int>(v));
  }
  return out;
}

int one_int(const std::string& s, const std::string& flag) {
  const std::vector<int> v = int_list(s, flag);
  if (v.size() != 1) usage(flag + " takes one positive integer, got '" + s + "'");
  return v.front();
}

double number(const std::string& s, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v > 0)) usage(flag + " takes a positive number, got '" + s + "'");
  return v;
}

struct device {
  std::string name;
  double flops = 0;         ///< dense bf16, per second
  double efficiency = 0.6;  ///< the fraction of it the trainer's products reach
  double memory_bw = 0;     ///< bytes per second
  double memory = 0;        ///< bytes
};

const device devices[] = {
    {"a100-80gb", 312e12, 0.6, 2.039e12, 80.0 * (1 << 30)},
    {"h100", 989e12, 0.6, 3.35e12, 80.0 * (1 << 30)},
    {"h200", 989e12, 0.6, 4.8e12, 141e9},
};

struct preset {
  const char* name;
  gpt::shape shape;
};

const preset models[] = {
    {"gpt2-124m", {50257, 1024, 768, 12, 12}},
    {"gpt2-1.5b", {50257, 1024, 1600, 25, 48}},
    {"gpt3-175b", {50000, 2048, 12288, 96, 96}},
};

struct strategy_choice {
  std::string label;
  fsdp::strategy_facts facts;
  fsdp::device_mesh mesh;
};

/// The data-parallel strategies at `world` ranks on nodes of `gpus` (hybrid: a shard group per node), with the
/// library's own facts and meshes (hybrid_shard's shard group is a template argument: its facts are hybrid_shard's
/// with the group sizes of this cluster).
std::vector<strategy_choice> strategies(const std::string& which, int world, int gpus) {
  std::vector<strategy_choice> out;
  auto want = [&](const char* s) { return which == "all" || which == s; };
  auto add = [&]<class S>(const char* label, S) {
    if (want(label)) out.push_back({label, fsdp::facts_of<S>(world), fsdp::mesh_of<S>(world)});
  };
  add("full_shard", fsdp::sharding::full_shard{});
  add("shard_grad_op", fsdp::sharding::shard_grad_op{});
  if (want("hybrid") && world > gpus && world % gpus == 0) {
    fsdp::strategy_facts f = fsdp::facts_of<fsdp::sharding::hybrid_shard<1>>(world);
    f.shard_group = gpus;
    f.replicate_group = world / gpus;
    out.push_back({"hybrid " + std::to_string(world / gpus) + "x" + std::to_string(gpus), f, {world / gpus, gpus}});
  }
  add("no_shard", fsdp::sharding::no_shard{});
  return out;
}

struct settings {
  gpt::shape shape = models[0].shape;
  std::string model = models[0].name;
  device dev = devices[1];
  std::vector<int> nodes{1};
  int gpus = 8;
  double nvlink = 0, network = 0;  ///< bytes per second: a GPU's inside a node, a node's between nodes
  std::string strategy = "all", prefetch = "all", checkpointing = "both", reduce = "fp32", attention = "flash";
  std::vector<int> micro_batch{1, 2, 4, 8};
  double reserve = 1.5 * (1 << 30);
  int top = 12;
};

/// The trainer's activation bytes per micro-batch (see the top of this file).
struct activations {
  double per_block = 0;  ///< one block's, all kept
  double kept = 0;       ///< the whole model's at the start of backward
  double logits = 0;
  double peak() const { return kept + logits; }
};

activations activations_of(const settings& s, int b, bool checkpointing) {
  const double T = s.shape.context, C = s.shape.width, A = s.shape.heads, L = s.shape.layers, V = s.shape.vocab;
  activations a;
  a.per_block = T * b * C * 34 + (s.attention == "eager" ? 5 * A * T * T * b : 0);
  a.kept = checkpointing ? L * 2 * T * b * C + a.per_block : L * a.per_block;
  a.logits = 6 * T * b * V;
  return a;
}

/// A unit's compute: its FLOPs at the device's rate, its elementwise bytes at the memory bandwidth.
fsdp::unit_time compute_of(const settings& s, const std::string& unit, int b, bool checkpointing) {
  const double T = s.shape.context, C = s.shape.width, V = s.shape.vocab;
  const double rate = s.dev.flops * s.dev.efficiency, tokens = T * b;
  double forward = 0, backward = 0;
  if (unit.rfind("h.", 0) == 0) {
    const double matrices = 12 * C * C;
    const double flops = tokens * (2 * matrices + 4 * T * C);
    const double bytes = activations_of(s, b, false).per_block;
    forward = flops / rate + 2 * bytes / s.dev.memory_bw;
    backward = 2 * flops / rate + 4 * bytes / s.dev.memory_bw + (checkpointing ? forward : 0);
  } else {  // the root unit: the tied classifier
    forward = tokens * 2 * V * C / rate;
    backward = 2 * forward;
  }
  return {std::chrono::nanoseconds(static_cast<std::int64_t>(forward * 1e9)),
          std::chrono::nanoseconds(static_cast<std::int64_t>(backward * 1e9))};
}

struct outcome {
  std::string label;
  int world = 0, micro_batch = 0;
  bool checkpointing = false;
  fsdp::memory_plan plan;
  fsdp::timeline time;
  activations act;
  double total_bytes = 0;  ///< the library's peak + activations + the reserve
  double tokens_per_gpu_s = 0, mfu = 0, model_tflops = 0, hardware_tflops = 0;
};

double gib(double b) { return b / double(1 << 30); }

void print_best(const settings& s, const outcome& o) {
  std::printf("\nthe best: %s\n", o.label.c_str());
  std::printf("  memory per GPU (the library's planned peak by category, exact; the trainer's by the formula):\n");
  for (std::size_t c = 0; c < fsdp::mem_categories; ++c)
    if (o.plan.peak.bytes[c] > 0)
      std::printf("    %-22s %9.2f GiB\n", std::string(fsdp::name_of(static_cast<fsdp::mem>(c))).c_str(),
                  gib(double(o.plan.peak.bytes[c])));
  std::printf("    %-22s %9.2f GiB (at the peak moment; the categories' own peaks need not coincide)\n",
              "library total", gib(double(o.plan.peak.total)));
  std::printf("    %-22s %9.2f GiB (%s)\n", "activations", gib(o.act.kept),
              o.checkpointing ? "each block's input, and one block recomputed" : "every block's");
  std::printf("    %-22s %9.2f GiB\n", "logits", gib(o.act.logits));
  std::printf("    %-22s %9.2f GiB\n", "reserve", gib(s.reserve));
  std::printf("    %-22s %9.2f GiB of %.2f\n", "total", gib(o.total_bytes), gib(s.dev.memory));
  const double step = double(o.time.step_ns) * 1e-9;
  std::printf("  step %.3f s: compute %.3f s, communication %.3f s of which exposed %.3f s (%.1f%% of the step)\n",
              step, double(o.time.compute_ns) * 1e-9, double(o.time.comm_ns) * 1e-9, double(o.time.exposed_ns) * 1e-9,
              100 * o.time.exposed_fraction());
  if (o.time.commit_ns > 0)  // an optimizer without clipping: the step's own commit (model_options::commit_step)
    std::printf(
        "  the step's commit: %.3f ms, all exposed (an all-reduce of one element over the world; none with "
        "clipping)\n",
        double(o.time.commit_ns) * 1e-6);
  std::printf("  %.0f tokens/s per GPU, MFU %.1f%%, %.0f model TFLOP/s per GPU (%.0f counting the recompute)\n",
              o.tokens_per_gpu_s, 100 * o.mfu, o.model_tflops, o.hardware_tflops);
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  std::optional<double> tflops, efficiency, bandwidth, memory;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") {
      const std::string v = value();
      const auto* m = std::find_if(std::begin(models), std::end(models), [&](const preset& p) { return v == p.name; });
      if (m == std::end(models)) usage("unknown model '" + v + "'");
      s.shape = m->shape;
      s.model = v;
    } else if (a == "--layers")
      s.shape.layers = one_int(value(), a), s.model = "custom";
    else if (a == "--width")
      s.shape.width = one_int(value(), a), s.model = "custom";
    else if (a == "--heads")
      s.shape.heads = one_int(value(), a), s.model = "custom";
    else if (a == "--vocab")
      s.shape.vocab = one_int(value(), a), s.model = "custom";
    else if (a == "--context")
      s.shape.context = one_int(value(), a), s.model = "custom";
    else if (a == "--device") {
      const std::string v = value();
      const auto same = [&](const device& x) { return v == x.name; };
      const auto* d = std::find_if(std::begin(devices), std::end(devices), same);
      if (d == std::end(devices)) usage("unknown device '" + v + "'");
      s.dev = *d;
    } else if (a == "--tflops")
      tflops = number(value(), a) * 1e12;
    else if (a == "--efficiency")
      efficiency = number(value(), a);
    else if (a == "--memory-bandwidth")
      bandwidth = number(value(), a) * 1e9;
    else if (a == "--memory")
      memory = number(value(), a) * double(1 << 30);
    else if (a == "--nodes")
      s.nodes = int_list(value(), a);
    else if (a == "--gpus-per-node")
      s.gpus = one_int(value(), a);
    else if (a == "--nvlink")
      s.nvlink = number(value(), a) * 1e9;
    else if (a == "--network")
      s.network = number(value(), a) * 1e9;
    else if (a == "--strategy")
      s.strategy = value();
    else if (a == "--micro-batch")
      s.micro_batch = int_list(value(), a);
    else if (a == "--checkpointing")
      s.checkpointing = value();
    else if (a == "--prefetch")
      s.prefetch = value();
    else if (a == "--reduce")
      s.reduce = value();
    else if (a == "--attention")
      s.attention = value();
    else if (a == "--reserve")
      s.reserve = number(value(), a) * double(1 << 30);
    else if (a == "--top")
      s.top = one_int(value(), a);
    else
      usage("unknown option '" + a + "'");
  }
  if (tflops) s.dev.flops = *tflops, s.dev.name = "custom";
  if (efficiency) s.dev.efficiency = *efficiency;
  if (bandwidth) s.dev.memory_bw = *bandwidth;
  if (memory) s.dev.memory = *memory;
  if (s.dev.efficiency > 1) usage("--efficiency is a fraction of the peak, at most 1");
  const auto one_of = [](const std::string& v, const std::string& allowed) {
    if ((" " + allowed + " ").find(" " + v + " ") == std::string::npos) usage("'" + v + "' is not one of: " + allowed);
  };
  one_of(s.strategy, "all full_shard shard_grad_op hybrid no_shard");
  one_of(s.prefetch, "all next backward_pre none");
  one_of(s.checkpointing, "on off both");
  one_of(s.reduce, "bf16 fp32");
  one_of(s.attention, "flash eager");
  // The defaults (A100 DGX-like): NVLink's bus bandwidth inside a node, 8 x 200 Gb/s between nodes.
  if (s.nvlink == 0) s.nvlink = 230e9;
  if (s.network == 0) s.network = 200e9;
  try {
    gpt::validate(s.shape);
  } catch (const fsdp::usage_error& e) {
    usage(e.what());
  }

  fsdp::comm::cluster_links cluster;
  cluster.gpus_per_node = s.gpus;
  cluster.intra.bytes_per_second = s.nvlink;
  cluster.intra.latency = std::chrono::microseconds(10);
  cluster.inter.bytes_per_second = s.network / s.gpus;
  cluster.inter.latency = std::chrono::microseconds(20);
  cluster.inter.step_latency = std::chrono::microseconds(5);

  const fsdp::ModelSpec spec = gpt::make_spec(s.shape, 0);
  const double params = double(spec.numel());
  std::printf("plan: %s (%.3g parameters: %d layers, width %d, %d heads, vocabulary %d, context %d)\n", s.model.c_str(),
              params, s.shape.layers, s.shape.width, s.shape.heads, s.shape.vocab, s.shape.context);
  std::printf(
      "on %s: %.0f TFLOP/s dense bf16 at %.0f%% for the products, %.0f GB/s memory, %.1f GiB; nodes of %d "
      "GPUs, %.0f GB/s a GPU inside a node, %.0f GB/s a node between nodes\n",
      s.dev.name.c_str(), s.dev.flops / 1e12, 100 * s.dev.efficiency, s.dev.memory_bw / 1e9, gib(s.dev.memory), s.gpus,
      s.nvlink / 1e9, s.network / 1e9);
  std::printf(
      "bf16 parameters gathered, gradients reduced in %s, AdamW (2 fp32 states), fp32 master shards; "
      "reserve %.1f GiB outside the plan; collectives one at a time (comm::nccl's default)\n\n",
      s.reduce.c_str(), gib(s.reserve));

  const fsdp::precision_facts precision =
      s.reduce == "bf16" ? fsdp::facts_of_precision<fsdp::precision::mixed<fsdp::bfloat16, float, fsdp::bfloat16>>()
                         : fsdp::facts_of_precision<fsdp::precision::mixed<fsdp::bfloat16>>();
  struct prefetch_choice {
    const char* name;
    fsdp::prefetch_facts facts;
  };
  std::vector<prefetch_choice> prefetches;
  if (s.prefetch == "all" || s.prefetch == "next") prefetches.push_back({"next", {1, 1, false, false}});
  if (s.prefetch == "all" || s.prefetch == "backward_pre") prefetches.push_back({"backward_pre", {0, 1, false, false}});
  if (s.prefetch == "all" || s.prefetch == "none") prefetches.push_back({"none", {0, 0, false, false}});
  std::vector<bool> ckpts;
  if (s.checkpointing != "on") ckpts.push_back(false);
  if (s.checkpointing != "off") ckpts.push_back(true);

  const double model_flops = gpt::flops_per_token(s.shape);
  // a checkpointed step computes each block's forward twice: its matrices' 2 FLOPs a parameter and attention's 4 T C
  const double C = s.shape.width;
  const double hardware_flops_on = model_flops + s.shape.layers * (2 * 12 * C * C + 4.0 * s.shape.context * C);
  std::vector<outcome> fits;
  std::vector<std::string> left_out;
  for (int n : s.nodes) {
    const int world = n * s.gpus;
    for (const strategy_choice& st : strategies(s.strategy, world, s.gpus)) {
      const fsdp::planned_units units =
          fsdp::plan_units(st.label, spec, gpt::wrapping(), st.facts.shards_params ? st.facts.shard_group : 1);
      for (int b : s.micro_batch)
        for (bool ck : ckpts)
          for (const prefetch_choice& pf : prefetches) {
            outcome o;
            o.world = world;
            o.micro_batch = b;
            o.checkpointing = ck;
            o.label = st.label + " on " + std::to_string(world) + ", micro-batch " + std::to_string(b) +
                      (ck ? ", checkpointed" : "") + ", prefetch " + pf.name;
            fsdp::budget_query q;
            q.strategy = st.facts;
            q.precision = precision;
            q.optimizer_states = 2;
            const fsdp::memory_plan_inputs in = fsdp::planner_inputs(units, q, pf.facts);
            o.plan = fsdp::plan_memory(units.names, units.layouts, in);
            o.act = activations_of(s, b, ck);
            o.total_bytes = double(o.plan.peak.total) + o.act.peak() + s.reserve;
            if (!o.plan.feasible()) {
              left_out.push_back(o.label + ": " + o.plan.infeasible);
              continue;
            }
            if (o.total_bytes > s.dev.memory) {
              char why[160];
              std::snprintf(why, sizeof why, ": %.1f GiB (library %.1f, activations and logits %.1f) over %.1f",
                            gib(o.total_bytes), gib(double(o.plan.peak.total)), gib(o.act.peak()), gib(s.dev.memory));
              left_out.push_back(o.label + why);
              continue;
            }
            fsdp::time_model t;
            fsdp::place_on_cluster(t, cluster, st.mesh);
            t.memory_bytes_per_second = s.dev.memory_bw;
            t.serial_collectives = true;
            for (const std::string& name : units.names) t.compute.push_back(compute_of(s, name, b, ck));
            o.time = fsdp::plan_timeline(units.names, units.layouts, in, t);
            if (!o.time.feasible()) {
              left_out.push_back(o.label + ": " + o.time.infeasible);
              continue;
            }
            const double step = double(o.time.step_ns) * 1e-9, tokens = double(b) * s.shape.context;
            o.tokens_per_gpu_s = tokens / step;
            o.model_tflops = o.tokens_per_gpu_s * model_flops / 1e12;
            o.hardware_tflops = o.tokens_per_gpu_s * (ck ? hardware_flops_on : model_flops) / 1e12;
            o.mfu = o.model_tflops * 1e12 / s.dev.flops;
            fits.push_back(std::move(o));
          }
    }
  }
  std::stable_sort(fits.begin(), fits.end(),
                   [](const outcome& a, const outcome& b) { return a.tokens_per_gpu_s > b.tokens_per_gpu_s; });
  std::printf("%-4s %-68s %8s %8s %9s %7s %6s %8s %8s\n", "rank", "configuration", "GiB/GPU", "step s", "tok/s/GPU",
              "exposed", "MFU", "TFLOP/s", "hw");
  for (std::size_t i = 0; i < fits.size() && int(i) < s.top; ++i) {
    const outcome& o = fits[i];
    std::printf("%-4zu %-68s %8.1f %8.3f %9.0f %6.1f%% %5.1f%% %8.0f %8.0f\n", i + 1, o.label.c_str(),
                gib(o.total_bytes), double(o.time.step_ns) * 1e-9, o.tokens_per_gpu_s, 100 * o.time.exposed_fraction(),
                100 * o.mfu, o.model_tflops, o.hardware_tflops);
  }
  if (fits.size() > std::size_t(s.top)) std::printf("(%zu more that fit)\n", fits.size() - std::size_t(s.top));
  std::printf("%zu configurations fit, %zu do not", fits.size(), left_out.size());
  if (!left_out.empty()) std::printf(" (e.g. %s)", left_out.front().c_str());
  std::printf("\n");
  if (!fits.empty()) print_best(s, fits.front());
  return fits.empty() ? 1 : 0;
}
