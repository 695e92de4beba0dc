#pragma once
// How a reduction divides (model_options::division): the collective's op, the factor applied before it (in the
// cast of its input, or in place) and the factor applied after it (while adding into the fp32 gradient shard).
#include <cmath>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/options/model_options.hpp"

namespace fsdp::exec {

struct reduce_facts {
  reduce_op op = reduce_op::avg;
  float prescale = 1.0f;
  float postscale = 1.0f;
};

/// The reduce facts of a division over `ranks` ranks; a pre-division factor that is not > 0 (or an unknown mode)
/// goes to `p`, and the facts are then an average's.
inline reduce_facts division_facts(const grad_division& d, int ranks, problems& p) {
  switch (d.how) {
    case grad_division::mode::average: return {reduce_op::avg, 1.0f, 1.0f};
    case grad_division::mode::sum: return {reduce_op::sum, 1.0f, 1.0f};
    case grad_division::mode::pre_post: {
      float f = d.pre_factor;
      if (f == 0.0f) {
        int k = 1;
        while (ranks > 0 && ranks % k == 0 && ranks / k > k) k *= 2;
        f = static_cast<float>(k);
      }
      if (!(f > 0.0f) || !std::isfinite(f)) {
        p.add("model_options::division.pre_factor must be > 0 (or 0 to pick it), got ", d.pre_factor);
        return {};
      }
      return {reduce_op::sum, 1.0f / f, f / static_cast<float>(ranks)};
    }
  }
  p.add("model_options::division: unknown mode ", static_cast<int>(d.how));
  return {};
}
/// division_facts, throwing a mistake as a usage_error.
inline reduce_facts division_facts(const grad_division& d, int ranks) {
  problems p;
  const reduce_facts r = division_facts(d, ranks, p);
  p.require();
  return r;
}

}  // namespace fsdp::exec
