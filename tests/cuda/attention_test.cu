// The GPT example's fused causal attention (examples/05_gpt_cuda/attention.cuh) against a plain one in double on the
// host: the output, each row's log-sum-exp and the gradients of Q, K and V (added to what dqkv held), for odd shapes
// (3 heads of width 4 over 5 positions), rows that cross the kernels' tiles (70 positions: two blocks of 64 query
// rows, three tiles of 32 keys), GPT-2's head width (64) and packed rows (documents that start mid-row and mid-tile).
// In fp32 (the twin) within 1e-4 absolute plus relative; in bf16 against a reference whose inputs are rounded to
// bf16 as the kernels round them, within 2e-2 (the probabilities and dS are rounded to bf16 before their products).
// Every output buffer has guard floats on both sides that must come back untouched (the simulated GPU checks no
// bounds), and a second run gives the same bits (no atomics: activation checkpointing changes nothing). The
// tensor-core product runs where it was built (not with EXAMPLES_NO_MMA, the simulated GPU's build) on a device of
// compute capability 8.0 or later. With qkv and the output kept in bf16 (the trainer's), the output is the fp32
// output rounded, bit for bit, and the backward the same bits as from those values in fp32.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "examples/05_gpt_cuda/attention.cuh"
#include "gpu.hpp"

namespace {

namespace att = gpt_cuda::attention;

struct problem {
  int B, T, C, NH;
  std::vector<int> starts;  // empty: whole rows
};

struct results {
  std::vector<float> out, lse, dqkv;
};

float round_bf16(float x) { return static_cast<float>(fsdp::bfloat16(x)); }

/// The plain attention in double: out, lse, and dqkv (starting from dqkv0) for the given dout.
results reference(const problem& p, std::vector<float> qkv, std::vector<float> dout, const std::vector<float>& dqkv0,
                  bool bf16) {
  if (bf16) {
    for (float& x : qkv) x = round_bf16(x);
    for (float& x : dout) x = round_bf16(x);
  }
  const int hs = p.C / p.NH, T = p.T;
  const long long C3 = 3LL * p.C;
  const double scale = 1.0 / std::sqrt(double(hs));
  results r{std::vector<float>(std::size_t(p.B) * T * p.C), std::vector<float>(std::size_t(p.B) * p.NH * T), dqkv0};
  std::vector<double> grad(dqkv0.size(), 0.0);
  auto at = [&](int b, int t, int part, int h, int i) { return ((long long)b * T + t) * C3 + part * p.C + h * hs + i; };
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.NH; ++h)
      for (int t = 0; t < T; ++t) {
        const int t0 = p.starts.empty() ? 0 : p.starts[std::size_t(b) * T + t];
        std::vector<double> s(std::size_t(t + 1), 0.0), pr(s.size(), 0.0), dp(s.size(), 0.0);
        double top = -INFINITY;
        for (int k = t0; k <= t; ++k) {
          for (int i = 0; i < hs; ++i) s[k] += double(qkv[at(b, t, 0, h, i)]) * qkv[at(b, k, 1, h, i)];
          s[k] *= scale;
          top = std::max(top, s[k]);
        }
        double sum = 0;
        for (int k = t0; k <= t; ++k) sum += (pr[k] = std::exp(s[k] - top));
        for (int k = t0; k <= t; ++k) pr[k] /= sum;
        r.lse[(std::size_t(b) * p.NH + h) * T + t] = float(top + std::log(sum));
        double dot = 0;
        for (int i = 0; i < hs; ++i) {
          double o = 0;
          for (int k = t0; k <= t; ++k) o += pr[k] * qkv[at(b, k, 2, h, i)];
          const std::size_t oi = (std::size_t(b) * T + t) * p.C + h * hs + i;
          r.out[oi] = float(o);
          dot += o * dout[oi];
        }
        for (int k = t0; k <= t; ++k) {
          for (int i = 0; i < hs; ++i)
            dp[k] += double(dout[(std::size_t(b) * T + t) * p.C + h * hs + i]) * qkv[at(b, k, 2, h, i)];
          const double ds = pr[k] * (dp[k] - dot) * scale;
          for (int i = 0; i < hs; ++i) {
            grad[at(b, t, 0, h, i)] += ds * qkv[at(b, k, 1, h, i)];
            grad[at(b, k, 1, h, i)] += ds * qkv[at(b, t, 0, h, i)];
            grad[at(b, k, 2, h, i)] += pr[k] * dout[(std::size_t(b) * T + t) * p.C + h * hs + i];
          }
        }
      }
  for (std::size_t i = 0; i < grad.size(); ++i) r.dqkv[i] = float(double(dqkv0[i]) + grad[i]);
  return r;
}

