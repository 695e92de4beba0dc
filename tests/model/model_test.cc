// Model: initialisation independent of world size, exact gradient reduction, collective counts per strategy.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cstring>
#include <map>
#include <mutex>

#include "tests/support/sanitizers.hpp"
#include "tests/support/support.hpp"

using fsdp::collective;
using fsdp::comm::local_communicator;
using fsdp_test::five_units;
using fsdp_test::run_ranks;

namespace {
using Full = fsdp::policy<fsdp::sharding::full_shard>;
using Grad = fsdp::policy<fsdp::sharding::shard_grad_op>;
using None = fsdp::policy<fsdp::sharding::no_shard>;

template <class Policy>
std::map<std::string, std::vector<float>> materialise(int world) {
  std::map<std::string, std::vector<float>> out;
  std::mutex mu;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::Model<Policy> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 99});
    auto full = fsdp::weights::gather_full_params(m);
    if (c.rank() == 0) {
      std::lock_guard lk(mu);
      out = std::move(full);
    }
  });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

TEST_CASE("initialisation does not depend on world size") {
  const auto ref = materialise<Full>(1);
  REQUIRE(ref.size() == 7);
  // the values are the rule's, element by element
  const fsdp::ModelSpec spec = five_units();
  for (const auto& [name, v] : ref) {
    const auto& p = spec.at(name);
    const std::string stored = p.is_tied() ? p.tied_to : name;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float expect = stored == "h.0.b" ? 1.0f : fsdp::init::value(fsdp::init::normal{0.5f, 99}, stored, i);
      REQUIRE(v[i] == expect);
    }
  }
  CHECK(same_bits(ref.at("head"), ref.at("emb")));
  for (int world : {2, 4, 7}) {
    CAPTURE(world);
    const auto got = materialise<Full>(world);
    REQUIRE(got.size() == ref.size());
    for (const auto& [name, v] : ref) CHECK(same_bits(got.at(name), v));
  }
  for (const auto& [name, v] : materialise<None>(4)) CHECK(same_bits(ref.at(name), v));
}

namespace {
struct counts {
  std::uint64_t fwd_ag = 0, bwd_ag = 0, rs = 0, ar = 0, fwd_other = 0;
};

/// One training step where every rank writes gradient (rank + 1) * (element index + 1); returns the collectives
/// issued by the forward and backward loops and checks the reduced gradient shards exactly.
template <class Policy>
counts one_step(local_communicator& c) {
  fsdp::model_options sum;  // summed, not averaged: the sums are exact at any world size (an average multiplies by
  sum.division.how = fsdp::grad_division::mode::sum;  // 1/W first, inexact at 3 ranks; precision_test covers it)
  fsdp::Model<Policy> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, sum);
  counts k;
  c.reset_stats();
  for (auto& u : m.forward()) (void)u.param(u.layout().entries()[0].name);
  auto s = c.stats();
  k.fwd_ag = s[collective::all_gather];
  k.fwd_other = s[collective::reduce_scatter] + s[collective::all_reduce];
  c.reset_stats();
  for (auto& u : m.backward())
    for (const auto& e : u.layout().entries()) {
      auto g = u.grad(e.name);
      for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = float((c.rank() + 1) * (i + 1));
    }
  m.synchronize();
  s = c.stats();
  k.bwd_ag = s[collective::all_gather];
  k.rs = s[collective::reduce_scatter];
  k.ar = s[collective::all_reduce];
  // The reduced gradient is the sum over ranks: W (W + 1) / 2 * (i + 1), exact in fp32 for these sizes.
  const float rank_sum = float(c.size() * (c.size() + 1) / 2);
  for (std::size_t ui = 0; ui < m.size(); ++ui) {
    auto& u = m.unit(ui);
    for (const auto& v : u.shard_views())
      for (std::int64_t i = v.begin; i < v.end; ++i)
        REQUIRE(u.grad_shard()[v.shard_offset + (i - v.begin)] == rank_sum * float(i + 1));
  }
  return k;
}
}  // namespace

TEST_CASE("collective counts per step are what each strategy implies") {
  const std::uint64_t n = 5;  // units: root (emb, head), h.0, h.1, h.2, h.3
  for (int world : {1, 3, 4}) {
    CAPTURE(world);
    run_ranks(world, [&](local_communicator& c) {
      // gather for forward, gather again for backward (but the root, first in forward and kept into its backward
      // by default), reduce-scatter
      const counts f = one_step<Full>(c);
      CHECK(f.fwd_ag == n);
      CHECK(f.fwd_other == 0);
      CHECK(f.bwd_ag == n - 1);
      CHECK(f.rs == n);
      CHECK(f.ar == 0);
      const counts g = one_step<Grad>(c);  // kept gathered from forward to backward
      CHECK(g.fwd_ag == n);
      CHECK(g.bwd_ag == 0);
      CHECK(g.rs == n);
      CHECK(g.ar == 0);
      const counts d = one_step<None>(c);  // replicated: no gathers, gradients all-reduced
      CHECK(d.fwd_ag == 0);
      CHECK(d.bwd_ag == 0);
      CHECK(d.rs == 0);
      CHECK(d.ar == n);
    });
  }
}

