// kernels::host_pool: the host threads that offloading's host functions run their loops on.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <fsdp/kernels/host_pool.hpp>
#include <fsdp/optim/adamw.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/support.hpp"

TEST_CASE("every element once, on several threads when the loop is large enough, on the caller alone when not") {
  fsdp::kernels::host_pool pool(4, 100);
  for (std::int64_t n : {0, 1, 199, 200, 1001, 100000}) {
    CAPTURE(n);
    std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
    std::mutex mu;
    std::set<std::thread::id> threads;
    pool.for_each(n, [&](std::int64_t i) {
      seen[static_cast<std::size_t>(i)].fetch_add(1);
      std::lock_guard lk(mu);
      threads.insert(std::this_thread::get_id());
    });
    int wrong = 0;
    for (auto& s : seen) wrong += s.load() != 1;
    CHECK(wrong == 0);
    if (n < 200) {
      CHECK(threads.size() <= 1);   // under two chunks of 100: the caller's loop
      CHECK(pool.started() == 0);   // and no thread started for it (these sizes come first)
    }
  }
  CHECK(pool.started() == 3);  // the caller is the fourth
}

TEST_CASE("the pool's threads take chunks: a chunk that waits for another thread is not waited for in vain") {
  fsdp::kernels::host_pool pool(2, 10);
  std::mutex mu;
  std::set<std::thread::id> threads;
  pool.for_each(100, [&](std::int64_t i) {
    {
      std::lock_guard lk(mu);
      threads.insert(std::this_thread::get_id());
    }
    if (i != 0) return;
    // the first chunk's thread waits (at most 10 s) until another thread has run an element of another chunk
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard lk(mu);
        if (threads.size() >= 2) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  CHECK(threads.size() == 2);
  CHECK(pool.started() == 1);
}

TEST_CASE("the host AdamW on the pool gives the bits of the single-threaded loop") {
  const std::int64_t n = 50000;
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    p[static_cast<std::size_t>(i)] = 0.001f * static_cast<float>(i % 977) - 0.4f;
    g[static_cast<std::size_t>(i)] = 0.0007f * static_cast<float>(i % 613) - 0.2f;
  }
  auto p2 = p, m2 = m, v2 = v;
  namespace od = fsdp::optim::detail;
  const od::adamw_coeffs c{
      1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, fsdp::optim::bias_correction(0.9f, 1), fsdp::optim::bias_correction(0.999f, 1)};
  od::decay_mask mask;
  mask.count = 1;
  mask.begin[0] = 100;
  mask.end[0] = 30000;
  fsdp::kernels::host_loops::for_each(n, od::adamw_elements{p.data(), g.data(), {m.data(), v.data()}, {c}, mask});
  fsdp::kernels::host_pool pool(3, 1000);
  pool.for_each(n, od::adamw_elements{p2.data(), g.data(), {m2.data(), v2.data()}, {c}, mask});
  CHECK(pool.started() == 2);
  CHECK(std::memcmp(p.data(), p2.data(), n * 4) == 0);
  CHECK(std::memcmp(m.data(), m2.data(), n * 4) == 0);
  CHECK(std::memcmp(v.data(), v2.data(), n * 4) == 0);
}

TEST_CASE("an exception from the loop is rethrown to the caller once every chunk is done; the pool goes on") {
  fsdp::kernels::host_pool pool(4, 10);
  std::atomic<int> ran{0};
  CHECK(fsdp_test::error_of<std::runtime_error>([&] {
          pool.for_each(1000, [&](std::int64_t i) {
            ran.fetch_add(1);
            if (i == 500) throw std::runtime_error("element 500");
          });
        }) == "element 500");
  CHECK(ran.load() <= 1000);
  std::atomic<std::int64_t> sum{0};
  pool.for_each(1000, [&](std::int64_t i) { sum.fetch_add(i); });
  CHECK(sum.load() == 999 * 1000 / 2);
}

TEST_CASE("an ArrayFunction on the host loop gives apply_at's bits: every array present, a state array null, a range") {
  // host_loops::for_range takes the arrays once and, where none is null, runs one loop without apply_at's checks;
  // apply_at element by element is the reference (the CUDA backend's remainder path).
  const std::int64_t n = 1003;
  std::vector<float> p(n), g(n), m(n), v(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    p[k] = 0.001f * static_cast<float>(i % 977) - 0.4f;
    g[k] = 0.0007f * static_cast<float>(i % 613) - 0.2f;
    m[k] = 0.0003f * static_cast<float>(i % 101);
    v[k] = 0.0001f * static_cast<float>(i % 89);
  }
  const std::vector<float> g0 = g;
  namespace od = fsdp::optim::detail;
  const od::adamw_coeffs c{
      1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, fsdp::optim::bias_correction(0.9f, 3), fsdp::optim::bias_correction(0.999f, 3)};
  od::decay_mask mask;
  mask.count = 1;
  mask.begin[0] = 100;
  mask.end[0] = 300;
  struct arrays {
    std::vector<float> p, m, v;
  };
  auto elements = [&](arrays& a, bool with_v) {
    od::adamw_elements f{a.p.data(), g.data(), {a.m.data(), with_v ? a.v.data() : nullptr}, {c}, mask};
    f.grad_scale = 0.5f;
    return f;
  };
  auto same = [](const arrays& x, const arrays& y) {
    return x.p.size() == y.p.size() && std::memcmp(x.p.data(), y.p.data(), x.p.size() * 4) == 0 &&
           std::memcmp(x.m.data(), y.m.data(), x.m.size() * 4) == 0 &&
           std::memcmp(x.v.data(), y.v.data(), x.v.size() * 4) == 0;
  };
  for (bool with_v : {true, false}) {
    for (auto [b, e] : {std::pair<std::int64_t, std::int64_t>{0, n}, {1, 2}, {101, 777}, {5, 5}}) {
      const std::int64_t begin = b, end = e;
      CAPTURE(with_v);
      CAPTURE(begin);
      CAPTURE(end);
      arrays want{p, m, v}, got{p, m, v};
      const auto ref = elements(want, with_v);
      for (std::int64_t i = begin; i < end; ++i) fsdp::kernels::apply_at(ref, i);
      fsdp::kernels::host_loops::for_range(begin, end, elements(got, with_v));
      CHECK(same(got, want));
      if (end > begin) CHECK(std::memcmp(got.p.data(), p.data(), n * 4) != 0);  // something was updated
      if (begin == 0 && end == n) {
        arrays whole{p, m, v};
        fsdp::kernels::host_loops::for_each(n, elements(whole, with_v));
        CHECK(same(whole, want));
      }
    }
  }
  CHECK(std::memcmp(g.data(), g0.data(), n * 4) == 0);  // the gradient is read, never written
}
