// examples/04_gpt_host is built in separate-compilation mode (docs/build.md, "Separate compilation": the library's
// and the checkpoints' non-template code compiled once, in //:fsdp_separate and //:checkpoint_separate). This test
// runs that program as its users do and trains the same configuration in-process, header-only: the exported
// initial weights (safetensors, written by the checkpoint code) and the losses, learning rates and gradient norms
// of every step must be the same bytes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <fsdp/checkpoint/safetensors.hpp>

#include "examples/04_gpt_host/gpt_host.hpp"
#include "tests/support/programs.hpp"

namespace {

using fsdp_tests::execute;
using fsdp_tests::file_bytes;
using fsdp_tests::scratch;

const std::string example = fsdp_tests::program("FSDP_GPT_EXAMPLE", "examples/04_gpt_host/04_gpt_host");

}  // namespace

TEST_CASE("the example built in separate mode exports and trains as the same code built header-only, byte for byte") {
  using policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full>;
  for (const int ranks : {1, 2}) {
    CAPTURE(ranks);
    const std::string r = std::to_string(ranks);
    const fsdp_tests::run ran =
        execute(example + " --ranks " + r + " --steps 3 --layers 1 --precision fp32 --strategy full_shard" +
                " --export-init " + scratch("separate" + r + ".safetensors") + " --losses " +
                scratch("separate" + r + ".losses"));
    REQUIRE_MESSAGE(ran.status == 0, ran.out);

    // main.cc's configuration for those flags
    gpt::config cfg;
    cfg.global_batch = 16;
    cfg.steps = 3;
    cfg.model.layers = 1;
    cfg.opt.total = cfg.steps;
    std::vector<gpt::result> results(static_cast<std::size_t>(ranks));
    const std::string exported = scratch("header_only" + r + ".safetensors");
    fsdp::comm::run_local(ranks, [&](fsdp::comm::local_communicator& comm) {
      auto before = [&](auto& model) { fsdp::safetensors::save(model, exported, {.overwrite = true}); };
      results[static_cast<std::size_t>(comm.rank())] = gpt::train<policy>(comm, cfg, before);
    });
    std::string losses;
    const gpt::result& r0 = results[0];
    REQUIRE(r0.losses.size() == 3);
    for (std::size_t i = 0; i < r0.losses.size(); ++i) {
      char line[128];
      std::snprintf(line, sizeof line, "%zu %.9g %.9g %.9g\n", i, r0.losses[i], r0.lrs[i], r0.norms[i]);
      losses += line;
    }
    CHECK(file_bytes(scratch("separate" + r + ".losses")) == losses);
    const std::string a = file_bytes(scratch("separate" + r + ".safetensors")), b = file_bytes(exported);
    CHECK(a.size() > 56256 * 4);  // every parameter in fp32, and the header
    CHECK(a == b);
  }
}

TEST_CASE(
    "--lose-rank: rank 3 fails after step 1; the survivors name it, its replica partner leaves, and the other "
    "replica group trains on to the last step from the state in memory") {
  const fsdp_tests::run ran = execute(example +
                                      " --ranks 4 --strategy hybrid_shard --lose-rank 3 --at-step 2 --steps 4 "
                                      "--layers 1 --precision fp32");
  REQUIRE_MESSAGE(ran.status == 0, ran.out);
  CHECK(fsdp_tests::lines_starting(ran.out, "step ").size() == 4);  // steps 0 .. 3, through the loss
  const auto saw = fsdp_tests::lines_starting(ran.out, "rank ");
  REQUIRE(saw.size() == 3);
  CHECK(saw[0].find("cannot complete: rank(s) 3 returned without issuing it; continues as rank 0 of 2") !=
        std::string::npos);
  CHECK(saw[1].find("; continues as rank 1 of 2") != std::string::npos);
  CHECK(saw[2].find("; leaves with its replica group") != std::string::npos);
  CHECK(ran.out.find("reshard 2 x 2 -> 1 x 2, 3 fp32 buffer(s) a unit") != std::string::npos);
  CHECK(ran.out.find("  3        lost ") != std::string::npos);
}

