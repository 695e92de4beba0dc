// The model core of every policy main.cc picks from (the host backend on comm::local: fsdp::model_core, with its
// executor and optimizers), compiled here once, apart from main.cc, which declares it extern (fsdp/instances.hpp):
// main.cc no longer compiles it, and the two files compile side by side (docs/build.md, "Compile time").
#include <fsdp/instances.hpp>

FSDP_INSTANTIATE_MODEL(fsdp::policy<fsdp::sharding::full_shard>);
