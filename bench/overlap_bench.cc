// Exposed communication per prefetch policy, on the host backend with a modelled link.
//
// A transformer-shaped unit list (embedding, L blocks of 12 d^2 parameters, head) trains on 8 thread ranks.
// Each unit's compute is modelled from its FLOPs (forward 2 P T, backward 4 P T, at throughput F; the embedding
// lookup is free) and spent sleeping on the compute stream; each collective takes its modelled time on the link
// (bytes x (n-1)/n / bandwidth, in the dtype the precision policy gathers or reduces in) with no data moved. Time is dilated by a
// constant factor (F and the bandwidth both divided by it) so that every interval lasts milliseconds and the
// host's own timing noise stays small; the ratio of communication to compute, which decides the exposed
// fraction, is that of the undilated model.
//
// Two ways to run the compute, both printed: "host" sleeps on the training thread (the host backend's inline
// compute stream: the host cannot run ahead of compute, so a gather is only issued early by a prefetch policy),
// and "async" submits the sleep to a threaded compute stream (host_options::threaded_compute), as a CUDA trainer
// launches kernels: the host runs ahead and issues the next unit's gather while the current one computes, as
// it does on a GPU. Each step ends with model.synchronize() (a trainer reading its loss does the same).
//
// Per policy, precision and link it prints the step time, the exposed communication (collective time not covered
// by compute, from the trace) as a fraction of the step, and the step time of the same policy with communication
// free (collectives take no time), measured in the same run: the baseline. Precisions: fp32 everything; bf16
// gathers with fp32 reduction; bf16 gathers and reduction (half the bytes on every collective).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <fsdp/fsdp.hpp>

namespace {
struct setup {
  int world = 8;
  int d = 128;            ///< model width (real buffers are this small; the timing model does the rest)
  int layers = 12;
  int vocab = 4096;
  double tokens = 4096;   ///< tokens per rank per step
  double flops = 400e12;  ///< modelled sustained throughput (an H100 at about 40% of its bf16 peak)
  double dilation = 2000;  ///< every modelled time is multiplied by this
  int warmup = 1, steps = 3;
};

fsdp::ModelSpec transformer(const setup& s) {
  fsdp::ModelSpec spec;
  spec.add("emb.w", {s.vocab, s.d});
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    spec.add(p + "attn.qkv", {3 * s.d, s.d}).add(p + "attn.proj", {s.d, s.d});
    spec.add(p + "mlp.up", {4 * s.d, s.d}).add(p + "mlp.down", {s.d, 4 * s.d});
    spec.add(p + "ln.g", {2 * s.d}, {.flags = {.no_decay = true}});
  }
  spec.add("head.w", {s.vocab, s.d});
  return spec;
}

fsdp::wrap::by_function units() {
  return fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
    if (p.name.rfind("h.", 0) == 0) return p.name.substr(0, p.name.find('.', 2));
    return p.name.substr(0, p.name.find('.'));
  }};
}

struct measured {
  double step_ms = 0, exposed_ms = 0, comm_ms = 0, compute_ms = 0;
};

template <class Prefetch, class Precision>
measured run(const setup& s, double link_bytes_per_s, bool async) {
  using Policy = fsdp::policy<fsdp::sharding::full_shard, Prefetch, Precision>;
  const fsdp::ModelSpec spec = transformer(s);
  fsdp::trace::recorder rec;
  fsdp::comm::local_options lo;
  lo.timeout = std::chrono::milliseconds(120000);
  lo.link.bytes_per_second = link_bytes_per_s / s.dilation;  // 0: free communication (the baseline)
  lo.link.move_data = false;  // timing only, in the baseline too: the trained values are not looked at
  lo.backend.threaded_compute = async;
  std::vector<measured> per_rank(s.world);
  fsdp::comm::run_local(
      s.world,
      [&](fsdp::comm::local_communicator& c) {
        fsdp::model_options mo;
        mo.recorder = &rec;
        fsdp::Model<Policy> m(c, spec, units(), fsdp::init::normal{0.02f, 1}, mo);
        fsdp::optim::sgd opt(m, {.lr = 0.0f});
        auto compute = [&](const auto& u, double flops_per_token_param) {
          std::int64_t p = 0;
          for (const auto& e : u.layout().entries()) p += e.numel;
          const double f = u.name() == "emb" ? 0.0 : flops_per_token_param * double(p) * s.tokens;
          const auto t = std::chrono::nanoseconds(std::int64_t(f / s.flops * s.dilation * 1e9));
          if (async)
            m.backend().compute_stream().submit([t] { std::this_thread::sleep_for(t); });
          else
            std::this_thread::sleep_for(t);
        };
        for (int step = 0; step < s.warmup + s.steps; ++step) {
          for (auto& u : m.forward()) compute(u, 2.0);
          for (auto& u : m.backward()) compute(u, 4.0);
          opt.step();
          m.synchronize();
        }
        measured acc;
        for (int step = s.warmup + 1; step <= s.warmup + s.steps; ++step) {
          const auto sum = fsdp::trace::summarize(rec.events(c.rank()), c.rank(), std::uint64_t(step));
          acc.step_ms += sum.wall_s * 1e3 / s.steps;
          acc.exposed_ms += sum.exposed_comm_s * 1e3 / s.steps;
          acc.comm_ms += sum.comm_s * 1e3 / s.steps;
          acc.compute_ms += sum.compute_s * 1e3 / s.steps;
        }
        per_rank[c.rank()] = acc;
      },
      lo);
  // the slowest rank decides the step
  return *std::max_element(per_rank.begin(), per_rank.end(),
                           [](const measured& a, const measured& b) { return a.step_ms < b.step_ms; });
}