constexpr std::size_t guard = 64;  // floats each side of every output
constexpr std::uint32_t guard_bits = 0x7fc0dead;

/// A device array of n floats with guard floats on both sides.
struct guarded {
  float* base = nullptr;
  std::size_t n;
  explicit guarded(std::size_t count, const std::vector<float>& init = {}) : n(count) {
    REQUIRE(cudaMalloc(&base, (n + 2 * guard) * sizeof(float)) == cudaSuccess);
    std::vector<float> host(n + 2 * guard);
    for (float& x : host) std::memcpy(&x, &guard_bits, sizeof x);
    if (!init.empty()) std::copy(init.begin(), init.end(), host.begin() + guard);
    REQUIRE(cudaMemcpy(base, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  guarded(const guarded&) = delete;
  ~guarded() { cudaFree(base); }
  float* data() const { return base + guard; }
  /// The contents; fails the case if a guard float changed.
  std::vector<float> read(const char* what) const {
    std::vector<float> host(n + 2 * guard);
    REQUIRE(cudaMemcpy(host.data(), base, host.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (std::size_t i = 0; i < guard; ++i)
      for (std::size_t at : {i, guard + n + i}) {
        std::uint32_t bits;
        std::memcpy(&bits, &host[at], sizeof bits);
        INFO(what << ": guard float " << (at < guard ? "before" : "after") << " the buffer overwritten");
        REQUIRE(bits == guard_bits);
      }
    return {host.begin() + guard, host.begin() + guard + n};
  }
};

std::vector<float> uniform(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

/// Runs the kernels (twice: the second must give the same bits) and compares with the reference.
template <class E, att::product P>
void check(const problem& p, double tolerance) {
  const std::size_t nqkv = std::size_t(p.B) * p.T * 3 * p.C, nout = std::size_t(p.B) * p.T * p.C,
                    nrow = std::size_t(p.B) * p.NH * p.T;
  const std::vector<float> qkv = uniform(nqkv, 1), dout = uniform(nout, 2), dqkv0 = uniform(nqkv, 3);
  const results want = reference(p, qkv, dout, dqkv0, std::is_same_v<E, fsdp::bfloat16>);
  guarded d_qkv(nqkv, qkv), d_dout(nout, dout), d_starts(p.starts.size() ? p.starts.size() : 1);
  if (!p.starts.empty())
    REQUIRE(cudaMemcpy(d_starts.data(), p.starts.data(), p.starts.size() * sizeof(int), cudaMemcpyHostToDevice) ==
            cudaSuccess);
  const att::dims d{p.B, p.T, p.C, p.NH, p.starts.empty() ? nullptr : reinterpret_cast<const int*>(d_starts.data())};
  results got[2];
  for (results& r : got) {
    guarded out(nout), lse(nrow), dd(nrow), dqkv(nqkv, dqkv0);
    att::launch<E, P>::forward(out.data(), lse.data(), d_qkv.data(), d, nullptr);
    att::launch<E, P>::backward(dqkv.data(), dd.data(), d_dout.data(), out.data(), d_qkv.data(), lse.data(), d,
                                nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    r = {out.read("out"), lse.read("lse"), dqkv.read("dqkv")};
    (void)dd.read("dd");
    (void)d_qkv.read("qkv"), (void)d_dout.read("dout");
  }
  CHECK(got[0].out == got[1].out);
  CHECK(got[0].lse == got[1].lse);
  CHECK(got[0].dqkv == got[1].dqkv);
  auto compare = [&](const char* what, const std::vector<float>& have, const std::vector<float>& ref) {
    REQUIRE(have.size() == ref.size());
    std::size_t worst = 0;
    double excess = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const double e = std::fabs(double(have[i]) - ref[i]) - tolerance * (1 + std::fabs(double(ref[i])));
      if (!(e <= excess)) excess = std::isnan(e) ? INFINITY : e, worst = i;
    }
    INFO(std::string(what) << "[" << worst << "] = " << have[worst] << ", the reference " << ref[worst]
                           << " (tolerance " << tolerance << " absolute and relative)");
    CHECK(excess <= 0);
  };
  compare("out", got[0].out, want.out);
  compare("lse", got[0].lse, want.lse);
  compare("dqkv", got[0].dqkv, want.dqkv);
}

/// Rows of documents: each row's starts from its documents' lengths.
std::vector<int> packed(int T, const std::vector<std::vector<int>>& lengths) {
  std::vector<int> s;
  for (const auto& row : lengths) {
    int at = 0;
    for (int len : row) {
      for (int i = 0; i < len; ++i) s.push_back(at);
      at += len;
    }
    REQUIRE(at == T);
  }
  return s;
}

template <class E, att::product P>
void every_shape(double tolerance) {
  const bool sim = fsdp_test::simulated_gpu();
  SUBCASE("3 heads of width 4, 5 positions") { check<E, P>({2, 5, 12, 3, {}}, tolerance); }
  SUBCASE("70 positions: two query blocks, three key tiles") { check<E, P>({1, 70, 32, 2, {}}, tolerance); }
  SUBCASE("packed rows: documents starting mid-row and mid-tile") {
    check<E, P>({2, 70, 16, 2, packed(70, {{3, 30, 37}, {70}})}, tolerance);
  }
  SUBCASE("GPT-2's head width 64") { check<E, P>({1, sim ? 33 : 130, 128, 2, {}}, tolerance); }
}

}  // namespace

TEST_CASE("attention in fp32 (the twin) equals the plain attention within 1e-4") {
  FSDP_REQUIRE_GPU();
  every_shape<float, att::product::twin>(1e-4);
}

TEST_CASE("attention in bf16, the twin, equals the plain attention on bf16 inputs within 2e-2") {
  FSDP_REQUIRE_GPU();
  every_shape<fsdp::bfloat16, att::product::twin>(2e-2);
}

TEST_CASE("attention in bf16 on tensor cores equals the plain attention on bf16 inputs within 2e-2") {
  FSDP_REQUIRE_GPU();
#ifdef EXAMPLES_NO_MMA
  fsdp_test::needs_real_gpu("built without mma.sync (EXAMPLES_NO_MMA: the simulated GPU's PTX reader has none)");
#else
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  if (prop.major < 8) {
    fsdp_test::needs_real_gpu("mma.sync with bf16 needs compute capability 8.0 (this device: " +
                              std::to_string(prop.major) + "." + std::to_string(prop.minor) + ")");
    return;
  }
  every_shape<fsdp::bfloat16, att::product::tensor>(2e-2);
#endif
}

TEST_CASE(
    "attention on qkv and an output kept in bf16 (as the trainer keeps them) gives its fp32 output rounded, and "
    "the backward reads them so; with its gradients in bf16 too, its fp32 gradients rounded once") {
  FSDP_REQUIRE_GPU();
  using bf16 = fsdp::bfloat16;
  const problem p{2, 70, 16, 2, packed(70, {{3, 30, 37}, {70}})};
  const std::size_t nqkv = std::size_t(p.B) * p.T * 3 * p.C, nout = std::size_t(p.B) * p.T * p.C,
                    nrow = std::size_t(p.B) * p.NH * p.T;
  const std::vector<float> qkv = uniform(nqkv, 4), dout = uniform(nout, 5), dqkv0 = uniform(nqkv, 6);
  guarded d_qkv(nqkv, qkv), d_dout(nout, dout), d_starts(std::size_t(p.B) * p.T);
  REQUIRE(cudaMemcpy(d_starts.data(), p.starts.data(), p.starts.size() * sizeof(int), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  const att::dims d{p.B, p.T, p.C, p.NH, reinterpret_cast<const int*>(d_starts.data())};
  using run = att::launch<bf16, att::product::twin>;
  // qkv in bf16 (two to a float of a guarded buffer): what the kernels' bf16 tiles round the fp32 qkv to.
  std::vector<bf16> qkv_bf16(nqkv);
  for (std::size_t i = 0; i < nqkv; ++i) qkv_bf16[i] = bf16(qkv[i]);
  std::vector<float> qkv_halves((nqkv + 1) / 2);
  std::memcpy(qkv_halves.data(), qkv_bf16.data(), nqkv * sizeof(bf16));
  guarded d_qkv16(qkv_halves.size(), qkv_halves);
  const auto* qkv16 = reinterpret_cast<const bf16*>(d_qkv16.data());
  // The output both ways: in fp32 from the fp32 qkv, and in bf16 from the bf16 qkv.
  guarded out32(nout), out16((nout + 1) / 2), lse32(nrow), lse16(nrow);
  run::forward(out32.data(), lse32.data(), d_qkv.data(), d, nullptr);
  run::forward(reinterpret_cast<bf16*>(out16.data()), lse16.data(), qkv16, d, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> o32 = out32.read("out (fp32)"), o16 = out16.read("out (bf16)");
  CHECK(lse32.read("lse (fp32 out)") == lse16.read("lse (bf16 out)"));
  std::vector<bf16> halves(nout);
  std::memcpy(halves.data(), o16.data(), nout * sizeof(bf16));
  std::vector<float> rounded(nout);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < nout; ++i) {
    rounded[i] = static_cast<float>(halves[i]);
    differ += rounded[i] != round_bf16(o32[i]);
  }
  CHECK(differ == 0);
  // The backward from the bf16 output, and from the fp32 one holding the same rounded values: the same bits.
  guarded held(nout, rounded), dd_a(nrow), dd_b(nrow), dqkv_a(nqkv, dqkv0), dqkv_b(nqkv, dqkv0);
  run::backward(dqkv_a.data(), dd_a.data(), d_dout.data(), reinterpret_cast<const bf16*>(out16.data()), qkv16,
                lse16.data(), d, nullptr);
  run::backward(dqkv_b.data(), dd_b.data(), d_dout.data(), held.data(), d_qkv.data(), lse32.data(), d, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(dd_a.read("dd (bf16 out)") == dd_b.read("dd (fp32 out)"));
  CHECK(dqkv_a.read("dqkv (bf16 out)") == dqkv_b.read("dqkv (fp32 out)"));
  // The backward with its gradients in bf16 too, as the trainer keeps them (dO, and dQ, dK, dV summed into a zeroed
  // dqkv): the fp32 backward's from the same dO values into zeros, each rounded once, bit for bit.
  std::vector<bf16> dout_bf16(nout);
  std::vector<float> dout_rounded(nout), dout_halves((nout + 1) / 2);
  for (std::size_t i = 0; i < nout; ++i)
    dout_bf16[i] = bf16(dout[i]), dout_rounded[i] = static_cast<float>(dout_bf16[i]);
  std::memcpy(dout_halves.data(), dout_bf16.data(), nout * sizeof(bf16));
  guarded d_dout16(dout_halves.size(), dout_halves), d_dout_r(nout, dout_rounded), dd_c(nrow), dd_d(nrow),
      dqkv16((nqkv + 1) / 2, std::vector<float>((nqkv + 1) / 2, 0.0f)), dqkv_z(nqkv, std::vector<float>(nqkv, 0.0f));
  run::backward(reinterpret_cast<bf16*>(dqkv16.data()), dd_c.data(), reinterpret_cast<const bf16*>(d_dout16.data()),
                reinterpret_cast<const bf16*>(out16.data()), qkv16, lse16.data(), d, nullptr);
  run::backward(dqkv_z.data(), dd_d.data(), d_dout_r.data(), reinterpret_cast<const bf16*>(out16.data()), qkv16,
                lse16.data(), d, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(dd_c.read("dd (bf16 gradients)") == dd_d.read("dd (fp32 gradients)"));
  const std::vector<float> g16 = dqkv16.read("dqkv (bf16)"), g32 = dqkv_z.read("dqkv (fp32, from zeros)");
  std::vector<bf16> g_halves(nqkv);
  std::memcpy(g_halves.data(), g16.data(), nqkv * sizeof(bf16));
  std::size_t unequal = 0, nonzero = 0;
  for (std::size_t i = 0; i < nqkv; ++i) {
    unequal += static_cast<float>(g_halves[i]) != round_bf16(g32[i]);
    nonzero += g32[i] != 0.0f;
  }
  CHECK(unequal == 0);
  CHECK(nonzero > nqkv / 2);  // the gradients are there to compare
  (void)d_qkv16.read("qkv (bf16)");
  (void)d_dout16.read("dout (bf16)");
}
