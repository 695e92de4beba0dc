// Every wrong transition of a unit or a pass is a clear error that names the unit, never undefined behaviour.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cmath>

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::run_ranks;

namespace {
fsdp::ModelSpec three_layers() {
  fsdp::ModelSpec s;
  for (int l = 0; l < 3; ++l) s.add("layers." + std::to_string(l) + ".w", {4, 4});
  return s;
}
using Full = fsdp::policy<fsdp::sharding::full_shard>;
using Grad = fsdp::policy<fsdp::sharding::shard_grad_op>;
using None = fsdp::policy<fsdp::sharding::no_shard>;
using fsdp::wrap::by_prefix;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("a unit used before it is gathered") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    auto& u = m.unit("layers.1");
    CHECK(u.state() == fsdp::unit_state::sharded);
    CHECK(error_of<fsdp::usage_error>([&] { u.param("layers.1.w"); }) ==
          "fsdp: unit 'layers.1' (index 1) is not gathered (state: sharded): param('layers.1.w') needs its parameters "
          "gathered; use it inside model.forward() or model.backward()");
    // after a full_shard forward it is released again, and asking for it names the option that keeps it
    for (auto& x : m.forward()) (void)x;
    CHECK(u.state() == fsdp::unit_state::sharded);
    CHECK(error_of<fsdp::usage_error>([&] { u.param("layers.1.w"); }) ==
          "fsdp: unit 'layers.1' (index 1) is not gathered (state: sharded): param('layers.1.w') was asked for after "
          "the unit's forward released it (it reshards after forward). A unit used again later in the forward pass, "
          "or before its own backward (a tied head), must stay gathered: set "
          "model_options::reshard_after_forward[\"layers.1\"] = false");
    CHECK(contains(error_of<fsdp::usage_error>([&] { u.param("layers.0.w"); }),
                   "no parameter named 'layers.0.w' in unit 'layers.1'"));
    CHECK(contains(error_of<fsdp::usage_error>([&] { m.unit("layers.9"); }), "no unit named 'layers.9'"));
    CHECK(contains(error_of<fsdp::usage_error>([&] { m.unit(3); }),
                   "unit index 3 is out of range: the model has 3 units"));
  });
}

namespace {
/// A tied-embedding model in small: the root unit ("wte", the embedding and the head) first, then two blocks.
fsdp::ModelSpec tied() {
  fsdp::ModelSpec s;
  s.add("wte", {4, 4}).add("h.0.w", {4, 4}).add("h.1.w", {4, 4});
  return s;
}
}  // namespace

TEST_CASE(
    "the root, first in forward, stays gathered into its backward by default: a tied head reads its own "
    "parameters at the forward's end and first in backward") {
  fsdp::model_options checked;  // and no view is stale meanwhile
  checked.check_views = true;
  for (int world : {1, 2}) {
    CAPTURE(world);
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>> m(
          c, tied(), by_prefix{"h."}, fsdp::init::normal{0.5f, 7}, checked);
      fsdp::optim::sgd sgd(m, {.lr = 0.1f});
      for (int step = 0; step < 2; ++step) {
        decltype(m)::unit_type* root = nullptr;
        fsdp::tensor_view<float> embedding;
        const float* raw = nullptr;  // the trainer's pointer, taken while the root is current
        std::vector<float> values;
        for (auto& u : m.forward()) {
          if (u.name() != "root") continue;
          root = &u;
          embedding = u.param("wte");
          raw = embedding.data();
          values.assign(embedding.begin(), embedding.end());
        }
        REQUIRE(root);
        // the head, after the last block: the root is still gathered, and the pointer reads the embedding
        CHECK(root->state() == fsdp::unit_state::gathered);
        m.synchronize();
        CHECK(std::vector<float>(raw, raw + 16) == values);
        CHECK(std::vector<float>(embedding.begin(), embedding.end()) == values);
        for (auto& u : m.backward()) {
          if (u.name() == "h.1")  // the head's backward comes first, before the root is current again
            CHECK(std::vector<float>(root->param("wte").begin(), root->param("wte").end()) == values);
          for (const auto& e : u.layout().entries()) (void)u.grad(e.name);
        }
        CHECK(root->state() == fsdp::unit_state::sharded);  // released when its backward ended
        m.synchronize();
        CHECK_THROWS_AS((void)embedding[0], fsdp::usage_error);
        sgd.step();
        sgd.zero_grad();
      }
    });
  }
  // named with true, the root is released after its forward: a head that asks for it is told what to set
  fsdp::model_options released;
  released.reshard_after_forward["root"] = true;
  run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<Full> m(c, tied(), by_prefix{"h."}, fsdp::init::normal{}, released);
    fsdp::Model<Full>::unit_type* root = nullptr;
    for (auto& u : m.forward())
      if (u.name() == "root") root = &u;
    CHECK(error_of<fsdp::usage_error>([&] { root->param("wte"); }) ==
          "fsdp: unit 'root' (index 0) is not gathered (state: sharded): param('wte') was asked for after the unit's "
          "forward released it (it reshards after forward). A unit used again later in the forward pass, or before "
          "its own backward (a tied head), must stay gathered: set model_options::reshard_after_forward[\"root\"] = "
          "false");
  });
}

