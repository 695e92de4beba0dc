#pragma once
// The library's umbrella header for the host path (any C++20 compiler, no CUDA toolkit needed).
// It names what a trainer calls, and nothing else (docs/architecture.md, "The API and the machinery"); the machinery
// under it (fsdp/detail/: the unit executor, the scheduler and the pass cursor; a folder's own detail/: the step
// program, the unit buffers; and the kernels' loops) arrives through fsdp/model.hpp as its implementation, not as
// API: its names may change in any release.
//
// The model and its policies
#include "fsdp/core/dtype.hpp"             // fsdp::dtype
#include "fsdp/core/error.hpp"             // fsdp::usage_error and the other errors
#include "fsdp/core/float16.hpp"           // fsdp::bfloat16, fsdp::half
#include "fsdp/init/init.hpp"              // init rules
#include "fsdp/layout/sharded_tensor.hpp"  // fsdp::ShardedTensor (a unit's shard_views)
#include "fsdp/model.hpp"                  // fsdp::Model<Policy>, FsdpUnit, the pass ranges
#include "fsdp/options/model_options.hpp"  // fsdp::model_options
#include "fsdp/policy.hpp"                 // fsdp::policy<Strategy, Prefetch, Precision, Offload>
#include "fsdp/policy/offload.hpp"         // offload policies
#include "fsdp/policy/precision.hpp"       // precision policies
#include "fsdp/policy/prefetch.hpp"        // prefetch policies
#include "fsdp/policy/sharding.hpp"        // sharding strategies
#include "fsdp/policy/wrap.hpp"            // wrapping policies
#include "fsdp/select.hpp"                 // fsdp::select: a policy picked at run time
#include "fsdp/spec/model_spec.hpp"        // fsdp::ModelSpec
// Ranks and communicators, backends
#include "fsdp/backend/concept.hpp"  // fsdp::Backend: a backend of your own
#include "fsdp/backend/host.hpp"     // fsdp::backend::host
#include "fsdp/comm/concept.hpp"     // fsdp::CollectivePolicy: a communicator of your own
#include "fsdp/comm/launch.hpp"      // fsdp::comm::launch: ranks as processes
#include "fsdp/comm/local.hpp"       // fsdp::comm::run_local: ranks as threads
// Optimizers and gradients
#include "fsdp/grad/inspect.hpp"      // clipping, non-finite checks (grad::options)
#include "fsdp/grad/loss_scaler.hpp"  // fp16's dynamic loss scale
#include "fsdp/optim/adamw.hpp"
#include "fsdp/optim/elementwise.hpp"  // an element-wise optimizer of your own
#include "fsdp/optim/schedule.hpp"     // learning-rate schedules, evaluated on the device
#include "fsdp/optim/sgd.hpp"
#include "fsdp/step_graph.hpp"  // a step captured once and replayed
// Weights in and out
#include "fsdp/weights/stacked.hpp"  // stacked layers' parameters
#include "fsdp/weights/weights.hpp"  // gather_full_params, load_full_params
// Data
#include "fsdp/data/async_packer.hpp"  // packing on a thread of its own
#include "fsdp/data/packer_state.hpp"  // a packer's position, for checkpoints
#include "fsdp/data/packing.hpp"       // sequence packing
// Plans and observation
#include "fsdp/memory/memory.hpp"        // memory_stats
#include "fsdp/memory/memory_table.hpp"  // the measured peak beside the plan
#include "fsdp/model_plans.hpp"          // a model's plans: plan_memory(model, opt), plan_timeline, list_step
#include "fsdp/observe/trace.hpp"        // fsdp::trace::recorder
#include "fsdp/plan/budget.hpp"          // the configuration that fits a memory budget
#include "fsdp/plan/listing.hpp"         // the step as text
#include "fsdp/plan/memory_plan.hpp"     // the memory planner
#include "fsdp/plan/timeline.hpp"        // the timeline planner

#if defined(FSDP_SEPARATE_COMPILATION)
// Separate compilation (fsdp/core/config.hpp): the host backend's model core on comm::local, with its executor and
// optimizers, is compiled once too, by fsdp/src.hpp. A program in this mode does not instantiate it itself.
#include "fsdp/instances.hpp"
FSDP_EXTERN_MODEL(fsdp::policy<fsdp::sharding::full_shard>);
#endif
