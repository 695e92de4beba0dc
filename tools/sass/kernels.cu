// The library's bandwidth kernels, instantiated for tools/sass-check: one launcher call per kernel it checks.
// Compiled to a cubin only (device code for sm_90); nothing here runs.
#include <fsdp/cuda/kernels.cuh>
#include <fsdp/kernels/quantize.hpp>
#include <fsdp/optim/adamw.hpp>
#include <fsdp/optim/lion.hpp>
#include <fsdp/optim/sgd.hpp>

namespace k = fsdp::cuda::kernels;
namespace q = fsdp::kernels;
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
  // block-scaled 8-bit gathers and reductions (kernels/quantize.hpp): a warp's lanes per block; four elements a thread
  auto* bytes = static_cast<std::uint8_t*>(a);
  k::for_each(n, q::block_quantize<dtype::f32, dtype::f8e4m3>{f0, bytes, n, 32, n + n / 8}, s);  // a gather's slice
  k::for_each(n, q::block_quantize<dtype::bf16, dtype::i8>{static_cast<const std::uint16_t*>(b), bytes, n, 32, n + n / 8,
                                                          0.25f},
              s);  // a reduction's input, pre-divided
  k::for_each(n, q::block_dequantize<dtype::bf16, dtype::f8e4m3>{bytes, static_cast<std::uint16_t*>(b), n, 32, n + n / 8}, s);
  k::for_each(n, q::block_dequantize<dtype::f32, dtype::f8e4m3>{bytes, f1, n, 32, n + n / 8}, s);
  k::for_each(n, q::block_dequantize_sum<dtype::i8>{bytes, f0, n, 32, n + n / 8, 4, 0.25f, 1.0f}, s);
  // comm::local's reduction over the ranks of one GPU
  k::reduce_ranks_params<dtype::f32> rf{};
  rf.dst = f0;
  rf.n = n;
  rf.world = 4;
  rf.premul = 1.0f;
  k::reduce_ranks(rf, s);
  k::reduce_ranks_params<dtype::bf16> rb{};
  rb.dst = static_cast<std::uint16_t*>(b);
  rb.n = n;
  rb.world = 4;
  rb.premul = 1.0f;
  k::reduce_ranks(rb, s);
}
