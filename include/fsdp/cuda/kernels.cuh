#pragma once
// The CUDA backend's kernels. Each applies the per-element logic shared with the host backend
// (fsdp/kernels/elementwise.hpp, and the element functions for_each runs), so results equal the host backend's bit
// for bit.
//
// Header hygiene (STYLE.md): kernels are templates with hidden visibility, launched only from this header's
// inline launchers, never explicitly instantiated; their parameters are trivially copyable structs.
// Data-movement kernels use 16-byte (fp32) / 8-byte (16-bit) vector loads and stores when both pointers allow
// it, and a scalar path otherwise: any alignment and size is correct, empty ranges launch nothing. for_each does
// the same for an ArrayFunction (the optimizers' updates: fsdp/kernels/array_function.hpp) and a QuadFunction (the
// block dequantizations), and runs a BlockFunction (the block quantization) a warp's lanes per block
// (fsdp/kernels/cooperative.hpp). tools/sass-check fails when one of these kernels loses its 128-bit global
// accesses, its lanes' shuffles or its occupancy.
#include <cuda_runtime_api.h>

#include <cub/device/device_reduce.cuh>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/float16.hpp"
#include "fsdp/cuda/error.cuh"
#include "fsdp/kernels/array_function.hpp"
#include "fsdp/kernels/cooperative.hpp"
#include "fsdp/kernels/elementwise.hpp"

#define FSDP_KERNEL __global__ __attribute__((visibility("hidden")))

