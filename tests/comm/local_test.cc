// comm::local: collectives are exact, honour stream order, match by issue order, and fail (never hang) when
// ranks disagree or one is missing.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/sanitizers.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include "tests/support/support.hpp"

using fsdp::dtype;
using fsdp::reduce_op;
using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::run_ranks;

TEST_CASE("collectives give exact results at every world size") {
  for (int world = 1; world <= 5; ++world) {
    CAPTURE(world);
    run_ranks(world, [&](local_communicator& c) {
      fsdp::backend::host be(c.rank());
      auto& s = be.reduce_stream();
      const int r = c.rank();
      const int n = 6;
      // all_gather
      std::vector<float> mine(n), all(n * world, -1.0f);
      for (int i = 0; i < n; ++i) mine[i] = float(100 * r + i);
      c.all_gather(mine.data(), all.data(), n, dtype::f32, s);
      // reduce_scatter: element i of rank q's input is q + i; rank r's output j is sum_q (q + r*n + j)
      std::vector<float> in(n * world), out(n, -1.0f), out_avg(n, -1.0f);
      for (int i = 0; i < n * world; ++i) in[i] = float(r + i);
      c.reduce_scatter(in.data(), out.data(), n, dtype::f32, reduce_op::sum, s);
      c.reduce_scatter(in.data(), out_avg.data(), n, dtype::f32, reduce_op::avg, s);
      // all_reduce in place and out of place
      std::vector<float> ar(n), ar_out(n, -1.0f);
      for (int i = 0; i < n; ++i) ar[i] = float(r * i);
      c.all_reduce(ar.data(), ar_out.data(), n, dtype::f32, reduce_op::sum, s);
      c.all_reduce(ar.data(), ar.data(), n, dtype::f32, reduce_op::sum, s);
      // broadcast from the last rank, in place and out of place (the root's recv is written too, as NCCL's)
      std::vector<float> b(n, float(r)), b_out(n, -1.0f);
      c.broadcast(b.data(), b.data(), n, dtype::f32, world - 1, s);
      c.broadcast(b.data(), b_out.data(), n, dtype::f32, world - 1, s);
      be.synchronize(s);

      const float ranksum = float(world * (world - 1) / 2);
      for (int q = 0; q < world; ++q)
        for (int i = 0; i < n; ++i) CHECK(all[q * n + i] == float(100 * q + i));
      for (int j = 0; j < n; ++j) {
        const float expect = ranksum + float(world * (r * n + j));
        CHECK(out[j] == expect);
        // an average is NCCL's: each rank's value times float(1 / world), summed in rank order
        float avg = 0.0f;
        for (int q = 0; q < world; ++q) avg += float(q + r * n + j) * static_cast<float>(1.0 / world);
        CHECK(out_avg[j] == avg);
        CHECK(ar_out[j] == ranksum * float(j));
        CHECK(ar[j] == ranksum * float(j));
        CHECK(b[j] == float(world - 1));
        CHECK(b_out[j] == float(world - 1));
      }
      const auto st = c.stats();
      CHECK(st[fsdp::collective::all_gather] == 1);
      CHECK(st[fsdp::collective::reduce_scatter] == 2);
      CHECK(st[fsdp::collective::all_reduce] == 2);
      CHECK(st[fsdp::collective::broadcast] == 2);
      CHECK(st.bytes[0] == std::uint64_t(n * world * 4));
    });
  }
}

namespace {
/// The rule, written independently of the library's code: rank-order sum from 0, rounded to T after every
/// addition; an average multiplies each value by T(1 / world) first (NCCL's PreMulSum).
template <class T>
float reduced(const std::vector<float>& per_rank, bool average) {
  const float premul = average ? float(T(static_cast<float>(1.0 / double(per_rank.size())))) : 1.0f;
  float acc = 0.0f;
  for (float x : per_rank) {
    float v = float(T(x));
    if (average && per_rank.size() > 1) v = float(T(v * premul));
    acc = float(T(acc + v));
  }
  return acc;
}

template <class T>
void check_16bit(int world) {
  const dtype t = fsdp::dtype_of_v<T>;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    auto& s = be.reduce_stream();
    const int n = 64;
    auto value = [](int rank, int i) {
      return float(T(std::ldexp(1.0f + float((i * 37 + rank * 11) % 97) / 97.0f, i % 5 - 2)));
    };
    std::vector<T> in(std::size_t(n) * world), rs(n), rs_avg(n), ar(std::size_t(n) * world);
    for (int i = 0; i < n * world; ++i) in[i] = ar[i] = T(value(c.rank(), i));
    c.reduce_scatter(in.data(), rs.data(), n, t, reduce_op::sum, s);
    c.reduce_scatter(in.data(), rs_avg.data(), n, t, reduce_op::avg, s);
    c.all_reduce(ar.data(), ar.data(), n * world, t, reduce_op::avg, s);
    be.synchronize(s);
    for (int j = 0; j < n; ++j) {
      std::vector<float> per_rank;
      for (int q = 0; q < world; ++q) per_rank.push_back(value(q, c.rank() * n + j));
      CHECK(float(rs[j]) == reduced<T>(per_rank, false));
      CHECK(float(rs_avg[j]) == reduced<T>(per_rank, true));
      CHECK(float(ar[c.rank() * n + j]) == reduced<T>(per_rank, true));
    }
    CHECK(c.stats().bytes[std::size_t(fsdp::collective::reduce_scatter)] == std::uint64_t(2 * n * world * 2));
  });
}
}  // namespace

