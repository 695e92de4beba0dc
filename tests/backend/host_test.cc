// Host backend: streams run in order, events order streams, errors propagate instead of hanging, memory is
// accounted by category in program order.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <atomic>
#include <future>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/support/support.hpp"

using fsdp::mem;
using fsdp_test::error_of;

TEST_CASE("a worker stream runs its tasks in order, off the calling thread") {
  fsdp::backend::host be;
  std::vector<int> seen;
  std::thread::id worker;
  for (int i = 0; i < 100; ++i)
    be.gather_stream().submit([&, i] {
      seen.push_back(i);
      worker = std::this_thread::get_id();
    });
  be.synchronize(be.gather_stream());
  REQUIRE(seen.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(seen[i] == i);
  CHECK(worker != std::this_thread::get_id());
  // the compute stream is the calling thread
  std::thread::id inline_id;
  be.compute_stream().submit([&] { inline_id = std::this_thread::get_id(); });
  CHECK(inline_id == std::this_thread::get_id());
}

TEST_CASE(
    "run_if_idle: on an idle worker stream the task runs at once on the calling thread; on a busy one it does not "
    "run, and the worker takes nothing queued while such a task runs; its failure is the stream's") {
  fsdp::backend::host be;
  auto& s = be.gather_stream();
  std::thread::id ran_on;
  CHECK(s.run_if_idle([&] { ran_on = std::this_thread::get_id(); }));
  CHECK(ran_on == std::this_thread::get_id());
  // busy: a task runs on the worker until released
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> started{false};
  s.submit([&, released] {
    started = true;
    released.wait();
  });
  while (!started) std::this_thread::yield();
  bool ran = false;
  CHECK_FALSE(s.run_if_idle([&] { ran = true; }));
  release.set_value();
  be.synchronize(s);
  CHECK_FALSE(ran);
  // while a task runs inline, a task another thread submits waits for it, in order
  std::vector<int> order;
  std::atomic<bool> inline_running{false};
  std::thread other;
  CHECK(s.run_if_idle([&] {
    inline_running = true;
    other = std::thread([&] { s.submit([&] { order.push_back(2); }); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the worker could take it now, were it allowed
    order.push_back(1);
  }));
  other.join();
  be.synchronize(s);
  CHECK(order == std::vector<int>{1, 2});
  // a throw puts the stream in its error state: later tasks are skipped, synchronize rethrows
  CHECK(s.run_if_idle([] { throw std::runtime_error("collective failed"); }));
  bool skipped = true;
  CHECK(s.run_if_idle([&] { skipped = false; }));
  CHECK(skipped);
  CHECK(error_of<std::runtime_error>([&] { be.synchronize(s); }) == "collective failed");
}

TEST_CASE("an event orders one stream after another") {
  fsdp::backend::host be;
  std::atomic<int> value{0};
  int observed = -1;
  fsdp::backend::host::event ev;
  be.gather_stream().submit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    value = 42;
  });
  be.record(ev, be.gather_stream());
  be.wait(be.reduce_stream(), ev);
  be.reduce_stream().submit([&] { observed = value.load(); });
  be.synchronize(be.reduce_stream());
  CHECK(observed == 42);
  // the inline compute stream blocks the caller on wait
  be.gather_stream().submit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    value = 7;
  });
  be.record(ev, be.gather_stream());
  be.wait(be.compute_stream(), ev);
  CHECK(value.load() == 7);
  // waiting on an event never recorded is a no-op, as in CUDA
  fsdp::backend::host::event never;
  be.wait(be.compute_stream(), never);
}

