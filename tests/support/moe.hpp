#pragma once
// A mixture-of-experts trainer for tests, on any communicator (thread ranks, MPI processes): a dense unit (a
// projection [D, D] and a router [X, D]) and an expert unit (X experts, each two products: w1 [H, D] and w2 [D, H],
// stacked on dimension 0), wrapped with wrap::by_prefix{"u."}. Each token goes to its router's top-1 expert by the
// trainer's all_to_all_v on the model's expert group, and its output comes back the same way scaled by the gate:
// out = h + gate * expert(h), h = W x; the loss is the mean squared error against a target. Backward sends each
// token's output gradient to its expert and the expert's input gradient back. Every rank trains on its slice of a
// global batch of `tokens` tokens; one rank holding every expert trains the same global model.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <fsdp/fsdp.hpp>

namespace fsdp_test::moe {

inline constexpr int D = 4, X = 4, H = 6, tokens = 24, steps = 4;

inline fsdp::ModelSpec spec() {
  fsdp::ModelSpec s;
  s.add("u.dense.w", {D, D});
  s.add("u.dense.router", {X, D}, {.init = fsdp::init::uniform{-0.5f, 0.5f, 3}});
  s.add("u.moe.w1", {X, H, D}, {.experts = true});
  s.add("u.moe.w2", {X, D, H}, {.init = fsdp::init::uniform{-0.4f, 0.4f, 4}, .experts = true});
  return s;
}

/// Token g's input and target, element i.
inline float input(int g, int i) { return std::sin(0.37f * float(g) + 1.1f * float(i)); }
inline float target(int g, int i) { return 0.5f * std::cos(0.23f * float(g) - 0.9f * float(i)); }

/// What one rank saw.
struct rank_result {
  std::vector<float> losses;                         ///< the global mean loss of each step
  std::vector<double> norms;                         ///< the gradient norm of each step (with max_norm)
  std::map<std::string, std::vector<float>> params;  ///< this rank's local parameters after training
  bool memory_as_planned = false;                    ///< the measured peak equals the plan, by category
  std::int64_t expert_exchanges = 0;                 ///< the expert group's all_to_all_v calls
  std::int64_t dense_reductions = 0;                 ///< the shard group's reduce-scatters (sharding strategies)
  std::int64_t expert_reductions = 0;  ///< the expert shard group's reduce-scatters, or all-reduces (no_shard)
};

/// The trainer's dispatch or combine of `width` floats a token: over the expert group, or to itself without one.
template <class Comm, class Backend>
void exchange(Comm* ep, const std::vector<float>& send, const std::vector<std::int64_t>& send_tokens,
              std::vector<float>& recv, const std::vector<std::int64_t>& recv_tokens, int width, Backend& be) {
  std::vector<std::int64_t> sc, rc;
  std::int64_t n = 0;
  for (std::size_t q = 0; q < send_tokens.size(); ++q) {
    sc.push_back(send_tokens[q] * width);
    rc.push_back(recv_tokens[q] * width);
    n += rc.back();
  }
  recv.assign(std::size_t(n), 0.0f);
  if (!ep) {
    recv = send;
    return;
  }
  ep->all_to_all_v(send.data(), sc, recv.data(), rc, fsdp::dtype::f32, be.compute_stream());
  be.synchronize(be.compute_stream());
}

/// `steps` AdamW steps of the trainer on this rank of `c` (every rank data-parallel), `expert` ranks an expert group
/// (1: every rank holds every expert). `max_norm` > 0: AdamW clips the global norm to it.
template <class Policy, class Comm>
rank_result train(Comm& c, int expert, float max_norm = 0.0f) {
  rank_result out;
  {
    const int world = c.size();
    fsdp::model_options o;
    o.expert_parallel = expert;
    fsdp::Model<Policy> m(c, spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{0.3f, 5}, o);
    fsdp::optim::adamw opt(m, {.lr = 1e-2f, .weight_decay = 0.01f, .grad = {.max_norm = max_norm}});
    const fsdp::memory_plan plan = fsdp::plan_memory(m, opt);
    auto& be = m.backend();
    auto& cs = be.compute_stream();
    auto* ep = m.expert_comm();
    const int n = tokens / world, first = c.rank() * n, per_rank = X / expert;
    std::vector<float> h, p, gate, y, z, a, dh, dg, recv, back;
    std::vector<int> chosen, order;
    std::vector<std::int64_t> send_tokens, recv_tokens;
    for (int step = 0; step < steps; ++step) {
      float loss = 0;
      std::vector<float> dout(std::size_t(n) * D);
      for (auto& u : m.forward()) {
        if (u.name() == "u.dense") {  // h = W x; the router's softmax and its top-1 expert
          const auto w = u.param("u.dense.w"), r = u.param("u.dense.router");
          h.assign(std::size_t(n) * D, 0.0f);
          p.assign(std::size_t(n) * X, 0.0f);
          gate.assign(std::size_t(n), 0.0f);
          chosen.assign(std::size_t(n), 0);
          for (int t = 0; t < n; ++t) {
            for (int o = 0; o < D; ++o)
              for (int i = 0; i < D; ++i) h[std::size_t(t * D + o)] += w[o * D + i] * input(first + t, i);
            float top = -1e30f, sum = 0;
            for (int e = 0; e < X; ++e) {
              float l = 0;
              for (int i = 0; i < D; ++i) l += r[e * D + i] * h[std::size_t(t * D + i)];
              p[std::size_t(t * X + e)] = l;
              top = std::max(top, l);
            }
            for (int e = 0; e < X; ++e) sum += p[std::size_t(t * X + e)] = std::exp(p[std::size_t(t * X + e)] - top);
            for (int e = 0; e < X; ++e) p[std::size_t(t * X + e)] /= sum;
            chosen[std::size_t(t)] =
                int(std::max_element(p.begin() + t * X, p.begin() + (t + 1) * X) - p.begin()) - t * X;
            gate[std::size_t(t)] = p[std::size_t(t * X + chosen[std::size_t(t)])];
          }
          continue;
        }
        // u.moe: dispatch each token (its h and its expert on the destination rank) to the rank holding its expert,
        // run the experts there, combine the outputs back: out = h + gate * y
        const auto w1 = u.param("u.moe.w1"), w2 = u.param("u.moe.w2");
        order.clear();
        send_tokens.assign(std::size_t(expert), 0);
        for (int q = 0; q < expert; ++q)
          for (int t = 0; t < n; ++t)
            if (chosen[std::size_t(t)] / per_rank == q) {
              order.push_back(t);
              ++send_tokens[std::size_t(q)];
            }
        recv_tokens.assign(std::size_t(expert), 0);
        if (ep) {
          ep->all_to_all(send_tokens.data(), recv_tokens.data(), sizeof(std::int64_t), fsdp::dtype::i8, cs);
          be.synchronize(cs);
        } else {
          recv_tokens = send_tokens;
        }
        std::vector<float> send;
        for (int t : order) {
          for (int i = 0; i < D; ++i) send.push_back(h[std::size_t(t * D + i)]);
          send.push_back(float(chosen[std::size_t(t)] % per_rank));
        }
        exchange(ep, send, send_tokens, recv, recv_tokens, D + 1, be);
        const std::size_t k_in = recv.size() / (D + 1);
        z.assign(k_in * D, 0.0f);
        a.assign(k_in * H, 0.0f);
        std::vector<float> yk(k_in * D, 0.0f);
        for (std::size_t k = 0; k < k_in; ++k) {
          const int e = int(recv[k * (D + 1) + D]);
          for (int i = 0; i < D; ++i) z[k * D + std::size_t(i)] = recv[k * (D + 1) + std::size_t(i)];
          for (int j = 0; j < H; ++j)
            for (int i = 0; i < D; ++i)
              a[k * H + std::size_t(j)] += w1[(e * H + j) * D + i] * z[k * D + std::size_t(i)];
          for (int o = 0; o < D; ++o)
            for (int j = 0; j < H; ++j)
              yk[k * D + std::size_t(o)] += w2[(e * D + o) * H + j] * std::max(a[k * H + std::size_t(j)], 0.0f);
        }
        exchange(ep, yk, recv_tokens, back, send_tokens, D, be);
        y.assign(std::size_t(n) * D, 0.0f);
        for (std::size_t s = 0; s < order.size(); ++s)
          for (int i = 0; i < D; ++i) y[std::size_t(order[s] * D + i)] = back[s * D + std::size_t(i)];
        for (int t = 0; t < n; ++t)
          for (int i = 0; i < D; ++i) {
            const std::size_t q = std::size_t(t * D + i);
            const float diff = h[q] + gate[std::size_t(t)] * y[q] - target(first + t, i);
            loss += diff * diff / float(n * D);
            dout[q] = 2.0f * diff / float(n * D);
          }
      }
      std::vector<int> recv_experts;
      for (auto& u : m.backward()) {
        if (u.name() == "u.moe") {  // dy = gate * dout to the experts; their input gradients back into dh
          const auto w1 = u.param("u.moe.w1"), w2 = u.param("u.moe.w2");
          const auto g1 = u.grad("u.moe.w1"), g2 = u.grad("u.moe.w2");
          dh = dout;
          dg.assign(std::size_t(n), 0.0f);
          std::vector<float> send;
          for (int t : order) {
            for (int i = 0; i < D; ++i) {
              dg[std::size_t(t)] += dout[std::size_t(t * D + i)] * y[std::size_t(t * D + i)];
              send.push_back(gate[std::size_t(t)] * dout[std::size_t(t * D + i)]);
            }
          }
          std::vector<float> dy;
          exchange(ep, send, send_tokens, dy, recv_tokens, D, be);
          const std::size_t k_in = dy.size() / D;
          std::vector<float> dz(k_in * D, 0.0f);
          for (std::size_t k = 0; k < k_in; ++k) {
            const int e = int(recv[k * (D + 1) + D]);
            std::vector<float> da(H, 0.0f);
            for (int o = 0; o < D; ++o)
              for (int j = 0; j < H; ++j) {
                const float r = std::max(a[k * H + std::size_t(j)], 0.0f);
                g2[(e * D + o) * H + j] += dy[k * D + std::size_t(o)] * r;
                if (a[k * H + std::size_t(j)] > 0)
                  da[std::size_t(j)] += w2[(e * D + o) * H + j] * dy[k * D + std::size_t(o)];
              }
            for (int j = 0; j < H; ++j)
              for (int i = 0; i < D; ++i) {
                g1[(e * H + j) * D + i] += da[std::size_t(j)] * z[k * D + std::size_t(i)];
                dz[k * D + std::size_t(i)] += w1[(e * H + j) * D + i] * da[std::size_t(j)];
              }
          }
          exchange(ep, dz, recv_tokens, back, send_tokens, D, be);
          for (std::size_t s = 0; s < order.size(); ++s)
            for (int i = 0; i < D; ++i) dh[std::size_t(order[s] * D + i)] += back[s * D + std::size_t(i)];
          continue;
        }
        // u.dense: the gate's gradient through the softmax into the router and h, then W
        const auto r = u.param("u.dense.router");
        const auto gw = u.grad("u.dense.w"), gr = u.grad("u.dense.router");
        for (int t = 0; t < n; ++t) {
          const int c_t = chosen[std::size_t(t)];
          for (int e = 0; e < X; ++e) {
            const float pe = p[std::size_t(t * X + e)];
            const float dl = dg[std::size_t(t)] * gate[std::size_t(t)] * ((e == c_t ? 1.0f : 0.0f) - pe);
            for (int i = 0; i < D; ++i) {
              gr[e * D + i] += dl * h[std::size_t(t * D + i)];
              dh[std::size_t(t * D + i)] += r[e * D + i] * dl;
            }
          }
          for (int o = 0; o < D; ++o)
            for (int i = 0; i < D; ++i) gw[o * D + i] += dh[std::size_t(t * D + o)] * input(first + t, i);
        }
      }
      const fsdp::grad::report rep = opt.step();
      opt.zero_grad();
      m.comm().all_reduce(&loss, &loss, 1, fsdp::dtype::f32, fsdp::reduce_op::avg, cs);
      out.losses.push_back(loss);
      if (max_norm > 0) out.norms.push_back(rep.norm);
    }
    m.synchronize();
    out.memory_as_planned = m.memory().peak == plan.peak;  // every category
    out.params = fsdp::weights::gather_full_params(m);
    if (ep) out.expert_exchanges = std::int64_t(ep->stats()[fsdp::collective::all_to_all_v]);
    const fsdp::collective reduction =
        m.facts().strategy.shards_params ? fsdp::collective::reduce_scatter : fsdp::collective::all_reduce;
    if (reduction == fsdp::collective::reduce_scatter)  // the shard group may be the world, whose all-reduces
      out.dense_reductions = std::int64_t(m.shard_comm().stats()[reduction]);  // are the trainer's and optimizer's
    if (auto* es = m.expert_shard_comm()) out.expert_reductions = std::int64_t(es->stats()[reduction]);
  }
  return out;
}

/// The global model from the local parameters of the first `expert` ranks (an expert group): the dense parameters
/// as rank 0 holds them, each stack of experts its ranks' shares in order.
inline std::map<std::string, std::vector<float>> global_params(
    const std::vector<std::map<std::string, std::vector<float>>>& local, int expert) {
  std::map<std::string, std::vector<float>> out;
  const fsdp::ModelSpec s = spec();
  for (const fsdp::ParamSpec& p : s.params())
    for (int q = 0; q < (p.experts ? expert : 1); ++q) {
      const std::vector<float>& l = local[std::size_t(q)].at(p.name);
      out[p.name].insert(out[p.name].end(), l.begin(), l.end());
    }
  return out;
}

}  // namespace fsdp_test::moe
