// Execution order: declared, wrapping (default) or recorded on the first step; units entered by name are
// checked against it, and the first unit out of place is an error that names it. Also the option errors of the
// scheduler (prefetch schedule, per-unit resharding, gather slots).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <string>
#include <vector>

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::run_ranks;
namespace prefetch = fsdp::prefetch;
namespace sharding = fsdp::sharding;
using fsdp_test::three_units;

namespace {
using Full = fsdp::policy<sharding::full_shard>;

template <class Policy = Full>
std::string construction_error(fsdp::model_options opt) {
  std::string msg;
  run_ranks(1, [&](local_communicator& c) {
    msg = error_of<fsdp::usage_error>(
        [&] { fsdp::Model<Policy> m(c, three_units(), fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{}, opt); });
  });
  return msg;
}

template <class M>
std::vector<std::string> visit(M& m, bool forward) {
  std::vector<std::string> out;
  if (forward)
    for (auto& u : m.forward()) out.push_back(u.name());
  else
    for (auto& u : m.backward()) out.push_back(u.name());
  return out;
}
using names = std::vector<std::string>;
}  // namespace

TEST_CASE("the wrapping order is the default; a declared order replaces it in both passes") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_units(), fsdp::wrap::by_prefix{"l"});
    CHECK(m.execution_order() == names{"l0", "l1", "l2"});
    CHECK(visit(m, true) == names{"l0", "l1", "l2"});
    CHECK(visit(m, false) == names{"l2", "l1", "l0"});

    fsdp::model_options opt;
    opt.forward_order = {"l2", "l0", "l1"};
    fsdp::Model<Full> d(c, three_units(), fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{}, opt);
    CHECK(d.execution_order() == names{"l2", "l0", "l1"});
    CHECK(visit(d, true) == names{"l2", "l0", "l1"});
    CHECK(visit(d, false) == names{"l1", "l0", "l2"});
  });
}

TEST_CASE("units entered by name follow the declared order; the first unit out of place is named") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::model_options opt;
    opt.forward_order = {"l2", "l0", "l1"};
    fsdp::Model<Full> m(c, three_units(), fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{}, opt);
    {
      auto f = m.forward();
      CHECK(f.enter("l2").name() == "l2");
      CHECK(f.enter("l0").state() == fsdp::unit_state::gathered);
      f.enter("l1");
      CHECK(error_of<fsdp::usage_error>([&] { f.enter("l2"); }) ==
            "fsdp: model.forward(): enter('l2') after all 3 units were entered; call finish()");
      f.finish();
    }
    {
      auto b = m.backward();
      b.enter("l1");
      CHECK(error_of<fsdp::usage_error>([&] { b.enter("l2"); }) ==
            "fsdp: execution order differs from the declared order: model.backward() entered unit 'l2' at position "
            "1, where the declared order has 'l0' (forward order: l2, l0, l1)");
    }
    // a pass stopped half-way cannot go on: the model says why
    CHECK(error_of<fsdp::usage_error>([&] { visit(m, true); }) ==
          "fsdp: model.forward() after an abandoned pass: model.backward() stopped at position 1: execution order "
          "differs from the declared order: model.backward() entered unit 'l2' at position 1, where the "
          "declared order has 'l0' (forward order: l2, l0, l1)");
  });
}

TEST_CASE("a wrong first unit leaves the model usable") {
  run_ranks(1, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_units(), fsdp::wrap::by_prefix{"l"});
    {
      auto f = m.forward();
      CHECK(error_of<fsdp::usage_error>([&] { f.enter("l1"); }) ==
            "fsdp: execution order differs from the wrapping order: model.forward() entered unit 'l1' at position 0, "
            "where the wrapping order has 'l0' (forward order: l0, l1, l2)");
      CHECK(error_of<fsdp::usage_error>([&] { f.enter("nope"); }) ==
            "fsdp: no unit named 'nope' (units: l0, l1, l2)");
    }
    CHECK(visit(m, true) == names{"l0", "l1", "l2"});
    CHECK(visit(m, false) == names{"l2", "l1", "l0"});
  });
}

