// examples/06_port built in separate-compilation mode (fsdp/core/config.hpp) against the same file built header-only.
// Separate compilation moves where the library's non-template code is compiled, not what it does: both builds print
// the same text and end with the same weights, byte for byte. A test of build modes: the sanitizer configurations
// leave it out (tagged "build_modes", .bazelrc); port_test runs the same port under them.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

#include "tests/support/programs.hpp"

namespace {

using fsdp_tests::execute;
using fsdp_tests::file_bytes;
using fsdp_tests::lines_starting;
using fsdp_tests::program;
using fsdp_tests::run;
using fsdp_tests::scratch;

const std::string port = program("FSDP_PORT_PORT", "examples/06_port/port");
const std::string port_separate = program("FSDP_PORT_SEPARATE", "examples/06_port/port_separate");

}  // namespace

TEST_CASE("built in separate-compilation mode, the port prints and trains as the header-only build, byte for byte") {
  for (const int ranks : {1, 4}) {
    const std::string r = std::to_string(ranks);
    const run a = execute(port + " --ranks " + r + " --dump " + scratch("header_only" + r + ".bin"));
    const run b = execute(port_separate + " --ranks " + r + " --dump " + scratch("separate" + r + ".bin"));
    REQUIRE_MESSAGE(a.status == 0, a.out);
    REQUIRE_MESSAGE(b.status == 0, b.out);
    CHECK(lines_starting(b.out, "step ").size() == 40);
    CHECK(b.out == a.out);
    CHECK(file_bytes(scratch("separate" + r + ".bin")) == file_bytes(scratch("header_only" + r + ".bin")));
  }
  const run refused = execute(port_separate + " --ranks 3");
  CHECK(refused.status == 1);
  CHECK(refused.out ==
        "the batch must split evenly over the ranks\n"
        "usage: port [--ranks N] [--steps N] [--batch B] [--lr LR] [--dump FILE]\n");
}
