// Resharding in memory (fsdp/elastic/reshard.hpp): a model's master shards and AdamW state moved by the surviving
// ranks onto a model of another data-parallel grid, against the same state saved in a checkpoint and loaded at that
// grid, bit for bit, and the training that follows.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <doctest/doctest.h>

#include <fsdp/checkpoint/checkpoint.hpp>
#include <fsdp/elastic/reshard.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

namespace ckpt = fsdp::checkpoint;
using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::local_state;
using fsdp_test::run_ranks;
using fsdp_test::same_bits;

namespace {

using full_shard = fsdp::policy<fsdp::sharding::full_shard>;

mlp::config small() {
  mlp::config c;
  c.dims = {12, 40, 24, 6};  // three units of uneven sizes; shards split parameters across ranks
  c.global_batch = 56;       // splits over 8, 7, 4 and 2 ranks
  return c;
}

/// What one case compares on each rank of the new grid: the resharded state against the loaded one, and the losses
/// of two more steps from each.
struct outcome {
  std::vector<std::vector<float>> resharded, loaded, resharded_after, loaded_after;
  std::vector<float> losses_resharded, losses_loaded;
  std::string table;
};

/// `world` ranks train `Before` 3 steps and save; old rank `lost` (or none: -1) then drops out (`exits`: fails); the
/// survivors move
/// the state in memory to `After` on `joins` (old ranks, in new-rank order) and, apart, load the checkpoint into a
/// second `After` model on the same ranks; both train 2 more steps.
template <class Before, class After>
std::vector<outcome> run_case(int world, fsdp::plan::shard_grid after, int lost, const std::vector<int>& joins,
                              const std::string& path, bool exits = false) {
  const mlp::config cfg = small();
  std::vector<int> survivors;
  for (int r = 0; r < world; ++r)
    if (r != lost) survivors.push_back(r);
  std::vector<outcome> out(joins.size());
  run_ranks(world, [&](local_communicator& comm) {
    const int me = comm.rank();
    auto m = mlp::make_model<Before>(comm, cfg);
    mlp::with_optimizer(m, cfg, [&](auto& opt) {
      mlp::result res;
      mlp::run_steps(m, opt, cfg, 0, 3, res);
      ckpt::save(m, opt, path);
      const auto joined = std::find(joins.begin(), joins.end(), me);
      // The survivors' communicator: with `exits`, the lost rank's function returns (a rank that failed), the
      // survivors' quorum between steps (a barrier) names it, and they shrink the world; otherwise it splits off by
      // itself (a rank that leaves in order).
      if (exits && me == lost) return res;
      std::vector<int> members = survivors;
      local_communicator group = [&]() -> local_communicator {
        if (!exits) return comm.split(me == lost ? 1 : 0, me);
        const std::string failed = error_of<fsdp::comm_error>([&] { comm.barrier(); });
        CHECK(failed.find("rank(s) " + std::to_string(lost) + " returned without issuing it") != std::string::npos);
        return comm.shrink(&members);
      }();
      CHECK(members == survivors);
      if (me == lost) return res;
      local_communicator fresh = group.split(joined == joins.end() ? 1 : 0, int(joined - joins.begin()));
      local_communicator fresh2 = group.split(joined == joins.end() ? 1 : 0, int(joined - joins.begin()));
      const fsdp::plan::reshard_request q = fsdp::elastic::reshard_request_of(m, after, survivors, joins);
      if (joined == joins.end()) {  // a survivor that leaves: it sends its shares
        fsdp::elastic::reshard(q, m, opt, static_cast<decltype(&m)>(nullptr), static_cast<decltype(&opt)>(nullptr),
                               group);
        return res;
      }
      outcome& o = out[static_cast<std::size_t>(joined - joins.begin())];
      // two more steps from the new grid's state, each rank's state then and after them, and their losses
      const auto finish = [&](auto& model, auto& o_pt, std::vector<std::vector<float>>& now,
                              std::vector<std::vector<float>>& after_two, std::vector<float>& losses) {
        now = local_state(model, o_pt);
        mlp::result more;
        more.losses.assign(3, 0.0f);
        mlp::run_steps(model, o_pt, cfg, 3, 2, more);
        losses = more.losses;
        after_two = local_state(model, o_pt);
        return more;
      };
      auto m2 = mlp::make_model<After>(fresh, cfg);
      mlp::with_optimizer(m2, cfg, [&](auto& opt2) {
        const fsdp::plan::reshard_plan p = fsdp::elastic::reshard(q, m, opt, &m2, &opt2, group);
        if (fresh.rank() == 0) o.table = fsdp::plan::describe(p, q, 1 + opt.states_per_element());
        return finish(m2, opt2, o.resharded, o.resharded_after, o.losses_resharded);
      });
      auto m3 = mlp::make_model<After>(fresh2, cfg);
      mlp::with_optimizer(m3, cfg, [&](auto& opt3) {
        ckpt::load(m3, opt3, path);
        return finish(m3, opt3, o.loaded, o.loaded_after, o.losses_loaded);
      });
      return res;
    });
  });
  return out;
}

void check_same(const std::vector<outcome>& out) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    CAPTURE(r);
    REQUIRE(!out[r].resharded.empty());
    CHECK(same_bits(out[r].resharded, out[r].loaded));
    CHECK(same_bits(out[r].resharded_after, out[r].loaded_after));
    CHECK(out[r].losses_resharded == out[r].losses_loaded);
  }
}

}  // namespace

