#pragma once
// The owning allocation both backends hand out (Backend::buffer): a pointer and a size, accounted to one memory
// category of a MemoryTracker from allocation until release. What the accounting is and how a buffer moves are
// the same for every backend; only how the memory goes back differs, and that is the backend's `Free`:
//
//   Free{}              nothing to give back (a moved-from or empty buffer)
//   free(ptr, bytes)    gives the memory back, once, when the buffer is reset or destroyed; ptr may be null
//                       (a zero-byte buffer), and Free must then do nothing that needs memory
//
// `Owner` (the backend) makes buffers and may end the accounting before the memory goes (release_after: the
// accounting drops when the release is issued, the memory when the stream reaches it).
#include <cstdint>
#include <utility>

#include "fsdp/memory/memory.hpp"

namespace fsdp::backend::detail {

template <class Free, class Owner>
class accounted_buffer {
 public:
  accounted_buffer() = default;
  accounted_buffer(accounted_buffer&& o) noexcept { *this = std::move(o); }
  accounted_buffer& operator=(accounted_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      cat_ = o.cat_;
      tracker_ = std::exchange(o.tracker_, nullptr);
      free_ = std::exchange(o.free_, Free{});
    }
    return *this;
  }
  accounted_buffer(const accounted_buffer&) = delete;
  accounted_buffer& operator=(const accounted_buffer&) = delete;
  ~accounted_buffer() { reset(); }

  void* data() const noexcept { return ptr_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }
  std::int64_t bytes() const noexcept { return bytes_; }
  mem category() const noexcept { return cat_; }
  explicit operator bool() const noexcept { return ptr_ != nullptr || bytes_ != 0 || tracker_ != nullptr; }

  /// Ends the accounting and gives the memory back now.
  void reset() noexcept {
    stop_accounting();
    std::exchange(free_, Free{})(ptr_, bytes_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  friend Owner;
  /// Takes over `ptr` (memory of `bytes` bytes, or null) and accounts it to `c` in `t` (if any) from now on.
  accounted_buffer(void* ptr, std::int64_t bytes, mem c, MemoryTracker* t, Free f) noexcept
      : ptr_(ptr), bytes_(bytes), cat_(c), tracker_(t), free_(std::move(f)) {
    if (tracker_) tracker_->allocated(cat_, bytes_);
  }
  /// Ends the accounting now; the memory goes when the buffer is reset or destroyed.
  void stop_accounting() noexcept {
    if (tracker_) tracker_->released(cat_, bytes_);
    tracker_ = nullptr;
  }

  void* ptr_ = nullptr;
  std::int64_t bytes_ = 0;
  mem cat_ = mem::comm_buffers;
  MemoryTracker* tracker_ = nullptr;
  Free free_{};
};

}  // namespace fsdp::backend::detail