TEST_CASE("all_to_all: block q of rank r's send lands as block r of rank q's receive, at every world size and dtype") {
  for (int world = 1; world <= 5; ++world) {
    CAPTURE(world);
    run_ranks(world, [&](local_communicator& c) {
      fsdp::backend::host be(c.rank());
      auto& s = be.reduce_stream();
      const int r = c.rank(), n = 5;
      // fp32: element i of the block for rank q is 1000 r + 100 q + i
      std::vector<float> send(std::size_t(n * world)), recv(std::size_t(n * world), -1.0f);
      for (int q = 0; q < world; ++q)
        for (int i = 0; i < n; ++i) send[std::size_t(q * n + i)] = float(1000 * r + 100 * q + i);
      c.all_to_all(send.data(), recv.data(), n, dtype::f32, s);
      // one-byte elements (int8 values with their block scales travel as bytes): 16 r + q, one per pair
      std::vector<std::int8_t> send8(static_cast<std::size_t>(world)), recv8(static_cast<std::size_t>(world), -1);
      for (int q = 0; q < world; ++q) send8[std::size_t(q)] = static_cast<std::int8_t>(16 * r + q);
      c.all_to_all(send8.data(), recv8.data(), 1, dtype::i8, s);
      c.all_to_all(send8.data(), recv8.data(), 0, dtype::i8, s);  // nothing moves, the collective still runs
      be.synchronize(s);
      for (int q = 0; q < world; ++q) {
        for (int i = 0; i < n; ++i) CHECK(recv[std::size_t(q * n + i)] == float(1000 * q + 100 * r + i));
        CHECK(recv8[std::size_t(q)] == 16 * q + r);
      }
      const auto st = c.stats();
      CHECK(st[fsdp::collective::all_to_all] == 3);
      CHECK(st.bytes[std::size_t(fsdp::collective::all_to_all)] == std::uint64_t(n * world * 4 + world));
      CHECK(error_of<fsdp::usage_error>([&] { c.all_to_all(send.data(), send.data() + 1, n, dtype::f32, s); }) ==
            "fsdp: all_to_all(count=5, f32) on rank " + std::to_string(r) +
                ": the send and receive buffers overlap; give it two buffers of " +
                std::to_string(n * world * 4) + " bytes each");
    });
  }
}

TEST_CASE(
    "all_to_all_v: rank q's block for rank r lands as block q of rank r's receive, each block as long as its "
    "count, empty blocks too, at every world size") {
  for (int world = 1; world <= 5; ++world) {
    CAPTURE(world);
    run_ranks(world, [&](local_communicator& c) {
      fsdp::backend::host be(c.rank());
      auto& s = be.compute_stream();
      const int r = c.rank();
      const auto count = [](int from, int to) { return std::int64_t((from + 2 * to) % 4); };  // 0 to 3, uneven
      std::vector<std::int64_t> send_counts, recv_counts;
      for (int q = 0; q < world; ++q) {
        send_counts.push_back(count(r, q));
        recv_counts.push_back(count(q, r));
      }
      // element i of the block for rank q is 1000 r + 100 q + i
      std::vector<float> send, recv;
      for (int q = 0; q < world; ++q)
        for (int i = 0; i < count(r, q); ++i) send.push_back(float(1000 * r + 100 * q + i));
      for (int q = 0; q < world; ++q) recv.resize(recv.size() + std::size_t(count(q, r)), -1.0f);
      c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, dtype::f32, s);
      // one-byte elements: 16 r + q, as many as the pair's count
      std::vector<std::int8_t> send8, recv8(recv.size(), -1);
      for (int q = 0; q < world; ++q) send8.resize(send8.size() + std::size_t(count(r, q)), std::int8_t(16 * r + q));
      c.all_to_all_v(send8.data(), send_counts, recv8.data(), recv_counts, dtype::i8, s);
      be.synchronize(s);
      std::vector<float> expected;
      std::vector<std::int8_t> expected8;
      for (int q = 0; q < world; ++q)
        for (int i = 0; i < count(q, r); ++i) {
          expected.push_back(float(1000 * q + 100 * r + i));
          expected8.push_back(std::int8_t(16 * q + r));
        }
      CHECK(recv == expected);
      CHECK(recv8 == expected8);
      const auto st = c.stats();
      CHECK(st[fsdp::collective::all_to_all_v] == 2);
      CHECK(st.bytes[std::size_t(fsdp::collective::all_to_all_v)] == std::uint64_t(send.size() * 4 + send8.size()));
    });
  }
}

TEST_CASE(
    "all_to_all_v: counts two ranks disagree on fail every rank's call, naming the pair; nothing moves, and the "
    "group goes on") {
  run_ranks(3, [](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    std::vector<float> send(6, 1.0f), recv(7, -1.0f);
    std::vector<std::int64_t> send_counts{2, 2, 2}, recv_counts{2, 2, 2};
    if (c.rank() == 1) recv_counts[2] = 3;  // rank 2 sends it 2
    const std::string r = std::to_string(c.rank());
    CHECK(error_of<fsdp::comm_error>([&] {
            c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, dtype::f32, be.compute_stream());
            be.synchronize(be.compute_stream());
          }) == std::string("fsdp: local all_to_all_v(send=[2, 2, 2], recv=[2, 2, ") + (c.rank() == 1 ? "3" : "2") +
                    "], f32) #0 on rank " + r +
                    ": rank 1 receives 3 elements from rank 2 (its recv_counts[2]) but rank 2 sends it 2 (its "
                    "send_counts[1]); rank p's recv_counts[q] must be rank q's send_counts[p]");
    CHECK(recv == std::vector<float>(7, -1.0f));
    recv_counts[2] = 2;
    c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, dtype::f32, be.reduce_stream());
    be.synchronize(be.reduce_stream());
    CHECK(std::vector<float>(recv.begin(), recv.begin() + 6) == std::vector<float>(6, 1.0f));
  });
  // An even all_to_all on one rank and an uneven one on the other are different collectives.
  const std::string kinds = error_of<fsdp::comm_error>([] {
    run_ranks(2, [](local_communicator& c) {
      fsdp::backend::host be(c.rank());
      std::vector<float> send(2, 1.0f), recv(2);
      const std::vector<std::int64_t> one{1, 1};
      if (c.rank() == 0)
        c.all_to_all(send.data(), recv.data(), 1, dtype::f32, be.compute_stream());
      else
        c.all_to_all_v(send.data(), one, recv.data(), one, dtype::f32, be.compute_stream());
      be.synchronize(be.compute_stream());
    });
  });
  CHECK(kinds.find("collective mismatch at #0") != std::string::npos);
  CHECK(kinds.find("all_to_all(count=1, f32)") != std::string::npos);
  CHECK(kinds.find("all_to_all_v(send=[1, 1], recv=[1, 1], f32)") != std::string::npos);
  // A large group's counts are named in part.
  fsdp::comm::detail::op_desc wide{int(fsdp::collective::all_to_all_v), 0, dtype::bf16, reduce_op::sum, 0};
  for (int q = 0; q < 2 * 20; ++q) wide.counts.push_back(q % 20);
  CHECK(wide.str() ==
        "all_to_all_v(send=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ... 4 more], recv=[0, 1, "
        "2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ... 4 more], bf16)");
}

