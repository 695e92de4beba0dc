#pragma once
// The checksums' definitions (fsdp/checkpoint/checksum.hpp): included by that header, or compiled once under
// FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp). Only this file includes xxhash.h.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "fsdp/checkpoint/checksum.hpp"

namespace fsdp::checkpoint {

FSDP_DECL std::uint64_t xxh3(const void* data, std::uint64_t n) noexcept {
  return XXH3_64bits(data, static_cast<std::size_t>(n));
}

/// XXH3 over bytes given in parts.
class xxh3_stream {
 public:
  xxh3_stream() { XXH3_64bits_reset(&state_); }
  void add(const void* data, std::uint64_t n) noexcept {
    XXH3_64bits_update(&state_, data, static_cast<std::size_t>(n));
  }
  std::uint64_t value() const noexcept { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_{};
};

FSDP_DECL std::uint64_t file_checksum(const std::vector<std::uint64_t>& blocks) noexcept {
  return xxh3(blocks.data(), blocks.size() * sizeof(std::uint64_t));
}

FSDP_DECL std::string hex64(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
  return s;
}
FSDP_DECL std::optional<std::uint64_t> parse_hex64(std::string_view s) noexcept {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return std::nullopt;
    v = v << 4 | static_cast<std::uint64_t>(d);
  }
  return v;
}

}  // namespace fsdp::checkpoint
