// comm::nccl's decisions (detail/nccl_logic.hpp, the code nccl.cuh runs) driven by a fake NCCL that records every
// call and answers from a script, on a virtual clock: shutdown, asynchronous errors, grouped launches.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/comm/detail/nccl_logic.hpp>

#include <chrono>
#include <deque>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace {

using namespace std::chrono_literals;
using fsdp::collective;
using fsdp::dtype;
using fsdp_test::error_of;

/// What the fake answers, and what it saw.
struct script {
  std::vector<std::string> calls;
  std::deque<int> async;  ///< successive states reported by ncclCommGetAsyncError; success once empty
  int finalize = 1;       ///< in_progress: what a non-blocking communicator answers
  int group_end = 0;
  int call = 0;  ///< what a collective call returns
  std::set<int> complete;
  int next_event = 1;
  std::chrono::steady_clock::time_point now{};
  std::vector<std::string> logs;
};

struct fake_api {
  enum result { success, in_progress, remote_error, invalid_argument };
  using stream = int;
  using event = int;
  script* sc;

  result get_async_error(result& state) {
    sc->calls.push_back("ncclCommGetAsyncError");
    state = success;
    if (!sc->async.empty()) {
      state = static_cast<result>(sc->async.front());
      sc->async.pop_front();
    }
    return success;
  }
  result comm_abort() { return note("ncclCommAbort", success); }
  result finalize() { return note("ncclCommFinalize", static_cast<result>(sc->finalize)); }
  result destroy() { return note("ncclCommDestroy", success); }
  result group_start() { return note("ncclGroupStart", success); }
  result group_end() { return note("ncclGroupEnd", static_cast<result>(sc->group_end)); }
  result fail_group() { return note("ncclBroadcast(root=-1)", invalid_argument); }
  std::string describe(result r) const {
    switch (r) {
      case success: return "ncclSuccess (no error)";
      case in_progress: return "ncclInProgress (NCCL operation in progress)";
      case remote_error: return "ncclRemoteError (remote process exited or there was a network error)";
      case invalid_argument: return "ncclInvalidArgument (invalid argument)";
    }
    return "?";
  }
  event new_event() { return sc->next_event++; }
  void record(event e, stream s) { sc->calls.push_back("cudaEventRecord(e" + std::to_string(e) + ", s" + std::to_string(s) + ")"); }
  bool complete(event e) { return sc->complete.count(e) != 0; }
  void destroy_event(event) noexcept {}
  /// A virtual clock: every reading advances it by 1 us, a sleep by its length.
  std::chrono::steady_clock::time_point now() { return sc->now += 1us; }
  void sleep(std::chrono::microseconds d) {
    sc->calls.push_back("sleep");
    sc->now += d;
  }
  void log(const std::string& line) noexcept { sc->logs.push_back(line); }

 private:
  result note(const char* name, result r) {
    sc->calls.push_back(name);
    return r;
  }
};

using core = fsdp::comm::detail::nccl_core<fake_api>;

/// A collective as nccl.cuh issues it, the NCCL call recorded under its name.
void all_gather(core& c, script& sc, std::int64_t count, int stream) {
  c.issue(collective::all_gather, count, dtype::f32, count * c.size(), stream, [&] {
    sc.calls.push_back("ncclAllGather");
    return static_cast<fake_api::result>(sc.call);
  });
}
void reduce_scatter(core& c, script& sc, std::int64_t count, int stream) {
  c.issue(collective::reduce_scatter, count, dtype::bf16, count * c.size(), stream, [&] {
    sc.calls.push_back("ncclReduceScatter");
    return static_cast<fake_api::result>(sc.call);
  });
}

using calls = std::vector<std::string>;

/// The calls as one line, so that a failing check prints them.
std::string seq(const calls& c) {
  std::string s;
  for (const std::string& x : c) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

TEST_CASE("nccl shutdown: ncclCommFinalize's ncclInProgress is polled with a sleep, then destroyed, and nothing is logged") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  sc.async = {fake_api::in_progress, fake_api::in_progress, fake_api::success};
  c.shutdown();
  CHECK(seq(sc.calls) == seq(calls{"ncclCommFinalize", "sleep", "ncclCommGetAsyncError", "sleep", "ncclCommGetAsyncError", "sleep",
                          "ncclCommGetAsyncError", "ncclCommDestroy"}));
  CHECK(seq(sc.logs) == "");
  c.shutdown();  // once only
  CHECK(sc.calls.size() == 8);
}

