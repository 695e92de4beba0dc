// Model on the CUDA backend: the same scheduler as on the host, so the same training run gives the same bits.
// The "user compute" goes through the backend's own kernels (a gradient = parameter * a per-rank scale, via
// convert, in the compute dtype), so host and GPU runs do identical arithmetic and the final parameters must
// match exactly:
//   - comm::local<backend::cuda> with 4 ranks on one GPU against comm::local<> (host) with 4 thread ranks,
//     for full_shard (backward_pre<1>), shard_grad_op and no_shard, AdamW and SGD; bf16 and fp16 compute with
//     fp32, bf16 and fp16 reductions (the casts, the rank reductions and the accumulation are the shared
//     per-element code); no-sync and kept-gathered accumulation; pre/post division;
//   - gradient inspection on the GPU (CUB squared norms, one all-reduce): the same parameters, a norm within
//     1e-5 of the host's (CUB sums in another order), and an inf uploaded into one rank's shard skipped by all;
//   - comm::nccl at world size 1 (RANK/WORLD_SIZE/LOCAL_RANK set in-process) against the host at world 1;
//   - comm::local at 1, 2, 3, 4 and 5 ranks (uneven shards), every sharding strategy and prefetch policy;
//   - on a real GPU only: the pool does not grow after the first step, for units larger than its 2 MiB
//     granularity (device memory bounded by the plan; the host's model of the pool, tests/model/
//     memory_bound_test.cc, checks the same rules exactly; the simulator's pool figures are bookkeeping);
//   - a rank that never issues a collective fails the others within the timeout, naming it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.cuh>

#include <bit>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "gpu.hpp"

namespace {

using params_t = std::map<std::string, std::vector<float>>;

fsdp::ModelSpec spec() {
  fsdp::ModelSpec s;
  const int dims[] = {13, 32, 7, 5};
  for (int l = 0; l < 3; ++l) {
    s.add("layers." + std::to_string(l) + ".w", {dims[l + 1], dims[l]});
    s.add("layers." + std::to_string(l) + ".b", {dims[l + 1]}, {.flags = {.no_decay = true}});
  }
  return s;
}

std::int64_t pool_bytes(fsdp::backend::cuda& be) { return be.pool_reserved_bytes(); }
std::int64_t pool_bytes(fsdp::backend::host&) { return -1; }

struct run_result {
  params_t params;
  fsdp::memory_stats memory;
  fsdp::memory_figures planned;
  std::int64_t pool_after_first = -1, pool_after_last = -1;
  std::vector<fsdp::grad::report> reports;
};

/// Trains `steps` steps of `opt.accumulation.micro_batches` micro-batches: the gradient of every parameter is
/// param * 0.1 * (rank + 1), written in the compute dtype with the backend's convert kernel on the compute stream.
template <class Policy>
run_result train(typename Policy::communicator& comm, bool adam, int steps = 4, fsdp::model_options mo = {},
                 fsdp::grad::options g = {}) {
  const fsdp::dtype t = fsdp::dtype_of_v<typename Policy::precision::compute_type>;
  fsdp::Model<Policy> model(comm, spec(), fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{0.5f, 3}, mo);
  auto body = [&](auto& opt) {
    run_result r;
    r.planned = model.plan_memory(opt).peak;
    auto& be = model.backend();
    const float scale = 0.1f * float(comm.rank() + 1);
    for (int step = 0; step < steps; ++step) {
      opt.zero_grad();
      for (int mb = 0; mb < mo.accumulation.micro_batches; ++mb) {
        for (auto& u : model.forward()) (void)u;
        std::size_t l = 3;
        for (auto& u : model.backward()) {
          --l;
          for (const char* suffix : {".w", ".b"}) {
            const std::string name = "layers." + std::to_string(l) + suffix;
            auto p = u.param(name);
            be.convert(u.grad(name).data(), t, p.data(), t, p.numel(), scale, be.compute_stream());
          }
        }
      }
      r.reports.push_back(opt.step());
      model.synchronize();
      if (step == 0) r.pool_after_first = pool_bytes(be);
      r.pool_after_last = pool_bytes(be);
    }
    model.synchronize();
    r.memory = model.memory();
    r.params = model.gather_full_params();
    return r;
  };
  if (adam) {
    fsdp::optim::adamw opt(model, {.lr = 1e-2f, .weight_decay = 0.1f, .grad = g});
    return body(opt);
  }
  fsdp::optim::sgd opt(model, {.lr = 5e-2f, .momentum = 0.9f, .weight_decay = 0.01f, .grad = g});
  return body(opt);
}

template <class Sharding, class Prefetch, class Precision = fsdp::precision::full>
using host_policy = fsdp::policy<Sharding, Prefetch, Precision, fsdp::comm::local<>>;
template <class Sharding, class Prefetch, class Precision = fsdp::precision::full>
using gpu_policy = fsdp::policy<Sharding, Prefetch, Precision, fsdp::comm::local<fsdp::backend::cuda>>;

void check_same(const params_t& a, const params_t& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, va] : a) {
    CAPTURE(name);
    const auto& vb = b.at(name);
    REQUIRE(va.size() == vb.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < va.size(); ++i)
      if (std::bit_cast<std::uint32_t>(va[i]) != std::bit_cast<std::uint32_t>(vb[i])) ++bad;
    CHECK(bad == 0);
  }
}

