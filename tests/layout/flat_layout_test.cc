// Shard math: for every buffer size and world size, shards cover each element exactly once, padding is zero,
// and an all-gather of the shards gives the original back bit for bit.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/support/support.hpp"

using fsdp_test::error_of;

namespace {
const std::int64_t kNumels[] = {0, 1, 3, 7, 17, 257, 4099};
const int kWorlds[] = {1, 2, 3, 4, 7, 8, 16};

/// A distinct bit pattern per element (some are NaN or denormal as floats: compared as bits).
std::uint32_t pattern(std::int64_t i) { return static_cast<std::uint32_t>(i) * 2654435761u + 12345u; }

/// A unit whose flat buffer holds exactly `numel` elements split over several parameters (numel > 0).
fsdp::ModelSpec spec_of(std::int64_t numel) {
  fsdp::ModelSpec s;
  std::int64_t left = numel, k = 0;
  while (left > 0) {
    const std::int64_t n = std::min<std::int64_t>(left, 1 + 5 * k * k);  // 1, 6, 21, ... elements
    s.add("p" + std::to_string(k), {n});
    left -= n;
    ++k;
  }
  return s;
}
}  // namespace

TEST_CASE("shard ranges partition the flat buffer for every size and world") {
  for (std::int64_t align : {1, 16})
    for (std::int64_t numel : kNumels)
      for (int world : kWorlds) {
        CAPTURE(numel);
        CAPTURE(world);
        CAPTURE(align);
        const std::int64_t s = fsdp::layout::shard_numel(numel, world, align);
        CHECK(s % align == 0);
        CHECK(s * world >= numel);
        CHECK((s - align) * world < numel + (numel == 0 ? 1 : 0));  // no whole aligned block of extra padding
        std::vector<int> owner(static_cast<std::size_t>(s * world), -1);
        for (int r = 0; r < world; ++r)
          for (std::int64_t i = r * s; i < (r + 1) * s; ++i) {
            CHECK(owner[i] == -1);
            owner[i] = r;
          }
        for (int o : owner) CHECK(o >= 0);
      }
}

TEST_CASE("sharded tensors cover every parameter element exactly once") {
  for (std::int64_t align : {1, 16})
    for (std::int64_t numel : kNumels) {
      if (numel == 0) continue;  // a parameter has at least one element; numel 0 is covered above
      const fsdp::ModelSpec spec = spec_of(numel);
      for (int world : kWorlds) {
        CAPTURE(numel);
        CAPTURE(world);
        auto units = fsdp::make_units(spec, fsdp::wrap::by_function{[](const auto&) { return std::string("u"); }});
        REQUIRE(units.size() == 1);
        const auto l = fsdp::FlatLayout::build(spec, units[0], world, {.align = align});
        for (const auto& e : l.entries()) CHECK(e.offset % align == 0);
        std::vector<std::vector<int>> seen(spec.size());
        for (std::size_t p = 0; p < spec.size(); ++p)
          seen[p].assign(static_cast<std::size_t>(spec.params()[p].numel()), 0);
        for (int r = 0; r < world; ++r)
          for (const auto& v : l.shard_views(r)) {
            CHECK(v.begin <= v.end);
            if (v.empty()) continue;
            CHECK(v.shard_offset >= 0);
            CHECK(v.shard_offset + v.local_numel() <= l.shard_numel());
            // the local range sits at the right place of the unsharded buffer
            CHECK(l.shard_begin(r) + v.shard_offset == l.entry(v.name).offset + v.begin);
            for (std::int64_t i = v.begin; i < v.end; ++i) seen[spec.index_of(v.name)][i] += 1;
          }
        for (const auto& s : seen)
          for (int c : s) CHECK(c == 1);
      }
    }
}

TEST_CASE("all_gather of the shards reproduces the buffer bit for bit, padding zero") {
  for (std::int64_t align : {1, 16})
    for (std::int64_t numel : kNumels)
      for (int world : kWorlds) {
        CAPTURE(numel);
        CAPTURE(world);
        CAPTURE(align);
        const std::int64_t s = fsdp::layout::shard_numel(numel, world, align);
        std::vector<std::vector<std::uint32_t>> gathered(world);
        fsdp_test::run_ranks(world, [&](fsdp::comm::local_communicator& comm) {
          const int r = comm.rank();
          std::vector<std::uint32_t> shard(static_cast<std::size_t>(s), 0u);  // padding: zero
          for (std::int64_t i = 0; i < s; ++i)
            if (r * s + i < numel) shard[i] = pattern(r * s + i);
          auto& out = gathered[r];
          out.assign(static_cast<std::size_t>(s * world), 0xdeadbeefu);
          fsdp::backend::host be(r);
          comm.all_gather(shard.data(), out.data(), s, fsdp::dtype::f32, be.gather_stream());
          be.synchronize(be.gather_stream());
        });
        for (int r = 0; r < world; ++r) {
          bool exact = true;
          for (std::int64_t i = 0; i < s * world; ++i)
            exact = exact && gathered[r][i] == (i < numel ? pattern(i) : 0u);
          CHECK(exact);
        }
      }
}

TEST_CASE("layout places tied aliases on their target and rejects bad sizes") {
  fsdp::ModelSpec spec;
  spec.add("wte", {10, 4}).add("ln", {4}).tie("head", "wte");
  auto units = fsdp::make_units(spec, fsdp::wrap::by_size{1000});
  REQUIRE(units.size() == 1);
  const auto l = fsdp::FlatLayout::build(spec, units[0], 3, {.align = 16});
  CHECK(l.entries().size() == 2);  // the alias has no storage of its own
  CHECK(l.entry("head").offset == l.entry("wte").offset);
  CHECK(l.entry("ln").offset == 48);
  CHECK(l.numel() == 52);
  CHECK(l.shard_numel() == 32);
  CHECK(l.padded_numel() == 96);
  CHECK(error_of([&] {
          (void)fsdp::FlatLayout::build(spec, units[0], 0);
        }).find("world size must be positive, got 0") != std::string::npos);
  CHECK(error_of([] { (void)fsdp::layout::shard_numel(5, 0); }).find("world size must be positive, got 0") !=
        std::string::npos);
  CHECK(error_of([&] { (void)l.shard_views(3); }).find("rank 3 is outside the shard group of 3") != std::string::npos);
  CHECK(error_of([&] { (void)l.entry("nope", "u0"); }).find("no parameter named 'nope' in unit 'u0'") !=
        std::string::npos);
}
