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
  CHECK(error_of<fsdp::usage_error>([&] { empty.validate(); }) ==
        "fsdp: the model spec is empty: add at least one parameter");
}

TEST_CASE("element counts that overflow, or pass 2^48, are refused naming the parameter and its shape") {
  fsdp::ModelSpec s;
  s.add("small", {2, 3});
  CHECK(error_of<fsdp::usage_error>([&] { s.add("huge", {std::int64_t{1} << 32, std::int64_t{1} << 32}); }) ==
        "fsdp: parameter 'huge' has shape [4294967296, 4294967296], whose element count exceeds 2^48 = "
        "281474976710656, the most one parameter may have (is a dimension wrong?)");
  // The product overflows a signed 64-bit count (it used to fail later, naming no parameter).
  CHECK(error_of<fsdp::usage_error>([&] { s.add("sq", {3037000500, 3037000500}); }) ==
        "fsdp: parameter 'sq' has shape [3037000500, 3037000500], whose element count exceeds 2^48 = "
        "281474976710656, the most one parameter may have (is a dimension wrong?)");
  CHECK(error_of<fsdp::usage_error>([&] { s.add("wide", {2, std::int64_t{1} << 62, 4}); })
            .find("'wide' has shape [2, "
                  "4611686018427387904, 4]") != std::string::npos);
  CHECK(s.size() == 1);  // nothing was added by the failed calls
  fsdp::ModelSpec big;
  big.add("max", {std::int64_t{1} << 47, 2});  // exactly 2^48: allowed
  CHECK(error_of<fsdp::usage_error>([&] { big.add("b", {1}); }) ==
        "fsdp: parameter 'b' of shape [1] (1 elements) brings the model past 2^48 = 281474976710656 elements (it has "
        "281474976710656 before it), the most one model may have");
  CHECK(big.numel() == std::int64_t{1} << 48);
}

TEST_CASE("names must be UTF-8: the message shows the name printably and the first bad byte") {
  fsdp::ModelSpec s;
  s.add("wte.\u00e9", {2}).add("\u5c42.0.w", {2}).add("emoji.\U0001F600", {1});  // 2-, 3- and 4-byte sequences
  CHECK(error_of<fsdp::usage_error>([&] { s.add("h.\xff.w", {2}); }) ==
        "fsdp: parameter name 'h.\\xff.w' is not valid UTF-8 (byte 0xff at offset 2): names appear in messages, "
        "traces and checkpoints; give the parameter a UTF-8 name");
  const auto bad_at = [](std::string_view name) { return fsdp::detail::utf8_error(name); };
  CHECK(bad_at("plain") == std::string_view::npos);
  CHECK(bad_at("\xc3\xa9") == std::string_view::npos);          // é
  CHECK(bad_at("ab\xc3") == 2);                                 // truncated at the end
  CHECK(bad_at("\xc0\x80") == 0);                              // overlong NUL
  CHECK(bad_at("x\xe0\x80\x80") == 1);                        // overlong 3-byte
  CHECK(bad_at("\xed\xa0\x80") == 0);                         // a surrogate
  CHECK(bad_at("\xf4\x90\x80\x80") == 0);                    // above U+10FFFF
  CHECK(bad_at("\xe2\x82") == 0);                              // truncated 3-byte
  CHECK(bad_at("\xe2\x28\xa1") == 0);                         // a bad continuation
  CHECK(fsdp::detail::printable("a\tb\xff\xc3\xa9") == "a\\x09b\\xff\xc3\xa9");  // control and bad bytes escaped
  CHECK(s.size() == 3);
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
