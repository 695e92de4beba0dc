#pragma once
// comm::run_nccl_threads's decisions (nccl_threads.cuh), made over an "API" as nccl_core's are, so that the host
// tests (tests/comm/launch_test.cc) run them against a fake: which device each rank is on, whether ranks may
// share a device with the NCCL loaded (nccl_versions.hpp), one unique id made once and handed to every rank in
// memory, each rank's communicator made on its own thread (NCCL's set-up is collective: every rank's must be under
// way at once) and ended there after the rank's function, the ranks run as run_local runs them
// (thread_ranks.hpp). Host-only.
//
// What Api provides (nccl_threads.cuh's nccl_world_api is the production one):
//   int version()          ncclGetVersion: the loaded library's NCCL_VERSION_CODE
//   visible_devices devices()  how many CUDA devices are visible, and why none where none is
//                              (cuda::device_status: cudaGetDeviceCount)
//   unique_id()            ncclGetUniqueId, once per world (throws when it fails)
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/detail/nccl_versions.hpp"
#include "fsdp/comm/detail/thread_ranks.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

/// The CUDA devices a process sees: how many, and why none where there is none.
struct visible_devices {
  int count = 0;
  std::string reason;  ///< empty when count > 0
};

/// The device of each of `world` thread ranks: devices[r % devices.size()], or r % the visible count when `devices`
/// is empty (one rank a device while there are enough). A usage_error for a world under 1, no visible device (with
/// the reason), or a device outside [0, count).
inline std::vector<int> thread_rank_devices(int world, const std::vector<int>& devices, const visible_devices& seen) {
  const int visible = seen.count;
  if (world < 1) fsdp::detail::fail_usage("comm::run_nccl_threads: a world of ", world, " ranks; at least 1");
  if (visible < 1) fsdp::detail::fail_usage("comm::run_nccl_threads: no CUDA device is visible (", seen.reason, ")");
  for (std::size_t i = 0; i < devices.size(); ++i)
    if (devices[i] < 0 || devices[i] >= visible)
      fsdp::detail::fail_usage("comm::run_nccl_threads: devices[", i, "] is ", devices[i],
                               ", but the visible devices are 0 to ", visible - 1);
  std::vector<int> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    out[static_cast<std::size_t>(r)] =
        devices.empty() ? r % visible : devices[static_cast<std::size_t>(r) % devices.size()];
  return out;
}

/// The first two ranks on one device (by the first rank, then the second), or {-1, -1} when every rank has its own.
inline std::pair<int, int> first_shared_device(const std::vector<int>& device) {
  for (std::size_t a = 0; a < device.size(); ++a)
    for (std::size_t b = a + 1; b < device.size(); ++b)
      if (device[a] == device[b]) return {static_cast<int>(a), static_cast<int>(b)};
  return {-1, -1};
}

/// Runs fn(make(r, world, device, id)) for every rank r of a world of `world` NCCL ranks, each on a thread of its
/// own, and joins them: the devices from `devices` (thread_rank_devices), refused where two ranks share one and the
/// loaded NCCL cannot have that (multi_rank_gpu_refusal, with `multi_rank_gpu_enable`, the environment's
/// NCCL_MULTI_RANK_GPU_ENABLE), one api.unique_id() for all. A rank's communicator is made and ended on its thread
/// (make's result is destroyed after fn returns or throws). A rank that fails cannot stop the others (NCCL's calls of
/// another thread cannot be aborted safely): they end at their timeout, and the first error, the root cause, is
/// rethrown once every rank has ended.
template <class Api, class Make, class F>
void run_nccl_world(Api& api, int world, const std::vector<int>& devices, const char* multi_rank_gpu_enable,
                    Make&& make, F&& fn) {
  const std::vector<int> device = thread_rank_devices(world, devices, api.devices());
  if (const auto [a, b] = first_shared_device(device); a >= 0)
    if (const std::string why =
            multi_rank_gpu_refusal(api.version(), multi_rank_gpu_enable, a, b, device[static_cast<std::size_t>(a)]);
        !why.empty())
      throw usage_error(why);
  const auto id = api.unique_id();
  thread_ranks_hooks hooks;
  hooks.size = world;
  hooks.started_then = "end at their timeout (a thread cannot stop another's NCCL calls)";
  run_thread_ranks(
      world, 0,
      [&](int r) {
        auto comm = make(r, world, device[static_cast<std::size_t>(r)], id);
        fn(comm);
      },
      hooks);
}

}  // namespace fsdp::comm::detail
