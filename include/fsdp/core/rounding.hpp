#pragma once
// fp32 arithmetic with one rounding per operation, on the host and in CUDA kernels alike. nvcc contracts
// a * b + c into one fused multiply-add by default, and --use_fast_math replaces division and square root with
// approximations; the __f*_rn intrinsics are never contracted or approximated. Code written with these helpers
// therefore gives the same bits on both backends (host code compiled without FMA contraction: the default of
// g++ and clang on x86-64 unless -mfma/-march=native with -ffp-contract=fast).
//
// nvcc --use_fast_math (or -ftz=true) is another matter: nvcc 13 then emits add.rn.ftz.f32 for __fadd_rn, so
// subnormals flush to zero and the bits differ from the host's. nvcc defines no macro for it, so backend::cuda
// probes its own kernels when it starts and refuses such a build with a sentence (cuda/kernels.cuh,
// subnormal_probe).
#include <cmath>
#include <cstdint>

#include "fsdp/core/config.hpp"

namespace fsdp::rn {

FSDP_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FSDP_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FSDP_HD inline float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FSDP_HD inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FSDP_HD inline float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// The same in double (the gradient inspection's decision: fsdp/grad/inspect.hpp; the learning-rate schedule and
// AdamW's bias corrections: fsdp/optim/schedule.hpp).
FSDP_HD inline double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
FSDP_HD inline double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
FSDP_HD inline double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
FSDP_HD inline double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
FSDP_HD inline double sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
/// A 64-bit integer as a double, exact for |x| < 2^53 (counts of steps and elements), from its two 32-bit halves:
/// the same value as static_cast<double>(x), but through 32-bit conversions, since the simulated GPU's cvt from a
/// 64-bit integer gives 0 (a kernel's `double(long)` is 0 there; tests/cuda/kernels_test checks this one).
FSDP_HD inline double from_int64(std::int64_t x) {
  const auto hi = static_cast<std::int32_t>(x >> 32);
  const auto lo = static_cast<std::uint32_t>(x & 0xffffffff);
  return add(mul(static_cast<double>(hi), 4294967296.0), static_cast<double>(lo));
}

}  // namespace fsdp::rn
