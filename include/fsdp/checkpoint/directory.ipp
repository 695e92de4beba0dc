#pragma once
// Checkpoint directories' definitions (fsdp/checkpoint/directory.hpp): included by that header, or compiled once by
// fsdp/checkpoint/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checksum.hpp"
#include "fsdp/checkpoint/directory.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/checkpoint/reads.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::checkpoint {

FSDP_DECL manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  const io::file f = io::open_read(path);
  const std::uint64_t n = f.size();
  if (n > (std::uint64_t{1} << 30))
    io::fail(fsdp::detail::cat("'", path, "' has ", n, " bytes: too large to be a manifest"));
  std::string text(static_cast<std::size_t>(n), '\0');
  f.read_at(text.data(), n, 0);
  return parse_manifest(text, fsdp::detail::cat("the manifest '", path, "'"));
}

FSDP_DECL std::vector<entry> scan(const std::string& root) {
  std::vector<entry> out;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator(root, ec)) {
    if (!d.is_directory()) continue;
    entry e;
    e.path = d.path().string();
    if (e.path.ends_with(".partial")) {
      e.state = entry::status::partial;
    } else if (!std::filesystem::exists(d.path() / "manifest.json")) {
      continue;  // not a checkpoint
    } else {
      try {
        e.step = read_manifest(e.path).step;
        e.state = entry::status::complete;
      } catch (const checkpoint_error& err) {
        e.state = entry::status::unreadable;
        e.problem = std::string(fsdp::detail::unprefixed(err));
      }
    }
    out.push_back(std::move(e));
  }
  if (ec) io::fail(fsdp::detail::cat("could not list the checkpoints in '", root, "': ", ec.message()));
  std::sort(out.begin(), out.end(), [](const entry& a, const entry& b) { return a.path < b.path; });
  return out;
}

FSDP_DECL std::optional<std::string> latest(const std::string& root) {
  std::optional<entry> best;
  for (entry& e : scan(root))
    if (e.state == entry::status::complete && (!best || e.step >= best->step)) best = std::move(e);
  if (!best) return std::nullopt;
  return best->path;
}

FSDP_DECL void check_size(const io::file& f, const file_record& rec) {
  if (const std::uint64_t n = f.size(); n != rec.bytes)
    io::fail(fsdp::detail::cat("'", f.path(), "' has ", n, " bytes; the manifest says ", rec.bytes, ": the file is ",
                               n < rec.bytes ? "truncated" : "longer than written"));
}

FSDP_DECL std::vector<std::string> verify(const std::string& dir) {
  std::vector<std::string> problems;
  manifest m;
  try {
    m = read_manifest(dir);
  } catch (const checkpoint_error& e) {
    return {std::string(fsdp::detail::unprefixed(e))};
  }
  for (const file_record& rec : m.files) {
    const std::string path = dir + "/" + rec.name;
    try {
      const io::file f = io::open_read(path);
      check_size(f, rec);
      std::vector<char> buf;
      for (std::uint64_t at = 0, b = 0; at < rec.bytes; at += rec.block_bytes, ++b) {
        const std::uint64_t len = std::min(rec.block_bytes, rec.bytes - at);
        buf.resize(static_cast<std::size_t>(len));
        f.read_at(buf.data(), len, at);
        check_block(path, b, at, buf.data(), len, rec.blocks);
      }
      if (const std::uint64_t whole = file_checksum(rec.blocks); whole != rec.xxh3)
        io::fail(fsdp::detail::cat("the manifest's checksum of '", path, "' (xxh3 ", hex64(rec.xxh3),
                                   ") is not that of its block checksums (", hex64(whole),
                                   "): the manifest is corrupted"));
    } catch (const checkpoint_error& e) {
      problems.emplace_back(fsdp::detail::unprefixed(e));
    }
  }
  return problems;
}

}  // namespace fsdp::checkpoint
