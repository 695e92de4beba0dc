// Device memory is bounded by the plan. The host backend counts what a stream-ordered pool (the CUDA backend's)
// would take from the device for the same allocations, frees and event waits (backend/detail/pool_model.hpp).
// The trainer here submits its work to a threaded compute stream that lags far behind the host, as a GPU does:
// memory released on one stream can then be reused by another only through an event, and whatever the library
// does not order that way is fresh memory. The pool's peak must equal the planner's figure, exactly.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <chrono>
#include <thread>

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
namespace prefetch = fsdp::prefetch;

namespace {
struct figures {
  std::int64_t planned = 0;    ///< the planner's peak, all categories at once
  std::int64_t accounted = 0;  ///< the tracker's peak (host program order)
  std::int64_t pool = 0;       ///< fresh memory the stream-ordered pool took
};

template <class Strategy, class Prefetch, class Precision = fsdp::precision::full>
figures run(fsdp::model_options mo, int steps = 3) {
  using Policy = fsdp::policy<Strategy, Prefetch, Precision>;
  using T = typename Precision::compute_type;
  figures out;
  fsdp::comm::local_options lo;
  lo.timeout = fsdp_test::timeout;
  lo.backend.threaded_compute = true;
  fsdp::comm::run_local(
      2,
      [&](local_communicator& c) {
        fsdp::Model<Policy> m(c, fsdp_test::five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 3}, mo);
        fsdp::optim::adamw opt(m, {.lr = 0.01f});
        const fsdp::memory_plan plan = fsdp::plan_memory(m, opt);
        REQUIRE(plan.feasible());
        auto& cs = m.backend().compute_stream();
        const auto lag = [] { std::this_thread::sleep_for(std::chrono::milliseconds(3)); };
        for (int step = 0; step < steps; ++step) {
          for (int mb = 0; mb < mo.accumulation.micro_batches; ++mb) {
            for (auto& u : m.forward()) {
              auto p = u.param(u.layout().entries().front().name);
              cs.submit([p, lag] {
                lag();
                volatile float sink = float(p[0]);
                (void)sink;
              });
            }
            for (auto& u : m.backward())
              for (const fsdp::flat_entry& e : u.layout().entries()) {
                auto g = u.grad(e.name);
                cs.submit([g, lag] {
                  lag();
                  for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = T(0.125f);
                });
              }
          }
          opt.step();
          opt.zero_grad();
        }
        m.backend().synchronize(cs);
        if (c.rank() == 0) {
          out.planned = plan.peak.total;
          out.accounted = m.memory().peak.total;
          out.pool = m.backend().pool().reserved;
        }
      },
      lo);
  return out;
}

/// Every unit reshards after forward, the root (first in forward, kept into its backward by default) too unless `mo`
/// names it, so that one gather slot can serve.
template <class Strategy, class Prefetch, class Precision = fsdp::precision::full>
void check_bounded(fsdp::model_options mo = {}, std::vector<int> gather_slots = {1, 2, 3}) {
  if (!mo.reshard_after_forward.contains("root")) mo.reshard_after_forward["root"] = true;
  for (int slots : gather_slots) {
    CAPTURE(slots);
    mo.gather_slots = slots;
    const figures f = run<Strategy, Prefetch, Precision>(mo);
    CHECK(f.accounted == f.planned);
    CHECK(f.pool == f.planned);
  }
}
}  // namespace

TEST_CASE("a lagging compute stream takes no memory beyond the plan: every prefetch policy, 1 to 3 gather slots") {
  using fsdp::sharding::full_shard;
  SUBCASE("none") { check_bounded<full_shard, prefetch::none>(); }
  SUBCASE("next") { check_bounded<full_shard, prefetch::next>(); }
  SUBCASE("forward<2>") { check_bounded<full_shard, prefetch::forward<2>>(); }
  SUBCASE("backward_pre<2>") { check_bounded<full_shard, prefetch::backward_pre<2>>(); }
  SUBCASE("backward_post") { check_bounded<full_shard, prefetch::backward_post>(); }
  SUBCASE("explicit_schedule") {
    fsdp::model_options ex;
    ex.prefetch.forward["root"] = {"h.0"};
    ex.prefetch.backward["h.3"] = {"h.2"};
    check_bounded<full_shard, prefetch::explicit_schedule>(ex);
  }
}

TEST_CASE(
    "bounded under mixed precision with no-sync accumulation, with one gradient slot, and with a unit kept gathered") {
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  check_bounded<fsdp::sharding::full_shard, prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>(mo);
  fsdp::model_options one_grad;
  one_grad.grad_slots = 1;  // each unit's gradient waits for the previous reduction
  check_bounded<fsdp::sharding::full_shard, prefetch::next>(one_grad);
  fsdp::model_options keep_root;
  keep_root.reshard_after_forward["root"] = false;  // the default: gathered from its forward to its backward
  check_bounded<fsdp::sharding::full_shard, prefetch::backward_pre<1>>(keep_root, {2, 3});
}

TEST_CASE("grad_slots must be at least one") {
  fsdp::model_options mo;
  mo.grad_slots = 0;
  fsdp_test::run_ranks(1, [&](local_communicator& c) {
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
            fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, prefetch::next>> m(c, fsdp_test::five_units(),
                                                                                  fsdp::wrap::by_prefix{"h."},
                                                                                  fsdp::init::normal{}, mo);
          }) == "fsdp: model_options::grad_slots must be >= 1, got 0");
  });
}
