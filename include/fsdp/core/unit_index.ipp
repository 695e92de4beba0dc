#pragma once
// The unit index's definitions (fsdp/core/unit_index.hpp): included by that header, or compiled once by fsdp/src.hpp
// under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/core/unit_index.hpp"

namespace fsdp {

FSDP_DECL unit_index::unit_index(std::vector<std::string> names) : names_(std::move(names)) {
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (!by_name_.emplace(names_[i], i).second) detail::fail_usage("two units are named '", names_[i], "'");
}

FSDP_DECL std::optional<std::size_t> unit_index::find(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

FSDP_DECL std::size_t unit_index::at(std::string_view name) const {
  if (auto i = find(name)) return *i;
  detail::fail_usage("no unit named '", name, "' (units: ", list(), ")");
}

FSDP_DECL std::string unit_index::list() const {
  std::string s;
  for (const auto& n : names_) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace fsdp
