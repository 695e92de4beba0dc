#pragma once
// The timeline planner's definitions (fsdp/plan/timeline.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <array>
#include <iomanip>
#include <sstream>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/core/unit_index.hpp"
#include "fsdp/detail/schedule/scheduler.hpp"
#include "fsdp/plan/collectives.hpp"
#include "fsdp/plan/timeline.hpp"

namespace fsdp {

namespace detail {
/// `ns` as integer nanoseconds; usage_error beyond what an int64 holds (about 292 years), naming `what`.
FSDP_DECL std::int64_t checked_ns(double ns, const char* what) {
  if (!(ns < 9.2e18))
    detail::fail_usage("timeline plan: ", what, " would take ", ns * 1e-9,
                       " s, more than the planner counts in nanoseconds; check the rates in time_model / flops_model");
  return static_cast<std::int64_t>(ns);
}
}  // namespace detail

FSDP_DECL unit_time flops_model::operator()(const FlatLayout& l) const {
  if (!(flops_per_second > 0)) detail::fail_usage("flops_model: flops_per_second must be > 0, got ", flops_per_second);
  if (!(tokens >= 0)) detail::fail_usage("flops_model: tokens must be >= 0, got ", tokens);
  double params = 0;
  for (const flat_entry& e : l.entries())
    if (std::find(lookups.begin(), lookups.end(), e.name) == lookups.end()) params += double(e.numel);
  auto ns = [&](double per) {
    return std::chrono::nanoseconds(
        detail::checked_ns(per * params * tokens / flops_per_second * 1e9, "a unit's compute"));
  };
  return {ns(forward_flops), ns(backward_flops)};
}

FSDP_DECL std::string timeline::critical_path_text() const {
  std::ostringstream os;
  for (const path_step& p : critical_path) {
    std::string what = plan::name_of(p.what);
    if (!p.unit.empty()) what += " " + p.unit;
    if (p.pass != pass_kind::none) what += " " + std::string(fsdp::name_of(p.pass));
    os << "  " << std::left << std::setw(11) << plan::name_of(p.lane) << std::setw(34) << what << std::right
       << std::fixed << std::setprecision(3) << std::setw(10) << double(p.begin_ns) * 1e-6 << " - " << std::setw(10)
       << double(p.end_ns) * 1e-6 << " ms\n";
  }
  return os.str();
}

FSDP_DECL std::string timeline::report() const {
  std::ostringstream os;
  auto ms = [](std::int64_t ns) { return double(ns) * 1e-6; };
  os << std::fixed << std::setprecision(3);
  if (!feasible()) {
    os << "predicted step: not feasible: " << infeasible << "\n";
    return os.str();
  }
  os << "predicted step " << ms(step_ns) << " ms: compute " << ms(compute_ns) << " ms, communication "
     << ms(comm_ns) << " ms, exposed " << ms(exposed_ns) << " ms (" << std::setprecision(1)
     << 100.0 * exposed_fraction() << "% of the step)\n"
     << std::setprecision(3);
  if (commit_ns > 0)
    os << "  the step's commit all_reduce " << ms(commit_ns) << " ms, all exposed (" << std::setprecision(1)
       << 100.0 * double(commit_ns) / double(step_ns) << "% of the step)\n"
       << std::setprecision(3);
  os << "  " << std::left << std::setw(16) << "unit" << std::right << std::setw(14) << "all_gather ms"
     << std::setw(12) << "reduce ms" << std::setw(13) << "exposed ms\n";
  for (const unit_exposure& u : by_unit)
    os << "  " << std::left << std::setw(16) << u.unit << std::right << std::setw(14) << ms(u.gather_ns)
       << std::setw(12) << ms(u.reduce_ns) << std::setw(12) << ms(u.exposed_ns) << "\n";
  os << "critical path:\n" << critical_path_text();
  return os.str();
}

namespace detail {

/// The program's time reading (see the top of the file).
class time_reading {
 public:
  /// A time, and the work that ended there.
  struct at {
    std::int64_t t = 0;
    int node = -1;  ///< -1: none
  };

