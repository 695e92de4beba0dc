// libFuzzer target: checkpoint::parse_manifest on any bytes. It must return a manifest or throw
// fsdp::checkpoint_error; anything else (another exception, a crash, a sanitizer report, a hang) is a finding.
// Built and run by tools/fuzz-check (clang's -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <fsdp/checkpoint/manifest.hpp>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const fsdp::checkpoint::manifest m = fsdp::checkpoint::parse_manifest(text, "the manifest 'fuzz'");
    // What parsed must write back to a manifest that parses to the same value.
    if (fsdp::checkpoint::parse_manifest(fsdp::checkpoint::to_json(m), "the rewritten manifest") != m) __builtin_trap();
  } catch (const fsdp::checkpoint_error&) {
  }
  return 0;
}
