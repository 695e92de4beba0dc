// fsdp::weights: a trainer's own fp32 tensors into a model's master shards by name, and the model's full values
// back into the trainer's buffers, with layers taken from one stacked buffer; refusals that modify nothing.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace {
using fsdp::comm::local_communicator;
constexpr int layers = 3;
constexpr std::int64_t per_layer = 5 * 4;

/// Embedding "emb.w" [7, 4] and three layers "h.<l>.w" [5, 4] (a unit each), as a trainer keeps them: one buffer
/// for the embedding and one stacked [3, 5, 4] buffer for the layers.
fsdp::ModelSpec spec() {
  fsdp::ModelSpec s;
  s.add("emb.w", {7, 4});
  for (int l = 0; l < layers; ++l) s.add("h." + std::to_string(l) + ".w", {5, 4});
  return s;
}
struct trainer_weights {
  std::vector<float> emb = std::vector<float>(28), stacked = std::vector<float>(layers * per_layer);
  /// The tensor of a parameter, by name: the stacked buffer's layer for "h.<l>.w".
  fsdp::weights::tensor operator()(const std::string& name) const {
    if (name == "emb.w") return {emb.data(), std::int64_t(emb.size())};
    if (name.starts_with("h.")) return fsdp::weights::layer(stacked.data(), per_layer, std::stoi(name.substr(2)));
    return {};
  }
};
trainer_weights numbered(float start) {
  trainer_weights w;
  for (std::size_t i = 0; i < w.emb.size(); ++i) w.emb[i] = start + float(i);
  for (std::size_t i = 0; i < w.stacked.size(); ++i) w.stacked[i] = -start - 0.5f * float(i);
  return w;
}
auto by_prefix = fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
  return p.name.substr(0, p.name.find('.', p.name.find('.') + 1));  // "emb.w" -> "emb.w", "h.1.w" -> "h.1"
}};
}  // namespace

TEST_CASE_TEMPLATE("loaded from the trainer's buffers and stored back, bit for bit, at 1, 3 and 4 ranks", Strategy,
                   fsdp::sharding::full_shard, fsdp::sharding::shard_grad_op, fsdp::sharding::zero1,
                   fsdp::sharding::no_shard) {
  const trainer_weights given = numbered(1.25f);
  for (int world : {1, 3, 4}) {
    CAPTURE(world);
    fsdp_test::run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<fsdp::policy<Strategy>> m(c, spec(), by_prefix);
      fsdp::weights::load(m, given);
      const auto full = fsdp::weights::gather_full_params(m);
      CHECK(full.at("emb.w") == given.emb);
      CHECK(full.at("h.2.w") == std::vector<float>(given.stacked.begin() + 2 * per_layer, given.stacked.end()));
      trainer_weights back;  // zeros
      fsdp::weights::store(m, [&](const std::string& name) -> fsdp::weights::target {
        if (name == "emb.w") return {back.emb.data(), std::int64_t(back.emb.size())};
        return fsdp::weights::layer(back.stacked.data(), per_layer, std::stoi(name.substr(2)));
      });
      CHECK(back.emb == given.emb);
      CHECK(back.stacked == given.stacked);
    });
  }
}

// A C trainer keeps `float*` fields (llm.c's ParameterTensors): layer() of a writable buffer is a target, which a
// load's source returns as its tensor.
TEST_CASE("a load's source over a trainer's float* buffers returns layer() of them as tensors") {
  trainer_weights given = numbered(0.5f);
  float* emb = given.emb.data();
  float* stacked = given.stacked.data();
  fsdp_test::run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec(), by_prefix);
    fsdp::weights::load(m, [&](const std::string& name) -> fsdp::weights::tensor {
      if (name == "emb.w") return {emb, 28};
      return fsdp::weights::layer(stacked, per_layer, std::stoi(name.substr(2)));
    });
    const auto full = fsdp::weights::gather_full_params(m);
    CHECK(full.at("emb.w") == given.emb);
    CHECK(full.at("h.1.w") ==
          std::vector<float>(given.stacked.begin() + per_layer, given.stacked.begin() + 2 * per_layer));
  });
}

