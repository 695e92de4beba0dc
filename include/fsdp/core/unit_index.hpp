#pragma once
// The units of a model by index and by name. Lookups by name that fail list the units, so a typo is easy to see.
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/error.hpp"

namespace fsdp {

class unit_index {
 public:
  unit_index() = default;
  /// Names in unit-index order; they must be unique (make_units guarantees it).
  explicit unit_index(std::vector<std::string> names) : names_(std::move(names)) {
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (!by_name_.emplace(names_[i], i).second) detail::fail_usage("two units are named '", names_[i], "'");
  }

  std::size_t size() const noexcept { return names_.size(); }
  const std::vector<std::string>& names() const noexcept { return names_; }
  const std::string& name(std::size_t i) const { return names_.at(i); }

  std::optional<std::size_t> find(std::string_view name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return std::nullopt;
    return it->second;
  }
  /// The index of `name`; usage_error "no unit named 'x' (units: a, b)" when there is none.
  std::size_t at(std::string_view name) const {
    if (auto i = find(name)) return *i;
    detail::fail_usage("no unit named '", name, "' (units: ", list(), ")");
  }
  /// "a, b, c": the units in index order, for messages.
  std::string list() const {
    std::string s;
    for (const auto& n : names_) s += (s.empty() ? "" : ", ") + n;
    return s;
  }

 private:
  std::vector<std::string> names_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
};

}  // namespace fsdp
