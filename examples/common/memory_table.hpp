#pragma once
// The examples' closing table: every rank's peak memory by category, measured next to the memory planner's
// prediction (KiB).
#include <cstdio>
#include <string>
#include <vector>

#include <fsdp/memory/memory.hpp>

namespace examples {

struct rank_memory {
  fsdp::memory_figures measured, planned;
};

inline void print_memory_table(const std::vector<rank_memory>& ranks) {
  std::printf("\npeak memory per rank (KiB), measured / planned\n%-6s", "rank");
  for (std::size_t c = 0; c < fsdp::mem_categories; ++c)
    std::printf(" %24s", std::string(fsdp::name_of(static_cast<fsdp::mem>(c))).c_str());
  std::printf(" %24s\n", "total (at once)");
  auto cell = [](std::int64_t measured, std::int64_t planned) {
    char text[64];
    std::snprintf(text, sizeof text, "%.2f / %.2f", measured / 1024.0, planned / 1024.0);
    std::printf(" %24s", text);
  };
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::printf("%-6zu", r);
    for (std::size_t c = 0; c < fsdp::mem_categories; ++c) cell(ranks[r].measured.bytes[c], ranks[r].planned.bytes[c]);
    cell(ranks[r].measured.total, ranks[r].planned.total);
    std::printf("\n");
  }
}

}  // namespace examples
