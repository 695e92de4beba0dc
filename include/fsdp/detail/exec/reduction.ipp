#pragma once
// The reduction facts' definitions (fsdp/detail/exec/reduction.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cmath>

#include "fsdp/core/problems.hpp"
#include "fsdp/detail/exec/reduction.hpp"

namespace fsdp::detail::exec {

FSDP_DECL reduce_facts division_facts(const grad_division& d, int ranks, problems& p) {
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

FSDP_DECL reduce_facts division_facts(const grad_division& d, int ranks) {
  problems p;
  const reduce_facts r = division_facts(d, ranks, p);
  p.require();
  return r;
}

}  // namespace fsdp::detail::exec
