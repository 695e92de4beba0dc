#pragma once
// The library's umbrella header for CUDA users (compile with nvcc): the host library (fsdp.hpp) plus the CUDA
// backend, its kernels, comm::local on one GPU and comm::nccl. comm::nccl over MPI is <fsdp/comm/nccl_mpi.cuh>
// (it needs <mpi.h>).
#include "fsdp/fsdp.hpp"

#include "fsdp/backend/cuda.cuh"
#include "fsdp/comm/local_cuda.cuh"
#include "fsdp/comm/nccl.cuh"
#include "fsdp/comm/nccl_threads.cuh"
#include "fsdp/cuda/device.cuh"
#include "fsdp/cuda/error.cuh"
#include "fsdp/cuda/kernels.cuh"
#include "fsdp/cuda/types.cuh"
