#pragma once
// Little-endian integers in byte strings, whatever the machine's byte order: the fingerprint's encoding and the
// ranks' digests (fsdp/agree/), a sequence packer's state (fsdp/data/packer_state.hpp).
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace fsdp::detail {

/// Appends `v` as sizeof(T) bytes, least significant first (two's complement for signed T).
template <std::integral T>
void put_le(std::string& out, T v) {
  const auto u = static_cast<std::make_unsigned_t<T>>(v);
  for (std::size_t b = 0; b < sizeof(T); ++b) out.push_back(static_cast<char>((u >> (8 * b)) & 0xff));
}
/// The sizeof(T) bytes at `at` of `in` (the caller checks they exist), least significant first.
template <std::integral T>
T get_le(std::string_view in, std::size_t at) noexcept {
  std::make_unsigned_t<T> u = 0;
  for (std::size_t b = 0; b < sizeof(T); ++b)
    u |= static_cast<std::make_unsigned_t<T>>(static_cast<unsigned char>(in[at + b])) << (8 * b);
  return static_cast<T>(u);
}

inline void put_u64le(std::string& out, std::uint64_t v) { put_le(out, v); }
inline std::uint64_t get_u64le(std::string_view in, std::size_t at) noexcept { return get_le<std::uint64_t>(in, at); }

}  // namespace fsdp::detail
