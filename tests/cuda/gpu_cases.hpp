#pragma once
// Counts a test program's GPU cases: each one either ran on a device or was skipped for want of one. At exit the
// program prints one line, "GPU cases: R ran, S skipped". A program whose GPU cases all skipped has not shown what
// it is for: .ci/run and CTest (SKIP_REGULAR_EXPRESSION "GPU cases: 0 ran, [1-9]") count it as skipped, not passed.
// Plain C++ (no CUDA headers): odr_main.cc, compiled by the host compiler, counts its cases too.
#include <atomic>
#include <cstdio>

namespace fsdp_test {

class gpu_case_count {
 public:
  gpu_case_count() = default;
  gpu_case_count(const gpu_case_count&) = delete;
  gpu_case_count& operator=(const gpu_case_count&) = delete;
  ~gpu_case_count() {
    std::printf("GPU cases: %d ran, %d skipped\n", ran_.load(), skipped_.load());
    std::fflush(stdout);
  }
  void ran() noexcept { ++ran_; }
  void skipped() noexcept { ++skipped_; }

 private:
  std::atomic<int> ran_{0}, skipped_{0};
};

/// The program's one count (an inline variable: one object however many translation units include this).
inline gpu_case_count gpu_cases;

}  // namespace fsdp_test
