// Experts on their own mesh, over thread ranks: the expert dimension's groups, each rank's share of the experts
// (its local shapes and the global model's initial values), the refusals, and training parity: a mixture-of-experts
// trainer (a dense projection and a router, then top-1 experts reached by the trainer's all_to_all_v on the model's
// expert group) at expert_parallel = 1, 2, 4 over 1 to 3 ranks holding the same experts trains the same global
// model as one rank holding every expert, under every sharding strategy.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::run_ranks;

namespace {
constexpr int D = 4, X = 4, H = 6, tokens = 24, steps = 4;

/// A dense unit (a projection [D, D] and a router [X, D]) and an expert unit (X experts, each two products: w1
/// [H, D] and w2 [D, H], stacked on dimension 0), wrapped with wrap::by_prefix{"u."}: units u.dense and u.moe.
fsdp::ModelSpec moe_spec() {
  fsdp::ModelSpec s;
  s.add("u.dense.w", {D, D});
  s.add("u.dense.router", {X, D}, {.init = fsdp::init::uniform{-0.5f, 0.5f, 3}});
  s.add("u.moe.w1", {X, H, D}, {.experts = true});
  s.add("u.moe.w2", {X, D, H}, {.init = fsdp::init::uniform{-0.4f, 0.4f, 4}, .experts = true});
  return s;
}

/// Token g's input and target, element i.
float input(int g, int i) { return std::sin(0.37f * float(g) + 1.1f * float(i)); }
float target(int g, int i) { return 0.5f * std::cos(0.23f * float(g) - 0.9f * float(i)); }

struct trained {
  std::vector<float> losses;                         ///< the global mean loss of each step
  std::vector<double> norms;                         ///< rank 0's gradient norm of each step (with max_norm)
  std::map<std::string, std::vector<float>> params;  ///< every global parameter after training
  bool memory_as_planned = true;                     ///< every rank's measured peak equals its planned peak
  std::int64_t expert_exchanges = 0;                 ///< rank 0's expert group's all_to_all_v calls
  std::int64_t dense_reductions = 0;                 ///< rank 0's shard group's reduce-scatters (sharding strategies)
  std::int64_t expert_reductions = 0;  ///< rank 0's expert shard group's reduce-scatters, or all-reduces (no_shard)
};

/// The trainer's dispatch or combine of `width` floats a token: over the expert group, or to itself without one.
void exchange(local_communicator* ep, const std::vector<float>& send, const std::vector<std::int64_t>& send_tokens,
              std::vector<float>& recv, const std::vector<std::int64_t>& recv_tokens, int width,
              fsdp::backend::host& be) {
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

/// `steps` AdamW steps of the MoE trainer at `world` ranks (all data-parallel), `expert` of them an expert group
/// (1: every rank holds every expert); each rank trains on its slice of the global batch of `tokens` tokens.
/// `max_norm` > 0: AdamW clips the global norm to it.
template <class Policy>
trained train(int world, int expert, float max_norm = 0.0f) {
  const fsdp::ModelSpec spec = moe_spec();
  std::vector<std::map<std::string, std::vector<float>>> local(static_cast<std::size_t>(expert));
  trained out;
  std::mutex mu;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = expert;
    fsdp::Model<Policy> m(c, spec, fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{0.3f, 5}, o);
    fsdp::optim::adamw opt(m, {.lr = 1e-2f, .weight_decay = 0.01f, .grad = {.max_norm = max_norm}});
    const fsdp::memory_plan plan = fsdp::plan_memory(m, opt);
    auto& be = m.backend();
    auto& cs = be.compute_stream();
    local_communicator* ep = m.expert_comm();
    const int n = tokens / world, first = c.rank() * n, per_rank = X / expert;
    std::vector<float> h, logits, p, gate, y, z, a, dh, dg, recv, back;
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
      if (c.rank() == 0) out.losses.push_back(loss);
      if (c.rank() == 0 && max_norm > 0) out.norms.push_back(rep.norm);
    }
    m.synchronize();
    const bool as_planned = m.memory().peak.total == plan.peak.total;
    auto full = fsdp::weights::gather_full_params(m);
    std::lock_guard lk(mu);
    out.memory_as_planned = out.memory_as_planned && as_planned;
    if (c.rank() == 0) {
      if (ep) out.expert_exchanges = ep->stats()[fsdp::collective::all_to_all_v];
      const fsdp::collective reduction =
          m.facts().strategy.shards_params ? fsdp::collective::reduce_scatter : fsdp::collective::all_reduce;
      if (reduction == fsdp::collective::reduce_scatter)  // the shard group may be the world, whose all-reduces
        out.dense_reductions = m.shard_comm().stats()[reduction];  // are the trainer's and the optimizer's too
      if (auto* es = m.expert_shard_comm()) out.expert_reductions = es->stats()[reduction];
    }
    if (c.rank() < expert) local[static_cast<std::size_t>(c.rank())] = std::move(full);
  });
  // the global model: the dense parameters as rank 0 holds them, each stack of experts its ranks' shares in order
  for (const fsdp::ParamSpec& p : spec.params())
    for (int q = 0; q < (p.experts ? expert : 1); ++q) {
      const std::vector<float>& l = local[std::size_t(q)].at(p.name);
      out.params[p.name].insert(out.params[p.name].end(), l.begin(), l.end());
    }
  return out;
}

