// fsdp::can_implement: every refusal the Model constructor would make, as values, before any memory or
// communicator exists; the constructor throws the first of them and refuses nothing else (but ranks that disagree).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::five_units;
using fsdp_test::run_ranks;

namespace {
using full = fsdp::policy<fsdp::sharding::full_shard>;
using hybrid4 = fsdp::policy<fsdp::sharding::hybrid_shard<4>>;
const fsdp::wrap::by_prefix blocks{"h."};

std::vector<std::string> parts(const fsdp::implementability& r) {
  std::vector<std::string> out;
  for (const auto& x : r.refusals) out.push_back(x.part);
  return out;
}
}  // namespace

TEST_CASE("a model that can be built: no refusal, its blueprint and its memory plan") {
  const auto r = fsdp::can_implement<full>(five_units(), blocks, {}, 4, {.optimizer_states = 2});
  CHECK(bool(r));
  CHECK(r.text().empty());
  CHECK(r.blueprint.mesh == fsdp::device_mesh{1, 4});
  CHECK(r.blueprint.units.names() == std::vector<std::string>{"root", "h.0", "h.1", "h.2", "h.3"});
  REQUIRE(r.plan.has_value());
  // the plan is the model's own, with AdamW's two states
  run_ranks(4, [&](local_communicator& c) {
    fsdp::Model<full> m(c, five_units(), blocks);
    CHECK(fsdp::plan_memory(m, 2).peak == r.plan->peak);
    CHECK(m.size() == r.blueprint.layouts.size());
  });
}

TEST_CASE(
    "every refusal at once, in the constructor's order, each with its sentence; the constructor throws the first") {
  fsdp::ModelSpec spec = five_units();
  spec.add("h.4.w", {4}, {.compute_dtype = fsdp::dtype::bf16});  // the policy computes in f32
  fsdp::model_options opt;
  opt.reshard_after_forward["nope"] = false;
  opt.grad_slots = 0;
  opt.forward_order = {"h.0"};
  opt.division = {fsdp::grad_division::mode::pre_post, -2.0f};
  const auto r = fsdp::can_implement<full>(spec, blocks, opt, 4);
  CHECK(!r);
  CHECK(parts(r) == std::vector<std::string>{"precision", "options", "options", "options", "options", "options",
                                             "options", "options", "options"});
  CHECK(r.text() ==
        "parameter 'h.4.w' asks for compute dtype bf16 but the precision policy computes in f32\n"
        "model_options::forward_order leaves out unit 'root'\n"
        "model_options::forward_order leaves out unit 'h.1'\n"
        "model_options::forward_order leaves out unit 'h.2'\n"
        "model_options::forward_order leaves out unit 'h.3'\n"
        "model_options::forward_order leaves out unit 'h.4'\n"
        "model_options::reshard_after_forward names 'nope', which is not a unit (units: root, h.0, h.1, h.2, h.3, "
        "h.4)\n"
        "model_options::grad_slots must be >= 1, got 0\n"
        "model_options::division.pre_factor must be > 0 (or 0 to pick it), got -2\n");
  CHECK(!r.plan.has_value());
  run_ranks(4, [&](local_communicator& c) {
    CHECK(error_of<fsdp::usage_error>([&] { fsdp::Model<full> m(c, spec, blocks, fsdp::init::normal{}, opt); }) ==
          "fsdp: " + r.refusals.front().sentence);
  });
}

TEST_CASE("the strategy against the world and against a mesh; a split the communicator cannot make") {
  auto r = fsdp::can_implement<hybrid4>(five_units(), blocks, {}, 6);
  CHECK(r.refusals == std::vector<fsdp::refusal>{
                          {"strategy", "sharding strategy hybrid_shard gives a shard group of 4 ranks, which does not "
                                       "divide the world of 6"}});
  CHECK(!r.plan.has_value());
  r = fsdp::can_implement<hybrid4>(five_units(), blocks, {}, fsdp::device_mesh{4, 2});
  CHECK(r.refusals ==
        std::vector<fsdp::refusal>{{"strategy",
                                    "sharding strategy hybrid_shard over 8 ranks with model_options::tensor_parallel "
                                    "= 1 makes a mesh of 2 x 4 x 1 x 1 (replicas x shards x experts x tensor), not "
                                    "the 4 x 2 x 1 x 1 asked for"}});
  CHECK(bool(fsdp::can_implement<hybrid4>(five_units(), blocks, {}, fsdp::device_mesh{2, 4})));
  CHECK(parts(fsdp::can_implement<full>(five_units(), blocks, {}, 0)) == std::vector<std::string>{"strategy"});
}

TEST_CASE("the wrapping and the layout, every problem of them") {
  fsdp::ModelSpec spec;
  spec.add("a.w", {4}).add("b.w", {4}).tie("c.w", "a.w");
  const fsdp::wrap::by_function split{
      [](const fsdp::ParamSpec& p) { return p.name == "c.w" ? std::string("c") : p.name.substr(0, 1); }};
  fsdp::model_options opt;
  opt.layout.align = 0;
  const auto r = fsdp::can_implement<full>(spec, split, opt, 2);
  CHECK(r.text() ==
        "tied parameters 'c.w' and 'a.w' landed in different units ('c' and 'a'): tied parameters share storage and "
        "must be in one unit; change the wrapping policy\n"
        "layout alignment must be positive, got 0\n");
  CHECK(parts(fsdp::can_implement<full>(fsdp::ModelSpec{}, blocks, {}, 2)) == std::vector<std::string>{"wrapping"});
}

TEST_CASE("slots against the plan, and memory budgets, with the planned figures") {
  fsdp::model_options opt;  // shard_grad_op keeps every unit gathered from its forward: three slots are not five
  opt.gather_slots = 3;
  using grad_op = fsdp::policy<fsdp::sharding::shard_grad_op>;
  const auto tight = fsdp::can_implement<grad_op>(five_units(), blocks, opt, 2);
  CHECK(tight.refusals ==
        std::vector<fsdp::refusal>{{"slots",
                                    "model_options::gather_slots = 3 is too few for this policy: gather slots "
                                    "exhausted: unit 'h.2' (index 3) must be gathered for its forward but all 3 "
                                    "slots are held by 'root', 'h.0', 'h.1'; raise model_options::gather_slots or "
                                    "let those units reshard after forward (model_options::reshard_after_forward)"}});
  REQUIRE(tight.plan.has_value());
  CHECK(!tight.plan->feasible());
  run_ranks(2, [&](local_communicator& c) {
    CHECK(error_of<fsdp::usage_error>([&] {
            fsdp::Model<grad_op> m(c, five_units(), blocks, fsdp::init::normal{}, opt);
          }) == "fsdp: " + tight.refusals[0].sentence);
  });
  const auto fits = fsdp::can_implement<full>(five_units(), blocks, {}, 2, {.optimizer_states = 2});
  REQUIRE(fits.plan.has_value());
  const std::int64_t peak = fits.plan->peak.total;
  CHECK(bool(fsdp::can_implement<full>(five_units(), blocks, {}, 2, {.optimizer_states = 2, .device_budget = peak})));
  const auto over =
      fsdp::can_implement<full>(five_units(), blocks, {}, 2, {.optimizer_states = 2, .device_budget = peak - 1});
  CHECK(over.refusals == std::vector<fsdp::refusal>{
                             {"budget", "the planned device peak of " + std::to_string(peak) +
                                            " bytes per rank passes the budget of " + std::to_string(peak - 1) +
                                            " bytes"}});
}
