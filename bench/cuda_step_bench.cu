// One FSDP training step at world size 1 (comm::nccl, full_shard, backward_pre<1>, AdamW) next to the same step
// written without the library: the same cuBLAS products and the same AdamW kernel over flat fp32 buffers. The
// difference is what the library adds at world 1: the gathers and reduce-scatters (copies at world 1), the
// accumulate into the gradient shard, events and scheduling. Goal: ratio <= 1.03. Without a GPU it prints one
// "skipped:" line.
//   bazel run //bench:cuda_step -- [--layers 8] [--hidden 2048] [--tokens 4096] [--steps 20]
#include <cublas_v2.h>

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
  double plain = 0;
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
    auto step = [&] {
      for (int l = 0; l < L; ++l) g.forward(w[l].as<float>(), act[l], act[l + 1]);
      for (int l = L - 1; l >= 0; --l) {
        be.fill_zero(gw[l].data(), std::int64_t(wn) * 4, s);
        g.backward(w[l].as<float>(), act[l], dact[l + 1], gw[l].as<float>(), dact[l]);
      }
      for (int l = 0; l < L; ++l)
        be.for_each(std::int64_t(wn),
                    fsdp::optim::detail::adamw_elements{w[l].as<float>(), gw[l].as<float>(), m[l].as<float>(),
                                                        v[l].as<float>(), coeffs, {}},
                    s);
    };
    step();
    be.synchronize(s);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < sh.steps; ++i) step();
    be.synchronize(s);
    plain = seconds_since(t0) / sh.steps;
  }

  // ---- with the library: Model over comm::nccl at world 1 ------------------------------------------------------
  double with_lib = 0;
  {
    ::setenv("RANK", "0", 0);
    ::setenv("WORLD_SIZE", "1", 0);
    ::setenv("LOCAL_RANK", "0", 0);
    auto comm = fsdp::comm::nccl::from_env();
    fsdp::ModelSpec spec;
    for (int l = 0; l < L; ++l) spec.add("layers." + std::to_string(l) + ".w", {d, d}, {.init = fsdp::init::zeros});
    using P = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::backward_pre<1>, fsdp::precision::full, fsdp::comm::nccl>;
    fsdp::Model<P> model(comm, spec, fsdp::wrap::by_prefix{"layers."});
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
  std::printf("{\"bench\":\"cuda_step\",\"device\":\"%s\",\"plain_ms\":%.4f,\"fsdp_ms\":%.4f,\"ratio\":%.4f}\n",
              prop.name, plain * 1e3, with_lib * 1e3, with_lib / plain);
  return 0;
}
