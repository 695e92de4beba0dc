#pragma once
// Memory accounting by category. Every buffer the library allocates names its category; the tracker keeps the
// current and peak bytes of each category and of their sum. Accounting follows the host-side program order of
// allocate/release calls (the semantics of a stream-ordered allocator such as cudaMallocAsync/cudaFreeAsync), so
// the figures are deterministic and the planner can predict them exactly.
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>

namespace fsdp {

enum class mem : std::uint8_t {
  sharded_params,   ///< fp32 master shards (the full replica under no_shard)
  gathered_params,  ///< unsharded parameters of gathered units, in the compute dtype
  grads,            ///< fp32 gradient shards
  optimizer_state,  ///< momentum / Adam moments
  comm_buffers,     ///< unsharded gradients being reduced, reduce-scatter outputs, staging
};
inline constexpr std::size_t mem_categories = 5;

/// Where a buffer lives: the backend's device memory, or (pinned) host memory (fsdp/policy/offload.hpp). Each
/// domain has its own tracker and its own plan.
enum class domain : std::uint8_t { device, host };

constexpr std::string_view name_of(domain d) noexcept { return d == domain::host ? "host" : "device"; }

constexpr std::string_view name_of(mem c) noexcept {
  switch (c) {
    case mem::sharded_params: return "sharded params";
    case mem::gathered_params: return "gathered params";
    case mem::grads: return "grads";
    case mem::optimizer_state: return "optimizer state";
    case mem::comm_buffers: return "comm buffers";
  }
  return "?";
}

/// Bytes per category (plus the total, which is not the sum of the per-category peaks).
struct memory_figures {
  std::array<std::int64_t, mem_categories> bytes{};
  std::int64_t total = 0;
  std::int64_t operator[](mem c) const noexcept { return bytes[static_cast<std::size_t>(c)]; }
  std::int64_t& operator[](mem c) noexcept { return bytes[static_cast<std::size_t>(c)]; }
  friend bool operator==(const memory_figures&, const memory_figures&) = default;
};

struct memory_stats {
  memory_figures current;
  memory_figures peak;
};

class MemoryTracker {
 public:
  void allocated(mem c, std::int64_t bytes) {
    std::lock_guard lk(mu_);
    s_.current[c] += bytes;
    s_.current.total += bytes;
    if (s_.current[c] > s_.peak[c]) s_.peak[c] = s_.current[c];
    if (s_.current.total > s_.peak.total) s_.peak.total = s_.current.total;
    if (listener_) listener_(s_.current);
  }
  void released(mem c, std::int64_t bytes) {
    std::lock_guard lk(mu_);
    s_.current[c] -= bytes;
    s_.current.total -= bytes;
    if (listener_) listener_(s_.current);
  }
  memory_stats stats() const {
    std::lock_guard lk(mu_);
    return s_;
  }
  /// Called with the current figures after every change, in the order of the changes (under the tracker's
  /// lock: it must not call back into the tracker). Used for the memory timeline.
  void set_listener(std::function<void(const memory_figures&)> f) {
    std::lock_guard lk(mu_);
    listener_ = std::move(f);
  }
  /// Starts a new peak window from the current figures.
  void reset_peak() {
    std::lock_guard lk(mu_);
    s_.peak = s_.current;
  }

 private:
  mutable std::mutex mu_;
  memory_stats s_;
  std::function<void(const memory_figures&)> listener_;
};

}  // namespace fsdp
