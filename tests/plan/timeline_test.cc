// The timeline planner: predicted step time, exposed communication and the critical path, worked out by hand.
//
// Every case below: full_shard at 4 ranks in fp32, units of 1024 elements (a 256-element shard), so an all-gather
// or a reduce-scatter moves 4096 unsharded bytes x 3/4 = 3072 bytes; on a link of 3.072 MB/s each takes exactly
// 1 ms. Memory-bound work is free (no memory bandwidth given) and the optimizer is SGD without state. The library
// keeps the first unit of the forward pass gathered into its backward by default (the root); unless a case says
// otherwise, inputs() names it with reshard_after_forward = true, so that every unit is released after its forward.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <fsdp/observe/chrome_trace.hpp>

#include "tests/support/support.hpp"

namespace {
using std::chrono::nanoseconds;
constexpr std::int64_t ms(double x) { return static_cast<std::int64_t>(x * 1e6); }

/// Units named by `names`, one 32 x 32 parameter each ("a.w" in unit "a").
fsdp::planned_units units_of(const std::vector<std::string>& names, int ranks = 4) {
  fsdp::ModelSpec spec;
  for (const auto& n : names) spec.add(n + ".w", {32, 32});
  return fsdp::plan_units("units", spec, fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
                            return p.name.substr(0, p.name.find('.'));
                          }},
                          ranks);
}

fsdp::memory_plan_inputs inputs(const fsdp::planned_units& u, fsdp::prefetch_facts pf, fsdp::model_options opt = {},
                                fsdp::offload_facts off = {}, fsdp::precision_facts precision = {}) {
  fsdp::memory_plan_inputs in;
  if (!opt.reshard_after_forward.contains(u.names.front())) opt.reshard_after_forward[u.names.front()] = true;
  in.schedule = fsdp::detail::sched::build_config(
      fsdp::unit_index(u.names), fsdp::facts_of<fsdp::sharding::full_shard>(4), pf, precision, opt, off);
  in.costs = fsdp::plan::make_cost_facts(precision, true, opt.accumulation, off);
  return in;
}

/// Every unit computes `forward` and `backward` ms; collectives take 1 ms.
fsdp::time_model timing(std::size_t units, double forward, double backward) {
  fsdp::time_model t;
  t.world = 4;
  t.link.bytes_per_second = 3.072e6;
  t.compute.assign(units, {nanoseconds(ms(forward)), nanoseconds(ms(backward))});
  return t;
}

fsdp::timeline predict(const fsdp::planned_units& u, const fsdp::memory_plan_inputs& in, const fsdp::time_model& t) {
  return fsdp::plan_timeline(u.names, u.layouts, in, t);
}

std::vector<std::int64_t> exposed_by_unit(const fsdp::timeline& tl) {
  std::vector<std::int64_t> out;
  for (const auto& u : tl.by_unit) out.push_back(u.exposed_ns);
  return out;
}

constexpr fsdp::prefetch_facts none{0, 0, false, false};
constexpr fsdp::prefetch_facts next{1, 1, false, false};
}  // namespace

TEST_CASE("one unit: gather, forward, gather again, backward, reduce; nothing overlaps") {
  const auto u = units_of({"u"});
  // forward 2 ms, backward 3 ms: gather 0-1, forward 1-3 (then released: full_shard), gather 3-4 (its slot is
  // the one forward gave back at 3), backward 4-7, reduce-scatter 7-8, the optimizer (free) at 8.
  const auto tl = predict(u, inputs(u, none), timing(1, 2, 3));
  REQUIRE(tl.feasible());
  CHECK(tl.step_ns == ms(8));
  CHECK(tl.compute_ns == ms(5));
  CHECK(tl.comm_ns == ms(3));
  CHECK(tl.exposed_ns == ms(3));
  CHECK(exposed_by_unit(tl) == std::vector<std::int64_t>{ms(3)});
  CHECK(tl.by_unit[0].gather_ns == ms(2));
  CHECK(tl.by_unit[0].reduce_ns == ms(1));
  CHECK(tl.critical_path_text() ==
        "  all_gather all_gather u forward                   0.000 -      1.000 ms\n"
        "  compute    compute u forward                      1.000 -      3.000 ms\n"
        "  all_gather all_gather u backward                  3.000 -      4.000 ms\n"
        "  compute    compute u backward                     4.000 -      7.000 ms\n"
        "  reduce     reduction u backward                   7.000 -      8.000 ms\n");
}

TEST_CASE("one unit by default: the first unit of the forward pass is gathered once and kept into its backward") {
  const auto u = units_of({"u"});
  fsdp::memory_plan_inputs in = inputs(u, none);
  in.schedule = fsdp::detail::sched::build_config(fsdp::unit_index(u.names),
                                                  fsdp::facts_of<fsdp::sharding::full_shard>(4), none, {}, {}, {});
  // gather 0-1, forward 1-3, backward 3-6 (no second gather), reduce-scatter 6-7
  const auto tl = predict(u, in, timing(1, 2, 3));
  REQUIRE(tl.feasible());
  CHECK(tl.step_ns == ms(7));
  CHECK(tl.comm_ns == ms(2));
  CHECK(tl.by_unit[0].gather_ns == ms(1));
  CHECK(tl.critical_path_text() ==
        "  all_gather all_gather u forward                   0.000 -      1.000 ms\n"
        "  compute    compute u forward                      1.000 -      3.000 ms\n"
        "  compute    compute u backward                     3.000 -      6.000 ms\n"
        "  reduce     reduction u backward                   6.000 -      7.000 ms\n");
}

