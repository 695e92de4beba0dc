// What a training step issues, per unit: kernel launches, memory operations, host functions, event records, stream
// waits and host synchronizes, counted by the host backend call by call (each is one CUDA runtime call on the CUDA
// backend, which runs the same step program through the same interpreter), and the collectives. docs/cuda.md states
// these figures; a change to the step program that issues more shows here first.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cmath>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <string>

#include "tests/support/support.hpp"

namespace {
using fsdp::backend::issue_counts;
using fsdp::comm::local_communicator;

struct counted {
  issue_counts issued;
  fsdp::collective_stats collectives;
};

/// `units` units of 64 x 8 weights and a bias of 64 (no decay), at 4 ranks: rank 0's counts for the second step
/// (forward, backward, the optimizer's step), the first having made every slot.
template <class Policy, class Optimizer>
counted second_step(int units, Optimizer make_optimizer, fsdp::model_options options = {}) {
  fsdp::ModelSpec spec;
  for (int k = 0; k < units; ++k) {
    const std::string u = "u" + std::to_string(k);
    spec.add(u + ".w", {64, 8}).add(u + ".b", {64}, {.flags = {.no_decay = true}});
  }
  counted out;
  std::mutex mu;
  fsdp_test::run_ranks(4, [&](local_communicator& c) {
    fsdp::Model<Policy> m(c, spec, fsdp::wrap::by_prefix{"u"}, fsdp::init::normal{}, options);
    auto opt = make_optimizer(m);
    auto step = [&] {
      for (int k = 0; k < options.accumulation.micro_batches; ++k) {
        for (auto& u : m.forward()) (void)u.param(u.name() + ".w");
        for (auto& u : m.backward()) u.grad(u.name() + ".w")[0] = fsdp::bfloat16(1.0f);
      }
      opt.step();
    };
    step();
    m.synchronize();
    const issue_counts before = m.backend().issued();
    const fsdp::collective_stats coll_before = c.stats();
    step();
    const issue_counts d = m.backend().issued() - before;
    fsdp::collective_stats coll = c.stats();
    for (std::size_t k = 0; k < fsdp::collective_kinds; ++k) coll.count[k] -= coll_before.count[k];
    m.synchronize();
    std::lock_guard lk(mu);
    if (c.rank() == 0) out = {d, coll};
  });
  return out;
}

issue_counts per_unit(const issue_counts& more, const issue_counts& fewer, std::uint64_t extra_units) {
  issue_counts d = more - fewer;
  for (auto* f : {&d.kernels, &d.memory_ops, &d.host_functions, &d.records, &d.waits, &d.synchronizes}) {
    CHECK(*f % extra_units == 0);
    *f /= extra_units;
  }
  return d;
}

std::string str(const issue_counts& c) {
  return fsdp::detail::cat(c.kernels, " kernels, ", c.memory_ops, " memory operations, ", c.host_functions,
                           " host functions, ", c.records, " event records, ", c.waits, " stream waits, ",
                           c.synchronizes, " synchronizes");
}

auto adamw = [](auto& m) { return fsdp::optim::adamw(m, {}); };
}  // namespace

TEST_CASE("full_shard, bf16 compute, AdamW, prefetching the next unit: what each unit issues in a step") {
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
  const counted six = second_step<P>(6, adamw), three = second_step<P>(3, adamw);
  // kernels: the cast into the gather slot, forward and backward (fused with nothing else: the gather reads the
  // slice it wrote); the cast of the bf16 gradient for the fp32 reduction, pre-divided in the same kernel; the
  // reduced shard added into the fp32 gradient shard; the fused AdamW update. Memory operations: the unsharded
  // gradient zeroed before backward. Records: gathered (twice), grad_ready, reduced, shard_ready, and the slots
  // given back (gather twice, gradient, reduce input and output). Waits: shard_ready and gathered (twice each),
  // grad_ready, reduced, and the takes of slots given back on another stream (gather twice, gradient); the reduce
  // input and output are taken again on the stream that gave them back, which needs no wait.
  CHECK(str(per_unit(six.issued, three.issued, 3)) ==
        "5 kernels, 1 memory operations, 0 host functions, 10 event records, 9 stream waits, 0 synchronizes");
  // nothing else: no work per step beyond the units' but one record (where the compute stream stood when the
  // updates were issued, which a survivor of a failure reads: Model::committed_steps; on the host backend only,
  // whose streams can fail) and the step's commit (model_options::commit_step: one element of gradient slot 0
  // all-reduced over the world on the compute stream, no memory of its own) and the optimizer's two one-thread kernels
  // (the step's rule made from the device's update count, and the count: fsdp/optim/detail/step_block.hpp), and
  // nothing in a step waits on the host.
  // Six units' worth, less the first unit's second gather (kept from its forward to its backward by default): its cast,
  // its two records (gathered, the slot given back) and three waits (shard_ready, gathered, the slot's take)
  CHECK(str(six.issued) ==
        "31 kernels, 6 memory operations, 0 host functions, 59 event records, 51 stream waits, 0 synchronizes");
  CHECK(six.collectives[fsdp::collective::all_gather] == 11);      // forward and backward, the first unit once
  CHECK(six.collectives[fsdp::collective::reduce_scatter] == 6);   // backward
  CHECK(six.collectives[fsdp::collective::all_reduce] == 1);       // the step's commit
  // and no device memory taken or given back: every slot was made in the first step
  CHECK(six.issued.allocations == 0);
  CHECK(six.issued.frees == 0);
}

