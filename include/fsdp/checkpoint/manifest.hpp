#pragma once
// The manifest of a sharded checkpoint (manifest.json in its directory): what was saved, by whom and where.
//
//   format, version      "fsdp-checkpoint", 2
//   step                 Model::step_count() at the save
//   optimizer            {"name": "adamw", "steps": 12, "states": ["exp_avg", "exp_avg_sq"]} (steps: updates
//                        applied, skipped ones not counted); null when only parameters were saved
//   loss_scaler          {"scale": 32768.0, "good_steps": 3}, or null
//   metadata             the user's {"key": "value"} strings
//   world, mesh, strategy, compute_dtype    how the saving run was laid out (informative: a load reshards); mesh:
//                        {"replicas", "shards", "tensor"} (tensor absent: 1)
//   tensors              every stored parameter in spec order: {"name", "dtype": "F32", "shape" (global),
//                        "placement": "replicated", "partial_grad" or "split(d)" (across the saving run's tensor
//                        group, informative; absent: replicated)}; ties: {alias: target}
//   files                one per writing rank: {"name", "rank", "bytes", "xxh3" (of the block checksums),
//   "block_bytes", "blocks": [xxh3 of
//                        each block], "pieces": [{"tensor", "kind", "begin", "end", "offset"}]}: elements
//                        [begin, end) of the tensor's `kind` ("param", or an optimizer state's name; row-major over
//                        its global shape) as raw little-endian fp32 at byte `offset` of the file
//   manifest_xxh3        the manifest's own checksum, always its last member: XXH3-64 of the file's bytes with the
//                        16 digits of this value (the last "manifest_xxh3" member of the text) read as '0's, so
//                        every byte of the file is covered: the step count, the optimizer's update count and the
//                        metadata as much as the shards' checksums
//
// parse_manifest() first checks the file against its checksum (a manifest changed by even one byte after it was
// written is refused, naming the file), then everything a load relies on (types, ranges, names, that the pieces of
// every tensor and kind cover it exactly once and lie inside their file, the block count), so that a load never
// trusts a number it has not checked; every problem is a checkpoint_error naming the manifest and the field.
// Version 1 manifests (before the checksum) are refused as having none.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/checkpoint/checksum.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/spec/placement.hpp"

namespace fsdp::checkpoint {

/// The kind of the parameters' own values; optimizer states are named by the optimizer.
inline constexpr std::string_view param_kind = "param";
inline constexpr int manifest_version = 2;

/// The kinds of values saved per parameter: "param", then an optimizer's states in order.
FSDP_DECL std::vector<std::string> kinds_with(const std::vector<std::string>& states);

struct piece_record {
  std::string tensor;
  std::string kind;
  std::int64_t begin = 0, end = 0;  ///< elements of the tensor
  std::uint64_t offset = 0;         ///< byte in the file
  std::uint64_t bytes() const noexcept { return static_cast<std::uint64_t>(end - begin) * 4; }
  friend bool operator==(const piece_record&, const piece_record&) = default;
};

struct file_record {
  std::string name;  ///< in the checkpoint directory
  int rank = 0;
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
  std::uint64_t block_bytes = default_block_bytes;
  std::vector<std::uint64_t> blocks;  ///< xxh3 of each block_bytes block (the last one may be shorter)
  std::vector<piece_record> pieces;
  friend bool operator==(const file_record&, const file_record&) = default;
};

struct tensor_record {
  std::string name;
  std::vector<std::int64_t> shape;  ///< global
  tensor_placement placement{};     ///< in the saving run (informative: pieces are in global element order)
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
  friend bool operator==(const tensor_record&, const tensor_record&) = default;
};

struct optimizer_record {
  std::string name;
  std::int64_t steps = 0;
  std::vector<std::string> states;
  friend bool operator==(const optimizer_record&, const optimizer_record&) = default;
};

struct scaler_record {
  float scale = 1.0f;
  int good_steps = 0;
  friend bool operator==(const scaler_record&, const scaler_record&) = default;
};

struct manifest {
  std::uint64_t step = 0;
  std::optional<optimizer_record> optimizer;
  std::optional<scaler_record> loss_scaler;
  std::map<std::string, std::string> metadata;
  int world = 1, replicas = 1, shards = 1;
  int tensor_ranks = 1;  ///< the mesh's tensor dimension (model_options::tensor_parallel)
  std::string strategy, compute_dtype;
  std::vector<tensor_record> tensors;
  std::map<std::string, std::string> ties;
  std::vector<file_record> files;
  friend bool operator==(const manifest&, const manifest&) = default;

  /// The kinds every tensor has pieces of: "param", then the optimizer's states.
  std::vector<std::string> kinds() const;
  const tensor_record* tensor(std::string_view name) const;
};

/// `text` (a manifest's JSON, whose "manifest_xxh3" member holds any 16 characters) with that member set to the
/// text's checksum. For code that writes a manifest itself (to_json does it); a text without the member is a
/// usage_error.
FSDP_DECL std::string seal_manifest(std::string text);

/// Throws a checkpoint_error naming `doc` unless `text` matches its own checksum (see the top of the file).
FSDP_DECL void verify_manifest_checksum(std::string_view text, const std::string& doc);

/// The manifest's file text: its fields in the order above, sealed with its checksum.
FSDP_DECL std::string to_json(const manifest& m);

/// Checks a manifest against its checksum, then parses and checks its fields; `doc` names it in errors ("the
/// manifest 'ck/manifest.json'").
FSDP_DECL manifest parse_manifest(std::string_view text, const std::string& doc);

}  // namespace fsdp::checkpoint

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/manifest.ipp"
#endif
