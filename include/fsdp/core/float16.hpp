#pragma once
// bf16 and fp16 as 16-bit storage, converted to and from fp32 by bit manipulation: round to nearest even,
// subnormals kept, every NaN turned into the canonical quiet NaN 0x7fff. The same functions run on the host and
// inside CUDA kernels (FSDP_HD), so a cast gives the same bits on both backends whatever the GPU's conversion
// instructions do with NaN payloads. fsdp::bfloat16 and fsdp::float16 are the element types a trainer names. The
// 8-bit formats' conversions are core/float8.hpp's; their element types, fsdp::float8_e4m3 and fsdp::float8_e5m2,
// are the same template below (basic_float). Signed 8-bit integers (dtype::i8, element type std::int8_t) convert
// here too: int8_from_float rounds to nearest even and saturates to -128..127; a NaN becomes 0 (an integer has no
// NaN: a block-scaled gather keeps it in the block's scale instead, kernels/quantize.hpp).
//
// The bit moves are __builtin_bit_cast, not std::bit_cast: std::bit_cast is a constexpr __host__ function, which
// plain nvcc (without --expt-relaxed-constexpr) only warns about calling from device code (#20013-D) and then
// compiles the kernel into stores of zeros. The builtin is what std::bit_cast calls; g++, clang and nvcc's device
// compiler all have it, so these headers are correct under plain `nvcc -std=c++20` (tests/cuda/plain_nvcc_test.cu).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/float8.hpp"

