// The in-memory reshard's plan (fsdp/plan/reshard.hpp): which elements each rank of a new data-parallel grid
// receives, from which survivor of the old one; hand-worked grids, the bytes each rank sends and receives, refusals.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/plan/reshard.hpp>

#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace {

using fsdp::plan::make_reshard_plan;
using fsdp::plan::reshard_request;
using fsdp::plan::reshard_run;
using runs = std::vector<reshard_run>;
using fsdp_test::error_of;

reshard_request one_unit(std::int64_t numel, std::int64_t align, fsdp::plan::shard_grid before,
                         fsdp::plan::shard_grid after, std::vector<int> survivors, std::vector<int> joins) {
  return {{"h.0"}, {numel}, align, before, after, std::move(survivors), std::move(joins)};
}

}  // namespace

TEST_CASE("2 x 4 loses rank 3: the 7 survivors continue as 1 x 7, each new shard from itself or its old replica") {
  // 100 elements: old shards of 25 (rank r holds [25 (r % 4), +25)), new shards of 15; rank 3's shard [75, 100) is
  // still held by rank 7
  const auto q = one_unit(100, 1, {2, 4}, {1, 7}, {0, 1, 2, 4, 5, 6, 7}, {0, 1, 2, 4, 5, 6, 7});
  const auto p = make_reshard_plan(q);
  CHECK(p.new_shard_numel == std::vector<std::int64_t>{15});
  CHECK(p.runs == runs{
                      {0, 0, 0, 0, 0, 15},   // new 0 = old 0: [0, 15) in place
                      {0, 0, 1, 15, 0, 10},  // new 1 = old 1: [15, 25) from its replica's shard 0
                      {0, 1, 1, 0, 10, 5},   //                [25, 30) in place
                      {0, 1, 2, 5, 0, 15},   // new 2 = old 2: [30, 45) from old 1
                      {0, 5, 3, 20, 0, 5},   // new 3 = old 4 (replica 1): [45, 50) from old 5, its replica's
                      {0, 6, 3, 0, 5, 10},   //                            [50, 60) from old 6
                      {0, 6, 4, 10, 0, 15},  // new 4 = old 5: [60, 75) from old 6
                      {0, 7, 5, 0, 0, 15},   // new 5 = old 6: [75, 90) from old 7
                      {0, 7, 6, 15, 0, 10},  // new 6 = old 7: [90, 100) in place
                  });
  CHECK(p.sent == std::vector<std::int64_t>{10, 15, 0, 0, 0, 5, 25, 15});
  CHECK(p.received == std::vector<std::int64_t>{0, 10, 15, 15, 15, 15, 0});
}

TEST_CASE("2 x 2 grows its shard group to 1 x 4 with no loss: aligned shards, a rank past the unit's end gets none") {
  // 40 elements aligned to 16: old shards of 32 ([0, 32), [32, 40) and padding), new shards of 16; new rank 3's
  // [48, 64) is all padding
  const auto q = one_unit(40, 16, {2, 2}, {1, 4}, {0, 1, 2, 3}, {0, 1, 2, 3});
  const auto p = make_reshard_plan(q);
  CHECK(p.new_shard_numel == std::vector<std::int64_t>{16});
  CHECK(p.runs == runs{{0, 0, 0, 0, 0, 16}, {0, 0, 1, 16, 0, 16}, {0, 3, 2, 0, 0, 8}});
  CHECK(p.sent == std::vector<std::int64_t>{16, 0, 0, 8});
  CHECK(p.received == std::vector<std::int64_t>{0, 16, 8, 0});
}