TEST_CASE("fp32 views over bf16 gathers: half the gather's link time, and the widening on the gather stream") {
  // precision::wire<bf16>: the all-gather moves 2048 unsharded bytes x 3/4 = 1536 bytes, 0.5 ms. Device memory at
  // 6.144 MB/s: the cast of the 256-element shard into bf16 (256 x (4 + 2) bytes) 0.25 ms, the widening of 1024
  // elements (1024 x (2 + 4) bytes) 1 ms, zeroing the fp32 gradient (4096 bytes) 2/3 ms, the addition into the
  // shard (256 x (4 + 4 + 4) bytes) 0.5 ms, SGD's update (256 x 3 x 4 bytes) 0.5 ms; the fp32 reduce-scatter 1 ms.
  const auto u = units_of({"u"});
  const fsdp::precision_facts wire = fsdp::facts_of_precision<fsdp::precision::wire<fsdp::bfloat16>>();
  const fsdp::memory_plan_inputs in = inputs(u, none, {}, {}, wire);
  fsdp::time_model t = timing(1, 2, 3);
  t.memory_bytes_per_second = 6.144e6;
  const auto tl = predict(u, in, t);
  REQUIRE(tl.feasible());
  CHECK(tl.by_unit[0].gather_ns == ms(3.5));  // two gathers, each its cast, its 0.5 ms on the link and its widening
  CHECK(tl.comm_ns == ms(5));  // and the reduction with its addition into the shard (1.5 ms)
  CHECK(tl.critical_path_text() ==
        "  all_gather all_gather u forward                   0.000 -      0.750 ms\n"
        "  all_gather widen u forward                        0.750 -      1.750 ms\n"
        "  compute    compute u forward                      1.750 -      3.750 ms\n"
        "  all_gather all_gather u backward                  3.750 -      4.500 ms\n"
        "  all_gather widen u backward                       4.500 -      5.500 ms\n"
        "  compute    zero grad u backward                   5.500 -      6.167 ms\n"
        "  compute    compute u backward                     6.167 -      9.167 ms\n"
        "  reduce     reduction u backward                   9.167 -     10.167 ms\n"
        "  reduce     add into shard u backward             10.167 -     10.667 ms\n"
        "  compute    optimizer u                           10.667 -     11.167 ms\n");
}

TEST_CASE("fp8 or int8 gathers in blocks of 16: the link carries the values and the scales") {
  // precision::scaled<float8_e4m3, 16> or <std::int8_t, 16>: 1024 one-byte values and 64 fp32 scales, 1280 bytes x
  // 3/4 = 960 bytes, 0.3125 ms; memory-bound work free. Gather 0-0.3125, forward to 2.3125, gather to 2.625, backward
  // to 5.625, the bf16 gradient cast to fp32 and reduce-scattered (3072 bytes) to 6.625. int8 moves fp8's bytes.
  const auto u = units_of({"u"});
  for (const fsdp::precision_facts q : {fsdp::facts_of_precision<fsdp::precision::scaled<fsdp::float8_e4m3, 16>>(),
                                        fsdp::facts_of_precision<fsdp::precision::scaled<std::int8_t, 16>>()}) {
    CAPTURE(fsdp::name_of(q.gather));
    const fsdp::memory_plan_inputs in = inputs(u, none, {}, {}, q);
    const auto tl = predict(u, in, timing(1, 2, 3));
    REQUIRE(tl.feasible());
    CHECK(tl.by_unit[0].gather_ns == ms(0.625));
    CHECK(tl.step_ns == ms(6.625));
  }
}

TEST_CASE("gradients reduced in int8 blocks of 16: an all_to_all of the quantized slices instead of the fp32 "
          "reduce-scatter") {
  // precision::scaled<std::int8_t, 16, bf16, std::int8_t>: the gathers as above (0.3125 ms each); the reduction sends
  // 4 slices of 256 values and 16 scales, 1280 bytes x 3/4 = 960 bytes, 0.3125 ms instead of the fp32
  // reduce-scatter's 1 ms: gather 0-0.3125, forward to 2.3125, gather to 2.625, backward to 5.625, all_to_all to
  // 5.9375 (the quantization before it and the sum after it are memory-bound: free here).
  const auto u = units_of({"u"});
  const fsdp::precision_facts q =
      fsdp::facts_of_precision<fsdp::precision::scaled<std::int8_t, 16, fsdp::bfloat16, std::int8_t>>();
  const fsdp::memory_plan_inputs in = inputs(u, none, {}, {}, q);
  auto tl = predict(u, in, timing(1, 2, 3));
  REQUIRE(tl.feasible());
  CHECK(tl.by_unit[0].reduce_ns == ms(0.3125));
  CHECK(tl.step_ns == ms(5.9375));
  CHECK(tl.critical_path_text() ==
        "  all_gather all_gather u forward                   0.000 -      0.312 ms\n"
        "  compute    compute u forward                      0.312 -      2.312 ms\n"
        "  all_gather all_gather u backward                  2.312 -      2.625 ms\n"
        "  compute    compute u backward                     2.625 -      5.625 ms\n"
        "  reduce     reduction u backward                   5.625 -      5.938 ms\n");
  // With device memory at 6.144 MB/s (6144 bytes a ms): each gather casts 256 elements (256 x (4 + 1) bytes) and
  // writes 16 scales (64 bytes), 0.219 ms before its 0.3125 on the link; each dequantization reads the 1280-byte wire
  // and writes 1024 bf16 views, 0.542 ms; zeroing the bf16 gradient 0.333 ms; the quantization reads the bf16
  // gradient and writes the slices (2048 + 1280 bytes), the sum reads the slices and reads and writes the fp32 shard
  // (1280 + 2 x 1024 bytes), 0.542 ms each; SGD 0.5 ms.
  fsdp::time_model t = timing(1, 2, 3);
  t.memory_bytes_per_second = 6.144e6;
  tl = predict(u, in, t);
  REQUIRE(tl.feasible());
  CHECK(tl.critical_path_text() ==
        "  all_gather all_gather u forward                   0.000 -      0.531 ms\n"
        "  all_gather widen u forward                        0.531 -      1.073 ms\n"
        "  compute    compute u forward                      1.073 -      3.073 ms\n"
        "  all_gather all_gather u backward                  3.073 -      3.604 ms\n"
        "  all_gather widen u backward                       3.604 -      4.146 ms\n"
        "  compute    zero grad u backward                   4.146 -      4.479 ms\n"
        "  compute    compute u backward                     4.479 -      7.479 ms\n"
        "  reduce     cast for reduction u backward          7.479 -      8.021 ms\n"
        "  reduce     reduction u backward                   8.021 -      8.333 ms\n"
        "  reduce     add into shard u backward              8.333 -      8.875 ms\n"
        "  compute    optimizer u                            8.875 -      9.375 ms\n");
}