TEST_CASE("nccl shutdown: failures are logged and end in ncclCommAbort") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 50ms);
  SUBCASE("an error while finalizing") {
    sc.async = {fake_api::in_progress, fake_api::remote_error};
    c.shutdown();
    CHECK(seq(sc.calls) == seq(calls{"ncclCommFinalize", "sleep", "ncclCommGetAsyncError", "sleep", "ncclCommGetAsyncError",
                            "ncclCommAbort"}));
    CHECK(seq(sc.logs) == seq(calls{"fsdp: comm::nccl on rank 1 of 4: ncclCommFinalize reported ncclRemoteError (remote process "
                           "exited or there was a network error) at shutdown; the communicator was aborted instead of "
                           "destroyed"}));
  }
  SUBCASE("finalizing never completes: bounded by the timeout, sleeping between polls") {
    sc.async.assign(1000, fake_api::in_progress);
    c.shutdown();
    REQUIRE(sc.calls.size() > 4);
    CHECK(sc.calls.back() == "ncclCommAbort");
    std::size_t polls = 0, sleeps = 0, polls_without_sleep = 0;
    for (std::size_t i = 0; i < sc.calls.size(); ++i) {
      if (sc.calls[i] == "ncclCommGetAsyncError") {
        ++polls;
        polls_without_sleep += sc.calls[i - 1] != "sleep";
      }
      sleeps += sc.calls[i] == "sleep";
    }
    CHECK(polls_without_sleep == 0);
    CHECK(polls == sleeps);
    CHECK(polls >= 45);  // 1 ms apart over a 50 ms timeout
    CHECK(polls <= 51);
    CHECK(seq(sc.logs) == seq(calls{"fsdp: comm::nccl on rank 1 of 4: ncclCommFinalize did not complete within 50 ms at shutdown (a "
                           "rank that exited without finalizing, or still has collectives to run, keeps the others "
                           "waiting); the communicator was aborted instead of destroyed"}));
  }
  SUBCASE("an aborted communicator is not finalized") {
    c.abort("test");
    c.shutdown();
    CHECK(seq(sc.calls) == seq(calls{"ncclCommAbort"}));
    CHECK(seq(sc.logs) == "");
  }
}

TEST_CASE("nccl asynchronous errors name the pending collectives, their units and sequence numbers") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  c.label("h.1");
  all_gather(c, sc, 8, 7);
  c.label("h.0");
  reduce_scatter(c, sc, 4, 8);
  sc.now += 12ms;
  const std::string pending =
      "all_gather(count=8, f32) #0 for unit 'h.1', issued 12 ms ago and not complete; reduce_scatter(count=4, bf16) #1 "
      "for unit 'h.0', issued 12 ms ago and not complete";
  const std::string aborted =
      "comm::nccl on rank 1 of 4 aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or "
      "resource failed)";

  SUBCASE("seen by the backend's synchronize() poll (check)") {
    sc.complete = {1};  // the all-gather has completed: only the reduce-scatter is pending
    sc.async = {fake_api::remote_error};
    const std::string msg = error_of<fsdp::comm_error>([&] { c.check(); });
    CHECK(msg == "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 "
                 "of 4; pending: reduce_scatter(count=4, bf16) #1 for unit 'h.0', issued 12 ms ago and not complete; " +
                     aborted);
    CHECK(sc.calls.back() == "ncclCommAbort");
    CHECK(error_of<fsdp::comm_error>([&] { c.check(); }) == "fsdp: comm::nccl on rank 1 was aborted: " + msg.substr(6));
    CHECK(error_of<fsdp::comm_error>([&] { all_gather(c, sc, 8, 7); }) ==
          "fsdp: all_gather on rank 1 after comm::nccl was aborted: " + msg.substr(6));
  }
  SUBCASE("seen while a call settles (ncclInProgress, then an error)") {
    sc.call = fake_api::in_progress;
    sc.async = {fake_api::in_progress, fake_api::remote_error};
    c.label("h.2");
    const std::string msg = error_of<fsdp::comm_error>([&] { all_gather(c, sc, 16, 7); });
    CHECK(msg == "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 "
                 "of 4 during ncclAllGather for all_gather(count=16, f32) #2 for unit 'h.2'; pending: " +
                     pending + "; " + aborted);
    CHECK(sc.calls.back() == "ncclCommAbort");
  }
  SUBCASE("a call that fails at once") {
    sc.call = fake_api::invalid_argument;
    c.label("h.3");
    CHECK(error_of<fsdp::comm_error>([&] { reduce_scatter(c, sc, 2, 8); }) ==
          "fsdp: NCCL reported ncclInvalidArgument (invalid argument) on rank 1 of 4 during ncclReduceScatter for "
          "reduce_scatter(count=2, bf16) #2 for unit 'h.3'; pending: " +
              pending + "; " + aborted);
  }
  SUBCASE("many pending: the four oldest are named, the rest counted") {
    c.label("h.4");
    for (int i = 0; i < 4; ++i) all_gather(c, sc, 1, 7);
    sc.async = {fake_api::remote_error};
    const std::string msg = error_of<fsdp::comm_error>([&] { c.check(); });
    CHECK(msg == "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 "
                 "of 4; pending: " +
                     pending +
                     "; all_gather(count=1, f32) #2 for unit 'h.4', issued 0 ms ago and not complete; all_gather(count=1, "
                     "f32) #3 for unit 'h.4', issued 0 ms ago and not complete; and 2 more; " +
                     aborted);
  }
}

