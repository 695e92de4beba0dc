#pragma once
// The data of a unit's gather and reduction within a step: which buffers they read and write (the master or its
// upload; the gradient slot, the no-sync accumulator or the reduce input; the reduce output, or the operand itself
// for an all-reduce in place), and the collectives on the unit's groups (detail/exec/groups.hpp), each compared first
// under model_options::check_collectives (detail/exec/diagnostics.hpp). Which collective each is, with what count and
// dtype, is fsdp/plan/collectives.hpp's (what a Model hands a communicator's connect() too). The interpreter
// (detail/exec/interpreter.hpp) calls them for the step program's gather and reduction work; which slot a unit holds is
// the program's.
#include <cstdint>

#include "fsdp/backend/concept.hpp"
#include "fsdp/detail/exec/diagnostics.hpp"
#include "fsdp/detail/exec/groups.hpp"
#include "fsdp/detail/exec/reduction.hpp"
#include "fsdp/detail/exec/step_slots.hpp"
#include "fsdp/detail/exec/unit_storage.hpp"
#include "fsdp/kernels/elementwise.hpp"
#include "fsdp/kernels/quantize.hpp"
#include "fsdp/plan/collectives.hpp"
#include "fsdp/plan/detail/program.hpp"

namespace fsdp::detail::exec {

template <Backend B, class C>
class transfers {
 public:
  using stream = typename B::stream;

  /// Every reference must outlive this.
  transfers(B& be, unit_storage<B>& storage, groups<C>& g, diagnostics& diag, const plan::detail::step_program& prog,
            const step_slots<B>& slots)
      : be_(be), st_(storage), g_(g), diag_(diag), prog_(prog), slots_(slots) {}

  /// The all-gather of unit u into its gather slot, or into its wire slot when the gather dtype is narrower than the
  /// compute dtype (the program's widen work follows): cast into this rank's slice first when the gather dtype is
  /// not the master's; with a shard group of one rank, the cast alone.
  void gather(std::size_t u, stream& s) {
    const plan::unit_costs& c = st_.cost(u);
    unit_buffers<B>& b = st_.buffers(u);
    const bool experts = st_.layout(u).experts();
    C& group = g_.shard(experts);
    g_.label(diag_.units().name(u), experts);
    const void* master_shard =  // what the gather reads: the master, or its upload
        prog_.held(u, plan::ring::upload) >= 0 ? slots_.held(u, plan::ring::upload) : b.master.data();
    void* out = c.wire ? slots_.held(u, plan::ring::wire) : b.params;
    const dtype wire = c.gather_type(), master = c.master.type;
    const std::int64_t S = c.shard_numel;
    const std::optional<collective_use> use = plan::gather_use(c, st_.facts());  // none: a shard group of one rank
    if (c.gather_block) {  // block-scaled: this rank's values and scales into its slice, then the slices gathered
      const std::int64_t slice_bytes = c.gather_count();
      const int rank = st_.facts().shards_params ? st_.shard_rank(u) : 0;
      auto* slice =
          static_cast<std::uint8_t*>(out) + static_cast<std::size_t>(rank) * static_cast<std::size_t>(slice_bytes);
      kernels::dispatch(wire, [&](auto q) {
        if constexpr (is_scaled(q()))
          be_.for_each(S / c.gather_block,
                       kernels::block_quantize<dtype::f32, q()>{static_cast<const float*>(master_shard), slice, S,
                                                                c.gather_block, slice_bytes},
                       s);
      });
      if (use) {
        diag_.check_next(g_.world(), be_, use->kind, use->count, use->type, u);
        group.all_gather(slice, out, use->count, use->type, s);
      }
      return;
    }
    if (use) {
      diag_.check_next(g_.world(), be_, use->kind, use->count, use->type, u);
      if (wire == master) {
        group.all_gather(master_shard, out, use->count, use->type, s);
      } else {  // cast into this rank's slice, then gather in place
        void* slice = static_cast<char*>(out) +
                      static_cast<std::size_t>(st_.shard_rank(u)) * static_cast<std::size_t>(S) * size_of(wire);
        be_.convert(slice, wire, master_shard, master, S, 1.0f, s);
        group.all_gather(slice, out, use->count, use->type, s);
      }
    } else {  // a shard group of one rank: the master is the full parameter; the gather is its cast
      be_.convert(out, wire, master_shard, master, S, 1.0f, s);
    }
  }

