// The CUDA backend's kernels against the host backend's: the same inputs through both backends' interfaces,
// results compared bit for bit (convert, accumulate, SGD, AdamW: 0 ULP, since both run the same per-element
// code with one rounding per operation) or within a stated bound (the CUB squared norm, whose summation order
// differs: relative 1e-5 of the double-precision sum). Sizes 0, 1, odd and (on a real GPU) large; pointers offset
// by 0..3 elements so the vector paths and the scalar fallbacks both run. Every device buffer is followed by guard
// bytes that must come back untouched, and no read may go past a buffer: a kernel or a test that writes out of
// bounds fails here, on a real GPU and on the simulated one alike (which checks no bounds itself).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.cuh>
#include <fsdp/optim/lion.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu.hpp"

namespace {

using fsdp::dtype;

std::vector<float> inputs(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  const float specials[] = {0.0f, -0.0f, 65520.0f, std::ldexp(3.0f, -26), std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1.00390625f, std::ldexp(1.0f, -130)};
  for (std::size_t i = 0; i < n; ++i)
    v[i] = i % 17 == 5 ? specials[(i / 17) % 8]
                       : std::ldexp(std::uniform_real_distribution<float>(-1, 1)(gen), int(gen() % 30) - 15);
  return v;
}

constexpr std::size_t guard_bytes = 256;
constexpr char guard_value = 0x5a;

/// Device copy of host bytes, with `pad` bytes before it (for misalignment) and guard bytes after it, inside one
/// allocation.
struct device_bytes {
  fsdp::backend::cuda& be;
  fsdp::backend::cuda::buffer buf;
  std::size_t pad, size;
  device_bytes(fsdp::backend::cuda& b, const void* src, std::size_t bytes, std::size_t pad_bytes)
      : be(b),
        buf(b.allocate(std::int64_t(pad_bytes + bytes + guard_bytes), fsdp::mem::comm_buffers, b.compute_stream())),
        pad(pad_bytes),
        size(bytes) {
    be.upload(ptr(), src, std::int64_t(bytes), be.compute_stream());
    const std::vector<char> guard(guard_bytes, guard_value);
    be.upload(ptr() + size, guard.data(), std::int64_t(guard_bytes), be.compute_stream());
    be.synchronize(be.compute_stream());  // the guard's pageable source goes out of scope
  }
  ~device_bytes() {
    try {
      CHECK_MESSAGE(guard_intact(), "a kernel wrote past the end of a ", size, "-byte buffer");
    } catch (...) {  // a failing device already failed the case
    }
  }
  char* ptr() const { return buf.as<char>() + pad; }
  std::vector<char> read(std::size_t bytes) {
    REQUIRE_MESSAGE(bytes <= size, "reading ", bytes, " bytes from a ", size, "-byte device buffer");
    std::vector<char> out(bytes);
    be.synchronize(be.compute_stream());  // the watched wait first: a copy to pageable memory blocks until done
    be.download(out.data(), ptr(), std::int64_t(bytes), be.compute_stream());
    be.synchronize(be.compute_stream());
    return out;
  }
  bool guard_intact() {
    std::vector<char> g(guard_bytes);
    be.synchronize(be.compute_stream());
    be.download(g.data(), ptr() + size, std::int64_t(guard_bytes), be.compute_stream());
    be.synchronize(be.compute_stream());
    return std::all_of(g.begin(), g.end(), [](char c) { return c == guard_value; });
  }
};

/// Sizes for the simulated GPU (seconds per case) and, on a real one, a large size too.
std::vector<std::int64_t> sizes_for(std::int64_t large) {
  std::vector<std::int64_t> s = {0, 1, 3, 4, 5, 1000, 4099};
  if (!fsdp_test::simulated_gpu()) s.push_back(large);
  return s;
}

bool same_bits(const std::vector<char>& a, const std::vector<char>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

/// fp32 values the same bit for bit, or both NaN: a sum with a NaN operand is the GPU's own NaN (add.f32 gives
/// 0x7fffffff) where x86 passes the operand's payload on, as in accumulate's check. Every other value, infinities and
/// signed zeros included, bit for bit.
bool same_f32_values(const std::vector<char>& got, const std::vector<char>& want) {
  if (got.size() != want.size() || got.size() % 4 != 0) return false;
  for (std::size_t i = 0; i < got.size(); i += 4) {
    float g, w;
    std::memcpy(&g, got.data() + i, 4);
    std::memcpy(&w, want.data() + i, 4);
    if (std::isnan(w) ? !std::isnan(g) : std::bit_cast<std::uint32_t>(g) != std::bit_cast<std::uint32_t>(w))
      return false;
  }
  return true;
}


}  // namespace

TEST_CASE("CUDA's fp8 types name the library's dtypes, and their saturating conversion gives the library's bits for "
          "every finite input sampled") {
  static_assert(fsdp::dtype_of_v<__nv_fp8_e4m3> == dtype::f8e4m3 && fsdp::dtype_of_v<__nv_fp8_e5m2> == dtype::f8e5m2);
  // __nv_fp8_*(float) saturates finite values (__NV_SATFINITE) and rounds to nearest even, as core/float8.hpp does;
  // the two differ on infinities only (CUDA: the largest finite value; the library: E5M2's infinity, E4M3's NaN)
  std::mt19937 gen(3);
  std::size_t compared = 0;
  for (int i = 0; i < 1000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(gen()));
    const float g = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen),
                               std::uniform_int_distribution<int>(-20, 18)(gen));  // the formats' own range
    for (float x : {f, g}) {
      if (!std::isfinite(x)) continue;
      ++compared;
      const __nv_fp8_e4m3 a(x);
      const __nv_fp8_e5m2 b(x);
      if (a.__x != fsdp::f8::from_float<fsdp::f8::e4m3>(x) || b.__x != fsdp::f8::from_float<fsdp::f8::e5m2>(x)) {
        FAIL_CHECK("fp8 conversions differ for ", x, " (bits ", std::bit_cast<std::uint32_t>(x), ")");
        return;
      }
    }
  }
  CHECK(compared > 1990000);
}

