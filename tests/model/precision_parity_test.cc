// Mixed-precision training parity: the example MLP with bf16 compute, reduced in fp32 and in bf16, with fp32
// compute over bf16 gathers (precision::wire), and with bf16 compute over fp8 gathers in blocks (precision::scaled),
// at 1, 3, 4 and 7 ranks, against a single-process run that does the
// same casts.
//
// The reference below uses no part of the library beyond the init rule, the example's layer loops and the bf16
// conversion (checked against independent references in tests/kernels/elementwise_test.cc). Per step it casts
// the fp32 masters to bf16, runs each rank's samples through the layers (each "rank" stores its gradient as bf16
// once, from fp32 sums), reduces the ranks' gradients the way an in-process reduction does, which is NCCL's
// average (each reduce-dtype value multiplied by 1/ranks rounded to the reduce dtype, the products summed in rank
// order from 0 and rounded to the reduce dtype after every addition), adds the result into a zeroed fp32
// gradient, and steps fp32 masters with the optimizer's formulas. That is the same sequence of roundings the sharded
// run makes, so the stated tolerance is zero: losses and parameters must equal the reference bit for bit. A cast in the
// wrong place (a gradient reduced before its bf16 rounding, a bf16 reduction summed in fp32, a compute copy not
// refreshed after a step) changes bits here.
//
// What bf16 reduction costs against fp32 reduction (the same bf16 compute) is measured here too and printed;
// docs/testing.md quotes the figures.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/model/reference.hpp"
#include "tests/support/support.hpp"

using fsdp::bfloat16;
using fsdp::comm::local_communicator;

