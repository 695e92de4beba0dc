// Mixed precision and gradient accumulation on the host backend:
//   - the gathered parameters are the fp32 masters rounded to the compute dtype, bit for bit; with a narrower
//     gather dtype (precision::wire), the fp32 views hold the masters rounded to the gather dtype, widened; with fp8
//     gathers in blocks (precision::scaled), the views are the blocks dequantized, the same bits at every world size;
//   - collective counts and bytes per step are exact for every precision, strategy and accumulation mode (a bf16
//     gather moves half the bytes of an fp32 one; no-sync reduces once per step; kept units gather once);
//   - the reduced gradient shards are exact for every precision and division mode (values chosen so that every
//     cast and every sum is exact, so any lost, doubled or mis-scaled contribution shows);
//   - the accumulation protocol: steps and backward passes outside the declared window are errors naming it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "tests/support/moe.hpp"
#include "tests/support/support.hpp"

using fsdp::bfloat16;
using fsdp::collective;
using fsdp::float16;
using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::five_units;
using fsdp_test::run_ranks;

namespace {

template <class Compute, class Reduce, class Strategy = fsdp::sharding::full_shard,
          class Prefetch = fsdp::prefetch::next, class Gather = Compute>
using policy = fsdp::policy<Strategy, Prefetch, fsdp::precision::mixed<Compute, float, Reduce, Gather>>;

template <class T>
std::uint16_t bits_of(T x) {
  return x.bits;
}
std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
}  // namespace

TEST_CASE("gathered parameters are the fp32 masters rounded to the compute dtype, bit for bit") {
  auto check = [](auto tag, int world, auto strategy) {
    using T = decltype(tag);
    using P = policy<T, float, decltype(strategy)>;
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 7});
      static_assert(std::is_same_v<typename fsdp::Model<P>::unit_type, fsdp::FsdpUnit<fsdp::backend::host, T>>);
      const auto full = fsdp::weights::gather_full_params(m);  // the fp32 masters
      std::size_t checked = 0;
      for (auto& u : m.forward())
        for (const auto& e : u.layout().entries()) {
          const auto v = u.param(e.name);  // T by default
          const auto& master = full.at(e.name);
          for (std::int64_t i = 0; i < v.numel(); ++i, ++checked) REQUIRE(bits_of(v[i]) == bits_of(T(master[i])));
        }
      CHECK(checked == 185 + 81 + 9 + 3 + 272 + 4);
    });
  };
  for (int world : {1, 3, 4, 7}) {
    CAPTURE(world);
    check(bfloat16{}, world, fsdp::sharding::full_shard{});
    check(float16{}, world, fsdp::sharding::full_shard{});
    check(bfloat16{}, world, fsdp::sharding::no_shard{});  // a cast without a collective
  }
}

TEST_CASE("gathered in bf16 or fp16, computed in fp32: each fp32 view holds its master rounded to the gather dtype") {
  auto check = [](auto gather_tag, int world, auto strategy) {
    using G = decltype(gather_tag);
    using P = fsdp::policy<decltype(strategy), fsdp::prefetch::next, fsdp::precision::wire<G>>;
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 7});
      static_assert(std::is_same_v<typename fsdp::Model<P>::unit_type, fsdp::FsdpUnit<fsdp::backend::host, float>>);
      const auto full = fsdp::weights::gather_full_params(m);  // the fp32 masters
      std::size_t checked = 0, rounded = 0;
      for (auto& u : m.forward())
        for (const auto& e : u.layout().entries()) {
          const auto v = u.param(e.name);  // float
          const auto& master = full.at(e.name);
          for (std::int64_t i = 0; i < v.numel(); ++i, ++checked) {
            REQUIRE(bits_of(v[i]) == bits_of(float(G(master[i]))));
            rounded += v[i] != master[i];
          }
        }
      CHECK(checked == 185 + 81 + 9 + 3 + 272 + 4);
      CHECK(rounded > checked / 2);  // the views are not the masters themselves: the rounding happened
    });
  };
  for (int world : {1, 3, 4, 7}) {
    CAPTURE(world);
    check(bfloat16{}, world, fsdp::sharding::full_shard{});
    check(float16{}, world, fsdp::sharding::full_shard{});
    check(bfloat16{}, world, fsdp::sharding::shard_grad_op{});
    check(bfloat16{}, world, fsdp::sharding::no_shard{});  // the cast and the widening, without a collective
  }
}

namespace {
/// x rounded to the 8-bit Q and back: fp8 by its element type, int8 by the C library (nearest even; |x| <= 127 here)
template <class Q>
float round_to(float x) {
  if constexpr (std::is_same_v<Q, std::int8_t>) return float(static_cast<std::int8_t>(std::nearbyint(x)));
  else return float(Q(x));
}

/// The reference of a block-scaled 8-bit gather, written here apart from kernels/quantize.hpp: the unit's flat fp32
/// buffer (parameters at their offsets, zeros between) in blocks of B, each scaled by its largest magnitude over the
/// format's largest value, each element divided by the scale, rounded to Q, multiplied back and rounded to T.
template <class Q, class T>
std::vector<T> scaled_reference(const std::vector<float>& flat, std::int64_t block, float top) {
  std::vector<T> out;
  for (std::size_t b = 0; b < flat.size(); b += std::size_t(block)) {
    float m = 0.0f;
    for (std::size_t k = b; k < b + std::size_t(block); ++k) m = std::max(m, std::fabs(flat[k]));
    const float scale = m / top;
    for (std::size_t k = b; k < b + std::size_t(block); ++k)
      out.push_back(T(m == 0.0f ? 0.0f : round_to<Q>(flat[k] / scale) * scale));
  }
  return out;
}

/// The largest value of the 8-bit Q, to which a block's largest magnitude is scaled.
template <class Q>
constexpr float top_of() {
  if constexpr (std::is_same_v<Q, fsdp::float8_e4m3>)
    return 448.0f;
  else if constexpr (std::is_same_v<Q, std::int8_t>)
    return 127.0f;
  else
    return 57344.0f;  // E5M2
}

/// Elements of views checked, and how many of them equal their master rounded to bf16.
struct view_counts {
  std::size_t checked = 0, exact = 0;
};

/// Unit `u`'s views under a gather in Q blocks of B, each element bit for bit scaled_reference of the unit's flat
/// buffer of its masters (`masters` by name: weights::gather_full_params, a rank's own experts for an expert unit).
template <class Q, class Unit, class Masters>
view_counts check_scaled_views(Unit& u, const Masters& masters, int B) {
  std::vector<float> flat(std::size_t(u.layout().padded_numel()), 0.0f);
  for (const auto& e : u.layout().entries())
    for (std::int64_t i = 0; i < e.numel; ++i) flat[std::size_t(e.offset + i)] = masters.at(e.name)[std::size_t(i)];
  const std::vector<bfloat16> want = scaled_reference<Q, bfloat16>(flat, B, top_of<Q>());
  view_counts n;
  for (const auto& e : u.layout().entries()) {
    const auto v = u.param(e.name);
    for (std::int64_t i = 0; i < v.numel(); ++i, ++n.checked) {
      REQUIRE(bits_of(v[i]) == bits_of(want[std::size_t(e.offset + i)]));
      n.exact += bits_of(v[i]) == bits_of(bfloat16(masters.at(e.name)[std::size_t(i)]));
    }
  }
  return n;
}
}  // namespace