TEST_CASE(
    "all_to_all_v: a mixture of experts' dispatch and combine: each token reaches the rank of the expert its router "
    "chose, and comes back in its place with that expert's output") {
  // 4 ranks, 2 experts each (expert e on rank e / 2); 6 tokens a rank of width 3; token t of rank r goes to expert
  // (5 r + 3 t) % 8. Expert e multiplies a token by (e + 1) and adds 100 r', r' the expert's rank.
  constexpr int world = 4, experts_per_rank = 2, tokens = 6, width = 3;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    auto& s = be.compute_stream();
    const int r = c.rank();
    const auto expert_of = [](int rank, int t) { return (5 * rank + 3 * t) % (world * experts_per_rank); };
    const auto value = [](int rank, int t, int i) { return float(100 * rank + 10 * t + i); };
    // The trainer's side: its tokens sorted by destination rank, and how many go to each.
    std::vector<std::int64_t> send_counts(world, 0);
    std::vector<std::vector<int>> by_dest(world);
    for (int t = 0; t < tokens; ++t) by_dest[std::size_t(expert_of(r, t) / experts_per_rank)].push_back(t);
    std::vector<float> send;
    std::vector<int> sent_expert;  // each sent token's expert, in the send order
    for (int q = 0; q < world; ++q) {
      send_counts[std::size_t(q)] = std::int64_t(by_dest[std::size_t(q)].size()) * width;
      for (int t : by_dest[std::size_t(q)]) {
        for (int i = 0; i < width; ++i) send.push_back(value(r, t, i));
        sent_expert.push_back(expert_of(r, t));
      }
    }
    // 1. The counts, one per pair, by an even all_to_all of their 8 bytes: what every rank will send this one. The
    //    trainer waits for them on the host, to size its receive buffer.
    std::vector<std::int64_t> counts_in(world, 0);
    c.all_to_all(send_counts.data(), counts_in.data(), sizeof(std::int64_t), dtype::i8, s);
    be.synchronize(s);
    // 2. Dispatch: the tokens and, in a second exchange of the same shape, each token's expert.
    std::int64_t received = 0;
    for (std::int64_t n : counts_in) received += n;
    std::vector<float> got(std::size_t(received), -1.0f);
    c.all_to_all_v(send.data(), send_counts, got.data(), counts_in, dtype::f32, s);
    std::vector<std::int64_t> send_ids, recv_ids;
    for (int q = 0; q < world; ++q) {
      send_ids.push_back(send_counts[std::size_t(q)] / width);
      recv_ids.push_back(counts_in[std::size_t(q)] / width);
    }
    std::vector<float> experts_sent(sent_expert.begin(), sent_expert.end()), experts_got(std::size_t(received / width));
    c.all_to_all_v(experts_sent.data(), send_ids, experts_got.data(), recv_ids, dtype::f32, s);
    be.synchronize(s);
    // 3. The experts: every token that arrived is for an expert of this rank.
    std::vector<float> out(got.size());
    for (std::size_t k = 0; k < experts_got.size(); ++k) {
      const int e = int(experts_got[k]);
      CHECK(e / experts_per_rank == r);
      for (int i = 0; i < width; ++i)
        out[k * width + std::size_t(i)] = got[k * width + std::size_t(i)] * float(e + 1) + float(100 * r);
    }
    // 4. Combine: the same exchange backwards (the counts swap sides).
    std::vector<float> back(send.size(), -1.0f);
    c.all_to_all_v(out.data(), counts_in, back.data(), send_counts, dtype::f32, s);
    be.synchronize(s);
    std::size_t k = 0;
    for (int q = 0; q < world; ++q)
      for (int t : by_dest[std::size_t(q)]) {
        const int e = expert_of(r, t);
        for (int i = 0; i < width; ++i)
          CHECK(back[k * width + std::size_t(i)] == value(r, t, i) * float(e + 1) + float(100 * q));
        ++k;
      }
    CHECK(c.stats()[fsdp::collective::all_to_all_v] == 3);
    CHECK(c.stats()[fsdp::collective::all_to_all] == 1);
  });
}

