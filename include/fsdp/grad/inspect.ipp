#pragma once
// The gradient inspection's definitions (fsdp/grad/inspect.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cmath>

#include "fsdp/core/error.hpp"
#include "fsdp/grad/inspect.hpp"

namespace fsdp::grad {

FSDP_DECL void check(const options& o) {
  if (!(o.max_norm >= 0.0f) || !std::isfinite(o.max_norm))
    detail::fail_usage("grad::options::max_norm must be finite and >= 0 (0 = no clipping), got ", o.max_norm);
}

FSDP_DECL std::string report::message() const {
  if (!skipped) return detail::cat("gradient norm ", norm, (clip_coef < 1.0f ? ", clipped" : ""));
  if (!nonfinite)
    return detail::cat("non-finite gradients (", located ? "every shard's squared norm is finite, their sum overflows"
                                                         : "the global squared norm is not finite",
                       "): the step was skipped on every rank",
                       located ? "" : "; set grad::options::locate_nonfinite to name the rank and unit");
  return detail::cat("non-finite gradient on rank ", nonfinite->rank, " in unit '", nonfinite->unit_name, "' (index ",
                     nonfinite->unit, "; first in backward order, ", nonfinite->count,
                     " unit shard(s) non-finite in all): the step was skipped on every rank");
}

}  // namespace fsdp::grad