TEST_CASE("gathered in fp8 or int8 blocks with a scale each: the views are the blocks dequantized, the same bits at "
          "every world size") {
  auto check = [](auto q_tag, auto block_tag, int world, auto strategy) {
    using Q = decltype(q_tag);
    constexpr int B = decltype(block_tag)::value;
    using P = fsdp::policy<decltype(strategy), fsdp::prefetch::next, fsdp::precision::scaled<Q, B>>;
    fsdp::model_options mo;
    mo.layout.align = B;
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 7}, mo);
      const auto full = fsdp::weights::gather_full_params(m);  // the fp32 masters
      std::size_t checked = 0, exact = 0;
      for (auto& u : m.forward()) {
        const view_counts n = check_scaled_views<Q>(u, full, B);
        checked += n.checked;
        exact += n.exact;
      }
      CHECK(checked == 185 + 81 + 9 + 3 + 272 + 4);
      CHECK(exact < checked);  // 8 bits are not bf16: the quantization shows
    });
  };
  for (int world : {1, 3, 4, 7}) {
    CAPTURE(world);
    check(fsdp::float8_e4m3{}, std::integral_constant<int, 16>{}, world, fsdp::sharding::full_shard{});
    check(fsdp::float8_e5m2{}, std::integral_constant<int, 32>{}, world, fsdp::sharding::full_shard{});
    check(fsdp::float8_e4m3{}, std::integral_constant<int, 64>{}, world, fsdp::sharding::shard_grad_op{});
    check(fsdp::float8_e4m3{}, std::integral_constant<int, 16>{}, world, fsdp::sharding::no_shard{});
    check(std::int8_t{}, std::integral_constant<int, 16>{}, world, fsdp::sharding::full_shard{});
    check(std::int8_t{}, std::integral_constant<int, 32>{}, world, fsdp::sharding::shard_grad_op{});
  }
}

TEST_CASE("a scaled gather's blocks must not cross a shard: an alignment that is no multiple of the block is refused") {
  using P =
      fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::scaled<fsdp::float8_e4m3, 64>>;
  run_ranks(2, [](local_communicator& c) {
    CHECK(error_of<fsdp::usage_error>([&] { fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}); }) ==
          "fsdp: the precision gathers in blocks of 64 elements with a scale each, and a block must not cross a "
          "shard: shards are multiples of model_options::layout.align, which is 16; set it to a multiple of 64");
  });
}

namespace {
/// The collectives of one optimizer step of `micro` micro-batches (no gradient inspection: the step itself issues
/// none), every rank writing gradient 1 everywhere.
template <class P>
fsdp::collective_stats one_step(local_communicator& c, const fsdp::model_options& mo,
                                std::vector<std::int64_t>& padded) {
  fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, mo);
  fsdp::optim::sgd opt(m, {.lr = 0.1f});
  padded.clear();
  for (std::size_t u = 0; u < m.size(); ++u) padded.push_back(m.unit(u).layout().padded_numel());
  c.reset_stats();
  for (int mb = 0; mb < mo.accumulation.micro_batches; ++mb) {
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward())
      for (const auto& e : u.layout().entries())
        for (auto& x : u.grad(e.name)) x = typename P::precision::compute_type(1.0f);
  }
  opt.step();
  m.synchronize();
  return c.stats();
}

struct mode {
  const char* name;
  fsdp::grad_sync sync;
  bool keep;
};
const mode modes[] = {{"every micro-batch", fsdp::grad_sync::every_micro_batch, false},
                      {"no-sync", fsdp::grad_sync::last_micro_batch, false},
                      {"every micro-batch, kept gathered", fsdp::grad_sync::every_micro_batch, true},
                      {"no-sync, kept gathered", fsdp::grad_sync::last_micro_batch, true}};

