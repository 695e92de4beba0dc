// Costs against world size: what one rank pays at worlds of 8 to 4096 ranks, and each cost's exponent fitted over
// the worlds measured (cost ~ world^b, least squares on the logarithms). Goal: no per-rank cost grows faster than
// linearly (b <= 1), and none on a step's critical path grows at all (b ~ 0).
//
// Without 4096 threads on 2 cores:
//   - rank 0 of a world of `world` ranks that all hold what it holds (`mirror`: a communicator whose all-gather
//     writes this rank's contribution into every rank's slot, as rank 0 of such a world receives it, whose other
//     collectives copy this rank's part, and which counts the bytes it receives) constructs a Model and steps it on
//     the host backend with inline streams: the collectives of its construction (the agreement's: one all-gather
//     when the ranks agree) and the bytes they bring rank 0, the construction, and a step's host work per unit
//     (scheduler, executor, the data work of rank 0's shard);
//   - the memory and timeline planners run as the pure functions they are, on the GPT-2 124M layouts of the
//     world's shard group;
//   - the checkpoint (the manifest's bytes, a save, a load at half the world: a resharding load; each rank's thread
//     CPU time, the busiest rank's shown, since the ranks share 2 cores and their wall time is everyone's) and the file
//     rendezvous (from every rank's start until all hold rank 0's blob) need every rank's part: they run on thread
//     ranks at worlds of 8 to 64 and are fitted there; the table extrapolates them (marked "~").
// The baseline, in the same run: each cost at the smallest world measured.
//
// Then the step's commit (model_options::commit_step: one element all-reduced over the world before the first
// update), at 8 to 4096 ranks: measured on rank 0 of the mirrored world (a step with it against a step without, each
// the best of 7 runs of 100 steps, alternated; and the bytes it moves), and planned by the timeline planner on GPT-2
// 124M under full_shard on A100 nodes of 8 with bench/plan's default links (NVLink 230 GB/s and 10 us inside a node;
// 200 Gb/s x 8 a node between nodes, 20 us a collective, 5 us a ring step): the commit's time on the ring model the
// planner uses, its share of the step, and, for comparison, a tree's latency (2 log2(n) steps), which NCCL uses for a
// message this small and the planner does not model.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fsdp/checkpoint/checkpoint.hpp>
#include <fsdp/comm/launch.hpp>
#include <fsdp/fsdp.hpp>

#include "examples/04_gpt_host/gpt_model.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
/// This thread's CPU time: what one thread rank spends, whatever the other ranks sharing the 2 cores do.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

/// Rank 0 of `world` ranks that all hold what this one holds (see the top of the file).
class mirror_communicator {
 public:
  using backend_type = fsdp::backend::host;
  explicit mirror_communicator(int world) : world_(world) {}
  int rank() const noexcept { return 0; }
  int size() const noexcept { return world_; }
  fsdp::collective_stats stats() const { return stats_; }
  fsdp::backend::host_options backend_options() const {
    fsdp::backend::host_options o;
    o.threaded_streams = false;
    return o;
  }

  void all_gather(const void* send, void* recv, std::int64_t count, fsdp::dtype t, backend_type::stream& s) {
    const std::size_t bytes = std::size_t(count) * fsdp::size_of(t);
    count_(fsdp::collective::all_gather, bytes * std::size_t(world_));
    s.submit([=, w = std::size_t(world_)] {  // slot 0, then doubling: log2(world) copies of the received bytes
      char* out = static_cast<char*>(recv);
      if (out != send) std::memcpy(out, send, bytes);
      for (std::size_t have = 1; have < w; have *= 2)
        std::memcpy(out + have * bytes, out, std::min(have, w - have) * bytes);
    });
  }
  void reduce_scatter(const void* send, void* recv, std::int64_t count, fsdp::dtype t, fsdp::reduce_op,
                      backend_type::stream& s) {
    copy(fsdp::collective::reduce_scatter, send, recv, std::size_t(count) * fsdp::size_of(t), s);
  }
  void all_reduce(const void* send, void* recv, std::int64_t count, fsdp::dtype t, fsdp::reduce_op,
                  backend_type::stream& s) {
    copy(fsdp::collective::all_reduce, send, recv, std::size_t(count) * fsdp::size_of(t), s);
  }
  void broadcast(const void* send, void* recv, std::int64_t count, fsdp::dtype t, int, backend_type::stream& s) {
    copy(fsdp::collective::broadcast, send, recv, std::size_t(count) * fsdp::size_of(t), s);
  }
  void barrier() {}

