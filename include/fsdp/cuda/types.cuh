#pragma once
// CUDA's own 16-bit types as element types: a CUDA trainer may ask a unit for param<__nv_bfloat16>(...) or
// grad<__half>(...) under a policy that computes in fsdp::bfloat16 / fsdp::float16 (same dtype, same bits), and
// may name them in a precision policy directly (fsdp::precision::mixed<__nv_bfloat16>).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__half) == 2);

}  // namespace fsdp
