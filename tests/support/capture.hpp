#pragma once
// A trainer whose every piece of work is issued on the backend's streams, so that its step can be captured and
// replayed (fsdp::step_graph): the model, the gradient kernel, the step, and one rank's 20 steps, eager or replayed
// (tests/model/capture_test.cc on thread ranks, tests/mpi/mpi_test.cc on processes, tests/cuda/model_test.cu into a
// CUDA graph).
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace fsdp_test::capture {

inline fsdp::ModelSpec spec() {
  fsdp::ModelSpec s;
  s.add("a.w", {7, 13}).add("a.b", {13}, {.flags = {.no_decay = true}}).add("b.w", {301}).add("c.w", {5, 5});
  return s;
}
inline const fsdp::wrap::by_function first_letter{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }};
/// A quadratic's gradient from the gathered parameter, on the compute stream: g[i] = p[i] / 4 + (i % 7 - 3) / 64,
/// times the loss scale where there is one (*scale: device memory, each replay's own), and *poison added to the first
/// element (0, or an inf that makes the optimizer skip the step).
struct quadratic_grad {
  const float* p;
  float* g;
  const float* poison;
  const float* scale;
  FSDP_HD void operator()(std::int64_t i) const {
    // i in 32 bits: a 64-bit remainder compiles to mul.hi.u64, which the simulated GPU cannot run (the tensors are
    // small)
    float v = fsdp::rn::add(fsdp::rn::mul(p[i], 0.25f), static_cast<float>(static_cast<int>(i) % 7 - 3) * 0.015625f);
    if (scale) v = fsdp::rn::mul(v, *scale);
    g[i] = i == 0 ? fsdp::rn::add(v, *poison) : v;
  }
};

/// One step whose every piece of work is issued on the backend's streams: a trainer that can be captured.
template <class M, class O>
fsdp::grad::step_report train_step(M& m, O& opt, const float* poison) {
  auto& be = m.backend();
  for (auto& u : m.forward()) (void)u;
  for (auto& u : m.backward())
    for (const auto& e : u.layout().entries()) {
      auto g = u.grad(e.name);
      be.for_each(g.numel(), quadratic_grad{u.param(e.name).data(), g.data(), poison, opt.loss_scale_on_device()},
                  be.compute_stream());
    }
  fsdp::grad::step_report report = opt.step();
  opt.zero_grad();
  return report;
}

/// What one rank ends with.
struct rank_outcome {
  std::vector<std::vector<float>> state;  // local_state: master shards and optimizer states
  long steps = 0;                         // the optimizer's update count
  fsdp::grad::scale_state scaler{};       // its loss scaler's, where it has one
  /// Each step's report (captured: step 1's, then each replay's), held to the end of the run and read there: a
  /// replay's is read before the next replay overwrites its decision's host copy.
  std::vector<fsdp::grad::report> reports;
};

/// "" where the two runs' reports say the same, bit for bit (inspected, skipped, norm, clip coefficient, loss scale,
/// gradient scale, the non-finite location); else the first step and what differs.
inline std::string differing_report(const std::vector<fsdp::grad::report>& a,
                                    const std::vector<fsdp::grad::report>& b) {
  if (a.size() != b.size()) return fsdp::detail::cat(a.size(), " reports against ", b.size());
  const auto bits = [](auto x) {
    std::uint64_t u = 0;
    std::memcpy(&u, &x, sizeof x);
    return u;
  };
  for (std::size_t t = 0; t < a.size(); ++t) {
    const fsdp::grad::report &x = a[t], &y = b[t];
    const auto at = [&](const char* what) { return fsdp::detail::cat("step ", t + 1, ": ", what, " differs"); };
    if (x.inspected != y.inspected || x.captured != y.captured) return at("inspected or captured");
    if (x.skipped != y.skipped) return at("skipped");
    if (bits(x.norm) != bits(y.norm)) return at("norm");
    if (bits(x.clip_coef) != bits(y.clip_coef)) return at("clip_coef");
    if (bits(x.loss_scale) != bits(y.loss_scale)) return at("loss_scale");
    if (bits(x.grad_scale) != bits(y.grad_scale)) return at("grad_scale");
    if (x.located != y.located || x.nonfinite.has_value() != y.nonfinite.has_value()) return at("location");
    if (x.nonfinite && (x.nonfinite->rank != y.nonfinite->rank || x.nonfinite->unit != y.nonfinite->unit ||
                        x.nonfinite->count != y.nonfinite->count))
      return at("location");
  }
  return "";
}

constexpr int steps = 20;

/// The float the gradient kernel adds to rank 0's first element, in the backend's device memory: on backend::host the
/// host's own; a GPU trainer passes one of its own with the same two members (set() writes it between steps).
struct host_poison {
  float value = 0.0f;
  const float* get() const { return &value; }
  void set(float v) { value = v; }
};

/// One rank's 20 steps: eager, or the first eager, the second captured (nothing runs) and replayed 19 times. Step
/// `poisoned` (0: none) has an inf in rank 0's gradient, written between steps. make_opt(model, scaler): the rank has a
/// loss scaler of `scaling`'s options, which the optimizer may take.
template <class Policy, class Comm, class MakeOpt, class Poison = host_poison>
rank_outcome train_rank(Comm& c, bool capture, MakeOpt&& make_opt, int poisoned,
                        fsdp::grad::loss_scaler_options scaling, Poison poison = {}) {
  fsdp::Model<Policy> m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11});
  fsdp::grad::loss_scaler scaler(scaling);
  auto opt = make_opt(m, scaler);
  poison.set(0.0f);
  auto poison_at = [&](int t) {
    m.synchronize();
    poison.set(t == poisoned && c.rank() == 0 ? std::numeric_limits<float>::infinity() : 0.0f);
  };
  std::vector<fsdp::grad::step_report> held;  // every step's, read at the end
  held.push_back(train_step(m, *opt, poison.get()));
  if (capture) {
    fsdp::step_graph graph(m, *opt, [&] { train_step(m, *opt, poison.get()); });
    CHECK(m.step_count() == 1);  // the captured step did not run
    for (int t = 2; t <= steps; ++t) {
      poison_at(t);
      held.push_back(graph.replay());
    }
  } else {
    for (int t = 2; t <= steps; ++t) {
      poison_at(t);
      held.push_back(train_step(m, *opt, poison.get()));
    }
  }
  CHECK(m.step_count() == steps);
  m.synchronize();
  CHECK(m.memory().peak == fsdp::plan_memory(m, *opt).peak);  // a captured step took no memory outside the plan
  rank_outcome out{fsdp_test::local_state(m, *opt), opt->steps(), {scaler.scale(), scaler.good_steps()}, {}};
  for (const fsdp::grad::step_report& r : held) out.reports.push_back(r.get());
  return out;
}

/// AdamW, its learning rate warmed up over 5 updates and then a cosine to a tenth at update 20 (`max_norm` > 0: clipped
/// to it; `scaled`: with the rank's loss scaler).
inline auto adamw(float max_norm = 0.0f, bool scaled = false) {
  return [max_norm, scaled](auto& m, fsdp::grad::loss_scaler& scaler) {
    return std::make_unique<fsdp::optim::adamw<fsdp::optim::detail::core_of_t<std::remove_cvref_t<decltype(m)>>>>(
        m, fsdp::optim::adamw_options{.lr = 0.05f,
                                      .weight_decay = 0.1f,
                                      .grad = {.max_norm = max_norm, .scaler = scaled ? &scaler : nullptr},
                                      .schedule = {5, 20, 0.1f}});
  };
}

}  // namespace fsdp_test::capture
