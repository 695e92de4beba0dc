// A training step captured once and replayed (fsdp::step_graph over backend::host's capture, a CUDA graph's
// counterpart): the trainer's gradient kernels, the library's gathers, reductions and optimizer updates issued once,
// replayed 19 times, and every rank's master shards, optimizer states and update count bit for bit against 20 eager
// steps: the optimizer's learning rate and bias corrections come from the update count the device keeps
// (fsdp/optim/detail/step_block.hpp), so each replay computes its own. The trainer: tests/support/capture.hpp.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/support/capture.hpp"
#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::error_of;
namespace sharding = fsdp::sharding;
using namespace fsdp_test::capture;

namespace {

struct outcome {
  std::vector<std::vector<std::vector<float>>> state;    // per rank: local_state
  std::vector<long> steps;                               // per rank: the optimizer's update count
  std::vector<fsdp::grad::scale_state> scaler;           // per rank: its loss scaler's, where it has one
  std::vector<std::vector<fsdp::grad::report>> reports;  // per rank: each step's report
};

/// 20 steps at `world` thread ranks (train_rank).
template <class Policy, class MakeOpt>
outcome train(int world, bool capture, MakeOpt&& make_opt, int poisoned, fsdp::grad::loss_scaler_options scaling) {
  outcome out;
  out.state.resize(static_cast<std::size_t>(world));
  out.steps.resize(static_cast<std::size_t>(world));
  out.scaler.resize(static_cast<std::size_t>(world));
  out.reports.resize(static_cast<std::size_t>(world));
  fsdp_test::run_ranks(world, [&](local_communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    fsdp_test::capture::rank_outcome o = train_rank<Policy>(c, capture, make_opt, poisoned, scaling);
    out.state[r] = std::move(o.state);
    out.steps[r] = o.steps;
    out.scaler[r] = o.scaler;
    out.reports[r] = std::move(o.reports);
  });
  return out;
}

/// Returns the eager run's outcome.
template <class Policy, class MakeOpt>
outcome check_replays_match(int world, MakeOpt&& make_opt, int poisoned = 0,
                            fsdp::grad::loss_scaler_options scaling = {}) {
  const outcome eager = train<Policy>(world, false, make_opt, poisoned, scaling);
  const outcome replayed = train<Policy>(world, true, make_opt, poisoned, scaling);
  const long updates = poisoned > 0 ? steps - 1 : steps;  // a skipped step does not count
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const auto i = static_cast<std::size_t>(r);
    CHECK(fsdp_test::same_bits(eager.state[i], replayed.state[i]));
    CHECK(eager.steps[i] == updates);
    CHECK(replayed.steps[i] == updates);
    CHECK(replayed.scaler[i].scale == eager.scaler[i].scale);
    CHECK(replayed.scaler[i].good == eager.scaler[i].good);
    CHECK(differing_report(eager.reports[i], replayed.reports[i]) == "");  // each replay's report, its eager step's
    if (poisoned > 0) CHECK(replayed.reports[i].at(static_cast<std::size_t>(poisoned - 1)).skipped);
  }
  return eager;
}

}  // namespace

TEST_CASE(
    "AdamW under warm-up and cosine: 19 replays of a captured step give every rank the bits of eager steps, "
    "under every strategy") {
  SUBCASE("full_shard") { check_replays_match<fsdp::policy<sharding::full_shard>>(3, adamw()); }
  SUBCASE("full_shard, prefetching the next unit") {
    check_replays_match<fsdp::policy<sharding::full_shard, fsdp::prefetch::next>>(2, adamw());
  }
  SUBCASE("shard_grad_op") { check_replays_match<fsdp::policy<sharding::shard_grad_op>>(3, adamw()); }
  SUBCASE("zero1") { check_replays_match<fsdp::policy<sharding::zero1>>(2, adamw()); }
  SUBCASE("no_shard") { check_replays_match<fsdp::policy<sharding::no_shard>>(2, adamw()); }
  SUBCASE("hybrid_shard<2> at 2 x 2") { check_replays_match<fsdp::policy<sharding::hybrid_shard<2>>>(4, adamw()); }
  SUBCASE("one rank") { check_replays_match<fsdp::policy<sharding::full_shard>>(1, adamw()); }
}

