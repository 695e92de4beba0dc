#pragma once
// Sharded checkpoints: every rank writes its shards of the fp32 master parameters and of the optimizer's state in
// parallel; a load, on any world size, mesh and sharding strategy, reads only the byte ranges its own shards need.
//
//   checkpoint::save(model, opt, "run/ckpt-000100", {.metadata = {...}, .loss_scaler = &scaler});
//   checkpoint::load(model, opt, *checkpoint::latest("run"), {.loss_scaler = &scaler});
//
// A checkpoint is a directory: manifest.json (fsdp/checkpoint/manifest.hpp) and one file per rank of the first
// replica, shard-00001-of-00004.bin, holding that rank's elements of every parameter and optimizer state as raw
// fp32, piece by piece, in global element order (not the flat layout's: so any layout can read them).
//
// Save is atomic: the files are written into "<dir>.partial", flushed (fsync) and checksummed (XXH3 per file and
// per 4 MiB block); rank 0 then writes the manifest and renames the directory to <dir>, the commit. A crash before
// the rename leaves the previous checkpoints untouched and a "<dir>.partial" that latest() ignores and the next
// save of <dir> replaces. A load verifies every block it reads. Every failure (a write, a missing, truncated or
// corrupted file, a manifest that does not parse, a tensor missing, unexpected or of another shape, ranks that
// disagree on the directory or step) is a checkpoint_error (usage_error for misuse) thrown on every rank
// together; a load that throws has modified nothing, unless load_options::in_place let it write before its last
// read (then the model refuses every use but a load until one succeeds).
//
// Saved: master parameters, optimizer state and update count, Model::step_count(), the loss scaler (when given),
// the user's metadata strings. Not saved: gradients (save and load happen between steps; a load zeroes them), the
// trainer's data position and RNG (keep them in the metadata), the optimizer's options (the trainer's code).
//
// The parts: options.hpp (what save and load take), directory.hpp (manifests, scan, latest, verify: no model),
// detail/save.hpp and detail/load.hpp (the two protocols), detail/shared.hpp (what they and safetensors.hpp share).
#include <string>

#include "fsdp/checkpoint/detail/load.hpp"
#include "fsdp/checkpoint/detail/save.hpp"
#include "fsdp/checkpoint/detail/shared.hpp"
#include "fsdp/checkpoint/directory.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/checkpoint/options.hpp"

namespace fsdp::checkpoint {

/// Collective: saves the model's master parameters and `opt`'s state into the new directory `dir` (see above).
template <class M, StatefulOptimizer O>
void save(M& model, const O& opt, const std::string& dir, const save_options& options = {}) {
  detail::save(model, &opt, dir, options);
}
/// Collective: saves the master parameters alone (no optimizer state: a load then resumes no optimizer).
template <class M>
void save(M& model, const std::string& dir, const save_options& options = {}) {
  detail::save(model, static_cast<const detail::no_optimizer*>(nullptr), dir, options);
}
/// Collective: a resume. Replaces the master parameters, `opt`'s state and update count, the model's step count
/// and (options.loss_scaler) the scaler with the checkpoint's, on any world size, mesh and strategy. Returns the
/// manifest (its metadata, step, ...).
template <class M, StatefulOptimizer O>
manifest load(M& model, O& opt, const std::string& dir, const load_options& options = {}) {
  return detail::load(model, &opt, dir, options);
}
/// Collective: replaces the master parameters alone (fine-tuning from a checkpoint); optimizer state, step counts
/// and gradients stay as they are, except that gradients are zeroed.
template <class M>
manifest load(M& model, const std::string& dir, const load_options& options = {}) {
  return detail::load(model, static_cast<detail::no_optimizer*>(nullptr), dir, options);
}

}  // namespace fsdp::checkpoint
