#pragma once
// GPU test cases call FSDP_REQUIRE_GPU() first: without a usable CUDA device they print one "skipped:" line
// with the reason and return (never fail, never pass silently).
#include <cstdio>
#include <string>

#include <fsdp/cuda/device.cuh>

#define FSDP_REQUIRE_GPU()                                                                    \
  do {                                                                                        \
    const ::fsdp::cuda::device_probe fsdp_probe_ = ::fsdp::cuda::device_status();             \
    if (fsdp_probe_.count == 0) {                                                             \
      const std::string fsdp_line_ = "skipped: no CUDA device (" + fsdp_probe_.reason + ")";  \
      std::printf("%s\n", fsdp_line_.c_str());                                               \
      std::fflush(stdout);                                                                    \
      MESSAGE(fsdp_line_);                                                                    \
      return;                                                                                 \
    }                                                                                         \
  } while (0)