TEST_CASE("a holder whose old replica lost it: the surviving holders take turns by destination rank") {
  // 3 x 2 loses rank 1 (replica 0's shard 1); as 5 x 1 every new rank needs the whole unit
  const auto q = one_unit(10, 1, {3, 2}, {5, 1}, {0, 2, 3, 4, 5}, {0, 2, 3, 4, 5});
  const auto p = make_reshard_plan(q);
  CHECK(p.runs == runs{{0, 0, 0, 0, 0, 5},
                       {0, 3, 0, 0, 5, 5},  // shard 1 from old 3 (holders 3, 5; rank 0's turn)
                       {0, 2, 1, 0, 0, 5},
                       {0, 3, 1, 0, 5, 5},  // new 1 = old 2: its replica's peer, old 3
                       {0, 2, 2, 0, 0, 5},
                       {0, 3, 2, 0, 5, 5},
                       {0, 4, 3, 0, 0, 5},
                       {0, 5, 3, 0, 5, 5},
                       {0, 4, 4, 0, 0, 5},
                       {0, 5, 4, 0, 5, 5}});
  CHECK(p.sent == std::vector<std::int64_t>{0, 0, 5, 10, 5, 5});
}

TEST_CASE(
    "survivors that leave still send; the table gives every old rank's bytes for the master and AdamW's two "
    "states") {
  // 2 x 2 as 1 x 2 by old ranks 1 and 2 (each now needing the other shard, from its old replica's peer); 0 and 3 leave
  const auto q = one_unit(40 << 16, 16, {2, 2}, {1, 2}, {0, 1, 2, 3}, {1, 2});
  const auto p = make_reshard_plan(q);
  CHECK(p.runs == runs{{0, 0, 0, 0, 0, 20 << 16}, {0, 3, 1, 0, 0, 20 << 16}});
  CHECK(fsdp::plan::describe(p, q, 3) ==
        "reshard 2 x 2 -> 1 x 2, 3 fp32 buffer(s) a unit\n"
        "  old rank new rank      sends MiB   receives MiB\n"
        "  0        leaves           15.000          0.000\n"
        "  1        0                 0.000         15.000\n"
        "  2        1                 0.000         15.000\n"
        "  3        leaves           15.000          0.000\n"
        "  moved between ranks: 30.000 MiB\n");
}

TEST_CASE(
    "newcomers (plan::newcomer) hold nothing: each of their runs comes from the surviving holders, the survivors "
    "keep theirs in place") {
  using fsdp::plan::newcomer;
  // the example's return: 1 x 2 grows back to 2 x 2, newcomers as new ranks 2 and 3 (shards 0 and 1)
  const std::int64_t half = 5 << 17;  // 2.5 MiB of fp32
  auto q = one_unit(2 * half, 1, {1, 2}, {2, 2}, {0, 1}, {0, 1, newcomer, newcomer});
  auto p = make_reshard_plan(q);
  CHECK(p.runs == runs{{0, 0, 0, 0, 0, half}, {0, 1, 1, 0, 0, half}, {0, 0, 2, 0, 0, half}, {0, 1, 3, 0, 0, half}});
  CHECK(p.sent == std::vector<std::int64_t>{half, half});
  CHECK(p.received == std::vector<std::int64_t>{0, 0, half, half});
  CHECK(fsdp::plan::describe(p, q, 1) ==
        "reshard 1 x 2 -> 2 x 2, 1 fp32 buffer(s) a unit\n"
        "  old rank new rank      sends MiB   receives MiB\n"
        "  0        0                 2.500          0.000\n"
        "  1        1                 2.500          0.000\n"
        "  joins    2                 0.000          2.500\n"
        "  joins    3                 0.000          2.500\n"
        "  moved between ranks: 5.000 MiB\n");
  // 2 x 2 lost rank 3; a replacement takes its place: shard 1 from rank 1, the only holder left
  q = one_unit(10, 1, {2, 2}, {2, 2}, {0, 1, 2}, {0, 1, 2, newcomer});
  p = make_reshard_plan(q);
  CHECK(p.runs == runs{{0, 0, 0, 0, 0, 5}, {0, 1, 1, 0, 0, 5}, {0, 2, 2, 0, 0, 5}, {0, 1, 3, 0, 0, 5}});
  // 1 x 2 as 1 x 3 with a newcomer: new shards of 3 elements
  q = one_unit(9, 1, {1, 2}, {1, 3}, {0, 1}, {0, 1, newcomer});
  p = make_reshard_plan(q);
  CHECK(p.runs == runs{{0, 0, 0, 0, 0, 3}, {0, 0, 1, 3, 0, 2}, {0, 1, 1, 0, 2, 1}, {0, 1, 2, 1, 0, 3}});
  CHECK(p.sent == std::vector<std::int64_t>{2, 3});
  CHECK(p.received == std::vector<std::int64_t>{0, 2, 3});
}

