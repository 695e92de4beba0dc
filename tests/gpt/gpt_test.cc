// The GPT example (examples/04_gpt_host) as a specification: its kernels' gradients, its data, and what training
// it on the library shows: activation checkpointing that changes no bit and no collective, the planner's peak
// equal to the measured one, the root unit kept gathered; and the CUDA trainer's step as work (its floor, plain
// C++: examples/05_gpt_cuda/step_work.hpp, whose launches the simulated GPU checks against the trainer's). The
// losses across world sizes: gpt_parity_test.cc.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "examples/05_gpt_cuda/step_work.hpp"
#include "tests/gpt/gpt_cases.hpp"

namespace {

using fsdp::bfloat16;
using gpt_tests::bf16_policy;
using gpt_tests::fp32_policy;
using gpt_tests::small;
using gpt_tests::train;

// ---- a unit standing in for the library's, to check the trainer's gradients against finite differences -------
struct fake_unit {
  std::map<std::string, std::vector<float>>* values;
  std::map<std::string, std::vector<float>>* grads;
  const fsdp::ModelSpec* spec;
  template <class T>
  fsdp::tensor_view<float> param(const std::string& n) const {
    auto& v = values->at(n);
    return {v.data(), &spec->at(n).shape, static_cast<std::int64_t>(v.size())};
  }
  template <class T>
  fsdp::tensor_view<float> grad(const std::string& n) const {
    auto& v = grads->at(n);
    return {v.data(), &spec->at(n).shape, static_cast<std::int64_t>(v.size())};
  }
};

using values_map = std::map<std::string, std::vector<float>>;

/// The whole model's loss on the batch `begin` gives the trainer, with the trainer's kernels; its gradients into
/// `grads`; the logits into `logits` when given.
template <class Begin>
float loss_and_grads(const gpt::shape& s, int B, const fsdp::ModelSpec& spec, values_map& values, values_map& grads,
                     Begin&& begin, std::vector<float>* logits = nullptr) {
  for (auto& [name, g] : grads) std::fill(g.begin(), g.end(), 0.0f);
  const fake_unit u{&values, &grads, &spec};
  gpt::trainer<float> tr(s, B);
  begin(tr);
  std::vector<std::vector<float>> xs(static_cast<std::size_t>(s.layers) + 1);
  std::vector<gpt::block_cache> caches(static_cast<std::size_t>(s.layers));
  tr.embed(u, xs[0]);
  for (int l = 0; l < s.layers; ++l) {
    tr.block_forward(u, l, xs[l], caches[l], xs[l + 1]);
    if (s.experts > 0) tr.experts_forward(u, l, caches[l], xs[l + 1]);  // every expert here (no expert group)
  }
  std::vector<float> dx, dnext;
  tr.head(u, xs.back(), dx);
  if (logits) *logits = tr.logits();
  for (int l = s.layers - 1; l >= 0; --l) {
    if (s.experts > 0) tr.experts_backward(u, l, caches[l], dx);
    tr.block_backward(u, l, xs[l], caches[l], dx, dnext);
    dx.swap(dnext);
  }
  tr.root_backward(u, dx);
  return tr.local_loss();
}

/// Random values for every stored parameter of `spec` (norm gains around 1), and zeroed gradients.
void random_values(const fsdp::ModelSpec& spec, values_map& values, values_map& grads) {
  std::uint64_t k = 0;
  for (const auto& p : spec.params()) {
    if (p.is_tied()) continue;
    std::vector<float> v(static_cast<std::size_t>(p.numel()));
    const bool gain = p.name.find("ln_") != std::string::npos && p.name.back() == 'w';
    for (auto& x : v) x = (gain ? 1.0f : 0.0f) + 0.3f * static_cast<float>(2.0 * gpt::detail::uniform(9, 0, k++) - 1.0);
    values[p.name] = v;
    grads[p.name].assign(v.size(), 0.0f);
  }
}

/// Rank `rank` of `world`'s share of the first step packed from `docs` into rows of T tokens, `rows` a step.
gpt::packed_tokens pack(const std::vector<std::vector<int>>& docs, int T, int rows, int world = 1, int rank = 0) {
  struct list {
    std::vector<std::vector<int>> docs;
    std::optional<std::vector<int>> operator()(std::uint64_t i) const {
      return i < docs.size() ? std::optional(docs[i]) : std::nullopt;
    }
  };
  fsdp::data::packer p({.row_tokens = T, .rows_per_step = rows, .lookahead = 16}, list{docs});
  const auto step = p.next();
  REQUIRE(step);
  REQUIRE(p.state().buffer.empty());  // every document in the step
  return gpt::to_tokens(fsdp::data::rank_share(*step, world, rank), T);
}

/// Checks every parameter's backward against central finite differences of the loss on the batch `begin` gives.
template <class Begin>
void check_gradients(const gpt::shape& s, int B, Begin&& begin) {
  const fsdp::ModelSpec spec = gpt::make_spec(s, 3);
  values_map values, grads;
  random_values(spec, values, grads);
  loss_and_grads(s, B, spec, values, grads, begin);
  const auto analytic = grads;
  int checked = 0;
  // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
  for (auto& entry : values) {
    const auto& name = entry.first;
    auto& v = entry.second;
    for (std::size_t i = 0; i < v.size(); i += 1 + v.size() / 7) {  // about 7 elements of each parameter
      const float keep = v[i], h = 3e-3f;  // larger steps see the curvature of softmax and GELU
      v[i] = keep + h;
      const float up = loss_and_grads(s, B, spec, values, grads, begin);
      v[i] = keep - h;
      const float down = loss_and_grads(s, B, spec, values, grads, begin);
      v[i] = keep;
      const double fd = (static_cast<double>(up) - down) / (2.0 * h), an = analytic.at(name)[i];
      INFO(name << "[" << i << "]: finite difference " << fd << ", backward " << an);
      CHECK(std::abs(fd - an) <= 3e-4 + 2e-2 * std::abs(an));
      ++checked;
    }
  }
  CHECK(checked > 100);
}

}  // namespace