TEST_CASE("sgd with momentum, lion and a user's step rule, scheduled, replay to the same bits") {
  using P = fsdp::policy<sharding::full_shard>;
  SUBCASE("sgd") {
    check_replays_match<P>(2, [](auto& m, fsdp::grad::loss_scaler&) {
      return std::make_unique<fsdp::optim::sgd<fsdp::optim::detail::core_of_t<std::remove_cvref_t<decltype(m)>>>>(
          m, fsdp::optim::sgd_options{.lr = 0.1f, .momentum = 0.9f, .schedule = {3, 0, 0.0f}});
    });
  }
  SUBCASE("lion") {
    check_replays_match<P>(2, [](auto& m, fsdp::grad::loss_scaler&) {
      return std::make_unique<fsdp::optim::lion<fsdp::optim::detail::core_of_t<std::remove_cvref_t<decltype(m)>>>>(
          m, fsdp::optim::lion_options{.lr = 0.01f, .weight_decay = 0.5f, .schedule = {0, 20, 0.0f}});
    });
  }
}

TEST_CASE(
    "clipping by the global norm, and a step skipped for a non-finite gradient, replay to the same bits: the "
    "decision is made on the device, and the skipped step is not counted there") {
  const auto clipped = adamw(0.5f);
  SUBCASE("clipped") { check_replays_match<fsdp::policy<sharding::full_shard>>(2, clipped); }
  SUBCASE("clipped, step 7 skipped") { check_replays_match<fsdp::policy<sharding::full_shard>>(2, clipped, 7); }
  SUBCASE("hybrid_shard<2>, step 12 skipped, the non-finite unit located") {
    check_replays_match<fsdp::policy<sharding::hybrid_shard<2>>>(
        4,
        [](auto& m, fsdp::grad::loss_scaler&) {
          return std::make_unique<fsdp::optim::adamw<fsdp::optim::detail::core_of_t<std::remove_cvref_t<decltype(m)>>>>(
              m, fsdp::optim::adamw_options{.grad = {.max_norm = 1.0f, .locate_nonfinite = true}});
        },
        12);
  }
}

TEST_CASE(
    "fp16's loss scale moves on the device: replays back it off at a non-finite step and grow it, as eager "
    "steps do, and the trainer's backward reads each replay's own") {
  const auto scaled = adamw(0.5f, true);
  // from 2^10, grown after every 4 good steps in a row and halved at the skipped step 9: 2048 after step 4, 4096
  // after 8, 2048 after 9, 4096 after 13, 8192 after 17, and 3 good steps since
  const outcome eager = check_replays_match<fsdp::policy<sharding::full_shard>>(
      2, scaled, 9, {.init_scale = 1024.0f, .growth_interval = 4});
  CHECK(eager.scaler[0].scale == 8192.0f);
  CHECK(eager.scaler[0].good == 3);
  // each step's report (a replay's as its eager step's: check_replays_match) names the scale its gradients carried
  std::vector<float> carried;
  for (const fsdp::grad::report& r : eager.reports[0]) carried.push_back(r.loss_scale);
  CHECK(carried == std::vector<float>{1024, 1024, 1024, 1024, 2048, 2048, 2048, 2048, 4096, 2048,
                                      2048, 2048, 2048, 4096, 4096, 4096, 4096, 8192, 8192, 8192});
}

TEST_CASE(
    "a replay's report is ready once the compute stream has passed its decision; one let go is never read, one "
    "held through later steps keeps its own step's decision, and eager steps between replays count as before") {
  using P = fsdp::policy<sharding::full_shard>;
  fsdp_test::run_ranks(2, [](local_communicator& c) {
    std::vector<fsdp::grad::report> eager;  // six eager steps of a twin model
    {
      fsdp::Model<P> m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11});
      fsdp::optim::adamw opt(m, {.grad = {.max_norm = 0.5f}});
      float poison = 0.0f;
      for (int t = 1; t <= 6; ++t) eager.push_back(train_step(m, opt, &poison).get());
    }
    fsdp::Model<P> m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11});
    fsdp::optim::adamw opt(m, {.grad = {.max_norm = 0.5f}});
    float poison = 0.0f;
    (void)train_step(m, opt, &poison);
    fsdp::step_graph graph(m, opt, [&] { (void)train_step(m, opt, &poison); });
    const fsdp::grad::step_report second = graph.replay();
    (void)graph.replay();  // the third step's, let go
    const fsdp::grad::step_report fourth = graph.replay();
    m.synchronize();
    CHECK(second.ready());
    CHECK(fourth.ready());
    const fsdp::grad::step_report fifth = train_step(m, opt, &poison);  // eager, between replays
    const fsdp::grad::step_report sixth = graph.replay();
    CHECK(differing_report({eager[1], eager[3], eager[4], eager[5]},
                           {second.get(), fourth.get(), fifth.get(), sixth.get()}) == "");
    CHECK(fourth.get().message() == eager[3].message());
    CHECK(eager[3].clip_coef < 1.0f);  // the norm over 0.5: clipped, the coefficient a replay's own
    CHECK(opt.steps() == 6);
    CHECK(m.step_count() == 6);
  });
}

