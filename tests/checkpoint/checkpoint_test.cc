// Sharded checkpoints on thread ranks: a resume equals a run that never stopped, bit for bit; a load on another
// world size, mesh, strategy or wrapping gives every tensor back bit for bit; every failure is the same error on
// every rank and leaves the previous checkpoint loadable and the model untouched.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fsdp/checkpoint/checkpoint.hpp>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

namespace ckpt = fsdp::checkpoint;
using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::local_state;
using fsdp_test::run_ranks;
using fsdp_test::same_bits;

namespace {

using full_shard = fsdp::policy<fsdp::sharding::full_shard>;
using grad_op = fsdp::policy<fsdp::sharding::shard_grad_op>;
using no_shard = fsdp::policy<fsdp::sharding::no_shard>;
using hybrid2 = fsdp::policy<fsdp::sharding::hybrid_shard<2>>;
using hybrid1 = fsdp::policy<fsdp::sharding::hybrid_shard<1>>;

mlp::config small() {
  mlp::config c;
  c.dims = {12, 40, 24, 6};  // three units of uneven sizes; shards split parameters across ranks
  c.global_batch = 24;
  return c;
}

/// Every tensor of a model and optimizer by (name, kind), full: what the ranks hold, put together.
using full_tensors = std::map<std::pair<std::string, std::string>, std::vector<float>>;

template <class M, class O>
void collect(M& m, O& opt, full_tensors& out, std::mutex& mu) {
  auto& be = m.backend();
  m.synchronize();
  for (std::size_t u = 0; u < m.size(); ++u) {
    std::vector<float> master(static_cast<std::size_t>(m.unit(u).layout().shard_numel()));
    be.download(master.data(), m.unit(u).master_shard(), static_cast<std::int64_t>(master.size() * 4),
                be.compute_stream());
    be.synchronize(be.compute_stream());
    for (const fsdp::ShardedTensor& v : m.unit(u).shard_views()) {
      std::lock_guard lock(mu);
      auto& p = out[{v.name, "param"}];
      p.resize(static_cast<std::size_t>(v.numel), -1.0f);
      std::copy(master.begin() + v.shard_offset, master.begin() + v.shard_offset + v.local_numel(),
                p.begin() + v.begin);
    }
    for (const std::string& s : opt.state_names())
      for (const fsdp::ShardedTensor& v : m.unit(u).shard_views()) {
        const auto part = opt.state(v.name, s);
        std::vector<float> host(static_cast<std::size_t>(part.view.local_numel()));
        be.download(host.data(), part.data, static_cast<std::int64_t>(host.size() * 4), be.compute_stream());
        be.synchronize(be.compute_stream());
        std::lock_guard lock(mu);
        auto& t = out[{v.name, s}];
        t.resize(static_cast<std::size_t>(v.numel), -1.0f);
        std::copy(host.begin(), host.end(), t.begin() + part.view.begin);
      }
  }
}

}  // namespace

TEST_CASE("a resume equals training without a stop, bit for bit: parameters, optimizer state, step counts") {
  fsdp_test::scratch_dir dir("ckpt-resume");
  const mlp::config c = small();
  const int world = 4, first = 3, more = 2;
  for (const std::string optimizer : {"adamw", "sgd"}) {
    CAPTURE(optimizer);
    mlp::config cfg = c;
    cfg.optimizer = optimizer;
    std::vector<std::vector<std::vector<float>>> straight(world), resumed(world);
    std::vector<std::vector<float>> losses_straight(world), losses_resumed(world);
    const std::string path = dir / ("ck-" + optimizer);
    run_ranks(world, [&](local_communicator& comm) {
      const int r = comm.rank();
      {
        auto m = mlp::make_model<full_shard>(comm, cfg);
        mlp::with_optimizer(m, cfg, [&](auto& opt) {
          mlp::result res;
          mlp::run_steps(m, opt, cfg, 0, first + more, res);
          straight[r] = local_state(m, opt);
          losses_straight[r] = res.losses;
          return res;
        });
      }
      {
        auto m = mlp::make_model<full_shard>(comm, cfg);
        mlp::with_optimizer(m, cfg, [&](auto& opt) {
          mlp::result res;
          mlp::run_steps(m, opt, cfg, 0, first, res);
          // saved through the model's core, as a loop written over it would (fsdp/model_core.hpp): the manifest records
          // the policy's strategy and compute dtype all the same
          auto& core = static_cast<typename decltype(m)::core_type&>(m);
          ckpt::save(core, opt, path, {.metadata = {{"data.next_step", std::to_string(first)}}});
          return res;
        });
      }
      auto m = mlp::make_model<full_shard>(comm, cfg);  // freshly initialised: everything comes from the checkpoint
      mlp::with_optimizer(m, cfg, [&](auto& opt) {
        const ckpt::manifest man = ckpt::load(m, opt, path);
        CHECK(man.metadata.at("data.next_step") == "3");
        CHECK(man.strategy == std::string(full_shard::sharding::name));
        CHECK(man.compute_dtype == std::string(fsdp::name_of(fsdp::dtype::f32)));
        CHECK(m.step_count() == std::uint64_t{first});
        CHECK(opt.steps() == first);
        mlp::result res = {};
        res.losses.assign(first, 0.0f);
        mlp::run_steps(m, opt, cfg, first, more, res);
        CHECK(opt.steps() == first + more);
        CHECK(m.step_count() == std::uint64_t{first + more});
        resumed[r] = local_state(m, opt);
        losses_resumed[r] = res.losses;
        return res;
      });
    });
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(same_bits(straight[r], resumed[r]));
      for (int s = first; s < first + more; ++s) CHECK(losses_straight[r][s] == losses_resumed[r][s]);
    }
  }
}

