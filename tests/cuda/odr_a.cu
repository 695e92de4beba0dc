// ODR check, first CUDA translation unit: includes the whole CUDA library and instantiates its kernels and
// communicators; odr_b.cu does the same. Linking both (and odr_main.cc) into one binary proves that no header
// defines a non-inline function, variable or non-template kernel (a "multiple definition" at link time).
#include <fsdp/fsdp.cuh>

#include "odr.hpp"

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

// Instantiated in both CUDA translation units (called only with a GPU; compiled always): the model, its
// executor, scheduler, optimizers and kernels on the CUDA backend with both communicators, so that every template
// the library has is emitted twice and the link proves they merge.
static_assert(fsdp::CollectivePolicy<fsdp::comm::nccl_communicator>);
static_assert(fsdp::CollectivePolicy<fsdp::comm::local_cuda_communicator>);
template <class CommTag>
float odr_train_a(typename fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full,
                                         CommTag>::communicator& comm) {
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>,
                         CommTag>;
  fsdp::ModelSpec spec;
  spec.add("l0.w", {4, 3}).add("l1.w", {5});
  fsdp::Model<P> m(comm, spec, fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{0.5f, 1});
  fsdp::optim::adamw opt(m, {.lr = 0.1f, .grad = {.max_norm = 1.0f}});
  for (auto& u : m.forward()) (void)u;
  for (auto& u : m.backward()) (void)u;  // zero gradients: AdamW's decay alone moves the weights
  opt.step();
  return m.gather_full_params().at("l1.w")[0];
}
std::string odr_model_a(float* out) {
  const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
  if (p.count == 0) return "skipped: no CUDA device (" + p.reason + ")";
  fsdp::comm::run_local_cuda(1, [&](fsdp::comm::local_cuda_communicator& c) {
    *out = odr_train_a<fsdp::comm::local<fsdp::backend::cuda>>(c);
  });
  return {};
}
// comm::nccl's instantiation, compiled (it needs a launcher to run)
template float odr_train_a<fsdp::comm::nccl>(fsdp::comm::nccl_communicator&);
