// The optimizers against a double-precision evaluation of PyTorch's documented algorithms, over 10 steps:
//   AdamW (torch.optim.AdamW): theta -= lr * wd * theta; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//          m_hat = m / (1 - b1^t); v_hat = v / (1 - b2^t); theta -= lr * m_hat / (sqrt(v_hat) + eps)
//   SGD (torch.optim.SGD, dampening 0, no Nesterov): g += wd * theta; buf = mu * buf + g; theta -= lr * buf
// The reference runs the whole trajectory in double from the same fp32 initial values, hyper-parameters (as the
// fp32 options hold them) and fp32 gradients. Each element's scale is its initial magnitude plus the length of its
// path so far (the sum of |update|): after every step, |theta - theta_ref| <= 1e-6 x scale.
//
// Why 1e-6: the fp32 run rounds theta twice a step (at most 2^-24 of |theta| <= scale each: 1.2e-6 of the scale
// after 10 steps in the worst case, about 3e-7 typically) and each update's few operations (about 3e-7 of the
// update). Measured worst: 4.6e-7 (AdamW), 2.3e-7 (SGD). Rounding beta^t to fp32 before 1 - beta^t (the old bias
// correction) is off by up to 1e-4 of 1 - beta2^t in the first steps at beta2 = 0.9999: with it this test
// measured 1.8e-5 at beta2 = 0.9999 and 1.6e-6 at 0.999, and failed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cmath>

#include "tests/optim/trajectory.hpp"

using fsdp::comm::local_communicator;

