// Tensor parallelism over thread ranks: the mesh's rank order, the groups the model splits, each rank's local
// slice of every parameter (its shape and its initial values), the refusals, and training parity: a Megatron-style
// trainer (column-parallel, then row-parallel products, its own all-reduces on the tensor group) on a replicas x
// shards x tensor mesh trains the same global model as the same trainer without tensor parallelism.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::assemble;
using fsdp_test::error_of;
using fsdp_test::members;
using fsdp_test::run_ranks;

namespace {
constexpr int D = 8, H = 16, blocks = 2, global_batch = 12;

/// Two blocks, each a column-parallel product (w1 [H, D], b1 [H], split on dimension 0) with ReLU and a
/// row-parallel one (w2 [D, H] split on dimension 1, b2 [D] replicated), wrapped one unit a block. `partial`: b2's
/// gradient is a partial sum on each tensor rank (as sequence parallelism's layernorm weights: each tensor rank
/// takes its slice of the samples).
fsdp::ModelSpec megatron_spec(bool partial = false) {
  fsdp::ModelSpec s;
  for (int b = 0; b < blocks; ++b) {
    const std::string p = "h." + std::to_string(b) + ".";
    s.add(p + "w1", {H, D}, {.tensor = fsdp::tp::split(0)});
    s.add(p + "b1", {H},
          {.flags = {.no_decay = true}, .init = fsdp::init::uniform{-0.1f, 0.1f, 3}, .tensor = fsdp::tp::split(0)});
    s.add(p + "w2", {D, H}, {.tensor = fsdp::tp::split(1)});
    s.add(p + "b2", {D},
          {.flags = {.no_decay = true},
           .init = fsdp::init::uniform{-0.1f, 0.1f, 4},
           .tensor = partial ? fsdp::tp::partial_grad : fsdp::tp::replicated});
  }
  return s;
}

struct trained {
  std::vector<float> losses;                         ///< the global mean loss of each step
  std::map<std::string, std::vector<float>> params;  ///< every global parameter after training
  bool memory_as_planned = true;                     ///< every rank's measured peak equals its planned peak
  std::int64_t tensor_all_reduces = 0;               ///< rank 0's tensor group's all-reduces (trainer's and model's)
  std::vector<double> norms;                         ///< rank 0's gradient norm of each step (with max_norm)
};

/// `steps` AdamW steps of the Megatron-style trainer at `world` ranks, `tensor` of them a tensor group (1: no
/// tensor parallelism); each data-parallel rank trains on its slice of a global batch of mlp::make_batch samples.
/// `partial`: b2 is tp::partial_grad, and each tensor rank writes its gradient from its slice of the samples only.
/// `max_norm` > 0: AdamW clips the gradients' global norm to it.
template <class Policy>
trained train(int world, int tensor, bool partial, float max_norm = 0.0f, int steps = 4) {
  using W = typename Policy::precision::compute_type;
  const fsdp::ModelSpec spec = megatron_spec(partial);
  const mlp::config data{.dims = {D, D}, .global_batch = global_batch, .seed = 7};
  std::vector<std::map<std::string, std::vector<float>>> local(static_cast<std::size_t>(tensor));
  trained out;
  std::mutex mu;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::model_options o;
    o.tensor_parallel = tensor;
    fsdp::Model<Policy> m(c, spec, fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.3f, 5}, o);
    fsdp::optim::adamw opt(m, {.lr = 1e-2f, .weight_decay = 0.01f, .grad = {.max_norm = max_norm}});
    const fsdp::memory_plan plan = fsdp::plan_memory(m, opt);
    auto& cs = m.backend().compute_stream();
    const int dp = m.mesh().data_parallel(), dp_rank = m.mesh().data_parallel_rank(c.rank());
    const int t = m.mesh().tensor_rank(c.rank()), h = H / tensor, n = global_batch / dp;
    auto tensor_sum = [&](std::vector<float>& v) {  // the trainer's own collective, on the compute stream
      if (auto* tc = m.tensor_comm())
        tc->all_reduce(v.data(), v.data(), v.size(), fsdp::dtype::f32, fsdp::reduce_op::sum, cs);
    };
    std::vector<float> x, target;
    std::vector<std::vector<float>> in(blocks + 1), hid(blocks);  // each block's input; its hidden activations
    const std::vector<W> no_bias(D, W(0.0f));
    for (int step = 0; step < steps; ++step) {
      mlp::make_batch(data, step, dp_rank * n, n, x, target);
      in[0] = x;
      int b = 0;
      for (auto& u : m.forward()) {
        const std::string p = "h." + std::to_string(b) + ".";
        hid[b].assign(static_cast<std::size_t>(n) * h, 0.0f);
        mlp::linear_forward<W>(in[b].data(), u.param(p + "w1").data(), u.param(p + "b1").data(), hid[b].data(), n, D, h,
                               true);
        in[b + 1].assign(static_cast<std::size_t>(n) * D, 0.0f);  // partial sums; the bias once, on tensor rank 0
        const W* bias = t == 0 ? u.param(p + "b2").data() : no_bias.data();
        mlp::linear_forward<W>(hid[b].data(), u.param(p + "w2").data(), bias, in[b + 1].data(), n, h, D, false);
        tensor_sum(in[b + 1]);
        ++b;
      }
      std::vector<float> dy(in[blocks].size());
      float loss = mlp::mse(in[blocks].data(), target.data(), dy.data(), n, D);
      for (auto& u : m.backward()) {
        --b;
        const std::string p = "h." + std::to_string(b) + ".";
        std::vector<float> dh(static_cast<std::size_t>(n) * h), dx(static_cast<std::size_t>(n) * D);
        mlp::linear_backward<W>(hid[b].data(), u.param(p + "w2").data(), dy.data(), u.grad(p + "w2").data(),
                                u.grad(p + "b2").data(), dh.data(), n, h, D);
        if (partial) {  // b2's gradient from this tensor rank's samples [first, last) only: a partial sum
          const auto db = u.grad(p + "b2");
          const int first = n * t / tensor, last = n * (t + 1) / tensor;
          for (int o = 0; o < D; ++o) {
            float sum = 0;
            for (int s = first; s < last; ++s) sum += dy[static_cast<std::size_t>(s * D + o)];
            db[o] = W(sum);
          }
        }
        for (std::size_t q = 0; q < dh.size(); ++q)
          if (hid[b][q] <= 0.0f) dh[q] = 0.0f;
        mlp::linear_backward<W>(in[b].data(), u.param(p + "w1").data(), dh.data(), u.grad(p + "w1").data(),
                                u.grad(p + "b1").data(), dx.data(), n, D, h);
        tensor_sum(dx);  // the column-parallel product's input gradient: a partial sum on each tensor rank
        dy = std::move(dx);
      }
      const fsdp::grad::report r = opt.step();
      opt.zero_grad();
      m.comm().all_reduce(&loss, &loss, 1, fsdp::dtype::f32, fsdp::reduce_op::avg, cs);
      if (c.rank() == 0) out.losses.push_back(loss);
      if (c.rank() == 0 && max_norm > 0) out.norms.push_back(r.norm);
    }
    m.synchronize();
    const bool as_planned = m.memory().peak.total == plan.peak.total;
    auto full = fsdp::weights::gather_full_params(m);
    std::lock_guard lk(mu);
    out.memory_as_planned = out.memory_as_planned && as_planned;
    if (c.rank() == 0 && m.tensor_comm())
      out.tensor_all_reduces = m.tensor_comm()->stats()[fsdp::collective::all_reduce];
    if (dp_rank == 0) local[static_cast<std::size_t>(t)] = std::move(full);
  });
  out.params = assemble(local, spec);
  return out;
}

