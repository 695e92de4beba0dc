#pragma once
// The model cores model_test.cu uses, compiled once in model_instances.cu (fsdp/instances.hpp): the CUDA backend
// on comm::local (ranks as threads on one GPU) and on comm::nccl, and the host backend on comm::local that the GPU
// runs are compared against. A core serves every policy of its backend and communicator, so these three serve all
// of model_test's policies. model_test.cu includes this before its first use of a Model.
#include <fsdp/fsdp.cuh>
#include <fsdp/instances.hpp>

/// X(a policy of each core); model_instances.cu instantiates them.
#define FSDP_TEST_CUDA_INSTANCES(X)                     \
  X(fsdp::policy<fsdp::sharding::full_shard>);          \
  X(fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, \
                 fsdp::comm::local<fsdp::backend::cuda>>); \
  X(fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, fsdp::comm::nccl>)

#ifndef FSDP_TEST_CUDA_INSTANTIATING
FSDP_TEST_CUDA_INSTANCES(FSDP_EXTERN_MODEL);
#endif
