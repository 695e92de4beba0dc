// Hybrid sharding on a replicas x shards mesh over thread ranks: which collectives go to which group, exactly,
// and how the groups fail. Parity with the single-process reference is in precision_parity_test.cc; the memory
// planner's exactness for hybrid strategies in memory_test.cc.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cstring>
#include <map>
#include <mutex>

#include "tests/support/support.hpp"

using fsdp::collective;
using fsdp::comm::local_communicator;
using fsdp_test::five_units;
using fsdp_test::run_ranks;

namespace {
std::size_t at(collective c) { return static_cast<std::size_t>(c); }

/// One forward and backward of five_units; the stats of the world, shard and replicate communicators during it.
struct step_stats {
  fsdp::collective_stats world, shard, replicate;
  std::int64_t reduced_bytes =
      0;  ///< what the replicate group's all-reduces must move: every shard, in the reduce dtype
};

template <class Policy>
step_stats one_step(local_communicator& c) {
  fsdp::Model<Policy> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
  c.reset_stats();
  m.shard_comm().reset_stats();
  if (m.replicate_comm()) m.replicate_comm()->reset_stats();
  for (auto& u : m.forward()) (void)u;
  for (auto& u : m.backward()) (void)u;
  m.synchronize();
  step_stats s;
  s.world = c.stats();
  s.shard = m.shard_comm().stats();
  if (m.replicate_comm()) s.replicate = m.replicate_comm()->stats();
  for (std::size_t u = 0; u < m.size(); ++u)
    s.reduced_bytes += m.unit(u).layout().shard_numel() *
                       std::int64_t(fsdp::size_of(fsdp::dtype_of_v<typename Policy::precision::reduce_type>));
  return s;
}

template <class Policy>
std::vector<step_stats> steps(int world) {
  std::vector<step_stats> out(static_cast<std::size_t>(world));
  run_ranks(world, [&](local_communicator& c) { out[c.rank()] = one_step<Policy>(c); });
  return out;
}

template <class Hybrid, class Flat, int Shards, class Precision>
void check_groups(int replicas) {
  using H = fsdp::policy<Hybrid, fsdp::prefetch::next, Precision>;
  using F = fsdp::policy<Flat, fsdp::prefetch::next, Precision>;
  const int world = replicas * Shards;
  CAPTURE(world);
  CAPTURE(Hybrid::name);
  const std::vector<step_stats> hybrid = steps<H>(world), flat = steps<F>(Shards);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const step_stats &h = hybrid[r], &f = flat[r % Shards];
    // the shard group issues exactly what the same strategy issues on a world of its size
    for (collective k : {collective::all_gather, collective::reduce_scatter}) {
      CHECK(h.shard[k] == f.world[k]);
      CHECK(h.shard.bytes[at(k)] == f.world.bytes[at(k)]);
    }
    CHECK(h.shard[collective::all_reduce] == 0);
    // the replicate group: one all-reduce per unit, of the reduced shard
    CHECK(h.replicate[collective::all_reduce] == 5);
    CHECK(h.replicate.bytes[at(collective::all_reduce)] == std::uint64_t(h.reduced_bytes));
    CHECK(h.replicate[collective::all_gather] + h.replicate[collective::reduce_scatter] == 0);
    // and the world communicator itself carries nothing during a step
    for (collective k : {collective::all_gather, collective::reduce_scatter, collective::all_reduce})
      CHECK(h.world[k] == 0);
  }
}
}  // namespace

