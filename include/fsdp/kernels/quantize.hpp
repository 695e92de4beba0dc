#pragma once
// Block-scaled 8-bit gathers (precision::scaled, in fp8 or int8): the element functions Backend::for_each runs on
// both backends, so the host and a GPU give the same bits.
//
// A rank's slice of the wire slot holds its shard's S values (one byte each) and then its S / B fp32 scales; the
// all-gather moves the slices whole (plan::unit_costs::gather_count: S + 4 S / B bytes each), so after it rank r's
// values start at r x slice and its scales at r x slice + S.
//
//   quantize (one call per block of B master elements):  m = the block's largest magnitude (NaN elements aside);
//       scale = m / top (top: the format's largest finite value, 448, 57344 or 127), 0 when m is 0;
//       q = Q(x / scale) (nearest even, saturating: core/float8.hpp, core/float16.hpp), 0 when the scale is 0
//   dequantize (one call per gathered element):          x' = compute(float(q) * scale)
//
// Every operation rounds once (core/rounding.hpp), so the bits depend on the element, its block and the format
// only: not on the world size, the shard an element falls in, or the backend. A NaN element stays NaN; an
// infinite one makes its block's scale infinite, and every element of that block NaN (finite ones 0 x infinity),
// so a non-finite weight is never hidden.
#include <cstdint>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/float16.hpp"
#include "fsdp/core/rounding.hpp"

namespace fsdp::kernels {

/// The largest finite value of the scaled 8-bit dtype Q.
template <dtype Q>
FSDP_HD constexpr float scaled_top() noexcept {
  static_assert(Q == dtype::f8e4m3 || Q == dtype::f8e5m2 || Q == dtype::i8,
                "fsdp: a block-scaled gather is in f8e4m3, f8e5m2 or i8");
  return Q == dtype::f8e4m3 ? 448.0f : Q == dtype::f8e5m2 ? 57344.0f : 127.0f;
}

/// f(b): block b of `master` (B elements) into `values` (one byte each, at b x B) and `scales[b]`.
template <dtype Q>
struct block_quantize {
  const float* master;
  std::uint8_t* values;
  float* scales;
  std::int64_t block;
  FSDP_HD void operator()(std::int64_t b) const {
    const float* x = master + b * block;
    std::uint8_t* q = values + b * block;
    float m = 0.0f;
    bool nan = false;
    for (std::int64_t k = 0; k < block; ++k) {
      const float a = f8::from_bits(f8::bits(x[k]) & 0x7fffffffu);
      if (a > m) m = a;  // a NaN compares false: left out of the scale, and quantized to NaN below (fp8)
      nan = nan || !(a == a);
    }
    // int8 has no NaN: the block's scale carries it (0x7fc00000, the one quiet NaN, whatever the element's payload)
    const float scale = Q == dtype::i8 && nan ? f8::from_bits(0x7fc00000u)
                        : m == 0.0f           ? 0.0f
                                              : rn::div(m, scaled_top<Q>());
    scales[b] = scale;
    for (std::int64_t k = 0; k < block; ++k)
      q[k] = scale == 0.0f ? std::uint8_t{0} : f16::from_float<Q>(rn::div(x[k], scale));
  }
};

/// f(i): gathered element i (of `shard` per rank, in blocks of `block`, each rank's slice `slice` bytes) from the
/// wire slot into `out` in dtype D.
template <dtype D, dtype Q>
struct block_dequantize {
  const std::uint8_t* wire;
  f16::storage_t<D>* out;
  std::int64_t shard;
  std::int64_t block;
  std::int64_t slice;
  FSDP_HD void operator()(std::int64_t i) const {
    const std::int64_t r = i / shard, j = i - r * shard;
    const std::uint8_t* values = wire + r * slice;  // rank r's values, then its scales
    const float* scales = reinterpret_cast<const float*>(values + shard);
    out[i] = f16::from_float<D>(rn::mul(f16::to_float<Q>(values[j]), scales[j / block]));
  }
};

}  // namespace fsdp::kernels
