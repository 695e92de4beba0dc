#pragma once
// Little-endian integers in byte strings: the fingerprint's encoding and the ranks' digests (fsdp/agree/).
#include <cstdint>
#include <string>
#include <string_view>

namespace fsdp::detail {

/// Appends `v` as 8 bytes, least significant first.
inline void put_u64le(std::string& out, std::uint64_t v) {
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
}
/// The 8 bytes at `at` of `in` (the caller checks they exist), least significant first.
inline std::uint64_t get_u64le(std::string_view in, std::size_t at) noexcept {
  std::uint64_t v = 0;
  for (int b = 0; b < 8; ++b) v |= std::uint64_t(static_cast<unsigned char>(in[at + b])) << (8 * b);
  return v;
}

}  // namespace fsdp::detail
