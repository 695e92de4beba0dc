// The planning command: what a GPT- or Llama-shaped model (dense, or a mixture of experts) costs per GPU on a
// cluster that is not here, from the library's planners (the memory planner's figures are the library's own, exact;
// the timeline planner's step runs the scheduler's decisions) and stated formulas for what the trainer itself holds
// and computes.
//
//   bazel run -c opt //bench:plan -- --model gpt2-124m --device h100 --nodes 1 --gpus-per-node 8
//   bazel run -c opt //bench:plan -- --model gpt3-175b --device a100-80gb --nodes 16,32,64 --micro-batch 1,2
//       --checkpointing on --strategy full_shard --prefetch backward_pre    (one line)
//   bazel run -c opt //bench:plan -- --model llama3-8b --device h100 --nodes 2 --tp 1,2
//   bazel run -c opt //bench:plan -- --model mixtral-8x7b --device h100 --nodes 4 --ep 1,2,4,8
//
// Llama's blocks (--model llama3-8b, mixtral-8x7b): RMSNorm gains, grouped-query attention (q [C, C], k and v of
// --kv-heads heads [2 kv C / A, C], o [C, C]), a SwiGLU MLP (gate and up [F, C], down [C, F]; --ffn F), rotary
// positions (no parameters), an untied head [V, C]. With --experts X (--top-k K) each block's MLP is X SwiGLU experts
// (stacked, param_options::experts) and a router [X, C]: the block's attention, norms and router are one unit, its
// experts another (a unit holds one kind), split over --ep ranks (model_options::expert_parallel) and sharded over
// the ranks holding the same experts. --tp T splits the blocks as Megatron does (q, k, v, gate and up by their
// output rows, o and down by their input columns; an expert on the same dimensions) and the strategies run over
// world / T data-parallel ranks.
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
//                    the classifier's 2 V C (embedding lookups are not FLOPs); all at the device's dense bf16
//                    rate x --efficiency, a block's over its tensor group (1 / T each). Beside it, each block's
//                    elementwise work (norms, GELU or SwiGLU, softmax, residuals): its activation bytes written and
//                    read once in forward, twice in backward, at the memory bandwidth. An expert unit's matrices are
//                    its K experts' of each token (the active parameters).
//   trainer comms    under --tp, two all-reduces of the block's output (b T C bf16 each) in forward and two of the
//                    input gradients in backward, on the tensor group's link; with experts, the tokens' dispatch and
//                    combine (b T K C bf16 each) in forward and again in backward, as all_to_alls on the expert
//                    group's link (unit_time's tensor and expert bytes).
//   activations      bf16, per block per micro-batch of b sequences: s b C (34 + 5 a s / C) bytes (Korthikanti et
//                    al., "Reducing Activation Recomputation in Large Transformer Models", 2022, eq. 1: dropout
//                    masks included, the a x s x s attention scores kept), or s b C x 34 with --attention flash
//                    (no s x s scores); a Llama block (no dropout, flash attention): 2 s b (4 C + (C + 2 kv C / A
//                    + C) / T + 3 K F / T) bytes (its norms' inputs and outputs and the residual, q, k, v and the
//                    attention's output, the SwiGLU's gate, up and product for each of K experts a token, 1 for a
//                    dense MLP); with checkpointing each block keeps only its input (2 s b C) and one
//                    block's full activations live during its backward; plus the logits in bf16 and their fp32
//                    gradient (6 s b V bytes). Added to the library's planned peak as if both peaked at once.
//   outside the plan --reserve GiB (CUDA context, cuBLAS workspace, NCCL's buffers).
//   MFU              model FLOPs per token (6 per active matrix parameter + 12 L T C; gpt::flops_per_token for
//                    GPT) x tokens/s / the peak; "hardware" TFLOP/s counts a checkpointed forward's recompute too
//                    (8 per parameter).
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
               "usage: plan [--model gpt2-124m|gpt2-1.5b|gpt3-175b|llama3-8b|mixtral-8x7b|deepseek-moe-16b]\n"
               "            [--layers L --width C "
               "--heads A --vocab V --context T]\n"
               "            [--kv-heads K --ffn F --experts X --top-k K --shared-experts S --dense-layers D "
               "--dense-ffn F (Llama's blocks)]\n"
               "            [--tp T[,T...]] [--ep E[,E...]]\n"
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

