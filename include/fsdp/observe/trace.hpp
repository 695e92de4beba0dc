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
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/config.hpp"
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
  void record(event e);
  /// Records `e` as having happened `t_ns` nanoseconds after origin(), a time measured elsewhere (a CUDA event
  /// the stamper resolved): only the sequence number is given here, so a caller that records late must record
  /// in time order for `seq` to keep saying the order events happened.
  void record_at(event e, std::int64_t t_ns);
  /// The steady-clock time event times count from (t_ns = 0): when the recorder was made.
  clock::time_point origin() const noexcept { return t0_; }
  /// Nanoseconds from origin() to `t` (negative before it).
  std::int64_t since_origin(clock::time_point t) const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - t0_).count();
  }
  void memory(int rank, const memory_figures& current);
  /// Names of the units by index (the same on every rank); the Model sets them.
  void set_unit_names(std::vector<std::string> names);

  std::vector<event> events() const;
  /// One rank's events, in the order they happened.
  std::vector<event> events(int rank) const;
  std::vector<memory_sample> memory_timeline() const;
  std::vector<std::string> unit_names() const;
  void clear();

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
FSDP_DECL std::vector<interval> merged(std::vector<interval> v);
FSDP_DECL std::int64_t length(const std::vector<interval>& v);
/// Length of a minus b (both merged).
FSDP_DECL std::int64_t uncovered(const std::vector<interval>& a, const std::vector<interval>& b);
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
  std::int64_t exposed_ns(int unit) const;
};

/// The intervals of `step` of `rank` (see summarize()).
FSDP_DECL step_intervals intervals_of(const std::vector<event>& events, int rank, std::uint64_t step);

/// Summarises `step` of `rank` from a recorder's events. Needs the step's stream work to have finished and been
/// recorded: call it after model.synchronize() (on a backend with timing marks, backend::cuda, stream-side events
/// enter the recorder there); a begin without its end is ignored.
FSDP_DECL step_summary summarize(const std::vector<event>& events, int rank, std::uint64_t step);

}  // namespace fsdp::trace

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/observe/trace.ipp"
#endif
