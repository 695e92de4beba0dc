#pragma once
// The step program (fsdp/plan/detail/program.hpp) carried out on a backend and a communicator: the interpreter the unit
// executor drives with the scheduler's decisions, beside the planners' memory and time readings of the same
// program. Each action of the program becomes:
//
//   take / give        a slot of the purpose's ring (detail/exec/step_slots.hpp): the program's ledger picks it, the
//                      ring makes it or waits for the event of its last give; the unit's params / grad point into it
//   buffer             the no-sync accumulator, made (stream-ordered) and freed (release_after)
//   wait / record      the unit's events (unit/detail/unit_buffers.hpp)
//   work               the casts, collectives (on the shard or replicate group: detail/exec/groups.hpp), accumulation,
//                      copies and host functions, and the optimizer's updates at the site the program chose
//                      (detail/exec/update_site.hpp: on the device, at staged copies of host-resident parts, or on the
//                      host)
//   stamp              a trace event (host side: noted now; stream side: where the stream reaches it)
//   views_end          model_options::check_views: the released gather slot filled with NaN, then the unit's
//                      hand-over counted where the stream passes it (fsdp/unit/tensor_view.hpp)
//
// Every buffer has the category, dtype and size fsdp/memory/cost.hpp gives, every cast uses the per-element code
// both backends share, and a memory_error names the unit and what was being made for it (detail/exec/diagnostics.hpp).
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/detail/exec/diagnostics.hpp"
#include "fsdp/detail/exec/groups.hpp"
#include "fsdp/detail/exec/reduction.hpp"
#include "fsdp/detail/exec/step_slots.hpp"
#include "fsdp/detail/exec/transfers.hpp"
#include "fsdp/detail/exec/unit_storage.hpp"
#include "fsdp/detail/exec/update_site.hpp"
#include "fsdp/kernels/host_loops.hpp"
#include "fsdp/kernels/host_pool.hpp"
#include "fsdp/observe/stamp.hpp"
#include "fsdp/plan/detail/program.hpp"

namespace fsdp::detail::exec {

template <Backend B, class C>
class interpreter {
 public:
  using stream = typename B::stream;

  /// Every reference must outlive the interpreter; `prog` is the program that drives it (whose ledgers pick the
  /// slots), `grad_slots` model_options::grad_slots.
  interpreter(B& be, unit_storage<B>& storage, groups<C>& g, diagnostics& diag, trace::stamper<B>& stamp,
              const plan::detail::step_program& prog, int grad_slots)
      : be_(be),
        streams_(streams_of(be)),
        st_(storage),
        g_(g),
        diag_(diag),
        stamp_(stamp),
        prog_(prog),
        slots_(be, prog, grad_slots),
        transfers_(be, storage, g, diag, prog, slots_) {}
  interpreter(const interpreter&) = delete;
  interpreter& operator=(const interpreter&) = delete;

  /// The state slots of a device step over host-resident optimizer state, made again for the program's state count
  /// (the caller synchronized: nothing uses the old ones).
  void remake_state_staging() { slots_.remake_state_staging(); }
  /// The optimizer whose updates the program's optimizer work runs (null between steps: the step's commit, if any,
  /// is behind it then).
  void use_optimizer(optimizer_work<B>* w) noexcept {
    work_ = w;
    if (!w) committed_ = false;
  }

  // ---- the program's actions ----------------------------------------------------------------------------------
  void take(plan::lane l, plan::ring r, sched::slot_ledger::pick p, const plan::buffer_cost& each, std::size_t u) {
    diag_.allocating(u, step_slots<B>::name_of(r), [&] { slots_.take(r, p, each, stream_of(l)); });
    unit_buffers<B>& b = st_.buffers(u);
    if (r == plan::ring::gathered) b.params = slots_.data(r, p.slot);
    if (r == plan::ring::grad) b.grad = slots_.data(r, p.slot);
  }
  void give(plan::lane l, plan::ring r, int slot, std::size_t u) {
    slots_.give(r, slot, stream_of(l));
    unit_buffers<B>& b = st_.buffers(u);
    if (r == plan::ring::gathered) b.params = nullptr;
    if (r == plan::ring::grad) b.grad = nullptr;
  }
  /// The no-sync accumulator (the program's only buffer outside the rings).
  void buffer(plan::lane l, const plan::buffer_cost& c, bool made, std::size_t u) {
    unit_buffers<B>& b = st_.buffers(u);
    if (made) {
      diag_.allocating(u, "the gradient accumulator",
                       [&] { b.accumulator = be_.allocate(c.bytes(), c.category, stream_of(l)); });
    } else {
      be_.release_after(std::move(b.accumulator), stream_of(l));
    }
  }
  void wait(plan::lane l, plan::signal s, std::size_t u) { be_.wait(stream_of(l), event(u, s)); }
  void record(plan::lane l, plan::signal s, std::size_t u) { be_.record(event(u, s), stream_of(l)); }