TEST_CASE("every parameter's gradient (tied head and embedding together) matches central finite differences") {
  const gpt::shape s{.vocab = 11, .context = 5, .width = 8, .heads = 2, .layers = 2};
  const int B = 2;
  std::vector<int> inputs(B * s.context), targets(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = static_cast<int>(i * 7 % 11);
    targets[i] = static_cast<int>((i * 5 + 3) % 11);
  }
  check_gradients(s, B, [&](gpt::trainer<float>& tr) { tr.begin_step(inputs, targets); });
  SUBCASE("and with a mixture of experts: the experts, their gates, the router and the load-balancing loss") {
    gpt::shape e = s;
    e.experts = 4;
    e.top_k = 2;
    e.aux_weight = 0.5f;  // large enough that its gradient shows
    check_gradients(e, B, [&](gpt::trainer<float>& tr) { tr.begin_step(inputs, targets); });
  }
  SUBCASE("and on packed rows: documents apart, positions restarting, padding and last tokens masked out") {
    // Two rows of 5: documents of 2 and 3 tokens in one, 4 tokens and a padding position in the other.
    const gpt::packed_tokens p = pack({{3, 9}, {1, 4, 7}, {10, 2, 5, 8}}, s.context, 2);
    REQUIRE(p.starts == std::vector<int>{0, 0, 2, 2, 2, 0, 0, 0, 0, 4});
    REQUIRE(p.step_loss_tokens == 6);
    check_gradients(s, B, [&](gpt::trainer<float>& tr) { tr.begin_packed_step(p); });
  }
}