TEST_CASE_TEMPLATE("on a hybrid mesh of 2 replicas x 2 shards every shard group holds the whole model, bit for bit",
                   Strategy, fsdp::sharding::hybrid_shard<2>, fsdp::sharding::hybrid_shard_zero2<2>,
                   fsdp::sharding::hybrid_shard_zero1<2>) {
  const trainer_weights given = numbered(-0.5f);
  std::mutex mu;
  std::map<int, std::vector<float>> shards;  // rank -> its master shard of h.1
  fsdp_test::run_ranks(4, [&](local_communicator& c) {
    fsdp::Model<fsdp::policy<Strategy>> m(c, spec(), by_prefix);
    REQUIRE(m.mesh().shards == 2);
    REQUIRE(m.mesh().replicas == 2);
    fsdp::weights::load(m, given);
    {
      const auto& u = m.unit("h.1");
      const float* p = u.master_shard();
      std::lock_guard lock(mu);
      shards[c.rank()].assign(p, p + m.unit("h.1").layout().shard_numel());
    }
    const auto full = fsdp::weights::gather_full_params(m);
    CHECK(full.at("emb.w") == given.emb);
    for (int l = 0; l < layers; ++l)
      CHECK(full.at("h." + std::to_string(l) + ".w") ==
            std::vector<float>(given.stacked.begin() + l * per_layer, given.stacked.begin() + (l + 1) * per_layer));
    trainer_weights back;
    fsdp::weights::store(m, [&](const std::string& name) -> fsdp::weights::target {
      if (name == "emb.w") return {back.emb.data(), std::int64_t(back.emb.size())};
      return fsdp::weights::layer(back.stacked.data(), per_layer, std::stoi(name.substr(2)));
    });
    CHECK(back.emb == given.emb);
    CHECK(back.stacked == given.stacked);
  });
  // The mesh is replicas x shards, rank = replica * 2 + shard: ranks 0 and 2 hold the first half of h.1's
  // elements, ranks 1 and 3 the second; the two halves are the layer, in order, then the layout's tail padding.
  CHECK(shards.at(0) == shards.at(2));
  CHECK(shards.at(1) == shards.at(3));
  std::vector<float> layer = shards.at(0);
  layer.insert(layer.end(), shards.at(1).begin(), shards.at(1).end());
  REQUIRE(layer.size() >= std::size_t(per_layer));
  layer.resize(std::size_t(per_layer));
  CHECK(layer == std::vector<float>(given.stacked.begin() + per_layer, given.stacked.begin() + 2 * per_layer));
}

TEST_CASE("a missing or mis-sized tensor is refused on every rank, naming the parameter and the ranks; nothing "
          "is modified") {
  std::vector<std::string> errors(2);
  std::mutex mu;
  fsdp_test::run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec(), by_prefix);
    const auto before = fsdp::weights::gather_full_params(m);
    const trainer_weights w = numbered(2.0f);
    const std::string missing = fsdp_test::error_of<fsdp::usage_error>([&] {
      fsdp::weights::load(m, [&](const std::string& name) -> fsdp::weights::tensor {
        return name == "h.1.w" && c.rank() == 1 ? fsdp::weights::tensor{} : w(name);
      });
    });
    const std::string sized = fsdp_test::error_of<fsdp::usage_error>([&] {
      fsdp::weights::load(m, [&](const std::string& name) -> fsdp::weights::tensor {
        return name == "emb.w" ? fsdp::weights::tensor{w.emb.data(), 27} : w(name);
      });
    });
    CHECK(fsdp::weights::gather_full_params(m) == before);
    std::lock_guard lk(mu);
    errors[std::size_t(c.rank())] = missing + "\n" + sized;
  });
  const std::string expected =
      "fsdp: weights::load: rank 1: the trainer gave no tensor for parameter 'h.1.w' [5, 4] (every parameter that is "
      "not an alias must be given); no parameter was modified\n"
      "fsdp: weights::load: ranks 0, 1: parameter 'emb.w' [7, 4] has 28 elements, but the trainer's tensor has 27; "
      "no parameter was modified";
  CHECK(errors[0] == expected);
  CHECK(errors[1] == expected);
}

