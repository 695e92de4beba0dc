// Measured per-rank peak memory by category equals what the layout and the policy predict, exactly.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

using fsdp::mem;
using fsdp::comm::local_communicator;

namespace {
mlp::config cfg(const char* optimizer, fsdp::model_options mo = {}, fsdp::grad::options g = {}) {
  mlp::config c;
  c.model = mo;
  c.grad = g;
  c.dims = {16, 64, 32, 128, 8};  // uneven units: 1088, 2080, 4224, 1032 elements
  c.global_batch = 24;
  c.steps = 2;
  c.optimizer = optimizer;
  return c;
}

template <class Policy>
std::vector<mlp::result> train(int world, const char* optimizer, fsdp::model_options mo = {},
                               fsdp::grad::options g = {}) {
  std::vector<mlp::result> out(static_cast<std::size_t>(world));
  fsdp_test::run_ranks(world,
                       [&](local_communicator& c) { out[c.rank()] = mlp::train<Policy>(c, cfg(optimizer, mo, g)); });
  return out;
}

template <class Strategy, class Prefetch, class Precision = fsdp::precision::full>
void check_plan_matches(fsdp::model_options mo = {}, fsdp::grad::options g = {},
                        std::vector<int> worlds = {1, 3, 4}) {
  using Policy = fsdp::policy<Strategy, Prefetch, Precision>;
  for (int world : worlds)
    for (const char* optimizer : {"adamw", "sgd"}) {
      CAPTURE(world);
      CAPTURE(optimizer);
      CAPTURE(Strategy::name);
      CAPTURE(Prefetch::forward_depth);
      CAPTURE(Prefetch::backward_depth);
      CAPTURE(fsdp::name_of(fsdp::dtype_of_v<typename Precision::compute_type>));
      CAPTURE(fsdp::name_of(fsdp::dtype_of_v<typename Precision::reduce_type>));
      CAPTURE(fsdp::name_of(fsdp::facts_of_precision<Precision>().gather));
      CAPTURE(mo.accumulation.micro_batches);
      CAPTURE(int(mo.accumulation.sync));
      CAPTURE(mo.accumulation.keep_gathered);
      CAPTURE(g.rows(world));
      for (const auto& r : train<Policy>(world, optimizer, mo, g)) {
        for (std::size_t k = 0; k < fsdp::mem_categories; ++k) {
          CAPTURE(fsdp::name_of(static_cast<mem>(k)));
          CHECK(r.memory.peak.bytes[k] == r.planned.bytes[k]);
        }
        CHECK(r.memory.peak.total == r.planned.total);  // all categories at once, too
        // after training, what the planner says stays: shards, gradients, optimizer state and the slots
        CHECK(r.memory.current == r.planned_between);
        CHECK(r.memory.current[mem::gathered_params] == r.planned[mem::gathered_params]);  // slots only
        CHECK(r.memory.current[mem::sharded_params] == r.planned[mem::sharded_params]);
      }
    }
}
}  // namespace

TEST_CASE("planned peak equals measured peak, per category, for every strategy and prefetch depth") {
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::none>();
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next>();
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::forward<2>>();
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::backward_pre<2>>();
  check_plan_matches<fsdp::sharding::shard_grad_op, fsdp::prefetch::next>();
  check_plan_matches<fsdp::sharding::shard_grad_op, fsdp::prefetch::none>();
  check_plan_matches<fsdp::sharding::no_shard, fsdp::prefetch::next>();
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::backward_post>();
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::depth<3, 3>>();
  check_plan_matches<fsdp::sharding::zero1, fsdp::prefetch::none>();
  check_plan_matches<fsdp::sharding::zero1, fsdp::prefetch::next>();
}

