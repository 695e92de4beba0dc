// ODR check, plain C++ translation unit (host compiler): includes the host library and links with the two CUDA
// translation units odr_a.cu and odr_b.cu.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.hpp>

#include <cstdio>

#include "tests/cuda/gpu_cases.hpp"
#include "tests/cuda/odr.hpp"

TEST_CASE("two .cu files and one .cc file including the library link into one binary") {
  // The host library works here as in any program.
  CHECK(fsdp::layout::shard_numel(257, 4, 16) == 80);
  float a = 0, b = 0;
  const std::string sa = odr_a(&a), sb = odr_b(&b);
  if (!sa.empty() || !sb.empty()) {
    std::printf("%s\n", sa.c_str());
    MESSAGE(sa);
    CHECK(sa.rfind("skipped: no CUDA device", 0) == 0);
    CHECK(sb == sa);
    fsdp_test::gpu_cases.skipped();
    return;
  }
  fsdp_test::gpu_cases.ran();
  CHECK(a == 3.0f);
  CHECK(b == 6.0f);
}

TEST_CASE("the model instantiated in both CUDA translation units trains alike from either") {
  float a = -1, b = -2;
  const std::string sa = odr_model_a(&a), sb = odr_model_b(&b);
  if (!sa.empty()) {
    std::printf("%s\n", sa.c_str());
    MESSAGE(sa);
    CHECK(sb == sa);
    fsdp_test::gpu_cases.skipped();
    return;
  }
  fsdp_test::gpu_cases.ran();
  CHECK(a == b);  // the same templates, the same bits
  CHECK(a != 0.0f);
}