  time_reading(const plan::detail::step_program& prog, const time_model& tm, const std::vector<FlatLayout>& layouts,
               const plan::cost_facts& facts)
      : prog_(prog), tm_(tm), signal_(prog.size()) {
    const std::size_t n = prog.size();
    shards_ = facts.shards_params;
    commit_bytes_ = static_cast<std::int64_t>(size_of(facts.precision.compute));  // the gradient's dtype
    reduction_ = plan::reduction_of(facts);
    for (std::size_t u = 0; u < n; ++u) {
      const plan::unit_costs& c = prog.costs(u);
      // an expert unit's gathers and reductions: on the expert shard group (its layout's world when sharded, the
      // data-parallel ranks holding the same experts when all-reduced)
      const bool experts = layouts[u].experts() && tm.expert > 1;
      const comm::link_model& link = experts && tm.expert_shard_link ? *tm.expert_shard_link : tm.link;
      const int group = shards_ ? layouts[u].world() : experts ? tm.world / tm.expert : tm.world;
      durations d;
      const std::int64_t S = c.shard_numel, P = c.padded_numel;
      const std::int64_t cs = static_cast<std::int64_t>(size_of(facts.precision.compute));
      const std::int64_t gs = static_cast<std::int64_t>(size_of(c.gather_type()));
      const std::int64_t rs = static_cast<std::int64_t>(size_of(facts.precision.reduce));
      const std::int64_t f = 4;
      const std::int64_t cast_elems = shards_ ? (c.gather_type() != facts.precision.master ? S : 0) : P;
      durations coll{};  // the collective part of each job
      coll[idx(plan::job::gather)] =
          shards_ ? link.duration(collective::all_gather, c.gather_bytes(), group).count() : 0;
      const std::int64_t scales = (c.gather_count() - S) * gs;  // a scaled gather's scale bytes, else 0
      d[idx(plan::job::gather)] = mem(cast_elems * (f + gs) + scales) + coll[idx(plan::job::gather)];
      d[idx(plan::job::widen)] = c.wire ? mem(c.wire.bytes() + P * cs) : 0;  // read the wire, write the views
      d[idx(plan::job::upload_master)] = bytes_over(c.upload.bytes(), tm.pcie_bytes_per_second);
      d[idx(plan::job::zero_grad)] = mem(c.grad.bytes());
      d[idx(plan::job::compute)] = 0;  // per pass: below
      d[idx(plan::job::start_accumulator)] = mem(P * (f + cs));  // read the gradient, write the accumulator
      d[idx(plan::job::accumulate)] = mem(P * (2 * f + cs));
      const std::int64_t src = static_cast<std::int64_t>(size_of(c.accumulator ? c.accumulator.type : c.grad.type));
      // a quantized reduction writes its slices (values and scales) and reads them back after the all_to_all
      const bool quantized = c.reduce_block > 0;
      d[idx(plan::job::cast_reduce_input)] = mem(P * src + (quantized ? c.reduce_input.bytes() : P * rs));
      d[idx(plan::job::prescale)] = mem(P * 2 * src);
      d[idx(plan::job::reduce_collective)] = link.duration(reduction_, c.reduce_bytes(), group).count();
      d[idx(plan::job::replica_reduce)] =
          tm.replica_link.duration(collective::all_reduce, S * rs, prog.replicas()).count();
      d[idx(plan::job::tensor_reduce)] = 0;
      for (const flat_run& r : layouts[u].partial_grad_runs()) {
        const collective_use use = plan::tensor_use(r, c);
        d[idx(plan::job::tensor_reduce)] +=
            tm.tensor_link.duration(use.kind, use.count * std::int64_t(size_of(use.type)), tm.tensor).count();
      }
      coll[idx(plan::job::reduce_collective)] = d[idx(plan::job::reduce_collective)];
      coll[idx(plan::job::replica_reduce)] = d[idx(plan::job::replica_reduce)];
      coll[idx(plan::job::tensor_reduce)] = d[idx(plan::job::tensor_reduce)];
      coll_.push_back(coll);
      const std::int64_t count = shards_ ? S : P;
      const std::int64_t add_bytes = count * 2 * f + (quantized ? c.reduce_output.bytes() : count * rs);
      d[idx(plan::job::add_into_shard)] = mem(add_bytes);
      d[idx(plan::job::download_grad)] = bytes_over(c.download.bytes(), tm.pcie_bytes_per_second);
      d[idx(plan::job::host_add)] = bytes_over(add_bytes, tm.host_bytes_per_second);
      const std::int64_t states = prog.optimizer_states();
      const std::int64_t step_bytes = S * f * (3 + 2 * states);  // read master, grad, states; write master, states
      d[idx(plan::job::optimizer_device)] = mem(step_bytes);
      d[idx(plan::job::optimizer_host)] = bytes_over(step_bytes, tm.host_bytes_per_second);
      d[idx(plan::job::stage_master)] = d[idx(plan::job::unstage_master)] = bytes_over(S * f, tm.pcie_bytes_per_second);
      d[idx(plan::job::stage_grad)] = bytes_over(S * f, tm.pcie_bytes_per_second);
      d[idx(plan::job::stage_state)] = d[idx(plan::job::unstage_state)] =
          bytes_over(S * f * states, tm.pcie_bytes_per_second);
      d[idx(plan::job::zero_shard)] = mem(S * f);
      d[idx(plan::job::zero_shard_host)] = bytes_over(S * f, tm.host_bytes_per_second);
      dur_.push_back(d);
    }
  }

