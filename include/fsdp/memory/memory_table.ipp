#pragma once
// The memory table's definitions (fsdp/memory/memory_table.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string_view>

#include "fsdp/memory/memory_table.hpp"

namespace fsdp {

FSDP_DECL std::string memory_table(std::vector<rank_memory> rows) {
  std::sort(rows.begin(), rows.end(), [](const rank_memory& a, const rank_memory& b) { return a.rank < b.rank; });
  std::string out;
  char text[96];
  auto put = [&](const char* format, auto... args) {
    std::snprintf(text, sizeof text, format, args...);
    out += text;
  };
  auto cell = [&](std::int64_t measured, std::int64_t planned) {
    char pair[64];
    std::snprintf(pair, sizeof pair, "%.2f / %.2f", double(measured) / 1024.0, double(planned) / 1024.0);
    put(" %24s", pair);
  };
  out += "peak memory per rank (KiB), measured / planned\n";
  put("%-6s", "rank");
  for (std::size_t c = 0; c < mem_categories; ++c) put(" %24s", std::string(name_of(static_cast<mem>(c))).c_str());
  put(" %24s\n", "total (at once)");
  std::string over;
  auto check = [&](const rank_memory& r, std::string_view what, std::int64_t measured, std::int64_t planned) {
    if (measured <= planned) return;
    if (!over.empty()) over += "; ";
    over += "rank " + std::to_string(r.rank) + " " + std::string(what) + " by " + std::to_string(measured - planned) +
            " bytes";
  };
  for (const rank_memory& r : rows) {
    put("%-6d", r.rank);
    for (std::size_t c = 0; c < mem_categories; ++c) {
      cell(r.measured.bytes[c], r.planned.bytes[c]);
      check(r, name_of(static_cast<mem>(c)), r.measured.bytes[c], r.planned.bytes[c]);
    }
    cell(r.measured.total, r.planned.total);
    check(r, "total", r.measured.total, r.planned.total);
    out += "\n";
  }
  if (rows.empty())
    out += "no ranks\n";
  else if (over.empty())
    out += "every rank within its plan\n";
  else
    out += "over the plan: " + over + "\n";
  return out;
}

}  // namespace fsdp
