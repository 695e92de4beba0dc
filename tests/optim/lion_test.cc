// Lion (fsdp/optim/lion.hpp) against a double-precision evaluation of the published algorithm (Chen et al. 2023,
// "Symbolic Discovery of Optimization Algorithms", Algorithm 2), over 10 steps:
//   c = b1 m + (1 - b1) g;  theta -= lr (sign(c) + wd theta);  m = b2 m + (1 - b2) g
// from the same fp32 initial values, hyper-parameters and gradients, with the bound of optim_test.cc: after every
// step |theta - theta_ref| <= 1e-6 x the element's scale (its initial magnitude plus its path). sign(c) is the
// same in both unless c is within rounding of 0, which these gradients never give (checked: the reference counts
// such elements). Then: the same bits at 1, 2 and 3 ranks; and a checkpoint resume (3 steps, save, a fresh model
// and optimizer load it, 2 more) equals 5 steps without a stop, bit for bit, the momentum included.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <fsdp/checkpoint/checkpoint.hpp>
#include <fsdp/optim/lion.hpp>

#include "tests/optim/trajectory.hpp"

namespace {
using namespace fsdp_test::optim;

struct lion_hp {
  float lr, beta1, beta2, wd;
};

template <class M>
auto make_lion(M& m, const lion_hp& h) {
  return std::make_unique<fsdp::optim::lion<typename M::core_type>>(
      m, fsdp::optim::lion_options{.lr = h.lr, .beta1 = h.beta1, .beta2 = h.beta2, .weight_decay = h.wd});
}

/// The worst |theta - reference| / scale over every element and step; `near_zero` counts the updates whose c lies
/// within 1e-6 of 0 relative to its terms (where fp32 and double could take different signs).
double check_lion(const trajectory& got, const lion_hp& h, int& near_zero) {
  double worst = 0;
  for (const char* name : names) {
    const bool decay = std::string(name) != "a.b";
    const auto& steps_of = got.at(name);
    for (std::size_t i = 0; i < steps_of[0].size(); ++i) {
      double theta = steps_of[0][i], m = 0, scale = std::abs(theta);
      const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, wd = decay ? double(h.wd) : 0.0;
      for (int t = 1; t <= steps; ++t) {
        const double g = gradient(name, std::int64_t(i), t), before = theta;
        const double c = b1 * m + (1 - b1) * g;
        if (std::abs(c) <= 1e-6 * (std::abs(b1 * m) + std::abs((1 - b1) * g))) ++near_zero;
        const double sign = c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0;
        theta -= lr * (sign + wd * theta);
        m = b2 * m + (1 - b2) * g;
        scale += std::abs(theta - before);
        worst = std::max(worst, std::abs(double(steps_of[t][i]) - theta) / scale);
      }
    }
  }
  return worst;
}
}  // namespace

TEST_CASE("Lion follows the published algorithm within 1e-6 of each element's scale; the same bits at 1, 2, 3 ranks") {
  for (const lion_hp h : {lion_hp{1e-3f, 0.9f, 0.99f, 0.0f}, lion_hp{3e-4f, 0.95f, 0.98f, 1.0f},
                          lion_hp{1e-2f, 0.9f, 0.99f, 0.1f}}) {
    CAPTURE(h.lr);
    CAPTURE(h.beta1);
    CAPTURE(h.beta2);
    CAPTURE(h.wd);
    auto make = [&](auto& m) { return make_lion(m, h); };
    const trajectory one = run(1, make);
    int near_zero = 0;
    const double worst = check_lion(one, h, near_zero);
    MESSAGE("Lion lr ", h.lr, " betas ", h.beta1, ", ", h.beta2, " wd ", h.wd,
            ": worst |theta - reference| / scale over 10 steps = ", worst);
    CHECK(near_zero == 0);  // no sign left to rounding: the comparison is of the algorithm, not of a coin toss
    CHECK(worst <= 1e-6);
    CHECK(same_bits(run(2, make), one));  // sharding changes no element's arithmetic
    CHECK(same_bits(run(3, make), one));
  }
}

