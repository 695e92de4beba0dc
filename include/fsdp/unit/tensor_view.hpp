#pragma once
// A non-owning view of one parameter (or gradient) inside a gathered flat buffer: pointer, global shape.
#include <cstdint>
#include <vector>

namespace fsdp {

template <class T>
class tensor_view {
 public:
  tensor_view() = default;
  tensor_view(T* data, const std::vector<std::int64_t>* shape, std::int64_t numel)
      : data_(data), shape_(shape), numel_(numel) {}

  T* data() const noexcept { return data_; }
  std::int64_t numel() const noexcept { return numel_; }
  const std::vector<std::int64_t>& shape() const noexcept { return *shape_; }
  std::int64_t size(std::size_t dim) const { return shape_->at(dim); }
  T& operator[](std::int64_t i) const noexcept { return data_[i]; }  // host backend only
  T* begin() const noexcept { return data_; }
  T* end() const noexcept { return data_ + numel_; }

 private:
  T* data_ = nullptr;
  const std::vector<std::int64_t>* shape_ = nullptr;
  std::int64_t numel_ = 0;
};

}  // namespace fsdp
