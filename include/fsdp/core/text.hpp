#pragma once
// Names as messages, traces and files show them: UTF-8 validation, a printable form of any byte string, and the
// text of a shape. Parameter and unit names are checked once, where they enter (ModelSpec::add, make_units), so
// that every later writer (Chrome traces, checkpoints, messages) can rely on them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::detail {

/// Offset of the first byte of `s` that does not belong to a well-formed UTF-8 sequence (RFC 3629: no overlong
/// forms, no surrogates, nothing above U+10FFFF), or npos when `s` is valid UTF-8.
inline std::size_t utf8_error(std::string_view s) noexcept {
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

/// `s` with every byte that is not part of valid UTF-8, and every control character, written as \xNN: a form
/// that can be printed and put in JSON whatever `s` holds.
inline std::string printable(std::string_view s) {
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

/// Why `name` cannot be a name, or "": what names `what` ("parameter name", "unit name") and the first byte that
/// is not UTF-8. "parameter name 'h.\xff.w' is not valid UTF-8 (byte 0xff at offset 2)"
inline std::string utf8_problem(std::string_view what, std::string_view name) {
  const std::size_t at = utf8_error(name);
  if (at == std::string_view::npos) return {};
  static constexpr char hex[] = "0123456789abcdef";
  const auto c = static_cast<unsigned char>(name[at]);
  return std::string(what) + " '" + printable(name) + "' is not valid UTF-8 (byte 0x" + hex[c >> 4] + hex[c & 15] +
         " at offset " + std::to_string(at) + ")";
}

/// "[4, 6]"
inline std::string shape_text(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace fsdp::detail
