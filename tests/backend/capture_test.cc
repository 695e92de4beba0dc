// The host backend's capture (a CUDA graph's counterpart): between begin_capture() and end_capture() the calls that
// issue work are recorded and nothing runs; replay() issues them again, in order, across streams and events; what a
// captured step may not do is refused with a sentence.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <string>
#include <vector>

#include "tests/support/support.hpp"

using fsdp::mem;
using fsdp_test::error_of;

namespace {
/// x[i] = x[i] * 2 + 1: an element function whose repeats show in the result.
struct twice_plus_one {
  float* x;
  FSDP_HD void operator()(std::int64_t i) const { x[i] = x[i] * 2.0f + 1.0f; }
};
}  // namespace

TEST_CASE(
    "a captured step's calls run only when replayed, in their order, across streams and events; a wait on an event "
    "recorded before the capture is dropped") {
  fsdp::backend::host be;
  auto a = be.allocate(4 * sizeof(float), mem::grads, be.compute_stream());
  auto b = be.allocate(4 * sizeof(float), mem::grads, be.gather_stream());
  float* x = a.as<float>();
  float* y = b.as<float>();
  for (int i = 0; i < 4; ++i) x[i] = float(i);
  fsdp::backend::host::event ready, early;
  be.record(early, be.reduce_stream());
  be.begin_capture();
  be.wait(be.compute_stream(), early);  // recorded before the capture: dropped (a replay starts after it)
  CHECK(be.capturing());
  be.for_each(4, twice_plus_one{x}, be.compute_stream());  // x = 2x + 1
  be.record(ready, be.compute_stream());
  be.wait(be.gather_stream(), ready);
  be.copy(y, x, 4 * sizeof(float), be.gather_stream());                // y = x, after the kernel
  be.accumulate(y, x, fsdp::dtype::f32, 4, 1.0f, be.gather_stream());  // y += x
  const fsdp::backend::host::graph g = be.end_capture();
  CHECK_FALSE(be.capturing());
  CHECK(g.size() == 5);
  be.synchronize(be.gather_stream());
  for (int i = 0; i < 4; ++i) CHECK(x[i] == float(i));  // nothing ran
  const auto before = be.issued();
  be.replay(g);
  be.synchronize(be.gather_stream());
  for (int i = 0; i < 4; ++i) {
    CHECK(x[i] == 2.0f * i + 1.0f);
    CHECK(y[i] == 2.0f * (2.0f * i + 1.0f));
  }
  be.replay(g);
  be.synchronize(be.gather_stream());
  for (int i = 0; i < 4; ++i) {
    const float once = 2.0f * i + 1.0f, twice = 2.0f * once + 1.0f;
    CHECK(x[i] == twice);
    CHECK(y[i] == 2.0f * twice);
  }
  // each replay issues what an eager step would: two kernels, a copy, a record, a wait
  const auto replayed = be.issued() - before;
  CHECK(replayed.kernels == 4);
  CHECK(replayed.memory_ops == 2);
  CHECK(replayed.records == 2);
  CHECK(replayed.waits == 2);
  CHECK(be.replays() == 2);
}

TEST_CASE("a collective issued while capturing is issued again at each replay, matched in every rank's order") {
  fsdp_test::run_ranks(3, [](fsdp::comm::local_communicator& c) {
    fsdp::backend::host be(c.rank());
    auto buf = be.allocate(3 * sizeof(float), mem::comm_buffers, be.gather_stream());
    float* x = buf.as<float>();
    for (int i = 0; i < 3; ++i) x[i] = 0.0f;
    x[c.rank()] = 1.0f;
    be.begin_capture();
    c.all_reduce(x, x, 3, fsdp::dtype::f32, fsdp::reduce_op::sum, be.gather_stream());
    const auto g = be.end_capture();
    CHECK(g.size() == 1);
    be.synchronize(be.gather_stream());
    CHECK(x[c.rank()] == 1.0f);  // not yet
    for (int r = 0; r < 3; ++r) be.replay(g);
    be.synchronize(be.gather_stream());
    for (int i = 0; i < 3; ++i) CHECK(x[i] == 9.0f);  // 1, then 3 on every rank, then 9
  });
}

TEST_CASE("what a captured step may not do is refused, each with its sentence") {
  fsdp::backend::host be(2);
  auto held = be.allocate(64, mem::grads, be.compute_stream());
  std::vector<float> pageable(16);
  fsdp::backend::host::event e;
  be.begin_capture();
  const std::string head = "fsdp: backend::host on rank 2: ";
  const std::string during = " while a step is captured (begin_capture() to end_capture()): ";
  CHECK(error_of([&] { (void)be.allocate(256, mem::comm_buffers, be.compute_stream()); }) ==
        head + "allocate(256 bytes of comm buffers)" + during +
            "memory taken inside a captured step lies outside the plan (on a GPU, a graph allocation beside the pool "
            "the plan reserved); take it before the capture (an eager step first makes the step's slots)");
  CHECK(error_of([&] { be.release_after(std::move(held), be.compute_stream()); }) ==
        head + "release_after(64 bytes of grads)" + during +
            "memory given back inside a captured step would be given back at every replay; give it back after "
            "end_capture()");
  CHECK(error_of([&] { be.synchronize(be.reduce_stream()); }) ==
        head + "synchronize(stream 'rank2.reduce')" + during +
            "a captured step's work runs only when it is replayed, and nothing in it may wait on the host; "
            "synchronize after end_capture() or after a replay");
  CHECK(error_of([&] { (void)be.done(e); }) ==
        head + "done(event)" + during +
            "an event query inside a captured step asks about the capture, not about a replay; ask after "
            "end_capture()");
  CHECK(error_of([&] { be.upload(held.data(), pageable.data(), 64, be.upload_stream()); }) ==
        head + "an upload from pageable host memory" + during +
            "such a copy waits on the host for its stream (cudaMemcpyAsync from or to pageable memory); copy through "
            "allocate_host() memory");
  CHECK(error_of([&] { be.begin_capture(); }) ==
        head + "begin_capture()" + during + "a capture is already under way; end_capture() it first");
  const fsdp::backend::host::graph none;
  CHECK(error_of([&] { be.replay(none); }) ==
        head + "replay(graph)" + during + "a replay inside a capture is not recorded; replay after end_capture()");
  const auto g = be.end_capture();
  CHECK(g.size() == 0);
  CHECK(error_of([&] { (void)be.end_capture(); }) == head + "end_capture() without a begin_capture()");
  // pinned memory copies are captured, and a refused call left the capture as it was
  auto pinned = be.allocate_host(64, mem::grads);
  be.begin_capture();
  be.upload(held.data(), pinned.data(), 64, be.upload_stream());
  CHECK(be.end_capture().size() == 1);
  CHECK(held.bytes() == 64);  // still held: release_after was refused before it took the buffer
}
