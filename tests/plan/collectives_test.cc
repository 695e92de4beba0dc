// The collectives a model issues, written once (fsdp/plan/collectives.hpp): each unit's gather, reduction and
// replica all-reduce for every kind of precision and sharding, every group's list, and a Model that hands each
// group's list to its communicator's connect() before it issues any of them (comm::nccl makes NCCL's lazily made
// connections there, before the memory plan is reserved), the ones the executor and the optimizer then issue all
// among them.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/plan/collectives.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace {

using fsdp::collective;
using fsdp::collective_use;
using fsdp::dtype;

/// "all_gather(256, bf16)"
std::string str(const collective_use& u) {
  return std::string(fsdp::name_of(u.kind)) + "(" + std::to_string(u.count) + ", " +
         std::string(fsdp::name_of(u.type)) + ")";
}
std::string str(const std::vector<collective_use>& v) {
  std::string s;
  for (const collective_use& u : v) s += (s.empty() ? "" : ", ") + str(u);
  return s;
}

/// Unit costs of two units of 1000 and 24 elements, sharded over `ranks`, under `precision` and `shards`.
std::vector<fsdp::plan::unit_costs> costs(int ranks, const fsdp::precision_facts& precision, bool shards = true) {
  fsdp::ModelSpec spec;
  spec.add("a.w", {1000}).add("b.w", {24});
  const fsdp::planned_units u = fsdp::plan_units(
      "two", spec, fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }}, ranks);
  std::vector<fsdp::plan::unit_costs> out;
  for (const fsdp::FlatLayout& l : u.layouts)
    out.push_back(fsdp::plan::costs_of(l, fsdp::plan::make_cost_facts(precision, shards, {})));
  return out;
}

}  // namespace

TEST_CASE("each unit's collectives: gathers in the gather dtype, reductions in the reduce dtype, by strategy") {
  const auto mixed = fsdp::facts_of_precision<fsdp::precision::mixed<fsdp::bfloat16>>();
  const auto c = costs(4, mixed);
  REQUIRE(c.size() == 2);
  const fsdp::plan::cost_facts f = fsdp::plan::make_cost_facts(mixed, true, {});
  // unit a: 1000 elements padded to 1024 over 4 ranks, a shard of 256: gathered in bf16, reduced in fp32
  CHECK(str(*fsdp::plan::gather_use(c[0], f)) == "all_gather(256, bf16)");
  CHECK(str(fsdp::plan::reduction_use(c[0], f)) == "reduce_scatter(256, f32)");
  CHECK(str(*fsdp::plan::replica_use(c[0])) == "all_reduce(256, f32)");

  // replicated parameters (no_shard): no gather collective, one all-reduce of the whole buffer, no replica all-reduce
  const fsdp::plan::cost_facts ns = fsdp::plan::make_cost_facts(mixed, false, {});
  const auto r = costs(1, mixed, false);
  CHECK_FALSE(fsdp::plan::gather_use(r[0], ns));
  CHECK(str(fsdp::plan::reduction_use(r[0], ns)) == "all_reduce(1008, f32)");  // 1000 padded to 16
  CHECK_FALSE(fsdp::plan::replica_use(r[0]));

  // fp8 gathers and int8 reductions in blocks of 16: each rank's values and its 16 fp32 scales as bytes
  const auto q = fsdp::facts_of_precision<
      fsdp::precision::scaled<fsdp::float8_e4m3, 16, fsdp::bfloat16, std::int8_t>>();
  const fsdp::plan::cost_facts qf = fsdp::plan::make_cost_facts(q, true, {});
  const auto qc = costs(4, q);
  CHECK(str(*fsdp::plan::gather_use(qc[0], qf)) == "all_gather(320, f8e4m3)");
  CHECK(str(fsdp::plan::reduction_use(qc[0], qf)) == "all_to_all(320, i8)");
}

