#pragma once
// Observability: a recorder of what the scheduler did and when, per rank, and summaries computed from it.
//
// Host-side events (issue, release) are recorded when the scheduler makes them; stream-side events (a
// collective beginning and ending, a unit's compute beginning and ending, the optimizer) are stamped when the
// stream reaches them: through the backend's host callbacks (backend::host), or timed with the backend's timing
// marks and recorded when the model synchronizes (backend::cuda: CUDA events; see fsdp/observe/stamp.hpp). Every
// event gets a sequence number from one counter, so the events of a rank are in the order they happened. The
// recorder also keeps the memory timeline by category. One recorder may be shared by every rank of a process
// (thread ranks); it is thread-safe.
//
// Recording costs a lock and a clock read per event (on the CUDA backend, an event record per stream-side event
// and two queries when it is resolved): leave model_options::recorder null when not observing.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/core/unit_state.hpp"

namespace fsdp::trace {

enum class kind : std::uint8_t {
  gather_issued,    ///< host: the unit's all-gather was issued (`ahead`: as a prefetch)
  gather_begin,     ///< all-gather stream: the collective starts
  gather_end,       ///< all-gather stream: the collective is complete
  compute_begin,    ///< compute stream: the unit becomes current (the user's work for it starts)
  compute_end,      ///< compute stream: the user's work for the unit is done
  release,          ///< host: the unit's gathered parameters are released
  reduce_issued,    ///< host: the unit's gradient reduction was issued
  reduce_begin,     ///< reduce stream: the collective starts
  reduce_end,       ///< reduce stream: the reduced gradient is accumulated into the shard
  optimizer_begin,  ///< compute stream: the optimizer step starts
  optimizer_end,    ///< compute stream: the optimizer step is done
};

/// Whether `k` is recorded by the host at the call (an issue, a release), not by a stream when it gets there.
constexpr bool recorded_by_host(kind k) noexcept {
  return k == kind::gather_issued || k == kind::reduce_issued || k == kind::release;
}

constexpr std::string_view name_of(kind k) noexcept {
  switch (k) {
    case kind::gather_issued: return "gather_issued";
    case kind::gather_begin: return "gather_begin";
    case kind::gather_end: return "gather_end";
    case kind::compute_begin: return "compute_begin";
    case kind::compute_end: return "compute_end";
    case kind::release: return "release";
    case kind::reduce_issued: return "reduce_issued";
    case kind::reduce_begin: return "reduce_begin";
    case kind::reduce_end: return "reduce_end";
    case kind::optimizer_begin: return "optimizer_begin";
    case kind::optimizer_end: return "optimizer_end";
  }
  return "?";
}

struct event {
  std::uint64_t seq = 0;   ///< order of recording, across all ranks
  std::int64_t t_ns = 0;   ///< steady-clock nanoseconds since the recorder was made (its origin())
  int rank = 0;
  kind what = kind::compute_begin;
  pass_kind pass = pass_kind::none;
  int unit = -1;            ///< unit index, -1 for none (optimizer)
  std::uint64_t step = 0;   ///< the model's step counter (1 = first step)
  std::int64_t bytes = 0;   ///< collectives: unsharded bytes moved (as nccl-tests count)
  bool ahead = false;       ///< gather_issued: a prefetch rather than a gather on demand
  collective coll = collective::all_gather;  ///< reduce events: reduce_scatter or all_reduce
};

struct memory_sample {
  std::int64_t t_ns = 0;
  int rank = 0;
  memory_figures current;  ///< every category (and the total) right after the change
};

class recorder {
 public:
  using clock = std::chrono::steady_clock;

  recorder() : t0_(clock::now()) {}
  recorder(const recorder&) = delete;
  recorder& operator=(const recorder&) = delete;

