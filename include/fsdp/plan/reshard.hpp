#pragma once
// Resharding in memory, planned: when a job changes its data-parallel grid without a checkpoint (a replica group
// lost, the survivors continuing as fewer replicas or a larger shard group), which elements of each unit's flat
// buffer every rank of the new grid receives, and from which surviving rank of the old grid. The plan is pure: it
// reads unit sizes and the two grids, touches no memory and no communicator, and is the same on every rank; an
// executor moves a unit's master shard and each optimizer state through it (every buffer laid out like the master
// shard: the same runs).
//
// Ranks are data-parallel ranks (device_mesh::data_parallel_rank: with tensor parallelism every tensor rank plans its
// own slices alike). In a grid of R replicas x S shards, rank r holds shard r % S of every unit, in replica r / S
// (device_mesh's order). A unit's layout does not depend on the grid but for its tail padding (FlatLayout: the same
// offsets, shard_numel(numel, S, align) elements a shard), so element e of a unit is in shard e / shard_numel of
// either grid; elements at or past the unit's numel are padding (zeros) and move nowhere.
//
// The source of a run: the destination itself when it held those elements before (a copy in place, no bytes on a
// link); otherwise the holder in the destination's old replica when it survives (its replica's peer: the rank the
// old grid already paired it with); otherwise the surviving holders take turns by destination rank. Elements that no
// surviving rank holds are lost, and the plan refuses with a sentence naming the unit, the elements and the ranks
// that held them: only a checkpoint has them.
//
// A rank that joins the job (a replacement, holding nothing: plan::newcomer in `joins`) takes each run from the
// surviving holders in turn, as a rank whose old replica lost those elements does.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/layout/flat_layout.hpp"