TEST_CASE("the order is recorded on the first forward pass and checked on later passes") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::trace::recorder rec;
    fsdp::model_options opt;
    opt.record_order = true;
    opt.recorder = &rec;
    fsdp::Model<fsdp::policy<sharding::full_shard, prefetch::next>> m(c, three_units(), fsdp::wrap::by_prefix{"l"},
                                                                     fsdp::init::normal{}, opt);
    CHECK(m.execution_order().empty());
    {
      auto f = m.forward();
      f.enter("l1");
      CHECK(m.execution_order().empty());  // still recording
      f.enter("l0");
      CHECK(error_of<fsdp::usage_error>([&] { f.finish(); }) ==
            "fsdp: model.forward().finish() after 2 of 3 units: unit 'l2' was not entered");
      f.enter("l2");
      f.finish();
    }
    CHECK(m.execution_order() == names{"l1", "l0", "l2"});
    CHECK(visit(m, false) == names{"l2", "l0", "l1"});
    // while recording nothing is known ahead, so the first forward prefetches nothing; the backward does (l0 at
    // l2; not l1, first in forward and so still gathered)
    int ahead_forward = 0, ahead_backward = 0;
    for (const auto& e : rec.events(c.rank()))
      if (e.what == fsdp::trace::kind::gather_issued && e.ahead)
        ++(e.pass == fsdp::pass_kind::forward ? ahead_forward : ahead_backward);
    CHECK(ahead_forward == 0);
    CHECK(ahead_backward == 1);
    fsdp::optim::sgd sgd(m, {.lr = 0.0f});
    sgd.step();
    // the second step prefetches in forward along the recorded order: l0 while l1 computes, then l2
    rec.clear();
    CHECK(visit(m, true) == names{"l1", "l0", "l2"});
    std::vector<int> ahead;
    for (const auto& e : rec.events(c.rank()))
      if (e.what == fsdp::trace::kind::gather_issued && e.ahead) ahead.push_back(e.unit);
    CHECK(ahead == std::vector<int>{0, 2});
    visit(m, false);
    sgd.step();
    auto f = m.forward();
    f.enter("l1");
    CHECK(error_of<fsdp::usage_error>([&] { f.enter("l2"); }) ==
          "fsdp: execution order differs from the recorded order: model.forward() entered unit 'l2' at position 1, "
          "where the recorded order has 'l0' (forward order: l1, l0, l2)");
  });
}

TEST_CASE("recording: a unit entered twice, a pass left without finish()") {
  run_ranks(1, [](local_communicator& c) {
    fsdp::model_options opt;
    opt.record_order = true;
    fsdp::Model<Full> m(c, three_units(), fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{}, opt);
    {
      auto f = m.forward();
      f.enter("l2");
      CHECK(error_of<fsdp::usage_error>([&] { f.enter("l2"); }) ==
            "fsdp: model.forward() entered unit 'l2' twice while recording the execution order");
    }
    CHECK(m.execution_order().empty());
    fsdp::Model<Full> n(c, three_units(), fsdp::wrap::by_prefix{"l"});
    {
      auto f = n.forward();
      f.enter("l0");
      f.enter("l1");
      f.enter("l2");
    }  // no finish()
    CHECK(error_of<fsdp::usage_error>([&] { n.zero_grad(); }) ==
          "fsdp: zero_grad() after an abandoned pass: model.forward() was left at unit 'l2' (finish() was not "
          "called); every pass must visit all units");
  });
}

TEST_CASE("iterating and entering by name do not mix") {
  run_ranks(1, [](local_communicator& c) {
    fsdp::Model<Full> m(c, three_units(), fsdp::wrap::by_prefix{"l"});
    auto f = m.forward();
    CHECK(error_of<fsdp::usage_error>([&] { f.finish(); }) ==
          "fsdp: model.forward(): finish() ends a pass whose units were entered by name");
    for (auto& u : f) {
      CHECK(error_of<fsdp::usage_error>([&] { f.enter(u.name()); }) ==
            "fsdp: model.forward(): enter('" + u.name() + "') on a range that is being iterated");
    }
  });
}