TEST_CASE("all_to_all_v: what one rank can tell is wrong is refused at the call, naming the rank and the count") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    auto& s = be.compute_stream();
    const std::string r = std::to_string(c.rank());
    std::vector<float> a(8), b(8);
    const auto call = [&](std::vector<std::int64_t> send_counts, std::vector<std::int64_t> recv_counts,
                          const void* send, void* recv) {
      return error_of<fsdp::usage_error>([&] { c.all_to_all_v(send, send_counts, recv, recv_counts, dtype::f32, s); });
    };
    CHECK(call({1, 1, 1}, {1, 1}, a.data(), b.data()) ==
          "fsdp: all_to_all_v on rank " + r +
              ": send_counts has 3 counts for a group of 2 ranks; give one count per rank");
    CHECK(call({1, 1}, {1}, a.data(), b.data()) ==
          "fsdp: all_to_all_v on rank " + r +
              ": recv_counts has 1 counts for a group of 2 ranks; give one count per rank");
    CHECK(call({1, -2}, {1, 1}, a.data(), b.data()) ==
          "fsdp: all_to_all_v on rank " + r + ": send_counts[1] is -2; a count must not be negative");
    std::vector<std::int64_t> self_send{1, 1}, self_recv{1, 1};
    self_recv[std::size_t(c.rank())] = 2;
    CHECK(call(self_send, self_recv, a.data(), b.data()) ==
          "fsdp: all_to_all_v on rank " + r + ": it sends itself 1 elements (send_counts[" + r +
              "]) but receives 2 from itself (recv_counts[" + r + "]); the two must be equal");
    CHECK(call({2, 2}, {2, 2}, a.data(), a.data() + 3) ==
          "fsdp: all_to_all_v on rank " + r +
              ": the send buffer (16 bytes) and the receive buffer (16 bytes) overlap; give it two buffers apart");
    CHECK(c.stats()[fsdp::collective::all_to_all_v] == 0);  // nothing refused was issued
  });
}

TEST_CASE("bf16 and fp16 reductions: rank order, rounded after every addition, averages pre-multiplied") {
  for (int world = 1; world <= 5; ++world) {
    CAPTURE(world);
    check_16bit<fsdp::bfloat16>(world);
    check_16bit<fsdp::float16>(world);
  }
  // rounding after every addition is not rounding once: 256 + 1 + 1 in bf16 (8 bits) is 256, not 258
  run_ranks(3, [](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    fsdp::bfloat16 x(c.rank() == 0 ? 256.0f : 1.0f);
    c.all_reduce(&x, &x, 1, dtype::bf16, reduce_op::sum, be.reduce_stream());
    be.synchronize(be.reduce_stream());
    CHECK(float(x) == 256.0f);
  });
  // an fp16 average stays in range where the sum would not: 60000 at 2 ranks averages to 60000, sums to inf
  run_ranks(2, [](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    fsdp::float16 avg(60000.0f), sum(60000.0f);
    c.all_reduce(&avg, &avg, 1, dtype::f16, reduce_op::avg, be.reduce_stream());
    c.all_reduce(&sum, &sum, 1, dtype::f16, reduce_op::sum, be.reduce_stream());
    be.synchronize(be.reduce_stream());
    CHECK(float(avg) == 60000.0f);
    CHECK(std::isinf(float(sum)));
  });
}

TEST_CASE("collectives on two streams are matched by issue order, not by arrival") {
  run_ranks(3, [](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    // Rank-dependent delays on the gather stream make the reduce stream reach its collective first on some ranks.
    be.gather_stream().submit([r = c.rank()] { std::this_thread::sleep_for(std::chrono::milliseconds(20 * r)); });
    std::vector<float> g(3), gall(9), x(9, 1.0f), y(3);
    for (auto& v : g) v = float(c.rank());
    c.all_gather(g.data(), gall.data(), 3, dtype::f32, be.gather_stream());
    c.reduce_scatter(x.data(), y.data(), 3, dtype::f32, reduce_op::sum, be.reduce_stream());
    be.synchronize(be.gather_stream());
    be.synchronize(be.reduce_stream());
    for (int i = 0; i < 9; ++i) CHECK(gall[i] == float(i / 3));
    for (float v : y) CHECK(v == 3.0f);
  });
}

TEST_CASE("a collective waits for earlier work on its stream") {
  run_ranks(2, [](local_communicator& c) {
    fsdp::backend::host be(c.rank());
    auto& s = be.gather_stream();
    std::vector<float> x(4, 0.0f), all(8);
    s.submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      for (auto& v : x) v = 5.0f;
    });
    c.all_gather(x.data(), all.data(), 4, dtype::f32, s);
    be.synchronize(s);
    for (float v : all) CHECK(v == 5.0f);
  });
}

TEST_CASE("world size 0 is rejected") {
  CHECK(error_of<fsdp::usage_error>([] { fsdp::comm::run_local(0, [](local_communicator&) {}); }) ==
        "fsdp: world size must be positive, got 0");
  CHECK(error_of<fsdp::usage_error>([] { fsdp::comm::run_local(-2, [](local_communicator&) {}); }) ==
        "fsdp: world size must be positive, got -2");
}

TEST_CASE("ranks that disagree on the collective fail with both named") {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of<fsdp::comm_error>([] {
    run_ranks(2, [](local_communicator& c) {
      fsdp::backend::host be(c.rank());
      std::vector<float> x(8), y(16);
      if (c.rank() == 0) c.all_gather(x.data(), y.data(), 8, dtype::f32, be.gather_stream());
      else c.reduce_scatter(y.data(), x.data(), 8, dtype::f32, reduce_op::sum, be.gather_stream());
      be.synchronize(be.gather_stream());
    });
  });
  CHECK(msg.find("collective mismatch at #0") != std::string::npos);
  CHECK(msg.find("all_gather(count=8, f32)") != std::string::npos);
  CHECK(msg.find("reduce_scatter(count=8, f32, sum)") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // failed fast, did not wait out a timeout
}

TEST_CASE("a rank that returns without issuing a collective fails the others at once, named") {
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    fsdp::comm::run_local(
        2,
        [](local_communicator& c) {
          if (c.rank() == 1) return;  // done early: issues nothing more
          fsdp::backend::host be(c.rank());
          std::vector<float> x(2), y(4);
          c.all_gather(x.data(), y.data(), 2, dtype::f32, be.gather_stream());
          be.synchronize(be.gather_stream());
        },
        {.timeout = std::chrono::seconds(30)});
  } catch (const fsdp::comm_error& e) {
    msg = e.what();
  }
  CHECK(msg ==
        "fsdp: local all_gather(count=2, f32) #0 on rank 0 cannot complete: rank(s) 1 returned without issuing it");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // not the 30 s timeout
}

