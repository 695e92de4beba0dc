#pragma once
// The shared checkpoint parts' definitions (fsdp/checkpoint/detail/shared.hpp): included by that header, or compiled
// once by fsdp/checkpoint/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checksum.hpp"
#include "fsdp/checkpoint/detail/shared.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/core/bytes.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::checkpoint::detail {

FSDP_DECL std::string shard_file_name(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.bin", index, count);
  return buf;
}

FSDP_DECL std::string normalised(std::string dir) {
  if (dir.empty()) fsdp::detail::fail_usage("checkpoint directory: the path is empty");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

FSDP_DECL block_writer::block_writer(io::file f, std::uint64_t block_bytes, const fault_hook& fault, int rank)
    : f_(std::move(f)),
      block_(block_bytes),
      flush_at_(std::max(block_bytes, std::uint64_t{16} << 20) / block_bytes * block_bytes),
      fault_(fault),
      rank_(rank) {}

FSDP_DECL void block_writer::append(const void* data, std::uint64_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (buf_.empty() && n >= block_) {
      const std::uint64_t whole = n / block_ * block_;
      write_blocks(p, whole);
      p += whole;
      n -= whole;
      continue;
    }
    // Fill the buffer; when a large piece follows, only up to the next block boundary, then write it.
    const std::uint64_t cap = n >= block_ ? (buf_.size() / block_ + 1) * block_ : flush_at_;
    const std::uint64_t take = std::min(n, cap - buf_.size());
    buf_.insert(buf_.end(), p, p + take);
    p += take;
    n -= take;
    if (buf_.size() == cap) {
      write_blocks(buf_.data(), buf_.size());
      buf_.clear();
    }
  }
}

FSDP_DECL void block_writer::finish(file_record& rec) {
  write_blocks(buf_.data(), buf_.size());
  buf_.clear();
  if (fault_) fault_({rank_, "fsync", f_.path()});
  f_.sync();
  f_.close();
  rec.bytes = written_;
  rec.xxh3 = file_checksum(blocks_);
  rec.block_bytes = block_;
  rec.blocks = std::move(blocks_);
}

FSDP_DECL void block_writer::write_blocks(const char* p, std::uint64_t n) {
  if (n == 0) return;
  for (std::uint64_t at = 0; at < n; at += block_) blocks_.push_back(xxh3(p + at, std::min(block_, n - at)));
  if (fault_) fault_({rank_, "write", f_.path()});
  f_.write_at(p, n, written_);
  written_ += n;
}

FSDP_DECL void put_str(std::string& out, std::string_view s) {
  fsdp::detail::put_u64le(out, s.size());
  out += s;
}

FSDP_DECL std::string encode(const file_record& r) {
  std::string out;
  put_str(out, r.name);
  for (std::uint64_t v : {static_cast<std::uint64_t>(r.rank), r.bytes, r.xxh3, r.block_bytes,
                          static_cast<std::uint64_t>(r.blocks.size()), static_cast<std::uint64_t>(r.pieces.size())})
    fsdp::detail::put_u64le(out, v);
  for (std::uint64_t b : r.blocks) fsdp::detail::put_u64le(out, b);
  for (const piece_record& p : r.pieces) {
    put_str(out, p.tensor);
    put_str(out, p.kind);
    fsdp::detail::put_u64le(out, static_cast<std::uint64_t>(p.begin));
    fsdp::detail::put_u64le(out, static_cast<std::uint64_t>(p.end));
    fsdp::detail::put_u64le(out, p.offset);
  }
  return out;
}

FSDP_DECL file_record decode(std::string_view in) {
  std::size_t at = 0;
  auto u64 = [&] {
    const std::uint64_t v = fsdp::detail::get_u64le(in, at);
    at += 8;
    return v;
  };
  auto str = [&] {
    const std::size_t n = static_cast<std::size_t>(u64());
    std::string s(in.substr(at, n));
    at += n;
    return s;
  };
  file_record r;
  r.name = str();
  r.rank = static_cast<int>(u64());
  r.bytes = u64();
  r.xxh3 = u64();
  r.block_bytes = u64();
  const std::uint64_t blocks = u64(), pieces = u64();
  for (std::uint64_t b = 0; b < blocks; ++b) r.blocks.push_back(u64());
  for (std::uint64_t k = 0; k < pieces; ++k) {
    piece_record p;
    p.tensor = str();
    p.kind = str();
    p.begin = static_cast<std::int64_t>(u64());
    p.end = static_cast<std::int64_t>(u64());
    p.offset = u64();
    r.pieces.push_back(std::move(p));
  }
  return r;
}

}  // namespace fsdp::checkpoint::detail
