// fsdp::select: a trainer's generic lambda called with the type a name chooses (a flag's strategy, precision or
// prefetch), and an unknown name refused with the names known.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <fsdp/select.hpp>

#include "tests/support/support.hpp"

namespace {
using fsdp::named;
namespace sharding = fsdp::sharding;

/// What a trainer would build from two flags: the policy's strategy and compute dtype, as text.
std::string chosen(std::string_view strategy, std::string_view precision) {
  return fsdp::select(
      "--precision", precision,
      [&](auto p) {
        using Precision = typename decltype(p)::type;
        return fsdp::select(
            "--strategy", strategy,
            [&](auto s) {
              using P = fsdp::policy<typename decltype(s)::type, fsdp::prefetch::next, Precision>;
              return std::string(P::sharding::name) + " in " +
                     std::string(fsdp::name_of(fsdp::facts_of_precision<typename P::precision>().compute));
            },
            fsdp::by_name<sharding::full_shard, sharding::shard_grad_op, sharding::no_shard>());
      },
      named<fsdp::precision::full>{"fp32"}, named<fsdp::precision::mixed<fsdp::bfloat16>>{"bf16"});
}
}  // namespace

TEST_CASE("each name chooses its type; the lambda's result is select's") {
  CHECK(chosen("full_shard", "fp32") == "full_shard in f32");
  CHECK(chosen("shard_grad_op", "bf16") == "shard_grad_op in bf16");
  CHECK(chosen("no_shard", "bf16") == "no_shard in bf16");
  int calls = 0;
  fsdp::select("--mode", "b", [&](auto m) { calls += decltype(m)::type::value; },  // a lambda returning nothing
               named<std::integral_constant<int, 1>>{"a"}, named<std::integral_constant<int, 2>>{"b"});
  CHECK(calls == 2);
}

TEST_CASE("a name that is not among the alternatives is refused, naming the setting, the name and the names known") {
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { (void)chosen("zero3", "fp32"); }) ==
        "fsdp: --strategy 'zero3' is not one of: full_shard, shard_grad_op, no_shard");
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { (void)chosen("full_shard", "fp8"); }) ==
        "fsdp: --precision 'fp8' is not one of: fp32, bf16");
  // what cannot be printed is escaped, not passed to the terminal
  CHECK(fsdp_test::error_of<fsdp::usage_error>([] { (void)chosen("full\x1b", "fp32"); }) ==
        "fsdp: --strategy 'full\\x1b' is not one of: full_shard, shard_grad_op, no_shard");
}