  // ---- the interpreter ---------------------------------------------------------------------------------------
  void take(plan::lane l, plan::ring r, detail::sched::slot_ledger::pick p, const plan::buffer_cost&, std::size_t) {
    std::vector<at>& given = given_[static_cast<std::size_t>(r)];
    if (given.size() <= static_cast<std::size_t>(p.slot)) given.resize(static_cast<std::size_t>(p.slot) + 1);
    if (!p.fresh) advance(lane_of(l), given[static_cast<std::size_t>(p.slot)]);
  }
  void give(plan::lane l, plan::ring r, int slot, std::size_t) {
    std::vector<at>& given = given_[static_cast<std::size_t>(r)];
    if (given.size() <= static_cast<std::size_t>(slot)) given.resize(static_cast<std::size_t>(slot) + 1);
    given[static_cast<std::size_t>(slot)] = lane_of(l);
  }
  void buffer(plan::lane, const plan::buffer_cost&, bool, std::size_t) {}
  void views_end(plan::lane, plan::views, std::size_t) {}
  void wait(plan::lane l, plan::signal s, std::size_t u) {
    advance(lane_of(l), signal_[u][static_cast<std::size_t>(s)]);
  }
  void record(plan::lane l, plan::signal s, std::size_t u) { signal_[u][static_cast<std::size_t>(s)] = lane_of(l); }
  void work(plan::lane l, plan::job j, std::size_t u, pass_kind pass) {
    if (j == plan::job::commit) {  // of no unit: one element over every rank of the world
      commit(l);
      return;
    }
    std::int64_t d = dur_[u][idx(j)];
    if (j == plan::job::compute) {
      const unit_time& ut = tm_.compute[u];
      const bool fwd = pass == pass_kind::forward;
      const std::int64_t tensor_bytes = fwd ? ut.tensor_forward_bytes : ut.tensor_backward_bytes;
      const std::int64_t expert_bytes = fwd ? ut.expert_forward_bytes : ut.expert_backward_bytes;
      d = (fwd ? ut.forward : ut.backward).count();
      if (tensor_bytes > 0) d += tm_.tensor_link.duration(collective::all_reduce, tensor_bytes, tm_.tensor).count();
      if (expert_bytes > 0) d += tm_.expert_link.duration(collective::all_to_all, expert_bytes, tm_.expert).count();
    }
    if (d <= 0) return;
    at& a = lane_of(l);
    std::int64_t begin = a.t;
    int pred = a.node;
    const std::int64_t c = coll_[u][idx(j)];
    at* group = nullptr;  // serial_collectives: every collective, of every group, one at a time in issue order
    if (tm_.serial_collectives && c > 0) group = &link_;
    if (group && group->t - (d - c) > begin) {  // the group's last collective ends first; the cast just before
      begin = group->t - (d - c);
      pred = group->node;
    }
    nodes_.push_back({l, j, u, pass, begin, begin + d, pred});
    a = {begin + d, static_cast<int>(nodes_.size()) - 1};
    if (group) *group = a;
  }
  void stamp(plan::lane l, trace::kind k, pass_kind pass, std::size_t u, bool ahead = false) {
    if (!keep_) return;
    trace::event e;
    e.t_ns = lane_of(l).t - origin_;
    e.seq = events_.size();
    e.what = k;
    e.pass = pass;
    e.unit = u == plan::detail::step_program::npos ? -1 : static_cast<int>(u);
    e.step = 1;
    e.ahead = ahead;
    if (u != plan::detail::step_program::npos) {
      const plan::stamp_payload p = plan::payload_of(k, prog_.costs(u), reduction_);
      e.bytes = p.bytes;
      e.coll = p.coll;
    }
    events_.push_back(e);
  }

