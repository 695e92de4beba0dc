#pragma once
// Element types the library moves and computes in. `dtype` is the runtime tag (stored in specs, layouts
// and collectives); `dtype_of<T>` maps a C++ element type to it.
#include <cstddef>
#include <cstdint>
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

template <class T>
struct dtype_of;  // no dtype for this C++ type: use float (or the bf16/f16 types of the CUDA backend)
template <>
struct dtype_of<float> {
  static constexpr dtype value = dtype::f32;
};
template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>::value;

}  // namespace fsdp
