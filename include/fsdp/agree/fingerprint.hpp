#pragma once
// What every rank of a group must agree on before a model is built, as a list of facts: (subject, attribute,
// value), e.g. ("parameter 'h.0.w'", "shape", "[9, 9]"). Two ranks' lists are compared fact by fact, so the first
// difference names what differs and where ("parameter 'h.0.w': shape is [9, 9] on rank 0 but [3, 27] on rank 2").
// fsdp/agree/agree.hpp exchanges them across a communicator; Model does so at construction.
//
// The model's fingerprint covers the spec (parameter count, then per parameter: name, shape, compute dtype,
// no_decay, tie, init rule), the default init rule, the policy (strategy, group sizes, prefetch, precision), every
// model_options field that changes what ranks do (layout alignment, division, accumulation, orders, per-unit
// resharding, slots, the prefetch schedule, the collective check) and the layout the wrapping produced (units by name,
// their parameters, padded and shard sizes). Not covered: the recorder (a per-process observer) and the communicator's
// own options.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/init/init.hpp"
#include "fsdp/layout/flat_layout.hpp"
#include "fsdp/options/model_options.hpp"
#include "fsdp/policy/offload.hpp"
#include "fsdp/policy/precision.hpp"
#include "fsdp/policy/prefetch.hpp"
#include "fsdp/policy/sharding.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp {

struct fingerprint_fact {
  std::string subject;
  std::string attribute;
  std::string value;
  friend bool operator==(const fingerprint_fact&, const fingerprint_fact&) = default;
};

class fingerprint {
 public:
  fingerprint& add(std::string subject, std::string attribute, std::string value);
  const std::vector<fingerprint_fact>& facts() const noexcept { return facts_; }

  /// Bytes that decode() reads back: every string preceded by its length (8 bytes, little-endian).
  std::string encode() const;
  /// The facts encoded in `bytes` (rank `rank`'s, for the message when they are not well formed).
  static fingerprint decode(std::string_view bytes, int rank);
  std::uint64_t digest() const;

  /// The first fact on which this fingerprint (rank `rank`'s) and `other` (rank `other_rank`'s) differ, as a
  /// sentence; nullopt when they are equal.
  std::optional<std::string> first_difference(const fingerprint& other, int rank, int other_rank) const;

 private:
  /// "subject: attribute", or the attribute alone for a fact without a subject.
  static std::string where(const fingerprint_fact& f);

  std::vector<fingerprint_fact> facts_;
};

namespace agree {

FSDP_DECL std::string in_quotes(std::string_view s);

FSDP_DECL std::string number(float v);

FSDP_DECL std::string list(const std::vector<std::string>& names);

FSDP_DECL std::string flag(bool b);

FSDP_DECL std::string describe(const init::rule& r);

FSDP_DECL std::string describe(const grad_division& d);

FSDP_DECL std::string describe(const std::map<std::string, std::vector<std::string>>& m);

}  // namespace agree

/// Everything that decides what a rank of a model does (see the file comment), in a fixed order.
FSDP_DECL fingerprint model_fingerprint(const ModelSpec& spec, const init::rule& default_init,
                                        const std::vector<std::string>& unit_names,
                                        const std::vector<FlatLayout>& layouts, const strategy_facts& strategy,
                                        const prefetch_facts& prefetch, const precision_facts& precision,
                                        const model_options& opt, const offload_facts& offload = {});

}  // namespace fsdp

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/agree/fingerprint.ipp"
#endif