TEST_CASE("what a captured step cannot hold is refused before anything is captured, each with its sentence") {
  using P = fsdp::policy<sharding::full_shard>;
  auto refusal = [](fsdp::model_options o, auto policy) {
    using Q = typename decltype(policy)::type;
    std::string message;
    fsdp_test::run_ranks(1, [&](local_communicator& c) {
      fsdp::Model<Q> m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11}, o);
      fsdp::optim::adamw opt(m, {});
      float poison = 0.0f;
      message = error_of([&] { fsdp::step_graph graph(m, opt, [&] { train_step(m, opt, &poison); }); });
      CHECK_FALSE(m.backend().capturing());
    });
    return message;
  };
  const std::string head = "fsdp: step_graph: ";
  fsdp::model_options accumulating;
  accumulating.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  CHECK(refusal(accumulating, std::type_identity<P>{}) ==
        head +
            "no-sync accumulation (model_options::accumulation with grad_sync::last_micro_batch) cannot be "
            "captured: its fp32 accumulators are taken and given back each step, which a captured step may not do");
  fsdp::model_options views;
  views.check_views = true;
  CHECK(refusal(views, std::type_identity<P>{}) ==
        head +
            "model_options::check_views cannot be captured: it marks views stale from the host as the streams pass "
            "each release");
  fsdp::model_options checked;
  checked.check_collectives = true;
  CHECK(refusal(checked, std::type_identity<P>{}) ==
        head +
            "model_options::check_collectives cannot be captured: the ranks compare each collective on the host "
            "before it is issued");
  CHECK(refusal({}, std::type_identity<fsdp::policy<sharding::full_shard, fsdp::prefetch::none, fsdp::precision::full,
                                                    fsdp::comm::local<>, fsdp::offload::all>>{}) ==
        head +
            "unit 'a' (index 0) cannot be captured: it offloads its params, grads and optimizer state, so its "
            "optimizer step runs on the host with a rule made there each step; keep one of them on the device");
}

TEST_CASE(
    "a captured step's report says so; a step whose trainer waits on the host is refused by the backend, and "
    "the capture ends with it") {
  fsdp_test::run_ranks(1, [](local_communicator& c) {
    fsdp::Model<fsdp::policy<sharding::full_shard>> m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11});
    fsdp::optim::adamw opt(m, {});
    float poison = 0.0f;
    train_step(m, opt, &poison);
    std::string said;
    fsdp::step_graph captured(m, opt, [&] { said = train_step(m, opt, &poison).get().message(); });
    CHECK(said == "captured, not run: each replay decides on the device");
    CHECK(opt.steps() == 1);
    CHECK(error_of([&] {
            fsdp::step_graph graph(m, opt, [&] {
              train_step(m, opt, &poison);
              m.synchronize();  // a trainer reading its loss
            });
          }) ==
          "fsdp: backend::host on rank 0: synchronize(stream 'rank0.upload') while a step is captured "
          "(begin_capture() to end_capture()): a captured step's work runs only when it is replayed, and nothing "
          "in it may wait on the host; synchronize after end_capture() or after a replay");
    CHECK_FALSE(m.backend().capturing());
    train_step(m, opt, &poison);  // eager steps go on
    CHECK(opt.steps() == 2);
  });
  // Inside a pass: the pass is abandoned, and the trainer still hears the backend's sentence, not the model's refusal
  // to restore its step count after an abandoned pass.
  fsdp_test::run_ranks(1, [](local_communicator& c) {
    fsdp::Model<fsdp::policy<sharding::full_shard>> m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11});
    fsdp::optim::adamw opt(m, {});
    float poison = 0.0f;
    train_step(m, opt, &poison);
    CHECK(error_of([&] {
            fsdp::step_graph graph(m, opt, [&] {
              for (auto& u : m.forward()) {
                (void)u;
                m.backend().synchronize(m.backend().compute_stream());  // a trainer reading an activation
              }
            });
          }) ==
          "fsdp: backend::host on rank 0: synchronize(stream 'rank0.compute') while a step is captured "
          "(begin_capture() to end_capture()): a captured step's work runs only when it is replayed, and nothing "
          "in it may wait on the host; synchronize after end_capture() or after a replay");
    CHECK_FALSE(m.backend().capturing());
  });
}