TEST_CASE(
    "a rank that returns: the survivors' collective fails naming it, and shrink() gives them a group of "
    "their own, ranked as before, that works") {
  std::vector<std::string> errors(4);
  std::vector<std::vector<int>> members(4);
  std::vector<float> sums(4, 0.0f);
  std::vector<int> places(4, -1);
  run_ranks(4, [&](local_communicator& c) {
    const int r = c.rank();
    if (r == 2) return;  // rank 2 fails: it issues nothing more
    fsdp::backend::host be(r);
    float x = static_cast<float>(r + 1), y = 0;
    errors[r] = error_of<fsdp::comm_error>([&] { c.barrier(); });  // a quorum between steps, on this thread
    local_communicator survivors = c.shrink(&members[r]);
    places[r] = survivors.rank();
    survivors.all_reduce(&x, &y, 1, dtype::f32, reduce_op::sum, be.compute_stream());
    be.synchronize(be.compute_stream());
    sums[r] = y;
  });
  for (int r : {0, 1, 3}) {
    CAPTURE(r);
    CHECK(errors[r].find("rank(s) 2 returned without issuing it") != std::string::npos);
    CHECK(members[r] == std::vector<int>{0, 1, 3});
    CHECK(sums[r] == 1.0f + 2.0f + 4.0f);
  }
  CHECK(places == std::vector<int>{0, 1, -1, 2});
}

TEST_CASE(
    "a rank that throws, as a real trainer's failing rank does: the survivors see the abort naming it, shrink() "
    "does not wait for it, their group works, and run_local rethrows the rank's own error once every rank ended") {
  std::vector<std::string> errors(4);
  std::vector<std::vector<int>> members(4);
  std::vector<float> sums(4, 0.0f);
  std::string rethrown;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fsdp::comm::run_local(4,
                          [&](local_communicator& c) {
                            const int r = c.rank();
                            if (r == 2) throw std::runtime_error("rank 2's trainer failed");
                            fsdp::backend::host be(r);
                            float x = static_cast<float>(r + 1), y = 0;
                            errors[r] = error_of<fsdp::comm_error>([&] { c.barrier(); });
                            local_communicator survivors = c.shrink(&members[r]);
                            survivors.all_reduce(&x, &y, 1, dtype::f32, reduce_op::sum, be.compute_stream());
                            be.synchronize(be.compute_stream());
                            sums[r] = y;
                          },
                          {.timeout = std::chrono::seconds(30)});
  } catch (const std::runtime_error& e) {
    rethrown = e.what();
  }
  CHECK(rethrown == "rank 2's trainer failed");
  for (int r : {0, 1, 3}) {
    CAPTURE(r);
    // the barrier either waited for rank 2 when it failed, or came after: the same reason either way
    CHECK(errors[r] ==
          "fsdp: local barrier #0 on rank " + std::to_string(r) + " aborted: rank 2 failed: rank 2's trainer failed");
    CHECK(members[r] == std::vector<int>{0, 1, 3});
    CHECK(sums[r] == 1.0f + 2.0f + 4.0f);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // not the 30 s timeout
}

TEST_CASE(
    "a timeout names the rank the world waits for: on a 2 x 2 grid whose rank 3 stalls, rank 0's replica "
    "all-reduce waits for rank 2, which is itself waiting for rank 3 in its shard group") {
  using namespace std::chrono_literals;
  std::string replica_error, shard_error;
  fsdp::comm::run_local(
      4,
      [&](local_communicator& c) {
        const int r = c.rank();
        local_communicator shard = c.split(r / 2, r), replica = c.split(r % 2, r);  // {0, 1}, {2, 3}; {0, 2}, {1, 3}
        fsdp::backend::host be(r);
        float x = 1.0f, y = 0.0f;
        const auto all_reduce_on = [&](local_communicator& g) {
          return error_of<fsdp::comm_error>([&] {
            g.all_reduce(&x, &y, 1, dtype::f32, reduce_op::sum, be.compute_stream());
            be.synchronize(be.compute_stream());
          });
        };
        if (r == 0) replica_error = all_reduce_on(replica);  // waits for rank 2 (its rank 1) from the start
        if (r == 2) {  // waits for rank 3 in its shard group from 100 ms on: it times out after rank 0
          std::this_thread::sleep_for(100ms);
          shard_error = all_reduce_on(shard);
        }
        if (r == 3) std::this_thread::sleep_for(700ms);  // stalls past every timeout, in no collective
      },
      {.timeout = 300ms});
  CHECK(replica_error ==
        "fsdp: local[ranks 0, 2] all_reduce(count=1, f32, sum) #0 on rank 0 timed out after 300 ms waiting for the "
        "other ranks: rank(s) 1 never issued it; rank 1 here is world rank 2, itself waiting in local[ranks 2, 3] "
        "all_reduce(count=1, f32, sum) #0 on rank 0 for world rank(s) 3; world rank 3 is in no collective: the world "
        "waits for it");
  CHECK(shard_error ==
        "fsdp: local[ranks 2, 3] all_reduce(count=1, f32, sum) #0 on rank 0 timed out after 300 ms waiting for the "
        "other ranks: rank(s) 1 never issued it; rank 1 here is world rank 3, which is in no collective");
}

