#pragma once
// Block-scaled 8-bit gathers and reductions (precision::scaled, in fp8 or int8): the element functions
// Backend::for_each runs on both backends, so the host and a GPU give the same bits.
//
// A rank's slice of the wire slot holds its shard's S values (one byte each) and then its S / B fp32 scales; the
// all-gather moves the slices whole (plan::unit_costs::gather_count: S + 4 S / B bytes each), so after it rank r's
// values start at r x slice and its scales at r x slice + S. A quantized reduction's input and output have the same
// layout: its input one slice per destination rank (that rank's shard of the gradient), its output, after the
// all_to_all, one slice per source rank (this rank's shard, quantized by that rank).
//
//   quantize (one call per block of B source elements):  m = the block's largest magnitude (NaN elements aside);
//       scale = m / top (top: the format's largest finite value, 448, 57344 or 127), 0 when m is 0;
//       q = Q(x / scale) (nearest even, saturating: core/float8.hpp, core/float16.hpp), 0 when the scale is 0
//   dequantize (one call per gathered element):          x' = compute(float(q) * scale)
//   dequantize and sum (one call per shard element):     g += post x (sum over ranks r in order of
//                                                        float(q_r) * scale_r * premul), in fp32
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
#include "fsdp/kernels/elementwise.hpp"

namespace fsdp::kernels {

/// The largest finite value of the scaled 8-bit dtype Q.
template <dtype Q>
FSDP_HD constexpr float scaled_top() noexcept {
  static_assert(Q == dtype::f8e4m3 || Q == dtype::f8e5m2 || Q == dtype::i8,
                "fsdp: a block-scaled gather is in f8e4m3, f8e5m2 or i8");
  return Q == dtype::f8e4m3 ? 448.0f : Q == dtype::f8e5m2 ? 57344.0f : 127.0f;
}

/// f(b): block b of `source` (B elements of dtype S, each multiplied by `scale_by` first: kernels::scaled_value) into
/// `out`: slices of `slice` bytes, one per `shard` source elements, each the shard's values (one byte each) and then
/// its fp32 scales. A gather quantizes this rank's master shard into its own slice (one slice); a quantized
/// reduction quantizes the unsharded gradient into one slice per destination rank.
template <dtype S, dtype Q>
struct block_quantize {
  const f16::storage_t<S>* source;
  std::uint8_t* out;
  std::int64_t shard;
  std::int64_t block;
  std::int64_t slice;
  float scale_by = 1.0f;
  FSDP_HD float element(std::int64_t i) const { return scaled_value(f16::to_float<S>(source[i]), scale_by); }
  FSDP_HD void operator()(std::int64_t b) const {
    const std::int64_t first = b * block, r = first / shard, j = first - r * shard;
    std::uint8_t* q = out + r * slice + j;
    float* scales = reinterpret_cast<float*>(out + r * slice + shard);
    float m = 0.0f;
    bool nan = false;
    for (std::int64_t k = 0; k < block; ++k) {
      const float a = f8::from_bits(f8::bits(element(first + k)) & 0x7fffffffu);
      if (a > m) m = a;  // a NaN compares false: left out of the scale, and quantized to NaN below (fp8)
      nan = nan || !(a == a);
    }
    // int8 has no NaN: the block's scale carries it (0x7fc00000, the one quiet NaN, whatever the element's payload)
    const float scale = Q == dtype::i8 && nan ? f8::from_bits(0x7fc00000u)
                        : m == 0.0f           ? 0.0f
                                              : rn::div(m, scaled_top<Q>());
    scales[j / block] = scale;
    for (std::int64_t k = 0; k < block; ++k)
      q[k] = scale == 0.0f ? std::uint8_t{0} : f16::from_float<Q>(rn::div(element(first + k), scale));
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

/// f(i): element i of this rank's fp32 gradient shard gets the quantized reduction's sum: `received` holds `ranks`
/// slices (as block_quantize writes them), rank r's quantization of this rank's shard in slice r; each element is
/// dequantized (its value times its block's scale), multiplied by `premul` (an average's float(1 / ranks), else
/// 1), summed in rank order from 0 in fp32 (kernels::reduce_add, as the fp32 reduce-scatter sums), and the sum added
/// into the shard times `postscale` (kernels::accumulate_one). So the result is the fp32 reduce-scatter of the
/// dequantized gradients, bit for bit.
template <dtype Q>
struct block_dequantize_sum {
  const std::uint8_t* received;
  float* shard_out;
  std::int64_t shard;
  std::int64_t block;
  std::int64_t slice;
  int ranks;
  float premul;
  float postscale;
  FSDP_HD void operator()(std::int64_t i) const {
    float acc = 0.0f;
    for (int r = 0; r < ranks; ++r) {
      const std::uint8_t* values = received + r * slice;
      const float* scales = reinterpret_cast<const float*>(values + shard);
      acc = reduce_add<dtype::f32>(acc, rn::mul(f16::to_float<Q>(values[i]), scales[i / block]), premul);
    }
    accumulate_one<dtype::f32>(shard_out[i], acc, postscale);
  }
};

}  // namespace fsdp::kernels
