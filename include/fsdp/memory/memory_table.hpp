#pragma once
// Every rank's peak memory by category, as measured next to the memory planner's prediction: the check that a
// model's memory is what its plan says, as one call.
//
//   fsdp::memory_row(model, optimizer)   this rank's row: Model::memory().peak and Model::plan_memory(optimizer).peak
//   fsdp::memory_table(rows)             the rows as a table (KiB, "measured / planned" per category and in total),
//                                        and a closing line: every rank within its plan, or each category and rank
//                                        that measured more than planned, by how many bytes
//
// With thread ranks (comm::run_local), gather the rows (one per rank, any order) and print the table once; with one
// process per rank, each prints its own row's table. The measured figures are the backend's accounting (on CUDA the
// library's pool, which the reservation holds at exactly the plan); the trainer's own buffers are not in them.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fsdp/memory/memory.hpp"

namespace fsdp {

/// One rank's peak memory, measured and planned.
struct rank_memory {
  int rank = 0;
  memory_figures measured;
  memory_figures planned;
};

/// This rank's row: the model's measured peak (Model::memory().peak) and the plan's (Model::plan_memory(opt).peak,
/// with the optimizer's state and inspection rows). Any model and optimizer with those calls.
template <class ModelT, class Optimizer>
rank_memory memory_row(ModelT& model, const Optimizer& opt) {
  return {model.comm().rank(), model.memory().peak, model.plan_memory(opt).peak};
}

/// The rows as a table, sorted by rank, then the verdict line.
inline std::string memory_table(std::vector<rank_memory> rows) {
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