TEST_CASE(
    "shrink(): a survivor that neither calls it nor returns within the timeout fails it on every caller, "
    "named") {
  std::vector<std::string> errors(3);
  fsdp::comm::run_local(3,
                        [&](local_communicator& c) {
                          if (c.rank() == 2) {  // alive, but late: past the others' timeout
                            std::this_thread::sleep_for(std::chrono::milliseconds(600));
                            return;
                          }
                          errors[static_cast<std::size_t>(c.rank())] = error_of<fsdp::comm_error>([&] { c.shrink(); });
                        },
                        {.timeout = std::chrono::milliseconds(200)});
  for (int r : {0, 1})
    CHECK(errors[r] == "fsdp: local shrink #0 on rank " + std::to_string(r) +
                           ": rank(s) 2 neither called shrink() nor returned within 200 ms (every surviving rank must "
                           "call it)");
}

TEST_CASE(
    "grow(): after a shrink, two newcomers join the survivors' group as ranks 2 and 3 (start_joining runs them) "
    "and every rank's collectives work") {
  std::vector<float> sums(4, 0.0f);  // by rank in the grown group
  std::vector<int> sizes(4, 0);
  std::future<void> joined;
  run_ranks(3, [&](local_communicator& c) {
    const int r = c.rank();
    if (r == 1) return;  // rank 1 fails
    fsdp::backend::host be(r);
    error_of<fsdp::comm_error>([&] { c.barrier(); });
    local_communicator survivors = c.shrink();
    fsdp::comm::local_invitation invitation;
    local_communicator grown = survivors.grow(2, &invitation);
    CHECK(invitation.first == 2);
    CHECK(invitation.newcomers == 2);
    const auto sum = [&](local_communicator& g, fsdp::backend::host& b) {
      float x = static_cast<float>(g.rank() + 1), y = 0;
      g.all_reduce(&x, &y, 1, dtype::f32, reduce_op::sum, b.compute_stream());
      b.synchronize(b.compute_stream());
      sums[static_cast<std::size_t>(g.rank())] = y;
      sizes[static_cast<std::size_t>(g.rank())] = g.size();
    };
    if (grown.rank() == 0)  // survivor 0 hands the invitation to the newcomers' threads; they may outlive this
                            // thread, so they hold a copy of `sum` (whose references are to the test's vectors)
      joined = fsdp::comm::start_joining(invitation, [sum](local_communicator& g) {
        fsdp::backend::host nb(10 + g.rank());
        sum(g, nb);
      });
    sum(grown, be);
  });
  joined.get();
  CHECK(sums == std::vector<float>(4, 1.0f + 2.0f + 3.0f + 4.0f));
  CHECK(sizes == std::vector<int>(4, 4));
}

TEST_CASE(
    "grow(): ranks that ask for different numbers of newcomers are refused, naming both; a newcomer that fails "
    "aborts the grown group and is the error start_joining's future gives") {
  std::vector<std::string> errors(2);
  run_ranks(2, [&](local_communicator& c) {
    fsdp::comm::local_invitation invitation;
    errors[static_cast<std::size_t>(c.rank())] =
        error_of<fsdp::usage_error>([&] { c.grow(c.rank() + 1, &invitation); });
  });
  CHECK(errors[0] ==
        "fsdp: grow: rank 0 asks for 1 newcomers and rank 1 for 2: every rank of the group passes the "
        "same number");
  std::string failed, survivor;
  std::future<void> joined;
  run_ranks(2, [&](local_communicator& c) {
    fsdp::comm::local_invitation invitation;
    local_communicator grown = c.grow(1, &invitation);
    if (grown.rank() == 0)
      joined = fsdp::comm::start_joining(
          invitation, [](local_communicator&) { throw std::runtime_error("newcomer's disk is full"); });
    fsdp::backend::host be(c.rank());
    float x = 1, y = 0;
    const std::string e = error_of<fsdp::comm_error>([&] {
      grown.all_reduce(&x, &y, 1, dtype::f32, reduce_op::sum, be.compute_stream());
      be.synchronize(be.compute_stream());
    });
    if (c.rank() == 1) survivor = e;
  });
  failed = error_of<std::runtime_error>([&] { joined.get(); });
  CHECK(failed == "newcomer's disk is full");
  CHECK(survivor.find("rank 2 failed: newcomer's disk is full") != std::string::npos);
}

