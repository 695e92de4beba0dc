#pragma once
// The library's kernels as host loops over the per-element code every backend shares (kernels/elementwise.hpp,
// and the element functions of Backend::for_each): backend::host's kernels run these, and so does host-side work
// on any backend (the host gradient shards and the host optimizer step of fsdp/offload/offload.hpp), so a host
// loop and a CUDA kernel give the same bits.
#include <cstdint>

#include "fsdp/core/dtype.hpp"
#include "fsdp/kernels/elementwise.hpp"

namespace fsdp::kernels::host_loops {

/// dst[i] = dst_type(float(src[i]) * scale).
inline void convert(void* dst, dtype dst_type, const void* src, dtype src_type, std::int64_t n, float scale) {
  dispatch(dst_type, [&](auto d) {
    dispatch(src_type, [&](auto t) {
      auto* out = static_cast<f16::storage_t<d()>*>(dst);
      const auto* in = static_cast<const f16::storage_t<t()>*>(src);
      for (std::int64_t i = 0; i < n; ++i) out[i] = convert_one<d(), t()>(in[i], scale);
    });
  });
}

/// dst[i] += float(src[i]) * scale, with the loop run(n, f) (f(i) for every i: a plain loop, or a pool's).
template <class Run>
void accumulate_with(Run&& run, float* dst, const void* src, dtype src_type, std::int64_t n, float scale) {
  dispatch(src_type, [&](auto t) {
    const auto* in = static_cast<const f16::storage_t<t()>*>(src);
    run(n, [=](std::int64_t i) { accumulate_one<t()>(dst[i], in[i], scale); });
  });
}
/// dst[i] += float(src[i]) * scale.
inline void accumulate(float* dst, const void* src, dtype src_type, std::int64_t n, float scale) {
  accumulate_with([](std::int64_t m, const auto& f) { for (std::int64_t i = 0; i < m; ++i) f(i); }, dst, src, src_type,
                  n, scale);
}

/// f(i) for i = 0 .. n-1, in order. On a copy of f: the stores f makes through its pointers cannot alias a local
/// copy, so the compiler keeps its coefficients in registers instead of reloading them after every element.
template <class F>
void for_each(std::int64_t n, const F& f) {
  const F local = f;
  for (std::int64_t i = 0; i < n; ++i) local(i);
}

}  // namespace fsdp::kernels::host_loops
