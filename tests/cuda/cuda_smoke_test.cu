// Smoke test of the CUDA entry point <fsdp/fsdp.cuh>: the host library compiles under nvcc, the error
// wrappers throw / log what they should, and (with a GPU) a kernel's output comes back bit for bit, and the CUDA
// graph behaviours the CUDA backend's capture relies on.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.cuh>

#include "gpu.hpp"

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Pattern generated on both sides: element i of a buffer seeded with `seed`. Exact in float (|value| < 2^24).
template <class T>
__host__ __device__ constexpr T pattern(std::uint32_t i, std::uint32_t seed) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(static_cast<std::int32_t>((i * 37u + seed) % 4096u) - 2048) * T(0.25);
  } else {
    return static_cast<T>(i * 2654435761u ^ seed);
  }
}

template <class T>
struct fill_params {
  T* out;
  std::uint32_t n;
  std::uint32_t seed;
};
static_assert(std::is_trivially_copyable_v<fill_params<float>>, "kernel parameters must be trivially copyable");
static_assert(std::is_trivially_copyable_v<fill_params<std::uint32_t>>,
              "kernel parameters must be trivially copyable");

}  // namespace

// A template and static: no "multiple definition" when several .cu files include a header defining it.
template <class T>
__global__ static void fill_pattern_kernel(fill_params<T> p) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x)
    p.out[i] = pattern<T>(i, p.seed);
}

TEST_CASE("error wrappers report the code and the failed expression (host only)") {
  SUBCASE("FSDP_CUDA_CHECK throws cuda_error") {
    auto failing = [] { return cudaErrorInvalidValue; };
    try {
      FSDP_CUDA_CHECK(failing());
      FAIL("FSDP_CUDA_CHECK did not throw");
    } catch (const fsdp::cuda_error& e) {
      const std::string what = e.what();
      CHECK(e.code() == cudaErrorInvalidValue);
      CHECK(std::string(e.expression()) == "failing()");
      CHECK(e.line() > 0);
      CHECK(contains(e.file(), "cuda_smoke_test.cu"));
      CHECK(what.rfind("fsdp: ", 0) == 0);
      CHECK(contains(what, "failing()"));
      CHECK(contains(what, "cudaErrorInvalidValue"));
      CHECK(contains(what, "cuda_smoke_test.cu:"));
    }
    // A cuda_error is a std::runtime_error.
    CHECK_THROWS_AS(FSDP_CUDA_CHECK(cudaErrorMemoryAllocation), std::runtime_error);
    CHECK_NOTHROW(FSDP_CUDA_CHECK(cudaSuccess));
  }

  SUBCASE("FSDP_NCCL_CHECK throws nccl_error") {
    auto failing = [] { return ncclInvalidArgument; };
    try {
      FSDP_NCCL_CHECK(failing());
      FAIL("FSDP_NCCL_CHECK did not throw");
    } catch (const fsdp::nccl_error& e) {
      const std::string what = e.what();
      CHECK(e.code() == ncclInvalidArgument);
      CHECK(std::string(e.expression()) == "failing()");
      CHECK(what.rfind("fsdp: ", 0) == 0);
      CHECK(contains(what, "failing()"));
      CHECK(contains(what, "ncclInvalidArgument"));
    }
    CHECK_THROWS_AS(FSDP_NCCL_CHECK(ncclSystemError), std::runtime_error);
    CHECK_NOTHROW(FSDP_NCCL_CHECK(ncclSuccess));
  }

  SUBCASE("the argument is evaluated exactly once") {
    int calls = 0;
    auto counted = [&] { ++calls; return cudaErrorInvalidValue; };
    CHECK_THROWS_AS(FSDP_CUDA_CHECK(counted()), fsdp::cuda_error);
    CHECK(calls == 1);
    FSDP_CUDA_LOG(counted());  // prints one line to stderr and goes on
    CHECK(calls == 2);
  }

  SUBCASE("the macros are single statements: an else binds to the right if") {
    bool took_else = false;
    if (false)
      FSDP_CUDA_LOG(cudaErrorInvalidValue);
    else
      took_else = true;
    CHECK(took_else);
    took_else = false;
    if (false)
      FSDP_NCCL_CHECK(ncclInvalidArgument);
    else
      took_else = true;
    CHECK(took_else);
  }
}

