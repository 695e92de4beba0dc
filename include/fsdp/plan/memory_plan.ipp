#pragma once
// The memory planner's definitions (fsdp/plan/memory_plan.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <iomanip>
#include <numeric>
#include <sstream>
#include <string_view>

#include "fsdp/core/error.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"
#include "fsdp/detail/schedule/slot_ledger.hpp"
#include "fsdp/plan/detail/drive.hpp"
#include "fsdp/plan/memory_plan.hpp"

namespace fsdp {

FSDP_DECL std::string memory_plan::table() const {
  std::ostringstream os;
  auto row = [&](std::string_view what, std::int64_t b) {
    os << "  " << std::left << std::setw(18) << what << std::right << std::setw(14) << b << " B  "
       << std::setw(10) << std::fixed << std::setprecision(3) << double(b) / (1024.0 * 1024.0) << " MiB\n";
  };
  os << "planned peak memory per rank (" << units.size() << " units, at most " << max_units_gathered
     << " gathered at once)\n";
  if (!feasible()) os << "  not feasible: " << infeasible << "\n";
  const bool host = host_peak.total > 0;
  if (host) os << "  device\n";
  for (std::size_t k = 0; k < mem_categories; ++k) row(name_of(static_cast<mem>(k)), peak.bytes[k]);
  row("total (at once)", peak.total);
  if (outside_plan_bytes > 0) {
    row("NCCL (measured)", outside_plan_bytes);
    if (outside_plan_connect_bytes > 0) row("  of it, connect", outside_plan_connect_bytes);
    row("total with NCCL", peak.total + outside_plan_bytes);
  }
  if (host) {
    os << "  host (offloaded)\n";
    for (std::size_t k = 0; k < mem_categories; ++k) row(name_of(static_cast<mem>(k)), host_peak.bytes[k]);
    row("total (at once)", host_peak.total);
    os << "  link per step: " << link.to_device << " B to the device, " << link.to_host << " B to the host\n";
  }
  return os.str();
}

namespace detail {
/// A MemoryTracker without locks or listeners per memory domain, for simulation.
struct counter {
  memory_figures cur, peak, host_cur, host_peak;
  void add(const plan::buffer_cost& b, int sign = 1) {
    const bool host = b.where == domain::host;
    memory_figures& c = host ? host_cur : cur;
    memory_figures& p = host ? host_peak : peak;
    const std::int64_t bytes = sign * b.bytes();
    c[b.category] += bytes;
    c.total += bytes;
    p[b.category] = std::max(p[b.category], c[b.category]);
    p.total = std::max(p.total, c.total);
  }
  void sub(const plan::buffer_cost& b) { add(b, -1); }
};

/// The program's memory reading: a slot's bytes count from the take that makes it (for good; a take that makes it
/// larger frees the old and counts the new); the accumulator from its making to its freeing; the copies of the
/// passes count as link bytes.
struct memory_reading {
  counter& m;
  const plan::detail::step_program& prog;
  plan::link_bytes link;
  int gathered = 0, max_gathered = 0;
  std::vector<plan::buffer_cost> made[plan::rings];  // per ring and slot: what it was made as