TEST_CASE(
    "every group's list: distinct and sorted, the world's one-element all-reduce and the norms' with inspection") {
  const auto mixed = fsdp::facts_of_precision<fsdp::precision::mixed<fsdp::bfloat16>>();
  const fsdp::plan::cost_facts f = fsdp::plan::make_cost_facts(mixed, true, {});
  const auto c = costs(4, mixed);  // shards of 256 (a) and 16 (b: 24 elements padded to 64)
  const fsdp::plan::group_collectives g = fsdp::plan::step_collectives(c, f, true, fsdp::plan::norm_count(2, 1));
  CHECK(str(g.world) == "all_reduce(1, f32), all_reduce(2, f32)");
  CHECK(str(g.shard) ==
        "all_gather(16, bf16), all_gather(256, bf16), reduce_scatter(16, f32), reduce_scatter(256, f32)");
  CHECK(str(g.replicas) == "all_reduce(16, f32), all_reduce(256, f32)");
  // without replicas or inspection
  const fsdp::plan::group_collectives h = fsdp::plan::step_collectives(c, f, false);
  CHECK(str(h.world) == "all_reduce(1, f32)");
  CHECK(h.replicas.empty());
  // what a later call adds: only what was not handed over before
  std::vector<collective_use> have = h.world;
  CHECK(str(fsdp::plan::not_yet(g.world, have)) == "all_reduce(2, f32)");
  CHECK(str(have) == "all_reduce(1, f32), all_reduce(2, f32)");
  CHECK(fsdp::plan::not_yet(g.world, have).empty());
}

namespace {

/// What a recording communicator saw: its group, whether a connect() list or an issued collective, and the use.
struct seen {
  std::string group;
  bool connect;
  collective_use use;
};
struct record_log {
  std::mutex mu;
  std::vector<seen> entries;
  void add(const std::string& group, bool connect, const collective_use& u) {
    std::lock_guard lk(mu);
    entries.push_back({group, connect, u});
  }
};

/// comm::local with connect() and a record of every collective, by group: the world, and the groups its first and
/// second split make ("shard" and "replicas": Model splits in that order).
class recording_communicator {
 public:
  using backend_type = fsdp::backend::host;
  using stream = backend_type::stream;

  /// `make()` gives the comm::local group it records (a prvalue: local_communicator does not move).
  template <class Make>
  recording_communicator(Make&& make, std::string group, std::shared_ptr<record_log> l)
      : inner_(make()), group_(std::move(group)), log_(std::move(l)) {}

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }
  const fsdp::backend::host_options& backend_options() const noexcept { return inner_.backend_options(); }
  fsdp::collective_stats stats() const { return inner_.stats(); }
  void barrier() { inner_.barrier(); }

  void all_gather(const void* send, void* recv, std::int64_t n, dtype t, stream& s) {
    note(collective::all_gather, n, t);
    inner_.all_gather(send, recv, n, t, s);
  }
  void reduce_scatter(const void* send, void* recv, std::int64_t n, dtype t, fsdp::reduce_op op, stream& s) {
    note(collective::reduce_scatter, n, t);
    inner_.reduce_scatter(send, recv, n, t, op, s);
  }
  void all_reduce(const void* send, void* recv, std::int64_t n, dtype t, fsdp::reduce_op op, stream& s) {
    note(collective::all_reduce, n, t);
    inner_.all_reduce(send, recv, n, t, op, s);
  }
  void broadcast(const void* send, void* recv, std::int64_t n, dtype t, int root, stream& s) {
    note(collective::broadcast, n, t);
    inner_.broadcast(send, recv, n, t, root, s);
  }
  recording_communicator split(int color, int key) {
    return recording_communicator([&] { return inner_.split(color, key); }, splits_++ == 0 ? "shard" : "replicas",
                                  log_);
  }
  void connect(const std::vector<collective_use>& uses) {
    for (const collective_use& u : uses) log_->add(group_, true, u);
  }
  std::int64_t connect_bytes() const { return 0; }  // it records; nothing is taken

