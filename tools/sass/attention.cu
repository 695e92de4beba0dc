// The GPT example's attention kernels (examples/05_gpt_cuda/attention.cuh) for tools/sass-check: the head width of
// GPT-2 (64) in bf16, on tensor cores and their twin (the twin is the check's control: it must have no HMMA).
#include "examples/05_gpt_cuda/attention.cuh"

namespace a = gpt_cuda::attention;
using bf16 = fsdp::bfloat16;

template __global__ void a::forward<bf16, 64, a::product::tensor>(float*, float*, const float*, a::dims);
template __global__ void a::backward_query<bf16, 64, a::product::tensor>(float*, const float*, const float*,
                                                                         const float*, const float*, a::dims);
template __global__ void a::backward_key<bf16, 64, a::product::tensor>(float*, const float*, const float*,
                                                                       const float*, const float*, a::dims);
template __global__ void a::forward<bf16, 64, a::product::twin>(float*, float*, const float*, a::dims);
