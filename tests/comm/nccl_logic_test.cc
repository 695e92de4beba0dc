// comm::nccl's decisions (detail/nccl_logic.hpp, the code nccl.cuh runs) driven by a fake NCCL that records every
// call and answers from a script, on a virtual clock: shutdown, asynchronous errors, grouped launches, a
// communicator per stream, split groups and their family.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/comm/detail/nccl_logic.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <optional>
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
/// Communicators are numbers: 1 is the base one (its calls are recorded by name alone), those that ncclCommSplit
/// makes are 2, 3, ... (recorded as "ncclCommGetAsyncError(c2)").
struct script {
  std::vector<std::string> calls;
  std::deque<int> async;  ///< successive states of communicator 1 (ncclCommGetAsyncError); success once empty
  std::map<int, std::deque<int>> async_of;  ///< the same for the others
  int finalize = 1;                        ///< in_progress: what a non-blocking communicator answers
  int group_end = 0;
  int call = 0;   ///< what a collective call returns
  int split = 1;  ///< what ncclCommSplit returns (in_progress: non-blocking; the parent's state then settles it)
  bool split_fills = true;  ///< whether the settled split gave a communicator
  /// As NCCL does: the communicator is filled in once the parent's state has settled (a read of it that answers
  /// success), not at the call.
  bool split_fills_when_settled = false;
  int* split_out = nullptr;  ///< where that split writes its communicator
  int split_made = 0;
  int next_comm = 2;
  std::set<int> complete;
  std::set<int> capturing;  ///< streams being captured into a CUDA graph (cudaStreamIsCapturing)
  int queries = 0;          ///< cudaEventQuery calls
  int next_event = 1;
  std::chrono::steady_clock::time_point now{};
  std::vector<std::string> logs;
  std::deque<std::int64_t> free_bytes;  ///< successive answers of cudaMemGetInfo's free bytes; 80 GB once empty
  int next_stream = 100;  ///< streams cudaStreamCreate makes: s100, s101, ...
  std::uintptr_t next_buffer = 0x1000;  ///< what cudaMalloc answers: 0x1000, 0x2000, ...
  int version = 22809;                  ///< what ncclGetVersion answers
  int revoke = 0;                       ///< what ncclCommRevoke answers
  int shrink = 0;                       ///< what ncclCommShrink answers (its communicator is there at once)
};

struct fake_api {
  enum result { success, in_progress, remote_error, invalid_argument, internal_error };
  using stream = int;
  using event = int;
  using comm = int;
  using data_type = int;
  script* sc;

  /// As nccl.cuh's: every dtype but fp8 E5M2, which this fake's NCCL lacks (as an NCCL before 2.24 lacks both).
  data_type type_of(dtype t) const {
    if (t == dtype::f8e5m2) fsdp::detail::fail_usage("comm::nccl: dtype f8e5m2 needs NCCL 2.24 or later");
    return static_cast<int>(t);
  }

  result get_async_error(comm c, result& state) {
    note("ncclCommGetAsyncError", c);
    state = success;
    std::deque<int>& q = c == 1 ? sc->async : sc->async_of[c];
    if (!q.empty()) {
      state = static_cast<result>(q.front());
      q.pop_front();
    }
    if (state == success && sc->split_out) {  // the parent's split job has ended: its communicator appears
      *sc->split_out = sc->split_made;
      sc->split_out = nullptr;
    }
    return success;
  }
  result split(comm parent, int color, int key, comm& out) {
    const int made = sc->next_comm++;
    if (sc->split_fills_when_settled) {
      sc->split_out = &out;
      sc->split_made = made;
    } else if (sc->split_fills) {
      out = made;
    }
    sc->calls.push_back("ncclCommSplit(c" + std::to_string(parent) + ", color=" + std::to_string(color) + ", key=" +
                        std::to_string(key) + ") -> " + (sc->split_fills ? "c" + std::to_string(made) : "null"));
    return static_cast<result>(sc->split);
  }
  result comm_abort(comm c) { return note("ncclCommAbort", c); }
  result revoke(comm c) { return note("ncclCommRevoke", c, static_cast<result>(sc->revoke)); }
  result shrink(comm parent, const std::vector<int>& exclude, comm& out) {
    out = sc->next_comm++;
    std::string list;
    for (int r : exclude) list += (list.empty() ? "" : ", ") + std::to_string(r);
    sc->calls.push_back("ncclCommShrink(c" + std::to_string(parent) + ", exclude=[" + list + "]) -> c" +
                        std::to_string(out));
    return static_cast<result>(sc->shrink);
  }
  int version() const { return sc->version; }
  result finalize(comm c) { return note("ncclCommFinalize", c, static_cast<result>(sc->finalize)); }
  result destroy(comm c) { return note("ncclCommDestroy", c); }
  result group_start() { return note("ncclGroupStart", 1); }
  result group_end() { return note("ncclGroupEnd", 1, static_cast<result>(sc->group_end)); }
  result fail_group(comm c) { return note("ncclBroadcast(root=-1)", c, invalid_argument); }
  std::string describe(result r, comm) const {
    switch (r) {
      case success: return "ncclSuccess (no error)";
      case in_progress: return "ncclInProgress (NCCL operation in progress)";
      case remote_error: return "ncclRemoteError (remote process exited or there was a network error)";
      case invalid_argument: return "ncclInvalidArgument (invalid argument)";
      case internal_error: return "ncclInternalError (internal error)";
    }
    return "?";
  }
  event new_event() { return sc->next_event++; }
  void record(event e, stream s) {
    sc->calls.push_back("cudaEventRecord(e" + std::to_string(e) + ", s" + std::to_string(s) + ")");
  }
  void wait(stream s, event e) {
    sc->calls.push_back("cudaStreamWaitEvent(s" + std::to_string(s) + ", e" + std::to_string(e) + ")");
  }
  stream new_stream() {
    const int s = sc->next_stream++;
    sc->calls.push_back("cudaStreamCreate -> s" + std::to_string(s));
    return s;
  }
  void destroy_stream(stream s) noexcept { sc->calls.push_back("cudaStreamDestroy(s" + std::to_string(s) + ")"); }
  void* device_alloc(std::size_t bytes) {
    const std::uintptr_t p = sc->next_buffer;
    sc->next_buffer += 0x1000;
    sc->calls.push_back("cudaMalloc(" + std::to_string(bytes) + ") -> " + std::to_string(p / 0x1000));
    return reinterpret_cast<void*>(p);
  }
  void device_free(void* p) noexcept {
    sc->calls.push_back("cudaFree(" + std::to_string(reinterpret_cast<std::uintptr_t>(p) / 0x1000) + ")");
  }
  bool complete(event e) {
    ++sc->queries;
    return sc->complete.count(e) != 0;
  }
  bool capturing(stream s) { return sc->capturing.count(s) != 0; }
  void destroy_event(event) noexcept {}
  /// A virtual clock: every reading advances it by 1 us, a sleep by its length.
  std::chrono::steady_clock::time_point now() { return sc->now += 1us; }
  void sleep(std::chrono::microseconds d) {
    sc->calls.push_back("sleep");
    sc->now += d;
  }
  void log(const std::string& line) noexcept { sc->logs.push_back(line); }
  std::int64_t free_device_bytes() {
    if (sc->free_bytes.empty()) return std::int64_t{80} << 30;
    const std::int64_t f = sc->free_bytes.front();
    sc->free_bytes.pop_front();
    return f;
  }

 private:
  result note(const std::string& name, comm c, result r = success) {
    sc->calls.push_back(c == 1 ? name : name + "(c" + std::to_string(c) + ")");
    return r;
  }
};

using core = fsdp::comm::detail::nccl_core<fake_api>;
using fsdp::comm::nccl_channels;

