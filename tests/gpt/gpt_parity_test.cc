// The GPT example's losses at world 1, 2, 3 and 4 over 30 steps (examples/04_gpt_host): the same global batches
// give the same losses to within the rounding of the gradient sums, and training reaches most of the way from the
// entropy of the token frequencies to the data's floor. And a packed run resumed from a checkpoint that keeps the
// packer's state in its metadata continues as if it had never stopped.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fsdp/checkpoint/checkpoint.hpp>

#include "tests/gpt/gpt_cases.hpp"
#include "tests/support/support.hpp"

namespace {

/// Rank 0's losses at world 1, and at 2, 3 and 4 within `tolerance` (relative) of them, step by step.
template <class Policy>
std::vector<float> check_worlds(const gpt::config& c, float tolerance) {
  const auto one = gpt_tests::train<Policy>(1, c)[0].losses;
  for (int world : {2, 3, 4}) {
    const auto other = gpt_tests::train<Policy>(world, c)[0].losses;
    REQUIRE(other.size() == one.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      INFO("world " << world << ", step " << i << ": " << other[i] << " against " << one[i]);
      CHECK(std::abs(other[i] - one[i]) <= tolerance * one[i]);
    }
  }
  return one;
}

}  // namespace

TEST_CASE("losses at world 1, 2, 3 and 4 agree over 30 steps, and fall well below the entropy of the tokens") {
  const gpt::config c = gpt_tests::small();
  SUBCASE("fp32 compute: within 1e-6 relative (only the order of the gradient sums differs; measured 1.3e-7)") {
    check_worlds<gpt_tests::fp32_policy>(c, 1e-6f);
  }
  SUBCASE("bf16 compute, fp32 master and reduction: within 0.2% relative (bf16 gradients round otherwise; measured "
          "0.036%)") {
    const auto one = check_worlds<gpt_tests::bf16_policy>(c, 2e-3f);
    const auto h = gpt::data_entropies(c.data, c.model.vocab);
    CHECK(one.front() == doctest::Approx(h.frequencies).epsilon(0.05));
    CHECK(one.back() < h.floor + 0.25 * (h.frequencies - h.floor));  // three quarters of the way to the floor
  }
}

TEST_CASE("packed training resumed from a checkpoint that holds the packer's state equals the run without a stop") {
  gpt::config c = gpt_tests::small();
  c.global_batch = 4;  // rows of 16 positions a step
  c.packing.on = true;
  c.packing.depth = 3;  // the background packer runs ahead of the save
  c.steps = 8;
  const int world = 2, first = 5;
  const fsdp_test::scratch_dir dir("gpt_packed_resume");
  const std::string path = dir / "step-5";
  std::vector<gpt::result> straight(world), resumed(world);
  fsdp::comm::run_local(world, [&](fsdp::comm::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    straight[r] = gpt::train<gpt_tests::fp32_policy>(comm, c);
    {
      auto model = gpt::make_model<gpt_tests::fp32_policy>(comm, c);
      auto opt = gpt::make_optimizer(model, c);
      auto tr = gpt::make_host_trainer{}(model, c.model, c.global_batch / world);
      gpt::result part;
      gpt::run_steps(model, opt, tr, c, 0, first, part);
      CHECK(part.data_state.step == std::uint64_t{first});
      fsdp::checkpoint::save(model, opt, path,
                             {.metadata = {{"data", fsdp::data::to_text(gpt::packing_options(c), part.data_state)}}});
    }
    auto model = gpt::make_model<gpt_tests::fp32_policy>(comm, c);  // fresh: everything from the checkpoint
    auto opt = gpt::make_optimizer(model, c);
    const fsdp::checkpoint::manifest man = fsdp::checkpoint::load(model, opt, path);
    gpt::config more = c;
    more.packing.resume = fsdp::data::from_text(man.metadata.at("data"), gpt::packing_options(c));
    auto tr = gpt::make_host_trainer{}(model, c.model, c.global_batch / world);
    gpt::run_steps(model, opt, tr, more, first, c.steps - first, resumed[r]);
    resumed[r].params = fsdp::weights::gather_full_params(model);
  });
  for (std::size_t r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(resumed[r].losses == std::vector<float>(straight[r].losses.begin() + first, straight[r].losses.end()));
    CHECK(resumed[r].step_tokens ==
          std::vector<std::int64_t>(straight[r].step_tokens.begin() + first, straight[r].step_tokens.end()));
    CHECK(resumed[r].data_state == straight[r].data_state);
    CHECK(resumed[r].params == straight[r].params);  // bit for bit
  }
  // A state that does not match the run's first step is refused.
  gpt::config wrong = c;
  wrong.packing.resume.step = 3;
  fsdp::comm::run_local(1, [&](fsdp::comm::local_communicator& comm) {
    auto model = gpt::make_model<gpt_tests::fp32_policy>(comm, wrong);
    auto opt = gpt::make_optimizer(model, wrong);
    auto tr = gpt::make_host_trainer{}(model, wrong.model, wrong.global_batch);
    gpt::result r;
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { gpt::run_steps(model, opt, tr, wrong, 5, 1, r); }) ==
          "fsdp: gpt: the packing state resumes at step 3 and the run starts at step 5");
  });
}
