#pragma once
// Your optimizer, as one per-element rule: what a parameter element's update does to its fp32 master value, given
// its fp32 gradient and S fp32 state values of its own. The library owns the rest, as for its own optimizers (which
// are rules too: optim/sgd.hpp, adamw.hpp, lion.hpp): the state buffers (named, one value per element, laid out as
// the master shard, zero at the start), their place in the memory plan and the pool's reservation, the gradient
// inspection (clipping, non-finite skips, loss scaling: grad::options), where the update runs (on the device, at
// staged copies of offloaded parts, or on the host: the step program's choice), checkpoints (the states saved and
// loaded by name, resharded to another world size) and the no_decay mask.
//
//   struct my_rule {                                     // trivially copyable: it travels as a kernel parameter
//     static constexpr int states = 2;                   // S, 0 to 6
//     float lr, beta;                                    // whatever the step needs
//     FSDP_HD void operator()(float& p, float g, float* s, bool decay) const {...}  // s[0..S) in place
//   };
//   fsdp::optim::elementwise opt(model, "my_rule", {"m", "v"});   // one name per state, for checkpoints
//   opt.step([&](long t) { return my_rule{lr_at(t), 0.9f}; });    // t: this update's number, from 1
//
// or, made on the device each step from the update count it keeps (a step captured and replayed computes each
// replay's own: fsdp::step_graph), a StepRule: a trivially copyable description with FSDP_HD at(t):
//
//   struct my_rule_at { float peak; fsdp::optim::lr_schedule s; FSDP_HD my_rule at(long t) const {...} };
//   opt.step(my_rule_at{3e-4f, {100, 5000, 0.1f}});
//
// The rule sees g with the step's gradient scale already applied (clipping, loss-scale removal: g * scale, one
// rounding, and only when the scale is not 1); `decay` is false for the elements of no_decay parameters. Write it
// with fsdp::rn (fsdp/core/rounding.hpp: one rounding per operation, never contracted into a fused multiply-add)
// and it gives the same bits on the host backend and in a CUDA kernel; mark it FSDP_HD and include
// <fsdp/fsdp.cuh> in a .cu file for the CUDA backend. A step the inspection skips leaves parameters and states
// bit-unchanged and does not count (t stays).
#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/rounding.hpp"
#include "fsdp/grad/inspect.hpp"
#include "fsdp/kernels/array_function.hpp"
#include "fsdp/model_access.hpp"
#include "fsdp/optim/detail/decay_mask.hpp"
#include "fsdp/optim/detail/shard_optimizer.hpp"
#include "fsdp/optim/detail/step_block.hpp"
#include "fsdp/optim/schedule.hpp"