TEST_CASE("convert: every dtype pair, scales 1 and 1/4, any size and alignment, bit-exact with the host") {
  FSDP_REQUIRE_GPU();
  fsdp::backend::cuda gpu(0, fsdp_test::backend_options());
  fsdp::backend::host cpu;
  const std::vector<std::int64_t> sizes = sizes_for(1 << 20);
  for (const fsdp::dtype_row& src_row : fsdp::dtype_rows)  // every row: the fp8 formats' saturation too
    for (const fsdp::dtype_row& dst_row : fsdp::dtype_rows)
      for (float scale : {1.0f, 0.25f})
        for (std::int64_t n : sizes)
          for (std::size_t shift : {0u, 1u, 2u, 3u}) {
            const dtype src_t = src_row.tag, dst_t = dst_row.tag;
            CAPTURE(fsdp::name_of(src_t));
            CAPTURE(fsdp::name_of(dst_t));
            CAPTURE(scale);
            CAPTURE(n);
            CAPTURE(shift);
            // Source in its dtype, made on the host from fp32 values.
            const std::vector<float> f = inputs(std::size_t(n), std::uint32_t(n + shift));
            std::vector<char> src(std::size_t(n) * fsdp::size_of(src_t));
            cpu.convert(src.data(), src_t, f.data(), dtype::f32, n, 1.0f, cpu.compute_stream());
            std::vector<char> want(std::size_t(n) * fsdp::size_of(dst_t));
            cpu.convert(want.data(), dst_t, src.data(), src_t, n, scale, cpu.compute_stream());

            device_bytes d_src(gpu, src.data(), src.size(), shift * fsdp::size_of(src_t));
            const std::vector<char> stale(want.size(), 0x33);  // overwritten entirely, or the check fails
            device_bytes d_dst(gpu, stale.data(), stale.size(), (shift + 1) % 4 * fsdp::size_of(dst_t));
            gpu.convert(d_dst.ptr(), dst_t, d_src.ptr(), src_t, n, scale, gpu.compute_stream());
            CHECK(same_bits(d_dst.read(want.size()), want));
          }
}

