// libFuzzer target: a safetensors file's header (length, then JSON) as an import reads it, on any bytes: it must
// give a header or throw fsdp::checkpoint_error; anything else is a finding. Built and run by tools/fuzz-check.
#include <cstddef>
#include <cstdint>
#include <fsdp/checkpoint/safetensors_header.hpp>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  try {
    const std::uint64_t n = fsdp::safetensors::header_length(file.substr(0, 8), size, "the file 'fuzz'");
    const fsdp::safetensors::header h =
        fsdp::safetensors::parse_header(file.substr(8, n), size - 8 - n, "the file 'fuzz'");
    // Every tensor the parser accepted lies inside the data section.
    for (const auto& t : h.tensors)
      if (t.end > size - 8 - n || t.begin > t.end) __builtin_trap();
  } catch (const fsdp::checkpoint_error&) {
  }
  return 0;
}
