#pragma once
// The flat layout's definitions (fsdp/layout/flat_layout.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>

#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/layout/flat_layout.hpp"

namespace fsdp {

namespace layout {
FSDP_DECL std::int64_t shard_numel(std::int64_t numel, int world, std::int64_t align) {
  if (world <= 0) detail::fail_usage("world size must be positive, got ", world);
  if (align <= 0) detail::fail_usage("layout alignment must be positive, got ", align);
  if (numel < 0) detail::fail_usage("flat buffer size must not be negative, got ", numel);
  return round_up((numel + world - 1) / world, align);
}
}  // namespace layout

FSDP_DECL FlatLayout FlatLayout::build(const ModelSpec& spec, const unit_plan& unit, int world, layout_options opt) {
  if (world <= 0) detail::fail_usage("world size must be positive, got ", world, " (unit '", unit.name, "')");
  FlatLayout l;
  l.world_ = world;
  l.align_ = opt.align;
  std::int64_t cursor = 0;
  // the parameters split across the tensor group first (in spec order), then the rest: split_end()
  for (const bool split : {true, false}) {
    for (std::size_t i : unit.params) {
      const ParamSpec& p = spec.params()[i];
      if (p.is_tied() || p.tensor.is_split() != split) continue;
      cursor = layout::round_up(cursor, opt.align);
      l.by_name_.emplace(p.name, l.entries_.size());
      l.entries_.push_back(flat_entry{i, p.name, p.shape, p.numel(), cursor, p.flags, p.tensor, p.experts});
      cursor += p.numel();
    }
    if (split) l.split_end_ = cursor;
  }
  for (std::size_t i : unit.params) {
    const ParamSpec& p = spec.params()[i];
    if (!p.is_tied()) continue;
    auto it = l.by_name_.find(p.tied_to);
    if (it == l.by_name_.end())
      detail::fail_usage("tied parameter '", p.name, "' is in unit '", unit.name, "' but '", p.tied_to,
                         "' is not");
    l.by_name_.emplace(p.name, it->second);
  }
  l.numel_ = cursor;
  l.shard_numel_ = layout::shard_numel(cursor, world, opt.align);
  return l;
}

FSDP_DECL std::string mixed_unit_problem(const ModelSpec& spec, const unit_plan& unit) {
  const std::size_t* dense = nullptr;
  const std::size_t* experts = nullptr;
  for (const std::size_t& i : unit.params) (spec.params()[i].experts ? experts : dense) = &i;
  if (!dense || !experts) return {};
  return detail::cat("unit '", unit.name, "' holds expert parameter '", spec.params()[*experts].name,
                     "' and dense parameter '", spec.params()[*dense].name,
                     "': wrap the experts in a unit of their own (their gathers and reductions go to the expert shard "
                     "group; fsdp::wrap::experts_apart{policy} does)");
}

FSDP_DECL FlatLayout layout_on(const ModelSpec& spec, const unit_plan& unit, const device_mesh& mesh,
                               layout_options opt) {
  const bool experts = !unit.params.empty() && spec.params()[unit.params.front()].experts;
  return FlatLayout::build(spec, unit, experts ? mesh.expert_shards() : mesh.shards, opt);
}

FSDP_DECL const flat_entry& FlatLayout::entry(const std::string& name, const std::string& unit_name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    detail::fail_usage("no parameter named '", name, "' in unit '", unit_name, "'");
  return entries_[it->second];
}

FSDP_DECL std::vector<flat_run> FlatLayout::partial_grad_runs() const {
  std::vector<flat_run> out;
  for (const flat_entry& e : entries_) {
    if (!e.tensor.has_partial_grad()) continue;
    if (!out.empty() && out.back().offset + out.back().numel == e.offset)
      out.back().numel += e.numel;
    else
      out.push_back({e.offset, e.numel});
  }
  return out;
}

FSDP_DECL std::vector<ShardedTensor> FlatLayout::shard_views(int rank) const {
  const std::int64_t lo = shard_begin(rank), hi = shard_end(rank);
  std::vector<ShardedTensor> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) {
    const std::int64_t b = std::clamp(lo - e.offset, std::int64_t{0}, e.numel);
    const std::int64_t en = std::clamp(hi - e.offset, std::int64_t{0}, e.numel);
    out.push_back(ShardedTensor{e.name, e.shape, e.numel, b, en, en > b ? e.offset + b - lo : 0, e.flags});
  }
  return out;
}

FSDP_DECL std::int64_t FlatLayout::check_rank(int rank) const {
  if (rank < 0 || rank >= world_) detail::fail_usage("rank ", rank, " is outside the shard group of ", world_);
  return rank;
}

}  // namespace fsdp