TEST_CASE(
    "hybrid sharding: shard groups of one rank gather in no time; the replicas' all-reduce is the communication") {
  // hybrid_shard<1> at 4 ranks: the layout is one rank's (a 1024-element shard), gathers and reduce-scatters run in
  // groups of one (no time), and the reduced shard is all-reduced across the 4 replicas on the replica link:
  // 4096 bytes x 2 x 3/4 = 6144 bytes at 3.072 MB/s, 2 ms. Forward 0-2, backward 2-5, all-reduce 5-7.
  const auto u = units_of({"u"}, 1);
  fsdp::memory_plan_inputs in;
  in.schedule =
      fsdp::detail::sched::build_config(fsdp::unit_index(u.names), fsdp::facts_of<fsdp::sharding::hybrid_shard<1>>(4),
                                        none, fsdp::precision_facts{}, {}, {});
  in.costs = fsdp::plan::make_cost_facts(fsdp::precision_facts{}, true, {}, {});
  fsdp::time_model t = timing(1, 2, 3);
  t.replica_link = t.link;
  const auto tl = predict(u, in, t);
  REQUIRE(tl.feasible());
  CHECK(tl.step_ns == ms(7));
  CHECK(tl.compute_ns == ms(5));
  CHECK(tl.comm_ns == ms(2));
  CHECK(tl.exposed_ns == ms(2));
  CHECK(tl.by_unit[0].gather_ns == 0);
  CHECK(tl.by_unit[0].reduce_ns == ms(2));
}

TEST_CASE("two units with prefetch next: compute longer than, equal to and shorter than the gathers") {
  const auto u = units_of({"a", "b"});
  SUBCASE("compute 2 ms per pass, gathers 1 ms") {
    // forward: gathers a 0-1, b 1-2; a 1-3, b 3-5. backward: b's gather waits for the slot a gave back at 3
    // (3-4), a's for b's at 5 (5-6); b 5-7, reduce b 7-8; a 7-9, reduce a 9-10. Compute covers 1-9: exposed are
    // a's first gather (0-1) and its reduction (9-10).
    const auto tl = predict(u, inputs(u, next), timing(2, 2, 2));
    CHECK(tl.step_ns == ms(10));
    CHECK(tl.compute_ns == ms(8));
    CHECK(tl.comm_ns == ms(6));
    CHECK(tl.exposed_ns == ms(2));
    CHECK(exposed_by_unit(tl) == std::vector<std::int64_t>{ms(2), 0});
  }
  SUBCASE("compute 1 ms per pass, as long as a gather") {
    // gathers a 0-1, b 1-2; a 1-2, b 2-3; backward gathers b 2-3, a 3-4; b 3-4, reduce b 4-5; a 4-5, reduce a
    // 5-6. Communication runs 0-6 without a gap, compute 1-5.
    const auto tl = predict(u, inputs(u, next), timing(2, 1, 1));
    CHECK(tl.step_ns == ms(6));
    CHECK(tl.compute_ns == ms(4));
    CHECK(tl.comm_ns == ms(6));
    CHECK(tl.exposed_ns == ms(2));
    CHECK(exposed_by_unit(tl) == std::vector<std::int64_t>{ms(2), 0});
  }
  SUBCASE("compute 0.5 ms per pass, half a gather") {
    // gathers a 0-1, b 1-2; a 1-1.5, b 2-2.5; backward gathers b 2-3, a 3-4; b 3-3.5, reduce b 3.5-4.5; a 4-4.5,
    // reduce a 4.5-5.5. Compute (2 ms) lies inside communication (0-5.5): 3.5 ms exposed. By unit: a's gathers
    // 0-1 and 3-4 less 3-3.5, and its reduction (2.5 ms); b's gathers and reduction less the compute under them
    // (1.5 ms). The two overlap 3.5-4 (b's reduction under a's gather), so they add up to more than the total.
    const auto tl = predict(u, inputs(u, next), timing(2, 0.5, 0.5));
    CHECK(tl.step_ns == ms(5.5));
    CHECK(tl.compute_ns == ms(2));
    CHECK(tl.comm_ns == ms(5.5));
    CHECK(tl.exposed_ns == ms(3.5));
    CHECK(exposed_by_unit(tl) == std::vector<std::int64_t>{ms(2.5), ms(1.5)});
  }
}

TEST_CASE("serial collectives (one NCCL communicator): a reduce-scatter waits for the gather issued before it") {
  const auto u = units_of({"a", "b"});
  // As "compute 0.5 ms per pass" above, but the group's collectives run one at a time in issue order: the host
  // issues a's backward gather (the prefetch, 3-4) before b's reduce-scatter, which now waits for it (4-5 instead
  // of 3.5-4.5) though its stream is free at 3.5; a computes 4-4.5, and a's reduce-scatter follows b's (5-6).
  fsdp::time_model t = timing(2, 0.5, 0.5);
  const auto concurrent = predict(u, inputs(u, next), t);
  t.serial_collectives = true;
  const auto tl = predict(u, inputs(u, next), t);
  CHECK(concurrent.step_ns == ms(5.5));
  CHECK(tl.step_ns == ms(6));
  // the path runs through the group's collectives: every gather, then b's reduce-scatter after a's gather
  CHECK(tl.critical_path_text() ==
        "  all_gather all_gather a forward                   0.000 -      1.000 ms\n"
        "  all_gather all_gather b forward                   1.000 -      2.000 ms\n"
        "  all_gather all_gather b backward                  2.000 -      3.000 ms\n"
        "  all_gather all_gather a backward                  3.000 -      4.000 ms\n"
        "  reduce     reduction b backward                   4.000 -      5.000 ms\n"
        "  reduce     reduction a backward                   5.000 -      6.000 ms\n");
}

