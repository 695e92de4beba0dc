#pragma once
// Compile a Model and its optimizers once, not in every translation unit that uses them.
//
// The code of a Model<P> is its core's (fsdp::model_core), which every policy with the same backend, communicator
// and compute dtype shares, and its optimizers are over that core. Every translation unit that uses a model
// compiles the core and the optimizers it uses (seconds at -O0: docs/build.md). A trainer split over several files,
// or rebuilt often, can compile them once, as an explicit instantiation:
//
//   // my_policy.hpp, included by every file that uses the model:
//   #include <fsdp/instances.hpp>
//   using my_policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
//   FSDP_EXTERN_MODEL(my_policy);        // the others do not compile it
//
//   // my_policy.cc, one file, compiled once and linked in:
//   #include "my_policy.hpp"
//   FSDP_INSTANTIATE_MODEL(my_policy);   // compiled here, with every member
//
// Both name the same things: the policy's model_core, and optim::elementwise, sgd, adamw and lion over it (with
// their common base). What stays in each file is the policy's own part, which is small (Model<P>'s constructor and
// can_implement<P>'s shell), and what a file instantiates for itself: a step(make) with its own rule, a wrapping
// policy's constructor, checkpoint::save/load, the trainer's code. FSDP_EXTERN_MODEL may be repeated, and must come
// before the first use of the model in a file. FSDP_INSTANTIATE_MODEL instantiates a core once in a program: for two
// policies that share one (the same backend, communicator and compute dtype: full_shard and no_shard in bf16, say),
// declare both extern and instantiate one. The policy may be a type alias or the type itself (commas in it are
// fine). With the CUDA backend, instantiate in a .cu file compiled by nvcc, as the model's other users are. Nothing
// changes in what the code does: the instance is the same code, compiled elsewhere.
#include "fsdp/model.hpp"
#include "fsdp/optim/adamw.hpp"
#include "fsdp/optim/elementwise.hpp"
#include "fsdp/optim/lion.hpp"
#include "fsdp/optim/sgd.hpp"

/// The model_core of a policy.
#define FSDP_DETAIL_MODEL_CORE(...) \
  fsdp::model_core<__VA_ARGS__::backend_type, __VA_ARGS__::communicator, __VA_ARGS__::precision::compute_type>

/// Declares that the model_core of `Policy` and its optimizers are instantiated in another translation unit.
#define FSDP_EXTERN_MODEL(...)                                                                  \
  extern template class FSDP_DETAIL_MODEL_CORE(__VA_ARGS__);                                    \
  extern template class fsdp::optim::detail::shard_optimizer<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>; \
  extern template class fsdp::optim::elementwise<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;            \
  extern template class fsdp::optim::sgd<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;                    \
  extern template class fsdp::optim::adamw<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;                  \
  extern template class fsdp::optim::lion<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>

/// Instantiates the model_core of `Policy` and its optimizers here, for the translation units that declared them
/// extern; once in a program for each core.
#define FSDP_INSTANTIATE_MODEL(...)                                                      \
  template class FSDP_DETAIL_MODEL_CORE(__VA_ARGS__);                                    \
  template class fsdp::optim::detail::shard_optimizer<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>; \
  template class fsdp::optim::elementwise<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;            \
  template class fsdp::optim::sgd<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;                    \
  template class fsdp::optim::adamw<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;                  \
  template class fsdp::optim::lion<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>
