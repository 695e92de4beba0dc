// Experts on their own mesh, over thread ranks: the expert dimension's groups, each rank's share of the experts
// (its local shapes and the global model's initial values), the refusals, and training parity: a mixture-of-experts
// trainer (a dense projection and a router, then top-1 experts reached by the trainer's all_to_all_v on the model's
// expert group) at expert_parallel = 1, 2, 4 over 1 to 3 ranks holding the same experts trains the same global
// model as one rank holding every expert, under every sharding strategy.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <fsdp/elastic/reshard.hpp>

#include "tests/support/moe.hpp"
#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::members;
using fsdp_test::run_ranks;

namespace {
using namespace fsdp_test::moe;

struct trained {
  std::vector<float> losses;                         ///< rank 0's: the global mean loss of each step
  std::vector<double> norms;                         ///< rank 0's gradient norm of each step (with max_norm)
  std::map<std::string, std::vector<float>> params;  ///< every global parameter after training
  bool memory_as_planned = true;                     ///< every rank's measured peak equals its planned peak
  rank_result first;                                 ///< rank 0's counts
};

/// The trainer (tests/support/moe.hpp) at `world` thread ranks, `expert` of them an expert group.
template <class Policy>
trained train(int world, int expert, float max_norm = 0.0f) {
  std::vector<rank_result> ranks(static_cast<std::size_t>(world));
  run_ranks(world, [&](local_communicator& c) {
    ranks[std::size_t(c.rank())] = fsdp_test::moe::train<Policy>(c, expert, max_norm);
  });
  trained out;
  out.losses = ranks[0].losses;
  out.norms = ranks[0].norms;
  for (const rank_result& r : ranks) out.memory_as_planned = out.memory_as_planned && r.memory_as_planned;
  std::vector<std::map<std::string, std::vector<float>>> local;
  for (int q = 0; q < expert; ++q) local.push_back(ranks[std::size_t(q)].params);
  out.params = global_params(local, expert);
  out.first = std::move(ranks[0]);
  return out;
}

float relative(float a, float b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-3f); }

/// The trainer under policy P at `world` ranks with expert groups of `expert` against one rank holding every expert.
template <class P>
void check_policy_parity(int world, int expert, float max_norm = 0.0f) {
  using Strategy = typename P::sharding;
  CAPTURE(Strategy::name);
  CAPTURE(world);
  CAPTURE(expert);
  CAPTURE(max_norm);
  const trained ep = train<P>(world, expert, max_norm),
                one = train<fsdp::policy<fsdp::sharding::full_shard>>(1, 1, max_norm);
  constexpr float tolerance = 2e-5f;
  REQUIRE(ep.losses.size() == one.losses.size());
  for (std::size_t s = 0; s < one.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(relative(ep.losses[s], one.losses[s]) <= tolerance);
  }
  REQUIRE(ep.norms.size() == one.norms.size());
  for (std::size_t s = 0; s < one.norms.size(); ++s) {  // every expert counted once, none missed
    CAPTURE(s);
    CHECK(std::fabs(ep.norms[s] - one.norms[s]) <= tolerance * one.norms[s]);
    CHECK(one.norms[s] > max_norm);  // so the clipping acted
  }
  CHECK(ep.memory_as_planned);
  // per step the trainer's four exchanges (dispatch and combine, forward and backward); each unit's one reduction
  // a step, the expert unit's on the expert shard group when there is one
  CHECK(ep.first.expert_exchanges == (expert > 1 ? 4 * steps : 0));
  if (Strategy::shards_params) CHECK(ep.first.dense_reductions == (expert > 1 ? 1 : 2) * steps);
  CHECK(ep.first.expert_reductions == (expert > 1 ? steps : 0));
  CHECK(fsdp_test::worst_error(ep.params, one.params) <= tolerance);
}
template <class Strategy>
void check_parity(int world, int expert, float max_norm = 0.0f) {
  check_policy_parity<fsdp::policy<Strategy>>(world, expert, max_norm);
}

using fsdp::sharding::full_shard;
using fsdp::sharding::hybrid_shard;
using fsdp::sharding::hybrid_shard_zero2;
using fsdp::sharding::no_shard;
using fsdp::sharding::shard_grad_op;
using fsdp::sharding::zero1;

}  // namespace

