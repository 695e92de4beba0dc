#pragma once
// Annotations shared by host and CUDA code. FSDP_HD marks a function callable from host code and from CUDA
// kernels: the per-element logic of every kernel is written once in a .hpp with it, and both backends call it
// (the host backend from loops, the CUDA backend from kernels), so their results agree bit for bit.
#if defined(__CUDACC__)
#define FSDP_HD __host__ __device__
#else
#define FSDP_HD
#endif