/// Checks the counts and bytes of every mode against what the strategy implies, per unit of padded size P:
/// a gather moves P gather elements, a reduction P reduce elements (the unsharded size, as nccl-tests count).
template <class Compute, class Reduce, class Strategy, class Gather = Compute>
void check_counts(int world) {
  using P = policy<Compute, Reduce, Strategy, fsdp::prefetch::next, Gather>;
  constexpr std::uint64_t k = 3;  // micro-batches
  const std::uint64_t cs = sizeof(Gather), rs = sizeof(Reduce);
  for (const mode& md : modes) {
    CAPTURE(md.name);
    CAPTURE(Strategy::name);
    CAPTURE(world);
    fsdp::model_options mo;
    mo.accumulation = {.micro_batches = int(k), .sync = md.sync, .keep_gathered = md.keep};
    run_ranks(world, [&](local_communicator& c) {
      std::vector<std::int64_t> padded;
      const fsdp::collective_stats s = one_step<P>(c, mo, padded);
      const std::uint64_t n = padded.size();
      std::uint64_t sum_p = 0;
      for (auto p : padded) sum_p += std::uint64_t(p);
      // gathers per step: a sharded unit is gathered for each forward and (full_shard) each backward, but for the
      // first unit of the forward pass (unit 0), kept into its backward by default; once per step when kept
      // gathered; a replicated unit is never all-gathered (its cast needs no collective)
      std::uint64_t gathers = 0, gathered = 0;  // collectives, and the elements they gather
      if (Strategy::shards_params) {
        if (md.keep) {
          gathers = n;
          gathered = sum_p;
        } else if (Strategy::reshard_after_forward) {
          gathers = (2 * n - 1) * k;
          gathered = (2 * sum_p - std::uint64_t(padded[0])) * k;
        } else {
          gathers = n * k;
          gathered = sum_p * k;
        }
      }
      // reductions: every micro-batch, or once per step under no-sync
      const std::uint64_t reductions = md.sync == fsdp::grad_sync::every_micro_batch ? n * k : n;
      const auto red = Strategy::shards_params ? collective::reduce_scatter : collective::all_reduce;
      const auto other = Strategy::shards_params ? collective::all_reduce : collective::reduce_scatter;
      CHECK(s.count[std::size_t(collective::all_gather)] == gathers);
      CHECK(s.bytes[std::size_t(collective::all_gather)] == gathered * cs);
      // and the step's commit (model_options::commit_step): one element of the gradient (compute) dtype
      // all-reduced over the world
      const std::uint64_t commit = red == collective::all_reduce ? 1 : 0;
      CHECK(s.count[std::size_t(red)] == reductions + commit);
      CHECK(s.bytes[std::size_t(red)] == reductions / n * sum_p * rs + commit * sizeof(Compute));
      CHECK(s.count[std::size_t(other)] == 1 - commit);
      CHECK(s.bytes[std::size_t(other)] == (1 - commit) * sizeof(Compute));
      CHECK(s.count[std::size_t(collective::broadcast)] == 0);
    });
  }
}
}  // namespace

TEST_CASE("collective counts and bytes per step are exact for every precision, strategy and accumulation mode") {
  for (int world : {1, 4}) {
    check_counts<float, float, fsdp::sharding::full_shard>(world);
    check_counts<bfloat16, float, fsdp::sharding::full_shard>(world);
    check_counts<bfloat16, bfloat16, fsdp::sharding::full_shard>(world);
    check_counts<float16, float16, fsdp::sharding::full_shard>(world);
    check_counts<bfloat16, bfloat16, fsdp::sharding::shard_grad_op>(world);
    check_counts<float, float, fsdp::sharding::no_shard>(world);
    check_counts<bfloat16, float, fsdp::sharding::no_shard>(world);
    check_counts<float, float, fsdp::sharding::full_shard, bfloat16>(world);
    check_counts<float, bfloat16, fsdp::sharding::shard_grad_op, float16>(world);
    check_counts<float, float, fsdp::sharding::no_shard, bfloat16>(world);
  }
}

TEST_CASE("a bf16 gather moves half the bytes of an fp32 one, and a bf16 reduction half those of an fp32 one") {
  run_ranks(4, [](local_communicator& c) {
    std::vector<std::int64_t> padded;
    const auto f32 = one_step<policy<float, float>>(c, {}, padded);
    const auto bf16 = one_step<policy<bfloat16, bfloat16>>(c, {}, padded);
    const auto mixed = one_step<policy<bfloat16, float>>(c, {}, padded);
    const auto ag = std::size_t(collective::all_gather), rs = std::size_t(collective::reduce_scatter);
    CHECK(bf16.count[ag] == f32.count[ag]);
    CHECK(2 * bf16.bytes[ag] == f32.bytes[ag]);
    CHECK(2 * bf16.bytes[rs] == f32.bytes[rs]);
    CHECK(mixed.bytes[ag] == bf16.bytes[ag]);  // bf16 gathers, fp32 reduction
    CHECK(mixed.bytes[rs] == f32.bytes[rs]);
    // fp32 compute over bf16 gathers: the gathers of bf16, the reduction of fp32
    const auto wire = one_step<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
                                            fsdp::precision::wire<bfloat16>>>(c, {}, padded);
    CHECK(wire.count[ag] == f32.count[ag]);
    CHECK(wire.bytes[ag] == bf16.bytes[ag]);
    CHECK(wire.bytes[rs] == f32.bytes[rs]);
  });
}

TEST_CASE("a scaled gather: values and scales move in one all-gather, a quarter of fp32's bytes plus the scales") {
  run_ranks(4, [](local_communicator& c) {
    std::vector<std::int64_t> padded;
    const auto f32 = one_step<policy<float, float>>(c, {}, padded);
    const auto fp8 = one_step<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
                                           fsdp::precision::scaled<fsdp::float8_e4m3, 16>>>(c, {}, padded);
    const auto ag = std::size_t(collective::all_gather), rs = std::size_t(collective::reduce_scatter);
    std::uint64_t sum_p = 0;
    for (auto p : padded) sum_p += std::uint64_t(p);
    const std::uint64_t gathered = 2 * sum_p - std::uint64_t(padded[0]);  // twice each, the first unit (kept) once
    CHECK(fp8.count[ag] == f32.count[ag]);
    CHECK(fp8.bytes[ag] == gathered + gathered / 16 * 4);  // values, then a scale per 16
    CHECK(fp8.bytes[rs] == f32.bytes[rs]);  // bf16 gradients reduced in fp32: the fp32 bytes
  });
}

