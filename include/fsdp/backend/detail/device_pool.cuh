#pragma once
// backend::cuda's memory pool: a CUDA memory pool of one device (cudaMemPoolCreate) whose release threshold is
// "never", so that memory freed inside a step stays in the pool for the next step, and its reservation (the
// planner's peak, reserved before the first step). The backend allocates from it stream-ordered
// (cudaMallocFromPoolAsync / cudaFreeAsync); this class owns the pool, grows it and reports what it holds.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "fsdp/cuda/error.cuh"

namespace fsdp::backend::detail {

class device_pool {
 public:
  explicit device_pool(int device) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    FSDP_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();  // never give memory back between steps
    const cudaError_t rc = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
    if (rc != cudaSuccess) {
      FSDP_CUDA_LOG(cudaMemPoolDestroy(pool_));
      fsdp::detail::throw_cuda_error(rc, "cudaMemPoolSetAttribute(pool, ReleaseThreshold)", __FILE__, __LINE__);
    }
  }
  device_pool(const device_pool&) = delete;
  device_pool& operator=(const device_pool&) = delete;
  ~device_pool() {
    if (pool_) FSDP_CUDA_LOG(cudaMemPoolDestroy(pool_));
  }

  cudaMemPool_t get() const noexcept { return pool_; }

  /// Makes the pool hold at least `bytes` in all (buffers in use included), so that later allocations up to that
  /// total take no memory from the device. Blocks on `s` once. Free memory is trimmed first and replaced by one
  /// block, so successive reservations (model, then optimizer) do not add up.
  void reserve(std::int64_t bytes, cudaStream_t s) {
    if (bytes <= reserved_) return;
    FSDP_CUDA_CHECK(cudaStreamSynchronize(s));
    FSDP_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
    const std::int64_t extra = bytes - used_bytes();
    if (extra > 0) {
      void* p = nullptr;
      FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(&p, static_cast<std::size_t>(extra), pool_, s));
      FSDP_CUDA_CHECK(cudaFreeAsync(p, s));
      FSDP_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    reserved_ = bytes;
  }

  /// Bytes of device memory the pool holds (cudaMemPoolAttrReservedMemCurrent) and hands out now.
  std::int64_t reserved_bytes() const { return attribute(cudaMemPoolAttrReservedMemCurrent); }
  std::int64_t used_bytes() const { return attribute(cudaMemPoolAttrUsedMemCurrent); }

  /// Leaves the pool to the process: work that may never finish could still use its memory, and freeing it under
  /// running work would be worse than the leak (backend::cuda's teardown after a stream that did not finish).
  void leave_to_process() noexcept { pool_ = nullptr; }

 private:
  std::int64_t attribute(cudaMemPoolAttr a) const {
    std::uint64_t v = 0;
    FSDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, a, &v));
    return static_cast<std::int64_t>(v);
  }

  cudaMemPool_t pool_ = nullptr;
  std::int64_t reserved_ = 0;
};

}  // namespace fsdp::backend::detail
