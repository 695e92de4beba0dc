// Measured per-rank peak memory by category equals what the layout and the policy predict, exactly.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

using fsdp::mem;
using fsdp::comm::local_communicator;

namespace {
mlp::config cfg(const char* optimizer) {
  mlp::config c;
  c.dims = {16, 64, 32, 128, 8};  // uneven units: 1088, 2080, 4224, 1032 elements
  c.global_batch = 24;
  c.steps = 2;
  c.optimizer = optimizer;
  return c;
}

template <class Policy>
std::vector<mlp::result> train(int world, const char* optimizer) {
  std::vector<mlp::result> out(static_cast<std::size_t>(world));
  fsdp_test::run_ranks(world, [&](local_communicator& c) { out[c.rank()] = mlp::train<Policy>(c, cfg(optimizer)); });
  return out;
}

template <class Strategy, class Prefetch>
void check_plan_matches() {
  using Policy = fsdp::policy<Strategy, Prefetch>;
  for (int world : {1, 3, 4})
    for (const char* optimizer : {"adamw", "sgd"}) {
      CAPTURE(world);
      CAPTURE(optimizer);
      CAPTURE(Strategy::name);
      CAPTURE(Prefetch::forward_depth);
      CAPTURE(Prefetch::backward_depth);
      for (const auto& r : train<Policy>(world, optimizer)) {
        for (std::size_t k = 0; k < fsdp::mem_categories; ++k) {
          CAPTURE(fsdp::name_of(static_cast<mem>(k)));
          CHECK(r.memory.peak.bytes[k] == r.planned.bytes[k]);
        }
        // after training only persistent state remains: shards, gradients, optimizer state
        CHECK(r.memory.current[mem::gathered_params] == 0);
        CHECK(r.memory.current[mem::comm_buffers] == 0);
        CHECK(r.memory.current[mem::sharded_params] == r.planned[mem::sharded_params]);
      }
    }
}
}  // namespace

TEST_CASE("planned peak equals measured peak, per category, for every strategy and prefetch depth") {
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::none>();
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next>();
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::forward<2>>();
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::backward_pre<2>>();
  check_plan_matches<fsdp::sharding::shard_grad_op, fsdp::prefetch::next>();
  check_plan_matches<fsdp::sharding::shard_grad_op, fsdp::prefetch::none>();
  check_plan_matches<fsdp::sharding::no_shard, fsdp::prefetch::next>();
}

TEST_CASE("the figures themselves, worked out by hand for 4 ranks") {
  // Per unit (align 16): elements 1088 | 2080 | 4224 | 1032; shards 272 | 528 | 1056 | 272;
  // padded 1088 | 2112 | 4224 | 1088. Bytes are 4 per element.
  const auto none = train<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::none>>(4, "adamw")[1].memory.peak;
  CHECK(none[mem::sharded_params] == 2128 * 4);
  CHECK(none[mem::grads] == 2128 * 4);
  CHECK(none[mem::optimizer_state] == 2 * 2128 * 4);
  CHECK(none[mem::gathered_params] == 4224 * 4);            // one unit at a time: the largest
  CHECK(none[mem::comm_buffers] == (4224 + 1056) * 4);      // its unsharded gradient + reduce-scatter output
  const auto next = train<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>>(4, "sgd")[0].memory.peak;
  CHECK(next[mem::gathered_params] == (2112 + 4224) * 4);  // a unit and its neighbour
  CHECK(next[mem::optimizer_state] == 2128 * 4);           // one momentum buffer
  const auto sgo = train<fsdp::policy<fsdp::sharding::shard_grad_op>>(4, "adamw")[2].memory.peak;
  CHECK(sgo[mem::gathered_params] == (1088 + 2112 + 4224 + 1088) * 4);  // everything, kept until backward
  const auto ddp = train<fsdp::policy<fsdp::sharding::no_shard>>(4, "adamw")[3].memory.peak;
  CHECK(ddp[mem::sharded_params] == (1088 + 2080 + 4224 + 1040) * 4);  // full replicas (padded to 16)
  CHECK(ddp[mem::gathered_params] == 0);
  CHECK(ddp[mem::comm_buffers] == 4224 * 4);
}
