// The budget helpers: the largest prefetch depth, and the first preferred grouping, whose planned peak fits.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include "tests/support/support.hpp"

namespace {
/// Eight equal blocks of 1024 elements (aligned, so at 4 ranks each shard is exactly 256 elements).
fsdp::ModelSpec blocks() {
  fsdp::ModelSpec s;
  for (int b = 0; b < 8; ++b) s.add("h." + std::to_string(b) + ".w", {32, 32});
  return s;
}
/// Groups of `k` consecutive blocks per unit.
fsdp::wrap::by_function grouping(int k) {
  return fsdp::wrap::by_function{[k](const fsdp::ParamSpec& p) {
    const int b = std::stoi(p.name.substr(2, p.name.find('.', 2) - 2));
    return "g" + std::to_string(b / k);
  }};
}
fsdp::budget_query query() {
  fsdp::budget_query q;
  q.strategy = fsdp::facts_of<fsdp::sharding::full_shard>(4);
  q.optimizer_states = 2;
  q.max_depth = 4;
  q.axis = fsdp::depth_axis::both;
  return q;
}
}  // namespace

TEST_CASE("the largest prefetch depth that fits, worked out by hand") {
  const auto units = fsdp::plan_units("1 block per unit", blocks(), grouping(1), 4);
  REQUIRE(units.names.size() == 8);
  // persistent: 8 units x 256-element shards x 4 B x (params + grads + 2 moments) = 32 768 B, and the optimizer's
  // step block (its update count and rule: 256 B)
  // slots at depth d: (d + 2) gathered units of 4096 B; in backward two gradient slots of 4096 B (grad_slots = 2:
  // one unit's reduction overlaps the next unit's backward) and the reduce-scatter output slot of 1024 B. All
  // are held from the second unit of backward on: its window is itself and its d prefetched neighbours, beside the
  // first unit of the forward pass, kept from its forward to its backward (the default for the root).
  auto peak_at = [](int d) { return 32768 + 256 + (d + 2) * 4096 + 2 * 4096 + 1024; };
  for (int d = 0; d <= 4; ++d) {
    auto q = query();
    q.max_depth = d;
    const auto c = fsdp::largest_prefetch_depth(units, q, peak_at(d));
    REQUIRE(c);
    CHECK(c->depth == d);
    CHECK(c->plan.peak.total == peak_at(d));
    // one byte less and the helper steps down a depth
    const auto below = fsdp::largest_prefetch_depth(units, q, peak_at(d) - 1);
    if (d == 0)
      CHECK(!below);
    else {
      REQUIRE(below);
      CHECK(below->depth == d - 1);
    }
  }
  // a budget between depth 2 and depth 3
  const auto mid = fsdp::largest_prefetch_depth(units, query(), peak_at(3) - 100);
  REQUIRE(mid);
  CHECK(mid->depth == 2);
  // the first unit released after its forward too (budget_query::root_reshards): a gather slot less at every depth
  auto released = query();
  released.root_reshards = true;
  const auto deeper = fsdp::largest_prefetch_depth(units, released, peak_at(2));
  REQUIRE(deeper);
  CHECK(deeper->depth == 3);
  CHECK(deeper->plan.peak.total == peak_at(2));
}

TEST_CASE("memory outside the plan (NCCL's communicators) comes off the budget before any depth is chosen") {
  const auto units = fsdp::plan_units("1 block per unit", blocks(), grouping(1), 4);
  auto peak_at = [](int d) { return 32768 + 256 + (d + 2) * 4096 + 2 * 4096 + 1024; };  // as above
  auto q = query();
  const auto without = fsdp::largest_prefetch_depth(units, q, peak_at(2));
  REQUIRE(without);
  CHECK(without->depth == 2);
  q.outside_plan_bytes = 1;  // one byte more than depth 2 leaves
  const auto with = fsdp::largest_prefetch_depth(units, q, peak_at(2));
  REQUIRE(with);
  CHECK(with->depth == 1);
  CHECK(with->plan.peak.total == peak_at(1));
  q.outside_plan_bytes = peak_at(2) - peak_at(0) + 1;  // not even depth 0 fits beside it
  CHECK_FALSE(fsdp::largest_prefetch_depth(units, q, peak_at(2)));
}

