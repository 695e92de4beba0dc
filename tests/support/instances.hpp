#pragma once
// The models the host tests use most, compiled once (tests/support/instances_*.cc) instead of in each test file
// (fsdp/instances.hpp). A test includes this first, before anything else uses a Model. Which policies: those most
// test files instantiate, counted from the test objects' symbols (docs/build.md, "Compile time").
#include <fsdp/instances.hpp>

namespace fsdp_test::instances {
namespace sh = fsdp::sharding;
namespace pf = fsdp::prefetch;
using bf16 = fsdp::precision::mixed<fsdp::bfloat16>;
using bf16_reduce = fsdp::precision::mixed<fsdp::bfloat16, float, fsdp::bfloat16>;
}  // namespace fsdp_test::instances

/// X(policy) for each common policy; instances_<n>.cc instantiates the n-th pair.
#define FSDP_TEST_INSTANCES_1(X) X(fsdp::policy<fsdp_test::instances::sh::full_shard>); \
  X(fsdp::policy<fsdp_test::instances::sh::no_shard>)
#define FSDP_TEST_INSTANCES_2(X) X(fsdp::policy<fsdp_test::instances::sh::shard_grad_op>); \
  X(fsdp::policy<fsdp_test::instances::sh::full_shard, fsdp_test::instances::pf::next, fsdp_test::instances::bf16>)
#define FSDP_TEST_INSTANCES_3(X) X(fsdp::policy<fsdp_test::instances::sh::zero1>); \
  X(fsdp::policy<fsdp_test::instances::sh::hybrid_shard<2>>)
#define FSDP_TEST_INSTANCES_4(X)                                                                                    \
  X(fsdp::policy<fsdp_test::instances::sh::full_shard, fsdp_test::instances::pf::next,                              \
                 fsdp_test::instances::bf16_reduce>);                                                              \
  X(fsdp::policy<fsdp_test::instances::sh::full_shard, fsdp_test::instances::pf::explicit_schedule>)
#define FSDP_TEST_INSTANCES_5(X)                                                                                    \
  X(fsdp::policy<fsdp_test::instances::sh::no_shard, fsdp_test::instances::pf::next, fsdp_test::instances::bf16>); \
  X(fsdp::policy<fsdp_test::instances::sh::full_shard, fsdp_test::instances::pf::backward_post>)

#ifndef FSDP_TEST_INSTANTIATING
FSDP_TEST_INSTANCES_1(FSDP_EXTERN_MODEL);
FSDP_TEST_INSTANCES_2(FSDP_EXTERN_MODEL);
FSDP_TEST_INSTANCES_3(FSDP_EXTERN_MODEL);
FSDP_TEST_INSTANCES_4(FSDP_EXTERN_MODEL);
FSDP_TEST_INSTANCES_5(FSDP_EXTERN_MODEL);
#endif