struct row {
  std::string policy, precision, mode, link;
  measured m, base;
};
}  // namespace

int main() {
  const setup s;
  std::printf("exposed communication, full_shard, %d thread ranks, transformer d=%d, %d blocks, vocab %d\n", s.world,
              s.d, s.layers, s.vocab);
  std::printf("compute modelled at %.0f TFLOP/s for %.0f tokens per rank; time dilated x%.0f\n\n", s.flops / 1e12,
              s.tokens, s.dilation);
  const struct {
    const char* name;
    double bw;
  } links[] = {{"NVLink-class 360 GB/s", 360e9}, {"InfiniBand-class 48 GB/s", 48e9}};
  std::vector<row> rows;
  auto bench = [&](const char* name, auto prefetch_tag, auto precision_tag, const char* precision) {
    using P = decltype(prefetch_tag);
    using Q = decltype(precision_tag);
    for (bool async : {false, true}) {
      const measured base = run<P, Q>(s, 0, async);
      for (const auto& l : links)
        rows.push_back({name, precision, async ? "async" : "host", l.name, run<P, Q>(s, l.bw, async), base});
    }
  };
  using fsdp::bfloat16;
  using fsdp::precision::mixed;
  const fsdp::precision::full f32;
  bench("none", fsdp::prefetch::none{}, f32, "fp32");
  bench("forward<1>", fsdp::prefetch::forward<1>{}, f32, "fp32");
  bench("backward_pre<1>", fsdp::prefetch::backward_pre<1>{}, f32, "fp32");
  bench("backward_pre<1>", fsdp::prefetch::backward_pre<1>{}, mixed<bfloat16>{}, "bf16/fp32");
  bench("backward_pre<1>", fsdp::prefetch::backward_pre<1>{}, mixed<bfloat16, float, bfloat16>{}, "bf16/bf16");
  bench("backward_post", fsdp::prefetch::backward_post{}, f32, "fp32");
  bench("next = depth<1,1>", fsdp::prefetch::next{}, f32, "fp32");
  bench("next = depth<1,1>", fsdp::prefetch::next{}, mixed<bfloat16>{}, "bf16/fp32");
  bench("next = depth<1,1>", fsdp::prefetch::next{}, mixed<bfloat16, float, bfloat16>{}, "bf16/bf16");
  bench("depth<2,2>", fsdp::prefetch::depth<2, 2>{}, f32, "fp32");

  std::printf("%-18s %-10s %-6s %-26s %10s %10s %7s %10s %8s\n", "prefetch", "gather/red", "mode", "link", "step ms",
              "no-comm ms", "ratio", "exposed ms", "exposed");
  for (const auto& r : rows)
    std::printf("%-18s %-10s %-6s %-26s %10.2f %10.2f %7.3f %10.2f %7.1f%%\n", r.policy.c_str(), r.precision.c_str(),
                r.mode.c_str(), r.link.c_str(), r.m.step_ms, r.base.step_ms, r.m.step_ms / r.base.step_ms,
                r.m.exposed_ms, 100.0 * r.m.exposed_ms / r.m.step_ms);
  std::printf("\n{\"bench\":\"overlap\",\"world\":%d,\"dilation\":%.0f,\"rows\":[", s.world, s.dilation);
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::printf("%s{\"prefetch\":\"%s\",\"precision\":\"%s\",\"mode\":\"%s\",\"link\":\"%s\",\"step_ms\":%.3f,"
                "\"baseline_step_ms\":%.3f,\"exposed_ms\":%.3f,\"comm_ms\":%.3f,\"exposed_fraction\":%.4f}",
                i ? "," : "", rows[i].policy.c_str(), rows[i].precision.c_str(), rows[i].mode.c_str(), rows[i].link.c_str(),
                rows[i].m.step_ms, rows[i].base.step_ms,
                rows[i].m.exposed_ms, rows[i].m.comm_ms, rows[i].m.exposed_ms / rows[i].m.step_ms);
  std::printf("]}\n");
}
