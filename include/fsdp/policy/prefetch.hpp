#pragma once
// Prefetch policies: when the scheduler issues a unit's all-gather ahead of its use. Each policy is a tag type
// that reports facts; the scheduler (fsdp/detail/schedule/scheduler.hpp) reads only these facts.
//
//   forward_depth    units gathered ahead, in forward order, when a unit's forward starts
//   backward_depth   units gathered ahead, in backward order, in a unit's backward
//   post_backward    false: the backward prefetch is issued when a unit's backward starts (before its compute);
//                    true: when it ends (after its compute, its parameters released, before its reduction)
//   by_schedule      true: the units to prefetch are named per unit in model_options::prefetch (a prefetch_schedule)
#include <concepts>
#include <map>
#include <string>
#include <vector>

namespace fsdp {

struct prefetch_tag {};

template <class P>
concept PrefetchPolicy = requires {
  typename P::prefetch_concept;
  requires std::same_as<typename P::prefetch_concept, prefetch_tag>;
  { P::forward_depth } -> std::convertible_to<int>;
  { P::backward_depth } -> std::convertible_to<int>;
  { P::post_backward } -> std::convertible_to<bool>;
  { P::by_schedule } -> std::convertible_to<bool>;
  requires P::forward_depth >= 0 && P::backward_depth >= 0;
};

/// A prefetch policy's facts as values, for code that is not a template (the schedule builder, the budget helpers).
struct prefetch_facts {
  int forward_depth = 0;
  int backward_depth = 0;
  bool post_backward = false;
  bool by_schedule = false;
};

template <PrefetchPolicy P>
constexpr prefetch_facts facts_of_prefetch() noexcept {
  return {P::forward_depth, P::backward_depth, P::post_backward, P::by_schedule};
}

/// The units to prefetch, by name, for prefetch::explicit_schedule: `forward[K]` are gathered when unit K's
/// forward starts, `backward[K]` when unit K's backward starts (after K's own gather, in the order listed).
struct prefetch_schedule {
  std::map<std::string, std::vector<std::string>> forward;
  std::map<std::string, std::vector<std::string>> backward;
  bool empty() const noexcept { return forward.empty() && backward.empty(); }
};

namespace prefetch {

/// Gathers up to `Forward` units ahead in forward and `Backward` units ahead in backward (when a unit's
/// backward starts).
template <int Forward, int Backward>
struct depth {
  static_assert(Forward >= 0 && Backward >= 0, "fsdp::prefetch::depth: depths must not be negative");
  using prefetch_concept = prefetch_tag;
  static constexpr int forward_depth = Forward;
  static constexpr int backward_depth = Backward;
  static constexpr bool post_backward = false;
  static constexpr bool by_schedule = false;
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

/// The next unit in backward order once the current unit's backward has finished and its parameters are
/// released, before its gradient reduction is issued (PyTorch's BACKWARD_POST): at most one unit's parameters
/// are gathered at a time in backward, at the price of a shorter overlap.
struct backward_post {
  using prefetch_concept = prefetch_tag;
  static constexpr int forward_depth = 0;
  static constexpr int backward_depth = 1;
  static constexpr bool post_backward = true;
  static constexpr bool by_schedule = false;
};

/// The user names which units to prefetch when, in model_options::prefetch (a prefetch_schedule).
struct explicit_schedule {
  using prefetch_concept = prefetch_tag;
  static constexpr int forward_depth = 0;
  static constexpr int backward_depth = 0;
  static constexpr bool post_backward = false;
  static constexpr bool by_schedule = true;
};

}  // namespace prefetch
}  // namespace fsdp
