#pragma once
// The unit executor: carries out the scheduler's decisions (fsdp/schedule/scheduler.hpp) on the units' buffers,
// with a backend and a communicator. It owns the backend and every unit's buffers and events; it decides nothing.
// Every buffer it allocates has the category, dtype and size fsdp/plan/cost.hpp gives (the planner counts the
// same), and every cast uses the per-element code both backends share.
//
// What comes and goes within a step lives in slots it owns (fsdp/exec/slot_ring.hpp): a ring for gathered
// parameters, one for unsharded gradients (model_options::grad_slots before reuse), one each for the reduce input
// and output. A slot is reused only after the stream that takes it has waited for the event recorded where it was
// given back, so device memory within a step is the rings' slots and nothing else, whatever the GPU's lag.
//
//   gather(u)       gather stream: wait for u's "shard ready"; take a gather slot; cast the fp32 master shard into
//                   this rank's slice of it (compute dtype) and all-gather in place; fp32 compute all-gathers from
//                   the master directly; a shard group of one (no_shard) is the cast alone. Records "gathered".
//   wait(u)         compute stream waits for "gathered"
//   release(u)      the gather slot is given back on the compute stream
//   alloc_grad(u)   a grad slot on the compute stream, zeroed: the unsharded gradient in the compute dtype
//   accumulate(u)   no-sync: the gradient is added into u's fp32 accumulator (made on the first micro-batch); the
//                   grad slot is given back on the compute stream
//   reduce(u)       reduce stream, after compute's writes: the source (the gradient, or the accumulator plus the
//                   last gradient) cast to the reduce dtype and pre-divided (or scaled in place), reduce-scattered
//                   (all-reduced when replicated; under hybrid sharding reduce-scattered in the shard group, then
//                   the reduced shard all-reduced in place across the replicate group), added into the fp32
//                   gradient shard with the post-division;
//                   then every slot is given back (and the accumulator freed) on the reduce stream. Records
//                   "reduced".
//
// Offloading (fsdp/offload/offload.hpp; backends that model OffloadBackend):
//   params          gather(u) first copies the host master shard into an upload slot (device) on the upload
//                   stream, after u's "shard ready", and records "uploaded"; the gather stream waits for it, casts
//                   and gathers from the slot and gives the slot back
//   grads           reduce(u) records "collected" on the reduce stream after the collective; the download stream
//                   waits for it, copies the result into a host download slot, gives the reduce slots back, waits
//                   for u's "shard ready" (the last step's reads of the gradient shard) and adds the slot into the
//                   host gradient shard on the host (a host function), then records "reduced" there
//   stage_step(u)   a device optimizer step of unit u with some parts on the host (not all three): the upload
//                   stream waits for u's "shard ready", "reduced" and "state saved", copies the host-resident parts
//                   into staging slots (device, two of each part, plan/cost.hpp's staging_costs; the master's are
//                   the upload ring's) and records "staged", for which the compute stream waits; the optimizer's
//                   kernels then run on the slots
//   unstage_step(u) the download stream waits for compute's "stepped", copies the master and the state back to
//                   the host, gives the slots back and records "state saved" (and "shard ready" for a host master)
//   host_update(u)  the host optimizer step of unit u: a host function on the download stream, after u's
//                   reduction and the master's last write; u's "shard ready" is recorded after it, so u's next
//                   gather waits for u's update alone
//
// The issue of each gather and reduction is a profiler range ("all_gather layers.3", "reduce_scatter layers.3"),
// on a backend with the hook (fsdp/observe/ranges.hpp); the trace stamps go through the model's stamper.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/agree/agree.hpp"
#include "fsdp/backend/concept.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/exec/slot_ring.hpp"
#include "fsdp/init/init.hpp"
#include "fsdp/kernels/host_loops.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/model_options.hpp"
#include "fsdp/observe/ranges.hpp"
#include "fsdp/observe/stamp.hpp"
#include "fsdp/plan/cost.hpp"
#include "fsdp/schedule/scheduler.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/unit/unit_buffers.hpp"
#include "fsdp/unit/unit_index.hpp"

