// The step program as text (fsdp/plan/listing.hpp): one unit's step, per stream, in issue order, and what the order
// promises: each unit's shard is ready right after its own update.
//
// The cases: full_shard at 4 ranks in fp32, units "a" and "b" of one 32 x 32 parameter each, both released after
// their forward (a, the first unit of the forward pass, is kept into its backward by default; named here), no
// prefetch, an optimizer without state unless said.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include "tests/support/support.hpp"

namespace {
fsdp::planned_units two_units() {
  fsdp::ModelSpec spec;
  spec.add("a.w", {32, 32}).add("b.w", {32, 32});
  return fsdp::plan_units("units", spec, fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
                            return p.name.substr(0, p.name.find('.'));
                          }},
                          4);
}

fsdp::memory_plan_inputs inputs(const fsdp::planned_units& u, fsdp::offload_facts off = {}, int states = 0,
                                fsdp::precision_facts precision = {}) {
  constexpr fsdp::prefetch_facts none{0, 0, false, false};
  fsdp::model_options opt;
  opt.reshard_after_forward["a"] = true;
  fsdp::memory_plan_inputs in;
  in.schedule = fsdp::detail::sched::build_config(
      fsdp::unit_index(u.names), fsdp::facts_of<fsdp::sharding::full_shard>(4), none, precision, opt, off);
  in.costs = fsdp::plan::make_cost_facts(precision, true, opt.accumulation, off);
  in.optimizer_states = states;
  return in;
}

/// The issue number of unit u's first action on `lane` whose text starts with `what` (0: none).
std::size_t seq_of(const fsdp::step_listing& l, fsdp::plan::lane lane, std::size_t u, std::string_view what) {
  for (const auto& a : l.actions)
    if (a.lane == lane && a.unit == u && a.what.starts_with(what)) return a.seq;
  return 0;
}
}  // namespace

TEST_CASE("one unit's step, per stream, in issue order: the second step of two, every slot made") {
  const auto u = two_units();
  const fsdp::step_listing l = fsdp::list_step(u.names, u.layouts, inputs(u), 4);
  CHECK(l.infeasible.empty());
  // Forward: a, then b; backward: b, then a (b's reduction, numbers 36 to 42, comes between). One gather slot
  // serves both units; of the two gradient slots, a takes slot 1: the ring reuses the slot given back longest ago
  // (a's own, in the first step), not slot 0, which b's reduction gave back just before.
  CHECK(l.str("a") ==
        "unit 'a': one step, per stream, in issue order\n"
        "host\n"
        "  1. gather_issued (forward)\n"
        "  8. release (forward)\n"
        "  43. gather_issued (backward)\n"
        "  52. release (backward)\n"
        "  55. reduce_issued (backward)\n"
        "compute\n"
        "  6. wait gathered\n"
        "  7. compute (forward)\n"
        "  9. views of params end\n"
        "  10. give gathered slot 0\n"
        "  48. wait gathered\n"
        "  49. take grad slot 1\n"
        "  50. zero grad (backward)\n"
        "  51. compute (backward)\n"
        "  53. views of params end\n"
        "  54. give gathered slot 0\n"
        "  56. views of grad end\n"
        "  57. record grad_ready\n"
        "  65. wait reduced\n"
        "  68. optimizer\n"
        "  69. record shard_ready\n"
        "all_gather\n"
        "  2. wait shard_ready\n"
        "  3. take gathered slot 0\n"
        "  4. all_gather (forward)\n"
        "  5. record gathered\n"
        "  44. wait shard_ready\n"
        "  45. take gathered slot 0\n"
        "  46. all_gather (backward)\n"
        "  47. record gathered\n"
        "reduce\n"
        "  58. wait grad_ready\n"
        "  59. take reduce_output slot 0\n"
        "  60. reduction (backward)\n"
        "  61. add into shard (backward)\n"
        "  62. give reduce_output slot 0\n"
        "  63. give grad slot 1\n"
        "  64. record reduced\n");
}