TEST_CASE("a packed row gives each document the logits it has alone: no attention across documents") {
  const gpt::shape s{.vocab = 11, .context = 16, .width = 8, .heads = 2, .layers = 2};
  const fsdp::ModelSpec spec = gpt::make_spec(s, 3);
  values_map values, grads;
  random_values(spec, values, grads);
  const std::vector<std::vector<int>> docs = {{3, 9, 1, 0, 4}, {7, 7, 2}, {10, 5, 6, 1, 8, 2}};
  const gpt::packed_tokens p = pack(docs, s.context, 1);  // one row: 5 + 3 + 6 tokens, 2 of padding
  const auto V = static_cast<std::ptrdiff_t>(s.vocab);
  std::vector<float> packed, alone;
  loss_and_grads(s, 1, spec, values, grads, [&](gpt::trainer<float>& tr) { tr.begin_packed_step(p); }, &packed);
  std::ptrdiff_t at = 0;
  for (const std::vector<int>& d : docs) {
    // The document alone at the start of an unpacked row, the rest of the row other tokens.
    std::vector<int> inputs(d), targets(static_cast<std::size_t>(s.context), 0);
    for (int t = static_cast<int>(d.size()); t < s.context; ++t) inputs.push_back(t * 3 % s.vocab);
    loss_and_grads(s, 1, spec, values, grads, [&](gpt::trainer<float>& tr) { tr.begin_step(inputs, targets); },
                   &alone);
    const auto n = static_cast<std::ptrdiff_t>(d.size());
    const std::vector<float> in_row(packed.begin() + at * V, packed.begin() + (at + n) * V);
    const std::vector<float> by_itself(alone.begin(), alone.begin() + n * V);
    CHECK(in_row == by_itself);  // the same bits
    at += n;
  }
  // Unpacked, the same row attends across its documents: the second and third documents' logits change.
  loss_and_grads(s, 1, spec, values, grads, [&](gpt::trainer<float>& tr) { tr.begin_step(p.inputs, p.targets); },
                 &alone);
  CHECK(std::vector<float>(alone.begin() + 5 * V, alone.begin() + 14 * V) !=
        std::vector<float>(packed.begin() + 5 * V, packed.begin() + 14 * V));
}

TEST_CASE("a packed step without a target (1-token documents only) has a loss of 0 and no gradient") {
  const gpt::shape s{.vocab = 11, .context = 4, .width = 8, .heads = 2, .layers = 1};
  const fsdp::ModelSpec spec = gpt::make_spec(s, 3);
  values_map values, grads;
  random_values(spec, values, grads);
  const gpt::packed_tokens p = pack({{3}, {5}, {7}}, s.context, 1);
  REQUIRE(p.step_loss_tokens == 0);
  CHECK(loss_and_grads(s, 1, spec, values, grads, [&](gpt::trainer<float>& tr) { tr.begin_packed_step(p); }) == 0.0f);
  for (const auto& [name, g] : grads)
    for (float v : g) CHECK(v == 0.0f);
  gpt::trainer<float> tr(s, 2);  // 2 rows: 8 tokens, and the batch has 4
  CHECK_THROWS_WITH_AS(tr.begin_packed_step(p),
                       "fsdp: gpt: packed rows of 4 inputs, 4 targets, 4 positions, 4 starts and 4 mask entries for a "
                       "trainer of 8 tokens (its rows times the context)",
                       fsdp::usage_error);
}

TEST_CASE("packed training: the same global data and the same losses at world sizes 1, 2 and 4") {
  gpt::config c = small();
  c.steps = 8;
  c.global_batch = 4;  // rows of 16 tokens a step
  c.packing.on = true;
  const auto one = train<fp32_policy>(1, c);
  CHECK(one[0].losses.front() > one[0].losses.back());
  std::int64_t tokens = 0;
  for (std::int64_t t : one[0].step_tokens) tokens += t;
  CHECK(tokens > 8 * 4 * 16 * 9 / 10);  // rows at least 90% real tokens
  CHECK(one[0].data_state.step == 8);
  for (int world : {2, 4}) {
    CAPTURE(world);
    const auto rs = train<fp32_policy>(world, c);
    CHECK(rs[0].step_tokens == one[0].step_tokens);
    CHECK(rs[0].data_state == one[0].data_state);
    for (std::size_t k = 0; k < one[0].losses.size(); ++k)
      CHECK(rs[0].losses[k] == doctest::Approx(one[0].losses[k]).epsilon(1e-5));
    // The ranks sum their rows' losses in another order, so the bits differ; Adam turns that rounding into updates
    // of up to lr on elements whose gradient is near zero, so the parameters agree to well below one step's lr.
    double worst = 0;
    for (const auto& [name, v] : one[0].params)
      for (std::size_t i = 0; i < v.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(rs[0].params.at(name)[i] - v[i])));
    CHECK(worst < c.opt.lr / 50);
  }
}

