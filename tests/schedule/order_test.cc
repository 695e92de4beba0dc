// The exact order of scheduler events (gather issued / begun / complete, compute start / end, release,
// reduction issued / begun / complete, optimizer) for every prefetch policy; and the slot ledger's picks (which
// reusable buffer a use takes, and its size).
//
// With host_options::threaded_streams = false every stream runs inline, so each rank's events happen in program
// order and the whole sequence is exact. With threaded streams and random delays on every collective, the events
// the host makes (issues, compute, releases) keep the same exact order, and every stream-side event sits where
// the waits put it: a unit's gather completes before its compute starts, its reduction starts after its
// backward ends and completes before the optimizer step.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <algorithm>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp::trace::kind;
namespace prefetch = fsdp::prefetch;
namespace sharding = fsdp::sharding;
using fsdp_test::three_units;

namespace {

/// A compact token per event: ag1 (gather issued on demand), ag1^ (issued ahead), ag1{ ag1} (gather begins /
/// completes on its stream), f1{ f1} and b1{ b1} (forward / backward compute of unit 1), rel1, rs1 / ar1
/// (reduce-scatter / all-reduce issued), rs1{ rs1} (it begins / completes), opt{ opt}.
std::string token(const fsdp::trace::event& e) {
  const std::string u = std::to_string(e.unit);
  const std::string red = e.coll == fsdp::collective::all_reduce ? "ar" : "rs";
  const std::string pass = e.pass == fsdp::pass_kind::forward ? "f" : "b";
  switch (e.what) {
    case kind::gather_issued: return "ag" + u + (e.ahead ? "^" : "");
    case kind::gather_begin: return "ag" + u + "{";
    case kind::gather_end: return "ag" + u + "}";
    case kind::compute_begin: return pass + u + "{";
    case kind::compute_end: return pass + u + "}";
    case kind::release: return "rel" + u;
    case kind::reduce_issued: return red + u;
    case kind::reduce_begin: return red + u + "{";
    case kind::reduce_end: return red + u + "}";
    case kind::optimizer_begin: return "opt{";
    case kind::optimizer_end: return "opt}";
  }
  return "?";
}

bool host_side(kind k) {
  return k != kind::gather_begin && k != kind::gather_end && k != kind::reduce_begin && k != kind::reduce_end;
}

std::string join(const std::vector<fsdp::trace::event>& ev, bool host_only) {
  std::string s;
  for (const auto& e : ev)
    if (!host_only || host_side(e.what)) s += (s.empty() ? "" : " ") + token(e);
  return s;
}

/// `steps` training steps (forward and backward per micro-batch, SGD step) per rank, recorded.
template <class Policy>
void run_step(fsdp::trace::recorder& rec, int world, fsdp::model_options opt, fsdp::comm::local_options lo,
              int steps = 1) {
  opt.recorder = &rec;
  lo.timeout = fsdp_test::timeout;
  fsdp::comm::run_local(
      world,
      [&](local_communicator& c) {
        fsdp::Model<Policy> m(c, three_units(), fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{}, opt);
        fsdp::optim::sgd sgd(m, {.lr = 0.1f});
        using T = typename Policy::precision::compute_type;
        for (int step = 0; step < steps; ++step) {
          for (int mb = 0; mb < opt.accumulation.micro_batches; ++mb) {
            for (auto& u : m.forward()) (void)u.param(u.name() + ".w");
            for (auto& u : m.backward()) {
              auto g = u.grad(u.name() + ".w");
              for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = T(1.0f);
            }
          }
          sgd.step();
          sgd.zero_grad();
        }
        m.synchronize();
      },
      lo);
}

/// Checks the exact sequence inline, then the host order and the causal placement with threaded, delayed streams.
template <class Policy>
void check(const std::string& expected, fsdp::model_options opt = {}, int steps = 1) {
  CAPTURE(expected);
  {
    fsdp::trace::recorder rec;
    fsdp::comm::local_options lo;
    lo.backend.threaded_streams = false;
    run_step<Policy>(rec, 2, opt, lo, steps);
    for (int r = 0; r < 2; ++r) CHECK(join(rec.events(r), false) == expected);
  }
  std::string host_expected;  // the expected tokens without the stream-side collective ones
  {
    std::istringstream is(expected);
    for (std::string t; is >> t;) {
      const bool stream_side = (t.back() == '{' || t.back() == '}') &&
                               (t.rfind("ag", 0) == 0 || t.rfind("rs", 0) == 0 || t.rfind("ar", 0) == 0);
      if (!stream_side) host_expected += (host_expected.empty() ? "" : " ") + t;
    }
  }
  for (int trial = 0; trial < 3; ++trial) {
    fsdp::trace::recorder rec;
    fsdp::comm::local_options lo;
    lo.delay = [trial](fsdp::collective, std::uint64_t seq, int rank) {
      std::mt19937 g(static_cast<unsigned>(seq * 31 + rank * 7 + trial));
      return std::chrono::microseconds(g() % 3000);
    };
    run_step<Policy>(rec, 3, opt, lo, steps);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      const auto ev = rec.events(r);
      CHECK(join(ev, true) == host_expected);
      // causal placement of the stream-side events
      auto pos = [&](const std::string& t, std::size_t from = 0) {
        for (std::size_t i = from; i < ev.size(); ++i)
          if (token(ev[i]) == t) return i;
        return ev.size();
      };
      // the k-th occurrence of `t` (a stream runs its collectives in issue order: the k-th issue of a unit's
      // gather or reduction is its k-th begin and end)
      auto nth = [&](const std::string& t, std::size_t k) {
        for (std::size_t i = 0; i < ev.size(); ++i)
          if (token(ev[i]) == t && k-- == 0) return i;
        return ev.size();
      };
      auto issues_before = [&](std::size_t i) {
        std::size_t k = 0;
        for (std::size_t j = 0; j < i; ++j) k += ev[j].what == ev[i].what && ev[j].unit == ev[i].unit;
        return k;
      };
      for (std::size_t i = 0; i < ev.size(); ++i) {
        const auto& e = ev[i];
        const std::string u = std::to_string(e.unit);
        if (e.what == kind::gather_issued) {
          const std::size_t k = issues_before(i);
          const std::size_t begin = nth("ag" + u + "{", k), end = nth("ag" + u + "}", k);
          // a gather issued after an optimizer step (pass none: ZeRO-1) serves the next forward
          const std::string use = e.pass == fsdp::pass_kind::backward ? "b" : "f";
          REQUIRE(begin < end);
          // complete before the unit's compute starts, or before it is released unused (at the optimizer step);
          // after the last step's update, ZeRO-1's gathers have no use left: complete is all there is
          const std::size_t next = std::min(pos(use + u + "{", i), pos("rel" + u, i));
          REQUIRE((next < ev.size() || e.pass == fsdp::pass_kind::none));
          CHECK(end < next);
        }
        if (e.what == kind::reduce_issued) {
          const std::string red = e.coll == fsdp::collective::all_reduce ? "ar" : "rs";
          const std::size_t k = issues_before(i);
          const std::size_t begin = nth(red + u + "{", k), end = nth(red + u + "}", k);
          REQUIRE(begin < end);
          CHECK(end < pos("opt{", i));  // reduced before the (next) optimizer step reads the shard
        }
      }
    }
  }
}
}  // namespace

