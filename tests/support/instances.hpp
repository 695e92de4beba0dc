#pragma once
// The model cores the host tests use, compiled once (tests/support/instances_*.cc) instead of in each test file
// (fsdp/instances.hpp). A test includes this first, before anything else uses a Model. A core (fsdp::model_core)
// serves every policy with its backend, communicator and compute dtype: these two, the host backend and
// comm::local in fp32 and in bf16, serve most of the tests' policies, whatever their strategy, prefetch, reduce
// dtype or offload.
#include <fsdp/instances.hpp>

/// X(policy) for a policy of each common core; instances_<n>.cc instantiates the n-th.
#define FSDP_TEST_INSTANCES_1(X) X(fsdp::policy<fsdp::sharding::full_shard>)
#define FSDP_TEST_INSTANCES_2(X) \
  X(fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>)

#ifndef FSDP_TEST_INSTANTIATING
FSDP_TEST_INSTANCES_1(FSDP_EXTERN_MODEL);
FSDP_TEST_INSTANCES_2(FSDP_EXTERN_MODEL);
#endif