TEST_CASE("option errors name the option and the unit") {
  {
    fsdp::model_options o;
    o.forward_order = {"l0", "l1", "x"};
    CHECK(construction_error(o) ==
          "fsdp: model_options::forward_order names 'x', which is not a unit (units: l0, l1, l2)");
    o.forward_order = {"l0", "l1", "l0"};
    CHECK(construction_error(o) == "fsdp: model_options::forward_order lists unit 'l0' twice");
    o.forward_order = {"l0", "l2"};
    CHECK(construction_error(o) == "fsdp: model_options::forward_order leaves out unit 'l1'");
    o.record_order = true;
    CHECK(construction_error(o) ==
          "fsdp: model_options: forward_order and record_order are exclusive (declare the order or record it)");
  }
  {
    fsdp::model_options o;
    o.early_grads = {"l1", "l9"};
    CHECK(construction_error(o) ==
          "fsdp: model_options::early_grads names 'l9', which is not a unit (units: l0, l1, l2)");
  }
  {
    fsdp::model_options o;
    o.reshard_after_forward["l9"] = false;
    CHECK(construction_error(o) ==
          "fsdp: model_options::reshard_after_forward names 'l9', which is not a unit (units: l0, l1, l2)");
    o.reshard_after_forward = {{"l1", false}};
    CHECK(construction_error<fsdp::policy<sharding::no_shard>>(o) ==
          "fsdp: model_options::reshard_after_forward is set for unit 'l1', but no_shard never gathers or reshards "
          "parameters");
    // zero1 keeps every unit gathered between steps: releasing one after its forward, or fewer slots than units
    o.reshard_after_forward = {{"l1", true}};
    CHECK(construction_error<fsdp::policy<sharding::zero1>>(o) ==
          "fsdp: model_options::reshard_after_forward releases unit 'l1' after its forward, but zero1 keeps every "
          "unit's parameters gathered between steps; leave the unit out of reshard_after_forward, or use "
          "shard_grad_op");
    o.reshard_after_forward = {{"l1", false}};  // keeping it gathered is what zero1 does anyway
    o.gather_slots = 2;
    CHECK(construction_error<fsdp::policy<sharding::zero1>>(o) ==
          "fsdp: model_options::gather_slots is 2, but zero1 keeps all 3 units' parameters gathered between steps; "
          "set it to 0 (no limit) or at least 3");
  }
  {
    fsdp::model_options o;
    using Explicit = fsdp::policy<sharding::full_shard, prefetch::explicit_schedule>;
    CHECK(construction_error<Explicit>(o) ==
          "fsdp: prefetch::explicit_schedule needs model_options::prefetch to name the units to prefetch");
    o.prefetch.forward["l0"] = {"l1"};
    CHECK(construction_error(o) ==
          "fsdp: model_options::prefetch names units to prefetch, but the policy's prefetch is not "
          "prefetch::explicit_schedule (it would be ignored)");
    o.prefetch.backward["l7"] = {"l1"};
    CHECK(construction_error<Explicit>(o) ==
          "fsdp: model_options::prefetch.backward['l7']: no unit named 'l7' (units: l0, l1, l2)");
    o.prefetch.backward = {{"l2", {"l1", "zz"}}};
    CHECK(construction_error<Explicit>(o) ==
          "fsdp: model_options::prefetch.backward['l2'] names 'zz', which is not a unit (units: l0, l1, l2)");
  }
  {
    fsdp::model_options o;
    o.gather_slots = -1;
    CHECK(construction_error(o) == "fsdp: model_options::gather_slots must be >= 0 (0 = no limit), got -1");
    // shard_grad_op keeps every unit gathered from its forward to its backward: three units need three slots
    o.gather_slots = 2;
    CHECK(
        construction_error<fsdp::policy<sharding::shard_grad_op>>(o) ==
        "fsdp: model_options::gather_slots = 2 is too few for this policy: gather slots exhausted: unit 'l2' "
        "(index 2) must be gathered for its forward but all 2 slots are held by 'l0', 'l1'; raise "
        "model_options::gather_slots or let those units reshard after forward (model_options::reshard_after_forward)");
    o.gather_slots = 3;
    run_ranks(1, [&](local_communicator& c) {
      fsdp::Model<fsdp::policy<sharding::shard_grad_op>> m(c, three_units(), fsdp::wrap::by_prefix{"l"},
                                                          fsdp::init::normal{}, o);
      visit(m, true);
      visit(m, false);
    });
  }
}