/// The storage and conversions of every narrow dtype (bf16, fp16, and through core/float8.hpp fp8 and int8):
/// storage_t<D>, to_float<D>, from_float<D>.
namespace fsdp::lowp {

FSDP_HD constexpr std::uint32_t bits(float f) noexcept { return __builtin_bit_cast(std::uint32_t, f); }
FSDP_HD constexpr float from_bits(std::uint32_t u) noexcept { return __builtin_bit_cast(float, u); }

/// fp32 -> bf16, round to nearest even.
FSDP_HD constexpr std::uint16_t bf16_from_float(float f) noexcept {
  const std::uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
FSDP_HD constexpr float bf16_to_float(std::uint16_t h) noexcept { return from_bits(std::uint32_t{h} << 16); }

/// fp32 -> IEEE binary16, round to nearest even, with subnormals; overflow gives infinity.
FSDP_HD constexpr std::uint16_t half_from_float(float f) noexcept {
  const std::uint32_t u = bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;                              // NaN
  if (a >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 2^16 (and inf): infinity
  if (a >= 0x38800000u) {                                           // normal half: |f| >= 2^-14
    const std::uint32_t mant = a & 0x7fffffu;
    std::uint32_t h = ((((a >> 23) - 112u) << 10) | (mant >> 13));
    const std::uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;         // a carry may reach infinity: correct
    return static_cast<std::uint16_t>(sign | h);
  }
  const std::uint32_t e = a >> 23;                                  // subnormal half, or zero
  if (e < 102u) return static_cast<std::uint16_t>(sign);            // below 2^-25: rounds to zero
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - e;                             // 14 .. 24
  std::uint32_t h = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;           // may carry into the smallest normal: correct
  return static_cast<std::uint16_t>(sign | h);
}
FSDP_HD constexpr float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return from_bits(sign | 0x7f800000u | (m << 13));  // inf, NaN (payload kept)
  if (e != 0u) return from_bits(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0u) return from_bits(sign);
  std::uint32_t exp = 113u;  // subnormal: normalise
  while ((m & 0x400u) == 0u) {
    m <<= 1;
    --exp;
  }
  return from_bits(sign | (exp << 23) | ((m & 0x3ffu) << 13));
}

/// An int8's bits (two's complement) as float: exact.
FSDP_HD constexpr float int8_to_float(std::uint8_t b) noexcept {
  return static_cast<float>(static_cast<int>(b) - (b >= 0x80u ? 256 : 0));
}
/// x rounded to the nearest integer, ties to even, saturated to -128..127, as int8 bits; NaN gives 0. Each step is
/// exact (|x| < 2^23 once clamped), so host and device give the same bits.
FSDP_HD constexpr std::uint8_t int8_from_float(float x) noexcept {
  if (!(x == x)) return 0;  // NaN
  if (x >= 127.0f) return 127;
  if (x <= -128.0f) return 0x80u;
  int t = static_cast<int>(x);  // toward zero, exact
  const float f = x - static_cast<float>(t);  // the fraction, exact: -1 < f < 1
  if (f > 0.5f || (f == 0.5f && (t & 1) != 0)) ++t;
  else if (f < -0.5f || (f == -0.5f && (t & 1) != 0)) --t;
  return static_cast<std::uint8_t>(t & 0xff);
}

namespace detail {
template <std::size_t Bytes>
struct bits_of_width;
template <>
struct bits_of_width<1> {
  using type = std::uint8_t;
};
template <>
struct bits_of_width<2> {
  using type = std::uint16_t;
};
template <class>
inline constexpr bool no_conversion = false;
}  // namespace detail

/// Storage type of a dtype's elements: float for f32, else unsigned bits of the row's width (core/dtype.hpp).
template <dtype D>
struct storage_of {
  using type = typename detail::bits_of_width<size_of(D)>::type;
};
template <>
struct storage_of<dtype::f32> {
  using type = float;
};
template <dtype D>
using storage_t = typename storage_of<D>::type;

/// A dtype's conversions to and from float (one branch per dtype; a dtype without one does not compile).
template <dtype D>
FSDP_HD constexpr float to_float(storage_t<D> x) noexcept {
  if constexpr (D == dtype::f32) return x;
  else if constexpr (D == dtype::bf16) return bf16_to_float(x);
  else if constexpr (D == dtype::f16) return half_to_float(x);
  else if constexpr (D == dtype::f8e4m3) return f8::to_float<f8::e4m3>(x);
  else if constexpr (D == dtype::f8e5m2) return f8::to_float<f8::e5m2>(x);
  else if constexpr (D == dtype::i8) return int8_to_float(x);
  else static_assert(detail::no_conversion<storage_t<D>>, "fsdp: a dtype without a conversion to float (float16.hpp)");
}
template <dtype D>
FSDP_HD constexpr storage_t<D> from_float(float x) noexcept {
  if constexpr (D == dtype::f32) return x;
  else if constexpr (D == dtype::bf16) return bf16_from_float(x);
  else if constexpr (D == dtype::f16) return half_from_float(x);
  else if constexpr (D == dtype::f8e4m3) return f8::from_float<f8::e4m3>(x);
  else if constexpr (D == dtype::f8e5m2) return f8::from_float<f8::e5m2>(x);
  else if constexpr (D == dtype::i8) return int8_from_float(x);
  else
    static_assert(detail::no_conversion<storage_t<D>>, "fsdp: a dtype without a conversion from float (float16.hpp)");
}

}  // namespace fsdp::lowp

namespace fsdp {

/// A narrow floating-point value as a trainer's own code sees it (unit.param<fsdp::bfloat16>(...), a precision
/// policy's compute type): the dtype's storage bits (16 or 8), converted with the functions above. `float(x)` widens
/// exactly; `T(f)` rounds to nearest even (the 8-bit formats saturate: core/float8.hpp). Layout-compatible with
/// CUDA's __nv_bfloat16 / __half / __nv_fp8_e4m3 / __nv_fp8_e5m2 (the same width, the same bits).
template <dtype D>
struct basic_float {
  static_assert(D != dtype::f32 && D != dtype::i8,
                "fsdp::basic_float: a narrow float dtype (fp32 is float itself, int8 is std::int8_t)");
  using storage = lowp::storage_t<D>;
  storage bits = 0;
  basic_float() = default;
  FSDP_HD constexpr explicit basic_float(float f) noexcept : bits(lowp::from_float<D>(f)) {}
  FSDP_HD constexpr explicit operator float() const noexcept { return lowp::to_float<D>(bits); }
  FSDP_HD static constexpr basic_float from_bits(storage b) noexcept {
    basic_float x;
    x.bits = b;
    return x;
  }
  friend constexpr bool operator==(basic_float, basic_float) = default;  ///< bit equality
};

using bfloat16 = basic_float<dtype::bf16>;       ///< bfloat16: 8 exponent bits, 7 mantissa bits
using float16 = basic_float<dtype::f16>;         ///< IEEE binary16: 5 exponent bits, 10 mantissa bits
using float8_e4m3 = basic_float<dtype::f8e4m3>;  ///< OCP E4M3: 4 exponent bits, 3 mantissa bits, no infinity
using float8_e5m2 = basic_float<dtype::f8e5m2>;  ///< OCP E5M2: 5 exponent bits, 2 mantissa bits

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2 && sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1 &&
              std::is_trivially_copyable_v<bfloat16> && std::is_trivially_copyable_v<float8_e4m3>);

template <dtype D>
struct dtype_of<basic_float<D>> {
  static constexpr dtype value = D;
};

}  // namespace fsdp
