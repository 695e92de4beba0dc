// A user's optimizer through fsdp::optim::elementwise: a rule of its own with three named states, against the same
// rule applied by a plain loop to whole fp32 arrays (bit for bit at 1, 2 and 3 ranks: an element's arithmetic does
// not depend on where its shard lives); its states planned as the library's are; a checkpoint resume at another
// world size with its states by name; the library's AdamW written as a rule from outside equal to optim::adamw bit
// for bit; and the mistakes a user can make, each refused with a sentence.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <fsdp/checkpoint/checkpoint.hpp>
#include <fsdp/model_plans.hpp>
#include <fsdp/optim/adamw.hpp>
#include <fsdp/optim/elementwise.hpp>

#include "tests/optim/trajectory.hpp"

namespace {
using namespace fsdp_test::optim;
namespace rn = fsdp::rn;

/// AMSGrad with decoupled weight decay and no bias correction: m, v and the running maximum of v, three states.
struct amsgrad_rule {
  static constexpr int states = 3;
  float lr, beta1, beta2, eps, wd;
  FSDP_HD void operator()(float& p, float g, float* s, bool decay) const {
    if (decay) p = rn::mul(p, rn::sub(1.0f, rn::mul(lr, wd)));
    s[0] = rn::add(rn::mul(beta1, s[0]), rn::mul(rn::sub(1.0f, beta1), g));
    s[1] = rn::add(rn::mul(beta2, s[1]), rn::mul(rn::mul(rn::sub(1.0f, beta2), g), g));
    s[2] = s[2] > s[1] ? s[2] : s[1];
    p = rn::sub(p, rn::div(rn::mul(lr, s[0]), rn::add(rn::sqrt(s[2]), eps)));
  }
};

/// AdamW written as a rule from outside the library, from its public update function.
struct my_adamw {
  static constexpr int states = 2;
  fsdp::optim::detail::adamw_coeffs c;
  FSDP_HD void operator()(float& p, float g, float* s, bool decay) const {
    fsdp::optim::detail::adamw_update(p, g, s[0], s[1], c, decay ? c.weight_decay : 0.0f);
  }
};

amsgrad_rule rule_at(long t) { return {1e-2f / float(t), 0.9f, 0.99f, 1e-8f, 0.1f}; }

template <class M>
auto make_amsgrad(M& m) {
  return std::make_unique<fsdp::optim::elementwise<typename M::core_type>>(m, "amsgrad",
                                                                           std::vector<std::string>{"m", "v", "v_max"});
}

/// The rule applied to whole arrays, element by element, from the model's initial values (a rank-1 run's record).
trajectory reference(const trajectory& from) {
  trajectory out;
  for (const char* name : names) {
    const bool decay = std::string(name) != "a.b";
    std::vector<float> p = from.at(name)[0];
    std::vector<float> m(p.size(), 0.0f), v(p.size(), 0.0f), vmax(p.size(), 0.0f);
    out[name].push_back(p);
    for (int t = 1; t <= steps; ++t) {
      const amsgrad_rule r = rule_at(t);
      for (std::size_t i = 0; i < p.size(); ++i) {
        float s[3] = {m[i], v[i], vmax[i]};
        r(p[i], gradient(name, std::int64_t(i), t), s, decay);
        m[i] = s[0], v[i] = s[1], vmax[i] = s[2];
      }
      out[name].push_back(p);
    }
  }
  return out;
}

/// An optimizer pointer whose step() runs the rule (the trajectory helper calls step() and zero_grad()).
template <class M>
struct stepping {
  std::unique_ptr<fsdp::optim::elementwise<typename M::core_type>> opt;
  void step() { opt->step(rule_at); }
  void zero_grad() { opt->zero_grad(); }
  stepping* operator->() { return this; }
};
}  // namespace

TEST_CASE("a user's three-state rule trains as the same rule over whole arrays, bit for bit at 1, 2 and 3 ranks") {
  auto make = [](auto& m) { return stepping<std::remove_reference_t<decltype(m)>>{make_amsgrad(m)}; };
  const trajectory one = run(1, make);
  const trajectory want = reference(one);
  CHECK(same_bits(one, want));
  CHECK(same_bits(run(2, make), want));
  CHECK(same_bits(run(3, make), want));
  // it moved: the comparison is of an update, not of constants
  CHECK(std::memcmp(one.at("b.w")[0].data(), one.at("b.w")[steps].data(), 4 * one.at("b.w")[0].size()) != 0);
}