 private:
  void count_(fsdp::collective c, std::size_t bytes) {
    stats_.count[std::size_t(c)] += 1;
    stats_.bytes[std::size_t(c)] += bytes;
  }
  void copy(fsdp::collective c, const void* send, void* recv, std::size_t bytes, backend_type::stream& s) {
    count_(c, bytes);
    s.submit([=] {
      if (send != recv) std::memcpy(recv, send, bytes);
    });
  }
  int world_;
  fsdp::collective_stats stats_;
};
static_assert(fsdp::CollectivePolicy<mirror_communicator>);

struct mirror {
  using backend_type = fsdp::backend::host;
  using communicator = mirror_communicator;
};
using mirror_policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, mirror>;
using local_policy = fsdp::policy<fsdp::sharding::full_shard>;

/// 64 units of 16384 elements (four elements a rank at 4096 ranks): small, so that a step is the library's own work.
fsdp::ModelSpec tiny() {
  fsdp::ModelSpec s;
  for (int u = 0; u < 64; ++u) s.add("u" + std::to_string(u) + ".w", {128, 128});
  return s;
}

struct mirror_costs {
  double agree_bytes = 0, agree_collectives = 0, construct_ms = 0, step_us_per_unit = 0;
};

mirror_costs on_mirror(int world, std::int64_t align);

/// GPT-2 124M's units and planner inputs under full_shard over `world` ranks, prefetching the next unit, AdamW.
struct gpt2_plan {
  fsdp::planned_units units;
  fsdp::memory_plan_inputs in;
};
gpt2_plan gpt2_full_shard(int world) {
  const gpt::shape shape{50257, 1024, 768, 12, 12};
  gpt2_plan p{fsdp::plan_units("gpt2", gpt::make_spec(shape, 0), gpt::wrapping(), world), {}};
  fsdp::budget_query q;
  q.strategy = fsdp::facts_of<fsdp::sharding::full_shard>(world);
  q.optimizer_states = 2;
  p.in = fsdp::planner_inputs(p.units, q, fsdp::facts_of_prefetch<fsdp::prefetch::next>());
  return p;
}

/// The step's commit on rank 0 of a mirrored world: a step's host work with it and without (us), and the bytes of
/// all-reduce a step moves with it, less without.
struct commit_measured {
  double with_us = 0, without_us = 0, bytes_per_step = 0;
};

commit_measured commit_on_mirror(int world) {
  struct run {
    mirror_communicator comm;
    fsdp::Model<mirror_policy> m;
    decltype(fsdp::optim::sgd(std::declval<fsdp::Model<mirror_policy>&>(), fsdp::optim::sgd_options{})) opt;
    run(int world, bool commit)
        : comm(world),
          m(comm, tiny(), fsdp::wrap::by_prefix{"u"}, fsdp::init::normal{},
            [&] {
              fsdp::model_options mo;
              mo.layout.align = 1;
              mo.commit_step = commit;
              return mo;
            }()),
          opt(m, {.lr = 1e-3f, .momentum = 0.9f}) {}
    void steps(int n) {
      for (int i = 0; i < n; ++i) {
        for (auto& u : m.forward()) (void)u;
        for (auto& u : m.backward()) (void)u;
        opt.step();
      }
      m.synchronize();
    }
    double all_reduce_bytes() const { return double(comm.stats().bytes[std::size_t(fsdp::collective::all_reduce)]); }
  };
  run with(world, true), without(world, false);
  with.steps(5);
  without.steps(5);
  commit_measured out;
  const double before_with = with.all_reduce_bytes(), before_without = without.all_reduce_bytes();
  constexpr int steps = 100;
  double best_with = 1e300, best_without = 1e300;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = clock_type::now();
    with.steps(steps);
    best_with = std::min(best_with, seconds_since(t0) / steps);
    t0 = clock_type::now();
    without.steps(steps);
    best_without = std::min(best_without, seconds_since(t0) / steps);
  }
  out.with_us = best_with * 1e6;
  out.without_us = best_without * 1e6;
  out.bytes_per_step =
      ((with.all_reduce_bytes() - before_with) - (without.all_reduce_bytes() - before_without)) / (7.0 * steps);
  return out;
}

