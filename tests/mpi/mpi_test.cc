// comm::mpi under mpirun (4 processes; tests/mpi/run_mpi_test.sh starts them): every collective gives comm::local's
// bits, a Model trains exactly as on comm::local, and a peer that returns or dies makes the others fail in bounded
// time with the collective named. Each process computes comm::local's answer itself: comm::run_local at world 4 over
// every rank's inputs (they are a pure function of the rank), then compares its own MPI result with its rank's.
//
// Every process runs the same test cases in the same order (collectives must match). The "failure" suite is
// skipped unless asked for by name (--test-case=... --no-skip): its cases make a process return early or kill
// itself, so run_mpi_test.sh starts each of them in its own mpirun with --enable-recovery. The "launch" case runs
// without mpirun.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fsdp/comm/mpi.hpp>
#include "tests/support/listener.hpp"
#if __has_include(<nlohmann/json.hpp>) && __has_include(<xxhash.h>)  // the GPU machine has no nlohmann-json
#define FSDP_TEST_CHECKPOINTS 1
#include <fsdp/checkpoint/checkpoint.hpp>
#endif
#include <fsdp/fsdp.hpp>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/capture.hpp"
#include "tests/support/moe.hpp"
#include "tests/support/support.hpp"

namespace {

using fsdp::collective;
using fsdp::dtype;
using fsdp::reduce_op;
using fsdp::comm::local_communicator;
using fsdp::comm::mpi_communicator;
using clock_type = std::chrono::steady_clock;

constexpr int kWorld = 4;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// ---- inputs: a pure function of (rank, salt, index), of mixed magnitudes so that the order of the additions shows
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float value(int rank, int salt, std::size_t i) {
  const std::uint64_t h = mix(mix(std::uint64_t(rank) * 1000003u + std::uint64_t(salt)) ^ i);
  const float unit = float(h >> 40) / float(1u << 24) - 0.5f;  // [-0.5, 0.5)
  const int exponent = int((h >> 8) % 17) - 8;                 // 2^-8 .. 2^8
  return std::ldexp(unit, exponent);
}
/// n elements of dtype t for `rank`, as bytes.
std::vector<unsigned char> input(dtype t, int rank, int salt, std::size_t n) {
  std::vector<unsigned char> out(n * fsdp::size_of(t));
  fsdp::kernels::dispatch(t, [&](auto d) {
    auto* p = reinterpret_cast<fsdp::lowp::storage_t<d()>*>(out.data());
    for (std::size_t i = 0; i < n; ++i) p[i] = fsdp::lowp::from_float<d()>(value(rank, salt, i));
  });
  return out;
}

/// One collective as the test issues it: kind, dtype, op, count (comm's meaning), root, in-place or not.
struct op {
  collective kind;
  dtype type;
  reduce_op rop = reduce_op::sum;
  std::int64_t count = 0;
  int root = 0;
  bool in_place = false;
  std::string str() const {
    return std::string(fsdp::name_of(kind)) + "(" + std::string(fsdp::name_of(type)) + ", " +
           std::string(fsdp::name_of(rop)) + ", count " + std::to_string(count) + ", root " + std::to_string(root) +
           (in_place ? ", in place)" : ")");
  }
};

/// Issues `o` on `comm` and stream `s` of `be` for this rank's inputs (salt `salt`), waits, returns recv's bytes.
template <class Comm>
std::vector<unsigned char> run_one(Comm& comm, fsdp::backend::host& be, fsdp::backend::host::stream& s, const op& o,
                                   int salt) {
  const int world = comm.size(), rank = comm.rank();
  const std::size_t es = fsdp::size_of(o.type), n = static_cast<std::size_t>(o.count);
  const std::size_t send_n = o.kind == collective::reduce_scatter || o.kind == collective::all_to_all ? n * world : n;
  const std::size_t recv_n = o.kind == collective::all_gather || o.kind == collective::all_to_all ? n * world : n;
  std::vector<unsigned char> send = input(o.type, rank, salt, send_n);
  std::vector<unsigned char> recv(std::max(recv_n, send_n) * es, 0xAB);  // room for in-place reduce-scatter
  const void* sp = send.data();
  if (o.in_place) {  // the aliasings the concept requires (and NCCL's in-place reduce-scatter)
    switch (o.kind) {
      case collective::all_gather:
        std::memcpy(recv.data() + rank * n * es, send.data(), n * es);
        sp = recv.data() + rank * n * es;
        break;
      case collective::reduce_scatter:
        std::memcpy(recv.data(), send.data(), send.size());
        sp = recv.data();
        break;
      case collective::all_reduce:
      case collective::broadcast:
        std::memcpy(recv.data(), send.data(), send.size());
        sp = recv.data();
        break;
      case collective::all_to_all:  // never in place (AllToAllCollective)
      case collective::all_to_all_v:  // not issued here: its own test case below
        break;
    }
  }
  void* rp = o.in_place && o.kind == collective::reduce_scatter ? recv.data() + rank * n * es : recv.data();
  switch (o.kind) {
    case collective::all_gather:
      comm.all_gather(sp, rp, o.count, o.type, s);
      break;
    case collective::reduce_scatter:
      comm.reduce_scatter(sp, rp, o.count, o.type, o.rop, s);
      break;
    case collective::all_reduce:
      comm.all_reduce(sp, rp, o.count, o.type, o.rop, s);
      break;
    case collective::broadcast:
      comm.broadcast(sp, rp, o.count, o.type, o.root, s);
      break;
    case collective::all_to_all:
      comm.all_to_all(sp, rp, o.count, o.type, s);
      break;
    case collective::all_to_all_v:  // its own test case below
      FAIL("run_one does not issue all_to_all_v");
      break;
  }
  be.synchronize(s);
  const unsigned char* r = static_cast<const unsigned char*>(rp);
  return std::vector<unsigned char>(r, r + recv_n * es);
}

std::vector<op> every_op() {
  std::vector<op> ops;
  for (const fsdp::dtype_row& row : fsdp::dtype_rows) {  // every dtype, fp8 too (one byte: MPI_UINT8_T)
    const dtype t = row.tag;
    // 0 and 1 element, uneven, and all_reduce on both sides of comm::mpi's 32 KiB switch (gather-all vs two-phase,
    // with uneven chunks at 20001)
    for (std::int64_t n : {0, 1, 3, 8, 1000, 20001}) {
      for (bool in_place : {false, true}) {
        ops.push_back({collective::all_gather, t, reduce_op::sum, n, 0, in_place});
        for (reduce_op r : {reduce_op::sum, reduce_op::avg}) {
          ops.push_back({collective::reduce_scatter, t, r, n, 0, in_place});
          ops.push_back({collective::all_reduce, t, r, n, 0, in_place});
        }
        for (int root : {0, 3}) ops.push_back({collective::broadcast, t, reduce_op::sum, n, root, in_place});
      }
      ops.push_back({collective::all_to_all, t, reduce_op::sum, n, 0, false});
    }
  }
  return ops;
}

/// comm::local's results: per op, per rank.
std::vector<std::vector<std::vector<unsigned char>>> local_results(const std::vector<op>& ops) {
  std::vector<std::vector<std::vector<unsigned char>>> out(ops.size(), std::vector<std::vector<unsigned char>>(kWorld));
  fsdp_test::run_ranks(kWorld, [&](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    for (std::size_t k = 0; k < ops.size(); ++k)
      out[k][static_cast<std::size_t>(c.rank())] = run_one(c, be, be.gather_stream(), ops[k], int(k));
  });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("every collective, dtype and op gives comm::local's bits at world 4, in place or not") {
  REQUIRE(world_rank() < kWorld);
  mpi_communicator comm;
  REQUIRE(comm.size() == kWorld);
  REQUIRE(comm.rank() == world_rank());
  const int rank = comm.rank();
  const std::vector<op> ops = every_op();
  const auto ref = local_results(ops);
  fsdp::backend::host be(rank);
  fsdp::backend::host::stream* streams[] = {&be.gather_stream(), &be.reduce_stream(), &be.compute_stream()};
  int compared = 0;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const op& o = ops[k];
    CAPTURE(o.str());
    // each op on one of the three streams: worker threads and the inline compute stream
    const auto got = run_one(comm, be, *streams[k % 3], o, int(k));
    const auto& want = ref[k][static_cast<std::size_t>(rank)];
    const bool out_of_place_root = o.kind == collective::broadcast && !o.in_place && rank == o.root;
    if (out_of_place_root) {
      // comm::local leaves the root's recv alone when it is not send; comm::mpi copies send there, as NCCL does
      CHECK(got == input(o.type, rank, int(k), static_cast<std::size_t>(o.count)));
    } else {
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
    }
    ++compared;
  }
  CHECK(compared == fsdp::dtype_count * 6 * (2 * 7 + 1));

  // Not vacuous: on these inputs the order of the additions changes the bits. Rank order reversed gives another
  // f32 sum for some elements of the large all_reduce.
  const std::size_t n = 20001;
  std::vector<std::vector<unsigned char>> in;
  for (int q = 0; q < kWorld; ++q) in.push_back(input(dtype::f32, q, 0, n));
  std::vector<float> forward(n), reverse(n);
  fsdp::comm::detail::reduce_in_rank_order(
      dtype::f32, reduce_op::sum, kWorld, n, [&](int q) { return in[static_cast<std::size_t>(q)].data(); },
      forward.data());
  fsdp::comm::detail::reduce_in_rank_order(
      dtype::f32, reduce_op::sum, kWorld, n, [&](int q) { return in[static_cast<std::size_t>(kWorld - 1 - q)].data(); },
      reverse.data());
  CHECK(!same_bits(forward, reverse));
}

TEST_CASE(
    "all_to_all_v moves every dtype's uneven blocks to the ranks they are for at world 4, on every stream; "
    "counts that disagree fail every rank, naming the pair") {
  REQUIRE(world_rank() < kWorld);
  const auto count = [](int from, int to, int salt) { return std::int64_t((3 * from + 5 * to + salt) % 7); };
  const auto sum_to = [](auto&& f, int end) {
    std::int64_t s = 0;
    for (int q = 0; q < end; ++q) s += f(q);
    return s;
  };
  {
    mpi_communicator comm;
    const int rank = comm.rank();
    fsdp::backend::host be(rank);
    fsdp::backend::host::stream* streams[] = {&be.gather_stream(), &be.reduce_stream(), &be.compute_stream()};
    int k = 0;
    for (const fsdp::dtype_row& row : fsdp::dtype_rows) {
      for (int salt : {0, 1, 4}) {
        const dtype t = row.tag;
        const std::size_t es = fsdp::size_of(t);
        CAPTURE(fsdp::name_of(t));
        CAPTURE(salt);
        std::vector<std::int64_t> send_counts, recv_counts;
        for (int q = 0; q < kWorld; ++q) {
          send_counts.push_back(count(rank, q, salt));
          recv_counts.push_back(count(q, rank, salt));
        }
        const auto sent = [&](int from) { return sum_to([&](int q) { return count(from, q, salt); }, kWorld); };
        const std::vector<unsigned char> send = input(t, rank, salt, std::size_t(sent(rank)));
        std::vector<unsigned char> recv(std::size_t(sum_to([&](int q) { return count(q, rank, salt); }, kWorld)) * es,
                                        0xAB);
        fsdp::backend::host::stream& s = *streams[k++ % 3];
        comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, t, s);
        be.synchronize(s);
        std::vector<unsigned char> want;  // rank q's block for this rank, from q's input, in rank order
        for (int q = 0; q < kWorld; ++q) {
          const std::vector<unsigned char> theirs = input(t, q, salt, std::size_t(sent(q)));
          const std::size_t from = std::size_t(sum_to([&](int p) { return count(q, p, salt); }, rank)) * es;
          want.insert(want.end(), theirs.begin() + std::ptrdiff_t(from),
                      theirs.begin() + std::ptrdiff_t(from + std::size_t(count(q, rank, salt)) * es));
        }
        CHECK(recv == want);
      }
    }
    CHECK(comm.stats()[collective::all_to_all_v] == std::uint64_t(k));
  }
  // Rank 1 expects one element more from rank 2 than rank 2 sends it: every rank's call fails, naming that pair,
  // and the communicator goes on.
  mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(30000)});
  fsdp::backend::host be(comm.rank());
  std::vector<float> send(8, 1.0f), recv(9);
  std::vector<std::int64_t> send_counts{2, 2, 2, 2}, recv_counts{2, 2, 2, 2};
  if (comm.rank() == 1) recv_counts[2] = 3;
  const auto t0 = clock_type::now();
  const std::string msg = fsdp_test::error_of<fsdp::comm_error>([&] {
    comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, dtype::f32, be.gather_stream());
    be.synchronize(be.gather_stream());
  });
  const std::string desc =
      comm.rank() == 1 ? "send=[2, 2, 2, 2], recv=[2, 2, 3, 2]" : "send=[2, 2, 2, 2], recv=[2, 2, 2, 2]";
  CHECK(msg == "fsdp: mpi all_to_all_v(" + desc + ", f32) #0 on rank " + std::to_string(comm.rank()) +
                   " of 4: rank 1 receives 3 elements from rank 2 (its recv_counts[2]) but rank 2 sends it 2 (its "
                   "send_counts[1]); rank p's recv_counts[q] must be rank q's send_counts[p]");
  CHECK(clock_type::now() - t0 < std::chrono::seconds(10));  // did not wait out the timeout
  CHECK(!fsdp::comm::mpi_session::finalize_skipped());       // nothing failed in MPI: the communicator goes on
  recv_counts[2] = 2;
  std::vector<float> again(8, 0.0f);
  comm.all_to_all_v(send.data(), send_counts, again.data(), recv_counts, dtype::f32, be.reduce_stream());
  be.synchronize(be.reduce_stream());
  CHECK(again == std::vector<float>(8, 1.0f));
}

