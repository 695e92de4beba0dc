// examples/06_port: the single-process trainer (original.cc) and its port to the library (port.cc), run as their
// users run them. At 1 rank the port prints the original's losses and ends with its weights, bit for bit: the same
// kernels on the same views, the reduction over one rank exact, the original's AdamW arithmetic as the port's
// element rule. At 4 ranks each rank computes a quarter of the batch and the gradients are averaged by the
// reduce-scatter, a different summation order: within the tolerances below after 40 steps. The port's memory table
// is its plan, and what it refuses it refuses before training, as the original does. The same port built in
// separate-compilation mode is port_modes_test's.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/programs.hpp"

namespace {

using fsdp_tests::execute;
using fsdp_tests::file_bytes;
using fsdp_tests::lines_starting;
using fsdp_tests::program;
using fsdp_tests::run;
using fsdp_tests::scratch;

const std::string original = program("FSDP_PORT_ORIGINAL", "examples/06_port/original");
const std::string port = program("FSDP_PORT_PORT", "examples/06_port/port");

std::vector<float> losses(const std::string& text) {
  std::vector<float> out;
  for (const std::string& line : lines_starting(text, "step "))
    out.push_back(std::stof(line.substr(line.find("loss ") + 5)));
  return out;
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = file_bytes(path);
  REQUIRE(bytes.size() % sizeof(float) == 0);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(v.data()));
  return v;
}

}  // namespace

TEST_CASE("at 1 rank the port prints the original's losses and ends with its weights, bit for bit") {
  const run a = execute(original + " --dump " + scratch("original.bin"));
  const run b = execute(port + " --ranks 1 --dump " + scratch("port1.bin"));
  REQUIRE_MESSAGE(a.status == 0, a.out);
  REQUIRE_MESSAGE(b.status == 0, b.out);
  CHECK(lines_starting(a.out, "68992 parameters") == std::vector<std::string>{"68992 parameters, 4 blocks, batch 32"});
  const std::vector<std::string> want = lines_starting(a.out, "step ");
  REQUIRE(want.size() == 40);
  CHECK(lines_starting(b.out, "step ") == want);
  const std::vector<float> w0 = read_floats(scratch("original.bin")), w1 = read_floats(scratch("port1.bin"));
  REQUIRE(w0.size() == 68992);
  REQUIRE(w1.size() == w0.size());
  CHECK(std::memcmp(w0.data(), w1.data(), w0.size() * sizeof(float)) == 0);
  // It learned: the mean loss of the last 10 steps is below the first step's by a third.
  const std::vector<float> l = losses(a.out);
  float tail = 0;
  for (std::size_t i = 30; i < 40; ++i) tail += l[i] / 10;
  CHECK(tail < l[0] * 2 / 3);
}

TEST_CASE("at 4 ranks the losses agree within 1e-6 relative and the weights within 1e-4 of the largest") {
  const run a = execute(original + " --dump " + scratch("original4.bin"));
  const run b = execute(port + " --ranks 4 --dump " + scratch("port4.bin"));
  REQUIRE_MESSAGE(a.status == 0, a.out);
  REQUIRE_MESSAGE(b.status == 0, b.out);
  const std::vector<float> la = losses(a.out), lb = losses(b.out);
  REQUIRE(la.size() == 40);
  REQUIRE(lb.size() == 40);  // printed by rank 0 only
  for (std::size_t i = 0; i < la.size(); ++i) CHECK(std::fabs(lb[i] - la[i]) <= 1e-6f * std::fabs(la[i]));
  const std::vector<float> w0 = read_floats(scratch("original4.bin")), w4 = read_floats(scratch("port4.bin"));
  REQUIRE(w4.size() == w0.size());
  float largest = 0, worst = 0;
  for (std::size_t i = 0; i < w0.size(); ++i) {
    largest = std::max(largest, std::fabs(w0[i]));
    worst = std::max(worst, std::fabs(w4[i] - w0[i]));
  }
  INFO("largest weight ", largest, ", largest difference ", worst);
  CHECK(worst <= 1e-4f * largest);
  CHECK(worst > 0);  // a different summation order: the tolerance is needed, not decorative
}

TEST_CASE("the port's memory table is its plan, at 1 and at 4 ranks") {
  for (const int ranks : {1, 4}) {
    const run b = execute(port + " --steps 2 --ranks " + std::to_string(ranks));
    REQUIRE_MESSAGE(b.status == 0, b.out);
    CHECK(lines_starting(b.out, "every rank") == std::vector<std::string>{"every rank within its plan"});
    CHECK(lines_starting(b.out, "over the plan").empty());
  }
}

TEST_CASE("a batch that does not split over the ranks is refused before training, with the usage") {
  const run b = execute(port + " --ranks 3");
  CHECK(b.status == 1);
  CHECK(b.out ==
        "the batch must split evenly over the ranks\n"
        "usage: port [--ranks N] [--steps N] [--batch B] [--lr LR] [--dump FILE]\n");
}
