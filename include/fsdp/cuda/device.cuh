#pragma once
// Is there a CUDA device to run on? device_status() answers without throwing (tests use it to skip);
// require_device() throws cuda_error with the reason (entry points that cannot run without a GPU).
#include <cuda_runtime_api.h>

#include <source_location>
#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/cuda/error.cuh"

namespace fsdp::cuda {

/// What cudaGetDeviceCount said. count == 0 means no usable device, and `reason` says why.
struct device_probe {
  int count = 0;
  std::string reason;               ///< empty when count > 0
  cudaError_t code = cudaSuccess;   ///< the failing code, cudaErrorNoDevice when the runtime reported 0 devices
};

/// Counts the visible CUDA devices. Never throws a CUDA error: a failing cudaGetDeviceCount (no driver, no
/// device, CUDA_VISIBLE_DEVICES hiding all of them) gives count 0 and the reason; the error is then cleared.
inline device_probe device_status() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return {0,
            detail::cat("cudaGetDeviceCount failed with ", cudaGetErrorName(rc), " (", cudaGetErrorString(rc), ")"),
            rc};
  }
  if (count <= 0) return {0, "cudaGetDeviceCount reported 0 devices", cudaErrorNoDevice};
  return {count, {}, cudaSuccess};
}

/// Returns the number of visible devices; throws cuda_error naming the reason when there is none.
inline int require_device(std::source_location where = std::source_location::current()) {
  device_probe p = device_status();
  if (p.count > 0) return p.count;
  throw cuda_error(p.code, "cudaGetDeviceCount(&count)", where.file_name(), static_cast<int>(where.line()),
                   detail::cat("no CUDA device: ", p.reason,
                               "; check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or use the host backend"));
}

}  // namespace fsdp::cuda
