// This file is built with nvcc --use_fast_math (tests/cuda/BUILD, tools/sim-check): the library's kernels would
// flush subnormals to zero and stop matching the host backend, so backend::cuda refuses to start, and says why.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.cuh>

#include <cstdio>
#include <string>

#include "gpu.hpp"

TEST_CASE("a build with --use_fast_math: backend::cuda refuses to start, naming the flag") {
  FSDP_REQUIRE_GPU();
  if (fsdp_test::simulated_gpu()) {  // its PTX has add.rn.ftz.f32, but GPGPU-Sim does not flush: nothing to see
    fsdp_test::needs_real_gpu("the simulator ignores .ftz");
    return;
  }
  std::string what;
  try {
    fsdp::backend::cuda be;
  } catch (const fsdp::usage_error& e) {
    what = e.what();
  }
  CHECK(what ==
        "fsdp: backend::cuda: this program's CUDA kernels flush subnormal floats to zero (built with nvcc "
        "--use_fast_math or -ftz=true), so they would not match the host backend bit for bit and small gradients "
        "would vanish; build the translation units that include fsdp without --use_fast_math (keep -ftz=false, "
        "-prec-div=true and -prec-sqrt=true, nvcc's defaults)");
}