TEST_CASE("accumulate into fp32 from every dtype, scales 1 and 3/8: bit-exact with the host") {
  FSDP_REQUIRE_GPU();
  fsdp::backend::cuda gpu(0, fsdp_test::backend_options());
  fsdp::backend::host cpu;
  const std::vector<std::int64_t> sizes = sizes_for(1 << 20);
  for (const fsdp::dtype_row& src_row : fsdp::dtype_rows)
    for (float scale : {1.0f, 0.375f})
    for (std::int64_t n : sizes)
      for (std::size_t shift : {0u, 1u, 2u, 3u}) {
        const dtype src_t = src_row.tag;
        CAPTURE(fsdp::name_of(src_t));
        CAPTURE(scale);
        CAPTURE(n);
        CAPTURE(shift);
        const std::vector<float> f = inputs(std::size_t(n), 11);
        std::vector<char> src(std::size_t(n) * fsdp::size_of(src_t));
        cpu.convert(src.data(), src_t, f.data(), dtype::f32, n, 1.0f, cpu.compute_stream());
        std::vector<float> acc = inputs(std::size_t(n), 12);
        device_bytes d_acc(gpu, acc.data(), acc.size() * 4, shift * 4);
        device_bytes d_src(gpu, src.data(), src.size(), 0);
        cpu.accumulate(acc.data(), src.data(), src_t, n, scale, cpu.compute_stream());
        gpu.accumulate(reinterpret_cast<float*>(d_acc.ptr()), d_src.ptr(), src_t, n, scale, gpu.compute_stream());
        std::vector<char> want(acc.size() * 4);
        std::memcpy(want.data(), acc.data(), want.size());
        const std::vector<char> got = d_acc.read(want.size());
        // NaN + x may carry a different payload on the GPU; compare NaN-ness there, bits elsewhere.
        std::size_t bad = 0;
        for (std::size_t i = 0; i < acc.size(); ++i) {
          float g;
          std::memcpy(&g, got.data() + 4 * i, 4);
          if (std::isnan(acc[i]) ? !std::isnan(g)
                                 : std::bit_cast<std::uint32_t>(g) != std::bit_cast<std::uint32_t>(acc[i]))
            ++bad;
        }
        CHECK(bad == 0);
      }
}

