// CPU offload (fsdp/policy/offload.hpp): master shards, gradient shards and optimizer state in the host memory
// domain, copied on their own streams. Training with any part offloaded must equal training without offload bit
// for bit (the same per-element code in the same order), with the same collectives; slowing down the copy streams
// must change no bit (every wait is in place); and the planner's peak of every category in both domains must equal
// what the backend measured, with the bytes it says a step moves over the link equal to the bytes the copy
// streams moved.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <atomic>
#include <cstring>
#include <random>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

using fsdp::bfloat16;
using fsdp::comm::local_communicator;
namespace offload = fsdp::offload;
namespace sharding = fsdp::sharding;

namespace {

mlp::config config(const char* optimizer) {
  mlp::config c;
  c.dims = {12, 40, 24, 56, 6};
  c.global_batch = 12;  // splits over 1, 3 and 4 ranks
  c.steps = 4;
  c.optimizer = optimizer;
  c.lr = std::string(optimizer) == "adamw" ? 3e-3f : 0.05f;
  return c;
}

template <class Strategy, class Precision, class Offload>
using policy_of = fsdp::policy<Strategy, fsdp::prefetch::next, Precision, fsdp::comm::local<>, Offload>;

struct options {
  bool inline_streams = false;
  std::function<std::chrono::microseconds(std::string_view, std::int64_t)> copy_delay;
};

template <class Policy>
std::vector<mlp::result> train(int world, const mlp::config& c, const options& o = {}) {
  fsdp::comm::local_options lo;
  lo.timeout = fsdp_test::timeout;
  lo.backend.threaded_streams = !o.inline_streams;
  lo.backend.copy_delay = o.copy_delay;
  std::vector<mlp::result> out(static_cast<std::size_t>(world));
  fsdp::comm::run_local(world, [&](local_communicator& comm) { out[comm.rank()] = mlp::train<Policy>(comm, c); }, lo);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_collectives(const fsdp::collective_stats& a, const fsdp::collective_stats& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

void check_same(const std::vector<mlp::result>& got, const std::vector<mlp::result>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    CHECK(same_bits(got[r].losses, want[r].losses));
    CHECK(same_collectives(got[r].shard_group, want[r].shard_group));
    REQUIRE(got[r].params.size() == want[r].params.size());
    // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
    for (const auto& entry : want[r].params) {
      const auto& name = entry.first;
      const auto& v = entry.second;
      CAPTURE(name);
      CHECK(same_bits(got[r].params.at(name), v));
    }
  }
}

/// Every combination of the three parts (all three: the host optimizer step), against no offload.
template <class Strategy, class Precision>
void check_parity(int world, const char* optimizer) {
  CAPTURE(world);
  CAPTURE(optimizer);
  CAPTURE(Strategy::name);
  const mlp::config c = config(optimizer);
  const auto want = train<policy_of<Strategy, Precision, offload::none>>(world, c);
  REQUIRE(want[0].losses.size() == 4);
  CHECK(want[0].losses.back() < want[0].losses.front());  // it learns: the comparison is not of constants
  check_same(train<policy_of<Strategy, Precision, offload::cpu<offload::params>>>(world, c), want);
  check_same(train<policy_of<Strategy, Precision, offload::cpu<offload::grads>>>(world, c), want);
  check_same(train<policy_of<Strategy, Precision, offload::cpu<offload::optimizer_state>>>(world, c), want);
  check_same(train<policy_of<Strategy, Precision, offload::cpu<offload::params | offload::grads>>>(world, c), want);
  check_same(train<policy_of<Strategy, Precision, offload::cpu<offload::params | offload::optimizer_state>>>(world, c),
             want);
  check_same(train<policy_of<Strategy, Precision, offload::cpu<offload::grads | offload::optimizer_state>>>(world, c),
             want);
  check_same(train<policy_of<Strategy, Precision, offload::all>>(world, c), want);
}

}  // namespace

TEST_CASE("every offload option trains bit for bit like no offload, with the same collectives: fp32") {
  for (int world : {1, 3, 4}) check_parity<sharding::full_shard, fsdp::precision::full>(world, "adamw");
  check_parity<sharding::full_shard, fsdp::precision::full>(3, "sgd");
  check_parity<sharding::shard_grad_op, fsdp::precision::full>(3, "adamw");
  check_parity<sharding::no_shard, fsdp::precision::full>(3, "adamw");  // offloaded params make no_shard gather
}

TEST_CASE("every offload option trains bit for bit like no offload, with the same collectives: bf16 compute") {
  using bf16 = fsdp::precision::mixed<bfloat16>;
  for (int world : {1, 3, 4}) check_parity<sharding::full_shard, bf16>(world, "adamw");
  check_parity<sharding::no_shard, fsdp::precision::mixed<bfloat16, float, bfloat16>>(4, "adamw");
}

TEST_CASE("every offload option trains bit for bit like no offload: gradients reduced in int8 blocks (the host "
          "dequantizes and sums the downloaded slices)") {
  using q = fsdp::precision::scaled<std::int8_t, 16, bfloat16, std::int8_t>;
  for (int world : {1, 3}) check_parity<sharding::full_shard, q>(world, "adamw");
}

TEST_CASE(
    "delays on the copy streams change no bit: every wait on an upload, a download and a host update is in place") {
  const mlp::config c = config("adamw");
  using bf16 = fsdp::precision::mixed<bfloat16>;
  auto check = [&](auto policy_tag) {
    using P = typename decltype(policy_tag)::type;
    const auto want =
        train<P>(3, c, {.inline_streams = true, .copy_delay = {}});  // every stream inline: no overlap at all
    for (unsigned seed : {1u, 2u}) {
      CAPTURE(seed);
      auto calls = std::make_shared<std::atomic<unsigned>>(0);
      options o;
      o.copy_delay = [seed, calls](std::string_view stream, std::int64_t bytes) {
        std::mt19937 g(seed * 7919u + (*calls)++ * 31u + static_cast<unsigned>(bytes) + (stream == "upload" ? 1u : 0u));
        return std::chrono::microseconds(g() % 1500);
      };
      check_same(train<P>(3, c, o), want);
    }
  };
  check(std::type_identity<policy_of<sharding::full_shard, bf16, offload::all>>{});
  check(std::type_identity<
        policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::params | offload::grads>>>{});
  check(std::type_identity<policy_of<sharding::no_shard, bf16, offload::cpu<offload::grads>>>{});
  check(std::type_identity<
        policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::optimizer_state>>>{});
}

TEST_CASE("a slow host does not hold backward: offloading's host functions run apart from the copies") {
  // Four units, two gradient slots: the last unit of backward takes the slot the second gave back once its
  // reduction was copied to the host. Each host function (the additions into the host gradient shards) sleeps
  // 400 ms here; when they shared the download stream with the copies, that copy waited behind the first unit's
  // addition and backward (its compute stream inline: the trainer's thread) with it. Now backward is issued and
  // run in far less than one host function.
  fsdp::ModelSpec spec;
  for (int k = 0; k < 4; ++k) spec.add("u" + std::to_string(k) + ".w", {64});
  fsdp::comm::local_options lo;
  lo.timeout = fsdp_test::timeout;
  lo.backend.copy_delay = [](std::string_view, std::int64_t bytes) {
    return std::chrono::microseconds(bytes == 0 ? 400000 : 0);  // every host function, on whichever stream
  };
  std::vector<std::chrono::steady_clock::duration> took(2);
  fsdp::comm::run_local(2, [&](local_communicator& comm) {
    fsdp::Model<policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::grads>>> m(
        comm, spec, fsdp::wrap::by_prefix{"u"});
    for (auto& u : m.forward()) (void)u.param(u.name() + ".w");
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& u : m.backward()) u.grad(u.name() + ".w")[0] = 1.0f;
    took[static_cast<std::size_t>(comm.rank())] = std::chrono::steady_clock::now() - t0;
    m.synchronize();
  }, lo);
  for (const auto& d : took) CHECK(d < std::chrono::milliseconds(400));
}