TEST_CASE("prefetch::none: every gather on demand, exposed") {
  check<fsdp::policy<sharding::full_shard, prefetch::none>>(
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} rel2 ag2 ag2{ ag2} b2{ b2} rel2 rs2 "
      "rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}");
}

TEST_CASE("prefetch::forward<1>: the next unit's gather is issued before the current unit computes") {
  check<fsdp::policy<sharding::full_shard, prefetch::forward<1>>>(
      "ag0 ag0{ ag0} ag1^ ag1{ ag1} f0{ f0} ag2^ ag2{ ag2} f1{ f1} rel1 f2{ f2} rel2 ag2 ag2{ ag2} b2{ b2} rel2 "
      "rs2 rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}");
}

TEST_CASE("prefetch::backward_pre<1>: the next backward unit is gathered when a unit's backward starts") {
  check<fsdp::policy<sharding::full_shard, prefetch::backward_pre<1>>>(
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} rel2 ag2 ag2{ ag2} ag1^ ag1{ ag1} "
      "b2{ b2} rel2 rs2 rs2{ rs2} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}");
}

TEST_CASE("prefetch::backward_post: the next backward unit is gathered after the current one is released") {
  check<fsdp::policy<sharding::full_shard, prefetch::backward_post>>(
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} rel2 ag2 ag2{ ag2} b2{ b2} rel2 ag1^ "
      "ag1{ ag1} rs2 rs2{ rs2} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}");
}

