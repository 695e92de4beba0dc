#pragma once
// Precision policies: the dtype parameters are computed in, the dtype of the master shards (always fp32), the dtype
// gradients are reduced in, and the dtype parameters are gathered in (the compute dtype unless a narrower one is
// named). Gradients always accumulate into fp32 gradient shards.
//
//   fsdp::precision::full                               everything fp32
//   fsdp::precision::mixed<fsdp::bfloat16>              bf16 gathers and compute, fp32 reduction
//   fsdp::precision::mixed<fsdp::bfloat16, float, fsdp::bfloat16>   bf16 reduction too (half the reduce bytes)
//   fsdp::precision::mixed<float, float, float, fsdp::bfloat16>     fp32 compute, bf16 on the wire: the all-gather
//                                                       moves bf16, the trainer's views are fp32 (widened after
//                                                       the gather), for fp32 kernels at half the gather bytes
//   fsdp::precision::wire<fsdp::bfloat16>               the same, by name
//   fsdp::precision::scaled<fsdp::float8_e4m3, 128>     fp8 on the wire with one fp32 scale per block of 128
//                                                       elements (symmetric absmax), bf16 views: a quarter of fp32's
//                                                       gather bytes, plus the scales
//   fsdp::precision::scaled<std::int8_t, 128>           int8 on the wire, the same way (ZeRO++'s qwZ scheme)
//   fsdp::precision::scaled<std::int8_t, 128, fsdp::bfloat16, std::int8_t>
//                                                       gradients reduced in int8 blocks too (ZeRO++'s qgZ scheme):
//                                                       each rank quantizes its gradient per destination shard,
//                                                       an all_to_all moves the blocks, and each rank dequantizes
//                                                       what it received and sums it in fp32 (kernels/quantize.hpp)
//
// The cast from the fp32 master shard to the gather dtype happens while the shard is copied into this rank's slice
// of the gather buffer; when the gather dtype is narrower than the compute dtype, the gathered parameters are
// widened into the compute views after the all-gather (a second buffer, the wire slot: fsdp/memory/cost.hpp), so a
// view holds exactly the gather dtype's values; a scaled gather (fp8 or int8) quantizes each block of the shard
// with its own scale into the wire slot and dequantizes into the views after the gather (kernels/quantize.hpp). The
// cast from the compute dtype (or the fp32 no-sync accumulator) to the reduce dtype happens when the reduction's input
// is prepared; the reduced result is added into the fp32 gradient shard. A scaled reduce dtype quantizes that input in
// blocks instead, one slice per rank of the shard group, and the all_to_all and the fp32 sum replace the
// reduce-scatter (it needs sharded parameters without replicas, and a communicator with all_to_all:
// fsdp/can_implement.hpp refuses the rest). Every narrowing cast rounds to nearest even
// (core/float16.hpp), every widening is exact: the same bits on every backend.
#include <concepts>
#include <type_traits>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/float16.hpp"