TEST_CASE("nccl grouped(): completion events are recorded only once ncclGroupEnd has launched the group") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  sc.group_end = fake_api::in_progress;  // a non-blocking communicator launches the group in the background
  c.label("h.1");
  c.grouped([&] {
    all_gather(c, sc, 8, 7);
    reduce_scatter(c, sc, 4, 8);
  });
  CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclAllGather", "ncclReduceScatter", "ncclGroupEnd", "sleep",
                          "ncclCommGetAsyncError", "cudaEventRecord(e1, s7)", "cudaEventRecord(e2, s8)"}));
  CHECK(c.stats()[collective::all_gather] == 1);
  CHECK(c.stats()[collective::reduce_scatter] == 1);
  CHECK(c.issued() == 2);
}

TEST_CASE("nccl grouped(): an exception inside the group abandons it: nothing is launched, the communicator is aborted") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  c.label("h.1");
  SUBCASE("the function throws after queueing a collective") {
    const std::string msg = error_of<std::exception>([&] {
      c.grouped([&] {
        all_gather(c, sc, 8, 7);
        throw std::runtime_error("boom");
      });
    });
    CHECK(msg == "fsdp: comm::nccl on rank 1 of 4: grouped() abandoned after 1 queued collective (all_gather(count=8, "
                 "f32) #0 for unit 'h.1') because its function threw: boom; the group was not launched and the "
                 "communicator was aborted (the other ranks fail at their timeout; restart every rank)");
    // The group is made to fail (NCCL then discards it at ncclGroupEnd), closed, and only then aborted.
    CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclAllGather", "ncclBroadcast(root=-1)", "ncclGroupEnd", "ncclCommAbort"}));
    CHECK(c.stats()[collective::all_gather] == 0);
    CHECK(error_of<fsdp::comm_error>([&] { all_gather(c, sc, 8, 7); }) ==
          "fsdp: all_gather on rank 1 after comm::nccl was aborted: " + msg.substr(6));
    c.shutdown();
    CHECK(sc.calls.back() == "ncclCommAbort");  // not aborted twice, not finalized
    CHECK(sc.calls.size() == 5);
  }
  SUBCASE("a collective inside the group fails: ncclCommAbort waits until the group is closed") {
    sc.call = fake_api::invalid_argument;
    const std::string msg = error_of<fsdp::comm_error>([&] { c.grouped([&] { all_gather(c, sc, 8, 7); }); });
    CHECK(msg == "fsdp: comm::nccl on rank 1 of 4: grouped() abandoned after 0 queued collectives because its function "
                 "threw: NCCL reported ncclInvalidArgument (invalid argument) on rank 1 of 4 during ncclAllGather for "
                 "all_gather(count=8, f32) #0 for unit 'h.1'; pending: no collective pending; comm::nccl on rank 1 of 4 "
                 "aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed); the "
                 "group was not launched and the communicator was aborted (the other ranks fail at their timeout; "
                 "restart every rank)");
    CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclAllGather", "ncclBroadcast(root=-1)", "ncclGroupEnd", "ncclCommAbort"}));
  }
  SUBCASE("ncclGroupEnd itself fails: nothing is recorded, the error names the group") {
    sc.group_end = fake_api::remote_error;
    const std::string msg = error_of<fsdp::comm_error>([&] { c.grouped([&] { all_gather(c, sc, 8, 7); }); });
    CHECK(msg == "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 of "
                 "4 during ncclGroupEnd for grouped collectives #0 to #0; pending: no collective pending; comm::nccl on "
                 "rank 1 of 4 aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource "
                 "failed)");
    CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclAllGather", "ncclGroupEnd", "ncclCommAbort"}));
  }
}

TEST_CASE("nccl timeouts name what timed out and the pending collectives") {
  script sc;
  core c(fake_api{&sc}, 0, 2, 5ms);
  c.label("h.0");
  all_gather(c, sc, 8, 7);
  sc.call = fake_api::in_progress;
  sc.async.assign(100000, fake_api::in_progress);
  const std::string msg = error_of<fsdp::comm_error>([&] { reduce_scatter(c, sc, 4, 8); });
  CHECK(msg == "fsdp: ncclReduceScatter for reduce_scatter(count=4, bf16) #1 for unit 'h.0' on rank 0 did not complete "
               "within 5 ms; pending: all_gather(count=8, f32) #0 for unit 'h.0', issued 5 ms ago and not complete; "
               "comm::nccl on rank 0 of 2 aborted (a rank that died or issued a different collective sequence leaves "
               "the others waiting)");
  CHECK(sc.calls.back() == "ncclCommAbort");
}