  /// Records `e` as happening now.
  void record(event e) {
    const auto t = clock::now();
    std::lock_guard lk(mu_);
    e.t_ns = since_origin(t);
    e.seq = next_seq_++;
    events_.push_back(e);
  }
  /// Records `e` as having happened `t_ns` nanoseconds after origin(), a time measured elsewhere (a CUDA event
  /// the stamper resolved): only the sequence number is given here, so a caller that records late must record
  /// in time order for `seq` to keep saying the order events happened.
  void record_at(event e, std::int64_t t_ns) {
    std::lock_guard lk(mu_);
    e.t_ns = t_ns;
    e.seq = next_seq_++;
    events_.push_back(e);
  }
  /// The steady-clock time event times count from (t_ns = 0): when the recorder was made.
  clock::time_point origin() const noexcept { return t0_; }
  /// Nanoseconds from origin() to `t` (negative before it).
  std::int64_t since_origin(clock::time_point t) const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - t0_).count();
  }
  void memory(int rank, const memory_figures& current) {
    const auto t = clock::now();
    std::lock_guard lk(mu_);
    memory_.push_back({since_origin(t), rank, current});
  }
  /// Names of the units by index (the same on every rank); the Model sets them.
  void set_unit_names(std::vector<std::string> names) {
    std::lock_guard lk(mu_);
    names_ = std::move(names);
  }

  std::vector<event> events() const {
    std::lock_guard lk(mu_);
    return events_;
  }
  /// One rank's events, in the order they happened.
  std::vector<event> events(int rank) const {
    std::lock_guard lk(mu_);
    std::vector<event> out;
    for (const auto& e : events_)
      if (e.rank == rank) out.push_back(e);
    return out;
  }
  std::vector<memory_sample> memory_timeline() const {
    std::lock_guard lk(mu_);
    return memory_;
  }
  std::vector<std::string> unit_names() const {
    std::lock_guard lk(mu_);
    return names_;
  }
  void clear() {
    std::lock_guard lk(mu_);
    events_.clear();
    memory_.clear();
  }

 private:
  clock::time_point t0_;
  mutable std::mutex mu_;
  std::uint64_t next_seq_ = 0;
  std::vector<event> events_;
  std::vector<memory_sample> memory_;
  std::vector<std::string> names_;
};

/// One collective as it ran: issued on the host, begun and ended on its stream.
struct collective_timing {
  collective coll = collective::all_gather;
  int unit = -1;
  pass_kind pass = pass_kind::none;
  std::int64_t bytes = 0;
  bool ahead = false;
  std::int64_t issued_ns = 0, begin_ns = 0, end_ns = 0;  ///< nanoseconds since the recorder was made
  double seconds() const noexcept { return double(end_ns - begin_ns) * 1e-9; }
};

/// Where one rank's time went in one step.
struct step_summary {
  std::uint64_t step = 0;
  int rank = 0;
  double wall_s = 0;           ///< first to last stream-side event of the step (host-side ones where there are none)
  double compute_s = 0;        ///< union of compute intervals (units and optimizer)
  double comm_s = 0;           ///< union of collective intervals
  double exposed_comm_s = 0;   ///< collective time not covered by compute: what communication adds to the step
  std::vector<collective_timing> collectives;
  double exposed_fraction() const noexcept { return wall_s > 0 ? exposed_comm_s / wall_s : 0.0; }
};

