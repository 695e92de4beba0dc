#pragma once
// From names to types: a trainer that takes its sharding strategy, precision or prefetch from a flag or a config
// names the alternatives it supports once, and select() calls its generic lambda with the one named:
//
//   return fsdp::select("--precision", precision_flag, [&](auto p) {
//     using Precision = typename decltype(p)::type;
//     return fsdp::select("--strategy", strategy_flag, [&](auto s) {
//       return train<fsdp::policy<typename decltype(s)::type, fsdp::prefetch::next, Precision>>(...);
//     }, fsdp::by_name<fsdp::sharding::full_shard, fsdp::sharding::shard_grad_op, fsdp::sharding::no_shard>());
//   }, fsdp::named<fsdp::precision::full>{"fp32"}, fsdp::named<fsdp::precision::mixed<fsdp::bfloat16>>{"bf16"});
//
// Each alternative is one instantiation of the lambda: list only the ones the trainer supports (each adds compile
// time). A name that is not among them is a usage_error that names what was being chosen, the name given and the
// names known: "fsdp: --strategy 'zero3' is not one of: full_shard, shard_grad_op, no_shard".
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"

namespace fsdp {

/// One alternative of select(): the name that chooses it, and its type (named<T>::type).
template <class T>
struct named {
  using type = T;
  std::string_view name;
};

/// The alternatives T..., each named by its own T::name (the sharding strategies' "full_shard", "shard_grad_op",
/// "no_shard", "hybrid_shard", "hybrid_shard_zero2"), for select's last argument.
template <class... T>
  requires(sizeof...(T) > 0 && (std::is_convertible_v<decltype(T::name), std::string_view> && ...))
constexpr std::tuple<named<T>...> by_name() {
  return {named<T>{T::name}...};
}

namespace detail {
template <class... T>
std::string known(const named<T>&... alts) {
  std::string out;
  ((out += out.empty() ? "" : ", ", out += alts.name), ...);
  return out;
}

template <class F, class T, class... Rest>
decltype(auto) pick(std::string_view what, std::string_view name, F& fn, const std::string& known,
                    const named<T>& first, const named<Rest>&... rest) {
  if (first.name == name) return fn(named<T>{first.name});
  if constexpr (sizeof...(Rest) == 0)
    detail::fail_usage(what, " '", detail::printable(name), "' is not one of: ", known);
  else
    return pick(what, name, fn, known, rest...);
}
}  // namespace detail

/// Calls fn(named<T>{name}) for the alternative named `name` and returns what it returns (every alternative's call
/// must return the same type). usage_error, naming `what` (the flag or setting), `name` and the known names, when
/// none is named so; two alternatives with the same name: the first is chosen.
template <class F, class... T>
  requires(sizeof...(T) > 0)
decltype(auto) select(std::string_view what, std::string_view name, F&& fn, const named<T>&... alternatives) {
  return detail::pick(what, name, fn, detail::known(alternatives...), alternatives...);
}
/// The same with the alternatives as a tuple (by_name<...>()).
template <class F, class... T>
  requires(sizeof...(T) > 0)
decltype(auto) select(std::string_view what, std::string_view name, F&& fn,
                      const std::tuple<named<T>...>& alternatives) {
  return std::apply([&](const auto&... a) -> decltype(auto) { return select(what, name, fn, a...); }, alternatives);
}

}  // namespace fsdp