namespace {
/// The value every rank r writes at element i of a parameter in micro-batch mb: small integers, so that every
/// cast (bf16, fp16) and every partial sum over 4 ranks and 2 micro-batches is exact.
float written(std::int64_t i, int rank, int mb) { return float((i % 8 + 1) * (rank + 1) * (mb + 1)); }

/// Trains one step of two micro-batches on 4 ranks and checks every element of every gradient shard against
/// `expect(i)` (i: the element's index in its parameter) before the optimizer runs.
template <class P>
void check_reduced(const fsdp::model_options& mo, float (*expect)(std::int64_t)) {
  using T = typename P::precision::compute_type;
  run_ranks(4, [&](local_communicator& c) {
    fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, mo);
    for (int mb = 0; mb < 2; ++mb) {
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries()) {
          auto g = u.grad(e.name);
          for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = T(written(i, c.rank(), mb));
        }
    }
    m.synchronize();
    std::size_t checked = 0;
    for (std::size_t ui = 0; ui < m.size(); ++ui) {
      auto& u = m.unit(ui);
      for (const auto& v : u.shard_views())
        for (std::int64_t i = v.begin; i < v.end; ++i, ++checked)
          REQUIRE(u.grad_shard()[v.shard_offset + (i - v.begin)] == expect(i));
    }
    // every element is checked on one rank of each replica: 554 per replica
    auto& cs = m.backend().compute_stream();
    float t = float(checked);
    c.all_reduce(&t, &t, 1, fsdp::dtype::f32, fsdp::reduce_op::sum, cs);
    CHECK(t == float((185 + 81 + 9 + 3 + 272 + 4) * m.mesh().replicas));
  });
}

// Sums over ranks 0..3 of (rank + 1) = 10 and over micro-batches 0..1 of (mb + 1) = 3.
float average(std::int64_t i) { return float(i % 8 + 1) * 30.0f / 4.0f; }
float total(std::int64_t i) { return float(i % 8 + 1) * 30.0f; }
}  // namespace

TEST_CASE("reduced gradients are exact for every precision, division and accumulation mode") {
  auto each_mode = [](fsdp::model_options mo, auto&& fn) {
    for (const mode& md : modes) {
      CAPTURE(md.name);
      mo.accumulation = {.micro_batches = 2, .sync = md.sync, .keep_gathered = md.keep};
      fn(mo);
    }
  };
  SUBCASE("average") {
    each_mode({}, [](const fsdp::model_options& mo) {
      check_reduced<policy<float, float>>(mo, average);
      check_reduced<policy<bfloat16, float>>(mo, average);
      check_reduced<policy<bfloat16, bfloat16>>(mo, average);
      check_reduced<policy<float16, float16>>(mo, average);
      check_reduced<policy<float16, float>>(mo, average);
      check_reduced<policy<bfloat16, bfloat16, fsdp::sharding::no_shard>>(mo, average);
    });
  }
  SUBCASE("sum") {
    fsdp::model_options sum;
    sum.division.how = fsdp::grad_division::mode::sum;
    each_mode(sum, [](const fsdp::model_options& mo) {
      check_reduced<policy<float, float>>(mo, total);
      check_reduced<policy<bfloat16, bfloat16>>(mo, total);
      check_reduced<policy<float16, float16, fsdp::sharding::no_shard>>(mo, total);
    });
  }
  SUBCASE("divided before (by 2, picked) and after (by 4 / 2) the reduction; or by 4 and 1") {
    fsdp::model_options pp;
    pp.division.how = fsdp::grad_division::mode::pre_post;
    each_mode(pp, [](const fsdp::model_options& mo) {
      check_reduced<policy<float, float>>(mo, average);
      check_reduced<policy<float16, float16>>(mo, average);
      check_reduced<policy<bfloat16, float>>(mo, average);
    });
    pp.division.pre_factor = 4.0f;
    each_mode(pp, [](const fsdp::model_options& mo) {
      check_reduced<policy<float16, float16, fsdp::sharding::no_shard>>(mo, average);
    });
  }
}

namespace {
/// What rank r writes at element i of a parameter in micro-batch mb for the quantized reductions: sixteenths from
/// -29/16 to 29/16 (exact in bf16, and their sums over micro-batches exact in fp32), mixed across ranks so that
/// blocks differ in scale from rank to rank, and with more bits than fp8 keeps.
float written_q(std::int64_t i, int rank, int mb) { return float((i * 37 + rank * 11 + mb * 5) % 59 - 29) / 16.0f; }

/// The quantized reduction written out for unit `u`'s flat gradient, element by element: each rank's gradient as
/// the reduction reads it (one micro-batch's, or under no-sync their fp32 sum), pre-divided, through Q blocks of B
/// (scaled_reference), each value times the average's factor, summed over the ranks in order in fp32, and added
/// into the shard times the post-division factor; once per reduction. `ranks`: the reducing group's ranks in its
/// order (each writes written_q of its own rank).
template <class Q>
std::vector<float> quantized_reference(const fsdp::FlatLayout& l, const std::vector<int>& ranks, int micro_batches,
                                       bool no_sync, const fsdp::detail::exec::reduce_facts& f, int B) {
  const int world = static_cast<int>(ranks.size());
  const float top = top_of<Q>();
  const std::size_t P = std::size_t(l.padded_numel());
  auto flat = [&](int rank, int mb) {
    std::vector<float> g(P, 0.0f);
    for (const auto& e : l.entries())
      for (std::int64_t i = 0; i < e.numel; ++i) g[std::size_t(e.offset + i)] = written_q(i, rank, mb);
    return g;
  };
  const float premul = f.op == fsdp::reduce_op::avg && world > 1 ? float(1.0 / world) : 1.0f;
  std::vector<float> shard(P, 0.0f);
  auto reduce = [&](const std::vector<std::vector<float>>& per_rank) {
    std::vector<float> acc(P, 0.0f);
    for (int r = 0; r < world; ++r) {
      std::vector<float> g = per_rank[std::size_t(r)];
      if (f.prescale != 1.0f)
        for (float& x : g) x *= f.prescale;
      const std::vector<float> d = scaled_reference<Q, float>(g, B, top);
      for (std::size_t i = 0; i < P; ++i) acc[i] += premul == 1.0f ? d[i] : d[i] * premul;
    }
    for (std::size_t i = 0; i < P; ++i) shard[i] += f.postscale == 1.0f ? acc[i] : acc[i] * f.postscale;
  };
  std::vector<std::vector<float>> per_rank(std::size_t(world), std::vector<float>(P, 0.0f));
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (int r = 0; r < world; ++r) {
      const std::vector<float> g = flat(ranks[std::size_t(r)], mb);
      for (std::size_t i = 0; i < P; ++i)
        per_rank[std::size_t(r)][i] = no_sync ? per_rank[std::size_t(r)][i] + g[i] : g[i];
    }
    if (!no_sync || mb + 1 == micro_batches) reduce(per_rank);
  }
  return shard;
}

