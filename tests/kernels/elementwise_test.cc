// The shared per-element logic (fsdp/core/float16.hpp, fsdp/kernels/elementwise.hpp, fsdp/optim/detail/*): the
// CUDA kernels run exactly this code, so checking it here against independent references checks both backends'
// arithmetic; tests/cuda/kernels_test.cu then checks that the GPU gives the same bits as the host backend.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.hpp>
#include <fsdp/kernels/elementwise.hpp>
#include <fsdp/kernels/quantize.hpp>
#include <fsdp/optim/detail/pieces.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "tests/support/support.hpp"

namespace {

using fsdp::lowp::bf16_from_float;
using fsdp::lowp::bf16_to_float;
using fsdp::lowp::half_from_float;
using fsdp::lowp::half_to_float;

// Reference: the value of a binary16 pattern computed with ldexp (independent of the bit manipulation).
double half_value(std::uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  return sign * std::ldexp(1024 + m, e - 25);
}

// Reference rounding: the nearest of the finite candidates (ties to the even pattern), by exhaustive distance over
// the two neighbours found by a search in double.
std::uint16_t half_reference(float f) {
  if (std::isnan(f)) return 0x7fff;
  const double x = f;
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;  // halfway between 65504 and 2^16 ties to even = infinity
  std::uint16_t lo = 0;                    // largest pattern with value <= a
  for (int step = 1 << 14; step > 0; step >>= 1)
    if (lo + step <= 0x7bff && half_value(static_cast<std::uint16_t>(lo + step)) <= a)
      lo = static_cast<std::uint16_t>(lo + step);
  if (half_value(lo) == a) return sign | lo;
  const std::uint16_t hi = lo + 1;
  const double dlo = a - half_value(lo), dhi = half_value(hi) - a;
  const std::uint16_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
  return sign | pick;
}

std::uint16_t bf16_reference(float f) {
  if (std::isnan(f)) return 0x7fff;
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // the neighbours (hi may be infinity)
  if (std::isinf(f) || u == lo) return static_cast<std::uint16_t>(u >> 16);
  // Distances in double are exact here; past the largest finite bf16 the upper neighbour is infinity, which
  // round-to-nearest reaches from halfway to 2^128 (the next power of two the format would hold).
  const double x = std::fabs(double(f)), below = std::fabs(double(std::bit_cast<float>(lo)));
  const double above =
      std::isinf(std::bit_cast<float>(hi)) ? std::ldexp(1.0, 128) : std::fabs(double(std::bit_cast<float>(hi)));
  const double dlo = x - below, dhi = above - x;
  const std::uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (((lo >> 16) & 1u) ? hi : lo);
  return static_cast<std::uint16_t>(pick >> 16);
}

std::vector<float> special_floats() {
  std::vector<float> v{0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, -70000.0f,
                       std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -26),
                       std::ldexp(1.0f, -26), std::ldexp(1023.0f, -24), std::ldexp(2047.0f, -25),
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                       std::numeric_limits<float>::min(), 1.00390625f, 1.01171875f, 3.3895314e38f};
  for (std::uint32_t lowbits : {0x8000u, 0x7fffu, 0x8001u, 0x18000u})  // bf16 ties and near-ties
    v.push_back(std::bit_cast<float>(0x3f800000u | lowbits));
  for (std::uint32_t lowbits : {0x1000u, 0x0fffu, 0x1001u, 0x3000u})  // fp16 ties and near-ties
    v.push_back(std::bit_cast<float>(0x3f800000u | lowbits));
  return v;
}

}  // namespace

TEST_CASE("bf16 and fp16 from fp32: round to nearest even, subnormals, overflow and NaN") {
  CHECK(bf16_from_float(1.0f) == 0x3f80);
  CHECK(half_from_float(1.0f) == 0x3c00);
  CHECK(half_from_float(65504.0f) == 0x7bff);
  CHECK(half_from_float(65520.0f) == 0x7c00);
  CHECK(half_from_float(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(half_from_float(std::ldexp(1.0f, -25)) == 0x0000);   // tie to even: zero
  CHECK(half_from_float(std::ldexp(3.0f, -26)) == 0x0001);   // 0.75 ulp rounds up
  CHECK(half_from_float(std::ldexp(1.0f, -14)) == 0x0400);
  CHECK(half_from_float(-0.0f) == 0x8000);
  CHECK(bf16_from_float(std::numeric_limits<float>::quiet_NaN()) == 0x7fff);
  CHECK(half_from_float(-std::numeric_limits<float>::quiet_NaN()) == 0x7fff);

  for (float f : special_floats()) {
    CAPTURE(f);
    CHECK(half_from_float(f) == half_reference(f));
    CHECK(bf16_from_float(f) == bf16_reference(f));
  }
  std::mt19937 gen(7);
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(gen()));
    if (std::isnan(f)) continue;
    // Also draw from the fp16 range, where the rounding is interesting.
    const float g = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen),
                               std::uniform_int_distribution<int>(-26, 17)(gen));
    for (float x : {f, g}) {
      if (half_from_float(x) != half_reference(x) || bf16_from_float(x) != bf16_reference(x)) {
        FAIL_CHECK("mismatch for ", x, " (bits ", std::bit_cast<std::uint32_t>(x), ")");
        return;
      }
    }
  }
}