/// A model to plan: GPT-2's blocks (gpt::make_spec), or Llama's (see the top of this file), with `experts` > 0 a
/// mixture of experts in each block: DeepSeekMoE's with `shared` experts every token goes through (in the block's
/// dense unit) and its first `dense_layers` blocks a dense SwiGLU of `dense_ffn`.
struct model_shape {
  gpt::shape base;  ///< vocab, context, width, heads, layers
  bool llama = false;
  int kv_heads = 0, ffn = 0;  ///< Llama: key/value heads, the SwiGLU's hidden width (an expert's, with experts)
  int experts = 0, top_k = 0;
  int shared = 0, dense_layers = 0, dense_ffn = 0;

  bool moe_layer(int l) const { return experts > 0 && l >= dense_layers; }
  /// Block l's dense unit's MLP matrices: the SwiGLU's (dense_ffn's in a leading dense block), or the router's and
  /// the shared experts'.
  double dense_mlp(int l) const {
    const double C = base.width;
    if (!moe_layer(l)) return 3.0 * (experts > 0 ? dense_ffn : ffn) * C;
    return experts * C + 3.0 * shared * ffn * C;
  }
  /// A token's routed experts' matrices in a block of experts.
  double active_experts() const { return 3.0 * top_k * ffn * base.width; }
};

struct preset {
  const char* name;
  model_shape shape;
};

const preset models[] = {
    {"gpt2-124m", {{50257, 1024, 768, 12, 12}}},
    {"gpt2-1.5b", {{50257, 1024, 1600, 25, 48}}},
    {"gpt3-175b", {{50000, 2048, 12288, 96, 96}}},
    // Meta's Llama 3 8B (its published configuration; context 8192)
    {"llama3-8b", {{128256, 8192, 4096, 32, 32}, true, 8, 14336}},
    // Mistral's Mixtral 8x7B (its published configuration, planned at a context of 4096): 8 experts, 2 a token
    {"mixtral-8x7b", {{32000, 4096, 4096, 32, 32}, true, 8, 14336, 8, 2}},
    // DeepSeekMoE 16B (its published configuration): 64 routed experts of 1408, 6 a token, 2 shared, the first
    // block dense (10944); multi-head attention
    {"deepseek-moe-16b", {{102400, 4096, 2048, 16, 28}, true, 16, 1408, 64, 6, 2, 1, 10944}},
};

std::string lname(int l, const std::string& leaf) { return "h." + std::to_string(l) + "." + leaf; }

/// The model's spec (global shapes, placed for tensor parallelism).
fsdp::ModelSpec spec_of(const model_shape& m) {
  if (!m.llama) return gpt::make_spec(m.base, 0);
  const std::int64_t V = m.base.vocab, C = m.base.width, A = m.base.heads, F = m.ffn, X = m.experts;
  const std::int64_t KV = 2 * m.kv_heads * (C / A);
  const fsdp::tensor_placement column = fsdp::tp::split(0), row = fsdp::tp::split(1);
  fsdp::ModelSpec spec;
  spec.add("tok_embeddings", {V, C});
  for (int l = 0; l < m.base.layers; ++l) {
    spec.add(lname(l, "attention_norm"), {C}, {.flags = {.no_decay = true}});
    spec.add(lname(l, "attention.wq"), {C, C}, {.tensor = column});
    spec.add(lname(l, "attention.wkv"), {KV, C}, {.tensor = fsdp::tp::split(0, 2)});
    spec.add(lname(l, "attention.wo"), {C, C}, {.tensor = row});
    spec.add(lname(l, "ffn_norm"), {C}, {.flags = {.no_decay = true}});
    if (!m.moe_layer(l)) {
      const std::int64_t D = X ? m.dense_ffn : F;
      spec.add(lname(l, "feed_forward.w13"), {2 * D, C}, {.tensor = fsdp::tp::split(0, 2)});
      spec.add(lname(l, "feed_forward.w2"), {C, D}, {.tensor = row});
    } else {
      spec.add(lname(l, "router"), {X, C});
      if (m.shared > 0) {
        const std::int64_t S = std::int64_t{m.shared} * F;
        spec.add(lname(l, "shared_experts.w13"), {2 * S, C}, {.tensor = fsdp::tp::split(0, 2)});
        spec.add(lname(l, "shared_experts.w2"), {C, S}, {.tensor = row});
      }
      spec.add(lname(l, "experts.w13"), {X, 2 * F, C}, {.tensor = fsdp::tp::split(1, 2), .experts = true});
      spec.add(lname(l, "experts.w2"), {X, C, F}, {.tensor = fsdp::tp::split(2), .experts = true});
    }
  }
  spec.add("norm", {C}, {.flags = {.no_decay = true}});
  spec.add("output", {V, C});
  return spec;
}

