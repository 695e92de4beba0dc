#pragma once
// fsdp::policy composes the compile-time choices of a model: sharding strategy, prefetch, precision, the
// communicator family and offload. Arguments in the wrong place fail with a sentence, not a template backtrace.
#include <type_traits>

#include "fsdp/backend/concept.hpp"
#include "fsdp/comm/local.hpp"
#include "fsdp/policy/offload.hpp"
#include "fsdp/policy/precision.hpp"
#include "fsdp/policy/prefetch.hpp"
#include "fsdp/policy/sharding.hpp"
#include "fsdp/policy_facts.hpp"

namespace fsdp {

template <class Sharding, class Prefetch = prefetch::next, class Precision = precision::full,
          class Comm = comm::local<>, class Offload = offload::none>
struct policy {
  static_assert(ShardingStrategy<Sharding>,
                "fsdp::policy: the first argument must be a sharding strategy "
                "(fsdp::sharding::full_shard, shard_grad_op, zero1, no_shard or a hybrid one)");
  static_assert(
      PrefetchPolicy<Prefetch>,
      "fsdp::policy: the second argument must be a prefetch policy "
      "(fsdp::prefetch::none, forward<N>, backward_pre<N>, backward_post, depth<F, B>, next or explicit_schedule)");
  static_assert(PrecisionPolicy<Precision>,
                "fsdp::policy: the third argument must be a precision policy (fsdp::precision::full or "
                "fsdp::precision::mixed<Compute, float, Reduce>, with float, fsdp::bfloat16 or fsdp::float16; "
                "master shards are always float)");

  static_assert(OffloadPolicy<Offload>,
                "fsdp::policy: the fifth argument must be an offload policy (fsdp::offload::none, or "
                "fsdp::offload::cpu<parts> with fsdp::offload::params, grads and optimizer_state joined with |)");
  static_assert(!Offload::facts.any() || OffloadBackend<typename Comm::backend_type>,
                "fsdp::policy: this offload policy keeps buffers in host memory, but the communicator's backend has "
                "no host memory domain or copy streams (it does not model fsdp::OffloadBackend)");

  using sharding = Sharding;
  using prefetch = Prefetch;
  using precision = Precision;
  using comm = Comm;
  using offload = Offload;
  using communicator = typename Comm::communicator;
  using backend_type = typename Comm::backend_type;
};

}  // namespace fsdp