TEST_CASE("a resume under fp16 with a loss scaler restores the scale and its good-step count") {
  fsdp_test::scratch_dir dir("ckpt-scaler");
  using fp16 = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::float16>>;
  const int world = 2;
  std::vector<std::vector<std::vector<float>>> straight(world), resumed(world);
  std::vector<float> scale_straight(world), scale_resumed(world);
  run_ranks(world, [&](local_communicator& comm) {
    const int r = comm.rank();
    auto config = [](fsdp::grad::loss_scaler& s) {
      mlp::config c = small();
      c.grad.scaler = &s;
      c.loss_scale = &s;
      return c;
    };
    {
      fsdp::grad::loss_scaler s({.init_scale = 1024.0f, .growth_interval = 2});
      const mlp::config c = config(s);
      auto m = mlp::make_model<fp16>(comm, c);
      mlp::with_optimizer(m, c, [&](auto& opt) {
        mlp::result res;
        mlp::run_steps(m, opt, c, 0, 5, res);
        straight[r] = local_state(m, opt);
        return res;
      });
      scale_straight[r] = s.scale();
    }
    {
      fsdp::grad::loss_scaler s({.init_scale = 1024.0f, .growth_interval = 2});
      const mlp::config c = config(s);
      auto m = mlp::make_model<fp16>(comm, c);
      mlp::with_optimizer(m, c, [&](auto& opt) {
        mlp::result res;
        mlp::run_steps(m, opt, c, 0, 3, res);
        CHECK(s.good_steps() == 1);  // 3 steps at interval 2: grown once, one good step since
        ckpt::save(m, opt, dir / "ck", {.loss_scaler = &s});
        return res;
      });
    }
    fsdp::grad::loss_scaler s({.init_scale = 1.0f, .growth_interval = 2});
    const mlp::config c = config(s);
    auto m = mlp::make_model<fp16>(comm, c);
    mlp::with_optimizer(m, c, [&](auto& opt) {
      CHECK(error_of<fsdp::checkpoint_error>([&] { ckpt::load(m, opt, dir / "ck"); }) ==
            "fsdp: checkpoint load from '" + dir / "ck" +
                "' failed (no parameter was modified): ranks 0, 1: checkpoint '" + dir / "ck" +
                "': it holds a loss scaler's state (scale 2048, 1 good steps); pass load_options::loss_scaler "
                "to resume with it");
      ckpt::load(m, opt, dir / "ck", {.loss_scaler = &s});
      CHECK(s.scale() == 2048.0f);
      CHECK(s.good_steps() == 1);
      mlp::result res;
      mlp::run_steps(m, opt, c, 3, 2, res);
      resumed[r] = local_state(m, opt);
      return res;
    });
    scale_resumed[r] = s.scale();
  });
  for (int r = 0; r < world; ++r) {
    CHECK(same_bits(straight[r], resumed[r]));
    CHECK(scale_straight[r] == scale_resumed[r]);
  }
}

namespace {
/// Trains 3 steps at world 4 under Saved and saves; returns every tensor as the ranks held it.
template <class Saved>
full_tensors save_trained(const std::string& path, const mlp::config& c) {
  full_tensors truth;
  std::mutex mu;
  run_ranks(4, [&](local_communicator& comm) {
    auto m = mlp::make_model<Saved>(comm, c);
    mlp::with_optimizer(m, c, [&](auto& opt) {
      mlp::result res;
      mlp::run_steps(m, opt, c, 0, 3, res);
      collect(m, opt, truth, mu);
      ckpt::save(m, opt, path);
      return res;
    });
  });
  return truth;
}

void compare_tensors(const full_tensors& got, const full_tensors& truth);

/// Loads `path` at `world` ranks under Loaded (wrapped by `wrap`), staged and in place, and compares every tensor
/// with `truth`.
template <class Loaded, class Wrap>
void load_and_compare(const std::string& path, const mlp::config& c, int world, const Wrap& wrap,
                      const full_tensors& truth) {
  for (const bool in_place : {false, true}) {
    CAPTURE(in_place);
    full_tensors got;
    std::mutex mu;
    run_ranks(world, [&](local_communicator& comm) {
      fsdp::Model<Loaded> m(comm, mlp::make_spec(c), wrap, fsdp::init::normal{}, c.model);
      fsdp::optim::adamw opt(m, {});
      ckpt::load(m, opt, path, {.in_place = in_place});
      CHECK(opt.steps() == 3);
      CHECK(m.step_count() == 3);
      collect(m, opt, got, mu);
    });
    compare_tensors(got, truth);
  }
}

void compare_tensors(const full_tensors& got, const full_tensors& truth) {
  REQUIRE(got.size() == truth.size());
  // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
  for (const auto& entry : truth) {
    const auto& key = entry.first;
    const auto& values = entry.second;
    CAPTURE(key.first);
    CAPTURE(key.second);
    const std::vector<float>& g = got.at(key);
    REQUIRE(g.size() == values.size());
    CHECK(std::memcmp(g.data(), values.data(), values.size() * 4) == 0);
  }
}
}  // namespace

TEST_CASE(
    "a checkpoint saved at world 4 loads at worlds 2, 3 and 1, across strategies and wrappings, bit for bit, "
    "staged or in place") {
  fsdp_test::scratch_dir dir("ckpt-reshard");
  const mlp::config c = small();
  const fsdp::wrap::by_prefix layers{"layers."};
  const fsdp::wrap::by_function one_unit{[](const fsdp::ParamSpec&) { return std::string("all"); }};
  SUBCASE("from full_shard") {
    const full_tensors truth = save_trained<full_shard>(dir / "fs", c);
    REQUIRE(truth.size() == 6 * 3);  // 6 parameters: param, exp_avg, exp_avg_sq
    load_and_compare<full_shard>(dir / "fs", c, 2, layers, truth);
    load_and_compare<grad_op>(dir / "fs", c, 3, layers, truth);
    load_and_compare<full_shard>(dir / "fs", c, 1, layers, truth);
    load_and_compare<hybrid2>(dir / "fs", c, 4, layers, truth);
    load_and_compare<full_shard>(dir / "fs", c, 3, one_unit, truth);
  }
  SUBCASE("from hybrid_shard<2> (the first replica writes) and from no_shard (rank 0 writes)") {
    const full_tensors hybrid = save_trained<hybrid2>(dir / "hy", c);
    load_and_compare<full_shard>(dir / "hy", c, 3, layers, hybrid);
    load_and_compare<no_shard>(dir / "hy", c, 2, layers, hybrid);
    CHECK(ckpt::read_manifest(dir / "hy").files.size() == 2);
    const full_tensors replicated = save_trained<no_shard>(dir / "ns", c);
    load_and_compare<full_shard>(dir / "ns", c, 4, layers, replicated);
    CHECK(ckpt::read_manifest(dir / "ns").files.size() == 1);
  }
  SUBCASE("from hybrid_shard<1> (shard groups of one rank: rank 0 writes the one file), and into it") {
    const full_tensors ones = save_trained<hybrid1>(dir / "h1", c);
    CHECK(ckpt::read_manifest(dir / "h1").files.size() == 1);
    CHECK(ckpt::read_manifest(dir / "h1").replicas == 4);
    load_and_compare<full_shard>(dir / "h1", c, 3, layers, ones);
    load_and_compare<hybrid1>(dir / "h1", c, 2, layers, ones);
    const full_tensors truth = save_trained<full_shard>(dir / "fs", c);
    load_and_compare<hybrid1>(dir / "fs", c, 3, layers, truth);
  }
}