/// A base communicator (c1) set up as nccl.cuh does (ncclCommInitRankConfig answered success).
void init(core& c) { c.init(1, fake_api::success, "ncclCommInitRankConfig", "communicator set-up"); }

/// An NCCL call as the fake records it: its name, then its communicator unless the base one ("(c2)"), then its stream
/// unless the one it was issued for (" on s100": the family's stream).
std::string nccl_call(const char* name, int comm, int on, int issued_on) {
  std::string s = name;
  if (comm != 1) s += "(c" + std::to_string(comm) + ")";
  if (on != issued_on) s += " on s" + std::to_string(on);
  return s;
}

/// A collective as nccl.cuh issues it, the NCCL call recorded under its name and communicator. `key` is the
/// stream's name (empty: the base communicator, as barrier() issues).
void all_gather(core& c, script& sc, std::int64_t count, int stream, std::string_view key = {}, dtype t = dtype::f32) {
  c.issue(collective::all_gather, count, t, count * c.size(), stream, key, [&](int comm, int on, int) {
    sc.calls.push_back(nccl_call("ncclAllGather", comm, on, stream));
    return static_cast<fake_api::result>(sc.call);
  });
}
void reduce_scatter(core& c, script& sc, std::int64_t count, int stream, std::string_view key = {}) {
  c.issue(collective::reduce_scatter, count, dtype::bf16, count * c.size(), stream, key, [&](int comm, int on, int) {
    sc.calls.push_back(nccl_call("ncclReduceScatter", comm, on, stream));
    return static_cast<fake_api::result>(sc.call);
  });
}
void all_reduce(core& c, script& sc, std::int64_t count, int stream, std::string_view key = {}) {
  c.issue(collective::all_reduce, count, dtype::f32, count, stream, key, [&](int comm, int on, int) {
    sc.calls.push_back(nccl_call("ncclAllReduce", comm, on, stream));
    return static_cast<fake_api::result>(sc.call);
  });
}
/// nccl.cuh's all_to_all: a send and a receive per rank, recorded with the peer ("ncclSend(1)").
void all_to_all(core& c, script& sc, std::int64_t count, int stream, dtype t = dtype::i8) {
  auto pair = [&](const char* name) {
    return [&sc, name, stream](int comm, int on, int, int q) {
      sc.calls.push_back(nccl_call(name, comm, on, stream) + "(" + std::to_string(q) + ")");
      return static_cast<fake_api::result>(sc.call);
    };
  };
  c.all_to_all(count, t, stream, {}, pair("ncclSend"), pair("ncclRecv"));
}

/// nccl.cuh's all_to_all_v: a send and a receive per rank whose block is not empty, recorded with the peer, the
/// block's first byte and its elements ("ncclSend(2 at 8, 3)").
void all_to_all_v(core& c, script& sc, const std::vector<std::int64_t>& counts, int stream, dtype t = dtype::f32) {
  auto pair = [&](const char* name) {
    return [&sc, name, stream](int comm, int on, int, int q, std::size_t at, std::int64_t n) {
      sc.calls.push_back(nccl_call(name, comm, on, stream) + "(" + std::to_string(q) + " at " + std::to_string(at) +
                         ", " + std::to_string(n) + ")");
      return static_cast<fake_api::result>(sc.call);
    };
  };
  c.all_to_all_v(counts, t, stream, {}, pair("ncclSend"), pair("ncclRecv"));
}

using calls = std::vector<std::string>;

/// The calls as one line, so that a failing check prints them.
std::string seq(const calls& c) {
  std::string s;
  for (const std::string& x : c) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

TEST_CASE(
    "nccl shutdown: ncclCommFinalize's ncclInProgress is polled with a sleep, then destroyed, and nothing is logged") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  init(c);
  sc.async = {fake_api::in_progress, fake_api::in_progress, fake_api::success};
  c.shutdown();
  CHECK(seq(sc.calls) == seq(calls{"ncclCommFinalize", "sleep", "ncclCommGetAsyncError", "sleep",
                                   "ncclCommGetAsyncError", "sleep", "ncclCommGetAsyncError", "ncclCommDestroy"}));
  CHECK(seq(sc.logs) == "");
  c.shutdown();  // once only
  CHECK(sc.calls.size() == 8);
}

