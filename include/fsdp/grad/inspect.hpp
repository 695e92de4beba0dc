#pragma once
// Gradient inspection before an optimizer step: the global L2 norm of every gradient shard of every unit on every
// rank, and whether any of them holds an inf or a NaN, agreed by all ranks in one all-reduce.
//
//   1. one fused squared norm per unit shard (backend::squared_norm: the host sums in double; CUDA uses CUB),
//      written into row r of a rows x units fp32 buffer (rows = 1: every rank adds into the same row; rows = world
//      with locate_nonfinite: rank r writes row r only, so every rank learns who holds what);
//   2. one all-reduce (sum) of that buffer on the compute stream; the host waits for it (the watched synchronize)
//      and reads it back;
//   3. on the host, in double and in a fixed order (the same on every rank): the squared norm is the sum of all
//      entries divided by the replicate group size (a replicated unit's shard is counted once per replica); any
//      non-finite entry, or a non-finite sum, means the step is skipped on every rank alike.
//
// Padding elements hold zero gradients, and an empty shard contributes 0, so neither changes the norm.
// Clipping follows torch.nn.utils.clip_grad_norm_: coefficient = min(1, max_norm / (norm + 1e-6)).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/grad/loss_scaler.hpp"
#include "fsdp/memory/cost.hpp"

namespace fsdp::grad {

/// What an optimizer step checks and does with the gradients before its update. Any inspection (clipping, a loss
/// scaler, skip_nonfinite, locate_nonfinite) skips a step whose gradients are not finite, on every rank: a
/// non-finite norm would otherwise write NaN into every parameter. The squared norms are fp32: a finite gradient
/// whose squared norm passes 3.4e38 counts as non-finite too.
struct options {
  /// > 0: clip the global gradient norm to this (the gradients are multiplied by min(1, max_norm / (norm + 1e-6))
  /// inside the fused update).
  float max_norm = 0.0f;
  /// Inspect the gradients without clipping: a non-finite value on any rank skips the step on every rank.
  bool skip_nonfinite = false;
  /// Also name the first rank and unit holding a non-finite value (the all-reduce then carries one row per rank).
  bool locate_nonfinite = false;
  /// fp16 dynamic loss scaling: gradients are divided by its scale; non-finite gradients skip the step and back
  /// the scale off. Must outlive the optimizer.
  loss_scaler* scaler = nullptr;

  bool inspects() const noexcept { return max_norm > 0.0f || skip_nonfinite || locate_nonfinite || scaler != nullptr; }
  /// Rows of the inspection buffer in a world of `world` ranks (0: no inspection).
  int rows(int world) const noexcept { return !inspects() ? 0 : locate_nonfinite ? world : 1; }
};

FSDP_DECL void check(const options& o);

/// Where a non-finite gradient was found.
struct location {
  int rank = 0;
  std::size_t unit = 0;
  std::string unit_name;
  int count = 0;  ///< unit shards holding a non-finite value, over all ranks
};

/// What a step did with the gradients.
struct report {
  bool inspected = false;
  bool skipped = false;     ///< non-finite gradients: no parameter or optimizer state changed, on any rank
  double norm = 0.0;        ///< global L2 norm of the unscaled gradients (inf or NaN when skipped; 0 uninspected)
  float clip_coef = 1.0f;   ///< what clipping multiplied the gradients by
  float loss_scale = 1.0f;  ///< the scale the gradients carried (1 without a loss scaler)
  float grad_scale = 1.0f;  ///< what the update multiplied each gradient element by: clip_coef / loss_scale
  bool located = false;     ///< the inspection had one row per rank (options::locate_nonfinite)
  std::optional<location> nonfinite;  ///< located and skipped: the first non-finite unit shard

  std::string message() const;
};

/// Inspects the gradients of `model` (inside Model::step, after every reduction was waited for). `backward`: the
/// units in backward order, for naming the first non-finite one.
template <class ModelT>
report inspect(ModelT& model, const options& o, const std::vector<std::size_t>& backward) {
  auto& be = model.backend();
  auto& comm = model.comm();
  auto& cs = be.compute_stream();
  const std::size_t n = model.size();
  const int world = comm.size();
  const int rows = o.rows(world);
  const plan::buffer_cost cost = plan::norm_buffer_cost(n, rows);
  auto buf = be.allocate(cost.bytes(), cost.category, cs);
  float* norms = buf.template as<float>();
  be.fill_zero(norms, cost.bytes(), cs);
  float* row = norms + (rows == 1 ? 0 : static_cast<std::size_t>(comm.rank()) * n);
  for (std::size_t u = 0; u < n; ++u) be.squared_norm(model.unit(u).grad_shard(), model.costs(u).shard_numel, row + u, cs);
  if constexpr (requires { comm.label(std::string_view{}); }) comm.label("(gradient norms)");  // names it in errors
  comm.all_reduce(norms, norms, cost.numel, cost.type, reduce_op::sum, cs);
  std::vector<float> host(static_cast<std::size_t>(cost.numel));
  be.synchronize(cs);  // the watched wait first: a copy to pageable memory cannot be interrupted
  be.download(host.data(), norms, cost.bytes(), cs);
  be.synchronize(cs);
  be.release_after(std::move(buf), cs);

  report r;
  r.inspected = true;
  r.located = rows == world;
  r.loss_scale = o.scaler ? o.scaler->scale() : 1.0f;
  double sum = 0.0;
  bool finite = true;
  for (float x : host) {
    sum += static_cast<double>(x);
    finite = finite && std::isfinite(x);
  }
  sum /= static_cast<double>(model.replicate_group_size());
  finite = finite && std::isfinite(sum);
  r.norm = std::sqrt(sum) / static_cast<double>(r.loss_scale);
  if (!finite) {
    r.skipped = true;
    r.clip_coef = 0.0f;
    r.grad_scale = 0.0f;
    if (r.located) {
      for (int q = 0; q < world && !r.nonfinite; ++q)
        for (std::size_t u : backward)
          if (!std::isfinite(host[static_cast<std::size_t>(q) * n + u])) {
            r.nonfinite = location{q, u, model.unit(u).name(), 0};
            break;
          }
      if (r.nonfinite)
        for (float x : host) r.nonfinite->count += std::isfinite(x) ? 0 : 1;
    }
    return r;
  }
  const double coef = o.max_norm > 0.0f ? std::min(1.0, static_cast<double>(o.max_norm) / (r.norm + 1e-6)) : 1.0;
  r.clip_coef = static_cast<float>(coef);
  r.grad_scale = static_cast<float>(coef / static_cast<double>(r.loss_scale));
  return r;
}

}  // namespace fsdp::grad

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/grad/inspect.ipp"
#endif
