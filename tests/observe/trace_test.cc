// Observability: the Chrome-trace file parses and holds the events it should; per-step summaries (compute,
// communication, exposed communication) are exact on known timelines; collective timings respect the modelled
// link; the memory timeline reproduces the measured peaks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

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
  fsdp::comm::run_local(world, [&](local_communicator& comm) { out.results[comm.rank()] = mlp::train<Policy>(comm, c); }, lo);
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
  // per rank and step: every unit computes forward and backward, is gathered twice and reduce-scattered once
  CHECK(complete_by_cat["compute"] == world * steps * 2 * units);
  CHECK(complete_by_cat["optimizer"] == world * steps);
  CHECK(complete_by_cat["all_gather"] == world * steps * 2 * units);
  CHECK(complete_by_cat["reduce_scatter"] == world * steps * units);
  CHECK(names["layers.2 forward"] == world * steps);
  CHECK(names["layers.0 backward"] == world * steps);
  CHECK(names["all_gather layers.3"] == world * steps * 2);
  // issues (8 gathers + 4 reductions) and releases (8) per rank and step
  CHECK(instants == world * steps * (2 * units + units + 2 * units));
  CHECK(counters == static_cast<int>(rec.memory_timeline().size()));
  CHECK(counters > 0);

  // to a file, and back
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/trace.json";
  fsdp::trace::write_chrome_trace(rec, path);
  std::ifstream f(path);
  CHECK(json::parse(f) == doc);
  CHECK(fsdp_test::error_of<std::runtime_error>([&] { fsdp::trace::write_chrome_trace(rec, "/nonexistent/dir/t.json"); }) ==
        "fsdp: cannot open trace file '/nonexistent/dir/t.json' for writing");
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

TEST_CASE("collective timings under a modelled link are at least the modelled time") {
  fsdp::trace::recorder rec;
  fsdp::comm::local_options lo;
  lo.link.bytes_per_second = 4e6;  // 4 MB/s: a 4224-element gather (16896 B) takes 16896 / 2 / 4e6 = 2.1 ms
  lo.link.latency = std::chrono::microseconds(100);
  train(rec, lo);
  for (int r = 0; r < world; ++r)
    for (std::uint64_t step = 1; step <= steps; ++step) {
      const auto s = fsdp::trace::summarize(rec.events(r), r, step);
      REQUIRE(s.collectives.size() == 3 * units);
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
      for (std::size_t k = 0; k < fsdp::mem_categories; ++k) peak.bytes[k] = std::max(peak.bytes[k], m.current.bytes[k]);
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