TEST_CASE("bf16 and fp16 to fp32 are exact: every pattern round-trips") {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float fh = half_to_float(b), fb = bf16_to_float(b);
    const bool nan_h = ((b >> 10) & 0x1f) == 0x1f && (b & 0x3ff);
    const bool nan_b = ((b >> 7) & 0xff) == 0xff && (b & 0x7f);
    if (nan_h) {
      CHECK(std::isnan(fh));
      CHECK(half_from_float(fh) == 0x7fff);
    } else {
      if (half_from_float(fh) != b || double(fh) != half_value(b)) FAIL_CHECK("fp16 pattern ", h);
    }
    if (nan_b) {
      CHECK(std::isnan(fb));
    } else if (bf16_from_float(fb) != b) {
      FAIL_CHECK("bf16 pattern ", h);
    }
  }
}

TEST_CASE("host backend convert and accumulate: casts, scaling, sizes 0 and 1") {
  fsdp::backend::host be;
  auto& s = be.compute_stream();
  const std::vector<float> src{1.0f, -2.5f, 65520.0f, std::ldexp(3.0f, -26), 1.00390625f};
  std::vector<std::uint16_t> h(src.size()), b(src.size());
  be.convert(h.data(), fsdp::dtype::f16, src.data(), fsdp::dtype::f32, std::int64_t(src.size()), 1.0f, s);
  be.convert(b.data(), fsdp::dtype::bf16, src.data(), fsdp::dtype::f32, std::int64_t(src.size()), 1.0f, s);
  for (std::size_t i = 0; i < src.size(); ++i) {
    CHECK(h[i] == half_from_float(src[i]));
    CHECK(b[i] == bf16_from_float(src[i]));
  }
  // Reduce-scatter preparation: scaled by 1/4 before the cast.
  std::vector<std::uint16_t> scaled(src.size());
  be.convert(scaled.data(), fsdp::dtype::bf16, src.data(), fsdp::dtype::f32, std::int64_t(src.size()), 0.25f, s);
  for (std::size_t i = 0; i < src.size(); ++i) CHECK(scaled[i] == bf16_from_float(src[i] * 0.25f));
  // Accumulate from bf16 into fp32.
  std::vector<float> acc{1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  be.accumulate(acc.data(), b.data(), fsdp::dtype::bf16, std::int64_t(b.size()), 1.0f, s);
  for (std::size_t i = 0; i < acc.size(); ++i) CHECK(acc[i] == 1.0f + bf16_to_float(b[i]));
  // f32 -> f32 with scale 1 is a bit copy, NaN payload included.
  const float payload = std::bit_cast<float>(0x7fc01234u);
  float out = 0;
  be.convert(&out, fsdp::dtype::f32, &payload, fsdp::dtype::f32, 1, 1.0f, s);
  CHECK(std::bit_cast<std::uint32_t>(out) == 0x7fc01234u);
  // A scale quiets a NaN and keeps its sign and payload (not multiplied: a GPU's multiply would return its canonical
  // NaN 0x7fffffff, the host's the input quieted), so both backends give the same bits, however the library was
  // optimised: -NaN as it is, and a signalling NaN quieted (clang -O2 multiplies it, which quiets it the same way).
  for (const auto& nan : {std::pair{0x7fc01234u, 0x7fc01234u}, std::pair{0xffc00000u, 0xffc00000u},
                          std::pair{0x7f801234u, 0x7fc01234u}}) {
    const float in = std::bit_cast<float>(nan.first);
    be.convert(&out, fsdp::dtype::f32, &in, fsdp::dtype::f32, 1, 0.25f, s);
    CHECK(std::bit_cast<std::uint32_t>(out) == nan.second);
  }
  // Empty: nothing is touched (null pointers are fine).
  be.convert(nullptr, fsdp::dtype::f16, nullptr, fsdp::dtype::f32, 0, 1.0f, s);
  be.accumulate(nullptr, nullptr, fsdp::dtype::f16, 0, 1.0f, s);
  float norm = -1;
  const std::vector<float> x{3.0f, 4.0f};
  be.squared_norm(x.data(), 2, &norm, s);
  CHECK(norm == 25.0f);
  be.squared_norm(x.data(), 0, &norm, s);
  CHECK(norm == 0.0f);
}

TEST_CASE("accumulate with a scale: dst + float(x) * scale, one rounding each; scale 1 adds x itself") {
  using fsdp::kernels::accumulate_one;
  float d = 1.0f;
  accumulate_one<fsdp::dtype::f32>(d, 0.1f, 1.0f);
  CHECK(d == 1.0f + 0.1f);
  d = 1.0f;
  accumulate_one<fsdp::dtype::bf16>(d, bf16_from_float(3.0f), 0.375f);
  CHECK(d == 1.0f + 3.0f * 0.375f);
  d = 0.5f;
  accumulate_one<fsdp::dtype::f16>(d, half_from_float(-2.5f), 1.0f / 3.0f);
  CHECK(d == 0.5f + (-2.5f * (1.0f / 3.0f)));
  // the host backend's accumulate applies it to every element
  fsdp::backend::host be;
  std::vector<float> acc = {1, 2, 3};
  const std::vector<float> x = {4, 8, 16};
  be.accumulate(acc.data(), x.data(), fsdp::dtype::f32, 3, 0.25f, be.compute_stream());
  CHECK(acc == std::vector<float>{2, 4, 7});
}

TEST_CASE("the reduction rule in fp32 is the plain rank-order sum; an average pre-multiplies by float(1/world)") {
  using fsdp::kernels::reduce_add;
  const float xs[] = {0.1f, 0.7f, -0.3f, 1e-3f, 5.0f};
  float acc = 0.0f, plain = 0.0f, avg = 0.0f, plain_avg = 0.0f;
  const float third = fsdp::kernels::average_factor<fsdp::dtype::f32>(5);
  CHECK(third == static_cast<float>(1.0 / 5));
  for (float x : xs) {
    acc = reduce_add<fsdp::dtype::f32>(acc, x, 1.0f);
    plain += x;
    avg = reduce_add<fsdp::dtype::f32>(avg, x, third);
    plain_avg += x * third;
  }
  CHECK(acc == plain);
  CHECK(avg == plain_avg);
  CHECK(fsdp::kernels::average_factor<fsdp::dtype::bf16>(3) == 0.333984375f);  // 1/3 in bf16: NCCL's scalar
}

TEST_CASE("decay masks and shard pieces: no-decay ranges get no weight decay, pieces cover the shard") {
  struct view {
    std::int64_t shard_offset, n;
    struct { bool no_decay; } flags;
    bool empty() const { return n == 0; }
    std::int64_t local_numel() const { return n; }
  };
  // 40 parameters of 3 elements, alternating decay / no decay, then padding to 130.
  std::vector<view> views;
  for (int k = 0; k < 40; ++k) views.push_back({3 * k, 3, {k % 2 == 1}});
  views.push_back({120, 0, {true}});  // empty on this rank: ignored
  const auto pieces = fsdp::optim::detail::masked_pieces(views, 130);
  REQUIRE(pieces.size() == 2);  // 20 no-decay ranges: 16 in the first piece, 4 in the second
  CHECK(pieces[0].offset == 0);
  CHECK(pieces[0].mask.count == 16);
  CHECK(pieces[1].offset == pieces[0].numel);
  CHECK(pieces[1].mask.count == 4);
  CHECK(pieces[0].numel + pieces[1].numel == 130);
  for (std::int64_t i = 0; i < 130; ++i) {
    const auto& p = i < pieces[1].offset ? pieces[0] : pieces[1];
    const bool want = i < 120 && (i / 3) % 2 == 1;
    CAPTURE(i);
    CHECK(p.mask.no_decay(i - p.offset) == want);
  }
  CHECK(fsdp::optim::detail::masked_pieces(views, 0).empty());
  const auto one = fsdp::optim::detail::masked_pieces(std::vector<view>{{0, 5, {false}}}, 5);
  REQUIRE(one.size() == 1);
  CHECK(one[0].numel == 5);
  CHECK(one[0].mask.count == 0);

  // The host backend's for_each of SGD's element function applies the mask per element.
  fsdp::backend::host be;
  std::vector<float> p{1, 1, 1, 1}, g{0, 0, 0, 0};
  fsdp::optim::detail::decay_mask m;
  m.count = 1;
  m.begin[0] = 1;
  m.end[0] = 3;
  be.for_each(4, fsdp::optim::detail::sgd_elements{p.data(), g.data(), {nullptr}, {0.5f, 0.0f, 0.1f}, m},
              be.compute_stream());
  CHECK(p == std::vector<float>{0.95f, 1.0f, 1.0f, 0.95f});
}

TEST_CASE("fp8 from fp32: round to nearest even, subnormals, saturation, and non-finite values kept non-finite") {
  using fsdp::f8::e4m3;
  using fsdp::f8::e5m2;
  auto e4 = [](float f) { return fsdp::f8::from_float<e4m3>(f); };
  auto e5 = [](float f) { return fsdp::f8::from_float<e5m2>(f); };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(e4(1.0f) == 0x38);
  CHECK(e5(1.0f) == 0x3c);
  CHECK(e4(448.0f) == 0x7e);                  // the largest finite E4M3
  CHECK(e4(464.0f) == 0x7e);                  // halfway to the NaN pattern: ties to the even 0x7e
  CHECK(e4(480.0f) == 0x7e);                  // beyond: saturates (ml_dtypes gives NaN)
  CHECK(e4(-1e30f) == 0xfe);
  CHECK(e4(inf) == 0x7f);                     // E4M3 has no infinity: NaN, never a finite value
  CHECK(e4(-inf) == 0x7f);
  CHECK(e4(nan) == 0x7f);
  CHECK(e4(std::ldexp(1.0f, -9)) == 0x01);    // the smallest subnormal
  CHECK(e4(std::ldexp(1.0f, -10)) == 0x00);   // half of it: ties to even, zero
  CHECK(e4(std::ldexp(3.0f, -11)) == 0x01);   // 0.75 of it rounds up
  CHECK(e4(std::ldexp(15.0f, -10)) == 0x08);  // 7.5 subnormal steps: ties to 8, the smallest normal
  CHECK(e4(-0.0f) == 0x80);
  CHECK(e5(57344.0f) == 0x7b);                // the largest finite E5M2
  CHECK(e5(61440.0f) == 0x7b);                // halfway to infinity: saturates (ml_dtypes gives infinity)
  CHECK(e5(inf) == 0x7c);
  CHECK(e5(-inf) == 0xfc);
  CHECK(e5(-nan) == 0x7f);
  CHECK(e5(std::ldexp(1.0f, -16)) == 0x01);
  CHECK(e5(std::ldexp(1.0f, -17)) == 0x00);
  CHECK(e5(std::numeric_limits<float>::denorm_min()) == 0x00);
  CHECK(e5(1.125f) == 0x3c);                  // 1 + 1/8 is halfway between 1 and 1.25: ties to even 1
  CHECK(e5(1.375f) == 0x3e);                  // halfway between 1.25 and 1.5: ties to even 1.5
  // the element types name the same conversions
  CHECK(fsdp::float8_e4m3(448.0f).bits == 0x7e);
  CHECK(float(fsdp::float8_e5m2::from_bits(0x7b)) == 57344.0f);
  static_assert(fsdp::dtype_of_v<fsdp::float8_e4m3> == fsdp::dtype::f8e4m3);
  static_assert(fsdp::f8::from_float<e4m3>(0.5f) == 0x30);  // constexpr, as the 16-bit conversions
}

TEST_CASE("fp8 to fp32 is exact: every pattern's value by ldexp, and every non-NaN pattern round-trips") {
  auto value = [](std::uint8_t b, int mbits, int bias) {  // the OFP8 formula, independent of the bit moves
    const int e = (b & 0x7f) >> mbits, m = b & ((1 << mbits) - 1);
    const double v = e == 0 ? std::ldexp(m, 1 - bias - mbits) : std::ldexp((1 << mbits) + m, e - bias - mbits);
    return (b & 0x80) ? -v : v;
  };
  int nan4 = 0, nan5 = 0, inf5 = 0;
  for (int i = 0; i < 256; ++i) {
    const auto b = static_cast<std::uint8_t>(i);
    CAPTURE(i);
    const float f4 = fsdp::f8::to_float<fsdp::f8::e4m3>(b), f5 = fsdp::f8::to_float<fsdp::f8::e5m2>(b);
    if ((b & 0x7f) == 0x7f) {
      CHECK(std::isnan(f4));
      ++nan4;
    } else {
      CHECK(double(f4) == value(b, 3, 7));
      CHECK(fsdp::f8::from_float<fsdp::f8::e4m3>(f4) == b);
    }
    if (((b >> 2) & 0x1f) == 0x1f) {
      if (b & 3) {
        CHECK(std::isnan(f5));
        ++nan5;
      } else {
        CHECK(std::isinf(f5));
        CHECK(fsdp::f8::from_float<fsdp::f8::e5m2>(f5) == b);
        ++inf5;
      }
    } else {
      CHECK(double(f5) == value(b, 2, 15));
      CHECK(fsdp::f8::from_float<fsdp::f8::e5m2>(f5) == b);
    }
  }
  CHECK(nan4 == 2);  // 0x7f, 0xff
  CHECK(nan5 == 6);
  CHECK(inf5 == 2);
}

TEST_CASE("fp8 is not a plain precision: a policy naming it is refused until its values carry scales") {
  struct fp8_gather {
    using precision_concept = fsdp::precision_tag;
    using compute_type = fsdp::bfloat16;
    using master_type = float;
    using reduce_type = float;
    using gather_type = fsdp::float8_e4m3;
  };
  struct fp8_reduce {
    using precision_concept = fsdp::precision_tag;
    using compute_type = float;
    using master_type = float;
    using reduce_type = fsdp::float8_e5m2;
  };
  static_assert(!fsdp::PrecisionPolicy<fp8_gather> && !fsdp::PrecisionPolicy<fp8_reduce>);
  CHECK(fsdp::is_scaled(fsdp::dtype::f8e4m3));
  CHECK(!fsdp::is_scaled(fsdp::dtype::bf16));
}

TEST_CASE("int8 from float: nearest, ties to even, saturating at -128 and 127, NaN to 0; back to float exactly") {
  using fsdp::lowp::int8_from_float;
  using fsdp::lowp::int8_to_float;
  const auto q = [](float x) { return static_cast<int>(static_cast<std::int8_t>(int8_from_float(x))); };
  CHECK(q(0.5f) == 0);
  CHECK(q(1.5f) == 2);
  CHECK(q(2.5f) == 2);
  CHECK(q(-0.5f) == 0);
  CHECK(q(-1.5f) == -2);
  CHECK(q(-2.5f) == -2);
  CHECK(q(std::nextafter(0.5f, 1.0f)) == 1);
  CHECK(q(126.5f) == 126);
  CHECK(q(127.49f) == 127);
  CHECK(q(127.5f) == 127);
  CHECK(q(-127.5f) == -128);
  CHECK(q(-128.5f) == -128);
  CHECK(q(1e30f) == 127);
  CHECK(q(-1e30f) == -128);
  CHECK(q(std::numeric_limits<float>::infinity()) == 127);
  CHECK(q(-std::numeric_limits<float>::infinity()) == -128);
  CHECK(q(std::numeric_limits<float>::quiet_NaN()) == 0);
  CHECK(q(-0.0f) == 0);
  for (int b = 0; b < 256; ++b)  // every pattern: two's complement, exact in float
    CHECK(int8_to_float(static_cast<std::uint8_t>(b)) == static_cast<float>(static_cast<std::int8_t>(b)));
  // Every float from 0.5 to 2^8 in magnitude (where rounding and saturation happen: 151 million inputs), and every
  // 4099th pattern elsewhere, against the C library's nearest-even rounding, clamped
  const auto reference = [](float x) {
    if (std::isnan(x)) return 0;
    return static_cast<int>(std::clamp(std::nearbyint(x), -128.0f, 127.0f));
  };
  std::uint64_t compared = 0, wrong = 0;
  const auto check = [&](std::uint32_t bits) {
    const float x = fsdp::f8::from_bits(bits);
    wrong += q(x) != reference(x) ? 1 : 0;
    ++compared;
  };
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t b = 0x3f000000u; b < 0x43800000u; ++b) check(sign | b);
  for (std::uint64_t b = 0; b < (1ull << 32); b += 4099) check(static_cast<std::uint32_t>(b));
  CHECK(wrong == 0);
  CHECK(compared > 150'000'000);
}