TEST_CASE("the gather and reduce streams run collectives concurrently, each on its own communicator") {
  // Each rank delays its two streams differently, so the streams reach MPI in a different order on every rank: one
  // shared MPI communicator would pair one rank's all_gather with another's reduce_scatter.
  mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(20000)});
  const int rank = comm.rank();
  std::vector<op> gathers, reductions;
  for (int k = 0; k < 12; ++k) {
    gathers.push_back({collective::all_gather, dtype::f32, reduce_op::sum, 64 + k, 0, false});
    reductions.push_back({collective::reduce_scatter, dtype::bf16, reduce_op::avg, 96 + k, 0, false});
  }
  std::vector<op> all = gathers;
  all.insert(all.end(), reductions.begin(), reductions.end());
  const auto ref = local_results(all);

  fsdp::backend::host be(rank);
  auto& ag = be.gather_stream();
  auto& rs = be.reduce_stream();
  std::vector<std::vector<unsigned char>> got_g(gathers.size()), got_r(reductions.size());
  std::vector<std::vector<unsigned char>> send_g, send_r;
  for (std::size_t k = 0; k < gathers.size(); ++k) {
    send_g.push_back(input(dtype::f32, rank, int(k), static_cast<std::size_t>(gathers[k].count)));
    send_r.push_back(
        input(dtype::bf16, rank, int(gathers.size() + k), static_cast<std::size_t>(reductions[k].count) * kWorld));
    got_g[k].assign(send_g[k].size() * kWorld, 0);
    got_r[k].assign(send_r[k].size() / kWorld, 0);
  }
  for (std::size_t k = 0; k < gathers.size(); ++k) {
    const auto delay = std::chrono::milliseconds(((rank + int(k)) % kWorld) * 3);
    ag.submit([delay] { std::this_thread::sleep_for(delay); });
    rs.submit([delay] { std::this_thread::sleep_for(std::chrono::milliseconds(9) - delay); });
    comm.all_gather(send_g[k].data(), got_g[k].data(), gathers[k].count, dtype::f32, ag);
    comm.reduce_scatter(send_r[k].data(), got_r[k].data(), reductions[k].count, dtype::bf16, reduce_op::avg, rs);
  }
  be.synchronize(ag);
  be.synchronize(rs);
  for (std::size_t k = 0; k < gathers.size(); ++k) {
    CAPTURE(k);
    CHECK(got_g[k] == ref[k][static_cast<std::size_t>(rank)]);
    CHECK(got_r[k] == ref[gathers.size() + k][static_cast<std::size_t>(rank)]);
  }
}

