// Delay injection: slowing down all-gathers, reductions, gradient accumulation and the optimizer kernels (at
// random, per rank and per collective) must not change a single bit of the results. Any missing wait would let a
// stream read a buffer before it is written, or free it while in use, and show up here (and under the
// sanitizers). The same training with every stream inline (no overlap at all) is the reference.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
namespace prefetch = fsdp::prefetch;
namespace sharding = fsdp::sharding;

namespace {
enum class mode { inline_streams, threaded, delayed };

template <class Policy>
std::vector<mlp::result> train(mode md, const char* optimizer, fsdp::model_options mo = {}, unsigned seed = 0,
                               fsdp::grad::options g = {}) {
  constexpr int world = 3;
  mlp::config c;
  c.dims = {12, 40, 24, 56, 6};
  c.global_batch = 12;
  c.steps = 3;
  c.optimizer = optimizer;
  c.model = mo;
  c.grad = g;
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
void check_unchanged(const char* optimizer, fsdp::model_options mo = {}, fsdp::grad::options g = {}) {
  CAPTURE(optimizer);
  const auto ref = train<Policy>(mode::inline_streams, optimizer, mo, 0, g);
  REQUIRE(ref[0].losses.size() == 3);
  for (const auto& r : ref) REQUIRE(same_bits(r.losses, ref[0].losses));  // every rank agrees
  auto compare = [&](const std::vector<mlp::result>& got) {
    for (const auto& r : got) {
      CHECK(same_bits(r.losses, ref[0].losses));
      REQUIRE(r.params.size() == ref[0].params.size());
      // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
      for (const auto& entry : ref[0].params) {
        const auto& name = entry.first;
        const auto& v = entry.second;
        CAPTURE(name);
        CHECK(same_bits(r.params.at(name), v));
      }
    }
  };
  compare(train<Policy>(mode::threaded, optimizer, mo, 0, g));
  for (unsigned seed : {1u, 2u}) {
    CAPTURE(seed);
    compare(train<Policy>(mode::delayed, optimizer, mo, seed, g));
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
TEST_CASE("bf16 compute and reduction, no-sync over two micro-batches, clipped") {
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  check_unchanged<fsdp::policy<sharding::full_shard, prefetch::next,
                               fsdp::precision::mixed<fsdp::bfloat16, float, fsdp::bfloat16>>>("adamw", mo,
                                                                                                {.max_norm = 0.05f});
}
TEST_CASE("fp16, units kept gathered over two micro-batches, divided before and after, non-finite checks") {
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .keep_gathered = true};
  mo.division.how = fsdp::grad_division::mode::pre_post;
  check_unchanged<fsdp::policy<sharding::full_shard, prefetch::backward_pre<2>,
                               fsdp::precision::mixed<fsdp::float16, float, fsdp::float16>>>(
      "sgd", mo, {.skip_nonfinite = true, .locate_nonfinite = true});
}
TEST_CASE("no_shard in bf16 (cast copies on the gather stream), no-sync") {
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  check_unchanged<fsdp::policy<sharding::no_shard, prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>>("adamw",
                                                                                                            mo);
}

namespace {
/// A trainer that submits all its work to the compute stream, as a CUDA trainer launches kernels: with a threaded
/// compute stream the host runs ahead of it. Each unit's "kernel" reads the gathered parameters and writes a
/// gradient that depends on them and on the running activation.
template <class Policy>
std::map<std::string, std::vector<float>> train_async(bool threaded, bool delayed, fsdp::model_options mo = {}) {
  std::map<std::string, std::vector<float>> out;
  std::mutex mu;
  fsdp::comm::local_options lo;
  lo.timeout = fsdp_test::timeout;
  lo.backend.threaded_compute = threaded;
  if (delayed) {
    lo.delay = [](fsdp::collective, std::uint64_t seq, int rank) {
      return std::chrono::microseconds((seq * 7 + static_cast<std::uint64_t>(rank) * 3) % 5 * 400);
    };
    lo.backend.kernel_delay = [](std::string_view) { return std::chrono::microseconds(1500); };
  }
  fsdp::comm::run_local(
      3,
      [&](local_communicator& c) {
        using T = typename Policy::precision::compute_type;
        fsdp::Model<Policy> m(c, fsdp_test::three_units(), fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{0.5f, 3}, mo);
        fsdp::optim::sgd opt(m, {.lr = 0.05f, .momentum = 0.9f});
        auto& cs = m.backend().compute_stream();
        auto act = std::make_shared<float>(0.0f);
        for (int step = 0; step < 4; ++step) {
          for (int mb = 0; mb < mo.accumulation.micro_batches; ++mb) {
            for (auto& u : m.forward()) {
              auto w = u.param(u.name() + ".w");
              cs.submit([w, act, delayed] {
                if (delayed) std::this_thread::sleep_for(std::chrono::microseconds(800));
                for (std::int64_t i = 0; i < w.numel(); ++i) *act = *act * 0.5f + float(w[i]);
              });
            }
            for (auto& u : m.backward()) {
              auto w = u.param(u.name() + ".w");
              auto g = u.grad(u.name() + ".w");
              cs.submit([w, g, act] {
                for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = T(float(w[i]) * 0.25f + *act * 0.01f);
              });
            }
          }
          opt.step();
          opt.zero_grad();
        }
        auto full = fsdp::weights::gather_full_params(m);
        if (c.rank() == 0) {
          std::lock_guard lk(mu);
          out = std::move(full);
        }
      },
      lo);
  return out;
}
}  // namespace

namespace {
template <class Policy>
void check_async(fsdp::model_options mo = {}) {
  const auto ref = train_async<Policy>(false, false, mo);
  REQUIRE(ref.size() == 3);
  for (bool delayed : {false, true}) {
    CAPTURE(delayed);
    const auto got = train_async<Policy>(true, delayed, mo);
    REQUIRE(got.size() == ref.size());
    // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
    for (const auto& entry : ref) {
      const auto& name = entry.first;
      const auto& v = entry.second;
      CAPTURE(name);
      CHECK(same_bits(got.at(name), v));
    }
  }
}
}  // namespace

TEST_CASE("a threaded compute stream (the host runs ahead, as on a GPU): results unchanged under delays") {
  check_async<fsdp::policy<sharding::full_shard, prefetch::next>>();
}

TEST_CASE("check_views with a threaded compute stream: views read on the stream before their release are good; no bit "
          "changes") {
  // The kernels read w[i] and write g[i] on the compute stream's thread, after the host has left the unit: the
  // views are checked in stream order, so they are good until the stream passes the release (then NaN fills the
  // slot, which nothing reads any more).
  using P = fsdp::policy<sharding::full_shard, prefetch::next>;
  fsdp::model_options checked;
  checked.check_views = true;
  const auto ref = train_async<P>(false, false);
  for (bool delayed : {false, true}) {
    CAPTURE(delayed);
    const auto got = train_async<P>(true, delayed, checked);
    REQUIRE(got.size() == ref.size());
    // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
    for (const auto& entry : ref) {
      const auto& name = entry.first;
      const auto& v = entry.second;
      CAPTURE(name);
      CHECK(same_bits(got.at(name), v));
    }
  }
}

TEST_CASE("a threaded compute stream with bf16 compute and no-sync: the accumulator is ordered across streams") {
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  check_async<fsdp::policy<sharding::full_shard, prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>>(mo);
}