TEST_CASE("the optimizers' element functions (SGD with and without momentum, AdamW, Lion) through for_each, with "
          "decay masks and gradient scales, 128-bit and scalar (a parameter array 4 bytes off 16): 0 ULP from the host "
          "over 5 steps") {
  FSDP_REQUIRE_GPU();
  fsdp::backend::cuda gpu(0, fsdp_test::backend_options());
  fsdp::backend::host cpu;
  fsdp::optim::detail::decay_mask mask;
  mask.count = 2;
  mask.begin[0] = 1;
  mask.end[0] = 7;
  mask.begin[1] = 100;
  mask.end[1] = 101;
  namespace od = fsdp::optim::detail;
  enum class optimizer { sgd, sgd_no_momentum, adamw, lion };
  for (std::int64_t n : sizes_for(1 << 18))
    for (optimizer opt : {optimizer::sgd, optimizer::sgd_no_momentum, optimizer::adamw, optimizer::lion})
    for (float grad_scale : {1.0f, 0.3f})
    for (std::size_t misalign : {std::size_t{0}, std::size_t{4}}) {
      CAPTURE(n);
      CAPTURE(int(opt));
      CAPTURE(grad_scale);
      CAPTURE(misalign);
      std::vector<float> p(static_cast<std::size_t>(n)), g, m(static_cast<std::size_t>(n), 0.0f),
          v(static_cast<std::size_t>(n), 0.0f);
      std::mt19937 gen(5);
      for (auto& x : p) x = std::uniform_real_distribution<float>(-2, 2)(gen);
      device_bytes dp(gpu, p.data(), p.size() * 4, misalign), dm(gpu, m.data(), m.size() * 4, 0),
          dv(gpu, v.data(), v.size() * 4, 0);
      for (int t = 1; t <= 5; ++t) {
        g.resize(std::size_t(n));
        for (auto& x : g) x = std::uniform_real_distribution<float>(-1, 1)(gen);
        device_bytes dg(gpu, g.data(), g.size() * 4, 0);
        auto* P = reinterpret_cast<float*>(dp.ptr());
        auto* G = reinterpret_cast<float*>(dg.ptr());
        auto* M = reinterpret_cast<float*>(dm.ptr());
        auto* V = reinterpret_cast<float*>(dv.ptr());
        switch (opt) {
          case optimizer::adamw: {
            const od::adamw_coeffs c{1e-2f,
                                     0.9f,
                                     0.999f,
                                     1e-8f,
                                     0.1f,
                                     fsdp::optim::bias_correction(0.9f, t),
                                     fsdp::optim::bias_correction(0.999f, t)};
            cpu.for_each(n, od::adamw_elements{p.data(), g.data(), m.data(), v.data(), c, mask, grad_scale},
                         cpu.compute_stream());
            gpu.for_each(n, od::adamw_elements{P, G, M, V, c, mask, grad_scale}, gpu.compute_stream());
            break;
          }
          case optimizer::sgd: {
            const od::sgd_coeffs c{0.05f, 0.9f, 0.01f};
            cpu.for_each(n, od::sgd_elements{p.data(), g.data(), m.data(), c, mask, grad_scale}, cpu.compute_stream());
            gpu.for_each(n, od::sgd_elements{P, G, M, c, mask, grad_scale}, gpu.compute_stream());
            break;
          }
          case optimizer::sgd_no_momentum: {
            const od::sgd_coeffs c{0.05f, 0.0f, 0.01f};
            cpu.for_each(n, od::sgd_elements{p.data(), g.data(), nullptr, c, mask, grad_scale}, cpu.compute_stream());
            gpu.for_each(n, od::sgd_elements{P, G, nullptr, c, mask, grad_scale}, gpu.compute_stream());
            break;
          }
          case optimizer::lion: {
            const od::lion_coeffs c{1e-3f, 0.9f, 0.99f, 0.5f};
            cpu.for_each(n, od::lion_elements{p.data(), g.data(), m.data(), c, mask, grad_scale}, cpu.compute_stream());
            gpu.for_each(n, od::lion_elements{P, G, M, c, mask, grad_scale}, gpu.compute_stream());
            break;
          }
        }
        gpu.synchronize(gpu.compute_stream());
      }
      auto bytes_of = [](const std::vector<float>& x) {
        std::vector<char> b(x.size() * 4);
        std::memcpy(b.data(), x.data(), b.size());
        return b;
      };
      CHECK(same_bits(dp.read(p.size() * 4), bytes_of(p)));
      CHECK(same_bits(dm.read(m.size() * 4), bytes_of(m)));
      if (opt == optimizer::adamw) CHECK(same_bits(dv.read(v.size() * 4), bytes_of(v)));
    }
}

