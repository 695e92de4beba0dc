#pragma once
// What is wrong with an input, as sentences collected rather than thrown: a check appends to a `problems`, a caller
// that must stop throws the first as a usage_error (require()), and a caller that asks (fsdp::can_implement)
// returns them all as values.
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.hpp"

namespace fsdp {

class problems {
 public:
  /// One more problem, its sentence built from streamable parts (as detail::cat).
  template <class... Parts>
  void add(Parts&&... parts) {
    list_.push_back(detail::cat(std::forward<Parts>(parts)...));
  }
  bool empty() const noexcept { return list_.empty(); }
  std::size_t size() const noexcept { return list_.size(); }
  const std::vector<std::string>& list() const noexcept { return list_; }
  /// Throws the first problem as a usage_error; nothing when there is none.
  void require() const {
    if (!list_.empty()) throw usage_error(list_.front());
  }

 private:
  std::vector<std::string> list_;
};

}  // namespace fsdp
