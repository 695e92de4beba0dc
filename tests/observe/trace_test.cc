// Observability: the Chrome-trace file parses and holds the events it should; per-step summaries (compute,
// communication, exposed communication) are exact on known timelines; collective timings respect the modelled
// link; the memory timeline reproduces the measured peaks. The recorder's record-at-time API; the stamper's
// timing-mark path (backend::cuda's, driven here by a fake whose marks complete when the test says): times,
// order, marks not complete yet kept pending, and close(); and a Model on a host backend given both optional hooks
// (timing marks, profiler ranges) records what the host-callback path records, with the ranges in place.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <fsdp/observe/chrome_trace.hpp>
#include <nlohmann/json.hpp>

#include "examples/01_mlp_host/mlp.hpp"
#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp::trace::kind;
using nlohmann::json;

namespace {
using Policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>;
constexpr int world = 2, steps = 2, units = 4;

struct run_result {
  std::vector<mlp::result> results;
};

run_result train(fsdp::trace::recorder& rec, fsdp::comm::local_options lo = {}) {
  mlp::config c;
  c.dims = {16, 64, 32, 128, 8};  // padded unit sizes at 2 ranks: 1088, 2080, 4224, 1056
  c.global_batch = 8;
  c.steps = steps;
  c.model.recorder = &rec;
  lo.timeout = fsdp_test::timeout;
  run_result out;
  out.results.resize(world);
  fsdp::comm::run_local(
      world, [&](local_communicator& comm) { out.results[comm.rank()] = mlp::train<Policy>(comm, c); }, lo);
  return out;
}

fsdp::trace::event ev(kind k, std::int64_t t_ns, int unit = 0, fsdp::pass_kind p = fsdp::pass_kind::forward) {
  fsdp::trace::event e;
  e.what = k;
  e.t_ns = t_ns;
  e.unit = unit;
  e.pass = p;
  e.step = 1;
  e.bytes = 100;
  return e;
}
}  // namespace

TEST_CASE("the Chrome trace is valid JSON with the events of every rank, stream and unit") {
  fsdp::trace::recorder rec;
  train(rec);
  std::ostringstream os;
  fsdp::trace::write_chrome_trace(rec, os);
  const json doc = json::parse(os.str());  // throws on invalid JSON
  REQUIRE(doc.is_object());
  REQUIRE(doc.at("traceEvents").is_array());
  std::map<std::string, int> complete_by_cat;
  std::map<std::string, int> names;
  int counters = 0, instants = 0;
  std::map<int, std::set<std::string>> threads;
  for (const json& e : doc.at("traceEvents")) {
    REQUIRE(e.contains("ph"));
    REQUIRE(e.contains("pid"));
    const std::string ph = e.at("ph");
    const int pid = e.at("pid");
    CHECK((pid == 0 || pid == 1));
    if (ph == "M") {
      if (e.at("name") == "thread_name") threads[pid].insert(e.at("args").at("name").get<std::string>());
      continue;
    }
    REQUIRE(e.at("ts").is_number());
    CHECK(e.at("ts").get<double>() >= 0.0);
    if (ph == "X") {
      CHECK(e.at("dur").get<double>() >= 0.0);
      const int tid = e.at("tid");
      const std::string cat = e.at("cat");
      CHECK(tid == (cat == "compute" || cat == "optimizer" ? 0 : cat == "all_gather" ? 1 : 2));
      ++complete_by_cat[cat];
      ++names[e.at("name").get<std::string>()];
      if (cat == "all_gather") {
        const std::string unit = e.at("args").at("unit");
        const std::map<std::string, std::int64_t> padded = {
            {"layers.0", 1088}, {"layers.1", 2080}, {"layers.2", 4224}, {"layers.3", 1056}};
        CHECK(e.at("args").at("bytes").get<std::int64_t>() == padded.at(unit) * 4);
      }
    } else if (ph == "C") {
      ++counters;
      CHECK(e.at("args").size() == fsdp::mem_categories);
      CHECK(e.at("args").contains("gathered params"));
    } else {
      CHECK(ph == "i");
      ++instants;
    }
  }
  for (int r = 0; r < world; ++r)
    CHECK(threads[r] == std::set<std::string>{"compute", "all_gather", "reduce", "scheduler"});
  // per rank and step: every unit computes forward and backward, is gathered twice (layers.0, first in forward and
  // kept into its backward, once) and reduce-scattered once
  CHECK(complete_by_cat["compute"] == world * steps * 2 * units);
  CHECK(complete_by_cat["optimizer"] == world * steps);
  CHECK(complete_by_cat["all_gather"] == world * steps * (2 * units - 1));
  CHECK(complete_by_cat["reduce_scatter"] == world * steps * units);
  CHECK(names["layers.2 forward"] == world * steps);
  CHECK(names["layers.0 backward"] == world * steps);
  CHECK(names["all_gather layers.3"] == world * steps * 2);
  // issues (7 gathers + 4 reductions) and releases (7) per rank and step
  CHECK(instants == world * steps * (2 * (2 * units - 1) + units));
  CHECK(counters == static_cast<int>(rec.memory_timeline().size()));
  CHECK(counters > 0);

  // to a file, and back
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/trace.json";
  fsdp::trace::write_chrome_trace(rec, path);
  std::ifstream f(path);
  CHECK(json::parse(f) == doc);
  CHECK(fsdp_test::error_of<std::runtime_error>([&] {
          fsdp::trace::write_chrome_trace(rec, "/nonexistent/dir/t.json");
        }) == "fsdp: cannot open trace file '/nonexistent/dir/t.json' for writing");
}