/// Two micro-batches of written_q gradients on `world` ranks under policy P (blocks of B), then every element of
/// every gradient shard, padding included, against quantized_reference, bit for bit.
template <class P, class Q>
void check_quantized(int world, fsdp::model_options mo, int B) {
  std::atomic<std::size_t> inexact{0};
  const fsdp::detail::exec::reduce_facts f = fsdp::detail::exec::division_facts(mo.division, world);
  const bool no_sync = mo.accumulation.sync == fsdp::grad_sync::last_micro_batch;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, mo);
    for (int mb = 0; mb < mo.accumulation.micro_batches; ++mb) {
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries()) {
          auto g = u.grad(e.name);
          for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = bfloat16(written_q(i, c.rank(), mb));
        }
    }
    m.synchronize();
    std::size_t checked = 0;
    for (std::size_t ui = 0; ui < m.size(); ++ui) {
      const fsdp::FlatLayout l = m.unit(ui).layout();
      std::vector<int> ranks(static_cast<std::size_t>(world));
      std::iota(ranks.begin(), ranks.end(), 0);
      const std::vector<float> want = quantized_reference<Q>(l, ranks, mo.accumulation.micro_batches, no_sync, f, B);
      const std::int64_t S = l.shard_numel();
      const float* got = m.unit(ui).grad_shard();
      for (std::int64_t k = 0; k < S; ++k, ++checked) {
        const float w = want[std::size_t(c.rank() * S + k)];
        CAPTURE(ui);
        CAPTURE(k);
        REQUIRE(bits_of(got[k]) == bits_of(w));
      }
      // the quantization shows: not every element is the exact reduction of what the ranks wrote
      for (std::int64_t k = 0; k < S; ++k) {
        const std::int64_t flat = c.rank() * S + k;
        float exact = 0.0f;
        for (const auto& e : l.entries())
          if (flat >= e.offset && flat < e.offset + e.numel)
            for (int r = 0; r < world; ++r)
              for (int mb = 0; mb < mo.accumulation.micro_batches; ++mb) exact += written_q(flat - e.offset, r, mb);
        const float scale = mo.division.how == fsdp::grad_division::mode::sum ? 1.0f : float(world);
        inexact += std::fabs(got[k] * scale - exact) > 1e-6f;
      }
    }
    std::int64_t shard_total = 0;
    for (std::size_t u = 0; u < m.size(); ++u) shard_total += m.unit(u).layout().shard_numel();
    CHECK(checked == std::size_t(shard_total));
  });
  CHECK(inexact > 0);
}
}  // namespace

TEST_CASE("gradients reduced in int8 or fp8 blocks (all_to_all, dequantized, summed in fp32): the same bits as the "
          "reference at every world size, strategy, accumulation mode and division") {
  using I8 = fsdp::precision::scaled<std::int8_t, 16, bfloat16, std::int8_t>;
  using F8 = fsdp::precision::scaled<fsdp::float8_e4m3, 32, bfloat16, fsdp::float8_e4m3>;
  auto all_modes = [](int world, fsdp::model_options mo) {
    for (const mode& md : modes) {
      CAPTURE(md.name);
      mo.accumulation = {.micro_batches = 2, .sync = md.sync, .keep_gathered = md.keep};
      mo.layout.align = 16;
      check_quantized<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, I8>, std::int8_t>(world, mo, 16);
      check_quantized<fsdp::policy<fsdp::sharding::zero1, fsdp::prefetch::next, I8>, std::int8_t>(world, mo, 16);
      mo.layout.align = 32;
      check_quantized<fsdp::policy<fsdp::sharding::shard_grad_op, fsdp::prefetch::next, F8>, fsdp::float8_e4m3>(world,
                                                                                                             mo, 32);
    }
  };
  for (int world : {1, 3, 4, 7}) {
    CAPTURE(world);
    all_modes(world, {});
  }
  fsdp::model_options sum;
  sum.division.how = fsdp::grad_division::mode::sum;
  sum.check_collectives = true;  // the ranks compare each all_to_all (its count: one slice) before issuing it
  all_modes(3, sum);
  fsdp::model_options pp;
  pp.division.how = fsdp::grad_division::mode::pre_post;
  all_modes(4, pp);  // divided by 2 in the quantization's input, by 4 / 2 after the sum
}

