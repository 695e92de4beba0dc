#pragma once
// Compile a Model and its optimizers once, not in every translation unit that uses them.
//
// Every translation unit that uses fsdp::Model<P> compiles all of Model<P>'s code and its optimizers' (about 5 s at
// -O0 for one policy, on the development machine: docs/build.md). A trainer split over several files, or rebuilt
// often, can compile them once, as an explicit instantiation:
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
// Both name the same things: Model<P>, and optim::elementwise, sgd, adamw and lion over it (with their common base).
// What stays in each file is what it instantiates for itself: a step(make) with its own rule, a wrapping policy's
// constructor, checkpoint::save/load, the trainer's code. FSDP_EXTERN_MODEL must come before the first use of
// Model<P> in a file. The policy may be a type alias or the type itself (commas in it are fine). With the CUDA
// backend, instantiate in a .cu file compiled by nvcc, as the model's other users are. Nothing changes in what the
// code does: the instance is the same code, compiled elsewhere.
#include "fsdp/model.hpp"
#include "fsdp/optim/adamw.hpp"
#include "fsdp/optim/elementwise.hpp"
#include "fsdp/optim/lion.hpp"
#include "fsdp/optim/sgd.hpp"

/// Declares that Model<Policy> and its optimizers are instantiated in another translation unit.
#define FSDP_EXTERN_MODEL(...)                                                         \
  extern template class fsdp::Model<__VA_ARGS__>;                                      \
  extern template class fsdp::optim::detail::shard_optimizer<fsdp::Model<__VA_ARGS__>>; \
  extern template class fsdp::optim::elementwise<fsdp::Model<__VA_ARGS__>>;            \
  extern template class fsdp::optim::sgd<fsdp::Model<__VA_ARGS__>>;                    \
  extern template class fsdp::optim::adamw<fsdp::Model<__VA_ARGS__>>;                  \
  extern template class fsdp::optim::lion<fsdp::Model<__VA_ARGS__>>

/// Instantiates Model<Policy> and its optimizers here, for the translation units that declared them extern.
#define FSDP_INSTANTIATE_MODEL(...)                                             \
  template class fsdp::Model<__VA_ARGS__>;                                      \
  template class fsdp::optim::detail::shard_optimizer<fsdp::Model<__VA_ARGS__>>; \
  template class fsdp::optim::elementwise<fsdp::Model<__VA_ARGS__>>;            \
  template class fsdp::optim::sgd<fsdp::Model<__VA_ARGS__>>;                    \
  template class fsdp::optim::adamw<fsdp::Model<__VA_ARGS__>>;                  \
  template class fsdp::optim::lion<fsdp::Model<__VA_ARGS__>>