TEST_CASE("nccl shutdown: failures are logged and end in ncclCommAbort") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 50ms);
  init(c);
  SUBCASE("an error while finalizing") {
    sc.async = {fake_api::in_progress, fake_api::remote_error};
    c.shutdown();
    CHECK(seq(sc.calls) == seq(calls{"ncclCommFinalize", "sleep", "ncclCommGetAsyncError", "sleep",
                                     "ncclCommGetAsyncError", "ncclCommAbort"}));
    CHECK(seq(sc.logs) ==
          seq(calls{"fsdp: comm::nccl on rank 1 of 4: ncclCommFinalize reported ncclRemoteError (remote process "
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
    CHECK(seq(sc.logs) ==
          seq(calls{"fsdp: comm::nccl on rank 1 of 4: ncclCommFinalize did not complete within 50 ms at shutdown (a "
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
  init(c);
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
    CHECK(msg ==
          "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 "
          "of 4; pending: " +
              pending +
              "; all_gather(count=1, f32) #2 for unit 'h.4', issued 0 ms ago and not complete; all_gather(count=1, "
              "f32) #3 for unit 'h.4', issued 0 ms ago and not complete; and 2 more; " +
              aborted);
  }
}

TEST_CASE(
    "nccl under capture (a CUDA graph): a collective issued on a stream being captured is recorded and waited for as "
    "always, never pending, and no event is asked of it; its event serves the next collective") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  init(c);
  c.label("h.1");
  sc.capturing = {7};
  for (int i = 0; i < 70; ++i) all_gather(c, sc, 8, 7);  // past the 64 after which pending ones are retired
  CHECK(sc.queries == 0);
  CHECK(seq(calls(sc.calls.end() - 2, sc.calls.end())) == "ncclAllGather, cudaEventRecord(e1, s7)");
  sc.capturing.clear();
  all_gather(c, sc, 8, 7);  // eager again: pending until its event completes
  CHECK(sc.calls.back() == "cudaEventRecord(e1, s7)");
  sc.async = {fake_api::remote_error};
  CHECK(error_of<fsdp::comm_error>([&] { c.check(); }) ==
        "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 of 4; "
        "pending: all_gather(count=8, f32) #70 for unit 'h.1', issued 0 ms ago and not complete; comm::nccl on rank 1 "
        "of 4 aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
}

TEST_CASE("nccl grouped(): completion events are recorded only once ncclGroupEnd has launched the group") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  init(c);
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

TEST_CASE(
    "nccl grouped(): an exception inside the group abandons it: nothing is launched, the communicator is aborted") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  init(c);
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
    CHECK(seq(sc.calls) ==
          seq(calls{"ncclGroupStart", "ncclAllGather", "ncclBroadcast(root=-1)", "ncclGroupEnd", "ncclCommAbort"}));
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
    CHECK(msg ==
          "fsdp: comm::nccl on rank 1 of 4: grouped() abandoned after 0 queued collectives because its function "
          "threw: NCCL reported ncclInvalidArgument (invalid argument) on rank 1 of 4 during ncclAllGather for "
          "all_gather(count=8, f32) #0 for unit 'h.1'; pending: no collective pending; comm::nccl on rank 1 of 4 "
          "aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed); the "
          "group was not launched and the communicator was aborted (the other ranks fail at their timeout; "
          "restart every rank)");
    CHECK(seq(sc.calls) ==
          seq(calls{"ncclGroupStart", "ncclAllGather", "ncclBroadcast(root=-1)", "ncclGroupEnd", "ncclCommAbort"}));
  }
  SUBCASE("ncclGroupEnd itself fails: nothing is recorded, the error names the group") {
    sc.group_end = fake_api::remote_error;
    const std::string msg = error_of<fsdp::comm_error>([&] { c.grouped([&] { all_gather(c, sc, 8, 7); }); });
    CHECK(msg ==
          "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 of "
          "4 during ncclGroupEnd for grouped collectives #0 to #0; pending: no collective pending; comm::nccl on "
          "rank 1 of 4 aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource "
          "failed)");
    CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclAllGather", "ncclGroupEnd", "ncclCommAbort"}));
  }
}

TEST_CASE("nccl timeouts name what timed out and the pending collectives") {
  script sc;
  core c(fake_api{&sc}, 0, 2, 5ms);
  init(c);
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

TEST_CASE("nccl streams, by default: every stream's collectives on the one communicator, in issue order; nothing is "
          "split after construction") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  init(c);
  c.label("h.1");
  all_gather(c, sc, 8, 7, "rank1.all_gather");
  reduce_scatter(c, sc, 4, 8, "rank1.reduce");
  all_gather(c, sc, 8, 7, "rank1.all_gather");
  all_gather(c, sc, 1, 9);
  // the gather and reduce streams' collectives are one sequence on one communicator: NCCL runs them in this order
  // on every rank
  CHECK(seq(sc.calls) == seq(calls{"ncclAllGather", "cudaEventRecord(e1, s7)", "ncclReduceScatter",
                                   "cudaEventRecord(e2, s8)", "ncclAllGather", "cudaEventRecord(e3, s7)",
                                   "ncclAllGather", "cudaEventRecord(e4, s9)"}));
  CHECK(c.live_communicators() == 1);
  CHECK(c.channels() == nccl_channels::one);
  c.shutdown();
}

TEST_CASE("nccl streams: per_stream is refused without NCCL 2.26 and NCCL_LAUNCH_ORDER_IMPLICIT=1, saying which") {
  using fsdp::comm::detail::per_stream_refusal;
  CHECK(per_stream_refusal(22809, "1") == "");
  CHECK(per_stream_refusal(22600, "1") == "");
  CHECK(
      per_stream_refusal(22507, "1") ==
      "comm::nccl: nccl_channels::per_stream needs NCCL 2.26 or later (NCCL_LAUNCH_ORDER_IMPLICIT orders the launches "
      "of its communicators), but this NCCL is 2.25.7; use nccl_channels::one (the default)");
  CHECK(per_stream_refusal(22809, nullptr) ==
        "comm::nccl: nccl_channels::per_stream issues collectives on several communicators at once, which NCCL runs in "
        "one order on every rank only with NCCL_LAUNCH_ORDER_IMPLICIT=1 (it is unset): set it on every rank before the "
        "first NCCL call, or use nccl_channels::one (the default)");
  CHECK(per_stream_refusal(22809, "0") ==
        "comm::nccl: nccl_channels::per_stream issues collectives on several communicators at once, which NCCL runs in "
        "one order on every rank only with NCCL_LAUNCH_ORDER_IMPLICIT=1 (it is '0'): set it on every rank before the "
        "first NCCL call, or use nccl_channels::one (the default)");
}

TEST_CASE("nccl memory: what each communicator's creation took is measured as the drop in free device memory") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms, "comm::nccl", nccl_channels::per_stream);
  // nccl.cuh reads the free memory before ncclCommInitRankConfig and passes it to init, which reads it again once
  // the communicator has settled: 1000 - 700
  sc.free_bytes = {700, /* the gather stream's split: */ 700, 650, /* the reduce stream's: */ 650, 640};
  c.init(1, fake_api::success, "ncclCommInitRankConfig", "communicator set-up", 1000);
  CHECK(c.device_bytes() == 300);
  all_gather(c, sc, 8, 7, "rank1.all_gather");
  reduce_scatter(c, sc, 4, 8, "rank1.reduce");
  CHECK(c.device_bytes() == 300 + 50 + 10);
  // memory that came back meanwhile is not a negative cost; an unmeasured creation counts nothing
  script sc2;
  core d(fake_api{&sc2}, 1, 4, 1000ms);
  sc2.free_bytes = {1200};
  d.init(1, fake_api::success, "ncclCommSplit", "a split group", 1000);
  CHECK(d.device_bytes() == 0);
  script sc3;
  core e(fake_api{&sc3}, 1, 4, 1000ms);
  e.init(1, fake_api::success, "ncclCommInitRankConfig", "communicator set-up");
  CHECK(e.device_bytes() == 0);
  c.shutdown();
  d.shutdown();
  e.shutdown();
}

TEST_CASE(
    "nccl streams, per_stream: each stream name gets its own communicator, split from the base on its first "
    "collective") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms, "comm::nccl", nccl_channels::per_stream);
  init(c);
  c.label("h.1");
  // A non-blocking split runs as a job of the parent: the parent's state settles it (here at the second poll),
  // then the new communicator's own state is read once.
  sc.async = {fake_api::in_progress};
  all_gather(c, sc, 8, 7, "rank1.all_gather");
  reduce_scatter(c, sc, 4, 8, "rank1.reduce");
  all_gather(c, sc, 8, 7, "rank1.all_gather");  // the stream's communicator is reused
  all_gather(c, sc, 1, 9);                      // no stream name (barrier()): the base communicator
  CHECK(seq(sc.calls) ==
        seq(calls{"ncclCommSplit(c1, color=0, key=1) -> c2", "sleep", "ncclCommGetAsyncError", "sleep",
                  "ncclCommGetAsyncError", "ncclCommGetAsyncError(c2)", "ncclAllGather(c2)", "cudaEventRecord(e1, s7)",
                  "ncclCommSplit(c1, color=0, key=1) -> c3", "sleep", "ncclCommGetAsyncError",
                  "ncclCommGetAsyncError(c3)", "ncclReduceScatter(c3)", "cudaEventRecord(e2, s8)", "ncclAllGather(c2)",
                  "cudaEventRecord(e3, s7)", "ncclAllGather", "cudaEventRecord(e4, s9)"}));
  CHECK(c.live_communicators() == 3);
  CHECK(c.issued() == 4);  // one numbering across the communicators
  CHECK(c.stats()[collective::all_gather] == 3);
  CHECK(c.stats()[collective::reduce_scatter] == 1);

  // Shutdown finalizes them all (the streams' first, the base last), polls them all, then destroys them all.
  sc.calls.clear();
  c.shutdown();
  CHECK(seq(sc.calls) == seq(calls{"ncclCommFinalize(c3)", "ncclCommFinalize(c2)", "ncclCommFinalize", "sleep",
                                   "ncclCommGetAsyncError", "ncclCommGetAsyncError(c2)", "ncclCommGetAsyncError(c3)",
                                   "ncclCommDestroy(c3)", "ncclCommDestroy(c2)", "ncclCommDestroy"}));
  CHECK(c.live_communicators() == 0);
  CHECK(seq(sc.logs) == "");
}

TEST_CASE("nccl streams, per_stream: a stream's split that fails is named, and every communicator is aborted") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms, "comm::nccl", nccl_channels::per_stream);
  init(c);
  c.label("h.1");
  all_gather(c, sc, 8, 7, "rank1.all_gather");
  sc.calls.clear();
  sc.async = {fake_api::remote_error};  // the parent reports the split job's failure
  const std::string msg = error_of<fsdp::comm_error>([&] { reduce_scatter(c, sc, 4, 8, "rank1.reduce"); });
  CHECK(msg == "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 of "
               "4 during ncclCommSplit for the communicator of stream 'rank1.reduce'; pending: all_gather(count=8, "
               "f32) #0 for unit 'h.1', issued 0 ms ago and not complete; comm::nccl on rank 1 of 4 aborted (restart "
               "every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
  // The communicators this core owns first (the stream's, then the base), then the one the split made.
  CHECK(seq(sc.calls) == seq(calls{"ncclCommSplit(c1, color=0, key=1) -> c3", "sleep", "ncclCommGetAsyncError",
                                   "ncclCommAbort(c2)", "ncclCommAbort", "ncclCommAbort(c3)"}));
  CHECK(c.issued() == 1);  // the reduce-scatter was never issued
  CHECK(c.live_communicators() == 0);
}