TEST_CASE("prefetch::next: one unit ahead in both passes") {
  check<fsdp::policy<sharding::full_shard, prefetch::next>>(
      "ag0 ag0{ ag0} ag1^ ag1{ ag1} f0{ f0} ag2^ ag2{ ag2} f1{ f1} rel1 f2{ f2} rel2 ag2 ag2{ ag2} ag1^ ag1{ ag1} "
      "b2{ b2} rel2 rs2 rs2{ rs2} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}");
}

TEST_CASE("prefetch::explicit_schedule: the units named for each unit, in the order listed") {
  fsdp::model_options opt;
  opt.prefetch.forward["l0"] = {"l2", "l1"};
  opt.prefetch.backward["l1"] = {"l0"};
  check<fsdp::policy<sharding::full_shard, prefetch::explicit_schedule>>(
      "ag0 ag0{ ag0} ag2^ ag2{ ag2} ag1^ ag1{ ag1} f0{ f0} f1{ f1} rel1 f2{ f2} rel2 ag2 ag2{ ag2} b2{ b2} rel2 rs2 "
      "rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}",
      opt);
}

TEST_CASE("gather slots rate-limit prefetch: forward<2> with two slots") {
  fsdp::model_options opt;
  opt.gather_slots = 2;
  opt.reshard_after_forward["l0"] = true;  // the first unit, kept into its backward by default, released here
  // entering l0 takes a slot and prefetches l1 into the second; l2 waits until l0 is released
  check<fsdp::policy<sharding::full_shard, prefetch::forward<2>>>(
      "ag0 ag0{ ag0} ag1^ ag1{ ag1} f0{ f0} rel0 ag2^ ag2{ ag2} f1{ f1} rel1 f2{ f2} rel2 "
      "ag2 ag2{ ag2} b2{ b2} rel2 rs2 rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} "
      "ag0 ag0{ ag0} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}",
      opt);
  // one slot: no prefetch at all
  opt.gather_slots = 1;
  check<fsdp::policy<sharding::full_shard, prefetch::next>>(
      "ag0 ag0{ ag0} f0{ f0} rel0 ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} rel2 "
      "ag2 ag2{ ag2} b2{ b2} rel2 rs2 rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} "
      "ag0 ag0{ ag0} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}",
      opt);
  // by default the first unit holds one of two slots from its forward to its backward: the others take turns in
  // the second, each gathered on demand
  fsdp::model_options kept;
  kept.gather_slots = 2;
  check<fsdp::policy<sharding::full_shard, prefetch::forward<2>>>(
      "ag0 ag0{ ag0} ag1^ ag1{ ag1} f0{ f0} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} rel2 "
      "ag2 ag2{ ag2} b2{ b2} rel2 rs2 rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} "
      "b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}",
      kept);
}

TEST_CASE("reshard_after_forward: false keeps a unit gathered into its backward, true releases the first unit") {
  fsdp::model_options opt;
  opt.reshard_after_forward["l2"] = false;
  check<fsdp::policy<sharding::full_shard, prefetch::none>>(
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} b2{ b2} rel2 rs2 rs2{ rs2} ag1 ag1{ ag1} "
      "b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}",
      opt);
  // naming the first unit with true releases it after its forward, and its backward gathers it again
  opt.reshard_after_forward["l0"] = true;
  check<fsdp::policy<sharding::full_shard, prefetch::none>>(
      "ag0 ag0{ ag0} f0{ f0} rel0 ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} "
      "b2{ b2} rel2 rs2 rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} "
      "ag0 ag0{ ag0} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}",
      opt);
  // and the opposite override: shard_grad_op with one unit resharded after forward
  fsdp::model_options sgo;
  sgo.reshard_after_forward["l0"] = true;
  check<fsdp::policy<sharding::shard_grad_op, prefetch::none>>(
      "ag0 ag0{ ag0} f0{ f0} rel0 ag1 ag1{ ag1} f1{ f1} ag2 ag2{ ag2} f2{ f2} "
      "b2{ b2} rel2 rs2 rs2{ rs2} b1{ b1} rel1 rs1 rs1{ rs1} "
      "ag0 ag0{ ag0} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}",
      sgo);
}