TEST_CASE(
    "2 x 2 (hybrid) as 1 x 4 in memory: the state a checkpoint saved at 2 x 2 and loaded at 1 x 4 gives, bit "
    "for bit, and the same training after") {
  fsdp_test::scratch_dir dir("elastic-grow");
  const auto out =
      run_case<fsdp::policy<fsdp::sharding::hybrid_shard<2>>, full_shard>(4, {1, 4}, -1, {0, 1, 2, 3}, dir / "ck");
  check_same(out);
}

TEST_CASE("2 x 4 loses rank 3: the 7 survivors continue as 1 x 7, rank 3's shard from its replica's peer") {
  fsdp_test::scratch_dir dir("elastic-lose");
  const auto out = run_case<fsdp::policy<fsdp::sharding::hybrid_shard<4>>, full_shard>(
      8, {1, 7}, 3, {0, 1, 2, 4, 5, 6, 7}, dir / "ck");
  check_same(out);
  MESSAGE(out[0].table);
}

TEST_CASE("2 x 2 as 1 x 2 on old ranks 1 and 2: the ranks that leave send their shards first") {
  fsdp_test::scratch_dir dir("elastic-leave");
  const auto out =
      run_case<fsdp::policy<fsdp::sharding::hybrid_shard<2>>, full_shard>(4, {1, 2}, -1, {1, 2}, dir / "ck");
  check_same(out);
  CHECK(out[0].table.find("  0        leaves ") != std::string::npos);
}

TEST_CASE(
    "a rank fails between steps (2 x 4, rank 5 exits): the survivors' quorum names it, they shrink the world "
    "and continue as 1 x 7 from the last step, as from that step's checkpoint") {
  fsdp_test::scratch_dir dir("elastic-exit");
  const auto out = run_case<fsdp::policy<fsdp::sharding::hybrid_shard<4>>, full_shard>(
      8, {1, 7}, 5, {0, 1, 2, 3, 4, 6, 7}, dir / "ck", /*exits=*/true);
  check_same(out);
}

TEST_CASE(
    "a rank fails between steps (2 x 4, rank 1 exits): the replica group without a loss continues alone as "
    "1 x 4, the others leave") {
  fsdp_test::scratch_dir dir("elastic-replica");
  const auto out = run_case<fsdp::policy<fsdp::sharding::hybrid_shard<4>>, full_shard>(8, {1, 4}, 1, {4, 5, 6, 7},
                                                                                       dir / "ck", /*exits=*/true);
  check_same(out);
  CHECK(out[0].table.find("moved between ranks: 0.000 MiB") != std::string::npos);  // each keeps its own shard
}