TEST_CASE("the data: a pure function of the global sample, every world size sees the same global batch") {
  gpt::config c = small();
  const auto perm = gpt::permutation(c.data, c.model.vocab);
  std::vector<int> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(static_cast<std::size_t>(c.model.vocab));
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(sorted == identity);
  std::vector<int> whole_in, whole_t;
  gpt::make_batch(c, perm, 7, 0, 12, whole_in, whole_t);
  for (int world : {2, 3, 4}) {
    std::vector<int> in, t, cat_in, cat_t;
    for (int r = 0; r < world; ++r) {
      gpt::make_batch(c, perm, 7, r, 12 / world, in, t);
      cat_in.insert(cat_in.end(), in.begin(), in.end());
      cat_t.insert(cat_t.end(), t.begin(), t.end());
    }
    CHECK(cat_in == whole_in);
    CHECK(cat_t == whole_t);
  }
  // targets are the inputs shifted by one; about `follow` of them are the permutation's image of their input
  int followed = 0, n = 0;
  std::vector<int> counts(static_cast<std::size_t>(c.model.vocab), 0);
  for (int step = 0; step < 50; ++step) {
    gpt::make_batch(c, perm, step, 0, 12, whole_in, whole_t);
    for (std::size_t i = 0; i < whole_in.size(); ++i) {
      if (i % c.model.context + 1 < static_cast<std::size_t>(c.model.context)) CHECK(whole_t[i] == whole_in[i + 1]);
      followed += whole_t[i] == perm[static_cast<std::size_t>(whole_in[i])] ? 1 : 0;
      ++counts[static_cast<std::size_t>(whole_t[i])];
      ++n;
    }
  }
  const double p = c.data.follow + (1 - c.data.follow) / c.model.vocab;
  CHECK(std::abs(static_cast<double>(followed) / n - p) < 0.02);
  for (int count : counts) CHECK(std::abs(count - n / c.model.vocab) < n / c.model.vocab / 4);
  const auto h = gpt::data_entropies(c.data, c.model.vocab);
  CHECK(h.frequencies == doctest::Approx(std::log(32.0)));
  CHECK(h.floor < h.frequencies - 2.0);
}

TEST_CASE("activation checkpointing: the same bits and the same collectives, only block inputs kept") {
  gpt::config c = small();
  c.steps = 6;
  const auto plain = train<bf16_policy>(2, c);
  c.checkpoint_activations = true;
  const auto ckpt = train<bf16_policy>(2, c);
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(ckpt[r].losses == plain[r].losses);
    CHECK(ckpt[r].norms == plain[r].norms);
    CHECK(ckpt[r].params == plain[r].params);
    for (std::size_t k = 0; k < fsdp::collective_kinds; ++k) {
      CHECK(ckpt[r].shard_group.count[k] == plain[r].shard_group.count[k]);
      CHECK(ckpt[r].shard_group.bytes[k] == plain[r].shard_group.bytes[k]);
    }
    CHECK(ckpt[r].memory.peak == plain[r].memory.peak);
  }
  // per block: the input [B, T, C] under checkpointing; otherwise also its cache: 15 tensors of [B, T, C] or
  // less (two norms' inputs and outputs, q k v, the attention and MLP outputs), the attention [B, H, T, T] and
  // four [B, T] norm statistics
  const std::size_t B = 6, T = 16, C = 32, H = 4, input = B * T * C * 4;
  CHECK(ckpt[0].activation_bytes_per_block == input);
  CHECK(plain[0].activation_bytes_per_block == input + (15 * B * T * C + B * H * T * T + 4 * B * T) * 4);
  CHECK(plain[0].activation_bytes - ckpt[0].activation_bytes ==
        (c.model.layers - 1) * (plain[0].activation_bytes_per_block - input));
}

