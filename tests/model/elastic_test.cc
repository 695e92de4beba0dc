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
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
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

/// One rank of a new grid, as each case compares it: a `Policy` model on `fresh` takes its state from `move(model,
/// opt)` (a reshard or a join), a second one on `fresh2` loads the checkpoint at `path`; each one's state then, and
/// after `more` steps from step `first` with their losses, go to `o` (check_same compares them). Returns the losses
/// of the first model's steps.
template <class Policy, class Move>
std::vector<float> moved_and_loaded(outcome& o, local_communicator& fresh, local_communicator& fresh2,
                                    const mlp::config& cfg, const std::string& path, int first, int more, Move&& move) {
  const auto record = [&](auto& model, auto& opt, std::vector<std::vector<float>>& now,
                          std::vector<std::vector<float>>& after, std::vector<float>& losses) {
    now = local_state(model, opt);
    mlp::result r;
    mlp::run_steps(model, opt, cfg, first, more, r);
    losses = r.losses;
    after = local_state(model, opt);
    return r;
  };
  auto m2 = mlp::make_model<Policy>(fresh, cfg);
  mlp::with_optimizer(m2, cfg, [&](auto& opt2) {
    move(m2, opt2);
    return record(m2, opt2, o.resharded, o.resharded_after, o.losses_resharded);
  });
  auto m3 = mlp::make_model<Policy>(fresh2, cfg);
  mlp::with_optimizer(m3, cfg, [&](auto& opt3) {
    ckpt::load(m3, opt3, path);
    return record(m3, opt3, o.loaded, o.loaded_after, o.losses_loaded);
  });
  return o.losses_resharded;
}

/// How a rank drops out between steps: it leaves in order (splits off by itself), or fails: its function returns, or
/// throws (as a real trainer's failing rank does).
enum class drop { leaves, returns, throws };

/// What a rank that fails by throwing throws.
struct dies : std::runtime_error {
  explicit dies(int rank) : std::runtime_error("rank " + std::to_string(rank) + " dies") {}
};

/// `world` ranks train `Before` 3 steps and save; old rank `lost` (or none: -1) then drops out as `how` says; the
/// survivors move the state in memory to `After` on `joins` (old ranks, in new-rank order) and, apart, load the
/// checkpoint into a second `After` model on the same ranks; both train 2 more steps. A rank that throws is what
/// run_local rethrows once every rank ended: checked here.
template <class Before, class After>
std::vector<outcome> run_case(int world, fsdp::plan::shard_grid after, int lost, const std::vector<int>& joins,
                              const std::string& path, drop how = drop::leaves) {
  const mlp::config cfg = small();
  const bool exits = how != drop::leaves;
  std::vector<int> survivors;
  for (int r = 0; r < world; ++r)
    if (r != lost) survivors.push_back(r);
  std::vector<outcome> out(joins.size());
  std::string rethrown;
  try {
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
        if (how == drop::throws && me == lost) throw dies(me);
        if (exits && me == lost) return res;
        std::vector<int> members = survivors;
        local_communicator group = [&]() -> local_communicator {
          if (!exits) return comm.split(me == lost ? 1 : 0, me);
          const std::string failed = error_of<fsdp::comm_error>([&] { comm.barrier(); });
          const std::string named =
              how == drop::returns
                  ? "rank(s) " + std::to_string(lost) + " returned without issuing it"
                  : " aborted: rank " + std::to_string(lost) + " failed: rank " + std::to_string(lost) + " dies";
          CHECK_MESSAGE(failed.find(named) != std::string::npos, failed);
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
        moved_and_loaded<After>(o, fresh, fresh2, cfg, path, 3, 2, [&](auto& m2, auto& opt2) {
          const fsdp::plan::reshard_plan p = fsdp::elastic::reshard(q, m, opt, &m2, &opt2, group);
          if (fresh.rank() == 0) o.table = fsdp::plan::describe(p, q, 1 + opt.states_per_element());
        });
        return res;
      });
    });
  } catch (const dies& e) {
    rethrown = e.what();
  }
  CHECK(rethrown == (how == drop::throws ? "rank " + std::to_string(lost) + " dies" : ""));
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
      8, {1, 7}, 5, {0, 1, 2, 3, 4, 6, 7}, dir / "ck", drop::returns);
  check_same(out);
}

