#pragma once
// What a model's state beyond its master shards is to the code that moves it: an optimizer's per-element state
// buffers, laid out like each unit's master shard, and its update count. Checkpoints save and load it
// (fsdp/checkpoint), an in-memory reshard moves it (fsdp/elastic/reshard.hpp).
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::optim {

/// An optimizer whose state can be saved, loaded and moved (fsdp::optim::sgd, adamw and lion have it): its name,
/// its state buffers' names, unit u's state k (a master shard's elements), and its update count (and that count
/// without a last step whose updates never ran: fsdp/elastic).
template <class O>
concept StatefulOptimizer = requires(O& o, const O& co, std::size_t u, int k, long n) {
  { co.name() } -> std::convertible_to<std::string_view>;
  { co.state_names() } -> std::convertible_to<const std::vector<std::string>&>;
  { co.steps() } -> std::convertible_to<long>;
  { co.steps_if_last_skipped() } -> std::convertible_to<long>;
  { co.state(u, k) } -> std::same_as<const float*>;
  { o.state(u, k) } -> std::same_as<float*>;
  o.restore_steps(n);
};

}  // namespace fsdp::optim