template <class Sharding, class Prefetch, class Precision = fsdp::precision::full>
void compare_local(int world, bool adam, fsdp::model_options mo = {}, fsdp::grad::options g = {}) {
  std::mutex mu;
  std::vector<run_result> host(world), gpu(world);
  fsdp::comm::run_local(world, [&](fsdp::comm::local_communicator& c) {
    auto r = train<host_policy<Sharding, Prefetch, Precision>>(c, adam, 4, mo, g);
    std::lock_guard lk(mu);
    host[c.rank()] = std::move(r);
  });
  fsdp::comm::local_cuda_options opt;
  opt.timeout = std::chrono::milliseconds(10000);
  fsdp::comm::run_local_cuda(world, [&](fsdp::comm::local_cuda_communicator& c) {
    auto r = train<gpu_policy<Sharding, Prefetch, Precision>>(c, adam, 4, mo, g);
    std::lock_guard lk(mu);
    gpu[c.rank()] = std::move(r);
  }, opt);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    check_same(gpu[r].params, host[r].params);
    REQUIRE(gpu[r].reports.size() == host[r].reports.size());
    for (std::size_t s = 0; s < host[r].reports.size(); ++s) {  // the norm: CUB's order against the host's double sum
      CHECK(gpu[r].reports[s].skipped == host[r].reports[s].skipped);
      CHECK(std::abs(gpu[r].reports[s].norm - host[r].reports[s].norm) <= 1e-5 * host[r].reports[s].norm);
    }
  }
}

}  // namespace

TEST_CASE("comm::local on one GPU, 1 to 5 ranks: parameters equal the host run bit for bit") {
  FSDP_REQUIRE_GPU();
  using fsdp::sharding::full_shard;
  namespace prefetch = fsdp::prefetch;
  SUBCASE("full_shard, backward_pre<1>, AdamW, 4 ranks") { compare_local<full_shard, prefetch::backward_pre<1>>(4, true); }
  SUBCASE("full_shard, none, SGD, 4 ranks") { compare_local<full_shard, prefetch::none>(4, false); }
  SUBCASE("shard_grad_op, next, AdamW, 4 ranks") { compare_local<fsdp::sharding::shard_grad_op, prefetch::next>(4, true); }
  SUBCASE("no_shard, forward<2>, AdamW, 4 ranks") { compare_local<fsdp::sharding::no_shard, prefetch::forward<2>>(4, true); }
  SUBCASE("full_shard, next, AdamW, 3 ranks (uneven shards)") { compare_local<full_shard, prefetch::next>(3, true); }
  SUBCASE("full_shard, backward_post, SGD, 2 ranks") { compare_local<full_shard, prefetch::backward_post>(2, false); }
  SUBCASE("full_shard, next, AdamW, 1 rank") { compare_local<full_shard, prefetch::next>(1, true); }
  SUBCASE("full_shard, backward_pre<2>, AdamW, 5 ranks (uneven shards, a unit smaller than some shards)") {
    compare_local<full_shard, prefetch::backward_pre<2>>(5, true);
  }
  SUBCASE("full_shard, explicit_schedule, 2 gather slots, one gradient slot, SGD, 3 ranks") {
    fsdp::model_options ex;
    ex.prefetch.forward["layers.0"] = {"layers.1"};
    ex.prefetch.backward["layers.2"] = {"layers.1"};
    ex.gather_slots = 2;
    ex.grad_slots = 1;
    compare_local<full_shard, prefetch::explicit_schedule>(3, false, ex);
  }
}