namespace fsdp::exec {

/// How a reduction divides: the collective's op, the factor applied before it (in the cast of its input) and the
/// factor applied after it (while adding into the fp32 gradient shard).
struct reduce_facts {
  reduce_op op = reduce_op::avg;
  float prescale = 1.0f;
  float postscale = 1.0f;
};

/// The reduce facts of a division over `ranks` ranks; usage_error for a pre-division factor that is not > 0.
inline reduce_facts division_facts(const grad_division& d, int ranks) {
  switch (d.how) {
    case grad_division::mode::average: return {reduce_op::avg, 1.0f, 1.0f};
    case grad_division::mode::sum: return {reduce_op::sum, 1.0f, 1.0f};
    case grad_division::mode::pre_post: {
      float f = d.pre_factor;
      if (f == 0.0f) {
        int k = 1;
        while (ranks % k == 0 && ranks / k > k) k *= 2;
        f = static_cast<float>(k);
      }
      if (!(f > 0.0f) || !std::isfinite(f))
        detail::fail_usage("model_options::division.pre_factor must be > 0 (or 0 to pick it), got ", d.pre_factor);
      return {reduce_op::sum, 1.0f / f, f / static_cast<float>(ranks)};
    }
  }
  detail::fail_usage("model_options::division: unknown mode ", static_cast<int>(d.how));
}

template <Backend B, CollectivePolicy C>
class unit_executor {
 public:
  using backend_type = B;
  using stream = typename B::stream;

  /// `units`, `comm` and `stamp` must outlive the executor. `layouts` in unit-index order; `shard_rank`: this
  /// rank's place in the units' shard group; `grad_slots`: gradient slots made before one is reused;
  /// `check_collectives`: model_options::check_collectives; `unit_offload`: each unit's offload facts (empty: the
  /// facts' own for every unit).
  unit_executor(const unit_index& units, C& comm, std::unique_ptr<B> backend, std::vector<FlatLayout> layouts,
                int shard_rank, const plan::cost_facts& facts, const reduce_facts& reduce, int grad_slots,
                trace::stamper<B>& stamp, bool check_collectives = false, std::vector<offload_facts> unit_offload = {})
      : units_(&units), world_(&comm), comm_(&comm), be_(std::move(backend)), layouts_(std::move(layouts)), shard_rank_(shard_rank), facts_(facts),
        reduce_(reduce), stamp_(&stamp), ranges_(units.names()), bufs_(layouts_.size()), check_(check_collectives),
        offload_(std::move(unit_offload)) {
    if (offload_.size() != layouts_.size()) offload_.assign(layouts_.size(), facts_.offload);
    cost_.reserve(layouts_.size());
    for (std::size_t u = 0; u < layouts_.size(); ++u) cost_.push_back(plan::costs_of(layouts_[u], plan::for_unit(facts_, offload_, u)));
    const plan::slot_costs slots = plan::slot_costs_of(cost_);
    gather_ring_ = slot_ring<B>(slots.gathered, 1);
    grad_ring_ = slot_ring<B>(slots.grad, grad_slots);
    in_ring_ = slot_ring<B>(slots.reduce_input, 1);
    out_ring_ = slot_ring<B>(slots.reduce_output, 1);
    upload_ring_ = slot_ring<B>(slots.upload, plan::offload_slots);
    download_ring_ = slot_ring<B>(slots.download, plan::offload_slots);
    if constexpr (OffloadBackend<B>)  // pinned host memory now: pinning may synchronise the device mid-step
      download_ring_.make_all(*be_, be_->download_stream());
    written_on_host_.assign(layouts_.size(), false);
    staged_.assign(layouts_.size(), staged_slots{});
  }
  unit_executor(const unit_executor&) = delete;
  unit_executor& operator=(const unit_executor&) = delete;

  /// Waits for every stream before the buffers go (the compute stream too, when it is asynchronous). Never throws.
  ~unit_executor() { synchronize_quietly(); }

  B& backend() noexcept { return *be_; }
  const B& backend() const noexcept { return *be_; }
  /// The communicator of the units' shard group (the world's unless use_groups() was called).
  C& comm() noexcept { return *comm_; }
  /// Hybrid sharding: gathers and reduce-scatters on `shard` from now on, and each reduce-scattered shard is
  /// all-reduced on `replicate` (null: no replicas). Both must outlive the executor.
  void use_groups(C& shard, C* replicate) {
    comm_ = &shard;
    replicas_ = replicate;
  }
  std::size_t size() const noexcept { return layouts_.size(); }
  const std::vector<FlatLayout>& layouts() const noexcept { return layouts_; }
  const FlatLayout& layout(std::size_t u) const { return layouts_.at(u); }
  const plan::unit_costs& costs(std::size_t u) const { return cost_.at(u); }
  /// The parts unit u keeps in host memory.
  const offload_facts& offload(std::size_t u) const { return offload_.at(u); }
  const plan::cost_facts& facts() const noexcept { return facts_; }
  const unit_buffers<B>& buffers(std::size_t u) const { return bufs_.at(u); }
  int shard_rank() const noexcept { return shard_rank_; }
  /// The profiler ranges of this rank's units (no-ops on a backend without the hook).
  const trace::ranges<B>& ranges() const noexcept { return ranges_; }
  /// model_options::check_views, from now on: released gather slots are filled with NaN, and the units' views
  /// check themselves against the hand-overs of their slots (fsdp/unit/tensor_view.hpp).
  void check_views() {
    if (handovers_) return;
    handovers_.reset(new handover_count[2 * bufs_.size()]);
    for (std::size_t u = 0; u < bufs_.size(); ++u) {
      bufs_[u].param_handovers = &handovers_[2 * u];
      bufs_[u].grad_handovers = &handovers_[2 * u + 1];
    }
  }

