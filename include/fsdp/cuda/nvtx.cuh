#pragma once
// NVTX ranges in the library's own domain, "fsdp": NVTX3 from the CUDA toolkit, header-only (a profiler such as
// Nsight Systems loads its own library into it; with none attached, every call returns at once). backend::cuda's
// profiler-range hook (fsdp/observe/ranges.hpp) comes here. Start/end ranges ("process ranges" in NVTX's terms):
// each returns an id that ends it, so ranges need not nest and may outlive an exception.
#include <nvtx3/nvToolsExt.h>

#include <cstdint>

namespace fsdp::cuda::nvtx {

/// The domain "fsdp", made on first use, once per process.
inline nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("fsdp");
  return d;
}

/// Opens a range named `name` (ASCII; the tool copies it) in colour `argb`; returns the id range_end() takes.
inline std::uint64_t range_start(const char* name, std::uint32_t argb) noexcept {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = argb;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  return nvtxDomainRangeStartEx(domain(), &a);
}

inline void range_end(std::uint64_t id) noexcept { nvtxDomainRangeEnd(domain(), id); }

}  // namespace fsdp::cuda::nvtx
