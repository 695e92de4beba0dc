// Ranks that would train different models refuse to, at construction, before anything is allocated or
// initialised: every rank throws the same usage_error, naming the first thing that differs and both ranks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <mutex>

#include "tests/support/support.hpp"

using fsdp::comm::local_communicator;
using fsdp_test::run_ranks;

namespace {
using Full = fsdp::policy<fsdp::sharding::full_shard>;
using Grad = fsdp::policy<fsdp::sharding::shard_grad_op>;
using fsdp::wrap::by_prefix;
/// Units "a" and "b": one per parameter's first letter.
fsdp::wrap::by_function by_letter() {
  return fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }};
}

const std::string fix =
    ". Every rank must construct its Model from the same ModelSpec, wrapping policy, fsdp::policy, default init rule "
    "and model_options";

/// Runs `build(comm)` on `world` thread ranks and returns what each rank's construction threw ("" if nothing).
template <class F>
std::vector<std::string> errors_by_rank(int world, F&& build) {
  std::vector<std::string> out(static_cast<std::size_t>(world));
  std::mutex mu;
  run_ranks(world, [&](local_communicator& c) {
    std::string what;
    try {
      build(c);
    } catch (const fsdp::usage_error& e) {
      what = e.what();
    }
    std::lock_guard lk(mu);
    out[static_cast<std::size_t>(c.rank())] = what;
  });
  return out;
}

/// Every rank threw `message`.
void every_rank_says(const std::vector<std::string>& errors, const std::string& message) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r);
    CHECK(errors[r] == message);
  }
}

fsdp::ModelSpec two_units(std::vector<std::int64_t> a_shape = {4, 6}, fsdp::param_options b = {}) {
  fsdp::ModelSpec s;
  s.add("a.w", std::move(a_shape)).add("b.w", {5}, b);
  return s;
}
}  // namespace

TEST_CASE("a transposed weight with the same shard sizes: the parameter, both shapes and both ranks are named") {
  every_rank_says(errors_by_rank(2,
                                 [](local_communicator& c) {
                                   fsdp::Model<Full> m(c, two_units(c.rank() == 1 ? std::vector<std::int64_t>{6, 4}
                                                                                  : std::vector<std::int64_t>{4, 6}),
                                                       by_letter());
                                 }),
                  "fsdp: ranks disagree on the model: parameter 'a.w': the shape is [4, 6] on rank 0 but [6, 4] on "
                  "rank 1" + fix);
}

TEST_CASE("shapes whose shard sizes differ fail the same way, instead of as an anonymous collective mismatch") {
  every_rank_says(errors_by_rank(3,
                                 [](local_communicator& c) {
                                   fsdp::Model<Full> m(c, two_units(c.rank() == 2 ? std::vector<std::int64_t>{4, 7}
                                                                                  : std::vector<std::int64_t>{4, 6}),
                                                       by_letter());
                                 }),
                  "fsdp: ranks disagree on the model: parameter 'a.w': the shape is [4, 6] on rank 0 but [4, 7] on "
                  "rank 2" + fix);
}

TEST_CASE("a parameter named differently on one rank") {
  every_rank_says(errors_by_rank(3,
                                 [](local_communicator& c) {
                                   fsdp::ModelSpec s;
                                   s.add("a.w", {4, 6}).add(c.rank() == 1 ? "b.v" : "b.w", {5});
                                   fsdp::Model<Full> m(c, s, by_letter());
                                 }),
                  "fsdp: ranks disagree on the model: parameter #1: the name is 'b.w' on rank 0 but 'b.v' on rank 1" +
                      fix);
}

TEST_CASE("no_decay set on one rank only") {
  every_rank_says(errors_by_rank(2,
                                 [](local_communicator& c) {
                                   fsdp::Model<Full> m(c, two_units({4, 6}, {.flags = {.no_decay = c.rank() == 1}}),
                                                       by_letter());
                                 }),
                  "fsdp: ranks disagree on the model: parameter 'b.w': no_decay is false on rank 0 but true on rank 1" +
                      fix);
}

