#pragma once
// The flat per-unit layout. Every stored parameter of a unit sits at an aligned offset of one flat buffer; the
// buffer is padded so that it splits into `world` equal shards whose size is a multiple of the alignment.
// Rank r owns elements [r * shard_numel, (r + 1) * shard_numel). Alignment gaps and the tail padding hold
// zeros. Parameters may straddle shards; a shard may hold no parameter at all (an empty shard).
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/mesh.hpp"
#include "fsdp/layout/sharded_tensor.hpp"
#include "fsdp/policy/wrap.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp {

struct layout_options {
  /// Alignment of every parameter offset and of the shard size, in elements. 16 keeps 32-byte alignment
  /// for 2-byte dtypes and 64-byte alignment for fp32, enough for vectorised copies on the CUDA backend.
  std::int64_t align = 16;
};

namespace layout {
constexpr std::int64_t round_up(std::int64_t n, std::int64_t m) noexcept { return (n + m - 1) / m * m; }

/// Elements per shard for a flat buffer of `numel` elements split over `world` ranks.
FSDP_DECL std::int64_t shard_numel(std::int64_t numel, int world, std::int64_t align = 1);
}  // namespace layout

/// One stored parameter placed in a unit's flat buffer.
struct flat_entry {
  std::size_t spec_index = 0;  ///< index in the ModelSpec
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::int64_t offset = 0;  ///< element offset in the unsharded flat buffer
  param_flags flags{};
  tensor_placement tensor{};  ///< its place in the tensor group (the spec's)
  bool experts = false;       ///< a stack of experts (the spec's ParamSpec::experts)
};

/// Elements [offset, offset + numel) of a unit's unsharded flat buffer.
struct flat_run {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  friend bool operator==(const flat_run&, const flat_run&) = default;
};

class FlatLayout {
 public:
  FlatLayout() = default;

  /// Places the parameters of `unit` (spec indices) for a shard group of `world` ranks, in spec order, but the
  /// parameters split across a tensor group (tp::split) first. Tied aliases share the offset of the parameter they
  /// are tied to.
  static FlatLayout build(const ModelSpec& spec, const unit_plan& unit, int world, layout_options opt = {});

  int world() const noexcept { return world_; }
  std::int64_t align() const noexcept { return align_; }
  /// Elements up to the end of the last parameter (alignment gaps included, tail padding not).
  std::int64_t numel() const noexcept { return numel_; }
  /// Elements of the unsharded flat buffer: world * shard_numel.
  std::int64_t padded_numel() const noexcept { return shard_numel_ * world_; }
  std::int64_t shard_numel() const noexcept { return shard_numel_; }
  /// Elements [0, split_end()) hold every parameter split across the tensor group (and the gaps between them);
  /// none of the others. 0 without split parameters.
  std::int64_t split_end() const noexcept { return split_end_; }
  const std::vector<flat_entry>& entries() const noexcept { return entries_; }
  /// Whether the unit's parameters are experts (ParamSpec::experts: sharded over the expert shard group; a unit
  /// holds experts or dense parameters, not both).
  bool experts() const noexcept { return !entries_.empty() && entries_.front().experts; }

  /// The entry that stores `name` (an alias resolves to its target). Throws usage_error when absent.
  const flat_entry& entry(const std::string& name, const std::string& unit_name = {}) const;
  bool contains(const std::string& name) const { return by_name_.count(name) != 0; }

  /// [first, last) of the unsharded buffer owned by `rank`.
  std::int64_t shard_begin(int rank) const { return check_rank(rank) * shard_numel_; }
  std::int64_t shard_end(int rank) const { return shard_begin(rank) + shard_numel_; }

  /// Every stored parameter's part of `rank`'s shard, in layout order (empty parts included).
  std::vector<ShardedTensor> shard_views(int rank) const;

  /// Where the parameters whose gradient is a partial sum across the tensor group (tp::partial_grad) lie, in
  /// layout order, adjacent ones as one run: what the model all-reduces over the tensor group.
  std::vector<flat_run> partial_grad_runs() const;

 private:
  std::int64_t check_rank(int rank) const;

  int world_ = 1;
  std::int64_t align_ = 1;
  std::int64_t numel_ = 0;
  std::int64_t shard_numel_ = 0;
  std::int64_t split_end_ = 0;
  std::vector<flat_entry> entries_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

/// Unit `unit`'s layout as a Model on `mesh` lays it out, from this rank's spec (local shapes): over the shard group
/// (mesh.shards ranks), or for a unit of experts (its parameters ParamSpec::experts) over the expert shard group
/// (mesh.expert_shards() ranks).
FSDP_DECL FlatLayout layout_on(const ModelSpec& spec, const unit_plan& unit, const device_mesh& mesh,
                               layout_options opt = {});
/// What is wrong with unit `unit` of `spec` for layout_on (it holds expert and dense parameters, whose gathers and
/// reductions go to different groups), or empty.
FSDP_DECL std::string mixed_unit_problem(const ModelSpec& spec, const unit_plan& unit);

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/layout/flat_layout.ipp"
#endif