TEST_CASE(
    "model_options::early_grads: the root's gradient from the start of backward, for the tied head's part; "
    "reduced with the rest, the memory as planned") {
  fsdp::model_options early;
  early.early_grads = {"root"};
  early.check_views = true;  // the head's view stays good until the root's backward ends
  run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>> m(c, tied(), by_prefix{"h."},
                                                                                  fsdp::init::normal{}, early);
    fsdp::optim::sgd sgd(m, {.lr = 0.0f});
    const float r = float(c.rank() + 1);
    for (auto& u : m.forward()) (void)u;
    auto& root = m.unit("root");
    fsdp::tensor_view<float> head;
    for (auto& u : m.backward()) {
      if (u.name() == "h.1") {  // first in backward: the head's gradient, before the root is current
        head = root.grad("wte");
        for (float& g : head) g = r;
      }
      if (u.name() == "root")
        for (std::int64_t i = 0; i < head.numel(); ++i) head[i] += 10.0f * r;  // the embedding's part
    }
    m.synchronize();
    // averaged over the ranks: 11 x (1 + 2) / 2 in every element this rank holds
    for (const auto& v : root.shard_views())
      for (std::int64_t i = v.begin; i < v.end; ++i) CHECK(root.grad_shard()[v.shard_offset + (i - v.begin)] == 16.5f);
    sgd.step();
    sgd.zero_grad();
    m.synchronize();
    CHECK(m.memory().peak == fsdp::plan_memory(m, sgd).peak);
  });
  // without it, the head's write is refused, naming the option
  run_ranks(1, [&](local_communicator& c) {
    fsdp::Model<Full> m(c, tied(), by_prefix{"h."});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward())
      if (u.name() == "h.1")
        CHECK(error_of<fsdp::usage_error>([&] { m.unit("root").grad("wte"); }) ==
              "fsdp: unit 'root' (index 0): grad('wte') is only available while the unit is current in "
              "model.backward() (now: not current); to write it earlier in the backward pass (a tied head's "
              "gradient), name the unit in model_options::early_grads");
  });
}

TEST_CASE("gradients are only reachable inside backward") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    for (auto& u : m.forward())
      CHECK(error_of<fsdp::usage_error>([&] { u.grad(u.name() + ".w"); }) ==
            "fsdp: unit '" + u.name() + "' (index " + std::to_string(u.index()) + "): grad('" + u.name() +
                ".w') is only available while the unit is current in model.backward() (now: current in forward); "
                "to write it earlier in the backward pass (a tied head's gradient), name the unit in "
                "model_options::early_grads");
    for (auto& u : m.backward()) (void)u.grad(u.name() + ".w");
  });
}

TEST_CASE("backward before forward") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    CHECK(error_of<fsdp::usage_error>([&] {
            for (auto& u : m.backward()) (void)u;
          }) == "fsdp: backward before forward: unit 'layers.0' (index 0) has not run forward since its last backward");
    // a second backward after one forward is the same mistake
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    CHECK(contains(error_of<fsdp::usage_error>([&] {
                     for (auto& u : m.backward()) (void)u;
                   }),
                   "backward before forward"));
  });
}

TEST_CASE("optimizer step before gradients are reduced") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    fsdp::optim::sgd opt(m, {.lr = 0.1f});
    CHECK(error_of<fsdp::usage_error>([&] { opt.step(); }) ==
          "fsdp: optimizer step before gradients are reduced: unit 'layers.0' (index 0) has no gradient reduced since "
          "the last step; run model.backward() to the end first");
    for (auto& u : m.forward()) (void)u;
    CHECK(contains(error_of<fsdp::usage_error>([&] { opt.step(); }), "optimizer step before gradients are reduced"));
    // a step in the middle of backward names where the pass is
    {
      auto range = m.backward();
      auto it = range.begin();
      CHECK(error_of<fsdp::usage_error>([&] { opt.step(); }) ==
            "fsdp: an optimizer step while model.backward() is at unit 'layers.2'; finish the pass first");
      for (; it != range.end(); ++it) (void)*it;
    }
    opt.step();  // now legal
    CHECK(contains(error_of<fsdp::usage_error>([&] { opt.step(); }), "unit 'layers.0' (index 0) has no gradient"));
  });
}