/// The step's commit as the timeline planner predicts it: GPT-2 124M, full_shard over `world` ranks, A100 nodes of 8
/// (bench/plan's default links), 8192 tokens a rank a step.
struct commit_planned {
  double step_ms = 0, commit_ms = 0, tree_ms = 0;
};

commit_planned commit_in_timeline(int world) {
  const gpt2_plan p = gpt2_full_shard(world);  // AdamW without clipping: the step commits on its own
  const fsdp::planned_units& u = p.units;
  const fsdp::memory_plan_inputs& in = p.in;
  fsdp::comm::cluster_links cluster;
  cluster.gpus_per_node = 8;
  cluster.intra.bytes_per_second = 230e9;
  cluster.intra.latency = std::chrono::microseconds(10);
  cluster.inter.bytes_per_second = 200e9 / 8;
  cluster.inter.latency = std::chrono::microseconds(20);
  cluster.inter.step_latency = std::chrono::microseconds(5);
  fsdp::time_model t;
  fsdp::place_on_cluster(t, cluster, fsdp::mesh_of<fsdp::sharding::full_shard>(world));
  t.memory_bytes_per_second = 2.039e12;
  t.serial_collectives = true;  // comm::nccl's default
  for (const auto& l : u.layouts) t.compute.push_back(fsdp::flops_model{8192, 312e12 * 0.6, 2, 4, {"wte", "wpe"}}(l));
  const fsdp::timeline tl = fsdp::plan_timeline(u.names, u.layouts, in, t);
  commit_planned out;
  out.step_ms = double(tl.step_ns) * 1e-6;
  out.commit_ms = double(tl.commit_ns) * 1e-6;
  const fsdp::comm::link_model& w = t.world_link;
  const double hops = 2.0 * std::ceil(std::log2(double(world)));
  out.tree_ms = (double(w.latency.count()) + hops * double(w.step_latency.count())) * 1e-6;
  return out;
}

mirror_costs on_mirror(int world, std::int64_t align) {
  mirror_costs out;
  mirror_communicator comm(world);
  const auto t0 = clock_type::now();
  // alignment 1: at the default 16 a rank's shard holds at least 16 elements, so these small units would be padded
  // to world x 16 elements past 1024 ranks (4 times their size at 4096) and the step would measure the padding's
  // copies (docs/benchmarks.md)
  fsdp::model_options mo;
  mo.layout.align = align;
  fsdp::Model<mirror_policy> m(comm, tiny(), fsdp::wrap::by_prefix{"u"}, fsdp::init::normal{}, mo);
  out.construct_ms = seconds_since(t0) * 1e3;
  const fsdp::collective_stats st = comm.stats();
  for (std::size_t k = 0; k < fsdp::collective_kinds; ++k) {
    out.agree_bytes += double(st.bytes[k]);
    out.agree_collectives += double(st.count[k]);
  }
  fsdp::optim::sgd opt(m, {.lr = 1e-3f, .momentum = 0.9f});
  auto step = [&] {
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    opt.step();
  };
  for (int i = 0; i < 5; ++i) step();
  m.synchronize();
  double best = 1e300;
  for (int rep = 0; rep < 3; ++rep) {
    constexpr int steps = 40;
    const auto t1 = clock_type::now();
    for (int i = 0; i < steps; ++i) step();
    m.synchronize();
    best = std::min(best, seconds_since(t1) / steps);
  }
  out.step_us_per_unit = best * 1e6 / double(m.size());
  return out;
}

