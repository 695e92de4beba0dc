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

FSDP_DECL report report_of(const verdict& v, const float* table, int rows, int world, std::size_t units,
                           const std::vector<std::size_t>& backward, const std::vector<std::string>& names) {
  report r;
  r.inspected = true;
  r.located = rows == world;
  r.loss_scale = v.loss_scale;
  r.norm = v.norm;
  r.skipped = v.skipped != 0;
  r.clip_coef = v.clip_coef;
  r.grad_scale = v.grad_scale;
  if (r.skipped && r.located) {
    for (int q = 0; q < world && !r.nonfinite; ++q)
      for (std::size_t u : backward)
        if (!std::isfinite(table[static_cast<std::size_t>(q) * units + u])) {
          r.nonfinite = location{q, u, names[u], 0};
          break;
        }
    if (r.nonfinite)
      for (std::size_t i = 0; i < static_cast<std::size_t>(rows) * units; ++i)
        r.nonfinite->count += std::isfinite(table[i]) ? 0 : 1;
  }
  return r;
}

FSDP_DECL std::string report::message() const {
  if (captured) return "captured, not run: each replay decides on the device";
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
