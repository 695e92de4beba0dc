#pragma once
// Element functions that a GPU runs wider than one element per thread, with the same bits as the host's loop of
// f(i) (Backend::for_each):
//
//   QuadFunction    f(i) for one element, and f.quad(q) for the four elements 4q .. 4q + 3 at once (one 32-bit load
//                   of four 8-bit values, 128-bit loads and stores of four fp32), when f.quads() says its pointers
//                   and sizes allow it; the same element code either way (kernels/quantize.hpp's dequantizations)
//   BlockFunction   f(b) for one block of f.block elements (a block quantization: the block's largest magnitude,
//                   then its scale, then every element); on a GPU the lanes of a warp share a block, each taking
//                   elements lane, lane + lanes, ... (so neighbouring lanes read and write neighbouring elements),
//                   their extents merged across lanes (block_extent: a maximum and an or, so the order of merging
//                   does not matter), then each lane emits its own elements
//
// fsdp/cuda/kernels.cuh's for_each launches the wider kernels; the host backend calls f(i) or f(b) in loops.
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "fsdp/core/config.hpp"
#include "fsdp/kernels/element_function.hpp"

namespace fsdp::kernels {

/// Four elements of T in one aligned access.
template <class T>
struct alignas(4 * sizeof(T)) quad_of {
  T v[4];
};

/// Whether `p` is aligned to `bytes`.
FSDP_HD inline bool aligned_to(const void* p, std::uintptr_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

template <class F>
concept QuadFunction = ElementFunction<F> && requires(const F& f, std::int64_t q) {
  { f.quads() } -> std::convertible_to<bool>;
  f.quad(q);
};

/// A block's largest magnitude, its NaN elements aside, and whether it holds a NaN.
struct block_extent {
  float max = 0.0f;
  bool nan = false;
  FSDP_HD block_extent merge(block_extent o) const noexcept { return {o.max > max ? o.max : max, nan || o.nan}; }
};

/// f(b) for block b on the host; on a GPU, for block b: p = f.place(b) once (where its elements and its scale are),
/// f.extent_of(p, k) of each element k < f.block merged, f.scale_of(extent), f.write_scale(p, scale) once,
/// f.emit(p, k, scale) for each element.
template <class F>
concept BlockFunction = ElementFunction<F> && requires(const F& f, std::int64_t b, int k, block_extent e, float s) {
  { f.block } -> std::convertible_to<std::int64_t>;
  f.place(b);
  { f.extent_of(f.place(b), k) } -> std::same_as<block_extent>;
  { f.scale_of(e) } -> std::same_as<float>;
  f.write_scale(f.place(b), s);
  f.emit(f.place(b), k, s);
};

}  // namespace fsdp::kernels
