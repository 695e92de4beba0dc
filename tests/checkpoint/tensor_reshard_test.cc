// Checkpoints and safetensors files across tensor- and expert-parallel degrees: files hold global tensors in their
// own element order, so a checkpoint saved on a replicas x shards x experts x tensor mesh loads on any other mesh and
// strategy, every master and optimizer-state element bit for bit; a safetensors export writes whole tensors and an
// import splits them.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <fsdp/checkpoint/checkpoint.hpp>
#include <fsdp/checkpoint/safetensors.hpp>

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::run_ranks;

namespace {
/// A root unit (an embedding, replicated), two Megatron blocks: a fused [q; k; v] (split(0, 3)), column-parallel
/// w1, b1 (split(0)), row-parallel w2 (split(1)), b2 with a partial gradient; and a unit of 4 experts (w1 split on
/// its dimension 1, w2 replicated); split dimensions divisible by 4.
fsdp::ModelSpec spec() {
  fsdp::ModelSpec s;
  s.add("emb", {10, 8});
  for (int b = 0; b < 2; ++b) {
    const std::string p = "h." + std::to_string(b) + ".";
    s.add(p + "qkv", {24, 8}, {.tensor = fsdp::tp::split(0, 3)});
    s.add(p + "w1", {16, 8}, {.tensor = fsdp::tp::split(0)});
    s.add(p + "b1", {16}, {.init = fsdp::init::uniform{}, .tensor = fsdp::tp::split(0)});
    s.add(p + "w2", {8, 12}, {.tensor = fsdp::tp::split(1)});
    s.add(p + "b2", {8}, {.init = fsdp::init::uniform{}, .tensor = fsdp::tp::partial_grad});
  }
  s.add("h.moe.w1", {4, 8, 6}, {.tensor = fsdp::tp::split(1), .experts = true});
  s.add("h.moe.w2", {4, 6, 8}, {.init = fsdp::init::uniform{}, .experts = true});
  return s;
}

/// "param/h.0.w1", "exp_avg/h.0.w1", ...: every global tensor of parameters and optimizer state.
using global_values = std::map<std::string, std::vector<float>>;

using model = fsdp::basic_model<fsdp::backend::host, local_communicator, float>;
using adamw = fsdp::optim::adamw<model::core_type>;

struct layout {
  std::string name;  ///< for messages
  int world, tensor, expert;
  /// Runs `fn(model, optimizer)` on a rank of a model of this layout (each layout its own strategy).
  std::function<void(local_communicator&, const std::function<void(model&, adamw&)>&)> run;
};

template <class Strategy>
layout make_layout(std::string name, int world, int tensor, int expert = 1) {
  layout l{std::move(name), world, tensor, expert, {}};
  l.run = [tensor, expert](local_communicator& c, const std::function<void(model&, adamw&)>& fn) {
    fsdp::model_options o;
    o.tensor_parallel = tensor;
    o.expert_parallel = expert;
    fsdp::Model<fsdp::policy<Strategy>> m(c, spec(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 3}, o);
    fsdp::optim::adamw opt(m, {.lr = 0.05f});
    fn(m, opt);
  };
  return l;
}

/// Every global element of this rank's shards (masters and optimizer states) into `out`, under `mu`.
template <class M, class O>
void collect(M& m, O& opt, global_values& out, std::mutex& mu) {
  m.synchronize();
  std::lock_guard lk(mu);
  const std::vector<std::string> kinds{"param", "exp_avg", "exp_avg_sq"};
  const fsdp::tensor_coords t{m.mesh().tensor, m.mesh().tensor_rank(m.comm().rank())};
  const fsdp::expert_coords e{m.mesh().expert, m.mesh().expert_rank(m.comm().rank())};
  for (std::size_t u = 0; u < m.size(); ++u)
    for (const fsdp::ShardedTensor& v : m.unit(u).shard_views()) {
      if (v.empty()) continue;
      const fsdp::ParamSpec& p = m.spec().at(v.name);
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        const float* src = (k == 0 ? m.unit(u).master_shard() : opt.state(u, static_cast<int>(k - 1))) + v.shard_offset;
        std::vector<float>& g = out[kinds[k] + "/" + v.name];
        std::int64_t numel = p.experts ? e.degree : 1;
        for (std::int64_t d : fsdp::global_shape(p.shape, p.tensor, t.degree)) numel *= d;
        g.resize(static_cast<std::size_t>(numel));
        fsdp::for_each_global_run(
            p.shape, p.tensor, t, v.begin, v.local_numel(),
            [&](std::int64_t global, std::int64_t at, std::int64_t n) { std::copy_n(src + at, n, g.begin() + global); },
            fsdp::expert_base(p.shape, p.tensor, p.experts, t, e));
      }
    }
}

