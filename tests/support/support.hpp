#pragma once
// Test helpers shared by the host tests.
#include <chrono>
#include <string>

#include <doctest/doctest.h>
#include <fsdp/fsdp.hpp>

namespace fsdp_test {

/// Collective timeout for multi-rank tests: a broken collective fails the test within this bound, never hangs.
inline constexpr std::chrono::milliseconds timeout{10000};

template <class F>
void run_ranks(int world, F&& fn) {
  fsdp::comm::run_local(world, std::forward<F>(fn), {.timeout = timeout});
}

/// Runs `fn`, expects it to throw E, and returns the message (so tests can check what it names).
template <class E = std::exception, class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (...) {
    FAIL("an exception of another type than expected was thrown");
  }
  FAIL("no exception thrown");
  return {};
}

}  // namespace fsdp_test
