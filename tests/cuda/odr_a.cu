// ODR check, first CUDA translation unit: includes the whole CUDA library and instantiates its kernels and
// communicators; odr_b.cu does the same. Linking both (and odr_main.cc) into one binary proves that no header
// defines a non-inline function, variable or non-template kernel (a "multiple definition" at link time).
#include <fsdp/fsdp.cuh>

#include "odr.hpp"
#include "odr_model.cuh"

std::string odr_a(float* out) {
  const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
  if (p.count == 0) return "skipped: no CUDA device (" + p.reason + ")";
  fsdp::backend::cuda be;
  auto buf = be.allocate(8, fsdp::mem::comm_buffers, be.compute_stream());
  const float x = 1.5f;
  be.upload(buf.data(), &x, 4, be.compute_stream());
  be.convert(buf.as<char>() + 4, fsdp::dtype::f32, buf.data(), fsdp::dtype::f32, 1, 2.0f, be.compute_stream());
  be.download(out, buf.as<char>() + 4, 4, be.compute_stream());
  be.synchronize(be.compute_stream());
  return {};
}

std::string odr_model_a(float* out) { return odr_train_local(out); }
// comm::nccl's instantiation, compiled in both units (it needs a launcher to run)
[[maybe_unused]] static auto* odr_nccl_a = &odr_train<fsdp::comm::nccl>;
[[maybe_unused]] static auto* odr_nccl_hybrid_a = &odr_train_with<odr_hybrid_nccl_policy>;