TEST_CASE("no-sync accumulation over two micro-batches: each unit's accumulator is the only memory a step takes") {
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
  fsdp::model_options o;
  o.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  const counted six = second_step<P>(6, adamw, o), three = second_step<P>(3, adamw, o);
  // taken from the pool (reserved for the plan's peak at construction: stream-ordered, no device synchronisation)
  // in the first micro-batch's backward, given back after the unit's reduction in the last
  CHECK(six.issued.allocations == 6);
  CHECK(six.issued.frees == 6);
  CHECK(three.issued.allocations == 3);
  CHECK(three.issued.frees == 3);
  CHECK(six.issued.synchronizes == 0);
  CHECK(six.collectives[fsdp::collective::reduce_scatter] == 6);  // once per step, in the last micro-batch
}

TEST_CASE("clipping by the global norm: the step decides on the compute stream and synchronizes nothing; the host "
          "learns the decision when its stream passes it") {
  // grad::options::max_norm: the squared norms (one per unit), their all-reduce, the decision (one element
  // function: the clip coefficient, the skip, the gradient scale, in double as the host computed them), its copy to
  // pinned host memory and an event; the updates read the decision on the compute stream. Until 2026-11-28 the
  // host read the norms back inside the step: two synchronizes of the compute stream a step.
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
  auto clipping = [](auto& m) { return fsdp::optim::adamw(m, {.grad = {.max_norm = 1.0f}}); };
  const counted six = second_step<P>(6, clipping), plain = second_step<P>(6, adamw);
  const issue_counts d = six.issued - plain.issued;
  CHECK(six.issued.synchronizes == 0);
  // 6 squared norms and the decision; zeroing the buffer and copying it to the host; its event
  CHECK(str(d) == "7 kernels, 2 memory operations, 0 host functions, 1 event records, 0 stream waits, 0 synchronizes");
  CHECK(six.collectives[fsdp::collective::all_reduce] == 1);  // the norms, which commit the step: no commit of its own
  CHECK(d.allocations == 0);  // the inspection's buffer is the optimizer's, for its whole life (a step takes none)
  CHECK(d.frees == 0);
}

TEST_CASE("a step's report is learned at a synchronize the trainer makes anyway: ready once the compute stream "
          "passed the decision, the same report as when waited for") {
  fsdp::ModelSpec spec;
  spec.add("u0.w", {64, 8}).add("u1.w", {64, 8});
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>;
  fsdp_test::run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<P> m(c, spec, fsdp::wrap::by_prefix{"u"});
    fsdp::optim::adamw opt(m, {.grad = {.max_norm = 1.0f}});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) u.grad(u.name() + ".w")[0] = 3.0f;
    const fsdp::grad::step_report r = opt.step();
    m.synchronize();  // the trainer reading its loss
    const issue_counts before = m.backend().issued(m.backend().compute_stream());
    CHECK(r.ready());
    const fsdp::grad::report& got = r;  // no wait: the stream has passed the decision
    CHECK((m.backend().issued(m.backend().compute_stream()) - before).synchronizes == 0);
    CHECK_FALSE(got.skipped);
    CHECK(got.norm > 1.0);  // a 3 in each unit's gradient on each rank
    CHECK(got.clip_coef == static_cast<float>(1.0 / (got.norm + 1e-6)));
    CHECK(opt.steps() == 1);
  });
}

TEST_CASE("a report held past its optimizer, whose compute stream failed before the decision: asking it throws "
          "what happened, and reaches no optimizer, whether the optimizer learned the failure first or not") {
  fsdp::ModelSpec spec;
  spec.add("u0.w", {64, 8}).add("u1.w", {64, 8});
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>;
  fsdp::comm::local_options o{.timeout = std::chrono::milliseconds(10000)};
  o.backend.threaded_compute = true;  // the step returns before its stream gets to the decision
  for (bool asked_first : {false, true}) {
    CAPTURE(asked_first);
    fsdp::comm::run_local(
        1,
        [&](local_communicator& c) {
          fsdp::Model<P> m(c, spec, fsdp::wrap::by_prefix{"u"});
          std::optional<fsdp::grad::step_report> r;
          {
            fsdp::optim::adamw opt(m, {.grad = {.max_norm = 1.0f}});
            for (int step = 0; step < 2; ++step) {  // the first step with an optimizer synchronizes (its staging)
              for (auto& u : m.forward()) (void)u;
              for (auto& u : m.backward()) {  // the trainer's backward, on the (threaded) compute stream
                float* g = u.grad(u.name() + ".w").data();
                m.backend().host_callback(m.backend().compute_stream(), [g] { g[0] = 3.0f; });
              }
              if (step == 0) (void)opt.step().get();
            }
            m.backend().host_callback(m.backend().compute_stream(), [] {
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
              throw std::runtime_error("the device fell off");
            });
            r.emplace(opt.step());
            if (asked_first)  // the optimizer learns the failure while alive: steps() settles the step
              CHECK(fsdp_test::error_of<std::runtime_error>([&] { (void)opt.steps(); }) == "the device fell off");
          }
          CHECK(r->ready());
          CHECK(fsdp_test::error_of<fsdp::comm_error>([&] { (void)r->get(); }) ==
                "fsdp: optimizer 'adamw': its step's decision was never read (the device fell off)");
        },
        o);
  }
}