namespace fsdp::optim {

/// An optimizer's per-element rule (see the top of this header).
template <class R>
concept ElementRule = std::is_trivially_copyable_v<R> && requires(const R& r, float& p, float g, float* s, bool decay) {
  { R::states } -> std::convertible_to<int>;
  requires R::states >= 0 && R::states <= 6;
  r(p, g, s, decay);
};

/// A rule made each step from its update number, on the device (see the top of this header): trivially copyable
/// (it travels as a kernel parameter), with FSDP_HD at(t) giving update t's ElementRule, at most 240 bytes.
template <class S>
concept StepRule = std::is_trivially_copyable_v<S> && requires(const S& s, long t) {
  { s.at(t) } -> ElementRule;
};

namespace detail {

/// A rule whose coefficients `c` hold a peak learning rate `c.lr`, scheduled over the updates (sgd's and lion's step
/// rule).
template <class R>
struct lr_scheduled {
  R base;
  lr_schedule schedule;
  FSDP_HD R at(long t) const {
    R r = base;
    r.c.lr = schedule.at(base.c.lr, t);
    return r;
  }
};

/// A learning rate as every built-in optimizer takes it, at construction and in set_lr: finite and >= 0, or a
/// usage_error naming the optimizer.
inline float checked_lr(const char* optimizer, float lr) {
  if (!(lr >= 0.0f) || !std::isfinite(lr))
    fsdp::detail::fail_usage(optimizer, ": lr must be finite and >= 0, got ", lr);
  return lr;
}

/// A rule over one shard piece, as a kernels::ArrayFunction over p, g and the S states (128-bit accesses in a
/// kernel). A null state array is neither read nor written and reads as 0. `grad_scale` multiplies g first.
template <ElementRule R>
struct rule_elements {
  static constexpr int S = R::states;
  float* p;
  const float* g;
  float* s[S > 0 ? S : 1];
  R rule;
  decay_mask mask;
  float grad_scale = 1.0f;
  /// The gradient inspection's decision, where this update runs (null: grad_scale): a skipped step changes
  /// nothing; otherwise its gradient scale replaces grad_scale (fsdp/grad/inspect.hpp).
  const grad::verdict* decided = nullptr;
  /// The rule the step made on the device (fsdp/optim/detail/step_block.hpp), read in place of `rule`; null: `rule`.
  const R* made = nullptr;
  static constexpr int array_count = 2 + S;
  FSDP_HD kernels::fp32_arrays<array_count> arrays() const {
    kernels::fp32_arrays<array_count> a{};
    a.at[0] = p;
    a.at[1] = const_cast<float*>(g);
    for (int k = 0; k < S; ++k) a.at[2 + k] = s[k];
    a.writes = ((1u << array_count) - 1u) & ~2u;  // all but the gradient
    return a;
  }
  FSDP_HD void update(float* x, std::int64_t i) const {
    float scale = grad_scale;
    if (decided) {
      if (decided->skipped) return;
      scale = decided->grad_scale;
    }
    const float g_scaled = scale != 1.0f ? rn::mul(x[1], scale) : x[1];
    // Two calls, not one through a reference to either rule: a reference to the kernel's parameter gives the kernel
    // a stack frame, and a copy of the rule holds it in registers (AdamW's update at 44, over the 40 that keep 75%
    // occupancy: tools/sass-check).
    if (made)
      (*made)(x[0], g_scaled, x + 2, !mask.no_decay(i));
    else
      rule(x[0], g_scaled, x + 2, !mask.no_decay(i));
  }
  FSDP_HD void operator()(std::int64_t i) const { kernels::apply_at(*this, i); }
};

}  // namespace detail

/// An optimizer over the local shards whose update is an ElementRule; the library's sgd, adamw and lion are
/// this with their own rules.
template <class ModelT>
class elementwise : public detail::shard_optimizer<ModelT> {
  using base = detail::shard_optimizer<ModelT>;

 public:
  /// `name` is what a checkpoint records and a load checks; `state_names` name the rule's states in order (one
  /// per state: a rule of S states needs S names), each a zeroed fp32 buffer per unit. usage_error for an empty
  /// name, an empty or repeated state name.
  elementwise(ModelT& model, std::string name, std::vector<std::string> state_names, grad::options g = {})
      : base(model, checked_name(std::move(name), state_names), state_names, g) {}

  /// One step over every local shard with the rule `s.at(t)` for update number t (from 1: the bias corrections and
  /// schedules need it), made on the device by the step's first kernel from the update count the device keeps
  /// (fsdp/optim/detail/step_block.hpp): a step issued once and replayed (a CUDA graph) makes each replay's own
  /// rule. usage_error, before any update, when the rule's state count is not the number of names given at
  /// construction. Returns what the step did with the gradients (inspection, skip, scale), learned without waiting
  /// for the step (grad::step_report).
  template <StepRule S>
  grad::step_report step(const S& s) {
    using R = std::remove_cvref_t<decltype(s.at(long{1}))>;
    check_states<R>();
    static_assert(sizeof(R) <= detail::step_rule_bytes && alignof(R) <= 16,
                  "fsdp::optim::elementwise::step: a step rule's rule must fit the step block's 240 bytes");
    auto& be = this->model_.backend();
    detail::step_block* block = this->block();
    be.for_each(1, detail::make_rule<S, R>{s, block}, be.compute_stream());
    // A unit stepped on the host (all its parts offloaded) reads the same rule, made on the host from the host's
    // count of updates.
    const R on_host = s.at(this->steps() + 1);
    const R* made = reinterpret_cast<const R*>(block->rule);
    return this->run_step([&](auto& unit, const detail::shard_piece& piece, const auto& scale, auto& site) {
      run_piece(unit, piece, scale, site, on_host, site.on_host() ? nullptr : made);
    });
  }