TEST_CASE("passes cannot nest, and a loop left early is reported") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    CHECK(error_of<fsdp::usage_error>([&] {
            for (auto& u : m.forward()) {
              (void)u;
              for (auto& v : m.forward()) (void)v;
            }
          }) == "fsdp: model.forward() while model.forward() is at unit 'layers.0'; finish the pass first");
    // the outer loop above exited through the exception: the model says so from now on
    // (the inner range, whose pass never began, did not abandon the outer one: the message names the outer)
    CHECK(error_of<fsdp::usage_error>([&] {
            for (auto& u : m.forward()) (void)u;
          }) == "fsdp: model.forward() after an abandoned pass: model.forward() was left at unit 'layers.0' (the loop "
                "exited early); every pass must visit all units");
  });
}

TEST_CASE("the same checks hold for shard_grad_op and no_shard") {
  run_ranks(3, [](local_communicator& c) {
    fsdp::Model<Grad> g(c, three_layers(), by_prefix{"layers."});
    CHECK(contains(error_of<fsdp::usage_error>([&] { g.unit(0).param("layers.0.w"); }), "is not gathered"));
    for (auto& u : g.forward()) (void)u;
    CHECK(g.unit(0).state() == fsdp::unit_state::gathered);  // kept until its backward
    (void)g.unit(0).param("layers.0.w");
    for (auto& u : g.backward()) (void)u;
    CHECK(g.unit(0).state() == fsdp::unit_state::sharded);

    fsdp::Model<None> n(c, three_layers(), by_prefix{"layers."});
    CHECK(n.unit(0).state() == fsdp::unit_state::gathered);  // replicated: always materialised
    CHECK(contains(error_of<fsdp::usage_error>([&] {
                     for (auto& u : n.backward()) (void)u;
                   }),
                   "backward before forward"));
  });
}

TEST_CASE("a parameter whose compute dtype differs from the policy's is named") {
  fsdp::ModelSpec s;
  s.add("w", {4}).add("norm", {4}, {.compute_dtype = fsdp::dtype::bf16});
  run_ranks(1, [&](local_communicator& c) {
    CHECK(error_of<fsdp::usage_error>([&] { fsdp::Model<Full>(c, s, fsdp::wrap::by_size{100}); }) ==
          "fsdp: parameter 'norm' asks for compute dtype bf16 but the precision policy computes in f32");
  });
}

TEST_CASE("an empty spec cannot make a model") {
  run_ranks(1, [](local_communicator& c) {
    CHECK(error_of<fsdp::usage_error>([&] { fsdp::Model<Full>(c, fsdp::ModelSpec{}, by_prefix{"h."}); }) ==
          "fsdp: the model spec is empty: add at least one parameter");
  });
}

TEST_CASE("an error caught inside a pass leaves that pass intact") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    for (auto& u : m.forward())
      CHECK(error_of<fsdp::usage_error>([&] {
              for (auto& v : m.backward()) (void)v;
            }) == "fsdp: model.backward() while model.forward() is at unit '" + u.name() + "'; finish the pass first");
    for (auto& u : m.backward()) (void)u.grad(u.name() + ".w");  // the forward completed normally
    fsdp::optim::sgd opt(m, {.lr = 0.1f});
    opt.step();
  });
}

TEST_CASE("a collective failing while a pass enters its first unit abandons the pass, with the reason") {
  run_ranks(1, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    c.abort("the test aborted the group");
    const std::string why = error_of<fsdp::comm_error>([&] {
      for (auto& u : m.forward()) (void)u;
    });
    CHECK(why == "fsdp: local all_gather(count=16, f32) #0 on rank 0 aborted: the test aborted the group");
    // no range owned the pass yet: the model says why, instead of waiting for a pass nobody can finish
    CHECK(error_of<fsdp::usage_error>([&] {
            for (auto& u : m.forward()) (void)u;
          }) == "fsdp: model.forward() after an abandoned pass: model.forward() stopped at unit 'layers.0': local "
                "all_gather(count=16, f32) #0 on rank 0 aborted: the test aborted the group");
  });
}

