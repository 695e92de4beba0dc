// Data-movement kernels against cudaMemcpy device-to-device, measured in the same run, 1 MiB to 1 GiB (of fp32
// input). GB/s counts bytes read + written:
//   memcpy D2D        read n*4, write n*4                      (the baseline)
//   copy-in           fp32 master -> bf16 gather input         read n*4, write n*2
//   rs-prep           fp32 grads * 1/8 -> bf16 reduce input    read n*4, write n*2
//   copy-out          bf16 reduced grads accumulated into fp32 read n*2 + n*4, write n*4
//   adamw             the fused AdamW update (p, g, m, v)      read n*16, write n*12
//   sgd               SGD with momentum (p, g, buf)            read n*12, write n*8
//   quant             fp32 master -> fp8 E4M3 in blocks of 32  read n*4, write n + n/8 (a scale per block)
//                     (a gather's slice: kernels/quantize.hpp, a warp's lanes per block)
//   dq-sum            four ranks' int8 slices of a shard of    read 4 (n/4 + n/32), read n + write n fp32
//                     n/4 elements dequantized, averaged and   (per shard element: 4 values, their scales, the shard)
//                     added into it (a quantized reduction's
//                     end, four elements a thread)
//   reduce            comm::local's reduction of 4 ranks' fp32 read 4 * n/4 * 4, write n/4 * 4
//                     (n/4 elements each; one GPU)
// Goal: each kernel >= 90% of the memcpy bandwidth from 32 MiB up. Prints a table, then one JSON line.
// Without a GPU it prints one "skipped:" line.
#include <cstdio>
#include <string>
#include <vector>

#include <fsdp/fsdp.cuh>
#include <fsdp/kernels/quantize.hpp>
#include <fsdp/optim/adamw.hpp>
#include <fsdp/optim/sgd.hpp>

namespace {

template <class F>
double best_ms(F&& f, cudaStream_t s, int iters) {
  cudaEvent_t a, b;
  FSDP_CUDA_CHECK(cudaEventCreate(&a));
  FSDP_CUDA_CHECK(cudaEventCreate(&b));
  f();  // warm-up
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    FSDP_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    FSDP_CUDA_CHECK(cudaEventRecord(b, s));
    FSDP_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    FSDP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, double(ms));
  }
  FSDP_CUDA_CHECK(cudaEventDestroy(a));
  FSDP_CUDA_CHECK(cudaEventDestroy(b));
  return best;
}

}  // namespace