  // ---- steps -------------------------------------------------------------------------------------------------
  /// The next step begins where the last one's synchronize ended; `keep`: record its events and critical path.
  void begin_step(bool keep) {
    keep_ = keep;
    origin_ = lane_of(plan::lane::host).t;
    first_node_ = nodes_.size();
  }
  /// The synchronize at the end of a step: every stream and the host meet at the latest.
  at synchronize() {
    at last = lane_[0];
    for (const at& a : lane_)
      if (a.t > last.t) last = a;
    for (at& a : lane_) a = last;
    return last;
  }

  std::int64_t origin() const noexcept { return origin_; }
  /// The last step's commit (0: none, or free).
  std::int64_t commit_ns() const noexcept { return commit_ns_; }
  std::vector<trace::event>& events() noexcept { return events_; }

  /// The chain of work that ended at `last`, first to last, within the kept step.
  std::vector<path_step> path_to(const at& last, const std::vector<std::string>& names) const {
    std::vector<path_step> out;
    for (int i = last.node; i >= 0 && static_cast<std::size_t>(i) >= first_node_;
         i = nodes_[static_cast<std::size_t>(i)].pred) {
      const node& n = nodes_[static_cast<std::size_t>(i)];
      out.push_back({n.lane, n.what, n.unit < names.size() ? names[n.unit] : std::string(), n.pass, n.begin - origin_,
                     n.end - origin_});
    }
    std::reverse(out.begin(), out.end());
    return out;
  }

 private:
  using durations = std::array<std::int64_t, plan::jobs>;
  struct node {
    plan::lane lane;
    plan::job what;
    std::size_t unit;
    pass_kind pass;
    std::int64_t begin, end;
    int pred;  ///< the work whose end this one started after (-1: none)
  };

  static std::size_t idx(plan::job j) noexcept { return static_cast<std::size_t>(j); }
  /// The step's commit on lane `l`: an all-reduce of one element of the gradient's dtype over the world's ranks
  /// (data-parallel x tensor) on time_model::world_link, after the last collective of any group when collectives
  /// are serial.
  void commit(plan::lane l) {
    const std::int64_t d =
        tm_.world_link.duration(collective::all_reduce, commit_bytes_, tm_.world * std::max(1, tm_.tensor)).count();
    if (d <= 0) return;
    at& a = lane_of(l);
    std::int64_t begin = a.t;
    int pred = a.node;
    if (tm_.serial_collectives && link_.t > begin) {
      begin = link_.t;
      pred = link_.node;
    }
    nodes_.push_back({l, plan::job::commit, plan::detail::step_program::npos, pass_kind::none, begin, begin + d, pred});
    commit_ns_ = d;
    a = {begin + d, static_cast<int>(nodes_.size()) - 1};
    if (tm_.serial_collectives) link_ = a;
  }
  static std::int64_t bytes_over(std::int64_t bytes, double per_second) {
    if (per_second <= 0 || bytes <= 0) return 0;
    return detail::checked_ns(double(bytes) / per_second * 1e9, "a copy or memory-bound piece of work");
  }
  std::int64_t mem(std::int64_t bytes) const noexcept { return bytes_over(bytes, tm_.memory_bytes_per_second); }
  at& lane_of(plan::lane l) noexcept { return lane_[static_cast<std::size_t>(l)]; }
  static void advance(at& a, const at& b) noexcept {
    if (b.t > a.t) a = b;
  }