TEST_CASE("the Chrome trace stays valid JSON when a recorder's unit names are not UTF-8 (written printably)") {
  fsdp::trace::recorder rec;
  rec.set_unit_names({"blk\xff", "ok"});  // a Model's names are checked at construction; a hand-fed recorder's are not
  rec.record(ev(kind::gather_issued, 0, 0));
  rec.record(ev(kind::gather_issued, 0, 1));
  std::ostringstream os;
  fsdp::trace::write_chrome_trace(rec, os);
  const json doc = json::parse(os.str());
  std::set<std::string> units;
  for (const json& e : doc.at("traceEvents"))
    if (e.contains("args") && e.at("args").contains("unit")) units.insert(e.at("args").at("unit").get<std::string>());
  CHECK(units == std::set<std::string>{"blk\\xff", "ok"});
}

TEST_CASE("step summary on a known timeline: compute, communication and the part of it that is exposed") {
  using P = fsdp::pass_kind;
  // compute [0,10) and [20,30); gathers [5,15) and [25,40); a reduction [12,18); optimizer [40,45)
  std::vector<fsdp::trace::event> e = {
      ev(kind::compute_begin, 0),           ev(kind::gather_issued, 1, 1),  ev(kind::gather_begin, 5, 1),
      ev(kind::compute_end, 10),            ev(kind::reduce_issued, 11, 0), ev(kind::reduce_begin, 12, 0),
      ev(kind::gather_end, 15, 1),          ev(kind::reduce_end, 18, 0),    ev(kind::compute_begin, 20, 1),
      ev(kind::gather_issued, 21, 2),       ev(kind::gather_begin, 25, 2),  ev(kind::compute_end, 30, 1),
      ev(kind::gather_end, 40, 2),          ev(kind::optimizer_begin, 40, -1, P::none),
      ev(kind::optimizer_end, 45, -1, P::none)};
  e[5].coll = e[4].coll = fsdp::collective::reduce_scatter;
  const auto s = fsdp::trace::summarize(e, 0, 1);
  CHECK(s.wall_s == doctest::Approx(45e-9).epsilon(1e-12));
  CHECK(s.compute_s == doctest::Approx(25e-9).epsilon(1e-12));  // 10 + 10 + 5
  CHECK(s.comm_s == doctest::Approx(28e-9).epsilon(1e-12));     // [5,18) + [25,40)
  CHECK(s.exposed_comm_s == doctest::Approx(18e-9).epsilon(1e-12));  // [10,18) + [30,40)
  REQUIRE(s.collectives.size() == 3);
  CHECK(s.collectives[0].coll == fsdp::collective::all_gather);
  CHECK(s.collectives[0].unit == 1);
  CHECK(s.collectives[0].begin_ns == 5);
  CHECK(s.collectives[0].end_ns == 15);
  CHECK(s.collectives[1].coll == fsdp::collective::reduce_scatter);
  CHECK(s.collectives[1].begin_ns == 12);
  CHECK(s.collectives[2].end_ns == 40);
  // another rank or step selects nothing
  CHECK(fsdp::trace::summarize(e, 1, 1).collectives.empty());
  CHECK(fsdp::trace::summarize(e, 0, 2).wall_s == 0.0);
}