TEST_CASE("a Model predicts its own step: its world set from its communicator, the rest as the time model says") {
  // The case "serial collectives" above on a 4-rank model of units a and b: the time model's world is left at 1
  // (where a collective moves nothing and takes no time); the model sets 4, giving the 5.5 ms step. comm::local
  // runs each stream's collectives when the stream gets there: not serial, whatever the time model says.
  fsdp::ModelSpec spec;
  for (const char* n : {"a.w", "b.w"}) spec.add(n, {32, 32});
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::depth<1, 1>>;
  fsdp::model_options release_a;  // as inputs() does
  release_a.reshard_after_forward["a"] = true;
  fsdp_test::run_ranks(4, [&](fsdp::comm::local_communicator& comm) {
    fsdp::Model<P> m(comm, spec, fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }},
                     fsdp::init::normal{}, release_a);
    fsdp::time_model t = timing(2, 0.5, 0.5);
    t.world = 1;
    t.serial_collectives = true;
    const fsdp::timeline tl = fsdp::plan_timeline(m, t, 0);
    CHECK(tl.feasible());
    CHECK(tl.step_ns == ms(5.5));
    CHECK(tl.comm_ns > 0);
    const auto u = units_of({"a", "b"});
    CHECK(tl.critical_path_text() == predict(u, inputs(u, next), timing(2, 0.5, 0.5)).critical_path_text());
  });
}

TEST_CASE("prefetch depth limited by gather slots runs as the shallower depth") {
  const auto u = units_of({"a", "b", "c"});
  // depth 2 with 2 gather slots: forward gathers a 0-1, b 1-2, then c only when a gives its slot back (2): 2-3;
  // a 1-2, b 2-3, c 3-4. Backward: c 3-4 (the slot b gave back at 3), b 4-5 (c's, at 4), then a only when c's
  // backward gives a slot back (5): 5-6; c 4-5, reduce c 5-6; b 5-6, reduce b 6-7; a 6-7 (its gradient takes the
  // slot c's reduction gave back at 6), reduce a 7-8.
  fsdp::model_options two_slots;
  two_slots.gather_slots = 2;
  const auto limited = predict(u, inputs(u, {2, 2, false, false}, two_slots), timing(3, 1, 1));
  CHECK(limited.step_ns == ms(8));
  CHECK(limited.compute_ns == ms(6));
  CHECK(limited.comm_ns == ms(8));
  CHECK(limited.exposed_ns == ms(2));
  // next (depth 1) without a limit: the same timeline, event for event.
  const auto shallow = predict(u, inputs(u, next), timing(3, 1, 1));
  CHECK(shallow.step_ns == ms(8));
  REQUIRE(shallow.events.size() == limited.events.size());
  for (std::size_t i = 0; i < shallow.events.size(); ++i) {
    CHECK(shallow.events[i].t_ns == limited.events[i].t_ns);
    CHECK(shallow.events[i].what == limited.events[i].what);
    CHECK(shallow.events[i].unit == limited.events[i].unit);
  }
  // depth 2 without the limit gathers all three at once, and is no faster: the gather stream is the bottleneck
  const auto deep = predict(u, inputs(u, {2, 2, false, false}), timing(3, 1, 1));
  CHECK(deep.step_ns == ms(8));
}

TEST_CASE("the root unit kept gathered from its forward to its backward") {
  const auto u = units_of({"root", "b"});
  // No prefetch, compute 1 ms per pass. Resharding both (inputs() names root with true): every gather waits for the one
  // slot (gather root 0-1, root 1-2, b 2-3, b 3-4; backward b 4-5, b 5-6, root 6-7, root 7-8, reduce root 8-9): 9 ms,
  // nothing hidden.
  const auto resharded = predict(u, inputs(u, none), timing(2, 1, 1));
  CHECK(resharded.step_ns == ms(9));
  CHECK(resharded.compute_ns == ms(4));
  CHECK(resharded.comm_ns == ms(5));
  CHECK(resharded.exposed_ns == ms(5));
  // Root kept (the library's default, named here): b's gather takes a second slot at once (1-2), b 2-3; backward b's
  // gather waits for its slot (3-4), b 4-5, reduce b 5-6 under root's backward 5-6 (no gather: still gathered), reduce
  // root 6-7.
  fsdp::model_options keep;
  keep.reshard_after_forward = {{"root", false}};
  const auto kept = predict(u, inputs(u, none, keep), timing(2, 1, 1));
  CHECK(kept.step_ns == ms(7));
  CHECK(kept.compute_ns == ms(4));
  CHECK(kept.comm_ns == ms(5));
  CHECK(kept.exposed_ns == ms(3));
  CHECK(exposed_by_unit(kept) == std::vector<std::int64_t>{ms(2), ms(1)});
  CHECK(kept.by_unit[0].gather_ns == ms(1));  // root is gathered once per step
}

TEST_CASE("offloaded params: the upload stream before each gather, the staged step after the reductions") {
  const auto u = units_of({"u"});
  auto t = timing(1, 2, 3);
  t.pcie_bytes_per_second = 1.024e6;  // a 256-element fp32 shard (1024 B) in 1 ms
  // upload 0-1, gather 1-2, forward 2-4; backward: upload 1-2 (the second upload slot), gather 4-5 (after the
  // gather slot comes back at 4), backward 5-8, reduce 8-9; the staged step: the master to the device 9-10, the
  // kernels (free) at 10, the master back 10-11.
  const auto tl = predict(u, inputs(u, none, {}, fsdp::offload::cpu<fsdp::offload::params>::facts), t);
  REQUIRE(tl.feasible());
  CHECK(tl.step_ns == ms(11));
  // compute: forward 2-4, backward 5-8, and the optimizer step 9-10 (from its start after the reductions to its
  // end after the staged kernels, as a measured trace stamps it)
  CHECK(tl.compute_ns == ms(6));
  CHECK(tl.comm_ns == ms(3));
  CHECK(tl.exposed_ns == ms(3));
  CHECK(tl.critical_path_text() ==
        "  upload     upload u forward                       0.000 -      1.000 ms\n"
        "  all_gather all_gather u forward                   1.000 -      2.000 ms\n"
        "  compute    compute u forward                      2.000 -      4.000 ms\n"
        "  all_gather all_gather u backward                  4.000 -      5.000 ms\n"
        "  compute    compute u backward                     5.000 -      8.000 ms\n"
        "  reduce     reduction u backward                   8.000 -      9.000 ms\n"
        "  upload     stage master u                         9.000 -     10.000 ms\n"
        "  download   master back u                         10.000 -     11.000 ms\n");
}

