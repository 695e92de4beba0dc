// Data-movement kernels against cudaMemcpy device-to-device, measured in the same run, 1 MiB to 1 GiB (of fp32
// input). GB/s counts bytes read + written:
//   memcpy D2D        read n*4, write n*4                      (the baseline)
//   copy-in           fp32 master -> bf16 gather input         read n*4, write n*2
//   rs-prep           fp32 grads * 1/8 -> bf16 reduce input    read n*4, write n*2
//   copy-out          bf16 reduced grads accumulated into fp32 read n*2 + n*4, write n*4
// Goal: each kernel >= 90% of the memcpy bandwidth from 32 MiB up. Prints a table, then one JSON line.
// Without a GPU it prints one "skipped:" line.
#include <cstdio>
#include <string>
#include <vector>

#include <fsdp/fsdp.cuh>

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
  be.fill_zero(f32a.data(), max_n * 4, s);
  be.fill_zero(f32b.data(), max_n * 4, s);
  be.fill_zero(h16.data(), max_n * 2, s);
  std::printf("device: %s\n%10s %12s %12s %8s %12s %8s %12s %8s\n", prop.name, "MiB(fp32)", "memcpy GB/s",
              "copy-in", "ratio", "rs-prep", "ratio", "copy-out", "ratio");
  std::string json = "{\"bench\":\"cuda_kernels\",\"device\":\"" + std::string(prop.name) + "\",\"rows\":[";
  for (std::int64_t mib = 1; mib <= 1024; mib *= 2) {
    const std::int64_t n = mib * (1 << 20) / 4;
    const int iters = mib >= 256 ? 10 : 50;
    const double t_copy = best_ms([&] { be.copy(f32b.data(), f32a.data(), n * 4, s); }, s.get(), iters);
    const double t_in = best_ms([&] { be.convert(h16.data(), fsdp::dtype::bf16, f32a.data(), fsdp::dtype::f32, n, 1.0f, s); }, s.get(), iters);
    const double t_rs = best_ms([&] { be.convert(h16.data(), fsdp::dtype::bf16, f32a.data(), fsdp::dtype::f32, n, 0.125f, s); }, s.get(), iters);
    const double t_out = best_ms([&] { be.accumulate(f32b.as<float>(), h16.data(), fsdp::dtype::bf16, n, 1.0f, s); }, s.get(), iters);
    auto gbs = [](double bytes, double ms) { return bytes / (ms * 1e6); };
    const double copy = gbs(8.0 * n, t_copy), in = gbs(6.0 * n, t_in), rs = gbs(6.0 * n, t_rs), out = gbs(10.0 * n, t_out);
    std::printf("%10lld %12.1f %12.1f %8.3f %12.1f %8.3f %12.1f %8.3f\n", static_cast<long long>(mib), copy, in,
                in / copy, rs, rs / copy, out, out / copy);
    char row[256];
    std::snprintf(row, sizeof row, "%s{\"mib\":%lld,\"memcpy\":%.1f,\"copy_in\":%.1f,\"rs_prep\":%.1f,\"copy_out\":%.1f}",
                  mib == 1 ? "" : ",", static_cast<long long>(mib), copy, in, rs, out);
    json += row;
  }
  std::printf("%s]}\n", json.c_str());
  return 0;
}
