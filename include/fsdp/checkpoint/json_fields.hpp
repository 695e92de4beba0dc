#pragma once
// Strict reading of a JSON document (a checkpoint manifest, a safetensors header) with nlohmann-json: every field
// is looked up with its path ("files[2].pieces[0].end") and its expected type, and anything else is a
// checkpoint_error naming the document and that path. Used by the parsers the fuzz targets run.
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"

namespace fsdp::checkpoint::json_fields {

using json = nlohmann::json;

/// Errors name `doc` ("the manifest 'ck/manifest.json'") and the field's path.
struct reader {
  std::string doc;

  [[noreturn]] void fail(std::string_view at, std::string_view problem) const {
    throw checkpoint_error(
        detail::cat(doc, ": ", at.empty() ? std::string("the document") : std::string(at), " ", problem));
  }

  /// Parses `text` as JSON (UTF-8 only); a syntax error names the byte where parsing stopped.
  json parse(std::string_view text) const {
    if (const std::size_t bad = detail::utf8_error(text); bad != std::string_view::npos)
      fail("", detail::cat("is not valid UTF-8 (byte ", bad, ")"));
    json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) fail("", "does not parse as JSON");
    return j;
  }

  const json& object(const json& j, std::string_view at) const {
    if (!j.is_object()) fail(at, "must be a JSON object");
    return j;
  }
  const json& array(const json& j, std::string_view at) const {
    if (!j.is_array()) fail(at, "must be a JSON array");
    return j;
  }
  /// Member `key` of the object `j` (at `at`), which must exist.
  const json& member(const json& j, std::string_view key, std::string_view at) const {
    object(j, at);
    const auto it = j.find(std::string(key));
    if (it == j.end()) fail(at, detail::cat("has no member '", key, "'"));
    return *it;
  }
  std::string string(const json& j, std::string_view at) const {
    if (!j.is_string()) fail(at, "must be a string");
    return j.get<std::string>();
  }
  /// An integer in [lo, hi].
  std::int64_t integer(const json& j, std::string_view at, std::int64_t lo = 0,
                       std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    std::int64_t v = 0;
    if (j.is_number_unsigned()) {
      const std::uint64_t u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(at, detail::cat("must be at most ", hi, ", got ", u));
      v = static_cast<std::int64_t>(u);
    } else if (j.is_number_integer()) {
      v = j.get<std::int64_t>();
    } else {
      fail(at, "must be an integer");
    }
    if (v < lo || v > hi) fail(at, detail::cat("must be in [", lo, ", ", hi, "], got ", v));
    return v;
  }
  double number(const json& j, std::string_view at) const {
    if (!j.is_number()) fail(at, "must be a number");
    return j.get<double>();
  }
};

inline std::string at(std::string_view base, std::string_view key) {
  return base.empty() ? std::string(key) : detail::cat(base, ".", key);
}
inline std::string at(std::string_view base, std::size_t index) { return detail::cat(base, "[", index, "]"); }

}  // namespace fsdp::checkpoint::json_fields
