// CPU offload (fsdp/policy/offload.hpp): what each option saves on the device and what it costs over the host
// link, before the first step (the planner) and measured on the host backend with a modelled link.
//
//   1. Planned, GPT-2 small (124 M parameters: 12 blocks of width 768, vocabulary 50 257, context 1024) at 8
//      ranks, bf16 compute, AdamW: per option the device and host peaks per rank and the bytes one step moves
//      over the link; then the budget helper's pick (grouping, depth, offload) for a few device budgets.
//   2. Measured on the host backend: the example MLP at 2 thread ranks with every copy on the copy streams slowed
//      to a modelled link (latency + bytes / bandwidth, dilated so that it shows next to host compute), step time
//      against no offload in the same run (the baseline), and the link time the plan predicts.
//
// The host backend's compute is the CPU's: the measured ratios show the copies' and the host optimizer's
// overlap, not a GPU's. On a GPU the same figures come from the CUDA backend (not run yet: no GPU was lent).
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "examples/01_mlp_host/mlp.hpp"
#include "fsdp/fsdp.hpp"

namespace {

namespace offload = fsdp::offload;

fsdp::ModelSpec gpt2_small() {
  const std::int64_t V = 50257, T = 1024, C = 768;
  fsdp::ModelSpec s;
  s.add("wte", {V, C});
  s.add("wpe", {T, C});
  for (int l = 0; l < 12; ++l) {
    const std::string b = "h." + std::to_string(l) + ".";
    s.add(b + "ln_1.w", {C});
    s.add(b + "ln_1.b", {C});
    s.add(b + "attn.qkv.w", {3 * C, C});
    s.add(b + "attn.qkv.b", {3 * C});
    s.add(b + "attn.proj.w", {C, C});
    s.add(b + "attn.proj.b", {C});
    s.add(b + "ln_2.w", {C});
    s.add(b + "ln_2.b", {C});
    s.add(b + "mlp.fc.w", {4 * C, C});
    s.add(b + "mlp.fc.b", {4 * C});
    s.add(b + "mlp.proj.w", {C, 4 * C});
    s.add(b + "mlp.proj.b", {C});
  }
  s.add("ln_f.w", {C});
  s.add("ln_f.b", {C});
  return s;
}

struct option {
  const char* name;
  fsdp::offload_facts facts;
};
const std::array<option, 6> options = {{
    {"none (baseline)", offload::none::facts},
    {"params", offload::cpu<offload::params>::facts},
    {"grads", offload::cpu<offload::grads>::facts},
    {"optimizer_state", offload::cpu<offload::optimizer_state>::facts},
    {"params+grads", offload::cpu<offload::params | offload::grads>::facts},
    {"all (host step)", offload::all::facts},
}};

double mib(std::int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

void planned() {
  const int world = 8;
  const fsdp::ModelSpec spec = gpt2_small();
  const auto blocks = fsdp::plan_units("one block per unit", spec, fsdp::wrap::by_prefix{"h."}, world);
  fsdp::budget_query q;
  q.strategy = fsdp::facts_of<fsdp::sharding::full_shard>(world);
  q.precision = fsdp::facts_of_precision<fsdp::precision::mixed<fsdp::bfloat16>>();
  q.optimizer_states = 2;
  q.max_depth = 2;
  std::printf("GPT-2 small (%lld parameters), %d ranks, bf16 compute, AdamW, prefetch depth 1, per rank:\n",
              static_cast<long long>(spec.numel()), world);
  std::printf("  %-18s %14s %14s %16s %16s\n", "offload", "device MiB", "host MiB", "to device MiB", "to host MiB");
  for (const option& o : options) {
    q.offload = o.facts;
    const fsdp::memory_plan p = fsdp::detail::plan_at(blocks, q, 1);
    std::printf("  %-18s %14.1f %14.1f %16.1f %16.1f\n", o.name, mib(p.peak.total), mib(p.host_peak.total),
                mib(p.link.to_device), mib(p.link.to_host));
  }
  std::vector<fsdp::offload_facts> facts;
  for (const option& o : options) facts.push_back(o.facts);
  const std::vector<fsdp::planned_units> groupings = {
      fsdp::plan_units("two blocks per unit", spec,
                       fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
                         if (p.name.rfind("h.", 0) != 0) return std::string("root");
                         return "g" + std::to_string(std::stoi(p.name.substr(2)) / 2);
                       }},
                       world),
      blocks};
  std::printf(
      "\nThe budget helper's pick (fewest link bytes that fit; groupings preferred in this order: two blocks per "
      "unit, one block per unit):\n");
  for (double budget_mib : {720.0, 690.0, 650.0, 600.0, 560.0, 500.0}) {
    const auto c = fsdp::fit_device_budget(groupings, facts, q, static_cast<std::int64_t>(budget_mib * 1024 * 1024));
    if (!c) {
      std::printf("  device budget %6.0f MiB: nothing fits\n", budget_mib);
      continue;
    }
    std::printf("  device budget %6.0f MiB: %-20s depth %d, offload %-16s device %6.1f MiB, host %6.1f MiB, link %6.1f "
                "MiB per step\n",
                budget_mib, groupings[c->candidate].label.c_str(), c->depth, options[c->offload].name,
                mib(c->plan.peak.total), mib(c->plan.host_peak.total), mib(c->plan.link.total()));
  }
}

