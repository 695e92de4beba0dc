#pragma once
// ModelSpec: the named parameters of a model, their shapes, dtype, flags and ties. A spec says nothing about
// ranks or units; the wrapping policy groups it into FSDP units and the layout places it in flat buffers.
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/problems.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/init/init.hpp"
#include "fsdp/spec/placement.hpp"

namespace fsdp {

/// Per-parameter flags.
struct param_flags {
  bool no_decay = false;  ///< excluded from weight decay (norms, biases)
};

struct ParamSpec {
  std::string name;
  /// The global shape (a Model's own spec, ModelSpec::tensor_local, holds this rank's local shape).
  std::vector<std::int64_t> shape;
  /// The dtype the parameter must be computed in; unset: whatever the model's precision policy computes in. A
  /// parameter that asks for another dtype than the policy's is refused (one compute dtype per model).
  std::optional<dtype> compute_dtype;
  param_flags flags{};
  std::optional<init::rule> init;  ///< overrides the model's default init rule
  std::string tied_to;             ///< non-empty: this name is an alias of that parameter's storage
  /// Where it lives across the tensor group (fsdp/spec/placement.hpp); an alias has its target's.
  tensor_placement tensor{};
  /// A stack of experts on dimension 0 (param_options::experts); an alias has its target's.
  bool experts = false;

  bool is_tied() const noexcept { return !tied_to.empty(); }
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

/// Options for ModelSpec::add.
struct param_options {
  std::optional<dtype> compute_dtype{};
  param_flags flags{};
  std::optional<init::rule> init{};
  /// Across the tensor group (model_options::tensor_parallel ranks): replicated, or tp::split(dim).
  tensor_placement tensor{};
  /// The parameter stacks experts on dimension 0 ([n_experts, ...]: a mixture of experts' weights): split over the
  /// expert group (model_options::expert_parallel ranks, each holding n_experts / expert_parallel of them), each
  /// rank's experts sharded and reduced over the ranks that hold the same experts (fsdp/core/mesh.hpp). A unit
  /// holds experts or dense parameters, not both. Under tensor parallelism an expert may be split on any other
  /// dimension.
  bool experts = false;
};

class ModelSpec {
 public:
  /// The most elements one parameter, and the whole model, may have: 2^48 (a petabyte of fp32). Every byte count
  /// the library derives from element counts (several buffers of up to 8 bytes an element) then fits in 64 bits.
  static constexpr std::int64_t max_numel = std::int64_t{1} << 48;

  /// Declares a parameter. Names are unique UTF-8; every dimension must be positive, and the element count at most
  /// max_numel (for the parameter and for the model).
  ModelSpec& add(std::string name, std::vector<std::int64_t> shape, param_options opt = {});

  /// Declares `alias` as another name for the storage of `target` (weight tying, e.g. lm_head.w -> wte.w).
  /// Both names must end up in the same FSDP unit; the wrapping step checks that.
  ModelSpec& tie(std::string alias, const std::string& target);

  const std::vector<ParamSpec>& params() const noexcept { return params_; }
  std::size_t size() const noexcept { return params_.size(); }
  bool empty() const noexcept { return params_.empty(); }

  const ParamSpec& at(const std::string& name) const { return params_[index_of(name)]; }
  std::size_t index_of(const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }

  /// Throws usage_error when the spec cannot be used to build a model.
  void validate() const;

  /// Total elements of stored parameters (aliases not counted twice).
  std::int64_t numel() const noexcept { return numel_; }

  /// The spec of one rank of a tensor group of `degree` ranks: every split parameter's shape divided on its split
  /// dimension (the rank's slice), the rest as they are; at degree 1 every placement is replicated (no slice, no
  /// partial gradient). A dimension the degree does not divide goes to `p`.
  ModelSpec tensor_local(int degree, problems& p) const;
  /// The spec of one rank of an expert group of `degree` ranks: every expert parameter's dimension 0 divided by the
  /// degree (its share of the experts), the rest as they are. An expert count the degree does not divide goes to
  /// `p`.
  ModelSpec expert_local(int degree, problems& p) const;

 private:
  void check_new_name(const std::string& name) const;

  std::vector<ParamSpec> params_;
  std::unordered_map<std::string, std::size_t> index_;
  std::int64_t numel_ = 0;  ///< elements of stored parameters, at most max_numel
};

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/spec/model_spec.ipp"
#endif
