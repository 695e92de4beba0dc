// A user's .cu file built with nvcc against the installed package: the library's CUDA umbrella header, the model
// on the CUDA backend over comm::local (one GPU rank), one AdamW step. Without a GPU it says so and exits 0;
// tools/cmake-check only builds it (this machine has none), tools/gpu-check runs it.
#include <fsdp/fsdp.cuh>

#include <cmath>
#include <cstdio>

int main() {
  const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
  if (p.count == 0) {
    std::printf("cuda_trainer: skipped: no CUDA device (%s)\n", p.reason.c_str());
    return 0;
  }
  using Policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>,
                              fsdp::comm::local<fsdp::backend::cuda>>;
  float before = 0, after = 0;
  fsdp::comm::run_local_cuda(1, [&](fsdp::comm::local_cuda_communicator& comm) {
    fsdp::ModelSpec spec;
    spec.add("layers.0.w", {4, 3}).add("layers.1.w", {5});
    fsdp::Model<Policy> model(comm, spec, fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{0.5f, 1});
    fsdp::optim::adamw opt(model, {.lr = 0.1f, .weight_decay = 0.5f});
    before = fsdp::weights::gather_full_params(model).at("layers.1.w")[0];
    for (auto& u : model.forward()) (void)u;
    for (auto& u : model.backward()) (void)u;  // zero gradients: the weight decay alone moves the weights
    opt.step();
    after = fsdp::weights::gather_full_params(model).at("layers.1.w")[0];
  });
  std::printf("cuda_trainer: layers.1.w[0] %.6f -> %.6f\n", before, after);
  if (!(std::fabs(after) < std::fabs(before))) {
    std::printf("cuda_trainer: FAILED: weight decay did not shrink the weight\n");
    return 1;
  }
  std::printf("cuda_trainer: OK\n");
  return 0;
}