namespace fsdp {

struct precision_tag {};

/// The element type parameters are gathered in: P::gather_type where the policy names one, else its compute type.
template <class P>
struct gather_type_of {
  using type = typename P::compute_type;
};
template <class P>
  requires requires { typename P::gather_type; }
struct gather_type_of<P> {
  using type = typename P::gather_type;
};

/// Elements per scale of a scaled gather: P::gather_block where the policy names one, else 0 (no scales).
template <class P>
inline constexpr int gather_block_of = 0;
template <class P>
  requires requires { P::gather_block; }
inline constexpr int gather_block_of<P> = P::gather_block;

/// Elements per scale of a quantized reduction: P::reduce_block where the policy names one, else 0 (a plain
/// reduce dtype).
template <class P>
inline constexpr int reduce_block_of = 0;
template <class P>
  requires requires { P::reduce_block; }
inline constexpr int reduce_block_of<P> = P::reduce_block;

/// Whether parameters may be gathered in `gather` and computed in `compute`: the same dtype, or a narrower one that
/// is widened exactly after the gather (a gather of the same width in another dtype would round twice; a wider one
/// would move more bytes than casting first).
constexpr bool gathers_into(dtype gather, dtype compute) noexcept {
  return gather == compute || size_of(gather) < size_of(compute);
}

/// Whether a precision policy may name `t` as its compute, reduce or gather dtype: any dtype whose values need no
/// scale beside them (not fp8: core/dtype.hpp's `scaled`).
constexpr bool plain_precision(dtype t) noexcept { return is_dtype(t) && !is_scaled(t); }

/// Whether `block` elements per scale suit a gather in `gather`: none (0) for a plain dtype; for a scaled one, a
/// positive multiple of 4 (so that each rank's scales, after its values in the wire slot, stay 4-byte aligned).
constexpr bool gather_block_fits(dtype gather, int block) noexcept {
  return is_scaled(gather) ? block > 0 && block % 4 == 0 : block == 0;
}

/// A precision policy opts in with `using precision_concept = fsdp::precision_tag;` and names three element
/// types (each with a dtype: float, fsdp::bfloat16, fsdp::float16, or CUDA's __nv_bfloat16 / __half), and
/// optionally a fourth, `gather_type`, narrower than the compute type. The master type must be float: the library
/// keeps fp32 master shards and fp32 gradient shards. A gather type whose values need scales (fp8) comes with
/// `static constexpr int gather_block`, the elements per scale (precision::scaled); a scaled reduce type with
/// `static constexpr int reduce_block`.
template <class P>
concept PrecisionPolicy = requires {
  typename P::precision_concept;
  requires std::same_as<typename P::precision_concept, precision_tag>;
  typename P::compute_type;
  typename P::master_type;
  typename P::reduce_type;
  requires ElementType<typename P::compute_type>;
  requires ElementType<typename P::reduce_type>;
  requires std::same_as<typename P::master_type, float>;
  requires ElementType<typename gather_type_of<P>::type>;
  requires plain_precision(dtype_of_v<typename P::compute_type>);
  requires is_dtype(dtype_of_v<typename P::reduce_type>);
  requires gather_block_fits(dtype_of_v<typename P::reduce_type>, reduce_block_of<P>);
  requires is_dtype(dtype_of_v<typename gather_type_of<P>::type>);
  requires gather_block_fits(dtype_of_v<typename gather_type_of<P>::type>, gather_block_of<P>);
  requires gathers_into(dtype_of_v<typename gather_type_of<P>::type>, dtype_of_v<typename P::compute_type>);
};

/// The policy's dtypes as values, for the code that is not a template (costs, the planner, the executor).
struct precision_facts {
  dtype compute = dtype::f32;  ///< gathered parameters and the unsharded gradients the trainer writes
  dtype master = dtype::f32;   ///< master shards (always f32)
  dtype reduce = dtype::f32;   ///< what the reduction moves
  dtype gather = compute;      ///< what the all-gather moves: the compute dtype, or a narrower one (gathers_into)
                               ///< widened into the compute views after the gather
  int gather_block = 0;        ///< a scaled gather dtype (fp8 or int8): elements per fp32 scale; else 0
  int reduce_block = 0;        ///< a scaled reduce dtype (a quantized reduction): elements per fp32 scale; else 0
  /// Whether gathered parameters are widened from the gather dtype into the compute dtype (a wire slot exists).
  constexpr bool widens() const noexcept { return gather != compute; }
  /// Whether gradients are reduced quantized in blocks (all_to_all, then an fp32 sum) rather than reduce-scattered.
  constexpr bool quantizes_reduction() const noexcept { return reduce_block > 0; }
  friend constexpr bool operator==(const precision_facts&, const precision_facts&) = default;
};

template <PrecisionPolicy P>
constexpr precision_facts facts_of_precision() noexcept {
  return {dtype_of_v<typename P::compute_type>,         dtype::f32,         dtype_of_v<typename P::reduce_type>,
          dtype_of_v<typename gather_type_of<P>::type>, gather_block_of<P>, reduce_block_of<P>};
}

namespace precision {

/// Parameters computed in `Compute` and gathered in `Gather` (by default `Compute`; a narrower type is widened into
/// the compute views after the gather), fp32 master shards, gradients reduced in `Reduce`.
template <class Compute, class Master = float, class Reduce = float, class Gather = Compute>
struct mixed {
  static_assert(ElementType<Compute>,
                "fsdp::precision::mixed: the compute type has no dtype (use float, fsdp::bfloat16 or fsdp::float16)");
  static_assert(std::same_as<Master, float>,
                "fsdp::precision::mixed: master shards are fp32: the second argument must be float");
  static_assert(ElementType<Reduce>,
                "fsdp::precision::mixed: the reduce type has no dtype (use float, fsdp::bfloat16 or fsdp::float16)");
  static_assert(ElementType<Gather>,
                "fsdp::precision::mixed: the gather type has no dtype (use float, fsdp::bfloat16 or fsdp::float16)");
  static_assert(plain_precision(dtype_of_v<Compute>) && plain_precision(dtype_of_v<Reduce>) &&
                    plain_precision(dtype_of_v<Gather>),
                "fsdp::precision::mixed: fp8 values need a scale beside them (their range ends at 448 or 57344), "
                "which a plain precision policy does not keep: gather in fp8 with precision::scaled");
  static_assert(gathers_into(dtype_of_v<Gather>, dtype_of_v<Compute>),
                "fsdp::precision::mixed: the gather type must be the compute type or narrower than it (a gather of "
                "the same width in another dtype rounds twice; a wider one moves more bytes than casting first)");
  using precision_concept = precision_tag;
  using compute_type = Compute;
  using master_type = Master;
  using reduce_type = Reduce;
  using gather_type = Gather;
};

/// Everything in fp32.
using full = mixed<float, float, float>;

/// fp32 compute (the trainer's views and gradients), parameters gathered in `Gather` and widened into the views
/// after the gather, gradients reduced in `Reduce`.
template <class Gather, class Reduce = float>
using wire = mixed<float, float, Reduce, Gather>;

/// Parameters gathered in the 8-bit `Scaled` (fsdp::float8_e4m3, fsdp::float8_e5m2 or std::int8_t) with one fp32
/// scale per block of `Block` elements: each rank quantizes its master shard block by block (scale = the block's
/// largest magnitude over the format's largest value, 448, 57344 or 127; each element divided by it and rounded to
/// the format, saturating), gathers values and scales, and dequantizes every element (its value times its block's
/// scale, rounded to `Compute`) into the compute views. Blocks never cross a shard: model_options::layout.align
/// must be a multiple of `Block`.
///
/// A scaled `Reduce` (the same three types) reduces gradients quantized in blocks of `Block` too, ZeRO++'s qgZ:
/// each rank quantizes its unsharded gradient (pre-divided where the division says so) block by block, into one
/// slice per destination rank (the elements of that rank's shard); an all_to_all gives each rank its shard from
/// every rank; each rank dequantizes them and sums them in fp32 in rank order (an average multiplying each by
/// float(1 / ranks) first, as the fp32 reduce-scatter does) and adds the sum into its fp32 gradient shard. The
/// result is the fp32 reduce-scatter of the ranks' dequantized gradients, bit for bit; its error against the exact
/// one is the quantization's, per rank and element at most half a step of the block's scale (int8: absmax / 254)
/// or half an fp8 unit in the last place, summed over the ranks (docs/policies.md).
template <class Scaled, int Block, class Compute = bfloat16, class Reduce = float>
struct scaled {
  static_assert(ElementType<Scaled> && is_scaled(dtype_of_v<Scaled>),
                "fsdp::precision::scaled: the gather type must be 8 bits wide and scaled (fsdp::float8_e4m3, "
                "fsdp::float8_e5m2 or std::int8_t); "
                "for a plain narrower gather use precision::mixed or precision::wire");
  static_assert(Block > 0 && Block % 4 == 0,
                "fsdp::precision::scaled: the block must be a positive multiple of 4 "
                "elements (each rank's scales stay 4-byte aligned after its values)");
  static_assert(ElementType<Compute> && plain_precision(dtype_of_v<Compute>),
                "fsdp::precision::scaled: the compute type is float, fsdp::bfloat16 or fsdp::float16");
  static_assert(ElementType<Reduce>,
                "fsdp::precision::scaled: the reduce type is float, fsdp::bfloat16 or "
                "fsdp::float16, or a scaled 8-bit type (a quantized reduction)");
  using precision_concept = precision_tag;
  using compute_type = Compute;
  using master_type = float;
  using reduce_type = Reduce;
  using gather_type = Scaled;
  static constexpr int gather_block = Block;
  static constexpr int reduce_block = is_scaled(dtype_of_v<Reduce>) ? Block : 0;
};

}  // namespace precision
}  // namespace fsdp