namespace fsdp::cuda::kernels {

/// Launch shape of the grid-stride kernels (tuning knobs, apart from the algorithms).
struct launch_tuning {
  static constexpr int threads = 256;
  static constexpr std::int64_t max_blocks = 132 * 16;  ///< enough to fill an H100/H200 several times over
  static constexpr int vector_width = 4;                ///< elements per vector access
};

inline int blocks_for(std::int64_t work) {
  const std::int64_t b = (work + launch_tuning::threads - 1) / launch_tuning::threads;
  return static_cast<int>(std::clamp<std::int64_t>(b, 1, launch_tuning::max_blocks));
}

template <class T, int N>
struct alignas(sizeof(T) * N) vec {
  T v[N];
};

inline bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// ---- convert: dst = D(float(src) * scale) ----------------------------------------------------------------------
template <dtype D, dtype S>
struct convert_params {
  lowp::storage_t<D>* dst;
  const lowp::storage_t<S>* src;
  std::int64_t n;
  float scale;
  bool vectorised;
};

template <dtype D, dtype S>
FSDP_KERNEL void convert_kernel(convert_params<D, S> p) {
  constexpr int W = launch_tuning::vector_width;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (p.vectorised) {
    using vin = vec<lowp::storage_t<S>, W>;
    using vout = vec<lowp::storage_t<D>, W>;
    const std::int64_t nv = p.n / W;
    const vin* in = reinterpret_cast<const vin*>(p.src);
    vout* out = reinterpret_cast<vout*>(p.dst);
    for (std::int64_t i = tid; i < nv; i += stride) {
      const vin x = in[i];
      vout y;
#pragma unroll
      for (int k = 0; k < W; ++k) y.v[k] = fsdp::kernels::convert_one<D, S>(x.v[k], p.scale);
      out[i] = y;
    }
    done = nv * W;
  }
  for (std::int64_t i = done + tid; i < p.n; i += stride)
    p.dst[i] = fsdp::kernels::convert_one<D, S>(p.src[i], p.scale);
}

template <dtype D, dtype S>
void convert(lowp::storage_t<D>* dst, const lowp::storage_t<S>* src, std::int64_t n, float scale, cudaStream_t s) {
  if (n <= 0) return;
  using P = convert_params<D, S>;
  static_assert(std::is_trivially_copyable_v<P>, "kernel parameters must be trivially copyable");
  constexpr int W = launch_tuning::vector_width;
  const bool v = aligned(dst, sizeof(*dst) * W) && aligned(src, sizeof(*src) * W);
  convert_kernel<D, S><<<blocks_for(v ? n / W + 1 : n), launch_tuning::threads, 0, s>>>(P{dst, src, n, scale, v});
  FSDP_CUDA_CHECK(cudaGetLastError());
}

/// Runtime-dtype form of convert (the backend's interface).
inline void convert(void* dst, dtype dst_type, const void* src, dtype src_type, std::int64_t n, float scale,
                    cudaStream_t s) {
  fsdp::kernels::dispatch(dst_type, [&](auto d) {
    fsdp::kernels::dispatch(src_type, [&](auto t) {
      convert<d(), t()>(static_cast<lowp::storage_t<d()>*>(dst), static_cast<const lowp::storage_t<t()>*>(src), n,
                        scale, s);
    });
  });
}

// ---- accumulate: dst (fp32) += float(src) * scale --------------------------------------------------------------
template <dtype S>
struct accumulate_params {
  float* dst;
  const lowp::storage_t<S>* src;
  std::int64_t n;
  float scale;
  bool vectorised;
};

template <dtype S>
FSDP_KERNEL void accumulate_kernel(accumulate_params<S> p) {
  constexpr int W = launch_tuning::vector_width;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (p.vectorised) {
    using vin = vec<lowp::storage_t<S>, W>;
    using vacc = vec<float, W>;
    const std::int64_t nv = p.n / W;
    const vin* in = reinterpret_cast<const vin*>(p.src);
    vacc* acc = reinterpret_cast<vacc*>(p.dst);
    for (std::int64_t i = tid; i < nv; i += stride) {
      const vin x = in[i];
      vacc a = acc[i];
#pragma unroll
      for (int k = 0; k < W; ++k) fsdp::kernels::accumulate_one<S>(a.v[k], x.v[k], p.scale);
      acc[i] = a;
    }
    done = nv * W;
  }
  for (std::int64_t i = done + tid; i < p.n; i += stride) fsdp::kernels::accumulate_one<S>(p.dst[i], p.src[i], p.scale);
}

inline void accumulate(float* dst, const void* src, dtype src_type, std::int64_t n, float scale, cudaStream_t s) {
  if (n <= 0) return;
  constexpr int W = launch_tuning::vector_width;
  fsdp::kernels::dispatch(src_type, [&](auto t) {
    using P = accumulate_params<t()>;
    static_assert(std::is_trivially_copyable_v<P>, "kernel parameters must be trivially copyable");
    const auto* in = static_cast<const lowp::storage_t<t()>*>(src);
    const bool v = aligned(dst, sizeof(float) * W) && aligned(in, sizeof(*in) * W);
    accumulate_kernel<t()><<<blocks_for(v ? n / W + 1 : n), launch_tuning::threads, 0, s>>>(P{dst, in, n, scale, v});
  });
  FSDP_CUDA_CHECK(cudaGetLastError());
}

// ---- for_each: f(i) for every i in [0, n) (Backend::for_each: an optimizer's update over a shard piece) ---------
template <class F>
FSDP_KERNEL void for_each_kernel(std::int64_t n, F f) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

/// An ArrayFunction (fsdp/kernels/array_function.hpp) whose arrays are all 16-byte aligned: four elements of each
/// array per 128-bit load and store, update() on each element in turn, f(i) for the remainder.
template <class F>
FSDP_KERNEL void for_each_arrays_kernel(std::int64_t n, F f) {
  constexpr int W = launch_tuning::vector_width;
  constexpr int K = F::array_count;
  using v4 = vec<float, W>;
  const fsdp::kernels::fp32_arrays<K> a = f.arrays();
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t nv = n / W;
  for (std::int64_t i = tid; i < nv; i += stride) {
    v4 x[K];
#pragma unroll
    for (int k = 0; k < K; ++k) x[k] = a.at[k] ? reinterpret_cast<const v4*>(a.at[k])[i] : v4{};
#pragma unroll
    for (int l = 0; l < W; ++l) {
      float e[K];
#pragma unroll
      for (int k = 0; k < K; ++k) e[k] = x[k].v[l];
      f.update(e, i * W + l);
#pragma unroll
      for (int k = 0; k < K; ++k) x[k].v[l] = e[k];
    }
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (a.at[k] && ((a.writes >> k) & 1u)) reinterpret_cast<v4*>(a.at[k])[i] = x[k];
  }
  for (std::int64_t i = nv * W + tid; i < n; i += stride) f(i);
}

/// A QuadFunction whose quads() holds: elements 4q .. 4q + 3 by f.quad(q), the remainder by f(i).
template <class F>
FSDP_KERNEL void for_each_quads_kernel(std::int64_t n, F f) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t nq = n / 4;
  for (std::int64_t q = tid; q < nq; q += stride) f.quad(q);
  for (std::int64_t i = nq * 4 + tid; i < n; i += stride) f(i);
}