TEST_CASE("nccl streams, per_stream: a stream's first collective cannot be grouped, and says so") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms, "comm::nccl", nccl_channels::per_stream);
  init(c);
  c.label("h.1");
  all_gather(c, sc, 8, 7, "g");
  sc.calls.clear();
  const std::string msg = error_of<fsdp::comm_error>([&] {
    c.grouped([&] {
      all_gather(c, sc, 8, 7, "g");
      reduce_scatter(c, sc, 4, 8, "r");
    });
  });
  CHECK(msg == "fsdp: comm::nccl on rank 1 of 4: grouped() abandoned after 1 queued collective (all_gather(count=8, "
               "f32) #1 for unit 'h.1') because its function threw: comm::nccl on rank 1: the first collective on "
               "stream 'r' is inside grouped(); a stream's communicator is split from the base one (ncclCommSplit) on "
               "its first collective, which cannot run inside a group. Issue one collective on the stream before "
               "grouping its collectives; the group was not launched and the communicator was aborted (the other "
               "ranks fail at their timeout; restart every rank)");
  CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclAllGather(c2)", "ncclBroadcast(root=-1)", "ncclGroupEnd",
                                   "ncclCommAbort(c2)", "ncclCommAbort"}));
}

TEST_CASE("nccl split groups: a failure in either a world or its split group aborts both and names both's pending") {
  script sc;
  core world(fake_api{&sc}, 1, 4, 1000ms, "comm::nccl", nccl_channels::per_stream);  // a communicator per stream
  init(world);
  sc.split = fake_api::success;
  const int sub = world.split(1, 1);
  CHECK(sub == 2);
  std::optional<core> group;  // a Model's shard or replicate group, which ends before the world
  group.emplace(fake_api{&sc}, 0, 2, 1000ms, "comm::nccl split(color=1, key=1)", nccl_channels::per_stream);
  group->init(sub, fake_api::success, "ncclCommSplit", "a split group");
  group->join_family(world);
  CHECK(world.issued() == 0);  // a split is not a collective of the count

  world.label("h.1");
  all_gather(world, sc, 8, 7, "rank1.all_gather");  // c3
  group->label("h.0");
  reduce_scatter(*group, sc, 4, 8, "rank1.reduce");  // c4, split from c2
  // the stream's split, the parent's state read at its answer (ncclSuccess does not mean settled), the new one's
  CHECK(sc.calls[sc.calls.size() - 5] == "ncclCommSplit(c2, color=0, key=0) -> c4");
  CHECK(sc.calls[sc.calls.size() - 4] == "ncclCommGetAsyncError(c2)");
  sc.now += 12ms;

  SUBCASE("an asynchronous error in the split group, seen by the world's check() (the CUDA backend's poll)") {
    sc.async_of[4] = {fake_api::remote_error};
    sc.calls.clear();
    const std::string msg = error_of<fsdp::comm_error>([&] { world.check(); });
    CHECK(msg == "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 0 "
                 "of 2; pending: comm::nccl: all_gather(count=8, f32) #0 for unit 'h.1', issued 12 ms ago and not "
                 "complete; comm::nccl split(color=1, key=1): reduce_scatter(count=4, bf16) #0 for unit 'h.0', issued "
                 "12 ms ago and not complete; comm::nccl split(color=1, key=1) on rank 0 of 2 aborted (restart every "
                 "rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
    CHECK(seq(sc.calls) == seq(calls{"ncclCommGetAsyncError", "ncclCommGetAsyncError(c3)", "ncclCommGetAsyncError(c2)",
                                     "ncclCommGetAsyncError(c4)", "ncclCommAbort(c3)", "ncclCommAbort",
                                     "ncclCommAbort(c4)", "ncclCommAbort(c2)"}));
    CHECK(error_of<fsdp::comm_error>([&] { world.check(); }) ==
          "fsdp: comm::nccl on rank 1 was aborted: " + msg.substr(6));
    CHECK(error_of<fsdp::comm_error>([&] { all_gather(*group, sc, 1, 7, "rank1.all_gather"); }) ==
          "fsdp: all_gather on rank 0 after comm::nccl split(color=1, key=1) was aborted: " + msg.substr(6));
  }
  SUBCASE("a timeout of the world's wait names the split group's pending collectives too") {
    sc.calls.clear();
    const std::string msg = error_of<fsdp::comm_error>([&] { world.fail_timeout("step on stream 'rank1.compute'"); });
    CHECK(msg == "fsdp: step on stream 'rank1.compute'; pending: comm::nccl: all_gather(count=8, f32) #0 for unit "
                 "'h.1', issued 12 ms ago and not complete; comm::nccl split(color=1, key=1): reduce_scatter(count=4, "
                 "bf16) #0 for unit 'h.0', issued 12 ms ago and not complete; comm::nccl on rank 1 of 4 aborted (a "
                 "rank that died or issued a different collective sequence leaves the others waiting)");
    CHECK(group->aborted());
    CHECK(group->live_communicators() == 0);
  }
  SUBCASE("a split group that has ended leaves the family") {
    sc.complete = {1, 2};
    group->shutdown();
    group.reset();
    sc.async_of[4] = {fake_api::remote_error};  // the ended group's communicator is not polled any more
    world.check();
    CHECK_FALSE(world.aborted());
  }
}

TEST_CASE("nccl split: a split that settles without a communicator is an error, and a split cannot be grouped") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  init(c);
  SUBCASE("no communicator") {
    sc.split = fake_api::success;
    sc.split_fills = false;
    CHECK(
        error_of<fsdp::comm_error>([&] { (void)c.split(1, 1); }) ==
        "fsdp: NCCL reported ncclInternalError (internal error) on rank 1 of 4 during ncclCommSplit for split(color=1, "
        "key=1) (it settled, but gave no communicator); pending: no collective pending; comm::nccl on rank 1 of 4 "
        "aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
    // the parent's state is read first (the call's ncclSuccess does not mean the split has settled)
    CHECK(seq(sc.calls) ==
          seq(calls{"ncclCommSplit(c1, color=1, key=1) -> null", "ncclCommGetAsyncError", "ncclCommAbort"}));
  }
  SUBCASE("inside grouped()") {
    const std::string msg = error_of<fsdp::comm_error>([&] { c.grouped([&] { (void)c.split(1, 1); }); });
    CHECK(msg.find("because its function threw: comm::nccl on rank 1: ncclCommSplit for split(color=1, key=1) inside "
                   "grouped(): a split cannot be grouped with collectives; split before grouping;") !=
          std::string::npos);
    CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclBroadcast(root=-1)", "ncclGroupEnd", "ncclCommAbort"}));
  }
}

TEST_CASE("nccl groups: a family member that fails inside a group is aborted with the rest once the group is closed") {
  // NCCL's group state is per thread: an ncclCommAbort called while this thread has a group open would be queued
  // in it, and the failing ncclGroupEnd would discard it. Every member's abort waits for the group to close.
  script sc;
  core world(fake_api{&sc}, 1, 4, 1000ms, "comm::nccl", nccl_channels::per_stream);  // a communicator per stream
  init(world);
  sc.split = fake_api::success;
  core group(fake_api{&sc}, 0, 2, 1000ms, "comm::nccl split(color=1, key=1)", nccl_channels::per_stream);
  group.init(world.split(1, 1), fake_api::success, "ncclCommSplit", "a split group");  // c2
  group.join_family(world);
  all_gather(world, sc, 8, 7, "g");    // c3
  reduce_scatter(group, sc, 4, 8, "r");  // c4
  sc.calls.clear();
  world.label("h.1");
  group.label("h.0");
  const std::string msg = error_of<fsdp::comm_error>([&] {
    world.grouped([&] {
      all_gather(world, sc, 8, 7, "g");
      sc.call = fake_api::invalid_argument;
      reduce_scatter(group, sc, 4, 8, "r");
    });
  });
  CHECK(msg.find("grouped() abandoned after 1 queued collective (all_gather(count=8, f32) #1 for unit 'h.1') because "
                 "its function threw: NCCL reported ncclInvalidArgument (invalid argument) on rank 0 of 2 during "
                 "ncclReduceScatter for reduce_scatter(count=4, bf16) #1 for unit 'h.0'") != std::string::npos);
  CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclAllGather(c3)", "ncclReduceScatter(c4)",
                                   "ncclBroadcast(root=-1)", "ncclGroupEnd", "ncclCommAbort(c3)", "ncclCommAbort",
                                   "ncclCommAbort(c4)", "ncclCommAbort(c2)"}));
  CHECK(world.live_communicators() == 0);
  CHECK(group.live_communicators() == 0);
}

