#pragma once
// The model spec's definitions (fsdp/spec/model_spec.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp {

FSDP_DECL ModelSpec& ModelSpec::add(std::string name, std::vector<std::int64_t> shape, param_options opt) {
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
  if (std::string why = placement_problem(name, shape, opt.tensor); !why.empty()) detail::fail_usage(why);
  if (opt.experts && opt.tensor.is_split() && opt.tensor.dim == 0)
    detail::fail_usage("parameter '", name,
                       "' stacks experts on dimension 0 and is split across the tensor group on "
                       "that dimension too: split an expert on another dimension (tp::split(1) or later)");
  index_.emplace(name, params_.size());
  numel_ += n;
  params_.push_back(ParamSpec{
      std::move(name), std::move(shape), opt.compute_dtype, opt.flags, opt.init, {}, opt.tensor, opt.experts});
  return *this;
}

FSDP_DECL ModelSpec& ModelSpec::tie(std::string alias, const std::string& target) {
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

FSDP_DECL ModelSpec ModelSpec::tensor_local(int degree, problems& p) const {
  ModelSpec out;
  for (const ParamSpec& q : params_) {
    if (q.is_tied()) {
      out.tie(q.name, q.tied_to);
      continue;
    }
    // one tensor rank: no gradient is partial, and nothing is split
    const tensor_placement t = degree == 1 ? tp::replicated : q.tensor;
    out.add(q.name, local_shape(q.name, q.shape, q.tensor, degree, p),
            {.compute_dtype = q.compute_dtype, .flags = q.flags, .init = q.init, .tensor = t, .experts = q.experts});
  }
  return out;
}

FSDP_DECL ModelSpec ModelSpec::expert_local(int degree, problems& p) const {
  ModelSpec out;
  for (const ParamSpec& q : params_) {
    if (q.is_tied()) {
      out.tie(q.name, q.tied_to);
      continue;
    }
    std::vector<std::int64_t> shape = q.shape;
    if (q.experts && degree > 1) {
      if (shape[0] % degree != 0)
        p.add("parameter '", q.name, "' of shape ", detail::shape_text(q.shape), " stacks ", shape[0],
              " experts, which model_options::expert_parallel = ", degree,
              " does not divide: each rank of an expert group holds an equal share of the experts");
      else
        shape[0] /= degree;
    }
    out.add(
        q.name, std::move(shape),
        {.compute_dtype = q.compute_dtype, .flags = q.flags, .init = q.init, .tensor = q.tensor, .experts = q.experts});
  }
  return out;
}

FSDP_DECL std::size_t ModelSpec::index_of(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) detail::fail_usage("no parameter named '", name, "' in the model spec");
  return it->second;
}

FSDP_DECL void ModelSpec::validate() const {
  if (params_.empty()) detail::fail_usage("the model spec is empty: add at least one parameter");
}

FSDP_DECL void ModelSpec::check_new_name(const std::string& name) const {
  if (name.empty()) detail::fail_usage("a parameter name is empty");
  if (std::string why = detail::utf8_problem("parameter name", name); !why.empty())
    detail::fail_usage(why, ": names appear in messages, traces and checkpoints; give the parameter a UTF-8 name");
  if (index_.count(name)) detail::fail_usage("duplicate parameter name '", name, "' in the model spec");
}

}  // namespace fsdp