TEST_CASE("the plan's table shows memory outside the plan beside the device's total, when there is some") {
  const auto units = fsdp::plan_units("1 block per unit", blocks(), grouping(1), 4);
  fsdp::memory_plan p = fsdp::detail::plan_at(units, query(), 0);
  const std::string without = p.table();
  CHECK(without.find("NCCL") == std::string::npos);
  p.outside_plan_bytes = 3 << 20;  // a Model on comm::nccl sets it from its communicators
  const std::string with = p.table();
  // as above, depth 0: 32 768 B of shards, grads and moments + the 256 B step block + two 4096 B gather slots (the
  // first unit's, kept, and the current unit's), two 4096 B gradient slots and the 1024 B reduce-scatter output =
  // 50 432 B; with 3 MiB of NCCL beside it, 3 196 160 B
  CHECK(with ==
        "planned peak memory per rank (8 units, at most 2 gathered at once)\n"
        "  sharded params              8192 B       0.008 MiB\n"
        "  gathered params             8192 B       0.008 MiB\n"
        "  grads                       8192 B       0.008 MiB\n"
        "  optimizer state            16640 B       0.016 MiB\n"
        "  comm buffers                9216 B       0.009 MiB\n"
        "  total (at once)            50432 B       0.048 MiB\n"
        "  NCCL (measured)          3145728 B       3.000 MiB\n"
        "  total with NCCL          3196160 B       3.048 MiB\n");
  // Of it, what connecting the plan's collectives took before the reservation (comm::nccl's connect()): a row of
  // its own, inside the NCCL figure.
  p.outside_plan_connect_bytes = 1 << 20;
  const std::string table = p.table();
  CHECK(table.substr(table.find("  NCCL")) ==
        "  NCCL (measured)          3145728 B       3.000 MiB\n"
        "    of it, connect         1048576 B       1.000 MiB\n"
        "  total with NCCL          3196160 B       3.048 MiB\n");
}

TEST_CASE("gather slots cap the useful depth") {
  const auto units = fsdp::plan_units("blocks", blocks(), grouping(1), 4);
  auto q = query();
  q.gather_slots = 2;  // the first unit, kept into its backward, holds one: no depth holds more than two units
  const auto c = fsdp::largest_prefetch_depth(units, q, 1 << 30);
  REQUIRE(c);
  CHECK(c->depth == 4);
  CHECK(c->plan.max_units_gathered == 2);
  CHECK(c->plan.peak.total == 32768 + 256 + 2 * 4096 + 2 * 4096 + 1024);
}

TEST_CASE("the first preferred grouping that fits, at its largest depth") {
  const fsdp::ModelSpec spec = blocks();
  const std::vector<fsdp::planned_units> candidates = {
      fsdp::plan_units("4 blocks per unit", spec, grouping(4), 4),
      fsdp::plan_units("2 blocks per unit", spec, grouping(2), 4),
      fsdp::plan_units("1 block per unit", spec, grouping(1), 4),
  };
  auto q = query();
  // Beside the gradient slots and the reduce output, the first unit of the forward pass holds a gather slot from
  // its forward to its backward (the default for the root), the current unit another, and each unit prefetched one.
  // 4 blocks per unit (two units): two gather slots of 16 384 B at any depth (both units are all there is), two
  // gradient slots of 16 384 B and a 4096 B reduce output; the largest depth, 4, holds no more.
  // 2 blocks per unit at depth 1: 3 x 8192 gathered + 2 x 8192 gradient slots + 2048 output (depth 2: 4 gathered).
  const auto roomy = fsdp::fit_memory_budget(candidates, q, 32768 + 256 + 4 * 16384 + 4096);
  REQUIRE(roomy);
  CHECK(roomy->candidate == 0);
  CHECK(roomy->depth == 4);
  CHECK(roomy->plan.peak.total == 32768 + 256 + 4 * 16384 + 4096);
  const auto tighter = fsdp::fit_memory_budget(candidates, q, 32768 + 256 + 5 * 8192 + 2048);
  REQUIRE(tighter);
  CHECK(tighter->candidate == 1);
  CHECK(tighter->depth == 1);
  CHECK(tighter->plan.peak.total == 32768 + 256 + 5 * 8192 + 2048);
  // below two blocks (the first unit and the current one), two gradient slots and an output slot
  CHECK(!fsdp::fit_memory_budget(candidates, q, 32768 + 256 + 4 * 4096 + 1024 - 1));
  q.max_depth = -1;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::fit_memory_budget(candidates, q, 1); }) ==
        "fsdp: budget: max_depth must be >= 0, got -1");
  q.max_depth = 2;
  q.gather_slots = -3;  // an error, not "nothing fits"
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::fit_memory_budget(candidates, q, 1 << 30); }) ==
        "fsdp: budget: gather_slots must be >= 0 (0 = no limit), got -3");
}

