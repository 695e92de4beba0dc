#pragma once
// The safetensors format (as the `safetensors` package reads and writes it): an 8-byte little-endian header length
// N, N bytes of UTF-8 JSON, then the data. The header maps each tensor's name to {"dtype", "shape",
// "data_offsets": [begin, end]} (bytes of the data section); an optional "__metadata__" maps strings to strings.
//
// parse_header() checks everything a reader relies on and the format's rules, as the `safetensors` package does
// (that no name appears twice, that every dtype is known, that the shape's element count times the dtype's size is
// the byte count, that the tensors tile the data section exactly: in order of offset, the first at byte 0, each
// beginning where the one before ends, the last ending at the section's end), so that an import never trusts an
// unchecked number and never reads a file the package refuses; every problem names the tensor; make_header() writes one
// padded with spaces to a multiple of 8 bytes, as the package does, so that the data section stays aligned.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::safetensors {

/// The largest header this library reads (the safetensors package's own limit).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

struct tensor_info {
  std::string name;
  std::string dtype;  ///< "F32", "BF16", "F16", ... as the format names them
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  ///< bytes of the data section
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
  friend bool operator==(const tensor_info&, const tensor_info&) = default;
};

struct header {
  std::vector<tensor_info> tensors;  ///< by name
  std::map<std::string, std::string> metadata;
  const tensor_info* find(std::string_view name) const;
};

/// Bytes per element of a safetensors dtype; 0 for a name the format does not have.
FSDP_DECL std::uint64_t dtype_bytes(std::string_view d) noexcept;

/// The header length a file of `file_size` bytes starts with (`first` holds its first min(8, file_size) bytes),
/// checked against the file's size and max_header_bytes; `doc` names the file in errors.
FSDP_DECL std::uint64_t header_length(std::string_view first, std::uint64_t file_size, const std::string& doc);

/// Parses and checks a header's JSON text for a data section of `data_bytes` bytes; `doc` names the file in errors.
FSDP_DECL header parse_header(std::string_view text, std::uint64_t data_bytes, const std::string& doc);

/// The bytes that start a file: the length and the header JSON, padded with spaces to a multiple of 8.
FSDP_DECL std::string make_header(const std::vector<tensor_info>& tensors,
                                  const std::map<std::string, std::string>& metadata);

}  // namespace fsdp::safetensors

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/safetensors_header.ipp"
#endif