TEST_CASE(
    "a replacement joins (2 x 2 loses rank 3, replica 0 trains on as 1 x 2, two newcomers grow it back to 2 x 2): "
    "the newcomers receive their shards from the survivors, no checkpoint read, bit for bit the state a checkpoint "
    "saved at 1 x 2 and loaded at 2 x 2 gives, and the same training after") {
  using hybrid = fsdp::policy<fsdp::sharding::hybrid_shard<2>>;
  using fsdp::plan::newcomer;
  fsdp_test::scratch_dir dir("elastic-rejoin");
  const std::string path = dir / "ck";
  const mlp::config cfg = small();
  std::vector<outcome> out(4);  // by rank of the grown grid
  std::vector<float> rejoined_losses(7, 0.0f), uninterrupted(7, 0.0f);
  std::future<void> newcomers;
  // Each rank of the 2 x 2 grid after the return: the state the reshard gave it against the checkpoint's, then two
  // more steps from each. `from` is the 1 x 2 model and its optimizer on the survivors, null on a newcomer.
  const auto grown_rank = [&](local_communicator& grown, auto* from, auto* from_opt) {
    local_communicator xfer = grown.split(0, grown.rank()), second = grown.split(0, grown.rank());
    outcome& o = out[static_cast<std::size_t>(grown.rank())];
    const std::vector<int> joins{0, 1, newcomer, newcomer};
    auto m4 = mlp::make_model<hybrid>(grown, cfg);
    mlp::with_optimizer(m4, cfg, [&](auto& opt4) {
      if (from) {
        const auto q = fsdp::elastic::reshard_request_of(*from, {2, 2}, {0, 1}, joins);
        const auto p = fsdp::elastic::reshard(q, *from, *from_opt, &m4, &opt4, xfer);
        if (grown.rank() == 0) o.table = fsdp::plan::describe(p, q, 1 + opt4.states_per_element());
      } else {
        const auto q = fsdp::elastic::join_request_of(m4, {1, 2}, {0, 1}, joins);
        fsdp::elastic::join(q, m4, opt4, xfer);
      }
      CHECK(m4.step_count() == 5);
      CHECK(opt4.steps() == 5);
      o.resharded = local_state(m4, opt4);
      mlp::result more;
      more.losses.assign(5, 0.0f);
      mlp::run_steps(m4, opt4, cfg, 5, 2, more);
      o.losses_resharded = more.losses;
      o.resharded_after = local_state(m4, opt4);
      if (grown.rank() == 0) std::copy(more.losses.begin() + 5, more.losses.end(), rejoined_losses.begin() + 5);
      return more;
    });
    auto m5 = mlp::make_model<hybrid>(second, cfg);
    mlp::with_optimizer(m5, cfg, [&](auto& opt5) {
      ckpt::load(m5, opt5, path);
      o.loaded = local_state(m5, opt5);
      mlp::result more;
      more.losses.assign(5, 0.0f);
      mlp::run_steps(m5, opt5, cfg, 5, 2, more);
      o.losses_loaded = more.losses;
      o.loaded_after = local_state(m5, opt5);
      return more;
    });
  };
  run_ranks(4, [&](local_communicator& comm) {
    const int me = comm.rank();
    auto m = mlp::make_model<hybrid>(comm, cfg);
    mlp::with_optimizer(m, cfg, [&](auto& opt) {
      mlp::result res;
      mlp::run_steps(m, opt, cfg, 0, 3, res);
      if (me == 0) std::copy(res.losses.begin(), res.losses.end(), rejoined_losses.begin());
      if (me == 3) return res;  // rank 3 fails between steps
      error_of<fsdp::comm_error>([&] { comm.barrier(); });
      local_communicator survivors = comm.shrink();
      // replica 1 lost a rank: rank 2 sends nothing it alone holds, and leaves; ranks 0 and 1 continue as 1 x 2
      local_communicator pair = survivors.split(me == 2 ? 1 : 0, me);
      const auto q = fsdp::elastic::reshard_request_of(m, {1, 2}, {0, 1, 2}, {0, 1});
      if (me == 2) {
        fsdp::elastic::reshard(q, m, opt, static_cast<decltype(&m)>(nullptr), static_cast<decltype(&opt)>(nullptr),
                               survivors);
        return res;
      }
      auto m2 = mlp::make_model<hybrid>(pair, cfg);
      mlp::with_optimizer(m2, cfg, [&](auto& opt2) {
        fsdp::elastic::reshard(q, m, opt, &m2, &opt2, survivors);
        mlp::result mid;
        mid.losses.assign(3, 0.0f);
        mlp::run_steps(m2, opt2, cfg, 3, 2, mid);
        if (me == 0) std::copy(mid.losses.begin() + 3, mid.losses.end(), rejoined_losses.begin() + 3);
        ckpt::save(m2, opt2, path);  // the reference's: saved at 1 x 2, loaded at 2 x 2
        // two replacements join: the grown group's ranks 2 and 3, started by survivor 0
        fsdp::comm::local_invitation invitation;
        local_communicator grown = pair.grow(2, &invitation);
        if (me == 0)
          newcomers = fsdp::comm::start_joining(invitation, [&](local_communicator& g) {
            grown_rank(g, static_cast<decltype(&m2)>(nullptr), static_cast<decltype(&opt2)>(nullptr));
          });
        grown_rank(grown, &m2, &opt2);
        if (me == 0) newcomers.get();
        return mid;
      });
      return res;
    });
  });
  check_same(out);
  CHECK(out[0].table.find("  joins    3 ") != std::string::npos);
  // against a run that never lost a rank: the same data, another reduction order for steps 3 and 4 (one replica's
  // two ranks each average half the batch instead of four averaging a quarter): close, not the same bits
  run_ranks(4, [&](local_communicator& comm) {
    auto m = mlp::make_model<hybrid>(comm, cfg);
    mlp::with_optimizer(m, cfg, [&](auto& opt) {
      mlp::result res;
      mlp::run_steps(m, opt, cfg, 0, 7, res);
      if (comm.rank() == 0) uninterrupted = res.losses;
      return res;
    });
  });
  double largest = 0;
  for (std::size_t s = 0; s < 7; ++s) {
    CAPTURE(s);
    CHECK(rejoined_losses[s] == doctest::Approx(uninterrupted[s]).epsilon(1e-5));
    if (s < 3) CHECK(rejoined_losses[s] == uninterrupted[s]);
    largest = std::max(largest, std::abs(double(rejoined_losses[s]) / uninterrupted[s] - 1));
  }
  MESSAGE(out[0].table, "largest relative loss difference from the run without the loss: ", largest);
}

