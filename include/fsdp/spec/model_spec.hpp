#pragma once
// ModelSpec: the named parameters of a model, their shapes, dtype, flags and ties. A spec says nothing about
// ranks or units; the wrapping policy groups it into FSDP units and the layout places it in flat buffers.
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/init/init.hpp"

namespace fsdp {

/// Per-parameter flags.
struct param_flags {
  bool no_decay = false;  ///< excluded from weight decay (norms, biases)
};

struct ParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  /// The dtype the parameter must be computed in; unset: whatever the model's precision policy computes in. A
  /// parameter that asks for another dtype than the policy's is refused (one compute dtype per model).
  std::optional<dtype> compute_dtype;
  param_flags flags{};
  std::optional<init::rule> init;  ///< overrides the model's default init rule
  std::string tied_to;             ///< non-empty: this name is an alias of that parameter's storage

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
};

class ModelSpec {
 public:
  /// The most elements one parameter, and the whole model, may have: 2^48 (a petabyte of fp32). Every byte count
  /// the library derives from element counts (several buffers of up to 8 bytes an element) then fits in 64 bits.
  static constexpr std::int64_t max_numel = std::int64_t{1} << 48;

  /// Declares a parameter. Names are unique UTF-8; every dimension must be positive, and the element count at most
  /// max_numel (for the parameter and for the model).
  ModelSpec& add(std::string name, std::vector<std::int64_t> shape, param_options opt = {}) {
    check_new_name(name);
    if (shape.empty()) detail::fail_usage("parameter '", name, "' has no dimensions: give it a shape such as {n}");
    std::int64_t n = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] <= 0)
        detail::fail_usage("parameter '", name, "' has dimension ", i, " = ", shape[i],
                           ": every dimension must be positive");
      if (__builtin_mul_overflow(n, shape[i], &n) || n > max_numel)
        detail::fail_usage("parameter '", name, "' has shape ", detail::shape_text(shape),
                           ", whose element count exceeds 2^48 = ", max_numel,
                           ", the most one parameter may have (is a dimension wrong?)");
    }
    if (n > max_numel - numel_)
      detail::fail_usage("parameter '", name, "' of shape ", detail::shape_text(shape), " (", n,
                         " elements) brings the model past 2^48 = ", max_numel, " elements (it has ", numel_,
                         " before it), the most one model may have");
    index_.emplace(name, params_.size());
    numel_ += n;
    params_.push_back(ParamSpec{std::move(name), std::move(shape), opt.compute_dtype, opt.flags, opt.init, {}});
    return *this;
  }

  /// Declares `alias` as another name for the storage of `target` (weight tying, e.g. lm_head.w -> wte.w).
  /// Both names must end up in the same FSDP unit; the wrapping step checks that.
  ModelSpec& tie(std::string alias, const std::string& target) {
    check_new_name(alias);
    auto it = index_.find(target);
    if (it == index_.end())
      detail::fail_usage("cannot tie '", alias, "' to '", target, "': no parameter named '", target, "'");
    const ParamSpec& t = params_[it->second];
    if (t.is_tied())
      detail::fail_usage("cannot tie '", alias, "' to '", target, "': '", target, "' is itself tied to '",
                         t.tied_to, "'; tie to '", t.tied_to, "' instead");
    ParamSpec p = t;
    p.name = alias;
    p.tied_to = target;
    index_.emplace(p.name, params_.size());
    params_.push_back(std::move(p));
    return *this;
  }

  const std::vector<ParamSpec>& params() const noexcept { return params_; }
  std::size_t size() const noexcept { return params_.size(); }
  bool empty() const noexcept { return params_.empty(); }

  const ParamSpec& at(const std::string& name) const { return params_[index_of(name)]; }
  std::size_t index_of(const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end()) detail::fail_usage("no parameter named '", name, "' in the model spec");
    return it->second;
  }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }

  /// Throws usage_error when the spec cannot be used to build a model.
  void validate() const {
    if (params_.empty()) detail::fail_usage("the model spec is empty: add at least one parameter");
  }

  /// Total elements of stored parameters (aliases not counted twice).
  std::int64_t numel() const noexcept { return numel_; }

 private:
  void check_new_name(const std::string& name) const {
    if (name.empty()) detail::fail_usage("a parameter name is empty");
    if (std::string why = detail::utf8_problem("parameter name", name); !why.empty())
      detail::fail_usage(why, ": names appear in messages, traces and checkpoints; give the parameter a UTF-8 name");
    if (index_.count(name)) detail::fail_usage("duplicate parameter name '", name, "' in the model spec");
  }

  std::vector<ParamSpec> params_;
  std::unordered_map<std::string, std::size_t> index_;
  std::int64_t numel_ = 0;  ///< elements of stored parameters, at most max_numel
};

}  // namespace fsdp
