// The library's bandwidth kernels, instantiated for tools/sass-check: one launcher call per kernel it checks.
// Compiled to a cubin only (device code for sm_90); nothing here runs.
#include <fsdp/cuda/kernels.cuh>
#include <fsdp/optim/adamw.hpp>
#include <fsdp/optim/lion.hpp>
#include <fsdp/optim/sgd.hpp>

namespace k = fsdp::cuda::kernels;
namespace od = fsdp::optim::detail;
using fsdp::dtype;

void instantiate(void* a, void* b, float* f0, float* f1, float* f2, float* f3, std::int64_t n, cudaStream_t s) {
  k::convert(a, dtype::bf16, b, dtype::f32, n, 1.0f, s);  // copy-in: fp32 master to bf16 compute
  k::convert(a, dtype::f16, b, dtype::f32, n, 1.0f, s);
  k::convert(a, dtype::f32, b, dtype::bf16, n, 1.0f, s);  // reduce-scatter input in fp32
  k::convert(a, dtype::f32, b, dtype::f32, n, 0.5f, s);   // pre-division in place
  k::accumulate(f0, b, dtype::bf16, n, 1.0f, s);          // a reduction's result into the fp32 gradient shard
  k::accumulate(f0, b, dtype::f16, n, 1.0f, s);
  k::accumulate(f0, b, dtype::f32, n, 1.0f, s);
  k::for_each(n, od::adamw_elements{f0, f1, f2, f3, {}, {}}, s);
  k::for_each(n, od::sgd_elements{f0, f1, f2, {}, {}}, s);
  k::for_each(n, od::lion_elements{f0, f1, f2, {}, {}}, s);
}