TEST_CASE("nccl hybrid groups (one communicator each): once the world is split, every collective of every group runs "
          "on one stream of the family's, in the order the host issued them") {
  // NCCL orders one communicator's collectives, not two communicators': the shard group's reduce-scatter on the
  // reduce stream, its prefetched gather on the gather stream and the world's loss all-reduce on the compute stream
  // could run in a different order on each rank. Through one stream, the order is the host's, which every rank shares.
  script sc;
  {
    core world(fake_api{&sc}, 1, 4, 1000ms);
    init(world);
    world.label("h.0");
    all_gather(world, sc, 8, 7, "rank1.all_gather");  // e1 on s7, still running at the split
    sc.split = fake_api::success;
    core group(fake_api{&sc}, 0, 2, 1000ms, "comm::nccl split(color=1, key=1)");
    group.init(world.split(1, 1), fake_api::success, "ncclCommSplit", "a split group");  // c2
    CHECK_FALSE(world.ordered());
    sc.calls.clear();
    group.join_family(world);
    CHECK(world.ordered());
    CHECK(group.ordered());
    // The family's stream is made at the join and first waits for what is still pending: the gather before the split.
    CHECK(seq(sc.calls) == seq(calls{"cudaStreamCreate -> s100", "cudaStreamWaitEvent(s100, e1)"}));

    sc.calls.clear();
    group.label("h.1");
    reduce_scatter(group, sc, 4, 8, "rank1.reduce");
    all_gather(group, sc, 8, 7, "rank1.all_gather");
    all_reduce(world, sc, 1, 9, "rank1.compute");
    // Each collective: the issuing stream's work so far (an event, e2 for the group and e5 for the world, reused),
    // the collective on s100, its completion event there, and the issuing stream waits for that.
    CHECK(seq(sc.calls) ==
          seq(calls{"cudaEventRecord(e2, s8)", "cudaStreamWaitEvent(s100, e2)", "ncclReduceScatter(c2) on s100",
                    "cudaEventRecord(e3, s100)", "cudaStreamWaitEvent(s8, e3)",
                    "cudaEventRecord(e2, s7)", "cudaStreamWaitEvent(s100, e2)", "ncclAllGather(c2) on s100",
                    "cudaEventRecord(e4, s100)", "cudaStreamWaitEvent(s7, e4)",
                    "cudaEventRecord(e5, s9)", "cudaStreamWaitEvent(s100, e5)", "ncclAllReduce on s100",
                    "cudaEventRecord(e6, s100)", "cudaStreamWaitEvent(s9, e6)"}));
    CHECK(group.stats()[collective::reduce_scatter] == 1);
    CHECK(world.stats()[collective::all_reduce] == 1);

    // Grouped: every call on s100 inside the group; the completions recorded once it is launched.
    sc.calls.clear();
    world.grouped([&] {
      all_gather(world, sc, 8, 7, "rank1.all_gather");
      reduce_scatter(group, sc, 4, 8, "rank1.reduce");
    });
    CHECK(seq(sc.calls) ==
          seq(calls{"ncclGroupStart", "cudaEventRecord(e5, s7)", "cudaStreamWaitEvent(s100, e5)",
                    "ncclAllGather on s100", "cudaEventRecord(e2, s8)", "cudaStreamWaitEvent(s100, e2)",
                    "ncclReduceScatter(c2) on s100", "ncclGroupEnd", "cudaEventRecord(e7, s100)",
                    "cudaStreamWaitEvent(s7, e7)", "cudaEventRecord(e8, s100)", "cudaStreamWaitEvent(s8, e8)"}));
    sc.complete = {1, 2, 3, 4, 5, 6, 7, 8};
    group.shutdown();
    world.shutdown();
    sc.calls.clear();
  }
  // The family's stream ends with its last member.
  CHECK(seq(sc.calls) == seq(calls{"cudaStreamDestroy(s100)"}));
}