TEST_CASE("a rank that stalls without issuing a collective makes the others fail within the timeout") {
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    fsdp::comm::run_local(
        3,
        [](local_communicator& c) {
          if (c.rank() == 1) {  // still running, issuing nothing, past the others' timeout
            std::this_thread::sleep_for(std::chrono::milliseconds(600));
            return;
          }
          fsdp::backend::host be(c.rank());
          std::vector<float> x(2), y(6);
          c.all_gather(x.data(), y.data(), 2, dtype::f32, be.gather_stream());
          be.synchronize(be.gather_stream());
        },
        {.timeout = std::chrono::milliseconds(200)});
  } catch (const fsdp::comm_error& e) {
    msg = e.what();
  }
  CHECK(msg.find("all_gather(count=2, f32) #0") != std::string::npos);
  CHECK(msg.find("timed out after 200 ms") != std::string::npos);
  CHECK(msg.find("rank(s) 1 never issued it") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("a rank that throws aborts the group; its own error is reported") {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of<std::runtime_error>([] {
    run_ranks(4, [](local_communicator& c) {
      if (c.rank() == 2) throw std::runtime_error("rank two broke");
      fsdp::backend::host be(c.rank());
      std::vector<float> x(1), y(4);
      c.all_gather(x.data(), y.data(), 1, dtype::f32, be.gather_stream());
      be.synchronize(be.gather_stream());
    });
  });
  CHECK(msg == "rank two broke");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // not the 10 s collective timeout
}

TEST_CASE("a rank whose thread cannot start: the started ranks are stopped and the error names the rank") {
#if FSDP_TEST_SANITIZED
  MESSAGE("not run under a sanitizer: its shadow memory does not fit the address-space limit this case sets");
#else
  // A child process under a 1 GiB address-space limit asks for 1025 thread ranks, each waiting in a barrier for
  // all the others: thread creation fails part way (each thread reserves its stack). Before, this was
  // "terminate called without an active exception" (std::thread destroyed joinable), exit 134; and where memory ran
  // out before the system refused a thread (std::bad_alloc for a thread's state, or in a started rank's abort),
  // "terminate called after throwing an instance of 'std::bad_alloc'" (once in the plain `bazel test` here).
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    const rlimit lim{rlim_t(1) << 30, rlim_t(1) << 30};
    std::string out;
    if (setrlimit(RLIMIT_AS, &lim) != 0) {
      out = "setrlimit failed";
    } else {
      try {
        fsdp::comm::run_local(1025, [](local_communicator& c) { c.barrier(); });
        out = "no error";
      } catch (const fsdp::comm_error& e) {
        out = e.what();
      } catch (const std::exception& e) {
        out = std::string("another error: ") + e.what();
      }
    }
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));  // not killed by abort()
  CHECK(WEXITSTATUS(status) == 0);
  const std::string head = "fsdp: could not start the thread of rank ";
  REQUIRE(msg.rfind(head, 0) == 0);
  const int r = std::stoi(msg.substr(head.size()));
  CHECK(r > 0);
  CHECK(r < 1025);
  // The system refuses the thread (EAGAIN), or memory for the thread's state runs out first (its stack and the
  // started threads' malloc arenas share the limit): either is a thread that cannot start.
  const auto expected = [&](const std::string& cause) {
    return head + std::to_string(r) + " of 1025 (" + cause + "); the " + std::to_string(r) +
           " rank(s) already started were stopped. Lower the world size or raise the process's thread or "
           "address-space limit (ulimit -u / -v)";
  };
  CHECK_MESSAGE((msg == expected("Resource temporarily unavailable") || msg == expected("std::bad_alloc")), msg);
#endif
}

TEST_CASE("barrier and bad arguments") {
  std::atomic<int> before{0};
  run_ranks(4, [&](local_communicator& c) {
    before.fetch_add(1);
    c.barrier();
    CHECK(before.load() == 4);
    fsdp::backend::host be(c.rank());
    std::vector<float> x(1);
    CHECK(error_of<fsdp::usage_error>([&] { c.broadcast(x.data(), x.data(), 1, dtype::f32, 4, be.gather_stream()); }) ==
          "fsdp: broadcast root 4 is outside the group of 4");
    // The checks every communicator shares (comm::detail::require_count, require_color), in comm::local's words.
    CHECK(error_of<fsdp::usage_error>([&] { c.all_gather(x.data(), x.data(), -1, dtype::f32, be.gather_stream()); }) ==
          "fsdp: all_gather(count=-1, f32) on rank " + std::to_string(c.rank()) + ": negative count");
    CHECK(error_of<fsdp::usage_error>([&] { c.split(-1, 0); }) ==
          "fsdp: split on rank " + std::to_string(c.rank()) + ": color must be >= 0, got -1");
  });
  auto g = std::make_shared<fsdp::comm::detail::local_group>(2, std::chrono::milliseconds(100));
  CHECK(error_of<fsdp::usage_error>([&] { local_communicator(g, 2); }) ==
        "fsdp: rank 2 is outside the local group of size 2");
}

TEST_CASE("a modelled link: each collective takes at least latency + bytes x factor / bandwidth") {
  using namespace std::chrono;
  fsdp::comm::link_model link{.bytes_per_second = 1e6, .latency = microseconds(500)};
  // the formula, for 4 ranks and 40 000 unsharded bytes
  CHECK(link.duration(fsdp::collective::all_gather, 40000, 4) == microseconds(500) + microseconds(30000));
  CHECK(link.duration(fsdp::collective::reduce_scatter, 40000, 4) == microseconds(30500));
  CHECK(link.duration(fsdp::collective::all_reduce, 40000, 4) == microseconds(60500));
  CHECK(link.duration(fsdp::collective::broadcast, 40000, 4) == microseconds(40500));
  CHECK(link.duration(fsdp::collective::all_gather, 40000, 1) == nanoseconds(0));  // a group of one
  CHECK(fsdp::comm::link_model{}.duration(fsdp::collective::all_gather, 40000, 4) == nanoseconds(0));

  for (bool move : {true, false}) {
    CAPTURE(move);
    fsdp::comm::local_options lo;
    lo.timeout = fsdp_test::timeout;
    lo.link = link;
    lo.link.move_data = move;
    fsdp::comm::run_local(
        2,
        [&](local_communicator& c) {
          fsdp::backend::host be(c.rank());
          std::vector<float> mine(2500, float(c.rank() + 1)), all(5000, -1.0f);
          const auto t0 = steady_clock::now();
          c.all_gather(mine.data(), all.data(), 2500, dtype::f32, be.gather_stream());  // 20 000 B: 10.5 ms
          be.synchronize(be.gather_stream());
          CHECK(steady_clock::now() - t0 >= microseconds(10500));
          if (move) {
            CHECK(all[0] == 1.0f);
            CHECK(all[4999] == 2.0f);
          } else {
            CHECK(all[0] == -1.0f);  // timing only: buffers untouched
            CHECK(all[4999] == -1.0f);
          }
        },
        lo);
  }
  CHECK(error_of<fsdp::usage_error>([] {
          fsdp::comm::local_options lo;
          lo.link.bytes_per_second = -1;
          fsdp::comm::run_local(1, [](local_communicator&) {}, lo);
        }) == "fsdp: link bandwidth must be >= 0, got -1");
}