TEST_CASE(
    "the expert dimension: expert groups are consecutive data-parallel ranks; the ranks holding the same experts "
    "shard them") {
  std::map<int, std::vector<int>> expert_group, expert_shard, shard;
  std::mutex mu;
  // full_shard over 8 ranks, expert_parallel 2: the mesh 1 x 4 x 2 x 1
  run_ranks(8, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<full_shard>> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    CHECK(m.mesh() == fsdp::device_mesh{1, 8, 1, 2});
    CHECK(fsdp::mesh::sizes_text(m.mesh()) == "1 x 4 x 2 x 1");
    CHECK(m.mesh().expert_rank(c.rank()) == c.rank() % 2);
    CHECK(m.mesh().expert_shard_rank(c.rank()) == c.rank() / 2);
    CHECK(m.mesh().shard_rank(c.rank()) == c.rank());
    REQUIRE(m.expert_comm() != nullptr);
    REQUIRE(m.expert_shard_comm() != nullptr);
    CHECK(m.replicate_comm() == nullptr);
    // each rank holds half the experts, sharded over 4 ranks; the dense parameters over all 8
    CHECK(m.spec().at("u.moe.w1").shape == std::vector<std::int64_t>{X / 2, H, D});
    CHECK(m.spec().at("u.dense.w").shape == std::vector<std::int64_t>{D, D});
    CHECK(m.unit("u.moe").layout().world() == 4);
    CHECK(m.unit("u.dense").layout().world() == 8);
    auto e = members(*m.expert_comm(), c.rank(), m.backend());
    auto es = members(*m.expert_shard_comm(), c.rank(), m.backend());
    std::lock_guard lk(mu);
    expert_group[c.rank()] = e;
    expert_shard[c.rank()] = es;
  });
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(expert_group[r] == std::vector<int>{r / 2 * 2, r / 2 * 2 + 1});
    CHECK(expert_shard[r] == std::vector<int>{r % 2, r % 2 + 2, r % 2 + 4, r % 2 + 6});
  }
  // hybrid_shard<4> over 8 ranks, expert_parallel 2: experts within a replica, the replicas as for dense units
  run_ranks(8, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<hybrid_shard<4>>> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    CHECK(m.mesh() == fsdp::device_mesh{2, 4, 1, 2});
    REQUIRE(m.replicate_comm() != nullptr);
    auto es = members(*m.expert_shard_comm(), c.rank(), m.backend());
    auto s = members(m.shard_comm(), c.rank(), m.backend());
    std::lock_guard lk(mu);
    expert_shard[c.rank()] = es;
    shard[c.rank()] = s;
  });
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(expert_shard[r] == std::vector<int>{r / 4 * 4 + r % 2, r / 4 * 4 + r % 2 + 2});
    CHECK(shard[r] == std::vector<int>{r / 4 * 4, r / 4 * 4 + 1, r / 4 * 4 + 2, r / 4 * 4 + 3});
  }
  // no_shard over 6 ranks, expert_parallel 2: the dimension comes out of the replicas; whole experts all-reduced
  // over the ranks that hold the same ones
  run_ranks(6, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<no_shard>> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    CHECK(m.mesh() == fsdp::device_mesh{6, 1, 1, 2});
    CHECK(fsdp::mesh::sizes_text(m.mesh()) == "3 x 1 x 2 x 1");
    CHECK(m.unit("u.moe").layout().world() == 1);
    CHECK(members(*m.expert_shard_comm(), c.rank(), m.backend()) ==
          std::vector<int>{c.rank() % 2, c.rank() % 2 + 2, c.rank() % 2 + 4});
    CHECK(members(*m.expert_comm(), c.rank(), m.backend()) == std::vector<int>{c.rank() / 2 * 2, c.rank() / 2 * 2 + 1});
  });
}

TEST_CASE("each rank holds its share of the experts: the global model's initial values, whatever the expert groups") {
  const auto at_start = [](int world, int expert) {
    std::vector<std::map<std::string, std::vector<float>>> local(static_cast<std::size_t>(expert));
    std::mutex mu;
    run_ranks(world, [&](local_communicator& c) {
      fsdp::model_options o;
      o.expert_parallel = expert;
      fsdp::Model<fsdp::policy<full_shard>> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
      auto full = fsdp::weights::gather_full_params(m);
      std::lock_guard lk(mu);
      if (c.rank() < expert) local[std::size_t(c.rank())] = std::move(full);
    });
    return global_params(local, expert);
  };
  const auto one = at_start(1, 1);
  CHECK(at_start(2, 2) == one);
  CHECK(at_start(4, 4) == one);
  CHECK(at_start(6, 2) == one);
  CHECK(at_start(8, 4) == one);
}