TEST_CASE(
    "nccl tensor-parallel groups: the world split into its shard group and its tensor group; the library's "
    "collectives and the trainer's run on the family's one stream in the order the host issued them, and a "
    "failure in the tensor group aborts all three") {
  // Rank 1 of a 2 x 2 mesh (tensor groups {0, 1} {2, 3}): exec::split_world's splits, in its order, the shard group
  // first (its data-parallel ranks {1, 3}: color = tensor rank 1), then the tensor group (color = data-parallel rank
  // 0). The trainer's all-reduce after a row-parallel product is issued on the compute stream (s9) between the
  // library's prefetched gather (s7) and its reduce-scatter (s8); every rank issues them in that order, and through
  // the family's one stream NCCL runs them so.
  script sc;
  core world(fake_api{&sc}, 1, 4, 1000ms);
  init(world);
  sc.split = fake_api::success;
  core shard(fake_api{&sc}, 0, 2, 1000ms, "comm::nccl split(color=1, key=1)");
  shard.init(world.split(1, 1), fake_api::success, "ncclCommSplit", "a split group");  // c2
  core tensor(fake_api{&sc}, 1, 2, 1000ms, "comm::nccl split(color=0, key=1)");
  tensor.init(world.split(0, 1), fake_api::success, "ncclCommSplit", "a split group");  // c3
  shard.join_family(world);
  tensor.join_family(world);
  CHECK(world.ordered());
  CHECK(shard.ordered());
  CHECK(tensor.ordered());
  sc.calls.clear();
  shard.label("h.1");
  all_gather(shard, sc, 8, 7, "rank1.all_gather");  // the library's prefetch of the next unit
  all_reduce(tensor, sc, 64, 9, "rank1.compute");   // the trainer's, after its row-parallel product
  reduce_scatter(shard, sc, 4, 8, "rank1.reduce");  // the library's reduction of the unit's gradients
  tensor.label("h.0");
  all_reduce(tensor, sc, 16, 9, "rank1.compute");  // the model's partial gradients (tensor_reduce)
  all_reduce(world, sc, 1, 9, "rank1.compute");    // the trainer's loss
  // Each: the issuing stream's work so far (an event of the issuing communicator's, reused), the collective on s100,
  // its completion event there, and the issuing stream waits for that.
  CHECK(seq(sc.calls) ==
        seq(calls{"cudaEventRecord(e1, s7)",   "cudaStreamWaitEvent(s100, e1)", "ncclAllGather(c2) on s100",
                  "cudaEventRecord(e2, s100)", "cudaStreamWaitEvent(s7, e2)",  // the prefetch
                  "cudaEventRecord(e3, s9)",   "cudaStreamWaitEvent(s100, e3)", "ncclAllReduce(c3) on s100",
                  "cudaEventRecord(e4, s100)", "cudaStreamWaitEvent(s9, e4)",  // the trainer's
                  "cudaEventRecord(e1, s8)",   "cudaStreamWaitEvent(s100, e1)", "ncclReduceScatter(c2) on s100",
                  "cudaEventRecord(e5, s100)", "cudaStreamWaitEvent(s8, e5)",  // the reduction
                  "cudaEventRecord(e3, s9)",   "cudaStreamWaitEvent(s100, e3)", "ncclAllReduce(c3) on s100",
                  "cudaEventRecord(e6, s100)", "cudaStreamWaitEvent(s9, e6)",  // the partial gradients
                  "cudaEventRecord(e7, s9)",   "cudaStreamWaitEvent(s100, e7)", "ncclAllReduce on s100",
                  "cudaEventRecord(e8, s100)", "cudaStreamWaitEvent(s9, e8)"}));  // the loss
  CHECK(tensor.stats()[collective::all_reduce] == 2);
  CHECK(shard.stats()[collective::all_gather] == 1);
  CHECK(world.stats()[collective::all_reduce] == 1);

  sc.now += 5ms;
  sc.complete = {2, 4, 5, 8};  // everything but the model's partial-gradient reduction has completed
  sc.async_of[3] = {fake_api::remote_error};
  sc.calls.clear();
  const std::string msg = error_of<fsdp::comm_error>([&] { world.check(); });
  CHECK(msg ==
        "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 1 "
        "of 2; pending: comm::nccl split(color=0, key=1): all_reduce(count=16, f32) #1 for unit 'h.0', issued "
        "5 ms ago and not complete; comm::nccl split(color=0, key=1) on rank 1 of 2 aborted (restart every "
        "rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
  CHECK(world.aborted());
  CHECK(shard.aborted());
  CHECK(tensor.aborted());
}

TEST_CASE("nccl hybrid groups under per_stream: no family stream (NCCL_LAUNCH_ORDER_IMPLICIT=1 orders the launches)") {
  script sc;
  core world(fake_api{&sc}, 1, 4, 1000ms, "comm::nccl", nccl_channels::per_stream);
  init(world);
  sc.split = fake_api::success;
  core group(fake_api{&sc}, 0, 2, 1000ms, "comm::nccl split(color=1, key=1)", nccl_channels::per_stream);
  group.init(world.split(1, 1), fake_api::success, "ncclCommSplit", "a split group");
  sc.calls.clear();
  group.join_family(world);
  CHECK_FALSE(world.ordered());
  CHECK(sc.calls.empty());
}

TEST_CASE("nccl all_to_all: one group of a send and a receive per rank; a dtype this NCCL lacks is refused before the "
          "group opens") {
  script sc;
  core c(fake_api{&sc}, 1, 3, 1000ms);
  init(c);
  c.label("h.1");
  all_to_all(c, sc, 4, 8);
  CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclSend(0)", "ncclRecv(0)", "ncclSend(1)", "ncclRecv(1)",
                                   "ncclSend(2)", "ncclRecv(2)", "ncclGroupEnd", "cudaEventRecord(e1, s8)"}));
  CHECK(c.stats()[collective::all_to_all] == 1);

  // The NCCL type is resolved first: nothing is called, no group is left open on this thread (it would capture every
  // later NCCL call), the communicator is not aborted, and no sequence number is spent.
  sc.calls.clear();
  CHECK(error_of<fsdp::usage_error>([&] { all_to_all(c, sc, 4, 8, dtype::f8e5m2); }) ==
        "fsdp: comm::nccl: dtype f8e5m2 needs NCCL 2.24 or later");
  CHECK(error_of<fsdp::usage_error>([&] { all_gather(c, sc, 4, 7, {}, dtype::f8e5m2); }) ==
        "fsdp: comm::nccl: dtype f8e5m2 needs NCCL 2.24 or later");
  // A negative count likewise (comm::detail::require_count, every communicator's check).
  CHECK(error_of<fsdp::usage_error>([&] { all_gather(c, sc, -1, 7); }) ==
        "fsdp: all_gather(count=-1, f32) on rank 1: negative count");
  CHECK(sc.calls.empty());
  CHECK_FALSE(c.aborted());
  CHECK(c.issued() == 1);

  // A send NCCL rejects: the group is still closed, then the communicator aborted.
  sc.complete = {1};
  sc.call = fake_api::invalid_argument;
  CHECK(error_of<fsdp::comm_error>([&] { all_to_all(c, sc, 4, 8); }) ==
        "fsdp: NCCL reported ncclInvalidArgument (invalid argument) on rank 1 of 3 during ncclSend/ncclRecv for "
        "all_to_all(count=4, i8) #1 for unit 'h.1'; pending: no collective pending; comm::nccl on rank 1 of 3 aborted "
        "(restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
  CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclSend(0)", "ncclGroupEnd", "ncclCommAbort"}));
}