namespace {
// A GPT's shape in small: a first unit 24 times a block (a tied embedding and head), four blocks, a small last unit.
fsdp::ModelSpec very_different_sizes() {
  fsdp::ModelSpec spec;
  spec.add("u0.w", {4800}).add("u1.w", {200}).add("u2.w", {200}).add("u3.w", {200}).add("u4.w", {200});
  return spec.add("u5.w", {24});
}

struct measured_and_planned {
  fsdp::memory_figures measured, planned;
  std::vector<std::int64_t> gathered;  // per unit: its gathered buffer's bytes
};

template <class Strategy, class Precision = fsdp::precision::full>
measured_and_planned train_very_different_sizes(int world) {
  using Policy = fsdp::policy<Strategy, fsdp::prefetch::next, Precision>;
  std::vector<measured_and_planned> out(static_cast<std::size_t>(world));
  fsdp_test::run_ranks(world, [&](local_communicator& c) {
    fsdp::Model<Policy> m(c, very_different_sizes(), fsdp::wrap::by_prefix{"u"});
    fsdp::optim::adamw opt(m, {});
    for (int step = 0; step < 4; ++step) {
      for (auto& u : m.forward()) (void)u.param(u.name() + ".w");
      for (auto& u : m.backward()) {
        auto g = u.grad(u.name() + ".w");
        g[0] = typename std::remove_reference_t<decltype(g[0])>(1.0f);
      }
      opt.step();
    }
    m.synchronize();
    measured_and_planned& r = out[static_cast<std::size_t>(c.rank())];
    r.measured = m.memory().peak;
    r.planned = fsdp::plan_memory(m, opt.states_per_element()).peak;
    for (std::size_t u = 0; u < m.size(); ++u) r.gathered.push_back(fsdp::model_access::costs(m, u).gathered.bytes());
  });
  for (const measured_and_planned& r : out) CHECK(r.measured == r.planned);
  return out[0];
}
}  // namespace

TEST_CASE("units of very different sizes: planned equals measured under every strategy, each slot at its units' size") {
  using fsdp::bfloat16;
  using fsdp::precision::mixed;
  namespace sh = fsdp::sharding;
  for (int world : {1, 4}) {
    CAPTURE(world);
    // full_shard: the first unit, kept into its backward, beside the window of the next one ahead: two blocks,
    // each gathered into a slot of a block's size (slots of the largest unit's size held 3 x 4800 elements)
    const auto fs = train_very_different_sizes<sh::full_shard>(world);
    CHECK(fs.planned[mem::gathered_params] == fs.gathered[0] + 2 * fs.gathered[1]);
    const auto fsb = train_very_different_sizes<sh::full_shard, mixed<bfloat16>>(world);
    CHECK(fsb.planned[mem::gathered_params] == fsb.gathered[0] + 2 * fsb.gathered[1]);
    CHECK(2 * fsb.planned[mem::gathered_params] == fs.planned[mem::gathered_params]);
    // ZeRO-1 and shard_grad_op keep every unit gathered from its gather to its backward: one copy of the model,
    // each unit in a slot of its own size
    std::int64_t model = 0;
    for (std::int64_t b : fs.gathered) model += b;
    CHECK(train_very_different_sizes<sh::zero1>(world).planned[mem::gathered_params] == model);
    CHECK(train_very_different_sizes<sh::zero1, mixed<bfloat16>>(world).planned[mem::gathered_params] == model / 2);
    CHECK(train_very_different_sizes<sh::shard_grad_op>(world).planned[mem::gathered_params] == model);
    // no_shard: fp32 compute reads the masters; a bf16 one keeps a bf16 copy of each unit, at its own size
    CHECK(train_very_different_sizes<sh::no_shard>(world).planned[mem::gathered_params] == 0);
    const auto ddp = train_very_different_sizes<sh::no_shard, mixed<bfloat16>>(world);
    std::int64_t copy = 0;
    for (std::int64_t b : ddp.gathered) copy += b;
    CHECK(ddp.planned[mem::gathered_params] == copy);
  }
  const auto hsdp = train_very_different_sizes<sh::hybrid_shard<2>>(4);
  CHECK(hsdp.planned[mem::gathered_params] == hsdp.gathered[0] + 2 * hsdp.gathered[1]);
  train_very_different_sizes<sh::hybrid_shard_zero1<2>, mixed<bfloat16>>(4);
}

