// Compiles the second of tests/support/instances.hpp's common model cores, once for every test.
#define FSDP_TEST_INSTANTIATING
#include "tests/support/instances.hpp"

FSDP_TEST_INSTANCES_2(FSDP_INSTANTIATE_MODEL);