TEST_CASE("stats count what was issued, as comm::local's do; barrier waits for every rank") {
  mpi_communicator comm;
  const int rank = comm.rank();
  const std::vector<op> ops = {{collective::all_gather, dtype::f32, reduce_op::sum, 10},
                               {collective::all_gather, dtype::bf16, reduce_op::sum, 7},
                               {collective::reduce_scatter, dtype::f32, reduce_op::avg, 5},
                               {collective::all_reduce, dtype::f16, reduce_op::sum, 9},
                               {collective::broadcast, dtype::f32, reduce_op::sum, 3, 2}};
  fsdp::collective_stats want;
  fsdp_test::run_ranks(kWorld, [&](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    for (std::size_t k = 0; k < ops.size(); ++k) (void)run_one(c, be, be.gather_stream(), ops[k], int(k));
    if (c.rank() == 0) want = c.stats();
  });
  fsdp::backend::host be(rank);
  for (std::size_t k = 0; k < ops.size(); ++k) (void)run_one(comm, be, be.gather_stream(), ops[k], int(k));
  const fsdp::collective_stats got = comm.stats();
  for (std::size_t c = 0; c < fsdp::collective_kinds; ++c) {
    CHECK(got.count[c] == want.count[c]);
    CHECK(got.bytes[c] == want.bytes[c]);
  }
  CHECK(got[collective::all_gather] == 2);
  CHECK(got.bytes[std::size_t(collective::all_gather)] == (10 * 4 + 7 * 2) * kWorld);
  comm.reset_stats();
  CHECK(comm.stats()[collective::all_gather] == 0);

  // rank r arrives r * 100 ms late: nobody leaves the barrier before the last rank (300 ms) has arrived
  comm.barrier();  // everyone starts together
  const auto start = clock_type::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(100 * rank));
  comm.barrier();
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start);
  CHECK(waited.count() >= 100 * (kWorld - 1) - 100);  // less the skew of the first barrier's release, on a busy machine
}