  void stamp(plan::lane l, trace::kind k, pass_kind pass, std::size_t u, bool ahead = false) {
    if (stamp_.on()) record_stamp(l, k, pass, u, ahead);  // the common case, no recorder, stays inline and cheap
  }

  void views_end(plan::lane l, plan::views v, std::size_t u) {
    unit_buffers<B>& b = st_.buffers(u);
    if (handover_count* h = v == plan::views::params ? b.param_handovers : b.grad_handovers) hand_over(l, v, u, *h);
  }

  void work(plan::lane l, plan::job j, std::size_t u, pass_kind) {
    if (j == plan::job::compute) return;  // the trainer's kernels, issued on the compute stream between enter and leave
    stream& s = stream_of(l);
    switch (j) {
      case plan::job::gather: transfers_.gather(u, s); return;
      case plan::job::widen: transfers_.widen(u, s); return;
      case plan::job::zero_grad: be_.fill_zero(st_.buffers(u).grad, st_.cost(u).grad.bytes(), s); return;
      case plan::job::reduce_collective: transfers_.reduce(u, s); return;
      case plan::job::replica_reduce: transfers_.reduce_across_replicas(u, s); return;
      case plan::job::tensor_reduce: transfers_.reduce_across_tensor(u, s); return;
      case plan::job::commit: commit(s); return;
      case plan::job::add_into_shard:
        if (st_.cost(u).reduce_block)  // a quantized reduction: the received slices dequantized and summed
          transfers_.add_dequantized(u, transfers_.result(u), st_.buffers(u).grad_shard.template as<float>(),
                                     [&](std::int64_t n, const auto& f) { be_.for_each(n, f, s); });
        else
          be_.accumulate(st_.buffers(u).grad_shard.template as<float>(), transfers_.result(u),
                         st_.cost(u).reduce_output.type, transfers_.reduced_count(u), st_.place(u).reduce.postscale, s);
        return;
      case plan::job::optimizer_device: {
        update_site<B> site = update_site<B>::device(be_, staged_.empty() ? nullptr : &staged_);
        optimizer().update(u, site);
        staged_.clear();
        return;
      }
      default: other_work(j, u, s);  // accumulation, casts, and offloading's copies and host functions
    }
  }