TEST_CASE(
    "a rank throws between steps (2 x 4, rank 5 throws out of its function, as a real trainer's failing rank): the "
    "survivors see the abort naming it, shrink without it, and continue as 1 x 7 as from that step's checkpoint; "
    "run_local rethrows its error once every rank ended") {
  fsdp_test::scratch_dir dir("elastic-throw");
  const auto out = run_case<fsdp::policy<fsdp::sharding::hybrid_shard<4>>, full_shard>(
      8, {1, 7}, 5, {0, 1, 2, 3, 4, 6, 7}, dir / "ck", drop::throws);
  check_same(out);
}

TEST_CASE(
    "a rank fails between steps (2 x 4, rank 1 returns, or throws): the replica group without a loss continues "
    "alone as 1 x 4, the others leave") {
  fsdp_test::scratch_dir dir("elastic-replica");
  for (const drop how : {drop::returns, drop::throws}) {
    CAPTURE(static_cast<int>(how));
    const auto out = run_case<fsdp::policy<fsdp::sharding::hybrid_shard<4>>, full_shard>(
        8, {1, 4}, 1, {4, 5, 6, 7}, dir / ("ck" + std::to_string(static_cast<int>(how))), how);
    check_same(out);
    CHECK(out[0].table.find("moved between ranks: 0.000 MiB") != std::string::npos);  // each keeps its own shard
  }
}

