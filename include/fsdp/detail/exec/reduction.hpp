#pragma once
// How a reduction divides (model_options::division): the collective's op, the factor applied before it (in the
// cast of its input, or in place) and the factor applied after it (while adding into the fp32 gradient shard).
#include "fsdp/comm/concept.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/mesh.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/options/model_options.hpp"

namespace fsdp::detail::exec {

struct reduce_facts {
  reduce_op op = reduce_op::avg;
  float prescale = 1.0f;
  float postscale = 1.0f;
};

/// Where a unit's gathers and reductions go and how its reduction divides: this rank's place in the unit's shard
/// group (the shard group, or for an expert unit the expert shard group: detail/exec/groups.hpp) and the division.
struct unit_place {
  int shard_rank = 0;
  reduce_facts reduce{};
};
/// The dense units' place and the expert units' (FlatLayout::experts).
struct unit_places {
  unit_place dense;
  unit_place experts;
  const unit_place& of(bool expert_unit) const noexcept { return expert_unit ? experts : dense; }
};

/// The reduce facts of a division over `ranks` ranks; a pre-division factor that is not > 0 (or an unknown mode)
/// goes to `p`, and the facts are then an average's.
FSDP_DECL reduce_facts division_facts(const grad_division& d, int ranks, problems& p);
/// division_facts, throwing a mistake as a usage_error.
FSDP_DECL reduce_facts division_facts(const grad_division& d, int ranks);
/// An expert unit's reduction under the dense units' facts `dense`, with `expert` ranks to an expert group: an
/// expert's gradient on its rank already sums what the tokens of its whole expert group contributed (the trainer's
/// all_to_all brings them), so it is summed over the expert shard group and divided by every data-parallel rank,
/// as a dense gradient is: an average over the expert shard group, then divided by `expert` (the other divisions
/// already divide by every data-parallel rank).
constexpr reduce_facts expert_facts(reduce_facts dense, int expert) noexcept {
  if (dense.op == reduce_op::avg && expert > 1) dense.postscale /= static_cast<float>(expert);
  return dense;
}
/// Rank `rank`'s places on mesh `m` under division `d` (which divides by every data-parallel rank).
inline unit_places places_of(const device_mesh& m, int rank, const grad_division& d) {
  const reduce_facts dense = division_facts(d, m.data_parallel());
  return {{m.shard_rank(rank), dense}, {m.expert_shard_rank(rank), expert_facts(dense, m.expert)}};
}

}  // namespace fsdp::detail::exec

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/detail/exec/reduction.ipp"
#endif