TEST_CASE(
    "collectives per group per step: the shard group's are the flat strategy's, the replicas all-reduce each shard") {
  using fsdp::bfloat16;
  using full = fsdp::precision::full;
  using bf16 = fsdp::precision::mixed<bfloat16, float, bfloat16>;
  check_groups<fsdp::sharding::hybrid_shard<2>, fsdp::sharding::full_shard, 2, full>(2);
  check_groups<fsdp::sharding::hybrid_shard<4>, fsdp::sharding::full_shard, 4, full>(2);
  check_groups<fsdp::sharding::hybrid_shard<2>, fsdp::sharding::full_shard, 2, bf16>(3);
  check_groups<fsdp::sharding::hybrid_shard_zero2<2>, fsdp::sharding::shard_grad_op, 2, full>(2);
  check_groups<fsdp::sharding::hybrid_shard_zero2<4>, fsdp::sharding::shard_grad_op, 4, bf16>(2);
  // shard groups of one rank: full_shard (shard_grad_op) in a group of one, the replicas all-reduce
  check_groups<fsdp::sharding::hybrid_shard<1>, fsdp::sharding::full_shard, 1, full>(2);
  check_groups<fsdp::sharding::hybrid_shard<1>, fsdp::sharding::full_shard, 1, bf16>(5);
  check_groups<fsdp::sharding::hybrid_shard_zero2<1>, fsdp::sharding::shard_grad_op, 1, full>(5);
  check_groups<fsdp::sharding::hybrid_shard_zero2<1>, fsdp::sharding::shard_grad_op, 1, bf16>(2);
  check_groups<fsdp::sharding::hybrid_shard_zero1<2>, fsdp::sharding::zero1, 2, bf16>(2);
}

namespace {
/// Three SGD steps of five_units at `world` ranks, the gradient a function of the gathered parameters, the rank,
/// the step and the element; every parameter afterwards, gathered in full.
template <class Strategy, class Precision>
std::map<std::string, std::vector<float>> trained(int world) {
  using P = fsdp::policy<Strategy, fsdp::prefetch::next, Precision>;
  using T = typename Precision::compute_type;
  std::map<std::string, std::vector<float>> out;
  std::mutex mu;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 11});
    fsdp::optim::sgd opt(m, {.lr = 0.1f, .momentum = 0.9f});
    for (int step = 0; step < 3; ++step) {
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries()) {
          const auto w = u.param(e.name);
          const auto g = u.grad(e.name);
          for (std::int64_t i = 0; i < g.numel(); ++i)
            g[i] = T(float(w[i]) * 0.5f + 0.125f * float(c.rank() + 1) - 0.01f * float(step) + 0.001f * float(i % 7));
        }
      opt.step();
      opt.zero_grad();
    }
    auto full = fsdp::weights::gather_full_params(m);
    std::lock_guard lk(mu);
    if (c.rank() == 0) out = std::move(full);
  });
  return out;
}

template <class Hybrid, class Flat, class Precision>
void check_same_training(int world) {
  CAPTURE(world);
  CAPTURE(Hybrid::name);
  CAPTURE(Hybrid::shard_group_size(world));
  const auto h = trained<Hybrid, Precision>(world), f = trained<Flat, Precision>(world);
  REQUIRE(h.size() == 7);
  // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
  for (const auto& entry : f) {
    const auto& name = entry.first;
    const auto& values = entry.second;
    CAPTURE(name);
    REQUIRE(h.count(name) == 1);
    REQUIRE(h.at(name).size() == values.size());
    CHECK(std::memcmp(h.at(name).data(), values.data(), values.size() * sizeof(float)) == 0);
  }
}
}  // namespace

TEST_CASE("every strategy at a shard group of one rank and of the whole world trains as its flat equal, bit for bit") {
  using namespace fsdp::sharding;
  using full = fsdp::precision::full;
  using bf16 = fsdp::precision::mixed<fsdp::bfloat16, float, fsdp::bfloat16>;
  for (int world : {2, 5}) {  // a group of one rank: every rank holds everything, the replicas all-reduce (DDP)
    check_same_training<hybrid_shard<1>, no_shard, full>(world);
    check_same_training<hybrid_shard<1>, no_shard, bf16>(world);
    check_same_training<hybrid_shard_zero2<1>, no_shard, full>(world);
    check_same_training<hybrid_shard_zero2<1>, no_shard, bf16>(world);
  }
  // a group of the whole world: full_shard and shard_grad_op
  check_same_training<hybrid_shard<2>, full_shard, full>(2);
  check_same_training<hybrid_shard<5>, full_shard, bf16>(5);
  check_same_training<hybrid_shard_zero2<2>, shard_grad_op, bf16>(2);
  check_same_training<hybrid_shard_zero2<5>, shard_grad_op, full>(5);
  // zero1 (full parameters kept between steps) trains as shard_grad_op does, flat and in groups
  check_same_training<zero1, shard_grad_op, full>(4);
  check_same_training<zero1, shard_grad_op, bf16>(3);
  check_same_training<hybrid_shard_zero1<1>, no_shard, full>(2);
  check_same_training<hybrid_shard_zero1<2>, zero1, bf16>(2);
}