TEST_CASE(
    "--rejoin-at: replacements for the replica group that left join before step 3, receive their shards and the "
    "step count from the survivors, and all four ranks train to the last step") {
  const fsdp_tests::run ran = execute(example +
                                      " --ranks 4 --strategy hybrid_shard --lose-rank 3 --at-step 1 --rejoin-at 3 "
                                      "--steps 4 --layers 1 --precision fp32");
  REQUIRE_MESSAGE(ran.status == 0, ran.out);
  CHECK(fsdp_tests::lines_starting(ran.out, "step ").size() == 4);
  const auto said = fsdp_tests::lines_starting(ran.out, "rank ");
  REQUIRE(said.size() == 5);  // three survivors, then the two replacements
  CHECK(said[3] == "rank 2 joined: received its shards from the survivors, and step count 3");
  CHECK(said[4] == "rank 3 joined: received its shards from the survivors, and step count 3");
  CHECK(ran.out.find("ranks 0-1 invited 2 replacement(s) as ranks 2-3 of 2 x 2 before step 3\n") != std::string::npos);
  CHECK(ran.out.find("reshard 1 x 2 -> 2 x 2, 3 fp32 buffer(s) a unit") != std::string::npos);
  CHECK(ran.out.find("  joins    3 ") != std::string::npos);
}

namespace {
/// The losses a --losses file holds, by step.
std::vector<double> losses_in(const std::string& path) {
  std::vector<double> out;
  std::string text = file_bytes(path), line;
  for (std::size_t at = 0, end; at < text.size(); at = end + 1) {
    end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    line = text.substr(at, end - at);
    if (line.empty()) continue;
    CHECK(std::stoul(line) == out.size());  // one line per step, in order
    out.push_back(std::stod(line.substr(line.find(' ') + 1)));
  }
  return out;
}
}  // namespace

TEST_CASE(
    "--fail-at: rank 1 fails during step 2 (before its forward, before its backward, inside its last replica "
    "all-reduce, before its optimizer step); the survivors hold step 2 whole, continue from it as 1 x 2, and end "
    "at the loss of the run without a failure; --losses has every step") {
  const std::string flags = " --ranks 4 --strategy hybrid_shard --steps 4 --layers 1 --precision fp32";
  const fsdp_tests::run plain = execute(example + flags + " --losses " + scratch("plain.losses"));
  REQUIRE_MESSAGE(plain.status == 0, plain.out);  // hybrid_shard as a strategy of its own
  const std::vector<double> reference = losses_in(scratch("plain.losses"));
  REQUIRE(reference.size() == 4);
  for (const std::string phase : {"forward", "backward", "reduction", "optimizer"}) {
    CAPTURE(phase);
    const std::string file = scratch("fail-" + phase + ".losses");
    const fsdp_tests::run ran =
        execute(example + flags + " --lose-rank 1 --at-step 2 --fail-at " + phase + " --losses " + file);
    REQUIRE_MESSAGE(ran.status == 0, ran.out);
    CHECK(fsdp_tests::lines_starting(ran.out, "step ").size() == 4);  // steps 0 and 1, then 2 and 3 again
    const auto saw = fsdp_tests::lines_starting(ran.out, "rank ");
    REQUIRE(saw.size() == 4);  // the three survivors, then the failed rank's own error
    CHECK_MESSAGE(saw[0].find("aborted: rank 1 failed: rank 1 ") != std::string::npos, ran.out);
    CHECK(saw[0].find("; leaves with its replica group") != std::string::npos);
    CHECK(saw[1].find("; continues as rank 0 of 2") != std::string::npos);
    CHECK(saw[2].find("; continues as rank 1 of 2") != std::string::npos);
    // the replica group's all-reduces: one a unit (root, h.0) a step, so step 2's last is #5
    CHECK(saw[3] == (phase == "reduction" ? "rank 1's thread ended with: rank 1 died inside its replica all-reduce #5"
                                          : "rank 1's thread ended with: rank 1 failed before step 2's " + phase));
    CHECK(ran.out.find("the survivors hold step 2 whole (ranks 0, 2, 3): training goes on from it\n") !=
          std::string::npos);
    const std::vector<double> got = losses_in(file);
    REQUIRE(got.size() == 4);
    CHECK(got[0] == reference[0]);  // before the failure: the same bits
    CHECK(got[1] == reference[1]);
    // after it, one replica group of 2 ranks averages what two did: another order of the same additions
    for (std::size_t s = 2; s < 4; ++s) CHECK(got[s] == doctest::Approx(reference[s]).epsilon(1e-6));
  }
}