TEST_CASE("the host library compiles and runs under nvcc") {
  CHECK(fsdp::layout::shard_numel(257, 4, 16) == 80);
  CHECK(fsdp::layout::shard_numel(256, 4) == 64);
  CHECK_THROWS_AS(fsdp::layout::shard_numel(10, 0), fsdp::usage_error);

  fsdp::ModelSpec spec;
  spec.add("wte.w", {64, 16}).add("ln.b", {16}, {.flags = {.no_decay = true}}).tie("lm_head.w", "wte.w");
  CHECK(spec.size() == 3);
  CHECK(spec.numel() == 64 * 16 + 16);
  CHECK(spec.at("lm_head.w").is_tied());
  CHECK_THROWS_AS(spec.add("ln.b", {4}), fsdp::usage_error);
}

TEST_CASE("a kernel fills a device buffer, checked bit for bit (needs a GPU)") {
  const fsdp::cuda::device_probe devices = fsdp::cuda::device_status();
  if (devices.count == 0) {
    const std::string line = "skipped: no CUDA device (" + devices.reason + ")";
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    MESSAGE(line);
    CHECK_THROWS_AS(fsdp::cuda::require_device(), fsdp::cuda_error);
    fsdp_test::gpu_cases.skipped();
    return;
  }
  fsdp_test::gpu_cases.ran();
  CHECK(fsdp::cuda::require_device() == devices.count);
  FSDP_CUDA_CHECK(cudaSetDevice(0));

  constexpr std::uint32_t n = 10'007;  // not a multiple of the block size: exercises the tail
  constexpr std::uint32_t seed = 0x5eedu;

  auto run = [&]<class T>(T) {
    T* d = nullptr;
    FSDP_CUDA_CHECK(cudaMalloc(&d, sizeof(T) * n));
    std::vector<T> got(n);
    try {
      fill_pattern_kernel<T><<<13, 256>>>(fill_params<T>{d, n, seed});
      FSDP_CUDA_CHECK(cudaGetLastError());
      FSDP_CUDA_CHECK(cudaMemcpy(got.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost));

      // An invalid copy (null destination, nonzero size) is reported as a cuda_error and then cleared.
      try {
        FSDP_CUDA_CHECK(cudaMemcpy(nullptr, d, sizeof(T) * n, cudaMemcpyDeviceToHost));
        FAIL("cudaMemcpy to nullptr did not fail");
      } catch (const fsdp::cuda_error& e) {
        CHECK(e.code() != cudaSuccess);
        CHECK(contains(e.what(), "cudaMemcpy(nullptr"));
      }
      CHECK(cudaGetLastError() == cudaSuccess);
    } catch (...) {
      FSDP_CUDA_LOG(cudaFree(d));
      throw;
    }
    FSDP_CUDA_CHECK(cudaFree(d));

    std::uint32_t mismatches = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
      if (std::bit_cast<bits>(got[i]) != std::bit_cast<bits>(pattern<T>(i, seed))) {
        if (mismatches++ < 5) FAIL_CHECK("element ", i, " is ", got[i], ", expected ", pattern<T>(i, seed));
      }
    }
    CHECK(mismatches == 0);
  };
  run(float{});
  run(std::uint32_t{});
}

