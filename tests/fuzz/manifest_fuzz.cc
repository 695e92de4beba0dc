// libFuzzer target: checkpoint::parse_manifest on any bytes, as they come (the checksum check) and sealed with their
// own checksum when they have the member (so that the fields' checks past it are reached too). It must return a
// manifest or throw fsdp::checkpoint_error; anything else (another exception, a crash, a sanitizer report, a hang)
// is a finding. Built and run by tools/fuzz-check (clang's -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <fsdp/checkpoint/manifest.hpp>
#include <string>
#include <string_view>

namespace {
void parse(std::string_view text) {
  try {
    const fsdp::checkpoint::manifest m = fsdp::checkpoint::parse_manifest(text, "the manifest 'fuzz'");
    // What parsed must write back to a manifest that parses to the same value.
    if (fsdp::checkpoint::parse_manifest(fsdp::checkpoint::to_json(m), "the rewritten manifest") != m) __builtin_trap();
  } catch (const fsdp::checkpoint_error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  parse(text);
  std::string sealed;
  try {
    sealed = fsdp::checkpoint::seal_manifest(std::string(text));
  } catch (const fsdp::usage_error&) {  // no checksum member: nothing to seal
    return 0;
  }
  parse(sealed);
  return 0;
}
