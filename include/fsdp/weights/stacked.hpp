#pragma once
// A trainer's stacked [L, ...] parameter buffers mapped to units with one declaration.
//
// A C trainer keeps one buffer per kind of layer tensor, [L, ...] row-major, as `float*` members of a struct
// (llm.c's ParameterTensors: qkvw [L, 3C, C], ...), and reaches layer l as `params.qkvw + l * 3*C*C`.
// fsdp::weights::stacked<T> declares those members once (name, member, one layer's shape) and gives from that one
// declaration what a port otherwise writes by hand for each member:
//
//   add_to(spec)            the parameters "<prefix><l>.<name>" of every layer, layer by layer, each layer's in the
//                           declaration's order, with each kind's options
//   unit_of(param)          the unit "<prefix><l>" of such a parameter, "" for any other name (for
//                           wrap::by_function: one unit per layer)
//   layer_of(unit)          l for the unit "<prefix><l>", -1 for any other
//   slice(buffers, param)   layer l's slice of the trainer's stacked buffer of that parameter, {} for a parameter
//                           that is not the stack's: a weights::load source and a weights::store sink
//   params(unit), grads(unit)
//                           a T whose declared members point at that layer's gathered parameters (or gradient
//                           buffers) in the unit, every other member null: the layer's code reads `lp.qkvw` where it
//                           read `params.qkvw + l * 3*C*C`. Valid while the unit's views are (param() and grad()).
//
// Misuse is a usage_error naming the declaration's part at fault: a kind without a name, two kinds of one name or
// one member, a shape with a dimension < 1, no layers; a null buffer in slice(); params() of a unit that
// is not one of the stack's.
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/weights/weights.hpp"

namespace fsdp::weights {

template <class T>
class stacked {
 public:
  static_assert(std::is_default_constructible_v<T>, "stacked<T>: T is the trainer's struct of float* buffers");

  /// One kind of layer tensor: its name within a layer ("qkvw"), the trainer's stacked buffer, one layer's shape,
  /// and the options of each layer's parameter (flags such as no_decay, an initializer: ModelSpec::add's).
  struct kind {
    using field = float* T::*;  // an alias: nvcc's host code spells the member pointer in parentheses otherwise
    std::string name;
    field member = nullptr;
    std::vector<std::int64_t> shape;
    param_options options{};
  };

  /// `layers` layers named "<prefix><l>" (prefix "h." gives "h.0" .. "h.<layers-1>").
  stacked(std::string prefix, int layers, std::vector<kind> kinds)
      : prefix_(std::move(prefix)), layers_(layers), kinds_(std::move(kinds)) {
    if (prefix_.empty()) detail::fail_usage("stacked: the unit prefix is empty (\"h.\" names units h.0, h.1, ...)");
    if (layers_ < 1) detail::fail_usage("stacked '", prefix_, "': ", layers_, " layers; at least 1");
    if (kinds_.empty()) detail::fail_usage("stacked '", prefix_, "': no tensor kinds declared");
    for (std::size_t i = 0; i < kinds_.size(); ++i) {
      const kind& k = kinds_[i];
      if (k.name.empty()) detail::fail_usage("stacked '", prefix_, "': kind ", i, " has no name");
      if (k.member == nullptr) detail::fail_usage("stacked '", prefix_, "': kind '", k.name, "' names no member");
      if (k.shape.empty()) detail::fail_usage("stacked '", prefix_, "': kind '", k.name, "' has an empty shape");
      for (std::int64_t d : k.shape)
        if (d < 1)
          detail::fail_usage("stacked '", prefix_, "': kind '", k.name, "' has a dimension of ", d,
                             " in its layer shape; each is at least 1");
      for (std::size_t j = 0; j < i; ++j) {
        if (kinds_[j].name == k.name) detail::fail_usage("stacked '", prefix_, "': two kinds named '", k.name, "'");
        if (kinds_[j].member == k.member)
          detail::fail_usage("stacked '", prefix_, "': kinds '", kinds_[j].name, "' and '", k.name,
                             "' name the same member");
      }
    }
  }