TEST_CASE("no_shard: no gathers, all-reduces") {
  check<fsdp::policy<sharding::no_shard, prefetch::next>>(
      "f0{ f0} f1{ f1} f2{ f2} b2{ b2} ar2 ar2{ ar2} b1{ b1} ar1 ar1{ ar1} b0{ b0} ar0 ar0{ ar0} opt{ opt}");
}

TEST_CASE("a unit still gathered at the optimizer step is released first: its copy would be stale") {
  fsdp::model_options opt;
  opt.prefetch.backward["l0"] = {"l2"};  // gathers l2 again at the end of backward: useless, but legal
  check<fsdp::policy<sharding::full_shard, prefetch::explicit_schedule>>(
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} rel2 ag2 ag2{ ag2} b2{ b2} rel2 rs2 "
      "rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} ag2^ ag2{ ag2} b0{ b0} rel0 rs0 rs0{ rs0} rel2 opt{ opt}",
      opt);
}

TEST_CASE("no-sync over two micro-batches: the first keeps its gradients, the second reduces them") {
  fsdp::model_options opt;
  opt.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  check<fsdp::policy<sharding::full_shard, prefetch::none>>(
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} rel2 ag2 ag2{ ag2} b2{ b2} rel2 ag1 "
      "ag1{ ag1} b1{ b1} rel1 b0{ b0} rel0 ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} rel1 ag2 ag2{ ag2} f2{ f2} rel2 "
      "ag2 ag2{ ag2} b2{ b2} rel2 rs2 rs2{ rs2} ag1 ag1{ ag1} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} "
      "opt{ opt}",
      opt);
}

TEST_CASE("kept gathered over two micro-batches: one gather per unit and step, released in the last backward") {
  fsdp::model_options opt;
  opt.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch, .keep_gathered = true};
  check<fsdp::policy<sharding::full_shard, prefetch::none>>(
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} ag2 ag2{ ag2} f2{ f2} b2{ b2} b1{ b1} b0{ b0} "
      "f0{ f0} f1{ f1} f2{ f2} b2{ b2} rel2 rs2 rs2{ rs2} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} "
      "opt{ opt}",
      opt);
  // reduced every micro-batch, kept gathered all the same
  opt.accumulation.sync = fsdp::grad_sync::every_micro_batch;
  check<fsdp::policy<sharding::full_shard, prefetch::next>>(
      "ag0 ag0{ ag0} ag1^ ag1{ ag1} f0{ f0} ag2^ ag2{ ag2} f1{ f1} f2{ f2} "
      "b2{ b2} rs2 rs2{ rs2} b1{ b1} rs1 rs1{ rs1} b0{ b0} rs0 rs0{ rs0} "
      "f0{ f0} f1{ f1} f2{ f2} b2{ b2} rel2 rs2 rs2{ rs2} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} "
      "opt{ opt}",
      opt);
}

TEST_CASE("zero1: gathered in the first forward and kept; each step releases the stale copies and gathers the "
          "updated shards right after its update; no gather in forward or backward from the second step on") {
  const std::string first_step =
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} ag2 ag2{ ag2} f2{ f2} "
      "b2{ b2} rs2 rs2{ rs2} b1{ b1} rs1 rs1{ rs1} b0{ b0} rs0 rs0{ rs0} "
      "rel0 rel1 rel2 opt{ opt} ag0^ ag0{ ag0} ag1^ ag1{ ag1} ag2^ ag2{ ag2}";
  const std::string later_step =
      " f0{ f0} f1{ f1} f2{ f2} b2{ b2} rs2 rs2{ rs2} b1{ b1} rs1 rs1{ rs1} b0{ b0} rs0 rs0{ rs0} "
      "rel0 rel1 rel2 opt{ opt} ag0^ ag0{ ag0} ag1^ ag1{ ag1} ag2^ ag2{ ag2}";
  check<fsdp::policy<sharding::zero1, prefetch::none>>(first_step + later_step, {}, 2);
  // under prefetch::next the first forward gathers ahead as usual; from the second step on prefetch finds every
  // unit gathered already
  check<fsdp::policy<sharding::zero1, prefetch::next>>(
      "ag0 ag0{ ag0} ag1^ ag1{ ag1} f0{ f0} ag2^ ag2{ ag2} f1{ f1} f2{ f2} "
      "b2{ b2} rs2 rs2{ rs2} b1{ b1} rs1 rs1{ rs1} b0{ b0} rs0 rs0{ rs0} "
      "rel0 rel1 rel2 opt{ opt} ag0^ ag0{ ag0} ag1^ ag1{ ag1} ag2^ ag2{ ag2}" + later_step,
      {}, 2);
}