namespace detail {
using interval = std::pair<std::int64_t, std::int64_t>;
inline std::vector<interval> merged(std::vector<interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<interval> out;
  for (const auto& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}
inline std::int64_t length(const std::vector<interval>& v) {
  std::int64_t s = 0;
  for (const auto& i : v) s += i.second - i.first;
  return s;
}
/// Length of a minus b (both merged).
inline std::int64_t uncovered(const std::vector<interval>& a, const std::vector<interval>& b) {
  std::int64_t s = 0;
  std::size_t j = 0;
  for (const auto& i : a) {
    std::int64_t cur = i.first;
    while (j < b.size() && b[j].second <= cur) ++j;
    for (std::size_t k = j; k < b.size() && b[k].first < i.second; ++k) {
      if (b[k].first > cur) s += b[k].first - cur;
      cur = std::max(cur, b[k].second);
      if (cur >= i.second) break;
    }
    if (cur < i.second) s += i.second - cur;
  }
  return s;
}
}  // namespace detail

/// One rank's step as intervals, in the events' nanoseconds: what summarize() reports, and what the timeline
/// planner (fsdp/plan/timeline.hpp) reads from its predicted events, so that a prediction and a measurement are
/// summarised by the same rules.
struct step_intervals {
  /// First and last stream-side event of the step (host-side ones where there are none; 0, 0: no event).
  std::int64_t first_ns = 0, last_ns = 0;
  std::vector<detail::interval> compute;    ///< merged compute intervals (units and optimizer)
  std::vector<detail::interval> comm;       ///< merged collective intervals
  std::vector<collective_timing> collectives;  ///< in issue order
  std::int64_t exposed_ns() const { return detail::uncovered(comm, compute); }
  /// Collective time of unit u not covered by compute (its all-gathers and reductions, merged).
  std::int64_t exposed_ns(int unit) const {
    std::vector<detail::interval> mine;
    for (const auto& c : collectives)
      if (c.unit == unit) mine.emplace_back(c.begin_ns, c.end_ns);
    return detail::uncovered(detail::merged(std::move(mine)), compute);
  }
};

/// The intervals of `step` of `rank` (see summarize()).
inline step_intervals intervals_of(const std::vector<event>& events, int rank, std::uint64_t step) {
  step_intervals s;
  std::vector<detail::interval> compute, comm;
  // The step's span is its stream-side events' (what the device did): a host that runs ahead issues a step long
  // before its streams reach it (20 queued steps made an H200's 17 ms step read 146 ms), so host-side events
  // (issues, releases) bound the span only when there are no stream-side ones.
  std::int64_t lo = INT64_MAX, hi = INT64_MIN, host_lo = INT64_MAX, host_hi = INT64_MIN;
  std::vector<std::int64_t> open_compute;  // the compute stream is in order: a begin pairs with the next end
  // Collectives of one stream run in issue order: pair the n-th issue with the n-th begin and end (whatever the
  // order they were recorded in: a stream time is only as close to the host's as its clock alignment).
  std::vector<collective_timing> gathers, reduces;
  std::vector<std::int64_t> g_begin, g_end, r_begin, r_end;
  for (const auto& e : events) {
    if (e.rank != rank || e.step != step) continue;
    if (recorded_by_host(e.what)) {
      host_lo = std::min(host_lo, e.t_ns);
      host_hi = std::max(host_hi, e.t_ns);
    } else {
      lo = std::min(lo, e.t_ns);
      hi = std::max(hi, e.t_ns);
    }
    switch (e.what) {
      case kind::compute_begin:
      case kind::optimizer_begin: open_compute.push_back(e.t_ns); break;
      case kind::compute_end:
      case kind::optimizer_end:
        if (!open_compute.empty()) {
          compute.emplace_back(open_compute.back(), e.t_ns);
          open_compute.pop_back();
        }
        break;
      case kind::gather_issued:
        gathers.push_back({collective::all_gather, e.unit, e.pass, e.bytes, e.ahead, e.t_ns, 0, 0});
        break;
      case kind::reduce_issued:
        reduces.push_back({e.coll, e.unit, e.pass, e.bytes, false, e.t_ns, 0, 0});
        break;
      case kind::gather_begin: g_begin.push_back(e.t_ns); break;
      case kind::gather_end: g_end.push_back(e.t_ns); break;
      case kind::reduce_begin: r_begin.push_back(e.t_ns); break;
      case kind::reduce_end: r_end.push_back(e.t_ns); break;
      case kind::release: break;
    }
  }
  auto pair = [](std::vector<collective_timing>& v, const std::vector<std::int64_t>& begins,
                 const std::vector<std::int64_t>& ends) {
    v.resize(std::min({v.size(), begins.size(), ends.size()}));
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i].begin_ns = begins[i];
      v[i].end_ns = ends[i];
    }
  };
  pair(gathers, g_begin, g_end);
  pair(reduces, r_begin, r_end);
  for (auto* v : {&gathers, &reduces})
    for (const auto& c : *v) {
      comm.emplace_back(c.begin_ns, c.end_ns);
      s.collectives.push_back(c);
    }
  std::stable_sort(s.collectives.begin(), s.collectives.end(),
                   [](const collective_timing& a, const collective_timing& b) { return a.issued_ns < b.issued_ns; });
  s.compute = detail::merged(std::move(compute));
  s.comm = detail::merged(std::move(comm));
  if (lo <= hi) s.first_ns = lo, s.last_ns = hi;
  else if (host_lo <= host_hi) s.first_ns = host_lo, s.last_ns = host_hi;
  return s;
}

/// Summarises `step` of `rank` from a recorder's events. Needs the step's stream work to have finished and been
/// recorded: call it after model.synchronize() (on a backend with timing marks, backend::cuda, stream-side events
/// enter the recorder there); a begin without its end is ignored.
inline step_summary summarize(const std::vector<event>& events, int rank, std::uint64_t step) {
  const step_intervals i = intervals_of(events, rank, step);
  auto sec = [](std::int64_t ns) { return double(ns) * 1e-9; };
  step_summary s;
  s.step = step;
  s.rank = rank;
  s.wall_s = sec(i.last_ns - i.first_ns);
  s.compute_s = sec(detail::length(i.compute));
  s.comm_s = sec(detail::length(i.comm));
  s.exposed_comm_s = sec(i.exposed_ns());
  s.collectives = i.collectives;
  return s;
}

}  // namespace fsdp::trace
