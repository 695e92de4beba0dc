// Delay injection: slowing down all-gathers, reductions, gradient accumulation and the optimizer kernels (at
// random, per rank and per collective) must not change a single bit of the results. Any missing wait would let a
// stream read a buffer before it is written, or free it while in use, and show up here (and under the
// sanitizers). The same training with every stream inline (no overlap at all) is the reference.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cstring>
#include <random>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
namespace prefetch = fsdp::prefetch;
namespace sharding = fsdp::sharding;

namespace {
enum class mode { inline_streams, threaded, delayed };

template <class Policy>
std::vector<mlp::result> train(mode md, const char* optimizer, fsdp::model_options mo = {}, unsigned seed = 0) {
  constexpr int world = 3;
  mlp::config c;
  c.dims = {12, 40, 24, 56, 6};
  c.global_batch = 12;
  c.steps = 3;
  c.optimizer = optimizer;
  c.model = mo;
  fsdp::comm::local_options lo;
  lo.timeout = fsdp_test::timeout;
  lo.backend.threaded_streams = md != mode::inline_streams;
  if (md == mode::delayed) {
    lo.delay = [seed](fsdp::collective, std::uint64_t seq, int rank) {
      std::mt19937 g(seed * 1000003u + static_cast<unsigned>(seq) * 131u + static_cast<unsigned>(rank));
      return std::chrono::microseconds(g() % 2000);
    };
    lo.backend.kernel_delay = [](std::string_view kernel) {
      return std::chrono::microseconds(kernel == "accumulate" ? 700 : 300);
    };
  }
  std::vector<mlp::result> out(world);
  fsdp::comm::run_local(world, [&](local_communicator& comm) { out[comm.rank()] = mlp::train<Policy>(comm, c); }, lo);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class Policy>
void check_unchanged(const char* optimizer, fsdp::model_options mo = {}) {
  CAPTURE(optimizer);
  const auto ref = train<Policy>(mode::inline_streams, optimizer, mo);
  REQUIRE(ref[0].losses.size() == 3);
  for (const auto& r : ref) REQUIRE(same_bits(r.losses, ref[0].losses));  // every rank agrees
  auto compare = [&](const std::vector<mlp::result>& got) {
    for (const auto& r : got) {
      CHECK(same_bits(r.losses, ref[0].losses));
      REQUIRE(r.params.size() == ref[0].params.size());
      for (const auto& [name, v] : ref[0].params) {
        CAPTURE(name);
        CHECK(same_bits(r.params.at(name), v));
      }
    }
  };
  compare(train<Policy>(mode::threaded, optimizer, mo));
  for (unsigned seed : {1u, 2u}) {
    CAPTURE(seed);
    compare(train<Policy>(mode::delayed, optimizer, mo, seed));
  }
}
}  // namespace

TEST_CASE("full_shard with one unit prefetched ahead") {
  check_unchanged<fsdp::policy<sharding::full_shard, prefetch::next>>("adamw");
}
TEST_CASE("full_shard, backward_post, root kept gathered, two gather slots") {
  fsdp::model_options mo;
  mo.reshard_after_forward["layers.3"] = false;
  mo.gather_slots = 2;
  check_unchanged<fsdp::policy<sharding::full_shard, prefetch::backward_post>>("sgd", mo);
}
TEST_CASE("shard_grad_op with a deep backward prefetch") {
  check_unchanged<fsdp::policy<sharding::shard_grad_op, prefetch::backward_pre<2>>>("adamw");
}
TEST_CASE("an explicit schedule") {
  fsdp::model_options mo;
  mo.prefetch.forward["layers.0"] = {"layers.2", "layers.1"};
  mo.prefetch.backward["layers.3"] = {"layers.1", "layers.2", "layers.0"};
  check_unchanged<fsdp::policy<sharding::full_shard, prefetch::explicit_schedule>>("sgd", mo);
}
TEST_CASE("no_shard") { check_unchanged<fsdp::policy<sharding::no_shard>>("adamw"); }