TEST_CASE("a parameter more on one rank: the count is compared first") {
  every_rank_says(errors_by_rank(2,
                                 [](local_communicator& c) {
                                   fsdp::ModelSpec s = two_units();
                                   if (c.rank() == 0) s.add("c.w", {3});
                                   fsdp::Model<Full> m(c, s, by_letter());
                                 }),
                  "fsdp: ranks disagree on the model: the spec: the parameter count is 3 on rank 0 but 2 on rank 1" +
                      fix);
}

TEST_CASE("a different init rule for one parameter, or by default") {
  every_rank_says(errors_by_rank(2,
                                 [](local_communicator& c) {
                                   fsdp::param_options b;
                                   if (c.rank() == 1) b.init = fsdp::init::zeros;
                                   fsdp::Model<Full> m(c, two_units({4, 6}, b), by_letter());
                                 }),
                  "fsdp: ranks disagree on the model: parameter 'b.w': the init rule is the model's default on rank 0 "
                  "but constant(0) on rank 1" + fix);
  every_rank_says(errors_by_rank(2,
                                 [](local_communicator& c) {
                                   fsdp::Model<Full> m(c, two_units(), by_letter(),
                                                       fsdp::init::normal{.seed = std::uint64_t(c.rank())});
                                 }),
                  "fsdp: ranks disagree on the model: the model: the default init rule is normal(mean=0, std=0.02, "
                  "seed=0) on rank 0 but normal(mean=0, std=0.02, seed=1) on rank 1" + fix);
}

TEST_CASE("another wrapping on one rank") {
  every_rank_says(
      errors_by_rank(2,
                     [](local_communicator& c) {
                       if (c.rank() == 0) {
                         fsdp::Model<Full> m(c, two_units(), by_letter());
                       } else {
                         fsdp::Model<Full> m(c, two_units(), fsdp::wrap::by_function{[](const fsdp::ParamSpec&) {
                                               return std::string("all");
                                             }});
                       }
                     }),
      "fsdp: ranks disagree on the model: the wrapping: the unit count is 2 on rank 0 but 1 on rank 1" + fix);
}

TEST_CASE("another sharding strategy or precision on one rank") {
  every_rank_says(errors_by_rank(2,
                                 [](local_communicator& c) {
                                   if (c.rank() == 0) fsdp::Model<Full> m(c, two_units(), by_letter());
                                   else fsdp::Model<Grad> m(c, two_units(), by_letter());
                                 }),
                  "fsdp: ranks disagree on the model: the policy: the sharding strategy is full_shard on rank 0 but "
                  "shard_grad_op on rank 1" + fix);
  using Bf16 = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
  every_rank_says(
      errors_by_rank(2,
                     [](local_communicator& c) {
                       if (c.rank() == 0)
                         fsdp::Model<Full> m(c, two_units(), by_letter());
                       else
                         fsdp::Model<Bf16> m(c, two_units(), by_letter());
                     }),
      "fsdp: ranks disagree on the model: the policy: the precision is compute f32, master f32, reduce f32, "
      "gather f32 on rank 0 but compute bf16, master f32, reduce f32, gather bf16 on rank 1" +
          fix);
  // int8 gathers, with gradients reduced in int8 blocks on one rank only
  using Qw = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::scaled<std::int8_t, 16>>;
  using Qg = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
                          fsdp::precision::scaled<std::int8_t, 16, fsdp::bfloat16, std::int8_t>>;
  every_rank_says(errors_by_rank(2,
                                 [](local_communicator& c) {
                                   if (c.rank() == 0) fsdp::Model<Qw> m(c, two_units(), by_letter());
                                   else fsdp::Model<Qg> m(c, two_units(), by_letter());
                                 }),
                  "fsdp: ranks disagree on the model: the policy: the precision is compute bf16, master f32, reduce "
                  "f32, gather i8 in blocks of 16 on rank 0 but compute bf16, master f32, reduce i8 in blocks of 16, "
                  "gather i8 in blocks of 16 on rank 1" + fix);
}