TEST_CASE("the root unit stays gathered: per step 2 L + 1 all-gathers, L + 1 reduce-scatters, 2 all-reduces") {
  gpt::config c = small();
  const int L = c.model.layers;
  c.steps = 1;
  const auto one = train<bf16_policy>(2, c)[0].shard_group;
  c.steps = 4;
  const auto four = train<bf16_policy>(2, c)[0].shard_group;
  using fsdp::collective;
  auto per_step = [&](collective k) { return (four[k] - one[k]) / 3; };
  CHECK((four[collective::all_gather] - one[collective::all_gather]) % 3 == 0);
  CHECK(per_step(collective::all_gather) == static_cast<std::uint64_t>(2 * L + 1));  // root once, blocks twice
  CHECK(per_step(collective::reduce_scatter) == static_cast<std::uint64_t>(L + 1));
  CHECK(per_step(collective::all_reduce) == 2u);  // the clipping's global norm and the printed loss
}

TEST_CASE("the planner's peak equals the measured peak, category by category, on every rank") {
  gpt::config c = small();
  c.steps = 2;
  for (bool ckpt : {false, true}) {
    c.checkpoint_activations = ckpt;
    for (int world : {1, 2, 3, 4}) {
      const auto rs = train<bf16_policy>(world, c);
      for (const auto& r : rs) {
        INFO("world " << world << (ckpt ? ", activation checkpointing" : ""));
        CHECK(r.memory.peak == r.planned);
      }
    }
    const auto zero2 =
        train<fsdp::policy<fsdp::sharding::shard_grad_op, fsdp::prefetch::next, fsdp::precision::mixed<bfloat16>>>(3,
                                                                                                                   c);
    for (const auto& r : zero2) CHECK(r.memory.peak == r.planned);
    const auto none =
        train<fsdp::policy<fsdp::sharding::no_shard, fsdp::prefetch::next, fsdp::precision::mixed<bfloat16>>>(2, c);
    for (const auto& r : none) CHECK(r.memory.peak == r.planned);
  }
}

TEST_CASE("bad settings are refused with a sentence") {
  gpt::config c = small();
  c.model.heads = 5;
  CHECK_THROWS_WITH_AS(gpt::make_spec(c.model, 1), "fsdp: gpt: width 32 must be a positive multiple of heads 5",
                       fsdp::usage_error);
  c = small();
  c.global_batch = 10;
  CHECK_THROWS_WITH_AS(train<fp32_policy>(4, c), "fsdp: gpt: global batch 10 sequences do not split over 4 ranks",
                       fsdp::usage_error);
  c = small();
  c.graph = true;  // the CUDA trainer's alone (05_gpt_cuda --graph)
  CHECK_THROWS_WITH_AS(train<fp32_policy>(1, c),
                       "fsdp: gpt: this trainer computes on the host, outside the backend's streams, so its step "
                       "cannot be captured; train it without graph",
                       fsdp::usage_error);
  c = small();
  c.packing.on = true;
  fsdp::comm::run_local(1, [&](fsdp::comm::local_communicator& comm) {
    // Built without gpt::make_model: its gradients would be averaged over the ranks.
    fsdp::Model<fp32_policy> model(comm, gpt::make_spec(c.model, c.seed), gpt::wrapping(), fsdp::init::normal{},
                                   c.options);
    auto opt = gpt::make_optimizer(model, c);
    auto tr = gpt::make_host_trainer{}(model, c.model, c.global_batch);
    gpt::result r;
    CHECK_THROWS_WITH_AS(gpt::run_steps(model, opt, tr, c, 0, 1, r),
                         "fsdp: gpt: sequence packing divides each rank's loss by the step's loss tokens, so the "
                         "gradients must be summed over ranks: build the model with gpt::make_model, or with "
                         "model_options::division.how = grad_division::mode::sum",
                         fsdp::usage_error);
  });
}

// ---- the CUDA trainer's step as work (examples/05_gpt_cuda/step_work.hpp) ---------------------------------------
namespace {
const gpt_cuda::kernel_work& row(const std::vector<gpt_cuda::kernel_work>& w, const std::string& name) {
  const auto it = std::find_if(w.begin(), w.end(), [&](const auto& k) { return k.name == name; });
  REQUIRE_MESSAGE(it != w.end(), name);
  return *it;
}
}  // namespace

