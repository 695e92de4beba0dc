#pragma once
// FNV-1a, 64 bits: the one string hash of the library (initialisation streams keyed by parameter name, the
// digest ranks compare at construction). Not a checksum against tampering; a fingerprint of honest input. And the
// size of that digest on the wire, with the scratch a comparison holds (here, not in fsdp/agree/, so that the memory
// table can count it without depending on the backends agree.hpp needs).
#include <cstddef>
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

namespace agree {

/// A fingerprint's digest on the wire (fsdp/agree/agree.hpp): its FNV-1a hash and its encoded length, 8 bytes each.
inline constexpr std::size_t digest_bytes = 16;

/// The scratch (mem::comm_buffers) one comparison holds at a time when the ranks agree: this rank's digest and every
/// rank's, digest_bytes * (world + 1); none in a group of one. Outside the memory plan: fsdp::memory_row counts it
/// as such under model_options::check_collectives.
constexpr std::int64_t agreement_scratch_bytes(int world) noexcept {
  return world <= 1 ? 0 : std::int64_t(digest_bytes) * (world + 1);
}

}  // namespace agree

}  // namespace fsdp