TEST_CASE(
    "experts train the same global model as one rank holding every expert: full_shard, E = 1, 2, 4 x 1 to 3 "
    "ranks holding the same experts") {
  for (int expert : {1, 2, 4})
    for (int edp : {1, 2, 3}) check_parity<full_shard>(expert * edp, expert);
}

TEST_CASE("experts under shard_grad_op, zero1, no_shard and the hybrid strategies") {
  for (int expert : {2, 4}) {
    check_parity<shard_grad_op>(expert * 2, expert);
    check_parity<zero1>(expert * 2, expert);
    check_parity<no_shard>(expert, expert);
    check_parity<no_shard>(expert * 3, expert);
  }
  check_parity<hybrid_shard<2>>(4, 2);
  check_parity<hybrid_shard<4>>(8, 2);
  check_parity<hybrid_shard<4>>(8, 4);
  check_parity<hybrid_shard_zero2<4>>(12, 2);
}

TEST_CASE("experts with CPU offload: master shards, gradients and optimizer state of both kinds in host memory") {
  namespace off = fsdp::offload;
  using fsdp::policy;
  using full = fsdp::precision::full;
  using next = fsdp::prefetch::next;
  check_policy_parity<policy<full_shard, next, full, fsdp::comm::local<>, off::all>>(4, 2);  // the host optimizer
  check_policy_parity<policy<full_shard, next, full, fsdp::comm::local<>, off::cpu<off::params>>>(4, 2, 0.05f);
  check_policy_parity<policy<no_shard, next, full, fsdp::comm::local<>, off::cpu<off::optimizer_state>>>(4, 2);
}

TEST_CASE("clipping over dense and expert shards: one global norm, every expert counted once") {
  check_parity<full_shard>(4, 2, 0.05f);
  check_parity<hybrid_shard<2>>(8, 2, 0.05f);
  check_parity<no_shard>(6, 2, 0.05f);  // the expert dimension out of the replicas: whole experts on 3 ranks each
}

TEST_CASE(
    "a non-finite expert gradient on one rank skips the step on every rank, named, and backs the loss scale off "
    "everywhere") {
  // rank 3 writes an inf into its first local expert's gradient: reduced over its expert shard group {1, 3}, it lands
  // in rank 1's shard of u.moe (the first of that group's shards); no_shard all-reduces it to ranks 1 and 3
  const auto run = [](auto policy, int world, int first_holder, int holders) {
    using P = decltype(policy);
    std::vector<fsdp::grad::report> reports(static_cast<std::size_t>(world));
    std::vector<float> scales(static_cast<std::size_t>(world));
    std::vector<char> unchanged(static_cast<std::size_t>(world));  // not vector<bool>: ranks write their own
    run_ranks(world, [&](local_communicator& c) {
      fsdp::model_options o;
      o.expert_parallel = 2;
      fsdp::Model<P> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{0.3f, 5}, o);
      fsdp::grad::loss_scaler scaler({.init_scale = 1024.0f});
      fsdp::optim::adamw opt(m, {.lr = 1e-2f, .grad = {.locate_nonfinite = true, .scaler = &scaler}});
      const auto before = fsdp::weights::gather_full_params(m);
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries()) {
          const auto g = u.grad(e.name);
          for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = 0.01f;
          if (c.rank() == 3 && e.name == "u.moe.w1") g[0] = std::numeric_limits<float>::infinity();
        }
      const fsdp::grad::report r = opt.step();
      m.synchronize();
      const bool same = fsdp::weights::gather_full_params(m) == before;
      reports[std::size_t(c.rank())] = r;
      scales[std::size_t(c.rank())] = scaler.scale();
      unchanged[std::size_t(c.rank())] = same;
    });
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      const fsdp::grad::report& rep = reports[std::size_t(r)];
      CHECK(rep.skipped);
      CHECK(unchanged[std::size_t(r)]);
      CHECK(scales[std::size_t(r)] == 512.0f);  // backed off by the default factor of 2, on every rank
      REQUIRE(rep.nonfinite.has_value());
      CHECK(rep.nonfinite->rank == first_holder);
      CHECK(rep.nonfinite->unit_name == "u.moe");
      CHECK(rep.nonfinite->count == holders);
    }
  };
  run(fsdp::policy<full_shard>{}, 4, 1, 1);
  run(fsdp::policy<no_shard>{}, 4, 1, 2);
}