TEST_CASE("the CUDA step's matrix products: 6 N FLOPs a matrix parameter, 12 L + 3 per head chunk, any chunking") {
  const gpt::shape s{.vocab = 37, .context = 8, .width = 16, .heads = 2, .layers = 3};
  const int batch = 5;  // N = 40 tokens
  const double N = 40, matrix_params = 3 * 12.0 * 16 * 16 + 37.0 * 16;
  for (const int rows : {0, 1, 7, 40}) {
    CAPTURE(rows);
    const auto w = gpt_cuda::step_work(s, batch, {.head_rows = rows});
    const auto& p = row(w, gpt_cuda::launch_names::product);
    const int chunks = (40 + gpt_cuda::head_rows(s, batch, rows) - 1) / gpt_cuda::head_rows(s, batch, rows);
    CHECK(p.flops == 6 * N * matrix_params);
    CHECK(p.launches == std::size_t(12 * 3 + 3 * chunks));
    CHECK(row(w, gpt_cuda::launch_names::cross_entropy).launches == std::size_t(chunks));
  }
}

TEST_CASE("the CUDA step's attention: 9 products over the causal half, forward 2, backward_key 4, backward_query 3") {
  const gpt::shape s{.vocab = 11, .context = 5, .width = 12, .heads = 3, .layers = 2};
  const double one = 2.0 * 3 /*batch*/ * 3 /*heads*/ * (5 * 6 / 2) /*pairs*/ * 4 /*head width*/;
  const auto w = gpt_cuda::step_work(s, 3, {});
  CHECK(row(w, gpt_cuda::launch_names::attention_forward).flops == 2 * 2 * one);
  CHECK(row(w, gpt_cuda::launch_names::backward_key).flops == 2 * 4 * one);
  CHECK(row(w, gpt_cuda::launch_names::backward_query).flops == 2 * 3 * one);
  CHECK(row(w, gpt_cuda::launch_names::row_dots).launches == 2);
}

TEST_CASE(
    "the CUDA step in bf16: a block casts two fp32 output gradients (the residual's, into the projections), a head "
    "chunk one; the MLP's and attention's inner gradients, the norms' output gradients and the projections' products "
    "are kept in bf16") {
  const gpt::shape s{.vocab = 37, .context = 8, .width = 16, .heads = 2, .layers = 3};
  for (const int rows : {1, 7, 40}) {
    CAPTURE(rows);
    const auto w = gpt_cuda::step_work(s, 5, {.head_rows = rows});
    const int chunks = (40 + rows - 1) / rows;
    CHECK(row(w, gpt_cuda::launch_names::narrow).launches == std::size_t(3 * 2 + chunks));
    // GELU's backward: its input, its output gradient and its input gradient in bf16, 2 bytes each
    CHECK(row(w, gpt_cuda::launch_names::gelu_backward).bytes == 3 * (3.0 * 40 * 64 * 2));
    // after the MLP's projection: its product read in bf16, the residual read and the block's output written in fp32,
    // the fp32 bias
    CHECK(row(w, gpt_cuda::launch_names::bias_residual).bytes == 3 * (40 * 16 * 2 + 2 * 40 * 16 * 4 + 16 * 4.0));
  }
  CHECK(row(gpt_cuda::step_work(s, 5, {.bf16 = false}), gpt_cuda::launch_names::bias_residual).bytes ==
        3 * (3 * 40 * 16 * 4 + 16 * 4.0));
  // those gradients' scratch, two bf16 to a float (fp32: a float each): [N, 4C] twice, [N, C], [N, 3C], [N, C]
  const std::vector<std::pair<std::string, std::size_t>> kept = {
      {"backward scratch: dfc_gelu, dfc [N, F] in the compute type", 40 * 64},
      {"backward scratch: datty [N, A] in the compute type", 40 * 16},
      {"backward scratch: dqkv [N, 3A] in the compute type", 40 * 48},
      {"scratch: a projection's product, then a norm's output gradient (dln2, dln1, dln_f) [N, C] in the compute type",
       40 * 16}};
  for (const bool bf16 : {true, false}) {
    const auto plan = gpt_cuda::buffer_plan(s, 5, {.bf16 = bf16});
    for (const auto& kept_row : kept) {
      CAPTURE(bf16);
      CAPTURE(kept_row.first);
      const auto it = std::find_if(plan.begin(), plan.end(), [&](const auto& b) { return b.name == kept_row.first; });
      REQUIRE(it != plan.end());
      CHECK(it->floats == (bf16 ? kept_row.second / 2 : kept_row.second));
    }
  }
}

