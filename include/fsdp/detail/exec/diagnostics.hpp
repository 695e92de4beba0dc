#pragma once
// What the executor says when something goes wrong, or checks when asked:
//
//   allocating(u, what, fn)   runs fn(); a memory_error inside it is reported again naming unit u, what was being
//                             made for it, this rank and the unit's largest parameter, with the fix
//   check_next(...)           model_options::check_collectives: the ranks compare the collective about to be issued
//                             for a unit (sequence number, unit, operation, count, dtype) and every rank throws the
//                             same usage_error when they differ
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/agree/agree.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/layout/flat_layout.hpp"

namespace fsdp::detail::exec {

class diagnostics {
 public:
  /// `units` and `layouts` must outlive it.
  diagnostics(const unit_index& units, const std::vector<FlatLayout>& layouts, int rank, bool check_collectives)
      : units_(&units), layouts_(&layouts), rank_(rank), check_(check_collectives) {}

  const unit_index& units() const noexcept { return *units_; }

  template <class F>
  decltype(auto) allocating(std::size_t u, std::string_view what, F&& fn) const {
    try {
      return std::forward<F>(fn)();
    } catch (const memory_error& e) {
      const flat_entry* largest = nullptr;
      for (const flat_entry& p : (*layouts_)[u].entries())
        if (!largest || p.numel > largest->numel) largest = &p;
      throw memory_error(detail::cat(
          "could not allocate ", what, " of unit '", units_->name(u), "' on rank ", rank_, ": ", detail::unprefixed(e),
          largest ? detail::cat("; the unit's largest parameter is '", largest->name, "' of shape ",
                                detail::shape_text(largest->shape), " (", largest->numel, " elements)")
                  : std::string(),
          ". Shard the model over more ranks, wrap it into smaller units, or make the parameter smaller"));
    }
  }

  /// model_options::check_collectives: compares, over `world`, the next collective of unit u (on the backend's
  /// gather stream, which the host waits for).
  template <class C, class B>
  void check_next(C& world, B& be, collective kind, std::int64_t count, dtype t, std::size_t u) {
    if (check_) compare_next(world, be, kind, count, t, u);  // off, the common case: inline and nothing more
  }

 private:
  template <class C, class B>
  void compare_next(C& world, B& be, collective kind, std::int64_t count, dtype t, std::size_t u) {
    fingerprint next;
    next.add("", "the sequence number", std::to_string(checked_++));
    next.add("", "the unit", agree::in_quotes(units_->name(u)));
    next.add("", "the operation", std::string(name_of(kind)));
    next.add("", "the count", std::to_string(count));
    next.add("", "the dtype", std::string(name_of(t)));
    agree::require_agreement(world, be, next, "the next collective (model_options::check_collectives)",
                             "Every rank must enter the same units in the same order");
  }

  const unit_index* units_;
  const std::vector<FlatLayout>* layouts_;
  int rank_;
  bool check_;
  std::uint64_t checked_ = 0;  // collectives compared so far
};

}  // namespace fsdp::detail::exec
