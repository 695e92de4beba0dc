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
