#pragma once
// Checkpoint directories without a model: reading a manifest, listing the checkpoints under a root, the latest one,
// and verifying every file of one (fsdp/checkpoint/checkpoint.hpp saves and loads them). No rank-collective.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/core/config.hpp"

namespace fsdp::checkpoint {

/// A checkpoint directory found by scan().
struct entry {
  std::string path;
  enum class status : std::uint8_t { complete, partial, unreadable } state = status::partial;
  std::uint64_t step = 0;  ///< complete only
  std::string problem;     ///< unreadable: why
};

/// Reads and checks `dir`/manifest.json (no rank-collective: any process may call it).
FSDP_DECL manifest read_manifest(const std::string& dir);

/// The checkpoint directories under `root`, by name: complete (a manifest that parses), partial (a save that did
/// not commit: the name ends in ".partial") or unreadable (with the reason).
FSDP_DECL std::vector<entry> scan(const std::string& root);

/// The complete checkpoint under `root` with the highest step (the last by name among equal steps), or nothing.
/// Partial saves are ignored; so are unreadable ones (scan() lists them with the reason).
FSDP_DECL std::optional<std::string> latest(const std::string& root);

/// The open checkpoint file `f` has the size its record says.
FSDP_DECL void check_size(const io::file& f, const file_record& rec);

/// Reads every file of the checkpoint `dir` whole and checks its size, whole-file and block checksums (a tool, for
/// one process: a load checks only the blocks it reads). Returns the problems found, empty when there are none.
FSDP_DECL std::vector<std::string> verify(const std::string& dir);

}  // namespace fsdp::checkpoint

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/directory.ipp"
#endif