TEST_CASE("store refuses a buffer of another size, naming the parameter") {
  fsdp_test::run_ranks(1, [&](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec(), by_prefix);
    std::vector<float> small(3);
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
            fsdp::weights::store(m, [&](const std::string& name) -> fsdp::weights::target {
              return name == "h.0.w" ? fsdp::weights::target{small.data(), 3} : fsdp::weights::target{};
            });
          }) == "fsdp: weights::store: parameter 'h.0.w' [5, 4] has 20 elements, but the trainer's buffer for it has 3 "
               "(rank 0)");
  });
}

namespace {
/// A C trainer's parameters: an embedding and two stacked kinds of layer tensor, [3, 5, 4] and [3, 5].
struct parameter_tensors {
  float* emb = nullptr;  // [7, 4]
  float* w = nullptr;    // [L, 5, 4]
  float* b = nullptr;    // [L, 5]
};
fsdp::weights::stacked<parameter_tensors> layer_stack() {
  return {"h.", layers, {{"w", &parameter_tensors::w, {5, 4}}, {"b", &parameter_tensors::b, {5}}}};
}
}  // namespace

TEST_CASE("stacked: one declaration of [L, ...] buffers gives the spec, a unit per layer, the slices and the views") {
  const auto stack = layer_stack();
  fsdp::ModelSpec spec;
  spec.add("emb.w", {7, 4});
  stack.add_to(spec);
  std::vector<std::string> names;
  for (const auto& p : spec.params()) names.push_back(p.name + " " + fsdp::detail::shape_text(p.shape));
  CHECK(names == std::vector<std::string>{"emb.w [7, 4]", "h.0.w [5, 4]", "h.0.b [5]", "h.1.w [5, 4]", "h.1.b [5]",
                                          "h.2.w [5, 4]", "h.2.b [5]"});
  CHECK(stack.unit_of("h.2.b") == "h.2");
  CHECK(stack.layer_of("h.2") == 2);
  for (const char* other : {"emb.w", "h.3.w", "h.01.w", "h.1.x", "h.1", "h..w", "h.-1.w", "g.1.w"}) {
    CAPTURE(other);
    CHECK(stack.unit_of(other).empty());
  }
  for (const char* other : {"emb", "h.", "h.3", "h.1.w", "h.01", "h"}) {
    CAPTURE(other);
    CHECK(stack.layer_of(other) == -1);
  }

  std::vector<float> emb(28), w(layers * per_layer), b(layers * 5);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * float(i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = -1.0f - float(i);
  for (std::size_t i = 0; i < emb.size(); ++i) emb[i] = 100.0f + float(i);
  const parameter_tensors given{emb.data(), w.data(), b.data()};
  const fsdp::weights::target s = stack.slice(given, "h.1.b");
  CHECK(s.data == b.data() + 5);
  CHECK(s.numel == 5);
  CHECK(stack.slice(given, "emb.w").data == nullptr);

  for (int world : {1, 3}) {
    CAPTURE(world);
    fsdp_test::run_ranks(world, [&](local_communicator& c) {
      auto unit_of = [&](const fsdp::ParamSpec& p) {
        const std::string u = stack.unit_of(p.name);
        return u.empty() ? std::string("emb") : u;
      };
      fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec, fsdp::wrap::by_function{unit_of});
      fsdp::weights::load(m, [&](const std::string& name) -> fsdp::weights::tensor {
        return name == "emb.w" ? fsdp::weights::tensor{emb.data(), 28} : stack.slice(given, name);
      });
      int layers_seen = 0;
      for (auto& u : m.forward()) {
        if (u.name() == "emb") continue;
        const int l = stack.layer_of(u.name());
        const parameter_tensors v = stack.params(u);
        CHECK(v.emb == nullptr);
        CHECK(v.w == u.param(u.name() + ".w").data());
        CHECK(v.b == u.param(u.name() + ".b").data());
        CHECK(std::vector<float>(v.w, v.w + per_layer) ==
              std::vector<float>(w.begin() + l * per_layer, w.begin() + (l + 1) * per_layer));
        CHECK(std::vector<float>(v.b, v.b + 5) == std::vector<float>(b.begin() + l * 5, b.begin() + (l + 1) * 5));
        ++layers_seen;
      }
      CHECK(layers_seen == layers);
      for (auto& u : m.backward()) {
        if (u.name() == "emb") continue;
        const parameter_tensors g = stack.grads(u);
        CHECK(g.w == u.grad(u.name() + ".w").data());
        CHECK(g.b == u.grad(u.name() + ".b").data());
        CHECK(g.emb == nullptr);
      }
      // stored back through the same slices: the stacked buffers, bit for bit
      std::vector<float> w2(w.size()), b2(b.size());
      const parameter_tensors back{nullptr, w2.data(), b2.data()};
      fsdp::weights::store(m, [&](const std::string& name) { return stack.slice(back, name); });
      CHECK(w2 == w);
      CHECK(b2 == b);
    });
  }
}