TEST_CASE("a slow download stream: the next step's copies wait for the last step's copies back to the host") {
  // Every copy back (the state and the master after a staged device step, reduced gradients) takes 20 ms, longer
  // than a whole step's compute here: a next step that read the host copy before it is written would show. One
  // unit: fewer units than staging slots, so no slot's reuse orders the copies in their place.
  mlp::config c = config("adamw");
  c.dims = {12, 40};
  auto check = [&](auto policy_tag) {
    using P = typename decltype(policy_tag)::type;
    const auto want = train<P>(3, c, {.inline_streams = true, .copy_delay = {}});
    options o;
    o.copy_delay = [](std::string_view stream, std::int64_t bytes) {
      return std::chrono::microseconds(stream == "download" && bytes > 0 ? 20000 : 0);
    };
    check_same(train<P>(3, c, o), want);
  };
  check(std::type_identity<
        policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::optimizer_state>>>{});
  check(std::type_identity<policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::params>>>{});
}

TEST_CASE("the planner's peak of every category equals the measured peak in both memory domains, exactly") {
  const mlp::config c = config("adamw");
  auto check = [&](auto policy_tag, bool host_parts) {
    using P = typename decltype(policy_tag)::type;
    for (const auto& r : train<P>(3, c)) {
      CHECK(r.planned == r.memory.peak);
      CHECK(r.planned_host == r.host_memory.peak);
      CHECK((r.host_memory.peak.total > 0) == host_parts);
    }
  };
  check(std::type_identity<policy_of<sharding::full_shard, fsdp::precision::full, offload::none>>{}, false);
  check(std::type_identity<policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::params>>>{},
        true);
  check(std::type_identity<
            policy_of<sharding::full_shard, fsdp::precision::mixed<bfloat16>, offload::cpu<offload::grads>>>{},
        true);
  check(std::type_identity<
            policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::optimizer_state>>>{},
        true);
  check(std::type_identity<policy_of<sharding::full_shard, fsdp::precision::mixed<bfloat16>, offload::all>>{}, true);
  check(std::type_identity<policy_of<sharding::no_shard, fsdp::precision::full, offload::all>>{}, true);
}

