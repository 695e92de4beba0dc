#pragma once
// Precision policies: the dtype parameters are gathered and computed in, the dtype of the master shards (always
// fp32) and the dtype gradients are reduced in. Gradients always accumulate into fp32 gradient shards.
//
//   fsdp::precision::full                               everything fp32
//   fsdp::precision::mixed<fsdp::bfloat16>              bf16 gathers and compute, fp32 reduction
//   fsdp::precision::mixed<fsdp::bfloat16, float, fsdp::bfloat16>   bf16 reduction too (half the reduce bytes)
//
// The cast from the fp32 master shard to the compute dtype happens while the shard is copied into this rank's
// slice of the gather buffer; the cast from the compute dtype (or the fp32 no-sync accumulator) to the reduce
// dtype when the reduction's input is prepared; the reduced result is added into the fp32 gradient shard. Every
// cast rounds to nearest even (core/float16.hpp), the same bits on every backend.
#include <concepts>
#include <type_traits>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/float16.hpp"

namespace fsdp {

struct precision_tag {};

/// A precision policy opts in with `using precision_concept = fsdp::precision_tag;` and names three element
/// types (each with a dtype: float, fsdp::bfloat16, fsdp::float16, or CUDA's __nv_bfloat16 / __half). The
/// master type must be float: the library keeps fp32 master shards and fp32 gradient shards.
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
};

/// The policy's dtypes as values, for the code that is not a template (costs, the planner, the executor).
struct precision_facts {
  dtype compute = dtype::f32;  ///< gathered parameters and the unsharded gradients the trainer writes
  dtype master = dtype::f32;   ///< master shards (always f32)
  dtype reduce = dtype::f32;   ///< what the reduction moves
  friend constexpr bool operator==(const precision_facts&, const precision_facts&) = default;
};

template <PrecisionPolicy P>
constexpr precision_facts facts_of_precision() noexcept {
  return {dtype_of_v<typename P::compute_type>, dtype::f32, dtype_of_v<typename P::reduce_type>};
}

namespace precision {

/// Parameters gathered and computed in `Compute`, fp32 master shards, gradients reduced in `Reduce`.
template <class Compute, class Master = float, class Reduce = float>
struct mixed {
  static_assert(ElementType<Compute>,
                "fsdp::precision::mixed: the compute type has no dtype (use float, fsdp::bfloat16 or fsdp::float16)");
  static_assert(std::same_as<Master, float>,
                "fsdp::precision::mixed: master shards are fp32: the second argument must be float");
  static_assert(ElementType<Reduce>,
                "fsdp::precision::mixed: the reduce type has no dtype (use float, fsdp::bfloat16 or fsdp::float16)");
  using precision_concept = precision_tag;
  using compute_type = Compute;
  using master_type = Master;
  using reduce_type = Reduce;
};

/// Everything in fp32.
using full = mixed<float, float, float>;

}  // namespace precision
}  // namespace fsdp
