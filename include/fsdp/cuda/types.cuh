#pragma once
// CUDA's own 16-bit types as element types: a CUDA trainer may ask a unit for param<__nv_bfloat16>(...) or
// grad<__half>(...) under a policy that computes in fsdp::bfloat16 / fsdp::float16 (same dtype, same bits), and
// may name them in a precision policy directly (fsdp::precision::mixed<__nv_bfloat16>). CUDA's 8-bit types too
// (__nv_fp8_e4m3, __nv_fp8_e5m2: the OCP formats, same bits as fsdp::float8_e4m3 / float8_e5m2; element types,
// not precisions: core/float8.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fsdp/core/dtype.hpp"

namespace fsdp {

template <>
struct dtype_of<__nv_bfloat16> {
  static constexpr dtype value = dtype::bf16;
};
template <>
struct dtype_of<__half> {
  static constexpr dtype value = dtype::f16;
};

template <>
struct dtype_of<__nv_fp8_e4m3> {
  static constexpr dtype value = dtype::f8e4m3;
};
template <>
struct dtype_of<__nv_fp8_e5m2> {
  static constexpr dtype value = dtype::f8e5m2;
};

static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__half) == 2);
static_assert(sizeof(__nv_fp8_e4m3) == 1 && sizeof(__nv_fp8_e5m2) == 1);

}  // namespace fsdp