/// A BlockFunction over `blocks` blocks: `lanes` consecutive lanes of a warp per block (a power of two, at most
/// 32, at most the block's size); lane l takes the block's elements l, l + lanes, ..., their extents are merged
/// across the lanes with shuffles, and each lane emits its own elements under the block's scale (lane 0 writes
/// it). Every lane of a warp runs the same iterations, so that the shuffles see the whole warp.
template <class F>
FSDP_KERNEL void __launch_bounds__(launch_tuning::threads, 6)  // 40 registers: 75% occupancy (tools/sass-check)
    for_each_block_kernel(std::int64_t blocks, F f, int lanes) {
  const int in_warp = static_cast<int>(threadIdx.x & 31u);
  const int lane = in_warp & (lanes - 1);
  const std::int64_t thread = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t groups = std::int64_t(gridDim.x) * blockDim.x / lanes;  // blocks taken per pass of the grid
  const std::int64_t warp_first = (thread - in_warp) / lanes;                 // this warp's first block per pass
  const int block = static_cast<int>(f.block);
  for (std::int64_t base = warp_first; base < blocks; base += groups) {
    const std::int64_t b = base + in_warp / lanes;
    const bool live = b < blocks;
    fsdp::kernels::block_extent e;
    const auto p = f.place(live ? b : base);
    if (live)
      for (int k = lane; k < block; k += lanes) e = e.merge(f.extent_of(p, k));
    for (int off = lanes / 2; off > 0; off /= 2) {
      fsdp::kernels::block_extent o;
      o.max = __shfl_xor_sync(0xffffffffu, e.max, off);
      o.nan = __shfl_xor_sync(0xffffffffu, e.nan ? 1 : 0, off) != 0;
      e = e.merge(o);
    }
    if (live) {
      const float scale = f.scale_of(e);
      if (lane == 0) f.write_scale(p, scale);
      for (int k = lane; k < block; k += lanes) f.emit(p, k, scale);
    }
  }
}

/// The lanes a BlockFunction's block of `block` elements gets: the largest power of two up to 32 and the block.
inline int lanes_for(std::int64_t block) {
  int lanes = 1;
  while (lanes < 32 && lanes * 2 <= block) lanes *= 2;
  return lanes;
}

