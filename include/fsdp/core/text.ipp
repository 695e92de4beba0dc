#pragma once
// The text helpers' definitions (fsdp/core/text.hpp): included by that header, or compiled once by fsdp/src.hpp
// under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/text.hpp"

namespace fsdp::detail {

FSDP_DECL std::size_t utf8_error(std::string_view s) noexcept {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (b[i + 1] < lo || b[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (b[i + k] < 0x80 || b[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

FSDP_DECL std::string printable(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t bad = utf8_error(s.substr(i));
    const std::size_t good_end = bad == std::string_view::npos ? s.size() : i + bad;
    for (; i < good_end; ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x20 || c == 0x7F) {
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      } else {
        out += s[i];
      }
    }
    if (i < s.size()) {
      const auto c = static_cast<unsigned char>(s[i]);
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
      ++i;
    }
  }
  return out;
}

FSDP_DECL std::string utf8_problem(std::string_view what, std::string_view name) {
  const std::size_t at = utf8_error(name);
  if (at == std::string_view::npos) return {};
  static constexpr char hex[] = "0123456789abcdef";
  const auto c = static_cast<unsigned char>(name[at]);
  return std::string(what) + " '" + printable(name) + "' is not valid UTF-8 (byte 0x" + hex[c >> 4] + hex[c & 15] +
         " at offset " + std::to_string(at) + ")";
}

FSDP_DECL std::string shape_text(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace fsdp::detail