TEST_CASE(
    "experts in int8 or fp8 blocks: a rank's experts gathered as its own blocks dequantized, their gradients "
    "reduced in blocks over the ranks holding the same experts and divided by every data-parallel rank: the "
    "same bits as the references") {
  // The mixture of tests/support/moe.hpp (a dense unit, and a unit of 4 stacked experts) at expert_parallel = E:
  // the expert unit is gathered and reduced over its expert shard group (the ranks holding the same experts), its
  // average over that group then divided by E (detail/exec/reduction.hpp, expert_facts); the dense unit over every
  // rank. A division by the wrong count, a block laid over the wrong ranks' elements, or a gradient reduced over the
  // wrong group changes bits here (AdamW's updates would hide a scale: this checks the reduced gradients themselves).
  using I8 = fsdp::precision::scaled<std::int8_t, 16, bfloat16, std::int8_t>;
  using F8 = fsdp::precision::scaled<fsdp::float8_e4m3, 32, bfloat16, fsdp::float8_e4m3>;
  auto check = [](auto policy_tag, auto q_tag, int B, int world, int expert, fsdp::model_options mo) {
    using P = decltype(policy_tag);
    using Q = decltype(q_tag);
    CAPTURE(P::sharding::name);
    CAPTURE(B);
    CAPTURE(world);
    CAPTURE(expert);
    mo.expert_parallel = expert;
    mo.layout.align = B;
    std::atomic<std::int64_t> expert_elements{0}, inexact_views{0};
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<P> m(c, fsdp_test::moe::spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{0.5f, 7}, mo);
      const auto mine = fsdp::weights::gather_full_params(m);  // the dense parameters and this rank's experts
      for (auto& u : m.forward()) {
        const view_counts n = check_scaled_views<Q>(u, mine, B);
        inexact_views += std::int64_t(n.checked - n.exact);
      }
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries()) {
          auto g = u.grad(e.name);
          for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = bfloat16(written_q(i, c.rank(), 0));
        }
      m.synchronize();
      const fsdp::device_mesh& mesh = m.mesh();
      const int me = c.rank();
      for (std::size_t ui = 0; ui < m.size(); ++ui) {
        const fsdp::FlatLayout l = m.unit(ui).layout();
        const bool experts = l.experts();
        CAPTURE(l.entries().front().name);
        // the unit's reducing group in its order: the ranks of this replica (holding the same experts)
        auto place_in_group = [&](int q) { return experts ? mesh.expert_shard_rank(q) : mesh.shard_rank(q); };
        std::vector<int> group;
        for (int q = 0; q < world; ++q)
          if (mesh.replica(q) == mesh.replica(me) && (!experts || mesh.expert_rank(q) == mesh.expert_rank(me)))
            group.push_back(q);
        std::sort(group.begin(), group.end(), [&](int a, int b) { return place_in_group(a) < place_in_group(b); });
        CHECK(group.size() == std::size_t(experts ? world / expert : world));
        // Divided by every data-parallel rank in all: the dense units' division over the world; an expert unit's
        // average over its group (1 / (world / E) before the sum), then 1 / E after it.
        fsdp::detail::exec::reduce_facts f = fsdp::detail::exec::division_facts(mo.division, world);
        if (experts && f.op == fsdp::reduce_op::avg) f.postscale = 1.0f / float(expert);
        const std::vector<float> want = quantized_reference<Q>(l, group, 1, false, f, B);
        const std::int64_t S = l.shard_numel(), at = place_in_group(me) * S;
        const float* got = m.unit(ui).grad_shard();
        for (std::int64_t k = 0; k < S; ++k) {
          CAPTURE(k);
          REQUIRE(bits_of(got[k]) == bits_of(want[std::size_t(at + k)]));
        }
        if (experts) expert_elements += S;
      }
    });
    CHECK(expert_elements > 0);
    CHECK(inexact_views > 0);  // 8 bits are not bf16: the quantization shows
  };
  using fsdp::sharding::full_shard;
  using fsdp::sharding::shard_grad_op;
  using next = fsdp::prefetch::next;
  for (auto [world, expert] : {std::pair{4, 2}, std::pair{6, 2}, std::pair{4, 4}}) {
    check(fsdp::policy<full_shard, next, I8>{}, std::int8_t{}, 16, world, expert, {});
    check(fsdp::policy<shard_grad_op, next, F8>{}, fsdp::float8_e4m3{}, 32, world, expert, {});
  }
  fsdp::model_options sum;  // no division: the expert group's sum as it is
  sum.division.how = fsdp::grad_division::mode::sum;
  check(fsdp::policy<full_shard, next, I8>{}, std::int8_t{}, 16, 4, 2, sum);
  fsdp::model_options pp;  // divided before the quantization and after the sum
  pp.division.how = fsdp::grad_division::mode::pre_post;
  check(fsdp::policy<full_shard, next, I8>{}, std::int8_t{}, 16, 4, 2, pp);
}

TEST_CASE("a quantized reduction's error: within half a step of each rank's block scale, summed over the ranks") {
  // int8 (blocks of 16) and fp8 E4M3 (blocks of 32) against the exact average of what the ranks wrote, at 7 ranks:
  // per rank and element the quantization errs by at most half a step: int8, its block's absmax / 254; E4M3, 2^-4
  // of the value (3 mantissa bits, to nearest) or half its smallest subnormal step, 2^-10 of the scale; then each
  // error is divided by the ranks like the value, and the fp32 sum adds a rounding per addition.
  auto check = [](auto q_tag) {
    using Q = decltype(q_tag);
    using P =
        fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::scaled<Q, 16, bfloat16, Q>>;
    constexpr bool int8 = std::is_same_v<Q, std::int8_t>;
    const int world = 7;
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<P> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries()) {
          auto g = u.grad(e.name);
          for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = bfloat16(written_q(i, c.rank(), 0));
        }
      m.synchronize();
      double worst = 0.0;  // the largest error as a fraction of its bound
      for (std::size_t ui = 0; ui < m.size(); ++ui) {
        const fsdp::FlatLayout l = m.unit(ui).layout();
        const std::int64_t S = l.shard_numel();
        std::vector<std::vector<float>> flat(world, std::vector<float>(std::size_t(l.padded_numel()), 0.0f));
        for (int r = 0; r < world; ++r)
          for (const auto& e : l.entries())
            for (std::int64_t i = 0; i < e.numel; ++i)
              flat[std::size_t(r)][std::size_t(e.offset + i)] = written_q(i, r, 0);
        for (std::int64_t k = 0; k < S; ++k) {
          const std::int64_t i = c.rank() * S + k, b0 = i / 16 * 16;
          double exact = 0.0, bound = 0.0, magnitude = 0.0;
          for (int r = 0; r < world; ++r) {
            const std::vector<float>& g = flat[std::size_t(r)];
            float absmax = 0.0f;
            for (std::int64_t j = b0; j < b0 + 16; ++j) absmax = std::max(absmax, std::fabs(g[std::size_t(j)]));
            const double x = g[std::size_t(i)];
            exact += x / world;
            magnitude += std::fabs(x) / world;
            bound += (int8 ? absmax / 254.0 : std::max(std::fabs(x) / 16.0, absmax / 448.0 / 1024.0)) / world;
          }
          bound += (magnitude + bound) * world * 0x1p-24;  // the fp32 sum's roundings
          const double err = std::fabs(double(m.unit(ui).grad_shard()[k]) - exact);
          CAPTURE(i);
          REQUIRE(err <= bound);
          if (bound > 0) worst = std::max(worst, err / bound);
        }
      }
      if (c.rank() == 0)
        MESSAGE(std::string(int8 ? "int8" : "fp8 e4m3"), ", rank 0: the largest error is ", worst, " of its bound");
      CHECK(worst > 0.0);  // the quantization shows; the bound is not met by an exact reduction alone
    });
  };
  check(std::int8_t{});
  check(fsdp::float8_e4m3{});
}

