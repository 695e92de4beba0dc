#pragma once
// The model core the host tests use, compiled once (tests/support/instances.cc) instead of in each test file
// (fsdp/instances.hpp). A test includes this first, before anything else uses a Model. A core (fsdp::model_core,
// with its executor and optimizers) serves every policy with its backend and communicator: this one serves every
// test policy of the host backend on comm::local, whatever its strategy, prefetch, precision or offload (a test
// with a backend or communicator of its own, such as trace_test's timed backend, compiles its core itself). Most host
// tests are built in separate mode (tests/defs.bzl), where fsdp/fsdp.hpp declares the same core extern and
// fsdp/src.hpp compiles it; the declaration here repeats it (fsdp/instances.hpp allows that), and instances.cc is
// linked only into the header-only tests.
#include <fsdp/instances.hpp>

/// X(a policy of the common core); instances.cc instantiates it.
#define FSDP_TEST_INSTANCES(X) X(fsdp::policy<fsdp::sharding::full_shard>)

#ifndef FSDP_TEST_INSTANTIATING
FSDP_TEST_INSTANCES(FSDP_EXTERN_MODEL);
#endif
