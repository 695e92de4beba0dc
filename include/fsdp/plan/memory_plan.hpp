#pragma once
// Memory planner: the per-rank peak of every memory category, and of their sum, known before the first step.
// It runs the scheduler's own decisions (fsdp/schedule/scheduler.hpp) through a training step on byte counters,
// in the order the model allocates and releases, so every policy (prefetch depth or schedule, gather slots,
// per-unit resharding, recorded order) is planned by the code that schedules it.
//
// What the model allocates, per unit u with padded size P_u and shard size S_u elements:
//   at construction   sharded params S_u * 4 and grads S_u * 4; the optimizer adds states * S_u * 4
//   gather / release  gathered params P_u * compute_bytes
//   backward          comm buffers P_u * reduce_bytes (unsharded gradient) and, while it is reduce-scattered,
//                     S_u * reduce_bytes (its output), both freed when the reduction is issued
#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/schedule/scheduler.hpp"

namespace fsdp {

struct memory_plan_inputs {
  sched::config schedule;
  /// Forward order of the units (indices); empty = index order.
  std::vector<std::size_t> order;
  int optimizer_states = 0;        ///< fp32 values of optimizer state per parameter element (AdamW 2)
  std::int64_t compute_bytes = 4;  ///< bytes per element of gathered parameters
  std::int64_t reduce_bytes = 4;   ///< bytes per element of unsharded gradients
  int micro_batches = 1;           ///< forward + backward passes per optimizer step
};

/// The planner's answer: peak bytes per category and of their sum at any one moment (figures.total).
struct memory_plan {
  memory_figures peak;
  std::vector<std::string> units;
  /// Gathered units held at once at the peak of gathered params.
  int max_units_gathered = 0;

  /// A printable table: one row per category and one for the total at the peak moment.
  std::string table() const {
    std::ostringstream os;
    auto row = [&](std::string_view what, std::int64_t b) {
      os << "  " << std::left << std::setw(18) << what << std::right << std::setw(14) << b << " B  "
         << std::setw(10) << std::fixed << std::setprecision(3) << double(b) / (1024.0 * 1024.0) << " MiB\n";
    };
    os << "planned peak memory per rank (" << units.size() << " units, at most " << max_units_gathered
       << " gathered at once)\n";
    for (std::size_t k = 0; k < mem_categories; ++k) row(name_of(static_cast<mem>(k)), peak.bytes[k]);
    row("total (at once)", peak.total);
    return os.str();
  }
};

namespace plan_detail {
/// A MemoryTracker without locks or listeners, for simulation.
struct counter {
  memory_figures cur, peak;
  void add(mem c, std::int64_t b) {
    cur[c] += b;
    cur.total += b;
    peak[c] = std::max(peak[c], cur[c]);
    peak.total = std::max(peak.total, cur.total);
  }
};
}  // namespace plan_detail

/// Plans one rank's memory for units with these names and layouts (in unit-index order).
inline memory_plan plan_memory(const std::vector<std::string>& names, const std::vector<FlatLayout>& units,
                               const memory_plan_inputs& in) {
  const std::size_t n = units.size();
  if (names.size() != n) detail::fail_usage("memory plan: ", names.size(), " unit names for ", n, " layouts");
  memory_plan out;
  out.units = names;
  if (in.micro_batches < 1) detail::fail_usage("memory plan: micro_batches must be >= 1, got ", in.micro_batches);
  std::vector<std::size_t> order = in.order;
  if (order.empty()) {
    order.resize(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
  }
  if (order.size() != n) detail::fail_usage("memory plan: the order names ", order.size(), " units of ", n);

  plan_detail::counter m;
  for (const auto& u : units) {
    m.add(mem::sharded_params, u.shard_numel() * 4);
    m.add(mem::grads, u.shard_numel() * 4);
  }
  for (const auto& u : units) m.add(mem::optimizer_state, u.shard_numel() * 4 * in.optimizer_states);

  sched::scheduler s(out.units, in.schedule);
  const bool sharded = in.schedule.shards_params;
  int gathered = 0;
  auto exec = [&](sched::op o, std::size_t i, bool) {
    const FlatLayout& l = units[i];
    switch (o) {
      case sched::op::gather:
        m.add(mem::gathered_params, l.padded_numel() * in.compute_bytes);
        out.max_units_gathered = std::max(out.max_units_gathered, ++gathered);
        break;
      case sched::op::release:
        m.add(mem::gathered_params, -l.padded_numel() * in.compute_bytes);
        --gathered;
        break;
      case sched::op::alloc_grad: m.add(mem::comm_buffers, l.padded_numel() * in.reduce_bytes); break;
      case sched::op::reduce:
        if (sharded) {
          m.add(mem::comm_buffers, l.shard_numel() * in.reduce_bytes);
          m.add(mem::comm_buffers, -l.shard_numel() * in.reduce_bytes);
        }
        m.add(mem::comm_buffers, -l.padded_numel() * in.reduce_bytes);
        break;
      case sched::op::wait: break;
    }
  };
  // Two steps: the second starts from the state the first leaves (all sharded after a step's release).
  for (int step = 0; step < 2; ++step) {
    for (int mb = 0; mb < in.micro_batches; ++mb) {
      for (std::size_t p = 0; p < n; ++p) {
        s.enter(pass_kind::forward, order, p, exec);
        s.leave(pass_kind::forward, order, p, exec);
      }
      for (std::size_t p = 0; p < n; ++p) {
        s.enter(pass_kind::backward, order, p, exec);
        s.leave(pass_kind::backward, order, p, exec);
      }
    }
    s.before_step(exec);
  }
  out.peak = m.peak;
  return out;
}

}  // namespace fsdp
