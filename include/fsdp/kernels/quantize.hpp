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
// infinite one makes its block's scale infinite, and every element of that block NaN (finite ones 0 x infinity,
// fp32's quiet NaN on every backend: kernels::dequantized), so a non-finite weight is never hidden. No NaN is
// multiplied (a GPU's multiply would give its own canonical NaN).
//
// On a GPU the block quantization runs a warp's lanes per block, neighbouring lanes on neighbouring elements, and
// the dequantizations four elements per thread (kernels/cooperative.hpp), with the same element code.
#include <cstdint>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/float16.hpp"
#include "fsdp/core/rounding.hpp"
#include "fsdp/kernels/cooperative.hpp"
#include "fsdp/kernels/elementwise.hpp"

namespace fsdp::kernels {

/// The largest finite value of the scaled 8-bit dtype Q.
template <dtype Q>
FSDP_HD constexpr float scaled_top() noexcept {
  static_assert(Q == dtype::f8e4m3 || Q == dtype::f8e5m2 || Q == dtype::i8,
                "fsdp: a block-scaled gather is in f8e4m3, f8e5m2 or i8");
  return Q == dtype::f8e4m3 ? 448.0f : Q == dtype::f8e5m2 ? 57344.0f : 127.0f;
}

/// q x scale, rounded once, without multiplying a NaN (kernels::scaled_value's rule: a GPU's multiply returns its
/// canonical NaN 0x7fffffff, an x86 host's the input NaN quieted): a NaN value or scale passes as it is, bit for bit,
/// and 0 x infinity (a finite element of a block whose scale is infinite) is fp32's quiet NaN 0x7fc00000, where an
/// x86 host's invalid operation gives 0xffc00000 and a GPU's 0x7fffffff. So both backends give the same bits.
FSDP_HD inline float dequantized(float q, float scale) {
  if (!(q == q)) return q;
  if (!(scale == scale)) return scale;
  const std::uint32_t qa = f8::bits(q) & 0x7fffffffu, sa = f8::bits(scale) & 0x7fffffffu;
  if ((qa == 0 && sa == 0x7f800000u) || (qa == 0x7f800000u && sa == 0)) return f8::from_bits(0x7fc00000u);
  return rn::mul(q, scale);
}

/// f(b): block b of `source` (B elements of dtype S, each multiplied by `scale_by` first: kernels::scaled_value) into
/// `out`: slices of `slice` bytes, one per `shard` source elements, each the shard's values (one byte each) and then
/// its fp32 scales. A gather quantizes this rank's master shard into its own slice (one slice); a quantized
/// reduction quantizes the unsharded gradient into one slice per destination rank. A BlockFunction
/// (kernels/cooperative.hpp): on a GPU the lanes of a warp share a block.
template <dtype S, dtype Q>
struct block_quantize {
  const lowp::storage_t<S>* source;
  std::uint8_t* out;
  std::int64_t shard;
  std::int64_t block;
  std::int64_t slice;
  float scale_by = 1.0f;
  /// Where block b's elements come from and go: its first source element, its values and its scale's slot (a block
  /// never crosses a slice: `block` divides `shard`; and `block` is a multiple of 4, precision::gather_block_fits,
  /// so each slice's scales are 4-byte aligned).
  struct place_of {
    const lowp::storage_t<S>* from;
    std::uint8_t* values;
    float* scale;
  };
  FSDP_HD place_of place(std::int64_t b) const {
    const std::int64_t first = b * block, r = first / shard, j = first - r * shard;
    std::uint8_t* at = out + r * slice;
    return {source + first, at + j, reinterpret_cast<float*>(at + shard) + j / block};
  }
  FSDP_HD float element(const place_of& p, int k) const { return scaled_value(lowp::to_float<S>(p.from[k]), scale_by); }
  /// Element k's part of its block's extent: its magnitude, or (a NaN) none and the block's NaN flag.
  FSDP_HD block_extent extent_of(const place_of& p, int k) const {
    const float a = f8::from_bits(f8::bits(element(p, k)) & 0x7fffffffu);
    return a == a ? block_extent{a, false} : block_extent{0.0f, true};
  }
  /// A block's scale: its largest magnitude over the format's largest value, 0 for a block of zeros; int8 has no
  /// NaN, so a block holding one has the scale 0x7fc00000 (the one quiet NaN, whatever the element's payload).
  FSDP_HD float scale_of(block_extent e) const {
    return Q == dtype::i8 && e.nan ? f8::from_bits(0x7fc00000u)
           : e.max == 0.0f         ? 0.0f
                                   : rn::div(e.max, scaled_top<Q>());
  }
  FSDP_HD void write_scale(const place_of& p, float scale) const { *p.scale = scale; }
  /// Element k under its block's scale: a NaN stays NaN (fp8; int8's block scale carries it).
  FSDP_HD void emit(const place_of& p, int k, float scale) const {
    p.values[k] = scale == 0.0f ? std::uint8_t{0} : lowp::from_float<Q>(rn::div(element(p, k), scale));
  }
  FSDP_HD void operator()(std::int64_t b) const {
    const place_of p = place(b);
    block_extent e;
    for (int k = 0; k < block; ++k) e = e.merge(extent_of(p, k));
    const float scale = scale_of(e);
    write_scale(p, scale);
    for (int k = 0; k < block; ++k) emit(p, k, scale);
  }
};

/// f(i): gathered element i (of `shard` per rank, in blocks of `block`, each rank's slice `slice` bytes) from the
/// wire slot into `out` in dtype D. A QuadFunction (kernels/cooperative.hpp): four elements of one block at a time
/// where the sizes and pointers allow (one 32-bit load of their values, one store of four D).
template <dtype D, dtype Q>
struct block_dequantize {
  const std::uint8_t* wire;
  lowp::storage_t<D>* out;
  std::int64_t shard;
  std::int64_t block;
  std::int64_t slice;
  FSDP_HD lowp::storage_t<D> value(std::uint8_t q, float scale) const {
    return lowp::from_float<D>(dequantized(lowp::to_float<Q>(q), scale));
  }
  FSDP_HD void operator()(std::int64_t i) const {
    const std::int64_t r = i / shard, j = i - r * shard;
    const std::uint8_t* values = wire + r * slice;  // rank r's values, then its scales
    const float* scales = reinterpret_cast<const float*>(values + shard);
    out[i] = value(values[j], scales[j / block]);
  }
  /// Four elements of one block never cross a slice or a block, and their accesses are aligned.
  FSDP_HD bool quads() const {
    return block % 4 == 0 && shard % 4 == 0 && slice % 4 == 0 && aligned_to(wire, 4) &&
           aligned_to(out, 4 * sizeof(lowp::storage_t<D>));
  }
  FSDP_HD void quad(std::int64_t q) const {
    const std::int64_t i = 4 * q, r = i / shard, j = i - r * shard;
    const std::uint8_t* values = wire + r * slice;
    const float scale = reinterpret_cast<const float*>(values + shard)[j / block];
    const quad_of<std::uint8_t> v = *reinterpret_cast<const quad_of<std::uint8_t>*>(values + j);
    quad_of<lowp::storage_t<D>> o;
    for (int k = 0; k < 4; ++k) o.v[k] = value(v.v[k], scale);
    *reinterpret_cast<quad_of<lowp::storage_t<D>>*>(out + i) = o;
  }
};

/// f(i): element i of this rank's fp32 gradient shard gets the quantized reduction's sum: `received` holds `ranks`
/// slices (as block_quantize writes them), rank r's quantization of this rank's shard in slice r; each element is
/// dequantized (its value times its block's scale, kernels::dequantized), multiplied by `premul` (an average's
/// float(1 / ranks), else 1), summed in rank order from 0 in fp32 (kernels::reduce_add, as the fp32 reduce-scatter
/// sums), and the sum added into the shard times `postscale` (kernels::accumulate_one). So the result is the fp32
/// reduce-scatter of the dequantized gradients, bit for bit. A QuadFunction: four elements at a time where the
/// sizes and pointers allow (a 32-bit load of four values per rank, 128-bit loads and stores of the shard).
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
      acc = reduce_add<dtype::f32>(acc, dequantized(lowp::to_float<Q>(values[i]), scales[i / block]), premul);
    }
    accumulate_one<dtype::f32>(shard_out[i], acc, postscale);
  }
  /// Four elements of one block, every rank's slice and the shard aligned for their accesses.
  FSDP_HD bool quads() const {
    return block % 4 == 0 && slice % 4 == 0 && aligned_to(received, 4) && aligned_to(shard_out, 16);
  }
  FSDP_HD void quad(std::int64_t q) const {
    const std::int64_t i = 4 * q;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = 0; r < ranks; ++r) {
      const std::uint8_t* values = received + r * slice;
      const float scale = reinterpret_cast<const float*>(values + shard)[i / block];
      const quad_of<std::uint8_t> v = *reinterpret_cast<const quad_of<std::uint8_t>*>(values + i);
      for (int k = 0; k < 4; ++k)
        acc[k] = reduce_add<dtype::f32>(acc[k], dequantized(lowp::to_float<Q>(v.v[k]), scale), premul);
    }
    quad_of<float> g = *reinterpret_cast<const quad_of<float>*>(shard_out + i);
    for (int k = 0; k < 4; ++k) accumulate_one<dtype::f32>(g.v[k], acc[k], postscale);
    *reinterpret_cast<quad_of<float>*>(shard_out + i) = g;
  }
};

}  // namespace fsdp::kernels
