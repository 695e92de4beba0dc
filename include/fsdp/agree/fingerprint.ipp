#pragma once
// The fingerprint's definitions (fsdp/agree/fingerprint.hpp): included by that header, or compiled once by
// fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <charconv>
#include <type_traits>
#include <utility>
#include <variant>

#include "fsdp/agree/fingerprint.hpp"
#include "fsdp/core/bytes.hpp"
#include "fsdp/core/hash.hpp"
#include "fsdp/core/text.hpp"

namespace fsdp {

FSDP_DECL fingerprint& fingerprint::add(std::string subject, std::string attribute, std::string value) {
  facts_.push_back({std::move(subject), std::move(attribute), std::move(value)});
  return *this;
}

FSDP_DECL std::string fingerprint::encode() const {
  std::string out;
  for (const auto& f : facts_)
    for (const std::string* s : {&f.subject, &f.attribute, &f.value}) {
      detail::put_u64le(out, s->size());
      out += *s;
    }
  return out;
}

FSDP_DECL fingerprint fingerprint::decode(std::string_view bytes, int rank) {
  fingerprint fp;
  std::size_t at = 0;
  auto next = [&]() -> std::string {
    if (bytes.size() - at < 8)
      throw comm_error(detail::cat("the fingerprint received from rank ", rank, " is cut short at byte ", at, " of ",
                                   bytes.size()));
    const std::uint64_t n = detail::get_u64le(bytes, at);
    at += 8;
    if (n > bytes.size() - at)
      throw comm_error(detail::cat("the fingerprint received from rank ", rank, " names a string of ", n,
                                   " bytes at byte ", at - 8, " but only ", bytes.size() - at, " follow"));
    std::string s(bytes.substr(at, static_cast<std::size_t>(n)));
    at += static_cast<std::size_t>(n);
    return s;
  };
  while (at < bytes.size()) {
    std::string subject = next(), attribute = next(), value = next();
    fp.add(std::move(subject), std::move(attribute), std::move(value));
  }
  return fp;
}

FSDP_DECL std::uint64_t fingerprint::digest() const { return fnv1a64(encode()); }

FSDP_DECL std::optional<std::string> fingerprint::first_difference(const fingerprint& other, int rank,
                                                                 int other_rank) const {
  const std::size_t n = std::min(facts_.size(), other.facts_.size());
  for (std::size_t i = 0; i < n; ++i) {
    const fingerprint_fact &a = facts_[i], &b = other.facts_[i];
    if (a == b) continue;
    if (a.subject == b.subject && a.attribute == b.attribute)
      return detail::cat(where(a), " is ", a.value, " on rank ", rank, " but ", b.value, " on rank ", other_rank);
    return detail::cat(where(a), " is ", a.value, " on rank ", rank, " but rank ", other_rank, " has ", where(b), " ",
                       b.value, " in its place");
  }
  if (facts_.size() == other.facts_.size()) return std::nullopt;
  const bool mine_longer = facts_.size() > other.facts_.size();
  const fingerprint_fact& extra = mine_longer ? facts_[n] : other.facts_[n];
  return detail::cat(where(extra), " is ", extra.value, " on rank ", mine_longer ? rank : other_rank,
                     " but absent on rank ", mine_longer ? other_rank : rank);
}

FSDP_DECL std::string fingerprint::where(const fingerprint_fact& f) {
  return f.subject.empty() ? f.attribute : f.subject + ": " + f.attribute;
}

namespace agree {

FSDP_DECL std::string in_quotes(std::string_view s) { return detail::cat("'", s, "'"); }

FSDP_DECL std::string number(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

FSDP_DECL std::string list(const std::vector<std::string>& names) {
  std::string s = "[";
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + in_quotes(names[i]);
  return s + "]";
}

FSDP_DECL std::string flag(bool b) { return b ? "true" : "false"; }

FSDP_DECL std::string describe(const init::rule& r) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, init::normal>)
          return detail::cat("normal(mean=", number(x.mean), ", std=", number(x.std), ", seed=", x.seed, ")");
        else if constexpr (std::is_same_v<T, init::uniform>)
          return detail::cat("uniform(lo=", number(x.lo), ", hi=", number(x.hi), ", seed=", x.seed, ")");
        else
          return detail::cat("constant(", number(x.value), ")");
      },
      r);
}

FSDP_DECL std::string describe(const grad_division& d) {
  switch (d.how) {
    case grad_division::mode::average: return "average";
    case grad_division::mode::sum: return "sum";
    case grad_division::mode::pre_post: return detail::cat("pre_post(pre_factor=", number(d.pre_factor), ")");
  }
  return detail::cat("mode ", static_cast<int>(d.how));
}

FSDP_DECL std::string describe(const std::map<std::string, std::vector<std::string>>& m) {
  std::string s = "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    s += detail::cat(first ? "" : ", ", in_quotes(k), ": ", list(v));
    first = false;
  }
  return s + "}";
}

}  // namespace agree