TEST_CASE("a step's wall time is its streams' span: a host running steps ahead does not lengthen it") {
  // Step 2 issued at 0 and 3 while the streams still ran step 1; its streams ran it from 100 to 130. Before, the
  // span began at the first issue: 130 ns instead of 30 (an H200's 17 ms step read 146 ms with 20 steps queued).
  std::vector<fsdp::trace::event> e = {
      ev(kind::gather_issued, 0, 0), ev(kind::reduce_issued, 3, 0), ev(kind::gather_begin, 100, 0),
      ev(kind::gather_end, 104, 0),  ev(kind::compute_begin, 105, 0), ev(kind::compute_end, 120, 0),
      ev(kind::reduce_begin, 121, 0), ev(kind::reduce_end, 130, 0),  ev(kind::release, 2, 0)};
  for (auto& x : e) x.step = 2;
  const auto s = fsdp::trace::summarize(e, 0, 2);
  CHECK(s.wall_s == doctest::Approx(30e-9).epsilon(1e-12));
  CHECK(s.compute_s == doctest::Approx(15e-9).epsilon(1e-12));
  CHECK(s.comm_s == doctest::Approx(13e-9).epsilon(1e-12));  // [100,104) + [121,130)
  // Host-side events alone (a recorder fed by hand, no stream marks) still give their own span.
  const std::vector<fsdp::trace::event> host_only = {e[0], e[1], e[8]};
  CHECK(fsdp::trace::summarize(host_only, 0, 2).wall_s == doctest::Approx(3e-9).epsilon(1e-12));
}

TEST_CASE("collective timings under a modelled link are at least the modelled time") {
  fsdp::trace::recorder rec;
  fsdp::comm::local_options lo;
  lo.link.bytes_per_second = 4e6;  // 4 MB/s: a 4224-element gather (16896 B) takes 16896 / 2 / 4e6 = 2.1 ms
  lo.link.latency = std::chrono::microseconds(100);
  train(rec, lo);
  for (int r = 0; r < world; ++r)
    for (std::uint64_t step = 1; step <= steps; ++step) {
      const auto s = fsdp::trace::summarize(rec.events(r), r, step);
      REQUIRE(s.collectives.size() == 3 * units - 1);  // the first unit gathered once
      for (const auto& c : s.collectives) {
        const double modelled = 100e-6 + double(c.bytes) * 0.5 / 4e6;
        CHECK(c.seconds() >= modelled);
        CHECK(c.issued_ns <= c.begin_ns);
      }
      CHECK(s.exposed_comm_s <= s.comm_s);
      CHECK(s.comm_s <= s.wall_s);
      CHECK(s.compute_s > 0.0);
    }
}

TEST_CASE("the memory timeline reproduces the measured peaks and ends at the current figures") {
  fsdp::trace::recorder rec;
  const auto res = train(rec);
  for (int r = 0; r < world; ++r) {
    fsdp::memory_figures peak{};
    fsdp::memory_figures last{};
    for (const auto& m : rec.memory_timeline()) {
      if (m.rank != r) continue;
      for (std::size_t k = 0; k < fsdp::mem_categories; ++k)
        peak.bytes[k] = std::max(peak.bytes[k], m.current.bytes[k]);
      peak.total = std::max(peak.total, m.current.total);
      last = m.current;
    }
    // the peak includes gather_full_params (after training, in mlp::train): a comm-category buffer on top of the
    // gradient slots, which stay
    CHECK(peak == res.results[r].exported.peak);
    // the timeline goes on past the figures mlp::train returned: its optimizer is destroyed before its model (whose
    // destructor stops the timeline), so the last sample is the model's persistent state without optimizer state
    fsdp::memory_figures expect = res.results[r].memory.current;
    expect.total -= expect[fsdp::mem::optimizer_state];
    expect[fsdp::mem::optimizer_state] = 0;
    CHECK(last == expect);
  }
}

