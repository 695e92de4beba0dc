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
  std::int64_t scratch_used = 0;  // the most any rank measured over its plan within its `outside_plan`
  // `allowed`: the bytes outside the plan by design that this figure counts (the row's outside_plan, or 0)
  auto check = [&](const rank_memory& r, std::string_view what, std::int64_t measured, std::int64_t planned,
                   std::int64_t allowed) {
    if (measured <= planned) return;
    if (measured - planned <= allowed) {
      scratch_used = std::max(scratch_used, measured - planned);
      return;
    }
    if (!over.empty()) over += "; ";
    over += "rank " + std::to_string(r.rank) + " " + std::string(what) + " by " +
            std::to_string(measured - planned - allowed) + " bytes";
    if (allowed > 0) over += " beyond model_options::check_collectives' " + std::to_string(allowed) + "-byte scratch";
  };
  for (const rank_memory& r : rows) {
    put("%-6d", r.rank);
    for (std::size_t c = 0; c < mem_categories; ++c) {
      const mem m = static_cast<mem>(c);
      cell(r.measured.bytes[c], r.planned.bytes[c]);
      check(r, name_of(m), r.measured.bytes[c], r.planned.bytes[c], m == mem::comm_buffers ? r.outside_plan : 0);
    }
    cell(r.measured.total, r.planned.total);
    check(r, "total", r.measured.total, r.planned.total, r.outside_plan);
    out += "\n";
  }
  if (rows.empty())
    out += "no ranks\n";
  else if (!over.empty())
    out += "over the plan: " + over + "\n";
  else if (scratch_used > 0)
    out += "every rank within its plan and model_options::check_collectives' scratch (comm buffers outside the plan: " +
           std::to_string(scratch_used) + " bytes at most)\n";
  else
    out += "every rank within its plan\n";
  return out;
}

}  // namespace fsdp
