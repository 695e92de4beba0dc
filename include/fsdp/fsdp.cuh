#pragma once
// The library's umbrella header for CUDA users (compile with nvcc). It is the host library (fsdp.hpp) plus the
// CUDA pieces that exist so far: error types and call-checking macros, and device discovery.
//
// The CUDA backend proper (device memory pool, streams, kernels, NCCL communicator) lands later; this header is
// where it will be included, so code written against <fsdp/fsdp.cuh> today keeps compiling.
#include "fsdp/fsdp.hpp"

#include "fsdp/cuda/device.cuh"
#include "fsdp/cuda/error.cuh"