TEST_CASE("recorder: events recorded at a given time keep it, take the next sequence numbers, and summarize") {
  fsdp::trace::recorder rec;
  CHECK(rec.since_origin(rec.origin()) == 0);
  CHECK(rec.since_origin(rec.origin() + std::chrono::microseconds(5)) == 5000);
  CHECK(rec.since_origin(rec.origin() - std::chrono::nanoseconds(7)) == -7);
  rec.record(ev(kind::gather_issued, 0, 1));
  const std::int64_t now_ns = rec.since_origin(fsdp::trace::recorder::clock::now());
  // a timeline measured elsewhere: compute [100, 300), a gather [150, 400) issued by the host note above
  std::vector<fsdp::trace::event> at = {ev(kind::compute_begin, 0), ev(kind::gather_begin, 0, 1),
                                        ev(kind::compute_end, 0), ev(kind::gather_end, 0, 1)};
  const std::int64_t t[] = {100, 150, 300, 400};
  for (std::size_t i = 0; i < at.size(); ++i) {
    at[i].t_ns = -1;  // ignored: the time given is the event's
    rec.record_at(at[i], now_ns + t[i]);
  }
  const auto e = rec.events(0);
  REQUIRE(e.size() == 5);
  CHECK(e[0].t_ns >= 0);
  CHECK(e[0].t_ns <= now_ns);
  for (std::size_t i = 0; i < e.size(); ++i) CHECK(e[i].seq == i);
  for (std::size_t i = 1; i < e.size(); ++i) CHECK(e[i].t_ns == now_ns + t[i - 1]);
  CHECK(e[2].what == kind::gather_begin);
  CHECK(e[2].unit == 1);
  const auto s = fsdp::trace::summarize(e, 0, 1);
  CHECK(s.compute_s == doctest::Approx(200e-9).epsilon(1e-12));
  CHECK(s.comm_s == doctest::Approx(250e-9).epsilon(1e-12));
  CHECK(s.exposed_comm_s == doctest::Approx(100e-9).epsilon(1e-12));  // [300, 400)
  REQUIRE(s.collectives.size() == 1);
  CHECK(s.collectives[0].begin_ns == now_ns + 150);
  CHECK(s.collectives[0].end_ns == now_ns + 400);
  // a stream's events recorded before their issue (stream and host clocks disagree) still pair with it
  std::vector<fsdp::trace::event> late_issue(e.begin() + 1, e.end());
  late_issue.push_back(e[0]);
  const auto s2 = fsdp::trace::summarize(late_issue, 0, 1);
  REQUIRE(s2.collectives.size() == 1);
  CHECK(s2.collectives[0].issued_ns == e[0].t_ns);
  CHECK(s2.collectives[0].begin_ns == now_ns + 150);
  CHECK(s2.collectives[0].end_ns == now_ns + 400);
}

namespace {
/// A backend with timing marks and no more (what the stamper's timing path uses): the test says when each mark
/// completes and how long after its reference; it checks that every query names the current reference.
struct fake_marks {
  struct stream {
    int id = 0;
  };
  struct timing_mark {
    int id = -1;
  };
  struct timing_reference {
    timing_mark mark;
    std::chrono::steady_clock::time_point at;
  };

  std::chrono::steady_clock::time_point reference_at;  // what record_reference() says
  std::map<int, std::int64_t> done;                     // completed marks: ns after the reference
  std::set<int> failing;                                // marks whose query fails (a failed stream)
  std::vector<std::pair<int, int>> recorded;            // (mark, stream) in recording order
  std::vector<int> released;
  int references = 0, reference = -1, next = 0;

  timing_reference record_reference() {
    ++references;
    reference = next++;
    return {{reference}, reference_at};
  }
  timing_mark record_mark(stream& s) {
    recorded.emplace_back(next, s.id);
    return {next++};
  }
  std::optional<std::chrono::nanoseconds> elapsed_since(const timing_reference& r, const timing_mark& m) {
    CHECK(r.mark.id == reference);
    if (failing.count(m.id)) throw std::runtime_error("mark " + std::to_string(m.id) + " failed");
    const auto it = done.find(m.id);
    if (it == done.end()) return std::nullopt;
    return std::chrono::nanoseconds(it->second);
  }
  void release_mark(const timing_mark& m) { released.push_back(m.id); }
};
static_assert(fsdp::trace::TimingMarks<fake_marks>);
static_assert(fsdp::trace::stamper<fake_marks>::timed);
static_assert(!fsdp::trace::stamper<fsdp::backend::host>::timed);
static_assert(!fsdp::trace::ProfilerRanges<fsdp::backend::host>);

using fake_stamper = fsdp::trace::stamper<fake_marks>;
using P = fsdp::pass_kind;

std::vector<std::pair<kind, std::int64_t>> kinds_and_times(const fsdp::trace::recorder& rec) {
  std::vector<std::pair<kind, std::int64_t>> out;
  for (const auto& e : rec.events()) out.emplace_back(e.what, e.t_ns);
  return out;
}
}  // namespace