int main() {
  const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
  if (p.count == 0) {
    std::printf("skipped: no CUDA device (%s)\n", p.reason.c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  FSDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  fsdp::backend::cuda be(0, {.device = 0});
  auto& s = be.compute_stream();
  const std::int64_t max_n = (std::int64_t{1} << 30) / 4;
  auto f32a = be.allocate(max_n * 4, fsdp::mem::comm_buffers, s);
  auto f32b = be.allocate(max_n * 4, fsdp::mem::comm_buffers, s);
  auto h16 = be.allocate(max_n * 2, fsdp::mem::comm_buffers, s);
  auto f32m = be.allocate(max_n * 4, fsdp::mem::comm_buffers, s);
  auto f32v = be.allocate(max_n * 4, fsdp::mem::comm_buffers, s);
  be.fill_zero(f32a.data(), max_n * 4, s);
  be.fill_zero(f32b.data(), max_n * 4, s);
  be.fill_zero(h16.data(), max_n * 2, s);
  be.fill_zero(f32m.data(), max_n * 4, s);
  be.fill_zero(f32v.data(), max_n * 4, s);
  namespace od = fsdp::optim::detail;
  const od::adamw_coeffs adamw{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.1f, 0.001f};
  const od::sgd_coeffs sgd{1e-2f, 0.9f, 0.0f};
  std::printf("device: %s\n%10s %12s %12s %8s %12s %8s %12s %8s %12s %8s %12s %8s %12s %8s %12s %8s %12s %8s\n",
              prop.name, "MiB(fp32)", "memcpy GB/s", "copy-in", "ratio", "rs-prep", "ratio", "copy-out", "ratio",
              "adamw", "ratio", "sgd", "ratio", "quant", "ratio", "dq-sum", "ratio", "reduce", "ratio");
  namespace kq = fsdp::kernels;
  std::string json = "{\"bench\":\"cuda_kernels\",\"device\":\"" + std::string(prop.name) + "\",\"rows\":[";
  for (std::int64_t mib = 1; mib <= 1024; mib *= 2) {
    const std::int64_t n = mib * (1 << 20) / 4;
    const int iters = mib >= 256 ? 10 : 50;
    const double t_copy = best_ms([&] { be.copy(f32b.data(), f32a.data(), n * 4, s); }, s.get(), iters);
    const double t_in = best_ms(
        [&] { be.convert(h16.data(), fsdp::dtype::bf16, f32a.data(), fsdp::dtype::f32, n, 1.0f, s); }, s.get(), iters);
    const double t_rs =
        best_ms([&] { be.convert(h16.data(), fsdp::dtype::bf16, f32a.data(), fsdp::dtype::f32, n, 0.125f, s); },
                s.get(), iters);
    const double t_out =
        best_ms([&] { be.accumulate(f32b.as<float>(), h16.data(), fsdp::dtype::bf16, n, 1.0f, s); }, s.get(), iters);
    const double t_adamw = best_ms(
        [&] {
          be.for_each(
              n, od::adamw_elements{f32a.as<float>(), f32b.as<float>(), f32m.as<float>(), f32v.as<float>(), adamw, {}},
              s);
        },
        s.get(), iters);
    const double t_sgd = best_ms([&] {
      be.for_each(n, od::sgd_elements{f32a.as<float>(), f32b.as<float>(), f32m.as<float>(), sgd, {}}, s);
    }, s.get(), iters);
    // a gather's quantization: n fp32 into one slice of n values and n / 32 scales (in h16 and beyond: n * 1.125 bytes
    // fit in the n * 2 of h16)
    auto* wire = h16.as<std::uint8_t>();
    const double t_quant = best_ms(
        [&] {
          be.for_each(
              n / 32,
              kq::block_quantize<fsdp::dtype::f32, fsdp::dtype::f8e4m3>{f32a.as<float>(), wire, n, 32, n + n / 8}, s);
        },
        s.get(), iters);
    // a quantized reduction's end: 4 ranks' slices of a shard of n / 4 (each n / 4 values and n / 128 scales)
    const std::int64_t shard = n / 4, slice = shard + shard / 8;
    const double t_dqsum = best_ms(
        [&] {
          be.for_each(
              shard,
              kq::block_dequantize_sum<fsdp::dtype::i8>{wire, f32b.as<float>(), shard, 32, slice, 4, 0.25f, 1.0f}, s);
        },
        s.get(), iters);
    // comm::local on one GPU: 4 ranks' n / 4 fp32 elements reduced into one
    fsdp::cuda::kernels::reduce_ranks_params<fsdp::dtype::f32> red{};
    for (int q = 0; q < 4; ++q) red.src[q] = f32a.as<float>() + q * shard;
    red.dst = f32b.as<float>();
    red.n = shard;
    red.world = 4;
    red.premul = 1.0f;
    const double t_reduce = best_ms([&] { fsdp::cuda::kernels::reduce_ranks(red, s.get()); }, s.get(), iters);
    auto gbs = [](double bytes, double ms) { return bytes / (ms * 1e6); };
    const double copy = gbs(8.0 * n, t_copy), in = gbs(6.0 * n, t_in), rs = gbs(6.0 * n, t_rs),
                 out = gbs(10.0 * n, t_out);
    const double aw = gbs(28.0 * n, t_adamw), sg = gbs(20.0 * n, t_sgd);
    const double qt = gbs(4.0 * n + 1.125 * n, t_quant);
    const double dq = gbs(4.0 * 1.125 * double(shard) + 8.0 * double(shard), t_dqsum);
    const double rd = gbs(4.0 * 4.0 * double(shard) + 4.0 * double(shard), t_reduce);
    std::printf(
        "%10lld %12.1f %12.1f %8.3f %12.1f %8.3f %12.1f %8.3f %12.1f %8.3f %12.1f %8.3f %12.1f %8.3f %12.1f %8.3f "
        "%12.1f %8.3f\n",
        static_cast<long long>(mib), copy, in, in / copy, rs, rs / copy, out, out / copy, aw, aw / copy, sg, sg / copy,
        qt, qt / copy, dq, dq / copy, rd, rd / copy);
    char row[400];
    std::snprintf(row, sizeof row,
                  "%s{\"mib\":%lld,\"memcpy\":%.1f,\"copy_in\":%.1f,\"rs_prep\":%.1f,\"copy_out\":%.1f,"
                  "\"adamw\":%.1f,\"sgd\":%.1f,\"quant\":%.1f,\"dq_sum\":%.1f,\"reduce\":%.1f}",
                  mib == 1 ? "" : ",", static_cast<long long>(mib), copy, in, rs, out, aw, sg, qt, dq, rd);
    json += row;
  }
  std::printf("%s]}\n", json.c_str());
  return 0;
}