float relative(float a, float b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-3f); }

template <class Strategy>
void check_parity(int world, int expert, float max_norm = 0.0f) {
  using P = fsdp::policy<Strategy>;
  CAPTURE(Strategy::name);
  CAPTURE(world);
  CAPTURE(expert);
  CAPTURE(max_norm);
  const trained ep = train<P>(world, expert, max_norm),
                one = train<fsdp::policy<fsdp::sharding::full_shard>>(1, 1, max_norm);
  constexpr float tolerance = 2e-5f;
  REQUIRE(ep.losses.size() == one.losses.size());
  for (std::size_t s = 0; s < one.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(relative(ep.losses[s], one.losses[s]) <= tolerance);
  }
  REQUIRE(ep.norms.size() == one.norms.size());
  for (std::size_t s = 0; s < one.norms.size(); ++s) {  // every expert counted once, none missed
    CAPTURE(s);
    CHECK(std::fabs(ep.norms[s] - one.norms[s]) <= tolerance * one.norms[s]);
    CHECK(one.norms[s] > max_norm);  // so the clipping acted
  }
  CHECK(ep.memory_as_planned);
  // per step the trainer's four exchanges (dispatch and combine, forward and backward); each unit's one reduction
  // a step, the expert unit's on the expert shard group when there is one
  CHECK(ep.expert_exchanges == (expert > 1 ? 4 * steps : 0));
  if (Strategy::shards_params) CHECK(ep.dense_reductions == (expert > 1 ? 1 : 2) * steps);
  CHECK(ep.expert_reductions == (expert > 1 ? steps : 0));
  float worst = 0;
  for (const auto& [name, want] : one.params) {
    const std::vector<float>& got = ep.params.at(name);
    REQUIRE(got.size() == want.size());
    float scale = 0;
    for (float v : want) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
  }
  CHECK(worst <= tolerance);
}

using fsdp::sharding::full_shard;
using fsdp::sharding::hybrid_shard;
using fsdp::sharding::hybrid_shard_zero2;
using fsdp::sharding::no_shard;
using fsdp::sharding::shard_grad_op;
using fsdp::sharding::zero1;

/// The world rank of every member of `c`, in its rank order.
std::vector<int> members(local_communicator& c, int world_rank, fsdp::backend::host& be) {
  std::vector<float> all(static_cast<std::size_t>(c.size()));
  const float mine = static_cast<float>(world_rank);
  c.all_gather(&mine, all.data(), 1, fsdp::dtype::f32, be.compute_stream());
  return {all.begin(), all.end()};
}
}  // namespace