TEST_CASE("stamper with timing marks: nothing runs on the stream; flush records completed marks in time order") {
  fsdp::trace::recorder rec;
  fake_marks b;
  b.reference_at = rec.origin() + std::chrono::milliseconds(1);
  constexpr std::int64_t ref = 1'000'000;
  fake_stamper st(&rec, 2);
  st.set_step(3);
  fake_marks::stream a{0}, g{1};
  st.stamp(b, a, kind::compute_begin, P::forward, 0);  // mark 1 (0 is the reference)
  st.stamp(b, g, kind::gather_begin, P::forward, 1, 400);
  st.stamp(b, a, kind::compute_end, P::forward, 0);
  st.stamp(b, g, kind::gather_end, P::forward, 1, 400);
  CHECK(b.references == 1);
  CHECK(b.recorded == std::vector<std::pair<int, int>>{{1, 0}, {2, 1}, {3, 0}, {4, 1}});
  CHECK(st.pending() == 4);
  st.flush(b);  // nothing has completed
  CHECK(rec.events().empty());
  CHECK(st.pending() == 4);
  b.done = {{1, 100}, {2, 50}, {3, 300}, {4, 200}};
  st.flush(b);
  CHECK(st.pending() == 0);
  using V = std::vector<std::pair<kind, std::int64_t>>;
  CHECK(kinds_and_times(rec) == V{{kind::gather_begin, ref + 50},
                                  {kind::compute_begin, ref + 100},
                                  {kind::gather_end, ref + 200},
                                  {kind::compute_end, ref + 300}});
  const auto e = rec.events();
  for (std::size_t i = 0; i < e.size(); ++i) {
    CHECK(e[i].seq == i);
    CHECK(e[i].rank == 2);
    CHECK(e[i].step == 3);
  }
  CHECK(e[0].unit == 1);
  CHECK(e[0].bytes == 400);
  CHECK(e[1].pass == P::forward);
  // every mark and, with nothing pending, the reference went back to the backend
  std::vector<int> released = b.released;
  std::sort(released.begin(), released.end());
  CHECK(released == std::vector<int>{0, 1, 2, 3, 4});

  // The next stamp takes a new reference, never earlier than the last time recorded: the backend's says 1 ms
  // again, but ref + 300 ns was recorded, so a mark at 0 after it is at ref + 300 ns.
  st.stamp(b, a, kind::optimizer_begin, P::none, -1);  // mark 6 (5 is the new reference)
  CHECK(b.references == 2);
  b.done[6] = 0;
  st.flush(b);
  REQUIRE(rec.events().size() == 5);
  CHECK(rec.events().back().what == kind::optimizer_begin);
  CHECK(rec.events().back().t_ns == ref + 300);
  CHECK(rec.events().back().unit == -1);
}

TEST_CASE("stamper with timing marks: a mark not complete yet stays pending, and so does all that may be later") {
  fsdp::trace::recorder rec;
  fake_marks b;
  b.reference_at = rec.origin() + std::chrono::milliseconds(1);
  constexpr std::int64_t ref = 1'000'000;
  fake_stamper st(&rec, 0);
  st.set_step(1);
  fake_marks::stream a{0}, r{2};
  st.stamp(b, a, kind::compute_begin, P::backward, 2);  // 1
  st.stamp(b, a, kind::compute_end, P::backward, 2);    // 2
  st.stamp(b, r, kind::reduce_begin, P::backward, 2);   // 3
  st.stamp(b, r, kind::reduce_end, P::backward, 2);     // 4
  b.done = {{1, 10}, {3, 5}, {4, 20}};                  // 2 (compute_end) has not completed
  st.flush(b);
  using V = std::vector<std::pair<kind, std::int64_t>>;
  // reduce_end (ref + 20) is complete but may come after compute_end, which is at ref + 10 at the earliest
  CHECK(kinds_and_times(rec) == V{{kind::reduce_begin, ref + 5}, {kind::compute_begin, ref + 10}});
  CHECK(st.pending() == 2);
  CHECK(std::count(b.released.begin(), b.released.end(), 0) == 0);  // the reference stays: a mark is pending
  // a stream is in order: a later mark of the same stream is not taken before the one ahead of it
  st.stamp(b, a, kind::compute_begin, P::backward, 1);  // 5
  b.done[5] = 15;
  st.flush(b);
  CHECK(rec.events().size() == 2);
  CHECK(st.pending() == 3);
  b.done[2] = 12;
  st.flush(b);
  CHECK(kinds_and_times(rec) == V{{kind::reduce_begin, ref + 5},
                                  {kind::compute_begin, ref + 10},
                                  {kind::compute_end, ref + 12},
                                  {kind::compute_begin, ref + 15},
                                  {kind::reduce_end, ref + 20}});
  CHECK(st.pending() == 0);
  CHECK(std::count(b.released.begin(), b.released.end(), 0) == 1);
  for (int m = 1; m <= 5; ++m) CHECK(std::count(b.released.begin(), b.released.end(), m) == 1);
}

TEST_CASE("stamper with timing marks: host notes wait for the flush and take their place in time") {
  fsdp::trace::recorder rec;
  fake_marks b;
  b.reference_at = rec.origin() - std::chrono::hours(1);  // stream marks long before any note
  constexpr std::int64_t ref = -3'600'000'000'000;
  fake_stamper st(&rec, 1);
  st.set_step(1);
  fake_marks::stream g{1};
  st.note(kind::gather_issued, P::forward, 0, 64, true);
  CHECK(rec.events().empty());  // notes are queued with their time, not recorded yet
  CHECK(st.pending() == 1);
  CHECK(b.references == 0);  // a note needs no reference
  st.stamp(b, g, kind::gather_begin, P::forward, 0, 64);  // 1
  st.flush(b);
  CHECK(rec.events().empty());  // the note is later than the incomplete mark may be
  b.done[1] = 7;
  st.flush(b);
  const auto e = rec.events();
  REQUIRE(e.size() == 2);
  CHECK(e[0].what == kind::gather_begin);
  CHECK(e[0].t_ns == ref + 7);
  CHECK(e[1].what == kind::gather_issued);
  CHECK(e[1].ahead);
  CHECK(e[1].bytes == 64);
  CHECK(e[1].t_ns >= 0);
  CHECK(e[0].seq < e[1].seq);
  // with nothing pending a note is final at once
  st.note(kind::release, P::forward, 0);
  st.flush(b);
  CHECK(rec.events().size() == 3);
}

