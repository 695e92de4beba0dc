#pragma once
// A policy's choices as values (fsdp::policy's strategy, prefetch, precision and offload): what the parts of a
// Model that do not depend on the policy's types decide from (fsdp::model_core, can_implement's checks).
#include "fsdp/policy/offload.hpp"
#include "fsdp/policy/precision.hpp"
#include "fsdp/policy/prefetch.hpp"
#include "fsdp/policy/sharding.hpp"

namespace fsdp {

/// The facts of a policy over a world of ranks (the strategy's groups depend on it).
struct policy_facts {
  strategy_facts strategy;
  prefetch_facts prefetch;
  precision_facts precision;
  offload_facts offload;
};

template <class Policy>
constexpr policy_facts facts_of_policy(int world) {
  return {facts_of<typename Policy::sharding>(world), facts_of_prefetch<typename Policy::prefetch>(),
          facts_of_precision<typename Policy::precision>(), facts_of_offload<typename Policy::offload>()};
}

}  // namespace fsdp