  int layers() const noexcept { return layers_; }
  const std::string& prefix() const noexcept { return prefix_; }

  /// The unit of layer l: "<prefix><l>".
  std::string unit(int l) const { return prefix_ + std::to_string(l); }

  /// Every layer's parameters into `spec`, layer by layer.
  void add_to(ModelSpec& spec) const {
    for (int l = 0; l < layers_; ++l)
      for (const kind& k : kinds_) spec.add(unit(l) + "." + k.name, k.shape, k.options);
  }

  std::string unit_of(std::string_view param) const {
    const place p = parse(param);
    return p.k ? unit(p.layer) : std::string();
  }

  int layer_of(std::string_view unit_name) const {
    const std::string_view rest = after_prefix(unit_name);
    if (rest.data() == nullptr) return -1;
    return layer_in(rest, rest.size());
  }

  /// Layer l's slice of `buffers`' stacked tensor of `param`; {} when `param` is not one of the stack's.
  target slice(const T& buffers, std::string_view param) const {
    const place p = parse(param);
    if (!p.k) return {};
    float* stack = buffers.*(p.k->member);
    if (stack == nullptr)
      detail::fail_usage("stacked '", prefix_, "': the trainer's buffer of '", p.k->name, "' is null (asked for '",
                         param, "')");
    const std::int64_t n = per_layer(*p.k);
    return {stack + static_cast<std::int64_t>(p.layer) * n, n};
  }

  /// The views of unit u's layer: its gathered parameters.
  template <class Unit>
  T params(Unit& u) const {
    return views(u, [&](const std::string& name) { return u.param(name).data(); });
  }
  /// ... and its gradient buffers (inside the unit's backward).
  template <class Unit>
  T grads(Unit& u) const {
    return views(u, [&](const std::string& name) { return u.grad(name).data(); });
  }

 private:
  struct place {
    int layer = -1;
    const kind* k = nullptr;
  };

  static std::int64_t per_layer(const kind& k) {
    std::int64_t n = 1;
    for (std::int64_t d : k.shape) n *= d;
    return n;
  }

  /// What follows the prefix in `s` (a null view when `s` does not start with it).
  std::string_view after_prefix(std::string_view s) const {
    if (s.size() <= prefix_.size() || s.substr(0, prefix_.size()) != prefix_) return {};
    return s.substr(prefix_.size());
  }
  /// The layer number in rest[0, end): digits only, no leading zero, < layers; -1 otherwise.
  int layer_in(std::string_view rest, std::size_t end) const {
    if (end == 0 || end > rest.size() || (rest[0] == '0' && end > 1)) return -1;
    int l = -1;
    const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + end, l);
    if (ec != std::errc() || ptr != rest.data() + end || l < 0 || l >= layers_) return -1;
    return l;
  }
  place parse(std::string_view param) const {
    const std::string_view rest = after_prefix(param);
    if (rest.data() == nullptr) return {};
    const std::size_t dot = rest.find('.');
    if (dot == std::string_view::npos) return {};
    const int l = layer_in(rest, dot);
    if (l < 0) return {};
    const std::string_view name = rest.substr(dot + 1);
    for (const kind& k : kinds_)
      if (k.name == name) return {l, &k};
    return {};
  }

  template <class Unit, class View>
  T views(Unit& u, View&& view) const {
    const int l = layer_of(u.name());
    if (l < 0)
      detail::fail_usage("stacked '", prefix_, "': unit '", u.name(), "' is not one of the stack's units (", unit(0),
                         " .. ", unit(layers_ - 1), ")");
    T out{};
    for (const kind& k : kinds_) {
      auto* p = view(unit(l) + "." + k.name);
      static_assert(std::is_same_v<decltype(p), float*>,
                    "stacked<T>: views of a unit whose compute dtype is fp32 (T's members are float*)");
      out.*(k.member) = p;
    }
    return out;
  }

  std::string prefix_;
  int layers_;
  std::vector<kind> kinds_;
};

}  // namespace fsdp::weights
