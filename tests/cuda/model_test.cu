// Model on the CUDA backend: the same scheduler as on the host, so the same training run gives the same bits.
// The "user compute" goes through the backend's own kernels (a gradient = parameter * a per-rank scale, via
// convert), so host and GPU runs do identical arithmetic and the final parameters must match exactly:
//   - comm::local<backend::cuda> with 4 ranks on one GPU against comm::local<> (host) with 4 thread ranks,
//     for full_shard (backward_pre<1>), shard_grad_op and no_shard, AdamW and SGD;
//   - comm::nccl at world size 1 (RANK/WORLD_SIZE/LOCAL_RANK set in-process) against the host at world 1;
//   - the planner's peak equals the measured peak on the GPU, and the pool does not grow after the first step;
//   - a rank that never issues a collective fails the others within the timeout, naming it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.cuh>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
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
};

/// Trains `steps` steps: the gradient of every parameter is param * 0.1 * (rank + 1), written with the backend's
/// convert kernel on the compute stream.
template <class Policy>
run_result train(typename Policy::communicator& comm, bool adam, int steps = 4) {
  fsdp::Model<Policy> model(comm, spec(), fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{0.5f, 3});
  auto body = [&](auto& opt) {
    run_result r;
    r.planned = model.planned_memory(opt.states_per_element());
    auto& be = model.backend();
    const float scale = 0.1f * float(comm.rank() + 1);
    for (int step = 0; step < steps; ++step) {
      opt.zero_grad();
      for (auto& u : model.forward()) (void)u;
      std::size_t l = 3;
      for (auto& u : model.backward()) {
        --l;
        for (const char* suffix : {".w", ".b"}) {
          const std::string name = "layers." + std::to_string(l) + suffix;
          auto p = u.param(name);
          be.convert(u.grad(name).data(), fsdp::dtype::f32, p.data(), fsdp::dtype::f32, p.numel(), scale,
                     be.compute_stream());
        }
      }
      opt.step();
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
    fsdp::optim::adamw opt(model, {.lr = 1e-2f, .weight_decay = 0.1f});
    return body(opt);
  }
  fsdp::optim::sgd opt(model, {.lr = 5e-2f, .momentum = 0.9f, .weight_decay = 0.01f});
  return body(opt);
}

template <class Sharding, class Prefetch>
using host_policy = fsdp::policy<Sharding, Prefetch, fsdp::precision::full, fsdp::comm::local<>>;
template <class Sharding, class Prefetch>
using gpu_policy = fsdp::policy<Sharding, Prefetch, fsdp::precision::full, fsdp::comm::local<fsdp::backend::cuda>>;

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

template <class Sharding, class Prefetch>
void compare_local(int world, bool adam) {
  std::mutex mu;
  std::vector<run_result> host(world), gpu(world);
  fsdp::comm::run_local(world, [&](fsdp::comm::local_communicator& c) {
    auto r = train<host_policy<Sharding, Prefetch>>(c, adam);
    std::lock_guard lk(mu);
    host[c.rank()] = std::move(r);
  });
  fsdp::comm::local_cuda_options opt;
  opt.timeout = std::chrono::milliseconds(10000);
  fsdp::comm::run_local_cuda(world, [&](fsdp::comm::local_cuda_communicator& c) {
    auto r = train<gpu_policy<Sharding, Prefetch>>(c, adam);
    std::lock_guard lk(mu);
    gpu[c.rank()] = std::move(r);
  }, opt);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    check_same(gpu[r].params, host[r].params);
    CHECK(gpu[r].memory.peak == gpu[r].planned);   // the planner is exact on the GPU too
    CHECK(gpu[r].memory.peak == host[r].memory.peak);
    CHECK(gpu[r].pool_after_last == gpu[r].pool_after_first);  // no step grows the pool
  }
}

}  // namespace

TEST_CASE("comm::local on one GPU, 4 ranks: parameters equal the host run bit for bit") {
  FSDP_REQUIRE_GPU();
  SUBCASE("full_shard, backward_pre<1>, AdamW") { compare_local<fsdp::sharding::full_shard, fsdp::prefetch::backward_pre<1>>(4, true); }
  SUBCASE("full_shard, none, SGD") { compare_local<fsdp::sharding::full_shard, fsdp::prefetch::none>(4, false); }
  SUBCASE("shard_grad_op, next, AdamW") { compare_local<fsdp::sharding::shard_grad_op, fsdp::prefetch::next>(4, true); }
  SUBCASE("no_shard, forward<2>, AdamW") { compare_local<fsdp::sharding::no_shard, fsdp::prefetch::forward<2>>(4, true); }
  SUBCASE("full_shard, 3 ranks (uneven shards), AdamW") { compare_local<fsdp::sharding::full_shard, fsdp::prefetch::next>(3, true); }
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