TEST_CASE("block quantization and its dequantizations (fp8 and int8 gathers and reductions): a warp's lanes per "
          "block and four elements a thread, bit for bit with the host's loops, NaN and infinity included") {
  // kernels/quantize.hpp through for_each: block_quantize as a BlockFunction (lanes of a warp share a block),
  // block_dequantize and block_dequantize_sum as QuadFunctions (four elements a thread where aligned; `misalign`
  // moves the outputs off their alignment, which takes the one-element path). inputs() puts NaN, infinity,
  // subnormals and signed zeros among the values, so blocks with a NaN (int8: a NaN scale) and with an infinite
  // scale (every element NaN, 0 x infinity) are in every case.
  FSDP_REQUIRE_GPU();
  namespace k = fsdp::kernels;
  fsdp::backend::cuda gpu(0, fsdp_test::backend_options());
  fsdp::backend::host cpu;
  auto on_both = [&](auto tag_s, auto tag_q, std::int64_t block, int ranks, std::size_t misalign) {
    constexpr dtype S = decltype(tag_s)::value, Q = decltype(tag_q)::value;
    using storage = fsdp::lowp::storage_t<S>;
    const std::int64_t shard = 3 * block, slice = shard + shard / block * 4, n = shard * ranks;
    const std::vector<float> f = inputs(static_cast<std::size_t>(n), 11);
    std::vector<storage> src(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) src[i] = fsdp::lowp::from_float<S>(f[i]);
    // quantize: one slice per rank, pre-divided by 1/4
    std::vector<std::uint8_t> host_q(static_cast<std::size_t>(slice * ranks), 0);
    cpu.for_each(n / block, k::block_quantize<S, Q>{src.data(), host_q.data(), shard, block, slice, 0.25f},
                 cpu.compute_stream());
    device_bytes d_src(gpu, src.data(), src.size() * sizeof(storage), 0);
    std::vector<std::uint8_t> zero(host_q.size(), 0);
    device_bytes d_q(gpu, zero.data(), zero.size(), 0);
    gpu.for_each(n / block,
                 k::block_quantize<S, Q>{reinterpret_cast<const storage*>(d_src.ptr()),
                                         reinterpret_cast<std::uint8_t*>(d_q.ptr()), shard, block, slice, 0.25f},
                 gpu.compute_stream());
    std::vector<char> want(host_q.size());
    std::memcpy(want.data(), host_q.data(), want.size());
    CHECK(same_bits(d_q.read(want.size()), want));
    // dequantize the gathered slices into fp32 and bf16
    auto dequantize = [&](auto tag_d) {
      constexpr dtype D = decltype(tag_d)::value;
      using out_t = fsdp::lowp::storage_t<D>;
      CAPTURE(fsdp::name_of(D));
      std::vector<out_t> host_out(static_cast<std::size_t>(n));
      cpu.for_each(n, k::block_dequantize<D, Q>{host_q.data(), host_out.data(), shard, block, slice},
                   cpu.compute_stream());
      std::vector<out_t> init(host_out.size(), out_t{});
      device_bytes d_out(gpu, init.data(), init.size() * sizeof(out_t), misalign);
      device_bytes d_in(gpu, host_q.data(), host_q.size(), 0);
      gpu.for_each(n, k::block_dequantize<D, Q>{reinterpret_cast<const std::uint8_t*>(d_in.ptr()),
                                                reinterpret_cast<out_t*>(d_out.ptr()), shard, block, slice},
                   gpu.compute_stream());
      std::vector<char> w(host_out.size() * sizeof(out_t));
      std::memcpy(w.data(), host_out.data(), w.size());
      CHECK(same_bits(d_out.read(w.size()), w));
    };
    dequantize(std::integral_constant<dtype, dtype::f32>{});
    dequantize(std::integral_constant<dtype, dtype::bf16>{});
    // a quantized reduction's end: the ranks' slices (here: the slices above, as if each came from another rank)
    // dequantized, averaged and added into a shard, post-divided by 2
    std::vector<float> host_shard = inputs(static_cast<std::size_t>(shard), 12);
    device_bytes d_shard(gpu, host_shard.data(), host_shard.size() * 4, misalign);
    device_bytes d_recv(gpu, host_q.data(), host_q.size(), 0);
    const float premul = k::average_factor<dtype::f32>(ranks);
    cpu.for_each(shard,
                 k::block_dequantize_sum<Q>{host_q.data(), host_shard.data(), shard, block, slice, ranks, premul, 0.5f},
                 cpu.compute_stream());
    gpu.for_each(
        shard,
        k::block_dequantize_sum<Q>{reinterpret_cast<const std::uint8_t*>(d_recv.ptr()),
                                   reinterpret_cast<float*>(d_shard.ptr()), shard, block, slice, ranks, premul, 0.5f},
        gpu.compute_stream());
    std::vector<char> ws(host_shard.size() * 4);
    std::memcpy(ws.data(), host_shard.data(), ws.size());
    CHECK(same_f32_values(d_shard.read(ws.size()), ws));  // fp32 sums: a NaN's payload is the GPU's
  };
  using f32 = std::integral_constant<dtype, dtype::f32>;
  using bf16 = std::integral_constant<dtype, dtype::bf16>;
  using e4m3 = std::integral_constant<dtype, dtype::f8e4m3>;
  using e5m2 = std::integral_constant<dtype, dtype::f8e5m2>;
  using i8 = std::integral_constant<dtype, dtype::i8>;
  // Blocks are multiples of 4 (precision::gather_block_fits: each rank's scales stay 4-byte aligned after its
  // values); 12 shares a warp unevenly.
  for (std::int64_t block : {12, 16, 32, 128})
    for (int ranks : {1, 3})
      for (std::size_t misalign : {std::size_t{0}, std::size_t{4}}) {
        CAPTURE(block);
        CAPTURE(ranks);
        CAPTURE(misalign);
        on_both(f32{}, e4m3{}, block, ranks, misalign);
        on_both(f32{}, i8{}, block, ranks, misalign);
        on_both(bf16{}, e5m2{}, block, ranks, misalign);
        on_both(bf16{}, i8{}, block, ranks, misalign);
      }
}

