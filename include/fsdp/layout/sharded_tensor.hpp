#pragma once
// ShardedTensor: one parameter's part of one rank's local shard. It knows the parameter's global shape, which
// of its row-major elements this rank holds ([begin, end), possibly empty) and where they sit in the shard.
// Init, optimizer masks and checkpoints work through it.
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/spec/model_spec.hpp"

namespace fsdp {

struct ShardedTensor {
  std::string name;
  std::vector<std::int64_t> shape;  ///< global shape
  std::int64_t numel = 0;           ///< global element count
  std::int64_t begin = 0;           ///< first global element held locally
  std::int64_t end = 0;             ///< one past the last global element held locally
  std::int64_t shard_offset = 0;    ///< position of element `begin` in the local shard
  param_flags flags{};

  std::int64_t local_numel() const noexcept { return end - begin; }
  bool empty() const noexcept { return end == begin; }
};

}  // namespace fsdp
