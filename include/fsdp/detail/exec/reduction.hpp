#pragma once
// How a reduction divides (model_options::division): the collective's op, the factor applied before it (in the
// cast of its input, or in place) and the factor applied after it (while adding into the fp32 gradient shard).
#include "fsdp/comm/concept.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/options/model_options.hpp"

namespace fsdp::detail::exec {

struct reduce_facts {
  reduce_op op = reduce_op::avg;
  float prescale = 1.0f;
  float postscale = 1.0f;
};

/// The reduce facts of a division over `ranks` ranks; a pre-division factor that is not > 0 (or an unknown mode)
/// goes to `p`, and the facts are then an average's.
FSDP_DECL reduce_facts division_facts(const grad_division& d, int ranks, problems& p);
/// division_facts, throwing a mistake as a usage_error.
FSDP_DECL reduce_facts division_facts(const grad_division& d, int ranks);

}  // namespace fsdp::detail::exec

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/detail/exec/reduction.ipp"
#endif
