// The three-step rendezvous behind comm::local on one GPU (detail/local_group.hpp: meet, part, abandon), with plain
// host tokens standing for the CUDA events: the ordering that keeps every rank's events and buffers alive while
// another rank may still use them. (What the CUDA calls then do needs a GPU: tests/cuda.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/comm/detail/local_group.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/support.hpp"

namespace {

using namespace std::chrono_literals;
using fsdp::comm::detail::local_group;
using fsdp::comm::detail::op_desc;
using clock_type = std::chrono::steady_clock;

const op_desc gather8{int(fsdp::collective::all_gather), 8, fsdp::dtype::f32, fsdp::reduce_op::sum, 0};

/// Tokens by name ("m0, m1, -"): which rank's mark each entry is, "-" for none.
std::string names(const std::vector<const void*>& tokens, const int* marks, int world) {
  std::string s;
  for (const void* t : tokens) {
    std::string n = "?";
    if (!t) n = "-";
    for (int q = 0; q < world; ++q)
      if (t == &marks[q]) n = "m" + std::to_string(q);
    s += (s.empty() ? "" : ", ") + n;
  }
  return s;
}

long long ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

template <class F>
void on_threads(int world, F&& fn) {
  std::vector<std::thread> t;
  for (int r = 0; r < world; ++r) t.emplace_back([&, r] { fn(r); });
  for (auto& x : t) x.join();
}

}  // namespace

TEST_CASE("local group part(): no rank leaves a collective before every rank has run before_leaving") {
  constexpr int world = 4, rounds = 5;
  local_group g(world, 10000ms);
  std::array<int, world> ready{}, mark{};
  std::array<std::array<std::atomic<bool>, world>, rounds> ran{};
  std::atomic<int> early{0}, wrong_tokens{0};
  on_threads(world, [&](int r) {
    for (int seq = 0; seq < rounds; ++seq) {
      (void)g.meet(seq, r, gather8, &ready[r]);
      g.part(seq, r, gather8, &mark[r], [&](const std::vector<const void*>& marks) {
        for (int q = 0; q < world; ++q) wrong_tokens += marks[q] != &mark[q];
        std::this_thread::sleep_for(std::chrono::milliseconds(5 * (world - r)));  // rank 0 is the slowest here
        ran[seq][r] = true;
      });
      // Leaving: this rank may now re-record or destroy its events. Every rank must have waited on them already.
      for (int q = 0; q < world; ++q) early += !ran[seq][q];
    }
  });
  CHECK(early.load() == 0);
  CHECK(wrong_tokens.load() == 0);
}

TEST_CASE("local group abandon(): a rank that failed after meet waits for every rank that met, and gets their marks") {
  constexpr int world = 3;
  local_group g(world, 10000ms);
  std::array<int, world> ready{}, mark{};
  std::array<clock_type::time_point, world> published{};
  clock_type::time_point abandon_returned{};
  std::vector<const void*> abandoned_with;
  std::array<std::vector<const void*>, world> aborted_with;
  std::array<std::string, world> errors;
  on_threads(world, [&](int r) {
    (void)g.meet(0, r, gather8, &ready[r]);
    if (r == 2) {  // its enqueueing failed: the others may already read its buffers
      abandoned_with = g.abandon(0, r, &mark[r], "rank 2 failed: boom");
      abandon_returned = clock_type::now();
      return;
    }
    std::this_thread::sleep_for(50ms);  // still enqueueing reads of rank 2's buffers
    published[r] = clock_type::now();
    try {
      g.part(0, r, gather8, &mark[r], {}, [&](const std::vector<const void*>& marks) { aborted_with[r] = marks; });
    } catch (const fsdp::comm_error& e) {
      errors[r] = e.what();
    }
  });
  // abandon() returned only after ranks 0 and 1 had finished enqueueing (published their marks)
  CHECK(ms_between(published[0], abandon_returned) >= 0);
  CHECK(ms_between(published[1], abandon_returned) >= 0);
  CHECK(names(abandoned_with, mark.data(), world) == "m0, m1, m2");
  CHECK(names(aborted_with[0], mark.data(), world) == "m0, m1, m2");
  CHECK(names(aborted_with[1], mark.data(), world) == "m0, m1, m2");
  CHECK(errors[0] == "fsdp: local all_gather(count=8, f32) #0 on rank 0 aborted: rank 2 failed: boom");
  CHECK(errors[1] == "fsdp: local all_gather(count=8, f32) #0 on rank 1 aborted: rank 2 failed: boom");
}

TEST_CASE("local group part(): a rank that met but never finishes makes the others fail within the timeout, named") {
  local_group g(2, 100ms);
  int ready[2] = {}, mark[2] = {};
  std::string error;
  std::vector<const void*> late;
  on_threads(2, [&](int r) {
    (void)g.meet(0, r, gather8, &ready[r]);
    if (r == 1) {  // stuck past the timeout, then gives up
      std::this_thread::sleep_for(300ms);
      late = g.abandon(0, r, &mark[r], "rank 1 gave up");
      return;
    }
    error = fsdp_test::error_of<fsdp::comm_error>([&] { g.part(0, r, gather8, &mark[r]); });
  });
  CHECK(error ==
        "fsdp: local all_gather(count=8, f32) #0 on rank 0 timed out after 100 ms waiting for the other ranks to "
        "finish: rank(s) 1 never finished it");
  CHECK(names(late, mark, 2) == "m0, m1");
}