TEST_CASE("offloaded gradients: a slow host addition does not hold backward (host functions on their own lane)") {
  // Four units, two gradient slots: backward d, c, b, a; a takes the slot c gave back once c's reduction was copied
  // to the host. With the host additions on the download stream, that copy queued behind d's host addition, and a
  // slow host held a's backward back by it; on their own lane the copies go on, and backward ends where it ends with
  // a free host. Each host addition here takes 10 ms (a 256-element shard: 3072 bytes at 307.2 kB/s).
  const auto u = units_of({"a", "b", "c", "d"});
  const auto in = inputs(u, none, {}, fsdp::offload::cpu<fsdp::offload::grads>::facts);
  auto backward_end = [&](const fsdp::timeline& tl, int unit) {
    std::int64_t t = -1;
    for (const auto& e : tl.events)
      if (e.what == fsdp::trace::kind::compute_end && e.pass == fsdp::pass_kind::backward && e.unit == unit) t = e.t_ns;
    return t;
  };
  auto t = timing(4, 1, 1);
  const auto free_host = predict(u, in, t);
  t.host_bytes_per_second = 3.072e5;
  const auto slow_host = predict(u, in, t);
  REQUIRE(free_host.feasible());
  REQUIRE(slow_host.feasible());
  REQUIRE(backward_end(free_host, 0) > 0);
  CHECK(backward_end(slow_host, 0) == backward_end(free_host, 0));
  CHECK(slow_host.step_ns > free_host.step_ns);  // the optimizer still waits for the host additions
}

TEST_CASE("the same inputs give the same prediction, bit for bit; summarize() reads it as the planner does") {
  fsdp::ModelSpec spec;
  spec.add("emb.w", {512, 64});
  for (int l = 0; l < 6; ++l) spec.add("h." + std::to_string(l) + ".w", {256, 64});
  spec.add("head.w", {512, 64});
  const auto u = fsdp::plan_units("blocks", spec, fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
                                    return p.name.substr(0, p.name.rfind('.'));
                                  }},
                                  8);
  fsdp::budget_query q;
  q.strategy = fsdp::facts_of<fsdp::sharding::full_shard>(8);
  q.precision = {fsdp::dtype::bf16, fsdp::dtype::f32, fsdp::dtype::f32};
  q.optimizer_states = 2;
  fsdp::time_model t;
  t.world = 8;
  t.link = {48e9, std::chrono::microseconds(20)};
  t.memory_bytes_per_second = 2e12;
  const fsdp::flops_model flops{4096, 400e12, 2, 4, {"emb.w"}};
  for (const auto& l : u.layouts) t.compute.push_back(flops(l));
  const auto in = fsdp::planner_inputs(u, q, next);
  const auto a = fsdp::plan_timeline(u.names, u.layouts, in, t);
  const auto b = fsdp::plan_timeline(u.names, u.layouts, in, t);
  REQUIRE(a.events.size() == b.events.size());
  CHECK(a.events.size() > 100);
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    CHECK(a.events[i].t_ns == b.events[i].t_ns);
    CHECK(a.events[i].what == b.events[i].what);
  }
  CHECK(a.report() == b.report());
  const auto s = fsdp::trace::summarize(a.events, 0, 1);
  CHECK(s.exposed_comm_s == double(a.exposed_ns) * 1e-9);
  CHECK(s.compute_s == double(a.compute_ns) * 1e-9);
  CHECK(s.comm_s == double(a.comm_ns) * 1e-9);
  // a gather per unit per pass (the last forward unit regathers; the first, kept, is gathered once), a reduction each
  CHECK(s.collectives.size() == 2 * 8 - 1 + 8);
  // the Chrome trace of the prediction: a "predicted rank 0" process with one slice per unit per pass
  const auto doc = fsdp::trace::chrome_trace_json(a.events, a.units, {}, {"predicted rank ", 100});
  int compute_slices = 0;
  std::string process;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "compute") ++compute_slices;
    if (e["ph"] == "M" && e["name"] == "process_name") process = e["args"]["name"];
  }
  CHECK(compute_slices == 2 * 8);
  CHECK(process == "predicted rank 0");
}

TEST_CASE("ranking configurations by predicted step time, among those that fit") {
  const auto u = units_of({"a", "b", "c"});
  fsdp::budget_query q;
  q.strategy = fsdp::facts_of<fsdp::sharding::full_shard>(4);
  q.root_reshards = true;                // a too is released after its forward, as inputs() does
  fsdp::time_model t = timing(3, 0, 0);  // compute from the rule below
  const auto compute = [](const fsdp::FlatLayout&) { return fsdp::unit_time{nanoseconds(ms(1)), nanoseconds(ms(1))}; };
  const std::vector<fsdp::time_variant> variants = {
      {"none", none, 0, {}},
      {"next", next, 0, {}},
      {"depth 2", {2, 2, false, false}, 0, {}},
  };
  // Peaks: 3 units x 256 x 4 B x (params + grads) = 6144 B persistent, and the optimizer's 256 B step block; none
  // holds one gather slot (4096 B), next two, depth 2 three; two gradient slots (8192 B) and the 1024 B reduce output
  // for all.
  const std::int64_t peak_none = 6144 + 256 + 4096 + 8192 + 1024;
  const auto r = fsdp::rank_by_time({u}, variants, q, t, compute, peak_none + 4096);
  REQUIRE(r.ranked.size() == 2);
  // none: every gather waits for the one slot: 0-1 a, 1-2; 2-3 b, 3-4; 4-5 c, 5-6; backward c 6-7, 7-8 (reduce
  // 8-9); b 8-9, 9-10 (10-11); a 10-11, 11-12, reduce 12-13: 13 ms. next: 8 ms (the case above).
  CHECK(r.ranked[0].label == "units / next");
  CHECK(r.ranked[0].time.step_ns == ms(8));
  CHECK(r.ranked[1].label == "units / none");
  CHECK(r.ranked[1].time.step_ns == ms(13));
  CHECK(r.ranked[1].plan.peak.total == peak_none);
  REQUIRE(r.left_out.size() == 1);
  CHECK(r.left_out[0] == "'units / depth 2': its peak of 27904 bytes is over the budget of 23808");
  CHECK(r.why() ==
        "'units / next' wins: predicted step 8.000 ms, 2.000 ms of it exposed communication; peak 23808 B of the "
        "23808 B budget. The next fastest, 'units / none', takes 13.000 ms (7.000 ms exposed): 5.000 ms slower, with "
        "5.000 ms more communication left exposed");
}

