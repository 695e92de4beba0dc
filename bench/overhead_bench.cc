// Host overhead of the scheduler per unit per step, in microseconds, at 64, 512 and 4096 units.
//
// Tiny units (256 elements) at world size 1, no compute: a step (forward, backward, SGD step) is then nothing
// but the library's own work. The baseline, measured in the same run for the same number of units, is the same
// step written by hand without the library: zero a gradient buffer, accumulate it into the gradient shard and
// update the shard with the same SGD kernel, unit by unit. Two host-backend settings: threaded streams (gathers
// and reductions handed to worker threads, as a GPU backend hands them to streams) and inline streams (no
// hand-off: the scheduler's decisions and bookkeeping alone). The threaded rows twice: with the host backend's
// default spin before a worker or a waiter sleeps (host_options::spin), and without it (0), in the same run.
// `overhead --inline` measures the inline rows only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <algorithm>
#include <vector>

#include <fsdp/fsdp.hpp>

namespace {
constexpr int numel = 256, repeats = 5;
int units = 64, steps = 200, warmup = 20;  // steps scale down as units grow: about 12800 unit-steps per repeat
using clock_type = std::chrono::steady_clock;

fsdp::ModelSpec spec() {
  fsdp::ModelSpec s;
  for (int u = 0; u < units; ++u) s.add("u" + std::to_string(u) + ".w", {numel});
  return s;
}

/// `spin`: host_options::spin (-1: the default); ignored by a library without it (tools/overhead-compare builds this
/// source against older headers too).
template <class Prefetch>
double library_us_per_step(bool threaded, std::chrono::microseconds spin = std::chrono::microseconds(-1)) {
  double best = 1e300;
  fsdp::comm::local_options lo;
  lo.backend.threaded_streams = threaded;
  [&](auto& backend) {  // generic: a library without the option compiles the test as false
    if constexpr (requires { backend.spin = spin; })
      if (spin.count() >= 0) backend.spin = spin;
  }(lo.backend);
  fsdp::comm::run_local(
      1,
      [&](fsdp::comm::local_communicator& c) {
        fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, Prefetch>> m(c, spec(), fsdp::wrap::by_prefix{"u"});
        fsdp::optim::sgd opt(m, {.lr = 1e-3f, .momentum = 0.9f});
        for (int rep = 0; rep < repeats; ++rep) {
          for (int i = 0; i < warmup; ++i) {
            for (auto& u : m.forward()) (void)u;
            for (auto& u : m.backward()) (void)u;
            opt.step();
          }
          m.synchronize();
          const auto t0 = clock_type::now();
          for (int i = 0; i < steps; ++i) {
            for (auto& u : m.forward()) (void)u;
            for (auto& u : m.backward()) (void)u;
            opt.step();
          }
          m.synchronize();
          best = std::min(best, std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / steps);
        }
      },
      lo);
  return best;
}

double baseline_us_per_step() {
  std::vector<std::vector<float>> master(units, std::vector<float>(numel, 0.5f)),
      grad(units, std::vector<float>(numel)), mom(units, std::vector<float>(numel)),
      full(units, std::vector<float>(numel));
  const fsdp::optim::detail::sgd_coeffs co{1e-3f, 0.9f, 0.0f};
  auto step = [&] {
    for (int u = 0; u < units; ++u) {
      std::memset(full[u].data(), 0, numel * sizeof(float));
      for (int i = 0; i < numel; ++i) grad[u][i] += full[u][i];
    }
    for (int u = 0; u < units; ++u)
      for (int i = 0; i < numel; ++i)
        fsdp::optim::detail::sgd_update(master[u][i], grad[u][i], &mom[u][i], co, co.weight_decay);
  };
  double best = 1e300;
  for (int rep = 0; rep < repeats; ++rep) {
    for (int i = 0; i < warmup; ++i) step();
    const auto t0 = clock_type::now();
    for (int i = 0; i < steps; ++i) step();
    best = std::min(best, std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / steps);
  }
  volatile float sink = master[0][0];
  (void)sink;
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  const bool inline_only = argc > 1 && std::strcmp(argv[1], "--inline") == 0;
  struct row {
    int units;
    const char* what;
    double us, base;
  };
  std::vector<row> rows;
  for (int n : {64, 512, 4096}) {
    units = n;
    steps = std::max(4, 12800 / n);
    warmup = std::max(2, steps / 10);
    const double base = baseline_us_per_step();
    if (!inline_only) {
      const std::chrono::microseconds no_spin(0);
      rows.push_back({n, "prefetch::none, threaded streams", library_us_per_step<fsdp::prefetch::none>(true), base});
      rows.push_back({n, "prefetch::next, threaded streams", library_us_per_step<fsdp::prefetch::next>(true), base});
      // the hand-off without spinning (host_options::spin = 0: every idle worker and waiter sleeps at once)
      rows.push_back(
          {n, "prefetch::none, threaded, no spin", library_us_per_step<fsdp::prefetch::none>(true, no_spin), base});
      rows.push_back(
          {n, "prefetch::next, threaded, no spin", library_us_per_step<fsdp::prefetch::next>(true, no_spin), base});
    }
    rows.push_back({n, "prefetch::none, inline streams", library_us_per_step<fsdp::prefetch::none>(false), base});
    rows.push_back({n, "prefetch::next, inline streams", library_us_per_step<fsdp::prefetch::next>(false), base});
  }
  std::printf("scheduler host overhead: units of %d elements, world 1, best of %d repeats (12800 unit-steps each)\n\n",
              numel, repeats);
  std::printf("%6s  %-34s %12s %12s %16s\n", "units", "", "us/step", "baseline", "overhead us/unit");
  for (const auto& r : rows)
    std::printf("%6d  %-34s %12.1f %12.1f %16.2f\n", r.units, r.what, r.us, r.base, (r.us - r.base) / r.units);
  std::printf("\n{\"bench\":\"overhead\",\"numel\":%d,\"rows\":[", numel);
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::printf(
        "%s{\"units\":%d,\"config\":\"%s\",\"us_per_step\":%.2f,\"baseline_us_per_step\":%.2f,"
        "\"overhead_us_per_unit\":%.3f}",
        i ? "," : "", rows[i].units, rows[i].what, rows[i].us, rows[i].base,
        (rows[i].us - rows[i].base) / rows[i].units);
  std::printf("]}\n");
}