TEST_CASE("offloading moves the persistent buffers to the host: device and host figures, category by category") {
  const mlp::config c = config("adamw");
  // The units' shard sizes at 3 ranks, from the layouts the model builds.
  std::int64_t shards = 0, largest = 0, first = 0;
  fsdp_test::run_ranks(3, [&](local_communicator& comm) {
    auto m = mlp::make_model<fsdp::policy<sharding::full_shard>>(comm, c);
    if (comm.rank() != 0) return;
    first = fsdp::model_access::costs(m, 0).shard_numel;
    for (std::size_t u = 0; u < m.size(); ++u) {
      shards += fsdp::model_access::costs(m, u).shard_numel;
      largest = std::max(largest, fsdp::model_access::costs(m, u).shard_numel);
    }
  });
  const std::int64_t f = 4;
  const auto none = train<policy_of<sharding::full_shard, fsdp::precision::full, offload::none>>(3, c)[0];
  const auto all = train<policy_of<sharding::full_shard, fsdp::precision::full, offload::all>>(3, c)[0];
  CHECK(none.memory.peak[fsdp::mem::sharded_params] == shards * f);
  CHECK(none.memory.peak[fsdp::mem::grads] == shards * f);
  CHECK(none.memory.peak[fsdp::mem::optimizer_state] == 2 * shards * f + fsdp::plan::step_block_cost().bytes());
  // offloaded: the device keeps two upload slots for the master, nothing of the rest. The first two gathers make
  // them at their units' shards (layers.0, layers.1); layers.2, the largest, finds both given back and too small
  // and makes the larger one larger; layers.3 fits in layers.0's. The optimizer's step block (its update count and
  // rule) stays on the device
  CHECK(all.memory.peak[fsdp::mem::sharded_params] == (first + largest) * f);
  CHECK(all.memory.peak[fsdp::mem::grads] == 0);
  CHECK(all.memory.peak[fsdp::mem::optimizer_state] == fsdp::plan::step_block_cost().bytes());
  CHECK(all.memory.peak[fsdp::mem::gathered_params] == none.memory.peak[fsdp::mem::gathered_params]);
  CHECK(all.host_memory.peak[fsdp::mem::sharded_params] == shards * f);
  CHECK(all.host_memory.peak[fsdp::mem::grads] == shards * f);
  CHECK(all.host_memory.peak[fsdp::mem::optimizer_state] == 2 * shards * f);
  // two download slots of the largest shard: pinned host memory, made at one size before the first step
  CHECK(all.host_memory.peak[fsdp::mem::comm_buffers] == 2 * largest * f);
  CHECK(all.memory.peak.total < none.memory.peak.total);
}