TEST_CASE("ranking groupings: three small units against one large one") {
  // The same three 32 x 32 parameters, as three units or as one. Compute: 1 ms per 1024 elements per pass.
  fsdp::ModelSpec spec;
  for (const char* n : {"a", "b", "c"}) spec.add(std::string(n) + ".w", {32, 32});
  const std::vector<fsdp::planned_units> groupings = {
      fsdp::plan_units("1 unit", spec,
                       fsdp::wrap::by_function{[](const fsdp::ParamSpec&) { return std::string("all"); }}, 4),
      units_of({"a", "b", "c"}),
  };
  fsdp::budget_query q;
  q.strategy = fsdp::facts_of<fsdp::sharding::full_shard>(4);
  q.root_reshards = true;  // every unit released after its forward, the first too (as inputs() does)
  const auto compute = [](const fsdp::FlatLayout& l) {
    const nanoseconds t(ms(double(l.numel()) / 1024.0));
    return fsdp::unit_time{t, t};
  };
  const auto r = fsdp::rank_by_time(groupings, {{"next", next, 0, {}}}, q, timing(0, 0, 0), compute,
                                    std::numeric_limits<std::int64_t>::max());
  // one unit of 3072 elements: its gathers and its reduce-scatter take 3 ms each and nothing overlaps them (gather
  // 0-3, forward 3-6, gather 6-9 after the release, backward 9-12, reduce 12-15): 15 ms, 9 exposed. Three units:
  // 8 ms, 2 exposed (the depth case above).
  REQUIRE(r.ranked.size() == 2);
  CHECK(r.ranked[0].candidate == 1);
  CHECK(r.ranked[1].time.step_ns == ms(15));
  CHECK(r.ranked[1].time.exposed_ns == ms(9));
  CHECK(r.why() ==
        "'units / next' wins: predicted step 8.000 ms, 2.000 ms of it exposed communication; peak 23808 B (no budget). "
        "The next fastest, '1 unit / next', takes 15.000 ms (9.000 ms exposed): 7.000 ms slower, with 7.000 ms more "
        "communication left exposed");
}

TEST_CASE("a time model that does not fit the units is refused, naming what is wrong") {
  const auto u = units_of({"a", "b"});
  auto t = timing(2, 1, 1);
  t.compute.pop_back();
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { predict(u, inputs(u, next), t); }) ==
        "fsdp: timeline plan: time_model::compute has 1 entries for 2 units; give each unit's forward and backward "
        "time in unit-index order (or use flops_model)");
  t = timing(2, 1, 1);
  t.link.bytes_per_second = -1;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { predict(u, inputs(u, next), t); }) ==
        "fsdp: timeline plan: time_model::link.bytes_per_second must be >= 0 (0: free), got -1");
  t = timing(2, 1, 1);
  t.link.latency = nanoseconds(-1);
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { predict(u, inputs(u, next), t); }) ==
        "fsdp: timeline plan: time_model::link.latency must be >= 0, got -1 ns");
  t = timing(2, 1, 1);
  t.link.bytes_per_second = 1e-12;  // 3072 bytes would take about 97 000 years
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { predict(u, inputs(u, next), t); }).rfind(
            "fsdp: timeline plan: a collective would take", 0) == 0);
  t = timing(2, 1, 1);
  t.world = 6;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { predict(u, inputs(u, next), t); }) ==
        "fsdp: timeline plan: time_model::world is 6, which the shard group of 4 ranks (the layouts') does not "
        "divide; set it to the data-parallel world size");
  t = timing(2, 1, 1);
  t.expert = 3;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { predict(u, inputs(u, next), t); }) ==
        "fsdp: timeline plan: time_model::expert is 3, which does not divide the world of 4 data-parallel ranks; set "
        "it to model_options::expert_parallel");
  t = timing(2, 1, 1);
  t.expert_shard_link = fsdp::comm::link_model{.bytes_per_second = -1};
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { predict(u, inputs(u, next), t); }) ==
        "fsdp: timeline plan: time_model::expert_shard_link.bytes_per_second must be >= 0 (0: free), got -1");
  t = timing(2, 1, 1);
  t.compute[1].backward = nanoseconds(-1);
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { predict(u, inputs(u, next), t); }) ==
        "fsdp: timeline plan: unit 'b' has a negative compute time");
  // a schedule that cannot run is a timeline that is not feasible, with the memory planner's sentence
  fsdp::model_options one_slot;
  one_slot.gather_slots = 1;
  fsdp::model_options keep = one_slot;
  keep.reshard_after_forward = {{"a", false}};
  const auto tl = predict(u, inputs(u, none, keep), timing(2, 1, 1));
  CHECK(!tl.feasible());
  CHECK(tl.infeasible ==
        "gather slots exhausted: unit 'b' (index 1) must be gathered for its forward but all 1 slots are held by 'a'; "
        "raise model_options::gather_slots or let those units reshard after forward "
        "(model_options::reshard_after_forward)");
}