TEST_CASE("the library's AdamW written as a rule from outside is optim::adamw, bit for bit") {
  const fsdp::optim::adamw_options o{.lr = 3e-3f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.2f};
  auto library = [&](auto& m) {
    return std::make_unique<fsdp::optim::adamw<typename std::remove_reference_t<decltype(m)>::core_type>>(m, o);
  };
  auto mine = [&](auto& m) {
    using M = std::remove_reference_t<decltype(m)>;
    struct opt_t {
      std::unique_ptr<fsdp::optim::elementwise<typename M::core_type>> e;
      fsdp::optim::adamw_options o;
      void step() {
        e->step([&](long t) {
          return my_adamw{{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, fsdp::optim::bias_correction(o.beta1, t),
                           fsdp::optim::bias_correction(o.beta2, t)}};
        });
      }
      void zero_grad() { e->zero_grad(); }
      opt_t* operator->() { return this; }
    };
    return opt_t{std::make_unique<fsdp::optim::elementwise<typename M::core_type>>(
                     m, "adamw", std::vector<std::string>{"exp_avg", "exp_avg_sq"}),
                 o};
  };
  CHECK(same_bits(run(2, mine), run(2, library)));
}

TEST_CASE("a user's rule: its states planned as the library's, and checkpointed by name at another world size") {
  fsdp_test::scratch_dir dir("elementwise-resume");
  auto make = [](auto& m) { return stepping<std::remove_reference_t<decltype(m)>>{make_amsgrad(m)}; };
  const trajectory straight = run(2, make);
  fsdp::model_options mo;
  mo.division.how = fsdp::grad_division::mode::sum;
  const fsdp::wrap::by_function first_letter{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }};
  using M = fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>>;
  fsdp_test::run_ranks(2, [&](local_communicator& c) {
    M m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11}, mo);
    auto opt = make_amsgrad(m);
    CHECK(opt->states_per_element() == 3);
    const fsdp::memory_figures planned = fsdp::plan_memory(m, opt->states_per_element()).peak;
    train_steps(c, m, 1, 3, [&] {
      opt->step(rule_at);
      opt->zero_grad();
    });
    CHECK(m.memory().peak[fsdp::mem::optimizer_state] == planned[fsdp::mem::optimizer_state]);
    // three fp32 states per shard element, and the step block (its update count and the step's rule)
    CHECK(planned[fsdp::mem::optimizer_state] == 3 * 4 * [&] {
      std::int64_t n = 0;
      for (std::size_t u = 0; u < m.size(); ++u) n += m.unit(u).layout().shard_numel();
      return n;
    }() + fsdp::plan::step_block_cost().bytes());
    fsdp::checkpoint::save(m, *opt, dir / "step-3");
  });
  CHECK(fsdp::checkpoint::read_manifest(dir / "step-3").optimizer->states ==
        std::vector<std::string>{"m", "v", "v_max"});
  std::map<std::string, std::vector<float>> resumed;
  fsdp_test::run_ranks(3, [&](local_communicator& c) {
    M m(c, spec(), first_letter, fsdp::init::normal{0.5f, 99}, mo);
    auto opt = make_amsgrad(m);
    fsdp::checkpoint::load(m, *opt, dir / "step-3");
    CHECK(opt->steps() == 3);
    train_steps(c, m, 4, 5, [&] {
      opt->step(rule_at);
      opt->zero_grad();
    });
    auto full = fsdp::weights::gather_full_params(m);
    if (c.rank() == 0) resumed = std::move(full);
  });
  for (const char* name : names) {
    CAPTURE(name);
    CHECK(std::memcmp(resumed.at(name).data(), straight.at(name)[5].data(), 4 * resumed.at(name).size()) == 0);
  }
  // loaded into an optimizer with other states: refused, naming both
  fsdp_test::run_ranks(1, [&](local_communicator& c) {
    M m(c, spec(), first_letter, fsdp::init::normal{0.5f, 99}, mo);
    fsdp::optim::elementwise other(m, "amsgrad", {"m", "v"});
    CHECK(fsdp_test::error_of<std::runtime_error>([&] { fsdp::checkpoint::load(m, other, dir / "step-3"); }) ==
          "fsdp: checkpoint load from '" + (dir / "step-3") + "' failed (no parameter was modified): rank 0: "
          "checkpoint '" + (dir / "step-3") +
              "': saved by amsgrad with states [m, v, v_max]; this optimizer is amsgrad with states [m, v]");
  });
}

TEST_CASE("a user's optimizer: a rule whose state count differs from its names, an empty or repeated name, refused") {
  fsdp_test::run_ranks(1, [&](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec(), fsdp::wrap::by_prefix{"a."});
    fsdp::optim::elementwise two(m, "mine", {"m", "v"});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { two.step(rule_at); }) ==
          "fsdp: optimizer 'mine': its rule keeps 3 state value(s) per element, but it was made with 2 state name(s) "
          "(m, v); give one name per state");
    CHECK(two.steps() == 0);
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::optim::elementwise e(m, "", {"m"}); }) ==
          "fsdp: optim::elementwise: the optimizer's name is empty (checkpoints record it)");
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::optim::elementwise e(m, "mine", {"m", ""}); }) ==
          "fsdp: optimizer 'mine': state 1 has an empty name (checkpoints save states by name)");
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { fsdp::optim::elementwise e(m, "mine", {"m", "v", "m"}); }) ==
          "fsdp: optimizer 'mine': state name 'm' is given twice (states 0 and 2)");
  });
}
