#pragma once
// The pinned-block record's definitions (fsdp/backend/detail/pinned_blocks.hpp): included by that header, or compiled
// once by fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

#include "fsdp/backend/detail/pinned_blocks.hpp"

namespace fsdp::backend::detail {

FSDP_DECL void pinned_blocks::add(const void* p, std::int64_t bytes) noexcept {
  try {
    std::lock_guard lk(mu_);
    blocks_[key(p)] = bytes;
  } catch (...) {
  }
}

FSDP_DECL void pinned_blocks::remove(const void* p) noexcept {
  std::lock_guard lk(mu_);
  blocks_.erase(key(p));
}

FSDP_DECL bool pinned_blocks::contains(const void* p) const {
  std::lock_guard lk(mu_);
  auto it = blocks_.upper_bound(key(p));
  if (it == blocks_.begin()) return false;
  --it;
  return key(p) < it->first + static_cast<std::uintptr_t>(it->second);
}

}  // namespace fsdp::backend::detail
