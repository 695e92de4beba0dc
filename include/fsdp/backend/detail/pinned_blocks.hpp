#pragma once
// The host backend's record of its allocate_host() blocks (what the CUDA backend pins), so that a copy can tell
// pinned memory from pageable memory as CUDA does (backend::host::upload / download). Blocks are added by the
// issuing thread and removed wherever their buffer is freed (a stream's worker, for a stream-ordered release).
#include <cstdint>
#include <map>
#include <mutex>

#include "fsdp/core/config.hpp"

namespace fsdp::backend::detail {

class pinned_blocks {
 public:
  /// Records [p, p + bytes). A failure to record (std::bad_alloc) is swallowed: the block then counts as
  /// pageable, which only makes copies through it wait as a pageable copy does.
  void add(const void* p, std::int64_t bytes) noexcept;
  void remove(const void* p) noexcept;
  /// Whether `p` lies inside a recorded block.
  bool contains(const void* p) const;

 private:
  static std::uintptr_t key(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  mutable std::mutex mu_;
  std::map<std::uintptr_t, std::int64_t> blocks_;
};

}  // namespace fsdp::backend::detail

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/backend/detail/pinned_blocks.ipp"
#endif