TEST_CASE("planned peak equals measured peak for hybrid sharding (2 x 2, 4 x 2, 2 x 4, W x 1), every precision") {
  using fsdp::bfloat16;
  using fsdp::precision::mixed;
  using fsdp::sharding::hybrid_shard;
  using fsdp::sharding::hybrid_shard_zero2;
  check_plan_matches<hybrid_shard<2>, fsdp::prefetch::next>({}, {}, {4, 8});
  check_plan_matches<hybrid_shard<4>, fsdp::prefetch::backward_pre<2>, mixed<bfloat16>>({}, {}, {8});
  check_plan_matches<hybrid_shard<2>, fsdp::prefetch::none, mixed<bfloat16, float, bfloat16>>({}, {.max_norm = 1.0f},
                                                                                              {4});
  check_plan_matches<hybrid_shard_zero2<2>, fsdp::prefetch::next, mixed<bfloat16>>({}, {}, {4});
  check_plan_matches<hybrid_shard_zero2<4>, fsdp::prefetch::next>({}, {}, {8});
  // shard groups of one rank (every rank holds everything; groups of one gather, the replicas all-reduce)
  check_plan_matches<hybrid_shard<1>, fsdp::prefetch::next>({}, {}, {2, 4});
  check_plan_matches<hybrid_shard_zero2<1>, fsdp::prefetch::next, mixed<bfloat16>>({}, {}, {3});
  check_plan_matches<fsdp::sharding::hybrid_shard_zero1<2>, fsdp::prefetch::next, mixed<bfloat16>>({}, {}, {4});
  check_plan_matches<hybrid_shard<2>, fsdp::prefetch::next, fsdp::precision::wire<bfloat16>>({}, {}, {4});
}

TEST_CASE("planned equals measured under gather slots, per-unit resharding, explicit schedules and orders") {
  fsdp::model_options slots;
  slots.gather_slots = 2;
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::depth<3, 3>>(slots);
  fsdp::model_options root;
  root.reshard_after_forward["layers.3"] = false;
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next>(root);
  fsdp::model_options sgo;
  sgo.reshard_after_forward["layers.0"] = true;
  sgo.gather_slots = 3;
  check_plan_matches<fsdp::sharding::shard_grad_op, fsdp::prefetch::backward_pre<1>>(sgo);
  fsdp::model_options ex;
  ex.prefetch.forward["layers.0"] = {"layers.2", "layers.1"};
  ex.prefetch.backward["layers.3"] = {"layers.1"};
  ex.prefetch.backward["layers.0"] = {"layers.3"};  // stays gathered until the step releases it
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::explicit_schedule>(ex);
}

