#pragma once
// A modelled link: how long a collective takes from its bytes, the group size, a bandwidth and a latency. One
// rule for the two places that model time: comm::local's modelled link (the collectives of thread ranks sleep
// for it, fsdp/comm/detail/local_group.hpp) and the timeline planner (fsdp/plan/timeline.hpp), so that a
// prediction and a host run on the same link agree on every collective's duration to the nanosecond.
#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm {

/// Once every rank has issued a collective, it takes latency + steps * step_latency + bytes * factor /
/// bytes_per_second, where bytes is the unsharded size, factor is (n-1)/n for all-gather, reduce-scatter and
/// all-to-all, 2(n-1)/n for all-reduce (ring) and 1 for broadcast, and steps is a ring's: n-1, 2(n-1) for an
/// all-reduce (n = group size; a group of one takes no time). The factors are the ring algorithms' bytes per rank
/// (what nccl-tests calls bus bandwidth: doc/PERFORMANCE.md of NVIDIA/nccl-tests). Concurrent collectives on
/// different streams do not share the bandwidth in this model.
struct link_model {
  double bytes_per_second = 0;  ///< 0: no model; a collective takes as long as its copies (the planner: no time)
  std::chrono::nanoseconds latency{0};  ///< once per collective
  /// Once per step of the ring: what makes a collective over thousands of ranks slow whatever its size (NCCL's
  /// tree and PAT algorithms, which cut the steps to a logarithm, are not modelled). 0 by default.
  std::chrono::nanoseconds step_latency{0};
  /// comm::local only. false: collectives only take their modelled time and leave every buffer untouched (for
  /// timing studies of large models on small machines; training results are then meaningless).
  bool move_data = true;

  std::chrono::nanoseconds duration(collective c, std::int64_t unsharded_bytes, int world) const {
    if (bytes_per_second <= 0 || world <= 1) return std::chrono::nanoseconds{0};
    const double n = world;
    const double factor = c == collective::broadcast    ? 1.0
                          : c == collective::all_reduce ? 2.0 * (n - 1) / n
                                                        : (n - 1) / n;
    const std::int64_t steps = c == collective::all_reduce ? 2 * (std::int64_t(world) - 1) : world - 1;
    return latency + steps * step_latency +
           std::chrono::nanoseconds(
               static_cast<std::int64_t>(double(unsharded_bytes) * factor / bytes_per_second * 1e9));
  }
};

/// Nodes of `gpus_per_node` ranks each, ranks placed node-major (rank r on node r / gpus_per_node, as launchers
/// number them): `intra` is one GPU's link inside a node (NVLink; the bus bandwidth nccl-tests measures on one
/// node), `inter` one GPU's share of its node's network (the node's bandwidth / gpus_per_node: one NIC a GPU on the
/// usual rail-optimised nodes) with the network's latencies.
///
/// group(size, stride), for a group of `size` ranks `stride` apart (a mesh's groups are: device_mesh), is the link
/// its collectives see. Inside one node: `intra`. Across nodes, with k of its ranks on each node: a ring enters and
/// leaves each node once, so the bytes crossing a node's boundary are the bytes each rank sends; a node's GPUs
/// belong to gpus_per_node / k groups of this kind running the same collectives at once, so each group's rings
/// have k GPUs' share of the network (NCCL spreads a ring's channels over the node's NICs), and no more than the
/// intra-node links carry: bandwidth min(intra, k x inter) (inter alone when k is 1), and the network's latency
/// and step latency (a ring steps at the pace of its slowest hop). Left out: NCCL's trees (an all-reduce's
/// bandwidth term is a ring's here), contention between different kinds of group (a shard group's gathers and a
/// replicate group's all-reduce on the same NICs at once each get their full share), and the network's topology
/// above the node (a non-blocking fabric is assumed).
struct cluster_links {
  int gpus_per_node = 1;
  link_model intra;
  link_model inter;

  link_model group(int size, int stride) const {
    if (gpus_per_node < 1 || size < 1 || stride < 1)
      fsdp::detail::fail_usage("cluster_links::group: gpus_per_node (", gpus_per_node, "), size (", size,
                               ") and stride (", stride, ") must be positive");
    if (size == 1) return intra;                                                   // takes no time
    const std::int64_t node = gpus_per_node, block = std::int64_t(size) * stride;  // block: `stride` groups' ranks
    auto refuse = [&] {
      fsdp::detail::fail_usage("cluster_links::group: groups of ", size, " ranks ", stride,
                               " apart do not tile nodes of ", gpus_per_node,
                               " GPUs (each node must hold the same number of a group's ranks, and a group inside "
                               "a node must not cross into the next): choose mesh dimensions whose products divide, "
                               "or are multiples of, gpus_per_node");
    };
    if (block <= node) {
      if (node % block != 0) refuse();
      return intra;
    }
    if (stride >= node ? stride % node != 0 : (node % stride != 0 || block % node != 0)) refuse();
    std::vector<int> places(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) places[static_cast<std::size_t>(i)] = i * stride;
    return placed(places);
  }

  /// The link of any group, from where its ranks sit (`places`: their ranks in the world, node-major): group()'s
  /// rule with k the fewest of its ranks on any node it spans (a ring is as fast as its slowest node). What
  /// comm::local gives each of its groups when local_options::cluster is set, a shrunk group's uneven one too.
  link_model placed(const std::vector<int>& places) const {
    if (gpus_per_node < 1)
      fsdp::detail::fail_usage("cluster_links: gpus_per_node must be positive, got ", gpus_per_node);
    std::map<int, int> on_node;  // node -> the group's ranks on it
    for (int p : places) {
      if (p < 0) fsdp::detail::fail_usage("cluster_links::placed: a rank's place must not be negative, got ", p);
      ++on_node[p / gpus_per_node];
    }
    if (on_node.size() <= 1) return intra;
    int k = gpus_per_node;
    for (const auto& [n, count] : on_node) k = count < k ? count : k;
    link_model out = inter;
    out.move_data = intra.move_data;
    out.bytes_per_second =
        k == 1 ? inter.bytes_per_second : slower(intra.bytes_per_second, double(k) * inter.bytes_per_second);
    return out;
  }

 private:
  static double slower(double a, double b) {  // 0 is free: the other one, if either
    return a <= 0 ? b : b <= 0 ? a : (a < b ? a : b);
  }
};

}  // namespace fsdp::comm