TEST_CASE("argument errors are usage errors that say what to do") {
  mpi_communicator comm;
  fsdp::backend::host be(comm.rank());
  float x = 0;
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { comm.broadcast(&x, &x, 1, dtype::f32, 4, be.gather_stream()); }) ==
        "fsdp: broadcast root 4 is outside the group of 4");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { comm.all_gather(&x, &x, -1, dtype::f32, be.gather_stream()); }) ==
        "fsdp: mpi all_gather(count=-1, f32) #0 on rank " + std::to_string(comm.rank()) + " of 4: negative count");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
          mpi_communicator bad(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(0)});
        }) == "fsdp: comm::mpi: mpi_options::timeout must be positive, got 0 ms");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { comm.split(-1, 0); }) ==
        "fsdp: split on rank " + std::to_string(comm.rank()) + ": color must be >= 0, got -1");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { comm.shrink(); }) ==
        "fsdp: comm::mpi: shrink() needs MPI's fault tolerance (ULFM: MPIX_Comm_revoke and MPIX_Comm_shrink, in Open "
        "MPI 5 built with --with-ft=ulfm), which comm::mpi does not use (Debian's Open MPI 4.1 has none): after a "
        "lost rank, restart every rank from the last checkpoint, or train on comm::local, whose shrink() keeps the "
        "survivors going");
}

namespace {
template <class Sharding, class Precision>
void check_mlp_parity(int tensor_parallel = 1) {
  mlp::config cfg;
  cfg.steps = 4;
  cfg.optimizer = "adamw";
  cfg.model.tensor_parallel = tensor_parallel;
  using Local = fsdp::policy<Sharding, fsdp::prefetch::next, Precision>;
  using Mpi = fsdp::policy<Sharding, fsdp::prefetch::next, Precision, fsdp::comm::mpi<>>;
  std::vector<mlp::result> want(kWorld);
  fsdp_test::run_ranks(
      kWorld, [&](local_communicator& c) { want[static_cast<std::size_t>(c.rank())] = mlp::train<Local>(c, cfg); });
  mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(30000)});
  const mlp::result got = mlp::train<Mpi>(comm, cfg);
  const mlp::result& ref = want[static_cast<std::size_t>(comm.rank())];
  REQUIRE(got.losses.size() == std::size_t(cfg.steps));
  CHECK(same_bits(got.losses, ref.losses));
  REQUIRE(got.params.size() == ref.params.size());
  for (const auto& [name, v] : ref.params) {
    CAPTURE(name);
    CHECK(same_bits(got.params.at(name), v));
  }
  // Not vacuous: it trained (the loss moved) and the parameters left their initial values.
  CHECK(got.losses.back() < got.losses.front());
  if (tensor_parallel > 1) {  // and the trainer's collectives went to the tensor group the model split
    // per step: the two row-parallel layers' outputs in forward, the second column-parallel layer's input gradient
    // in backward (the first layer's input has none)
    CHECK(got.tensor_group[collective::all_reduce] == std::uint64_t(cfg.steps * 3));
    CHECK(got.tensor_group[collective::all_reduce] == ref.tensor_group[collective::all_reduce]);
  }
  mlp::config untrained = cfg;
  untrained.steps = 0;
  std::vector<mlp::result> init(kWorld);
  fsdp_test::run_ranks(kWorld, [&](local_communicator& c) {
    init[static_cast<std::size_t>(c.rank())] = mlp::train<Local>(c, untrained);
  });
  CHECK(!same_bits(got.params.at(mlp::wname(0)), init[0].params.at(mlp::wname(0))));
}
}  // namespace

TEST_CASE("a Model on comm::mpi trains the MLP exactly as on comm::run_local at world 4 (AdamW, 4 steps)") {
  using fsdp::bfloat16;
  using fsdp::precision::mixed;
  SUBCASE("full_shard, fp32") { check_mlp_parity<fsdp::sharding::full_shard, fsdp::precision::full>(); }
  SUBCASE("full_shard, bf16 compute, fp32 reduction") {
    check_mlp_parity<fsdp::sharding::full_shard, mixed<bfloat16>>();
  }
  SUBCASE("full_shard, bf16 compute and reduction") {
    check_mlp_parity<fsdp::sharding::full_shard, mixed<bfloat16, float, bfloat16>>();
  }
  SUBCASE("no_shard (all_reduce), fp32") { check_mlp_parity<fsdp::sharding::no_shard, fsdp::precision::full>(); }
  SUBCASE("full_shard, int8 gathers and gradients reduced in int8 blocks (MPI_Ialltoall)") {
    check_mlp_parity<fsdp::sharding::full_shard, fsdp::precision::scaled<std::int8_t, 16, bfloat16, std::int8_t>>();
  }
  // Hybrid sharding split into 2 x 2: both strategies in every precision mode.
  SUBCASE("hybrid_shard<2>, fp32") { check_mlp_parity<fsdp::sharding::hybrid_shard<2>, fsdp::precision::full>(); }
  SUBCASE("hybrid_shard<2>, bf16 compute, fp32 reduction") {
    check_mlp_parity<fsdp::sharding::hybrid_shard<2>, mixed<bfloat16>>();
  }
  SUBCASE("hybrid_shard<2>, bf16 compute and reduction") {
    check_mlp_parity<fsdp::sharding::hybrid_shard<2>, mixed<bfloat16, float, bfloat16>>();
  }
  SUBCASE("hybrid_shard_zero2<2>, fp32") {
    check_mlp_parity<fsdp::sharding::hybrid_shard_zero2<2>, fsdp::precision::full>();
  }
  SUBCASE("hybrid_shard_zero2<2>, bf16 compute, fp32 reduction") {
    check_mlp_parity<fsdp::sharding::hybrid_shard_zero2<2>, mixed<bfloat16>>();
  }
  SUBCASE("hybrid_shard_zero2<2>, bf16 compute and reduction") {
    check_mlp_parity<fsdp::sharding::hybrid_shard_zero2<2>, mixed<bfloat16, float, bfloat16>>();
  }
}

