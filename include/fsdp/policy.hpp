#pragma once
// fsdp::policy composes the compile-time choices of a model: sharding strategy, prefetch, precision and the
// communicator family. Arguments in the wrong place fail with a sentence, not a template backtrace.
#include <type_traits>

#include "fsdp/comm/local.hpp"
#include "fsdp/precision/precision.hpp"
#include "fsdp/prefetch/prefetch.hpp"
#include "fsdp/sharding/sharding.hpp"

namespace fsdp {

template <class Sharding, class Prefetch = prefetch::next, class Precision = precision::full,
          class Comm = comm::local<>>
struct policy {
  static_assert(ShardingStrategy<Sharding>,
                "fsdp::policy: the first argument must be a sharding strategy "
                "(fsdp::sharding::full_shard, shard_grad_op or no_shard)");
  static_assert(PrefetchPolicy<Prefetch>,
                "fsdp::policy: the second argument must be a prefetch policy "
                "(fsdp::prefetch::none, forward<N>, backward_pre<N>, backward_post, depth<F, B>, next or explicit_schedule)");
  static_assert(PrecisionPolicy<Precision>,
                "fsdp::policy: the third argument must be a precision policy (fsdp::precision::full or "
                "fsdp::precision::mixed<Compute, float, Reduce>, with float, fsdp::bfloat16 or fsdp::float16; "
                "master shards are always float)");

  using sharding = Sharding;
  using prefetch = Prefetch;
  using precision = Precision;
  using comm = Comm;
  using communicator = typename Comm::communicator;
  using backend_type = typename Comm::backend_type;
};

}  // namespace fsdp
