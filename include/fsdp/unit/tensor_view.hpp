#pragma once
// A non-owning view of one parameter (or gradient) inside a gathered flat buffer: pointer, global shape.
//
// Gathered parameters and unsharded gradients live in slots the executor reuses (fsdp/detail/exec/slot_ring.hpp): a
// view kept after its unit gave the slot back points at whatever unit takes it next. Under model_options::check_views a
// view carries a view_check: the count of its unit's hand-overs (releases of the gathered parameters, or of the
// gradient to its reduction) issued when it was made, against the count the streams have passed. Once the stream
// has passed a hand-over issued after the view was made, using the view's memory (data(), begin(), end(), [])
// is a usage_error naming the unit and the parameter. Unchecked views (the default) carry no count and cost one
// test of a null pointer per use.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {

/// A unit's hand-overs of one kind of slot (gathered parameters, or the unsharded gradient) under
/// model_options::check_views: `issued` counts the host's (the executor's call), `passed` the stream's (a host
/// function in stream order, at the point where the slot is given back).
struct handover_count {
  std::uint64_t issued = 0;
  std::atomic<std::uint64_t> passed{0};
};

/// What a checked view knows of itself (all null: unchecked).
struct view_check {
  const std::atomic<std::uint64_t>* passed = nullptr;  ///< the unit's hand-overs passed in stream order
  std::uint64_t born = 0;                              ///< hand-overs issued before the view was made
  const std::string* unit = nullptr;
  const std::string* param = nullptr;
  bool grad = false;

  void require() const {
    if (passed && passed->load(std::memory_order_acquire) > born) stale();
  }
  [[noreturn]] void stale() const;
};

template <class T>
class tensor_view {
 public:
  tensor_view() = default;
  tensor_view(T* data, const std::vector<std::int64_t>* shape, std::int64_t numel, view_check check = {})
      : data_(data), shape_(shape), numel_(numel), check_(check) {}

  T* data() const {
    check_.require();
    return data_;
  }
  std::int64_t numel() const noexcept { return numel_; }
  const std::vector<std::int64_t>& shape() const noexcept { return *shape_; }
  std::int64_t size(std::size_t dim) const { return shape_->at(dim); }
  T& operator[](std::int64_t i) const {  // host backend only
    check_.require();
    return data_[i];
  }
  T* begin() const { return data(); }
  T* end() const { return data() + numel_; }

 private:
  T* data_ = nullptr;
  const std::vector<std::int64_t>* shape_ = nullptr;
  std::int64_t numel_ = 0;
  view_check check_{};
};

inline void view_check::stale() const {
  if (grad)
    detail::fail_usage("a gradient view of '", *param, "' of unit '", *unit,
                       "' was used after the unit's backward ended (model_options::check_views): its gradient went "
                       "to the reduction and its memory to another unit. Write the gradient while the unit is "
                       "current in model.backward(), through a view asked for there");
  detail::fail_usage("a view of parameter '", *param, "' of unit '", *unit,
                     "' was used after the unit released its gathered parameters (model_options::check_views): its "
                     "memory now holds another unit's parameters. Ask unit.param(\"", *param,
                     "\") again while the unit is gathered, inside model.forward() or model.backward()");
}

}  // namespace fsdp
