#pragma once
// Gradient inspection before an optimizer step: the global L2 norm of every gradient shard of every unit on every
// rank, and whether any of them holds an inf or a NaN, agreed by all ranks in one all-reduce, decided on the
// device, so that a step needs no host synchronize:
//
//   1. one fused squared norm per unit shard (backend::squared_norm: the host sums in double; CUDA uses CUB),
//      written into row r of a rows x units fp32 table (rows = 1: every rank adds into the same row; rows = world
//      with locate_nonfinite: rank r writes row r only, so every rank learns who holds what);
//   2. one all-reduce (sum) of that table on the compute stream;
//   3. the decision (grad::decide, one element function run by Backend::for_each on the compute stream: one
//      thread on a GPU, a loop on the host), in double and in a fixed order, the same on every rank and every
//      backend: the squared norm is the sum of all entries in order divided by the replicate group size (a
//      replicated unit's shard is counted once per replica); any non-finite entry, or a non-finite sum, skips the
//      step on every rank alike; else clipping's coefficient and the gradient scale. It is written into the same
//      buffer (grad::verdict, before the table), where the update kernels read it: a skipped step's kernels change
//      nothing, the others multiply each gradient by its scale;
//   4. the decision (and, to locate a non-finite gradient, the table) copied into pinned host memory and an event
//      recorded after it: the host learns the decision at a synchronize it makes anyway (reading its loss), or
//      when it asks for it (grad::step_report::get(): then one synchronize of the compute stream). An optimizer
//      counts the step (AdamW's t) and tells the loss scaler then, at the latest before its next step.
//
// A backend without pinned host memory or done(event) (backend/concept.hpp) reads the table back on the host
// inside the step, as before (one synchronize).
//
// Padding elements hold zero gradients, and an empty shard contributes 0, so neither changes the norm.
// Clipping follows torch.nn.utils.clip_grad_norm_: coefficient = min(1, max_norm / (norm + 1e-6)).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/rounding.hpp"
#include "fsdp/grad/loss_scaler.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/model_access.hpp"

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
  /// The step was captured (a CUDA graph, backend::host's capture), not run: each replay decides on the device and
  /// step_graph::replay() returns its report; nothing above describes this one.
  bool captured = false;
  std::optional<location> nonfinite;  ///< located and skipped: the first non-finite unit shard

  std::string message() const;
};

/// The inspection's decision, as the update kernels read it (in the backend's memory) and the host learns it (in
/// pinned host memory): 32 bytes, the first verdict_slots fp32 slots of the inspection's buffer (memory/cost.hpp).
struct verdict {
  double norm = 0.0;        ///< global L2 norm of the unscaled gradients (inf or NaN when skipped)
  float clip_coef = 1.0f;   ///< what clipping multiplies the gradients by (0 when skipped)
  float grad_scale = 1.0f;  ///< what the update multiplies each gradient element by: clip_coef / loss_scale
  std::int32_t skipped = 0;  ///< non-zero: non-finite gradients; no update changes anything
  float loss_scale = 1.0f;   ///< the scale the gradients carried, as the decision read it (1 without a loss scaler)
  std::int32_t pad[2] = {0, 0};
};
static_assert(sizeof(verdict) == plan::verdict_slots * sizeof(float), "grad::verdict fills the buffer's first slots");