TEST_CASE(
    "stamper with timing marks: a failed query leaves everything pending; close() drops only what never completed") {
  fsdp::trace::recorder rec;
  fake_marks b;
  b.reference_at = rec.origin();
  fake_stamper st(&rec, 0);
  st.set_step(1);
  fake_marks::stream a{0}, g{1};
  st.stamp(b, a, kind::compute_begin, P::forward, 0);  // 1
  st.stamp(b, g, kind::gather_begin, P::forward, 1);   // 2
  st.note(kind::release, P::forward, 0);
  st.stamp(b, g, kind::gather_end, P::forward, 1);  // 3
  b.done = {{1, 10}, {2, 20}};
  b.failing = {2};
  CHECK(fsdp_test::error_of<std::runtime_error>([&] { st.flush(b); }) == "mark 2 failed");
  CHECK(rec.events().empty());
  CHECK(st.pending() == 4);
  b.failing.clear();
  // mark 3 never completes (its stream hangs): close() records the rest in time order and drops it
  const std::size_t dropped = st.close(b);
  CHECK(dropped == 1);
  CHECK(st.pending() == 0);
  const auto e = rec.events();
  REQUIRE(e.size() == 3);
  CHECK(e[0].what == kind::compute_begin);
  CHECK(e[1].what == kind::gather_begin);
  CHECK(e[2].what == kind::release);  // a note: its host time is after the marks' (reference = origin, + 20 ns)
  std::vector<int> released = b.released;
  std::sort(released.begin(), released.end());
  CHECK(released == std::vector<int>{0, 1, 2, 3});  // the dropped mark and the reference included
  CHECK(st.close(b) == 0);
}

TEST_CASE("stamper without a recorder submits nothing and makes no reference") {
  fake_marks b;
  fake_stamper st(nullptr, 0);
  fake_marks::stream a{0};
  st.stamp(b, a, kind::compute_begin, P::forward, 0);
  st.note(kind::release, P::forward, 0);
  st.flush(b);
  CHECK(b.references == 0);
  CHECK(b.recorded.empty());
  CHECK(st.pending() == 0);
  CHECK(st.close(b) == 0);
}

namespace {
/// What a timed_host backend did, kept after it is gone (by rank).
struct hooks_log {
  std::vector<std::pair<std::string, bool>> ranges;  // name, ended
  std::vector<std::pair<bool, std::string>> calls;   // start (true) / end of a range, by name, in order
  int marks_made = 0, marks_released = 0;
};
std::mutex hooks_mu;
std::map<int, hooks_log> hooks_by_rank;

/// backend::host with backend::cuda's two optional hooks: timing marks (a host function notes when the stream
/// reaches the mark, so the stamper runs its CUDA-event path) and profiler ranges (logged).
class timed_host : public fsdp::backend::host {
 public:
  struct mark_state {
    std::atomic<bool> done{false};
    std::chrono::steady_clock::time_point at{};
  };
  using timing_mark = std::shared_ptr<mark_state>;
  struct timing_reference {
    timing_mark mark;
    std::chrono::steady_clock::time_point at;
  };

  explicit timed_host(int rank = 0, fsdp::backend::host_options o = {}) : host(rank, o), rank_(rank) {}
  ~timed_host() {
    std::lock_guard lk(hooks_mu);
    hooks_by_rank[rank_] = log_;
  }

  timing_reference record_reference() {
    auto m = std::make_shared<mark_state>();
    m->at = std::chrono::steady_clock::now();
    m->done = true;
    ++log_.marks_made;
    return {m, m->at};
  }
  timing_mark record_mark(stream& s) {
    auto m = std::make_shared<mark_state>();
    host_callback(s, [m] {
      m->at = std::chrono::steady_clock::now();
      m->done.store(true, std::memory_order_release);
    });
    ++log_.marks_made;
    return m;
  }
  std::optional<std::chrono::nanoseconds> elapsed_since(const timing_reference& r, const timing_mark& m) {
    if (!m->done.load(std::memory_order_acquire)) return std::nullopt;
    return m->at - r.mark->at;
  }
  void release_mark(const timing_mark&) { ++log_.marks_released; }
  const hooks_log& log() const noexcept { return log_; }