TEST_CASE("planned equals measured for every precision and accumulation mode, with and without gradient inspection") {
  using fsdp::bfloat16;
  using fsdp::float16;
  using fsdp::precision::mixed;
  const fsdp::accumulation_options modes[] = {
      {.micro_batches = 1},
      {.micro_batches = 2},
      {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch},
      {.micro_batches = 2, .keep_gathered = true},
      {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch, .keep_gathered = true},
  };
  for (const auto& a : modes) {
    fsdp::model_options mo;
    mo.accumulation = a;
    check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next, mixed<bfloat16>>(mo);
    check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::none, mixed<bfloat16, float, bfloat16>>(mo);
    check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::backward_post, mixed<float16, float, float16>>(mo);
    check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next>(mo);
    check_plan_matches<fsdp::sharding::shard_grad_op, fsdp::prefetch::next, mixed<bfloat16>>(mo);
    check_plan_matches<fsdp::sharding::zero1, fsdp::prefetch::next, mixed<bfloat16>>(mo);
    check_plan_matches<fsdp::sharding::no_shard, fsdp::prefetch::next, mixed<bfloat16>>(mo);
    check_plan_matches<fsdp::sharding::no_shard, fsdp::prefetch::next>(mo);
    // fp32 compute over bf16 or fp16 gathers: the wire slot beside the gathered ones
    check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::wire<bfloat16>>(mo);
    check_plan_matches<fsdp::sharding::shard_grad_op, fsdp::prefetch::none, fsdp::precision::wire<float16, float16>>(
        mo);
    check_plan_matches<fsdp::sharding::no_shard, fsdp::prefetch::next, fsdp::precision::wire<bfloat16>>(mo);
    // fp8 or int8 gathers in blocks with a scale each: the wire slot holds values and scales
    check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next,
                       fsdp::precision::scaled<fsdp::float8_e4m3, 16>>(mo);
    check_plan_matches<fsdp::sharding::no_shard, fsdp::prefetch::next,
                       fsdp::precision::scaled<fsdp::float8_e5m2, 16, float, bfloat16>>(mo);
    check_plan_matches<fsdp::sharding::shard_grad_op, fsdp::prefetch::next, fsdp::precision::scaled<std::int8_t, 16>>(
        mo);
    // gradients reduced quantized: the reduce input and output slots of values and scales
    check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next,
                       fsdp::precision::scaled<std::int8_t, 16, bfloat16, std::int8_t>>(mo);
    check_plan_matches<fsdp::sharding::zero1, fsdp::prefetch::none,
                       fsdp::precision::scaled<fsdp::float8_e4m3, 16, float, fsdp::float8_e4m3>>(mo);
  }
  // gradient inspection adds one rows x units buffer at the step: a row, or one per rank when locating
  fsdp::model_options pre_post;
  pre_post.division.how = fsdp::grad_division::mode::pre_post;
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next, mixed<bfloat16>>({}, {.max_norm = 1.0f});
  check_plan_matches<fsdp::sharding::full_shard, fsdp::prefetch::next, mixed<float16, float, float16>>(
      pre_post, {.skip_nonfinite = true, .locate_nonfinite = true});
  check_plan_matches<fsdp::sharding::no_shard, fsdp::prefetch::next>({}, {.locate_nonfinite = true});
}

