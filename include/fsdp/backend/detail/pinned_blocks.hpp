#pragma once
// The host backend's record of its allocate_host() blocks (what the CUDA backend pins), so that a copy can tell
// pinned memory from pageable memory as CUDA does (backend::host::upload / download). Blocks are added by the
// issuing thread and removed wherever their buffer is freed (a stream's worker, for a stream-ordered release).
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace fsdp::backend::host_detail {

class pinned_blocks {
 public:
  /// Records [p, p + bytes). A failure to record (std::bad_alloc) is swallowed: the block then counts as
  /// pageable, which only makes copies through it wait as a pageable copy does.
  void add(const void* p, std::int64_t bytes) noexcept {
    try {
      std::lock_guard lk(mu_);
      blocks_[key(p)] = bytes;
    } catch (...) {
    }
  }
  void remove(const void* p) noexcept {
    std::lock_guard lk(mu_);
    blocks_.erase(key(p));
  }
  /// Whether `p` lies inside a recorded block.
  bool contains(const void* p) const {
    std::lock_guard lk(mu_);
    auto it = blocks_.upper_bound(key(p));
    if (it == blocks_.begin()) return false;
    --it;
    return key(p) < it->first + static_cast<std::uintptr_t>(it->second);
  }

 private:
  static std::uintptr_t key(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  mutable std::mutex mu_;
  std::map<std::uintptr_t, std::int64_t> blocks_;
};

}  // namespace fsdp::backend::host_detail