TEST_CASE(
    "the timeline planner puts an expert unit's collectives on the expert shard group and the trainer's token "
    "exchanges on the expert group") {
  using namespace std::chrono_literals;
  // links that cost their latency alone (bandwidths too high for a byte to count): which link a collective took shows
  // in its duration
  const fsdp::comm::link_model dense{.bytes_per_second = 1e30, .latency = 7000ns},
      expert_shard{.bytes_per_second = 1e30, .latency = 1000ns};
  run_ranks(4, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<full_shard>> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    fsdp::time_model t;
    t.compute.assign(m.size(), {});
    t.link = dense;
    t.expert_shard_link = expert_shard;
    const fsdp::timeline tl = fsdp::plan_timeline(m, t, 2);
    const std::size_t d = m.unit("u.dense").index(), e = m.unit("u.moe").index();
    CHECK(tl.by_unit[d].reduce_ns == 7000);      // one reduce-scatter a step, over the 4 ranks
    CHECK(tl.by_unit[e].reduce_ns == 1000);      // over the expert shard group
    CHECK(tl.by_unit[e].gather_ns == 2 * 1000);  // gathered for its forward and again for its backward
    // the trainer's exchanges: u.moe's forward sends 4,000 bytes, its backward 2,000, as all_to_alls over the
    // expert group of 2 on its own link (every other link free): 500 ns + 1/2 of the bytes at 1 GB/s each
    fsdp::time_model x;
    x.compute.assign(m.size(), {});
    x.expert_link = {.bytes_per_second = 1e9, .latency = 500ns};
    x.compute[e].expert_forward_bytes = 4000;
    x.compute[e].expert_backward_bytes = 2000;
    CHECK(fsdp::plan_timeline(m, x, 2).step_ns == (500 + 2000) + (500 + 1000));
    // the planning command's units on the same mesh, from the global spec: the model's layouts
    const fsdp::planned_units u = fsdp::plan_units("ep2", spec(), fsdp::wrap::by_prefix{"u."}, m.mesh());
    REQUIRE(u.layouts.size() == m.size());
    for (std::size_t k = 0; k < m.size(); ++k) {
      CHECK(u.layouts[k].world() == m.unit(k).layout().world());
      CHECK(u.layouts[k].shard_numel() == m.unit(k).layout().shard_numel());
      CHECK(u.layouts[k].experts() == m.unit(k).layout().experts());
    }
  });
  // no_shard: the expert unit all-reduces over the 2 ranks holding its experts, the dense one over all 4
  run_ranks(4, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<no_shard>> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    fsdp::time_model t;
    t.compute.assign(m.size(), {});
    t.link = {.bytes_per_second = 1e30, .step_latency = 100ns};  // a ring's steps: 2 (n - 1) for an all-reduce
    t.expert_shard_link = t.link;
    const fsdp::timeline tl = fsdp::plan_timeline(m, t, 2);
    CHECK(tl.by_unit[m.unit("u.dense").index()].reduce_ns == 600);
    CHECK(tl.by_unit[m.unit("u.moe").index()].reduce_ns == 200);
  });
  // on a cluster of 4 GPUs a node: expert groups {0, 1} inside a node, expert shard groups {0, 2, 4, 6} across two
  const fsdp::comm::cluster_links cluster{.gpus_per_node = 4,
                                          .intra = {.bytes_per_second = 100e9, .latency = 2us},
                                          .inter = {.bytes_per_second = 10e9, .latency = 20us}};
  fsdp::time_model t;
  fsdp::place_on_cluster(t, cluster, fsdp::device_mesh{1, 8, 1, 2});
  CHECK(t.expert == 2);
  CHECK(t.expert_link.bytes_per_second == 100e9);
  REQUIRE(t.expert_shard_link.has_value());
  CHECK(t.expert_shard_link->bytes_per_second == 20e9);  // two of a group's ranks a node: two GPUs' share
  CHECK(t.link.bytes_per_second == 40e9);
}

