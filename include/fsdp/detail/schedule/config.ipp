#pragma once
// The schedule configuration's definitions (fsdp/detail/schedule/config.hpp): included by that header, or compiled once
// by fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "fsdp/core/problems.hpp"
#include "fsdp/detail/schedule/config.hpp"

namespace fsdp::detail::sched {

FSDP_DECL config build_config(const unit_index& units, const strategy_facts& strategy, const prefetch_facts& prefetch,
                              const precision_facts& precision, const model_options& opt, const offload_facts& offload,
                              problems& p) {
  const std::size_t n = units.size();
  config c;
  c.gathers = plan::units_gather(strategy.shards_params, precision, offload);
  c.reshard_after_forward.assign(n, strategy.reshard_after_forward);
  c.reshard_named.assign(n, false);
  for (const auto& [name, value] : opt.reshard_after_forward) {
    const auto u = units.find(name);
    if (!u)
      p.add("model_options::reshard_after_forward names '", name, "', which is not a unit (units: ", units.list(), ")");
    else if (!strategy.shards_params)
      p.add("model_options::reshard_after_forward is set for unit '", name, "', but ", strategy.name,
            " never gathers or reshards parameters");
    else {
      c.reshard_after_forward[*u] = value;
      c.reshard_named[*u] = true;
    }
  }
  c.forward_depth = prefetch.forward_depth;
  c.backward_depth = prefetch.backward_depth;
  c.post_backward = prefetch.post_backward;
  c.by_schedule = prefetch.by_schedule;
  if (prefetch.by_schedule) {
    if (opt.prefetch.empty())
      p.add("prefetch::explicit_schedule needs model_options::prefetch to name the units to prefetch");
    c.forward_schedule.resize(n);
    c.backward_schedule.resize(n);
    auto fill = [&](const std::map<std::string, std::vector<std::string>>& from,
                    std::vector<std::vector<std::size_t>>& to, const char* which) {
      for (const auto& [at, list] : from) {
        const auto a = units.find(at);
        if (!a) {
          p.add("model_options::prefetch.", which, "['", at, "']: no unit named '", at, "' (units: ", units.list(),
                ")");
          continue;
        }
        for (const auto& target : list) {
          const auto t = units.find(target);
          if (!t)
            p.add("model_options::prefetch.", which, "['", at, "'] names '", target,
                  "', which is not a unit (units: ", units.list(), ")");
          else
            to[*a].push_back(*t);
        }
      }
    };
    fill(opt.prefetch.forward, c.forward_schedule, "forward");
    fill(opt.prefetch.backward, c.backward_schedule, "backward");
  } else if (!opt.prefetch.empty()) {
    p.add(
        "model_options::prefetch names units to prefetch, but the policy's prefetch is not "
        "prefetch::explicit_schedule (it would be ignored)");
  }
  c.early_grad.assign(n, false);
  for (const auto& name : opt.early_grads) {
    const auto u = units.find(name);
    if (!u)
      p.add("model_options::early_grads names '", name, "', which is not a unit (units: ", units.list(), ")");
    else
      c.early_grad[*u] = true;
  }
  c.gather_slots = opt.gather_slots;
  if (c.gather_slots < 0) p.add("model_options::gather_slots must be >= 0 (0 = no limit), got ", c.gather_slots);
  c.grad_slots = opt.grad_slots;
  if (c.grad_slots < 1) p.add("model_options::grad_slots must be >= 1, got ", c.grad_slots);
  const accumulation_options& a = opt.accumulation;
  if (a.micro_batches < 1) p.add("model_options::accumulation.micro_batches must be >= 1, got ", a.micro_batches);
  c.micro_batches = a.micro_batches;
  c.sync_each_micro_batch = a.sync == grad_sync::every_micro_batch;
  c.keep_gathered = a.keep_gathered;
  c.keep_between_steps = c.gathers && strategy.keeps_params_gathered;
  if (c.keep_between_steps) {
    for (const auto& [name, value] : opt.reshard_after_forward)
      if (value && units.find(name))
        p.add("model_options::reshard_after_forward releases unit '", name, "' after its forward, but ", strategy.name,
              " keeps every unit's parameters gathered between steps; leave the unit out of reshard_after_forward, "
              "or use shard_grad_op");
    if (c.gather_slots > 0 && std::size_t(c.gather_slots) < n)
      p.add("model_options::gather_slots is ", c.gather_slots, ", but ", strategy.name, " keeps all ", n,
            " units' parameters gathered between steps; set it to 0 (no limit) or at least ", n);
  }
  c.offload.assign(n, offload);
  for (const auto& [name, facts] : opt.offload_units) {
    const auto u = units.find(name);
    if (!u)
      p.add("model_options::offload_units names '", name, "', which is not a unit (units: ", units.list(), ")");
    else if (facts.params != offload.params && !plan::units_gather(strategy.shards_params, precision))
      p.add("model_options::offload_units sets params for unit '", name, "' unlike the policy, but under ",
            strategy.name,
            " in fp32 whether a unit's master serves compute or is gathered follows the policy's "
            "params, for every unit alike; set params in the policy only, or shard the parameters");
    else
      c.offload[*u] = facts;
  }
  return c;
}

FSDP_DECL config build_config(const unit_index& units, const strategy_facts& strategy, const prefetch_facts& prefetch,
                              const precision_facts& precision, const model_options& opt,
                              const offload_facts& offload) {
  problems p;
  config c = build_config(units, strategy, prefetch, precision, opt, offload, p);
  p.require();
  return c;
}

}  // namespace fsdp::detail::sched