struct planner_costs {
  double memory_ms = 0, timeline_ms = 0;
};

planner_costs planners(int world) {
  const gpt2_plan p = gpt2_full_shard(world);
  const fsdp::planned_units& u = p.units;
  const fsdp::memory_plan_inputs& in = p.in;
  fsdp::time_model t;
  t.world = world;
  t.link.bytes_per_second = 200e9;
  t.memory_bytes_per_second = 3e12;
  for (const auto& l : u.layouts) t.compute.push_back(fsdp::flops_model{8192, 400e12, 2, 4, {"wte", "wpe"}}(l));
  planner_costs out;
  double best_m = 1e300, best_t = 1e300;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = clock_type::now();
    const fsdp::memory_plan p = fsdp::plan_memory(u.names, u.layouts, in);
    best_m = std::min(best_m, seconds_since(t0));
    t0 = clock_type::now();
    const fsdp::timeline tl = fsdp::plan_timeline(u.names, u.layouts, in, t);
    best_t = std::min(best_t, seconds_since(t0));
    if (!p.feasible() || !tl.feasible()) std::printf("(not feasible at %d)\n", world);
  }
  out.memory_ms = best_m * 1e3;
  out.timeline_ms = best_t * 1e3;
  return out;
}

struct thread_costs {
  double manifest_bytes = 0, save_ms = 0, load_ms = 0, rendezvous_ms = 0;
};

thread_costs on_threads(int world, const std::filesystem::path& scratch) {
  thread_costs out;
  const std::string dir = (scratch / ("ckpt-" + std::to_string(world))).string();
  std::filesystem::remove_all(dir);
  fsdp::comm::local_options lo;
  lo.backend.threaded_streams = false;
  lo.timeout = std::chrono::milliseconds(600000);
  // on `ranks` thread ranks, each makes the model and times fn(model, optimizer) in its thread's CPU: the busiest's
  auto busiest_ms = [&](int ranks, const auto& fn) {
    std::vector<double> cpu(std::size_t(ranks), 0.0);
    fsdp::comm::run_local(
        ranks,
        [&](fsdp::comm::local_communicator& c) {
          fsdp::Model<local_policy> m(c, tiny(), fsdp::wrap::by_prefix{"u"});
          fsdp::optim::sgd opt(m, {.lr = 1e-3f, .momentum = 0.9f});
          c.barrier();
          const double t0 = thread_cpu_seconds();
          fn(m, opt);
          cpu[std::size_t(c.rank())] = thread_cpu_seconds() - t0;
        },
        lo);
    return *std::max_element(cpu.begin(), cpu.end()) * 1e3;
  };
  out.save_ms = busiest_ms(world, [&](auto& m, auto& opt) { fsdp::checkpoint::save(m, opt, dir); });
  out.manifest_bytes = double(std::filesystem::file_size(dir + "/manifest.json"));
  out.load_ms = busiest_ms(world / 2, [&](auto& m, auto& opt) { fsdp::checkpoint::load(m, opt, dir); });
  std::filesystem::remove_all(dir);

  // the rendezvous: every rank starts at once; rank 0's publish returns once all have acknowledged
  const std::filesystem::path rdv = scratch / ("rendezvous-" + std::to_string(world));
  std::vector<std::thread> ranks;
  const auto t0 = clock_type::now();
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      const fsdp::comm::file_rendezvous fr(rdv, world, r, "world-bench");
      if (r == 0)
        fr.publish(std::vector<char>(128, 'x'), std::chrono::milliseconds(120000));
      else
        (void)fr.fetch(128, std::chrono::milliseconds(120000));
    });
  for (auto& t : ranks) t.join();
  out.rendezvous_ms = seconds_since(t0) * 1e3;
  fsdp::comm::file_rendezvous(rdv, world, 0, "world-bench").remove();
  return out;
}