  // ---- the scheduler's decisions -----------------------------------------------------------------------------
  void operator()(sched::op o, std::size_t u, bool ahead, pass_kind pass) {
    switch (o) {
      case sched::op::gather: gather(u, ahead, pass); break;
      case sched::op::wait: be_->wait(be_->compute_stream(), bufs_[u].gathered_ev); break;
      case sched::op::release: release(u, pass); break;
      case sched::op::alloc_grad: alloc_grad(u); break;
      case sched::op::accumulate: accumulate(u); break;
      case sched::op::reduce: reduce(u, pass); break;
    }
  }

  // ---- outside the scheduler's decisions ---------------------------------------------------------------------
  /// Allocates unit u's master and gradient shards, fills the master with this rank's elements of every
  /// parameter (computed on the host from their global indices) and zeroes the gradient shard. `master_serves`:
  /// the master is what compute reads (no gather ever happens).
  void materialise(std::size_t u, const ModelSpec& spec, const init::rule& default_init, bool master_serves) {
    const plan::unit_costs& c = cost_[u];
    unit_buffers<B>& b = bufs_[u];
    stream& cs = be_->compute_stream();
    std::vector<float> staging;  // master dtype: f32
    allocating(u, "the master and gradient shards", [&] {
      b.master = allocate(*be_, c.master, cs);
      b.grad_shard = allocate(*be_, c.grad_shard, cs);
      try {
        staging.assign(static_cast<std::size_t>(c.shard_numel), 0.0f);
      } catch (const std::bad_alloc&) {
        throw memory_error(detail::cat("could not allocate ", c.shard_numel * std::int64_t{sizeof(float)},
                                       " bytes of host staging"));
      }
    });
    for (const ShardedTensor& v : layouts_[u].shard_views(shard_rank_)) {
      if (v.empty()) continue;
      const ParamSpec& p = spec.at(v.name);
      init::fill(p.init ? *p.init : default_init, v.name, static_cast<std::uint64_t>(v.begin),
                 static_cast<std::size_t>(v.local_numel()), staging.data() + v.shard_offset);
    }
    if (c.master.where == domain::host)  // host memory, new: nothing else uses it yet
      std::memcpy(b.master.data(), staging.data(), static_cast<std::size_t>(c.master.bytes()));
    else
      be_->upload(b.master.data(), staging.data(), c.master.bytes(), cs);
    be_->record(b.shard_ready, cs);
    zero_new(*be_, b.grad_shard, c.grad_shard, cs);
    be_->synchronize(cs);  // staging goes out of scope
    if (master_serves) b.params = b.master.data();
  }

  /// Compute waits for every unit's reduction.
  void wait_reductions() {
    for (auto& b : bufs_) be_->wait(be_->compute_stream(), b.reduced);
  }
  /// Compute waits for the last host-side writes of offloaded masters and state: host updates and the copies back
  /// of staged device steps (before anything else writes them on compute).
  void wait_copies_back() {
    for (auto& b : bufs_) {
      be_->wait(be_->compute_stream(), b.shard_ready);
      be_->wait(be_->compute_stream(), b.state_saved);
    }
  }
  /// The optimizer wrote every master shard on the compute stream (those host_update() wrote on the host:
  /// there): later gathers wait for this point only.
  void shards_written() {
    for (std::size_t u = 0; u < bufs_.size(); ++u) {
      if (!written_on_host_[u]) be_->record(bufs_[u].shard_ready, be_->compute_stream());
      written_on_host_[u] = false;
    }
  }
  /// Offloaded params, grads and optimizer state: `fn` updates unit u's host shards on the host, in the download
  /// stream's order after u's reduction and the master's last write; u's next gather waits for it alone.
  /// Where a device step finds a unit's parts: the staging slot of each host-resident part (see stage_step).
  class staged_parts {
   public:
    /// The device address of `p`: inside a staged part, the same element of its slot; else `p` itself.
    template <class T>
    T* on_device(T* p) const noexcept {
      for (const part& s : parts_)
        if (p >= s.host && p < s.host + s.numel) return s.device + (p - s.host);
      return p;
    }