TEST_CASE("set_link: a group made on a link that moves data times later collectives on another") {
  using std::chrono::microseconds;
  using std::chrono::steady_clock;
  // A Model's construction compares the ranks' fingerprints through collectives: a timing study makes it on a
  // link that moves data, then switches to one that does not (bench/overlap_bench.cc).
  fsdp::comm::run_local(
      2,
      [&](local_communicator& c) {
        fsdp::backend::host be(c.rank());
        std::vector<float> mine(2500, float(c.rank() + 1)), all(5000, -1.0f);
        c.all_gather(mine.data(), all.data(), 2500, dtype::f32, be.gather_stream());
        be.synchronize(be.gather_stream());
        CHECK(all[4999] == 2.0f);  // moved
        fsdp::comm::local_communicator half = c.split(0, c.rank());  // a sub-group made before: set_link reaches it
        c.barrier();
        if (c.rank() == 0) c.set_link({.bytes_per_second = 1e6, .latency = microseconds(500), .move_data = false});
        c.barrier();
        std::fill(all.begin(), all.end(), -1.0f);
        const auto t0 = steady_clock::now();
        c.all_gather(mine.data(), all.data(), 2500, dtype::f32, be.gather_stream());  // 20 000 B: 10.5 ms
        be.synchronize(be.gather_stream());
        CHECK(steady_clock::now() - t0 >= microseconds(10500));
        CHECK(all[4999] == -1.0f);  // timing only
        half.all_gather(mine.data(), all.data(), 2500, dtype::f32, be.gather_stream());
        be.synchronize(be.gather_stream());
        CHECK(all[4999] == -1.0f);  // in the sub-group too
        c.barrier();
        if (c.rank() == 0) c.set_link({});
        c.barrier();
        c.all_gather(mine.data(), all.data(), 2500, dtype::f32, be.gather_stream());
        be.synchronize(be.gather_stream());
        CHECK(all[4999] == 2.0f);  // moved again
        std::fill(all.begin(), all.end(), -1.0f);
        half.all_gather(mine.data(), all.data(), 2500, dtype::f32, be.gather_stream());
        be.synchronize(be.gather_stream());
        CHECK(all[4999] == 2.0f);
      },
      [] {
        fsdp::comm::local_options lo;
        lo.timeout = fsdp_test::timeout;
        return lo;
      }());
  CHECK(error_of<fsdp::usage_error>([] {
          fsdp::comm::run_local(1, [](local_communicator& c) { c.set_link({.bytes_per_second = -1}); });
        }) == "fsdp: link bandwidth must be >= 0, got -1");
}

TEST_CASE(
    "a modelled cluster: every group, split, shrunk or grown, is timed on the link where its ranks sit, the "
    "links place_on_cluster gives the timeline planner") {
  using std::chrono::microseconds;
  fsdp::comm::cluster_links c{
      .gpus_per_node = 4,
      .intra = {.bytes_per_second = 100e9, .latency = microseconds(5)},
      .inter = {.bytes_per_second = 10e9, .latency = microseconds(20), .step_latency = microseconds(2)}};
  const fsdp::device_mesh mesh{.replicas = 2, .shards = 2, .tensor = 2};
  fsdp::time_model t;
  fsdp::place_on_cluster(t, c, mesh);
  struct seen {
    fsdp::comm::link_model world, shard, replica, tensor;
  };
  std::vector<seen> links(8);
  fsdp::comm::local_options o;
  o.cluster = c;
  fsdp::comm::run_local(
      8,
      [&](local_communicator& w) {
        auto g = fsdp::detail::exec::split_world(w, mesh, true);  // as a Model splits its communicator
        links[static_cast<std::size_t>(w.rank())] = {w.link(), g.of(fsdp::mesh_group::shard)->link(),
                                                     g.of(fsdp::mesh_group::replicate)->link(),
                                                     g.of(fsdp::mesh_group::tensor)->link()};
      },
      o);
  auto same = [](const fsdp::comm::link_model& a, const fsdp::comm::link_model& b) {
    return a.bytes_per_second == b.bytes_per_second && a.latency == b.latency && a.step_latency == b.step_latency;
  };
  for (std::size_t r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(links[r].world.bytes_per_second == 40e9);  // 8 ranks on 2 nodes: 4 GPUs' share of the network
    CHECK(same(links[r].shard, t.link));             // {0, 2}: one node, NVLink
    CHECK(same(links[r].replica, t.replica_link));   // {0, 4}: across nodes
    CHECK(same(links[r].tensor, t.tensor_link));
    CHECK(links[r].shard.bytes_per_second == 100e9);
    CHECK(links[r].replica.bytes_per_second == 10e9);
    CHECK(links[r].replica.step_latency == microseconds(2));
  }

  // 4 ranks on 2 nodes of 2; rank 3 fails: the survivors {0, 1} on node 0 and {2} on node 1 run at one GPU's share;
  // a newcomer takes place 3, and the grown group is two a node again
  c.gpus_per_node = 2;
  o.cluster = c;
  std::vector<double> shrunk(3), grown(4);
  std::future<void> joined;
  fsdp::comm::run_local(
      4,
      [&](local_communicator& w) {
        if (w.rank() == 3) return;
        error_of<fsdp::comm_error>([&] { w.barrier(); });
        local_communicator s = w.shrink();
        shrunk[static_cast<std::size_t>(s.rank())] = s.link().bytes_per_second;
        fsdp::comm::local_invitation invitation;
        local_communicator g = s.grow(1, &invitation);
        grown[static_cast<std::size_t>(g.rank())] = g.link().bytes_per_second;
        if (g.rank() == 0)
          joined = fsdp::comm::start_joining(invitation, [&grown](local_communicator& n) {
            grown[static_cast<std::size_t>(n.rank())] = n.link().bytes_per_second;
          });
        if (g.rank() == 0) joined.get();
      },
      o);
  CHECK(shrunk == std::vector<double>(3, 10e9));
  CHECK(grown == std::vector<double>(4, 20e9));
}
