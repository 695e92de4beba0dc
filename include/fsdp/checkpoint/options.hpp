#pragma once
// What checkpoint::save and checkpoint::load take (fsdp/checkpoint/checkpoint.hpp): the optimizer's interface and
// the options of each.
#include <bit>
#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/grad/loss_scaler.hpp"
#include "fsdp/optim/stateful.hpp"

namespace fsdp::checkpoint {

static_assert(std::endian::native == std::endian::little, "checkpoint files hold little-endian fp32 values");

/// What checkpoint::save and load need of an optimizer (fsdp/optim/stateful.hpp).
using optim::StatefulOptimizer;

struct save_options {
  std::map<std::string, std::string> metadata{};    ///< the trainer's strings (UTF-8), kept in the manifest
  const grad::loss_scaler* loss_scaler = nullptr;   ///< its scale and good-step count are kept
  std::uint64_t block_bytes = default_block_bytes;  ///< checksummed block size: a power of two in [4 KiB, 1 GiB]
  fault_hook fault{};                               ///< tests: called before each file-system change
};

struct load_options {
  /// Restored from the checkpoint. A resume (a load with an optimizer) requires it exactly when the checkpoint
  /// holds a scaler's state; a parameters-only load ignores the checkpoint's scaler unless one is given.
  grad::loss_scaler* loss_scaler = nullptr;
  /// Reads straight into the model's memory where the backend's is host memory (backend::host), otherwise (CUDA)
  /// through two reused 4 MiB host buffers uploaded while the next is read: no host copy of the shards, at the
  /// speed of the reads. The price: a read or checksum that fails after the first byte was written leaves the
  /// parameters (and the optimizer's state) torn, and the model then refuses every use but another
  /// checkpoint::load (with the optimizer, if this one had it) until one succeeds. Everything else that can refuse
  /// a load (the manifest, the model's fit, the files' presence and sizes) is still checked before any write.
  /// Without it, a load stages the rank's whole shards in host memory first and a failed load modifies nothing.
  bool in_place = false;
};

}  // namespace fsdp::checkpoint