TEST_CASE("an option set on one rank of four: rank 0 and the first rank that differs are named") {
  every_rank_says(
      errors_by_rank(4,
                     [](local_communicator& c) {
                       fsdp::model_options o;
                       if (c.rank() >= 2) o.gather_slots = 3;
                       fsdp::Model<Full> m(c, two_units(), by_letter(), fsdp::init::normal{}, o);
                     }),
      "fsdp: ranks disagree on the model: model_options: gather_slots is 0 on rank 0 but 3 on rank 2" + fix);
  every_rank_says(
      errors_by_rank(2,
                     [](local_communicator& c) {
                       fsdp::model_options o;
                       if (c.rank() == 1) o.division.how = fsdp::grad_division::mode::sum;
                       fsdp::Model<Full> m(c, two_units(), by_letter(), fsdp::init::normal{}, o);
                     }),
      "fsdp: ranks disagree on the model: model_options: division is average on rank 0 but sum on rank 1" + fix);
  // the tensor-parallel degree is compared first: the local shapes and the strategy's groups follow from it
  every_rank_says(
      errors_by_rank(2,
                     [](local_communicator& c) {
                       fsdp::model_options o;
                       o.tensor_parallel = c.rank() == 0 ? 2 : 1;
                       fsdp::Model<Full> m(c, two_units(), by_letter(), fsdp::init::normal{}, o);
                     }),
      "fsdp: ranks disagree on the model: model_options: tensor_parallel is 2 on rank 0 but 1 on rank 1" + fix);
}

TEST_CASE("ranks that agree: one all_gather of 16 bytes per rank, and no memory left or counted in the peak") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    run_ranks(world, [&](local_communicator& c) {
      fsdp::Model<Full> m(c, two_units(), by_letter());
      const fsdp::collective_stats s = c.stats();
      CHECK(s[fsdp::collective::all_gather] == (world > 1 ? 1u : 0u));
      CHECK(s.bytes[std::size_t(fsdp::collective::all_gather)] == (world > 1 ? 16u * unsigned(world) : 0u));
      const fsdp::memory_stats mem = m.memory();
      CHECK(mem.peak[fsdp::mem::comm_buffers] == 0);
      CHECK(mem.current[fsdp::mem::comm_buffers] == 0);
    });
  }
}

TEST_CASE("the ranks' comparison waits for the gather stream's earlier work in the watched synchronize, never "
          "inside a copy from pageable memory") {
  // Mid-step, under model_options::check_collectives, the gather stream holds the gathers in flight: one that
  // does not finish must reach the watchdog (the host backend reports a copy from pageable memory that would have
  // blocked a GPU's host without one, as the comparison's upload did).
  std::vector<std::string> errors(2);
  std::mutex mu;
  run_ranks(2, [&](local_communicator& c) {
    fsdp::backend::host_options o;
    o.wait_timeout = std::chrono::milliseconds(200);
    o.kernel_delay = [](std::string_view k) {
      return std::chrono::microseconds(k == "accumulate" ? 1000000 : 0);
    };
    fsdp::backend::host be(c.rank(), o);
    auto& s = be.gather_stream();
    auto busy = be.allocate(4, fsdp::mem::comm_buffers, s);
    be.fill_zero(busy.data(), 4, s);
    be.accumulate(busy.as<float>(), busy.data(), fsdp::dtype::f32, 1, 1.0f, s);  // 1 s of earlier work
    std::string what;
    try {
      (void)fsdp::agree::all_gather_strings(c, be, "the next collective");
    } catch (const fsdp::comm_error& e) {
      what = e.what();
    }
    be.release_after(std::move(busy), s);
    std::lock_guard lk(mu);
    errors[static_cast<std::size_t>(c.rank())] = what;
  });
  CHECK(errors[0] == "fsdp: stream 'rank0.all_gather' did not drain within 200 ms");
  CHECK(errors[1] == "fsdp: stream 'rank1.all_gather' did not drain within 200 ms");
}