  /// Unit u's gathered parameters widened from its wire slot into its gather slot (exact: every value of a narrower
  /// float type is one of the wider's), or dequantized (a scaled gather: each value times its block's scale).
  void widen(std::size_t u, stream& s) {
    const plan::unit_costs& c = st_.cost(u);
    void* wire = slots_.held(u, plan::ring::wire);
    if (!c.gather_block) {
      be_.convert(st_.buffers(u).params, c.gathered.type, wire, c.wire.type, c.padded_numel, 1.0f, s);
      return;
    }
    kernels::dispatch(c.gathered.type, [&](auto d) {
      kernels::dispatch(c.wire.type, [&](auto q) {
        if constexpr (is_scaled(q()))
          be_.for_each(c.padded_numel,
                       kernels::block_dequantize<d(), q()>{static_cast<const std::uint8_t*>(wire),
                                                           static_cast<lowp::storage_t<d()>*>(st_.buffers(u).params),
                                                           c.shard_numel, c.gather_block, c.gather_count()},
                       s);
      });
    });
  }

  /// The reduction of unit u in its shard group: a reduce-scatter into its reduce output, or (replicated
  /// parameters) an all-reduce in place, or (a quantized reduction) the all_to_all of its quantized slices into its
  /// reduce output.
  void reduce(std::size_t u, stream& s) {
    const plan::unit_costs& c = st_.cost(u);
    const bool experts = st_.layout(u).experts();
    C& group = g_.shard(experts);
    const reduce_op op = st_.place(u).reduce.op;
    g_.label(diag_.units().name(u), experts);
    const collective_use use = plan::reduction_use(c, st_.facts());
    dtype operand_type;
    void* src = operand(u, &operand_type);
    diag_.check_next(g_.world(), be_, use.kind, use.count, use.type, u);
    if (use.kind == collective::reduce_scatter) {
      group.reduce_scatter(src, slots_.held(u, plan::ring::reduce_output), use.count, use.type, op, s);
    } else if (use.kind == collective::all_to_all) {
      if constexpr (AllToAllCollective<C>)
        group.all_to_all(src, slots_.held(u, plan::ring::reduce_output), use.count, use.type, s);
      else  // fsdp/can_implement.hpp refuses the model first
        detail::fail_usage("unit '", diag_.units().name(u),
                           "': a quantized reduction needs a communicator with "
                           "all_to_all (fsdp::AllToAllCollective)");
    } else {
      group.all_reduce(src, src, use.count, use.type, op, s);
    }
  }

  /// A quantized reduction's input: unit u's source (the gradient or the no-sync accumulator), pre-divided where the
  /// division says so, quantized block by block into one slice per destination rank of its reduce input.
  void quantize_reduce_input(std::size_t u, stream& s) {
    const plan::unit_costs& c = st_.cost(u);
    dtype t;
    const void* src = source(u, &t);
    auto* out = static_cast<std::uint8_t*>(slots_.held(u, plan::ring::reduce_input));
    kernels::dispatch(t, [&](auto d) {
      kernels::dispatch(c.reduce_input.type, [&](auto q) {
        if constexpr (is_scaled(q()) && !is_scaled(d()))
          be_.for_each(
              c.padded_numel / c.reduce_block,
              kernels::block_quantize<d(), q()>{static_cast<const lowp::storage_t<d()>*>(src), out, c.shard_numel,
                                                c.reduce_block, c.reduce_count(), st_.place(u).reduce.prescale},
              s);
      });
    });
  }

