#pragma once
// The single-process references of the parity tests: the MLP's fp32 parameters as initialised (from the init
// rule, whose world-size independence model_test proves) and the optimizers' per-element updates written as plain
// fp32 loops (torch.optim.AdamW; torch.optim.SGD with momentum and L2 weight decay), independent of the library's
// optimizer code.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "examples/01_mlp_host/mlp.hpp"

namespace mlp_reference {

/// Master parameters and optimizer state per layer (m1/m2: 2l for the weight, 2l + 1 for the bias).
struct state {
  std::vector<std::vector<float>> w, b, m1, m2;

  explicit state(const mlp::config& c) {
    const std::size_t layers = c.dims.size() - 1;
    w.resize(layers);
    b.resize(layers);
    m1.resize(2 * layers);
    m2.resize(2 * layers);
    for (std::size_t l = 0; l < layers; ++l) {
      const int in = c.dims[l], out = c.dims[l + 1];
      w[l].resize(static_cast<std::size_t>(in) * out);
      const float std = 1.0f / std::sqrt(static_cast<float>(in));
      for (std::size_t i = 0; i < w[l].size(); ++i)
        w[l][i] = fsdp::init::value(fsdp::init::normal{std, c.seed}, mlp::wname(l), i);
      b[l].assign(static_cast<std::size_t>(out), 0.0f);
      m1[2 * l].assign(w[l].size(), 0.0f);
      m2[2 * l].assign(w[l].size(), 0.0f);
      m1[2 * l + 1].assign(b[l].size(), 0.0f);
      m2[2 * l + 1].assign(b[l].size(), 0.0f);
    }
  }

  std::map<std::string, std::vector<float>> params() const {
    std::map<std::string, std::vector<float>> out;
    for (std::size_t l = 0; l < w.size(); ++l) {
      out[mlp::wname(l)] = w[l];
      out[mlp::bname(l)] = b[l];
    }
    return out;
  }
};

/// The optimizer step `step` (0-based) of every tensor: grad_w(l, i), grad_b(l, i) give the gradients; weights are
/// decayed, biases (no_decay) are not. AdamW's bias corrections are 1 - beta^t in double from the fp32 betas, as
/// the options hold them, rounded once.
template <class GradW, class GradB>
void step(const mlp::config& c, int step, state& s, GradW&& grad_w, GradB&& grad_b) {
  const float t1 = static_cast<float>(1.0 - std::pow(double(0.9f), step + 1));
  const float t2 = static_cast<float>(1.0 - std::pow(double(0.999f), step + 1));
  auto update = [&](std::vector<float>& p, auto&& grad, std::vector<float>& m, std::vector<float>& v, bool decay) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      const float g = grad(i);
      if (c.optimizer == "adamw") {  // torch.optim.AdamW
        if (decay) p[i] *= 1.0f - c.lr * c.weight_decay;
        m[i] = 0.9f * m[i] + (1.0f - 0.9f) * g;
        v[i] = 0.999f * v[i] + (1.0f - 0.999f) * g * g;
        p[i] -= c.lr * (m[i] / t1) / (std::sqrt(v[i] / t2) + 1e-8f);
      } else {  // torch.optim.SGD, momentum, L2 weight decay
        const float gi = g + (decay ? c.weight_decay : 0.0f) * p[i];
        m[i] = c.momentum * m[i] + gi;
        p[i] -= c.lr * m[i];
      }
    }
  };
  for (std::size_t l = 0; l < s.w.size(); ++l) {
    update(s.w[l], [&](std::size_t i) { return grad_w(l, i); }, s.m1[2 * l], s.m2[2 * l], true);
    update(s.b[l], [&](std::size_t i) { return grad_b(l, i); }, s.m1[2 * l + 1], s.m2[2 * l + 1], false);
  }
}

}  // namespace mlp_reference