// ---- failures ------------------------------------------------------------------------------------------------
namespace {
/// Trains `steps` steps at `world` ranks (full_shard, adamw) and saves into `path` with `so`.
void train_and_save(const std::string& path, int world, int steps, const ckpt::save_options& so = {}) {
  const mlp::config c = small();
  run_ranks(world, [&](local_communicator& comm) {
    auto m = mlp::make_model<full_shard>(comm, c);
    fsdp::optim::adamw opt(m, {});
    mlp::result res;
    mlp::run_steps(m, opt, c, 0, steps, res);
    ckpt::save(m, opt, path, so);
  });
}

/// Loads `path` at 2 ranks into a model trained one step; returns each rank's error message and whether the
/// rank's parameters and optimizer state stayed as they were.
struct failed_load {
  std::vector<std::string> messages;
  bool untouched = true;
};
failed_load load_expecting_failure(const std::string& path, const ckpt::load_options& lo = {}) {
  const mlp::config c = small();
  failed_load out;
  out.messages.resize(2);
  std::mutex mu;
  run_ranks(2, [&](local_communicator& comm) {
    auto m = mlp::make_model<full_shard>(comm, c);
    fsdp::optim::adamw opt(m, {});
    mlp::result res;
    mlp::run_steps(m, opt, c, 0, 1, res);
    const auto before = local_state(m, opt);
    const std::string msg = error_of<fsdp::checkpoint_error>([&] { ckpt::load(m, opt, path, lo); });
    const bool same = same_bits(before, local_state(m, opt)) && opt.steps() == 1 && m.step_count() == 1;
    std::lock_guard lock(mu);
    out.messages[comm.rank()] = msg;
    out.untouched = out.untouched && same;
  });
  return out;
}

/// Flips one bit of byte 100 of checkpoint file `file`, whose block 0 holds all of it and has checksum `sum` in the
/// manifest; returns what a load reports for it.
std::string flip_byte(const std::string& file, std::uint64_t sum) {
  std::string bytes = fsdp_test::read_file_bytes(file);
  bytes[100] = static_cast<char>(bytes[100] ^ 0x10);
  fsdp_test::write_file_bytes(file, bytes);
  return "'" + file + "': block 0 (bytes [0, " + std::to_string(bytes.size()) +
         ")) does not match its checksum in the manifest (xxh3 " + ckpt::hex64(ckpt::xxh3(bytes.data(), bytes.size())) +
         ", expected " + ckpt::hex64(sum) + "): the file is corrupted";
}

}  // namespace

TEST_CASE(
    "every byte of a checkpoint's manifest changed in turn: no load succeeds, every rank refuses, nothing modified") {
  fsdp_test::scratch_dir dir("ckpt-manifest-flips");
  train_and_save(dir / "ck", 2, 2);
  const std::string path = dir / "ck" + "/manifest.json";
  const std::string text = fsdp_test::read_file_bytes(path);
  REQUIRE(text.size() > 1000);
  const mlp::config c = small();
  std::vector<int> silent(2, 0), refused(2, 0);
  std::vector<int> untouched(2, 0);  // not vector<bool>: the ranks write their own elements at once
  run_ranks(2, [&](local_communicator& comm) {
    auto m = mlp::make_model<full_shard>(comm, c);
    fsdp::optim::adamw opt(m, {});
    mlp::result res;
    mlp::run_steps(m, opt, c, 0, 1, res);
    const auto before = local_state(m, opt);
    for (std::size_t i = 0; i < text.size(); ++i)
      for (unsigned char x : {0x01, 0x20}) {  // one bit: a digit to its neighbour ("step": 2 -> 3); a letter's case
        if (comm.rank() == 0) {
          std::string bad = text;
          bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ x);
          fsdp_test::write_file_bytes(path, bad);
        }
        comm.barrier();
        try {
          ckpt::load(m, opt, dir / "ck");
          ++silent[comm.rank()];
        } catch (const fsdp::checkpoint_error& e) {
          const std::string_view what = e.what();
          if (what.find("manifest.json'") != std::string_view::npos) ++refused[comm.rank()];
        }
        comm.barrier();
      }
    untouched[comm.rank()] = same_bits(before, local_state(m, opt)) && opt.steps() == 1 && m.step_count() == 1 ? 1 : 0;
  });
  CHECK(silent == std::vector<int>{0, 0});
  CHECK(refused == std::vector<int>(2, 2 * int(text.size())));  // each naming the manifest
  CHECK(untouched == std::vector<int>{1, 1});
}

