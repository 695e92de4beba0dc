#pragma once
// The units' storage on a backend: each unit's layout, costs (fsdp/memory/cost.hpp), offload facts and buffers
// (unit/detail/unit_buffers.hpp: the master and gradient shards, the events, where its slots are while it holds them),
// and what is done to them outside a step: materialising the master shards from the init rule, the export gather
// of a unit's full parameters, and the hand-over counts of model_options::check_views. What happens within a step
// is the step program's (fsdp/plan/detail/program.hpp), carried out by fsdp/detail/exec/interpreter.hpp.
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/detail/exec/diagnostics.hpp"
#include "fsdp/detail/exec/groups.hpp"
#include "fsdp/detail/exec/reduction.hpp"
#include "fsdp/detail/exec/slot_ring.hpp"
#include "fsdp/init/init.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/cost.hpp"
#include "fsdp/policy/offload.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/spec/placement.hpp"
#include "fsdp/unit/detail/unit_buffers.hpp"
#include "fsdp/unit/tensor_view.hpp"

namespace fsdp::detail::exec {

template <Backend B>
class unit_storage {
 public:
  using stream = typename B::stream;

  /// `layouts` in unit-index order; `places`: this rank's place in the dense and the expert units' shard groups and
  /// their divisions; `unit_offload`: each unit's offload facts (empty: the facts' own for every unit).
  unit_storage(std::vector<FlatLayout> layouts, const unit_places& places, const plan::cost_facts& facts,
               std::vector<offload_facts> unit_offload)
      : layouts_(std::move(layouts)),
        places_(places),
        facts_(facts),
        offload_(std::move(unit_offload)),
        bufs_(layouts_.size()) {
    if (offload_.size() != layouts_.size()) offload_.assign(layouts_.size(), facts_.offload);
    cost_.reserve(layouts_.size());
    for (std::size_t u = 0; u < layouts_.size(); ++u)
      cost_.push_back(plan::costs_of(layouts_[u], plan::for_unit(facts_, offload_, u)));
  }
  unit_storage(const unit_storage&) = delete;
  unit_storage& operator=(const unit_storage&) = delete;

  std::size_t size() const noexcept { return layouts_.size(); }
  const std::vector<FlatLayout>& layouts() const noexcept { return layouts_; }
  const FlatLayout& layout(std::size_t u) const { return layouts_.at(u); }
  const std::vector<plan::unit_costs>& costs() const noexcept { return cost_; }
  const plan::unit_costs& costs(std::size_t u) const { return cost_.at(u); }
  /// Unit u's costs, unchecked (u < size(): the step program's units).
  const plan::unit_costs& cost(std::size_t u) const noexcept { return cost_[u]; }
  const std::vector<offload_facts>& offload() const noexcept { return offload_; }
  const offload_facts& offload(std::size_t u) const { return offload_.at(u); }
  const plan::cost_facts& facts() const noexcept { return facts_; }
  /// Unit u's place: its shard group's rank and its division (an expert unit's or a dense one's).
  const unit_place& place(std::size_t u) const noexcept { return places_.of(layouts_[u].experts()); }
  int shard_rank(std::size_t u) const noexcept { return place(u).shard_rank; }
  unit_buffers<B>& buffers(std::size_t u) { return bufs_[u]; }
  const unit_buffers<B>& buffers(std::size_t u) const { return bufs_.at(u); }

