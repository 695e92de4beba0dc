#pragma once
// A training step captured once and replayed: the trainer's own work, the library's gathers, reductions, gradient
// inspection and optimizer updates issued once into a recording (backend::host's capture, a CUDA graph's
// counterpart) and issued again by each replay, the same bits as eager steps (tests/model/capture_test).
//
//   step(model, opt);                                        // one eager step first: it makes the slots
//   fsdp::step_graph g(model, opt, [&] { step(model, opt); });  // captured: nothing runs
//   for (int t = 2; t <= steps; ++t) g.replay();             // each replay is one step
//
// The contract, what must hold between the capture and every replay:
//   - addresses: every buffer the step reads or writes stays where it was (the model's slots stay made after the
//     first step; the trainer's own buffers are its to keep), and the data a replay should see is written there
//     before it (in stream order, or by the host once the streams are done);
//   - shapes and the unit order: the same batch shape, the same passes over the same units;
//   - per-step values: the optimizer's learning rate, bias corrections, gradient scale, clip coefficient and skip
//     come from the device (the update count it keeps: fsdp/optim/detail/step_block.hpp; the inspection's verdict),
//     so each replay computes its own; set_lr() between replays changes nothing (give the optimizer an
//     lr_schedule), and a rule made on the host (optim::elementwise::step(make)) is replayed as made;
//   - the host learns afterwards: each replay() returns that replay's report (its norm, clip coefficient, loss scale,
//     whether it skipped), ready once the compute stream has passed the decision, as an eager step's; a report still
//     held at the next replay is read before it (waiting for its decision), one let go is never read. The
//     optimizer's steps() after replays (one synchronize), Model::step_count() counts each replay; the captured
//     step's own report says it was captured (grad::report::captured).
// A loss scaler's scale moves on the device too: a captured trainer multiplies its loss gradient by
// opt.loss_scale_on_device() in a kernel, not by the host's scaler.scale(), which the host learns after replays.
// Refused, each with a sentence naming it: no-sync accumulation (its
// accumulators are taken each step), a unit whose optimizer step runs on the host (params, grads and optimizer
// state offloaded: its rule is made on the host), model_options::check_views and check_collectives (host checks
// inside the step), and what the backend refuses while capturing (memory taken or given back, host waits, event
// queries: backend::host::begin_capture).
#include <cstddef>
#include <cstdint>
#include <utility>

#include "fsdp/backend/concept.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/model_access.hpp"
#include "fsdp/optim/detail/shard_optimizer.hpp"
#include "fsdp/options/model_options.hpp"
#include "fsdp/policy/offload.hpp"

namespace fsdp {

/// A backend that records a step and replays it: begin_capture(), end_capture() -> graph, abandon_capture() (ends
/// one without a graph, never throws), replay(graph).
template <class B>
concept GraphBackend = CapturingBackend<B> && requires(B& b, const typename B::graph& g) {
  b.begin_capture();
  { b.end_capture() } -> std::same_as<typename B::graph>;
  b.abandon_capture();
  b.replay(g);
};

template <class ModelT, class Optimizer>
class step_graph {
  using backend_type = typename ModelT::backend_type;
  static_assert(GraphBackend<backend_type>,
                "fsdp::step_graph: this backend cannot capture a step (backend::host and backend::cuda can)");

 public:
  /// Captures step() (one training step: forward, backward, opt.step(), zero_grad) on `model`'s streams after
  /// learning what the host waits for (the model synchronized, the optimizer's last decision). usage_error, before
  /// anything is captured, for what a captured step cannot hold (see the top of this header).
  template <class Step>
  step_graph(ModelT& model, Optimizer& opt, Step&& step) : model_(model), opt_(opt) {
    refuse_what_cannot_be_captured();
    auto& be = model_.backend();
    model_.synchronize();
    (void)opt_.steps();  // the last eager step's decision learned: nothing on the host waits for it in the capture
    const std::uint64_t before = model_.step_count();
    be.begin_capture();
    try {
      std::forward<Step>(step)();
    } catch (...) {  // nothing captured ran: the host's counts are as before
      be.abandon_capture();
      // A pass the error abandoned leaves the model refusing to restore its count (it says so at its next use):
      // the capture's own error is the one to report.
      try {
        model_access::restore_step_count(model_, before);
      } catch (...) {
      }
      throw;
    }
    graph_ = be.end_capture();
    model_access::restore_step_count(model_, before);  // the captured step did not run
  }

  /// One step: the captured calls issued again, once every stream has run what came before. Returns its report (the
  /// decision its inspection made on the device; see the top of this header).
  grad::step_report replay() {
    optim::detail::replay_access::before(opt_);
    model_.backend().replay(graph_);
    model_access::restore_step_count(model_, model_.step_count() + 1);
    return optim::detail::replay_access::after(opt_);
  }

  /// The calls captured (kernels, copies, event records and waits, host functions, collectives).
  std::size_t size() const noexcept { return graph_.size(); }

 private:
  void refuse_what_cannot_be_captured() const {
    const model_options& o = model_.options();
    const auto why = [](const char* what, const char* because) {
      detail::fail_usage("step_graph: ", what, " cannot be captured: ", because);
    };
    if (o.accumulation.micro_batches > 1 && o.accumulation.sync == grad_sync::last_micro_batch)
      why("no-sync accumulation (model_options::accumulation with grad_sync::last_micro_batch)",
          "its fp32 accumulators are taken and given back each step, which a captured step may not do");
    if (o.check_views)
      why("model_options::check_views", "it marks views stale from the host as the streams pass each release");
    if (o.check_collectives)
      why("model_options::check_collectives", "the ranks compare each collective on the host before it is issued");
    for (std::size_t u = 0; u < model_.size(); ++u)
      if (model_.unit_offload(u).host_step())
        detail::fail_usage("step_graph: unit '", model_.unit(u).name(), "' (index ", u,
                           ") cannot be captured: it offloads its params, grads and optimizer state, so its optimizer "
                           "step runs on the host with a rule made there each step; keep one of them on the device");
  }

  ModelT& model_;
  Optimizer& opt_;
  typename backend_type::graph graph_;
};

/// `fsdp::step_graph g(model, opt, step)` for a Model and any optimizer over it.
template <class ModelT, class Optimizer, class Step>
step_graph(ModelT&, Optimizer&, Step&&) -> step_graph<ModelT, Optimizer>;

}  // namespace fsdp
