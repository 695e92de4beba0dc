#pragma once
// The per-element logic of the library's data-movement kernels, written once for both backends: the host
// backend calls it from loops, the CUDA backend from vectorised kernels (fsdp/cuda/kernels.cuh).
//   convert:    dst = D(float(src) * scale)   copy-in (fp32 master -> compute dtype, scale 1) and reduce-scatter
//                                             input preparation (compute -> reduce dtype, scale 1 or 1/world)
//   accumulate: dst += float(src)             copy-out of a reduction into an fp32 gradient shard
//   reduce_ranks: dst = sum over ranks, in rank order (then / world for avg)
#include <cstdint>
#include <utility>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/float16.hpp"
#include "fsdp/core/rounding.hpp"

namespace fsdp::kernels {

template <dtype D, dtype S>
FSDP_HD inline f16::storage_t<D> convert_one(f16::storage_t<S> x, float scale) {
  if constexpr (D == S) {
    if (scale == 1.0f) return x;  // a plain copy keeps every bit, NaN payloads included
  }
  float f = f16::to_float<S>(x);
  if (scale != 1.0f) f = rn::mul(f, scale);
  return f16::from_float<D>(f);
}

template <dtype S>
FSDP_HD inline void accumulate_one(float& dst, f16::storage_t<S> x) {
  dst = rn::add(dst, f16::to_float<S>(x));
}

/// Calls fn(std::integral_constant<dtype, t>{}) for the runtime dtype t.
template <class F>
decltype(auto) dispatch(dtype t, F&& fn) {
  switch (t) {
    case dtype::f32: return std::forward<F>(fn)(std::integral_constant<dtype, dtype::f32>{});
    case dtype::bf16: return std::forward<F>(fn)(std::integral_constant<dtype, dtype::bf16>{});
    case dtype::f16: return std::forward<F>(fn)(std::integral_constant<dtype, dtype::f16>{});
  }
  fsdp::detail::fail_usage("unknown dtype ", static_cast<int>(t));
}

}  // namespace fsdp::kernels
