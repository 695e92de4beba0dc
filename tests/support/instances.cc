// Compiles tests/support/instances.hpp's common model core, once for every test.
#define FSDP_TEST_INSTANTIATING
#include "tests/support/instances.hpp"

FSDP_TEST_INSTANCES(FSDP_INSTANTIATE_MODEL);
