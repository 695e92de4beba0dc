#pragma once
// Offload policies: which of a rank's persistent buffers live in (pinned) host memory instead of the device's.
// Host memory is usually several times the GPU's; offloading trades link (PCIe) time for device memory.
//
//   fsdp::offload::none                                   everything on the device (the default)
//   fsdp::offload::cpu<fsdp::offload::params>             fp32 master shards on the host
//   fsdp::offload::cpu<fsdp::offload::grads>              fp32 gradient shards on the host
//   fsdp::offload::cpu<fsdp::offload::optimizer_state>    optimizer state on the host
//   fsdp::offload::cpu<params | grads | optimizer_state>  all three: the optimizer steps on the host
//
// What each part does to a step (fsdp/detail/exec/unit_executor.hpp carries it out, fsdp/memory/cost.hpp costs it):
//   params           a gather first copies the unit's master shard to the device on the upload stream, into one of
//                    two upload slots (device memory, "sharded params"), then casts and all-gathers from there as
//                    usual; the copy is issued with the gather, so the prefetch policy and the gather slots bound it.
//                    Units are then gathered in every strategy (no_shard in fp32 too: compute reads device memory).
//   grads            each reduced gradient shard is copied to the host on the download stream as its reduction
//                    completes (into a host slot) and added into the host gradient shard on the host, by a host
//                    function on the host_work stream (no copy waits behind the CPU).
//   optimizer_state  the optimizer's state buffers are host memory.
// With all three on the host the optimizer steps on the host, unit by unit, on the host_work stream (a host
// function in stream order: the same per-element code as the device kernels, so the same bits), and a unit's
// next gather waits only for that unit's update: the next step's forward overlaps the rest of the step. With only
// some parts on the host the optimizer steps on the device, unit by unit: the host-resident parts are copied into
// staging slots on the device (two of each part), stepped there, and the master and state copied back.
#include <concepts>
#include <string>
#include <string_view>

#include "fsdp/core/config.hpp"

namespace fsdp {

/// An offload policy's choices as values, for the code that is not a template (costs, the planner, the executor).
struct offload_facts {
  bool params = false;           ///< fp32 master shards in host memory
  bool grads = false;            ///< fp32 gradient shards in host memory
  bool optimizer_state = false;  ///< optimizer state in host memory
  constexpr bool any() const noexcept { return params || grads || optimizer_state; }
  /// The optimizer steps on the host: everything it reads and writes is there.
  constexpr bool host_step() const noexcept { return params && grads && optimizer_state; }
  friend constexpr bool operator==(const offload_facts&, const offload_facts&) = default;
};

/// "none", or the parts on the host joined with '+' ("params+grads+optimizer_state").
inline std::string describe(const offload_facts& f);

struct offload_tag {};

/// An offload policy opts in with `using offload_concept = fsdp::offload_tag;` and states its facts.
template <class O>
concept OffloadPolicy = requires {
  typename O::offload_concept;
  requires std::same_as<typename O::offload_concept, offload_tag>;
  { O::facts } -> std::convertible_to<offload_facts>;
};

template <OffloadPolicy O>
constexpr offload_facts facts_of_offload() noexcept {
  return O::facts;
}

namespace offload {

/// The parts a cpu<> policy moves to the host; combine them with |.
enum class part : unsigned { params = 1, grads = 2, optimizer_state = 4 };
inline constexpr part params = part::params;
inline constexpr part grads = part::grads;
inline constexpr part optimizer_state = part::optimizer_state;
constexpr part operator|(part a, part b) noexcept {
  return static_cast<part>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
constexpr bool has(part set, part p) noexcept { return (static_cast<unsigned>(set) & static_cast<unsigned>(p)) != 0; }

/// Everything on the device.
struct none {
  using offload_concept = offload_tag;
  static constexpr offload_facts facts{};
};

/// The named parts in pinned host memory.
template <part Parts>
struct cpu {
  static_assert((static_cast<unsigned>(Parts) & ~7u) == 0 && static_cast<unsigned>(Parts) != 0,
                "fsdp::offload::cpu: name the parts to offload: fsdp::offload::params, grads, optimizer_state, "
                "joined with |");
  using offload_concept = offload_tag;
  static constexpr offload_facts facts{has(Parts, params), has(Parts, grads), has(Parts, optimizer_state)};
};

/// Master shards, gradient shards and optimizer state on the host; the optimizer steps there.
using all = cpu<params | grads | optimizer_state>;

}  // namespace offload

inline std::string describe(const offload_facts& f) {
  if (!f.any()) return "none";
  std::string s;
  auto add = [&](bool on, std::string_view what) {
    if (!on) return;
    if (!s.empty()) s += "+";
    s += what;
  };
  add(f.params, "params");
  add(f.grads, "grads");
  add(f.optimizer_state, "optimizer_state");
  return s;
}

}  // namespace fsdp