namespace {
using namespace fsdp_test::optim;

struct adamw_hp {
  float lr, beta1, beta2, eps, wd;
};

/// The worst |theta - reference| / scale over every element and step (see the header).
double check_adamw(const trajectory& got, const adamw_hp& h) {
  double worst = 0;
  for (const char* name : names) {
    const bool decay = std::string(name) != "a.b";
    const auto& steps_of = got.at(name);
    const std::size_t n = steps_of[0].size();
    for (std::size_t i = 0; i < n; ++i) {
      double theta = steps_of[0][i], m = 0, v = 0;
      double scale = std::abs(theta);
      const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, eps = h.eps, wd = decay ? double(h.wd) : 0.0;
      for (int t = 1; t <= steps; ++t) {
        const double g = gradient(name, std::int64_t(i), t);
        const double before = theta;
        theta -= lr * wd * theta;
        m = b1 * m + (1 - b1) * g;
        v = b2 * v + (1 - b2) * g * g;
        const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
        theta -= lr * mhat / (std::sqrt(vhat) + eps);
        scale += std::abs(theta - before);
        const double err = std::abs(double(steps_of[t][i]) - theta) / scale;
        worst = std::max(worst, err);
      }
    }
  }
  return worst;
}

double check_sgd(const trajectory& got, float lr, float mu, float wd) {
  double worst = 0;
  for (const char* name : names) {
    const bool decay = std::string(name) != "a.b";
    const auto& steps_of = got.at(name);
    for (std::size_t i = 0; i < steps_of[0].size(); ++i) {
      double theta = steps_of[0][i], buf = 0, scale = std::abs(theta);
      for (int t = 1; t <= steps; ++t) {
        const double before = theta;
        const double g = double(gradient(name, std::int64_t(i), t)) + (decay ? double(wd) : 0.0) * theta;
        buf = double(mu) * buf + g;
        theta -= double(lr) * buf;
        scale += std::abs(theta - before);
        worst = std::max(worst, std::abs(double(steps_of[t][i]) - theta) / scale);
      }
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("AdamW follows PyTorch's documented algorithm within 1e-6 of each element's scale, beta2 0.95 to 0.9999") {
  for (float beta2 : {0.95f, 0.999f, 0.9999f}) {
    CAPTURE(beta2);
    const adamw_hp h{1e-2f, 0.9f, beta2, 1e-8f, 0.1f};
    auto make = [&](auto& m) {
      return std::make_unique<fsdp::optim::adamw<typename std::remove_reference_t<decltype(m)>::core_type>>(
          m, fsdp::optim::adamw_options{
                 .lr = h.lr, .beta1 = h.beta1, .beta2 = h.beta2, .eps = h.eps, .weight_decay = h.wd});
    };
    const trajectory one = run(1, make);
    const double worst = check_adamw(one, h);
    MESSAGE("AdamW beta2 ", beta2, ": worst |theta - reference| / scale over 10 steps = ", worst);
    CHECK(worst <= 1e-6);
    CHECK(same_bits(run(3, make), one));  // sharding changes no element's arithmetic
  }
}

TEST_CASE("the bias correction is 1 - beta^t in double, rounded once; rounding beta^t first is off by up to 1e-4") {
  double worst_naive = 0;
  for (long t : {1L, 2L, 3L, 5L, 10L, 1000L, 1000000L}) {
    CAPTURE(t);
    const double exact = 1.0 - std::pow(double(0.9999f), double(t));
    CHECK(std::abs(double(fsdp::optim::bias_correction(0.9999f, t)) - exact) <= std::ldexp(1.0, -24) * exact);
    const float naive = 1.0f - static_cast<float>(std::pow(double(0.9999f), double(t)));
    if (t <= 10) worst_naive = std::max(worst_naive, std::abs(double(naive) - exact) / exact);
  }
  // 1e-4 of 1 - beta2^t is 5e-5 of an early update (through the square root): 50 times the bound above
  CHECK(worst_naive > 9e-5);
}

TEST_CASE("SGD with momentum follows PyTorch's documented algorithm within 1e-6 of each element's scale") {
  for (float mu : {0.0f, 0.9f, 0.99f}) {
    CAPTURE(mu);
    auto make = [&](auto& m) {
      return std::make_unique<fsdp::optim::sgd<typename std::remove_reference_t<decltype(m)>::core_type>>(
          m, fsdp::optim::sgd_options{.lr = 0.05f, .momentum = mu, .weight_decay = 0.01f});
    };
    const trajectory one = run(1, make);
    const double worst = check_sgd(one, 0.05f, mu, 0.01f);
    MESSAGE("SGD momentum ", mu, ": worst |theta - reference| / scale over 10 steps = ", worst);
    CHECK(worst <= 1e-6);
    CHECK(same_bits(run(3, make), one));
  }
}

TEST_CASE("every built-in optimizer checks its lr at construction and in set_lr, naming itself; a refused set_lr "
          "keeps the lr it had") {
  fsdp_test::run_ranks(1, [](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec(), fsdp::wrap::by_prefix{"a."});
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::optim::sgd o(m, {.lr = -1.0f}); }) ==
          "fsdp: sgd: lr must be finite and >= 0, got -1");
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::optim::adamw o(m, {.lr = INFINITY}); }) ==
          "fsdp: adamw: lr must be finite and >= 0, got inf");
    fsdp::optim::sgd sgd(m, {.lr = 0.5f});
    fsdp::optim::adamw adamw(m, {.lr = 0.25f});
    fsdp::optim::lion lion(m, {.lr = 0.125f});
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { sgd.set_lr(NAN); }) ==
          "fsdp: sgd: lr must be finite and >= 0, got nan");
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { adamw.set_lr(-0.5f); }) ==
          "fsdp: adamw: lr must be finite and >= 0, got -0.5");
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { lion.set_lr(-INFINITY); }) ==
          "fsdp: lion: lr must be finite and >= 0, got -inf");
    CHECK(sgd.options().lr == 0.5f);
    CHECK(adamw.options().lr == 0.25f);
    CHECK(lion.options().lr == 0.125f);
    sgd.set_lr(0.0f);
    CHECK(sgd.options().lr == 0.0f);
  });
}