TEST_CASE(
    "a flipped byte, a truncated or deleted file, a manifest that does not parse: the same error on every "
    "rank, naming the file, and nothing modified") {
  fsdp_test::scratch_dir dir("ckpt-corrupt");
  train_and_save(dir / "good", 2, 2);
  const ckpt::manifest man = ckpt::read_manifest(dir / "good");
  REQUIRE(man.files.size() == 2);
  auto copy = [&](const std::string& name) {
    std::filesystem::copy(dir / "good", dir / name, std::filesystem::copy_options::recursive);
    return dir / name;
  };
  const std::string failed = "fsdp: checkpoint load from '";
  SUBCASE("a flipped byte") {
    const std::string ck = copy("flipped");
    const std::string corrupted = flip_byte(ck + "/shard-00001-of-00002.bin", man.files[1].blocks[0]);
    const failed_load f = load_expecting_failure(ck);
    const std::string expected = failed + ck + "' failed (no parameter was modified): rank 1: " + corrupted;
    CHECK(f.messages[0] == expected);
    CHECK(f.messages[1] == expected);
    CHECK(f.untouched);
    CHECK(ckpt::verify(ck) == std::vector<std::string>{corrupted});
  }
  // A load in place asks these before its first write: it refuses them alike, with the model untouched.
  auto refused_staged_and_in_place = [&](const std::string& ck, const std::string& expected) {
    for (const bool in_place : {false, true}) {
      CAPTURE(in_place);
      const failed_load f = load_expecting_failure(ck, {.in_place = in_place});
      CHECK(f.messages == std::vector<std::string>{expected, expected});
      CHECK(f.untouched);
    }
  };
  SUBCASE("a truncated file, staged and in place") {
    const std::string ck = copy("truncated"), file = ck + "/shard-00000-of-00002.bin";
    std::filesystem::resize_file(file, 1000);
    const std::string expected = failed + ck + "' failed (no parameter was modified): rank 0: '" + file +
                                 "' has 1000 bytes; the manifest says " + std::to_string(man.files[0].bytes) +
                                 ": the file is truncated";
    refused_staged_and_in_place(ck, expected);
  }
  SUBCASE("a deleted file, staged and in place") {
    const std::string ck = copy("deleted"), file = ck + "/shard-00001-of-00002.bin";
    std::filesystem::remove(file);
    const std::string expected = failed + ck + "' failed (no parameter was modified): rank 1: could not open '" + file +
                                 "': No such file or directory";
    refused_staged_and_in_place(ck, expected);
  }
  SUBCASE("a manifest cut short, one sealed again over a cut, and a missing one") {
    const std::string ck = copy("garbled");
    std::string text = fsdp_test::read_file_bytes(ck + "/manifest.json");
    fsdp_test::write_file_bytes(ck + "/manifest.json", text.substr(0, text.size() / 2));
    failed_load f = load_expecting_failure(ck);
    std::string expected = failed + ck + "' failed (no parameter was modified): ranks 0, 1: the manifest '" + ck +
                           "/manifest.json' has no checksum of its own (no member \"manifest_xxh3\"): it was cut or "
                           "damaged, or written by a version of this library that did not checksum its manifests "
                           "(manifest version 1), which this one does not read";
    CHECK(f.messages == std::vector<std::string>{expected, expected});
    CHECK(f.untouched);
    // a tool that writes the checksum over what it cut: the parser still finds what is wrong
    fsdp_test::write_file_bytes(ck + "/manifest.json",
                                ckpt::seal_manifest(text.substr(0, text.size() / 2) + text.substr(text.size() - 43)));
    f = load_expecting_failure(ck);
    expected = failed + ck + "' failed (no parameter was modified): ranks 0, 1: the manifest '" + ck +
               "/manifest.json': the document does not parse as JSON";
    CHECK(f.messages == std::vector<std::string>{expected, expected});
    CHECK(f.untouched);
    f = load_expecting_failure(dir / "absent");
    expected = failed + dir / "absent" + "' failed (no parameter was modified): ranks 0, 1: could not open '" +
               dir / "absent" + "/manifest.json': No such file or directory";
    CHECK(f.messages == std::vector<std::string>{expected, expected});
  }
}

TEST_CASE(
    "a load in place into a model the checkpoint does not fit refuses before the first write: the model's bits as "
    "they were, and not torn") {
  fsdp_test::scratch_dir dir("ckpt-in-place-refused");
  train_and_save(dir / "good", 2, 2);
  std::vector<std::string> reshaped(2);
  std::vector<int> kept(2, 0);
  run_ranks(2, [&](local_communicator& comm) {
    const fsdp::ModelSpec saved = mlp::make_spec(small());
    fsdp::ModelSpec spec;
    for (const auto& p : saved.params())
      spec.add(p.name, p.name == "layers.1.w" ? std::vector<std::int64_t>{40, 24} : p.shape);
    fsdp::Model<full_shard> m(comm, spec, fsdp::wrap::by_prefix{"layers."});
    fsdp::optim::adamw opt(m, {});
    const auto before = local_state(m, opt);
    reshaped[comm.rank()] =
        error_of<fsdp::checkpoint_error>([&] { ckpt::load(m, opt, dir / "good", {.in_place = true}); });
    kept[comm.rank()] = same_bits(before, local_state(m, opt)) ? 1 : 0;
    for (auto& u : m.forward()) (void)u;  // not torn
  });
  CHECK(kept == std::vector<int>{1, 1});
  const std::string expected = "fsdp: checkpoint load from '" + dir / "good" +
                               "' failed (no parameter was modified): ranks 0, 1: checkpoint '" + dir / "good" +
                               "': parameter 'layers.1.w' is [24, 40] in the checkpoint but [40, 24] in the model";
  CHECK(reshaped == std::vector<std::string>{expected, expected});
}

