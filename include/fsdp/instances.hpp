#pragma once
// Compile a Model and its optimizers once, not in every translation unit that uses them.
//
// The code of a Model<P> is its core's (fsdp::model_core) and its executor's, which every policy with the same
// backend and communicator shares, and its optimizers are over that core. Every translation unit that uses a model
// compiles them (seconds at -O0: docs/build.md). A trainer split over several files,
// or rebuilt often, can compile them once, as an explicit instantiation:
//
//   // my_policy.hpp, included by every file that uses the model:
//   #include <fsdp/instances.hpp>
//   using my_policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
//   fsdp::precision::mixed<fsdp::bfloat16>>; FSDP_EXTERN_MODEL(my_policy);        // the others do not compile it
//
//   // my_policy.cc, one file, compiled once and linked in:
//   #include "my_policy.hpp"
//   FSDP_INSTANTIATE_MODEL(my_policy);   // compiled here, with every member
//
// Both name the same things: the policy's model_core, the executor's classes over its backend and communicator
// (exec::unit_executor, interpreter, transfers), and optim::elementwise, sgd, adamw and lion over the core (with
// their common base; a built-in optimizer added to fsdp/optim/ gets a row in FSDP_DETAIL_MODEL_CLASSES below, and
// docs/optimizers.md says so). What stays in each file is the policy's own part, which is small (Model<P>'s
// constructor, can_implement<P>'s shell, the typed units of basic_model), and what a file instantiates for itself: a
// step(make) with its own rule, a wrapping policy's constructor, checkpoint::save/load, the trainer's code.
// FSDP_EXTERN_MODEL may be repeated, and must come before the first use of the model in a file. FSDP_INSTANTIATE_MODEL
// instantiates a core once in a program: every policy with the same backend and communicator shares one (all the host
// policies on comm::local, whatever their strategy, precision or offload), so instantiate one of them. The policy may
// be a type alias or the type itself (commas in it are fine). With the CUDA backend, instantiate in a .cu file compiled
// by nvcc, as the model's other users are (tests/cuda/model_instances.cu does, for comm::local and comm::nccl).
// Nothing changes in what the code does: the instance is the same code, compiled elsewhere. In separate-compilation
// mode (fsdp/core/config.hpp) fsdp/fsdp.hpp declares the host core on comm::local extern and fsdp/src.hpp
// instantiates it: do not instantiate that one again; other backends and communicators are as above.
#include "fsdp/model.hpp"
#include "fsdp/optim/adamw.hpp"
#include "fsdp/optim/elementwise.hpp"
#include "fsdp/optim/lion.hpp"
#include "fsdp/optim/sgd.hpp"

/// The model_core of a policy, and the executor's classes over its backend and communicator.
#define FSDP_DETAIL_MODEL_CORE(...) fsdp::model_core<__VA_ARGS__::backend_type, __VA_ARGS__::communicator>
#define FSDP_DETAIL_MODEL_CLASSES(how, ...)                                                          \
  how class FSDP_DETAIL_MODEL_CORE(__VA_ARGS__);                                                     \
  how class fsdp::detail::exec::unit_executor<__VA_ARGS__::backend_type, __VA_ARGS__::communicator>; \
  how class fsdp::detail::exec::interpreter<__VA_ARGS__::backend_type, __VA_ARGS__::communicator>;   \
  how class fsdp::detail::exec::transfers<__VA_ARGS__::backend_type, __VA_ARGS__::communicator>;     \
  how class fsdp::optim::detail::shard_optimizer<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;               \
  how class fsdp::optim::elementwise<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;                           \
  how class fsdp::optim::sgd<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;                                   \
  how class fsdp::optim::adamw<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>;                                 \
  how class fsdp::optim::lion<FSDP_DETAIL_MODEL_CORE(__VA_ARGS__)>

/// Declares that the model_core of `Policy`, its executor and its optimizers are instantiated in another
/// translation unit.
#define FSDP_EXTERN_MODEL(...) FSDP_DETAIL_MODEL_CLASSES(extern template, __VA_ARGS__)

/// Instantiates the model_core of `Policy`, its executor and its optimizers here, for the translation units that
/// declared them extern; once in a program for each backend and communicator.
#define FSDP_INSTANTIATE_MODEL(...) FSDP_DETAIL_MODEL_CLASSES(template, __VA_ARGS__)
