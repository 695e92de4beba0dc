#pragma once
// A trainer's own weights in and out of a model, by name, with no file between: the call that fills every master
// shard from the trainer's full fp32 tensors, and the one that writes the model's full values back into them.
//
//   fsdp::weights::load(model, source)   collective: source(name) gives parameter `name`'s full fp32 tensor in host
//                                        memory (weights::tensor: data and element count; {} when the trainer has
//                                        none); each rank copies the elements of its own shard. Every parameter that
//                                        is not an alias (ModelSpec::tie) must be given, at its size: otherwise a
//                                        usage_error on every rank that names the parameter and the rank, and no
//                                        shard is modified. Between optimizer steps; gradients are zeroed.
//   fsdp::weights::gather_full_params(model)
//                                        collective: every rank receives the full fp32 value of every parameter
//                                        (aliases included) by name, in a std::map; not during a pass
//   fsdp::weights::store(model, sink)    collective: sink(name) gives where parameter `name`'s full fp32 value goes
//                                        (weights::target: data and element count; {} to skip it); every rank
//                                        receives every value (gather_full_params), aliases included.
//   fsdp::weights::layer(stacked, per_layer, l)
//                                        layer l of a stacked [L, ...] buffer, for a trainer that keeps one buffer
//                                        for every layer: no renaming table, just the index in the name.
//   fsdp::weights::stacked<T>            (fsdp/weights/stacked.hpp) a trainer's stacked buffers declared once: the
//                                        spec's per-layer names, a unit per layer, each layer's slice, the views.
//
// Works on every backend and world size, and on a hybrid mesh (each shard group holds the whole model). Under tensor
// parallelism (model_options::tensor_parallel) "full" is this rank's local tensor (model.spec()'s shape: its slice of
// a split parameter), the same on every rank of its tensor rank; with experts (model_options::expert_parallel) a
// stack of experts is this rank's share of it, the same on every rank holding those experts; checkpoints and
// safetensors files hold global ones.
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/agree/agree.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/layout/sharded_tensor.hpp"
#include "fsdp/model_access.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp::weights {

/// A full fp32 tensor the trainer holds in host memory (row-major, as the parameter's shape).
struct tensor {
  const float* data = nullptr;
  std::int64_t numel = 0;
};
/// Where a full fp32 value goes in the trainer's host memory. A writable buffer is a readable one too: a target is
/// a tensor wherever one is asked for (a load's source over a trainer's `float*` buffers, `layer` of one included).
struct target {
  float* data = nullptr;
  std::int64_t numel = 0;

  operator tensor() const noexcept { return {data, numel}; }
};

/// Layer `l` of a stacked buffer of `per_layer` elements per layer ([L, ...] row-major).
inline tensor layer(const float* stacked, std::int64_t per_layer, int l) {
  return {stacked + static_cast<std::int64_t>(l) * per_layer, per_layer};
}
inline target layer(float* stacked, std::int64_t per_layer, int l) {
  return {stacked + static_cast<std::int64_t>(l) * per_layer, per_layer};
}

/// Fills every master shard of `m` from source(name) -> tensor (see the header). Collective.
template <class ModelT, class Source>
void load(ModelT& m, Source&& source) {
  // Checked on every rank first, so that a failure on any rank modifies nothing on any.
  std::map<std::string, tensor> given;
  std::optional<std::string> mine;
  for (const ParamSpec& p : m.spec().params()) {
    if (p.is_tied()) continue;  // its storage is its target's
    const tensor t = source(p.name);
    if (!t.data) {
      mine = detail::cat("the trainer gave no tensor for parameter '", p.name, "' ",
                         detail::shape_text(p.shape), " (every parameter that is not an alias must be given)");
      break;
    }
    if (t.numel != p.numel()) {
      mine = detail::cat("parameter '", p.name, "' ", detail::shape_text(p.shape), " has ", p.numel(),
                         " elements, but the trainer's tensor has ", t.numel);
      break;
    }
    given[p.name] = t;
  }
  agree::require_success<usage_error>(m.comm(), m.backend(), mine, "weights::load", "; no parameter was modified");
  // This rank's elements of each parameter, in shard order, uploaded into the master shards between steps.
  std::vector<std::vector<float>> staging(m.size());
  for (std::size_t u = 0; u < m.size(); ++u) {
    staging[u].assign(static_cast<std::size_t>(m.unit(u).layout().shard_numel()), 0.0f);
    for (const ShardedTensor& v : m.unit(u).shard_views()) {
      if (v.empty()) continue;
      const tensor& t = given.at(v.name);
      std::memcpy(staging[u].data() + v.shard_offset, t.data + v.begin,
                  static_cast<std::size_t>(v.local_numel()) * sizeof(float));
    }
  }
  model_access::replace_shards(m, "weights::load", [&] {
    auto& be = m.backend();
    for (std::size_t u = 0; u < m.size(); ++u)
      be.upload(model_access::master_shard(m.unit(u)), staging[u].data(),
                static_cast<std::int64_t>(staging[u].size() * sizeof(float)), be.compute_stream());
    be.synchronize(be.compute_stream());
  });
}

/// Every parameter's full fp32 value (aliases included), by name, on every rank. Collective; not during a pass.
template <class ModelT>
std::map<std::string, std::vector<float>> gather_full_params(ModelT& m) {
  model_access::require_idle(m, "gather_full_params()");
  std::map<std::string, std::vector<float>> out;
  for (std::size_t u = 0; u < m.size(); ++u) {
    const std::vector<float> full = model_access::gather_full(m, u);
    const auto& unit = m.unit(u);
    for (const ParamSpec& p : m.spec().params()) {
      if (!unit.layout().contains(p.name)) continue;
      const flat_entry& e = unit.layout().entry(p.name, unit.name());
      out[p.name].assign(full.begin() + e.offset, full.begin() + e.offset + e.numel);
    }
  }
  return out;
}

/// Writes every parameter's full fp32 value where sink(name) -> target says (see the header). Collective.
template <class ModelT, class Sink>
void store(ModelT& m, Sink&& sink) {
  const std::map<std::string, std::vector<float>> full = gather_full_params(m);
  for (const ParamSpec& p : m.spec().params()) {
    const target t = sink(p.name);
    if (!t.data) continue;
    if (t.numel != p.numel())
      detail::fail_usage("weights::store: parameter '", p.name, "' ", detail::shape_text(p.shape), " has ", p.numel(),
                         " elements, but the trainer's buffer for it has ", t.numel, " (rank ", m.comm().rank(), ")");
    const std::vector<float>& v = full.at(p.name);
    std::memcpy(t.data, v.data(), v.size() * sizeof(float));
  }
}

}  // namespace fsdp::weights
