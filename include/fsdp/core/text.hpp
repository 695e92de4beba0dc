#pragma once
// Names as messages, traces and files show them: UTF-8 validation, a printable form of any byte string, and the
// text of a shape. Parameter and unit names are checked once, where they enter (ModelSpec::add, make_units), so
// that every later writer (Chrome traces, checkpoints, messages) can rely on them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/config.hpp"

namespace fsdp::detail {

/// Offset of the first byte of `s` that does not belong to a well-formed UTF-8 sequence (RFC 3629: no overlong
/// forms, no surrogates, nothing above U+10FFFF), or npos when `s` is valid UTF-8.
FSDP_DECL std::size_t utf8_error(std::string_view s) noexcept;

/// `s` with every byte that is not part of valid UTF-8, and every control character, written as \xNN: a form
/// that can be printed and put in JSON whatever `s` holds.
FSDP_DECL std::string printable(std::string_view s);

/// Why `name` cannot be a name, or "": what names `what` ("parameter name", "unit name") and the first byte that
/// is not UTF-8. "parameter name 'h.\xff.w' is not valid UTF-8 (byte 0xff at offset 2)"
FSDP_DECL std::string utf8_problem(std::string_view what, std::string_view name);

/// "[4, 6]"
FSDP_DECL std::string shape_text(const std::vector<std::int64_t>& dims);

}  // namespace fsdp::detail

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/core/text.ipp"
#endif
