#pragma once
// The device mesh, written once: its dimensions (one row each in mesh_dimensions) and the groups of ranks a Model
// splits its communicator into (one row each in mesh_groups). Everything else asks: where a rank sits along a
// dimension, which ranks form its group of a role, how the world is split (detail/exec/groups.hpp), which links a
// group's collectives cross (plan::place_on_cluster), how the mesh is named in messages ("replicas x shards x
// tensor"). A checkpoint's manifest still records the mesh as named fields (checkpoint/manifest.hpp).
//
// Adding a dimension: a field of device_mesh, its row in mesh_dimensions (in its place, outermost first), the
// groups that span it in mesh_groups (a new role: a row there, and its member in mesh_group). docs/architecture.md
// ("where to start") names what else reads a dimension by meaning, not by structure.
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace fsdp {

/// Where a rank sits in a world of replicas x shards x tensor, row-major with the tensor dimension innermost (as
/// torchtitan's [dp_replicate, dp_shard, tp] mesh): the ranks of one tensor group are consecutive (one node's GPUs
/// under the usual launchers, so that the trainer's tensor-parallel collectives stay on NVLink), then the
/// data-parallel ranks count shards within a replica, then replicas. Rank r is at tensor rank r % tensor of
/// data-parallel rank r / tensor, which is shard shard_rank(r) of replica replica(r).
///
///   world 8, replicas 2 x shards 2 x tensor 2:  tensor groups {0,1} {2,3} {4,5} {6,7}; shard groups {0,2} {1,3}
///                                               {4,6} {5,7}; replicate groups {0,4} {1,5} {2,6} {3,7}
///
/// Experts (model_options::expert_parallel = `expert`) take their dimension from the data-parallel ranks, innermost:
/// the expert group (the trainer's all_to_all of tokens) is `expert` data-parallel ranks in a row, each holding
/// its share of every stacked expert parameter; the expert shard group (an expert's gathers and reductions) is the
/// ranks that hold the same experts. The dimension comes out of the shards (`expert` divides them: the mesh's shard
/// dimension is then shards / expert) or, for a strategy that keeps whole parameters (one shard), out of the
/// replicas. The dense parameters' groups are as without experts.
///
///   world 8, shards 8, expert 2:                expert groups {0,1} {2,3} {4,5} {6,7}; expert shard groups
///                                               {0,2,4,6} {1,3,5,7}; the shard group all 8 ranks
///
/// The layout is built for `shards` ranks (an expert unit's for expert_shards()) and the executor takes
/// shard_rank() (expert_shard_rank()) of it; the Model splits its communicator into the groups of mesh_groups
/// (detail/exec/groups.hpp): the shard group (the data-parallel group when the strategy does not split the world),
/// the replicate group (strategy_facts::splits_world), the tensor group (tensor > 1) and the two expert groups
/// (expert > 1). hybrid(): both data-parallel dimensions have more than one rank.
struct device_mesh {
  int replicas = 1;
  int shards = 1;
  int tensor = 1;  ///< model_options::tensor_parallel
  int expert = 1;  ///< model_options::expert_parallel
  friend bool operator==(const device_mesh&, const device_mesh&) = default;
  // By name, for what the dimensions mean (defined below, from the rows):
  int world() const noexcept;
  /// Ranks of one tensor group's place: replicas x shards, among whom gradients are reduced.
  int data_parallel() const noexcept;
  int tensor_rank(int rank) const noexcept;
  /// The rank's place among the data-parallel ranks (the tensor groups', in world order).
  int data_parallel_rank(int rank) const noexcept;
  int shard_rank(int rank) const noexcept;
  int replica(int rank) const noexcept;
  /// The rank's place in its expert group: which share of the experts it holds.
  int expert_rank(int rank) const noexcept;
  /// Ranks an expert's parameters are sharded over (its expert shard group within a replica): shards / expert, or
  /// 1 when the strategy keeps whole parameters.
  int expert_shards() const noexcept;
  /// The rank's place among them.
  int expert_shard_rank(int rank) const noexcept;
  bool hybrid() const noexcept { return replicas > 1 && shards > 1; }
};

/// The mesh's dimensions, outermost first.
enum class mesh_dim : unsigned char { replicate, shard, expert, tensor };
/// A set of dimensions (bit d: mesh_dim d).
using mesh_dims = unsigned;
constexpr mesh_dims dims_of(mesh_dim d) noexcept { return 1u << static_cast<unsigned>(d); }

/// One row per dimension, outermost first: its size in a mesh and its name (in messages). The expert dimension is
/// carved out of the shards where it divides them, else out of the replicas (device_mesh).
struct mesh_dimension {
  mesh_dim dim;
  int (*size)(const device_mesh&);
  std::string_view name;
};
namespace mesh {
/// Whether the expert dimension comes out of the shards (else out of the replicas: one shard).
constexpr bool experts_from_shards(const device_mesh& m) noexcept { return m.expert > 0 && m.shards % m.expert == 0; }
}  // namespace mesh
inline constexpr std::array<mesh_dimension, 4> mesh_dimensions{{
    {mesh_dim::replicate,
     [](const device_mesh& m) { return mesh::experts_from_shards(m) ? m.replicas : m.replicas / m.expert; },
     "replicas"},
    {mesh_dim::shard,
     [](const device_mesh& m) { return mesh::experts_from_shards(m) ? m.shards / m.expert : m.shards; }, "shards"},
    {mesh_dim::expert, [](const device_mesh& m) { return m.expert; }, "experts"},
    {mesh_dim::tensor, [](const device_mesh& m) { return m.tensor; }, "tensor"},
}};

/// The groups a Model splits its communicator into, beside the world's own: each the ranks that differ only along
/// the dimensions it spans.
enum class mesh_group : unsigned char { shard, replicate, tensor, expert_shard, expert };

/// One row per group, in the order every rank splits them off the world: its name, the dimensions it spans when
/// the strategy splits the world into replicas (strategy_facts::splits_world) and when it does not, and whether
/// the Model makes it (else its collectives are the world's, or there are none).
struct mesh_group_row {
  mesh_group group;
  std::string_view name;
  mesh_dims spans_split;
  mesh_dims spans_whole;
  bool (*made)(const device_mesh&, bool split);
};
inline constexpr mesh_dims data_parallel_dims =
    dims_of(mesh_dim::replicate) | dims_of(mesh_dim::shard) | dims_of(mesh_dim::expert);
inline constexpr std::array<mesh_group_row, 5> mesh_groups{{
    // gathers and reduce-scatters: the ranks of a replica at one tensor rank; every data-parallel rank at one
    // tensor rank when the world is not split (made then only to leave the tensor ranks apart)
    {mesh_group::shard, "shard group", dims_of(mesh_dim::shard) | dims_of(mesh_dim::expert), data_parallel_dims,
     [](const device_mesh& m, bool split) { return split || m.tensor > 1; }},
    // the all-reduce of each reduce-scattered shard: the ranks at one shard position and tensor rank
    {mesh_group::replicate, "replicate group", dims_of(mesh_dim::replicate), 0,
     [](const device_mesh&, bool split) { return split; }},
    // the trainer's tensor-parallel collectives and the partial gradients' all-reduce: consecutive ranks
    {mesh_group::tensor, "tensor group", dims_of(mesh_dim::tensor), dims_of(mesh_dim::tensor),
     [](const device_mesh& m, bool) { return m.tensor > 1; }},
    // an expert unit's gathers and reductions: the ranks of a replica (of the data-parallel ranks, when the world is
    // not split) that hold the same experts, at one tensor rank
    {mesh_group::expert_shard, "expert shard group", dims_of(mesh_dim::shard),
     dims_of(mesh_dim::replicate) | dims_of(mesh_dim::shard), [](const device_mesh& m, bool) { return m.expert > 1; }},
    // the trainer's all_to_all of tokens to their experts and back: consecutive data-parallel ranks
    {mesh_group::expert, "expert group", dims_of(mesh_dim::expert), dims_of(mesh_dim::expert),
     [](const device_mesh& m, bool) { return m.expert > 1; }},
}};
inline constexpr std::size_t mesh_group_count = mesh_groups.size();

// Each table is indexed by its enum (mesh::size, mesh::row): its rows in the enum's order.
static_assert(
    [] {
      for (std::size_t k = 0; k < mesh_dimensions.size(); ++k)
        if (static_cast<std::size_t>(mesh_dimensions[k].dim) != k) return false;
      for (std::size_t k = 0; k < mesh_groups.size(); ++k)
        if (static_cast<std::size_t>(mesh_groups[k].group) != k) return false;
      return true;
    }(),
    "fsdp/core/mesh.hpp: mesh_dimensions and mesh_groups must list their rows in mesh_dim's and mesh_group's order");

namespace mesh {

inline int size(const device_mesh& m, mesh_dim d) noexcept {
  return mesh_dimensions[static_cast<std::size_t>(d)].size(m);
}
/// How far apart consecutive ranks along `d` are: the product of the sizes of the dimensions inside it.
inline int stride(const device_mesh& m, mesh_dim d) noexcept {
  int s = 1;
  for (std::size_t k = static_cast<std::size_t>(d) + 1; k < mesh_dimensions.size(); ++k)
    s *= mesh_dimensions[k].size(m);
  return s;
}
/// Where world rank `rank` sits along `d`.
inline int coordinate(const device_mesh& m, int rank, mesh_dim d) noexcept { return rank / stride(m, d) % size(m, d); }
/// Every dimension.
inline constexpr mesh_dims all_dims = [] {
  mesh_dims d = 0;
  for (const mesh_dimension& r : mesh_dimensions) d |= dims_of(r.dim);
  return d;
}();
/// How far apart consecutive ranks of a group spanning `dims` are (its dimensions next to each other in the
/// mesh's order): the stride of its innermost dimension; 1 for none.
inline int stride(const device_mesh& m, mesh_dims dims) noexcept {
  for (std::size_t k = mesh_dimensions.size(); k-- > 0;)
    if (dims & dims_of(mesh_dimensions[k].dim)) return stride(m, mesh_dimensions[k].dim);
  return 1;
}
/// Ranks in a group spanning `dims`.
inline int group_size(const device_mesh& m, mesh_dims dims) noexcept {
  int n = 1;
  for (const mesh_dimension& r : mesh_dimensions)
    if (dims & dims_of(r.dim)) n *= r.size(m);
  return n;
}
/// The number of `rank`'s group spanning `dims` among the groups that tile the world (the color of a split): its
/// coordinates along the other dimensions, row-major. The ranks of one group share it.
inline int group_color(const device_mesh& m, int rank, mesh_dims dims) noexcept {
  int color = 0;
  for (const mesh_dimension& r : mesh_dimensions)
    if (!(dims & dims_of(r.dim))) color = color * r.size(m) + coordinate(m, rank, r.dim);
  return color;
}
/// The row of group `g`, and the dimensions it spans.
inline const mesh_group_row& row(mesh_group g) noexcept { return mesh_groups[static_cast<std::size_t>(g)]; }
inline mesh_dims spans(mesh_group g, bool split) noexcept { return split ? row(g).spans_split : row(g).spans_whole; }
/// The dimensions' names joined: "replicas x shards x experts x tensor".
inline std::string names_text() {
  std::string s;
  for (const mesh_dimension& r : mesh_dimensions) s += (s.empty() ? "" : " x ") + std::string(r.name);
  return s;
}
/// The dimensions' sizes joined, in the same order: "2 x 4 x 1 x 1".
inline std::string sizes_text(const device_mesh& m) {
  std::string s;
  for (const mesh_dimension& r : mesh_dimensions) s += (s.empty() ? "" : " x ") + std::to_string(r.size(m));
  return s;
}

}  // namespace mesh

inline int device_mesh::world() const noexcept { return mesh::group_size(*this, mesh::all_dims); }
inline int device_mesh::data_parallel() const noexcept { return mesh::group_size(*this, data_parallel_dims); }
inline int device_mesh::tensor_rank(int rank) const noexcept { return mesh::coordinate(*this, rank, mesh_dim::tensor); }
inline int device_mesh::data_parallel_rank(int rank) const noexcept {
  return mesh::group_color(*this, rank, dims_of(mesh_dim::tensor));
}
inline int device_mesh::shard_rank(int rank) const noexcept { return data_parallel_rank(rank) % shards; }
inline int device_mesh::replica(int rank) const noexcept { return data_parallel_rank(rank) / shards; }
inline int device_mesh::expert_rank(int rank) const noexcept { return mesh::coordinate(*this, rank, mesh_dim::expert); }
inline int device_mesh::expert_shards() const noexcept { return mesh::size(*this, mesh_dim::shard); }
inline int device_mesh::expert_shard_rank(int rank) const noexcept {
  return mesh::coordinate(*this, rank, mesh_dim::shard);
}

}  // namespace fsdp