/// Two AdamW steps on `l` with gradients that are a function of the data-parallel rank and the global element (so
/// that every tensor rank holding a replicated parameter writes the same), then save to `dir` (and, when
/// `safetensors` is not empty, export there); returns every global value.
global_values train_and_save(const layout& l, const std::string& dir, const std::string& safetensors = {}) {
  global_values out;
  std::mutex mu;
  run_ranks(l.world, [&](local_communicator& c) {
    l.run(c, [&](model& m, adamw& opt) {
      const fsdp::tensor_coords t{m.mesh().tensor, m.mesh().tensor_rank(c.rank())};
      const fsdp::expert_coords ex{m.mesh().expert, m.mesh().expert_rank(c.rank())};
      const int dp = m.mesh().data_parallel_rank(c.rank());
      for (int step = 0; step < 2; ++step) {
        for (auto& u : m.forward()) (void)u;
        for (auto& u : m.backward())
          for (const auto& e : u.layout().entries()) {
            const auto g = u.grad(e.name);
            const fsdp::ParamSpec& p = m.spec().at(e.name);
            fsdp::for_each_global_run(
                p.shape, p.tensor, t, 0, g.numel(),
                [&](std::int64_t global, std::int64_t at, std::int64_t n) {
                  for (std::int64_t i = 0; i < n; ++i)
                    g[at + i] = 0.01f * float((global + i) % 13) - 0.05f * float(dp + step);
                },
                fsdp::expert_base(p.shape, p.tensor, p.experts, t, ex));
          }
        opt.step();
        opt.zero_grad();
      }
      fsdp::checkpoint::save(m, opt, dir);
      if (!safetensors.empty()) fsdp::safetensors::save(m, safetensors);
      collect(m, opt, out, mu);
    });
  });
  return out;
}

/// Loads `dir` into a fresh model of `l` (and saves it to `resave` when given); every global value after the load.
global_values load(const layout& l, const std::string& dir, const std::string& resave = {}) {
  global_values out;
  std::mutex mu;
  run_ranks(l.world, [&](local_communicator& c) {
    l.run(c, [&](model& m, adamw& opt) {
      fsdp::checkpoint::load(m, opt, dir);
      if (!resave.empty()) fsdp::checkpoint::save(m, opt, resave);
      collect(m, opt, out, mu);
    });
  });
  return out;
}

/// `dir`/ckpt, saved by `saved` with values `want`, loads into each of `others` bit for bit, and each one's save (in
/// `dir`/back-i) loads into `saved` bit for bit.
void loads_everywhere(const layout& saved, const std::vector<layout>& others, const fsdp_test::scratch_dir& dir,
                      const global_values& want) {
  for (std::size_t i = 0; i < others.size(); ++i) {
    const layout& l = others[i];
    CAPTURE(l.name);
    const std::string back = dir / ("back-" + std::to_string(i));
    CHECK(load(l, dir / "ckpt", back) == want);  // bit for bit
    CHECK(load(saved, back) == want);            // and back
  }
}

/// Imports the safetensors file into a fresh model of `l`; every parameter's global value.
std::map<std::string, std::vector<float>> import(const layout& l, const std::string& path) {
  global_values all;
  std::mutex mu;
  run_ranks(l.world, [&](local_communicator& c) {
    l.run(c, [&](model& m, adamw& opt) {
      fsdp::safetensors::load(m, path);
      collect(m, opt, all, mu);
    });
  });
  std::map<std::string, std::vector<float>> params;
  for (auto& [key, v] : all)
    if (key.starts_with("param/")) params[key.substr(6)] = std::move(v);
  return params;
}
}  // namespace