/// One unit per block, a block's experts one of their own ("h.L.experts"), everything else the root.
fsdp::wrap::experts_apart<fsdp::wrap::by_prefix> wrapping_of() { return {fsdp::wrap::by_prefix{"h."}}; }

/// Model FLOPs per token (forward and backward; active parameters): gpt::flops_per_token, or for Llama's blocks 6 per
/// active matrix parameter (a token's K experts, the router, the untied head) + 12 L T C.
double flops_per_token(const model_shape& m) {
  if (!m.llama) return gpt::flops_per_token(m.base);
  const double C = m.base.width, L = m.base.layers, V = m.base.vocab, T = m.base.context;
  const double kv = 2.0 * m.kv_heads * (C / m.base.heads);
  double blocks = 0;
  for (int l = 0; l < m.base.layers; ++l)
    blocks += 2 * C * C + kv * C + m.dense_mlp(l) + (m.moe_layer(l) ? m.active_experts() : 0);
  return 6.0 * (blocks + V * C) + 12.0 * L * T * C;
}

struct strategy_choice {
  std::string label;
  fsdp::strategy_facts facts;
  fsdp::device_mesh mesh;
};

/// The data-parallel strategies at `dp` data-parallel ranks (the world over tensor groups of `tp`) on nodes of `gpus`
/// (hybrid: a shard group per node), with the library's own facts and meshes (hybrid_shard's shard group is a template
/// argument: its facts are hybrid_shard's with the group sizes of this cluster); the mesh's tensor and expert degrees
/// set.
std::vector<strategy_choice> strategies(const std::string& which, int dp, int gpus, int tp, int ep) {
  std::vector<strategy_choice> out;
  auto want = [&](const char* s) { return which == "all" || which == s; };
  auto add = [&]<class S>(const char* label, S) {
    if (want(label)) out.push_back({label, fsdp::facts_of<S>(dp), fsdp::mesh_of<S>(dp)});
  };
  add("full_shard", fsdp::sharding::full_shard{});
  add("shard_grad_op", fsdp::sharding::shard_grad_op{});
  const int per_node = gpus / tp;  // data-parallel ranks a node
  if (want("hybrid") && per_node >= 1 && gpus % tp == 0 && dp > per_node && dp % per_node == 0) {
    fsdp::strategy_facts f = fsdp::facts_of<fsdp::sharding::hybrid_shard<1>>(dp);
    f.shard_group = per_node;
    f.replicate_group = dp / per_node;
    out.push_back(
        {"hybrid " + std::to_string(dp / per_node) + "x" + std::to_string(per_node), f, {dp / per_node, per_node}});
  }
  add("no_shard", fsdp::sharding::no_shard{});
  for (strategy_choice& c : out) {
    c.mesh.tensor = tp;
    c.mesh.expert = ep;
    if (tp > 1) c.label += " tp" + std::to_string(tp);
    if (ep > 1) c.label += " ep" + std::to_string(ep);
  }
  return out;
}

/// Why the expert degree does not fit this strategy's mesh (the sentence can_implement would give), or empty.
std::string expert_problem(const strategy_choice& c, int ep) {
  if (ep == 1) return {};
  const fsdp::device_mesh& m = c.mesh;
  if (c.facts.splits_world() ? m.shards % ep != 0 : m.data_parallel() % ep != 0)
    return "expert_parallel = " + std::to_string(ep) + " does not divide its " +
           (c.facts.splits_world() ? "shard group" : "data-parallel ranks");
  return {};
}

