#pragma once
// The library's non-template definitions, for separate-compilation mode (fsdp/core/config.hpp, docs/build.md):
// compile this file in exactly one translation unit of a program whose every file that includes a library header
// defines FSDP_SEPARATE_COMPILATION (Bazel: depend on //:fsdp_separate; CMake: link fsdp::separate; both do it).
// By default, the header-only mode, each header includes its own .ipp and this file is not used. fsdp/checkpoint/
// has its own (fsdp/checkpoint/src.hpp), since it needs nlohmann-json and xxHash.
#if !defined(FSDP_SEPARATE_COMPILATION)
#error "fsdp/src.hpp is for separate-compilation mode: define FSDP_SEPARATE_COMPILATION for this file and \
for every file that includes a library header (docs/build.md)"
#endif

#include "fsdp/agree/fingerprint.ipp"
#include "fsdp/backend/detail/pinned_blocks.ipp"
#include "fsdp/backend/detail/pool_model.ipp"
#include "fsdp/backend/detail/work_queue.ipp"
#include "fsdp/backend/host.ipp"
#include "fsdp/can_implement.ipp"
#include "fsdp/comm/detail/local_group.ipp"
#include "fsdp/comm/detail/local_group.members.ipp"
#include "fsdp/comm/detail/thread_ranks.ipp"
#include "fsdp/comm/launch.ipp"
#include "fsdp/comm/local.ipp"
#include "fsdp/core/text.ipp"
#include "fsdp/core/unit_index.ipp"
#include "fsdp/data/packer_state.ipp"
#include "fsdp/data/packing.ipp"
#include "fsdp/detail/exec/reduction.ipp"
#include "fsdp/detail/schedule/config.ipp"
#include "fsdp/detail/schedule/pass_cursor.ipp"
#include "fsdp/detail/schedule/scheduler.ipp"
#include "fsdp/grad/inspect.ipp"
#include "fsdp/grad/loss_scaler.ipp"
#include "fsdp/kernels/host_pool.ipp"
#include "fsdp/layout/flat_layout.ipp"
#include "fsdp/memory/cost.ipp"
#include "fsdp/memory/memory_table.ipp"
#include "fsdp/observe/trace.ipp"
#include "fsdp/plan/budget.ipp"
#include "fsdp/plan/listing.ipp"
#include "fsdp/plan/memory_plan.ipp"
#include "fsdp/plan/timeline.ipp"
#include "fsdp/policy/wrap.ipp"
#include "fsdp/spec/model_spec.ipp"

// The host backend's model core on comm::local, its executor and optimizers (fsdp/instances.hpp), which
// fsdp/fsdp.hpp declares extern in this mode: every host policy on comm::local shares them.
#include "fsdp/fsdp.hpp"
FSDP_INSTANTIATE_MODEL(fsdp::policy<fsdp::sharding::full_shard>);