TEST_CASE("block-scaled 8 bits: a block's scale is its largest magnitude over the format's top; a non-finite weight "
          "is never hidden (fp8 keeps a NaN in place, int8 in the block's scale)") {
  using fsdp::dtype;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // four blocks of 4: plain, with a NaN, with an infinity, all zero
  const std::vector<float> master = {1.0f, -0.5f, 0.25f, 0.0f, 2.0f, nan, -1.0f, 0.5f,
                                     3.0f, inf, 1.0f, 0.0f, 0.0f, -0.0f, 0.0f, 0.0f};
  auto run = [&](auto q) {
    constexpr dtype Q = decltype(q)::value;
    std::vector<std::uint8_t> wire(16 + 4 * 4);
    float* scales = reinterpret_cast<float*>(wire.data() + 16);
    const fsdp::kernels::block_quantize<dtype::f32, Q> quantize{master.data(), wire.data(), 16, 4, 32};
    for (std::int64_t b = 0; b < 4; ++b) quantize(b);
    std::vector<float> out(16);
    const fsdp::kernels::block_dequantize<dtype::f32, Q> dequantize{wire.data(), out.data(), 16, 4, 32};
    for (std::int64_t i = 0; i < 16; ++i) dequantize(i);
    return std::pair{std::vector<float>(scales, scales + 4), out};
  };
  const auto [s8, v8] = run(std::integral_constant<dtype, dtype::f8e4m3>{});
  CHECK(s8[0] == 1.0f / 448.0f);
  CHECK(s8[1] == 2.0f / 448.0f);  // the NaN left out of the scale ...
  CHECK(std::isnan(v8[5]));       // ... and kept in place; the block's other elements within E4M3's half step
  for (int i : {0, 1, 2, 3, 4, 6, 7})
    CHECK(std::fabs(v8[std::size_t(i)] - master[std::size_t(i)]) <= std::fabs(master[std::size_t(i)]) * 0x1.01p-4f);
  CHECK(s8[2] == inf);
  for (int i = 8; i < 12; ++i) CHECK(std::isnan(v8[std::size_t(i)]));  // the infinity's block, all of it
  CHECK(s8[3] == 0.0f);
  for (int i = 12; i < 16; ++i) CHECK(v8[std::size_t(i)] == 0.0f);
  const auto [si, vi] = run(std::integral_constant<dtype, dtype::i8>{});
  CHECK(si[0] == 1.0f / 127.0f);
  for (int i : {0, 1, 2, 3})  // within half a step of the block's scale
    CHECK(std::fabs(vi[std::size_t(i)] - master[std::size_t(i)]) <= si[0] * 0.5001f);
  CHECK(vi[1] == -64.0f * si[0]);  // -0.5 x 127 = -63.5: to even, -64
  CHECK(std::isnan(si[1]));  // int8 has no NaN: the scale carries it, and the whole block is NaN
  for (int i = 4; i < 8; ++i) CHECK(std::isnan(vi[std::size_t(i)]));
  CHECK(si[2] == inf);
  for (int i = 8; i < 12; ++i) CHECK(std::isnan(vi[std::size_t(i)]));
  CHECK(si[3] == 0.0f);
  for (int i = 12; i < 16; ++i) CHECK(vi[std::size_t(i)] == 0.0f);
}