TEST_CASE("the bytes the planner says a step moves over the link are the bytes the copy streams moved") {
  mlp::config c = config("adamw");
  auto check = [&](auto policy_tag, bool uploads, bool downloads) {
    using P = typename decltype(policy_tag)::type;
    auto moved = std::make_shared<std::array<std::atomic<std::int64_t>, 2>>();
    options o;
    o.copy_delay = [moved](std::string_view stream, std::int64_t bytes) {
      (*moved)[stream == "upload" ? 0 : 1] += bytes;
      return std::chrono::microseconds(0);
    };
    const auto r = train<P>(1, c, o)[0];  // one rank: the copy counts are this rank's
    // gather_full_params after training reads the host master directly: no copy stream
    CHECK((*moved)[0] == c.steps * r.planned_link.to_device);
    CHECK((*moved)[1] == c.steps * r.planned_link.to_host);
    CHECK((r.planned_link.to_device > 0) == uploads);
    CHECK((r.planned_link.to_host > 0) == downloads);
  };
  check(std::type_identity<policy_of<sharding::full_shard, fsdp::precision::full, offload::all>>{}, true, true);
  check(std::type_identity<policy_of<sharding::full_shard, fsdp::precision::mixed<bfloat16, float, bfloat16>,
                                     offload::cpu<offload::params | offload::grads | offload::optimizer_state>>>{},
        true, true);
  // a device step over host parts stages them: up before its kernels, the master and the state back after
  check(std::type_identity<policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::params>>>{},
        true, true);
  check(std::type_identity<
            policy_of<sharding::full_shard, fsdp::precision::mixed<bfloat16>, offload::cpu<offload::grads>>>{},
        true, true);
  check(std::type_identity<
            policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::optimizer_state>>>{},
        true, true);
  check(std::type_identity<
            policy_of<sharding::no_shard, fsdp::precision::full, offload::cpu<offload::params | offload::grads>>>{},
        true, true);
}

TEST_CASE(
    "a device optimizer step over the offloaded state stages it: two slots on the device, both states up and back") {
  // The planner's figures, from memory/cost.hpp's rules: AdamW's two states go up and come back; the device holds
  // two staging slots of two states: the first two units' (layers.0, layers.1); layers.2, the largest, makes the
  // larger of them larger, and layers.3 fits in layers.0's.
  const mlp::config c = config("adamw");
  const auto p =
      train<policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::optimizer_state>>>(1, c)[0];
  std::int64_t shards = 0, largest = 0, first = 0;
  fsdp_test::run_ranks(1, [&](local_communicator& comm) {
    auto m = mlp::make_model<fsdp::policy<sharding::full_shard>>(comm, c);
    first = fsdp::model_access::costs(m, 0).shard_numel;
    for (std::size_t u = 0; u < m.size(); ++u) {
      shards += fsdp::model_access::costs(m, u).shard_numel;
      largest = std::max(largest, fsdp::model_access::costs(m, u).shard_numel);
    }
  });
  CHECK(p.planned_link.to_device == 2 * 4 * shards);
  CHECK(p.planned_link.to_host == 2 * 4 * shards);
  CHECK(p.memory.peak[fsdp::mem::optimizer_state] == 2 * 4 * (first + largest) + fsdp::plan::step_block_cost().bytes());
  CHECK(p.host_memory.peak[fsdp::mem::optimizer_state] == 2 * 4 * shards);
}

TEST_CASE("per-unit offload: units that override the policy train bit for bit like no offload, planned exactly") {
  mlp::config c = config("adamw");
  using none = policy_of<sharding::full_shard, fsdp::precision::mixed<bfloat16>, offload::none>;
  using all = policy_of<sharding::full_shard, fsdp::precision::mixed<bfloat16>, offload::all>;
  for (int world : {1, 3}) {
    CAPTURE(world);
    const auto want = train<none>(world, c);
    // the policy offloads nothing; one unit steps on the host, one stages its gradients, one its state
    mlp::config mixed = c;
    mixed.model.offload_units = {{"layers.0", offload::all::facts},
                                 {"layers.2", offload::cpu<offload::grads>::facts},
                                 {"layers.3", offload::cpu<offload::params | offload::optimizer_state>::facts}};
    const auto got = train<none>(world, mixed);
    check_same(got, want);
    // the policy offloads everything; the first unit stays on the device
    mlp::config kept = c;
    kept.model.offload_units = {{"layers.0", offload::none::facts}};
    const auto got2 = train<all>(world, kept);
    check_same(got2, want);
    for (const auto* r : {&got, &got2})
      for (const auto& rank : *r) {
        CHECK(rank.planned == rank.memory.peak);
        CHECK(rank.planned_host == rank.host_memory.peak);
        CHECK(rank.host_memory.peak.total > 0);
      }
    // under `all` with layers.0 kept on the device, its gradient shard is the device's only one
    CHECK(got2[0].memory.peak[fsdp::mem::grads] > 0);
    CHECK(got2[0].memory.peak[fsdp::mem::grads] < want[0].memory.peak[fsdp::mem::grads]);
  }
}

