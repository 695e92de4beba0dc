#pragma once
// The ranged reads' definitions (fsdp/checkpoint/reads.hpp): included by that header, or compiled once under
// FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checksum.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/reads.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::checkpoint {

FSDP_DECL void plan_reads(const std::vector<extent>& extents, std::int64_t begin, std::int64_t end,
                          std::uint64_t elem_bytes, char* dest, std::vector<std::vector<read_op>>& per_file) {
  auto it = std::upper_bound(extents.begin(), extents.end(), begin,
                             [](std::int64_t v, const extent& e) { return v < e.begin; });
  if (it != extents.begin()) --it;
  for (; it != extents.end() && it->begin < end; ++it) {
    const std::int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->end);
    if (lo >= hi) continue;
    per_file[it->file].push_back({it->offset + static_cast<std::uint64_t>(lo - it->begin) * elem_bytes,
                                  static_cast<std::uint64_t>(hi - lo) * elem_bytes,
                                  dest + static_cast<std::uint64_t>(lo - begin) * elem_bytes});
  }
}

FSDP_DECL void check_block(const std::string& path, std::uint64_t index, std::uint64_t at, const char* data,
                           std::uint64_t len, const std::vector<std::uint64_t>& sums) {
  const std::uint64_t found = xxh3(data, len), want = sums[index];
  if (found != want)
    io::fail(fsdp::detail::cat("'", path, "': block ", index, " (bytes [", at, ", ", at + len,
                         ")) does not match its checksum in the manifest (xxh3 ", hex64(found), ", expected ",
                         hex64(want), "): the file is corrupted"));
}

FSDP_DECL void read_ranges(const io::file& f, std::uint64_t file_bytes, std::vector<read_op> ops,
                           const block_sums* check) {
  host_sink sink;
  read_ranges(f, file_bytes, std::move(ops), sink, check);
}

}  // namespace fsdp::checkpoint