   private:
    friend class unit_executor;
    struct part {
      const float* host;
      float* device;
      std::int64_t numel;
    };
    std::vector<part> parts_;
  };

  /// A device optimizer step of unit u whose master, gradient or optimizer state (`states`: the optimizer's state
  /// buffers of u) lives on the host: each host-resident part is copied into a staging slot on the upload stream,
  /// after its last write, and the compute stream waits for the copies. The optimizer issues its kernels on
  /// the compute stream at staged_parts::on_device() of its pointers, then calls unstage_step(u, states).
  staged_parts stage_step(std::size_t u, const std::vector<float*>& states) {
    const offload_facts& o = offload_[u];
    if (!o.any() || o.host_step())
      detail::fail_usage("a staged device step of unit '", units_->name(u),
                         "', but the policy offloads ", o.any() ? "all three parts (the optimizer steps on the host)" : "nothing");
    const plan::staging_costs c = plan::staging_costs_of(cost_[u], o, static_cast<int>(states.size()));
    if (staging_states_ != static_cast<int>(states.size())) {  // the first step: the rings for this optimizer
      const plan::staging_costs slots = plan::staging_slots_of(cost_, offload_, static_cast<int>(states.size()));
      if (staging_states_ >= 0) synchronize();  // another optimizer's state slots: nothing may still use them
      else stage_grad_ = slot_ring<B>(slots.grad, plan::offload_slots);
      stage_state_ = slot_ring<B>(slots.state, plan::offload_slots);
      staging_states_ = static_cast<int>(states.size());
    }
    unit_buffers<B>& b = bufs_[u];
    stream& up = upload_stream();
    be_->wait(up, b.shard_ready);  // the master's last write
    be_->wait(up, b.reduced);      // the gradient's
    be_->wait(up, b.state_saved);  // the state's (the last step's copy back)
    const std::int64_t S = cost_[u].shard_numel;
    staged_parts parts;
    staged_slots& slot = staged_[u];
    auto stage = [&](slot_ring<B>& ring, const char* what, int& taken, const float* host, std::int64_t offset) {
      if (taken < 0) taken = take_slot(ring, u, what, up);
      float* dev = static_cast<float*>(ring.data(taken)) + offset;
      be_->upload(dev, host, S * static_cast<std::int64_t>(sizeof(float)), up);
      parts.parts_.push_back({host, dev, S});
    };
    if (c.master) stage(upload_ring_, "the upload slot", slot.master, b.master.template as<float>(), 0);
    if (c.grad) stage(stage_grad_, "the gradient's staging slot", slot.grad, b.grad_shard.template as<float>(), 0);
    if (c.state)
      for (std::size_t k = 0; k < states.size(); ++k)
        stage(stage_state_, "the optimizer state's staging slot", slot.state, states[k], static_cast<std::int64_t>(k) * S);
    be_->record(b.staged, up);
    be_->wait(be_->compute_stream(), b.staged);
    return parts;
  }

  /// After the kernels of a staged device step of unit u (on the compute stream): the master and the state copied
  /// back to the host on the download stream, the slots given back there. u's next gather waits for the master's
  /// copy ("shard ready"), its next step for the state's ("state saved").
  void unstage_step(std::size_t u, const std::vector<float*>& states) {
    unit_buffers<B>& b = bufs_[u];
    staged_slots& slot = staged_[u];
    stream& dl = download_stream();
    const std::int64_t bytes = cost_[u].shard_numel * static_cast<std::int64_t>(sizeof(float));
    be_->record(b.stepped, be_->compute_stream());
    be_->wait(dl, b.stepped);
    if (slot.master >= 0) {
      be_->download(b.master.data(), upload_ring_.data(slot.master), bytes, dl);
      upload_ring_.give(*be_, slot.master, dl);
    }
    if (slot.grad >= 0) stage_grad_.give(*be_, slot.grad, dl);
    if (slot.state >= 0) {
      for (std::size_t k = 0; k < states.size(); ++k)
        be_->download(states[k], static_cast<char*>(stage_state_.data(slot.state)) + static_cast<std::int64_t>(k) * bytes,
                      bytes, dl);
      stage_state_.give(*be_, slot.state, dl);
      be_->record(b.state_saved, dl);
    }
    if (slot.master >= 0) {
      be_->record(b.shard_ready, dl);
      written_on_host_[u] = true;
    }
    slot = {};
  }