/// The decision from the all-reduced table of `count` squared norms (an ElementFunction: f(0) once, on the compute
/// stream). In double, one rounding per operation (rn::), in the table's order: the same bits on every rank and
/// every backend, and as the host computed them before the decision moved to the device. A NaN norm is fp64's
/// quiet NaN whatever the payloads.
struct decide {
  const float* norms;
  std::int64_t count;
  int replicas;
  float max_norm;
  float loss_scale;
  verdict* out;
  /// Where the step's loss scale is in device memory (the optimizer's step block), read in place of loss_scale; null:
  /// loss_scale.
  const float* scale_at = nullptr;
  FSDP_HD void operator()(std::int64_t) const {
    const float loss_scale = scale_at ? *scale_at : this->loss_scale;
    double sum = 0.0;
    bool finite = true;
    for (std::int64_t i = 0; i < count; ++i) {
      const float x = norms[i];
      finite = finite && x - x == 0.0f;  // neither NaN nor infinite
      sum = rn::add(sum, static_cast<double>(x));
    }
    sum = rn::div(sum, static_cast<double>(replicas));
    finite = finite && sum - sum == 0.0;
    verdict v;
    v.loss_scale = loss_scale;
    v.norm = sum == sum
                 ? rn::div(rn::sqrt(sum), static_cast<double>(loss_scale))
                 : __builtin_bit_cast(double, std::uint64_t{0x7ff8000000000000u});  // one NaN, whatever the payloads
    if (!finite) {
      v.clip_coef = 0.0f;
      v.grad_scale = 0.0f;
      v.skipped = 1;
    } else {
      double coef = 1.0;
      if (max_norm > 0.0f) {
        const double c = rn::div(static_cast<double>(max_norm), rn::add(v.norm, 1e-6));
        coef = c < 1.0 ? c : 1.0;  // std::min(1.0, c)
      }
      v.clip_coef = static_cast<float>(coef);
      v.grad_scale = static_cast<float>(rn::div(coef, static_cast<double>(loss_scale)));
    }
    *out = v;
  }
};

/// The report of a decision `v`; `table` (rows x units, rows == world: located) names the first non-finite unit shard
/// in backward order, when it was skipped.
FSDP_DECL report report_of(const verdict& v, const float* table, int rows, int world, std::size_t units,
                           const std::vector<std::size_t>& backward, const std::vector<std::string>& names);

/// One optimizer step's decision on its way to the host, shared by the optimizer and the step_report it returned:
/// resolved once, by whichever asks first (the optimizer at its next step at the latest).
struct pending_decision {
  std::function<bool()> arrived;  ///< the compute stream has passed the decision's copy to the host (never waits)
  std::function<void()> wait;     ///< waits for it (a synchronize of the compute stream)
  std::function<report()> read;   ///< the report, from the host copy
  std::function<void(const report&)> settled;  ///< what the optimizer does with it (counts the step, the loss scaler)
  std::optional<report> result;

  const report& resolve() {
    if (!result) {
      if (!arrived()) wait();
      result = read();
      if (settled) settled(*result);
    }
    return *result;
  }
  /// The optimizer that made it is gone without a report (its streams failed first): from now on, asking throws
  /// `why` instead of reaching the optimizer.
  void orphan(std::string why) {
    arrived = [] { return true; };
    wait = [] {};
    read = [why = std::move(why)]() -> report { throw comm_error(why); };
    settled = nullptr;
  }
};

/// What an optimizer step did with the gradients, learned without waiting for the step: ready() once the compute
/// stream has passed the decision (a synchronize the trainer makes anyway, reading its loss, gets it there); get()
/// the report, waiting for it when it is not ready (one synchronize of the compute stream); a const report& by
/// conversion (get()), so `grad::report r = opt.step();` waits as a step did before. A stream that failed before
/// it got to the decision throws its error from either (Backend::done).
class step_report {
 public:
  /// A report known at once (no inspection, or a backend that reads the table on the host).
  explicit step_report(report r) : p_(std::make_shared<pending_decision>()) { p_->result = std::move(r); }
  /// A decision on its way.
  explicit step_report(std::shared_ptr<pending_decision> p) : p_(std::move(p)) {}
  bool ready() const { return p_->result.has_value() || p_->arrived(); }
  const report& get() const { return p_->resolve(); }
  operator const report&() const { return get(); }

 private:
  std::shared_ptr<pending_decision> p_;
};