  /// One step over every local shard: make(t) gives the rule for update number t, on the host. A step issued once
  /// and replayed would replay update t's rule: give a StepRule where steps are captured. Otherwise as step(s).
  template <class Make>
    requires(!StepRule<std::remove_cvref_t<Make>>)
  grad::step_report step(Make&& make) {
    using R = std::remove_cvref_t<decltype(make(long{1}))>;
    static_assert(ElementRule<R>, "fsdp::optim::elementwise::step: make(t) must return an ElementRule (see "
                                  "fsdp/optim/elementwise.hpp): trivially copyable, with static constexpr int states "
                                  "and void operator()(float& p, float g, float* s, bool decay) const");
    check_states<R>();
    const R rule = make(this->steps() + 1);
    return this->run_step([&](auto& unit, const detail::shard_piece& piece, const auto& scale, auto& site) {
      run_piece(unit, piece, scale, site, rule, static_cast<const R*>(nullptr));
    });
  }

 private:
  template <class R>
  void check_states() const {
    if (R::states != this->states_per_element())
      fsdp::detail::fail_usage("optimizer '", this->name(), "': its rule keeps ", R::states,
                               " state value(s) per element, but it was made with ", this->states_per_element(),
                               " state name(s)", names_text(this->state_names()), "; give one name per state");
  }
  /// One piece's update at `site`: `rule`, or the one at `made` (device memory) where that is given.
  template <class Unit, class Scale, class Site, class R>
  void run_piece(Unit& unit, const detail::shard_piece& piece, const Scale& scale, Site& site, const R& rule,
                 const R* made) {
    const auto off = piece.offset;
    detail::rule_elements<R> f{};
    f.p = site.at(model_access::master_shard(unit) + off);
    f.g = site.at(model_access::grad_shard(unit) + off);
    for (int k = 0; k < R::states; ++k) f.s[k] = site.at(this->state(unit.index(), k) + off);
    f.rule = rule;
    f.made = made;
    f.mask = piece.mask;
    f.grad_scale = scale.value;
    f.decided = site.on_host() ? scale.host : scale.device;
    site.run(piece.numel, f);
  }
  static std::string names_text(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? " (" : ", ") + n;
    return s.empty() ? s : s + ")";
  }
  static std::string checked_name(std::string name, const std::vector<std::string>& states) {
    if (name.empty())
      fsdp::detail::fail_usage("optim::elementwise: the optimizer's name is empty (checkpoints record it)");
    for (std::size_t k = 0; k < states.size(); ++k) {
      if (states[k].empty())
        fsdp::detail::fail_usage("optimizer '", name, "': state ", k,
                                 " has an empty name (checkpoints save states by name)");
      for (std::size_t j = 0; j < k; ++j)
        if (states[j] == states[k])
          fsdp::detail::fail_usage("optimizer '", name, "': state name '", states[k], "' is given twice (states ", j,
                                   " and ", k, ")");
    }
    return name;
  }
};

/// Over the model's core (fsdp::model_core), as the library's optimizers are.
template <class ModelT>
elementwise(ModelT&, std::string, std::vector<std::string>, grad::options = {})
    -> elementwise<detail::core_of_t<ModelT>>;

}  // namespace fsdp::optim