TEST_CASE(
    "a load in place that fails part way (a flipped byte) tears the model on every rank: every use but a load with "
    "the optimizer refuses, naming the load; a load that succeeds mends it and training goes on as after any load") {
  fsdp_test::scratch_dir dir("ckpt-in-place-torn");
  train_and_save(dir / "good", 2, 2);
  const ckpt::manifest man = ckpt::read_manifest(dir / "good");
  std::filesystem::copy(dir / "good", dir / "flipped", std::filesystem::copy_options::recursive);
  const std::string corrupted =
      "rank 1: " + flip_byte(dir / "flipped" + "/shard-00001-of-00002.bin", man.files[1].blocks[0]);
  const std::string torn = "a checkpoint load from '" + dir / "flipped" +
                           "' that failed part way, in place (the parameters and the optimizer's state are torn): " +
                           corrupted;
  const mlp::config c = small();
  std::vector<std::string> load_error(2), step_error(2), save_error(2), params_only(2), weights_error(2);
  std::vector<std::vector<std::vector<float>>> mended(2), fresh(2);
  std::vector<int> trained(2, 0);
  run_ranks(2, [&](local_communicator& comm) {
    const int r = comm.rank();
    {
      auto m = mlp::make_model<full_shard>(comm, c);
      fsdp::optim::adamw opt(m, {});
      mlp::result res;
      mlp::run_steps(m, opt, c, 0, 1, res);
      load_error[r] =
          error_of<fsdp::checkpoint_error>([&] { ckpt::load(m, opt, dir / "flipped", {.in_place = true}); });
      step_error[r] = error_of<fsdp::usage_error>([&] { mlp::run_steps(m, opt, c, 1, 1, res); });
      save_error[r] = error_of<fsdp::usage_error>([&] { ckpt::save(m, opt, dir / "never"); });
      params_only[r] = error_of<fsdp::usage_error>([&] { ckpt::load(m, dir / "good"); });
      weights_error[r] = error_of<fsdp::usage_error>([&] { (void)fsdp::weights::gather_full_params(m); });
      ckpt::load(m, opt, dir / "good", {.in_place = true});  // mends
      mended[r] = local_state(m, opt);
      mlp::run_steps(m, opt, c, 2, 1, res);
      trained[r] = m.step_count() == 3 ? 1 : 0;
    }
    auto m = mlp::make_model<full_shard>(comm, c);
    fsdp::optim::adamw opt(m, {});
    ckpt::load(m, opt, dir / "good");
    fresh[r] = local_state(m, opt);
  });
  const std::string load_msg = "fsdp: checkpoint load from '" + dir / "flipped" +
                               "' failed part way, in place (the parameters and the optimizer's state are torn: load "
                               "a checkpoint before using the model): " +
                               corrupted;
  CHECK(load_error == std::vector<std::string>{load_msg, load_msg});
  const std::string step_msg =
      "fsdp: model.forward() after " + torn + "; load a checkpoint first (checkpoint::load, with the optimizer)";
  CHECK(step_error == std::vector<std::string>{step_msg, step_msg});
  const std::string save_msg =
      "fsdp: a checkpoint save after " + torn + "; load a checkpoint first (checkpoint::load, with the optimizer)";
  CHECK(save_error == std::vector<std::string>{save_msg, save_msg});
  const std::string params_msg = "fsdp: a checkpoint load without the optimizer after " + torn +
                                 "; the optimizer's state is torn too: load a checkpoint with the optimizer";
  CHECK(params_only == std::vector<std::string>{params_msg, params_msg});
  const std::string gather_msg =
      "fsdp: gather_full_params() after " + torn + "; load a checkpoint first (checkpoint::load, with the optimizer)";
  CHECK(weights_error == std::vector<std::string>{gather_msg, gather_msg});
  CHECK(same_bits(mended[0], fresh[0]));
  CHECK(same_bits(mended[1], fresh[1]));
  CHECK(trained == std::vector<int>{1, 1});
}

TEST_CASE(
    "a load in place whose ranks cannot agree after their writes (rank 1's part of the last collective fails): the "
    "model stays torn on every rank, and says that the load did not finish") {
  fsdp_test::scratch_dir dir("ckpt-in-place-unfinished");
  train_and_save(dir / "good", 2, 2);
  const mlp::config c = small();
  // The first load counts its collectives; the second issues the same ones, and rank 1 fails its part of the last
  // (the agreement after the writes), so that rank 0 waits for it in vain.
  std::atomic<int> counted{0}, armed{0}, second{0};
  fsdp::comm::local_options lo;
  lo.timeout = std::chrono::milliseconds(2000);
  lo.delay = [&](fsdp::collective, std::uint64_t, int rank) {
    if (rank != 1) return std::chrono::microseconds(0);
    if (armed == 1) ++counted;
    if (armed == 2 && ++second == counted) throw std::runtime_error("injected: rank 1 lost");
    return std::chrono::microseconds(0);
  };
  std::vector<std::string> escaped(2), refused(2);
  fsdp::comm::run_local(
      2,
      [&](local_communicator& comm) {
        auto m = mlp::make_model<full_shard>(comm, c);
        fsdp::optim::adamw opt(m, {});
        comm.barrier();
        if (comm.rank() == 1) armed = 1;
        comm.barrier();
        ckpt::load(m, opt, dir / "good", {.in_place = true});
        comm.barrier();
        if (comm.rank() == 1) armed = 2;
        comm.barrier();
        try {
          ckpt::load(m, opt, dir / "good", {.in_place = true});
        } catch (const std::exception& e) {
          escaped[comm.rank()] = e.what();
        }
        refused[comm.rank()] = error_of<fsdp::usage_error>([&] { (void)fsdp::weights::gather_full_params(m); });
      },
      lo);
  REQUIRE(counted > 0);
  CHECK(escaped[0].find("rank(s) 1 returned without issuing it") != std::string::npos);
  CHECK(escaped[1].find("injected: rank 1 lost") != std::string::npos);
  const std::string refusal = "fsdp: gather_full_params() after a checkpoint load from '" + dir / "good" +
                              "' that did not finish, in place (the parameters and the optimizer's state are torn); "
                              "load a checkpoint first (checkpoint::load, with the optimizer)";
  CHECK(refused == std::vector<std::string>{refusal, refusal});
}

namespace {
/// What upload_sink needs of a backend, with uploads that run on a thread of their own, each 2 ms after the one
/// before: a chunk buffer reused before its uploads finished would be read after it was overwritten.
class late_uploads {
 public:
  struct stream {};
  late_uploads() : worker_([this] { run(); }) {}
  ~late_uploads() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  stream& compute_stream() { return stream_; }
  void upload(void* dest, const void* src, std::int64_t n, stream&) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back([=] { std::memcpy(dest, src, static_cast<std::size_t>(n)); });
    }
    cv_.notify_all();
  }
  void synchronize(stream&) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty(); });
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const std::function<void()> copy = queue_.front();
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      copy();
      lock.lock();
      queue_.pop_front();
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  stream stream_;
  std::thread worker_;
};
}  // namespace