struct settings {
  model_shape shape = models[0].shape;
  std::string model = models[0].name;
  std::vector<int> tp{1}, ep{1};
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

activations activations_of(const settings& s, int b, bool checkpointing, int tp) {
  const model_shape& m = s.shape;
  const double T = m.base.context, C = m.base.width, A = m.base.heads, L = m.base.layers, V = m.base.vocab;
  activations a;
  if (m.llama) {
    const double kv = 2.0 * m.kv_heads * (C / A);
    const double hidden = m.experts ? (m.top_k + m.shared) * double(m.ffn) : m.ffn;  // a block of experts'
    a.per_block = 2 * T * b * (4 * C + (2 * C + kv) / tp + 3 * hidden / tp);
  } else {
    a.per_block = T * b * C * 34 + (s.attention == "eager" ? 5 * A * T * T * b : 0);
  }
  a.kept = checkpointing ? L * 2 * T * b * C + a.per_block : L * a.per_block;
  a.logits = 6 * T * b * V;
  return a;
}

/// A unit's compute: its FLOPs at the device's rate (a block's over its tensor group), its elementwise bytes at the
/// memory bandwidth; the trainer's own collectives' bytes (see the top of this file).
fsdp::unit_time compute_of(const settings& s, const std::string& unit, int b, bool checkpointing, int tp) {
  const model_shape& m = s.shape;
  const double T = m.base.context, C = m.base.width, V = m.base.vocab, A = m.base.heads;
  const double rate = s.dev.flops * s.dev.efficiency, tokens = T * b;
  const bool experts = unit.size() > 8 && unit.compare(unit.size() - 8, 8, ".experts") == 0;
  double forward = 0, backward = 0;
  fsdp::unit_time out;
  if (experts) {  // a token's K experts, each a SwiGLU
    const double flops = tokens * 2 * m.active_experts() / tp;
    forward = flops / rate;
    backward = 2 * flops / rate + (checkpointing ? forward : 0);
    out.expert_forward_bytes = out.expert_backward_bytes = static_cast<std::int64_t>(2 * tokens * m.top_k * C * 2);
  } else if (unit.rfind("h.", 0) == 0) {
    double matrices = 12 * C * C;
    if (m.llama) {
      const double kv = 2.0 * m.kv_heads * (C / A);
      matrices = 2 * C * C + kv * C + m.dense_mlp(std::stoi(unit.substr(2)));
    }
    const double flops = tokens * (2 * matrices + 4 * T * C) / tp;
    const double bytes = activations_of(s, b, false, tp).per_block;
    forward = flops / rate + 2 * bytes / s.dev.memory_bw;
    backward = 2 * flops / rate + 4 * bytes / s.dev.memory_bw + (checkpointing ? forward : 0);
    if (tp > 1) out.tensor_forward_bytes = out.tensor_backward_bytes = static_cast<std::int64_t>(2 * tokens * C * 2);
  } else {  // the root unit: the classifier (tied for GPT)
    forward = tokens * 2 * V * C / rate;
    backward = 2 * forward;
  }
  out.forward = std::chrono::nanoseconds(static_cast<std::int64_t>(forward * 1e9));
  out.backward = std::chrono::nanoseconds(static_cast<std::int64_t>(backward * 1e9));
  return out;
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
      s.shape.base.layers = one_int(value(), a), s.model = "custom";
    else if (a == "--width")
      s.shape.base.width = one_int(value(), a), s.model = "custom";
    else if (a == "--heads")
      s.shape.base.heads = one_int(value(), a), s.model = "custom";
    else if (a == "--vocab")
      s.shape.base.vocab = one_int(value(), a), s.model = "custom";
    else if (a == "--context")
      s.shape.base.context = one_int(value(), a), s.model = "custom";
    else if (a == "--kv-heads")
      s.shape.kv_heads = one_int(value(), a), s.shape.llama = true, s.model = "custom";
    else if (a == "--ffn")
      s.shape.ffn = one_int(value(), a), s.shape.llama = true, s.model = "custom";
    else if (a == "--experts")
      s.shape.experts = one_int(value(), a), s.shape.llama = true, s.model = "custom";
    else if (a == "--top-k")
      s.shape.top_k = one_int(value(), a), s.model = "custom";
    else if (a == "--shared-experts")
      s.shape.shared = one_int(value(), a), s.model = "custom";
    else if (a == "--dense-layers")
      s.shape.dense_layers = one_int(value(), a), s.model = "custom";
    else if (a == "--dense-ffn")
      s.shape.dense_ffn = one_int(value(), a), s.model = "custom";
    else if (a == "--tp")
      s.tp = int_list(value(), a);
    else if (a == "--ep")
      s.ep = int_list(value(), a);
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
    gpt::validate(s.shape.base);
  } catch (const fsdp::usage_error& e) {
    usage(e.what());
  }
  if (s.shape.llama) {
    if (s.shape.kv_heads < 1 || s.shape.base.heads % s.shape.kv_heads != 0)
      usage("--kv-heads must divide the " + std::to_string(s.shape.base.heads) + " heads");
    if (s.shape.ffn < 1) usage("Llama's blocks need --ffn (the SwiGLU's hidden width)");
    if (s.shape.experts > 0 && (s.shape.top_k < 1 || s.shape.top_k > s.shape.experts))
      usage("--top-k must be between 1 and the " + std::to_string(s.shape.experts) + " experts");
    if (s.shape.dense_layers > 0 && s.shape.dense_ffn < 1)
      usage("--dense-layers needs --dense-ffn (their SwiGLU's hidden width)");
  }
  if (!s.shape.experts && (s.ep.size() != 1 || s.ep.front() != 1)) usage("--ep needs a model with experts");

