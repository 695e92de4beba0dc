#pragma once
// The step listing's definitions (fsdp/plan/listing.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <sstream>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"
#include "fsdp/observe/trace.hpp"
#include "fsdp/plan/listing.hpp"

namespace fsdp {

FSDP_DECL std::string step_listing::str(std::string_view unit) const {
  std::size_t only = plan::detail::step_program::npos;
  if (!unit.empty()) {
    for (std::size_t u = 0; u < units.size(); ++u)
      if (units[u] == unit) only = u;
    if (only == plan::detail::step_program::npos) {
      std::string known;
      for (const std::string& n : units) known += (known.empty() ? "" : ", ") + n;
      detail::fail_usage("step_listing: '", unit, "' is not a unit (units: ", known, ")");
    }
  }
  std::ostringstream os;
  if (!infeasible.empty()) {
    os << "the step cannot run: " << infeasible << "\n";
    return os.str();
  }
  os << (unit.empty() ? std::string("every unit") : "unit '" + std::string(unit) + "'")
     << ": one step, per stream, in issue order\n";
  for (std::size_t l = 0; l < plan::lanes; ++l) {
    bool any = false;
    for (const action& a : actions) {
      if (static_cast<std::size_t>(a.lane) != l) continue;
      if (!unit.empty() && a.unit != only) continue;
      if (!any) os << plan::name_of(a.lane) << "\n";
      any = true;
      os << "  " << a.seq << ". " << a.what;
      if (unit.empty() && a.unit != plan::detail::step_program::npos) os << "  [" << units[a.unit] << "]";
      os << "\n";
    }
  }
  return os.str();
}

namespace detail {
/// The listing's interpreter of the program (fsdp/plan/detail/program.hpp's interface).
class listing_reading {
 public:
  /// `replicas_known`: the program knows the replicate group (else its replica all-reduces are marked as hybrid
  /// sharding's only).
  listing_reading(std::vector<step_listing::action>& out, bool replicas_known)
      : out_(out), replicas_known_(replicas_known) {}
  /// Actions are written down only while on.
  void listing(bool on) { on_ = on; }

  void take(plan::lane l, plan::ring r, detail::sched::slot_ledger::pick p, const plan::buffer_cost&, std::size_t u) {
    note(l, u,
         "take " + std::string(plan::name_of(r)) + " slot " + std::to_string(p.slot) +
             (p.fresh   ? " (made)"
              : p.grows ? " (made larger)"
                        : ""));
  }
  void give(plan::lane l, plan::ring r, int slot, std::size_t u) {
    note(l, u, "give " + std::string(plan::name_of(r)) + " slot " + std::to_string(slot));
  }
  void buffer(plan::lane l, const plan::buffer_cost&, bool made, std::size_t u) {
    note(l, u, made ? "make accumulator" : "free accumulator");
  }
  void wait(plan::lane l, plan::signal s, std::size_t u) { note(l, u, "wait " + std::string(plan::name_of(s))); }
  void record(plan::lane l, plan::signal s, std::size_t u) { note(l, u, "record " + std::string(plan::name_of(s))); }
  void work(plan::lane l, plan::job j, std::size_t u, pass_kind pass) {
    std::string what = plan::name_of(j);
    if (pass != pass_kind::none) what += " (" + std::string(name_of(pass)) + ")";
    if (j == plan::job::replica_reduce && !replicas_known_) what += ", hybrid sharding only";
    note(l, u, std::move(what));
  }
  void stamp(plan::lane l, trace::kind k, pass_kind pass, std::size_t u, bool ahead = false) {
    if (l != plan::lane::host) return;  // a stream's stamps mark times, not actions
    std::string what(trace::name_of(k));
    if (pass != pass_kind::none) what += " (" + std::string(name_of(pass)) + (ahead ? ", ahead" : "") + ")";
    note(l, u, std::move(what));
  }
  void views_end(plan::lane l, plan::views v, std::size_t u) {
    note(l, u, v == plan::views::params ? "views of params end" : "views of grad end");
  }

 private:
  void note(plan::lane l, std::size_t u, std::string what) {
    if (on_) out_.push_back({out_.size() + 1, l, u, std::move(what)});
  }
  std::vector<step_listing::action>& out_;
  bool replicas_known_;
  bool on_ = false;
};
}  // namespace detail

FSDP_DECL step_listing list_step(const std::vector<std::string>& names, const std::vector<FlatLayout>& layouts,
                                 const memory_plan_inputs& in, int world, int expert) {
  step_listing out;
  out.units = names;
  const detail::prepared p = detail::prepare(names, layouts, in, "step listing");
  const unit_index units(names);
  detail::sched::scheduler s(units, in.schedule);
  const int group = detail::shard_group_of(layouts, expert);
  if (world < 0 || (world > 0 && world % group != 0))
    detail::fail_usage("step listing: a world of ", world, " ranks, which the shard group of ", group,
                       " ranks (the layouts') does not divide; give the data-parallel world size (0: not known)");
  const int replicas = world == 0 ? 0 : detail::replicas_of(world, layouts, in.costs, expert);
  plan::detail::step_program prog(p.cost, p.offload, in.schedule.grad_slots, in.optimizer_states, replicas,
                                  in.costs.prescales);
  detail::listing_reading r(out.actions, replicas != 0);
  for (int step = 0; step < 2; ++step) {
    r.listing(step == 1);
    if (auto short_of = plan::detail::run_step(s, p.order, prog, r, plan::commits(in.commit_step, in.norm_rows))) {
      out.infeasible = short_of->message(units);
      out.actions.clear();
      return out;
    }
  }
  return out;
}

}  // namespace fsdp
