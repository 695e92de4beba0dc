#pragma once
// The units of a model by index and by name. Lookups by name that fail list the units, so a typo is easy to see.
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/config.hpp"

namespace fsdp {

class unit_index {
 public:
  unit_index() = default;
  /// Names in unit-index order; they must be unique (make_units guarantees it).
  explicit unit_index(std::vector<std::string> names);

  std::size_t size() const noexcept { return names_.size(); }
  const std::vector<std::string>& names() const noexcept { return names_; }
  const std::string& name(std::size_t i) const { return names_.at(i); }

  std::optional<std::size_t> find(std::string_view name) const;
  /// The index of `name`; usage_error "no unit named 'x' (units: a, b)" when there is none.
  std::size_t at(std::string_view name) const;
  /// "a, b, c": the units in index order, for messages.
  std::string list() const;

 private:
  std::vector<std::string> names_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
};

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/core/unit_index.ipp"
#endif
