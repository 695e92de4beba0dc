#pragma once
// The MLP of examples/01_mlp_host, trained on GPUs: cuBLAS (or, selected with gemm_kind::plain, a plain GEMM kernel
// of the example's own) for the matrix products, the user's own small kernels for bias, ReLU and the loss, the
// library for gathering, reducing and the optimizer. Same spec, same data, same optimizer as the host example, so
// its losses can be compared with the host run's (to within the rounding of the summation order).
//
// The plain GEMM lets the whole step run where cuBLAS cannot: on the simulated GPU (tools/sim-check builds this
// example with -DEXAMPLES_NO_CUBLAS, without cuBLAS at all).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <fsdp/fsdp.cuh>

#include "examples/01_mlp_host/mlp.hpp"
#include "examples/common/gemm.cuh"

namespace mlp_cuda {

using examples::gemm;
using examples::gemm_kind;

// ---- the user's kernels -----------------------------------------------------------------------------------------
template <int = 0>
__global__ void bias_act(float* y, const float* b, int n, int out, bool relu) {
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n * out; k += gridDim.x * blockDim.x) {
    const float v = y[k] + b[k % out];
    y[k] = relu && v < 0.0f ? 0.0f : v;
  }
}
/// dy[k] = 0 where the ReLU output was not positive.
template <int = 0>
__global__ void relu_mask(float* dy, const float* y, int count) {
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += gridDim.x * blockDim.x)
    if (y[k] <= 0.0f) dy[k] = 0.0f;
}
/// db[o] += sum_s dy[s, o]
template <int = 0>
__global__ void bias_grad(float* db, const float* dy, int n, int out) {
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < out; o += gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n; ++s) acc += dy[s * out + o];
    db[o] += acc;
  }
}
/// One block: *loss = mean (y - t)^2 (deterministic tree sum), dy = 2 (y - t) / count.
template <int Threads = 256>
__global__ void mse(const float* y, const float* t, float* dy, float* loss, int count) {
  __shared__ float part[Threads];
  const float scale = 1.0f / float(count);
  float acc = 0.0f;
  for (int k = threadIdx.x; k < count; k += Threads) {
    const float d = y[k] - t[k];
    acc += d * d;
    dy[k] = 2.0f * d * scale;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = Threads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] * scale;
}

using examples::blocks;

/// Trains on this rank's slice of every global batch; all ranks call it together. Policy's backend is CUDA.
template <class Policy>
mlp::result train(typename Policy::communicator& comm, const mlp::config& c, gemm_kind kind = gemm_kind::cublas) {
  const int world = comm.size(), rank = comm.rank();
  if (c.global_batch % world != 0)
    throw fsdp::usage_error("global batch " + std::to_string(c.global_batch) + " does not split over " +
                            std::to_string(world) + " ranks");
  const int n = c.global_batch / world;
  const std::size_t layers = c.dims.size() - 1;
  fsdp::Model<Policy> model(comm, mlp::make_spec(c), fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{}, c.model);
  auto& be = model.backend();
  auto& cs = be.compute_stream();

  gemm mm(kind, cs.get());

  // Activations and their gradients (the user's buffers; the library's memory figures do not include them).
  auto device_floats = [&](std::size_t count) {
    float* p = nullptr;
    FSDP_CUDA_CHECK(cudaMalloc(&p, count * sizeof(float) + 16));
    return p;
  };
  std::vector<float*> act(layers + 1), dact(layers + 1);
  for (std::size_t l = 0; l <= layers; ++l) {
    act[l] = device_floats(std::size_t(n) * c.dims[l]);
    dact[l] = device_floats(std::size_t(n) * c.dims[l]);
  }
  float* target = device_floats(std::size_t(n) * c.dims.back());
  float* loss_d = device_floats(1);
  struct free_all {
    std::vector<float*> ptrs;
    ~free_all() {
      for (float* p : ptrs) FSDP_CUDA_LOG(cudaFree(p));
    }
  } cleanup{[&] {
    std::vector<float*> all(act);
    all.insert(all.end(), dact.begin(), dact.end());
    all.push_back(target);
    all.push_back(loss_d);
    return all;
  }()};

  auto run = [&](auto& opt) {
    mlp::result r;
    r.planned = fsdp::plan_memory(model, opt.states_per_element()).peak;
    std::vector<float> x, t;
    const auto t0 = std::chrono::steady_clock::now();
    for (int step = 0; step < c.steps; ++step) {
      mlp::make_batch(c, step, rank * n, n, x, t);
      be.upload(act[0], x.data(), std::int64_t(x.size() * 4), cs);
      be.upload(target, t.data(), std::int64_t(t.size() * 4), cs);
      std::size_t l = 0;
      for (auto& unit : model.forward()) {
        const int in = c.dims[l], out = c.dims[l + 1];
        // y[n,out] = x[n,in] W^T (row-major), as column-major: Y(out x n) = W^T(col) ... see the README.
        mm(true, false, out, n, in, 1.0f, unit.param(mlp::wname(l)).data(), in, act[l], in, 0.0f, act[l + 1], out);
        bias_act<><<<blocks(n * out), 256, 0, cs.get()>>>(act[l + 1], unit.param(mlp::bname(l)).data(), n, out,
                                                          l + 1 < layers);
        FSDP_CUDA_CHECK(cudaGetLastError());
        ++l;
      }
      mse<><<<1, 256, 0, cs.get()>>>(act[layers], target, dact[layers], loss_d, n * c.dims.back());
      FSDP_CUDA_CHECK(cudaGetLastError());
      for (auto& unit : model.backward()) {
        --l;
        const int in = c.dims[l], out = c.dims[l + 1];
        if (l + 1 < layers) relu_mask<><<<blocks(n * out), 256, 0, cs.get()>>>(dact[l + 1], act[l + 1], n * out);
        // dW[out,in] += dy^T x ; db += sum dy ; dx[n,in] = dy W
        mm(false, true, in, out, n, 1.0f, act[l], in, dact[l + 1], out, 1.0f, unit.grad(mlp::wname(l)).data(), in);
        bias_grad<><<<blocks(out), 256, 0, cs.get()>>>(unit.grad(mlp::bname(l)).data(), dact[l + 1], n, out);
        FSDP_CUDA_CHECK(cudaGetLastError());
        if (l > 0)
          mm(false, false, in, n, out, 1.0f, unit.param(mlp::wname(l)).data(), in, dact[l + 1], out, 0.0f, dact[l], in);
      }
      opt.step();
      opt.zero_grad();
      // The printed loss is the global mean: the average of the ranks' local means.
      model.comm().all_reduce(loss_d, loss_d, 1, fsdp::dtype::f32, fsdp::reduce_op::avg, cs);
      float loss = 0;
      be.synchronize(cs);  // the watched wait first: a copy into pageable memory blocks until the stream drains
      be.download(&loss, loss_d, 4, cs);
      be.synchronize(cs);
      r.losses.push_back(loss);
      if (c.verbose && rank == 0) std::printf("step %3d  loss %.6f\n", step, loss);
    }
    model.synchronize();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.memory = model.memory();
    r.params = fsdp::weights::gather_full_params(model);
    return r;
  };
  return mlp::with_optimizer(model, c, run);
}

}  // namespace mlp_cuda