FSDP_DECL fingerprint model_fingerprint(const ModelSpec& spec, const init::rule& default_init,
                                        const std::vector<std::string>& unit_names,
                                        const std::vector<FlatLayout>& layouts, const strategy_facts& strategy,
                                        const prefetch_facts& prefetch, const precision_facts& precision,
                                        const model_options& opt, const offload_facts& offload) {
  using namespace agree;
  fingerprint fp;
  // first: the spec's local shapes and the strategy's groups follow from it, so a rank that differs in it is named
  // for it and not for what it changed
  fp.add("model_options", "tensor_parallel", std::to_string(opt.tensor_parallel));
  fp.add("model_options", "expert_parallel", std::to_string(opt.expert_parallel));
  const auto& params = spec.params();
  fp.add("the spec", "the parameter count", std::to_string(params.size()));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    fp.add(detail::cat("parameter #", i), "the name", in_quotes(p.name));
    const std::string who = "parameter " + in_quotes(p.name);
    if (p.is_tied()) {
      fp.add(who, "tied to", in_quotes(p.tied_to));
      continue;
    }
    fp.add(who, "the shape", detail::shape_text(p.shape));
    fp.add(who, "the compute dtype", p.compute_dtype ? std::string(name_of(*p.compute_dtype)) : "the policy's");
    fp.add(who, "no_decay", flag(p.flags.no_decay));
    fp.add(who, "the init rule", p.init ? describe(*p.init) : "the model's default");
    fp.add(who, "the tensor placement", describe(p.tensor));
    fp.add(who, "experts", flag(p.experts));
  }
  fp.add("the model", "the default init rule", describe(default_init));
  fp.add("the policy", "the sharding strategy", std::string(strategy.name));
  fp.add("the policy", "shards_params", flag(strategy.shards_params));
  fp.add("the policy", "reshard_after_forward", flag(strategy.reshard_after_forward));
  fp.add("the policy", "keeps_params_gathered", flag(strategy.keeps_params_gathered));
  fp.add("the policy", "the shard group", std::to_string(strategy.shard_group));
  fp.add("the policy", "the replicate group", std::to_string(strategy.replicate_group));
  fp.add("the policy", "the prefetch",
         detail::cat("forward depth ", prefetch.forward_depth, ", backward depth ", prefetch.backward_depth,
                     prefetch.post_backward ? ", post-backward" : "", prefetch.by_schedule ? ", by schedule" : ""));
  fp.add("the policy", "the precision",
         detail::cat("compute ", name_of(precision.compute), ", master ", name_of(precision.master), ", reduce ",
                     name_of(precision.reduce),
                     precision.reduce_block ? detail::cat(" in blocks of ", precision.reduce_block) : std::string(),
                     ", gather ", name_of(precision.gather),
                     precision.gather_block ? detail::cat(" in blocks of ", precision.gather_block) : std::string()));
  fp.add("the policy", "the offload", describe(offload));
  fp.add("model_options", "layout.align", std::to_string(opt.layout.align));
  fp.add("model_options", "division", describe(opt.division));
  fp.add("model_options", "accumulation.micro_batches", std::to_string(opt.accumulation.micro_batches));
  fp.add("model_options", "accumulation.sync",
         opt.accumulation.sync == grad_sync::every_micro_batch ? "every_micro_batch" : "last_micro_batch");
  fp.add("model_options", "accumulation.keep_gathered", flag(opt.accumulation.keep_gathered));
  fp.add("model_options", "forward_order", list(opt.forward_order));
  fp.add("model_options", "record_order", flag(opt.record_order));
  std::string reshard = "{";
  for (const auto& [unit, on] : opt.reshard_after_forward)
    reshard += detail::cat(reshard.size() > 1 ? ", " : "", in_quotes(unit), ": ", flag(on));
  fp.add("model_options", "reshard_after_forward", reshard + "}");
  std::string offload_units = "{";
  for (const auto& [unit, parts] : opt.offload_units)
    offload_units += detail::cat(offload_units.size() > 1 ? ", " : "", in_quotes(unit), ": ", describe(parts));
  fp.add("model_options", "offload_units", offload_units + "}");
  fp.add("model_options", "gather_slots", std::to_string(opt.gather_slots));
  fp.add("model_options", "grad_slots", std::to_string(opt.grad_slots));
  fp.add("model_options", "early_grads", list(opt.early_grads));
  fp.add("model_options", "check_collectives", flag(opt.check_collectives));
  fp.add("model_options", "prefetch.forward", describe(opt.prefetch.forward));
  fp.add("model_options", "prefetch.backward", describe(opt.prefetch.backward));
  fp.add("the wrapping", "the unit count", std::to_string(layouts.size()));
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    const std::string& name = u < unit_names.size() ? unit_names[u] : std::string("?");
    fp.add(detail::cat("unit #", u), "the name", in_quotes(name));
    std::vector<std::string> members;
    for (const flat_entry& e : layouts[u].entries()) members.push_back(e.name);
    const std::string who = "unit " + in_quotes(name);
    fp.add(who, "the parameters", list(members));
    fp.add(who, "the padded elements", std::to_string(layouts[u].padded_numel()));
    fp.add(who, "the shard elements", std::to_string(layouts[u].shard_numel()));
  }
  return fp;
}

}  // namespace fsdp
