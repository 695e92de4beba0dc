// The library's fp8 conversions (fsdp/core/float8.hpp) against the ml_dtypes package, over every input:
//   float8_interop REFERENCE   (REFERENCE: what tests/kernels/float8_interop.py wrote)
//
// fp8 -> fp32: all 256 patterns of each format give ml_dtypes' bits (a NaN: any NaN).
// fp32 -> fp8: all 2^32 inputs of each format, against ml_dtypes' steps, with the library's one documented
// difference: a finite input that ml_dtypes turns into infinity (E5M2) or NaN (E4M3) saturates to the largest
// finite value of its sign, an E4M3 infinity is the canonical NaN 0x7f, and every NaN input gives 0x7f (ml_dtypes
// keeps the sign). And the random samples, directly, with the same rule.
// Prints one line per format and exits 1 on the first mismatches (at most 10 listed per format).
#include <fsdp/core/float8.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct step {
  std::uint32_t from;
  std::uint8_t q;
};

struct reference {
  std::uint32_t decode[256] = {};
  int decoded = 0;
  std::vector<step> steps[2];  // per sign
  std::vector<std::pair<std::uint32_t, std::uint8_t>> samples;
};

template <class F>
std::uint8_t expected(std::uint32_t x, std::uint8_t ml) {
  const std::uint32_t a = x & 0x7fffffffu;
  const std::uint8_t sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  if (a > 0x7f800000u) return F::nan_bits;                                  // NaN: canonical
  if (a == 0x7f800000u) return F::has_inf ? ml : F::nan_bits;               // infinity
  const std::uint8_t mag = ml & 0x7fu;
  const bool non_finite = F::has_inf ? mag >= F::inf_bits : mag == 0x7fu;
  return non_finite ? static_cast<std::uint8_t>(sign | F::max_bits) : ml;  // overflow saturates
}

template <class F>
bool check(const char* name, const reference& r) {
  bool ok = true;
  int listed = 0;
  auto fail = [&](const std::string& what) {
    ok = false;
    if (listed++ < 10) std::fprintf(stderr, "%s: %s\n", name, what.c_str());
  };
  // every pattern to fp32
  if (r.decoded != 256) fail("the reference decodes " + std::to_string(r.decoded) + " patterns, not 256");
  for (int b = 0; b < 256; ++b) {
    const std::uint32_t ours = fsdp::f8::bits(fsdp::f8::to_float<F>(static_cast<std::uint8_t>(b)));
    const std::uint32_t ml = r.decode[b];
    const bool nan_ours = (ours & 0x7fffffffu) > 0x7f800000u, nan_ml = (ml & 0x7fffffffu) > 0x7f800000u;
    if (nan_ours != nan_ml || (!nan_ml && ours != ml)) {
      std::ostringstream os;
      os << std::hex << "pattern 0x" << b << " decodes to 0x" << ours << ", ml_dtypes 0x" << ml;
      fail(os.str());
    }
  }
  // every fp32 input, one thread per sign
  std::uint64_t mismatches[2] = {0, 0}, saturated[2] = {0, 0}, first_bad[2] = {~0ull, ~0ull};
  auto walk = [&](int s) {
    const std::vector<step>& st = r.steps[s];
    std::uint64_t bad = 0, sat = 0, first = ~0ull;  // locals: the two threads share no cache line in the loop
    std::uint64_t p = 0;
    for (std::size_t k = 0; k < st.size(); ++k) {  // one step of ml_dtypes at a time: its inputs [from, end)
      const std::uint64_t end = k + 1 < st.size() ? st[k + 1].from : 0x80000000ull;
      for (; p < end; ++p) {
        const std::uint32_t x = (static_cast<std::uint32_t>(s) << 31) | static_cast<std::uint32_t>(p);
        const std::uint8_t ml = p <= 0x7f800000u ? st[k].q : F::nan_bits;  // NaN inputs: the rule's 0x7f
        const std::uint8_t want = expected<F>(x, ml);
        sat += want != ml && p < 0x7f800000u;
        if (fsdp::f8::from_float<F>(fsdp::f8::from_bits(x)) != want && bad++ == 0) first = x;
      }
    }
    mismatches[s] = bad;
    saturated[s] = sat;
    first_bad[s] = first;
  };
  if (r.steps[0].empty() || r.steps[1].empty() || r.steps[0][0].from != 0 || r.steps[1][0].from != 0) {
    fail("the reference's steps do not start at 0 for both signs");
  } else {
    std::thread neg(walk, 1);
    walk(0);
    neg.join();
  }
  for (int s = 0; s < 2; ++s)
    if (mismatches[s]) {
      std::ostringstream os;
      os << mismatches[s] << " inputs of sign " << s << " differ, the first 0x" << std::hex << first_bad[s];
      fail(os.str());
    }
  // the samples, directly
  for (const auto& [x, ml] : r.samples) {
    const std::uint8_t ours = fsdp::f8::from_float<F>(fsdp::f8::from_bits(x)), want = expected<F>(x, ml);
    if (ours != want) {
      std::ostringstream os;
      os << std::hex << "input 0x" << x << " converts to 0x" << int(ours) << ", ml_dtypes 0x" << int(ml)
         << " (expected 0x" << int(want) << ")";
      fail(os.str());
    }
  }
  std::printf("%s: 256 patterns decoded, 4294967296 inputs converted (%zu + %zu steps of ml_dtypes), %zu samples; "
              "%llu finite inputs saturated where ml_dtypes overflows; %s\n",
              name, r.steps[0].size(), r.steps[1].size(), r.samples.size(),
              static_cast<unsigned long long>(saturated[0] + saturated[1]), ok ? "all equal" : "MISMATCH");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: float8_interop REFERENCE\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "float8_interop: cannot read '%s'\n", argv[1]);
    return 2;
  }
  std::map<std::string, reference> refs;
  std::string kind, fmt;
  while (in >> kind >> fmt) {
    reference& r = refs[fmt];
    std::string a, b, c;
    if (kind == "decode" && in >> a >> b) {
      r.decode[std::stoi(a) & 0xff] = static_cast<std::uint32_t>(std::stoul(b, nullptr, 16));
      ++r.decoded;
    } else if (kind == "step" && in >> a >> b >> c) {
      r.steps[std::stoi(a) & 1].push_back({static_cast<std::uint32_t>(std::stoul(b, nullptr, 16)),
                                           static_cast<std::uint8_t>(std::stoul(c, nullptr, 16))});
    } else if (kind == "sample" && in >> a >> b) {
      r.samples.emplace_back(static_cast<std::uint32_t>(std::stoul(a, nullptr, 16)),
                             static_cast<std::uint8_t>(std::stoul(b, nullptr, 16)));
    } else {
      std::fprintf(stderr, "float8_interop: unreadable line '%s %s ...' in '%s'\n", kind.c_str(), fmt.c_str(), argv[1]);
      return 2;
    }
  }
  if (refs.size() != 2 || !refs.count("e4m3") || !refs.count("e5m2")) {
    std::fprintf(stderr, "float8_interop: '%s' must hold the formats e4m3 and e5m2\n", argv[1]);
    return 2;
  }
  const bool ok = check<fsdp::f8::e4m3>("e4m3", refs["e4m3"]) & check<fsdp::f8::e5m2>("e5m2", refs["e5m2"]);
  return ok ? 0 : 1;
}