TEST_CASE("serial collectives under hybrid sharding: the replicas' all-reduce and the shard group's gathers one at a "
          "time, in issue order") {
  // hybrid_shard<2> at 4 ranks: shard groups of 2 (a 512-element shard of each 1024-element unit), 2 replicas. On a
  // link of 2.048 MB/s a gather or reduce-scatter in the shard group moves 4096 x 1/2 = 2048 bytes (1 ms); the
  // all-reduce of a 2048-byte shard across 2 replicas 2048 x 2 x 1/2 = 2048 bytes (1 ms) on the replica link;
  // compute 0.5 ms per pass, prefetch next. comm::nccl issues every collective of every group on one stream, in
  // the host's order (nccl_core::join_family): gathers a, b, c 0-3; c's backward gather 3-4; b's, prefetched while c
  // computes (4-4.5), 4-5; c's reduce-scatter, issued after it, 5-6, then c's replica all-reduce 6-7; a's backward
  // gather, issued as b is entered, waits for that: 7-8 (unordered, it would run beside it on its own link, 6-7);
  // b's reduction 8-9 and replica all-reduce 9-10, a's 10-11 and 11-12.
  const auto u = units_of({"a", "b", "c"}, 2);
  fsdp::memory_plan_inputs in;
  fsdp::model_options release_a;  // a too is released after its forward (as inputs() does)
  release_a.reshard_after_forward["a"] = true;
  in.schedule =
      fsdp::detail::sched::build_config(fsdp::unit_index(u.names), fsdp::facts_of<fsdp::sharding::hybrid_shard<2>>(4),
                                        next, fsdp::precision_facts{}, release_a, {});
  in.costs = fsdp::plan::make_cost_facts(fsdp::precision_facts{}, true, {}, {});
  fsdp::time_model t = timing(3, 0.5, 0.5);
  t.link.bytes_per_second = 2.048e6;
  t.replica_link = t.link;
  const auto concurrent = predict(u, in, t);
  t.serial_collectives = true;
  const auto tl = predict(u, in, t);
  CHECK(concurrent.step_ns == ms(10.5));
  CHECK(tl.step_ns == ms(12));
  CHECK(tl.critical_path_text() ==
        "  all_gather all_gather a forward                   0.000 -      1.000 ms\n"
        "  all_gather all_gather b forward                   1.000 -      2.000 ms\n"
        "  all_gather all_gather c forward                   2.000 -      3.000 ms\n"
        "  all_gather all_gather c backward                  3.000 -      4.000 ms\n"
        "  all_gather all_gather b backward                  4.000 -      5.000 ms\n"
        "  reduce     reduction c backward                   5.000 -      6.000 ms\n"
        "  reduce     replica all_reduce c backward          6.000 -      7.000 ms\n"
        "  all_gather all_gather a backward                  7.000 -      8.000 ms\n"
        "  reduce     reduction b backward                   8.000 -      9.000 ms\n"
        "  reduce     replica all_reduce b backward          9.000 -     10.000 ms\n"
        "  reduce     reduction a backward                  10.000 -     11.000 ms\n"
        "  reduce     replica all_reduce a backward         11.000 -     12.000 ms\n");
}

TEST_CASE(
    "nodes: a group inside a node runs on its links; across nodes on k GPUs' share of the network, at most "
    "the node's links") {
  // nodes of 8 GPUs: NVLink 200 GB/s a GPU, 2 us; the network 20 GB/s a GPU (160 GB/s a node), 10 us and 1 us a
  // ring step
  const fsdp::comm::cluster_links c{
      .gpus_per_node = 8,
      .intra = {.bytes_per_second = 200e9, .latency = nanoseconds(2000)},
      .inter = {.bytes_per_second = 20e9, .latency = nanoseconds(10000), .step_latency = nanoseconds(1000)}};
  const struct {
    int size, stride;
    double bytes_per_second;
    std::int64_t latency_ns;
  } cases[] = {
      {8, 1, 200e9, 2000},    // one node's 8 GPUs
      {4, 2, 200e9, 2000},    // a shard group of 4 beside tensor groups of 2: still one node
      {16, 1, 160e9, 10000},  // 2 nodes, 8 each: 8 x 20 GB/s, below NVLink
      {8, 2, 80e9, 10000},    // 2 nodes, 4 each (two such groups share a node's network)
      {4, 4, 40e9, 10000},    // 2 nodes, 2 each
      {4, 8, 20e9, 10000},    // a replicate group: one rank a node, one GPU's share
      {2, 16, 20e9, 10000},   // one rank a node, nodes apart
  };
  for (const auto& k : cases) {
    CAPTURE(k.size);
    CAPTURE(k.stride);
    const fsdp::comm::link_model l = c.group(k.size, k.stride);
    CHECK(l.bytes_per_second == k.bytes_per_second);
    CHECK(l.latency.count() == k.latency_ns);
    CHECK(l.step_latency.count() == (k.latency_ns == 2000 ? 0 : 1000));
  }
  // an all-gather over 2 nodes of 8: 10 us, 15 ring steps of 1 us and 1.6 GB x 15/16 at 160 GB/s (9.375 ms); an
  // all-reduce of the same bytes: 30 steps, twice the bytes
  CHECK(c.group(16, 1).duration(fsdp::collective::all_gather, 1'600'000'000, 16).count() ==
        10'000 + 15'000 + 9'375'000);
  CHECK(c.group(16, 1).duration(fsdp::collective::all_reduce, 1'600'000'000, 16).count() ==
        10'000 + 30'000 + 18'750'000);
  // nothing that straddles nodes unevenly
  for (const auto& g : {std::pair{3, 1}, {2, 3}, {4, 12}, {3, 4}}) {  // (size, stride)
    CAPTURE(g.first);
    CAPTURE(g.second);
    CHECK_THROWS_AS(c.group(g.first, g.second), fsdp::usage_error);
  }
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { c.group(3, 4); }) ==
        "fsdp: cluster_links::group: groups of 3 ranks 4 apart do not tile nodes of 8 GPUs (each node must hold the "
        "same number of a group's ranks, and a group inside a node must not cross into the next): choose mesh "
        "dimensions whose products divide, or are multiples of, gpus_per_node");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { c.group(0, 1); }) ==
        "fsdp: cluster_links::group: gpus_per_node (8), size (0) and stride (1) must be positive");
}

