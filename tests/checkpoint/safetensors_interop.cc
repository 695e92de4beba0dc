// The C++ half of the interoperability check with the `safetensors` Python package (safetensors_interop_test.sh):
//   export FILE F16FILE REFDIR: five_units at 3 thread ranks -> FILE (F32) and F16FILE (F16), and every stored
//                               parameter's fp32 values as REFDIR/<name>.f32 (raw little-endian)
//   import FILE REFDIR:         FILE (written by the package) -> five_units at 2 thread ranks; every parameter must
//                               equal REFDIR/<name>.f32 bit for bit
#define DOCTEST_CONFIG_DISABLE  // a program, not a test: tests/support is here for five_units()
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fsdp/checkpoint/safetensors.hpp>
#include <fstream>
#include <string>

#include "tests/support/support.hpp"

namespace {
using full_shard = fsdp::policy<fsdp::sharding::full_shard>;
const fsdp::wrap::by_prefix units{"h."};

int do_export(const std::string& file, const std::string& f16_file, const std::string& refdir) {
  std::filesystem::create_directories(refdir);
  fsdp::comm::run_local(3, [&](fsdp::comm::local_communicator& c) {
    fsdp::Model<full_shard> m(c, fsdp_test::five_units(), units, fsdp::init::normal{1.0f, 5});
    fsdp::safetensors::save(m, file);
    fsdp::safetensors::save(m, f16_file, {.type = fsdp::dtype::f16});
    const auto full = fsdp::weights::gather_full_params(m);
    if (c.rank() != 0) return;
    for (const auto& p : m.spec().params()) {
      if (p.is_tied()) continue;
      const std::vector<float>& v = full.at(p.name);
      std::ofstream(refdir + "/" + p.name + ".f32", std::ios::binary)
          .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    }
  });
  std::printf("export: wrote %s and %s\n", file.c_str(), f16_file.c_str());
  return 0;
}

int do_import(const std::string& file, const std::string& refdir) {
  int mismatches = 0, compared = 0;
  fsdp::comm::run_local(2, [&](fsdp::comm::local_communicator& c) {
    fsdp::Model<full_shard> m(c, fsdp_test::five_units(), units, fsdp::init::normal{1.0f, 99});
    fsdp::safetensors::load(m, file);
    const auto full = fsdp::weights::gather_full_params(m);
    if (c.rank() != 0) return;
    for (const auto& p : m.spec().params()) {
      if (p.is_tied()) continue;
      std::ifstream in(refdir + "/" + p.name + ".f32", std::ios::binary);
      std::vector<float> want(static_cast<std::size_t>(p.numel()));
      in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
      const std::vector<float>& got = full.at(p.name);
      ++compared;
      if (!in || std::memcmp(got.data(), want.data(), want.size() * 4) != 0) {
        std::printf("import: parameter '%s' differs from %s/%s.f32\n", p.name.c_str(), refdir.c_str(), p.name.c_str());
        ++mismatches;
      }
    }
  });
  std::printf("import: %d parameters compared, %d differ\n", compared, mismatches);
  return mismatches == 0 && compared > 0 ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "export" && argc == 5) return do_export(argv[2], argv[3], argv[4]);
    if (mode == "import" && argc == 4) return do_import(argv[2], argv[3]);
    std::fprintf(stderr, "usage: %s export FILE F16FILE REFDIR | import FILE REFDIR\n", argv[0]);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