TEST_CASE(
    "the expert dimension: expert groups are consecutive data-parallel ranks; the ranks holding the same experts "
    "shard them") {
  std::map<int, std::vector<int>> expert_group, expert_shard, shard;
  std::mutex mu;
  // full_shard over 8 ranks, expert_parallel 2: the mesh 1 x 4 x 2 x 1
  run_ranks(8, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<full_shard>> m(c, moe_spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    CHECK(m.mesh() == fsdp::device_mesh{1, 8, 1, 2});
    CHECK(fsdp::mesh::sizes_text(m.mesh()) == "1 x 4 x 2 x 1");
    CHECK(m.mesh().expert_rank(c.rank()) == c.rank() % 2);
    CHECK(m.mesh().expert_shard_rank(c.rank()) == c.rank() / 2);
    CHECK(m.mesh().shard_rank(c.rank()) == c.rank());
    REQUIRE(m.expert_comm() != nullptr);
    REQUIRE(m.expert_shard_comm() != nullptr);
    CHECK(m.replicate_comm() == nullptr);
    // each rank holds half the experts, sharded over 4 ranks; the dense parameters over all 8
    CHECK(m.spec().at("u.moe.w1").shape == std::vector<std::int64_t>{X / 2, H, D});
    CHECK(m.spec().at("u.dense.w").shape == std::vector<std::int64_t>{D, D});
    CHECK(m.unit("u.moe").layout().world() == 4);
    CHECK(m.unit("u.dense").layout().world() == 8);
    auto e = members(*m.expert_comm(), c.rank(), m.backend());
    auto es = members(*m.expert_shard_comm(), c.rank(), m.backend());
    std::lock_guard lk(mu);
    expert_group[c.rank()] = e;
    expert_shard[c.rank()] = es;
  });
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(expert_group[r] == std::vector<int>{r / 2 * 2, r / 2 * 2 + 1});
    CHECK(expert_shard[r] == std::vector<int>{r % 2, r % 2 + 2, r % 2 + 4, r % 2 + 6});
  }
  // hybrid_shard<4> over 8 ranks, expert_parallel 2: experts within a replica, the replicas as for dense units
  run_ranks(8, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<hybrid_shard<4>>> m(c, moe_spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    CHECK(m.mesh() == fsdp::device_mesh{2, 4, 1, 2});
    REQUIRE(m.replicate_comm() != nullptr);
    auto es = members(*m.expert_shard_comm(), c.rank(), m.backend());
    auto s = members(m.shard_comm(), c.rank(), m.backend());
    std::lock_guard lk(mu);
    expert_shard[c.rank()] = es;
    shard[c.rank()] = s;
  });
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(expert_shard[r] == std::vector<int>{r / 4 * 4 + r % 2, r / 4 * 4 + r % 2 + 2});
    CHECK(shard[r] == std::vector<int>{r / 4 * 4, r / 4 * 4 + 1, r / 4 * 4 + 2, r / 4 * 4 + 3});
  }
  // no_shard over 6 ranks, expert_parallel 2: the dimension comes out of the replicas; whole experts all-reduced
  // over the ranks that hold the same ones
  run_ranks(6, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<no_shard>> m(c, moe_spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
    CHECK(m.mesh() == fsdp::device_mesh{6, 1, 1, 2});
    CHECK(fsdp::mesh::sizes_text(m.mesh()) == "3 x 1 x 2 x 1");
    CHECK(m.unit("u.moe").layout().world() == 1);
    CHECK(members(*m.expert_shard_comm(), c.rank(), m.backend()) ==
          std::vector<int>{c.rank() % 2, c.rank() % 2 + 2, c.rank() % 2 + 4});
    CHECK(members(*m.expert_comm(), c.rank(), m.backend()) == std::vector<int>{c.rank() / 2 * 2, c.rank() / 2 * 2 + 1});
  });
}

TEST_CASE("each rank holds its share of the experts: the global model's initial values, whatever the expert groups") {
  const auto at_start = [](int world, int expert) {
    std::vector<std::map<std::string, std::vector<float>>> local(static_cast<std::size_t>(expert));
    std::mutex mu;
    run_ranks(world, [&](local_communicator& c) {
      fsdp::model_options o;
      o.expert_parallel = expert;
      fsdp::Model<fsdp::policy<full_shard>> m(c, moe_spec(), fsdp::wrap::by_prefix{"u."}, fsdp::init::normal{}, o);
      auto full = fsdp::weights::gather_full_params(m);
      std::lock_guard lk(mu);
      if (c.rank() < expert) local[std::size_t(c.rank())] = std::move(full);
    });
    std::map<std::string, std::vector<float>> out;
    const fsdp::ModelSpec spec = moe_spec();
    for (const fsdp::ParamSpec& p : spec.params())
      for (int q = 0; q < (p.experts ? expert : 1); ++q)
        out[p.name].insert(out[p.name].end(), local[std::size_t(q)].at(p.name).begin(),
                           local[std::size_t(q)].at(p.name).end());
    return out;
  };
  const auto one = at_start(1, 1);
  CHECK(at_start(2, 2) == one);
  CHECK(at_start(4, 4) == one);
  CHECK(at_start(6, 2) == one);
  CHECK(at_start(8, 4) == one);
}

