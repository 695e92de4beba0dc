// fsdp::memory_table and fsdp::memory_row: every rank's peak memory by category, measured next to the plan, and the
// verdict line that names each rank and category over its plan.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <fsdp/memory/memory_table.hpp>

#include <mutex>

#include "tests/support/support.hpp"

namespace {
fsdp::memory_figures figures(std::int64_t sharded, std::int64_t gathered, std::int64_t total) {
  fsdp::memory_figures f;
  f[fsdp::mem::sharded_params] = sharded;
  f[fsdp::mem::gathered_params] = gathered;
  f.total = total;
  return f;
}
}  // namespace

TEST_CASE("the table: ranks in order, KiB measured / planned per category and in total, then the verdict") {
  const std::vector<fsdp::rank_memory> rows{{1, figures(2048, 3072, 5120), figures(2048, 2048, 4096)},
                                            {0, figures(2048, 1024, 3072), figures(2048, 1024, 3072)}};
  const std::string header =
      "peak memory per rank (KiB), measured / planned\n"
      "rank             sharded params          gathered params                    grads          "
      "optimizer state             comm buffers          total (at once)\n";
  CHECK(fsdp::memory_table(rows) ==
        header +
            "0                   2.00 / 2.00              1.00 / 1.00              0.00 / 0.00              0.00 "
            "/ 0.00              0.00 / 0.00              3.00 / 3.00\n"
            "1                   2.00 / 2.00              3.00 / 2.00              0.00 / 0.00              0.00 "
            "/ 0.00              0.00 / 0.00              5.00 / 4.00\n"
            "over the plan: rank 1 gathered params by 1024 bytes; rank 1 total by 1024 bytes\n");
  CHECK(fsdp::memory_table({rows[1]}).ends_with("\nevery rank within its plan\n"));
  CHECK(fsdp::memory_table({}) == header + "no ranks\n");
}

TEST_CASE(
    "check_collectives' scratch is outside the plan by design: allowed for in comm buffers and the total, and "
    "said") {
  fsdp::memory_figures planned = figures(2048, 1024, 4096), measured = planned;
  planned[fsdp::mem::comm_buffers] = 512;
  measured[fsdp::mem::comm_buffers] = 512 + 48;
  measured.total = 4096 + 48;
  const fsdp::rank_memory within{0, measured, planned, 48};
  CHECK(fsdp::memory_table({within}).ends_with(
      "\nevery rank within its plan and model_options::check_collectives' scratch (comm buffers outside the plan: 48 "
      "bytes at most)\n"));
  // without the allowance (no check_collectives) the same figures are over the plan
  CHECK(fsdp::memory_table({{0, measured, planned, 0}})
            .ends_with("\nover the plan: rank 0 comm buffers by 48 bytes; rank 0 total by 48 bytes\n"));
  // beyond it, what is over is counted past the scratch, and only in comm buffers and the total
  measured[fsdp::mem::comm_buffers] += 4;
  measured.total += 4;
  measured[fsdp::mem::gathered_params] += 16;
  measured.total += 16;
  CHECK(fsdp::memory_table({{1, measured, planned, 48}})
            .ends_with("\nover the plan: rank 1 gathered params by 16 bytes; rank 1 comm buffers by 4 bytes beyond "
                       "model_options::check_collectives' 48-byte scratch; rank 1 total by 20 bytes beyond "
                       "model_options::check_collectives' 48-byte scratch\n"));
}

namespace {
/// Every rank's row of a 2-rank model of three units after one AdamW step under `o`.
std::vector<fsdp::rank_memory> rows_after_a_step(const fsdp::model_options& o) {
  std::vector<fsdp::rank_memory> rows;
  std::mutex mu;
  fsdp_test::run_ranks(2, [&](fsdp::comm::local_communicator& comm) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>> m(
        comm, fsdp_test::three_units(), fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{}, o);
    fsdp::optim::adamw opt(m, {});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    opt.step();
    m.synchronize();
    const fsdp::rank_memory row = fsdp::memory_row(m, opt);
    CHECK(row.rank == comm.rank());
    std::lock_guard lk(mu);
    rows.push_back(row);
  });
  return rows;
}
}  // namespace

TEST_CASE("a model under check_collectives: its row carries the scratch, and the table finds every rank within") {
  fsdp::model_options checked;
  checked.check_collectives = true;
  const std::vector<fsdp::rank_memory> rows = rows_after_a_step(checked);
  REQUIRE(rows.size() == 2);
  for (const fsdp::rank_memory& row : rows) {
    CHECK(row.outside_plan == 16 * (2 + 1));  // a 16-byte digest and both ranks'
    CHECK(row.measured[fsdp::mem::comm_buffers] - row.planned[fsdp::mem::comm_buffers] <= row.outside_plan);
  }
  CHECK(fsdp::memory_table(rows).find("\nevery rank within its plan") != std::string::npos);
}

TEST_CASE("a model's rows: measured equal to the plan on every rank, category by category, after a step") {
  const std::vector<fsdp::rank_memory> rows = rows_after_a_step({});
  REQUIRE(rows.size() == 2);
  for (const fsdp::rank_memory& row : rows) {
    CHECK(row.measured == row.planned);
    CHECK(row.measured.total > 0);
    CHECK(row.outside_plan == 0);
  }
  CHECK(fsdp::memory_table(rows).ends_with("\nevery rank within its plan\n"));
}
