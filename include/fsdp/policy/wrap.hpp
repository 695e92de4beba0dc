#pragma once
// Wrapping policies turn a ModelSpec into FSDP units: groups of parameters that are sharded, gathered and
// reduced together. A policy only names the unit of each parameter (`assign`); `make_units` is shared and
// orders the units, keeps tied parameters together and reports a tie split across units.
#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp {

/// One FSDP unit as planned by the wrapping step: its name and its parameters (indices into the spec).
struct unit_plan {
  std::string name;
  std::vector<std::size_t> params;
};

/// A wrapping policy names the unit of every parameter of a spec, in spec order.
template <class W>
concept WrappingPolicy = requires(const W& w, const ModelSpec& spec) {
  { w.assign(spec) } -> std::same_as<std::vector<std::string>>;
};

namespace wrap {

/// One unit per block: a parameter whose name starts with `prefix` goes to the unit named by the prefix and
/// the next name component ("h." + "3" for "h.3.attn.w"); every other parameter goes to the unit `rest`.
struct by_prefix {
  std::string prefix;
  std::string rest = "root";

  std::vector<std::string> assign(const ModelSpec& spec) const;
};

/// Consecutive parameters (spec order) are packed into one unit until it holds at least `min_numel`
/// elements. A tied alias joins the unit of the parameter it is tied to.
struct by_size {
  std::int64_t min_numel = 1 << 20;

  std::vector<std::string> assign(const ModelSpec& spec) const;
};

/// The user names the unit of each parameter.
struct by_function {
  std::function<std::string(const ParamSpec&)> fn;

  std::vector<std::string> assign(const ModelSpec& spec) const;
};

/// Policy `inner`'s units with each unit's experts (ParamSpec::experts) moved to a unit of their own, named after it
/// with `suffix` ("h.3" -> "h.3.experts"): a unit holds experts or dense parameters, as a Model needs (their gathers
/// and reductions go to different groups: docs/policies.md). It comes in the spec's order as any unit does, so a
/// block that declares its attention first runs its dense unit, then its experts.
template <class W>
struct experts_apart {
  W inner;
  std::string suffix = ".experts";

  std::vector<std::string> assign(const ModelSpec& spec) const {
    std::vector<std::string> out = inner.assign(spec);
    if (out.size() == spec.size())  // else make_units names the mismatch
      for (std::size_t i = 0; i < out.size(); ++i)
        if (spec.params()[i].experts) out[i] += suffix;
    return out;
  }
};

}  // namespace wrap

/// Groups the spec into units with `policy`. Units come in the order of their first parameter in the spec
/// (that is the default execution order). What is wrong (an empty spec, a unit name that is empty or not UTF-8,
/// a tie split across units) goes to `p`.
template <WrappingPolicy W>
std::vector<unit_plan> make_units(const ModelSpec& spec, const W& policy, problems& p) {
  if (spec.size() == 0) {
    p.add("the model spec is empty: add at least one parameter");
    return {};
  }
  const std::vector<std::string> names = policy.assign(spec);
  if (names.size() != spec.size()) {
    p.add("the wrapping policy named ", names.size(), " units for ", spec.size(), " parameters");
    return {};
  }
  std::vector<unit_plan> units;
  std::unordered_map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < spec.size(); ++i) {
    auto [it, fresh] = by_name.emplace(names[i], units.size());
    if (fresh) {
      if (names[i].empty())
        p.add("the wrapping policy gave parameter '", spec.params()[i].name, "' an empty unit name");
      else if (std::string why = detail::utf8_problem("unit name", names[i]); !why.empty())
        p.add(why, ", given by the wrapping policy to parameter '", spec.params()[i].name,
              "': names appear in messages, traces and checkpoints; name units in UTF-8");
      units.push_back(unit_plan{names[i], {}});
    }
    units[it->second].params.push_back(i);
  }
  for (std::size_t i = 0; i < spec.size(); ++i) {
    const auto& param = spec.params()[i];
    if (!param.is_tied()) continue;
    const auto& target_unit = names[spec.index_of(param.tied_to)];
    if (names[i] != target_unit)
      p.add("tied parameters '", param.name, "' and '", param.tied_to, "' landed in different units ('", names[i],
            "' and '", target_unit,
            "'): tied parameters share storage and must be in one unit; change the wrapping policy");
  }
  return units;
}
/// make_units, throwing the first problem as a usage_error.
template <WrappingPolicy W>
std::vector<unit_plan> make_units(const ModelSpec& spec, const W& policy) {
  problems p;
  std::vector<unit_plan> units = make_units(spec, policy, p);
  p.require();
  return units;
}

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/policy/wrap.ipp"
#endif