float relative(float a, float b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-3f); }

template <class Strategy, class Precision>
void check_parity(int world, int tensor, float tolerance, bool partial = false, float max_norm = 0.0f) {
  using P = fsdp::policy<Strategy, fsdp::prefetch::next, Precision>;
  CAPTURE(Strategy::name);
  CAPTURE(world);
  CAPTURE(tensor);
  CAPTURE(partial);
  CAPTURE(max_norm);
  const trained tp = train<P>(world, tensor, partial, max_norm), ref = train<P>(world / tensor, 1, partial, max_norm);
  REQUIRE(tp.losses.size() == ref.losses.size());
  REQUIRE(tp.norms.size() == ref.norms.size());
  for (std::size_t s = 0; s < ref.norms.size(); ++s) {  // every element counted once, whatever the tensor groups
    CAPTURE(s);
    CHECK(std::fabs(tp.norms[s] - ref.norms[s]) <= tolerance * ref.norms[s]);
    CHECK(ref.norms[s] > max_norm);  // so the clipping acted
  }
  // per step: the trainer's two per block (forward's output, backward's input gradient), the model's one per block
  // with partial gradients (b2's one run)
  CHECK(tp.tensor_all_reduces == std::int64_t(tp.losses.size()) * blocks * (partial ? 3 : 2));
  CHECK(tp.memory_as_planned);
  CHECK(ref.memory_as_planned);
  for (std::size_t s = 0; s < ref.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(relative(tp.losses[s], ref.losses[s]) <= tolerance);
  }
  REQUIRE(tp.params.size() == ref.params.size());
  // each parameter's error against its tensor's largest value (in bf16 a partial gradient is rounded on each tensor
  // rank before the model sums it)
  CHECK(fsdp_test::worst_error(tp.params, ref.params) <= tolerance);
}