TEST_CASE("comm::local's reduction over one GPU's ranks: four elements a thread where aligned, bit for bit with the "
          "host's loop (an fp32 NaN's payload aside), sums and averages") {
  FSDP_REQUIRE_GPU();
  namespace ck = fsdp::cuda::kernels;
  fsdp::backend::cuda gpu(0, fsdp_test::backend_options());
  auto run = [&](auto tag, std::int64_t n, std::size_t misalign, bool average) {
    constexpr dtype D = decltype(tag)::value;
    using T = fsdp::lowp::storage_t<D>;
    constexpr int world = 3;
    std::vector<std::vector<T>> src(world);
    std::vector<std::unique_ptr<device_bytes>> d;
    ck::reduce_ranks_params<D> a{};
    for (int q = 0; q < world; ++q) {
      const std::vector<float> f = inputs(static_cast<std::size_t>(n), 20 + q);
      for (float x : f) src[q].push_back(fsdp::lowp::from_float<D>(x));
      d.push_back(std::make_unique<device_bytes>(gpu, src[q].data(), src[q].size() * sizeof(T), q == 1 ? misalign : 0));
      a.src[q] = reinterpret_cast<const T*>(d.back()->ptr());
    }
    std::vector<T> zero(static_cast<std::size_t>(n));
    device_bytes out(gpu, zero.data(), zero.size() * sizeof(T), 0);
    a.dst = reinterpret_cast<T*>(out.ptr());
    a.n = n;
    a.world = world;
    a.premul = average ? fsdp::kernels::average_factor<D>(world) : 1.0f;
    ck::reduce_ranks(a, gpu.compute_stream().get());
    std::vector<T> want(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < want.size(); ++i) {
      float acc = 0.0f;
      for (int q = 0; q < world; ++q) acc = fsdp::kernels::reduce_add<D>(acc, src[q][i], a.premul);
      want[i] = fsdp::lowp::from_float<D>(acc);
    }
    std::vector<char> w(want.size() * sizeof(T));
    std::memcpy(w.data(), want.data(), w.size());
    if constexpr (D == dtype::f32) {
      CHECK(same_f32_values(out.read(w.size()), w));  // fp32 sums: a NaN's payload is the GPU's
    } else {
      CHECK(same_bits(out.read(w.size()), w));  // bf16: from_float gives every NaN one pattern
    }
  };
  for (std::int64_t n : sizes_for(1 << 18))
    for (std::size_t misalign : {std::size_t{0}, std::size_t{4}})
      for (bool average : {false, true}) {
        CAPTURE(n);
        CAPTURE(misalign);
        CAPTURE(average);
        run(std::integral_constant<dtype, dtype::f32>{}, n, misalign, average);
        run(std::integral_constant<dtype, dtype::bf16>{}, n, misalign, average);
      }
}