  /// A quantized reduction's end: the slices in `received` (the reduce output, or its host copy) dequantized,
  /// summed and added into `shard`, unit u's fp32 gradient shard, by run(n, f): f(i) for i < n
  /// (kernels::block_dequantize_sum).
  template <class Run>
  void add_dequantized(std::size_t u, const void* received, float* shard, Run&& run) const {
    const plan::unit_costs& c = st_.cost(u);
    const int ranks = static_cast<int>(c.reduce_output.numel / c.reduce_count());
    const reduce_facts& reduce = st_.place(u).reduce;
    const float premul = reduce.op == reduce_op::avg ? kernels::average_factor<dtype::f32>(ranks) : 1.0f;
    kernels::dispatch(c.reduce_output.type, [&](auto q) {
      if constexpr (is_scaled(q()))
        run(c.shard_numel,
            kernels::block_dequantize_sum<q()>{static_cast<const std::uint8_t*>(received), shard, c.shard_numel,
                                               c.reduce_block, c.reduce_count(), ranks, premul, reduce.postscale});
    });
  }

  /// Hybrid sharding: unit u's reduced shard all-reduced in place across the replicate group (the step program
  /// issues this only with a replicate group of more than one rank, and a reduce output).
  void reduce_across_replicas(std::size_t u, stream& s) {
    const collective_use use = *plan::replica_use(st_.cost(u));
    void* out = slots_.held(u, plan::ring::reduce_output);
    diag_.check_next(g_.world(), be_, use.kind, use.count, use.type, u);
    g_.replicas()->all_reduce(out, out, use.count, use.type, st_.place(u).reduce.op, s);
  }

  /// Unit u's partial gradients (tp::partial_grad: FlatLayout::partial_grad_runs) summed over the tensor group, in
  /// place in its gradient slot, a run at a time.
  void reduce_across_tensor(std::size_t u, stream& s) {
    const plan::unit_costs& c = st_.cost(u);
    comm::label_next(*g_.tensor(), diag_.units().name(u));
    char* grad = static_cast<char*>(st_.buffers(u).grad);
    for (const flat_run& r : st_.layout(u).partial_grad_runs()) {
      const collective_use use = plan::tensor_use(r, c);
      void* p = grad + r.offset * static_cast<std::int64_t>(size_of(use.type));
      diag_.check_next(g_.world(), be_, use.kind, use.count, use.type, u);
      g_.tensor()->all_reduce(p, p, use.count, use.type, reduce_op::sum, s);
    }
  }

  /// A reduction's collective: a reduce-scatter when parameters are sharded, else an all-reduce; an all_to_all when
  /// the reduction is quantized.
  collective reduction_kind() const noexcept { return plan::reduction_of(st_.facts()); }
  /// Elements a reduction leaves this rank: its shard, or (replicated) the whole buffer.
  std::int64_t reduced_count(std::size_t u) const {
    const plan::unit_costs& c = st_.cost(u);
    return st_.facts().shards_params ? c.shard_numel : c.padded_numel;
  }
  /// What a reduction reduces from: the no-sync accumulator while it exists, else the gradient slot.
  void* source(std::size_t u, dtype* t) {
    unit_buffers<B>& b = st_.buffers(u);
    const plan::unit_costs& c = st_.cost(u);
    if (prog_.accumulating(u)) {
      *t = c.accumulator.type;
      return b.accumulator.data();
    }
    *t = c.grad.type;
    return b.grad;
  }
  /// What the collective reads: the reduce input when the source was cast into one, else the source itself.
  void* operand(std::size_t u, dtype* t) {
    if (prog_.held(u, plan::ring::reduce_input) >= 0) {
      *t = st_.cost(u).reduce_input.type;
      return slots_.held(u, plan::ring::reduce_input);
    }
    return source(u, t);
  }
  /// The reduced values: the reduce output (a reduce-scatter), else the operand (an all-reduce in place).
  const void* result(std::size_t u) {
    if (prog_.held(u, plan::ring::reduce_output) >= 0) return slots_.held(u, plan::ring::reduce_output);
    dtype t;
    return operand(u, &t);
  }

 private:
  B& be_;
  unit_storage<B>& st_;
  groups<C>& g_;
  diagnostics& diag_;
  const plan::detail::step_program& prog_;
  const step_slots<B>& slots_;
};

}  // namespace fsdp::detail::exec