using full = fsdp::precision::full;
using bf16 = fsdp::precision::mixed<fsdp::bfloat16, float, fsdp::bfloat16>;
using fsdp::sharding::full_shard;
using fsdp::sharding::hybrid_shard;
using fsdp::sharding::hybrid_shard_zero1;
using fsdp::sharding::hybrid_shard_zero2;
using fsdp::sharding::no_shard;
using fsdp::sharding::shard_grad_op;
using fsdp::sharding::zero1;

}  // namespace

TEST_CASE("the mesh: tensor groups are consecutive ranks, then shards within a replica, then replicas") {
  const fsdp::device_mesh m{2, 2, 2};
  CHECK(m.world() == 8);
  CHECK(m.data_parallel() == 4);
  const std::vector<int> tensor_rank{0, 1, 0, 1, 0, 1, 0, 1}, shard{0, 0, 1, 1, 0, 0, 1, 1},
      replica{0, 0, 0, 0, 1, 1, 1, 1};
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(m.tensor_rank(r) == tensor_rank[r]);
    CHECK(m.shard_rank(r) == shard[r]);
    CHECK(m.replica(r) == replica[r]);
    CHECK(m.data_parallel_rank(r) == r / 2);
  }
  // the groups the model splits are those the mesh says (sharding.hpp's example), on every strategy's path
  std::vector<std::vector<int>> tensor(8), shards(8), replicas(8);
  std::mutex mu;
  run_ranks(8, [&](local_communicator& c) {
    using P = fsdp::policy<hybrid_shard<2>>;
    fsdp::model_options o;
    o.tensor_parallel = 2;
    fsdp::Model<P> model(c, megatron_spec(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, o);
    REQUIRE(model.tensor_comm() != nullptr);
    REQUIRE(model.replicate_comm() != nullptr);
    CHECK(model.mesh() == m);
    auto t = members(*model.tensor_comm(), c.rank(), model.backend());
    auto s = members(model.shard_comm(), c.rank(), model.backend());
    auto r = members(*model.replicate_comm(), c.rank(), model.backend());
    std::lock_guard lk(mu);
    tensor[c.rank()] = t;
    shards[c.rank()] = s;
    replicas[c.rank()] = r;
  });
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(tensor[r] == std::vector<int>{r / 2 * 2, r / 2 * 2 + 1});
    CHECK(shards[r] == std::vector<int>{r / 4 * 4 + r % 2, r / 4 * 4 + r % 2 + 2});
    CHECK(replicas[r] == std::vector<int>{r % 4, r % 4 + 4});
  }
  // without replicas the shard group is every data-parallel rank of one tensor rank; no_shard all-reduces there
  run_ranks(6, [&](local_communicator& c) {
    fsdp::model_options o;
    o.tensor_parallel = 2;
    fsdp::Model<fsdp::policy<no_shard>> model(c, megatron_spec(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, o);
    CHECK(model.mesh() == fsdp::device_mesh{3, 1, 2});
    CHECK(model.replicate_comm() == nullptr);
    const int t = c.rank() % 2;
    CHECK(members(model.shard_comm(), c.rank(), model.backend()) == std::vector<int>{t, t + 2, t + 4});
    CHECK(members(*model.tensor_comm(), c.rank(), model.backend()) == std::vector<int>{c.rank() - t, c.rank() - t + 1});
  });
}

