#pragma once
// Prefetch policies: how far ahead of use the scheduler issues all-gathers. Forward prefetch gathers the next
// units in forward order while the current one computes; backward-pre prefetch gathers the next units in
// backward order as soon as a unit's backward starts.
#include <concepts>

namespace fsdp {

struct prefetch_tag {};

template <class P>
concept PrefetchPolicy = requires {
  typename P::prefetch_concept;
  requires std::same_as<typename P::prefetch_concept, prefetch_tag>;
  { P::forward_depth } -> std::convertible_to<int>;
  { P::backward_depth } -> std::convertible_to<int>;
  requires P::forward_depth >= 0 && P::backward_depth >= 0;
};

namespace prefetch {

/// Gathers up to `Forward` units ahead in forward and `Backward` units ahead in backward.
template <int Forward, int Backward>
struct depth {
  static_assert(Forward >= 0 && Backward >= 0, "fsdp::prefetch::depth: depths must not be negative");
  using prefetch_concept = prefetch_tag;
  static constexpr int forward_depth = Forward;
  static constexpr int backward_depth = Backward;
};

/// Every unit is gathered when it is entered, never earlier.
using none = depth<0, 0>;
/// The next N units in forward order (PyTorch's forward_prefetch with N = 1).
template <int N>
using forward = depth<N, 0>;
/// The next N units in backward order when a unit's backward starts (PyTorch's BACKWARD_PRE with N = 1).
template <int N>
using backward_pre = depth<0, N>;
/// The default: one unit ahead in both directions.
using next = depth<1, 1>;

}  // namespace prefetch
}  // namespace fsdp
