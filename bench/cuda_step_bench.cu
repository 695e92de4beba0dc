// One FSDP training step at world size 1 (comm::nccl, full_shard, backward_pre<1>, AdamW) next to the same step
// written without the library: the same cuBLAS products and the same AdamW kernel over flat fp32 buffers. The
// difference is what the library adds at world 1: the gathers and reduce-scatters (copies at world 1), the
// accumulate into the gradient shard, events and scheduling. Goal: ratio <= 1.03.
//
// Then, for the library's step: its trace (the CUDA backend's timing events, fsdp/observe/stamp.hpp) summarized
// over the measured steps, beside Model::plan_timeline's prediction for the same model, whose compute times are the
// plain step's passes measured here (per layer: the forward loop's and the backward loop's time over the layers)
// and whose memory-bound work runs at the device-to-device copy bandwidth measured here; and the memory plan with
// what NCCL's communicator took from the device, measured (the "NCCL (measured)" row). Without a GPU it prints one
// "skipped:" line.
//   bazel run //bench:cuda_step -- [--layers 8] [--hidden 2048] [--tokens 4096] [--steps 20]
#include <cublas_v2.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fsdp/fsdp.cuh>

namespace {

struct shape {
  int layers = 8, hidden = 2048, tokens = 4096, steps = 20;
};

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + " failed: " + std::to_string(int(st)));
}

/// The layer math both variants run: y = W x forward, dW = dy x^T and dx = W^T dy backward (column-major).
struct gemms {
  cublasHandle_t h;
  int d, t;
  void forward(const float* w, const float* x, float* y) const {
    const float one = 1, zero = 0;
    check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, t, d, &one, w, d, x, d, &zero, y, d), "forward");
  }
  void backward(const float* w, const float* x, const float* dy, float* dw, float* dx) const {
    const float one = 1, zero = 0;
    check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, d, t, &one, dy, d, x, d, &one, dw, d), "dW");
    check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, d, t, d, &one, w, d, dy, d, &zero, dx, d), "dx");
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Seconds between two recorded events.
double between(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  FSDP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms * 1e-3;
}

}  // namespace

