#pragma once
// Checksums of checkpoint files: XXH3 (64 bits) from the xxHash library (Debian's libxxhash-dev, used header-only
// through XXH_INLINE_ALL, so nothing is linked and a user's own xxhash.h does not collide). A checkpoint file has
// one checksum per block of block_bytes, so that a rank reading a byte range verifies the blocks it reads and never
// needs the whole file, and one for the whole file: XXH3 of the block checksums. Written as 16 lowercase
// hexadecimal digits.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace fsdp::checkpoint {

/// Bytes per checksummed block of a checkpoint file (the manifest records the value a file was written with).
inline constexpr std::uint64_t default_block_bytes = std::uint64_t{4} << 20;

inline std::uint64_t xxh3(const void* data, std::uint64_t n) noexcept {
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

/// A file's checksum: XXH3 of its blocks' checksums (8 bytes each, little-endian), so that writing and checking
/// it costs no second pass over the data.
inline std::uint64_t file_checksum(const std::vector<std::uint64_t>& blocks) noexcept {
  return xxh3(blocks.data(), blocks.size() * sizeof(std::uint64_t));
}

inline std::string hex64(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
  return s;
}
/// The value of 16 lowercase hexadecimal digits; nothing for any other text.
inline std::optional<std::uint64_t> parse_hex64(std::string_view s) noexcept {
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