TEST_CASE("a quantized reduction's element functions: the gradient quantized into one slice per destination rank, "
          "then each rank's received slices dequantized and summed in fp32 in rank order") {
  using fsdp::dtype;
  namespace k = fsdp::kernels;
  // two ranks, a padded gradient of 8 elements in blocks of 2: shards of 4, slices of 4 values + 2 scales = 12 bytes
  const std::vector<float> g0 = {1.0f, -2.0f, 0.5f, 0.25f, 3.0f, 0.0f, -1.0f, 1.0f};
  const std::vector<float> g1 = {-1.0f, 1.0f, 0.0f, 0.0f, 2.0f, -0.5f, 4.0f, 2.0f};
  auto quantize = [](const std::vector<float>& g, float pre) {
    std::vector<std::uint8_t> out(2 * 12);
    const k::block_quantize<dtype::f32, dtype::i8> q{g.data(), out.data(), 4, 2, 12, pre};
    for (std::int64_t b = 0; b < 4; ++b) q(b);
    return out;
  };
  auto scale_at = [](const std::vector<std::uint8_t>& v, int slice, int block) {
    float f;
    std::memcpy(&f, v.data() + slice * 12 + 4 + block * 4, 4);
    return f;
  };
  const auto s0 = quantize(g0, 1.0f);
  // slice 0 (rank 0's shard: elements 0..3), slice 1 (rank 1's: 4..7); each slice's values, then its scales
  CHECK(scale_at(s0, 0, 0) == 2.0f / 127.0f);
  CHECK(scale_at(s0, 0, 1) == 0.5f / 127.0f);
  CHECK(scale_at(s0, 1, 0) == 3.0f / 127.0f);
  CHECK(scale_at(s0, 1, 1) == 1.0f / 127.0f);
  CHECK(std::int8_t(s0[1]) == -127);  // -2 at the top of its block
  CHECK(std::int8_t(s0[0]) == 64);    // 1 / (2 / 127) = 63.5: to even
  CHECK(std::int8_t(s0[12 + 0]) == 127);
  CHECK(std::int8_t(s0[12 + 1]) == 0);
  // pre-divided by 4 first: the scales are a quarter, the values the same
  const auto p0 = quantize(g0, 0.25f);
  CHECK(scale_at(p0, 0, 0) == 0.5f / 127.0f);
  CHECK(std::equal(p0.begin(), p0.begin() + 4, s0.begin()));
  // the all_to_all: rank 0 receives slice 0 of each rank, in rank order
  const auto s1 = quantize(g1, 1.0f);
  std::vector<std::uint8_t> received(s0.begin(), s0.begin() + 12);
  received.insert(received.end(), s1.begin(), s1.begin() + 12);
  std::vector<float> shard = {10.0f, 0.0f, 0.0f, 0.0f};  // the sum adds into what the shard holds
  const float half = k::average_factor<dtype::f32>(2);
  const k::block_dequantize_sum<dtype::i8> sum{received.data(), shard.data(), 4, 2, 12, 2, half, 1.0f};
  for (std::int64_t i = 0; i < 4; ++i) sum(i);
  auto deq = [&](const std::vector<std::uint8_t>& s, int i) {
    return float(std::int8_t(s[std::size_t(i)])) * scale_at(s, 0, i / 2);
  };
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    const float want = (i == 0 ? 10.0f : 0.0f) + (0.0f + deq(s0, i) * half + deq(s1, i) * half);
    CHECK(shard[std::size_t(i)] == want);
  }
  CHECK(shard[1] == -0.5f);  // -2 and 1 are their blocks' tops: exact, (-2 + 1) / 2
}