TEST_CASE("backend::cuda's teardown waits at most wait_timeout for a stream that never finishes (needs a GPU)") {
  FSDP_REQUIRE_GPU();
  if (fsdp_test::simulated_gpu()) {
    // GPGPU-Sim returns from the teardown in 300 ms as it should (it logs "stream 'rank0.compute' at backend::cuda
    // teardown did not finish within 300 ms"), but then never completes the destroyed stream's host function
    fsdp_test::needs_real_gpu("the simulator hangs on a stream destroyed with a host function running");
    return;
  }
  std::atomic<bool> release{false};
  fsdp::backend::cuda_options opt;
  opt.wait_timeout = std::chrono::milliseconds(300);
  auto* be = new fsdp::backend::cuda(0, opt);
  const auto t0 = std::chrono::steady_clock::now();
  // the compute stream is held until `release`: a stuck kernel or a dead peer's collective, as far as teardown sees
  be->host_callback(be->compute_stream(), [&release] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const auto t1 = std::chrono::steady_clock::now();
  delete be;  // before: cudaStreamSynchronize, which returns only when the stream is released (after this line)
  const auto t2 = std::chrono::steady_clock::now();
  release = true;
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(t1 - t0 < std::chrono::milliseconds(1000));  // the host function runs on the stream, not at the call
  CHECK(t2 - t1 < std::chrono::milliseconds(3000));  // bounded: 300 ms per stream at most, and a log line
}

TEST_CASE("a trainer's own compute stream: the backend issues its compute-side work there and leaves it alive; "
          "the default streams are refused (needs a GPU)") {
  FSDP_REQUIRE_GPU();
  cudaStream_t mine = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
  {
    fsdp::backend::cuda_options opt;
    opt.compute_stream = mine;
    fsdp::backend::cuda be(0, opt);
    CHECK(be.compute_stream().get() == mine);
    CHECK_FALSE(be.compute_stream().owned());
    CHECK(be.gather_stream().owned());
    const std::vector<float> in = {1.0f, -2.0f, 3.5f, 0.25f, 7.0f};
    auto src = be.allocate(20, fsdp::mem::comm_buffers, be.compute_stream());
    auto dst = be.allocate(10, fsdp::mem::comm_buffers, be.compute_stream());
    be.upload(src.data(), in.data(), 20, be.compute_stream());
    be.convert(dst.data(), fsdp::dtype::bf16, src.data(), fsdp::dtype::f32, 5, 1.0f, be.compute_stream());
    std::vector<std::uint16_t> out(5, 0);
    REQUIRE(cudaStreamSynchronize(mine) == cudaSuccess);  // the work went to the trainer's stream
    be.download(out.data(), dst.data(), 10, be.compute_stream());
    be.synchronize(be.compute_stream());
    CHECK(out == std::vector<std::uint16_t>{0x3f80, 0xc000, 0x4060, 0x3e80, 0x40e0});
    be.release_after(std::move(src), be.compute_stream());
    be.release_after(std::move(dst), be.compute_stream());
  }
  CHECK(cudaStreamQuery(mine) == cudaSuccess);  // still the trainer's, alive after the backend
  CHECK(cudaStreamDestroy(mine) == cudaSuccess);
  for (cudaStream_t d : {cudaStreamLegacy, cudaStreamPerThread}) {
    fsdp::backend::cuda_options opt;
    opt.compute_stream = d;
    const std::string which = d == cudaStreamLegacy ? "legacy" : "per-thread";
    std::string what;
    try {
      fsdp::backend::cuda be(0, opt);
    } catch (const fsdp::usage_error& e) {
      what = e.what();
    }
    CHECK(what ==
          "fsdp: backend::cuda on rank 0: cuda_options::compute_stream is the " + which +
              " default stream, which synchronizes with the device's other work; pass a stream made with "
              "cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) (null: the backend makes one)");
  }
}

namespace {
struct shift {
  float a[5];
  int b;
};
__global__ void add_shift(float* x, shift p, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] += p.a[i % 5] + static_cast<float>(p.b);
}
__global__ void twice(float* x, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] *= 2.0f;
}
void CUDART_CB count_call(void* calls) { ++*static_cast<int*>(calls); }
}  // namespace