TEST_CASE("stacked: misuse is refused, naming the part of the declaration at fault") {
  using stack_t = fsdp::weights::stacked<parameter_tensors>;
  auto error = [](auto&& f) { return fsdp_test::error_of<fsdp::usage_error>(f); };
  CHECK(error([] { stack_t("h.", 0, {{"w", &parameter_tensors::w, {5, 4}}}); }) ==
        "fsdp: stacked 'h.': 0 layers; at least 1");
  CHECK(error([] { stack_t("", 2, {{"w", &parameter_tensors::w, {5, 4}}}); }) ==
        "fsdp: stacked: the unit prefix is empty (\"h.\" names units h.0, h.1, ...)");
  CHECK(error([] { stack_t("h.", 2, {}); }) == "fsdp: stacked 'h.': no tensor kinds declared");
  CHECK(error([] { stack_t("h.", 2, {{"", &parameter_tensors::w, {5, 4}}}); }) ==
        "fsdp: stacked 'h.': kind 0 has no name");
  CHECK(error([] { stack_t("h.", 2, {{"w", &parameter_tensors::w, {5, 0}}}); }) ==
        "fsdp: stacked 'h.': kind 'w' has a dimension of 0 in its layer shape; each is at least 1");
  CHECK(error([] { stack_t("h.", 2, {{"w", &parameter_tensors::w, {5}}, {"w", &parameter_tensors::b, {5}}}); }) ==
        "fsdp: stacked 'h.': two kinds named 'w'");
  CHECK(error([] { stack_t("h.", 2, {{"w", &parameter_tensors::w, {5}}, {"b", &parameter_tensors::w, {5}}}); }) ==
        "fsdp: stacked 'h.': kinds 'w' and 'b' name the same member");
  CHECK(error([] { stack_t("h.", 2, {{"w", nullptr, {5}}}); }) == "fsdp: stacked 'h.': kind 'w' names no member");
  const auto stack = layer_stack();
  CHECK(error([&] { (void)stack.slice(parameter_tensors{}, "h.2.b"); }) ==
        "fsdp: stacked 'h.': the trainer's buffer of 'b' is null (asked for 'h.2.b')");
  fsdp_test::run_ranks(1, [&](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> m(c, spec(), by_prefix);
    for (auto& u : m.forward())
      if (u.name() == "emb.w")
        CHECK(error([&] { (void)stack.params(u); }) ==
              "fsdp: stacked 'h.': unit 'emb.w' is not one of the stack's units (h.0 .. h.2)");
  });
}