TEST_CASE("tensor parallelism on a 2 x 2 mesh of processes trains the Megatron MLP exactly as on comm::run_local") {
  // tensor groups {0, 1} and {2, 3}: the MLP's column- and row-parallel pairs (mlp.hpp), the trainer's all-reduces on
  // the model's tensor_comm() (an MPI_Comm_split group), the data-parallel groups {0, 2} and {1, 3}
  using fsdp::bfloat16;
  using fsdp::precision::mixed;
  SUBCASE("full_shard, fp32") { check_mlp_parity<fsdp::sharding::full_shard, fsdp::precision::full>(2); }
  SUBCASE("no_shard, bf16 compute and reduction") {
    check_mlp_parity<fsdp::sharding::no_shard, mixed<bfloat16, float, bfloat16>>(2);
  }
  SUBCASE("hybrid_shard<1> (2 replicas x 1 shard x 2), fp32") {
    check_mlp_parity<fsdp::sharding::hybrid_shard<1>, fsdp::precision::full>(2);
  }
  SUBCASE("zero1, tensor groups of 4, fp32") { check_mlp_parity<fsdp::sharding::zero1, fsdp::precision::full>(4); }
}

namespace {
/// The mixture-of-experts trainer (tests/support/moe.hpp) on comm::mpi at world 4, against comm::run_local at 4.
template <class Sharding>
void check_moe_parity(int expert, float max_norm = 0.0f) {
  using Local = fsdp::policy<Sharding>;
  using Mpi = fsdp::policy<Sharding, fsdp::prefetch::next, fsdp::precision::full, fsdp::comm::mpi<>>;
  std::vector<fsdp_test::moe::rank_result> want(kWorld);
  fsdp_test::run_ranks(kWorld, [&](local_communicator& c) {
    want[static_cast<std::size_t>(c.rank())] = fsdp_test::moe::train<Local>(c, expert, max_norm);
  });
  mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(30000)});
  const fsdp_test::moe::rank_result got = fsdp_test::moe::train<Mpi>(comm, expert, max_norm);
  const fsdp_test::moe::rank_result& ref = want[static_cast<std::size_t>(comm.rank())];
  CHECK(same_bits(got.losses, ref.losses));
  CHECK(got.norms == ref.norms);
  REQUIRE(got.params.size() == ref.params.size());
  for (const auto& [name, v] : ref.params) {
    CAPTURE(name);
    CHECK(same_bits(got.params.at(name), v));
  }
  CHECK(got.losses.back() < got.losses.front());  // it trained
  CHECK(got.memory_as_planned);
  // the trainer's four exchanges a step on the expert group (an MPI_Comm_split group), the expert unit's reduction
  CHECK(got.expert_exchanges == 4 * fsdp_test::moe::steps);
  CHECK(got.expert_reductions == fsdp_test::moe::steps);
}
}  // namespace

TEST_CASE("experts on 4 processes train exactly as on comm::run_local: expert groups of 2 and 4, their all_to_all_v") {
  SUBCASE("full_shard, expert_parallel 2 (expert shard groups {0, 2} and {1, 3})") {
    check_moe_parity<fsdp::sharding::full_shard>(2);
  }
  SUBCASE("full_shard, expert_parallel 4, clipping") { check_moe_parity<fsdp::sharding::full_shard>(4, 0.05f); }
  SUBCASE("no_shard, expert_parallel 2 (out of the replicas), clipping") {
    check_moe_parity<fsdp::sharding::no_shard>(2, 0.05f);
  }
  SUBCASE("hybrid_shard<2>, expert_parallel 2 (2 replicas x 2 experts)") {
    check_moe_parity<fsdp::sharding::hybrid_shard<2>>(2);
  }
}

TEST_CASE(
    "a step captured on comm::mpi and replayed gives the bits of eager steps on comm::run_local (AdamW clipped, "
    "a skipped step, fp16's loss scale moving on the device)") {
  namespace cap = fsdp_test::capture;
  using Local = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>;
  using Mpi = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, fsdp::comm::mpi<>>;
  const auto make = cap::adamw(0.5f, true);
  const fsdp::grad::loss_scaler_options scaling{.init_scale = 1024.0f, .growth_interval = 4};
  std::vector<cap::rank_outcome> want(kWorld);
  fsdp_test::run_ranks(kWorld, [&](local_communicator& c) {
    want[static_cast<std::size_t>(c.rank())] = cap::train_rank<Local>(c, false, make, 9, scaling);
  });
  mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(30000)});
  const cap::rank_outcome got = cap::train_rank<Mpi>(comm, true, make, 9, scaling);
  const cap::rank_outcome& ref = want[static_cast<std::size_t>(comm.rank())];
  CHECK(fsdp_test::same_bits(got.state, ref.state));
  CHECK(got.steps == cap::steps - 1);  // step 9 skipped
  CHECK(ref.steps == cap::steps - 1);
  CHECK(got.scaler.scale == ref.scaler.scale);
  CHECK(got.scaler.good == ref.scaler.good);
  CHECK(cap::differing_report(ref.reports, got.reports) == "");  // each replay's report, its eager step's
}

