#pragma once
// The wrapping policies' definitions (fsdp/policy/wrap.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include "fsdp/core/error.hpp"
#include "fsdp/policy/wrap.hpp"

namespace fsdp::wrap {

FSDP_DECL std::vector<std::string> by_prefix::assign(const ModelSpec& spec) const {
  if (prefix.empty()) detail::fail_usage("wrap::by_prefix needs a non-empty prefix");
  std::vector<std::string> out;
  out.reserve(spec.size());
  for (const auto& p : spec.params()) {
    if (p.name.size() > prefix.size() && p.name.compare(0, prefix.size(), prefix) == 0) {
      const auto dot = p.name.find('.', prefix.size());
      out.push_back(p.name.substr(0, dot));
    } else {
      out.push_back(rest);
    }
  }
  return out;
}

FSDP_DECL std::vector<std::string> by_size::assign(const ModelSpec& spec) const {
  if (min_numel <= 0) detail::fail_usage("wrap::by_size needs min_numel > 0, got ", min_numel);
  std::vector<std::string> out(spec.size());
  std::int64_t filled = 0;
  int unit = 0;
  for (std::size_t i = 0; i < spec.size(); ++i) {
    const auto& p = spec.params()[i];
    if (p.is_tied()) {
      out[i] = out[spec.index_of(p.tied_to)];
      continue;
    }
    if (filled >= min_numel) {
      ++unit;
      filled = 0;
    }
    out[i] = "unit" + std::to_string(unit);
    filled += p.numel();
  }
  return out;
}

FSDP_DECL std::vector<std::string> by_function::assign(const ModelSpec& spec) const {
  if (!fn) detail::fail_usage("wrap::by_function has no function");
  std::vector<std::string> out;
  out.reserve(spec.size());
  for (const auto& p : spec.params()) {
    out.push_back(fn(p));
    if (out.back().empty()) detail::fail_usage("wrap::by_function gave parameter '", p.name, "' an empty unit name");
  }
  return out;
}

}  // namespace fsdp::wrap
