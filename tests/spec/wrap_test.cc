// Wrapping policies: grouping into units, unit order, ties kept together or reported.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "tests/support/support.hpp"

using fsdp_test::error_of;

namespace {
fsdp::ModelSpec gpt_like() {
  fsdp::ModelSpec s;
  s.add("wte", {16, 8}).add("h.0.attn.w", {8, 8}).add("h.0.mlp.w", {8, 8}).add("h.1.attn.w", {8, 8});
  s.add("h.1.mlp.w", {8, 8}).add("ln_f", {8}).tie("lm_head", "wte");
  return s;
}
std::vector<std::string> names(const std::vector<fsdp::unit_plan>& u) {
  std::vector<std::string> out;
  for (const auto& x : u) out.push_back(x.name);
  return out;
}
}  // namespace

TEST_CASE("by_prefix: one unit per block, the rest in the root unit, in spec order") {
  const auto units = fsdp::make_units(gpt_like(), fsdp::wrap::by_prefix{"h."});
  CHECK(names(units) == std::vector<std::string>{"root", "h.0", "h.1"});
  CHECK(units[0].params == std::vector<std::size_t>{0, 5, 6});
  CHECK(units[1].params == std::vector<std::size_t>{1, 2});
  CHECK(units[2].params == std::vector<std::size_t>{3, 4});
}

TEST_CASE("by_size packs consecutive parameters and keeps aliases with their target") {
  const auto units = fsdp::make_units(gpt_like(), fsdp::wrap::by_size{128});
  CHECK(names(units) == std::vector<std::string>{"unit0", "unit1", "unit2", "unit3"});
  CHECK(units[0].params == std::vector<std::size_t>{0, 6});  // wte (128) + its alias lm_head
  CHECK(units[1].params == std::vector<std::size_t>{1, 2});
  CHECK(units[2].params == std::vector<std::size_t>{3, 4});
  CHECK(units[3].params == std::vector<std::size_t>{5});
  CHECK(error_of<fsdp::usage_error>([] { fsdp::make_units(gpt_like(), fsdp::wrap::by_size{0}); }) ==
        "fsdp: wrap::by_size needs min_numel > 0, got 0");
}

TEST_CASE("by_function lets the user name units") {
  const auto units = fsdp::make_units(gpt_like(), fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
                                        return p.name.find("mlp") != std::string::npos ? std::string("mlps")
                                                                                       : std::string("rest");
                                      }});
  CHECK(names(units) == std::vector<std::string>{"rest", "mlps"});
  CHECK(error_of<fsdp::usage_error>([] {
          fsdp::make_units(gpt_like(), fsdp::wrap::by_function{[](const fsdp::ParamSpec&) { return std::string(); }});
        }) == "fsdp: wrap::by_function gave parameter 'wte' an empty unit name");
}

TEST_CASE("a tie split across units names both parameters and both units") {
  fsdp::ModelSpec s;
  s.add("h.0.w", {4}).add("h.1.w", {4}).tie("h.1.w_tied", "h.0.w");
  CHECK(error_of<fsdp::usage_error>([&] { fsdp::make_units(s, fsdp::wrap::by_prefix{"h."}); }) ==
        "fsdp: tied parameters 'h.1.w_tied' and 'h.0.w' landed in different units ('h.1' and 'h.0'): tied "
        "parameters share storage and must be in one unit; change the wrapping policy");
}

TEST_CASE("an empty spec cannot be wrapped") {
  CHECK(error_of<fsdp::usage_error>([] { fsdp::make_units(fsdp::ModelSpec{}, fsdp::wrap::by_prefix{"h."}); }) ==
        "fsdp: the model spec is empty: add at least one parameter");
}

TEST_CASE("unit names from a wrapping policy must be non-empty UTF-8, naming the parameter that got it") {
  fsdp::ModelSpec spec;
  spec.add("a.w", {2}).add("b.w", {2});
  const auto wrap_as = [&](std::string bad) {
    return fsdp_test::error_of<fsdp::usage_error>([&] {
      (void)fsdp::make_units(spec, fsdp::wrap::by_function{[bad](const fsdp::ParamSpec& p) {
                               return p.name == "b.w" ? bad : std::string("a");
                             }});
    });
  };
  CHECK(wrap_as("blk\xfe") ==
        "fsdp: unit name 'blk\\xfe' is not valid UTF-8 (byte 0xfe at offset 3), given by the wrapping policy to "
        "parameter 'b.w': names appear in messages, traces and checkpoints; name units in UTF-8");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
          (void)fsdp::make_units(spec, fsdp::wrap::by_prefix{.prefix = "a.", .rest = ""});
        }) == "fsdp: the wrapping policy gave parameter 'b.w' an empty unit name");
}