TEST_CASE("squared norm with CUB: within 1e-5 relative of the host's double sum; empty gives 0") {
  FSDP_REQUIRE_GPU();
  fsdp::backend::cuda gpu(0, fsdp_test::backend_options());
  fsdp::backend::host cpu;
  std::vector<std::int64_t> norm_sizes = {0, 1, 12345};
  norm_sizes.push_back(fsdp_test::simulated_gpu() ? 1 << 16 : 1 << 22);
  for (std::int64_t n : norm_sizes) {
    CAPTURE(n);
    std::vector<float> x(static_cast<std::size_t>(n));
    std::mt19937 gen(9);
    for (auto& e : x) e = std::uniform_real_distribution<float>(-1, 1)(gen);
    float want = -1;
    cpu.squared_norm(x.data(), n, &want, cpu.compute_stream());
    device_bytes dx(gpu, x.data(), x.size() * 4, 0);
    float init = -1;
    device_bytes dout(gpu, &init, 4, 0);
    gpu.squared_norm(reinterpret_cast<const float*>(dx.ptr()), n, reinterpret_cast<float*>(dout.ptr()),
                     gpu.compute_stream());
    float got = 0;
    std::memcpy(&got, dout.read(4).data(), 4);
    CHECK(std::fabs(double(got) - double(want)) <= 1e-5 * std::fabs(double(want)));
  }
}

TEST_CASE("squared norm's scratch lives on one stream: a second stream is refused, not raced") {
  FSDP_REQUIRE_GPU();
  fsdp::backend::cuda gpu(0, fsdp_test::backend_options());
  const std::vector<float> x(300, 0.5f);
  device_bytes dx(gpu, x.data(), x.size() * 4, 0);
  float init = -1;
  device_bytes dout(gpu, &init, 4, 0);
  const auto* in = reinterpret_cast<const float*>(dx.ptr());
  auto* out = reinterpret_cast<float*>(dout.ptr());
  gpu.squared_norm(in, 300, out, gpu.compute_stream());
  std::string what;
  try {
    gpu.squared_norm(in, 300, out, gpu.reduce_stream());
  } catch (const fsdp::usage_error& e) {
    what = e.what();
  }
  CHECK(what == "fsdp: squared_norm: the CUDA backend's scratch space is used on stream 'rank0.reduce' but was made "
                "for another stream; use one stream for norms");
  float got = 0;
  std::memcpy(&got, dout.read(4).data(), 4);
  CHECK(got == 75.0f);  // 300 x 0.25, exact in fp32
}

