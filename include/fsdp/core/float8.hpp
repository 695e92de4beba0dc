#pragma once
// The OCP 8-bit floating-point formats (OCP 8-bit Floating Point Specification, OFP8, rev. 1.0), converted to and
// from fp32 by bit manipulation, the same functions on the host and inside CUDA kernels (FSDP_HD), as for bf16 and
// fp16 (core/float16.hpp):
//
//   format  exponent, mantissa bits  bias  largest finite  smallest subnormal  infinity  NaN
//   E4M3    4, 3                     7     448 (0x7e)      2^-9                none      S.1111.111 (0x7f, 0xff)
//   E5M2    5, 2                     15    57344 (0x7b)    2^-16               S.11111.00 S.11111.{01,10,11}
//
// fp32 -> fp8 rounds to nearest even, subnormals kept. Overflow saturates: a finite value beyond the largest finite
// one (after rounding) becomes the largest finite value of its sign, the OCP specification's saturating mode,
// which scaled formats need (a block's absmax maps to the top of the range). Non-finite values stay non-finite, so
// an overflowed gradient is still seen as one: an infinity becomes E5M2's infinity of its sign, and E4M3's NaN (it
// has no infinity); every NaN becomes the canonical 0x7f. This differs from CUDA's __NV_SATFINITE conversion,
// which also maps infinities to the largest finite value, and from the non-saturating conversion of the
// `ml_dtypes` package, which turns overflow into infinity (E5M2) or NaN (E4M3); every other input gives the same
// bits (tests/kernels/float8_interop_test.sh holds every fp32 input to ml_dtypes, with that rule).
//
// fp8 -> fp32 is exact; a NaN becomes fp32's quiet NaN of its sign.
#include <cstdint>

#include "fsdp/core/config.hpp"

namespace fsdp::f8 {

FSDP_HD constexpr std::uint32_t bits(float f) noexcept { return __builtin_bit_cast(std::uint32_t, f); }
FSDP_HD constexpr float from_bits(std::uint32_t u) noexcept { return __builtin_bit_cast(float, u); }

/// A format's facts: exponent and mantissa widths, bias, its largest finite magnitude's bits and what an infinity
/// becomes.
template <int E, int M, int Bias, std::uint8_t MaxBits, bool HasInf>
struct format {
  static constexpr int exponent_bits = E;
  static constexpr int mantissa_bits = M;
  static constexpr int bias = Bias;
  static constexpr std::uint8_t max_bits = MaxBits;  ///< the largest finite magnitude
  static constexpr bool has_inf = HasInf;
  static constexpr std::uint8_t nan_bits = 0x7f;     ///< the canonical NaN
  static constexpr std::uint8_t inf_bits = static_cast<std::uint8_t>(((1u << E) - 1u) << M);  ///< E5M2: 0x7c
};
using e4m3 = format<4, 3, 7, 0x7e, false>;
using e5m2 = format<5, 2, 15, 0x7b, true>;

/// fp32 -> the format, round to nearest even, saturating (see the top of the file).
template <class F>
FSDP_HD constexpr std::uint8_t from_float(float f) noexcept {
  constexpr int M = F::mantissa_bits;
  const std::uint32_t u = bits(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return F::nan_bits;                                  // NaN
  if (a == 0x7f800000u) return F::has_inf ? static_cast<std::uint8_t>(sign | F::inf_bits) : F::nan_bits;
  const int e = static_cast<int>(a >> 23);                                  // fp32's biased exponent
  if (e == 0) return static_cast<std::uint8_t>(sign);                       // below 2^-126: zero in any fp8
  const int te = e - 127 + F::bias;                                         // the format's biased exponent
  const std::uint32_t mant = a & 0x7fffffu;
  std::uint32_t h;
  if (te >= 1) {  // a normal of the format, unless it overflows
    const std::uint32_t rem = mant & ((1u << (23 - M)) - 1u), halfway = 1u << (22 - M);
    h = (static_cast<std::uint32_t>(te) << M) | (mant >> (23 - M));
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;                 // a carry moves into the exponent
  } else {        // a subnormal of the format, or zero
    const int shift = (1 - te) + (23 - M);
    if (shift > 24) return static_cast<std::uint8_t>(sign);                // below half the smallest subnormal
    const std::uint32_t m = mant | 0x800000u;
    const std::uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    h = m >> shift;
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;                 // may reach the smallest normal
  }
  if (h > F::max_bits) h = F::max_bits;                                     // saturate
  return static_cast<std::uint8_t>(sign | h);
}

/// The format -> fp32, exact.
template <class F>
FSDP_HD constexpr float to_float(std::uint8_t b) noexcept {
  constexpr int M = F::mantissa_bits;
  const std::uint32_t sign = std::uint32_t{b & 0x80u} << 24;
  const std::uint32_t mag = b & 0x7fu;
  const std::uint32_t e = mag >> M, m = mag & ((1u << M) - 1u);
  if (F::has_inf ? e == (1u << F::exponent_bits) - 1u : mag == 0x7fu) {
    if (F::has_inf && m == 0u) return from_bits(sign | 0x7f800000u);       // infinity
    return from_bits(sign | 0x7fc00000u);                                   // NaN
  }
  if (e != 0u) return from_bits(sign | ((e + 127u - static_cast<std::uint32_t>(F::bias)) << 23) | (m << (23 - M)));
  // subnormal (or zero): m x 2^(1 - bias - M), exact in fp32
  const float scale = from_bits(static_cast<std::uint32_t>(127 + 1 - F::bias - M) << 23);
  const float v = static_cast<float>(m) * scale;
  return sign ? -v : v;
}

}  // namespace fsdp::f8
