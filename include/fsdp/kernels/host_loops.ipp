#pragma once
// The host loops' definitions (fsdp/kernels/host_loops.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstdint>

#include "fsdp/core/dtype.hpp"
#include "fsdp/kernels/elementwise.hpp"
#include "fsdp/kernels/host_loops.hpp"

namespace fsdp::kernels::host_loops {

FSDP_DECL void convert(void* dst, dtype dst_type, const void* src, dtype src_type, std::int64_t n, float scale) {
  dispatch(dst_type, [&](auto d) {
    dispatch(src_type, [&](auto t) {
      auto* out = static_cast<lowp::storage_t<d()>*>(dst);
      const auto* in = static_cast<const lowp::storage_t<t()>*>(src);
      for (std::int64_t i = 0; i < n; ++i) out[i] = convert_one<d(), t()>(in[i], scale);
    });
  });
}

FSDP_DECL void accumulate(float* dst, const void* src, dtype src_type, std::int64_t n, float scale) {
  accumulate_with([](std::int64_t m, const auto& f) { for (std::int64_t i = 0; i < m; ++i) f(i); }, dst, src, src_type,
                  n, scale);
}

}  // namespace fsdp::kernels::host_loops