TEST_CASE("the CUDA step: checkpointing runs each block's forward twice; fp32 rounds no operand") {
  const gpt::shape s{.vocab = 16, .context = 8, .width = 16, .heads = 2, .layers = 4};
  const auto plain = gpt_cuda::step_work(s, 2, {}), again = gpt_cuda::step_work(s, 2, {.checkpoint_activations = true});
  for (const char* k : {gpt_cuda::launch_names::layernorm_forward, gpt_cuda::launch_names::attention_forward,
                        gpt_cuda::launch_names::bias_gelu, gpt_cuda::launch_names::bias_residual_layernorm}) {
    CAPTURE(k);
    CHECK(row(again, k).launches - row(plain, k).launches == 4);
  }
  CHECK(row(again, gpt_cuda::launch_names::backward_key).launches ==
        row(plain, gpt_cuda::launch_names::backward_key).launches);
  const auto fp32 = gpt_cuda::step_work(s, 2, {.bf16 = false});
  CHECK(std::none_of(fp32.begin(), fp32.end(), [](const auto& k) { return k.name == gpt_cuda::launch_names::narrow; }));
  CHECK(row(plain, gpt_cuda::launch_names::narrow).launches > 0);
}

TEST_CASE(
    "the CUDA step in tensor groups of 2: the blocks' products, attention and gradient sums halve, the head's "
    "stay whole") {
  namespace n = gpt_cuda::launch_names;
  const gpt::shape s{.vocab = 37, .context = 8, .width = 16, .heads = 2, .layers = 3};
  const double N = 40, C = 16;  // 5 sequences of 8
  const auto one = gpt_cuda::step_work(s, 5, {}), two = gpt_cuda::step_work(s, 5, {.tensor = 2});
  CHECK(row(two, n::product).flops == 6 * N * (3 * 12 * C * C / 2 + 37 * C));
  CHECK(row(two, n::product).launches == row(one, n::product).launches);
  for (const char* k : {n::attention_forward, n::backward_key, n::backward_query}) {
    CAPTURE(k);
    CHECK(row(two, k).flops * 2 == row(one, k).flops);
  }
  // AdamW on a shard of the rank's parameters: its slices and the replicated ones, over the data-parallel ranks
  CHECK(gpt::parameters(s, 2) == gpt::parameters(s) - 3 * (12 * 16 * 16 + 7 * 16) / 2);
  CHECK(row(gpt_cuda::step_work(s, 5, {.tensor = 2}, 4), "library: AdamW").bytes ==
        28.0 * std::ceil(gpt::parameters(s, 2) / 2.0));
  const auto sums = [&](const std::vector<gpt_cuda::planned_buffer>& p) {
    const auto it = std::find_if(p.begin(), p.end(), [](const auto& b) {
      return b.name.find("block gradient") == 0 || b.name.find("fp32 block") == 0;
    });
    REQUIRE(it != p.end());
    return it->floats;
  };
  CHECK(sums(gpt_cuda::buffer_plan(s, 5, {})) == 12 * 16 * 16 + 13 * 16);
  CHECK(sums(gpt_cuda::buffer_plan(s, 5, {.tensor = 2})) == 12 * 16 * 16 / 2 + 6 * 16 + 7 * 16 / 2);
}

