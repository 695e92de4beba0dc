#pragma once
// Element types the library moves and computes in. `dtype` is the runtime tag (stored in specs, layouts
// and collectives); `dtype_of<T>` maps a C++ element type to it.
#include <cstddef>
#include <cstdint>
#include <concepts>
#include <string_view>

namespace fsdp {

enum class dtype : std::uint8_t { f32, bf16, f16 };

constexpr std::size_t size_of(dtype t) noexcept { return t == dtype::f32 ? 4 : 2; }

constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
  }
  return "?";
}

/// The dtype of a C++ element type: float, fsdp::bfloat16 and fsdp::float16 (core/float16.hpp), and CUDA's
/// __nv_bfloat16 and __half under nvcc (cuda/types.cuh). No specialisation: the type is not an element type.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr dtype value = dtype::f32;
};
template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>::value;

/// A C++ type the library can store and move: one with a dtype.
template <class T>
concept ElementType = requires { { dtype_of<T>::value } -> std::convertible_to<dtype>; };

/// T is an element type with the dtype of element type U (false, not an error, for any other T).
template <class T, class U>
constexpr bool same_dtype() noexcept {
  if constexpr (ElementType<T> && ElementType<U>) return dtype_of_v<T> == dtype_of_v<U>;
  else return false;
}

}  // namespace fsdp