 private:
  void note(collective k, std::int64_t n, dtype t) { log_->add(group_, false, {k, n, t}); }

  fsdp::comm::local_communicator inner_;
  std::string group_;
  std::shared_ptr<record_log> log_;
  int splits_ = 0;
};
// The Model hands its lists only to a ConnectingCollective: were this one not, the test below would see no list.
static_assert(fsdp::ConnectingCollective<recording_communicator>);
static_assert(fsdp::CollectivePolicy<recording_communicator>);

struct recording {
  using backend_type = fsdp::backend::host;
  using communicator = recording_communicator;
};

}  // namespace

TEST_CASE("a Model hands each group its collectives before issuing any, and issues none it did not hand over") {
  // hybrid_shard<2> at 4 ranks in bf16 with fp32 reductions, AdamW clipping by the global norm (its inspection's
  // norms all-reduced over the world): units a (1000 elements, shards of 512) and b (24, padded to shards of 16).
  fsdp::ModelSpec spec;
  spec.add("a.w", {1000}).add("b.w", {24});
  using P = fsdp::policy<fsdp::sharding::hybrid_shard<2>, fsdp::prefetch::next,
                         fsdp::precision::mixed<fsdp::bfloat16>, recording>;
  std::vector<std::shared_ptr<record_log>> logs(4);
  for (auto& l : logs) l = std::make_shared<record_log>();
  fsdp_test::run_ranks(4, [&](fsdp::comm::local_communicator& c) {
    recording_communicator comm([&] { return c.split(0, c.rank()); }, "world",
                                logs[static_cast<std::size_t>(c.rank())]);
    fsdp::Model<P> model(comm, spec,
                         fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }});
    fsdp::optim::adamw opt(model, {.lr = 1e-3f, .grad = {.max_norm = 1.0f}});
    for (int step = 0; step < 2; ++step) {
      for (auto& unit : model.forward()) (void)unit;
      for (auto& unit : model.backward()) (void)unit;  // zero gradients: a norm of 0, the step still inspects
      opt.step();
      opt.zero_grad();
    }
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    std::vector<collective_use> connected[3];  // world, shard, replicas
    auto at = [](const std::string& g) { return g == "world" ? 0 : g == "shard" ? 1 : 2; };
    std::size_t first_issue = logs[r]->entries.size(), last_connect = 0;
    for (std::size_t i = 0; i < logs[r]->entries.size(); ++i) {
      const seen& e = logs[r]->entries[i];
      if (e.connect) {
        connected[at(e.group)].push_back(e.use);
        last_connect = i;
      } else if (first_issue == logs[r]->entries.size() && e.group != "world") {
        first_issue = i;
      }
    }
    // the world's: the trainer's one-element all-reduce, the step's commit in the gradient's dtype (handed over at
    // construction, before the model knows its optimizer inspects and commits with its norms), the norms
    CHECK(str(connected[0]) == "all_reduce(1, f32), all_reduce(1, bf16), all_reduce(2, f32)");
    CHECK(str(connected[1]) ==
          "all_gather(16, bf16), all_gather(512, bf16), reduce_scatter(16, f32), reduce_scatter(512, f32)");
    CHECK(str(connected[2]) == "all_reduce(16, f32), all_reduce(512, f32)");
    CHECK(last_connect < first_issue);  // all handed over before the first step's first gather
    // every collective issued on a group was handed to that group (the world's agreement all-gathers at
    // construction come before any list, and are not the step's)
    bool step_started = false;
    for (const seen& e : logs[r]->entries) {
      if (e.connect) continue;
      if (e.group != "world") step_started = true;
      if (!step_started) continue;
      CAPTURE(e.group);
      CAPTURE(str(e.use));
      const auto& have = connected[at(e.group)];
      CHECK(std::find(have.begin(), have.end(), e.use) != have.end());
    }
  }
}