  void host_update(std::size_t u, std::function<void()> fn) {
    if (!offload_[u].host_step())
      detail::fail_usage("a host optimizer update of unit '", units_->name(u),
                         "', but the unit does not offload params, grads and optimizer_state together");
    stream& dl = download_stream();
    be_->wait(dl, bufs_[u].shard_ready);
    be_->wait(dl, bufs_[u].reduced);
    be_->wait(dl, bufs_[u].uploaded);  // a gather since the reduction (a forward before the step) read the master
    be_->host_callback(dl, std::move(fn));
    be_->record(bufs_[u].shard_ready, dl);
    written_on_host_[u] = true;
  }
  /// Every gradient shard set to zero once its pending reduction is done; no-sync accumulators (last written on
  /// the compute stream) freed.
  void zero_grads() {
    stream& cs = be_->compute_stream();
    for (std::size_t u = 0; u < bufs_.size(); ++u) {
      if (cost_[u].grad_shard.where == domain::host) {  // on the host, after the reduction and the step's reads
        stream& dl = download_stream();
        be_->wait(dl, bufs_[u].reduced);
        be_->wait(dl, bufs_[u].shard_ready);
        be_->host_callback(dl, [p = bufs_[u].grad_shard.data(), n = cost_[u].grad_shard.bytes()] {
          std::memset(p, 0, static_cast<std::size_t>(n));
        });
        be_->record(bufs_[u].reduced, dl);  // later readers of the shard (a step) wait for the zeroes
      } else {
        be_->wait(cs, bufs_[u].reduced);
        be_->fill_zero(bufs_[u].grad_shard.data(), cost_[u].grad_shard.bytes(), cs);
      }
      be_->release_after(std::move(bufs_[u].accumulator), cs);
    }
  }
  /// Collective: unit u's full fp32 master (padded flat buffer) on the host of every rank. Allocates one unsharded
  /// fp32 comm buffer for the time of the call (not part of a step's plan).
  std::vector<float> gather_full(std::size_t u) {
    const plan::unit_costs& c = cost_[u];
    const plan::buffer_cost full{mem::comm_buffers, c.master.type, c.padded_numel};
    std::vector<float> out(static_cast<std::size_t>(c.padded_numel));
    stream& ag = be_->gather_stream();
    auto tmp = be_->allocate(full.bytes(), full.category, ag);
    be_->wait(ag, bufs_[u].shard_ready);
    label(u);
    if (facts_.shards_params) {
      check_next(collective::all_gather, c.shard_numel, c.master.type, u);
      const void* from = bufs_[u].master.data();
      if (c.master.where == domain::host) {  // collectives read device memory: the shard into this rank's slice first
        void* slice = static_cast<char*>(tmp.data()) + static_cast<std::size_t>(shard_rank_) * c.master.bytes();
        be_->copy(slice, from, c.master.bytes(), ag);
        from = slice;
      }
      comm_->all_gather(from, tmp.data(), c.shard_numel, c.master.type, ag);
    } else {
      be_->copy(tmp.data(), bufs_[u].master.data(), full.bytes(), ag);
    }
    be_->synchronize(ag);  // the watched wait first: a copy to pageable memory cannot be interrupted
    be_->download(out.data(), tmp.data(), full.bytes(), ag);
    be_->synchronize(ag);
    return out;
  }

  void synchronize() {
    if constexpr (OffloadBackend<B>) be_->synchronize(be_->upload_stream());
    be_->synchronize(be_->gather_stream());
    be_->synchronize(be_->reduce_stream());
    if constexpr (OffloadBackend<B>) be_->synchronize(be_->download_stream());
    be_->synchronize(be_->compute_stream());
  }
  /// synchronize() without throwing (destructors).
  void synchronize_quietly() noexcept {
    if (!be_) return;
    std::vector<stream*> all{&be_->compute_stream(), &be_->gather_stream(), &be_->reduce_stream()};
    if constexpr (OffloadBackend<B>) {
      all.push_back(&be_->upload_stream());
      all.push_back(&be_->download_stream());
    }
    for (stream* s : all) {
      try {
        be_->synchronize(*s);
      } catch (...) {
      }
    }
  }