TEST_CASE(
    "refusals before anything moves: a communicator that is not the survivors then the newcomers, named with the "
    "fix") {
  using hybrid = fsdp::policy<fsdp::sharding::hybrid_shard<2>>;
  using fsdp::plan::newcomer;
  const mlp::config cfg = small();
  std::vector<std::string> sizes(4), order(4);
  run_ranks(4, [&](local_communicator& comm) {
    auto m = mlp::make_model<hybrid>(comm, cfg);
    mlp::with_optimizer(m, cfg, [&](auto& opt) {
      fsdp::plan::reshard_request q = fsdp::elastic::join_request_of(m, {1, 2}, {0, 1}, {0, 1, newcomer, newcomer});
      const auto r = static_cast<std::size_t>(comm.rank());
      if (comm.rank() < 2)  // ranks 0 and 1 call join, as if newcomers, where the request's survivors are
        order[r] = error_of<fsdp::usage_error>([&] { fsdp::elastic::join(q, m, opt, comm); });
      q.after = {1, 3};
      q.joins = {0, 1, newcomer};
      sizes[r] = error_of<fsdp::usage_error>([&] { fsdp::elastic::join(q, m, opt, comm); });
      return mlp::result{};
    });
  });
  for (int r = 0; r < 4; ++r)
    CHECK(sizes[static_cast<std::size_t>(r)] ==
          "fsdp: reshard: the communicator has 4 ranks, and the request 2 survivor(s) and 1 newcomer(s): make it of "
          "the survivors, ranked as listed, then the newcomers by new rank");
  for (int r = 0; r < 2; ++r)
    CHECK(order[static_cast<std::size_t>(r)] ==
          "fsdp: join: rank " + std::to_string(r) +
              " of the communicator is a newcomer, but the request's first 2 ranks are the survivors: make the "
              "communicator with the survivors first");
}