namespace {

struct run {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;
};

/// The rounding of a value to the reduce dtype R (float: none).
template <class R>
float to_reduce(float x) {
  return float(R(x));
}

/// x rounded to the 8-bit G and back: fp8 by its element type, int8 by the C library (nearest even; |x| <= 127 here)
template <class G>
float round_to(float x) {
  if constexpr (std::is_same_v<G, std::int8_t>) return float(static_cast<std::int8_t>(std::nearbyint(x)));
  else return float(G(x));
}

/// A parameter's values through a block-scaled 8-bit gather of G in blocks of B (each block scaled by its largest
/// magnitude over G's largest value; the last block padded with zeros, which change no scale), rounded to W.
template <class G, class W, int B>
std::vector<W> scaled_blocks(const std::vector<float>& v) {
  const float top = std::is_same_v<G, fsdp::float8_e4m3> ? 448.0f
                    : std::is_same_v<G, std::int8_t>     ? 127.0f
                                                         : 57344.0f;
  std::vector<W> out;
  for (std::size_t b = 0; b < v.size(); b += B) {
    const std::size_t e = std::min(v.size(), b + B);
    float m = 0.0f;
    for (std::size_t k = b; k < e; ++k) m = std::max(m, std::fabs(v[k]));
    const float scale = m / top;
    for (std::size_t k = b; k < e; ++k) out.push_back(W(m == 0.0f ? 0.0f : round_to<G>(v[k] / scale) * scale));
  }
  return out;
}

/// The single-process run with the casts of W compute, G gathers (the masters rounded to G, then to W) and R
/// reduction over `world` simulated ranks, sharded in groups of `shards` consecutive ranks (the world: one group;
/// fewer: hybrid sharding, whose reduction sums each group's ranks in order, then the groups' results in order,
/// each an average of its own).
template <class W, class R, class G = W, int Block = 0, class QR = void>
run reference(const mlp::config& c, int world, int shards = 0) {
  if (shards == 0) shards = world;
  const int replicas = world / shards;
  const std::size_t layers = c.dims.size() - 1;
  mlp_reference::state st(c);
  const auto& w = st.w;
  const auto& b = st.b;
  run r;
  const int n = c.global_batch / world;
  std::vector<float> x, t;
  std::vector<std::vector<float>> act(layers + 1), dact(layers + 1);
  for (int step = 0; step < c.steps; ++step) {
    std::vector<std::vector<W>> wc(layers), bc(layers);  // the gathered compute copies
    for (std::size_t l = 0; l < layers; ++l) {
      if constexpr (Block == 0) {
        for (float v : w[l]) wc[l].push_back(W(float(G(v))));
        for (float v : b[l]) bc[l].push_back(W(float(G(v))));
      } else {  // fp8 or int8 in blocks of Block elements (each parameter starts a block: the layout aligns to Block)
        wc[l] = scaled_blocks<G, W, Block>(w[l]);
        bc[l] = scaled_blocks<G, W, Block>(b[l]);
      }
    }
    // per rank: forward, loss, backward into W gradients
    std::vector<std::vector<std::vector<W>>> gw(world, std::vector<std::vector<W>>(layers)), gb = gw;
    std::vector<float> loss(world);
    for (int rank = 0; rank < world; ++rank) {
      mlp::make_batch(c, step, rank * n, n, x, t);
      act[0] = x;
      for (std::size_t l = 0; l < layers; ++l) {
        act[l + 1].assign(static_cast<std::size_t>(n) * c.dims[l + 1], 0.0f);
        mlp::linear_forward<W>(act[l].data(), wc[l].data(), bc[l].data(), act[l + 1].data(), n, c.dims[l],
                               c.dims[l + 1], l + 1 < layers);
      }
      dact[layers].assign(act[layers].size(), 0.0f);
      loss[rank] = mlp::mse(act[layers].data(), t.data(), dact[layers].data(), n, c.dims.back());
      for (std::size_t l = layers; l-- > 0;) {
        if (l + 1 < layers)
          for (std::size_t k = 0; k < act[l + 1].size(); ++k)
            if (act[l + 1][k] <= 0.0f) dact[l + 1][k] = 0.0f;
        gw[rank][l].assign(w[l].size(), W(0.0f));
        gb[rank][l].assign(b[l].size(), W(0.0f));
        dact[l].assign(static_cast<std::size_t>(n) * c.dims[l], 0.0f);
        mlp::linear_backward<W>(act[l].data(), wc[l].data(), dact[l + 1].data(), gw[rank][l].data(), gb[rank][l].data(),
                                l > 0 ? dact[l].data() : nullptr, n, c.dims[l], c.dims[l + 1]);
      }
    }
    float global = 0.0f;  // the loss all-reduce: an fp32 average (NCCL's: each loss times float(1 / world))
    const float loss_premul = world == 1 ? 1.0f : static_cast<float>(1.0 / world);
    for (int rank = 0; rank < world; ++rank) global += loss[rank] * loss_premul;
    r.losses.push_back(global);
    // the reduction of each element, then the fp32 gradient; an average pre-multiplies by 1/n in R (as NCCL), for
    // the n ranks of the shard group, then (hybrid) for the n replicas
    auto premul = [](int n) { return n == 1 ? 1.0f : to_reduce<R>(static_cast<float>(1.0 / n)); };
    auto reduce = [&](const auto& per_rank, std::size_t l, std::size_t i) {
      float total = 0.0f;
      for (int replica = 0; replica < replicas; ++replica) {
        float acc = 0.0f;
        for (int rank = replica * shards; rank < (replica + 1) * shards; ++rank)
          acc = to_reduce<R>(acc + to_reduce<R>(to_reduce<R>(float(per_rank[rank][l][i])) * premul(shards)));
        total = replicas == 1 ? acc : to_reduce<R>(total + to_reduce<R>(acc * premul(replicas)));
      }
      return 0.0f + total;
    };
    if constexpr (std::is_void_v<QR>) {
      mlp_reference::step(
          c, step, st, [&](std::size_t l, std::size_t i) { return reduce(gw, l, i); },
          [&](std::size_t l, std::size_t i) { return reduce(gb, l, i); });
    } else {  // a quantized reduction: each rank's gradient through QR blocks of Block, then the fp32 reduction
      std::vector<std::vector<std::vector<float>>> qw(world, std::vector<std::vector<float>>(layers)), qb = qw;
      for (int rank = 0; rank < world; ++rank)
        for (std::size_t l = 0; l < layers; ++l) {
          qw[rank][l] = scaled_blocks<QR, float, Block>(std::vector<float>(gw[rank][l].begin(), gw[rank][l].end()));
          qb[rank][l] = scaled_blocks<QR, float, Block>(std::vector<float>(gb[rank][l].begin(), gb[rank][l].end()));
        }
      mlp_reference::step(
          c, step, st, [&](std::size_t l, std::size_t i) { return reduce(qw, l, i); },
          [&](std::size_t l, std::size_t i) { return reduce(qb, l, i); });
    }
  }
  r.params = st.params();
  return r;
}

template <class W, class R, class Strategy = fsdp::sharding::full_shard, class G = W>
run sharded(int world, const mlp::config& c) {
  using P = fsdp::policy<Strategy, fsdp::prefetch::next, fsdp::precision::mixed<W, float, R, G>>;
  std::vector<mlp::result> out(static_cast<std::size_t>(world));
  fsdp_test::run_ranks(world, [&](local_communicator& comm) { out[comm.rank()] = mlp::train<P>(comm, c); });
  for (int r = 1; r < world; ++r) {  // every rank saw the same global loss and holds the same parameters
    CHECK(out[r].losses == out[0].losses);
    CHECK(out[r].params == out[0].params);
  }
  return {out[0].losses, out[0].params};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_same(const run& got, const run& want) {
  CHECK(same_bits(got.losses, want.losses));
  REQUIRE(got.params.size() == want.params.size());
  for (const auto& [name, v] : want.params) {
    CAPTURE(name);
    CHECK(same_bits(got.params.at(name), v));
  }
}

/// Largest parameter difference and largest relative loss difference between two runs.
std::pair<float, float> difference(const run& a, const run& b) {
  float dp = 0, dl = 0;
  for (const auto& [name, v] : a.params)
    for (std::size_t i = 0; i < v.size(); ++i) dp = std::max(dp, std::abs(v[i] - b.params.at(name)[i]));
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    dl = std::max(dl, std::abs(a.losses[i] - b.losses[i]) / std::abs(b.losses[i]));
  return {dp, dl};
}

mlp::config config(const char* optimizer) {
  mlp::config c;
  c.dims = {16, 48, 32, 8};
  c.steps = 20;
  c.global_batch = 84;  // splits over 1, 3, 4 and 7 ranks
  c.optimizer = optimizer;
  c.lr = std::string(optimizer) == "adamw" ? 3e-3f : 0.05f;
  return c;
}

template <class R>
void check_parity(const std::string& optimizer) {
  const mlp::config c = config(optimizer.c_str());
  for (int world : {1, 3, 4, 7}) {
    CAPTURE(world);
    CAPTURE(optimizer);
    const run want = reference<bfloat16, R>(c, world);
    REQUIRE(want.losses.size() == 20);
    CHECK(want.losses.back() < 0.9f * want.losses.front());  // it is learning: the comparison is not of constants
    check_same(sharded<bfloat16, R>(world, c), want);
  }
}
}  // namespace

TEST_CASE("bf16 compute, fp32 reduction: equals the single-process run with the same casts, bit for bit") {
  check_parity<float>("adamw");
  check_parity<float>("sgd");
}

TEST_CASE("bf16 compute, bf16 reduction: equals the single-process run with the same casts, bit for bit") {
  check_parity<bfloat16>("adamw");
  check_parity<bfloat16>("sgd");
}

TEST_CASE("fp32 compute over bf16 gathers: equals the single-process run that widens bf16 weights, bit for bit") {
  for (const char* optimizer : {"adamw", "sgd"}) {
    const mlp::config c = config(optimizer);
    for (int world : {1, 3, 4, 7}) {
      CAPTURE(world);
      CAPTURE(optimizer);
      const run want = reference<float, float, bfloat16>(c, world);
      CHECK(want.losses.back() < 0.9f * want.losses.front());
      check_same(sharded<float, float, fsdp::sharding::full_shard, bfloat16>(world, c), want);
      // not the fp32 run: the gathers' rounding shows in the losses
      CHECK_FALSE(same_bits(want.losses, reference<float, float>(c, world).losses));
    }
    check_same(sharded<float, float, fsdp::sharding::no_shard, bfloat16>(4, c),
               reference<float, float, bfloat16>(c, 4));
  }
}

TEST_CASE("bf16 compute over fp8 or int8 gathers in blocks of 16: equals the single-process run that quantizes the "
          "same blocks, bit for bit") {
  auto check = [](auto g_tag, auto block_tag) {
    using G = decltype(g_tag);
    constexpr int B = decltype(block_tag)::value;
    for (const char* optimizer : {"adamw", "sgd"}) {
      const mlp::config c = config(optimizer);
      for (int world : {1, 3, 4, 7}) {
        CAPTURE(world);
        CAPTURE(optimizer);
        const run want = reference<bfloat16, float, G, B>(c, world);
        CHECK(want.losses.back() < 0.9f * want.losses.front());
        using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::scaled<G, B>>;
        std::vector<mlp::result> out(static_cast<std::size_t>(world));
        fsdp_test::run_ranks(world, [&](local_communicator& comm) { out[comm.rank()] = mlp::train<P>(comm, c); });
        check_same({out[0].losses, out[0].params}, want);
        // not the bf16 run: the quantization shows in the losses
        CHECK_FALSE(same_bits(want.losses, reference<bfloat16, float>(c, world).losses));
      }
    }
  };
  check(fsdp::float8_e4m3{}, std::integral_constant<int, 16>{});
  check(std::int8_t{}, std::integral_constant<int, 16>{});
}

TEST_CASE("gradients reduced in fp8 or int8 blocks of 16 (all_to_all, then an fp32 sum): equals the single-process "
          "run that quantizes each rank's gradient in the same blocks, bit for bit") {
  auto check = [](auto g_tag) {
    using G = decltype(g_tag);
    for (const char* optimizer : {"adamw", "sgd"}) {
      const mlp::config c = config(optimizer);
      for (int world : {1, 3, 4, 7}) {
        CAPTURE(world);
        CAPTURE(optimizer);
        const run want = reference<bfloat16, float, G, 16, G>(c, world);
        CHECK(want.losses.back() < 0.9f * want.losses.front());
        using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
                               fsdp::precision::scaled<G, 16, bfloat16, G>>;
        std::vector<mlp::result> out(static_cast<std::size_t>(world));
        fsdp_test::run_ranks(world, [&](local_communicator& comm) { out[comm.rank()] = mlp::train<P>(comm, c); });
        for (int r = 1; r < world; ++r) CHECK(out[r].params == out[0].params);
        check_same({out[0].losses, out[0].params}, want);
        // not the run with an fp32 reduction: the gradients' quantization shows in the parameters
        CHECK_FALSE(
            same_bits(want.params.begin()->second, reference<bfloat16, float, G, 16>(c, world).params.begin()->second));
      }
    }
  };
  check(fsdp::float8_e4m3{});
  check(std::int8_t{});
}

TEST_CASE("fp32 reference of the same emulation equals the fp32 library run (the emulation itself is right)") {
  const mlp::config c = config("adamw");
  for (int world : {1, 4}) {
    CAPTURE(world);
    check_same(sharded<float, float>(world, c), reference<float, float>(c, world));
  }
}

TEST_CASE("what bf16 reduction costs against fp32 reduction, measured (bf16 compute, AdamW, 20 steps)") {
  const mlp::config c = config("adamw");
  const run fp32 = reference<float, float>(c, 1);  // everything fp32, one rank
  for (int world : {1, 3, 4, 7}) {
    CAPTURE(world);
    const run r32 = reference<bfloat16, float>(c, world), r16 = reference<bfloat16, bfloat16>(c, world);
    const auto [dp, dl] = difference(r16, r32);
    const auto [cp, cl] = difference(r32, fp32);
    MESSAGE("world ", world, ": bf16 vs fp32 reduction: worst parameter difference ", dp, ", worst loss difference ",
            dl, " (relative); bf16 compute with fp32 reduction vs all-fp32 at one rank: ", cp, ", ", cl);
    if (world == 1) {
      CHECK(dp == 0.0f);  // one rank: nothing is summed, the bf16 gradient is what either reduction returns
    } else {
      CHECK(dp > 0.0f);  // the bf16 reduction rounds its partial sums: it must show
      CHECK(dl < 0.02f);  // and stay a rounding-level effect on the loss
    }
  }
}

namespace {
/// hybrid_shard and hybrid_shard_zero2 over replicas x Shards ranks, compute W and reduction R, against the
/// reference that reduces inside each shard group, then across the groups.
template <int Shards, class W, class R>
void check_hybrid(int replicas, const mlp::config& c) {
  const int world = replicas * Shards;
  CAPTURE(world);
  CAPTURE(Shards);
  CAPTURE(fsdp::name_of(fsdp::dtype_of_v<W>));
  CAPTURE(fsdp::name_of(fsdp::dtype_of_v<R>));
  const run want = reference<W, R>(c, world, Shards);
  CHECK(want.losses.back() < 0.9f * want.losses.front());
  check_same(sharded<W, R, fsdp::sharding::hybrid_shard<Shards>>(world, c), want);
  check_same(sharded<W, R, fsdp::sharding::hybrid_shard_zero2<Shards>>(world, c), want);
}
}  // namespace

TEST_CASE("hybrid sharding at 2 x 2 and 2 x 4 equals the reference that reduces per group, for every precision") {
  mlp::config c = config("adamw");
  c.global_batch = 96;  // splits over 4 and 8 ranks
  check_hybrid<2, float, float>(2, c);
  check_hybrid<4, float, float>(2, c);
  check_hybrid<2, bfloat16, float>(2, c);
  check_hybrid<4, bfloat16, float>(2, c);
  check_hybrid<2, bfloat16, bfloat16>(2, c);
  check_hybrid<4, bfloat16, bfloat16>(2, c);
  c.optimizer = "sgd";
  c.lr = 0.05f;
  check_hybrid<4, bfloat16, bfloat16>(2, c);
  // The reference's grouping is not a no-op: with bf16 reduction, summing per group then across groups rounds
  // differently from one flat sum over 8 ranks, so the comparisons above can tell the two apart.
  CHECK(!same_bits(reference<bfloat16, bfloat16>(c, 8, 4).params.begin()->second,
                   reference<bfloat16, bfloat16>(c, 8).params.begin()->second));
}