TEST_CASE("hybrid sharding at 2 x 4 on 8 processes trains the MLP exactly as on comm::run_local at world 8" *
          doctest::test_suite("world8")) {
  // Run by run_mpi_test.sh in an mpirun of 8 processes (--test-suite=world8; the 4-process run excludes it).
  // comm::run_local at 8 is itself checked against the single-process reference in
  // tests/model/precision_parity_test.cc.
  using fsdp::bfloat16;
  using fsdp::precision::mixed;
  mlp::config cfg;
  cfg.steps = 4;
  cfg.optimizer = "adamw";
  auto check = [&](auto sharding, auto precision) {
    using P = fsdp::policy<decltype(sharding), fsdp::prefetch::next, decltype(precision)>;
    using M = fsdp::policy<decltype(sharding), fsdp::prefetch::next, decltype(precision), fsdp::comm::mpi<>>;
    std::vector<mlp::result> want(8);
    fsdp_test::run_ranks(
        8, [&](local_communicator& c) { want[static_cast<std::size_t>(c.rank())] = mlp::train<P>(c, cfg); });
    mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(30000)});
    REQUIRE(comm.size() == 8);
    const mlp::result got = mlp::train<M>(comm, cfg);
    const mlp::result& ref = want[static_cast<std::size_t>(comm.rank())];
    CHECK(same_bits(got.losses, ref.losses));
    for (const auto& [name, v] : ref.params) {
      CAPTURE(name);
      CHECK(same_bits(got.params.at(name), v));
    }
    CHECK(got.replicate_group[collective::all_reduce] == ref.replicate_group[collective::all_reduce]);
    CHECK(got.replicate_group[collective::all_reduce] > 0);
  };
  // 2 x 4: both strategies in every precision mode.
  SUBCASE("hybrid_shard<4>, fp32") { check(fsdp::sharding::hybrid_shard<4>{}, fsdp::precision::full{}); }
  SUBCASE("hybrid_shard<4>, bf16 compute, fp32 reduction") {
    check(fsdp::sharding::hybrid_shard<4>{}, mixed<bfloat16>{});
  }
  SUBCASE("hybrid_shard<4>, bf16 compute and reduction") {
    check(fsdp::sharding::hybrid_shard<4>{}, mixed<bfloat16, float, bfloat16>{});
  }
  SUBCASE("hybrid_shard_zero2<4>, fp32") { check(fsdp::sharding::hybrid_shard_zero2<4>{}, fsdp::precision::full{}); }
  SUBCASE("hybrid_shard_zero2<4>, bf16 compute, fp32 reduction") {
    check(fsdp::sharding::hybrid_shard_zero2<4>{}, mixed<bfloat16>{});
  }
  SUBCASE("hybrid_shard_zero2<4>, bf16 compute and reduction") {
    check(fsdp::sharding::hybrid_shard_zero2<4>{}, mixed<bfloat16, float, bfloat16>{});
  }
  SUBCASE("hybrid_shard_zero2<2> (4 x 2), fp32") {
    check(fsdp::sharding::hybrid_shard_zero2<2>{}, fsdp::precision::full{});
  }
}

#if FSDP_TEST_CHECKPOINTS
TEST_CASE("checkpoints on comm::mpi: a resume equals training without a stop; the files load on thread ranks at 2") {
  using Mpi = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, fsdp::comm::mpi<>>;
  mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(30000)});
  fsdp::backend::host be(comm.rank());
  // One scratch directory for every process: rank 0 makes it and tells the others.
  std::string made;
  if (comm.rank() == 0) {
    std::string tmpl =
        std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/mpi-ckpt-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    made = tmpl;
  }
  const std::string dir = fsdp::agree::all_gather_strings(comm, be, made)[0];
  mlp::config cfg;
  // Each process's master shard and AdamW state, after training.
  auto state = [](auto& m, auto& opt) {
    std::vector<float> out;
    m.synchronize();
    for (std::size_t u = 0; u < m.size(); ++u)
      for (int k = -1; k < 2; ++k) {
        std::vector<float> v(static_cast<std::size_t>(m.unit(u).layout().shard_numel()));
        m.backend().download(v.data(), k < 0 ? m.unit(u).master_shard() : opt.state(u, k),
                             static_cast<std::int64_t>(v.size() * 4), m.backend().compute_stream());
        m.backend().synchronize(m.backend().compute_stream());
        out.insert(out.end(), v.begin(), v.end());
      }
    return out;
  };
  std::vector<float> straight, resumed;
  std::map<std::string, std::vector<float>> saved;
  {
    auto m = mlp::make_model<Mpi>(comm, cfg);
    fsdp::optim::adamw opt(m, {});
    mlp::result r;
    mlp::run_steps(m, opt, cfg, 0, 5, r);
    straight = state(m, opt);
  }
  {
    auto m = mlp::make_model<Mpi>(comm, cfg);
    fsdp::optim::adamw opt(m, {});
    mlp::result r;
    mlp::run_steps(m, opt, cfg, 0, 3, r);
    fsdp::checkpoint::save(m, opt, dir + "/step-3");
    saved = fsdp::weights::gather_full_params(m);
  }
  {
    auto m = mlp::make_model<Mpi>(comm, cfg);
    fsdp::optim::adamw opt(m, {});
    fsdp::checkpoint::load(m, opt, dir + "/step-3");
    CHECK(opt.steps() == 3);
    mlp::result r;
    mlp::run_steps(m, opt, cfg, 3, 2, r);
    resumed = state(m, opt);
  }
  CHECK(same_bits(straight, resumed));
  CHECK(fsdp::checkpoint::read_manifest(dir + "/step-3").files.size() == std::size_t(kWorld));
  if (comm.rank() == 0) {
    std::map<std::string, std::vector<float>> loaded;
    fsdp_test::run_ranks(2, [&](local_communicator& c) {
      auto m = mlp::make_model<fsdp::policy<fsdp::sharding::full_shard>>(c, cfg);
      fsdp::checkpoint::load(m, dir + "/step-3");
      const auto p = fsdp::weights::gather_full_params(m);
      if (c.rank() == 0) loaded = p;
    });
    for (const auto& [name, v] : saved) {
      CAPTURE(name);
      CHECK(same_bits(loaded.at(name), v));
    }
  }
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}
#endif

TEST_CASE("split groups ranks by color, ordered by key, as MPI_Comm_split does") {
  mpi_communicator comm;
  const int rank = comm.rank();
  mpi_communicator sub = comm.split(rank % 2, -rank);  // {0, 2} and {1, 3}, each in reverse rank order
  CHECK(sub.size() == 2);
  CHECK(sub.rank() == (rank < 2 ? 1 : 0));
  fsdp::backend::host be(rank);
  const float mine = float(rank + 1);
  float got[2] = {0, 0};
  sub.all_gather(&mine, got, 1, dtype::f32, be.gather_stream());
  be.synchronize(be.gather_stream());
  const float expect[2] = {float((rank % 2) + 2 + 1), float((rank % 2) + 1)};  // ranks 2, 0 or 3, 1
  CHECK(got[0] == expect[0]);
  CHECK(got[1] == expect[1]);
}