TEST_CASE("a quantized reduction moves one all_to_all per reduction: each rank's slices of values and scales, a "
          "quarter of fp32's bytes plus the scales, and no reduce-scatter") {
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
                         fsdp::precision::scaled<std::int8_t, 16, bfloat16, std::int8_t>>;
  for (const mode& md : modes)
    for (int world : {1, 4}) {
      CAPTURE(md.name);
      CAPTURE(world);
      fsdp::model_options mo;
      mo.accumulation = {.micro_batches = 3, .sync = md.sync, .keep_gathered = md.keep};
      run_ranks(world, [&](local_communicator& c) {
        std::vector<std::int64_t> padded;
        const fsdp::collective_stats s = one_step<P>(c, mo, padded);
        const std::uint64_t n = padded.size(), k = 3;
        std::uint64_t sum_p = 0;
        for (auto p : padded) sum_p += std::uint64_t(p);
        const std::uint64_t reductions = md.sync == fsdp::grad_sync::every_micro_batch ? n * k : n;
        const auto a2a = std::size_t(collective::all_to_all);
        CHECK(s.count[a2a] == reductions);
        CHECK(s.bytes[a2a] == reductions / n * (sum_p + sum_p / 16 * 4));  // values, then a scale per 16
        CHECK(s.count[std::size_t(collective::reduce_scatter)] == 0);
        CHECK(s.count[std::size_t(collective::all_reduce)] == 1);  // the step's commit (model_options::commit_step)
      });
    }
}

TEST_CASE("a quantized reduction is refused where it cannot be what it says: replicated parameters, replicas across "
          "groups, a shard that splits a block") {
  using Q = fsdp::precision::scaled<std::int8_t, 16, bfloat16, std::int8_t>;
  run_ranks(4, [](local_communicator& c) {
    CHECK(error_of<fsdp::usage_error>([&] {
            fsdp::Model<fsdp::policy<fsdp::sharding::no_shard, fsdp::prefetch::next, Q>> m(c, five_units(),
                                                                                          fsdp::wrap::by_prefix{"h."});
          }) == "fsdp: the precision reduces gradients quantized to i8 in blocks of 16 (all_to_all, then a sum in "
                "fp32), which reduces into shards; sharding strategy no_shard keeps whole replicas: reduce in a plain "
                "dtype (float or fsdp::bfloat16) or shard");
    CHECK(error_of<fsdp::usage_error>([&] {
            fsdp::Model<fsdp::policy<fsdp::sharding::hybrid_shard<2>, fsdp::prefetch::next, Q>> m(
                c, five_units(), fsdp::wrap::by_prefix{"h."});
          }) == "fsdp: the precision reduces gradients quantized to i8 in blocks of 16 (all_to_all, then a sum in "
                "fp32), within one shard group; sharding strategy hybrid_shard also all-reduces across 2 replicas, "
                "which a quantized reduction does not do: reduce in a plain dtype, or shard over the world");
    fsdp::model_options mo;
    mo.layout.align = 8;
    CHECK(error_of<fsdp::usage_error>([&] {
            fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
                                     fsdp::precision::scaled<fsdp::float8_e4m3, 16, float, fsdp::float8_e4m3>>>
                m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, mo);
          }) == "fsdp: the precision gathers in blocks of 16 elements with a scale each, and a block must not cross a "
                "shard: shards are multiples of model_options::layout.align, which is 8; set it to a multiple of 16");
  });
}

TEST_CASE("the pre-division factor: picked as PyTorch FSDP picks it, or given; never <= 0") {
  const fsdp::grad_division pp{fsdp::grad_division::mode::pre_post};
  const std::pair<int, float> picked[] = {{1, 1.0f}, {2, 2.0f}, {3, 2.0f}, {4, 2.0f}, {6, 4.0f}, {8, 4.0f}, {64, 8.0f}};
  // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
  for (const auto& entry : picked) {
    const int ranks = entry.first;
    const float f = entry.second;
    CAPTURE(ranks);
    const auto r = fsdp::detail::exec::division_facts(pp, ranks);
    CHECK(r.op == fsdp::reduce_op::sum);
    CHECK(r.prescale == 1.0f / f);
    CHECK(r.postscale == f / float(ranks));
  }
  CHECK(fsdp::detail::exec::division_facts({fsdp::grad_division::mode::average}, 8).op == fsdp::reduce_op::avg);
  CHECK(error_of<fsdp::usage_error>([] {
          fsdp::detail::exec::division_facts({fsdp::grad_division::mode::pre_post, -1.0f}, 4);
        }) == "fsdp: model_options::division.pre_factor must be > 0 (or 0 to pick it), got -1");
}