TEST_CASE("zero1: one gather per unit in the first forward, then one per unit after each step and none in forward or "
          "backward; gradients reduce-scattered; the kept parameters are the updated shards, gathered") {
  const std::uint64_t n = 5;
  for (int world : {1, 3, 4}) {
    CAPTURE(world);
    run_ranks(world, [&](local_communicator& c) {
      using Z1 = fsdp::policy<fsdp::sharding::zero1>;
      fsdp::Model<Z1> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{});
      fsdp::optim::sgd sgd(m, {.lr = 0.5f});
      std::map<std::string, std::vector<float>> updated;  // the full parameters after the last step
      for (int step = 0; step < 3; ++step) {
        CAPTURE(step);
        c.reset_stats();
        for (auto& u : m.forward()) {
          for (const auto& e : u.layout().entries()) {
            const auto view = u.param(e.name);  // the kept copy: the last step's updated shards, gathered
            if (step == 0) continue;
            const std::vector<float>& want = updated.at(e.name);
            REQUIRE(std::size_t(view.numel()) == want.size());
            CHECK(std::memcmp(view.data(), want.data(), want.size() * sizeof(float)) == 0);
          }
        }
        CHECK(c.stats()[collective::all_gather] == (step == 0 ? n : 0));
        c.reset_stats();
        for (auto& u : m.backward())
          for (const auto& e : u.layout().entries()) {
            auto g = u.grad(e.name);
            for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = float(c.rank() + 1);
          }
        m.synchronize();
        auto s = c.stats();
        CHECK(s[collective::all_gather] == 0);
        CHECK(s[collective::reduce_scatter] == n);
        CHECK(s[collective::all_reduce] == 0);
        c.reset_stats();
        sgd.step();
        sgd.zero_grad();
        m.synchronize();
        CHECK(c.stats()[collective::all_gather] == n);  // the updated shards, right after the step
        for (std::size_t ui = 0; ui < m.size(); ++ui) CHECK(m.unit(ui).state() != fsdp::unit_state::sharded);
        updated = fsdp::weights::gather_full_params(m);  // from the master shards, apart from the kept copies
      }
    });
  }
}

TEST_CASE("gradients of several backward passes accumulate until zero_grad") {
  run_ranks(3, [](local_communicator& c) {
    fsdp::Model<Full> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries()) {
          auto g = u.grad(e.name);
          for (auto& x : g) x = 0.25f * float(c.rank() + 1);
        }
    }
    m.synchronize();
    for (std::size_t ui = 0; ui < m.size(); ++ui)
      for (const auto& v : m.unit(ui).shard_views())
        for (std::int64_t i = 0; i < v.local_numel(); ++i) REQUIRE(m.unit(ui).grad_shard()[v.shard_offset + i] == 1.0f);
    m.zero_grad();
    m.synchronize();
    for (std::size_t ui = 0; ui < m.size(); ++ui)
      for (std::int64_t i = 0; i < m.unit(ui).layout().shard_numel(); ++i) REQUIRE(m.unit(ui).grad_shard()[i] == 0.0f);
  });
}

TEST_CASE("a tied alias is the same storage as its target") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
    for (auto& u : m.forward())
      if (u.name() == "root") CHECK(u.param("head").data() == u.param("emb").data());
    for (auto& u : m.backward())
      if (u.name() == "root") CHECK(u.grad("head").data() == u.grad("emb").data());
  });
}

TEST_CASE("optimizers update only their shard, honour no_decay, and agree across world sizes") {
  // Every rank writes the same gradient 0.5 everywhere; after one AdamW step each element moved by the same
  // rule, so the gathered result equals the world-1 result bit for bit.
  auto run = [](int world) {
    std::map<std::string, std::vector<float>> out;
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<Full> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 3});
      fsdp::optim::adamw opt(m, {.lr = 0.1f, .weight_decay = 0.5f});
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries())
          for (auto& x : u.grad(e.name)) x = 0.5f;
      opt.step();
      auto full = fsdp::weights::gather_full_params(m);
      if (c.rank() == 0) out = std::move(full);
    });
    return out;
  };
  const auto one = run(1);
  const auto init_w = fsdp::init::value(fsdp::init::normal{0.5f, 3}, "h.1.w", 1);  // decayed: p(1 - lr wd) - lr
  CHECK(one.at("h.1.w")[1] == doctest::Approx(init_w * (1 - 0.05f) - 0.1f).epsilon(1e-6));
  for (int world : {2, 5})
    for (const auto& [name, v] : run(world)) CHECK(same_bits(v, one.at(name)));
  // h.0.b starts at 1 and has no decay: 1 - lr * m_hat / (sqrt(v_hat) + eps) = 1 - 0.1 * 0.5 / (0.5 + 1e-8)
  for (float x : one.at("h.0.b")) CHECK(x == doctest::Approx(0.9f).epsilon(1e-6));
}

TEST_CASE("a parameter too large for memory is a memory_error naming the unit, the parameter, the bytes and the rank") {
#if FSDP_TEST_SANITIZED
  MESSAGE("not run under a sanitizer: its allocator reports a 256 TiB request itself instead of failing it");
#else
  fsdp::ModelSpec spec;
  spec.add("small.w", {4}).add("big.w", {std::int64_t{1} << 16, std::int64_t{1} << 30}).add("big.b", {8});
  run_ranks(1, [&](local_communicator& c) {
    const std::string msg = fsdp_test::error_of<fsdp::memory_error>(
        [&] { fsdp::Model<Full> m(c, spec, fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
                                                           return p.name.substr(0, p.name.find('.'));  // small, big
                                                         }});
        });
    // 'big' holds 2^46 + 8 elements, padded to 2^46 + 16 (16-element alignment), 4 bytes each; 'small' holds its 4
    // elements padded to 16 twice (master and gradient shards): 128 bytes.
    CHECK(msg ==
          "fsdp: could not allocate the master and gradient shards of unit 'big' on rank 0: backend::host on rank 0: "
          "could not allocate 281474976710720 bytes of sharded params (std::bad_alloc: more than this process can "
          "have; 128 bytes held now); the unit's largest parameter is 'big.w' of shape [65536, 1073741824] "
          "(70368744177664 elements). Shard the model over more ranks, wrap it into smaller units, or make the "
          "parameter smaller");
  });
#endif
}