  std::uint64_t range_start(const char* name, std::uint32_t) {
    log_.ranges.emplace_back(name, false);
    log_.calls.emplace_back(true, name);
    return log_.ranges.size();  // ids from 1
  }
  void range_end(std::uint64_t id) {
    CHECK(id >= 1);
    CHECK(id <= log_.ranges.size());
    if (id < 1 || id > log_.ranges.size()) return;
    CHECK_FALSE(log_.ranges[id - 1].second);
    log_.ranges[id - 1].second = true;
    log_.calls.emplace_back(false, log_.ranges[id - 1].first);
  }

 private:
  int rank_;
  hooks_log log_;
};
static_assert(fsdp::Backend<timed_host>);
static_assert(fsdp::trace::TimingMarks<timed_host>);
static_assert(fsdp::trace::ProfilerRanges<timed_host>);
static_assert(!fsdp::trace::ProfilerRanges<fake_marks>);

struct timed_local {
  using backend_type = timed_host;
  using communicator = fsdp::comm::local_communicator;
};

using event_key = std::tuple<kind, int, fsdp::pass_kind, std::uint64_t, std::int64_t, bool, fsdp::collective>;
std::multiset<event_key> keys(const std::vector<fsdp::trace::event>& events) {
  std::multiset<event_key> out;
  for (const auto& e : events) out.insert({e.what, e.unit, e.pass, e.step, e.bytes, e.ahead, e.coll});
  return out;
}

/// `steps` steps of three units (zero gradients), synchronizing after each step; with a recorder if given.
template <class Pol>
void train_units(local_communicator& comm, fsdp::trace::recorder* rec, int steps) {
  fsdp::model_options mo;
  mo.recorder = rec;
  fsdp::Model<Pol> model(comm, fsdp_test::three_units(), fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{}, mo);
  fsdp::optim::sgd opt(model, {.lr = 0.1f});
  for (int s = 0; s < steps; ++s) {
    for (auto& u : model.forward()) (void)u;
    for (auto& u : model.backward()) (void)u;
    opt.step();
    model.synchronize();
    if (rec) {  // the step's stream events are in the recorder once the model has synchronized
      const auto e = rec->events(comm.rank());
      CHECK(std::count_if(e.begin(), e.end(), [&](const fsdp::trace::event& x) {
              return x.what == kind::optimizer_end && x.step == std::uint64_t(s + 1);
            }) == 1);
      CHECK(std::count_if(e.begin(), e.end(), [&](const fsdp::trace::event& x) {
              return x.what == kind::reduce_end && x.step == std::uint64_t(s + 1);
            }) == 3);
    }
  }
}
}  // namespace