TEST_CASE("bf16 figures worked out by hand for 4 ranks: half the gathered bytes, the casts' buffers in comm buffers") {
  // The units of the test above at 4 ranks: padded 1088 | 2112 | 4224 | 1088, shards 272 | 528 | 1056 | 272.
  using fsdp::bfloat16;
  using fsdp::precision::mixed;
  using F = fsdp::sharding::full_shard;
  const auto f32 = train<fsdp::policy<F, fsdp::prefetch::none>>(4, "adamw")[0].memory.peak;
  const auto mixed32 = train<fsdp::policy<F, fsdp::prefetch::none, mixed<bfloat16>>>(4, "adamw")[0].memory.peak;
  const auto bf16 =
      train<fsdp::policy<F, fsdp::prefetch::none, mixed<bfloat16, float, bfloat16>>>(4, "adamw")[0].memory.peak;
  // two gather slots, each as large as the units it served: the first unit's (1088), kept from its forward to its
  // backward by default, and the one the others take in turn (grown to layers.2's 4224)
  CHECK(mixed32[mem::gathered_params] == (1088 + 4224) * 2);
  CHECK(2 * mixed32[mem::gathered_params] == f32[mem::gathered_params]);
  CHECK(mixed32[mem::sharded_params] == f32[mem::sharded_params]);  // masters stay fp32
  CHECK(mixed32[mem::grads] == 2128 * 4);                            // gradient shards too
  // backward's first two units make the two bf16 gradient slots (layers.3's 1088, layers.2's 4224, which
  // layers.1 and layers.0 reuse); the fp32 cast for the fp32 reduce-scatter and the fp32 output shard, one slot each,
  // grow to the largest unit's
  CHECK(mixed32[mem::comm_buffers] == (1088 + 4224) * 2 + 4224 * 4 + 1056 * 4);
  // bf16 reduction: the gradient itself is reduced; the output shard is bf16
  CHECK(bf16[mem::comm_buffers] == (1088 + 4224) * 2 + 1056 * 2);
  // no-sync over 2 micro-batches: every unit's fp32 accumulator (1088 + 2112 + 4224 + 1088 elements) lives until
  // its reduction in the last backward. The peak comes in that backward, with all four accumulators, both bf16
  // gradient slots (1088 and 4224, made in the first) and the fp32 output slot at the largest shard
  fsdp::model_options nosync;
  nosync.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  const auto ns = train<fsdp::policy<F, fsdp::prefetch::none, mixed<bfloat16>>>(4, "adamw", nosync)[0].memory.peak;
  CHECK(ns[mem::comm_buffers] == (1088 + 2112 + 4224 + 1088) * 4 + (1088 + 4224) * 2 + 1056 * 4);
  // fp16 reduced in fp16 with pre/post division: the pre-division scales the gradient in place, no cast buffer
  fsdp::model_options pp;
  pp.division.how = fsdp::grad_division::mode::pre_post;
  const auto f16 =
      train<fsdp::policy<F, fsdp::prefetch::none, mixed<fsdp::float16, float, fsdp::float16>>>(4, "adamw", pp)[1]
          .memory.peak;
  CHECK(f16[mem::comm_buffers] == (1088 + 4224) * 2 + 1056 * 2);
  // no_shard in bf16: unsharded units (1088, 2080, 4224, 1040 at align 16) as bf16 cast copies, every one kept from
  // its forward to its backward: four gather slots, each its unit's size (one bf16 copy of the model); two bf16
  // gradient slots (layers.3's 1040 and layers.2's 4224) and the fp32 cast, all-reduced in place
  const auto ddp = train<fsdp::policy<fsdp::sharding::no_shard, fsdp::prefetch::next, mixed<bfloat16>>>(4, "adamw")[3]
                       .memory.peak;
  CHECK(ddp[mem::gathered_params] == (1088 + 2080 + 4224 + 1040) * 2);
  CHECK(ddp[mem::comm_buffers] == (1040 + 4224) * 2 + 4224 * 4);
  CHECK(ddp[mem::sharded_params] == (1088 + 2080 + 4224 + 1040) * 4);
}

TEST_CASE("fp32 views over bf16 gathers, worked out by hand for 4 ranks: one fp32 slot and one bf16 wire slot") {
  // The units above at 4 ranks: padded 1088 | 2112 | 4224 | 1088, shards 272 | 528 | 1056 | 272.
  using F = fsdp::sharding::full_shard;
  const auto wire = train<fsdp::policy<F, fsdp::prefetch::none, fsdp::precision::wire<fsdp::bfloat16>>>(4, "adamw")[2];
  // the two gather slots (the first unit's 1088, kept into its backward, and the others', grown to the largest
  // unit's 4224) hold fp32 views, the wire slot (grown to the largest) the bf16 gather
  CHECK(wire.memory.peak[mem::gathered_params] == (1088 + 4224) * 4 + 4224 * 2);
  CHECK(wire.memory.peak[mem::sharded_params] == 2128 * 4);
  // fp32 gradients reduced in fp32: two gradient slots (1088 and 4224) and the fp32 output shard, no cast
  CHECK(wire.memory.peak[mem::comm_buffers] == (1088 + 4224) * 4 + 1056 * 4);
  CHECK(wire.planned[mem::gathered_params] == wire.memory.peak[mem::gathered_params]);
  // against fp32 gathers: the same views, half the gathered bytes on the wire, a bf16 slot more in memory
  const auto f32 = train<fsdp::policy<F, fsdp::prefetch::none>>(4, "adamw")[2];
  CHECK(wire.memory.peak[mem::gathered_params] - f32.memory.peak[mem::gathered_params] == 4224 * 2);
  CHECK(wire.memory.peak[mem::comm_buffers] == f32.memory.peak[mem::comm_buffers]);
}