TEST_CASE("an optimizer step that fails part way is not retried: the model says why") {
  run_ranks(1, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    fsdp::optim::sgd opt(m, {.lr = 0.1f, .grad = {.skip_nonfinite = true}});  // the inspection all-reduces
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    m.synchronize();  // the reductions are done: the step fails inside its update (the inspection's all-reduce)
    c.abort("the test aborted the group");
    CHECK(contains(error_of<fsdp::comm_error>([&] { opt.step(); }), "aborted: the test aborted the group"));
    CHECK(contains(error_of<fsdp::usage_error>([&] { opt.step(); }),
                   "fsdp: an optimizer step after a failed optimizer step: local all_reduce"));
    CHECK(contains(error_of<fsdp::usage_error>([&] { m.zero_grad(); }), "zero_grad() after a failed optimizer step"));
  });
}

TEST_CASE("check_views: a view kept past its unit's release, or a gradient view past its backward, is refused naming "
          "both; released slots hold NaN") {
  const std::string stale_param =
      "fsdp: a view of parameter 'layers.1.w' of unit 'layers.1' was used after the unit released its gathered "
      "parameters (model_options::check_views): its memory now holds another unit's parameters. Ask "
      "unit.param(\"layers.1.w\") again while the unit is gathered, inside model.forward() or model.backward()";
  const std::string stale_grad =
      "fsdp: a gradient view of 'layers.2.w' of unit 'layers.2' was used after the unit's backward ended "
      "(model_options::check_views): its gradient went to the reduction and its memory to another unit. Write the "
      "gradient while the unit is current in model.backward(), through a view asked for there";
  fsdp::model_options checked;
  checked.check_views = true;
  for (int world : {1, 2}) {
    CAPTURE(world);
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."}, fsdp::init::normal{0.5f, 7}, checked);
      fsdp::tensor_view<float> kept, kept_grad;
      float* raw = nullptr;
      for (auto& u : m.forward()) {
        const auto v = u.param(u.name() + ".w");
        CHECK(std::isfinite(v[3]));  // inside its unit: fine
        if (u.name() == "layers.1") kept = v;  // released after its forward (layers.0, the first, is kept)
      }
      CHECK(error_of<fsdp::usage_error>([&] { (void)kept[0]; }) == stale_param);
      CHECK(error_of<fsdp::usage_error>([&] { (void)kept.data(); }) == stale_param);
      CHECK(error_of<fsdp::usage_error>([&] { (void)*kept.begin(); }) == stale_param);
      CHECK(kept.numel() == 16);  // what does not touch the memory still answers
      for (auto& u : m.backward()) {
        const auto w = u.param(u.name() + ".w");  // the same unit gathered again: a new view is good
        const auto g = u.grad(u.name() + ".w");
        for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = w[i];
        if (u.name() == "layers.2") {
          kept_grad = g;
          raw = w.data();  // a raw pointer escapes every check: what it reads after the release is NaN
        }
      }
      CHECK(error_of<fsdp::usage_error>([&] { kept_grad[0] = 1.0f; }) == stale_grad);
      m.synchronize();
      for (int i = 0; i < 16; ++i) CHECK(std::isnan(raw[i]));
    });
  }
}

TEST_CASE("check_views: a view stays good while its unit stays gathered (shard_grad_op from forward to backward)") {
  fsdp::model_options checked;
  checked.check_views = true;
  run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<Grad> m(c, three_layers(), by_prefix{"layers."}, fsdp::init::normal{0.5f, 7}, checked);
    std::vector<fsdp::tensor_view<float>> from_forward;
    for (auto& u : m.forward()) from_forward.push_back(u.param(u.name() + ".w"));
    for (auto& u : m.backward()) {
      const auto& v = from_forward[u.index()];
      CHECK(v[5] == u.param(u.name() + ".w")[5]);  // kept gathered: the forward's view reads the same memory
    }
    for (const auto& v : from_forward) CHECK_THROWS_AS((void)v[0], fsdp::usage_error);  // released after backward
  });
}

TEST_CASE("without check_views a kept view is not checked (the default: no cost, no protection)") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_layers(), by_prefix{"layers."});
    fsdp::tensor_view<float> kept;
    for (auto& u : m.forward())
      if (u.name() == "layers.1") kept = u.param("layers.1.w");
    CHECK_NOTHROW((void)kept[0]);  // reads whatever holds the slot now
  });
}
