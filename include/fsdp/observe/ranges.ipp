#pragma once
// The profiler ranges' definitions (fsdp/observe/ranges.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <string>
#include <string_view>

#include "fsdp/observe/ranges.hpp"

namespace fsdp::trace {

FSDP_DECL std::string range_name(range_kind k, std::string_view unit) {
  std::string s(name_of(k));
  if (!unit.empty()) {
    s += ' ';
    s += unit;
  }
  return s;
}

}  // namespace fsdp::trace