TEST_CASE("a checkpoint saved at tensor 2 x shard 2 loads at tensor 1 x 4, 4 x 1, 2 x (2 replicas x 1), and back") {
  fsdp_test::scratch_dir dir("tensor_reshard_test");
  using fsdp::sharding::full_shard;
  const layout saved = make_layout<full_shard>("tensor 2 x shard 2", 4, 2);
  const global_values want = train_and_save(saved, dir / "ckpt", dir / "m.safetensors");
  REQUIRE(want.size() == 13 * 3);
  const std::vector<layout> others{
      make_layout<full_shard>("tensor 1 x shard 4", 4, 1),
      make_layout<full_shard>("tensor 4 x shard 1", 4, 4),
      make_layout<fsdp::sharding::hybrid_shard<1>>("tensor 2 x (2 replicas x shard 1)", 4, 2),
      make_layout<fsdp::sharding::zero1>("zero1, tensor 2 x shard 3", 6, 2),
      make_layout<fsdp::sharding::no_shard>("no_shard, tensor 4 x 2 replicas", 8, 4),
  };
  loads_everywhere(saved, others, dir, want);
  // the manifest records the global shapes, the placements and the saving mesh
  const fsdp::checkpoint::manifest man = fsdp::checkpoint::read_manifest(dir / "ckpt");
  CHECK(man.tensor_ranks == 2);
  CHECK(man.shards == 2);
  CHECK(man.files.size() == 4);  // one file per rank of the first replica: every tensor rank of every shard
  const fsdp::checkpoint::tensor_record* w2 = man.tensor("h.1.w2");
  REQUIRE(w2 != nullptr);
  CHECK(w2->shape == std::vector<std::int64_t>{8, 12});
  CHECK(w2->placement == fsdp::tp::split(1));
  CHECK(man.tensor("h.1.b2")->placement == fsdp::tp::partial_grad);
  CHECK(man.tensor("emb")->placement == fsdp::tp::replicated);

  // safetensors: whole tensors in the file, split again on import at any degree
  const fsdp::safetensors::header h =
      fsdp::safetensors::read_header(fsdp::checkpoint::io::open_read(dir / "m.safetensors"));
  REQUIRE(h.find("h.0.w2") != nullptr);
  CHECK(h.find("h.0.w2")->shape == std::vector<std::int64_t>{8, 12});
  std::map<std::string, std::vector<float>> params;
  for (const auto& [key, v] : want)
    if (key.starts_with("param/")) params[key.substr(6)] = v;
  CHECK(import(make_layout<full_shard>("tensor 1", 2, 1), dir / "m.safetensors") == params);
  CHECK(import(make_layout<full_shard>("tensor 4 x shard 2", 8, 4), dir / "m.safetensors") == params);
}

TEST_CASE(
    "a checkpoint saved with experts split over 2 ranks loads at 1 and 4, with tensor groups, under no_shard and "
    "hybrid sharding, and back") {
  fsdp_test::scratch_dir dir("expert_reshard_test");
  using fsdp::sharding::full_shard;
  const layout saved = make_layout<full_shard>("experts 2 x shard 2", 4, 1, 2);
  const global_values want = train_and_save(saved, dir / "ckpt", dir / "m.safetensors");
  REQUIRE(want.size() == 13 * 3);
  CHECK(want.at("param/h.moe.w1").size() == 4u * 8 * 6);
  const std::vector<layout> others{
      make_layout<full_shard>("experts 1 x shard 4", 4, 1, 1),
      make_layout<full_shard>("experts 4 x shard 1", 4, 1, 4),
      make_layout<full_shard>("experts 2 x shard 2 x tensor 2", 8, 2, 2),
      make_layout<fsdp::sharding::no_shard>("no_shard, experts 2 out of 4 replicas", 4, 1, 2),
      make_layout<fsdp::sharding::hybrid_shard<2>>("2 replicas x (experts 2 x shard 1)", 4, 1, 2),
      make_layout<fsdp::sharding::zero1>("zero1, experts 4 x shard 2 x tensor 2", 16, 2, 4),
  };
  loads_everywhere(saved, others, dir, want);
  // one file per rank of the first replica; the global shape of a stack of experts
  const fsdp::checkpoint::manifest man = fsdp::checkpoint::read_manifest(dir / "ckpt");
  CHECK(man.files.size() == 4);
  CHECK(man.tensor("h.moe.w2")->shape == std::vector<std::int64_t>{4, 6, 8});
  CHECK(fsdp::checkpoint::read_manifest(dir / "back-3").files.size() == 2);  // no_shard: the two expert ranks' files
  std::map<std::string, std::vector<float>> params;
  for (const auto& [key, v] : want)
    if (key.starts_with("param/")) params[key.substr(6)] = v;
  CHECK(import(make_layout<full_shard>("experts 1", 1, 1, 1), dir / "m.safetensors") == params);
  CHECK(import(make_layout<fsdp::sharding::no_shard>("experts 4 out of 4 replicas", 4, 1, 4), dir / "m.safetensors") ==
        params);
  // a model with another expert count: refused by the global shapes, naming the parameter, nothing read
  fsdp::ModelSpec eight;
  const fsdp::ModelSpec four = spec();
  for (const fsdp::ParamSpec& p : four.params()) {
    std::vector<std::int64_t> shape = p.shape;
    if (p.experts) shape[0] = 8;
    eight.add(p.name, shape, {.init = p.init, .tensor = p.tensor, .experts = p.experts});
  }
  run_ranks(2, [&](local_communicator& c) {
    fsdp::model_options o;
    o.expert_parallel = 2;
    fsdp::Model<fsdp::policy<full_shard>> m(c, eight, fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 3}, o);
    const std::string at = dir / "ckpt";
    CHECK(fsdp_test::error_of<fsdp::checkpoint_error>([&] { fsdp::checkpoint::load(m, at); }) ==
          "fsdp: checkpoint load from '" + at + "' failed (no parameter was modified): ranks 0, 1: checkpoint '" + at +
              "': parameter 'h.moe.w1' is [4, 8, 6] in the checkpoint but [8, 8, 6] in the model");
  });
}