TEST_CASE(
    "nccl all_to_all_v: one group of a send and a receive per rank whose block is not empty, each at its "
    "block's place; the stats count what this rank sends") {
  script sc;
  core c(fake_api{&sc}, 1, 3, 1000ms);
  init(c);
  c.label("h.1");
  // rank 1 of 3 sends 2, 0 and 3 elements (itself nothing) and receives 1, 0 and 5
  all_to_all_v(c, sc, {2, 0, 3, 1, 0, 5}, 8);
  CHECK(seq(sc.calls) ==
        seq(calls{"ncclGroupStart", "ncclSend(0 at 0, 2)", "ncclRecv(0 at 0, 1)", "ncclSend(2 at 8, 3)",
                  "ncclRecv(2 at 4, 5)", "ncclGroupEnd", "cudaEventRecord(e1, s8)"}));
  CHECK(c.stats()[collective::all_to_all_v] == 1);
  CHECK(c.stats().bytes[std::size_t(collective::all_to_all_v)] == 5 * 4);
  // Nothing to move at all: still one collective (every rank issues it), an empty group.
  sc.calls.clear();
  all_to_all_v(c, sc, {0, 0, 0, 0, 0, 0}, 8, dtype::bf16);
  CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclGroupEnd", "cudaEventRecord(e2, s8)"}));
  CHECK(c.issued() == 2);
  // A receive NCCL rejects is named as the collective it belongs to.
  sc.calls.clear();
  sc.complete = {1, 2};
  sc.call = fake_api::invalid_argument;
  CHECK(error_of<fsdp::comm_error>([&] { all_to_all_v(c, sc, {0, 0, 0, 4, 0, 0}, 8); }) ==
        "fsdp: NCCL reported ncclInvalidArgument (invalid argument) on rank 1 of 3 during ncclSend/ncclRecv for "
        "all_to_all_v(count=0, f32) #2 for unit 'h.1'; pending: no collective pending; comm::nccl on rank 1 of 3 "
        "aborted (restart every rank; NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
  CHECK(seq(sc.calls) == seq(calls{"ncclGroupStart", "ncclRecv(0 at 0, 4)", "ncclGroupEnd", "ncclCommAbort"}));
}

namespace {
/// Issues `u` as nccl.cuh's connect() does (its own collective methods), recorded with its count and dtype.
void issue_use(core& c, script& sc, const fsdp::collective_use& u, int stream) {
  if (u.kind == collective::all_to_all) return all_to_all(c, sc, u.count, stream, u.type);
  const std::string name = std::string(fsdp::comm::detail::nccl_function(u.kind)) + "(count=" +
                           std::to_string(u.count) + ", " + std::string(fsdp::name_of(u.type)) + ")";
  c.issue(u.kind, u.count, u.type, u.count * c.size(), stream, {}, [&](int comm, int on, int) {
    sc.calls.push_back(nccl_call(name.c_str(), comm, on, stream));
    return static_cast<fake_api::result>(sc.call);
  });
}
const std::vector<fsdp::collective_use> plan_uses = {{collective::all_gather, 1000, dtype::bf16},
                                                     {collective::reduce_scatter, 1000, dtype::f32},
                                                     {collective::all_to_all, 64, dtype::i8}};
}  // namespace

TEST_CASE("nccl connect: each collective of the plan runs once over scratch before the reservation; what NCCL took is "
          "measured, and none of it is counted") {
  // NCCL 2.28 connects an algorithm's buffers at its first collective (NCCL_RUNTIME_CONNECT=1, its default where cuMem
  // is), and a peer's at the first send to it: made here, they are measured beside the plan instead of taken in step 1.
  script sc;
  core c(fake_api{&sc}, 1, 4, 1000ms);
  sc.free_bytes = {10'000'000, 10'000'000, 9'000'000};  // after set-up; before connect(); after it, scratch freed
  c.init(1, fake_api::success, "ncclCommInitRankConfig", "communicator set-up", 12'000'000);
  c.label("h.3");
  sc.complete = {1, 2, 3};
  c.connect(plan_uses, [&](const fsdp::collective_use& u, void*, void*) { issue_use(c, sc, u, 9); });
  // scratch for the largest: the reduce-scatter sends 4 x 1000 f32 (16000 B), the gather receives 4 x 1000 bf16
  CHECK(seq(sc.calls) == seq(calls{"cudaMalloc(16000) -> 1", "cudaMalloc(8000) -> 2", "ncclAllGather(count=1000, bf16)",
                                   "cudaEventRecord(e1, s9)", "ncclReduceScatter(count=1000, f32)",
                                   "cudaEventRecord(e2, s9)", "ncclGroupStart", "ncclSend(0)", "ncclRecv(0)",
                                   "ncclSend(1)", "ncclRecv(1)", "ncclSend(2)", "ncclRecv(2)", "ncclSend(3)",
                                   "ncclRecv(3)", "ncclGroupEnd", "cudaEventRecord(e3, s9)", "ncclCommGetAsyncError",
                                   "cudaFree(2)", "cudaFree(1)"}));
  CHECK(c.connect_bytes() == 1'000'000);
  CHECK(c.device_bytes() == 2'000'000 + 1'000'000);
  CHECK(c.connected() == 3);
  for (std::size_t k = 0; k < fsdp::collective_kinds; ++k) CHECK(c.stats().count[k] == 0);
  CHECK(c.issued() == 3);  // numbered like any collective, so a failure among them is named
  // nothing to connect: nothing called
  sc.calls.clear();
  c.connect({}, [&](const fsdp::collective_use&, void*, void*) { FAIL("no use to issue"); });
  CHECK(sc.calls.empty());
  // an all_to_all_v has no shape of its own: refused before anything is made
  CHECK(error_of<fsdp::usage_error>([&] {
          c.connect({{collective::all_gather, 8, dtype::f32}, {collective::all_to_all_v, 8, dtype::f32}},
                    [&](const fsdp::collective_use&, void*, void*) { FAIL("nothing to issue"); });
        }) ==
        "fsdp: connect() on rank 1: all_to_all_v has no shape to connect ahead (its counts are each call's); list "
        "an all_to_all of its largest block instead, which connects the same peers");
  CHECK(sc.calls.empty());
  CHECK(c.connected() == 3);
  // the trainer's label is back
  sc.call = fake_api::invalid_argument;
  CHECK(error_of<fsdp::comm_error>([&] { all_gather(c, sc, 8, 7); }).find("#3 for unit 'h.3'") != std::string::npos);
}

TEST_CASE("nccl connect: a connection that never completes is named, aborts the family, and leaves the scratch alone") {
  script sc;
  core c(fake_api{&sc}, 1, 4, 5ms);
  init(c);
  c.label("h.3");
  const std::string msg = error_of<fsdp::comm_error>([&] {
    c.connect(plan_uses, [&](const fsdp::collective_use& u, void*, void*) { issue_use(c, sc, u, 9); });
  });
  CHECK(msg == "fsdp: connecting 3 collectives of the plan on rank 1 did not complete within 5 ms; pending: "
               "all_gather(count=1000, bf16) #0 for unit '(connections for the plan's collectives)', issued 5 ms ago "
               "and not complete; reduce_scatter(count=1000, f32) #1 for unit '(connections for the plan's "
               "collectives)', issued 5 ms ago and not complete; all_to_all(count=64, i8) #2 for unit '(connections "
               "for the plan's collectives)', issued 5 ms ago and not complete; comm::nccl on rank 1 of 4 aborted (a "
               "rank that died or issued a different collective sequence leaves the others waiting)");
  CHECK(sc.calls.back() == "ncclCommAbort");
  for (const std::string& call : sc.calls) CHECK(call.rfind("cudaFree", 0) != 0);  // a collective may still hold it
}

TEST_CASE("nccl split: ncclCommSplit answers ncclSuccess while the split still runs; the parent's state says when it "
          "has settled, and only then is the new communicator read") {
  // NCCL 2.28 (2.28.3 on the H200, 2.28.9 here): a non-blocking split returns ncclSuccess from the call, sets the
  // parent's state to ncclInProgress, and fills the new communicator from a job of the parent. Reading it at the
  // call's answer found it null on the H200 ("it settled, but gave no communicator"), and the abort that followed
  // ended the running job ("ncclAsyncJobComplete: job ... failed, job error 3").
  script sc;
  core c(fake_api{&sc}, 0, 1, 1000ms);
  init(c);
  sc.split = fake_api::success;
  sc.split_fills_when_settled = true;
  sc.async = {fake_api::in_progress, fake_api::in_progress};  // the parent's job runs for two more reads
  const int sub = c.split(3, 0);
  CHECK(sub == 2);
  CHECK(seq(sc.calls) == seq(calls{"ncclCommSplit(c1, color=3, key=0) -> c2", "ncclCommGetAsyncError", "sleep",
                                   "ncclCommGetAsyncError", "sleep", "ncclCommGetAsyncError",
                                   "ncclCommGetAsyncError(c2)"}));
  CHECK_FALSE(c.aborted());
  // the parent's state reports the job's failure: named, and nothing is left half made
  script sc2;
  core d(fake_api{&sc2}, 0, 1, 1000ms);
  init(d);
  sc2.split = fake_api::success;
  sc2.split_fills_when_settled = true;
  sc2.async = {fake_api::in_progress, fake_api::internal_error};
  CHECK(error_of<fsdp::comm_error>([&] { (void)d.split(3, 0); }) ==
        "fsdp: NCCL reported ncclInternalError (internal error) on rank 0 of 1 during ncclCommSplit for split(color=3, "
        "key=0); pending: no collective pending; comm::nccl on rank 0 of 1 aborted (restart every rank; "
        "NCCL_DEBUG=WARN on every rank shows which peer or resource failed)");
  CHECK(seq(sc2.calls) == seq(calls{"ncclCommSplit(c1, color=3, key=0) -> c2", "ncclCommGetAsyncError", "sleep",
                                    "ncclCommGetAsyncError", "ncclCommAbort"}));
}

TEST_CASE(
    "nccl revoke: under nccl_failure::revoke a failure revokes every communicator of the family instead of aborting "
    "it, says so, and shrink() makes the survivors' communicator once the revoked ones are quiescent") {
  script sc;
  core world(fake_api{&sc}, 1, 4, 1000ms, "comm::nccl", nccl_channels::one, fsdp::comm::nccl_failure::revoke);
  init(world);
  sc.split = fake_api::success;
  std::optional<core> group;  // a hybrid model's shard group
  group.emplace(fake_api{&sc}, 0, 2, 1000ms, "comm::nccl split(color=0, key=1)", nccl_channels::one,
                fsdp::comm::nccl_failure::revoke);
  group->init(world.split(0, 1), fake_api::success, "ncclCommSplit", "a split group");  // c2
  group->join_family(world);
  group->label("h.0");
  all_gather(*group, sc, 8, 7);
  sc.now += 3ms;
  sc.async_of[2] = {fake_api::remote_error};
  sc.calls.clear();
  const std::string msg = error_of<fsdp::comm_error>([&] { world.check(); });
  CHECK(msg ==
        "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 0 of "
        "2; pending: comm::nccl split(color=0, key=1): all_gather(count=8, f32) #0 for unit 'h.0', issued 3 ms "
        "ago and not complete; comm::nccl split(color=0, key=1) on rank 0 of 2 revoked (NCCL_DEBUG=WARN on "
        "every rank shows which peer or resource failed; the survivors name the ranks that failed and call "
        "shrink())");
  CHECK(seq(sc.calls) ==
        seq(calls{"ncclCommGetAsyncError", "ncclCommGetAsyncError(c2)", "ncclCommRevoke", "ncclCommRevoke(c2)"}));
  CHECK(world.revoked());
  CHECK(world.live_communicators() == 1);  // still there, for shrink()
  CHECK(error_of<fsdp::comm_error>([&] { all_gather(world, sc, 1, 7); }) ==
        "fsdp: all_gather on rank 1 after comm::nccl was revoked: " + msg.substr(6));

  // the survivors agree that rank 3 failed; NCCL quiesces the revoked communicator (in progress, then success)
  sc.async = {fake_api::in_progress, fake_api::in_progress};
  sc.calls.clear();
  const int survivors = world.shrink({3});
  CHECK(survivors == 3);
  CHECK(seq(sc.calls) ==
        seq(calls{"ncclCommGetAsyncError", "sleep", "ncclCommGetAsyncError", "sleep", "ncclCommGetAsyncError",
                  "ncclCommShrink(c1, exclude=[3]) -> c3", "ncclCommGetAsyncError", "ncclCommGetAsyncError(c3)"}));
  sc.calls.clear();
  group.reset();
  world.shutdown();  // revoked communicators end with ncclCommAbort (ncclCommFinalize is invalid after a revoke)
  CHECK(seq(sc.calls) == seq(calls{"ncclCommAbort(c2)", "ncclCommAbort"}));
}

TEST_CASE(
    "nccl shrink: a healthy group shrinks at once (ranks leaving in order); the list is checked before any call; "
    "after an abort (the default) shrink() says which option keeps the communicators") {
  script sc;
  core world(fake_api{&sc}, 2, 4, 1000ms, "comm::nccl", nccl_channels::one, fsdp::comm::nccl_failure::revoke);
  init(world);
  sc.calls.clear();
  CHECK(error_of<fsdp::usage_error>([&] { world.shrink({2}); }) ==
        "fsdp: comm::nccl on rank 2: shrink() excludes this rank; a rank that is excluded does not call it");
  CHECK(error_of<fsdp::usage_error>([&] { world.shrink({4}); }) ==
        "fsdp: comm::nccl on rank 2: shrink() excludes rank 4, which is not a rank of 4");
  CHECK(error_of<fsdp::usage_error>([&] { world.shrink({3, 0, 3}); }) ==
        "fsdp: comm::nccl on rank 2: shrink() excludes rank 3 twice");
  CHECK(error_of<fsdp::usage_error>([&] { world.shrink({}); }) ==
        "fsdp: comm::nccl on rank 2: shrink() with no rank to exclude (split() keeps them all)");
  CHECK(sc.calls.empty());
  CHECK(world.shrink({3, 0}) == 2);
  CHECK(seq(sc.calls) ==
        seq(calls{"ncclCommShrink(c1, exclude=[0, 3]) -> c2", "ncclCommGetAsyncError", "ncclCommGetAsyncError(c2)"}));

  script sa;
  core aborting(fake_api{&sa}, 1, 4, 1000ms);  // nccl_failure::abort
  init(aborting);
  sa.async = {fake_api::remote_error};
  const std::string msg = error_of<fsdp::comm_error>([&] { aborting.check(); });
  CHECK(sa.calls.back() == "ncclCommAbort");
  CHECK(error_of<fsdp::comm_error>([&] { aborting.shrink({3}); }) ==
        "fsdp: shrink() on rank 1 after comm::nccl was aborted: " + msg.substr(6) +
            " (with nccl_options::on_failure = nccl_failure::revoke a failure revokes the communicators instead, and "
            "shrink() can follow)");
}

TEST_CASE(
    "nccl revoke: refused by version (ncclCommRevoke and ncclCommShrink from 2.28.7, ncclCommGrow from 2.29.2, not "
    "built); a revoke NCCL rejects falls back to an abort, logged; a revoked communicator that reports an error "
    "while quiescing cannot be shrunk") {
  script sc;
  sc.version = 22803;  // the GPU machine's NCCL
  CHECK(error_of<fsdp::usage_error>([&] {
          core c(fake_api{&sc}, 0, 2, 1000ms, "comm::nccl", nccl_channels::one, fsdp::comm::nccl_failure::revoke);
        }) ==
        "fsdp: comm::nccl: nccl_failure::revoke and shrink() need ncclCommRevoke and ncclCommShrink (NCCL 2.28.7 or "
        "later), but this NCCL is 2.28.3: use nccl_failure::abort (the default) and restart every rank from the last "
        "checkpoint after a lost rank, or run with NCCL 2.28.7 or later");
  core old(fake_api{&sc}, 0, 2, 1000ms);
  init(old);
  CHECK(error_of<fsdp::usage_error>([&] { old.shrink({1}); }).find("but this NCCL is 2.28.3") != std::string::npos);
  CHECK(fsdp::comm::detail::shrink_refusal(22807).empty());
  CHECK(fsdp::comm::detail::grow_refusal(22809) ==
        "comm::nccl: growing a communicator needs ncclCommGrow (NCCL 2.29.2 or later), but this NCCL is 2.28.9: "
        "replacements join at a restart of every rank from the last checkpoint");
  CHECK(fsdp::comm::detail::grow_refusal(22902) ==
        "comm::nccl: growing a communicator (ncclCommGrow, in this NCCL 2.29.2) is not built yet: replacements join "
        "at a restart of every rank from the last checkpoint");

  script sr;
  sr.revoke = fake_api::invalid_argument;
  core c(fake_api{&sr}, 0, 2, 1000ms, "comm::nccl", nccl_channels::one, fsdp::comm::nccl_failure::revoke);
  init(c);
  sr.async = {fake_api::remote_error};
  error_of<fsdp::comm_error>([&] { c.check(); });
  CHECK(sr.calls.back() == "ncclCommAbort");
  CHECK_FALSE(c.revoked());
  CHECK(sr.logs == std::vector<std::string>{"fsdp: comm::nccl on rank 0 of 2: ncclCommRevoke reported "
                                            "ncclInvalidArgument (invalid argument); the communicators were aborted "
                                            "instead"});

  script sq;
  core d(fake_api{&sq}, 0, 2, 1000ms, "comm::nccl", nccl_channels::one, fsdp::comm::nccl_failure::revoke);
  init(d);
  sq.async = {fake_api::remote_error, fake_api::remote_error};
  error_of<fsdp::comm_error>([&] { d.check(); });
  CHECK(d.revoked());
  CHECK(error_of<fsdp::comm_error>([&] { d.shrink({1}); }) ==
        "fsdp: NCCL reported ncclRemoteError (remote process exited or there was a network error) on rank 0 of 2 while "
        "the revoked communicators quiesced for shrink(excluding rank 1); comm::nccl cannot be shrunk; restart every "
        "rank from the last checkpoint");
}