// ---- failure: run one at a time, by name, under mpirun --enable-recovery (run_mpi_test.sh) ---------------------
namespace {
const std::string kWhy =
    ": the other ranks did not complete it (a peer process died, or does not issue the same collectives in the same "
    "order; raise mpi_options::timeout if a peer is only slow)";

/// Prints what this rank caught, one line, for run_mpi_test.sh to compare.
void report(const std::string& what, double seconds) {
  std::printf("rank %d caught after %.1f s: %s\n", world_rank(), seconds, what.c_str());
  std::fflush(stdout);
}
}  // namespace

TEST_CASE("failure: a rank that returns without issuing a collective makes the others fail within the timeout" *
          doctest::test_suite("failure") * doctest::skip()) {
  const auto timeout = std::chrono::milliseconds(2000);
  // a hands every collective to its stream's worker (inline_max_bytes = 0); c runs a small one on the issuing
  // thread once its stream's communicator is set up (the default); b's first collective comes after rank 3 left.
  mpi_communicator a(MPI_COMM_WORLD, {.timeout = timeout, .inline_max_bytes = 0});
  mpi_communicator b(MPI_COMM_WORLD, {.timeout = timeout});
  mpi_communicator c(MPI_COMM_WORLD, {.timeout = timeout});
  const int rank = a.rank();
  fsdp::backend::host be(rank), bc(rank);
  std::vector<float> send(8, float(rank)), recv(32);
  a.label("probe");
  a.all_gather(send.data(), recv.data(), 8, dtype::f32, be.gather_stream());  // #0: every rank
  be.synchronize(be.gather_stream());
  CHECK(recv[31] == 3.0f);
  c.all_gather(send.data(), recv.data(), 8, dtype::f32, bc.gather_stream());  // c's #0: its stream is set up
  bc.synchronize(bc.gather_stream());
  if (rank == 3) return;  // rank 3 leaves: it issues neither a's #1 nor c's #1 nor anything on b

  // Timed from the issue, which returns at once (a's worker waits the timeout out).
  auto t0 = clock_type::now();
  a.all_gather(send.data(), recv.data(), 8, dtype::f32, be.gather_stream());  // #1: rank 3 never issues it
  const std::string first = fsdp_test::error_of<fsdp::comm_error>([&] { be.synchronize(be.gather_stream()); });
  double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  report(first, s);
  CHECK(first == "fsdp: mpi all_gather(count=8, f32) #1 for unit 'probe' on rank " + std::to_string(rank) +
                     " of 4 timed out after 2000 ms" + kWhy);
  CHECK(s >= 1.9);
  CHECK(s < 4.0);

  // The communicator is aborted: its next collective fails at once, quoting the first failure.
  fsdp::backend::host be2(rank);
  t0 = clock_type::now();
  a.reduce_scatter(send.data(), recv.data(), 2, dtype::f32, reduce_op::sum, be2.reduce_stream());
  const std::string after = fsdp_test::error_of<fsdp::comm_error>([&] { be2.synchronize(be2.reduce_stream()); });
  CHECK(after == "fsdp: mpi reduce_scatter(count=2, f32, sum) #2 for unit 'probe' on rank " + std::to_string(rank) +
                     " of 4 aborted: " + first.substr(std::string("fsdp: ").size()));
  CHECK(std::chrono::duration<double>(clock_type::now() - t0).count() < 0.5);

  // Inline: c's #1 runs on this thread, which waits the timeout out in the issue itself; the synchronize reports it.
  t0 = clock_type::now();
  c.all_gather(send.data(), recv.data(), 8, dtype::f32, bc.gather_stream());  // #1: rank 3 never issues it
  const double in_issue = std::chrono::duration<double>(clock_type::now() - t0).count();
  const std::string inline_failure =
      fsdp_test::error_of<fsdp::comm_error>([&] { bc.synchronize(bc.gather_stream()); });
  CHECK(inline_failure == "fsdp: mpi all_gather(count=8, f32) #1 on rank " + std::to_string(rank) +
                              " of 4 timed out after 2000 ms" + kWhy);
  CHECK(in_issue >= 1.9);
  CHECK(in_issue < 4.0);

  // A stream first used after rank 3 left: its communicator cannot even be set up.
  t0 = clock_type::now();
  b.all_reduce(send.data(), send.data(), 8, dtype::f32, reduce_op::avg, be.reduce_stream());
  const std::string setup = fsdp_test::error_of<fsdp::comm_error>([&] { be.synchronize(be.reduce_stream()); });
  s = std::chrono::duration<double>(clock_type::now() - t0).count();
  report(setup, s);
  CHECK(setup == "fsdp: mpi all_reduce(count=8, f32, avg) #0 on rank " + std::to_string(rank) +
                     " of 4 timed out after 2000 ms while setting up this stream's communicator (MPI_Comm_idup)" +
                     kWhy);
  CHECK(s >= 1.9);
  CHECK(s < 4.0);
}

TEST_CASE("failure: a rank killed in the middle of training makes the others fail within the timeout" *
          doctest::test_suite("failure") * doctest::skip()) {
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, fsdp::comm::mpi<>>;
  mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(2000)});
  const int rank = comm.rank();
  fsdp::Model<P> m(comm, fsdp_test::five_units(), fsdp::wrap::by_prefix{"h."}, fsdp::init::normal{0.5f, 3});
  fsdp::optim::adamw opt(m, {.lr = 0.01f});
  auto step = [&] {
    for (auto& u : m.forward()) (void)u.param(u.layout().entries()[0].name);
    for (auto& u : m.backward())
      for (const auto& e : u.layout().entries()) {
        auto g = u.grad(e.name);
        for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = 0.01f * float((rank + 1) * (i % 7 + 1));
      }
    opt.step();
    opt.zero_grad();
  };
  step();
  step();
  m.synchronize();
  if (rank == 3) std::raise(SIGKILL);  // between steps 2 and 3: rank 3 never issues step 3's collectives
  const auto t0 = clock_type::now();
  const std::string what = fsdp_test::error_of<fsdp::comm_error>([&] {
    step();
    m.synchronize();
  });
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  report(what, s);
  // Step 3's first collective: the forward all-gather of the first unit (root: emb, 185 elements, with head tied to
  // it; the layout pads the flat buffer to 192, 48 per rank). Steps 1 and 2 issued 5 forward gathers, 4 backward
  // gathers (root, first in forward, is kept into its backward), 5 reduce-scatters and the step's commit (a
  // one-element all-reduce, model_options::commit_step) each, after the Model's one agreement all-gather at
  // construction: #31.
  CHECK(what == "fsdp: mpi all_gather(count=48, f32) #31 for unit 'root' on rank " + std::to_string(rank) +
                    " of 4 timed out after 2000 ms" + kWhy);
  CHECK(s >= 1.9);
  CHECK(s < 4.0);
}