TEST_CASE(
    "nodes: a mesh's groups placed on a cluster (shard groups inside nodes, replicas across, tensor groups "
    "innermost)") {
  const fsdp::comm::cluster_links c{
      .gpus_per_node = 4, .intra = {.bytes_per_second = 100e9}, .inter = {.bytes_per_second = 10e9}};
  fsdp::time_model t;
  fsdp::place_on_cluster(t, c, {.replicas = 2, .shards = 2, .tensor = 2});  // 8 ranks on 2 nodes
  CHECK(t.world == 4);
  CHECK(t.tensor == 2);
  CHECK(t.tensor_link.bytes_per_second == 100e9);                            // {0,1}: one node
  CHECK(t.link.bytes_per_second == 100e9);                                   // {0,2}: one node
  CHECK(t.replica_link.bytes_per_second == 10e9);                            // {0,4}: a rank on each node
  fsdp::place_on_cluster(t, c, {.replicas = 1, .shards = 16, .tensor = 1});  // full_shard over 4 nodes
  CHECK(t.world == 16);
  CHECK(t.link.bytes_per_second == 40e9);                                   // 4 GPUs' share of the network
  fsdp::place_on_cluster(t, c, {.replicas = 8, .shards = 1, .tensor = 1});  // no_shard: the all-reduce over all 8
  CHECK(t.link.bytes_per_second == 40e9);
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
          fsdp::place_on_cluster(t, c, {.replicas = 2, .shards = 3});
        }).find("groups of 3 ranks 1 apart do not tile nodes of 4 GPUs") != std::string::npos);
}

namespace {
/// hybrid_shard<2> over 4 ranks on nodes of 2 GPUs, one unit: a 1024-element fp32 unit sharded over 2 ranks (a gather
/// or reduce-scatter moves 4096 x 1/2 = 2048 bytes, the replicas' all-reduce of the 2048-byte shard 2048 x 2 x 1/2 =
/// 2048 bytes), released after its forward. NVLink 2.048 MB/s (1 ms), the network 1.024 MB/s a GPU (2 ms) with 0.5
/// ms a collective and 0.25 ms a ring step. Forward 2 ms, backward 3 ms.
struct one_unit_on_nodes {
  fsdp::planned_units u = units_of({"u"}, 2);
  fsdp::memory_plan_inputs in;
  fsdp::comm::cluster_links c{
      .gpus_per_node = 2,
      .intra = {.bytes_per_second = 2.048e6},
      .inter = {.bytes_per_second = 1.024e6, .latency = nanoseconds(ms(0.5)), .step_latency = nanoseconds(ms(0.25))}};
  fsdp::time_model t = timing(1, 2, 3);
  one_unit_on_nodes() {
    fsdp::model_options release;
    release.reshard_after_forward["u"] = true;
    in.schedule =
        fsdp::detail::sched::build_config(fsdp::unit_index(u.names), fsdp::facts_of<fsdp::sharding::hybrid_shard<2>>(4),
                                          none, fsdp::precision_facts{}, release, {});
    in.costs = fsdp::plan::make_cost_facts(fsdp::precision_facts{}, true, {}, {});
    place();
  }
  void place() { fsdp::place_on_cluster(t, c, fsdp::mesh_of<fsdp::sharding::hybrid_shard<2>>(4)); }
};
}  // namespace

TEST_CASE("nodes: hybrid_shard<2> on 2 nodes of 2 GPUs against 4 nodes of 1 (one unit, worked by hand)") {
  one_unit_on_nodes n;
  auto& [u, in, c, t] = n;
  in.commit_step = false;  // the step's commit: the next case
  // the shard group inside a node, the replicas across: gather 0-1, forward 1-3, gather 3-4, backward 4-7,
  // reduce-scatter 7-8, the replicas' all-reduce 8-11 (0.5 + 2 steps x 0.25 + 2 ms)
  const auto two_nodes = predict(u, in, t);
  CHECK(two_nodes.step_ns == ms(11));
  CHECK(two_nodes.critical_path_text() ==
        "  all_gather all_gather u forward                   0.000 -      1.000 ms\n"
        "  compute    compute u forward                      1.000 -      3.000 ms\n"
        "  all_gather all_gather u backward                  3.000 -      4.000 ms\n"
        "  compute    compute u backward                     4.000 -      7.000 ms\n"
        "  reduce     reduction u backward                   7.000 -      8.000 ms\n"
        "  reduce     replica all_reduce u backward          8.000 -     11.000 ms\n");
  // every GPU on a node of its own: each shard-group collective crosses the network too (0.5 + 0.25 + 2 ms)
  c.gpus_per_node = 1;
  n.place();
  const auto four_nodes = predict(u, in, t);
  CHECK(four_nodes.step_ns == ms(2.75 + 2 + 2.75 + 3 + 2.75 + 3));
}

TEST_CASE(
    "the step's commit: on the compute stream once every reduction is done and before the update, over the whole "
    "world on its link, all of it exposed (the same unit and nodes as above, worked by hand)") {
  one_unit_on_nodes n;
  auto& [u, in, c, t] = n;
  // the world of 4 ranks on 2 nodes: 2 GPUs' share of the network (2.048 MB/s), 0.5 ms a collective, 0.25 ms a ring
  // step; the commit's all-reduce of one fp32 element (4 bytes: the gradient's dtype) takes 2 x 3 steps: 0.5 + 6 x 0.25
  // ms + 4 x 2 x 3/4 B / 2.048 MB/s (2929 ns, truncated), from the replicas' all-reduce's end at 11 ms
  const auto with = predict(u, in, t);
  CHECK(with.commit_ns == 2002929);
  CHECK(with.step_ns == ms(11) + 2002929);
  CHECK(with.critical_path_text() ==
        "  all_gather all_gather u forward                   0.000 -      1.000 ms\n"
        "  compute    compute u forward                      1.000 -      3.000 ms\n"
        "  all_gather all_gather u backward                  3.000 -      4.000 ms\n"
        "  compute    compute u backward                     4.000 -      7.000 ms\n"
        "  reduce     reduction u backward                   7.000 -      8.000 ms\n"
        "  reduce     replica all_reduce u backward          8.000 -     11.000 ms\n"
        "  compute    commit all_reduce                     11.000 -     13.003 ms\n");
  CHECK(with.report().find("  the step's commit all_reduce 2.003 ms, all exposed (15.4% of the step)\n") !=
        std::string::npos);
  // an optimizer that inspects its gradients commits with its norms' all-reduce: none of its own
  in.norm_rows = 1;
  CHECK(predict(u, in, t).commit_ns == 0);
  in.norm_rows = 0;
  in.commit_step = false;
  const auto without = predict(u, in, t);
  CHECK(without.commit_ns == 0);
  CHECK(without.step_ns == ms(11));
}