TEST_CASE("refusals: elements no survivor holds, each unit's named; grids and ranks that do not fit") {
  // 2 x 2 loses ranks 1 and 3: shard 1 of both units is gone
  reshard_request q{{"root", "h.0"}, {10, 3}, 1, {2, 2}, {1, 2}, {0, 2}, {0, 2}};
  CHECK(error_of<fsdp::usage_error>([&] { make_reshard_plan(q); }) ==
        "fsdp: reshard: no survivor holds elements [5, 10) of unit 'root' (held by ranks 1, 3 only), [2, 3) of unit "
        "'h.0' (held by ranks 1, 3 only): no replica has them (load the last checkpoint)");
  q = one_unit(10, 1, {2, 2}, {1, 3}, {0, 1, 2}, {0, 1});
  CHECK(error_of<fsdp::usage_error>([&] { make_reshard_plan(q); }) ==
        "fsdp: reshard: the new 1 x 3 grid has 3 ranks, and 2 survivors join it");
  q = one_unit(10, 1, {2, 2}, {1, 2}, {0, 1, 2}, {0, 3});
  CHECK(error_of<fsdp::usage_error>([&] { make_reshard_plan(q); }) ==
        "fsdp: reshard: old rank 3 joins the new grid but is not a survivor");
  q = one_unit(10, 1, {2, 2}, {1, 2}, {0, 4}, {0, 4});
  CHECK(error_of<fsdp::usage_error>([&] { make_reshard_plan(q); }) ==
        "fsdp: reshard: survivor 4 is not a rank of the old 2 x 2 grid");
}

TEST_CASE(
    "last_committed: the highest step whose survivors hold every shard; survivors at another step, or not "
    "committed, hold nothing usable; none held whole is refused with each step's holders and missing shards") {
  using fsdp::plan::last_committed;
  using fsdp::plan::not_committed;
  // 2 x 4 lost rank 3 during step 4: replica 1 (ranks 4-7) finished it, ranks 0-2 did not
  auto c = last_committed({2, 4}, {0, 1, 2, 4, 5, 6, 7}, {3, 3, 3, 4, 4, 4, 4});
  CHECK(c.step == 4);
  CHECK(c.holders == std::vector<int>{4, 5, 6, 7});
  // only rank 5 finished it (shard 1): step 3 is the last held whole, by everyone else
  c = last_committed({2, 4}, {0, 1, 2, 4, 5, 6, 7}, {3, 3, 3, 3, 4, 3, 3});
  CHECK(c.step == 3);
  CHECK(c.holders == std::vector<int>{0, 1, 2, 4, 6, 7});
  // a survivor whose update failed part way is passed over
  c = last_committed({1, 2}, {0, 1}, {5, 5});
  CHECK(c.holders == std::vector<int>{0, 1});
  CHECK(error_of<fsdp::usage_error>([] { last_committed({2, 2}, {0, 1, 2}, {not_committed, 3, 4}); }) ==
        "fsdp: reshard: no step's state is held whole by the survivors of the 2 x 2 grid (step 4 by rank 2, without "
        "shard 1; step 3 by rank 1, without shard 0; rank(s) 0 hold no completed step's state): load the last "
        "checkpoint");
  CHECK(error_of<fsdp::usage_error>([] { last_committed({1, 4}, {0, 1}, {2, 2}); }) ==
        "fsdp: reshard: no step's state is held whole by the survivors of the 1 x 4 grid (step 2 by ranks 0, 1, "
        "without shards 2, 3): load the last checkpoint");
}
