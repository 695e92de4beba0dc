// The gradient pipeline of an optimizer step (fsdp/grad/inspect.hpp, fsdp/optim/detail/shard_optimizer.hpp):
//   - the global norm over every shard of every unit equals the double-precision norm of the reduced gradient
//     within a derived bound, at 1, 3, 4 and 7 ranks (a unit smaller than the world: empty shards; padding),
//     under full_shard and no_shard (replicas counted once), with one row or one row per rank;
//   - a clipped step moves every parameter exactly by the reported scale;
//   - an inf or a NaN in one rank's shard skips the step on every rank: parameters, optimizer state and the step
//     count bit-unchanged, the loss scaler backed off, and the report names the rank and the unit;
//   - fp16 with dynamic loss scaling: an overflow is skipped and backed off, the next step is unscaled exactly.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::five_units;
using fsdp_test::run_ranks;

namespace {
// fsdp_test::five_units(): at 7 ranks, h.1 (3 elements) and h.3 (4) leave six ranks' shards empty (padding only).
const char* const params[] = {"emb", "h.0.w", "h.0.b", "h.1.w", "h.2.w", "h.3.w"};

/// Rank r's gradient of element i of parameter p: positive (no cancellation between ranks), of varied size.
float written(const std::string& p, std::int64_t i, int rank) {
  const auto h = fsdp::init::detail::mix(fsdp::init::detail::name_hash(p) + std::uint64_t(i));
  return std::ldexp(1.0f + float(h % 1000) / 1000.0f, int(h / 1000 % 6) - 8) * float(rank + 1);
}

/// The exact norm of the averaged gradient, from the written values, in double.
double reference_norm(int world) {
  const fsdp::ModelSpec spec = five_units();
  double sum = 0;
  for (const char* p : params)
    for (std::int64_t i = 0; i < spec.at(p).numel(); ++i) {
      double mean = 0;
      for (int r = 0; r < world; ++r) mean += double(written(p, i, r));
      mean /= world;
      sum += mean * mean;
    }
  return std::sqrt(sum);
}

/// The bound on |norm - exact| / exact at `world` ranks, all terms positive, u = 2^-24. Each reduced element is
/// NCCL's average: W products by 1/W rounded to fp32 (one rounding for the factor, one per product) summed with
/// W - 1 roundings: (W + 1) u; squared, 2 (W + 1) u. The shard's squared norm is rounded to fp32 once (u) and the
/// per-unit sums are all-reduced over W ranks in fp32 ((W - 1) u). The square root halves it: (3W + 2) u / 2.
double bound(int world) { return (3.0 * world + 2.0) / 2.0 * std::ldexp(1.0, -24); }

template <class Strategy>
using policy = fsdp::policy<Strategy, fsdp::prefetch::next>;

/// What rank `rank` of `world` writes at element i of parameter p.
using writer = float (*)(const std::string& p, std::int64_t i, int rank, int world);
float each_rank(const std::string& p, std::int64_t i, int rank, int) { return written(p, i, rank); }
/// One rank standing for `simulated` ranks: it writes their average, rounded to fp32 once.
template <int simulated>
float averaged(const std::string& p, std::int64_t i, int, int) {
  double mean = 0;
  for (int r = 0; r < simulated; ++r) mean += double(written(p, i, r));
  return float(mean / simulated);
}

/// Backward with every rank writing `w`, then one SGD step (lr 0.1, no momentum) with these gradient options.
/// Checks on every rank that each master element moved by exactly lr * grad * report.grad_scale.
template <class Strategy>
fsdp::grad::report clipped_step(int world, fsdp::grad::options g, writer w = each_rank) {
  std::vector<fsdp::grad::report> reports(world);
  run_ranks(world, [&](local_communicator& c) {
    fsdp::Model<policy<Strategy>> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 2});
    fsdp::optim::sgd opt(m, {.lr = 0.1f, .grad = g});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward())
      for (const auto& e : u.layout().entries()) {
        auto v = u.grad(e.name);
        for (std::int64_t i = 0; i < v.numel(); ++i) v[i] = w(e.name, i, c.rank(), c.size());
      }
    m.synchronize();
    std::vector<std::vector<float>> p0, g0;
    for (std::size_t u = 0; u < m.size(); ++u) {
      const auto n = std::size_t(m.unit(u).layout().shard_numel());
      p0.emplace_back(m.unit(u).master_shard(), m.unit(u).master_shard() + n);
      g0.emplace_back(m.unit(u).grad_shard(), m.unit(u).grad_shard() + n);
    }
    const fsdp::grad::report r = opt.step();
    m.synchronize();
    for (std::size_t u = 0; u < m.size(); ++u)
      for (std::size_t i = 0; i < p0[u].size(); ++i)
        REQUIRE(m.unit(u).master_shard()[i] == p0[u][i] - 0.1f * (g0[u][i] * r.grad_scale));
    reports[c.rank()] = r;
  });
  for (const auto& r : reports) {  // every rank agrees
    CHECK(r.norm == reports[0].norm);
    CHECK(r.grad_scale == reports[0].grad_scale);
  }
  return reports[0];
}
}  // namespace

