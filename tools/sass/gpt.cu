// The GPT example's kernels for tools/sass-check: the attention (examples/05_gpt_cuda/attention.cuh) at GPT-2's head
// width (64) in bf16, its qkv, output and their gradients in bf16 as the trainer keeps them, on tensor cores and
// their twin (the twin is the check's control: it must have no HMMA); and the element-wise, row and column kernels of
// gpt_kernels.cuh that take four floats a thread (128-bit accesses).
#include "examples/05_gpt_cuda/attention.cuh"
#include "examples/05_gpt_cuda/gpt_kernels.cuh"

namespace a = gpt_cuda::attention;
namespace k = gpt_cuda::kernels;
using bf16 = fsdp::bfloat16;

template __global__ void a::forward<bf16, 64, a::product::tensor, bf16>(bf16*, float*, const bf16*, a::dims);
template __global__ void a::backward_query<bf16, 64, a::product::tensor, bf16, bf16>(bf16*, const bf16*, const bf16*,
                                                                                     const float*, const float*,
                                                                                     a::dims);
template __global__ void a::backward_key<bf16, 64, a::product::tensor, bf16, bf16>(bf16*, const bf16*, const bf16*,
                                                                                   const float*, const float*, a::dims);
template __global__ void a::forward<bf16, 64, a::product::twin, bf16>(bf16*, float*, const bf16*, a::dims);
template __global__ void k::bias_gelu<float>(float*, float*, const float*, int, int);
template __global__ void k::bias_gelu<bf16>(bf16*, bf16*, const float*, int, int);
template __global__ void k::gelu_backward<float>(float*, const float*, const float*, long long);
template __global__ void k::gelu_backward<bf16>(bf16*, const bf16*, const bf16*, long long);
template __global__ void k::bias_residual<float>(float*, const float*, const float*, const float*, int, int);
template __global__ void k::bias_residual<bf16>(float*, const bf16*, const float*, const float*, int, int);
template __global__ void k::add_bias<float>(float*, const float*, int, int);
template __global__ void k::add_bias<bf16>(bf16*, const float*, int, int);
template __global__ void k::column_partials<float>(float*, const float*, int, int);
template __global__ void k::column_partials<bf16>(float*, const bf16*, int, int);
template __global__ void k::layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*,
                                                     int, int);
template __global__ void k::layernorm_forward<bf16>(bf16*, float*, float*, const float*, const float*, const float*,
                                                    int, int);
template __global__ void k::bias_residual_layernorm<float, float>(float*, float*, float*, float*, const float*,
                                                                  const float*, const float*, const float*,
                                                                  const float*, int, int);
template __global__ void k::bias_residual_layernorm<bf16, bf16>(float*, bf16*, float*, float*, const bf16*,
                                                                const float*, const float*, const float*,
                                                                const float*, int, int);
template __global__ void k::layernorm_backward_input<float>(float*, const float*, const float*, const float*,
                                                            const float*, const float*, int, int);
template __global__ void k::layernorm_backward_input<bf16>(float*, const bf16*, const float*, const float*,
                                                           const float*, const float*, int, int);
template __global__ void k::layernorm_param_partials<float>(float*, float*, const float*, const float*, const float*,
                                                            const float*, int, int);
template __global__ void k::layernorm_param_partials<bf16>(float*, float*, const bf16*, const float*, const float*,
                                                           const float*, int, int);
template __global__ void k::cross_entropy<0>(float*, float*, const float*, const int*, const int*, int, int, float);
