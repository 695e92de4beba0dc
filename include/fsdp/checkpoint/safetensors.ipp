#pragma once
// The safetensors weights' non-template definitions (fsdp/checkpoint/safetensors.hpp): included by that header,
// or compiled once under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/checkpoint/safetensors_header.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/float16.hpp"
#include "fsdp/kernels/elementwise.hpp"

namespace fsdp::safetensors {

FSDP_DECL header read_header(const checkpoint::io::file& f, std::uint64_t* data_start) {
  const std::uint64_t size = f.size();
  const std::string doc = fsdp::detail::cat("the safetensors file '", f.path(), "'");
  std::string len(static_cast<std::size_t>(std::min<std::uint64_t>(size, 8)), '\0');
  f.read_at(len.data(), len.size(), 0);
  const std::uint64_t n = header_length(len, size, doc);
  std::string text(static_cast<std::size_t>(n), '\0');
  f.read_at(text.data(), n, 8);
  if (data_start) *data_start = 8 + n;
  return parse_header(text, size - 8 - n, doc);
}

namespace detail {

FSDP_DECL std::string st_dtypes_text() {
  std::string out;
  for (std::size_t i = 0; i < dtype_count; ++i)
    out += std::string(i == 0 ? "" : i + 1 == dtype_count ? " and " : ", ") + std::string(dtype_rows[i].safetensors);
  return out;
}

FSDP_DECL void encode(const float* in, std::size_t n, dtype type, std::vector<char>& out) {
  out.resize(n * size_of(type));
  kernels::dispatch(type, [&](auto d) {
    for (std::size_t i = 0; i < n; ++i) {
      const lowp::storage_t<d()> x = lowp::from_float<d()>(in[i]);
      std::memcpy(out.data() + sizeof(x) * i, &x, sizeof(x));
    }
  });
}

FSDP_DECL void decode(const char* in, std::size_t n, dtype type, float* out) {
  kernels::dispatch(type, [&](auto d) {
    for (std::size_t i = 0; i < n; ++i) {
      lowp::storage_t<d()> x;
      std::memcpy(&x, in + sizeof(x) * i, sizeof(x));
      out[i] = lowp::to_float<d()>(x);
    }
  });
}

}  // namespace detail

}  // namespace fsdp::safetensors