TEST_CASE("each rank holds its slice of every split parameter: local shapes, and the global model's initial values") {
  const auto at_start = [](int world, int tensor) {
    std::vector<std::map<std::string, std::vector<float>>> local(static_cast<std::size_t>(tensor));
    std::vector<fsdp::ModelSpec> specs(static_cast<std::size_t>(tensor));
    std::mutex mu;
    run_ranks(world, [&](local_communicator& c) {
      fsdp::model_options o;
      o.tensor_parallel = tensor;
      fsdp::Model<fsdp::policy<full_shard>> m(c, megatron_spec(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, o);
      auto full = fsdp::weights::gather_full_params(m);
      std::lock_guard lk(mu);
      if (m.mesh().data_parallel_rank(c.rank()) == 0) {
        local[static_cast<std::size_t>(c.rank())] = std::move(full);
        specs[static_cast<std::size_t>(c.rank())] = m.spec();
      }
    });
    return std::make_pair(local, specs);
  };
  const auto [one, one_spec] = at_start(2, 1);
  const auto [four, four_spec] = at_start(8, 4);
  // the model's spec is the rank's: split dimensions divided by the degree, placements kept
  const fsdp::ParamSpec& w1 = four_spec[3].at("h.1.w1");
  CHECK(w1.shape == std::vector<std::int64_t>{H / 4, D});
  CHECK(w1.tensor == fsdp::tp::split(0));
  CHECK(four_spec[3].at("h.1.w2").shape == std::vector<std::int64_t>{D, H / 4});
  CHECK(four_spec[3].at("h.1.b2").shape == std::vector<std::int64_t>{D});
  CHECK(fsdp::global_shape(w1.shape, w1.tensor, 4) == std::vector<std::int64_t>{H, D});
  // bit for bit: the four slices put together are the untouched global model
  CHECK(assemble(four, megatron_spec()) == one[0]);
  // and tensor rank 1's slice of the row-parallel w2 [D, H] is columns [4, 8) of every row
  const std::vector<float>& w2 = one[0].at("h.0.w2");
  const std::vector<float>& slice = four[1].at("h.0.w2");
  REQUIRE(slice.size() == std::size_t(D * H / 4));
  for (int row = 0; row < D; ++row)
    for (int col = 0; col < H / 4; ++col) CHECK(slice[row * (H / 4) + col] == w2[row * H + H / 4 + col]);
}

TEST_CASE("a fused [q; k; v] projection split in 3 blocks: each tensor rank holds its rows of q, of k and of v") {
  // qkv [3 * 8, 2] split(0, 3) across 4 ranks: rank t holds rows [2t, 2t + 2) of each block of 8, in block order
  fsdp::ModelSpec spec;
  spec.add("qkv", {24, 2}, {.tensor = fsdp::tp::split(0, 3)});
  fsdp::problems none;
  CHECK(spec.tensor_local(4, none).at("qkv").shape == std::vector<std::int64_t>{6, 2});
  std::vector<std::vector<float>> local(4);
  std::vector<float> global;
  std::mutex mu;
  for (const int tensor : {1, 4})
    run_ranks(tensor, [&](local_communicator& c) {
      fsdp::model_options o;
      o.tensor_parallel = tensor;
      fsdp::Model<fsdp::policy<full_shard>> m(c, spec, fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{}, o);
      auto full = fsdp::weights::gather_full_params(m);
      std::lock_guard lk(mu);
      (tensor == 1 ? global : local[static_cast<std::size_t>(c.rank())]) = full.at("qkv");
    });
  for (int t = 0; t < 4; ++t)
    for (int b = 0; b < 3; ++b)
      for (int r = 0; r < 2; ++r)
        for (int col = 0; col < 2; ++col) {
          CAPTURE(t);
          CAPTURE(b);
          CHECK(local[t][static_cast<std::size_t>((b * 2 + r) * 2 + col)] ==
                global[static_cast<std::size_t>((b * 8 + t * 2 + r) * 2 + col)]);
        }
  CHECK(error_of<fsdp::usage_error>([&] { fsdp::ModelSpec().add("w", {16}, {.tensor = fsdp::tp::split(0, 3)}); }) ==
        "fsdp: parameter 'w' is split on dimension 0 in 3 blocks, which do not divide its 16 elements (shape [16])");
  fsdp::problems p;
  fsdp::ModelSpec s;
  s.add("w", {12, 2}, {.tensor = fsdp::tp::split(0, 3)});
  (void)s.tensor_local(8, p);
  CHECK(p.list() ==
        std::vector<std::string>{
            "parameter 'w' of shape [12, 2] is split on dimension 0 in 3 blocks, each across 8 "
            "tensor-parallel ranks, which do not divide its 4 elements a block: make the blocks multiples of "
            "model_options::tensor_parallel, or replicate the parameter"});
  CHECK(fsdp::parse_placement("split(0,3)") == fsdp::tp::split(0, 3));
  CHECK(fsdp::placement_name(fsdp::tp::split(1, 2)) == "split(1,2)");
  CHECK(fsdp::describe(fsdp::tp::split(0, 3)) == "split on dimension 0 in 3 blocks");
  for (const char* bad : {"split(0,1)", "split(0,0)", "split(0,)", "split(,3)", "split(0,3,1)"}) {
    CAPTURE(bad);
    CHECK(!fsdp::parse_placement(bad).has_value());
  }
}

TEST_CASE("training parity: the 2 x 2, 3 x 2 and 2 x 2 x 2 meshes train the model of one tensor rank, fp32") {
  constexpr float tol = 1e-5f;
  check_parity<full_shard, full>(4, 2, tol);
  check_parity<shard_grad_op, full>(4, 2, tol);
  check_parity<zero1, full>(4, 2, tol);
  check_parity<no_shard, full>(4, 2, tol);
  check_parity<full_shard, full>(6, 2, tol);
  check_parity<no_shard, full>(6, 2, tol);
  check_parity<full_shard, full>(4, 4, tol);
  check_parity<hybrid_shard<2>, full>(8, 2, tol);
  check_parity<hybrid_shard_zero2<2>, full>(8, 2, tol);
  check_parity<hybrid_shard_zero1<2>, full>(8, 2, tol);
  check_parity<full_shard, full>(8, 2, tol);
}

TEST_CASE("training parity in bf16 (compute and reduction), within 5e-3") {
  constexpr float tol = 5e-3f;
  check_parity<full_shard, bf16>(4, 2, tol);
  check_parity<shard_grad_op, bf16>(6, 2, tol);
  check_parity<hybrid_shard<2>, bf16>(8, 2, tol);
  check_parity<hybrid_shard_zero1<2>, bf16>(8, 2, tol);
}

TEST_CASE("partial gradients (sequence parallelism): the model sums them over the tensor group before reducing") {
  check_parity<full_shard, full>(4, 2, 1e-5f, true);
  check_parity<no_shard, full>(6, 2, 1e-5f, true);
  check_parity<full_shard, full>(4, 4, 1e-5f, true);
  check_parity<hybrid_shard<2>, full>(8, 2, 1e-5f, true);
  check_parity<zero1, bf16>(4, 2, 5e-3f, true);
  check_parity<hybrid_shard_zero2<2>, bf16>(8, 2, 5e-3f, true);
  // the layout's runs: b2 alone in each unit, and at one tensor rank there is nothing partial
  fsdp::problems none;
  const fsdp::ModelSpec two = megatron_spec(true).tensor_local(2, none),
                        one = megatron_spec(true).tensor_local(1, none);
  REQUIRE(none.empty());
  CHECK(two.at("h.0.b2").tensor == fsdp::tp::partial_grad);
  CHECK(one.at("h.0.b2").tensor == fsdp::tp::replicated);
  const fsdp::unit_plan h0{"h.0", {0, 1, 2, 3}};
  const fsdp::FlatLayout l = fsdp::FlatLayout::build(two, h0, 2);
  CHECK(l.partial_grad_runs() == std::vector<fsdp::flat_run>{{l.entry("h.0.b2").offset, D}});
  CHECK(fsdp::FlatLayout::build(one, h0, 2).partial_grad_runs().empty());
  // the step program issues the all-reduce on the compute stream when the unit's backward ends, and the timeline
  // times it on the tensor group's link
  run_ranks(4, [&](local_communicator& c) {
    fsdp::model_options o;
    o.tensor_parallel = 2;
    fsdp::Model<fsdp::policy<full_shard>> m(c, megatron_spec(true), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{},
                                            o);
    std::vector<std::size_t> reduced;  // units whose partial gradients the listed step all-reduces, in issue order
    for (const auto& a : fsdp::list_step(m, 0).actions)
      if (a.what == "tensor all_reduce (backward)") {
        CHECK(a.lane == fsdp::plan::lane::compute);
        reduced.push_back(a.unit);
      }
    CHECK(reduced == std::vector<std::size_t>{1, 0});
    fsdp::time_model t;
    t.compute.assign(m.size(), {});
    t.tensor_link = {.bytes_per_second = 1e9, .latency = std::chrono::nanoseconds{1000}};
    const fsdp::timeline tl = fsdp::plan_timeline(m, t, 0);
    // two units, one run of D fp32 each: 1000 ns + 2 (n - 1) / n * 32 bytes at 1 GB/s = 1032 ns, on the compute path
    CHECK(tl.step_ns == 2 * 1032);
    // the trainer's own all-reduces, declared per unit and pass, on the same link and stream: h.1's forward moves
    // 4,000 bytes (1000 ns + 4000 ns), its backward 1,000 (1000 + 1000)
    t.compute[1].tensor_forward_bytes = 4000;
    t.compute[1].tensor_backward_bytes = 1000;
    CHECK(fsdp::plan_timeline(m, t, 0).step_ns == 2 * 1032 + 5000 + 2000);
  });
}

TEST_CASE("the MLP example with tensor groups (--tp) trains as without them, its memory as planned") {
  const auto run = [](int world, int tensor) {
    mlp::config cfg;
    cfg.steps = 5;
    cfg.model.tensor_parallel = tensor;
    std::vector<mlp::result> out(static_cast<std::size_t>(world));
    run_ranks(world, [&](local_communicator& c) {
      out[static_cast<std::size_t>(c.rank())] = mlp::train<fsdp::policy<full_shard>>(c, cfg);
    });
    std::vector<std::map<std::string, std::vector<float>>> local;
    for (int t = 0; t < tensor; ++t) local.push_back(out[static_cast<std::size_t>(t)].params);
    for (const mlp::result& r : out) CHECK(r.memory.peak == r.planned);
    return std::make_pair(out[0].losses, assemble(local, mlp::make_spec(cfg)));
  };
  const auto [want_losses, want] = run(2, 1);
  // not a structured binding: Clang 14 cannot capture one, and CAPTURE is a lambda
  for (const std::pair<int, int>& mesh : std::vector<std::pair<int, int>>{{4, 2}, {8, 4}, {6, 2}}) {
    const int world = mesh.first, tensor = mesh.second;
    CAPTURE(world);
    CAPTURE(tensor);
    const auto [losses, params] = run(world, tensor);
    REQUIRE(losses.size() == want_losses.size());
    // at 3 data-parallel ranks each takes 16 samples instead of 24: the same global mean, rounded otherwise
    for (std::size_t s = 0; s < losses.size(); ++s) CHECK(relative(losses[s], want_losses[s]) <= 1e-5f);
    CHECK(fsdp_test::worst_error(params, want) <= 1e-5f);
  }
}

TEST_CASE("refusals before any memory, each with its sentence") {
  using P = fsdp::policy<full_shard>;
  const fsdp::wrap::by_prefix by_block{"h."};
  fsdp::model_options o;
  o.tensor_parallel = 0;
  CHECK(fsdp::can_implement<P>(megatron_spec(), by_block, o, 4).text() ==
        "model_options::tensor_parallel must be at least 1 (no tensor parallelism), got 0\n");
  o.tensor_parallel = 4;
  CHECK(fsdp::can_implement<P>(megatron_spec(), by_block, o, 6).text() ==
        "model_options::tensor_parallel = 4 does not divide the world of 6 ranks: the mesh is replicas x shards x "
        "experts x tensor, and its size must be the world\n");
  o.tensor_parallel = 3;
  CHECK(fsdp::can_implement<P>(megatron_spec(), by_block, o, 6).refusals ==
        std::vector<fsdp::refusal>{
            {"tensor",
             "parameter 'h.0.w1' of shape [16, 8] is split on dimension 0 across 3 tensor-parallel ranks, "
             "which do not divide its 16 elements: make the dimension a multiple of "
             "model_options::tensor_parallel, or replicate the parameter"},
            {"tensor",
             "parameter 'h.0.b1' of shape [16] is split on dimension 0 across 3 tensor-parallel ranks, "
             "which do not divide its 16 elements: make the dimension a multiple of "
             "model_options::tensor_parallel, or replicate the parameter"},
            {"tensor",
             "parameter 'h.0.w2' of shape [8, 16] is split on dimension 1 across 3 tensor-parallel ranks, "
             "which do not divide its 16 elements: make the dimension a multiple of "
             "model_options::tensor_parallel, or replicate the parameter"},
            {"tensor",
             "parameter 'h.1.w1' of shape [16, 8] is split on dimension 0 across 3 tensor-parallel ranks, "
             "which do not divide its 16 elements: make the dimension a multiple of "
             "model_options::tensor_parallel, or replicate the parameter"},
            {"tensor",
             "parameter 'h.1.b1' of shape [16] is split on dimension 0 across 3 tensor-parallel ranks, "
             "which do not divide its 16 elements: make the dimension a multiple of "
             "model_options::tensor_parallel, or replicate the parameter"},
            {"tensor",
             "parameter 'h.1.w2' of shape [8, 16] is split on dimension 1 across 3 tensor-parallel ranks, "
             "which do not divide its 16 elements: make the dimension a multiple of "
             "model_options::tensor_parallel, or replicate the parameter"}});
  // the strategy tiles what is left of the world: hybrid_shard<2> over 6 / 2 = 3 data-parallel ranks
  o.tensor_parallel = 2;
  CHECK(fsdp::can_implement<fsdp::policy<hybrid_shard<2>>>(megatron_spec(), by_block, o, 6).text() ==
        "sharding strategy hybrid_shard gives a shard group of 2 ranks, which does not divide the world of 3\n");
  // on a mesh: the tensor dimension is compared too
  CHECK(fsdp::can_implement<fsdp::policy<hybrid_shard<2>>>(megatron_spec(), by_block, o, fsdp::device_mesh{1, 2, 4})
            .text() ==
        "sharding strategy hybrid_shard over 8 ranks with model_options::tensor_parallel = 2 makes a mesh of 2 x 2 x "
        "1 x 2 (replicas x shards x experts x tensor), not the 1 x 2 x 1 x 4 asked for\n");
  CHECK(bool(
      fsdp::can_implement<fsdp::policy<hybrid_shard<2>>>(megatron_spec(), by_block, o, fsdp::device_mesh{2, 2, 2})));
  // a placement that names no dimension of the shape is refused when the spec is written
  fsdp::ModelSpec s;
  CHECK(error_of<fsdp::usage_error>([&] { s.add("w", {4, 4}, {.tensor = fsdp::tp::split(2)}); }) ==
        "fsdp: parameter 'w' is split on dimension 2, which its shape [4, 4] does not have (dimensions 0 to 1)");
  CHECK(error_of<fsdp::usage_error>([&] { s.add("w", {4}, {.tensor = fsdp::tp::split(-1)}); }) ==
        "fsdp: parameter 'w' is split on dimension -1, which its shape [4] does not have (dimensions 0 to 0)");
  // the model throws the first refusal
  run_ranks(2, [&](local_communicator& c) {
    fsdp::model_options bad;
    bad.tensor_parallel = 4;
    CHECK(error_of<fsdp::usage_error>(
              [&] { fsdp::Model<P> m(c, megatron_spec(), by_block, fsdp::init::normal{}, bad); }) ==
          "fsdp: model_options::tensor_parallel = 4 does not divide the world of 2 ranks: the mesh is replicas x "
          "shards x experts x tensor, and its size must be the world");
  });
}

TEST_CASE("gradient clipping: the global norm counts each split slice and each replicated parameter once") {
  check_parity<full_shard, full>(4, 2, 1e-5f, false, 0.05f);
  check_parity<hybrid_shard<2>, full>(8, 2, 1e-5f, true, 0.05f);
  check_parity<no_shard, full>(6, 2, 1e-5f, false, 0.05f);
  check_parity<zero1, bf16>(4, 2, 5e-3f, true, 0.05f);
  // the layout puts a unit's split parameters first, so a rank's split part of its shard is one prefix
  fsdp::ModelSpec s;
  s.add("a", {3}).add("b", {4, 2}, {.tensor = fsdp::tp::split(0)}).add("c", {5}, {.tensor = fsdp::tp::partial_grad});
  s.add("d", {2, 4}, {.tensor = fsdp::tp::split(1)});
  fsdp::problems none;
  const fsdp::FlatLayout l = fsdp::FlatLayout::build(s.tensor_local(2, none), fsdp::unit_plan{"u", {0, 1, 2, 3}}, 2);
  std::vector<std::string> order;
  for (const auto& e : l.entries()) order.push_back(e.name);
  CHECK(order == std::vector<std::string>{"b", "d", "a", "c"});
  CHECK(l.split_end() == l.entry("d").offset + 4);
  CHECK(l.entry("a").offset >= l.split_end());
  // one tensor rank: nothing is split, the spec's order
  const fsdp::FlatLayout one = fsdp::FlatLayout::build(s.tensor_local(1, none), fsdp::unit_plan{"u", {0, 1, 2, 3}}, 2);
  CHECK(one.entries().front().name == "a");
  CHECK(one.split_end() == 0);
}