 private:
  void gather(std::size_t u, bool ahead, pass_kind pass) {
    const plan::unit_costs& c = cost_[u];
    unit_buffers<B>& b = bufs_[u];
    stream& ag = be_->gather_stream();
    const int unit = static_cast<int>(u);
    const typename trace::ranges<B>::scope range(ranges_, *be_, trace::range_kind::all_gather, unit);
    stamp_->note(trace::kind::gather_issued, pass, unit, c.gather_bytes(), ahead);
    const void* master_shard = b.master.data();  // what the gather reads: the master, or its upload
    int up = -1;
    if (c.upload) {  // offloaded params: the host master shard to the device first, on the upload stream
      stream& us = upload_stream();
      be_->wait(us, b.shard_ready);
      up = take_slot(upload_ring_, u, "the upload slot", us);
      be_->upload(upload_ring_.data(up), b.master.data(), c.upload.bytes(), us);
      be_->record(b.uploaded, us);
      be_->wait(ag, b.uploaded);
      master_shard = upload_ring_.data(up);
    } else {
      be_->wait(ag, b.shard_ready);  // the last write of the master shard (initialisation or optimizer step)
    }
    b.gather_slot = take_slot(gather_ring_, u, "the gather slot", ag);  // waits until its last reader has released it
    b.params = gather_ring_.data(b.gather_slot);
    stamp_->stamp(*be_, ag, trace::kind::gather_begin, pass, unit, c.gather_bytes());
    label(u);
    const dtype compute = c.gathered.type, master = c.master.type;
    if (facts_.shards_params) {
      check_next(collective::all_gather, c.shard_numel, compute, u);
      if (compute == master) {
        comm_->all_gather(master_shard, b.params, c.shard_numel, compute, ag);
      } else {  // cast into this rank's slice, then gather in place
        void* slice = static_cast<char*>(b.params) +
                      static_cast<std::size_t>(shard_rank_) * static_cast<std::size_t>(c.shard_numel) * size_of(compute);
        be_->convert(slice, compute, master_shard, master, c.shard_numel, 1.0f, ag);
        comm_->all_gather(slice, b.params, c.shard_numel, compute, ag);
      }
    } else {  // a shard group of one rank: the master is the full parameter; the gather is its cast
      be_->convert(b.params, compute, master_shard, master, c.shard_numel, 1.0f, ag);
    }
    if (up >= 0) upload_ring_.give(*be_, up, ag);
    stamp_->stamp(*be_, ag, trace::kind::gather_end, pass, unit, c.gather_bytes());
    be_->record(b.gathered_ev, ag);
  }

  void release(std::size_t u, pass_kind pass) {
    stamp_->note(trace::kind::release, pass, static_cast<int>(u));
    if (handover_count* h = bufs_[u].param_handovers) {  // check_views: NaN in the slot, then stale views refused
      const plan::buffer_cost& g = cost_[u].gathered;
      be_->convert(bufs_[u].params, g.type, bufs_[u].params, g.type, g.numel, std::numeric_limits<float>::quiet_NaN(),
                   be_->compute_stream());  // x * NaN is NaN, in every dtype's rounding
      hand_over(*h, be_->compute_stream());
    }
    gather_ring_.give(*be_, bufs_[u].gather_slot, be_->compute_stream());
    bufs_[u].gather_slot = -1;
    bufs_[u].params = nullptr;
  }

  void alloc_grad(std::size_t u) {
    stream& cs = be_->compute_stream();
    unit_buffers<B>& b = bufs_[u];
    b.grad_slot = take_slot(grad_ring_, u, "the gradient slot", cs);  // waits until its last reduction has read it
    b.grad = grad_ring_.data(b.grad_slot);
    be_->fill_zero(b.grad, cost_[u].grad.bytes(), cs);
  }

  void accumulate(std::size_t u) {
    stream& cs = be_->compute_stream();
    if (handover_count* h = bufs_[u].grad_handovers) hand_over(*h, cs);  // check_views: the gradient's views end
    add_to_accumulator(u, cs);
    give_grad(u, cs);
  }

  /// The unit's grad slot is free again once `s` reaches this point.
  void give_grad(std::size_t u, stream& s) {
    grad_ring_.give(*be_, bufs_[u].grad_slot, s);
    bufs_[u].grad_slot = -1;
    bufs_[u].grad = nullptr;
  }

  /// accumulator (f32) += grad (compute dtype) on `s`; the first add makes the accumulator (an exact copy).
  void add_to_accumulator(std::size_t u, stream& s) {
    const plan::unit_costs& c = cost_[u];
    unit_buffers<B>& b = bufs_[u];
    if (!b.accumulator) {
      allocating(u, "the gradient accumulator",
                 [&] { b.accumulator = be_->allocate(c.accumulator.bytes(), c.accumulator.category, s); });
      be_->convert(b.accumulator.data(), c.accumulator.type, b.grad, c.grad.type, c.padded_numel, 1.0f, s);
    } else {
      be_->accumulate(b.accumulator.template as<float>(), b.grad, c.grad.type, c.padded_numel, 1.0f, s);
    }
  }