TEST_CASE(
    "upload_sink, a load in place into memory the host cannot address: chunks read into two reused buffers, each "
    "uploaded once verified while the next is read, and reused once its uploads finished; a corrupted block uploads "
    "no byte of its chunk") {
  fsdp_test::scratch_dir dir("ckpt-upload-sink");
  constexpr std::uint64_t block = 4096, chunk = 2 * block, blocks = 64;
  std::string bytes(blocks * block, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::vector<std::uint64_t> sums;
  for (std::uint64_t b = 0; b < blocks; ++b) sums.push_back(ckpt::xxh3(bytes.data() + b * block, block));
  const std::string path = dir / "data.bin";
  fsdp_test::write_file_bytes(path, bytes);
  // Pieces of the file in three destinations, out of order, some inside one chunk, some across several.
  struct piece {
    std::uint64_t offset, bytes;
    int dest;
    std::uint64_t at;
  };
  const std::vector<piece> pieces = {{70000, 50000, 1, 0}, {100, 3000, 0, 0},  {5000, 20000, 0, 3000},
                                     {130000, 4096, 2, 0}, {200000, 60000, 2, 4096}};
  auto run = [&](const std::string& file_bytes, std::uint64_t* failed_at) {
    fsdp_test::write_file_bytes(path, file_bytes);
    late_uploads be;
    std::vector<std::vector<char>> dest(3, std::vector<char>(70000, '#'));
    std::vector<ckpt::read_op> ops;
    for (const piece& p : pieces) ops.push_back({p.offset, p.bytes, dest[p.dest].data() + p.at});
    const ckpt::block_sums check{block, &sums};
    ckpt::upload_sink<late_uploads> sink(be);
    const ckpt::io::file f = ckpt::io::open_read(path);
    try {
      ckpt::read_ranges(f, file_bytes.size(), ops, sink, &check, chunk, 1024);
      sink.finish();
    } catch (const fsdp::checkpoint_error& e) {
      be.synchronize(be.compute_stream());
      *failed_at = 1;
      CHECK(std::string(e.what()) == "fsdp: '" + path + "': block 50 (bytes [204800, 208896)) does not match its "
                                     "checksum in the manifest (xxh3 " +
                                         ckpt::hex64(ckpt::xxh3(file_bytes.data() + 204800, block)) + ", expected " +
                                         ckpt::hex64(sums[50]) + "): the file is corrupted");
    }
    return dest;
  };
  std::uint64_t failed = 0;
  const auto got = run(bytes, &failed);
  CHECK(failed == 0);
  for (const piece& p : pieces) {
    CAPTURE(p.offset);
    CHECK(std::memcmp(got[p.dest].data() + p.at, bytes.data() + p.offset, p.bytes) == 0);
  }
  CHECK(got[0][23000] == '#');  // beyond every piece: untouched
  std::string bad = bytes;
  bad[50 * block + 7] = static_cast<char>(bad[50 * block + 7] ^ 1);  // in the chunk [204800, 212992)
  const auto torn = run(bad, &failed);
  CHECK(failed == 1);
  // Delivered: every piece before the bad chunk, and of the piece at 200000 the chunk [196608, 204800) before it.
  CHECK(std::memcmp(torn[0].data(), bytes.data() + 100, 3000) == 0);
  CHECK(std::memcmp(torn[0].data() + 3000, bytes.data() + 5000, 20000) == 0);
  CHECK(std::memcmp(torn[1].data(), bytes.data() + 70000, 50000) == 0);
  CHECK(std::memcmp(torn[2].data(), bytes.data() + 130000, 4096) == 0);
  CHECK(std::memcmp(torn[2].data() + 4096, bytes.data() + 200000, 4800) == 0);
  CHECK(std::all_of(torn[2].begin() + 8896, torn[2].end(), [](char x) { return x == '#'; }));
}

TEST_CASE("upload_sink on a backend with pinned memory and an upload stream (backend::cuda's shape): pinned chunk "
          "buffers, uploads on the upload stream, and the compute stream never synchronized") {
  // On a GPU an upload from pageable memory returns only once its stream has run it, so the double buffer overlapped
  // nothing, and the sink synchronized the compute stream once a chunk. backend::host keeps both rules (a pageable
  // copy waits for its stream; every synchronize is counted), so the counts below are the GPU's.
  fsdp_test::scratch_dir dir("ckpt-upload-sink-pinned");
  constexpr std::uint64_t chunk = 8192, total = 20 * chunk;
  std::string bytes(total, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 11);
  const std::string path = dir / "data.bin";
  fsdp_test::write_file_bytes(path, bytes);
  fsdp::backend::host be;
  std::vector<char> dest(total - 1000, '#');
  const std::vector<ckpt::read_op> ops = {{1000, total - 1000, dest.data()}};
  static_assert(ckpt::upload_sink<fsdp::backend::host>::pinned);
  const fsdp::backend::issue_counts compute0 = be.issued(be.compute_stream()), upload0 = be.issued(be.upload_stream());
  {
    ckpt::upload_sink<fsdp::backend::host> sink(be);
    const ckpt::io::file f = ckpt::io::open_read(path);
    ckpt::read_ranges(f, total, ops, sink, nullptr, chunk, 1024);
    CHECK(be.host_memory().stats().current[fsdp::mem::comm_buffers] == 2 * std::int64_t{chunk});  // two pinned buffers
    sink.finish();
  }
  const fsdp::backend::issue_counts compute = be.issued(be.compute_stream()) - compute0;
  const fsdp::backend::issue_counts upload = be.issued(be.upload_stream()) - upload0;
  CHECK(compute.synchronizes == 0);  // 20 (one a chunk) and one at the end before
  CHECK(compute.records == 1);       // what the uploads wait for first: the compute stream's work so far
  CHECK(compute.waits == 1);         // and what the compute stream waits for at the end: the uploads
  CHECK(upload.memory_ops == 20);    // the chunks' uploads, each from a pinned buffer
  CHECK(upload.synchronizes == 21);  // before each chunk's uploads (the other buffer's, a chunk old) and at the end
  CHECK(be.host_memory().stats().current[fsdp::mem::comm_buffers] == 0);
  CHECK(std::memcmp(dest.data(), bytes.data() + 1000, dest.size()) == 0);
}

TEST_CASE("a checkpoint that does not fit the model: a missing, unexpected or reshaped tensor, another optimizer") {
  fsdp_test::scratch_dir dir("ckpt-mismatch");
  train_and_save(dir / "ck", 2, 1);
  const mlp::config c = small();
  auto load_into = [&](const fsdp::ModelSpec& spec, auto make_opt) {
    std::vector<std::string> out(2);
    run_ranks(2, [&](local_communicator& comm) {
      fsdp::Model<full_shard> m(comm, spec, fsdp::wrap::by_prefix{"layers."});
      auto opt = make_opt(m);
      out[comm.rank()] = error_of<fsdp::checkpoint_error>([&] { ckpt::load(m, opt, dir / "ck"); });
    });
    CHECK(out[0] == out[1]);
    return out[0];
  };
  auto adamw = [](auto& m) { return fsdp::optim::adamw(m, {}); };
  const std::string prefix = "fsdp: checkpoint load from '" + dir / "ck" +
                             "' failed (no parameter was modified): "
                             "ranks 0, 1: checkpoint '" +
                             dir / "ck" + "': ";
  fsdp::ModelSpec more = mlp::make_spec(c);
  more.add("layers.3.w", {2, 6});
  CHECK(load_into(more, adamw) == prefix + "the model's parameter 'layers.3.w' [2, 6] is not in the checkpoint");
  const fsdp::ModelSpec spec = mlp::make_spec(c);
  fsdp::ModelSpec fewer;
  for (const auto& p : spec.params())
    if (p.name != "layers.2.b") fewer.add(p.name, p.shape);
  CHECK(load_into(fewer, adamw) ==
        prefix + "the checkpoint holds tensor 'layers.2.b' [6], which the model does not have");
  fsdp::ModelSpec reshaped;
  for (const auto& p : spec.params())
    reshaped.add(p.name, p.name == "layers.1.w" ? std::vector<std::int64_t>{40, 24} : p.shape);
  CHECK(load_into(reshaped, adamw) ==
        prefix + "parameter 'layers.1.w' is [24, 40] in the checkpoint but [40, 24] in the model");
  CHECK(load_into(mlp::make_spec(c), [](auto& m) { return fsdp::optim::sgd(m, {.momentum = 0.9f}); }) ==
        prefix +
            "saved by adamw with states [exp_avg, exp_avg_sq]; this optimizer is sgd with states [momentum_buffer]");
}

TEST_CASE("a write failing on one rank fails the save on every rank; the previous checkpoint still loads") {
  fsdp_test::scratch_dir dir("ckpt-write-fault");
  train_and_save(dir / "step-1", 3, 1);
  ckpt::save_options so;
  so.fault = [](const ckpt::io_event& e) {
    if (e.rank == 1 && e.op == "write") throw fsdp::checkpoint_error("injected: Input/output error");
  };
  std::vector<std::string> messages(3);
  const mlp::config c = small();
  run_ranks(3, [&](local_communicator& comm) {
    auto m = mlp::make_model<full_shard>(comm, c);
    fsdp::optim::adamw opt(m, {});
    mlp::result res;
    mlp::run_steps(m, opt, c, 0, 2, res);
    messages[comm.rank()] = error_of<fsdp::checkpoint_error>([&] { ckpt::save(m, opt, dir / "step-2", so); });
  });
  const std::string expected = "fsdp: checkpoint save to '" + dir / "step-2" +
                               "' failed: rank 1: injected: "
                               "Input/output error; '" +
                               dir / "step-2.partial" +
                               "' was removed; earlier checkpoints "
                               "are untouched";
  CHECK(messages == std::vector<std::string>{expected, expected, expected});
  CHECK(!std::filesystem::exists(dir / "step-2"));
  CHECK(!std::filesystem::exists(dir / "step-2.partial"));
  CHECK(ckpt::latest(dir.root) == dir / "step-1");
  CHECK(ckpt::verify(dir / "step-1").empty());
}

TEST_CASE("a failure while rank 0 commits (the manifest made, written, synced; the rename) leaves no .partial behind") {
  fsdp_test::scratch_dir dir("ckpt-commit-fault");
  train_and_save(dir / "step-1", 2, 1);
  const mlp::config c = small();
  const std::string target = dir / "step-2", partial = target + ".partial", manifest = partial + "/manifest.json";
  // Each rank's message when rank 0's file-system operation `op` on `path` fails with `why`.
  auto save_failing = [&](const std::string& op, const std::string& path, const char* why) {
    ckpt::save_options so;
    so.fault = [&](const ckpt::io_event& e) {
      if (e.rank == 0 && e.op == op && e.path == path) throw fsdp::checkpoint_error(why);
    };
    std::vector<std::string> messages(2);
    run_ranks(2, [&](local_communicator& comm) {
      auto m = mlp::make_model<full_shard>(comm, c);
      fsdp::optim::adamw opt(m, {});
      mlp::result res;
      mlp::run_steps(m, opt, c, 0, 2, res);
      messages[comm.rank()] = error_of<fsdp::checkpoint_error>([&] { ckpt::save(m, opt, target, so); });
    });
    return messages;
  };
  // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
  for (const auto& entry : std::vector<std::pair<std::string, std::string>>{
           {"create", manifest}, {"write", manifest}, {"fsync", manifest}, {"rename", partial}}) {
    const std::string& op = entry.first;
    const std::string& path = entry.second;
    CAPTURE(op);
    CAPTURE(path);
    const std::string expected = "fsdp: checkpoint save to '" + target + "' failed: rank 0: injected: No space left on "
                                 "device; '" + partial + "' was removed; earlier checkpoints are untouched";
    CHECK(save_failing(op, path, "injected: No space left on device") == std::vector<std::string>{expected, expected});
    CHECK(!std::filesystem::exists(partial));
    CHECK(!std::filesystem::exists(target));
    CHECK(ckpt::latest(dir.root) == dir / "step-1");
  }
  // after the rename: the checkpoint is complete, and the message says so
  const std::string expected = "fsdp: checkpoint save to '" + target + "' failed: rank 0: injected: Input/output "
                               "error after the rename: '" + target + "' is complete, but a crash before the file "
                               "system writes the rename back may lose it; earlier checkpoints are untouched";
  CHECK(save_failing("fsync", dir.root, "injected: Input/output error") ==
        std::vector<std::string>{expected, expected});
  CHECK(!std::filesystem::exists(partial));
  CHECK(ckpt::latest(dir.root) == target);
  CHECK(ckpt::verify(target).empty());
}

TEST_CASE("a full disk (a file size limit) fails the save on every rank with the system's reason") {
  fsdp_test::scratch_dir dir("ckpt-full-disk");
  train_and_save(dir / "step-1", 2, 1);
  std::vector<std::string> messages(2);
  const mlp::config c = small();
  run_ranks(2, [&](local_communicator& comm) {
    auto m = mlp::make_model<full_shard>(comm, c);
    fsdp::optim::adamw opt(m, {});
    mlp::result res;
    mlp::run_steps(m, opt, c, 0, 2, res);
    std::string msg;
    {
      // Both ranks' files need more than 4096 bytes: a write past the limit fails with EFBIG (SIGXFSZ ignored).
      static std::mutex limit_mu;
      static rlimit saved{};
      static int inside = 0;
      {
        std::lock_guard lock(limit_mu);
        if (inside++ == 0) {
          std::signal(SIGXFSZ, SIG_IGN);
          getrlimit(RLIMIT_FSIZE, &saved);
          rlimit small_files = saved;
          small_files.rlim_cur = 4096;
          setrlimit(RLIMIT_FSIZE, &small_files);
        }
      }
      comm.barrier();
      msg = error_of<fsdp::checkpoint_error>([&] { ckpt::save(m, opt, dir / "step-2"); });
      comm.barrier();
      std::lock_guard lock(limit_mu);
      if (--inside == 0) setrlimit(RLIMIT_FSIZE, &saved);
    }
    messages[comm.rank()] = msg;
  });
  // The same model at the same world: the files step-2 would have written are as large as step-1's.
  const ckpt::manifest man = ckpt::read_manifest(dir / "step-1");
  auto failure = [&](int r) {
    return "rank " + std::to_string(r) + ": could not write " + std::to_string(man.files[r].bytes) + " bytes to '" +
           dir / "step-2.partial/" + man.files[r].name + "' at byte 0: File too large";
  };
  const std::string expected = "fsdp: checkpoint save to '" + dir / "step-2" + "' failed: " + failure(0) + "; " +
                               failure(1) + "; '" + dir / "step-2.partial" +
                               "' was removed; earlier checkpoints are "
                               "untouched";
  CHECK(messages == std::vector<std::string>{expected, expected});
  CHECK(ckpt::latest(dir.root) == dir / "step-1");
}

TEST_CASE("a process killed mid-save leaves the previous checkpoint loadable and a partial save that is ignored") {
  fsdp_test::scratch_dir dir("ckpt-killed");
  train_and_save(dir / "step-1", 2, 1);
  for (const std::string_view at : {"write", "rename"}) {
    CAPTURE(at);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // the child saves step-2 and is killed before it commits
      ckpt::save_options so;
      so.fault = [at](const ckpt::io_event& e) {
        if (e.op == at && (at == "rename" || e.rank == 1)) raise(SIGKILL);
      };
      train_and_save(dir / "step-2", 2, 2, so);
      _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    const std::vector<ckpt::entry> found = ckpt::scan(dir.root);
    REQUIRE(found.size() == 2);
    CHECK(found[0].path == dir / "step-1");
    CHECK(found[0].state == ckpt::entry::status::complete);
    CHECK(found[1].path == dir / "step-2.partial");
    CHECK(found[1].state == ckpt::entry::status::partial);
    CHECK(ckpt::latest(dir.root) == dir / "step-1");
  }
  // The previous checkpoint loads; a new save of step-2 replaces the partial one.
  const mlp::config c = small();
  run_ranks(2, [&](local_communicator& comm) {
    auto m = mlp::make_model<full_shard>(comm, c);
    fsdp::optim::adamw opt(m, {});
    ckpt::load(m, opt, *ckpt::latest(dir.root));
    CHECK(opt.steps() == 1);
    mlp::result res;
    mlp::run_steps(m, opt, c, 1, 1, res);
    ckpt::save(m, opt, dir / "step-2");
  });
  CHECK(ckpt::latest(dir.root) == dir / "step-2");
  CHECK(!std::filesystem::exists(dir / "step-2.partial"));
}

TEST_CASE("misuse: an existing directory, ranks naming different directories, a save between backward and step") {
  fsdp_test::scratch_dir dir("ckpt-misuse");
  train_and_save(dir / "ck", 2, 1);
  const mlp::config c = small();
  std::vector<std::string> exists(2), disagree(2), early(2);
  run_ranks(2, [&](local_communicator& comm) {
    auto m = mlp::make_model<full_shard>(comm, c);
    fsdp::optim::adamw opt(m, {});
    exists[comm.rank()] = error_of<fsdp::checkpoint_error>([&] { ckpt::save(m, opt, dir / "ck"); });
    disagree[comm.rank()] =
        error_of<fsdp::usage_error>([&] { ckpt::save(m, opt, dir / ("ck-" + std::to_string(comm.rank()))); });
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    early[comm.rank()] = error_of<fsdp::usage_error>([&] { ckpt::save(m, opt, dir / "ck-early"); });
  });
  const std::string exists_msg = "fsdp: checkpoint save to '" + dir / "ck" + "' failed: rank 0: '" + dir / "ck" +
                                 "' already exists; a checkpoint is never overwritten: save to a new directory or "
                                 "remove it first";
  CHECK(exists == std::vector<std::string>{exists_msg, exists_msg});
  const std::string disagree_msg = "fsdp: ranks disagree on a checkpoint save: checkpoint::save: directory is " +
                                   dir / "ck-0" + " on rank 0 but " + dir / "ck-1" +
                                   " on rank 1. Every rank must "
                                   "call checkpoint::save with the same directory, after the same step";
  CHECK(disagree == std::vector<std::string>{disagree_msg, disagree_msg});
  const std::string early_msg =
      "fsdp: a checkpoint save between a backward pass and its optimizer step: unit "
      "'layers.0' (index 0) has a gradient reduced since the last step, which a checkpoint "
      "save does not keep; run the optimizer step (and zero_grad()) first";
  CHECK(early == std::vector<std::string>{early_msg, early_msg});
}