TEST_CASE("the global norm equals the exact norm within the stated bound, at 1, 3, 4 and 7 ranks") {
  std::vector<double> norms;
  for (int world : {1, 3, 4, 7}) {
    CAPTURE(world);
    const double exact = reference_norm(world);
    for (bool locate : {false, true}) {
      CAPTURE(locate);
      const auto full =
          clipped_step<fsdp::sharding::full_shard>(world, {.skip_nonfinite = true, .locate_nonfinite = locate});
      const auto repl =
          clipped_step<fsdp::sharding::no_shard>(world, {.skip_nonfinite = true, .locate_nonfinite = locate});
      CHECK(full.inspected);
      CHECK(!full.skipped);
      CHECK(full.grad_scale == 1.0f);  // no clipping asked
      CHECK(std::abs(full.norm - exact) <= bound(world) * exact);
      CHECK(std::abs(repl.norm - exact) <= bound(world) * exact);  // replicas counted once
      MESSAGE("world ", world, std::string(locate ? " (a row per rank)" : ""), ": norm ", full.norm, ", exact ", exact,
              ", relative error ", std::abs(full.norm - exact) / exact, " (bound ", bound(world), ")");
    }
  }
}

TEST_CASE("the global norm at 7 ranks equals the world-1 computation of the same reduced gradient") {
  // world 1: one rank writes the 7 ranks' average (rounded to fp32 once); its error bound is bound(1) + one
  // rounding of each element (2u on the square, u on the norm)
  const double exact = reference_norm(7);
  const auto seven = clipped_step<fsdp::sharding::full_shard>(7, {.skip_nonfinite = true});
  const auto one = clipped_step<fsdp::sharding::full_shard>(1, {.skip_nonfinite = true}, averaged<7>);
  const double u = std::ldexp(1.0, -24);
  CHECK(std::abs(one.norm - exact) <= (bound(1) + u) * exact);
  CHECK(std::abs(seven.norm - one.norm) <= (bound(7) + bound(1) + u) * exact);
  MESSAGE("world 7: ", seven.norm, ", world 1: ", one.norm, ", relative difference ",
          std::abs(seven.norm - one.norm) / exact);
}

TEST_CASE("a clipped step scales every gradient by min(1, max_norm / (norm + 1e-6)), exactly once") {
  for (int world : {1, 4, 7}) {
    CAPTURE(world);
    const double exact = reference_norm(world);
    const float max_norm = float(exact / 3);
    const auto r = clipped_step<fsdp::sharding::full_shard>(world, {.max_norm = max_norm});
    CHECK(r.clip_coef == float(std::min(1.0, double(max_norm) / (r.norm + 1e-6))));
    CHECK(r.grad_scale == r.clip_coef);
    CHECK(std::abs(double(r.clip_coef) - 1.0 / 3.0) <= 2 * bound(world) + 1e-6);
    CHECK(r.message() == fsdp::detail::cat("gradient norm ", r.norm, ", clipped"));
    // above the norm: no clipping, the plain update
    const auto free = clipped_step<fsdp::sharding::full_shard>(world, {.max_norm = float(exact * 2)});
    CHECK(free.clip_coef == 1.0f);
    CHECK(free.grad_scale == 1.0f);
  }
}