TEST_CASE("the gather, reduce and copy streams run at the device's most urgent priority, compute at the default") {
  FSDP_REQUIRE_GPU();
  int least = 0, greatest = 0;
  FSDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  fsdp::backend::cuda gpu(0, fsdp_test::backend_options());
  CHECK(gpu.compute_stream().priority() == 0);
  for (auto* s : {&gpu.gather_stream(), &gpu.reduce_stream(), &gpu.upload_stream(), &gpu.download_stream()}) {
    CAPTURE(s->name());
    CHECK(s->priority() == greatest);
  }
  if (least == greatest) {  // GPGPU-Sim: no priorities (and no cudaStreamGetPriority)
    fsdp_test::needs_real_gpu("stream priorities: this device has one stream priority (the simulated GPU)");
    return;
  }
  CHECK(greatest < least);
  for (auto* s : {&gpu.compute_stream(), &gpu.gather_stream(), &gpu.reduce_stream(), &gpu.upload_stream(),
                  &gpu.download_stream()}) {
    CAPTURE(s->name());
    int got = 1;
    FSDP_CUDA_CHECK(cudaStreamGetPriority(s->get(), &got));
    CHECK(got == s->priority());
  }
}

namespace {
/// AdamW's rule for updates 1 .. n, each made as the optimizer's first kernel makes it (fsdp/optim/detail/
/// step_block.hpp: from a count read from device memory), and a 64-bit count as a double.
struct rules_on_device {
  fsdp::optim::detail::adamw_step step;
  const std::int64_t* counts;
  float* out;  // lr, bias_correction1, bias_correction2 per update
  double* as_double;
  FSDP_HD void operator()(std::int64_t i) const {
    const fsdp::optim::detail::adamw_rule r = step.at(static_cast<long>(counts[i]) + 1);
    out[3 * i] = r.c.lr;
    out[3 * i + 1] = r.c.bias_correction1;
    out[3 * i + 2] = r.c.bias_correction2;
    as_double[i] = fsdp::rn::from_int64(counts[i] * 1000003 - 5);
  }
};
}  // namespace

TEST_CASE(
    "the learning-rate schedule and the bias corrections made on the device give the host's bits at every update "
    "(warm-up, cosine, flat after it), from counts kept in device memory") {
  FSDP_REQUIRE_GPU();
  constexpr int n = 160;
  const fsdp::optim::detail::adamw_step step{{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f}, {10, 120, 0.1f}};
  std::vector<std::int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[static_cast<std::size_t>(i)] = i;  // updates 1 .. n
  fsdp::backend::cuda be(0, fsdp_test::backend_options());
  auto& s = be.compute_stream();
  auto dc = be.allocate(n * 8, fsdp::mem::comm_buffers, s);
  auto dout = be.allocate(3 * n * 4, fsdp::mem::comm_buffers, s);
  auto dd = be.allocate(n * 8, fsdp::mem::comm_buffers, s);
  be.upload(dc.data(), counts.data(), n * 8, s);
  be.for_each(n, rules_on_device{step, dc.as<std::int64_t>(), dout.as<float>(), dd.as<double>()}, s);
  std::vector<float> got(3 * n);
  std::vector<double> got_double(n);
  be.synchronize(s);
  be.download(got.data(), dout.data(), 3 * n * 4, s);
  be.download(got_double.data(), dd.data(), n * 8, s);
  be.synchronize(s);
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    const fsdp::optim::detail::adamw_rule want = step.at(i + 1);
    CHECK(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(3 * i)]) ==
          std::bit_cast<std::uint32_t>(want.c.lr));
    CHECK(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(3 * i + 1)]) ==
          std::bit_cast<std::uint32_t>(want.c.bias_correction1));
    CHECK(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(3 * i + 2)]) ==
          std::bit_cast<std::uint32_t>(want.c.bias_correction2));
    CHECK(got_double[static_cast<std::size_t>(i)] == static_cast<double>(std::int64_t{i} * 1000003 - 5));
  }
  CHECK(got[3] > got[0]);                    // warming up
  CHECK(got[3 * 159] == step.at(160).c.lr);  // flat after update 120
  CHECK(got[3 * 159] == 3e-3f * 0.1f);       // at lr * min_ratio
  be.release_after(std::move(dc), s);
  be.release_after(std::move(dout), s);
  be.release_after(std::move(dd), s);
  be.synchronize(s);
}