  fsdp::comm::cluster_links cluster;
  cluster.gpus_per_node = s.gpus;
  cluster.intra.bytes_per_second = s.nvlink;
  cluster.intra.latency = std::chrono::microseconds(10);
  cluster.inter.bytes_per_second = s.network / s.gpus;
  cluster.inter.latency = std::chrono::microseconds(20);
  cluster.inter.step_latency = std::chrono::microseconds(5);

  const fsdp::ModelSpec spec = spec_of(s.shape);
  const double params = double(spec.numel());
  const gpt::shape& g = s.shape.base;
  std::printf("plan: %s (%.3g parameters: %d layers, width %d, %d heads, vocabulary %d, context %d", s.model.c_str(),
              params, g.layers, g.width, g.heads, g.vocab, g.context);
  if (s.shape.llama)
    std::printf("; Llama blocks: %d key/value heads, SwiGLU of %d, untied head", s.shape.kv_heads, s.shape.ffn);
  if (s.shape.shared)
    std::printf("; %d shared experts, the first %d block(s) dense (SwiGLU of %d)", s.shape.shared, s.shape.dense_layers,
                s.shape.dense_ffn);
  if (s.shape.experts)
    std::printf("; %d experts a block, %d a token: %.3g active parameters", s.shape.experts, s.shape.top_k,
                flops_per_token(s.shape) / 6 - 2.0 * g.layers * g.context * g.width);
  std::printf(")\n");
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

  const double model_flops = flops_per_token(s.shape);
  // a checkpointed step computes each block's forward twice: its matrices' 2 FLOPs a parameter and attention's 4 T C
  // (the blocks' third of the model FLOPs, but the head's and the attention's, again)
  const double C = g.width, V = g.vocab;
  const double hardware_flops_on =
      model_flops + (model_flops - 6 * V * C - 12.0 * g.layers * g.context * C) / 3 + g.layers * 4.0 * g.context * C;
  std::vector<outcome> fits;
  std::vector<std::string> left_out;
  for (int n : s.nodes)
    for (int tp : s.tp)
      for (int ep : s.ep) {
        const int world = n * s.gpus;
        if (world % tp != 0 || s.gpus % tp != 0) {
          left_out.push_back("tp " + std::to_string(tp) + " on " + std::to_string(world) +
                             ": a tensor group must fit in a node of " + std::to_string(s.gpus));
          continue;
        }
        for (const strategy_choice& st : strategies(s.strategy, world / tp, s.gpus, tp, ep)) {
          if (const std::string why = expert_problem(st, ep); !why.empty()) {
            left_out.push_back(st.label + " on " + std::to_string(world) + ": " + why);
            continue;
          }
          fsdp::planned_units units;
          try {
            units = fsdp::plan_units(st.label, spec, wrapping_of(), st.mesh);
          } catch (const fsdp::usage_error& e) {  // a split the degrees do not divide
            left_out.push_back(st.label + " on " + std::to_string(world) + ": " + e.what());
            continue;
          }
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
                o.act = activations_of(s, b, ck, tp);
                o.total_bytes = double(o.plan.peak.total) + o.act.peak() + s.reserve;
                if (!o.plan.feasible()) {
                  left_out.push_back(o.label + ": " + o.plan.infeasible);
                  continue;
                }
                if (o.total_bytes > s.dev.memory) {
                  char why[160];
                  std::snprintf(why, sizeof why, ": %.1f GiB (library %.1f, activations and logits %.1f) over %.1f",
                                gib(o.total_bytes), gib(double(o.plan.peak.total)), gib(o.act.peak()),
                                gib(s.dev.memory));
                  left_out.push_back(o.label + why);
                  continue;
                }
                fsdp::time_model t;
                fsdp::place_on_cluster(t, cluster, st.mesh);
                t.memory_bytes_per_second = s.dev.memory_bw;
                t.serial_collectives = true;
                for (const std::string& name : units.names) t.compute.push_back(compute_of(s, name, b, ck, tp));
                o.time = fsdp::plan_timeline(units.names, units.layouts, in, t);
                if (!o.time.feasible()) {
                  left_out.push_back(o.label + ": " + o.time.infeasible);
                  continue;
                }
                // a tensor group's ranks share their micro-batch: tokens a GPU are the data-parallel rank's over tp
                const double step = double(o.time.step_ns) * 1e-9, tokens = double(b) * g.context / tp;
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
