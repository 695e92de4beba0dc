// ODR check, second CUDA translation unit: the same instantiations as odr_a.cu, which must not collide
// at link time.
#include <fsdp/fsdp.cuh>
// Only here: comm::nccl over MPI, so that the MPI header compiles with the rest under nvcc.
#include <fsdp/comm/nccl_mpi.cuh>

#include "odr.hpp"
#include "odr_model.cuh"

std::string odr_b(float* out) {
  const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
  if (p.count == 0) return "skipped: no CUDA device (" + p.reason + ")";
  fsdp::backend::cuda be;
  auto buf = be.allocate(8, fsdp::mem::comm_buffers, be.compute_stream());
  const float x = 1.5f;
  be.upload(buf.data(), &x, 4, be.compute_stream());
  be.convert(buf.as<char>() + 4, fsdp::dtype::f32, buf.data(), fsdp::dtype::f32, 1, 4.0f, be.compute_stream());
  be.download(out, buf.as<char>() + 4, 4, be.compute_stream());
  be.synchronize(be.compute_stream());
  return {};
}

std::string odr_model_b(float* out) { return odr_train_local(out); }
// comm::nccl's instantiation, compiled in both units (it needs a launcher to run)
[[maybe_unused]] static auto* odr_nccl_b = &odr_train<fsdp::comm::nccl>;
[[maybe_unused]] static auto* odr_nccl_hybrid_b = &odr_train_with<odr_hybrid_nccl_policy>;
[[maybe_unused]] static auto* odr_mpi_b = &fsdp::comm::nccl_from_mpi;