  void take(plan::lane, plan::ring r, detail::sched::slot_ledger::pick p, const plan::buffer_cost& each, std::size_t) {
    std::vector<plan::buffer_cost>& slots = made[static_cast<std::size_t>(r)];
    const auto i = static_cast<std::size_t>(p.slot);
    if (p.fresh) {
      slots.resize(std::max(slots.size(), i + 1));
      slots[i] = each;
      m.add(each);
    } else if (p.grows) {
      m.sub(slots[i]);
      slots[i] = each;
      m.add(each);
    }
    if (r == plan::ring::gathered) max_gathered = std::max(max_gathered, ++gathered);
  }
  void give(plan::lane, plan::ring r, int, std::size_t) {
    if (r == plan::ring::gathered) --gathered;
  }
  void buffer(plan::lane, const plan::buffer_cost& b, bool made, std::size_t) { m.add(b, made ? 1 : -1); }
  void wait(plan::lane, plan::signal, std::size_t) {}
  void record(plan::lane, plan::signal, std::size_t) {}
  void stamp(plan::lane, trace::kind, pass_kind, std::size_t, bool = false) {}
  void views_end(plan::lane, plan::views, std::size_t) {}
  void work(plan::lane, plan::job j, std::size_t u, pass_kind) {
    if (j == plan::job::upload_master) link.to_device += prog.costs(u).upload.bytes();
    if (j == plan::job::download_grad) link.to_host += prog.costs(u).download.bytes();
  }
};

FSDP_DECL prepared prepare(const std::vector<std::string>& names, const std::vector<FlatLayout>& layouts,
                           const memory_plan_inputs& in, const char* who) {
  const std::size_t n = layouts.size();
  if (names.size() != n) detail::fail_usage(who, ": ", names.size(), " unit names for ", n, " layouts");
  if (in.optimizer_states < 0) detail::fail_usage(who, ": optimizer_states must be >= 0, got ", in.optimizer_states);
  if (in.norm_rows < 0) detail::fail_usage(who, ": norm_rows must be >= 0, got ", in.norm_rows);
  prepared p;
  p.order = in.order;
  if (p.order.empty()) {
    p.order.resize(n);
    std::iota(p.order.begin(), p.order.end(), std::size_t{0});
  }
  if (p.order.size() != n) detail::fail_usage(who, ": the order names ", p.order.size(), " units of ", n);
  p.offload = in.schedule.offload;
  if (p.offload.size() != n) p.offload.assign(n, in.costs.offload);
  p.cost.reserve(n);
  for (std::size_t u = 0; u < n; ++u)
    p.cost.push_back(plan::costs_of(layouts[u], plan::for_unit(in.costs, p.offload, u)));
  return p;
}

FSDP_DECL int shard_group_of(const std::vector<FlatLayout>& layouts, int expert) {
  if (layouts.empty()) return 1;
  for (const FlatLayout& l : layouts)
    if (!l.experts()) return l.world();
  return layouts[0].world() * expert;
}

FSDP_DECL int replicas_of(int world, const std::vector<FlatLayout>& layouts, const plan::cost_facts& facts,
                          int expert) {
  return facts.shards_params ? world / shard_group_of(layouts, expert) : 1;
}

}  // namespace detail

FSDP_DECL memory_plan plan_memory(const std::vector<std::string>& names, const std::vector<FlatLayout>& layouts,
                                  const memory_plan_inputs& in) {
  const detail::prepared p = detail::prepare(names, layouts, in, "memory plan");
  const std::size_t n = layouts.size();
  const std::vector<std::size_t>& order = p.order;
  const std::vector<offload_facts>& offload = p.offload;
  const std::vector<plan::unit_costs>& cost = p.cost;
  const unit_index units(names);
  memory_plan out;
  out.units = names;

  detail::counter m;
  for (const auto& c : cost) {
    m.add(c.master);
    m.add(c.grad_shard);
  }
  for (std::size_t u = 0; u < n; ++u) m.add(plan::optimizer_state_cost(layouts[u], in.optimizer_states, offload[u]));
  m.add(plan::step_block_cost());                    // the optimizer's update count and step rule
  m.add(plan::norm_buffer_cost(n, in.norm_rows));    // an inspecting optimizer's norms and decision
  m.add(plan::decision_copy_cost(n, in.norm_rows));  // and its pinned copy of them

  detail::sched::scheduler s(units, in.schedule);
  // Replicas not known (0): the replica all-reduce works in place, on no memory of its own.
  plan::detail::step_program prog(cost, offload, in.schedule.grad_slots, in.optimizer_states, 0, in.costs.prescales);
  detail::memory_reading r{m, prog, {}, 0, 0, {}};
  // The second step starts from the state the first leaves (all sharded after a step's release), and every later
  // one as the second, but for the slots: the slot ledgers' state (slots, sizes, the order of slots given back)
  // decides which slot each take gets. Steps run until a step leaves the ledgers in a state an earlier step (not
  // the first) left them in: from there the steps repeat ones already counted. A ledger's slots only grow, up to the
  // largest unit's buffer, so that comes within a few steps (most models: the second).
  auto ledgers = [&] {
    std::vector<detail::sched::slot_ledger> l;
    for (std::size_t k = 0; k < plan::rings; ++k) l.push_back(prog.ledger(plan::ring(k)));
    return l;
  };
  std::vector<std::vector<detail::sched::slot_ledger>> seen;
  for (int step = 0;; ++step) {
    if (step >= 1) {  // the state the last step left
      seen.push_back(ledgers());
      if (step >= 2 && std::find(seen.begin(), seen.end() - 1, seen.back()) != seen.end() - 1) break;
    }
    r.link = {};
    const auto short_of = plan::detail::run_step(s, order, prog, r, plan::commits(in.commit_step, in.norm_rows));
    if (short_of) {
      out.infeasible = short_of->message(units);
      out.max_units_gathered = r.max_gathered;
      out.peak = m.peak;
      out.host_peak = m.host_peak;
      return out;
    }
    for (std::size_t u = 0; u < n; ++u)
      r.link += plan::optimizer_link_bytes(cost[u], offload[u], in.optimizer_states, in.norm_rows > 0);
  }
  out.max_units_gathered = r.max_gathered;
  out.link = r.link;
  out.peak = m.peak;
  out.between_steps = m.cur;
  out.host_peak = m.host_peak;
  out.host_between_steps = m.host_cur;
  return out;
}

}  // namespace fsdp
