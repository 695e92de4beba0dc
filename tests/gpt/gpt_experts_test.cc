// The GPT example with a mixture of experts (gpt::shape::experts, examples/04_gpt_host --experts --top-k --ep): each
// block's MLP replaced by experts of its shape and a router choosing top_k of them a token, the experts a unit of
// their own, split over expert groups (model_options::expert_parallel) and sharded over the ranks holding the same
// experts, the tokens sent to their experts and back by the trainer's all_to_all_v on the model's expert group.
// Specified against the same trainer with every rank holding every expert, and without the load-balancing loss
// (which each rank computes over its own tokens) against one rank.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/gpt/gpt_cases.hpp"
#include "tests/support/support.hpp"

namespace {

using fsdp::collective;
using gpt_tests::small;

/// Every rank's result on `world` thread ranks in expert groups of `expert`.
template <class Policy>
std::vector<gpt::result> train(int world, int expert, gpt::config c) {
  c.options.expert_parallel = expert;
  return gpt_tests::train<Policy>(world, c);
}

double relative(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-6); }

/// 8 experts a block, 2 a token, 20 steps.
gpt::config with_experts() {
  gpt::config c = small();
  c.model.experts = 8;
  c.model.top_k = 2;
  c.steps = 20;
  c.opt.total = 20;
  return c;
}

/// Runs at (world, expert) against `ref`'s rank 0: losses and gradient norms within `tolerance`, every rank's
/// memory as planned, the global loss the same on every rank.
template <class Policy>
void check_against(const gpt::result& ref, int world, int expert, const gpt::config& c, double tolerance) {
  CAPTURE(world);
  CAPTURE(expert);
  const std::vector<gpt::result> rs = train<Policy>(world, expert, c);
  for (const gpt::result& r : rs) CHECK(r.memory.peak == r.planned);
  REQUIRE(rs[0].losses.size() == ref.losses.size());
  double loss = 0, norm = 0;
  for (std::size_t s = 0; s < ref.losses.size(); ++s) {
    loss = std::max(loss, relative(rs[0].losses[s], ref.losses[s]));
    norm = std::max(norm, relative(rs[0].norms[s], ref.norms[s]));
  }
  CHECK(loss <= tolerance);
  CHECK(norm <= tolerance);
  for (const gpt::result& r : rs) CHECK(r.losses == rs[0].losses);
}

}  // namespace

TEST_CASE(
    "experts split over expert groups of 2 and 4 at 4 ranks train as every rank holding every expert, within "
    "1e-5 over 20 steps") {
  const gpt::config c = with_experts();
  const gpt::result ref = train<gpt_tests::fp32_policy>(4, 1, c)[0];
  CHECK(ref.losses.back() < ref.losses.front() - 0.5f);  // it trains
  check_against<gpt_tests::fp32_policy>(ref, 4, 2, c, 1e-5);
  check_against<gpt_tests::fp32_policy>(ref, 4, 4, c, 1e-5);
  using namespace fsdp::sharding;
  using fp32 = fsdp::precision::full;
  check_against<fsdp::policy<shard_grad_op, fsdp::prefetch::next, fp32>>(ref, 4, 2, c, 1e-5);
  check_against<fsdp::policy<no_shard, fsdp::prefetch::next, fp32>>(ref, 4, 4, c, 1e-5);
  check_against<fsdp::policy<hybrid_shard<2>, fsdp::prefetch::next, fp32>>(ref, 4, 2, c, 1e-5);
}

TEST_CASE(
    "without the load-balancing loss, 2 and 4 ranks with their experts split train as one rank holding them "
    "all") {
  gpt::config c = with_experts();
  c.model.aux_weight = 0;  // each rank's balance is over its own tokens: with it, the ranks' sum is not one rank's
  const gpt::result one = train<gpt_tests::fp32_policy>(1, 1, c)[0];
  check_against<gpt_tests::fp32_policy>(one, 2, 2, c, 1e-5);
  check_against<gpt_tests::fp32_policy>(one, 4, 4, c, 1e-5);
  check_against<gpt_tests::fp32_policy>(one, 3, 1, c, 1e-5);
}

TEST_CASE(
    "04_gpt_host --experts 8 --top-k 2 --ep 2 --ranks 4: the loss falls; per step and block the trainer's "
    "counts and four exchanges on the expert group, each unit one reduction on its own group") {
  gpt::config c = with_experts();
  const int L = c.model.layers;
  const std::vector<gpt::result> rs = train<gpt_tests::bf16_policy>(4, 2, c);
  for (const gpt::result& r : rs) {
    CHECK(r.losses.back() < r.losses.front() - 0.5f);
    CHECK(r.memory.peak == r.planned);
    CHECK(r.expert_group[collective::all_to_all] == std::uint64_t(c.steps * L));
    CHECK(r.expert_group[collective::all_to_all_v] == std::uint64_t(c.steps * L * 4));
    // the shard group (the world here) reduces the root and the blocks' dense units: the experts reduce apart
    CHECK(r.shard_group[collective::reduce_scatter] == std::uint64_t(c.steps * (L + 1)));
  }
}

TEST_CASE("settings the experts cannot take are refused with a sentence") {
  gpt::config c = with_experts();
  c.options.tensor_parallel = 2;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { gpt_tests::train<gpt_tests::fp32_policy>(4, c); }) ==
        "fsdp: gpt: the examples' experts do not split over tensor groups (tensor_parallel 2): use expert_parallel "
        "instead");
  c = with_experts();
  c.checkpoint_activations = true;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { gpt_tests::train<gpt_tests::fp32_policy>(2, c); }) ==
        "fsdp: gpt: the experts run without activation checkpointing and sequence packing");
  c = with_experts();
  c.model.top_k = 9;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { gpt_tests::train<gpt_tests::fp32_policy>(1, c); }) ==
        "fsdp: gpt: top_k must be between 1 and the 8 experts, got 9");
}
