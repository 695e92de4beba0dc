#pragma once
// The trace recorder's and summaries' definitions (fsdp/observe/trace.hpp): included by that header, or compiled
// once by fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/observe/trace.hpp"

namespace fsdp::trace {

FSDP_DECL void recorder::record(event e) {
  const auto t = clock::now();
  std::lock_guard lk(mu_);
  e.t_ns = since_origin(t);
  e.seq = next_seq_++;
  events_.push_back(e);
}

FSDP_DECL void recorder::record_at(event e, std::int64_t t_ns) {
  std::lock_guard lk(mu_);
  e.t_ns = t_ns;
  e.seq = next_seq_++;
  events_.push_back(e);
}

FSDP_DECL void recorder::memory(int rank, const memory_figures& current) {
  const auto t = clock::now();
  std::lock_guard lk(mu_);
  memory_.push_back({since_origin(t), rank, current});
}

FSDP_DECL void recorder::set_unit_names(std::vector<std::string> names) {
  std::lock_guard lk(mu_);
  names_ = std::move(names);
}

FSDP_DECL std::vector<event> recorder::events() const {
  std::lock_guard lk(mu_);
  return events_;
}

FSDP_DECL std::vector<event> recorder::events(int rank) const {
  std::lock_guard lk(mu_);
  std::vector<event> out;
  for (const auto& e : events_)
    if (e.rank == rank) out.push_back(e);
  return out;
}

FSDP_DECL std::vector<memory_sample> recorder::memory_timeline() const {
  std::lock_guard lk(mu_);
  return memory_;
}

FSDP_DECL std::vector<std::string> recorder::unit_names() const {
  std::lock_guard lk(mu_);
  return names_;
}

FSDP_DECL void recorder::clear() {
  std::lock_guard lk(mu_);
  events_.clear();
  memory_.clear();
}

namespace detail {
FSDP_DECL std::vector<interval> merged(std::vector<interval> v) {
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
FSDP_DECL std::int64_t length(const std::vector<interval>& v) {
  std::int64_t s = 0;
  for (const auto& i : v) s += i.second - i.first;
  return s;
}
FSDP_DECL std::int64_t uncovered(const std::vector<interval>& a, const std::vector<interval>& b) {
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

FSDP_DECL std::int64_t step_intervals::exposed_ns(int unit) const {
  std::vector<detail::interval> mine;
  for (const auto& c : collectives)
    if (c.unit == unit) mine.emplace_back(c.begin_ns, c.end_ns);
  return detail::uncovered(detail::merged(std::move(mine)), compute);
}

FSDP_DECL step_intervals intervals_of(const std::vector<event>& events, int rank, std::uint64_t step) {
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

FSDP_DECL step_summary summarize(const std::vector<event>& events, int rank, std::uint64_t step) {
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