TEST_CASE("no-sync accumulation: the step needs every micro-batch, and a micro-batch too many is refused") {
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<policy<bfloat16, float>> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, mo);
    fsdp::optim::adamw opt(m, {});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    CHECK(m.unit(0).state() == fsdp::unit_state::sharded);
    CHECK(error_of<fsdp::usage_error>([&] { opt.step(); }) ==
          "fsdp: optimizer step before gradients are reduced: unit 'root' (index 0) has no gradient reduced since the "
          "last step (gradient accumulation: 1 of 2 micro-batches done; gradients are reduced in the last); run "
          "model.backward() to the end first");
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    for (auto& u : m.forward()) (void)u;  // a forward is harmless; the third backward is not
    CHECK(error_of<fsdp::usage_error>([&] {
            for (auto& u : m.backward()) (void)u;
          }) == "fsdp: model.backward() would begin micro-batch 3 of 2 (model_options::accumulation: gradients are "
                "reduced in the last micro-batch); run the optimizer step first");
    CHECK(opt.step().get().skipped == false);  // the window is complete
    CHECK(opt.steps() == 1);
  });
  mo.accumulation.micro_batches = 0;
  run_ranks(1, [&](local_communicator& c) {
    CHECK(error_of<fsdp::usage_error>([&] {
            fsdp::Model<policy<float, float>>(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, mo);
          }) == "fsdp: model_options::accumulation.micro_batches must be >= 1, got 0");
  });
}

TEST_CASE("kept gathered: each unit is gathered once per step and released in the last micro-batch's backward") {
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .keep_gathered = true};
  run_ranks(3, [&](local_communicator& c) {
    fsdp::Model<policy<bfloat16, float>> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, mo);
    fsdp::optim::sgd opt(m, {.lr = 0.1f});
    for (int step = 0; step < 2; ++step) {
      for (int mb = 0; mb < 2; ++mb) {
        for (auto& u : m.forward()) (void)u;
        for (std::size_t i = 0; i < m.size(); ++i) CHECK(m.unit(i).state() == fsdp::unit_state::gathered);
        for (auto& u : m.backward()) (void)u;
        for (std::size_t i = 0; i < m.size(); ++i)
          CHECK(m.unit(i).state() == (mb == 0 ? fsdp::unit_state::gathered : fsdp::unit_state::sharded));
      }
      opt.step();
    }
    // too few gather slots to keep every unit is found at construction, by the planner
    fsdp::model_options few = mo;
    few.gather_slots = 3;
    CHECK(
        error_of<fsdp::usage_error>([&] {
          fsdp::Model<policy<bfloat16, float>>(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, few);
        }) ==
        "fsdp: model_options::gather_slots = 3 is too few for this policy: gather slots exhausted: unit 'h.2' "
        "(index 3) must be gathered for its forward but all 3 slots are held by 'root', 'h.0', 'h.1'; raise "
        "model_options::gather_slots or let those units reshard after forward (model_options::reshard_after_forward)");
  });
}

TEST_CASE("no_shard in bf16: units are cast copies, gathered for use and released after backward") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<policy<bfloat16, float, fsdp::sharding::no_shard>> m(c, five_units(), fsdp::wrap::by_prefix{"h."});
    CHECK(m.unit(1).state() == fsdp::unit_state::sharded);  // not the fp32 master: a bf16 copy made on demand
    CHECK(fsdp::model_access::schedule_config(m).gathers);
    for (auto& u : m.forward()) (void)u;
    CHECK(m.unit(1).state() == fsdp::unit_state::gathered);  // no_shard keeps it to its backward
    for (auto& u : m.backward()) (void)u;
    CHECK(m.unit(1).state() == fsdp::unit_state::sharded);
    CHECK(c.stats()[collective::all_gather] == 1);  // the ranks' agreement at construction; no gather of a unit
    fsdp::Model<policy<float, float, fsdp::sharding::no_shard>> f(c, five_units(), fsdp::wrap::by_prefix{"h."});
    CHECK(f.unit(1).state() == fsdp::unit_state::gathered);  // fp32: the master itself
    CHECK(!fsdp::model_access::schedule_config(f).gathers);
  });
}

TEST_CASE("zero_grad in the middle of a no-sync window discards the micro-batches so far and starts it again") {
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  mo.division.how = fsdp::grad_division::mode::sum;
  run_ranks(3, [&](local_communicator& c) {
    fsdp::Model<policy<bfloat16, float>> m(c, five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, mo);
    auto micro_batch = [&](float value) {
      for (auto& u : m.forward()) (void)u;
      for (auto& u : m.backward())
        for (const auto& e : u.layout().entries())
          for (auto& x : u.grad(e.name)) x = bfloat16(value * float(c.rank() + 1));
    };
    micro_batch(100.0f);  // kept in the accumulators, then discarded
    m.synchronize();
    const std::int64_t window = m.memory().current[fsdp::mem::comm_buffers];  // the accumulators and the grad slots
    m.zero_grad();
    m.synchronize();
    std::int64_t accumulators = 0, grad_slot = 0;
    for (std::size_t ui = 0; ui < m.size(); ++ui) {
      accumulators += fsdp::model_access::costs(m, ui).accumulator.bytes();
      grad_slot = std::max(grad_slot, fsdp::model_access::costs(m, ui).grad.bytes());
    }
    // the accumulators are gone, the two gradient slots stay (each at most the largest unit's gradient)
    const std::int64_t slots = m.memory().current[fsdp::mem::comm_buffers];
    CHECK(slots == window - accumulators);
    CHECK(slots > 0);
    CHECK(slots <= 2 * grad_slot);
    micro_batch(1.0f);
    micro_batch(2.0f);  // the last of the new window: reduced
    m.synchronize();
    for (std::size_t ui = 0; ui < m.size(); ++ui)
      for (const auto& v : m.unit(ui).shard_views())
        for (std::int64_t i = 0; i < v.local_numel(); ++i)
          REQUIRE(m.unit(ui).grad_shard()[v.shard_offset + i] == 3.0f * (1 + 2 + 3));  // (1 + 2) summed over ranks
  });
}
