// The GPT example with tensor parallelism (model_options::tensor_parallel, examples/04_gpt_host --tp): Megatron's
// split of each block over a tensor group (the heads and the MLP's hidden dimension), the library sharding each
// rank's slices over the data-parallel ranks. Specified against the same trainer without tensor parallelism: the
// same losses and gradient norms, the same trained global model, the planned memory, the collectives it adds.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/gpt/gpt_cases.hpp"
#include "tests/support/support.hpp"

namespace {

using fsdp::bfloat16;
using fsdp::collective;
using gpt_tests::small;

/// Every rank's result on `world` thread ranks in tensor groups of `tensor`.
template <class Policy>
std::vector<gpt::result> train(int world, int tensor, gpt::config c) {
  c.options.tensor_parallel = tensor;
  return gpt_tests::train<Policy>(world, c);
}

/// The trained global model: tensor ranks 0 .. T-1 of the first data-parallel rank, their slices put together.
std::map<std::string, std::vector<float>> global_params(const std::vector<gpt::result>& rs, int tensor,
                                                        const gpt::config& c) {
  std::vector<std::map<std::string, std::vector<float>>> local;
  for (int t = 0; t < tensor; ++t) local.push_back(rs[static_cast<std::size_t>(t)].params);
  return fsdp_test::assemble(local, gpt::make_spec(c.model, c.seed));
}

double relative(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-6); }

/// Trains at every tensor degree in `degrees` times every data-parallel size in `dps` and compares each run with
/// the run of Ref (a policy of the same precision) on one rank: losses and gradient norms within `tolerance`
/// relative, every rank's memory as planned. (Not the trained parameters: AdamW's first steps move every element
/// by about the learning rate whatever its gradient's size, so a gradient near zero, rounded otherwise, moves its
/// element the other way. The initial model is compared bit for bit below, the gradients through their norms.)
template <class Policy, class Ref = Policy>
void check_parity(gpt::config c, std::initializer_list<int> degrees, std::initializer_list<int> dps, double tolerance) {
  const std::vector<gpt::result> ref = train<Ref>(1, 1, c);
  for (int tensor : degrees)
    for (int dp : dps) {
      CAPTURE(tensor);
      CAPTURE(dp);
      const std::vector<gpt::result> rs = train<Policy>(tensor * dp, tensor, c);
      for (const gpt::result& r : rs) CHECK(r.memory.peak == r.planned);
      const gpt::result& r0 = rs[0];
      REQUIRE(r0.losses.size() == ref[0].losses.size());
      double loss = 0, norm = 0;
      for (std::size_t s = 0; s < r0.losses.size(); ++s) {
        loss = std::max(loss, relative(r0.losses[s], ref[0].losses[s]));
        norm = std::max(norm, relative(r0.norms[s], ref[0].norms[s]));
      }
      CHECK(loss <= tolerance);
      CHECK(norm <= tolerance);
      for (const gpt::result& r : rs) CHECK(r.losses == r0.losses);  // the global loss, the same on every rank
    }
}

gpt::config twenty_steps() {
  gpt::config c = small();  // 4 heads of width 8, 12 sequences a step
  c.steps = 20;
  c.opt.total = 20;
  return c;
}

}  // namespace

TEST_CASE(
    "each tensor rank starts from its slices of the one-rank model, bit for bit: heads of q, k and v, rows "
    "of the MLP, columns of the projections") {
  gpt::config c = small();
  c.steps = 0;
  const auto want = gpt_tests::train<gpt_tests::fp32_policy>(1, c)[0].params;
  for (int tensor : {2, 4}) {
    CAPTURE(tensor);
    const std::vector<gpt::result> rs = train<gpt_tests::fp32_policy>(2 * tensor, tensor, c);
    CHECK(rs[0].params.at("h.0.attn.qkv.w").size() == want.at("h.0.attn.qkv.w").size() / tensor);
    CHECK(rs[0].params.at("h.0.attn.proj.b").size() == want.at("h.0.attn.proj.b").size());
    CHECK(global_params(rs, tensor, c) == want);
  }
}

