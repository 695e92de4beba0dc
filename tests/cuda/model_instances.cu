// Compiles model_test's three model cores once (model_instances.hpp), apart from model_test.cu, which declares them
// extern: FSDP_INSTANTIATE_MODEL under nvcc for the CUDA backend, and the test's run over the linked cores.
#define FSDP_TEST_CUDA_INSTANTIATING
#include "model_instances.hpp"

FSDP_TEST_CUDA_INSTANCES(FSDP_INSTANTIATE_MODEL);