 private:
  /// The jobs of gradient accumulation, reduction casts and offloading (off work()'s common path).
  void other_work(plan::job j, std::size_t u, stream& s) {
    const plan::unit_costs& c = st_.cost(u);
    unit_buffers<B>& b = st_.buffers(u);
    const std::int64_t S = c.shard_numel, P = c.padded_numel, f32 = static_cast<std::int64_t>(sizeof(float));
    switch (j) {
      case plan::job::upload_master:
        be_.upload(slot(u, plan::ring::upload), b.master.data(), c.upload.bytes(), s);
        break;
      case plan::job::start_accumulator:  // an exact copy
        be_.convert(b.accumulator.data(), c.accumulator.type, b.grad, c.grad.type, P, 1.0f, s);
        break;
      case plan::job::accumulate:
        be_.accumulate(b.accumulator.template as<float>(), b.grad, c.grad.type, P, 1.0f, s);
        break;
      case plan::job::cast_reduce_input: {
        if (c.reduce_block) {  // a quantized reduction: the source quantized per destination rank
          transfers_.quantize_reduce_input(u, s);
          break;
        }
        dtype t;
        const void* src = transfers_.source(u, &t);
        be_.convert(slot(u, plan::ring::reduce_input), c.reduce_input.type, src, t, P, st_.place(u).reduce.prescale, s);
        break;
      }
      case plan::job::prescale: {
        dtype t;
        void* src = transfers_.source(u, &t);
        be_.convert(src, t, src, t, P, st_.place(u).reduce.prescale, s);
        break;
      }
      case plan::job::download_grad:
        be_.download(slot(u, plan::ring::download), transfers_.result(u), c.download.bytes(), s);
        break;
      case plan::job::host_add:
        if (c.reduce_block) {  // a quantized reduction's slices, dequantized and summed on the host
          transfers_.add_dequantized(u, slot(u, plan::ring::download), b.grad_shard.template as<float>(),
                                     [&](std::int64_t n, const auto& f) {
                                       be_.host_callback(s, [n, f, pool = &pool_] { pool->for_each(n, f); });
                                     });
          break;
        }
        be_.host_callback(s, [shard = b.grad_shard.template as<float>(), from = slot(u, plan::ring::download),
                              t = c.reduce_output.type, n = transfers_.reduced_count(u),
                              post = st_.place(u).reduce.postscale, pool = &pool_] {
          kernels::host_loops::accumulate_with([pool](std::int64_t m, const auto& f) { pool->for_each(m, f); }, shard,
                                               from, t, n, post);
        });
        break;
      case plan::job::optimizer_host: {
        std::vector<std::function<void()>> updates;
        update_site<B> site = update_site<B>::host(updates, pool_);
        optimizer().update(u, site);
        if (optimizer().decided)
          be_.wait(s, *optimizer().decided);  // the decision it reads, in host memory
        else if (committed_)
          be_.wait(s, commit_done_);  // the step's commit, which it follows
        be_.host_callback(s, [updates = std::move(updates)] {
          for (const auto& w : updates) w();
        });
        break;
      }
      case plan::job::stage_master: stage(s, b.master.template as<float>(), slot_f(u, plan::ring::upload), S); break;
      case plan::job::stage_grad:
        stage(s, b.grad_shard.template as<float>(), slot_f(u, plan::ring::stage_grad), S);
        break;
      case plan::job::stage_state: {
        const std::vector<float*> states = optimizer().states(u);
        for (std::size_t k = 0; k < states.size(); ++k)
          stage(s, states[k], slot_f(u, plan::ring::stage_state) + static_cast<std::int64_t>(k) * S, S);
        break;
      }
      case plan::job::unstage_master: be_.download(b.master.data(), slot(u, plan::ring::upload), S * f32, s); break;
      case plan::job::unstage_state: {
        const std::vector<float*> states = optimizer().states(u);
        for (std::size_t k = 0; k < states.size(); ++k)
          be_.download(states[k], slot_f(u, plan::ring::stage_state) + static_cast<std::int64_t>(k) * S, S * f32, s);
        break;
      }
      case plan::job::zero_shard: be_.fill_zero(b.grad_shard.data(), c.grad_shard.bytes(), s); break;
      case plan::job::zero_shard_host:
        be_.host_callback(
            s, [p = b.grad_shard.data(), n = c.grad_shard.bytes()] { std::memset(p, 0, static_cast<std::size_t>(n)); });
        break;
      case plan::job::compute:
      case plan::job::gather:
      case plan::job::widen:
      case plan::job::zero_grad:
      case plan::job::reduce_collective:
      case plan::job::replica_reduce:
      case plan::job::tensor_reduce:
      case plan::job::commit:
      case plan::job::add_into_shard:
      case plan::job::optimizer_device: break;  // work()
    }
  }

  /// The step's commit on `s` (the compute stream, past every reduction): the first element of gradient slot 0
  /// all-reduced over the world, in place (plan::commits: the slot is idle and its value dead; `s` follows every
  /// stream that used it); a host step's updates, which do not follow the compute stream, wait for it too.
  void commit(stream& s) {
    if (!slots_.made(plan::ring::grad, 0))  // Model::step refuses a step without a backward before this
      detail::fail_usage("the step's commit before any gradient slot was made (no backward in the step)");
    void* slot = slots_.data(plan::ring::grad, 0);
    comm::label_next(g_.world(), "(the step's commit)");  // names it in errors
    g_.world().all_reduce(slot, slot, 1, st_.cost(0).grad.type, reduce_op::sum, s);
    for (std::size_t u = 0; u < st_.size() && !committed_; ++u)
      if (st_.offload(u).host_step()) {  // an event only for the updates that need it
        be_.record(commit_done_, s);
        committed_ = true;
      }
  }

  /// A trace event, with a recorder: its bytes and collective from unit u's costs.
  void record_stamp(plan::lane l, trace::kind k, pass_kind pass, std::size_t u, bool ahead) {
    const bool unit = u != plan::detail::step_program::npos;
    const plan::stamp_payload p =
        unit ? plan::payload_of(k, st_.cost(u), transfers_.reduction_kind()) : plan::stamp_payload{};
    const int id = unit ? static_cast<int>(u) : -1;
    if (l == plan::lane::host)
      stamp_.note(k, pass, id, p.bytes, ahead, p.coll);
    else
      stamp_.stamp(be_, stream_of(l), k, pass, id, p.bytes, p.coll);
  }