TEST_CASE("dequantization never multiplies a NaN: a NaN value or scale passes bit for bit, 0 x infinity is fp32's "
          "quiet NaN, on every backend") {
  // A GPU's multiply returns its canonical NaN (0x7fffffff), an x86 host's the input NaN quieted, and 0 x infinity
  // gives 0xffc00000 on x86: neither is the other's, so the dequantization writes the non-finite cases out.
  namespace k = fsdp::kernels;
  const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  const float signalling = std::bit_cast<float>(0x7fa00001u), inf = std::numeric_limits<float>::infinity();
  CHECK(bits(k::dequantized(3.0f, signalling)) == 0x7fa00001u);  // unquieted: not multiplied
  CHECK(bits(k::dequantized(signalling, 2.0f)) == 0x7fa00001u);
  CHECK(bits(k::dequantized(0.0f, inf)) == 0x7fc00000u);  // x86's 0 x inf is 0xffc00000
  CHECK(bits(k::dequantized(-0.0f, inf)) == 0x7fc00000u);
  CHECK(bits(k::dequantized(inf, 0.0f)) == 0x7fc00000u);
  CHECK(k::dequantized(-3.0f, inf) == -inf);
  CHECK(k::dequantized(3.0f, 0.5f) == 1.5f);
  // through the element functions: an int8 block whose scale is a NaN (written as a signalling one here)
  std::vector<std::uint8_t> wire(4 + 4, 0);
  wire[0] = 5;
  std::memcpy(wire.data() + 4, &signalling, 4);
  std::vector<float> out(4);
  const k::block_dequantize<fsdp::dtype::f32, fsdp::dtype::i8> deq{wire.data(), out.data(), 4, 4, 8};
  for (std::int64_t i = 0; i < 4; ++i) deq(i);
  for (float x : out) CHECK(bits(x) == 0x7fa00001u);
}

