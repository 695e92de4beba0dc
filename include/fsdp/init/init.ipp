#pragma once
// The initialisation rules' definitions (fsdp/init/init.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include "fsdp/init/init.hpp"

namespace fsdp::init {

FSDP_DECL void fill(const rule& r, std::string_view name, std::uint64_t first, std::size_t count, float* out) {
  std::visit(
      [&](const auto& x) {
        for (std::size_t i = 0; i < count; ++i) out[i] = value(x, name, first + i);
      },
      r);
}

}  // namespace fsdp::init