TEST_CASE("a schedule that cannot run is a plan that says why, and the helpers skip it without an exception") {
  const auto units = fsdp::plan_units("blocks", blocks(), grouping(1), 4);
  auto q = query();
  q.strategy = fsdp::facts_of<fsdp::sharding::shard_grad_op>(4);  // every unit stays gathered to its backward
  q.gather_slots = 3;
  CHECK(!fsdp::largest_prefetch_depth(units, q, 1 << 30));
  const fsdp::memory_plan p = fsdp::detail::plan_at(units, q, 0);
  CHECK(!p.feasible());
  CHECK(p.infeasible ==
        "gather slots exhausted: unit 'g3' (index 3) must be gathered for its forward but all 3 slots "
        "are held by 'g0', 'g1', 'g2'; raise model_options::gather_slots or let those units reshard "
        "after forward (model_options::reshard_after_forward)");
  CHECK(p.table().find("  not feasible: gather slots exhausted") != std::string::npos);
  q.gather_slots = 8;
  CHECK(fsdp::detail::plan_at(units, q, 0).feasible());
}

TEST_CASE("bf16 gathers and reductions: the same budget holds a deeper prefetch") {
  const auto units = fsdp::plan_units("blocks", blocks(), grouping(1), 4);
  auto q = query();
  // fp32: depth 1 (three units gathered: the first unit's, kept, and two; two gradient slots, a 1024 B output slot)
  const std::int64_t budget = 32768 + 256 + 5 * 4096 + 1024;
  const auto f32 = fsdp::largest_prefetch_depth(units, q, budget);
  REQUIRE(f32);
  CHECK(f32->depth == 1);
  q.precision = {fsdp::dtype::bf16, fsdp::dtype::f32, fsdp::dtype::bf16};
  const auto bf16 = fsdp::largest_prefetch_depth(units, q, budget);
  REQUIRE(bf16);
  // (d + 2) units of 2048 B gathered, two 2048 B bf16 gradient slots and a 512 B bf16 output slot over the same
  // persistent fp32 shards
  CHECK(bf16->depth == 4);
  CHECK(bf16->plan.peak.total == 32768 + 256 + 8 * 2048 + 512);
}

TEST_CASE("the helper's plan is what a model with that policy measures") {
  const auto units = fsdp::plan_units("blocks", blocks(), grouping(2), 4);
  const auto c = fsdp::largest_prefetch_depth(units, query(), 32768 + 256 + 5 * 8192 + 2048);
  REQUIRE(c);
  REQUIRE(c->depth == 1);
  fsdp_test::run_ranks(4, [&](fsdp::comm::local_communicator& comm) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::depth<1, 1>>> m(comm, blocks(), grouping(2));
    fsdp::optim::adamw opt(m, {});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    opt.step();
    m.synchronize();
    CHECK(m.memory().peak == c->plan.peak);
  });
}

