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

#include "fsdp/core/config.hpp"

namespace fsdp::checkpoint {

/// Bytes per checksummed block of a checkpoint file (the manifest records the value a file was written with).
inline constexpr std::uint64_t default_block_bytes = std::uint64_t{4} << 20;

FSDP_DECL std::uint64_t xxh3(const void* data, std::uint64_t n) noexcept;

/// A file's checksum: XXH3 of its blocks' checksums (8 bytes each, little-endian), so that writing and checking
/// it costs no second pass over the data.
FSDP_DECL std::uint64_t file_checksum(const std::vector<std::uint64_t>& blocks) noexcept;

FSDP_DECL std::string hex64(std::uint64_t v);
/// The value of 16 lowercase hexadecimal digits; nothing for any other text.
FSDP_DECL std::optional<std::uint64_t> parse_hex64(std::string_view s) noexcept;

}  // namespace fsdp::checkpoint

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/checksum.ipp"
#endif