  void reduce(std::size_t u, pass_kind pass) {
    const plan::unit_costs& c = cost_[u];
    unit_buffers<B>& b = bufs_[u];
    stream& rs = be_->reduce_stream();
    const collective kind = facts_.shards_params ? collective::reduce_scatter : collective::all_reduce;
    const int unit = static_cast<int>(u);
    const typename trace::ranges<B>::scope range(
        ranges_, *be_, kind == collective::reduce_scatter ? trace::range_kind::reduce_scatter : trace::range_kind::all_reduce,
        unit);
    stamp_->note(trace::kind::reduce_issued, pass, unit, c.reduce_bytes(), false, kind);
    if (handover_count* h = b.grad_handovers) hand_over(*h, be_->compute_stream());  // check_views: its views end
    be_->record(b.grad_ready, be_->compute_stream());
    be_->wait(rs, b.grad_ready);
    stamp_->stamp(*be_, rs, trace::kind::reduce_begin, pass, unit, c.reduce_bytes(), kind);
    label(u);
    // The source: the gradient, or (no-sync) the accumulator with the last gradient added and its slot given back.
    void* src = b.grad;
    dtype src_type = c.grad.type;
    const bool accumulated = static_cast<bool>(b.accumulator);
    if (accumulated) {
      add_to_accumulator(u, rs);
      give_grad(u, rs);
      src = b.accumulator.data();
      src_type = c.accumulator.type;
    }
    const dtype reduce = c.reduce_output.type;
    int in = -1, out = -1;
    if (c.reduce_input) {  // another dtype: cast (and pre-divide) into the reduce input
      in = take_slot(in_ring_, u, "the reduce input slot", rs);
      be_->convert(in_ring_.data(in), reduce, src, src_type, c.padded_numel, reduce_.prescale, rs);
      src = in_ring_.data(in);
    } else if (reduce_.prescale != 1.0f) {  // same dtype: pre-divide in place
      be_->convert(src, src_type, src, src_type, c.padded_numel, reduce_.prescale, rs);
    }
    float* shard = b.grad_shard.template as<float>();
    check_next(kind, facts_.shards_params ? c.shard_numel : c.padded_numel, reduce, u);
    const void* result = src;  // the reduced values to add into the gradient shard
    const std::int64_t count = facts_.shards_params ? c.shard_numel : c.padded_numel;
    if (facts_.shards_params) {
      out = take_slot(out_ring_, u, "the reduce output slot", rs);
      comm_->reduce_scatter(src, out_ring_.data(out), c.shard_numel, reduce, reduce_.op, rs);
      if (replicas_) {  // hybrid: the shard group's reduced shard, reduced across the replicas in place
        check_next(collective::all_reduce, c.shard_numel, reduce, u);
        replicas_->all_reduce(out_ring_.data(out), out_ring_.data(out), c.shard_numel, reduce, reduce_.op, rs);
      }
      result = out_ring_.data(out);
    } else {
      comm_->all_reduce(src, src, c.padded_numel, reduce, reduce_.op, rs);
    }
    int down = -1;
    stream* gives = &rs;  // where the reduction's slots are given back: the stream that read them last
    if (c.download) {  // offloaded grads: the result to the host, added into the host shard there
      stamp_->stamp(*be_, rs, trace::kind::reduce_end, pass, unit, c.reduce_bytes(), kind);
      be_->record(b.collected, rs);
      stream& dl = download_stream();
      be_->wait(dl, b.collected);
      down = take_slot(download_ring_, u, "the download slot", dl);
      be_->download(download_ring_.data(down), result, c.download.bytes(), dl);
      gives = &dl;
    } else {
      be_->accumulate(shard, result, reduce, count, reduce_.postscale, rs);
      stamp_->stamp(*be_, rs, trace::kind::reduce_end, pass, unit, c.reduce_bytes(), kind);
    }
    // given back in the order fsdp/plan/memory_plan.hpp counts: output, input, then the gradient or the
    // accumulator, then the download slot
    if (out >= 0) out_ring_.give(*be_, out, *gives);
    if (in >= 0) in_ring_.give(*be_, in, *gives);
    if (accumulated) be_->release_after(std::move(b.accumulator), *gives);
    else give_grad(u, *gives);
    if (down >= 0) {
      stream& dl = *gives;
      be_->wait(dl, b.shard_ready);  // the last step read the gradient shard (a device step, on compute)
      be_->host_callback(dl, [shard, from = download_ring_.data(down), reduce, count, post = reduce_.postscale] {
        kernels::host_loops::accumulate(shard, from, reduce, count, post);
      });
      download_ring_.give(*be_, down, dl);
    }
    be_->record(b.reduced, *gives);
  }