TEST_CASE("the GPU's shapes of the block functions give the host loop's bits: a block shared among 1 to 32 lanes "
          "merged in a butterfly, four dequantized elements at a time") {
  // fsdp/cuda/kernels.cuh runs block_quantize with a warp's lanes per block (each lane's elements lane, lane + L,
  // ..., extents merged by __shfl_xor over L/2, ..., 1) and the dequantizations four elements a thread; here the same
  // protocol on the host, against f(b) and f(i).
  using fsdp::dtype;
  namespace k = fsdp::kernels;
  std::mt19937 gen(9);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (std::int64_t block : {4, 12, 16, 64}) {  // multiples of 4, as precision::gather_block_fits asks
    CAPTURE(block);
    const std::int64_t shard = 2 * block, slice = shard + 2 * 4, n = 2 * shard;  // two slices of two blocks
    std::vector<float> src(static_cast<std::size_t>(n));
    for (auto& x : src) x = std::uniform_real_distribution<float>(-3, 3)(gen);
    src[3] = nan;  // block 0 holds a NaN, block 2 an infinity
    src[static_cast<std::size_t>(2 * block + 1)] = inf;
    std::vector<std::uint8_t> serial(static_cast<std::size_t>(2 * slice), 0);
    const k::block_quantize<dtype::f32, dtype::f8e4m3> q{src.data(), serial.data(), shard, block, slice, 0.5f};
    for (std::int64_t b = 0; b < n / block; ++b) q(b);
    for (int lanes = 1; lanes <= 32 && lanes <= block; lanes *= 2) {
      CAPTURE(lanes);
      std::vector<std::uint8_t> shared(serial.size(), 0);
      const k::block_quantize<dtype::f32, dtype::f8e4m3> f{src.data(), shared.data(), shard, block, slice, 0.5f};
      for (std::int64_t b = 0; b < n / block; ++b) {
        const auto p = f.place(b);
        std::vector<k::block_extent> e(static_cast<std::size_t>(lanes));
        for (int l = 0; l < lanes; ++l)
          for (int i = l; i < block; i += lanes) e[std::size_t(l)] = e[std::size_t(l)].merge(f.extent_of(p, i));
        for (int off = lanes / 2; off > 0; off /= 2) {  // __shfl_xor_sync's butterfly
          const std::vector<k::block_extent> before = e;
          for (int l = 0; l < lanes; ++l)
            e[std::size_t(l)] = before[std::size_t(l)].merge(before[std::size_t(l ^ off)]);
        }
        for (int l = 0; l < lanes; ++l) CHECK(e[std::size_t(l)].max == e[0].max);
        const float scale = f.scale_of(e[0]);
        f.write_scale(p, scale);
        for (int l = lanes - 1; l >= 0; --l)
          for (int i = l; i < block; i += lanes) f.emit(p, i, scale);
      }
      CHECK(shared == serial);
    }
    if (block % 4 != 0) continue;
    // four at a time: dequantize into fp32 and bf16, and the reduction's dequantize-sum
    std::vector<float> one(static_cast<std::size_t>(n)), four(one.size());
    const k::block_dequantize<dtype::f32, dtype::f8e4m3> d1{serial.data(), one.data(), shard, block, slice};
    const k::block_dequantize<dtype::f32, dtype::f8e4m3> d4{serial.data(), four.data(), shard, block, slice};
    REQUIRE(d4.quads());
    for (std::int64_t i = 0; i < n; ++i) d1(i);
    for (std::int64_t qd = 0; qd < n / 4; ++qd) d4.quad(qd);
    CHECK(std::memcmp(one.data(), four.data(), one.size() * 4) == 0);
    std::vector<std::uint16_t> h1(one.size()), h4(one.size());
    const k::block_dequantize<dtype::bf16, dtype::f8e4m3> b1{serial.data(), h1.data(), shard, block, slice};
    const k::block_dequantize<dtype::bf16, dtype::f8e4m3> b4{serial.data(), h4.data(), shard, block, slice};
    for (std::int64_t i = 0; i < n; ++i) b1(i);
    for (std::int64_t qd = 0; qd < n / 4; ++qd) b4.quad(qd);
    CHECK(h1 == h4);
    alignas(16) float g1[64 * 2] = {}, g4[64 * 2] = {};
    const float third = k::average_factor<dtype::f32>(2);
    const k::block_dequantize_sum<dtype::f8e4m3> s1{serial.data(), g1, shard, block, slice, 2, third, 0.5f};
    const k::block_dequantize_sum<dtype::f8e4m3> s4{serial.data(), g4, shard, block, slice, 2, third, 0.5f};
    REQUIRE(s4.quads());
    for (std::int64_t i = 0; i < shard; ++i) s1(i);
    for (std::int64_t qd = 0; qd < shard / 4; ++qd) s4.quad(qd);
    CHECK(std::memcmp(g1, g4, sizeof g1) == 0);
  }
}

