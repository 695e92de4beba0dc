#pragma once
// The states of a unit's parameters and the passes a unit can be current in.
#include <cstdint>
#include <string_view>

namespace fsdp {

enum class unit_state : std::uint8_t { sharded, gathering, gathered };
enum class pass_kind : std::uint8_t { none, forward, backward };

constexpr std::string_view name_of(unit_state s) noexcept {
  switch (s) {
    case unit_state::sharded: return "sharded";
    case unit_state::gathering: return "gathering";
    case unit_state::gathered: return "gathered";
  }
  return "?";
}
constexpr std::string_view name_of(pass_kind p) noexcept {
  switch (p) {
    case pass_kind::none: return "none";
    case pass_kind::forward: return "forward";
    case pass_kind::backward: return "backward";
  }
  return "?";
}

}  // namespace fsdp
