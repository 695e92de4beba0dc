// A probe of ncclCommSplit at world size 1, with NCCL alone (no fsdp code between it and NCCL), for the GPU check:
// on an H200 with NCCL 2.28.3 (2026-11-26) comm::nccl's split found no communicator and, aborting, ended NCCL's
// split job ("ncclAsyncJobComplete: job ... failed, job error 3", nothing else at NCCL_DEBUG=WARN). Read against
// NCCL's source (docs/cuda.md), the cause was comm::nccl's: a non-blocking ncclCommSplit answers ncclSuccess while
// the split still runs as a job of the parent, and the library read the new communicator at that answer (fixed:
// nccl_logic_test holds it). This probe confirms that on hardware, and answers what is left open. For every
// combination of `blocking` (0, 1) and `splitShare` (0, 1), set on the parent (NCCL reads both from the parent's
// config: src/init.cc, ncclCommInitChildComm) and on the split, and of the colour (0, 3), it makes a fresh world of
// one (ncclCommInitRankConfig), splits it, says what the call answered and whether the communicator was there at
// that answer, polls the parent's state until it has settled (at most 3 s), runs a one-element all-reduce on the
// new communicator, and prints one line per combination, then a summary:
//
//   split blocking=0 splitShare=0 color=3: the call answered ncclSuccess (no communicator yet); ncclSuccess after
//     0.12 s, a communicator; its all-reduce: ncclSuccess
//   split probe: 8 of 8 combinations made a communicator (NCCL 2.28.3, /lib/x86_64-linux-gnu/libnccl.so.2) in 3.1 s
//
// NCCL's own messages go to stdout with them (NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET,BOOTSTRAP,GRAPH unless
// set), cutting its lines; tools/gpu-check sends them to a file of their own (NCCL_DEBUG_FILE). At INFO, NCCL names the
// file and line of every failing call on its way out ("init.cc:1534 -> 3"). `--cuda-error-first` makes the probe leave
// a failed CUDA call's error undrained on the calling thread before the first NCCL call (the pattern NCCL 2.28.7's
// notes fixed). Exit status 0 when every combination made a communicator, 1 otherwise, 2 without a GPU (it prints
// "skipped: ..."); the whole probe takes a few seconds (each world of one about 0.1 to 0.5 s after the first).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <fsdp/cuda/error.cuh>  // nccl_result_name: the enumerators' names, nothing between the probe and NCCL

namespace {

using clock_type = std::chrono::steady_clock;

const char* result_name(ncclResult_t r) { return fsdp::detail::nccl_result_name(r); }

/// Polls `c`'s asynchronous state until it leaves ncclInProgress, at most `limit`.
ncclResult_t settle(ncclComm_t c, ncclResult_t rc, std::chrono::milliseconds limit) {
  const auto deadline = clock_type::now() + limit;
  while (rc == ncclInProgress && clock_type::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ncclResult_t state = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(c, &state);
    rc = q != ncclSuccess ? q : state;
  }
  return rc;
}

/// One combination: true when it made a communicator that ran an all-reduce.
bool probe(int blocking, int share, int color, float* buf, cudaStream_t s) {
  const auto t0 = clock_type::now();
  auto secs = [&] { return std::chrono::duration<double>(clock_type::now() - t0).count(); };
  std::printf("split blocking=%d splitShare=%d color=%d: ", blocking, share, color);
  std::fflush(stdout);
  ncclUniqueId id;
  ncclComm_t parent = nullptr, child = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    std::printf("ncclGetUniqueId failed\n");
    return false;
  }
  ncclConfig_t pc = NCCL_CONFIG_INITIALIZER;
  pc.blocking = blocking;
  pc.splitShare = share;
  ncclResult_t rc = settle(parent, ncclCommInitRankConfig(&parent, 1, id, 0, &pc), std::chrono::milliseconds(3000));
  if (rc != ncclSuccess) {
    std::printf("the world of one itself failed: %s (%s)\n", result_name(rc), ncclGetLastError(parent));
    if (parent) (void)ncclCommAbort(parent);
    return false;
  }
  ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
  cc.blocking = blocking;
  cc.splitShare = share;
  rc = ncclCommSplit(parent, color, 0, &child, &cc);
  std::printf("the call answered %s (%s); ", result_name(rc), child ? "a communicator already" : "no communicator yet");
  std::fflush(stdout);
  // The parent's state says when the split has settled, whatever the call answered.
  rc = settle(parent, rc == ncclSuccess ? ncclInProgress : rc, std::chrono::milliseconds(3000));
  if (rc == ncclSuccess && child) rc = settle(child, ncclInProgress, std::chrono::milliseconds(3000));
  bool ok = false;
  if (rc != ncclSuccess || !child) {
    std::printf("%s after %.2f s, %s; NCCL's last message: %s\n", result_name(rc), secs(),
                child ? "a communicator that did not settle" : "no communicator", ncclGetLastError(parent));
    std::printf("aborting the parent\n");
  } else {
    const ncclResult_t ar = settle(child, ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, child, s),
                                   std::chrono::milliseconds(3000));
    const cudaError_t sync = cudaStreamSynchronize(s);
    ok = ar == ncclSuccess && sync == cudaSuccess;
    std::printf("%s after %.2f s, a communicator; its all-reduce: %s%s\n", result_name(rc), secs(), result_name(ar),
                sync == cudaSuccess ? "" : (std::string(", stream: ") + cudaGetErrorString(sync)).c_str());
  }
  if (child) (void)(ok ? ncclCommDestroy(child) : ncclCommAbort(child));
  (void)(rc == ncclSuccess ? ncclCommDestroy(parent) : ncclCommAbort(parent));
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("NCCL_DEBUG", "INFO", 0);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,NET,BOOTSTRAP,GRAPH", 0);
  const bool cuda_error_first = argc > 1 && std::strcmp(argv[1], "--cuda-error-first") == 0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    std::printf("skipped: no CUDA device\n");
    return 2;
  }
  if (cudaSetDevice(0) != cudaSuccess) return 1;
  int version = 0;
  (void)ncclGetVersion(&version);
  Dl_info where{};
  const char* lib = dladdr(reinterpret_cast<void*>(&ncclGetVersion), &where) && where.dli_fname ? where.dli_fname : "?";
  float* buf = nullptr;
  cudaStream_t s = nullptr;
  if (cudaMalloc(&buf, sizeof(float)) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
    return 1;
  if (cuda_error_first) {  // a failed call whose error stays on this thread
    void* p = nullptr;
    std::printf("before the first NCCL call: cudaMalloc(1 << 62) answered %s, left undrained\n",
                cudaGetErrorString(cudaMalloc(&p, std::size_t{1} << 62)));
  }
  int made = 0, tried = 0;
  const auto t0 = clock_type::now();
  for (int blocking : {0, 1})
    for (int share : {0, 1})
      for (int color : {0, 3}) {
        ++tried;
        made += probe(blocking, share, color, buf, s);
      }
  std::printf("split probe: %d of %d combinations made a communicator (NCCL %d.%d.%d, %s) in %.1f s\n", made, tried,
              version / 10000, version / 100 % 100, version % 100, lib,
              std::chrono::duration<double>(clock_type::now() - t0).count());
  (void)cudaStreamDestroy(s);
  (void)cudaFree(buf);
  return made == tried ? 0 : 1;
}