int main(int argc, char** argv) {
  shape sh;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--layers") sh.layers = v;
    else if (a == "--hidden") sh.hidden = v;
    else if (a == "--tokens") sh.tokens = v;
    else if (a == "--steps") sh.steps = v;
  }
  const fsdp::cuda::device_probe probe = fsdp::cuda::device_status();
  if (probe.count == 0) {
    std::printf("skipped: no CUDA device (%s)\n", probe.reason.c_str());
    return 0;
  }
  const int d = sh.hidden, t = sh.tokens, L = sh.layers;
  const std::size_t wn = std::size_t(d) * d, an = std::size_t(d) * t;
  std::vector<float*> act(L + 1), dact(L + 1);
  for (int l = 0; l <= L; ++l) {
    FSDP_CUDA_CHECK(cudaMalloc(&act[l], an * 4));
    FSDP_CUDA_CHECK(cudaMalloc(&dact[l], an * 4));
    FSDP_CUDA_CHECK(cudaMemset(act[l], 0, an * 4));
    FSDP_CUDA_CHECK(cudaMemset(dact[l], 0, an * 4));
  }
  cublasHandle_t h;
  check(cublasCreate(&h), "cublasCreate");
  const gemms g{h, d, t};
  const fsdp::optim::detail::adamw_coeffs coeffs{1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 0.001f};

  // ---- without the library: flat params, grads and moments; the same products and the same AdamW kernel ------
  double plain = 0, forward_s = 0, backward_s = 0, copy_bytes_per_s = 0;  // forward_s, backward_s: per step
  {
    fsdp::backend::cuda be(0, {.device = 0});
    auto& s = be.compute_stream();
    check(cublasSetStream(h, s.get()), "cublasSetStream");
    std::vector<fsdp::backend::cuda::buffer> w, gw, m, v;
    for (int l = 0; l < L; ++l)
      for (auto* vec : {&w, &gw, &m, &v}) {
        vec->push_back(be.allocate(std::int64_t(wn) * 4, fsdp::mem::comm_buffers, s));
        be.fill_zero(vec->back().data(), std::int64_t(wn) * 4, s);
      }
    cudaEvent_t marks[3];
    for (auto& e : marks) FSDP_CUDA_CHECK(cudaEventCreate(&e));
    auto step = [&] {
      FSDP_CUDA_CHECK(cudaEventRecord(marks[0], s.get()));
      for (int l = 0; l < L; ++l) g.forward(w[l].as<float>(), act[l], act[l + 1]);
      FSDP_CUDA_CHECK(cudaEventRecord(marks[1], s.get()));
      for (int l = L - 1; l >= 0; --l) {
        be.fill_zero(gw[l].data(), std::int64_t(wn) * 4, s);
        g.backward(w[l].as<float>(), act[l], dact[l + 1], gw[l].as<float>(), dact[l]);
      }
      FSDP_CUDA_CHECK(cudaEventRecord(marks[2], s.get()));
      for (int l = 0; l < L; ++l)
        be.for_each(std::int64_t(wn),
                    fsdp::optim::detail::adamw_elements{w[l].as<float>(), gw[l].as<float>(), m[l].as<float>(),
                                                        v[l].as<float>(), coeffs, {}},
                    s);
    };
    step();
    be.synchronize(s);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < sh.steps; ++i) {
      step();
      be.synchronize(s);  // the passes' events of this step, before the next records them again
      forward_s += between(marks[0], marks[1]) / sh.steps;
      backward_s += between(marks[1], marks[2]) / sh.steps;
    }
    plain = seconds_since(t0) / sh.steps;
    // device-to-device copy bandwidth (read + write), for the plan's memory-bound work
    FSDP_CUDA_CHECK(cudaEventRecord(marks[0], s.get()));
    for (int l = 1; l < L; ++l)
      FSDP_CUDA_CHECK(cudaMemcpyAsync(m[l].data(), w[l].data(), wn * 4, cudaMemcpyDeviceToDevice, s.get()));
    FSDP_CUDA_CHECK(cudaEventRecord(marks[1], s.get()));
    be.synchronize(s);
    copy_bytes_per_s = L > 1 ? 2.0 * double(wn * 4) * (L - 1) / between(marks[0], marks[1]) : 0.0;
    for (auto& e : marks) FSDP_CUDA_LOG(cudaEventDestroy(e));
  }

  // ---- with the library: Model over comm::nccl at world 1 ------------------------------------------------------
  double with_lib = 0;
  fsdp::trace::step_summary measured;  // means over the measured steps
  fsdp::timeline predicted;
  std::string memory_table;
  {
    ::setenv("RANK", "0", 0);
    ::setenv("WORLD_SIZE", "1", 0);
    ::setenv("LOCAL_RANK", "0", 0);
    auto comm = fsdp::comm::nccl::from_env();
    fsdp::ModelSpec spec;
    for (int l = 0; l < L; ++l) spec.add("layers." + std::to_string(l) + ".w", {d, d}, {.init = fsdp::init::zeros});
    using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::backward_pre<1>, fsdp::precision::full,
                           fsdp::comm::nccl>;
    fsdp::trace::recorder rec;
    fsdp::model_options mo;
    mo.recorder = &rec;
    fsdp::Model<P> model(comm, spec, fsdp::wrap::by_prefix{"layers."}, fsdp::init::zeros, mo);
    fsdp::optim::adamw opt(model, {.lr = 1e-4f, .weight_decay = 0.0f});
    auto& s = model.backend().compute_stream();
    check(cublasSetStream(h, s.get()), "cublasSetStream");
    auto step = [&] {
      int l = 0;
      for (auto& u : model.forward()) {
        g.forward(u.param("layers." + std::to_string(l) + ".w").data(), act[l], act[l + 1]);
        ++l;
      }
      for (auto& u : model.backward()) {
        --l;
        const std::string n = "layers." + std::to_string(l) + ".w";
        g.backward(u.param(n).data(), act[l], dact[l + 1], u.grad(n).data(), dact[l]);
      }
      opt.step();
      opt.zero_grad();
    };
    step();
    model.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < sh.steps; ++i) step();
    model.synchronize();
    with_lib = seconds_since(t0) / sh.steps;
    for (int i = 0; i < sh.steps; ++i) {  // step 1 was the warm-up
      const fsdp::trace::step_summary one = fsdp::trace::summarize(rec.events(0), 0, std::uint64_t(i + 2));
      measured.wall_s += one.wall_s / sh.steps;
      measured.compute_s += one.compute_s / sh.steps;
      measured.comm_s += one.comm_s / sh.steps;
      measured.exposed_comm_s += one.exposed_comm_s / sh.steps;
    }
    fsdp::time_model t;
    const auto per_layer = [&](double s) { return std::chrono::nanoseconds(std::int64_t(s / L * 1e9)); };
    t.compute.assign(model.size(), {per_layer(forward_s), per_layer(backward_s)});
    t.memory_bytes_per_second = copy_bytes_per_s;
    t.link.bytes_per_second = copy_bytes_per_s;  // world 1: a collective moves (n - 1) / n = 0 of its bytes
    predicted = fsdp::plan_timeline(model, t, opt.states_per_element());
    memory_table = fsdp::plan_memory(model, opt).table();
  }
  cublasDestroy(h);
  for (int l = 0; l <= L; ++l) {
    FSDP_CUDA_LOG(cudaFree(act[l]));
    FSDP_CUDA_LOG(cudaFree(dact[l]));
  }
  cudaDeviceProp prop{};
  FSDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s; %d layers of %dx%d, %d tokens, %d steps\n", prop.name, L, d, d, t, sh.steps);
  std::printf("%-28s %10.3f ms\n%-28s %10.3f ms\n%-28s %10.4f (goal <= 1.03)\n", "step without the library",
              plain * 1e3, "step with fsdp (nccl, world 1)", with_lib * 1e3, "ratio", with_lib / plain);
  std::printf("\nthe library's step: its trace (mean of steps 2..%d) beside Model::plan_timeline (compute: the plain "
              "step's passes, %.3f + %.3f ms per layer; memory-bound work at %.1f GB/s)\n",
              sh.steps + 1, forward_s / L * 1e3, backward_s / L * 1e3, copy_bytes_per_s / 1e9);
  std::printf("%-28s %10s %10s\n", "", "measured", "predicted");
  const double ns = 1e-6;
  std::printf("%-28s %7.3f ms %7.3f ms\n", "step", measured.wall_s * 1e3, double(predicted.step_ns) * ns);
  std::printf("%-28s %7.3f ms %7.3f ms\n", "compute", measured.compute_s * 1e3, double(predicted.compute_ns) * ns);
  std::printf("%-28s %7.3f ms %7.3f ms\n", "communication", measured.comm_s * 1e3, double(predicted.comm_ns) * ns);
  std::printf("%-28s %7.3f ms %7.3f ms\n", "exposed communication", measured.exposed_comm_s * 1e3,
              double(predicted.exposed_ns) * ns);
  std::printf("predicted critical path:\n%s\n%s", predicted.critical_path_text().c_str(), memory_table.c_str());
  std::printf(
      "{\"bench\":\"cuda_step\",\"device\":\"%s\",\"plain_ms\":%.4f,\"fsdp_ms\":%.4f,\"ratio\":%.4f,"
      "\"trace_step_ms\":%.4f,\"predicted_step_ms\":%.4f,\"trace_exposed_ms\":%.4f,\"predicted_exposed_ms\":%.4f}\n",
      prop.name, plain * 1e3, with_lib * 1e3, with_lib / plain, measured.wall_s * 1e3, double(predicted.step_ns) * ns,
      measured.exposed_comm_s * 1e3, double(predicted.exposed_ns) * ns);
  return 0;
}
