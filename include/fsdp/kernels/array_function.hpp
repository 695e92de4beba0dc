#pragma once
// The form of an element function that lets a kernel move 128 bits at a time: an update over K fp32 arrays of one
// length (an optimizer's parameter, gradient and states), written once and run by every backend.
//
//   F::array_count     K
//   f.arrays()         the arrays (fp32_arrays<K>): a null one is neither read nor written (its value reads as 0),
//                      and `writes` says which are written back
//   f.update(x, i)     steps element i's values x[0..K) in place (i: the element's index, for per-range facts
//                      such as a no-decay mask)
//   f(i)               apply_at(f, i): so an ArrayFunction is an ElementFunction too
//
// Backend::for_each of the host backend and every host loop call f(i), element by element. The CUDA backend's
// for_each loads four elements of each array as one 128-bit access when every array is 16-byte aligned, calls
// update() on each of the four in turn and stores the written arrays the same way; the remainder, and any
// unaligned piece, goes through f(i). Each element sees the same operations in the same order either way, so
// both backends give the same bits.
#include <concepts>
#include <cstdint>

#include "fsdp/core/config.hpp"

namespace fsdp::kernels {

/// The K arrays of an ArrayFunction; bit k of `writes`: array k is written back.
template <int K>
struct fp32_arrays {
  float* at[K];
  unsigned writes;
};

template <class F>
concept ArrayFunction = requires(const F& f, float* x, std::int64_t i) {
  requires F::array_count >= 1 && F::array_count <= 8;
  { f.arrays() } -> std::same_as<fp32_arrays<F::array_count>>;
  f.update(x, i);
};

/// Element i of an ArrayFunction: its values read, updated and the written ones stored.
template <class F>
FSDP_HD inline void apply_at(const F& f, std::int64_t i) {
  constexpr int K = F::array_count;
  const fp32_arrays<K> a = f.arrays();
  float x[K];
  for (int k = 0; k < K; ++k) x[k] = a.at[k] ? a.at[k][i] : 0.0f;
  f.update(x, i);
  for (int k = 0; k < K; ++k)
    if (a.at[k] && ((a.writes >> k) & 1u)) a.at[k][i] = x[k];
}

}  // namespace fsdp::kernels