template <class F>
void for_each(std::int64_t n, const F& f, cudaStream_t s) {
  static_assert(std::is_trivially_copyable_v<F>, "kernel parameters must be trivially copyable");
  if (n <= 0) return;
  if constexpr (fsdp::kernels::BlockFunction<F>) {
    if (f.block > 0) {
      const int lanes = lanes_for(f.block);
      const std::int64_t threads = n * lanes;  // a warp per 32 / lanes blocks
      for_each_block_kernel<F><<<blocks_for((threads + 31) / 32 * 32), launch_tuning::threads, 0, s>>>(n, f, lanes);
      FSDP_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  if constexpr (fsdp::kernels::QuadFunction<F>) {
    if (f.quads()) {
      for_each_quads_kernel<F><<<blocks_for(n / 4 + 1), launch_tuning::threads, 0, s>>>(n, f);
      FSDP_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  if constexpr (fsdp::kernels::ArrayFunction<F>) {
    constexpr int W = launch_tuning::vector_width;
    const auto a = f.arrays();
    bool v = true;
    for (const float* p : a.at) v = v && (!p || aligned(p, sizeof(float) * W));
    if (v) {
      for_each_arrays_kernel<F><<<blocks_for(n / W + 1), launch_tuning::threads, 0, s>>>(n, f);
      FSDP_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  for_each_kernel<F><<<blocks_for(n), launch_tuning::threads, 0, s>>>(n, f);
  FSDP_CUDA_CHECK(cudaGetLastError());
}

// ---- reduction over the ranks of an in-process group on one GPU (comm::local on the CUDA backend) ---------------
template <dtype D>
struct reduce_ranks_params {
  static constexpr int max_ranks = 64;
  const lowp::storage_t<D>* src[max_ranks];
  lowp::storage_t<D>* dst;
  std::int64_t n;
  int world;
  float premul;  ///< kernels::average_factor<D>(world) for an average, 1 for a sum
};
inline constexpr int max_local_ranks = reduce_ranks_params<dtype::f32>::max_ranks;

/// dst[i] = the reduction of src[q][i] over ranks q by kernels::reduce_add: the same operations, in the same
/// order, as the host local communicator. `vectorised`: every pointer is aligned for four elements, which each
/// thread then takes at once (16 bytes of fp32, 8 of a 16-bit type), the remainder one by one.
template <dtype D>
FSDP_KERNEL void reduce_ranks_kernel(reduce_ranks_params<D> a, bool vectorised) {
  constexpr int W = launch_tuning::vector_width;
  using T = lowp::storage_t<D>;
  using v4 = vec<T, W>;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vectorised) {
    const std::int64_t nv = a.n / W;
    for (std::int64_t i = tid; i < nv; i += stride) {
      float acc[W] = {};
      for (int q = 0; q < a.world; ++q) {
        const v4 x = reinterpret_cast<const v4*>(a.src[q])[i];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = fsdp::kernels::reduce_add<D>(acc[k], x.v[k], a.premul);
      }
      v4 y;
#pragma unroll
      for (int k = 0; k < W; ++k) y.v[k] = lowp::from_float<D>(acc[k]);
      reinterpret_cast<v4*>(a.dst)[i] = y;
    }
    done = nv * W;
  }
  for (std::int64_t i = done + tid; i < a.n; i += stride) {
    float acc = 0.0f;
    for (int q = 0; q < a.world; ++q) acc = fsdp::kernels::reduce_add<D>(acc, a.src[q][i], a.premul);
    a.dst[i] = lowp::from_float<D>(acc);
  }
}

template <dtype D>
void reduce_ranks(const reduce_ranks_params<D>& a, cudaStream_t s) {
  static_assert(std::is_trivially_copyable_v<reduce_ranks_params<D>>, "kernel parameters must be trivially copyable");
  if (a.n <= 0) return;
  constexpr int W = launch_tuning::vector_width;
  constexpr std::size_t bytes = sizeof(lowp::storage_t<D>) * W;
  bool v = aligned(a.dst, bytes);
  for (int q = 0; q < a.world; ++q) v = v && aligned(a.src[q], bytes);
  reduce_ranks_kernel<D><<<blocks_for(v ? a.n / W + 1 : a.n), launch_tuning::threads, 0, s>>>(a, v);
  FSDP_CUDA_CHECK(cudaGetLastError());
}

// ---- the build's float mode -------------------------------------------------------------------------------------
template <int = 0>
FSDP_KERNEL void subnormal_probe_kernel(float* x) {
  x[1] = rn::add(x[0], 0.0f);
}
/// Whether the kernels of this translation unit keep subnormals (they flush them to zero when built with nvcc
/// --use_fast_math or -ftz=true). `scratch`: 2 floats of device memory. Blocks on `s`; for start-up only.
inline bool kernels_keep_subnormals(float* scratch, cudaStream_t s) {
  const float in[2] = {1.0e-40f, 1.0f};  // 1e-40 is subnormal in fp32
  float out[2] = {0.0f, 0.0f};
  FSDP_CUDA_CHECK(cudaMemcpyAsync(scratch, in, sizeof in, cudaMemcpyHostToDevice, s));
  subnormal_probe_kernel<<<1, 1, 0, s>>>(scratch);
  FSDP_CUDA_CHECK(cudaGetLastError());
  FSDP_CUDA_CHECK(cudaStreamSynchronize(s));
  FSDP_CUDA_CHECK(cudaMemcpy(out, scratch, sizeof out, cudaMemcpyDeviceToHost));
  return out[1] == in[0];
}

// ---- squared L2 norm with CUB ----------------------------------------------------------------------------------
struct square {
  __host__ __device__ float operator()(float x) const { return x * x; }
};
struct plus {
  __host__ __device__ float operator()(float a, float b) const { return a + b; }
};

/// Bytes of temporary storage squared_norm needs for n elements.
inline std::size_t squared_norm_temp_bytes(std::int64_t n) {
  std::size_t bytes = 0;
  FSDP_CUDA_CHECK(cub::DeviceReduce::TransformReduce(nullptr, bytes, static_cast<const float*>(nullptr),
                                                     static_cast<float*>(nullptr), n, plus{}, square{}, 0.0f));
  return bytes;
}
/// *out = sum of x[i]^2, in fp32 (CUB's reduction order: not bit-equal to the host backend's double sum).
inline void squared_norm(const float* x, std::int64_t n, float* out, void* temp, std::size_t temp_bytes,
                         cudaStream_t s) {
  FSDP_CUDA_CHECK(cub::DeviceReduce::TransformReduce(temp, temp_bytes, x, out, n, plus{}, square{}, 0.0f, s));
}

}  // namespace fsdp::cuda::kernels
