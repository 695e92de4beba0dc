// Training parity: the MLP trained with each sharding strategy at 3 and 4 ranks follows the unsharded
// single-rank run on the same global batch. The reference below uses no part of the library beyond the init
// rule (whose world-size independence model_test proves) and has its own optimizer loops.
//
// Tolerance. Sharding changes only the order of fp32 sums: each rank sums its samples' gradients, then the
// ranks' means are averaged, where the reference sums all samples at once; the loss is averaged the same way. A
// reordered sum of k terms differs by at most about k * 2^-24 of the sum of magnitudes, so per step the gradients
// agree to about 1e-7 relative. SGD passes that on unchanged: measured worst parameter difference after 20 steps
// 6e-8 (3 and 4 ranks), bound 1e-6. AdamW divides by sqrt(v): for an element whose gradient is near zero a 1e-7
// difference can move its step by a visible fraction of lr (3e-3); measured worst 1.3e-5, bound 1e-4 (lr / 30).
// Losses: measured worst 3e-6 relative, bound 2e-5. A real fault (a missing 1/W, a lost or doubled unit, a
// stale gather) moves them by 1e-2 or more. At one rank the order of operations is the reference's, and the
// results must be identical bit for bit.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cmath>
#include <cstring>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/model/reference.hpp"
#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;

namespace {
constexpr float kLossRel = 2e-5f;
float param_bound(const std::string& optimizer) { return optimizer == "adamw" ? 1e-4f : 1e-6f; }

struct reference_result {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;
};

/// Plain single-process training on the whole global batch.
reference_result reference(const mlp::config& c) {
  const std::size_t layers = c.dims.size() - 1;
  mlp_reference::state st(c);
  auto& w = st.w;
  auto& b = st.b;
  std::vector<std::vector<float>> gw(layers), gb(layers);
  reference_result r;
  const int n = c.global_batch;
  std::vector<float> x, t;
  std::vector<std::vector<float>> act(layers + 1), dact(layers + 1);
  for (int step = 0; step < c.steps; ++step) {
    mlp::make_batch(c, step, 0, n, x, t);
    act[0] = x;
    for (std::size_t l = 0; l < layers; ++l) {
      act[l + 1].assign(static_cast<std::size_t>(n) * c.dims[l + 1], 0.0f);
      mlp::linear_forward(act[l].data(), w[l].data(), b[l].data(), act[l + 1].data(), n, c.dims[l], c.dims[l + 1],
                          l + 1 < layers);
    }
    dact[layers].assign(act[layers].size(), 0.0f);
    r.losses.push_back(mlp::mse(act[layers].data(), t.data(), dact[layers].data(), n, c.dims.back()));
    for (std::size_t l = layers; l-- > 0;) {
      if (l + 1 < layers)
        for (std::size_t k = 0; k < act[l + 1].size(); ++k)
          if (act[l + 1][k] <= 0.0f) dact[l + 1][k] = 0.0f;
      gw[l].assign(w[l].size(), 0.0f);
      gb[l].assign(b[l].size(), 0.0f);
      dact[l].assign(static_cast<std::size_t>(n) * c.dims[l], 0.0f);
      mlp::linear_backward(act[l].data(), w[l].data(), dact[l + 1].data(), gw[l].data(), gb[l].data(),
                           l > 0 ? dact[l].data() : nullptr, n, c.dims[l], c.dims[l + 1]);
    }
    mlp_reference::step(
        c, step, st, [&](std::size_t l, std::size_t i) { return gw[l][i]; },
        [&](std::size_t l, std::size_t i) { return gb[l][i]; });
  }
  r.params = st.params();
  return r;
}

template <class Strategy>
mlp::result sharded(int world, const mlp::config& c) {
  std::vector<mlp::result> out(static_cast<std::size_t>(world));
  fsdp_test::run_ranks(world, [&](local_communicator& comm) {
    out[comm.rank()] = mlp::train<fsdp::policy<Strategy>>(comm, c);
  });
  for (int r = 1; r < world; ++r) {  // every rank saw the same global loss and holds the same parameters
    CHECK(out[r].losses == out[0].losses);
    CHECK(out[r].params == out[0].params);
  }
  return out[0];
}

template <class Strategy>
void check_parity(const mlp::config& c) {
  const reference_result ref = reference(c);
  REQUIRE(ref.losses.size() == 20);
  CHECK(ref.losses.back() < 0.8f * ref.losses.front());  // it is learning: the comparison is not of constants
  {
    const mlp::result one = sharded<Strategy>(1, c);
    CHECK(one.losses == ref.losses);  // bit for bit
    CHECK(one.params == ref.params);
  }
  for (int world : {3, 4}) {
    CAPTURE(world);
    CAPTURE(Strategy::name);
    CAPTURE(c.optimizer);
    const mlp::result got = sharded<Strategy>(world, c);
    REQUIRE(got.losses.size() == ref.losses.size());
    float worst_loss = 0, worst_param = 0;
    for (std::size_t i = 0; i < ref.losses.size(); ++i) {
      const float rel = std::abs(got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]);
      worst_loss = std::max(worst_loss, rel);
      CHECK(rel <= kLossRel);
    }
    REQUIRE(got.params.size() == ref.params.size());
    for (const auto& [name, v] : ref.params) {
      const auto& g = got.params.at(name);
      REQUIRE(g.size() == v.size());
      for (std::size_t i = 0; i < v.size(); ++i) worst_param = std::max(worst_param, std::abs(g[i] - v[i]));
    }
    CHECK(worst_param <= param_bound(c.optimizer));
    MESSAGE(Strategy::name, " ", c.optimizer, " world ", world, ": worst loss rel diff ", worst_loss,
            ", worst param abs diff ", worst_param);
  }
}

mlp::config config(const char* optimizer) {
  mlp::config c;
  c.steps = 20;
  c.global_batch = 48;
  c.optimizer = optimizer;
  c.lr = std::string(optimizer) == "adamw" ? 3e-3f : 0.05f;
  c.model.check_views = true;  // a view of the example used past its unit's release fails the test, named
  return c;
}
}  // namespace

TEST_CASE("full_shard matches the unsharded run") {
  check_parity<fsdp::sharding::full_shard>(config("adamw"));
  check_parity<fsdp::sharding::full_shard>(config("sgd"));
}
TEST_CASE("shard_grad_op matches the unsharded run") {
  check_parity<fsdp::sharding::shard_grad_op>(config("adamw"));
  check_parity<fsdp::sharding::shard_grad_op>(config("sgd"));
}
TEST_CASE("zero1 matches the unsharded run") {
  check_parity<fsdp::sharding::zero1>(config("adamw"));
  check_parity<fsdp::sharding::zero1>(config("sgd"));
}
TEST_CASE("no_shard matches the unsharded run") {
  check_parity<fsdp::sharding::no_shard>(config("adamw"));
  check_parity<fsdp::sharding::no_shard>(config("sgd"));
}