TEST_CASE(
    "experts train the same global model as one rank holding every expert: full_shard, E = 1, 2, 4 x 1 to 3 "
    "ranks holding the same experts") {
  for (int expert : {1, 2, 4})
    for (int edp : {1, 2, 3}) check_parity<full_shard>(expert * edp, expert);
}

TEST_CASE("experts under shard_grad_op, zero1, no_shard and the hybrid strategies") {
  for (int expert : {2, 4}) {
    check_parity<shard_grad_op>(expert * 2, expert);
    check_parity<zero1>(expert * 2, expert);
    check_parity<no_shard>(expert, expert);
    check_parity<no_shard>(expert * 3, expert);
  }
  check_parity<hybrid_shard<2>>(4, 2);
  check_parity<hybrid_shard<4>>(8, 2);
  check_parity<hybrid_shard<4>>(8, 4);
  check_parity<hybrid_shard_zero2<4>>(12, 2);
}

TEST_CASE("clipping over dense and expert shards: one global norm, every expert counted once") {
  check_parity<full_shard>(4, 2, 0.05f);
  check_parity<hybrid_shard<2>>(8, 2, 0.05f);
  check_parity<no_shard>(6, 2, 0.05f);  // the expert dimension out of the replicas: whole experts on 3 ranks each
}

TEST_CASE("what the expert dimension refuses, each with its sentence") {
  const auto refusals = [](auto policy, int world, int expert, const fsdp::ModelSpec& spec) {
    fsdp::model_options o;
    o.expert_parallel = expert;
    return fsdp::can_implement<decltype(policy)>(spec, fsdp::wrap::by_prefix{"u."}, o, world).text();
  };
  CHECK(refusals(fsdp::policy<full_shard>{}, 4, 0, moe_spec()) ==
        "model_options::expert_parallel must be at least 1 (every rank holds every expert), got 0\n");
  CHECK(refusals(fsdp::policy<full_shard>{}, 6, 4, moe_spec()) ==
        "model_options::expert_parallel = 4 does not divide the 6 data-parallel ranks (the world of 6 over "
        "model_options::tensor_parallel = 1)\n");
  CHECK(refusals(fsdp::policy<hybrid_shard<3>>{}, 6, 2, moe_spec()) ==
        "model_options::expert_parallel = 2 does not divide the shard group of 3 ranks (sharding strategy hybrid_shard "
        "over 2 replicas): an expert group is ranks of one replica\n");
  fsdp::ModelSpec odd;
  odd.add("u.moe.w", {3, 4}, {.experts = true});
  CHECK(refusals(fsdp::policy<full_shard>{}, 2, 2, odd) ==
        "parameter 'u.moe.w' of shape [3, 4] stacks 3 experts, which model_options::expert_parallel = 2 does not "
        "divide: each rank of an expert group holds an equal share of the experts\n");
  fsdp::ModelSpec mixed;
  mixed.add("u.moe.gate", {4, 4}).add("u.moe.w", {4, 4}, {.experts = true});
  CHECK(refusals(fsdp::policy<full_shard>{}, 2, 2, mixed) ==
        "unit 'u.moe' holds expert parameter 'u.moe.w' and dense parameter 'u.moe.gate': wrap the experts in a unit of "
        "their own (their gathers and reductions go to the expert shard group)\n");
  fsdp::ModelSpec s;
  CHECK(error_of<fsdp::usage_error>([&] { s.add("moe.w", {4, 8}, {.tensor = fsdp::tp::split(0), .experts = true}); }) ==
        "fsdp: parameter 'moe.w' stacks experts on dimension 0 and is split across the tensor group on that "
        "dimension too: split an expert on another dimension (tp::split(1) or later)");
}