TEST_CASE("a Model on a backend with timing marks and profiler ranges: the same events, in time order, with ranges") {
  using Host = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>;
  using Timed = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, timed_local>;
  constexpr int ranks = 2, n_steps = 3;
  fsdp::trace::recorder host_rec, timed_rec;
  fsdp_test::run_ranks(ranks, [&](local_communicator& c) { train_units<Host>(c, &host_rec, n_steps); });
  {
    std::lock_guard lk(hooks_mu);
    hooks_by_rank.clear();
  }
  fsdp_test::run_ranks(ranks, [&](local_communicator& c) { train_units<Timed>(c, &timed_rec, n_steps); });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    const auto h = host_rec.events(r), t = timed_rec.events(r);
    REQUIRE(!h.empty());
    CHECK(keys(t) == keys(h));
    for (std::size_t i = 1; i < t.size(); ++i) {  // seq order is time order
      CHECK(t[i - 1].seq < t[i].seq);
      CHECK(t[i - 1].t_ns <= t[i].t_ns);
    }
    for (std::uint64_t step = 1; step <= n_steps; ++step) {
      const auto s = fsdp::trace::summarize(t, r, step);
      CHECK(s.collectives.size() == 3 * 3 - 1);  // two gathers and a reduce-scatter per unit; the first unit's one
      CHECK(s.compute_s > 0.0);
      CHECK(s.comm_s > 0.0);
      for (const auto& col : s.collectives) CHECK(col.issued_ns <= col.begin_ns);
    }
    const hooks_log log = hooks_by_rank.at(r);
    CHECK(log.marks_made > 0);
    CHECK(log.marks_released == log.marks_made);  // every mark and reference given back
    std::map<std::string, int> names;
    for (const auto& [name, ended] : log.ranges) {
      CHECK(ended);
      ++names[name];
    }
    std::map<std::string, int> expect = {{"optimizer", n_steps}};
    for (const char* u : {"l0", "l1", "l2"})
      for (const char* k : {"forward", "backward", "reduce_scatter"}) expect[std::string(k) + " " + u] = n_steps;
    for (const char* u : {"l1", "l2"}) expect[std::string("all_gather ") + u] = 2 * n_steps;
    expect["all_gather l0"] = n_steps;  // first in forward: kept into its backward
    CHECK(names == expect);
    // no library range opens inside a unit's: collectives are issued between units
    std::string open_unit;
    // not a structured binding: Clang 14 cannot capture one, and CAPTURE / INFO are lambdas
    for (const auto& call : log.calls) {
      const bool start = call.first;
      const std::string& name = call.second;
      const bool unit = name.starts_with("forward ") || name.starts_with("backward ");
      if (start) {
        CHECK_MESSAGE(open_unit.empty(), name, " opened inside ", open_unit);
        if (unit) open_unit = name;
      } else if (unit) {
        CHECK(name == open_unit);
        open_unit.clear();
      }
    }
  }
  // the Chrome trace of the timed run has the host run's slices (prefetches included)
  auto slices = [](const fsdp::trace::recorder& rec) {
    std::map<std::string, int> n;
    const json doc = fsdp::trace::chrome_trace_json(rec);
    for (const json& e : doc.at("traceEvents")) {
      if (e.at("ph").get<std::string>() != "X") continue;
      ++n[e.at("cat").get<std::string>()];
      if (e.at("args").value("prefetch", false)) ++n["prefetch"];
    }
    return n;
  };
  const auto timed_slices = slices(timed_rec);
  CHECK(timed_slices == slices(host_rec));
  CHECK(timed_slices.at("prefetch") > 0);
  CHECK(timed_slices.at("all_gather") == ranks * n_steps * (2 * 3 - 1));
  // without a recorder: ranges, and not a single mark
  {
    std::lock_guard lk(hooks_mu);
    hooks_by_rank.clear();
  }
  fsdp_test::run_ranks(ranks, [&](local_communicator& c) { train_units<Timed>(c, nullptr, 1); });
  for (int r = 0; r < ranks; ++r) {
    CHECK(hooks_by_rank.at(r).marks_made == 0);
    CHECK(hooks_by_rank.at(r).ranges.size() == 3 * 5 - 1 + 1);  // l0's one gather
  }
}

TEST_CASE("a quantized reduction shows as an all_to_all: its profiler ranges, its trace events and their bytes") {
  using Q = fsdp::precision::scaled<std::int8_t, 16, fsdp::bfloat16, std::int8_t>;
  using Timed = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, Q, timed_local>;
  constexpr int ranks = 2;
  {
    std::lock_guard lk(hooks_mu);
    hooks_by_rank.clear();
  }
  fsdp::trace::recorder rec;
  fsdp_test::run_ranks(ranks, [&](local_communicator& c) { train_units<Timed>(c, &rec, 1); });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    std::map<std::string, int> names;
    for (const auto& range : hooks_by_rank.at(r).ranges) ++names[range.first];
    for (const char* u : {"l0", "l1", "l2"}) {
      CHECK(names[std::string("all_to_all ") + u] == 1);
      CHECK(names.count(std::string("reduce_scatter ") + u) == 0);
    }
    int reduce_events = 0;
    for (const auto& e : rec.events(r))
      if (e.what == kind::reduce_begin) {
        ++reduce_events;
        CHECK(e.coll == fsdp::collective::all_to_all);
        // the whole send buffer, P one-byte values and a 4-byte scale per 16: at 2 ranks and alignment 16, l0 (24
        // elements) and l2 (16) pad to 32, l1 (35) to 64
        CHECK(e.bytes == (e.unit == 1 ? 64 + 16 : 32 + 8));
      }
    CHECK(reduce_events == 3);
  }
}

TEST_CASE("a unit's profiler range ends when the user's code abandons the pass") {
  using Timed = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full, timed_local>;
  hooks_log log;
  fsdp_test::run_ranks(1, [&](local_communicator& c) {
    fsdp::Model<Timed> model(c, fsdp_test::three_units(), fsdp::wrap::by_prefix{"l"});
    try {
      for (auto& u : model.forward())
        if (u.name() == "l1") throw std::runtime_error("the user's layer failed");
    } catch (const std::runtime_error&) {
    }
    log = model.backend().log();  // before the model goes (its destructor would end an open range too)
  });
  REQUIRE(!log.ranges.empty());
  for (const auto& range : log.ranges) CHECK_MESSAGE(range.second, range.first);  // (name, ended)
  CHECK(log.ranges.back().first == "forward l1");
}
