#pragma once
// Element types the library moves and computes in. `dtype` is the runtime tag (stored in specs, layouts and
// collectives); `dtype_of<T>` maps a C++ element type to it.
//
// Everything the library knows of a dtype is one row of dtype_rows: its name, its width, and its codes in NCCL and
// the safetensors format (MPI moves it as unsigned integers of its width). The storage type (lowp::storage_t), every
// switch over dtypes (kernels::dispatch) and those codes come from the row. Adding a dtype is a row here, an
// enumerator, and its conversions to and from float in core/float16.hpp, which refuse to compile for a dtype that
// has none (a one-byte type gets one-byte storage, never two). tests/kernels/elementwise_test.cc walks every row.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>

namespace fsdp {

enum class dtype : std::uint8_t { f32, bf16, f16, f8e4m3, f8e5m2, i8 };

/// One dtype's facts.
struct dtype_row {
  dtype tag;
  std::string_view name;         ///< in messages, fingerprints and traces: "bf16"
  std::size_t bytes;             ///< storage width
  std::string_view safetensors;  ///< the safetensors format's name: "BF16"
  int nccl;                      ///< ncclDataType_t's value (nccl.h: ncclFloat16 6, ncclFloat32 7, ncclBfloat16 9,
                                 ///< ncclFloat8e4m3 10, ncclFloat8e5m2 11, ncclInt8 0)
  bool scaled;                   ///< its range needs a scale beside the values (fp8: 448 or 57344 at most; int8:
                                 ///< the integers -128 to 127), so a precision policy cannot name it as a plain
                                 ///< compute, gather or reduce type
};

inline constexpr dtype_row dtype_rows[] = {
    {dtype::f32, "f32", 4, "F32", 7, false},
    {dtype::bf16, "bf16", 2, "BF16", 9, false},
    {dtype::f16, "f16", 2, "F16", 6, false},
    {dtype::f8e4m3, "f8e4m3", 1, "F8_E4M3", 10, true},  // OCP E4M3 (core/float8.hpp)
    {dtype::f8e5m2, "f8e5m2", 1, "F8_E5M2", 11, true},  // OCP E5M2
    {dtype::i8, "i8", 1, "I8", 0, true},                // signed 8-bit integers (core/float16.hpp: int8_from_float)
};
inline constexpr std::size_t dtype_count = std::size(dtype_rows);

/// Whether `t` is one of the dtypes (a value read from a file or cast from an integer may not be).
constexpr bool is_dtype(dtype t) noexcept { return static_cast<std::size_t>(t) < dtype_count; }
/// The row of `t`, a dtype (the rows are in the order of the enumerators; no pointer is compared, so this stays a
/// constant expression under -fsanitize=undefined too).
constexpr const dtype_row& row_of(dtype t) noexcept { return dtype_rows[static_cast<std::size_t>(t)]; }
constexpr std::size_t size_of(dtype t) noexcept { return is_dtype(t) ? row_of(t).bytes : 0; }
constexpr std::string_view name_of(dtype t) noexcept { return is_dtype(t) ? row_of(t).name : std::string_view("?"); }
/// Whether `t`'s values need a scale beside them (dtype_row::scaled).
constexpr bool is_scaled(dtype t) noexcept { return is_dtype(t) && row_of(t).scaled; }
/// The dtype the safetensors format calls `name` ("BF16"), if the library has it.
constexpr std::optional<dtype> dtype_of_safetensors(std::string_view name) noexcept {
  for (const dtype_row& r : dtype_rows)
    if (r.safetensors == name) return r.tag;
  return std::nullopt;
}

static_assert([] {
  for (std::size_t i = 0; i < dtype_count; ++i)
    if (static_cast<std::size_t>(dtype_rows[i].tag) != i) return false;
  return true;
}(), "fsdp: dtype_rows must list the dtypes in the order of their enumerators");

/// The dtype of a C++ element type: float, std::int8_t, fsdp::bfloat16, fsdp::float16, fsdp::float8_e4m3 and
/// fsdp::float8_e5m2 (core/float16.hpp), and CUDA's __nv_bfloat16, __half, __nv_fp8_e4m3 and __nv_fp8_e5m2 under nvcc
/// (cuda/types.cuh). No specialisation: the type is not an element type.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr dtype value = dtype::f32;
};
template <>
struct dtype_of<std::int8_t> {
  static constexpr dtype value = dtype::i8;
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
