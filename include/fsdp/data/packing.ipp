#pragma once
// The packing helpers' definitions (fsdp/data/packing.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/data/packing.hpp"

namespace fsdp::data {

FSDP_DECL void validate(const packing_options& o) {
  auto positive = [](const char* name, std::int64_t v, const char* what) {
    if (v <= 0) fsdp::detail::fail_usage("packing: ", name, " is ", v, "; it is ", what, " and must be positive");
  };
  positive("row_tokens", o.row_tokens, "the tokens of one row (the model's context length)");
  positive("rows_per_step", o.rows_per_step, "the rows of one step over every rank");
  positive("lookahead", o.lookahead, "the pieces of documents the packer may reorder");
  if (o.row_tokens > INT32_MAX)
    fsdp::detail::fail_usage("packing: row_tokens is ", o.row_tokens,
                             "; position ids and cu_seqlens are 32-bit, so at most ", INT32_MAX);
}

FSDP_DECL void check_world(std::int64_t rows, int world) {
  if (world <= 0) fsdp::detail::fail_usage("packing: world size ", world, " is not positive");
  if (rows % world != 0)
    fsdp::detail::fail_usage("packing: ", rows, " rows per step do not split over ", world,
                       " ranks; choose rows_per_step a multiple of every world size you train at");
}

FSDP_DECL void check_rank(int world, int rank) {
  if (rank < 0 || rank >= world) fsdp::detail::fail_usage("packing: rank ", rank, " is outside a world of ", world);
}

FSDP_DECL std::vector<std::vector<std::int64_t>> deal_rows(const std::vector<std::int64_t>& row_real_tokens,
                                                           int world) {
  const auto rows = static_cast<std::int64_t>(row_real_tokens.size());
  check_world(rows, world);
  std::vector<std::int64_t> order(static_cast<std::size_t>(rows));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return row_real_tokens[static_cast<std::size_t>(a)] > row_real_tokens[static_cast<std::size_t>(b)];
  });
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(world));
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t round = i / world, pos = i % world;
    const std::int64_t rank = round % 2 == 0 ? pos : world - 1 - pos;
    out[static_cast<std::size_t>(rank)].push_back(order[static_cast<std::size_t>(i)]);
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

FSDP_DECL rank_batch rank_share(const packed_step& s, int world, int rank) {
  check_rank(world, rank);
  std::vector<std::int64_t> real(s.rows.size());
  for (std::size_t i = 0; i < s.rows.size(); ++i) real[i] = s.rows[i].real_tokens();
  rank_batch b;
  b.step = s.step;
  b.row_ids = deal_rows(real, world)[static_cast<std::size_t>(rank)];
  for (std::int64_t id : b.row_ids) {
    b.rows.push_back(s.rows[static_cast<std::size_t>(id)]);
    b.real_tokens += b.rows.back().real_tokens();
    b.loss_tokens += b.rows.back().loss_tokens();
  }
  b.step_real_tokens = s.real_tokens;
  b.step_loss_tokens = s.loss_tokens;
  return b;
}

FSDP_DECL packer_state packer_snapshot::value() const {
  packer_state s{.step = step, .next_document = next_document, .stream_ended = stream_ended, .buffer = {}, .carry = {}};
  for (const auto& p : buffer) s.buffer.push_back(*p);
  if (carry) {
    const auto from = carry->tokens.begin() + static_cast<std::ptrdiff_t>(carry_taken);
    s.carry = piece{.document = carry->document,
                    .offset = carry->offset + carry_taken,
                    .tokens = std::vector<token>(from, carry->tokens.end())};
  }
  return s;
}

}  // namespace fsdp::data