TEST_CASE("a fingerprint: its encoding round-trips, a damaged one is refused, an extra fact is named") {
  fsdp::fingerprint a;
  a.add("parameter 'w'", "the shape", "[2, 3]").add("x\ty", "", std::string("a\0b", 3));
  const std::string bytes = a.encode();
  CHECK(fsdp::fingerprint::decode(bytes, 0).facts() == a.facts());
  CHECK(fsdp_test::error_of<fsdp::comm_error>([&] { fsdp::fingerprint::decode(bytes.substr(0, 30), 3); }) ==
        "fsdp: the fingerprint received from rank 3 names a string of 9 bytes at byte 21 but only 1 follow");
  CHECK(fsdp_test::error_of<fsdp::comm_error>([&] { fsdp::fingerprint::decode(bytes.substr(0, 4), 3); }) ==
        "fsdp: the fingerprint received from rank 3 is cut short at byte 0 of 4");
  fsdp::fingerprint b = a;
  b.add("unit 'u'", "the shard elements", "16");
  CHECK(!a.first_difference(a, 0, 1));
  CHECK(*a.first_difference(b, 0, 1) == "unit 'u': the shard elements is 16 on rank 1 but absent on rank 0");
  CHECK(*b.first_difference(a, 0, 1) == "unit 'u': the shard elements is 16 on rank 0 but absent on rank 1");
}

TEST_CASE("debug mode: a collective issued out of order is caught before it runs, on every rank") {
  // Two units of the same size, entered in another order on rank 1 while the order is being recorded: without the
  // check, rank 0's gather of 'a' meets rank 1's gather of 'b' and both carry on with the wrong parameters.
  fsdp::ModelSpec s;
  s.add("a.w", {4, 6}).add("b.w", {6, 4});
  auto enter_in_rank_order = [&](bool check) {
    return errors_by_rank(2, [&](local_communicator& c) {
      fsdp::model_options o;
      o.record_order = true;
      o.check_collectives = check;
      fsdp::Model<Full> m(c, s, by_letter(), fsdp::init::normal{}, o);
      auto pass = m.forward();
      pass.enter(c.rank() == 0 ? "a" : "b");
      pass.enter(c.rank() == 0 ? "b" : "a");
      pass.finish();
      m.synchronize();
    });
  };
  every_rank_says(enter_in_rank_order(false), "");  // what the check is for: nothing notices
  every_rank_says(enter_in_rank_order(true),
                  "fsdp: ranks disagree on the next collective (model_options::check_collectives): the unit is 'a' on "
                  "rank 0 but 'b' on rank 1. Every rank must enter the same units in the same order");
}

TEST_CASE("debug mode: ranks that agree train as without it, with one 16-byte all_gather per collective more") {
  const fsdp::ModelSpec s = fsdp_test::five_units();
  std::map<bool, std::vector<std::map<std::string, std::vector<float>>>> params;
  std::map<bool, std::vector<fsdp::collective_stats>> stats;
  for (bool check : {false, true}) {
    params[check].resize(3);
    stats[check].resize(3);
    run_ranks(3, [&](local_communicator& c) {
      fsdp::model_options o;
      o.check_collectives = check;
      fsdp::Model<Full> m(c, s, by_prefix{"h."}, fsdp::init::normal{}, o);
      fsdp::optim::sgd opt(m, {.lr = 0.1f});
      for (int step = 0; step < 2; ++step) {
        for (auto& u : m.forward()) (void)u;
        for (auto& u : m.backward())
          for (const auto& e : u.layout().entries()) {
            auto g = u.grad(e.name);
            for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = float(c.rank() + 1) * 0.01f * float(i % 7);
          }
        opt.step();
      }
      params[check][c.rank()] = fsdp::weights::gather_full_params(m);
      m.synchronize();
      stats[check][c.rank()] = c.stats();
    });
  }
  CHECK(params[true] == params[false]);
  for (int r = 0; r < 3; ++r) {
    const auto &on = stats[true][r], &off = stats[false][r];
    const std::uint64_t issued = off[fsdp::collective::all_gather] - 1 + off[fsdp::collective::reduce_scatter];
    CHECK(on[fsdp::collective::all_gather] == off[fsdp::collective::all_gather] + issued);
    CHECK(on[fsdp::collective::reduce_scatter] == off[fsdp::collective::reduce_scatter]);
    CHECK(on.bytes[std::size_t(fsdp::collective::all_gather)] ==
          off.bytes[std::size_t(fsdp::collective::all_gather)] + issued * 16 * 3);
  }
}
