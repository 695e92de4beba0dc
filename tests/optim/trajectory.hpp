#pragma once
// What the optimizer tests share: a small model (a no-decay bias among its parameters), a gradient known for every
// element and step, and the trajectory of every parameter over `steps` optimizer steps at any world size.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace fsdp_test::optim {

using fsdp::comm::local_communicator;

inline fsdp::ModelSpec spec() {
  fsdp::ModelSpec s;
  s.add("a.w", {7, 13}).add("a.b", {13}, {.flags = {.no_decay = true}}).add("b.w", {301}).add("c.w", {5, 5});
  return s;
}
inline const char* const names[] = {"a.w", "a.b", "b.w", "c.w"};

/// The fp32 gradient of element i of parameter p at step t: signs and magnitudes from 1e-4 to 1.
inline float gradient(const std::string& p, std::int64_t i, int t) {
  const auto h =
      fsdp::init::detail::mix(fsdp::init::detail::name_hash(p) ^ (std::uint64_t(i) << 20) ^ std::uint64_t(t));
  const float mag = std::pow(10.0f, -4.0f * float(h % 1000) / 1000.0f);
  return (h >> 40) & 1 ? mag : -mag;
}

constexpr int steps = 10;
using trajectory = std::map<std::string, std::vector<std::vector<float>>>;  // per parameter, per step

/// Steps `from` to `to` of the training below on a model already made: the known gradient written on rank 0 (zero
/// on the others), then step() (the optimizer's step and zero_grad).
template <class M, class Step>
void train_steps(local_communicator& c, M& m, int from, int to, Step&& step) {
  for (int t = from; t <= to; ++t) {
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward())
      for (const auto& e : u.layout().entries()) {
        auto g = u.grad(e.name);
        for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = c.rank() == 0 ? gradient(e.name, i, t) : 0.0f;
      }
    step();
  }
}

/// Trains `steps` steps at `world` ranks (rank 0 writes the gradient, the others zero; summed, so the reduced
/// gradient is exactly the one written) with the optimizer make(model) returns (a pointer), and returns every
/// parameter after each step.
template <class MakeOpt>
trajectory run(int world, MakeOpt&& make) {
  trajectory out;
  fsdp_test::run_ranks(world, [&](local_communicator& c) {
    fsdp::model_options mo;
    mo.division.how = fsdp::grad_division::mode::sum;
    const fsdp::wrap::by_function first_letter{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }};
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec(), first_letter, fsdp::init::normal{0.5f, 11}, mo);
    auto opt = make(m);
    trajectory mine;
    auto record = [&] {
      for (const auto& [name, v] : fsdp::weights::gather_full_params(m)) mine[name].push_back(v);
    };
    record();
    for (int t = 1; t <= steps; ++t) {
      train_steps(c, m, t, t, [&] {
        opt->step();
        opt->zero_grad();
      });
      record();
    }
    if (c.rank() == 0) out = std::move(mine);
  });
  return out;
}

inline bool same_bits(const trajectory& a, const trajectory& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, v] : a)
    for (std::size_t t = 0; t < v.size(); ++t)
      if (std::memcmp(v[t].data(), b.at(name)[t].data(), v[t].size() * 4) != 0) return false;
  return true;
}

}  // namespace fsdp_test::optim