TEST_CASE(
    "a replacement joins (2 x 2 loses rank 3, which returns or throws; replica 0 trains on as 1 x 2, two newcomers "
    "grow it back to 2 x 2): "
    "the newcomers receive their shards from the survivors, no checkpoint read, bit for bit the state a checkpoint "
    "saved at 1 x 2 and loaded at 2 x 2 gives, and the same training after") {
  for (const drop how : {drop::returns, drop::throws}) {
    CAPTURE(static_cast<int>(how));
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
      const std::vector<float> losses =
          moved_and_loaded<hybrid>(o, grown, second, cfg, path, 5, 2, [&](auto& m4, auto& opt4) {
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
          });
      if (grown.rank() == 0) std::copy(losses.begin(), losses.end(), rejoined_losses.begin() + 5);
    };
    std::string rethrown;
    try {
      run_ranks(4, [&](local_communicator& comm) {
        const int me = comm.rank();
        auto m = mlp::make_model<hybrid>(comm, cfg);
        mlp::with_optimizer(m, cfg, [&](auto& opt) {
          mlp::result res;
          mlp::run_steps(m, opt, cfg, 0, 3, res);
          if (me == 0) std::copy(res.losses.begin(), res.losses.end(), rejoined_losses.begin());
          if (me == 3 && how == drop::throws) throw dies(me);  // rank 3 fails between steps
          if (me == 3) return res;
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
    } catch (const dies& e) {
      rethrown = e.what();
    }
    CHECK(rethrown == (how == drop::throws ? "rank 3 dies" : ""));
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

namespace {

/// Which old ranks hold the state the survivors agree on after `lost` fails before `phase` of step `at`, by the
/// steps' collectives. forward, backward: no survivor's step completes (every rank's gradient reaches every rank
/// through the replicas' all-reduce), so every survivor is at the step before. optimizer: the failed rank never
/// issues the step's commit (model_options::commit_step), which every survivor's updates are queued behind, so every
/// survivor skips its updates and is at the step before too. loss: every survivor finished the step.
fsdp::plan::committed_state expected(int world, int lost, const std::string& phase, std::uint64_t at) {
  fsdp::plan::committed_state c;
  c.step = phase == "loss" ? at + 1 : at;
  for (int r = 0; r < world; ++r)
    if (r != lost) c.holders.push_back(r);
  return c;
}

/// How the failed rank of failure_during_step ends: its function returns, throws (the model and optimizer unwind
/// with it: their destructors wait for its streams), or throws with its model and optimizer leaked (kept by the
/// test past run_local: nothing of it is drained, its streams' queued collectives still run behind the failure).
enum class ends { returns, throws, throws_leaked };

/// A failed rank's model and optimizer, kept past its function (ends::throws_leaked), on a split of the world (a
/// communicator is neither copied nor moved; every rank's model is on such a split then).
template <class Policy>
struct leaked_rank {
  local_communicator comm;
  fsdp::Model<Policy> model;
  decltype(fsdp::optim::adamw(std::declval<fsdp::Model<Policy>&>(), fsdp::optim::adamw_options{})) opt;
  leaked_rank(local_communicator& world, const mlp::config& cfg)
      : comm(world.split(0, world.rank())),
        model(mlp::make_model<Policy>(comm, cfg)),
        opt(model, {.lr = cfg.lr, .weight_decay = cfg.weight_decay, .grad = cfg.grad}) {}
};

/// `world` ranks train `Policy` (a hybrid strategy) with rank `lost` failing (as `end` says) before `phase` of step
/// 3, or where `fault` throws (comm::local_options::fault: inside a collective; phase ""); every survivor sees a
/// failure, aborts the world so that no survivor waits out the timeout, and the survivors shrink, agree on the last
/// committed step and continue as 1 x (world - 1) from the holders' state; a second model of the same grid loads the
/// checkpoint an uninterrupted run saved at that step. Returns, by new rank, what check_same compares.
template <class Policy>
std::vector<outcome> failure_during_step(int world, int lost, const std::string& phase, bool clip,
                                         fsdp::plan::committed_state& agreed, double& slowest_ms,
                                         fsdp::comm::collective_delay delay = {}, ends end = ends::returns,
                                         fsdp::comm::collective_fault fault = {}) {
  constexpr int at = 3;
  mlp::config cfg = small();
  cfg.global_batch = 60;  // splits over 6, 5, 4 and 3 ranks
  if (clip) cfg.grad.max_norm = 0.05f;
  fsdp_test::scratch_dir dir("elastic-phase");
  run_ranks(world, [&](local_communicator& comm) {  // the reference: no failure, saved after 3 and 4 steps
    auto m = mlp::make_model<Policy>(comm, cfg);
    mlp::with_optimizer(m, cfg, [&](auto& opt) {
      mlp::result res;
      mlp::run_steps(m, opt, cfg, 0, at, res);
      ckpt::save(m, opt, dir / "ck3");
      mlp::run_steps(m, opt, cfg, at, 1, res);
      ckpt::save(m, opt, dir / "ck4");
      return res;
    });
  });
  std::vector<int> joins;
  for (int r = 0; r < world; ++r)
    if (r != lost) joins.push_back(r);
  const fsdp::plan::shard_grid after{1, world - 1};
  std::vector<outcome> out(joins.size());
  std::vector<fsdp::plan::committed_state> seen(static_cast<std::size_t>(world));
  std::vector<double> detect(static_cast<std::size_t>(world), 0.0);
  std::atomic<std::int64_t> died{0};
  const auto now_us = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::shared_ptr<void> leaked;  // ends::throws_leaked: the failed rank's model, destroyed after run_local
  std::string rethrown;
  try {
    fsdp::comm::run_local(
        world,
        [&](local_communicator& comm) {
          const int me = comm.rank();
          mlp::config mine = cfg;
          mine.before = [&, me](int step, const char* p) {
            if (me == lost && step == at && phase == p) {
              died = now_us();
              throw dies(me);
            }
          };
          if (me == lost && end == ends::throws_leaked) {  // throws out of its function, nothing unwound with it
            auto kept = std::make_shared<leaked_rank<Policy>>(comm, mine);
            leaked = kept;
            mlp::result res;
            mlp::run_steps(kept->model, kept->opt, mine, 0, at + 2, res);
            FAIL("rank ", me, " finished its steps without failing");
          }
          std::unique_ptr<local_communicator> split;  // ends::throws_leaked: the models' world, as the failed rank's
          if (end == ends::throws_leaked) split.reset(new local_communicator(comm.split(0, me)));
          auto m = mlp::make_model<Policy>(split ? *split : comm, mine);
          mlp::with_optimizer(m, mine, [&](auto& opt) {
            mlp::result res;
            std::string failure;
            try {
              mlp::run_steps(m, opt, mine, 0, at + 2, res);
            } catch (const dies&) {
              if (end != ends::returns) throw;
              return res;  // the failed rank's thread returns
            } catch (const fsdp::comm_error& e) {
              failure = e.what();
              comm.abort("rank " + std::to_string(me) + " saw a failure");  // the others stop waiting at once
            }
            detect[static_cast<std::size_t>(me)] = static_cast<double>(now_us() - died) / 1000.0;
            CHECK_MESSAGE(!failure.empty(), "rank ", me, " finished its steps despite rank ", lost, "'s failure");
            std::vector<int> members;
            local_communicator shrunk = comm.shrink(&members);
            CHECK(members == joins);
            fsdp::backend::host staging(me);  // the model's streams may have failed with the step
            const fsdp::plan::committed_state c = fsdp::elastic::agree(m, members, shrunk, staging);
            seen[static_cast<std::size_t>(me)] = c;
            const auto place = fsdp::elastic::transfer_place(c, joins, me);
            local_communicator xfer = shrunk.split(place.first, place.second);
            const int mine_new = static_cast<int>(std::find(joins.begin(), joins.end(), me) - joins.begin());
            local_communicator fresh = shrunk.split(0, mine_new), fresh2 = shrunk.split(0, mine_new);
            const fsdp::plan::reshard_request q = fsdp::elastic::committed_request(m, c, after, joins);
            outcome& o = out[static_cast<std::size_t>(mine_new)];
            moved_and_loaded<full_shard>(o, fresh, fresh2, cfg, dir / (c.step == at ? "ck3" : "ck4"),
                                         static_cast<int>(c.step), 2, [&](auto& m2, auto& opt2) {
                                           if (std::find(c.holders.begin(), c.holders.end(), me) != c.holders.end())
                                             fsdp::elastic::reshard(q, m, opt, &m2, &opt2, xfer);
                                           else
                                             fsdp::elastic::join(q, m2, opt2, xfer);
                                           CHECK(m2.step_count() == c.step);
                                           CHECK(opt2.steps() == static_cast<long>(c.step));
                                         });
            return res;
          });
        },
        {.timeout = std::chrono::milliseconds(5000),
         .delay = delay,
         .fault = !fault ? fault : [&, fault](const fsdp::comm::collective_site& s) {
           try {
             fault(s);
           } catch (...) {
             died = now_us();
             throw;
           }
         }});
  } catch (const dies& e) {
    rethrown = e.what();
  }
  CHECK(rethrown == (end == ends::returns ? "" : "rank " + std::to_string(lost) + " dies"));
  agreed = seen[static_cast<std::size_t>(joins.front())];
  slowest_ms = 0;
  for (int r : joins) {
    CAPTURE(r);
    CHECK(seen[static_cast<std::size_t>(r)].step == agreed.step);
    CHECK(seen[static_cast<std::size_t>(r)].holders == agreed.holders);
    slowest_ms = std::max(slowest_ms, detect[static_cast<std::size_t>(r)]);
  }
  return out;
}

template <class Policy>
void every_phase(int world, int lost, std::initializer_list<ends> how) {
  for (const ends end : how)
    for (const std::string phase : {"forward", "backward", "optimizer", "loss"}) {
      CAPTURE(static_cast<int>(end));
      CAPTURE(phase);
      fsdp::plan::committed_state agreed;
      double slowest = 0;
      const auto out = failure_during_step<Policy>(world, lost, phase, false, agreed, slowest, {}, end);
      const auto want = expected(world, lost, phase, 3);
      CHECK(agreed.step == want.step);
      const auto text = [](const std::vector<int>& v) {
        std::string t;
        for (int r : v) t += (t.empty() ? "" : ", ") + std::to_string(r);
        return t;
      };
      CHECK(text(agreed.holders) == text(want.holders));
      CHECK(slowest < 5000.0);  // every survivor saw the failure within the collective timeout
      check_same(out);
    }
}

}  // namespace

TEST_CASE(
    "a rank fails during a step, at each phase (before its forward, backward, optimizer step, and the loss's "
    "all-reduce), returning, throwing, or throwing with its model leaked, on 2 x 2, 2 x 3 and 3 x 2 grids under every "
    "hybrid strategy: every survivor detects it within the "
    "timeout, they agree on the last committed step and its holders, and continue as 1 x (world - 1) from it, bit "
    "for bit the checkpoint an uninterrupted run saved at that step" *
    doctest::test_suite("sweep")) {
  using fsdp::sharding::hybrid_shard;
  using fsdp::sharding::hybrid_shard_zero1;
  using fsdp::sharding::hybrid_shard_zero2;
  // the failed rank's model leaked past run_local on 2 x 2 (what it shows does not depend on the grid)
  SUBCASE("2 x 2, rank 3") {
    for (auto p : {&every_phase<fsdp::policy<hybrid_shard<2>>>, &every_phase<fsdp::policy<hybrid_shard_zero2<2>>>,
                   &every_phase<fsdp::policy<hybrid_shard_zero1<2>>>})
      p(4, 3, {ends::returns, ends::throws, ends::throws_leaked});
  }
  SUBCASE("2 x 3, rank 1") {
    for (auto p : {&every_phase<fsdp::policy<hybrid_shard<3>>>, &every_phase<fsdp::policy<hybrid_shard_zero2<3>>>,
                   &every_phase<fsdp::policy<hybrid_shard_zero1<3>>>})
      p(6, 1, {ends::returns, ends::throws});
  }
  SUBCASE("3 x 2, rank 4") {
    for (auto p : {&every_phase<fsdp::policy<hybrid_shard<2>>>, &every_phase<fsdp::policy<hybrid_shard_zero2<2>>>,
                   &every_phase<fsdp::policy<hybrid_shard_zero1<2>>>})
      p(6, 4, {ends::returns, ends::throws});
  }
}

TEST_CASE(
    "with clipping, a failure before the optimizer step fails every survivor's gradient-norm all-reduce before any "
    "update: the world's norm is the commit, and every survivor continues from the step before, whether the "
    "failure is seen before the updates are issued or only by the stream they were queued on") {
  using namespace std::chrono_literals;
  for (const bool late : {false, true}) {
    CAPTURE(late);
    fsdp::plan::committed_state agreed;
    double slowest = 0;
    // late: every all-reduce waits 30 ms on its stream, so the host issues the updates before the norm's failure is
    // known; the stream then skips them, and the survivors must not count the step (committed_steps)
    const fsdp::comm::collective_delay delay = [](fsdp::collective k, std::uint64_t, int) {
      return k == fsdp::collective::all_reduce ? std::chrono::microseconds(30ms) : std::chrono::microseconds(0);
    };
    const auto out = failure_during_step<fsdp::policy<fsdp::sharding::hybrid_shard<2>>>(
        4, 3, "optimizer", true, agreed, slowest, late ? delay : fsdp::comm::collective_delay{});
    CHECK(agreed.step == 3);
    CHECK(agreed.holders == std::vector<int>{0, 1, 2});
    check_same(out);
  }
}

namespace {

/// Fault injection for failure_during_step: world rank `lost` dies inside its last replica all-reduce of step 3 (3
/// units, so its 12th: the only all-reduces of more than one element in a sub-group are the replicas'), never
/// arriving; its stream fails with `dies`, which its thread rethrows at its next wait. `before_dying`, when given, runs
/// on that stream first.
constexpr int dying_step = 3;  ///< the step in which in_last_replica_all_reduce's rank dies (counted from 0)
fsdp::comm::collective_fault in_last_replica_all_reduce(int lost, std::function<void()> before_dying = {}) {
  auto seen = std::make_shared<std::atomic<int>>(0);
  return [lost, seen, before_dying](const fsdp::comm::collective_site& s) {
    if (s.world_rank == lost && s.kind == fsdp::collective::all_reduce && !s.group.empty() && s.count > 1 &&
        ++*seen == 3 * (dying_step + 1)) {
      if (before_dying) before_dying();
      throw dies(lost);
    }
  };
}

template <class Policy>
void dies_in_last_replica_all_reduce(int world, int lost) {
  fsdp::plan::committed_state agreed;
  double slowest = 0;
  const auto out = failure_during_step<Policy>(world, lost, "", false, agreed, slowest, {}, ends::throws,
                                               in_last_replica_all_reduce(lost));
  std::vector<int> survivors;
  for (int r = 0; r < world; ++r)
    if (r != lost) survivors.push_back(r);
  CHECK(agreed.step == 3);
  CHECK(agreed.holders == survivors);
  CHECK(slowest < 5000.0);
  check_same(out);
}

}  // namespace

TEST_CASE(
    "without clipping, a rank that dies inside its last replica all-reduce of a step (the other replica groups "
    "have finished theirs): the step's commit fails on every survivor before any update, so all of them hold the "
    "step before whole and continue from it, bit for bit its checkpoint; on 2 x 2, 3 x 2 and 2 x 3 grids under the "
    "three hybrid strategies") {
  using fsdp::sharding::hybrid_shard;
  using fsdp::sharding::hybrid_shard_zero1;
  using fsdp::sharding::hybrid_shard_zero2;
  SUBCASE("2 x 2, rank 3") {
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard<2>>>(4, 3);
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard_zero2<2>>>(4, 3);
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard_zero1<2>>>(4, 3);
  }
  SUBCASE("3 x 2, rank 4") {
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard<2>>>(6, 4);
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard_zero2<2>>>(6, 4);
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard_zero1<2>>>(6, 4);
  }
  SUBCASE("2 x 3, rank 1") {
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard<3>>>(6, 1);
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard_zero2<3>>>(6, 1);
    dies_in_last_replica_all_reduce<fsdp::policy<hybrid_shard_zero1<3>>>(6, 1);
  }
}

TEST_CASE(
    "with the commit off (model_options::commit_step = false) the same failure loses the step: the replica group "
    "without the failed rank updates, its partner cannot, and the survivors' agreement refuses, naming both steps") {
  mlp::config cfg = small();
  cfg.global_batch = 60;
  cfg.model.commit_step = false;
  std::vector<std::string> refusals(4);
  std::string rethrown;
  // What the test shows needs one order: ranks 0 and 2 (the replica group without the failed rank) apply the failing
  // step's updates before anything aborts the world, or their step fails too (it did under ASan and TSan). Rank 3's
  // death aborts it (its thread rethrows `dies` at its next wait, and run_local aborts the group), and so does rank 1
  // once its replica all-reduce with rank 3 failed. So rank 3 dies only once the streams of ranks 0 and 2 reached
  // the failing step's loss all-reduce (queued after its updates on the same stream; the world's one-element
  // all-reduces, which the fault hook counts on each stream: no commit, no clipping), or after 20 s; rank 1's
  // replica all-reduce waits for rank 3 meanwhile, within the group's timeout of 30 s. (Waiting for their threads to
  // issue it, or only holding rank 1 back, was not enough: their streams run later, and rank 3's death aborts.)
  std::array<std::atomic<int>, 4> losses_reached{0, 0, 0, 0};
  const fsdp::comm::collective_fault dies_in_replica = in_last_replica_all_reduce(3, [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((losses_reached[0] <= dying_step || losses_reached[2] <= dying_step) &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  fsdp::comm::collective_fault fault = [&](const fsdp::comm::collective_site& s) {
    if (s.group.empty() && s.kind == fsdp::collective::all_reduce && s.count == 1)
      ++losses_reached[static_cast<std::size_t>(s.world_rank)];
    dies_in_replica(s);
  };
  auto rank = [&](local_communicator& comm) {
    const int me = comm.rank();
    auto m = mlp::make_model<fsdp::policy<fsdp::sharding::hybrid_shard<2>>>(comm, cfg);
    mlp::with_optimizer(m, cfg, [&](auto& opt) {
      mlp::result res;
      try {
        mlp::run_steps(m, opt, cfg, 0, 5, res);
      } catch (const fsdp::comm_error&) {
        comm.abort("rank " + std::to_string(me) + " saw a failure");
      }
      std::vector<int> members;
      local_communicator shrunk = comm.shrink(&members);
      fsdp::backend::host staging(me);
      refusals[static_cast<std::size_t>(me)] =
          error_of<fsdp::usage_error>([&] { fsdp::elastic::agree(m, members, shrunk, staging); });
      return res;
    });
  };
  try {
    fsdp::comm::run_local(4, rank, {.timeout = std::chrono::milliseconds(30000), .fault = fault});
  } catch (const dies& e) {
    rethrown = e.what();
  }
  CHECK(rethrown == "rank 3 dies");
  CHECK(losses_reached[0].load() == dying_step + 1);  // steps 0 to dying_step: none after it
  CHECK(losses_reached[2].load() == dying_step + 1);
  for (int r : {0, 1, 2}) {
    CAPTURE(r);
    CHECK(refusals[static_cast<std::size_t>(r)] ==
          "fsdp: reshard: no step's state is held whole by the survivors of the 2 x 2 grid (step 4 by ranks 0, 2, "
          "without shard 1; step 3 by rank 1, without shard 0): load the last checkpoint");
  }
}

TEST_CASE(
    "a compute stream that failed before the last step's updates: they were skipped, so the step is not counted "
    "(committed_steps, the optimizer's count too) and a reshard from the model gives the step before's state") {
  fsdp_test::scratch_dir dir("elastic-skipped");
  const mlp::config cfg = small();
  std::vector<outcome> out(2);
  run_ranks(2, [&](local_communicator& comm) {
    local_communicator xfer = comm.split(0, comm.rank()), fresh = comm.split(0, comm.rank()),
                       fresh2 = comm.split(0, comm.rank());
    auto m = mlp::make_model<full_shard>(comm, cfg);
    mlp::with_optimizer(m, cfg, [&](auto& opt) {
      mlp::result res;
      mlp::run_steps(m, opt, cfg, 0, 2, res);
      ckpt::save(m, opt, dir / "ck2");
      // the third step's updates queue behind a failure of the compute stream, as behind a reduction that failed
      mlp::config failing = cfg;
      failing.before = [&](int, const char* phase) {
        if (std::string(phase) == "optimizer")
          m.backend().host_callback(m.backend().compute_stream(), [] { throw fsdp::comm_error("injected"); });
      };
      CHECK(error_of<fsdp::comm_error>([&] {
              mlp::run_steps(m, opt, failing, 2, 1, res);
              m.synchronize();
            }) == "fsdp: injected");
      CHECK(m.step_count() == 3);
      CHECK(fsdp::model_access::committed_steps(m) == std::optional<std::uint64_t>(2));
      CHECK(fsdp::model_access::last_update_skipped(m));
      CHECK(opt.steps_if_last_skipped() == 2);
      outcome& o = out[static_cast<std::size_t>(comm.rank())];
      const auto q = fsdp::elastic::reshard_request_of(m, {1, 2}, {0, 1}, {0, 1});
      moved_and_loaded<full_shard>(o, fresh, fresh2, cfg, dir / "ck2", 2, 2, [&](auto& m2, auto& opt2) {
        fsdp::elastic::reshard(q, m, opt, &m2, &opt2, xfer);
        CHECK(m2.step_count() == 2);
        CHECK(opt2.steps() == 2);
      });
      return res;
    });
  });
  check_same(out);
}

namespace {

/// 2 x 2 under `Policy`: 3 steps and a checkpoint, then rank 3 fails instead of joining the next save; the survivors'
/// save fails (a comm_error), the directory holds no checkpoint, and they continue as 1 x 3 from the state in memory,
/// bit for bit the checkpoint of the step.
template <class Policy>
void save_failure(drop how) {
  const mlp::config cfg = [] {
    mlp::config c = small();
    c.global_batch = 60;
    return c;
  }();
  fsdp_test::scratch_dir dir("elastic-save");
  const std::vector<int> joins{0, 1, 2};
  std::vector<outcome> out(joins.size());
  std::vector<std::string> failures(4);
  std::string rethrown;
  try {
    fsdp::comm::run_local(
        4,
        [&](local_communicator& comm) {
          const int me = comm.rank();
          auto m = mlp::make_model<Policy>(comm, cfg);
          mlp::with_optimizer(m, cfg, [&](auto& opt) {
            mlp::result res;
            mlp::run_steps(m, opt, cfg, 0, 3, res);
            ckpt::save(m, opt, dir / "good");
            if (me == 3 && how == drop::throws) throw dies(me);  // fails instead of saving
            if (me == 3) return res;
            failures[static_cast<std::size_t>(me)] =
                error_of<fsdp::comm_error>([&] { ckpt::save(m, opt, dir / "torn"); });
            comm.abort("rank " + std::to_string(me) + " saw a failure");
            std::vector<int> members;
            local_communicator shrunk = comm.shrink(&members);
            fsdp::backend::host staging(me);
            const fsdp::plan::committed_state c = fsdp::elastic::agree(m, members, shrunk, staging);
            CHECK(c.step == 3);
            CHECK(c.holders == joins);
            const auto place = fsdp::elastic::transfer_place(c, joins, me);
            local_communicator xfer = shrunk.split(place.first, place.second);
            local_communicator fresh = shrunk.split(0, me), fresh2 = shrunk.split(0, me);
            const auto q = fsdp::elastic::committed_request(m, c, {1, 3}, joins);
            outcome& o = out[static_cast<std::size_t>(me)];
            moved_and_loaded<full_shard>(o, fresh, fresh2, cfg, dir / "good", 3, 2, [&](auto& m2, auto& opt2) {
              // the failed save left nothing to load: refused before anything is written
              CHECK(error_of<fsdp::checkpoint_error>([&] { ckpt::load(m2, opt2, dir / "torn"); }) ==
                    "fsdp: checkpoint load from '" + (dir / "torn") +
                        "' failed (no parameter was modified): ranks 0, 1, 2: could not open '" + (dir / "torn") +
                        "/manifest.json': No such file or directory");
              fsdp::elastic::reshard(q, m, opt, &m2, &opt2, xfer);
            });
            return res;
          });
        },
        {.timeout = std::chrono::milliseconds(5000)});
  } catch (const dies& e) {
    rethrown = e.what();
  }
  CHECK(rethrown == (how == drop::throws ? "rank 3 dies" : ""));
  for (int r : joins) {
    CAPTURE(r);
    CHECK(!failures[static_cast<std::size_t>(r)].empty());
  }
  check_same(out);
}

}  // namespace

TEST_CASE(
    "a rank fails during a checkpoint save (2 x 2, rank 3 returns or throws instead of joining it): the survivors' "
    "save fails, leaves no "
    "checkpoint, and they continue from the step in memory as from the last good checkpoint") {
  using hybrids =
      std::tuple<fsdp::policy<fsdp::sharding::hybrid_shard<2>>, fsdp::policy<fsdp::sharding::hybrid_shard_zero2<2>>,
                 fsdp::policy<fsdp::sharding::hybrid_shard_zero1<2>>>;
  for (const drop how : {drop::returns, drop::throws}) {
    CAPTURE(static_cast<int>(how));
    std::apply([how](auto... p) { (save_failure<decltype(p)>(how), ...); }, hybrids{});
  }
}