namespace {
struct snapshot {
  std::vector<std::vector<float>> master, m, v;
  bool operator==(const snapshot&) const = default;
};
template <class Model, class Opt>
snapshot take(Model& m, const Opt& opt) {
  m.synchronize();
  snapshot s;
  for (std::size_t u = 0; u < m.size(); ++u) {
    const auto n = std::size_t(m.unit(u).layout().shard_numel());
    s.master.emplace_back(m.unit(u).master_shard(), m.unit(u).master_shard() + n);
    s.m.emplace_back(opt.state(u, 0), opt.state(u, 0) + n);
    s.v.emplace_back(opt.state(u, 1), opt.state(u, 1) + n);
  }
  return s;
}
bool same_bits(const snapshot& a, const snapshot& b) {
  auto eq = [](const std::vector<std::vector<float>>& x, const std::vector<std::vector<float>>& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i].size() != y[i].size() || std::memcmp(x[i].data(), y[i].data(), x[i].size() * 4) != 0) return false;
    return true;
  };
  return eq(a.master, b.master) && eq(a.m, b.m) && eq(a.v, b.v);
}

/// Two AdamW steps at 4 ranks; before the second, rank `bad_rank` puts `bad` at element `at` of unit `unit`'s
/// gradient shard. Returns every rank's report of the second step and checks that nothing moved.
std::vector<fsdp::grad::report> poisoned_step(float bad, int bad_rank, const char* unit, std::size_t at, bool locate,
                                              fsdp::grad::loss_scaler* scaler) {
  std::vector<fsdp::grad::report> reports(4);
  run_ranks(4, [&](local_communicator& c) {
    fsdp::Model<policy<fsdp::sharding::full_shard>> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
    fsdp::grad::options g{.skip_nonfinite = true, .locate_nonfinite = locate};
    fsdp::grad::loss_scaler own;  // one scaler per rank, as each process of a real run has
    if (scaler) {
      own = *scaler;
      g.scaler = &own;
    }
    fsdp::optim::adamw opt(m, {.lr = 0.01f, .grad = g});
    for (int step = 0; step < 2; ++step) {
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries())
          for (auto& x : u.grad(e.name)) x = 0.25f * float(c.rank() + 1);
      if (step == 1) {
        m.synchronize();
        if (c.rank() == bad_rank) fsdp::model_access::grad_shard(m.unit(unit))[at] = bad;
      }
      const snapshot before = take(m, opt);
      const float scale_before = own.scale();
      const long steps_before = opt.steps();
      const fsdp::grad::report r = opt.step();
      if (step == 0) {
        CHECK(!r.skipped);
        continue;
      }
      CHECK(r.skipped);
      CHECK(same_bits(take(m, opt), before));  // parameters and both moments, bit for bit
      CHECK(opt.steps() == steps_before);
      if (scaler) CHECK(own.scale() == scale_before * 0.5f);
      reports[c.rank()] = r;
    }
  });
  return reports;
}
}  // namespace

TEST_CASE("an inf in one rank's gradient shard: every rank skips the step, nothing moves, the report names it") {
  fsdp::grad::loss_scaler scaler({.init_scale = 1024.0f});
  // h.2 (272 elements) at 4 ranks: 80-element shards; rank 2 holds its elements 160..239
  const auto reports = poisoned_step(std::numeric_limits<float>::infinity(), 2, "h.2", 5, true, &scaler);
  for (const auto& r : reports) {
    REQUIRE(r.nonfinite);
    CHECK(r.nonfinite->rank == 2);
    CHECK(r.nonfinite->unit_name == "h.2");
    CHECK(r.message() == "non-finite gradient on rank 2 in unit 'h.2' (index 3; first in backward order, 1 unit "
                         "shard(s) non-finite in all): the step was skipped on every rank");
  }
}