/// Inspects the gradients of `model` (inside Model::step, after every reduction was waited for) into `buf` (the
/// inspection's buffer, norm_buffer_cost: the verdict, then the table), on the compute stream: the norms, their
/// all-reduce, the decision. With a loss scaler, the decision reads the scale at `scale_at` (device memory: the
/// optimizer's step block) when given, else the scaler's. Returns nothing: the update kernels read `buf`'s verdict, the
/// caller copies it to the host.
template <class ModelT>
void issue_inspection(ModelT& model, const options& o, void* buf, const float* scale_at = nullptr) {
  auto& be = model.backend();
  auto& comm = model.comm();
  auto& cs = be.compute_stream();
  const std::size_t n = model.size();
  const int world = comm.size();
  const int rows = o.rows(world);
  const plan::buffer_cost cost = plan::norm_buffer_cost(n, rows);
  float* slots = static_cast<float*>(buf);
  float* table = slots + plan::verdict_slots;
  be.fill_zero(slots, cost.bytes(), cs);
  float* row = table + (rows == 1 ? 0 : static_cast<std::size_t>(comm.rank()) * n);
  // Under tensor parallelism every tensor rank holds its own slice of a split parameter, but the same whole
  // replicated one: tensor rank 0 counts its whole shard, the others only their part of the split parameters,
  // which the layout places first (FlatLayout::split_end), so that the world's sum counts every element once per
  // replica.
  // The world's sum is divided by the replicas: an expert unit's elements are held by replicas / expert ranks each
  // where the expert dimension comes out of the replicas (a strategy that keeps whole parameters), so its squares
  // count `expert` times there.
  const device_mesh& mesh = model.mesh();
  const bool split_only = mesh.tensor > 1 && mesh.tensor_rank(comm.rank()) != 0;
  const bool weigh_experts = mesh.expert > 1 && !fsdp::mesh::experts_from_shards(mesh);
  for (std::size_t u = 0; u < n; ++u) {
    const std::int64_t S = model_access::costs(model, u).shard_numel;
    const FlatLayout& l = model.unit(u).layout();
    const std::int64_t counted =
        split_only ? std::clamp(l.split_end() - l.shard_begin(model.unit(u).shard_rank()), std::int64_t{0}, S) : S;
    be.squared_norm(model.unit(u).grad_shard(), counted, row + u, cs);
    if (weigh_experts && l.experts())
      be.convert(row + u, dtype::f32, row + u, dtype::f32, 1, static_cast<float>(mesh.expert), cs);
  }
  comm::label_next(comm, "(gradient norms)");  // names it in errors
  comm.all_reduce(table, table, plan::norm_count(n, rows), dtype::f32, reduce_op::sum, cs);
  be.for_each(
      1,
      decide{table, plan::norm_count(n, rows), model.mesh().replicas, o.max_norm, o.scaler ? o.scaler->scale() : 1.0f,
             reinterpret_cast<verdict*>(slots), o.scaler ? scale_at : nullptr},
      cs);
}

/// The inspection with the decision read back on the host inside the step (a backend without pinned host memory
/// or done(event)): one synchronize of the compute stream. `backward`: the units in backward order, for naming the
/// first non-finite one.
template <class ModelT>
report inspect(ModelT& model, const options& o, const std::vector<std::size_t>& backward) {
  auto& be = model.backend();
  auto& cs = be.compute_stream();
  const std::size_t n = model.size();
  const int world = model.comm().size();
  const int rows = o.rows(world);
  const plan::buffer_cost cost = plan::norm_buffer_cost(n, rows);
  auto buf = be.allocate(cost.bytes(), cost.category, cs);
  issue_inspection(model, o, buf.data());
  std::vector<float> host(static_cast<std::size_t>(cost.numel));
  be.synchronize(cs);  // the watched wait first: a copy to pageable memory cannot be interrupted
  be.download(host.data(), buf.data(), cost.bytes(), cs);
  be.synchronize(cs);
  be.release_after(std::move(buf), cs);
  verdict v;
  std::memcpy(&v, host.data(), sizeof v);
  std::vector<std::string> names;
  for (std::size_t u = 0; u < n; ++u) names.push_back(model.unit(u).name());
  return report_of(v, host.data() + plan::verdict_slots, rows, world, n, backward, names);
}

}  // namespace fsdp::grad

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/grad/inspect.ipp"
#endif
