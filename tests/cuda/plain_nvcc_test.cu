// The library under plain `nvcc -std=c++20`, as a user's own nvcc build compiles <fsdp/fsdp.cuh>: no
// --expt-relaxed-constexpr, no --extended-lambda (the #error below keeps it so). Built that way, a std::bit_cast in
// the per-element cast code was only a warning (#20013-D) and the bf16 conversion kernel stored zeros without
// loading anything. Here the CUDA backend's casts (fp32 to bf16 and fp16, with and without a scale, and back) run
// on the device and are compared bit for bit with the host functions (fsdp/core/float16.hpp) on inputs where zeros
// or any other shortcut would differ: normal values of every sign and scale, halfway cases, fp16 subnormals,
// overflow, infinities and NaN.
#if defined(__CUDACC_RELAXED_CONSTEXPR__) || defined(__CUDACC_EXTENDED_LAMBDA__)
#error "plain_nvcc_test must be built without --expt-relaxed-constexpr and --extended-lambda: that is what it tests"
#endif

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.cuh>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu.hpp"

namespace {

using fsdp::dtype;

std::vector<float> inputs(std::size_t n) {
  std::mt19937 gen(20013);
  std::vector<float> v;
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 1e30f, -1e30f, inf, -inf,
                  std::numeric_limits<float>::quiet_NaN(), std::ldexp(1.0f, -14), std::ldexp(1.0f, -24),
                  std::ldexp(3.0f, -26), std::ldexp(1.0f, -130), 1.00390625f, 1.01171875f, 3.14159265f})
    v.push_back(s);
  while (v.size() < n)  // every exponent from fp16's subnormals to past its range, both signs
    v.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(gen), int(gen() % 48) - 30));
  return v;
}

template <class T>
std::vector<T> on_device(fsdp::backend::cuda& be, const std::vector<float>& in, dtype to, float scale) {
  auto& s = be.compute_stream();
  const std::int64_t n = std::int64_t(in.size());
  auto src = be.allocate(n * 4, fsdp::mem::comm_buffers, s);
  auto dst = be.allocate(n * std::int64_t(sizeof(T)), fsdp::mem::comm_buffers, s);
  be.upload(src.data(), in.data(), n * 4, s);
  be.convert(dst.data(), to, src.data(), dtype::f32, n, scale, s);
  std::vector<T> out(in.size());
  be.synchronize(s);
  be.download(out.data(), dst.data(), n * std::int64_t(sizeof(T)), s);
  be.synchronize(s);
  return out;
}

std::vector<float> widened_on_device(fsdp::backend::cuda& be, const std::vector<std::uint16_t>& in, dtype from) {
  auto& s = be.compute_stream();
  const std::int64_t n = std::int64_t(in.size());
  auto src = be.allocate(n * 2, fsdp::mem::comm_buffers, s);
  auto dst = be.allocate(n * 4, fsdp::mem::comm_buffers, s);
  be.upload(src.data(), in.data(), n * 2, s);
  be.convert(dst.data(), dtype::f32, src.data(), from, n, 1.0f, s);
  std::vector<float> out(in.size());
  be.synchronize(s);
  be.download(out.data(), dst.data(), n * 4, s);
  be.synchronize(s);
  return out;
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST_CASE("under plain nvcc, the device casts equal the host functions bit for bit (bf16 and fp16, both ways)") {
  FSDP_REQUIRE_GPU();
  fsdp::backend::cuda be(0, fsdp_test::backend_options());
  const std::vector<float> in = inputs(1027);
  for (float scale : {1.0f, 0.5f, 3.0f}) {
    CAPTURE(scale);
    const std::vector<std::uint16_t> bf = on_device<std::uint16_t>(be, in, dtype::bf16, scale);
    const std::vector<std::uint16_t> hf = on_device<std::uint16_t>(be, in, dtype::f16, scale);
    int nonzero = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      CAPTURE(i);
      CAPTURE(in[i]);
      REQUIRE(bf[i] == fsdp::kernels::convert_one<dtype::bf16, dtype::f32>(in[i], scale));  // the host backend's bits
      REQUIRE(hf[i] == fsdp::kernels::convert_one<dtype::f16, dtype::f32>(in[i], scale));
      nonzero += bf[i] != 0;
    }
    CHECK(nonzero > 1000);  // what the miscompiled kernel could never give
    const std::vector<float> bf_back = widened_on_device(be, bf, dtype::bf16),
                             hf_back = widened_on_device(be, hf, dtype::f16);
    for (std::size_t i = 0; i < in.size(); ++i) {
      CAPTURE(i);
      REQUIRE(bits(bf_back[i]) == bits(fsdp::kernels::convert_one<dtype::f32, dtype::bf16>(bf[i], 1.0f)));
      REQUIRE(bits(hf_back[i]) == bits(fsdp::kernels::convert_one<dtype::f32, dtype::f16>(hf[i], 1.0f)));
    }
  }
}