TEST_CASE("comm::local on one GPU: mixed precision and accumulation equal the host run bit for bit") {
  FSDP_REQUIRE_GPU();
  using fsdp::bfloat16;
  using fsdp::float16;
  using fsdp::precision::mixed;
  using fsdp::sharding::full_shard;
  fsdp::model_options nosync;
  nosync.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};
  fsdp::model_options kept;
  kept.accumulation = {.micro_batches = 2, .keep_gathered = true};
  kept.division.how = fsdp::grad_division::mode::pre_post;
  SUBCASE("bf16 compute, fp32 reduction, AdamW, 4 ranks") { compare_local<full_shard, fsdp::prefetch::next, mixed<bfloat16>>(4, true); }
  SUBCASE("bf16 compute and reduction, no-sync, SGD, 3 ranks") {
    compare_local<full_shard, fsdp::prefetch::backward_pre<1>, mixed<bfloat16, float, bfloat16>>(3, false, nosync);
  }
  SUBCASE("fp16 compute and reduction, kept gathered, pre/post division, AdamW, 4 ranks") {
    compare_local<fsdp::sharding::shard_grad_op, fsdp::prefetch::next, mixed<float16, float, float16>>(4, true, kept);
  }
  SUBCASE("no_shard in bf16 (cast copies), AdamW, 2 ranks") { compare_local<fsdp::sharding::no_shard, fsdp::prefetch::next, mixed<bfloat16>>(2, true); }
  SUBCASE("CUDA's own types name the precision: __nv_bfloat16") {
    compare_local<full_shard, fsdp::prefetch::next, mixed<__nv_bfloat16, float, __nv_bfloat16>>(2, false);
  }
  SUBCASE("gradient inspection (CUB norms, one all-reduce), located, 4 ranks") {
    compare_local<full_shard, fsdp::prefetch::next, mixed<bfloat16>>(4, true, {}, {.skip_nonfinite = true, .locate_nonfinite = true});
  }
}

