#pragma once
// GPU test cases call FSDP_REQUIRE_GPU() first: without a usable CUDA device they print one "skipped:" line
// with the reason and return (never fail, never pass silently). Either way the case is counted (gpu_cases.hpp).
//
// Bounded: every wait a GPU test makes (a stream, a collective) gives up within fsdp_test::wait_limit (60 s), so
// that a hang fails its case with the library's own message well inside tools/gpu-check's limit for the program,
// and each case's name is printed as it starts ("[case] NAME", stdout, flushed), so that a program killed at that
// limit still says which case was running.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <fsdp/backend/cuda.cuh>
#include <fsdp/comm/local_cuda.cuh>
#include <fsdp/cuda/device.cuh>

#include "../support/listener.hpp"
#include "gpu_cases.hpp"

#define FSDP_REQUIRE_GPU()                                                                    \
  do {                                                                                        \
    const ::fsdp::cuda::device_probe fsdp_probe_ = ::fsdp::cuda::device_status();             \
    if (fsdp_probe_.count == 0) {                                                             \
      const std::string fsdp_line_ = "skipped: no CUDA device (" + fsdp_probe_.reason + ")";  \
      std::printf("%s\n", fsdp_line_.c_str());                                               \
      std::fflush(stdout);                                                                    \
      MESSAGE(fsdp_line_);                                                                    \
      ::fsdp_test::gpu_cases.skipped();                                                       \
      return;                                                                                 \
    }                                                                                         \
    ::fsdp_test::gpu_cases.ran();                                                             \
  } while (0)

namespace fsdp_test {
/// The longest any wait in a GPU test may take: a stream's (backend::cuda_options::wait_timeout, 300 s by default)
/// or a collective's.
inline constexpr std::chrono::milliseconds wait_limit{60000};

/// A backend's options with waits bounded by wait_limit.
inline fsdp::backend::cuda_options backend_options(fsdp::backend::cuda_options o = {}) {
  o.wait_timeout = wait_limit;
  return o;
}

/// comm::local on one GPU: collectives bounded by `collective` (10 s), each rank's backend by wait_limit.
inline fsdp::comm::local_cuda_options local_options(
    std::chrono::milliseconds collective = std::chrono::milliseconds(10000)) {
  fsdp::comm::local_cuda_options o;
  o.timeout = collective;
  o.backend = backend_options(o.backend);
  return o;
}

/// Says, once in the doctest report and once on stdout (where tools/sim-check counts "needs a real GPU:" lines),
/// that the current case cannot show its point on this device: the caller then returns. For the simulated GPU.
inline void needs_real_gpu(const std::string& why) {
  const std::string line = "needs a real GPU: " + why;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  MESSAGE(line);
}

/// True on GPGPU-Sim (../shared/gpgpu-sim): it runs every instruction on the host, about 1.6 million
/// thread-instructions a second, so GPU tests keep to thousands of elements there and take the large sizes only
/// on a real device. Its device name starts with "GPGPU-Sim".
inline bool simulated_gpu() {
  cudaDeviceProp prop{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return std::strncmp(prop.name, "GPGPU-Sim", 9) == 0;
}
}  // namespace fsdp_test

#if defined(DOCTEST_CONFIG_IMPLEMENT)  // once per program: the file that has doctest's main
namespace fsdp_test {
/// Prints "[case] NAME" as each test case starts (tools/gpu-check names the running case from it on a timeout).
struct case_names : quiet_listener {
  using quiet_listener::quiet_listener;
  void test_case_start(const doctest::TestCaseData& tc) override {
    std::printf("[case] %s\n", tc.m_name);
    std::fflush(stdout);
  }
};
REGISTER_LISTENER("fsdp_case_names", 1, case_names);
}  // namespace fsdp_test
#endif