TEST_CASE(
    "the CUDA graph behaviours backend::cuda's capture relies on: a fork and a join through events, arguments taken "
    "at capture, a host function at each launch, and what capture refuses (needs a GPU; tools/sim/graphs.cc on the "
    "simulated one)") {
  FSDP_REQUIRE_GPU();
  constexpr int n = 37;
  float *x = nullptr, *y = nullptr;
  FSDP_CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
  FSDP_CUDA_CHECK(cudaMalloc(&y, n * sizeof(float)));
  FSDP_CUDA_CHECK(cudaMemset(x, 0, n * sizeof(float)));
  fsdp::backend::detail::cuda_stream s0("s0"), s1("s1");
  fsdp::backend::detail::cuda_event fork, join;
  shift p{{1, 2, 3, 4, 5}, 10};
  int calls = 0;
  FSDP_CUDA_CHECK(cudaStreamBeginCapture(s0.get(), cudaStreamCaptureModeThreadLocal));
  add_shift<<<2, 32, 0, s0.get()>>>(x, p, n);
  FSDP_CUDA_CHECK(cudaEventRecord(fork.get(), s0.get()));
  FSDP_CUDA_CHECK(cudaStreamWaitEvent(s1.get(), fork.get(), 0));  // s1 joins the capture
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FSDP_CUDA_CHECK(cudaStreamIsCapturing(s1.get(), &status));
  CHECK(status == cudaStreamCaptureStatusActive);
  FSDP_CUDA_CHECK(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s1.get()));
  twice<<<1, 64, 0, s1.get()>>>(y, n);
  FSDP_CUDA_CHECK(cudaLaunchHostFunc(s1.get(), &count_call, &calls));
  FSDP_CUDA_CHECK(cudaEventRecord(join.get(), s1.get()));
  CHECK(cudaEventQuery(join.get()) == cudaErrorCapturedEvent);    // the library never asks a captured event
  FSDP_CUDA_CHECK(cudaStreamWaitEvent(s0.get(), join.get(), 0));  // s1 joined back
  p.b = 1000;                                                     // the graph holds the arguments as they were
  cudaGraph_t g = nullptr;
  FSDP_CUDA_CHECK(cudaStreamEndCapture(s0.get(), &g));
  std::size_t nodes = 0;
  FSDP_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
  CHECK(nodes == 4);  // two kernels, a copy, a host function
  cudaGraphExec_t exec = nullptr;
  FSDP_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  FSDP_CUDA_CHECK(cudaGraphDestroy(g));
  CHECK(calls == 0);  // nothing ran at the capture
  for (int t = 0; t < 3; ++t) FSDP_CUDA_CHECK(cudaGraphLaunch(exec, s0.get()));
  FSDP_CUDA_CHECK(cudaStreamSynchronize(s0.get()));
  std::vector<float> hx(n), hy(n);
  FSDP_CUDA_CHECK(cudaMemcpy(hx.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost));
  FSDP_CUDA_CHECK(cudaMemcpy(hy.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    const float step = static_cast<float>(i % 5 + 1) + 10.0f;
    CHECK(hx[static_cast<std::size_t>(i)] == 3.0f * step);  // three launches added it
    CHECK(hy[static_cast<std::size_t>(i)] == 6.0f * step);  // the last one doubled the third sum
  }
  CHECK(calls == 3);
  FSDP_CUDA_CHECK(cudaGraphExecDestroy(exec));

  // A stream forked into a capture and not joined back: the end fails, and nothing is made.
  FSDP_CUDA_CHECK(cudaStreamBeginCapture(s0.get(), cudaStreamCaptureModeThreadLocal));
  FSDP_CUDA_CHECK(cudaEventRecord(fork.get(), s0.get()));
  FSDP_CUDA_CHECK(cudaStreamWaitEvent(s1.get(), fork.get(), 0));
  twice<<<1, 64, 0, s1.get()>>>(y, n);
  CHECK(cudaStreamEndCapture(s0.get(), &g) == cudaErrorStreamCaptureUnjoined);
  (void)cudaGetLastError();
  // A wait on work recorded before the capture: refused (the CUDA backend drops such waits), the capture invalidated.
  FSDP_CUDA_CHECK(cudaEventRecord(join.get(), s1.get()));
  FSDP_CUDA_CHECK(cudaStreamBeginCapture(s0.get(), cudaStreamCaptureModeThreadLocal));
  CHECK(cudaStreamWaitEvent(s0.get(), join.get(), 0) == cudaErrorStreamCaptureIsolation);
  CHECK(cudaStreamEndCapture(s0.get(), &g) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  // A capturing stream synchronized: refused, the capture invalidated (the backend refuses it first, by name).
  FSDP_CUDA_CHECK(cudaStreamBeginCapture(s0.get(), cudaStreamCaptureModeThreadLocal));
  CHECK(cudaStreamSynchronize(s0.get()) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s0.get(), &g) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  FSDP_CUDA_CHECK(cudaDeviceSynchronize());
  FSDP_CUDA_CHECK(cudaFree(x));
  FSDP_CUDA_CHECK(cudaFree(y));
}
