#pragma once
// Reading only what a rank needs: given where a tensor's elements lie in files (extents), the byte ranges that
// fill one rank's elements [begin, end) (plan_reads), and the reads of one file (read_ranges): nearby ranges are
// read together in chunks of at most chunk_bytes, and, when the file has block checksums, every block a read
// touches is read whole and verified before any byte of it is used. Shared by checkpoint loads and safetensors
// imports.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checksum.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::checkpoint {

/// Elements [begin, end) of one tensor, stored contiguously at byte `offset` of file `file`.
struct extent {
  std::int64_t begin = 0, end = 0;
  std::size_t file = 0;
  std::uint64_t offset = 0;
};

/// `bytes` bytes at byte `offset` of a file, to be copied to `dest`.
struct read_op {
  std::uint64_t offset = 0, bytes = 0;
  char* dest = nullptr;
};

/// Appends to per_file[file] the reads that fill elements [begin, end) of a tensor stored as `extents` (sorted by
/// begin, covering the tensor once: the manifest or header parser checked it), `elem_bytes` each, into `dest`.
inline void plan_reads(const std::vector<extent>& extents, std::int64_t begin, std::int64_t end,
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

/// Block checksums of a file: the loader verifies every block it reads.
struct block_sums {
  std::uint64_t block_bytes = 0;
  const std::vector<std::uint64_t>* sums = nullptr;
};

/// Checks block `index` (`len` bytes at byte `at` of the file `path`) against its checksum in `sums`.
inline void check_block(const std::string& path, std::uint64_t index, std::uint64_t at, const char* data,
                        std::uint64_t len, const std::vector<std::uint64_t>& sums) {
  const std::uint64_t found = xxh3(data, len), want = sums[index];
  if (found != want)
    io::fail(detail::cat("'", path, "': block ", index, " (bytes [", at, ", ", at + len,
                         ")) does not match its checksum in the manifest (xxh3 ", hex64(found), ", expected ",
                         hex64(want), "): the file is corrupted"));
}

/// Performs `ops` on the open file `f` of `file_bytes` bytes (its size was checked). Reads merge ranges less than
/// `gap` bytes apart; with `check`, they grow to whole blocks, each verified against its checksum. A read is at most
/// `chunk_bytes` (4 MiB: a chunk is checksummed while it is still in the CPU's cache, which made loads twice as
/// fast as 64 MiB chunks on the development machine).
inline void read_ranges(const io::file& f, std::uint64_t file_bytes, std::vector<read_op> ops,
                        const block_sums* check = nullptr, std::uint64_t chunk_bytes = std::uint64_t{4} << 20,
                        std::uint64_t gap = std::uint64_t{1} << 20) {
  if (ops.empty()) return;
  std::sort(ops.begin(), ops.end(), [](const read_op& a, const read_op& b) { return a.offset < b.offset; });
  const std::uint64_t align = check ? check->block_bytes : 1;
  chunk_bytes = std::max(chunk_bytes / align * align, align);
  std::vector<char> buf;
  auto run = [&](std::uint64_t lo, std::uint64_t hi, std::size_t first, std::size_t last) {  // ops [first, last)
    std::size_t from = first;  // ops ending before the chunk are done
    for (std::uint64_t at = lo; at < hi; at += chunk_bytes) {
      const std::uint64_t n = std::min(chunk_bytes, hi - at);
      while (from < last && ops[from].offset + ops[from].bytes <= at) ++from;
      // A chunk inside one op is read straight into its destination; otherwise through the buffer.
      const char* data = nullptr;
      std::size_t direct = last;
      for (std::size_t i = from; i < last && ops[i].offset <= at; ++i)
        if (ops[i].offset + ops[i].bytes >= at + n) direct = i;
      if (direct < last) {
        char* d = ops[direct].dest + (at - ops[direct].offset);
        f.read_at(d, n, at);
        data = d;
      } else {
        buf.resize(static_cast<std::size_t>(n));
        f.read_at(buf.data(), n, at);
        data = buf.data();
      }
      if (check)
        for (std::uint64_t b = at; b < at + n; b += align)
          check_block(f.path(), b / align, b, data + (b - at), std::min(align, at + n - b), *check->sums);
      for (std::size_t i = from; i < last && ops[i].offset < at + n; ++i) {
        if (i == direct) continue;
        const read_op& o = ops[i];
        const std::uint64_t s = std::max(o.offset, at), e = std::min(o.offset + o.bytes, at + n);
        if (s < e) std::memcpy(o.dest + (s - o.offset), data + (s - at), static_cast<std::size_t>(e - s));
      }
    }
  };
  std::size_t first = 0;
  std::uint64_t lo = ops[0].offset / align * align, hi = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::uint64_t s = ops[i].offset / align * align;
    const std::uint64_t e = std::min((ops[i].offset + ops[i].bytes + align - 1) / align * align, file_bytes);
    if (i > first && s > hi + gap) {
      run(lo, hi, first, i);
      first = i;
      lo = s;
      hi = 0;
    }
    hi = std::max(hi, e);
  }
  run(lo, hi, first, ops.size());
}

}  // namespace fsdp::checkpoint
