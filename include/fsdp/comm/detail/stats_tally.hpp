#pragma once
// The collective_stats a communicator keeps: counted as each collective is issued, read from any thread. One tally
// for every communicator (comm::local, comm::local on one GPU, comm::mpi, comm::nccl).
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/dtype.hpp"

namespace fsdp::comm::detail {

class stats_tally {
 public:
  /// One collective of kind `k` (collective's value) moving `unsharded_elems` elements of `t` (nccl-tests' bytes).
  void add(std::size_t k, dtype t, std::int64_t unsharded_elems) {
    std::lock_guard lk(mu_);
    s_.count[k] += 1;
    s_.bytes[k] += static_cast<std::uint64_t>(unsharded_elems) * size_of(t);
  }
  collective_stats get() const {
    std::lock_guard lk(mu_);
    return s_;
  }
  void reset() {
    std::lock_guard lk(mu_);
    s_ = {};
  }

 private:
  mutable std::mutex mu_;
  collective_stats s_;
};

}  // namespace fsdp::comm::detail