TEST_CASE("fp32 views over bf16 gathers: the gather stream gathers into the wire slot, widens, and gives it back") {
  const auto u = two_units();
  const fsdp::step_listing l = fsdp::list_step(
      u.names, u.layouts, inputs(u, {}, 0, fsdp::facts_of_precision<fsdp::precision::wire<fsdp::bfloat16>>()), 4);
  CHECK(l.infeasible.empty());
  const std::string a = l.str("a");
  const std::size_t from = a.find("all_gather\n"), to = a.find("reduce\n");
  REQUIRE(to != std::string::npos);
  CHECK(a.substr(from, to - from) ==
        "all_gather\n"
        "  2. wait shard_ready\n"
        "  3. take gathered slot 0\n"
        "  4. take wire slot 0\n"
        "  5. all_gather (forward)\n"
        "  6. widen (forward)\n"
        "  7. give wire slot 0\n"
        "  8. record gathered\n"
        "  53. wait shard_ready\n"
        "  54. take gathered slot 0\n"
        "  55. take wire slot 0\n"
        "  56. all_gather (backward)\n"
        "  57. widen (backward)\n"
        "  58. give wire slot 0\n"
        "  59. record gathered\n");
}

TEST_CASE("every unit's actions, each named; the first step's are not listed") {
  const auto u = two_units();
  const fsdp::step_listing l = fsdp::list_step(u.names, u.layouts, inputs(u), 4);
  const std::string all = l.str();
  CHECK(all.starts_with("every unit: one step, per stream, in issue order\nhost\n  1. gather_issued (forward)  [a]\n"));
  CHECK(all.find("  11. gather_issued (forward)  [b]\n") != std::string::npos);
  CHECK(l.actions.front().seq == 1);
  CHECK(l.actions.back().seq == l.actions.size());
  std::size_t a = 0, b = 0;
  std::vector<std::string> step;  // the step's own actions: its commit (the stamps mark times on the compute stream)
  for (const auto& x : l.actions) {
    if (x.unit == fsdp::plan::detail::step_program::npos) {
      step.push_back(x.what);
      continue;
    }
    CHECK(x.unit < 2);
    ++(x.unit == 0 ? a : b);
  }
  CHECK(a == 35);  // the lines of unit a above: host 5, compute 15, all_gather 8, reduce 7
  CHECK(b == 35);
  CHECK(step == std::vector<std::string>{"commit all_reduce"});
}

TEST_CASE(
    "the step's commit: on the compute stream after it waits for every unit's reduction and before the first update; "
    "none when model_options::commit_step is off, or when the optimizer inspects its gradients (its norms' "
    "all-reduce commits)") {
  const auto u = two_units();
  fsdp::memory_plan_inputs in = inputs(u);
  const auto compute_of_step = [&] {  // the compute stream's lines from its first "wait reduced" on
    const std::string s = fsdp::list_step(u.names, u.layouts, in, 4).str();
    const std::string c = s.substr(s.find("compute\n"), s.find("all_gather\n") - s.find("compute\n"));
    return c.substr(c.rfind('\n', c.find("wait reduced")) + 1);
  };
  CHECK(compute_of_step() ==
        "  65. wait reduced  [a]\n"
        "  66. wait reduced  [b]\n"
        "  67. commit all_reduce\n"
        "  68. optimizer  [a]\n"
        "  69. record shard_ready  [a]\n"
        "  70. optimizer  [b]\n"
        "  71. record shard_ready  [b]\n");
  in.commit_step = false;
  CHECK(compute_of_step().find("commit") == std::string::npos);
  in.commit_step = true;
  in.norm_rows = 1;
  CHECK(compute_of_step().find("commit") == std::string::npos);
}