namespace {
/// A user's strategy that replicates whole parameters yet names shard groups of two ranks.
struct replicated_in_pairs {
  using sharding_concept = fsdp::sharding_tag;
  static constexpr std::string_view name = "replicated_in_pairs";
  static constexpr bool shards_params = false;
  static constexpr bool reshard_after_forward = false;
  static constexpr int shard_group_size(int) { return 2; }
  static constexpr int replicate_group_size(int world) { return world / 2; }
};
}  // namespace

TEST_CASE("a strategy that keeps whole parameters but names a shard group of several ranks is refused, named") {
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { (void)fsdp::mesh_of<replicated_in_pairs>(4); }) ==
        "fsdp: sharding strategy replicated_in_pairs does not shard parameters (shards_params is false) but gives a "
        "shard group of 2 ranks; a strategy that keeps whole parameters on every rank has a shard group of 1");
}

TEST_CASE("the mesh: shard groups are consecutive ranks, replicate groups the ranks at one shard position") {
  run_ranks(8, [](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::hybrid_shard<4>>> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
    CHECK(m.mesh().replicas == 2);
    CHECK(m.mesh().shards == 4);
    CHECK(m.mesh().shards == 4);
    CHECK(m.mesh().replicas == 2);
    CHECK(m.shard_comm().rank() == c.rank() % 4);
    CHECK(m.replicate_comm()->rank() == c.rank() / 4);
    CHECK(m.unit(0).layout().world() == 4);
  });
  run_ranks(4, [](local_communicator& c) {  // one group of the whole world: full_shard, no split, no replicas
    fsdp::Model<fsdp::policy<fsdp::sharding::hybrid_shard<4>>> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
    CHECK(!m.mesh().hybrid());
    CHECK(&m.shard_comm() == &c);
    CHECK(m.replicate_comm() == nullptr);
  });
  run_ranks(4, [](local_communicator& c) {  // groups of one rank: split all the same, each rank its own shard group
    fsdp::Model<fsdp::policy<fsdp::sharding::hybrid_shard<1>>> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
    CHECK(!m.mesh().hybrid());
    CHECK(m.mesh().replicas == 4);
    CHECK(m.shard_comm().size() == 1);
    CHECK(&m.shard_comm() != &c);
    REQUIRE(m.replicate_comm() != nullptr);
    CHECK(m.replicate_comm()->size() == 4);
    CHECK(m.replicate_comm()->rank() == c.rank());
    CHECK(m.unit(0).layout().world() == 1);
  });
}

TEST_CASE("a shard group that does not divide the world is refused, naming both") {
  run_ranks(6, [](local_communicator& c) {
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
            fsdp::Model<fsdp::policy<fsdp::sharding::hybrid_shard<4>>> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
          }) ==
          "fsdp: sharding strategy hybrid_shard gives a shard group of 4 ranks, which does not divide the world of 6");
  });
}

TEST_CASE("a rank that returns before a hybrid forward: its shard group fails at once, naming its ranks") {
  std::mutex mu;
  std::vector<std::string> errors(4);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(fsdp::comm::run_local(
                      4,
                      [&](local_communicator& c) {
                        fsdp::Model<fsdp::policy<fsdp::sharding::hybrid_shard<2>>> m(c, five_units(),
                                                                                      fsdp::wrap::by_prefix{"h."});
                        if (c.rank() == 3) return;  // leaves before the first forward
                        try {
                          for (auto& u : m.forward()) (void)u;
                          m.synchronize();
                        } catch (const fsdp::comm_error& e) {
                          std::lock_guard lk(mu);
                          errors[c.rank()] = e.what();
                          throw;
                        }
                      },
                      {.timeout = std::chrono::seconds(30)}),
                  fsdp::comm_error);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // not the 30 s timeout
  // rank 2 shares its shard group with rank 3 ("[ranks 2, 3]", where rank 3 is rank 1): its first gather fails
  CHECK(errors[2] == "fsdp: local[ranks 2, 3] all_gather(count=96, f32) #0 on rank 0 cannot complete: rank(s) 1 "
                     "returned without issuing it");
}