  /// model_options::check_views: one more hand-over of `h`'s slot, issued now and passed where `s` reaches it.
  void hand_over(handover_count& h, stream& s) {
    ++h.issued;
    be_->host_callback(s, [passed = &h.passed] { passed->fetch_add(1, std::memory_order_release); });
  }

  /// The copy streams: offloading only, which Model allows only on an OffloadBackend.
  stream& upload_stream() {
    if constexpr (OffloadBackend<B>) return be_->upload_stream();
    else detail::fail_usage("an upload on a backend without copy streams (it does not model fsdp::OffloadBackend)");
  }
  stream& download_stream() {
    if constexpr (OffloadBackend<B>) return be_->download_stream();
    else detail::fail_usage("a download on a backend without copy streams (it does not model fsdp::OffloadBackend)");
  }

  /// Runs fn(); memory that cannot be had inside it (a memory_error from the backend) is reported again naming
  /// unit u, what was being made for it, this rank and the unit's largest parameter.
  template <class F>
  decltype(auto) allocating(std::size_t u, std::string_view what, F&& fn) {
    try {
      return std::forward<F>(fn)();
    } catch (const memory_error& e) {
      const flat_entry* largest = nullptr;
      for (const flat_entry& p : layouts_[u].entries())
        if (!largest || p.numel > largest->numel) largest = &p;
      throw memory_error(detail::cat(
          "could not allocate ", what, " of unit '", units_->name(u), "' on rank ", world_->rank(), ": ",
          detail::unprefixed(e),
          largest ? detail::cat("; the unit's largest parameter is '", largest->name, "' of shape ",
                                detail::shape_text(largest->shape), " (", largest->numel, " elements)")
                  : std::string(),
          ". Shard the model over more ranks, wrap it into smaller units, or make the parameter smaller"));
    }
  }
  int take_slot(slot_ring<B>& ring, std::size_t u, std::string_view what, stream& s) {
    return allocating(u, what, [&] { return ring.take(*be_, s); });
  }

  /// Tells a communicator that keeps one (comm::nccl, comm::mpi) which unit the next collective is for, so that a
  /// timeout names it.
  void label(std::size_t u) {
    if constexpr (requires(C& c) { c.label(std::string_view{}); }) {
      comm_->label(units_->name(u));
      if (replicas_) replicas_->label(units_->name(u));
    }
  }

  /// model_options::check_collectives: the ranks compare the collective about to be issued for unit u (on the
  /// gather stream, which the host waits for) and every rank throws the same usage_error when they differ.
  void check_next(collective kind, std::int64_t count, dtype t, std::size_t u) {
    if (!check_) return;
    fingerprint next;
    next.add("", "the sequence number", std::to_string(checked_++));
    next.add("", "the unit", agree::in_quotes(units_->name(u)));
    next.add("", "the operation", std::string(name_of(kind)));
    next.add("", "the count", std::to_string(count));
    next.add("", "the dtype", std::string(name_of(t)));
    agree::require_agreement(*world_, *be_, next, "the next collective (model_options::check_collectives)",
                             "Every rank must enter the same units in the same order");
  }

  const unit_index* units_;
  C* world_;                 // every rank: what check_next compares over
  C* comm_;                  // the shard group: gathers and reduce-scatters (all-reduces under no_shard)
  C* replicas_ = nullptr;    // the replicate group under hybrid sharding
  std::unique_ptr<B> be_;  // before the buffers: destroyed after them
  std::vector<FlatLayout> layouts_;
  int shard_rank_;
  plan::cost_facts facts_;
  reduce_facts reduce_;
  trace::stamper<B>* stamp_;
  trace::ranges<B> ranges_;
  std::vector<plan::unit_costs> cost_;
  std::vector<unit_buffers<B>> bufs_;
  slot_ring<B> gather_ring_, grad_ring_, in_ring_, out_ring_, upload_ring_,
      download_ring_;  // destroyed first: their memory goes before the backend
  std::vector<bool> written_on_host_;  // per unit: its "shard ready" was recorded off the compute stream in this step
  struct staged_slots {
    int master = -1, grad = -1, state = -1;
  };
  slot_ring<B> stage_grad_, stage_state_;  // a device step's staging (made at the first one; the master's: uploads)
  int staging_states_ = -1;                              // the state count the staging rings were made for
  std::vector<staged_slots> staged_;                     // per unit, between stage_step and unstage_step
  bool check_ = false;
  std::vector<offload_facts> offload_;  // per unit
  std::uint64_t checked_ = 0;  // collectives compared so far (check_collectives)
  std::unique_ptr<handover_count[]> handovers_;  // check_views: per unit, its params' and its gradient's
};

}  // namespace fsdp::exec
