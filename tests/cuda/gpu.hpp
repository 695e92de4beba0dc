#pragma once
// GPU test cases call FSDP_REQUIRE_GPU() first: without a usable CUDA device they print one "skipped:" line
// with the reason and return (never fail, never pass silently). Either way the case is counted (gpu_cases.hpp).
#include <cstdio>
#include <cstring>
#include <string>

#include <fsdp/cuda/device.cuh>

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