namespace fsdp::plan {

/// A data-parallel grid: replica groups x ranks of a shard group.
struct shard_grid {
  int replicas = 1, shards = 1;
  int ranks() const noexcept { return replicas * shards; }
  int shard_of(int rank) const noexcept { return rank % shards; }
  int replica_of(int rank) const noexcept { return rank / shards; }
};

/// What a reshard starts from and goes to. `units`: each unit's name and flat elements (FlatLayout::numel: up to
/// the end of its last parameter), the same on both grids; `align`: the layout's alignment. `survivors`: the old
/// ranks that are alive and can send, ascending; `joins`: for each rank of the new grid, in order, the old rank it
/// was (a survivor), or plan::newcomer for a rank that joins the job holding nothing.
inline constexpr int newcomer = -1;

struct reshard_request {
  std::vector<std::string> unit_names;
  std::vector<std::int64_t> unit_numel;
  std::int64_t align = 1;
  shard_grid before, after;
  std::vector<int> survivors, joins;
};

/// Elements [src_offset, src_offset + numel) of unit `unit`'s shard on old rank `from` go to [dst_offset, ...) of its
/// shard on new rank `to`.
struct reshard_run {
  std::size_t unit = 0;
  int from = 0, to = 0;
  std::int64_t src_offset = 0, dst_offset = 0, numel = 0;
  friend bool operator==(const reshard_run&, const reshard_run&) = default;
};

struct reshard_plan {
  /// Every run, by destination rank, then unit, then offset.
  std::vector<reshard_run> runs;
  /// Elements each old rank sends to another rank, and each new rank receives from another rank (a run whose
  /// destination was its own source is a copy in place: in neither).
  std::vector<std::int64_t> sent, received;
  /// Elements a new rank's shard of each unit holds, and of them those past the unit's numel (zeros).
  std::vector<std::int64_t> new_shard_numel;
};

/// The plan, or a usage_error naming what cannot work (a grid that does not match, a survivor or join out of range
/// or twice, elements no survivor holds).
inline reshard_plan make_reshard_plan(const reshard_request& q) {
  std::string lost;  // the elements no survivor holds, by unit
  const shard_grid& a = q.before;
  const shard_grid& b = q.after;
  if (a.replicas < 1 || a.shards < 1 || b.replicas < 1 || b.shards < 1)
    fsdp::detail::fail_usage("reshard: grids need at least one replica and one shard, got ", a.replicas, " x ",
                             a.shards, " and ", b.replicas, " x ", b.shards);
  if (q.unit_names.size() != q.unit_numel.size())
    fsdp::detail::fail_usage("reshard: ", q.unit_names.size(), " unit names for ", q.unit_numel.size(), " unit sizes");
  std::vector<char> alive(static_cast<std::size_t>(a.ranks()), 0);
  for (int r : q.survivors) {
    if (r < 0 || r >= a.ranks())
      fsdp::detail::fail_usage("reshard: survivor ", r, " is not a rank of the old ", a.replicas, " x ", a.shards,
                               " grid");
    if (alive[static_cast<std::size_t>(r)]) fsdp::detail::fail_usage("reshard: survivor ", r, " is listed twice");
    alive[static_cast<std::size_t>(r)] = 1;
  }
  if (static_cast<int>(q.joins.size()) != b.ranks())
    fsdp::detail::fail_usage("reshard: the new ", b.replicas, " x ", b.shards, " grid has ", b.ranks(), " ranks, and ",
                             q.joins.size(), " survivors join it");
  std::vector<char> joined(alive.size(), 0);
  for (int r : q.joins) {
    if (r == newcomer) continue;
    if (r < 0 || r >= a.ranks() || !alive[static_cast<std::size_t>(r)])
      fsdp::detail::fail_usage("reshard: old rank ", r, " joins the new grid but is not a survivor");
    if (joined[static_cast<std::size_t>(r)])
      fsdp::detail::fail_usage("reshard: old rank ", r, " joins the new grid twice");
    joined[static_cast<std::size_t>(r)] = 1;
  }
  reshard_plan out;
  out.sent.assign(alive.size(), 0);
  out.received.assign(static_cast<std::size_t>(b.ranks()), 0);
  for (std::size_t u = 0; u < q.unit_numel.size(); ++u) {
    const std::int64_t n = q.unit_numel[u];
    const std::int64_t so = layout::shard_numel(n, a.shards, q.align), sn = layout::shard_numel(n, b.shards, q.align);
    out.new_shard_numel.push_back(sn);
    // every old shard's elements in this unit, and whether a survivor holds them
    for (int k = 0; k < a.shards; ++k) {
      const std::int64_t first = k * so, last = std::min(n, first + so);
      if (first >= last) continue;
      bool held = false;
      std::string holders;
      for (int r = 0; r < a.replicas; ++r) {
        const int rank = r * a.shards + k;
        held = held || alive[static_cast<std::size_t>(rank)];
        holders += (holders.empty() ? "" : ", ") + std::to_string(rank);
      }
      if (!held)
        lost += fsdp::detail::cat(lost.empty() ? "" : ", ", "[", first, ", ", last, ") of unit '", q.unit_names[u],
                                  "' (held by rank", a.replicas > 1 ? "s " : " ", holders, " only)");
    }
  }
  if (!lost.empty())
    fsdp::detail::fail_usage("reshard: no survivor holds elements ", lost,
                             ": no replica has them (load the last checkpoint)");
  for (int to = 0; to < b.ranks(); ++to) {
    const int self = q.joins[static_cast<std::size_t>(to)];
    for (std::size_t u = 0; u < q.unit_numel.size(); ++u) {
      const std::int64_t n = q.unit_numel[u];
      const std::int64_t so = layout::shard_numel(n, a.shards, q.align), sn = out.new_shard_numel[u];
      const std::int64_t first = b.shard_of(to) * sn, last = std::min(n, first + sn);
      for (std::int64_t e = first; e < last;) {  // one run per old shard the new shard overlaps
        const int k = static_cast<int>(e / so);
        const std::int64_t end = std::min(last, (k + 1) * so);
        std::vector<int> holders;
        for (int r = 0; r < a.replicas; ++r)
          if (alive[static_cast<std::size_t>(r * a.shards + k)]) holders.push_back(r * a.shards + k);
        int from = holders[static_cast<std::size_t>(to) % holders.size()];
        if (self != newcomer) {
          const int peer = a.replica_of(self) * a.shards + k;
          if (a.shard_of(self) == k)
            from = self;
          else if (alive[static_cast<std::size_t>(peer)])
            from = peer;
        }
        out.runs.push_back({u, from, to, e - k * so, e - first, end - e});
        if (from != self) {
          out.sent[static_cast<std::size_t>(from)] += end - e;
          out.received[static_cast<std::size_t>(to)] += end - e;
        }
        e = end;
      }
    }
  }
  return out;
}

/// What the survivors of a failure agree on (plan::last_committed): the last step whose state some of them hold
/// whole, and which of them hold it (old ranks, ascending).
struct committed_state {
  std::uint64_t step = 0;
  std::vector<int> holders;
};

/// In last_committed's `steps`: a survivor whose state is not a completed step's (an update that failed part way, a
/// load that left it torn).
inline constexpr std::uint64_t not_committed = ~std::uint64_t{0};

/// The highest step count among `steps` (survivor survivors[i]'s completed steps, or not_committed) whose survivors
/// hold every shard of `before` between them, and those survivors: the state the survivors continue from. A
/// survivor at another step, or not committed, holds nothing usable (it receives like a newcomer). A usage_error
/// naming each step's survivors and the shards they lack when no step is held whole: only a checkpoint has it.
inline committed_state last_committed(shard_grid before, const std::vector<int>& survivors,
                                      const std::vector<std::uint64_t>& steps) {
  if (steps.size() != survivors.size())
    fsdp::detail::fail_usage("reshard: ", steps.size(), " step counts for ", survivors.size(), " survivors");
  std::vector<std::uint64_t> distinct;
  for (std::uint64_t s : steps)
    if (s != not_committed && std::find(distinct.begin(), distinct.end(), s) == distinct.end()) distinct.push_back(s);
  std::sort(distinct.rbegin(), distinct.rend());
  std::string seen;
  for (std::uint64_t s : distinct) {
    committed_state c{s, {}};
    std::vector<char> has(static_cast<std::size_t>(before.shards), 0);
    for (std::size_t i = 0; i < steps.size(); ++i)
      if (steps[i] == s) {
        c.holders.push_back(survivors[i]);
        has[static_cast<std::size_t>(before.shard_of(survivors[i]))] = 1;
      }
    std::string lacks;
    for (int k = 0; k < before.shards; ++k)
      if (!has[static_cast<std::size_t>(k)]) lacks += fsdp::detail::cat(lacks.empty() ? "" : ", ", k);
    if (lacks.empty()) {
      std::sort(c.holders.begin(), c.holders.end());
      return c;
    }
    std::string who;
    for (int r : c.holders) who += fsdp::detail::cat(who.empty() ? "" : ", ", r);
    seen += fsdp::detail::cat(seen.empty() ? "" : "; ", "step ", s, " by rank", c.holders.size() > 1 ? "s " : " ", who,
                              ", without shard", lacks.find(',') != std::string::npos ? "s " : " ", lacks);
  }
  std::string torn;
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (steps[i] == not_committed) torn += fsdp::detail::cat(torn.empty() ? "" : ", ", survivors[i]);
  if (!torn.empty())
    seen += fsdp::detail::cat(seen.empty() ? "" : "; ", "rank(s) ", torn, " hold no completed step's state");
  fsdp::detail::fail_usage("reshard: no step's state is held whole by the survivors of the ", before.replicas, " x ",
                           before.shards, " grid (", seen, "): load the last checkpoint");
}

/// The plan as a table: a line per rank (old rank, its new rank or "leaves", elements and MiB sent and received for
/// `buffers` fp32 buffers a unit: the master shard and each optimizer state), a line per newcomer ("joins" as its old
/// rank), then the totals.
inline std::string describe(const reshard_plan& plan, const reshard_request& q, int buffers) {
  std::vector<int> new_of(plan.sent.size(), -1);
  for (std::size_t i = 0; i < q.joins.size(); ++i)
    if (q.joins[i] != newcomer) new_of[static_cast<std::size_t>(q.joins[i])] = static_cast<int>(i);
  std::vector<char> alive(plan.sent.size(), 0);
  for (int r : q.survivors) alive[static_cast<std::size_t>(r)] = 1;
  const double mib = 4.0 * buffers / 1048576.0;
  std::string out;
  char line[200];
  std::snprintf(line, sizeof line, "reshard %d x %d -> %d x %d, %d fp32 buffer(s) a unit\n  %-8s %-8s %14s %14s\n",
                q.before.replicas, q.before.shards, q.after.replicas, q.after.shards, buffers, "old rank", "new rank",
                "sends MiB", "receives MiB");
  out += line;
  std::int64_t total = 0;
  for (std::size_t r = 0; r < plan.sent.size(); ++r) {
    const int n = new_of[r];
    const std::string now = !alive[r] ? "lost" : n < 0 ? "leaves" : std::to_string(n);
    const double got = n < 0 ? 0.0 : static_cast<double>(plan.received[static_cast<std::size_t>(n)]) * mib;
    std::snprintf(line, sizeof line, "  %-8zu %-8s %14.3f %14.3f\n", r, now.c_str(),
                  static_cast<double>(plan.sent[r]) * mib, got);
    out += line;
    total += plan.sent[r];
  }
  for (std::size_t i = 0; i < q.joins.size(); ++i)
    if (q.joins[i] == newcomer) {
      std::snprintf(line, sizeof line, "  %-8s %-8zu %14.3f %14.3f\n", "joins", i, 0.0,
                    static_cast<double>(plan.received[i]) * mib);
      out += line;
    }
  std::snprintf(line, sizeof line, "  moved between ranks: %.3f MiB\n", static_cast<double>(total) * mib);
  return out + line;
}

}  // namespace fsdp::plan