TEST_CASE("on a real GPU, the pool does not grow after the first step: units beyond its 2 MiB granularity") {
  FSDP_REQUIRE_GPU();
  if (fsdp_test::simulated_gpu()) {
    // not a skip of the whole program: this one case needs a real device, and says so
    MESSAGE("needs a real GPU: the simulator's pool figures are bookkeeping, and 4 MiB units are too slow there");
    std::printf("needs a real GPU: pool growth after the first step\n");
    return;
  }
  using P = gpu_policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
  fsdp::ModelSpec big;
  for (int l = 0; l < 4; ++l) big.add("layers." + std::to_string(l) + ".w", {1024, 2048});  // 8 MiB fp32 each
  std::mutex mu;
  std::vector<std::int64_t> first(2), last(2), planned(2);
  fsdp::model_options mo;
  mo.accumulation = {.micro_batches = 2, .sync = fsdp::grad_sync::last_micro_batch};  // accumulators come and go
  fsdp::comm::run_local_cuda(2, [&](fsdp::comm::local_cuda_communicator& c) {
    fsdp::Model<P> m(c, big, fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{0.02f, 1}, mo);
    fsdp::optim::adamw opt(m, {.lr = 1e-3f, .grad = {.max_norm = 1.0f}});
    auto& be = m.backend();
    std::int64_t f = 0, l = 0;
    for (int step = 0; step < 3; ++step) {
      for (int mb = 0; mb < 2; ++mb) {
        for (auto& u : m.forward()) (void)u;
        for (auto& u : m.backward()) {
          const std::string name = u.name() + ".w";
          auto p = u.param(name);
          be.convert(u.grad(name).data(), fsdp::dtype::bf16, p.data(), fsdp::dtype::bf16, p.numel(), 0.5f,
                     be.compute_stream());
        }
      }
      opt.step();
      opt.zero_grad();
      m.synchronize();
      (step == 0 ? f : l) = be.pool_reserved_bytes();
    }
    std::lock_guard lk(mu);
    first[c.rank()] = f;
    last[c.rank()] = l;
    planned[c.rank()] = m.plan_memory(opt).peak.total;
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(last[r] == first[r]);
    CHECK(first[r] >= planned[r]);  // the reservation covers the plan (rounded up to the pool's granularity)
  }
}

TEST_CASE("comm::local on one GPU: an inf uploaded into one rank's gradient shard skips the step on every rank") {
  FSDP_REQUIRE_GPU();
  using P = gpu_policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
  std::mutex mu;
  std::vector<fsdp::grad::report> reports(3);
  std::vector<bool> unchanged(3, false);
  fsdp::comm::run_local_cuda(3, [&](fsdp::comm::local_cuda_communicator& c) {
    fsdp::Model<P> m(c, spec(), fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{0.5f, 3});
    fsdp::optim::adamw opt(m, {.lr = 1e-2f, .grad = {.locate_nonfinite = true}});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    m.synchronize();
    auto& be = m.backend();
    if (c.rank() == 1) {
      const float inf = std::numeric_limits<float>::infinity();
      be.upload(m.unit("layers.1").grad_shard() + 2, &inf, 4, be.compute_stream());
    }
    const auto before = m.gather_full_params();
    const fsdp::grad::report r = opt.step();
    const auto after = m.gather_full_params();
    std::lock_guard lk(mu);
    reports[c.rank()] = r;
    unchanged[c.rank()] = before == after && opt.steps() == 0;
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(reports[r].skipped);
    CHECK(unchanged[r]);
    REQUIRE(reports[r].nonfinite);
    CHECK(reports[r].nonfinite->rank == 1);
    CHECK(reports[r].nonfinite->unit_name == "layers.1");
  }
}

TEST_CASE("comm::nccl at world size 1 from the environment: equals the host run bit for bit") {
  FSDP_REQUIRE_GPU();
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  fsdp::comm::nccl_options opt;
  opt.timeout = std::chrono::milliseconds(10000);
  auto comm = fsdp::comm::nccl::from_env(opt);
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::backward_pre<1>, fsdp::precision::full, fsdp::comm::nccl>;
  const run_result gpu = train<P>(comm, true);
  run_result host;
  fsdp::comm::run_local(1, [&](fsdp::comm::local_communicator& c) {
    host = train<host_policy<fsdp::sharding::full_shard, fsdp::prefetch::backward_pre<1>>>(c, true);
  });
  check_same(gpu.params, host.params);
  CHECK(gpu.memory.peak == gpu.planned);
  const fsdp::collective_stats st = comm.stats();
  CHECK(st[fsdp::collective::all_gather] == 4 * (3 + 3) + 3);  // forward + backward per step, then gather_full_params
  CHECK(st[fsdp::collective::reduce_scatter] == 4 * 3);
  comm.barrier();
  // Grouped calls: one NCCL launch for both; at world 1 an all-reduce and a broadcast leave the value as it is.
  fsdp::backend::cuda be(0, comm.backend_options());
  auto buf = be.allocate(8, fsdp::mem::comm_buffers, be.reduce_stream());
  const float two[2] = {2.5f, -1.0f};
  be.upload(buf.data(), two, 8, be.reduce_stream());
  comm.grouped([&] {
    comm.all_reduce(buf.data(), buf.data(), 1, fsdp::dtype::f32, fsdp::reduce_op::sum, be.reduce_stream());
    comm.broadcast(buf.as<float>() + 1, buf.as<float>() + 1, 1, fsdp::dtype::f32, 0, be.reduce_stream());
  });
  float back[2] = {0, 0};
  be.download(back, buf.data(), 8, be.reduce_stream());
  be.synchronize(be.reduce_stream());
  CHECK(back[0] == 2.5f);
  CHECK(back[1] == -1.0f);
  CHECK(comm.stats()[fsdp::collective::broadcast] == 1);
}

TEST_CASE("comm::local on one GPU: a rank that never issues a collective fails the others, named") {
  FSDP_REQUIRE_GPU();
  fsdp::comm::local_cuda_options opt;
  opt.timeout = std::chrono::milliseconds(200);
  std::string what;
  try {
    fsdp::comm::run_local_cuda(2, [&](fsdp::comm::local_cuda_communicator& c) {
      if (c.rank() == 1) return;  // never issues
      fsdp::backend::cuda be(0, c.backend_options());
      auto buf = be.allocate(64, fsdp::mem::comm_buffers, be.gather_stream());
      c.all_gather(buf.data(), buf.data(), 8, fsdp::dtype::f32, be.gather_stream());
    }, opt);
  } catch (const fsdp::comm_error& e) {
    what = e.what();
  }
  CHECK(what == "fsdp: local all_gather(count=8, f32) #0 on rank 0 timed out after 200 ms waiting for the other "
                "ranks: rank(s) 1 never issued it");
}
