#pragma once
// FNV-1a, 64 bits: the one string hash of the library (initialisation streams keyed by parameter name, the
// digest ranks compare at construction). Not a checksum against tampering; a fingerprint of honest input.
#include <cstdint>
#include <string_view>

namespace fsdp {

constexpr std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = 1469598103934665603ull) noexcept {
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace fsdp
