#pragma once
// The pool model's definitions (fsdp/backend/detail/pool_model.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "fsdp/backend/detail/pool_model.hpp"

namespace fsdp::backend::detail {

FSDP_DECL void pool_model::allocate(int s, std::int64_t bytes) {
  if (bytes <= 0) return;
  std::lock_guard lk(mu_);
  std::int64_t need = bytes;
  for (auto it = free_.begin(); it != free_.end() && need > 0;) {
    if (!reusable(*it, s)) {
      ++it;
      continue;
    }
    const std::int64_t take = std::min(need, it->bytes);
    need -= take;
    it->bytes -= take;
    it = it->bytes == 0 ? free_.erase(it) : it + 1;
  }
  f_.reserved += need;
  f_.in_use += bytes;
}

FSDP_DECL std::shared_ptr<std::atomic<bool>> pool_model::free(int s, std::int64_t bytes) {
  if (bytes <= 0) return nullptr;
  std::lock_guard lk(mu_);
  f_.in_use -= bytes;
  chunk c{bytes, s, 0, nullptr};
  if (s != any) {
    c.seq = issued_[static_cast<std::size_t>(s)].fetch_add(1, std::memory_order_relaxed) + 1;
    c.done = std::make_shared<std::atomic<bool>>(false);
  }
  free_.push_back(c);
  return c.done;
}

FSDP_DECL pool_model::clock pool_model::record(int s) const {
  clock c;
  const auto& mine = seen_[static_cast<std::size_t>(s)];
  for (std::size_t t = 0; t < c.size(); ++t) c[t] = mine[t].load(std::memory_order_relaxed);
  c[static_cast<std::size_t>(s)] = issued_[static_cast<std::size_t>(s)].load(std::memory_order_relaxed);
  return c;
}

FSDP_DECL void pool_model::wait(int s, const clock& c) {
  auto& mine = seen_[static_cast<std::size_t>(s)];
  for (std::size_t t = 0; t < c.size(); ++t) {
    std::uint64_t seen = mine[t].load(std::memory_order_relaxed);
    while (seen < c[t] && !mine[t].compare_exchange_weak(seen, c[t], std::memory_order_relaxed)) {
    }
  }
}

FSDP_DECL pool_model::figures pool_model::stats() const {
  std::lock_guard lk(mu_);
  return f_;
}

FSDP_DECL bool pool_model::reusable(const chunk& c, int s) const {
  if (c.stream == any || c.stream == s) return true;
  if (seen_[static_cast<std::size_t>(s)][static_cast<std::size_t>(c.stream)].load(std::memory_order_relaxed) >= c.seq)
    return true;
  return c.done->load(std::memory_order_acquire);
}

}  // namespace fsdp::backend::detail