TEST_CASE("every row of the dtype table: its width is its storage's, its names and codes are its own, its values "
          "round-trip through float and through the backend") {
  std::set<std::string_view> names, st_names;
  std::set<int> nccl_codes;
  for (const fsdp::dtype_row& row : fsdp::dtype_rows) {
    CAPTURE(row.name);
    CHECK(fsdp::is_dtype(row.tag));
    CHECK(&fsdp::row_of(row.tag) == &row);
    CHECK(fsdp::size_of(row.tag) == row.bytes);
    CHECK(fsdp::name_of(row.tag) == row.name);
    CHECK(fsdp::dtype_of_safetensors(row.safetensors) == row.tag);
    CHECK(names.insert(row.name).second);
    CHECK(st_names.insert(row.safetensors).second);
    CHECK(nccl_codes.insert(row.nccl).second);
    fsdp::kernels::dispatch(row.tag, [&](auto d) {
      using bits = fsdp::lowp::storage_t<d()>;
      CHECK(sizeof(bits) == row.bytes);
      // 1.5, -2 and 0.25 are exact in every floating type the library has, 3, -2, -128 and 0 in int8: through
      // float and back, bit for bit
      const std::array<float, 4> exact = row.tag == fsdp::dtype::i8 ? std::array{3.0f, -2.0f, -128.0f, 0.0f}
                                                                     : std::array{1.5f, -2.0f, 0.25f, 0.0f};
      for (float x : exact) {
        const bits b = fsdp::lowp::from_float<d()>(x);
        CHECK(fsdp::lowp::to_float<d()>(b) == x);
        // and through the host backend's convert, from f32 and back
        fsdp::backend::host be;
        bits out{};
        float back = 0;
        be.convert(&out, row.tag, &x, fsdp::dtype::f32, 1, 1.0f, be.compute_stream());
        be.convert(&back, fsdp::dtype::f32, &out, row.tag, 1, 1.0f, be.compute_stream());
        CHECK(std::memcmp(&out, &b, sizeof(bits)) == 0);
        CHECK(back == x);
      }
    });
  }
  CHECK(fsdp::dtype_count == 6);
  CHECK(!fsdp::dtype_of_safetensors("F64"));
  CHECK(fsdp::name_of(static_cast<fsdp::dtype>(200)) == "?");
  CHECK(!fsdp::is_dtype(static_cast<fsdp::dtype>(200)));
  CHECK(fsdp_test::error_of<fsdp::usage_error>(
            [] { fsdp::kernels::dispatch(static_cast<fsdp::dtype>(200), [](auto) {}); }) == "fsdp: unknown dtype 200");
}