TEST_CASE("bf16 views over fp8 gathers in blocks of 16, by hand for 4 ranks: a bf16 slot and a wire slot of values "
          "and scales") {
  using F = fsdp::sharding::full_shard;
  const auto r =
      train<fsdp::policy<F, fsdp::prefetch::none, fsdp::precision::scaled<fsdp::float8_e4m3, 16>>>(4, "adamw")[1];
  // two gather slots of bf16 views (the first unit's 1088, kept into its backward, and the others', grown to 4224);
  // one wire slot, grown to the largest unit: 4224 one-byte values and 4224 / 16 fp32 scales
  CHECK(r.memory.peak[mem::gathered_params] == (1088 + 4224) * 2 + 4224 + 4224 / 16 * 4);
  CHECK(r.planned[mem::gathered_params] == r.memory.peak[mem::gathered_params]);
  // the gradient side is mixed<bfloat16>'s: two bf16 gradient slots, the fp32 cast and the fp32 output shard
  CHECK(r.memory.peak[mem::comm_buffers] == (1088 + 4224) * 2 + 4224 * 4 + 1056 * 4);
}

TEST_CASE("gradients reduced in int8 blocks of 16, by hand for 4 ranks: a reduce input and output of four slices "
          "each") {
  using F = fsdp::sharding::full_shard;
  const auto r = train<
      fsdp::policy<F, fsdp::prefetch::none, fsdp::precision::scaled<std::int8_t, 16, fsdp::bfloat16, std::int8_t>>>(
      4, "adamw")[3];
  // two bf16 gradient slots (1088 and 4224); the input quantized per destination rank and the output received from
  // every rank, each grown to the largest unit's (shards of 1056): 4 slices of 1056 values and 1056 / 16 fp32 scales
  CHECK(r.memory.peak[mem::comm_buffers] == (1088 + 4224) * 2 + 2 * 4 * (1056 + 1056 / 16 * 4));
  CHECK(r.planned[mem::comm_buffers] == r.memory.peak[mem::comm_buffers]);
  // against mixed<bfloat16>'s fp32 cast (4224 x 4) and fp32 output shard (1056 x 4): 10560 bytes instead of 21120
  const auto m = train<fsdp::policy<F, fsdp::prefetch::none, fsdp::precision::scaled<std::int8_t, 16>>>(4, "adamw")[3];
  CHECK(m.memory.peak[mem::comm_buffers] - r.memory.peak[mem::comm_buffers] == 4224 * 4 + 1056 * 4 - 2 * 5280);
}

TEST_CASE("planned equals measured for a declared order other than the wrapping order") {
  fsdp::ModelSpec spec;
  spec.add("u0.w", {40}).add("u1.w", {300}).add("u2.w", {24}).add("u3.w", {130});
  fsdp::model_options mo;
  mo.forward_order = {"u2", "u0", "u3", "u1"};
  fsdp_test::run_ranks(3, [&](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>> m(
        c, spec, fsdp::wrap::by_prefix{"u"}, fsdp::init::normal{}, mo);
    fsdp::optim::adamw opt(m, {});
    for (int step = 0; step < 2; ++step) {
      for (auto& u : m.forward()) (void)u.param(u.name() + ".w");
      for (auto& u : m.backward()) u.grad(u.name() + ".w")[0] = 1.0f;
      opt.step();
    }
    m.synchronize();
    const auto measured = m.memory().peak;
    const auto planned = fsdp::plan_memory(m, opt.states_per_element()).peak;
    CHECK(measured == planned);
    // padded sizes at 3 ranks are u0 48, u1 336, u2 48, u3 144; one unit ahead holds two neighbours at once, beside
    // the first unit of the forward pass (u2 here), kept into its backward: three gather slots, u2's (48), u0's
    // (which u1 takes after it, 336) and u3's (144); every step takes them again as the first did
    CHECK(planned[mem::gathered_params] == (48 + 336 + 144) * 4);
    CHECK(fsdp::plan_memory(m, opt).max_units_gathered == 3);
    fsdp::model_options wrapping_order;
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>> w(
        c, spec, fsdp::wrap::by_prefix{"u"}, fsdp::init::normal{}, wrapping_order);
    // in the wrapping order: u0's (48), u1's (336, which u3 takes after it) and u2's (48)
    CHECK(fsdp::plan_memory(w, 2).peak[mem::gathered_params] == (48 + 336 + 48) * 4);
  });
}