TEST_CASE("failure: a rank killed in the forward, the backward or before the step makes the others fail in bounds" *
          doctest::test_suite("failure") * doctest::skip()) {
  // FSDP_KILL_AT (run_mpi_test.sh passes it with mpirun -x): forward (after entering the second unit), backward
  // (likewise) or step (right before the optimizer step, whose clipping all-reduce is then pending on the others).
  const char* at_env = std::getenv("FSDP_KILL_AT");
  REQUIRE(at_env != nullptr);
  const std::string at = at_env;
  REQUIRE((at == "forward" || at == "backward" || at == "step"));
  using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, fsdp::comm::mpi<>>;
  mpi_communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(2000)});
  const int rank = comm.rank();
  fsdp::Model<P> m(comm, fsdp_test::five_units(), fsdp::wrap::by_prefix{"h."});
  fsdp::optim::adamw opt(m, {.lr = 0.01f, .grad = {.max_norm = 1.0f}});
  auto die_at = [&](const char* here) {
    if (rank != 3 || at != here) return;
    // before the step: once this rank's reductions are done, so the step's all-reduce is what the others miss
    if (at == "step") m.synchronize();
    std::raise(SIGKILL);
  };
  const auto t0 = clock_type::now();
  std::string what;
  try {
    std::size_t entered = 0;
    for (auto& u : m.forward()) {
      (void)u;
      if (++entered == 2) die_at("forward");
    }
    entered = 0;
    for (auto& u : m.backward()) {
      for (const auto& e : u.layout().entries()) {
        auto g = u.grad(e.name);
        for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = 0.01f;
      }
      if (++entered == 2) die_at("backward");
    }
    die_at("step");
    opt.step();
    m.synchronize();
  } catch (const std::exception& e) {  // a comm_error, or the usage_error of a pass its failure abandoned
    what = e.what();
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  report(what, s);
  // The first pending collective of each kind the position leaves pending; a rank may also see it through the
  // abort of another of its streams ("... aborted: mpi all_gather(...) ... timed out ...").
  const std::string kind = at == "forward" ? "all_gather(" : at == "step" ? "all_reduce(" : "";
  CHECK(what.find("fsdp: ") != std::string::npos);
  CHECK(what.find("mpi ") != std::string::npos);
  CHECK(what.find(" of 4 timed out after 2000 ms") != std::string::npos);
  if (!kind.empty()) CHECK(what.find(kind) != std::string::npos);
  else CHECK((what.find("reduce_scatter(") != std::string::npos || what.find("all_gather(") != std::string::npos));
  CHECK(s < 5.0);  // the 2 s timeout, plus polling and a little start-up: never the default 60 s
}

// ---- launch: run_mpi_test.sh starts the program once without mpirun, with torchrun's variables -----------------
TEST_CASE("a process started by torchrun instead of mpirun is refused, naming the launcher to use" *
          doctest::test_suite("launch") * doctest::skip()) {
  REQUIRE(std::getenv("WORLD_SIZE") != nullptr);
  REQUIRE(std::string(std::getenv("WORLD_SIZE")) == "2");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { mpi_communicator comm; }) ==
        "fsdp: comm::mpi: WORLD_SIZE=2 (torchrun) says this process is one of several, but MPI sees a world of 1: "
        "without MPI's launcher every process initialises MPI alone. Start the program with mpirun -np 2 (comm::mpi "
        "needs MPI's own launcher), or use comm::nccl with torchrun");
}

// run_mpi_test.sh starts the program once more without mpirun, with the variables srun sets: Slurm's srun without a
// process-management interface that Open MPI can use starts processes that each see a world of one.
TEST_CASE("a process started by srun without PMI support is refused, naming srun --mpi=pmix" *
          doctest::test_suite("launch") * doctest::skip()) {
  REQUIRE(std::getenv("SLURM_NTASKS") != nullptr);
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { mpi_communicator comm; }) ==
        "fsdp: comm::mpi: SLURM_NTASKS=2 (srun) says this process is one of several, but MPI sees a world of 1: srun "
        "started it without a process-management interface this MPI library can use, so every process initialised "
        "MPI alone. Start it with srun --mpi=pmix (an MPI built with PMIx support; srun --mpi=list shows what Slurm "
        "offers), or with mpirun -np 2");
}

namespace {
/// One line per process at the end of the run, for run_mpi_test.sh to count: "rank 0 of 4: 5 test cases, 0 failed,
/// 123 assertions, 0 failed".
struct summary : fsdp_test::quiet_listener {
  using quiet_listener::quiet_listener;
  void test_run_end(const doctest::TestRunStats& s) override {
    int rank = 0, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    std::printf("rank %d of %d: %u test cases, %u failed, %d assertions, %d failed\n", rank, world,
                s.numTestCasesPassingFilters, s.numTestCasesFailed, s.numAsserts, s.numAssertsFailed);
    std::fflush(stdout);
  }
};
REGISTER_LISTENER("mpi_summary", 1, summary);
}  // namespace

int main(int argc, char** argv) {
  bool scenario = false;  // a failure case, run by name with --no-skip (run_mpi_test.sh)
  for (int i = 1; i < argc; ++i) scenario = scenario || std::string(argv[i]).rfind("--no-skip", 0) == 0;
  fsdp::comm::mpi_session mpi(argc, argv);
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  if (scenario) {
    // End without MPI_Finalize on every rank, the healthy one too: under mpirun --enable-recovery, Open MPI 4.1.4's
    // MPI_Finalize sometimes waits forever (a PMIx fence) for processes that ended without finalising (the
    // survivors, see mpi_session) or died.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(rc);
  }
  return rc;
}
