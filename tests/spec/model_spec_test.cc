// ModelSpec and init rules: bad input is a clear error naming the parameter; init values depend only on
// (seed, name, global index).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "tests/support/support.hpp"

using fsdp_test::error_of;

TEST_CASE("a spec records shapes, flags and ties") {
  fsdp::ModelSpec s;
  s.add("w", {3, 4}).add("b", {4}, {.flags = {.no_decay = true}}).tie("w_out", "w");
  CHECK(s.size() == 3);
  CHECK(s.at("w").numel() == 12);
  CHECK(s.at("b").flags.no_decay);
  CHECK(s.at("w_out").is_tied());
  CHECK(s.at("w_out").tied_to == "w");
  CHECK(s.at("w_out").shape == std::vector<std::int64_t>{3, 4});
  CHECK(s.numel() == 16);  // the alias adds no storage
}

TEST_CASE("bad specs are rejected with the parameter named") {
  fsdp::ModelSpec s;
  s.add("h.0.w", {4, 4});
  CHECK(error_of<fsdp::usage_error>([&] { s.add("h.0.w", {2}); }) ==
        "fsdp: duplicate parameter name 'h.0.w' in the model spec");
  CHECK(error_of<fsdp::usage_error>([&] { s.add("z", {4, 0}); }) ==
        "fsdp: parameter 'z' has dimension 1 = 0: every dimension must be positive");
  CHECK(error_of<fsdp::usage_error>([&] { s.add("neg", {-3}); }) ==
        "fsdp: parameter 'neg' has dimension 0 = -3: every dimension must be positive");
  CHECK(error_of<fsdp::usage_error>([&] { s.add("scalar", {}); }).find("parameter 'scalar' has no dimensions") !=
        std::string::npos);
  CHECK(error_of<fsdp::usage_error>([&] { s.add("", {1}); }) == "fsdp: a parameter name is empty");
  CHECK(error_of<fsdp::usage_error>([&] { s.tie("a", "missing"); }) ==
        "fsdp: cannot tie 'a' to 'missing': no parameter named 'missing'");
  s.tie("alias", "h.0.w");
  CHECK(error_of<fsdp::usage_error>([&] { s.tie("alias2", "alias"); }).find("'alias' is itself tied to 'h.0.w'") !=
        std::string::npos);
  CHECK(s.size() == 2);  // nothing was added by the failed calls

  fsdp::ModelSpec empty;
  CHECK(error_of<fsdp::usage_error>([&] { empty.validate(); }) == "fsdp: the model spec is empty: add at least one parameter");
}

TEST_CASE("init values are a pure function of seed, name and global index") {
  const fsdp::init::normal n{0.02f, 7};
  std::vector<float> whole(1000), part(300);
  fsdp::init::fill(n, "w", 0, whole.size(), whole.data());
  fsdp::init::fill(n, "w", 500, part.size(), part.data());
  for (std::size_t i = 0; i < part.size(); ++i) CHECK(part[i] == whole[500 + i]);
  // other names and seeds give other streams
  CHECK(fsdp::init::value(n, "w", 3) != fsdp::init::value(n, "v", 3));
  CHECK(fsdp::init::value(n, "w", 3) != fsdp::init::value(fsdp::init::normal{0.02f, 8}, "w", 3));
  // moments are what the rule says (100k samples: mean within 4 sigma of 0, std within 1%)
  std::vector<float> big(100000);
  fsdp::init::fill(fsdp::init::normal{1.0f, 1}, "x", 0, big.size(), big.data());
  double sum = 0, sq = 0;
  for (float v : big) {
    sum += v;
    sq += double(v) * v;
  }
  const double mean = sum / big.size(), sd = std::sqrt(sq / big.size() - mean * mean);
  CHECK(std::abs(mean) < 4.0 / std::sqrt(100000.0));
  CHECK(std::abs(sd - 1.0) < 0.01);
  for (float v : big) CHECK(std::isfinite(v));
  CHECK(fsdp::init::value(fsdp::init::ones, "g", 12) == 1.0f);
  const fsdp::init::uniform u{-2.0f, 3.0f, 5};
  for (int i = 0; i < 1000; ++i) {
    const float v = fsdp::init::value(u, "u", i);
    CHECK(v >= -2.0f);
    CHECK(v < 3.0f);
  }
}