TEST_CASE("what the expert dimension refuses, each with its sentence") {
  const auto refusals = [](auto policy, int world, int expert, const fsdp::ModelSpec& spec) {
    fsdp::model_options o;
    o.expert_parallel = expert;
    return fsdp::can_implement<decltype(policy)>(spec, fsdp::wrap::by_prefix{"u."}, o, world).text();
  };
  CHECK(refusals(fsdp::policy<full_shard>{}, 4, 0, spec()) ==
        "model_options::expert_parallel must be at least 1 (every rank holds every expert), got 0\n");
  CHECK(refusals(fsdp::policy<full_shard>{}, 6, 4, spec()) ==
        "model_options::expert_parallel = 4 does not divide the 6 data-parallel ranks (the world of 6 over "
        "model_options::tensor_parallel = 1)\n");
  CHECK(refusals(fsdp::policy<hybrid_shard<3>>{}, 6, 2, spec()) ==
        "model_options::expert_parallel = 2 does not divide the shard group of 3 ranks (sharding strategy hybrid_shard "
        "over 2 replicas): an expert group is ranks of one replica\n");
  fsdp::ModelSpec odd;
  odd.add("u.moe.w", {3, 4}, {.experts = true});
  CHECK(refusals(fsdp::policy<full_shard>{}, 2, 2, odd) ==
        "parameter 'u.moe.w' of shape [3, 4] stacks 3 experts, which model_options::expert_parallel = 2 does not "
        "divide: each rank of an expert group holds an equal share of the experts\n");
  fsdp::ModelSpec mixed;
  mixed.add("u.moe.gate", {4, 4}).add("u.moe.w", {4, 4}, {.experts = true});
  CHECK(refusals(fsdp::policy<full_shard>{}, 2, 2, mixed) ==
        "unit 'u.moe' holds expert parameter 'u.moe.w' and dense parameter 'u.moe.gate': wrap the experts in a unit of "
        "their own (their gathers and reductions go to the expert shard group; fsdp::wrap::experts_apart{policy} "
        "does)\n");
  // resharding in memory: refused, naming the checkpoint route
  run_ranks(2, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<full_shard>> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    CHECK(error_of<fsdp::usage_error>([&] { fsdp::elastic::reshard_request_of(m, {1, 1}, {0}, {0}); }) ==
          "fsdp: reshard: the model has expert groups of 2; resharding with expert parallelism is not built yet (save "
          "a checkpoint, which holds global expert tensors, and load it at the new mesh)");
    // the survivors' agreement too, before its collective (every survivor's mesh is the same)
    CHECK(error_of<fsdp::usage_error>([&] { fsdp::elastic::agree(m, {0, 1}, c, m.backend()); }) ==
          "fsdp: agree: the model has expert groups of 2; resharding with expert parallelism is not built yet (save "
          "a checkpoint, which holds global expert tensors, and load it at the new mesh)");
  });
  // the planners' units on a mesh: what cannot be laid out
  CHECK(error_of<fsdp::usage_error>(
            [&] { fsdp::plan_units("x", spec(), fsdp::wrap::by_prefix{"u."}, fsdp::device_mesh{3, 1, 1, 2}); }) ==
        "fsdp: plan_units: an expert degree of 2 divides neither the 1 shards nor, with one shard, the 3 replicas "
        "of the mesh");
  CHECK(error_of<fsdp::usage_error>(
            [&] { fsdp::plan_units("x", mixed, fsdp::wrap::by_prefix{"u."}, fsdp::device_mesh{1, 2, 1, 2}); }) ==
        "fsdp: unit 'u.moe' holds expert parameter 'u.moe.w' and dense parameter 'u.moe.gate': wrap the experts "
        "in a unit of their own (their gathers and reductions go to the expert shard group; "
        "fsdp::wrap::experts_apart{policy} does)");
  // as experts_apart does: the same spec wrapped into u.moe (the gate) and u.moe.experts
  fsdp::model_options two;
  two.expert_parallel = 2;
  const fsdp::wrap::experts_apart<fsdp::wrap::by_prefix> apart{fsdp::wrap::by_prefix{"u."}};
  CHECK(bool(fsdp::can_implement<fsdp::policy<full_shard>>(mixed, apart, two, 2)));
  const std::vector<fsdp::unit_plan> units = fsdp::make_units(mixed, apart);
  REQUIRE(units.size() == 2u);
  CHECK(units[0].name == "u.moe");
  CHECK(units[1].name == "u.moe.experts");
  fsdp::ModelSpec s;
  CHECK(error_of<fsdp::usage_error>([&] { s.add("moe.w", {4, 8}, {.tensor = fsdp::tp::split(0), .experts = true}); }) ==
        "fsdp: parameter 'moe.w' stacks experts on dimension 0 and is split across the tensor group on that "
        "dimension too: split an expert on another dimension (tp::split(1) or later)");
}