template <class Offload>
mlp::result measure(const mlp::config& c, double bytes_per_us, int latency_us) {
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>,
                         fsdp::comm::local<>, Offload>;
  fsdp::comm::local_options lo;
  lo.backend.copy_delay = [=](std::string_view, std::int64_t bytes) {
    if (bytes == 0) return std::chrono::microseconds(0);  // host functions: only their own time
    return std::chrono::microseconds(latency_us + static_cast<std::int64_t>(static_cast<double>(bytes) / bytes_per_us));
  };
  std::vector<mlp::result> out(2);
  fsdp::comm::run_local(
      2, [&](fsdp::comm::local_communicator& comm) { out[comm.rank()] = mlp::train<P>(comm, c); }, lo);
  return out[0];
}

void measured(double bytes_per_us) {
  mlp::config c;
  c.dims = {256, 1024, 1024, 1024, 256};
  c.global_batch = 64;
  c.steps = 6;
  const int latency_us = 10;
  std::printf("\nMeasured on the host backend: MLP %d-1024-1024-1024-%d (%d units), 2 thread ranks, bf16 compute, "
              "AdamW, %d steps;\nmodelled link %.2f GB/s, %d us per copy (dilated)\n",
              c.dims.front(), c.dims.back(), static_cast<int>(c.dims.size() - 1), c.steps, bytes_per_us / 1000.0,
              latency_us);
  std::printf("  %-18s %12s %12s %14s %14s %12s %8s\n", "offload", "device KiB", "host KiB", "link KiB/step",
              "link ms/step", "step ms", "vs none");
  double base = 0;
  auto row = [&](const char* name, const mlp::result& r) {
    const double step_ms = r.seconds * 1000.0 / c.steps;
    if (base == 0) base = step_ms;
    const double link_ms = static_cast<double>(r.planned_link.total()) / bytes_per_us / 1000.0;
    std::printf("  %-18s %12.1f %12.1f %14.1f %14.2f %12.2f %7.2fx\n", name, r.planned.total / 1024.0,
                r.planned_host.total / 1024.0, r.planned_link.total() / 1024.0, link_ms, step_ms, step_ms / base);
    std::printf(
        "{\"bench\":\"offload\",\"offload\":\"%s\",\"device_bytes\":%lld,\"host_bytes\":%lld,\"link_bytes\":%lld,"
        "\"step_ms\":%.3f,\"vs_none\":%.3f}\n",
        name, static_cast<long long>(r.planned.total), static_cast<long long>(r.planned_host.total),
        static_cast<long long>(r.planned_link.total()), step_ms, step_ms / base);
  };
  (void)measure<offload::none>(c, bytes_per_us, latency_us);  // warm-up
  row("none (baseline)", measure<offload::none>(c, bytes_per_us, latency_us));
  row("params", measure<offload::cpu<offload::params>>(c, bytes_per_us, latency_us));
  row("grads", measure<offload::cpu<offload::grads>>(c, bytes_per_us, latency_us));
  row("optimizer_state", measure<offload::cpu<offload::optimizer_state>>(c, bytes_per_us, latency_us));
  row("params+grads", measure<offload::cpu<offload::params | offload::grads>>(c, bytes_per_us, latency_us));
  row("all (host step)", measure<offload::all>(c, bytes_per_us, latency_us));
}

}  // namespace

int main() {
  planned();
  measured(1000.0);  // 1 GB/s: a 25 GB/s PCIe link dilated 25x, as the host's compute is that much slower than a GPU's
  measured(50.0);    // 50 MB/s: a link too slow to hide behind this compute
  std::printf("\n(on a GPU: not measured; no GPU was lent)\n");
  return 0;
}
