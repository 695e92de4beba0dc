#pragma once
// Every rank's peak memory by category, as measured next to the memory planner's prediction: the check that a
// model's memory is what its plan says, as one call.
//
//   fsdp::memory_row(model, optimizer)   this rank's row: Model::memory().peak and plan_memory(model, optimizer).peak
//                                        (fsdp/model_plans.hpp, with the model's other plans)
//   fsdp::memory_table(rows)             the rows as a table (KiB, "measured / planned" per category and in total),
//                                        and a closing line: every rank within its plan, or each category and rank
//                                        that measured more than planned, by how many bytes
//
// What the plan leaves out by design is allowed for, and said: under model_options::check_collectives each rank
// holds up to agree::agreement_scratch_bytes(world) (fsdp/core/hash.hpp) of comm buffers beside the plan while it
// compares a collective (fsdp/agree/agree.hpp); a row's `outside_plan` carries it, and a measured figure over the plan
// by no more than that is within it, with the closing line saying so.
//
// With thread ranks (comm::run_local), gather the rows (one per rank, any order) and print the table once; with one
// process per rank, each prints its own row's table. The measured figures are the backend's accounting (on CUDA the
// library's pool, which the reservation holds at exactly the plan); the trainer's own buffers are not in them.
#include <string>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/memory/memory.hpp"

namespace fsdp {

/// One rank's peak memory, measured and planned.
struct rank_memory {
  int rank = 0;
  memory_figures measured;
  memory_figures planned;
  /// Comm buffers the plan leaves out by design, at most this many bytes at a time: model_options::check_collectives'
  /// scratch (0 without it). Counted in the measured comm buffers and total, not in the planned ones.
  std::int64_t outside_plan = 0;
};

/// The rows as a table, sorted by rank, then the verdict line.
FSDP_DECL std::string memory_table(std::vector<rank_memory> rows);

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/memory/memory_table.ipp"
#endif