TEST_CASE("per-unit offload: a unit that does not exist, and per-unit params where units do not gather, are refused") {
  fsdp_test::run_ranks(1, [&](local_communicator& comm) {
    mlp::config c = config("adamw");
    c.model.offload_units = {{"layers.9", offload::all::facts}};
    CHECK(fsdp_test::error_of<fsdp::usage_error>(
              [&] { (void)mlp::make_model<fsdp::policy<sharding::full_shard>>(comm, c); }) ==
          "fsdp: model_options::offload_units names 'layers.9', which is not a unit (units: layers.0, layers.1, "
          "layers.2, layers.3)");
    c.model.offload_units = {{"layers.1", offload::cpu<offload::params>::facts}};
    const std::string unlike =
        "model_options::offload_units sets params for unit 'layers.1' unlike the policy, but under no_shard in fp32 "
        "whether a unit's master serves compute or is gathered follows the policy's params, for every unit alike; "
        "set params in the policy only, or shard the parameters";
    CHECK(fsdp_test::error_of<fsdp::usage_error>(
              [&] { (void)mlp::make_model<fsdp::policy<sharding::no_shard>>(comm, c); }) == "fsdp: " + unlike);
    // and the other way: the policy offloads params (every unit gathers), one unit would not
    c.model.offload_units = {{"layers.1", offload::none::facts}};
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
            (void)mlp::make_model<policy_of<sharding::no_shard, fsdp::precision::full, offload::all>>(comm, c);
          }) == "fsdp: " + unlike);
    // under no_shard in fp32, per-unit grads and state need no gather
    c.model.offload_units = {{"layers.1", offload::cpu<offload::grads | offload::optimizer_state>::facts}};
    (void)mlp::make_model<fsdp::policy<sharding::no_shard>>(comm, c);
  });
}

TEST_CASE("an optimizer that goes before the model waits for the copy streams' work on its offloaded state") {
  // The host update (offload::all) and the copy back of a staged step (state alone) use the state on the download
  // stream after step() returns; the optimizer is destroyed here without a synchronize (ASan would see a use after
  // free otherwise).
  auto run = [](auto policy_tag) {
    using P = typename decltype(policy_tag)::type;
    mlp::config c = config("adamw");
    fsdp::comm::local_options lo;
    lo.timeout = fsdp_test::timeout;
    lo.backend.copy_delay = [](std::string_view stream, std::int64_t) {
      return std::chrono::microseconds(stream == "download" ? 3000 : 0);
    };
    fsdp::comm::run_local(2, [&](local_communicator& comm) {
      auto model = mlp::make_model<P>(comm, c);
      mlp::result r;
      {
        fsdp::optim::adamw opt(model, {.lr = c.lr, .weight_decay = c.weight_decay});
        mlp::run_steps(model, opt, c, 0, 2, r);
      }
      CHECK(r.losses.size() == 2);
    }, lo);
  };
  run(std::type_identity<policy_of<sharding::full_shard, fsdp::precision::full, offload::all>>{});
  run(std::type_identity<
      policy_of<sharding::full_shard, fsdp::precision::full, offload::cpu<offload::optimizer_state>>>{});
}

TEST_CASE("an offload policy describes itself by its parts (fingerprints and reports)") {
  CHECK(fsdp::describe(fsdp::offload::all::facts) == "params+grads+optimizer_state");
  CHECK(fsdp::describe(fsdp::offload::none::facts) == "none");
  CHECK(fsdp::describe(fsdp::offload::cpu<offload::grads | offload::params>::facts) == "params+grads");
  CHECK(fsdp::offload::all::facts.host_step());
  CHECK(!fsdp::offload::cpu<offload::grads | offload::params>::facts.host_step());
}
