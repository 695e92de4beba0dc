#pragma once
// The tensor view's definitions (fsdp/unit/tensor_view.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include "fsdp/core/error.hpp"
#include "fsdp/unit/tensor_view.hpp"

namespace fsdp {

FSDP_DECL void view_check::stale() const {
  if (grad)
    detail::fail_usage("a gradient view of '", *param, "' of unit '", *unit,
                       "' was used after the unit's backward ended (model_options::check_views): its gradient went "
                       "to the reduction and its memory to another unit. Write the gradient while the unit is "
                       "current in model.backward(), through a view asked for there");
  detail::fail_usage("a view of parameter '", *param, "' of unit '", *unit,
                     "' was used after the unit released its gathered parameters (model_options::check_views): its "
                     "memory now holds another unit's parameters. Ask unit.param(\"", *param,
                     "\") again while the unit is gathered, inside model.forward() or model.backward()");
}

}  // namespace fsdp
