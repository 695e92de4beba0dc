#pragma once
// comm::run_nccl_threads: the ranks of one NCCL world as threads of one process, each with its own comm::nccl
// communicator on the device it is given, one unique id made once and shared in memory (what ncclCommInitAll serves,
// with the library's communicator): for a trainer that drives several GPUs from one process, one thread a GPU, and
// for tests. Several ranks may share one GPU with NCCL 2.30 or later and NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL up to
// 2.29 refuses them; comm::run_nccl_threads says so before any NCCL call): such a world proves correctness, ordering,
// failure handling and memory, not speed (its ranks share the GPU's SMs and memory bandwidth). Processes keep their
// launchers (comm::nccl::from_env under torchrun or srun, comm::nccl_from_mpi under mpirun).
//
// Compiled by tools/header-check and the CUDA tests' build; its decisions (devices, the version gate, one id, the
// ranks' threads) are tested against a fake NCCL (tests/comm/launch_test.cc). Not yet run on a GPU.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "fsdp/comm/detail/nccl_world.hpp"
#include "fsdp/comm/nccl.cuh"
#include "fsdp/cuda/device.cuh"
#include "fsdp/cuda/error.cuh"

namespace fsdp::comm {

struct nccl_threads_options {
  /// Rank r's device: devices[r % devices.size()]; empty: r % the visible devices. {0}: every rank on device 0.
  std::vector<int> devices;
  /// Every rank's communicator options (its backend's device is the rank's, whatever nccl.backend.device says).
  nccl_options nccl;
};

namespace detail {
/// The NCCL and CUDA calls of run_nccl_world (nccl_world.hpp).
struct nccl_world_api {
  int version() const { return nccl_api{}.version(); }
  visible_devices devices() const {
    const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
    return {p.count, p.reason};
  }
  ncclUniqueId unique_id() const {
    ncclUniqueId id{};
    FSDP_NCCL_CHECK(ncclGetUniqueId(&id));
    return id;
  }
};
}  // namespace detail

/// Runs fn(nccl_communicator&) for each of `world` ranks on a thread of its own, and joins them; the first error (the
/// root cause) is rethrown once every rank has ended. A rank that fails cannot stop the others: they fail at their
/// timeout (nccl_options::timeout), naming what they waited for. Each rank's communicator is ended on its thread after
/// fn returns (ncclCommFinalize, polled, then ncclCommDestroy), all ranks at once as NCCL needs.
template <class F>
void run_nccl_threads(int world, F&& fn, nccl_threads_options opt = {}) {
  detail::nccl_world_api api;
  detail::run_nccl_world(
      api, world, opt.devices, std::getenv("NCCL_MULTI_RANK_GPU_ENABLE"),
      [&](int rank, int size, int device, const ncclUniqueId& id) {
        nccl_options o = opt.nccl;
        o.backend.device = device;
        return nccl_communicator(rank, size, device, id, std::move(o));
      },
      std::forward<F>(fn));
}

}  // namespace fsdp::comm
