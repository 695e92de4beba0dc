// The device mesh's rows (fsdp/core/mesh.hpp): coordinates, strides and the groups of each role, as the ranks that
// differ only along the dimensions the role spans, against the groups docs/policies.md lists; the mesh's names.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <map>
#include <set>
#include <vector>

#include "tests/support/support.hpp"

namespace {
using fsdp::device_mesh;
using fsdp::mesh_dim;
using fsdp::mesh_group;
namespace mesh = fsdp::mesh;

/// The groups a split by mesh::group_color makes: world ranks by color, in rank order.
std::vector<std::vector<int>> groups_of(const device_mesh& m, fsdp::mesh_dims dims) {
  std::map<int, std::vector<int>> by_color;
  for (int r = 0; r < m.world(); ++r) by_color[mesh::group_color(m, r, dims)].push_back(r);
  std::vector<std::vector<int>> out;
  for (auto& [color, ranks] : by_color) out.push_back(ranks);
  return out;
}
using groups = std::vector<std::vector<int>>;
}  // namespace

TEST_CASE("2 x 2 x 2: the groups docs/policies.md lists, each role's ranks differing along its dimensions only") {
  const device_mesh m{2, 2, 2};
  CHECK(m.world() == 8);
  CHECK(m.data_parallel() == 4);
  CHECK(groups_of(m, mesh::spans(mesh_group::tensor, true)) == groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(groups_of(m, mesh::spans(mesh_group::shard, true)) == groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(groups_of(m, mesh::spans(mesh_group::replicate, true)) == groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // the world not split into replicas: the shard group is every data-parallel rank at one tensor rank
  CHECK(groups_of(m, mesh::spans(mesh_group::shard, false)) == groups{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(groups_of(m, mesh::all_dims) == groups{{0, 1, 2, 3, 4, 5, 6, 7}});
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(m.tensor_rank(r) == r % 2);
    CHECK(m.data_parallel_rank(r) == r / 2);
    CHECK(m.shard_rank(r) == r / 2 % 2);
    CHECK(m.replica(r) == r / 4);
  }
}

TEST_CASE("coordinates, strides and group sizes: the row-major order, the last dimension innermost") {
  const device_mesh m{3, 4, 2};  // 24 ranks
  CHECK(mesh::stride(m, mesh_dim::tensor) == 1);
  CHECK(mesh::stride(m, mesh_dim::shard) == 2);
  CHECK(mesh::stride(m, mesh_dim::replicate) == 8);
  CHECK(mesh::stride(m, mesh::spans(mesh_group::shard, false)) == 2);  // replicas x shards: the shards' stride
  CHECK(mesh::stride(m, 0) == 1);
  CHECK(mesh::group_size(m, mesh::spans(mesh_group::shard, true)) == 4);
  CHECK(mesh::group_size(m, mesh::spans(mesh_group::shard, false)) == 12);
  CHECK(mesh::group_size(m, mesh::spans(mesh_group::replicate, true)) == 3);
  CHECK(mesh::group_size(m, 0) == 1);
  std::set<std::vector<int>> seen;  // every rank's coordinates, each once: the mesh tiles the world
  for (int r = 0; r < m.world(); ++r) {
    const std::vector<int> at{mesh::coordinate(m, r, mesh_dim::replicate), mesh::coordinate(m, r, mesh_dim::shard),
                              mesh::coordinate(m, r, mesh_dim::tensor)};
    CHECK(at[0] * 8 + at[1] * 2 + at[2] == r);
    seen.insert(at);
  }
  CHECK(seen.size() == 24u);
  // 3 replicate groups' worth of shard groups, each of 4 ranks 2 apart
  const groups shard = groups_of(m, mesh::spans(mesh_group::shard, true));
  REQUIRE(shard.size() == 6u);
  CHECK(shard[0] == std::vector<int>{0, 2, 4, 6});
  CHECK(shard[1] == std::vector<int>{1, 3, 5, 7});
  CHECK(shard[5] == std::vector<int>{17, 19, 21, 23});
}

TEST_CASE(
    "which groups a Model makes: the shard group when the world is split or has tensor groups, the replicate "
    "group when split, the tensor group when tensor > 1") {
  const auto made = [](const device_mesh& m, bool split) {
    std::vector<mesh_group> out;
    for (const fsdp::mesh_group_row& row : fsdp::mesh_groups)
      if (row.made(m, split)) out.push_back(row.group);
    return out;
  };
  using v = std::vector<mesh_group>;
  CHECK(made({1, 4, 1}, false) == v{});
  CHECK(made({2, 2, 1}, true) == v{mesh_group::shard, mesh_group::replicate});
  CHECK(made({1, 2, 2}, false) == v{mesh_group::shard, mesh_group::tensor});
  CHECK(made({2, 2, 2}, true) == v{mesh_group::shard, mesh_group::replicate, mesh_group::tensor});
  CHECK(made({1, 4, 1, 2}, false) == v{mesh_group::expert_shard, mesh_group::expert});
}

TEST_CASE("the expert dimension: out of the shards where it divides them, else out of the replicas; its groups") {
  // full_shard over 8 data-parallel ranks x tensor 2, expert 2: expert groups are consecutive data-parallel ranks
  const device_mesh m{1, 8, 2, 2};
  CHECK(m.world() == 16);
  CHECK(m.data_parallel() == 8);
  CHECK(m.expert_shards() == 4);
  CHECK(mesh::size(m, mesh_dim::shard) == 4);
  CHECK(mesh::stride(m, mesh_dim::expert) == 2);
  CHECK(mesh::stride(m, mesh_dim::shard) == 4);
  for (int r = 0; r < 16; ++r) {
    CAPTURE(r);
    CHECK(m.tensor_rank(r) == r % 2);
    CHECK(m.data_parallel_rank(r) == r / 2);
    CHECK(m.shard_rank(r) == r / 2);  // the dense units' shards: as without experts
    CHECK(m.replica(r) == 0);
    CHECK(m.expert_rank(r) == r / 2 % 2);
    CHECK(m.expert_shard_rank(r) == r / 4);
  }
  CHECK(groups_of(m, mesh::spans(mesh_group::expert, false)) ==
        groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(groups_of(m, mesh::spans(mesh_group::expert_shard, false)) ==
        groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(groups_of(m, mesh::spans(mesh_group::shard, false)) ==
        groups{{0, 2, 4, 6, 8, 10, 12, 14}, {1, 3, 5, 7, 9, 11, 13, 15}});
  // hybrid: 2 replicas x 4 shards, expert 2: the expert shard group within a replica, the replicas as without
  const device_mesh h{2, 4, 1, 2};
  CHECK(groups_of(h, mesh::spans(mesh_group::expert_shard, true)) == groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(groups_of(h, mesh::spans(mesh_group::shard, true)) == groups{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(groups_of(h, mesh::spans(mesh_group::replicate, true)) == groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // whole parameters (one shard, 6 replicas), expert 3: out of the replicas
  const device_mesh w{6, 1, 1, 3};
  CHECK(mesh::sizes_text(w) == "2 x 1 x 3 x 1");
  CHECK(w.expert_shards() == 1);
  for (int r = 0; r < 6; ++r) {
    CAPTURE(r);
    CHECK(w.replica(r) == r);
    CHECK(w.shard_rank(r) == 0);
    CHECK(w.expert_rank(r) == r % 3);
  }
  CHECK(groups_of(w, mesh::spans(mesh_group::expert_shard, false)) == groups{{0, 3}, {1, 4}, {2, 5}});
  CHECK(groups_of(w, mesh::spans(mesh_group::expert, false)) == groups{{0, 1, 2}, {3, 4, 5}});
}

TEST_CASE("the mesh's names and sizes in messages, from the rows") {
  CHECK(mesh::names_text() == "replicas x shards x experts x tensor");
  CHECK(mesh::sizes_text({2, 4, 1}) == "2 x 4 x 1 x 1");
  CHECK(mesh::sizes_text({2, 4, 1, 2}) == "2 x 2 x 2 x 1");  // the expert dimension out of the shards
  CHECK(mesh::row(mesh_group::replicate).name == "replicate group");
}