TEST_CASE("a wait and the completion it waits for may meet in any order: none is missed, none returns early") {
  // The wait of the inline compute stream checks the event's marker without a lock, spins for host_options::spin,
  // and sleeps only when it is still not reached; the worker's completion notifies only while someone sleeps. The
  // worker itself spins for new work before it sleeps, and a submit notifies only a sleeping worker. 3000 rounds of
  // a record on the gather worker raced against the wait on the calling thread, with no spin (every hand-off a
  // sleep), the default spin, and a spin longer than any round: a missed wake-up is a timeout (comm_error) here,
  // and an early return a stale count.
  for (const auto spin :
       {std::chrono::microseconds(0), fsdp::backend::host_options{}.spin, std::chrono::microseconds(20000)}) {
    CAPTURE(spin.count());
    fsdp::backend::host_options opt;
    opt.wait_timeout = std::chrono::milliseconds(5000);
    opt.spin = spin;
    fsdp::backend::host be(0, opt);
    fsdp::backend::host::event ev;
    int count = 0;  // written by the gather worker, read by the calling thread after each wait
    for (int i = 1; i <= 3000; ++i) {
      if (i % 500 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // past the default spin
      be.gather_stream().submit([&count, i] {
        if (i % 3 == 0) std::this_thread::yield();  // some completions land after the wait began, some before
        count = i;
      });
      be.record(ev, be.gather_stream());
      if (i % 2 == 0) std::this_thread::yield();
      be.wait(be.compute_stream(), ev);
      REQUIRE(count == i);
    }
  }
}

TEST_CASE("a spinning worker stops at once when its backend goes, and hands work on between two workers") {
  fsdp::backend::host_options opt;
  opt.spin = std::chrono::microseconds(10'000'000);  // ten seconds: no round below may wait for a spin to end
  const auto t0 = std::chrono::steady_clock::now();
  {
    fsdp::backend::host be(0, opt);
    fsdp::backend::host::event a, b;
    std::atomic<int> hops{0};
    for (int i = 0; i < 200; ++i) {  // gather -> reduce -> gather ..., each waiting for the other's event
      be.gather_stream().submit([&] { hops.fetch_add(1); });
      be.record(a, be.gather_stream());
      be.wait(be.reduce_stream(), a);
      be.reduce_stream().submit([&] { hops.fetch_add(1); });
      be.record(b, be.reduce_stream());
      be.wait(be.gather_stream(), b);
    }
    be.synchronize(be.gather_stream());
    CHECK(hops.load() == 400);
  }  // every worker is spinning here: the destructor must not wait out the ten seconds
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("a failed task poisons its stream and reaches whoever waits on it") {
  fsdp::backend::host be;
  bool ran_after = false;
  be.gather_stream().submit([] { throw std::runtime_error("kernel failed"); });
  be.gather_stream().submit([&] { ran_after = true; });
  fsdp::backend::host::event ev;
  be.record(ev, be.gather_stream());
  // the reduce stream inherits the error through the event
  be.wait(be.reduce_stream(), ev);
  bool reduce_ran = false;
  be.reduce_stream().submit([&] { reduce_ran = true; });
  CHECK(error_of<std::runtime_error>([&] { be.synchronize(be.reduce_stream()); }) == "kernel failed");
  CHECK_FALSE(reduce_ran);
  CHECK(error_of<std::runtime_error>([&] { be.wait(be.compute_stream(), ev); }) == "kernel failed");
  CHECK(error_of<std::runtime_error>([&] { be.synchronize(be.gather_stream()); }) == "kernel failed");
  CHECK_FALSE(ran_after);
}

TEST_CASE("a copy from or to pageable memory returns once its stream has run it, as on a GPU; allocate_host memory "
          "does not wait; a stream that does not get there is reported and fails, not waited on") {
  fsdp::backend::host_options o;
  o.wait_timeout = std::chrono::milliseconds(200);
  fsdp::backend::host be(0, o);
  auto& s = be.gather_stream();
  auto dev = be.allocate(64, fsdp::mem::comm_buffers, s);
  auto pinned = be.allocate_host(64, fsdp::mem::grads);
  std::memset(pinned.data(), 1, 64);
  std::vector<char> pageable(64, 7);
  // a stream that gets there in 50 ms: the pageable download has finished when it returns
  auto& r = be.reduce_stream();
  r.submit([] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  be.upload(dev.data(), pinned.data(), 64, r);  // pinned: returns at once
  std::vector<char> back(64, 0);
  be.download(back.data(), dev.data(), 64, r);
  CHECK(back == std::vector<char>(64, 1));
  // a stream that does not get there within wait_timeout
  std::atomic<bool> release{false};
  s.submit([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  be.download(static_cast<char*>(pinned.data()) + 8, dev.data(), 8, s);  // inside a pinned block: returns at once
  const std::string stuck =
      "fsdp: backend::host: an upload from pageable host memory on stream 'rank0.all_gather' waited 200 ms for the "
      "stream's earlier work and still waits: on a GPU this copy blocks the host with no watchdog (cudaMemcpyAsync "
      "from or to pageable memory returns only once the stream reaches it). Synchronize the stream first (a watched "
      "wait), or copy through allocate_host() memory";
  CHECK(error_of<fsdp::comm_error>([&] { be.upload(dev.data(), pageable.data(), 64, s); }) == stuck);
  release = true;
  CHECK(error_of<fsdp::comm_error>([&] { be.synchronize(s); }) == stuck);  // the stream failed with it
  be.synchronize(r);
  be.download(back.data(), dev.data(), 64, r);
  CHECK(back == std::vector<char>(64, 1));  // the queued upload was skipped, not run on memory given back
  be.release_after(std::move(pinned), r);
}

TEST_CASE("memory is accounted by category; stream-ordered release drops the count at the call") {
  fsdp::backend::host be;
  auto& cs = be.compute_stream();
  auto a = be.allocate(1000, mem::grads, cs);
  auto b = be.allocate(500, mem::grads, cs);
  auto c = be.allocate(300, mem::comm_buffers, be.reduce_stream());
  CHECK(be.memory().stats().current[mem::grads] == 1500);
  b.reset();
  CHECK(be.memory().stats().current[mem::grads] == 1000);
  CHECK(be.memory().stats().peak[mem::grads] == 1500);
  // a release behind slow work: the accounting drops now, the memory goes when the stream gets there
  std::atomic<bool> freed_late{false};
  be.reduce_stream().submit([&] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
  float* p = c.as<float>();
  be.reduce_stream().submit([p] { p[0] = 1.0f; });  // still valid: released after this task
  be.release_after(std::move(c), be.reduce_stream());
  be.reduce_stream().submit([&] { freed_late = true; });
  CHECK(be.memory().stats().current[mem::comm_buffers] == 0);
  CHECK(be.memory().stats().peak[mem::comm_buffers] == 300);
  be.synchronize(be.reduce_stream());
  CHECK(freed_late.load());
  const auto st = be.memory().stats();
  CHECK(st.peak.total == 1800);
  CHECK(st.current.total == 1000);
  be.memory().reset_peak();
  CHECK(be.memory().stats().peak.total == 1000);
  CHECK(be.allocate(0, mem::grads, cs).data() == nullptr);
}

TEST_CASE("the pool model: memory freed on another stream is reused only after an event wait, or once freed") {
  fsdp::backend::host_options three_workers;  // three worker streams, as on a GPU
  three_workers.threaded_compute = true;
  fsdp::backend::host be(0, three_workers);
  auto& cs = be.compute_stream();
  auto& ag = be.gather_stream();
  auto& rs = be.reduce_stream();
  std::promise<void> go;
  std::shared_future<void> open = go.get_future().share();
  rs.submit([open] { open.wait(); });  // the reduce stream is held: nothing submitted after this runs yet

  auto a = be.allocate(1000, mem::comm_buffers, rs);
  CHECK(be.pool().reserved == 1000);
  be.release_after(std::move(a), rs);
  SUBCASE("the same stream reuses at once, in its order") {
    auto b = be.allocate(600, mem::comm_buffers, rs);
    CHECK(be.pool().reserved == 1000);
  }
  SUBCASE("another stream cannot reuse a free its stream has not reached: fresh memory") {
    auto b = be.allocate(600, mem::comm_buffers, ag);
    CHECK(be.pool().reserved == 1600);
    CHECK(be.pool().in_use == 600);
  }
  SUBCASE("another stream reuses it after waiting on an event recorded after the free") {
    fsdp::backend::host::event freed;
    be.record(freed, rs);
    be.wait(ag, freed);
    auto b = be.allocate(1000, mem::comm_buffers, ag);
    CHECK(be.pool().reserved == 1000);
  }
  SUBCASE("the order passes through streams: compute waited on reduce, gather on compute") {
    fsdp::backend::host::event e1, e2;
    be.record(e1, rs);
    be.wait(cs, e1);
    be.record(e2, cs);
    be.wait(ag, e2);
    auto b = be.allocate(1000, mem::comm_buffers, ag);
    CHECK(be.pool().reserved == 1000);
  }
  SUBCASE("an event recorded before the free orders nothing") {
    go.set_value();
    be.synchronize(rs);
    // the free has happened by now: reused (opportunistically), whatever the events
    auto b = be.allocate(1000, mem::comm_buffers, ag);
    CHECK(be.pool().reserved == 1000);
    fsdp::backend::host::event early;
    be.record(early, rs);
    std::promise<void> go2;
    rs.submit([open2 = go2.get_future().share()] { open2.wait(); });
    auto c = be.allocate(500, mem::comm_buffers, rs);
    CHECK(be.pool().reserved == 1500);
    be.release_after(std::move(c), rs);
    be.wait(ag, early);
    auto d = be.allocate(500, mem::comm_buffers, ag);
    CHECK(be.pool().reserved == 2000);
    go2.set_value();
    be.synchronize(rs);
    return;
  }
  go.set_value();
  be.synchronize(rs);
}

TEST_CASE("kernels: accumulate and optimizer updates (element functions through for_each) follow their formulas") {
  fsdp::backend::host be;
  auto& s = be.compute_stream();
  std::vector<float> d{1, 2, 3}, src{0.5f, 0.25f, -1};
  be.accumulate(d.data(), src.data(), fsdp::dtype::f32, 3, 1.0f, s);
  CHECK(d == std::vector<float>{1.5f, 2.25f, 2});
  // SGD with momentum 0.5, lr 0.1, wd 0.1: g' = g + wd*p; buf = 0.5*buf + g'; p -= lr*buf
  float p = 1.0f, g = 0.5f, buf = 0.2f;
  be.for_each(1, fsdp::optim::detail::sgd_elements{&p, &g, {&buf}, {0.1f, 0.5f, 0.1f}, {}}, s);
  CHECK(buf == doctest::Approx(0.5f * 0.2f + 0.5f + 0.1f).epsilon(1e-7));
  CHECK(p == doctest::Approx(1.0f - 0.1f * buf).epsilon(1e-7));
  // AdamW step 1 from zero moments: p = p*(1-lr*wd) - lr * g/(|g|+eps)
  float q = 2.0f, gg = -0.3f, m = 0, v = 0;
  be.for_each(1,
              fsdp::optim::detail::adamw_elements{
                  &q, &gg, {&m, &v}, {0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 1 - 0.9f, 1 - 0.999f}, {}},
              s);
  CHECK(q == doctest::Approx(2.0f * (1 - 0.001f) + 0.01f).epsilon(1e-6));
}