TEST_CASE("each unit's shard is ready right after its own update, not after the whole optimizer step") {
  const auto u = two_units();
  const fsdp::offload_facts none{}, params{.params = true}, state{.optimizer_state = true},
      all{.params = true, .grads = true, .optimizer_state = true};
  using lane = fsdp::plan::lane;
  struct where {
    const char* name;
    fsdp::offload_facts off;
    lane update_lane;
    const char* update;
    lane ready_lane;
  } cases[] = {
      {"on the device", none, lane::compute, "optimizer", lane::compute},
      {"staged: the master back from the device", params, lane::compute, "optimizer", lane::download},
      {"staged: the state alone (the master stays on the device)", state, lane::compute, "optimizer", lane::compute},
      {"on the host (offload::all)", all, lane::host_work, "host optimizer", lane::host_work},
  };
  for (const where& w : cases) {
    const std::string name = w.name;
    CAPTURE(name);
    const fsdp::step_listing l = fsdp::list_step(u.names, u.layouts, inputs(u, w.off, 2), 4);
    REQUIRE(l.infeasible.empty());
    const std::size_t update_a = seq_of(l, w.update_lane, 0, w.update),
                      update_b = seq_of(l, w.update_lane, 1, w.update);
    const std::size_t ready_a = seq_of(l, w.ready_lane, 0, "record shard_ready");
    const std::size_t ready_b = seq_of(l, w.ready_lane, 1, "record shard_ready");
    REQUIRE(update_a > 0);
    REQUIRE(update_b > 0);
    CHECK(ready_a > update_a);
    CHECK(ready_a < update_b);  // a's gather in the next step need not wait for b's update
    CHECK(ready_b > update_b);
  }
}

TEST_CASE("hybrid sharding's all-reduce across replicas: listed where the world has replicas, or marked when the "
          "world is not known") {
  const auto u = two_units();
  const auto reduce_of_a = [&](int world) {
    const fsdp::step_listing l = fsdp::list_step(u.names, u.layouts, inputs(u), world);
    const std::string s = l.str("a");
    return s.substr(s.find("reduce\n"));
  };
  CHECK(reduce_of_a(8) ==
        "reduce\n"
        "  59. wait grad_ready\n"
        "  60. take reduce_output slot 0\n"
        "  61. reduction (backward)\n"
        "  62. replica all_reduce (backward)\n"
        "  63. add into shard (backward)\n"
        "  64. give reduce_output slot 0\n"
        "  65. give grad slot 1\n"
        "  66. record reduced\n");
  CHECK(reduce_of_a(0).find("  62. replica all_reduce (backward), hybrid sharding only\n") != std::string::npos);
  CHECK(reduce_of_a(4).find("replica") == std::string::npos);
}

TEST_CASE("a name that is not a unit, and a world the shard group does not divide, are refused by name") {
  const auto u = two_units();
  const fsdp::step_listing l = fsdp::list_step(u.names, u.layouts, inputs(u), 4);
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { (void)l.str("c"); }) ==
        "fsdp: step_listing: 'c' is not a unit (units: a, b)");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { (void)fsdp::list_step(u.names, u.layouts, inputs(u), 6); }) ==
        "fsdp: step listing: a world of 6 ranks, which the shard group of 4 ranks (the layouts') does not divide; "
        "give the data-parallel world size (0: not known)");
}

TEST_CASE("a Model lists its own step: its units, its prefetch, no replica all-reduce without hybrid sharding") {
  const fsdp::ModelSpec spec = fsdp_test::three_units();
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>;
  fsdp_test::run_ranks(2, [&](fsdp::comm::local_communicator& comm) {
    fsdp::Model<P> m(comm, spec, fsdp::wrap::by_prefix{"l"});
    fsdp::optim::adamw opt(m, {});
    const fsdp::step_listing l = fsdp::list_step(m, opt);
    CHECK(l.units == std::vector<std::string>{"l0", "l1", "l2"});
    CHECK(l.infeasible.empty());
    // prefetch::next: l1's forward gather is issued ahead, while l0 computes
    CHECK(l.str("l1").find("gather_issued (forward, ahead)") != std::string::npos);
    CHECK(l.str("l1").find("replica") == std::string::npos);
    CHECK(l.str() == fsdp::list_step(m, 2).str());  // AdamW's two states: the optimizer's overload asks for them
  });
}
