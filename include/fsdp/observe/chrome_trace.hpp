#pragma once
// The recorder's events as a Chrome-trace JSON timeline (the "JSON object format" that Perfetto and
// chrome://tracing open). One process per rank, four threads per process:
//   compute     one complete event per unit per pass ("h.0 forward"), and the optimizer step
//   all_gather  one complete event per all-gather, from its start on the stream to its end
//   reduce      one complete event per reduce-scatter / all-reduce (with the accumulation into the shard)
//   scheduler   instant events where the host issued a collective or released a unit
// and a counter track "memory" with the bytes of every category after each change.
// Needs nlohmann-json (Bazel target //:chrome_trace).
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/observe/trace.hpp"

namespace fsdp::trace {

namespace detail {
enum tid : int { compute = 0, all_gather = 1, reduce = 2, scheduler = 3 };
inline double us(std::int64_t ns) { return double(ns) / 1000.0; }
}  // namespace detail

/// How a trace names its processes: `process` followed by the rank ("rank 0"; "predicted rank 0" for a timeline
/// plan's events), at process id rank + pid_offset, so that a measured and a predicted trace can share one file.
struct chrome_options {
  std::string process = "rank ";
  int pid_offset = 0;
};

/// Events (a recorder's, or the timeline planner's prediction, fsdp/plan/timeline.hpp) as a JSON trace value.
inline nlohmann::json chrome_trace_json(const std::vector<event>& events, const std::vector<std::string>& names,
                                        const std::vector<memory_sample>& memory = {}, const chrome_options& o = {}) {
  using nlohmann::json;
  using namespace detail;
  // A Model's unit names are UTF-8 (make_units checks them); names set on a recorder by hand are written in
  // printable form, so that the JSON is always valid.
  auto unit_name = [&](int u) -> std::string {
    if (u < 0) return "-";
    return std::size_t(u) < names.size() ? fsdp::detail::printable(names[std::size_t(u)]) : "unit " + std::to_string(u);
  };
  json out = json::array();
  std::vector<int> ranks;
  for (const auto& e : events)
    if (std::find(ranks.begin(), ranks.end(), e.rank) == ranks.end()) ranks.push_back(e.rank);
  for (const auto& m : memory)
    if (std::find(ranks.begin(), ranks.end(), m.rank) == ranks.end()) ranks.push_back(m.rank);
  std::sort(ranks.begin(), ranks.end());

  for (int r : ranks) {
    const int pid = r + o.pid_offset;
    out.push_back(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", o.process + std::to_string(r)}}}});
    out.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    const char* threads[] = {"compute", "all_gather", "reduce", "scheduler"};
    for (int t = 0; t < 4; ++t)
      out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", t}, {"args", {{"name", threads[t]}}}});

    // Each stream runs in order: a begin pairs with the next end of its lane; the n-th issue of a lane's
    // collective pairs with its n-th begin.
    std::vector<event> open_compute, gather_issues, reduce_issues, gather_begins, reduce_begins;
    std::size_t gi = 0, ri = 0;
    std::vector<std::size_t> gather_slices;  // where the n-th gather's slice is in `out`
    for (const auto& e : events) {
      if (e.rank != r) continue;
      const double ts = us(e.t_ns);
      auto complete = [&](const event& b, int tid, std::string name, std::string cat, json args) {
        args["step"] = b.step;
        out.push_back({{"ph", "X"}, {"name", std::move(name)}, {"cat", std::move(cat)}, {"pid", pid}, {"tid", tid},
                       {"ts", us(b.t_ns)}, {"dur", us(e.t_ns - b.t_ns)}, {"args", std::move(args)}});
      };
      switch (e.what) {
        case kind::compute_begin:
        case kind::optimizer_begin: open_compute.push_back(e); break;
        case kind::compute_end:
        case kind::optimizer_end:
          if (!open_compute.empty()) {
            const event b = open_compute.back();
            open_compute.pop_back();
            if (b.what == kind::optimizer_begin)
              complete(b, compute, "optimizer step", "optimizer", json::object());
            else
              complete(b, compute, unit_name(b.unit) + " " + std::string(name_of(b.pass)), "compute",
                       {{"unit", unit_name(b.unit)}, {"pass", std::string(name_of(b.pass))}});
          }
          break;
        case kind::gather_issued:
        case kind::reduce_issued: {
          const bool g = e.what == kind::gather_issued;
          (g ? gather_issues : reduce_issues).push_back(e);
          const std::string coll(name_of(g ? collective::all_gather : e.coll));
          out.push_back(
              {{"ph", "i"},
               {"s", "t"},
               {"name", "issue " + coll + " " + unit_name(e.unit) + (e.ahead ? " (prefetch)" : "")},
               {"cat", "scheduler"},
               {"pid", pid},
               {"tid", scheduler},
               {"ts", ts},
               {"args", {{"unit", unit_name(e.unit)}, {"bytes", e.bytes}, {"prefetch", e.ahead}, {"step", e.step}}}});
          break;
        }
        case kind::release:
          out.push_back({{"ph", "i"},
                         {"s", "t"},
                         {"name", "release " + unit_name(e.unit)},
                         {"cat", "scheduler"},
                         {"pid", pid},
                         {"tid", scheduler},
                         {"ts", ts},
                         {"args", {{"unit", unit_name(e.unit)}, {"step", e.step}}}});
          break;
        case kind::gather_begin: gather_begins.push_back(e); break;
        case kind::reduce_begin: reduce_begins.push_back(e); break;
        case kind::gather_end:
          if (gi < gather_begins.size()) {
            const event b = gather_begins[gi++];
            gather_slices.push_back(out.size());
            complete(b, all_gather, "all_gather " + unit_name(b.unit), "all_gather",
                     {{"unit", unit_name(b.unit)}, {"bytes", b.bytes}, {"prefetch", false},
                      {"pass", std::string(name_of(b.pass))}});
          }
          break;
        case kind::reduce_end:
          if (ri < reduce_begins.size()) {
            const event b = reduce_begins[ri++];
            complete(b, reduce, std::string(name_of(b.coll)) + " " + unit_name(b.unit), std::string(name_of(b.coll)),
                     {{"unit", unit_name(b.unit)}, {"bytes", b.bytes}});
          }
          break;
      }
    }
    // The n-th gather's issue says whether it was a prefetch (once every event is read: with CUDA-event times a
    // stream event may be recorded before the host's issue of it)
    for (std::size_t n = 0; n < gather_slices.size() && n < gather_issues.size(); ++n)
      out[gather_slices[n]]["args"]["prefetch"] = gather_issues[n].ahead;
  }
  for (const auto& m : memory) {
    json args = json::object();
    for (std::size_t k = 0; k < mem_categories; ++k)
      args[std::string(name_of(static_cast<mem>(k)))] = m.current.bytes[k];
    out.push_back({{"ph", "C"},
                   {"name", "memory (bytes)"},
                   {"pid", m.rank + o.pid_offset},
                   {"ts", us(m.t_ns)},
                   {"args", std::move(args)}});
  }
  return {{"traceEvents", std::move(out)}, {"displayTimeUnit", "ms"}};
}

/// The whole recorder as a JSON trace value.
inline nlohmann::json chrome_trace_json(const recorder& rec, const chrome_options& o = {}) {
  return chrome_trace_json(rec.events(), rec.unit_names(), rec.memory_timeline(), o);
}

inline void write_chrome_trace(const recorder& rec, std::ostream& os) { os << chrome_trace_json(rec).dump() << '\n'; }

/// Writes a JSON trace value to `path`; throws std::runtime_error naming the path when it cannot be written.
inline void write_chrome_trace(const nlohmann::json& trace, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("fsdp: cannot open trace file '" + path + "' for writing");
  f << trace.dump() << '\n';
  f.flush();
  if (!f) throw std::runtime_error("fsdp: writing trace file '" + path + "' failed");
}

/// Writes the recorder's trace to `path` (see above).
inline void write_chrome_trace(const recorder& rec, const std::string& path) {
  write_chrome_trace(chrome_trace_json(rec), path);
}

}  // namespace fsdp::trace
