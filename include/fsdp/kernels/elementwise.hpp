#pragma once
// The per-element logic of the library's data-movement kernels, written once for both backends: the host
// backend calls it from loops, the CUDA backend from vectorised kernels (fsdp/cuda/kernels.cuh).
//   convert:    dst = D(float(src) * scale)   copy-in (fp32 master -> compute dtype, scale 1) and reduce-scatter
//                                             input preparation (compute -> reduce dtype, scale 1 or 1/world)
//   accumulate: dst += float(src) * scale     copy-out of a reduction into an fp32 gradient shard (scale: the
//                                             post-division of grad_division::pre_post, else 1)
//   reduce:     acc = D(acc + x_q')           the in-process communicators' reduction: over ranks q in rank order
//                                             from 0, rounded to the wire dtype D after every addition (NCCL rounds
//                                             after every addition too, in its ring or tree order, not rank order);
//                                             x_q' = D(x_q * D(1/world)) for an average (NCCL's PreMulSum scalar),
//                                             x_q for a sum
#include <cstdint>
#include <utility>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/float16.hpp"
#include "fsdp/core/rounding.hpp"

namespace fsdp::kernels {

/// f * scale, rounded once; f itself when the scale is 1; a NaN quieted, with its sign and payload, when it is not. A
/// NaN is not multiplied: a GPU's multiply returns its canonical NaN (0x7fffffff), an x86 host's the input NaN
/// quieted, so the NaN is quieted here and both backends give the same bits (an H200 showed the difference). Not
/// the NaN as it is: an optimizer may take `nan ? f : f * scale` for `f * scale` (LLVM keeps no NaN's payload
/// through a multiply; clang -O2 did so, and quieted a signalling NaN, where -O0 and g++ kept it), and the quieted
/// NaN is the same bits either way.
FSDP_HD inline float scaled_value(float f, float scale) {
  if (scale == 1.0f) return f;
  const std::uint32_t b = lowp::bits(f);
  return (b & 0x7fffffffu) > 0x7f800000u ? lowp::from_bits(b | 0x00400000u) : rn::mul(f, scale);
}

template <dtype D, dtype S>
FSDP_HD inline lowp::storage_t<D> convert_one(lowp::storage_t<S> x, float scale) {
  if constexpr (D == S) {
    if (scale == 1.0f) return x;  // a plain copy keeps every bit, NaN payloads included
  }
  return lowp::from_float<D>(scaled_value(lowp::to_float<S>(x), scale));
}

template <dtype S>
FSDP_HD inline void accumulate_one(float& dst, lowp::storage_t<S> x, float scale = 1.0f) {
  const float f = lowp::to_float<S>(x);
  dst = rn::add(dst, scale == 1.0f ? f : rn::mul(f, scale));
}

/// The in-process communicators' reduction of one element over the ranks, with NCCL's rounding rules for floating
/// types in a fixed order: the ranks' values are added in rank order starting from 0, the running value rounded
/// to D after every addition (NCCL also rounds after every addition, but in its ring or tree order: 16-bit results
/// at 3 or more ranks may differ from NCCL's in the last bits); an average pre-multiplies each value by 1/world
/// rounded to D (NCCL's ncclAvg is its PreMulSum with that scalar), so a 16-bit sum stays as far from overflow as
/// the average itself. `premul`: average_factor<D>(world) for an average, 1 for a sum.
/// A NaN is not multiplied by `premul` (scaled_value): it passes as it is.
template <dtype D>
FSDP_HD inline float reduce_add(float acc, lowp::storage_t<D> x, float premul) {
  float v = lowp::to_float<D>(x);
  if (premul != 1.0f) v = lowp::to_float<D>(lowp::from_float<D>(scaled_value(v, premul)));
  return lowp::to_float<D>(lowp::from_float<D>(rn::add(acc, v)));
}
/// 1/world as an element of D, as a float (NCCL computes float(1.0 / nRanks) and converts it to D).
template <dtype D>
inline float average_factor(int world) {
  return lowp::to_float<D>(lowp::from_float<D>(static_cast<float>(1.0 / world)));
}

/// Calls fn(std::integral_constant<dtype, t>{}) for the runtime dtype t: one instance for each row of
/// core/dtype.hpp.
template <class F>
void dispatch(dtype t, F&& fn) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const bool found =
        ((t == dtype_rows[I].tag ? (fn(std::integral_constant<dtype, dtype_rows[I].tag>{}), true) : false) || ...);
    if (!found) fsdp::detail::fail_usage("unknown dtype ", static_cast<int>(t));
  }(std::make_index_sequence<dtype_count>{});
}

}  // namespace fsdp::kernels
