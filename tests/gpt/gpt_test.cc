// The GPT example (examples/04_gpt_host) as a specification: its kernels' gradients, its data, and what training
// it on the library shows: activation checkpointing that changes no bit and no collective, the planner's peak
// equal to the measured one, the root unit kept gathered. The losses across world sizes: gpt_parity_test.cc.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

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

/// The whole model's mean loss on (inputs, targets) with the trainer's kernels; its gradients into `grads`.
float loss_and_grads(const gpt::shape& s, int B, const fsdp::ModelSpec& spec,
                     std::map<std::string, std::vector<float>>& values, std::map<std::string, std::vector<float>>& grads,
                     const std::vector<int>& inputs, const std::vector<int>& targets) {
  for (auto& [name, g] : grads) std::fill(g.begin(), g.end(), 0.0f);
  const fake_unit u{&values, &grads, &spec};
  gpt::trainer<float> tr(s, B);
  tr.begin_step(inputs, targets);
  std::vector<std::vector<float>> xs(static_cast<std::size_t>(s.layers) + 1);
  std::vector<gpt::block_cache> caches(static_cast<std::size_t>(s.layers));
  tr.embed(u, xs[0]);
  for (int l = 0; l < s.layers; ++l) tr.block_forward(u, l, xs[l], caches[l], xs[l + 1]);
  std::vector<float> dx, dnext;
  tr.head(u, xs.back(), dx);
  for (int l = s.layers - 1; l >= 0; --l) {
    tr.block_backward(u, l, xs[l], caches[l], dx, dnext);
    dx.swap(dnext);
  }
  tr.root_backward(u, dx);
  return tr.local_loss();
}

}  // namespace

TEST_CASE("every parameter's gradient (tied head and embedding together) matches central finite differences") {
  const gpt::shape s{.vocab = 11, .context = 5, .width = 8, .heads = 2, .layers = 2};
  const int B = 2;
  const fsdp::ModelSpec spec = gpt::make_spec(s, 3);
  std::map<std::string, std::vector<float>> values, grads;
  std::uint64_t k = 0;
  for (const auto& p : spec.params()) {
    if (p.is_tied()) continue;
    std::vector<float> v(static_cast<std::size_t>(p.numel()));
    const bool gain = p.name.find("ln_") != std::string::npos && p.name.back() == 'w';
    for (auto& x : v) x = (gain ? 1.0f : 0.0f) + 0.3f * static_cast<float>(2.0 * gpt::detail::uniform(9, 0, k++) - 1.0);
    values[p.name] = v;
    grads[p.name].assign(v.size(), 0.0f);
  }
  std::vector<int> inputs(B * s.context), targets(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = static_cast<int>(i * 7 % 11);
    targets[i] = static_cast<int>((i * 5 + 3) % 11);
  }
  loss_and_grads(s, B, spec, values, grads, inputs, targets);
  const auto analytic = grads;
  int checked = 0;
  for (auto& [name, v] : values) {
    for (std::size_t i = 0; i < v.size(); i += 1 + v.size() / 7) {  // about 7 elements of each parameter
      const float keep = v[i], h = 3e-3f;  // larger steps see the curvature of softmax and GELU
      v[i] = keep + h;
      const float up = loss_and_grads(s, B, spec, values, grads, inputs, targets);
      v[i] = keep - h;
      const float down = loss_and_grads(s, B, spec, values, grads, inputs, targets);
      v[i] = keep;
      const double fd = (static_cast<double>(up) - down) / (2.0 * h), an = analytic.at(name)[i];
      INFO(name << "[" << i << "]: finite difference " << fd << ", backward " << an);
      CHECK(std::abs(fd - an) <= 3e-4 + 2e-2 * std::abs(an));
      ++checked;
    }
  }
  CHECK(checked > 100);
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
  CHECK(plain[0].activation_bytes - ckpt[0].activation_bytes == (c.model.layers - 1) * (plain[0].activation_bytes_per_block - input));
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
        train<fsdp::policy<fsdp::sharding::shard_grad_op, fsdp::prefetch::next, fsdp::precision::mixed<bfloat16>>>(3, c);
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
}