TEST_CASE("a NaN, or a non-finite value in padding, is found too; without locating, the report says how to") {
  // a NaN on rank 0 in the root unit
  for (const auto& r : poisoned_step(std::numeric_limits<float>::quiet_NaN(), 0, "root", 3, true, nullptr)) {
    REQUIRE(r.nonfinite);
    CHECK(r.nonfinite->rank == 0);
    CHECK(r.nonfinite->unit_name == "root");
  }
  // h.1 holds 3 elements, all on rank 0: rank 3's shard of it is padding only
  for (const auto& r : poisoned_step(-std::numeric_limits<float>::infinity(), 3, "h.1", 7, true, nullptr)) {
    REQUIRE(r.nonfinite);
    CHECK(r.nonfinite->rank == 3);
    CHECK(r.nonfinite->unit_name == "h.1");
  }
  for (const auto& r : poisoned_step(std::numeric_limits<float>::infinity(), 1, "h.0", 0, false, nullptr)) {
    CHECK(!r.nonfinite);
    CHECK(r.message() == "non-finite gradients (the global squared norm is not finite): the step was skipped on every "
                         "rank; set grad::options::locate_nonfinite to name the rank and unit");
  }
}

TEST_CASE("the loss scaler: backs off on a skipped step, grows after growth_interval good ones") {
  fsdp::grad::loss_scaler s({.init_scale = 8.0f, .growth_factor = 2.0f, .backoff_factor = 0.25f, .growth_interval = 2});
  s.update(false);
  CHECK(s.scale() == 8.0f);
  s.update(false);
  CHECK(s.scale() == 16.0f);
  s.update(false);
  s.update(true);
  CHECK(s.scale() == 4.0f);
  CHECK(s.good_steps() == 0);
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { fsdp::grad::loss_scaler({.backoff_factor = 1.0f}); }) ==
        "fsdp: loss_scaler: backoff_factor must be in (0, 1), got 1");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { fsdp::grad::loss_scaler({.init_scale = 0.0f}); }) ==
        "fsdp: loss_scaler: init_scale must be finite and > 0, got 0");
}

TEST_CASE(
    "fp16 with dynamic loss scaling: an overflowing step is skipped and backed off, the next is unscaled exactly") {
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
                         fsdp::precision::mixed<fsdp::float16, float, fsdp::float16>>;
  run_ranks(2, [](local_communicator& c) {
    fsdp::grad::loss_scaler scaler({.init_scale = 1048576.0f});  // 2^20: 0.1 * 2^20 overflows fp16 (max 65504)
    fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 4});
    fsdp::optim::sgd opt(m, {.lr = 0.5f, .grad = {.scaler = &scaler}});
    std::vector<std::vector<float>> before;
    for (int step = 0; step < 2; ++step) {
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())  // the trainer's loss is multiplied by the scale: so is every gradient
        for (const auto& e : u.layout().entries())
          for (auto& x : u.grad(e.name)) x = fsdp::float16(0.1f * scaler.scale());
      m.synchronize();
      before.clear();
      for (std::size_t u = 0; u < m.size(); ++u)
        before.emplace_back(m.unit(u).master_shard(), m.unit(u).master_shard() + m.unit(u).layout().shard_numel());
      const fsdp::grad::report r = opt.step();
      opt.zero_grad();  // after every step, skipped or not: a skipped step leaves its non-finite gradients
      m.synchronize();
      if (step == 0) {
        CHECK(r.skipped);
        CHECK(scaler.scale() == 524288.0f);
        continue;
      }
      CHECK(!r.skipped);
      CHECK(r.loss_scale == 524288.0f);
      CHECK(r.grad_scale == 1.0f / 524288.0f);
      // 0.1 * 2^19 = 52428.8 is 52416 in fp16 (spacing 32); the fp16 average at 2 ranks (each value halved, the
      // halves added) is exact: 52416; unscaled by 2^-19
      const float g = 52416.0f * (1.0f / 524288.0f);
      for (std::size_t u = 0; u < m.size(); ++u)
        for (const auto& v : m.unit(u).shard_views())
          for (std::int64_t i = 0; i < v.local_numel(); ++i) {
            const auto k = std::size_t(v.shard_offset + i);
            REQUIRE(m.unit(u).master_shard()[k] == before[u][k] - 0.5f * g);
          }
    }
  });
}