TEST_CASE("bf16 compute and reduction: the same order of events as fp32 (the casts are inside the collectives' work)") {
  check<fsdp::policy<sharding::full_shard, prefetch::next,
                     fsdp::precision::mixed<fsdp::bfloat16, float, fsdp::bfloat16>>>(
      "ag0 ag0{ ag0} ag1^ ag1{ ag1} f0{ f0} ag2^ ag2{ ag2} f1{ f1} rel1 f2{ f2} rel2 ag2 ag2{ ag2} ag1^ ag1{ ag1} "
      "b2{ b2} rel2 rs2 rs2{ rs2} b1{ b1} rel1 rs1 rs1{ rs1} b0{ b0} rel0 rs0 rs0{ rs0} opt{ opt}");
  // no_shard in bf16: each unit's cast copy is made on the gather stream for forward and kept to its backward
  check<fsdp::policy<sharding::no_shard, prefetch::none, fsdp::precision::mixed<fsdp::bfloat16>>>(
      "ag0 ag0{ ag0} f0{ f0} ag1 ag1{ ag1} f1{ f1} ag2 ag2{ ag2} f2{ f2} "
      "b2{ b2} rel2 ar2 ar2{ ar2} b1{ b1} rel1 ar1 ar1{ ar1} b0{ b0} rel0 ar0 ar0{ ar0} opt{ opt}");
}

TEST_CASE("slot_ledger: a use takes its last slot, else the smallest that holds it, else the largest made larger") {
  using fsdp::detail::sched::slot_ledger;
  auto text = [](slot_ledger::pick p) {
    return std::to_string(p.slot) + (p.fresh ? " made" : p.grows ? " made larger" : " reused");
  };
  slot_ledger l(1);
  CHECK(text(l.take(100, 0)) == "0 made");  // nothing given back: a new slot, of the use's size
  CHECK(text(l.take(400, 1)) == "1 made");
  l.give(1);
  l.give(0);
  // both hold 50: the smallest, slot 0, though slot 1 was given back first
  CHECK(text(l.take(50, 2)) == "0 reused");
  l.give(0);
  // none given back holds 500: the largest (slot 1) is made larger; no new slot
  CHECK(text(l.take(500, 3)) == "1 made larger");
  CHECK(l.size(1) == 500);
  CHECK(l.size(0) == 100);
  CHECK(l.count() == 2);
  CHECK(text(l.take(50, 4)) == "0 reused");  // slot 1 is held: use 4 takes slot 0
  l.give(1);
  l.give(0);
  // use 4 (50) took slot 0 last and takes it again; use 2 also took slot 0 last, now held: the smallest given back
  // that holds it, slot 1
  CHECK(text(l.take(50, 4)) == "0 reused");
  CHECK(text(l.take(50, 2)) == "1 reused");
  l.give(1);
  l.give(0);
  // now use 2's last slot is slot 1 (500): taken again over the smaller slot 0 (100), given back after it, so a step
  // takes the slots the step before took
  CHECK(text(l.take(50, 2)) == "1 reused");
  // a use whose last slot is too small now takes the smallest that holds it instead
  slot_ledger m(1);
  (void)m.take(10, 0);
  (void)m.take(50, 1);
  (void)m.take(60, 2);
  m.give(0);
  m.give(2);
  m.give(1);
  CHECK(text(m.take(40, 0)) == "1 reused");
  CHECK(m.size(0) == 10);
}

TEST_CASE("slot_ledger: with keep = 2 a second slot is made before one is reused, and equal ledgers pick alike") {
  using fsdp::detail::sched::slot_ledger;
  slot_ledger l(2);
  CHECK(l.take(100, 0).fresh);
  l.give(0);
  const slot_ledger::pick second = l.take(100, 1);  // one given back, but fewer than keep exist: a new one
  CHECK(second.fresh);
  CHECK(second.slot == 1);
  l.give(1);
  const slot_ledger copy = l;
  CHECK(copy == l);
  const slot_ledger::pick third = l.take(100, 2);  // equal sizes: the one given back longest ago
  CHECK_FALSE(third.fresh);
  CHECK(third.slot == 0);
  CHECK_FALSE(copy == l);
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { slot_ledger bad(0); }) ==
        "fsdp: slot_ledger: keep must be >= 1, got 0");
}