TEST_CASE(
    "fp32: tensor groups of 1, 2 and 4 times 1, 2 and 3 data-parallel ranks train the same model as one "
    "rank, within 1e-5 over 20 steps") {
  check_parity<gpt_tests::fp32_policy>(twenty_steps(), {1, 2, 4}, {1, 2, 3}, 1e-5);
}

TEST_CASE("bf16: the same meshes within 5e-3") {
  check_parity<gpt_tests::bf16_policy>(twenty_steps(), {1, 2, 4}, {1, 2, 3}, 5e-3);
}

TEST_CASE("every strategy composes with the tensor groups: ZeRO-2, no sharding, and HSDP over 2 x 2 x 2 ranks") {
  using namespace fsdp::sharding;
  using fp32 = fsdp::precision::full;
  check_parity<fsdp::policy<shard_grad_op, fsdp::prefetch::next, fp32>>(twenty_steps(), {2}, {3}, 1e-5);
  check_parity<fsdp::policy<no_shard, fsdp::prefetch::next, fp32>>(twenty_steps(), {2}, {2}, 1e-5);
  // hybrid_shard<2>: shard groups of 2 data-parallel ranks, 2 replicas, each rank in a tensor group of 2
  check_parity<fsdp::policy<hybrid_shard<2>, fsdp::prefetch::next, fp32>, gpt_tests::fp32_policy>(twenty_steps(), {2},
                                                                                                  {4}, 1e-5);
}

TEST_CASE("packed rows: the tensor group's ranks read the same rows and its loss is counted once") {
  gpt::config c = twenty_steps();
  c.packing.on = true;
  check_parity<gpt_tests::fp32_policy>(c, {2, 4}, {1, 2}, 1e-5);
}

TEST_CASE(
    "the collectives: the library's are those of the data-parallel ranks alone; the trainer adds 4 sums a "
    "block and step on the tensor group, 6 with activation checkpointing") {
  gpt::config c = small();
  c.steps = 3;
  const int L = c.model.layers;
  const auto one = train<gpt_tests::bf16_policy>(2, 1, c);
  for (bool ckpt : {false, true}) {
    CAPTURE(ckpt);
    c.checkpoint_activations = ckpt;
    const auto tp = train<gpt_tests::bf16_policy>(4, 2, c);
    for (const gpt::result& r : tp) {
      // per step: each block gathered twice and the root once, each unit reduced once, of the local slices
      CHECK(r.shard_group[collective::all_gather] == std::uint64_t(c.steps * (2 * L + 1)));
      CHECK(r.shard_group[collective::reduce_scatter] == std::uint64_t(c.steps * (L + 1)));
      for (collective k : {collective::all_gather, collective::reduce_scatter})
        CHECK(r.shard_group.bytes[static_cast<std::size_t>(k)] < one[0].shard_group.bytes[static_cast<std::size_t>(k)]);
      // the activations of this data-parallel rank's 6 sequences of 16 tokens, 32 channels
      CHECK(r.tensor_group[collective::all_reduce] == std::uint64_t(c.steps * L * (ckpt ? 6 : 4)));
      CHECK(r.tensor_group.bytes[static_cast<std::size_t>(collective::all_reduce)] ==
            std::uint64_t(c.steps * L * (ckpt ? 6 : 4)) * (12 / 2) * 16 * 32 * sizeof(float));
    }
    CHECK(tp[0].losses == tp[1].losses);
  }
}

TEST_CASE("settings the tensor groups cannot take are refused with a sentence") {
  gpt::config c = small();
  c.model.heads = 2;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { train<gpt_tests::fp32_policy>(4, 4, c); }) ==
        "fsdp: gpt: 2 heads do not split over tensor groups of 4 ranks (each takes whole heads)");
  c = small();
  c.global_batch = 10;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { train<gpt_tests::fp32_policy>(6, 2, c); }) ==
        "fsdp: gpt: global batch 10 sequences do not split over 3 data-parallel ranks (6 ranks in tensor groups of "
        "2)");
}