/// b in cost ~ world^b, least squares over (log world, log cost).
double exponent(const std::vector<int>& worlds, const std::vector<double>& cost) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = double(worlds.size());
  for (std::size_t i = 0; i < worlds.size(); ++i) {
    const double x = std::log(double(worlds[i])), y = std::log(std::max(cost[i], 1e-12));
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

/// The fitted power law's value at `world` from the fit over (worlds, cost).
double extrapolate(const std::vector<int>& worlds, const std::vector<double>& cost, int world) {
  const double b = exponent(worlds, cost);
  double mean_x = 0, mean_y = 0;
  for (std::size_t i = 0; i < worlds.size(); ++i)
    mean_x += std::log(double(worlds[i])), mean_y += std::log(std::max(cost[i], 1e-12));
  mean_x /= double(worlds.size()), mean_y /= double(worlds.size());
  return std::exp(mean_y + b * (std::log(double(world)) - mean_x));
}

struct row {
  const char* name;
  const char* unit;
  bool per_step;  ///< on a step's critical path: must not grow
  std::vector<int> worlds;
  std::vector<double> cost;
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int> shown{8, 64, 512, 4096};
  std::vector<int> mirror_worlds{8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  std::vector<int> thread_worlds{8, 16, 32, 64};
  if (argc > 1 && std::string(argv[1]) == "--quick") mirror_worlds = {8, 64, 512, 4096}, thread_worlds = {4, 8};
  const std::filesystem::path scratch = std::filesystem::temp_directory_path() / "fsdp-world-bench";
  std::filesystem::create_directories(scratch);

  row agree_bytes{"construction collectives: B received", "B", false, mirror_worlds, {}};
  row agree_calls{"construction collectives: count", "", false, mirror_worlds, {}};
  row construct{"construction (rank 0)", "ms", false, mirror_worlds, {}};
  row step{"step host work per unit (alignment 1)", "us", true, mirror_worlds, {}};
  row memory{"memory planner (GPT-2 124M)", "ms", false, mirror_worlds, {}};
  row timeline{"timeline planner (GPT-2 124M)", "ms", false, mirror_worlds, {}};
  row padded{"  the same at alignment 16 (default)", "us", false, mirror_worlds, {}};
  for (int w : mirror_worlds) {
    padded.cost.push_back(on_mirror(w, 16).step_us_per_unit);
    const mirror_costs m = on_mirror(w, 1);
    agree_bytes.cost.push_back(m.agree_bytes);
    agree_calls.cost.push_back(m.agree_collectives);
    construct.cost.push_back(m.construct_ms);
    step.cost.push_back(m.step_us_per_unit);
    const planner_costs p = planners(w);
    memory.cost.push_back(p.memory_ms);
    timeline.cost.push_back(p.timeline_ms);
  }
  row manifest{"checkpoint manifest", "KiB", false, thread_worlds, {}};
  row save{"checkpoint save (CPU, busiest rank)", "ms", false, thread_worlds, {}};
  row load{"resharding load at world/2 (CPU)", "ms", false, thread_worlds, {}};
  row rendezvous{"file rendezvous (until all hold it)", "ms", false, thread_worlds, {}};
  for (int w : thread_worlds) {
    const thread_costs t = on_threads(w, scratch);
    manifest.cost.push_back(t.manifest_bytes / 1024);
    save.cost.push_back(t.save_ms);
    load.cost.push_back(t.load_ms);
    rendezvous.cost.push_back(t.rendezvous_ms);
  }
  std::filesystem::remove_all(scratch);
  if (argc > 1 && std::string(argv[1]) == "--series")
    for (const row* r : {&construct, &step, &padded, &memory, &timeline, &manifest, &save, &load, &rendezvous}) {
      std::printf("%-38s", r->name);
      for (std::size_t i = 0; i < r->worlds.size(); ++i) std::printf(" %d:%.4g", r->worlds[i], r->cost[i]);
      std::printf("\n");
    }

  std::printf(
      "costs one rank pays against the world size: rank 0 of a mirrored world (host backend, inline "
      "streams), the planners as pure functions, the checkpoint and the rendezvous on thread ranks at "
      "%d-%d (\"~\": extrapolated from their fit)\n\n",
      thread_worlds.front(), thread_worlds.back());
  std::printf("%-38s %4s", "cost", "");
  for (int w : shown) std::printf(" %11d", w);
  std::printf(" %9s  %s\n", "exponent", "verdict");
  bool ok = true;
  for (const row* r : {&agree_bytes, &agree_calls, &construct, &step, &padded, &memory, &timeline, &manifest, &save,
                       &load, &rendezvous}) {
    std::printf("%-38s %4s", r->name, r->unit);
    for (int w : shown) {
      const auto at = std::find(r->worlds.begin(), r->worlds.end(), w);
      if (at != r->worlds.end())
        std::printf(" %11.4g", r->cost[std::size_t(at - r->worlds.begin())]);
      else
        std::printf("  ~%9.4g", extrapolate(r->worlds, r->cost, w));
    }
    const double b = exponent(r->worlds, r->cost);
    // the verdicts allow 0.1 of the exponent for timing noise (a fit over measured times)
    const bool fine = r->per_step ? b < 0.1 : b < 1.1;
    ok = ok && fine;
    std::printf(" %9.2f  %s\n", b,
                fine ? (r->per_step ? "flat (a step's cost)" : "at most linear")
                     : (r->per_step ? "GROWS on a step's path" : "FASTER than linear"));
  }
  std::printf(
      "\nbaseline (the smallest world measured): construction's collectives %.0f B in %.0f, construction %.2f ms, "
      "a step %.2f us a unit, planners %.2f and %.2f ms, manifest %.1f KiB\n",
      agree_bytes.cost.front(), agree_calls.cost.front(), construct.cost.front(), step.cost.front(),
      memory.cost.front(), timeline.cost.front(), manifest.cost.front());

  // The step's commit: measured on the mirror, planned on GPT-2 124M (see the top of the file).
  std::printf("\nthe step's commit (model_options::commit_step), against the world size\n\n%-44s %4s", "", "");
  for (int w : shown) std::printf(" %11d", w);
  std::printf("\n");
  std::vector<commit_measured> measured;
  std::vector<commit_planned> planned;
  for (int w : shown) measured.push_back(commit_on_mirror(w)), planned.push_back(commit_in_timeline(w));
  const auto line = [&](const char* name, const char* unit, auto value) {
    std::printf("%-44s %4s", name, unit);
    for (std::size_t i = 0; i < shown.size(); ++i) std::printf(" %11.4g", value(i));
    std::printf("\n");
  };
  std::printf("measured: rank 0 of a mirrored world, 64 units, host backend, inline streams\n");
  line("  a step with the commit", "us", [&](std::size_t i) { return measured[i].with_us; });
  line("  a step without (the baseline)", "us", [&](std::size_t i) { return measured[i].without_us; });
  line("  the commit's host work (the difference)", "us",
       [&](std::size_t i) { return measured[i].with_us - measured[i].without_us; });
  line("  what it moves a step (all-reduce, fp32)", "B", [&](std::size_t i) { return measured[i].bytes_per_step; });
  std::printf("planned: GPT-2 124M, full_shard, A100 nodes of 8 (bench/plan's links), 8192 tokens a rank\n");
  line("  the step", "ms", [&](std::size_t i) { return planned[i].step_ms; });
  line("  the commit (ring model, all exposed)", "ms", [&](std::size_t i) { return planned[i].commit_ms; });
  line("  its share of the step", "%", [&](std::size_t i) { return 100 * planned[i].commit_ms / planned[i].step_ms; });
  line("  a tree's latency for it (not modelled)", "ms", [&](std::size_t i) { return planned[i].tree_ms; });

  std::printf(
      "{\"bench\":\"world\",\"step_exponent\":%.3f,\"agreement_bytes_exponent\":%.3f,\"manifest_exponent\":%.3f,"
      "\"commit_share_at_4096\":%.4f,\"within_goal\":%s}\n",
      exponent(step.worlds, step.cost), exponent(agree_bytes.worlds, agree_bytes.cost),
      exponent(manifest.worlds, manifest.cost), planned.back().commit_ms / planned.back().step_ms,
      ok ? "true" : "false");
  return 0;
}
