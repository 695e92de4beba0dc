#pragma once
// Annotations shared by host and CUDA code. FSDP_HD marks a function callable from host code and from CUDA
// kernels: the per-element logic of every kernel is written once in a .hpp with it, and both backends call it
// (the host backend from loops, the CUDA backend from kernels), so their results agree bit for bit.
#if defined(__CUDACC__)
#define FSDP_HD __host__ __device__
#else
#define FSDP_HD
#endif

// FSDP_DECL marks a non-template function whose definition lives in a .ipp file beside its header. By default the
// library is header-only: each header includes its .ipp at its end and FSDP_DECL is `inline`. A program that defines
// FSDP_SEPARATE_COMPILATION in every file that includes a library header (and compiles fsdp/src.hpp in exactly one
// file, or links Bazel's //:fsdp_separate, which does both) sees only the declarations: the definitions, and the
// standard headers only they need, are compiled once, in that one file (docs/build.md, "Separate compilation").
// Templates stay in the headers either way; FSDP_EXTERN_MODEL (fsdp/instances.hpp) is their counterpart.
#if defined(FSDP_SEPARATE_COMPILATION)
#define FSDP_DECL
#else
#define FSDP_DECL inline
#endif
