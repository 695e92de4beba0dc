#pragma once
// The library's kernels as host loops over the per-element code every backend shares (kernels/elementwise.hpp,
// and the element functions of Backend::for_each): backend::host's kernels run these, and so does host-side work
// on any backend (the host gradient shards and the host optimizer step of fsdp/policy/offload.hpp), so a host
// loop and a CUDA kernel give the same bits.
#include <cstdint>
#include <utility>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/kernels/array_function.hpp"
#include "fsdp/kernels/elementwise.hpp"

namespace fsdp::kernels::host_loops {

/// dst[i] = dst_type(float(src[i]) * scale).
inline void convert(void* dst, dtype dst_type, const void* src, dtype src_type, std::int64_t n, float scale);

/// dst[i] += float(src[i]) * scale, with the loop run(n, f) (f(i) for every i: a plain loop, or a pool's).
template <class Run>
void accumulate_with(Run&& run, float* dst, const void* src, dtype src_type, std::int64_t n, float scale) {
  dispatch(src_type, [&](auto t) {
    const auto* in = static_cast<const lowp::storage_t<t()>*>(src);
    // accumulate_one for every element; where the scale is 1 the loop is told so, which drops accumulate_one's test
    // of it from the loop (the same operations, so the same bits)
    if (scale == 1.0f) run(n, [=](std::int64_t i) { accumulate_one<t()>(dst[i], in[i], 1.0f); });
    else run(n, [=](std::int64_t i) { accumulate_one<t()>(dst[i], in[i], scale); });
  });
}
/// dst[i] += float(src[i]) * scale.
inline void accumulate(float* dst, const void* src, dtype src_type, std::int64_t n, float scale);

/// f(i) for i = b .. e-1, in order. On a copy of f: the stores f makes through its pointers cannot alias a local
/// copy, so the compiler keeps its coefficients in registers instead of reloading them after every element. An
/// ArrayFunction's arrays are taken once for the range instead of once per element (apply_at), and where none is
/// null the elements run through one loop without apply_at's null and write checks: each element still sees the
/// same loads, the same update() and the same stores, so the bits are apply_at's. (The optimizers' rules are
/// ArrayFunctions: SGD with momentum over 256 elements took 1.6 to 2.1 us through apply_at and 0.73 to 0.75 us
/// through this loop, g++ -O2, 2026-11-27; docs/benchmarks.md, "The host optimizer loop".)
template <class F>
void for_range(std::int64_t b, std::int64_t e, const F& f) {
  const F local = f;
  if constexpr (ArrayFunction<F>) {
    constexpr int K = F::array_count;
    const fp32_arrays<K> a = local.arrays();
    bool all = true;
    for (int k = 0; k < K; ++k) all = all && a.at[k] != nullptr;
    if (all) {  // unrolled over the K arrays (a fold), so that x lives in registers
      [&]<int... k>(std::integer_sequence<int, k...>) {
        float* const at[K] = {a.at[k]...};
        const bool written[K] = {(((a.writes >> k) & 1u) != 0)...};
        for (std::int64_t i = b; i < e; ++i) {
          float x[K] = {at[k][i]...};
          local.update(x, i);
          ((written[k] ? void(at[k][i] = x[k]) : void()), ...);
        }
      }(std::make_integer_sequence<int, K>{});
      return;
    }
  }
  for (std::int64_t i = b; i < e; ++i) local(i);
}

/// f(i) for i = 0 .. n-1, in order (for_range over the whole).
template <class F>
void for_each(std::int64_t n, const F& f) {
  for_range(0, n, f);
}

inline void convert(void* dst, dtype dst_type, const void* src, dtype src_type, std::int64_t n, float scale) {
  dispatch(dst_type, [&](auto d) {
    dispatch(src_type, [&](auto t) {
      auto* out = static_cast<lowp::storage_t<d()>*>(dst);
      const auto* in = static_cast<const lowp::storage_t<t()>*>(src);
      for (std::int64_t i = 0; i < n; ++i) out[i] = convert_one<d(), t()>(in[i], scale);
    });
  });
}

inline void accumulate(float* dst, const void* src, dtype src_type, std::int64_t n, float scale) {
  accumulate_with([](std::int64_t m, const auto& f) { for (std::int64_t i = 0; i < m; ++i) f(i); }, dst, src, src_type,
                  n, scale);
}

}  // namespace fsdp::kernels::host_loops