TEST_CASE("the plan as a table, and the prediction for a model that has not run") {
  fsdp_test::run_ranks(4, [](local_communicator& c) {
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::none>> m(
        c, mlp::make_spec(cfg("adamw")), fsdp::wrap::by_prefix{"layers."});
    const fsdp::memory_plan p = fsdp::plan_memory(m, 2);
    CHECK(p.max_units_gathered == 2);
    // persistent (params, grads, two moments) + the slots, all made by the second unit of backward: two gathered
    // units (the first unit of the forward pass, 1088, kept into its backward by default, and the current one,
    // grown to the largest, 4224), two unsharded gradients (layers.3's 1088, layers.2's 4224) and one reduce-scatter
    // output shard (grown to the largest, 1056); and the optimizer's step block (256 B: its update count and rule)
    CHECK(p.peak.total == (2128 * 4) * 4 + ((1088 + 4224) + (1088 + 4224) + 1056) * 4 + 256);
    CHECK(p.between_steps == p.peak);  // the slots stay
    if (c.rank() == 0) {
      CHECK(p.table() ==
            "planned peak memory per rank (4 units, at most 2 gathered at once)\n"
            "  sharded params              8512 B       0.008 MiB\n"
            "  gathered params            21248 B       0.020 MiB\n"
            "  grads                       8512 B       0.008 MiB\n"
            "  optimizer state            17280 B       0.016 MiB\n"
            "  comm buffers               25472 B       0.024 MiB\n"
            "  total (at once)            81024 B       0.077 MiB\n");
    }
  });
}

TEST_CASE("the figures themselves, worked out by hand for 4 ranks") {
  // Per unit (align 16): elements 1088 | 2080 | 4224 | 1032; shards 272 | 528 | 1056 | 272;
  // padded 1088 | 2112 | 4224 | 1088. Bytes are 4 per element. A slot is made at the size of the unit that first
  // takes it, and grows when a larger unit finds only smaller slots given back. An optimizer's state holds its step
  // block too (256 B: its update count and rule, fsdp/optim/detail/step_block.hpp).
  const auto none = train<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::none>>(4, "adamw")[1].memory.peak;
  CHECK(none[mem::sharded_params] == 2128 * 4);
  CHECK(none[mem::grads] == 2128 * 4);
  CHECK(none[mem::optimizer_state] == 2 * 2128 * 4 + 256);
  CHECK(none[mem::gathered_params] == (1088 + 4224) * 4);  // the first unit (kept into its backward), one other slot
  CHECK(none[mem::comm_buffers] == (1088 + 4224 + 1056) * 4);  // two gradient slots + the reduce-scatter output
  const auto next = train<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>>(4, "sgd")[0].memory.peak;
  // a unit and its neighbour beside the first unit: at most layers.0, .1 and .2 at once, each in a slot of its size
  CHECK(next[mem::gathered_params] == (1088 + 2112 + 4224) * 4);
  CHECK(next[mem::optimizer_state] == 2128 * 4 + 256);  // one momentum buffer
  const auto sgo = train<fsdp::policy<fsdp::sharding::shard_grad_op>>(4, "adamw")[2].memory.peak;
  CHECK(sgo[mem::gathered_params] == (1088 + 2112 + 4224 + 1088) * 4);  // everything, kept until backward: one copy
  const auto ddp = train<fsdp::policy<fsdp::sharding::no_shard>>(4, "adamw")[3].memory.peak;
  CHECK(ddp[mem::sharded_params] == (1088 + 2080 + 4224 + 1040) * 4);  // full replicas (padded to 16)
  CHECK(ddp[mem::gathered_params] == 0);
  CHECK(ddp[mem::comm_buffers] == (1040 + 4224) * 4);  // two gradient slots (layers.3's, layers.2's), in place
}