  /// Allocates unit u's master and gradient shards, fills the master with this rank's elements of every parameter
  /// (computed on the host from their global indices: under tensor parallelism, the indices in the global
  /// parameter of this tensor rank's slice, so that every layout of the same global model starts from the same
  /// numbers) and zeroes the gradient shard. `spec`: this rank's (local shapes). `master_serves`: the master is
  /// what compute reads (no gather ever happens); `tensor` and `expert`: this rank's place in its tensor and expert
  /// groups.
  void materialise(B& be, const diagnostics& diag, std::size_t u, const ModelSpec& spec, const init::rule& default_init,
                   bool master_serves, const tensor_coords& tensor, const expert_coords& expert) {
    const plan::unit_costs& c = cost_[u];
    unit_buffers<B>& b = bufs_[u];
    stream& cs = be.compute_stream();
    std::vector<float> staging;  // master dtype: f32
    diag.allocating(u, "the master and gradient shards", [&] {
      b.master = allocate(be, c.master, cs);
      b.grad_shard = allocate(be, c.grad_shard, cs);
      try {
        staging.assign(static_cast<std::size_t>(c.shard_numel), 0.0f);
      } catch (const std::bad_alloc&) {
        throw memory_error(
            detail::cat("could not allocate ", c.shard_numel * std::int64_t{sizeof(float)}, " bytes of host staging"));
      }
    });
    for (const ShardedTensor& v : layouts_[u].shard_views(shard_rank(u))) {
      if (v.empty()) continue;
      const ParamSpec& p = spec.at(v.name);
      const init::rule& rule = p.init ? *p.init : default_init;
      for_each_global_run(
          p.shape, p.tensor, tensor, v.begin, v.local_numel(),
          [&](std::int64_t global, std::int64_t offset, std::int64_t n) {
            init::fill(rule, v.name, static_cast<std::uint64_t>(global), static_cast<std::size_t>(n),
                       staging.data() + v.shard_offset + offset);
          },
          expert_base(p.shape, p.tensor, p.experts, tensor, expert));
    }
    if (c.master.where == domain::host)  // host memory, new: nothing else uses it yet
      std::memcpy(b.master.data(), staging.data(), static_cast<std::size_t>(c.master.bytes()));
    else
      be.upload(b.master.data(), staging.data(), c.master.bytes(), cs);
    be.record(b.shard_ready, cs);
    zero_new(be, b.grad_shard, c.grad_shard, cs);
    be.synchronize(cs);  // staging goes out of scope
    if (master_serves) b.params = b.master.data();
  }

  /// Collective: unit u's full fp32 master (padded flat buffer) on the host of every rank. Allocates one unsharded
  /// fp32 comm buffer for the time of the call (not part of a step's plan).
  template <class C>
  std::vector<float> gather_full(B& be, groups<C>& g, diagnostics& diag, std::size_t u) {
    const plan::unit_costs& c = cost_[u];
    const plan::buffer_cost full{mem::comm_buffers, c.master.type, c.padded_numel};
    std::vector<float> out(static_cast<std::size_t>(c.padded_numel));
    stream& ag = be.gather_stream();
    auto tmp = be.allocate(full.bytes(), full.category, ag);
    be.wait(ag, bufs_[u].shard_ready);
    g.label(diag.units().name(u), layouts_[u].experts());
    if (facts_.shards_params) {
      diag.check_next(g.world(), be, collective::all_gather, c.shard_numel, c.master.type, u);
      const void* from = bufs_[u].master.data();
      if (c.master.where == domain::host) {  // collectives read device memory: the shard into this rank's slice first
        void* slice = static_cast<char*>(tmp.data()) + static_cast<std::size_t>(shard_rank(u)) * c.master.bytes();
        be.copy(slice, from, c.master.bytes(), ag);
        from = slice;
      }
      g.shard(layouts_[u].experts()).all_gather(from, tmp.data(), c.shard_numel, c.master.type, ag);
    } else {
      be.copy(tmp.data(), bufs_[u].master.data(), full.bytes(), ag);
    }
    be.synchronize(ag);  // the watched wait first: a copy to pageable memory cannot be interrupted
    be.download(out.data(), tmp.data(), full.bytes(), ag);
    be.synchronize(ag);
    return out;
  }

  /// model_options::check_views, from now on: each unit's hand-overs of its gathered parameters and of its
  /// gradient are counted (fsdp/unit/tensor_view.hpp), and its views check themselves against them.
  void check_views() {
    if (handovers_) return;
    handovers_.reset(new handover_count[2 * bufs_.size()]);
    for (std::size_t u = 0; u < bufs_.size(); ++u) {
      bufs_[u].param_handovers = &handovers_[2 * u];
      bufs_[u].grad_handovers = &handovers_[2 * u + 1];
    }
  }

 private:
  std::vector<FlatLayout> layouts_;
  unit_places places_;
  plan::cost_facts facts_;
  std::vector<offload_facts> offload_;  // per unit
  std::vector<plan::unit_costs> cost_;
  std::vector<unit_buffers<B>> bufs_;
  std::unique_ptr<handover_count[]> handovers_;  // check_views: per unit, its params' and its gradient's
};

}  // namespace fsdp::detail::exec
