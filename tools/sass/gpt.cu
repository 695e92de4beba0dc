// The GPT example's kernels for tools/sass-check: the attention (examples/05_gpt_cuda/attention.cuh) at GPT-2's head
// width (64) in bf16, on tensor cores and their twin (the twin is the check's control: it must have no HMMA); and
// the element-wise kernels of gpt_kernels.cuh that take four floats a thread (128-bit accesses).
#include "examples/05_gpt_cuda/attention.cuh"
#include "examples/05_gpt_cuda/gpt_kernels.cuh"

namespace a = gpt_cuda::attention;
namespace k = gpt_cuda::kernels;
using bf16 = fsdp::bfloat16;

template __global__ void a::forward<bf16, 64, a::product::tensor>(float*, float*, const float*, a::dims);
template __global__ void a::backward_query<bf16, 64, a::product::tensor>(float*, const float*, const float*,
                                                                         const float*, const float*, a::dims);
template __global__ void a::backward_key<bf16, 64, a::product::tensor>(float*, const float*, const float*,
                                                                       const float*, const float*, a::dims);
template __global__ void a::forward<bf16, 64, a::product::twin>(float*, float*, const float*, a::dims);
template __global__ void k::bias_gelu<0>(float*, float*, const float*, int, int);
template __global__ void k::gelu_backward<0>(float*, const float*, const float*, long long);
template __global__ void k::bias_residual<0>(float*, const float*, const float*, int, int);