  const plan::detail::step_program& prog_;
  const time_model& tm_;
  bool shards_ = true;
  std::int64_t commit_bytes_ = 4;  ///< the step's commit: one element of the gradient's (compute) dtype
  collective reduction_ = collective::reduce_scatter;  // what a reduction issues (plan::reduction_of)
  std::vector<durations> dur_;
  std::vector<durations> coll_;  ///< the collective part of each duration
  at link_{};  ///< serial_collectives: where the last collective (of any group) ended
  std::array<at, plan::lanes> lane_{};
  std::vector<std::array<at, plan::signals>> signal_;
  std::array<std::vector<at>, plan::rings> given_{};
  std::vector<node> nodes_;
  std::vector<trace::event> events_;
  bool keep_ = false;
  std::int64_t origin_ = 0;
  std::int64_t commit_ns_ = 0;
  std::size_t first_node_ = 0;
};

}  // namespace detail

FSDP_DECL void place_on_cluster(time_model& t, const comm::cluster_links& c, const device_mesh& m) {
  t.world = m.data_parallel();
  t.tensor = m.tensor;
  const auto link_of = [&](mesh_dims dims) { return c.group(mesh::group_size(m, dims), mesh::stride(m, dims)); };
  t.link = link_of(mesh::spans(mesh_group::shard, m.shards > 1));  // a shard group of one: the data-parallel ranks
  t.replica_link = link_of(mesh::spans(mesh_group::replicate, true));
  t.tensor_link = link_of(mesh::spans(mesh_group::tensor, true));
  t.world_link = link_of(mesh::all_dims);
  t.expert = m.expert;
  t.expert_link = link_of(mesh::spans(mesh_group::expert, true));
  t.expert_shard_link.reset();
  if (m.expert > 1) t.expert_shard_link = link_of(mesh::spans(mesh_group::expert_shard, m.shards > 1));
}

FSDP_DECL timeline plan_timeline(const std::vector<std::string>& names, const std::vector<FlatLayout>& layouts,
                              const memory_plan_inputs& in, const time_model& t) {
  const std::size_t n = layouts.size();
  if (t.compute.size() != n)
    detail::fail_usage("timeline plan: time_model::compute has ", t.compute.size(), " entries for ", n,
                       " units; give each unit's forward and backward time in unit-index order (or use flops_model)");
  for (std::size_t u = 0; u < n; ++u)
    if (t.compute[u].forward.count() < 0 || t.compute[u].backward.count() < 0)
      detail::fail_usage("timeline plan: unit '", names[u], "' has a negative compute time");
  const struct {
    const char* name;
    double v;
  } rates[] = {{"link.bytes_per_second", t.link.bytes_per_second},
               {"replica_link.bytes_per_second", t.replica_link.bytes_per_second},
               {"tensor_link.bytes_per_second", t.tensor_link.bytes_per_second},
               {"world_link.bytes_per_second", t.world_link.bytes_per_second},
               {"expert_link.bytes_per_second", t.expert_link.bytes_per_second},
               {"memory_bytes_per_second", t.memory_bytes_per_second},
               {"host_bytes_per_second", t.host_bytes_per_second},
               {"pcie_bytes_per_second", t.pcie_bytes_per_second}};
  for (const auto& r : rates)
    if (!(r.v >= 0)) detail::fail_usage("timeline plan: time_model::", r.name, " must be >= 0 (0: free), got ", r.v);
  if (t.expert_shard_link && !(t.expert_shard_link->bytes_per_second >= 0))
    detail::fail_usage("timeline plan: time_model::expert_shard_link.bytes_per_second must be >= 0 (0: free), got ",
                       t.expert_shard_link->bytes_per_second);
  if (t.expert < 1 || t.world % t.expert != 0)
    detail::fail_usage("timeline plan: time_model::expert is ", t.expert, ", which does not divide the world of ",
                       t.world, " data-parallel ranks; set it to model_options::expert_parallel");
  for (const auto& [name, l] : {std::pair<const char*, const comm::link_model*>{"link", &t.link},
                                {"replica_link", &t.replica_link},
                                {"tensor_link", &t.tensor_link},
                                {"world_link", &t.world_link},
                                {"expert_link", &t.expert_link},
                                {"expert_shard_link", t.expert_shard_link ? &*t.expert_shard_link : &t.link}}) {
    if (l->latency.count() < 0)
      detail::fail_usage("timeline plan: time_model::", name, ".latency must be >= 0, got ", l->latency.count(), " ns");
    if (l->step_latency.count() < 0)
      detail::fail_usage("timeline plan: time_model::", name, ".step_latency must be >= 0, got ",
                         l->step_latency.count(), " ns");
  }
  const int group = detail::shard_group_of(layouts, t.expert);
  if (t.world < 1 || (in.costs.shards_params && t.world % group != 0))
    detail::fail_usage("timeline plan: time_model::world is ", t.world, ", which the shard group of ", group,
                       " ranks (the layouts') does not divide; set it to the data-parallel world size");

  timeline out;
  out.units = names;
  detail::prepared p = detail::prepare(names, layouts, in, "timeline plan");
  const std::vector<std::size_t>& order = p.order;
  const std::vector<plan::unit_costs>& cost = p.cost;

  // comm::link_model::duration converts to integer nanoseconds itself: bound the largest collective first (an
  // all-reduce's factor is below 2)
  std::int64_t largest = 0;
  for (const plan::unit_costs& c : cost) largest = std::max({largest, c.gather_bytes(), c.reduce_bytes()});
  for (const comm::link_model* l : {&t.link, &t.replica_link, t.expert_shard_link ? &*t.expert_shard_link : &t.link})
    if (l->bytes_per_second > 0) detail::checked_ns(2.0 * double(largest) / l->bytes_per_second * 1e9, "a collective");

  const unit_index units(names);
  detail::sched::scheduler s(units, in.schedule);
  plan::detail::step_program prog(cost, p.offload, in.schedule.grad_slots, in.optimizer_states,
                                  detail::replicas_of(t.world, layouts, in.costs, t.expert), in.costs.prescales);
  detail::time_reading r(prog, t, layouts, in.costs);
  detail::time_reading::at end;
  for (int step = 0; step < 2; ++step) {
    r.begin_step(step == 1);
    if (auto short_of = plan::detail::run_step(s, order, prog, r, plan::commits(in.commit_step, in.norm_rows))) {
      out.infeasible = short_of->message(units);
      return out;
    }
    end = r.synchronize();
  }
  out.events = std::move(r.events());
  out.step_ns = end.t - r.origin();
  const trace::step_intervals iv = trace::intervals_of(out.events, 0, 1);
  out.compute_ns = trace::detail::length(iv.compute);
  out.comm_ns = trace::detail::length(iv.comm);
  out.exposed_ns = iv.exposed_ns();
  out.commit_ns = r.commit_ns();
  out.by_unit.resize(n);
  for (std::size_t u = 0; u < n; ++u) {
    out.by_unit[u].unit = names[u];
    out.by_unit[u].exposed_ns = iv.exposed_ns(static_cast<int>(u));
  }
  for (const trace::collective_timing& c : iv.collectives) {
    if (c.unit < 0) continue;
    unit_exposure& e = out.by_unit[static_cast<std::size_t>(c.unit)];
    (c.coll == collective::all_gather ? e.gather_ns : e.reduce_ns) += c.end_ns - c.begin_ns;
  }
  out.critical_path = r.path_to(end, names);
  return out;
}

}  // namespace fsdp
