#pragma once
// Initialisation rules. Every value is a pure function of (seed, parameter name, global element index), so the
// parameters a rank materialises for its shard are the same numbers whatever the world size, the wrapping
// policy or the layout: only the local shard is ever computed.
#include <cmath>
#include <cstdint>
#include <string_view>
#include <variant>

#include "fsdp/core/config.hpp"
#include "fsdp/core/hash.hpp"

namespace fsdp::init {

/// Normal(mean, std) per element.
struct normal {
  float std = 0.02f;
  std::uint64_t seed = 0;
  float mean = 0.0f;
};
/// Uniform[lo, hi) per element.
struct uniform {
  float lo = -1.0f;
  float hi = 1.0f;
  std::uint64_t seed = 0;
};
/// Every element the same value (zeros for biases, ones for norm gains).
struct constant {
  float value = 0.0f;
};
inline constexpr constant zeros{0.0f};
inline constexpr constant ones{1.0f};

using rule = std::variant<normal, uniform, constant>;

namespace detail {
/// FNV-1a over the parameter name: ties the stream of values to the name, not to a position in the spec.
constexpr std::uint64_t name_hash(std::string_view s) noexcept { return fnv1a64(s); }
/// splitmix64 finaliser: a counter-based generator, so element i needs no state from element i-1.
constexpr std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// Uniform double in [0, 1) from the top 53 bits.
constexpr double unit(std::uint64_t bits) noexcept { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

inline std::uint64_t key(std::uint64_t seed, std::string_view name, std::uint64_t index) noexcept {
  return mix(seed ^ mix(name_hash(name))) + 2 * index;
}
}  // namespace detail

/// The value of element `index` (row-major over the parameter's global shape) of parameter `name`.
inline float value(const normal& r, std::string_view name, std::uint64_t index) noexcept {
  const std::uint64_t k = detail::key(r.seed, name, index);
  const double u1 = 1.0 - detail::unit(detail::mix(k));  // (0, 1]: log is finite
  const double u2 = detail::unit(detail::mix(k + 1));
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  return static_cast<float>(r.mean + r.std * z);
}
inline float value(const uniform& r, std::string_view name, std::uint64_t index) noexcept {
  const double u = detail::unit(detail::mix(detail::key(r.seed, name, index)));
  return static_cast<float>(r.lo + (r.hi - r.lo) * u);
}
inline float value(const constant& r, std::string_view, std::uint64_t) noexcept { return r.value; }
inline float value(const rule& r, std::string_view name, std::uint64_t index) noexcept {
  return std::visit([&](const auto& x) { return value(x, name, index); }, r);
}

/// Fills out[0, count) with the values of elements [first, first + count) of parameter `name`.
inline void fill(const rule& r, std::string_view name, std::uint64_t first, std::size_t count, float* out);

inline void fill(const rule& r, std::string_view name, std::uint64_t first, std::size_t count, float* out) {
  std::visit(
      [&](const auto& x) {
        for (std::size_t i = 0; i < count; ++i) out[i] = value(x, name, first + i);
      },
      r);
}

}  // namespace fsdp::init