TEST_CASE(
    "the CUDA step with experts: a block's router product and each of its rank's experts' two products in place of "
    "its MLP; at one expert rank the four exchanges a block are device copies; the plan holds the most rows a rank "
    "can receive") {
  namespace n = gpt_cuda::launch_names;
  const gpt::shape s{.vocab = 37, .context = 8, .width = 16, .heads = 2, .layers = 3, .experts = 4, .top_k = 2};
  const double N = 40, C = 16, X = 4;  // 5 sequences of 8
  const auto one = gpt_cuda::step_work(s, 5, {}), two = gpt_cuda::step_work(s, 5, {.expert_parallel = 2});
  const int chunks = (40 + gpt_cuda::head_rows(s, 5, 0) - 1) / gpt_cuda::head_rows(s, 5, 0);
  // a block: QKV, the attention projection and the router, and each of the rank's experts' two matrices, each
  // forward and twice backward
  CHECK(row(one, n::product).launches == std::size_t((9 + 6 * 4) * 3 + 3 * chunks));
  CHECK(row(two, n::product).launches == std::size_t((9 + 6 * 2) * 3 + 3 * chunks));
  // 6 FLOPs a token and matrix parameter it uses: a block's attention and router, and its top_k experts' 8 C^2
  for (const auto* w : {&one, &two})
    CHECK(row(*w, n::product).flops == 6 * N * (3 * (4 * C * C + X * C + 2 * 8 * C * C) + 37 * C));
  for (const char* k : {n::route, n::dispatch, n::combine, n::choice_gradients, n::gather_input_gradient,
                        n::route_backward, n::add_into}) {
    CAPTURE(k);
    CHECK(row(one, k).launches == 3);
    CHECK(row(two, k).launches == 3);
  }
  CHECK(row(one, n::gather_rows).launches == 6);   // the rows in, their output gradients in
  CHECK(row(one, n::scatter_rows).launches == 9);  // the outputs out and in place, the input gradients out
  CHECK(row(one, n::bias_gelu).launches == 3 * 4);
  CHECK(row(two, n::bias_gelu).launches == 3 * 2);
  CHECK(row(one, n::add_to_loss).launches == 1);
  CHECK(row(one, n::memcpy).launches - row(two, n::memcpy).launches == 4 * 3);
  // 4 C^2 of attention's matrices, 8 C of the block's norms and biases, X C the router's, P (8 C^2 + 5 C) the rank's
  // two experts'
  const auto plan = gpt_cuda::buffer_plan(s, 5, {.expert_parallel = 2});
  const auto sums =
      std::find_if(plan.begin(), plan.end(), [](const auto& b) { return b.name.find("fp32 block") == 0; });
  REQUIRE(sums != plan.end());
  CHECK(sums->floats == std::size_t(4 * C * C + 8 * C + X * C + 2 * (8 * C * C + 5 * C)));
  const auto received = std::find_if(plan.begin(), plan.end(), [](const auto& b) {
    return b.name == "experts: rows received, then the experts' input gradients [E N K, C]";
  });
  REQUIRE(received != plan.end());
  CHECK(received->floats == std::size_t(2 * N * 2 * C));  // every choice of both ranks, dropless
}

TEST_CASE(
    "a kernel's floor is the larger of its FLOPs at the matrix rate and its bytes at the copy rate; the step's "
    "is their sum") {
  const gpt_cuda::ceilings c{1e12, 1e9, "test"};
  const std::vector<gpt_cuda::kernel_work> w = {{"products", 1, 2e12, 1e9}, {"copies", 1, 1e12, 4e9}};
  CHECK(gpt_cuda::floor_seconds(w[0], c) == 2.0);
  CHECK(gpt_cuda::floor_seconds(w[1], c) == 4.0);
  CHECK(gpt_cuda::floor_seconds(w, c) == 6.0);
  CHECK(
      gpt_cuda::floor_table(w, c) ==
      "the step's floor: 1 TFLOP/s for matrix products, 1 GB/s for bytes read and written (test)\n"
      "  kernel                                     launches      GFLOP         GB   ms FLOPs   ms bytes   floor ms\n"
      "  products                                          1   2000.000      1.000   2000.000   1000.000   2000.000\n"
      "  copies                                            1   1000.000      4.000   1000.000   4000.000   4000.000\n"
      "  the step                                          2   3000.000      5.000   3000.000   5000.000   6000.000\n");
}
