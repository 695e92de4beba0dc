#pragma once
// Named ranges for a profiler around the library's host-side work, so that a timeline (Nsight Systems) shows it:
// each unit's forward and backward ("forward layers.3", "backward layers.3"), the issue of each collective of the
// schedule ("all_gather layers.3", "reduce_scatter layers.3", "all_reduce layers.3" or, for a quantized reduction,
// "all_to_all layers.3") and the optimizer step
// ("optimizer"). backend::cuda implements the hook with NVTX in the domain "fsdp" (fsdp/cuda/nvtx.cuh); a backend
// without it (backend::host) gets no ranges and pays nothing. Ranges are always on where the hook exists: with no
// profiler attached, NVTX calls return at once. They do not depend on the trace recorder.
//
// Where the Model opens them (the scheduler's call order): a unit's range opens once the unit has become current
// (its gathers issued and waited for) and closes when the pass leaves it, before the scheduler releases it and
// issues its reduction and the next gathers. So collective ranges fall between unit ranges on the host thread,
// never inside one; the user's own ranges inside a unit fall inside its range. Ranges are start/end pairs, not a
// push/pop stack: a pass abandoned by an exception in the user's code ends its open unit range and leaves no
// stack unbalanced.
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::trace {

/// Optional backend hook: profiler ranges (backend::cuda: NVTX start/end ranges in the domain "fsdp";
/// backend/concept.hpp's Backend does not require it).
///   range_start(name, argb)  opens a range named `name` (the tool copies it) in colour `argb`; returns its id
///   range_end(id)            closes it
template <class B>
concept ProfilerRanges = requires(B& b, const char* name, std::uint32_t argb, std::uint64_t id) {
  { b.range_start(name, argb) } -> std::same_as<std::uint64_t>;
  b.range_end(id);
};

/// The optimizer's comes last (ranges keeps one name for it, after every other kind's per unit).
enum class range_kind : std::uint8_t {
  forward, backward, all_gather, reduce_scatter, all_reduce, all_to_all, optimizer
};
inline constexpr int range_kinds = 7;

constexpr std::string_view name_of(range_kind k) noexcept {
  switch (k) {
    case range_kind::forward: return "forward";
    case range_kind::backward: return "backward";
    case range_kind::all_gather: return "all_gather";
    case range_kind::reduce_scatter: return "reduce_scatter";
    case range_kind::all_reduce: return "all_reduce";
    case range_kind::optimizer: return "optimizer";
    case range_kind::all_to_all: return "all_to_all";
  }
  return "?";
}

/// Colours (ARGB) per kind: compute green and teal, gathers blue, reductions orange and red, optimizer purple.
constexpr std::uint32_t colour_of(range_kind k) noexcept {
  switch (k) {
    case range_kind::forward: return 0xff4caf50u;
    case range_kind::backward: return 0xff009688u;
    case range_kind::all_gather: return 0xff2196f3u;
    case range_kind::reduce_scatter: return 0xffff9800u;
    case range_kind::all_reduce: return 0xfff44336u;
    case range_kind::optimizer: return 0xff9c27b0u;
    case range_kind::all_to_all: return 0xffff5722u;
  }
  return 0xff9e9e9eu;
}

/// A range's name: "<kind> <unit>", or the kind alone for no unit ("optimizer").
inline std::string range_name(range_kind k, std::string_view unit);

/// One rank's ranges over a backend: the names made once per unit (no allocation per range) and the calls to the
/// backend's hook; without the hook every call is a no-op.
template <class B>
class ranges {
 public:
  static constexpr bool on = ProfilerRanges<B>;

  /// `units`: the unit names by index.
  explicit ranges(const std::vector<std::string>& units) : units_(units.size()) {
    if constexpr (on) {
      names_.reserve(units.size() * (range_kinds - 1) + 1);
      for (int k = 0; k + 1 < range_kinds; ++k)
        for (const std::string& u : units) names_.push_back(range_name(range_kind(k), u));
      names_.push_back(range_name(range_kind::optimizer, {}));
    }
  }

  /// Opens the range of `k` for `unit` (-1 for none: the optimizer); its id, or nullopt without the hook.
  std::optional<std::uint64_t> start(B& b, range_kind k, int unit = -1) const {
    if constexpr (on) return b.range_start(name(k, unit).c_str(), colour_of(k));
    else return std::nullopt;
  }
  /// Closes a range start() opened (nullopt: nothing).
  void end(B& b, std::optional<std::uint64_t> id) const noexcept {
    if constexpr (on)
      if (id) b.range_end(*id);
  }

  /// A range open for the lifetime of the scope.
  class scope {
   public:
    scope(const ranges& r, B& b, range_kind k, int unit) : r_(&r), b_(&b), id_(r.start(b, k, unit)) {}
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() { r_->end(*b_, id_); }

   private:
    const ranges* r_;
    B* b_;
    std::optional<std::uint64_t> id_;
  };

  /// The name of the range of `k` for `unit`: "forward layers.3"; "optimizer" (any unit). Only with the hook.
  const std::string& name(range_kind k, int unit) const {
    if (names_.empty()) fsdp::detail::fail_usage("trace::ranges::name: this backend has no profiler ranges");
    if (k == range_kind::optimizer) return names_.back();
    if (unit < 0 || static_cast<std::size_t>(unit) >= units_)
      fsdp::detail::fail_usage("trace::ranges: no unit ", unit, " for a ", name_of(k), " range (the model has ", units_,
                         " units)");
    return names_[static_cast<std::size_t>(k) * units_ + static_cast<std::size_t>(unit)];
  }

 private:
  std::size_t units_;
  std::vector<std::string> names_;  // by kind, then unit; the optimizer's last (empty without the hook)
};

inline std::string range_name(range_kind k, std::string_view unit) {
  std::string s(name_of(k));
  if (!unit.empty()) {
    s += ' ';
    s += unit;
  }
  return s;
}

}  // namespace fsdp::trace
