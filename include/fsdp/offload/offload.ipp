#pragma once
// The offload policies' definitions (fsdp/offload/offload.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <string_view>

#include "fsdp/offload/offload.hpp"

namespace fsdp {

FSDP_DECL std::string describe(const offload_facts& f) {
  if (!f.any()) return "none";
  std::string s;
  auto add = [&](bool on, std::string_view what) {
    if (!on) return;
    if (!s.empty()) s += "+";
    s += what;
  };
  add(f.params, "params");
  add(f.grads, "grads");
  add(f.optimizer_state, "optimizer_state");
  return s;
}

}  // namespace fsdp
