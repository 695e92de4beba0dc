#pragma once
// Precision policies: the dtype parameters are computed in, the dtype of the master shards, and the dtype
// gradients are reduced in.
#include <concepts>
#include <type_traits>

#include "fsdp/core/dtype.hpp"

namespace fsdp {

struct precision_tag {};

template <class P>
concept PrecisionPolicy = requires {
  typename P::precision_concept;
  requires std::same_as<typename P::precision_concept, precision_tag>;
  typename P::compute_type;
  typename P::master_type;
  typename P::reduce_type;
};

namespace precision {

/// Everything in fp32.
struct full {
  using precision_concept = precision_tag;
  using compute_type = float;
  using master_type = float;
  using reduce_type = float;
};

}  // namespace precision
}  // namespace fsdp