TEST_CASE("the cheapest offload configuration that fits a device budget, worked out by hand") {
  // Eight units of one block at 4 ranks: shards of 256 elements (1024 B), fp32, AdamW (two states), depth d.
  // Slots: (d + 2) gathered units of 4096 B (the first unit of the forward pass is kept from its forward to its
  // backward), two gradient slots of 4096 B, one reduce output of 1024 B = 17 408 B at d = 0 (slots stay made, so
  // the peak is at the optimizer step, which adds the device step's staging slots: two of each host-resident part).
  // Per option, the device peak at depth 0 and the bytes a step moves (each device peak holds the optimizer's 256 B
  // step block beside what is listed: its update count and rule, on the device whatever is offloaded):
  //   none             params 8192 + grads 8192 + state 16 384 + slots                   = 50 432 B; link 0
  //   grads            params 8192 + state 16 384 + slots + 2 x 1024 staged gradients    = 44 288 B; a download of
  //                    1024 B per reduction (8) + the device step's gradient uploads: 8192 + 8192 = 16 384 B
  //   optimizer_state  params 8192 + grads 8192 + slots + 2 x 2048 staged states         = 38 144 B; both states
  //                    up and back: 2 x 8 x 2048                                         = 32 768 B
  //   params           grads 8192 + state 16 384 + two upload slots 2048 (which stage the masters for the device
  //                    step too) + slots                                                 = 44 288 B; an upload of
  //                    1024 B per gather (15: full_shard gathers each unit in forward and in backward, the first
  //                    once) + the device step's master up and back: 15 360 + 32 768     = 48 128 B
  //   all three        two upload slots 2048 + slots                                     = 19 712 B; uploads
  //                    15 360 + downloads 8192 (the optimizer steps on the host)         = 23 552 B
  // Each further depth adds a 4096 B gather slot.
  const auto units = fsdp::plan_units("1 block per unit", blocks(), grouping(1), 4);
  const std::vector<fsdp::offload_facts> options = {
      fsdp::offload::none::facts,
      fsdp::offload::cpu<fsdp::offload::grads>::facts,
      fsdp::offload::cpu<fsdp::offload::optimizer_state>::facts,
      fsdp::offload::cpu<fsdp::offload::params>::facts,
      fsdp::offload::all::facts,
  };
  const auto q = query();
  struct expect {
    std::int64_t budget;
    std::size_t option;
    int depth;
    std::int64_t peak, link;
  };
  for (const expect& e : {expect{50432, 0, 0, 50432, 0},      // nothing offloaded fits
                          expect{45000, 1, 0, 44288, 16384},  // grads: the fewest bytes of those that fit
                          expect{40000, 4, 4, 36096, 23552},  // state (32 768 B) and all (23 552 B) fit
                          expect{30000, 4, 2, 27904, 23552},  // all alone fits, at depth 2
                          expect{20000, 4, 0, 19712, 23552}}) {
    CAPTURE(e.budget);
    const auto c = fsdp::fit_device_budget({units}, options, q, e.budget);
    REQUIRE(c);
    CHECK(c->offload == e.option);
    CHECK(c->depth == e.depth);
    CHECK(c->plan.peak.total == e.peak);
    CHECK(c->plan.link.total() == e.link);
  }
  CHECK(!fsdp::fit_device_budget({units}, options, q, 19711));  // all three at depth 0 needs 19 712 B
  // A host budget too: all three keep 32 768 B of shards and state and two 1024 B download slots on the host.
  const auto host_bound = fsdp::fit_device_budget({units}, options, q, 38200, 34815);
  REQUIRE(host_bound);
  CHECK(host_bound->offload == 2);  // optimizer state alone: 16 384 B on the host
  CHECK(host_bound->depth == 0);
  CHECK(host_bound->plan.peak.total == 38144);
  CHECK(host_bound->plan.peak[fsdp::mem::optimizer_state] == 4096 + 256);  // the two staging slots, the step block
  CHECK(host_bound->plan.host_peak.total == 16384);
  const auto all = fsdp::fit_device_budget({units}, {fsdp::offload::all::facts}, q, 30000);
  REQUIRE(all);
  CHECK(all->plan.host_peak.total == 34816);
  CHECK(all->plan.host_peak[fsdp::mem::comm_buffers] == 2048);
}