  /// model_options::check_views: unit u hands its slot over on `l` (see views_end).
  void hand_over(plan::lane l, plan::views v, std::size_t u, handover_count& h) {
    stream& s = stream_of(l);
    if (v == plan::views::params) {  // NaN in the slot first: x * NaN is NaN, in every dtype's rounding
      unit_buffers<B>& b = st_.buffers(u);
      const plan::buffer_cost& g = st_.cost(u).gathered;
      be_.convert(b.params, g.type, b.params, g.type, g.numel, std::numeric_limits<float>::quiet_NaN(), s);
    }
    ++h.issued;
    be_.host_callback(s, [passed = &h.passed] { passed->fetch_add(1, std::memory_order_release); });
  }

  /// The stream of each lane (null: the host lane, and the copy lanes on a backend without copy streams).
  static std::array<stream*, plan::lanes> streams_of(B& be) {
    std::array<stream*, plan::lanes> s{};
    s[static_cast<std::size_t>(plan::lane::compute)] = &be.compute_stream();
    s[static_cast<std::size_t>(plan::lane::gather)] = &be.gather_stream();
    s[static_cast<std::size_t>(plan::lane::reduce)] = &be.reduce_stream();
    if constexpr (OffloadBackend<B>) {
      s[static_cast<std::size_t>(plan::lane::upload)] = &be.upload_stream();
      s[static_cast<std::size_t>(plan::lane::download)] = &be.download_stream();
      s[static_cast<std::size_t>(plan::lane::host_work)] = &be.host_work_stream();
    }
    return s;
  }
  stream& stream_of(plan::lane l) {
    if (stream* s = streams_[static_cast<std::size_t>(l)]) return *s;
    if (l == plan::lane::host) detail::fail_usage("the step program issued work on the host lane, which has no stream");
    // Model allows offloading only on an OffloadBackend
    detail::fail_usage("a copy on a backend without copy streams (it does not model fsdp::OffloadBackend)");
  }

  typename B::event& event(std::size_t u, plan::signal s) {
    unit_buffers<B>& b = st_.buffers(u);
    switch (s) {
      case plan::signal::shard_ready: return b.shard_ready;
      case plan::signal::uploaded: return b.uploaded;
      case plan::signal::gathered: return b.gathered_ev;
      case plan::signal::grad_ready: return b.grad_ready;
      case plan::signal::collected: return b.collected;
      case plan::signal::downloaded: return b.downloaded;
      case plan::signal::reduced: return b.reduced;
      case plan::signal::staged: return b.staged;
      case plan::signal::stepped: return b.stepped;
      case plan::signal::state_saved: return b.state_saved;
    }
    return b.shard_ready;
  }

  void* slot(std::size_t u, plan::ring r) const { return slots_.held(u, r); }
  float* slot_f(std::size_t u, plan::ring r) const { return static_cast<float*>(slot(u, r)); }

  optimizer_work<B>& optimizer() {
    if (!work_) detail::fail_usage("the step program ran an optimizer's update outside an optimizer step");
    return *work_;
  }

  /// A host-resident part's `n` fp32 values to its staging slot `device` on `s`; the device step finds it there.
  void stage(stream& s, float* host, float* device, std::int64_t n) {
    be_.upload(device, host, n * static_cast<std::int64_t>(sizeof(float)), s);
    staged_.add(host, device, n);
  }

  B& be_;
  std::array<stream*, plan::lanes> streams_;
  unit_storage<B>& st_;
  groups<C>& g_;
  diagnostics& diag_;
  trace::stamper<B>& stamp_;
  const plan::detail::step_program& prog_;
  step_slots<B> slots_;  // destroyed before the backend (the executor's member order)
  transfers<B, C> transfers_;
  optimizer_work<B>* work_ = nullptr;  // during an optimizer step
  typename B::event commit_done_;      // recorded after the step's commit
  bool committed_ = false;             // this step's commit recorded commit_done_ (for a host step's update)
  staged_parts staged_;                // a device step over host parts: where the unit's parts are staged
  kernels::host_pool pool_;            // offloading's host functions: the host step and host additions
};

}  // namespace fsdp::detail::exec