TEST_CASE("Lion's update, element by element: sign of the interpolation, decoupled decay, no decay where masked") {
  namespace od = fsdp::optim::detail;
  // c = 0.9 * 1 + 0.1 * (-20) = -1.1: sign -1; p = 2 * (1 - 0.1 * 0.5) + 0.1 = 2.0; m = 0.99 + 0.01 * (-20) = 0.79,
  // each operation in fp32 (1 - beta rounded as the update rounds it)
  float p = 2.0f, g = -20.0f, m = 1.0f;
  od::lion_update(p, g, m, {0.1f, 0.9f, 0.99f, 0.5f}, 0.5f);
  CHECK(p == 2.0f * (1.0f - 0.1f * 0.5f) + 0.1f);
  CHECK(m == 0.99f * 1.0f + (1.0f - 0.99f) * -20.0f);
  float q = 1.0f, zero_m = 0.0f;  // c = 0: no step but the decay
  od::lion_update(q, 0.0f, zero_m, {0.1f, 0.9f, 0.99f, 0.5f}, 0.5f);
  CHECK(q == 1.0f * (1.0f - 0.1f * 0.5f));
  CHECK(od::lion_sign(-0.0f) == 0.0f);
  CHECK(std::isnan(od::lion_sign(std::nanf(""))));
  // through a backend's for_each with a mask: element 1 gets no decay
  fsdp::backend::host be;
  std::vector<float> ps{1, 1, 1}, gs{1, 1, 1}, ms{0, 0, 0};
  od::decay_mask mask;
  mask.count = 1;
  mask.begin[0] = 1;
  mask.end[0] = 2;
  be.for_each(3, od::lion_elements{ps.data(), gs.data(), {ms.data()}, {0.5f, 0.9f, 0.99f, 0.2f}, mask},
              be.compute_stream());
  CHECK(ps == std::vector<float>{1.0f * (1.0f - 0.5f * 0.2f) - 0.5f, 1.0f - 0.5f, 1.0f * (1.0f - 0.5f * 0.2f) - 0.5f});
  CHECK(ms == std::vector<float>(3, 0.99f * 0.0f + (1.0f - 0.99f) * 1.0f));
}

TEST_CASE("Lion's state is checkpointed: a resume equals the run without a stop, bit for bit, at another world size") {
  fsdp_test::scratch_dir dir("lion-resume");
  const lion_hp h{1e-3f, 0.9f, 0.99f, 0.1f};
  // 5 steps straight at 2 ranks
  const trajectory straight = [&] {
    auto make = [&](auto& m) { return make_lion(m, h); };
    return run(2, make);
  }();
  // 3 steps at 2 ranks, saved; loaded at 3 ranks, 2 more
  fsdp::model_options mo;
  mo.division.how = fsdp::grad_division::mode::sum;
  const fsdp::wrap::by_function first_letter{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }};
  using M = fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>>;
  fsdp_test::run_ranks(2, [&](fsdp_test::optim::local_communicator& c) {
    M m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11}, mo);
    auto opt = make_lion(m, h);
    train_steps(c, m, 1, 3, [&] {
      opt->step();
      opt->zero_grad();
    });
    fsdp::checkpoint::save(m, *opt, dir / "step-3");
  });
  CHECK(fsdp::checkpoint::read_manifest(dir / "step-3").optimizer->states == std::vector<std::string>{"exp_avg"});
  std::map<std::string, std::vector<float>> resumed;
  fsdp_test::run_ranks(3, [&](fsdp_test::optim::local_communicator& c) {
    M m(c, spec(), first_letter, fsdp::init::normal{0.5f, 99}, mo);
    auto opt = make_lion(m, h);
    fsdp::checkpoint::load(m, *opt, dir / "step-3");
    CHECK(opt->steps() == 3);
    train_steps(c, m, 4, 5, [&] {
      opt->step();
      opt->zero_grad();
    });
    auto full = fsdp::weights::gather_full_params(m);
    if (c.rank() == 0) resumed = std::move(full);
  });
  for (const char* name : names) {
    CAPTURE(name);
    const std::vector<float>& want = straight.at(name)[5];
    REQUIRE(resumed.at(name).size() == want.size());
    CHECK(std::memcmp(resumed.at(name).data(), want.data(), want.size() * 4) == 0);
  }
}

TEST_CASE("Lion's options are checked, naming the one at fault") {
  fsdp_test::run_ranks(1, [](fsdp_test::optim::local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec(), fsdp::wrap::by_prefix{"a."});
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::optim::lion o(m, {.lr = -1.0f}); }) ==
          "fsdp: lion: lr must be finite and >= 0, got -1");
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::optim::lion o(m, {.beta2 = 1.5f}); }) ==
          "fsdp: lion: beta2 must be in [0, 1], got 1.5");
  });
}
