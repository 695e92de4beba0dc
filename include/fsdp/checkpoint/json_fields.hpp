#pragma once
// Strict reading of a JSON document (a checkpoint manifest, a safetensors header) with nlohmann-json: every field
// is looked up with its path ("files[2].pieces[0].end") and its expected type, and anything else is a
// checkpoint_error naming the document and that path. A member name that appears twice in one object is refused
// (nlohmann-json, like many readers, would keep the last one silently: two readers could then see two different
// documents). Used by the parsers the fuzz targets run. An internal header: only the .ipp files of manifest.hpp and
// safetensors_header.hpp include it, so that no public checkpoint header includes nlohmann/json.hpp.
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"

namespace fsdp::checkpoint::json_fields {

using json = nlohmann::json;

/// Errors name `doc` ("the manifest 'ck/manifest.json'") and the field's path.
struct reader {
  std::string doc;
  /// What a member of the top-level object is, when it is named (safetensors headers: "tensor", so that a path
  /// reads "tensor 'emb': dtype"); empty: paths are plain ("files[0].name").
  std::string_view top_noun = {};

  [[noreturn]] void fail(std::string_view at, std::string_view problem) const {
    throw checkpoint_error(
        fsdp::detail::cat(doc, ": ", at.empty() ? std::string("the document") : std::string(at), " ", problem));
  }

  /// Parses `text` as JSON (UTF-8 only); a syntax error names the byte where parsing stopped, a member name
  /// repeated within one object names the first such member.
  json parse(std::string_view text) const {
    if (const std::size_t bad = fsdp::detail::utf8_error(text); bad != std::string_view::npos)
      fail("", fsdp::detail::cat("is not valid UTF-8 (byte ", bad, ")"));
    struct level {
      bool object;
      std::set<std::string, std::less<>> names;  // objects: the member names seen
      std::string name;                          // objects: the member being read
      std::size_t index = 0;                     // arrays: the element being read
    };
    std::vector<level> open;
    std::optional<std::string> repeated;  // the path of the first repeated member
    const auto element_done = [&] {
      if (!open.empty() && !open.back().object) ++open.back().index;
    };
    json::parser_callback_t note = [&](int, json::parse_event_t e, json& v) {
      switch (e) {
        case json::parse_event_t::object_start: open.push_back({true, {}, {}, 0}); break;
        case json::parse_event_t::array_start: open.push_back({false, {}, {}, 0}); break;
        case json::parse_event_t::key:
          if (!v.is_string()) break;
          open.back().name = v.get<std::string>();
          if (!open.back().names.insert(open.back().name).second && !repeated) repeated = path_of(open);
          break;
        case json::parse_event_t::object_end:
        case json::parse_event_t::array_end:
          open.pop_back();
          element_done();
          break;
        case json::parse_event_t::value: element_done(); break;
      }
      return true;
    };
    json j = json::parse(text.begin(), text.end(), note, /*allow_exceptions=*/false);
    if (j.is_discarded()) fail("", "does not parse as JSON");
    if (repeated)
      fail(*repeated, "appears twice; the names in a JSON object must be unique (a reader that keeps either one "
                      "would see another document)");
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
    if (it == j.end()) fail(at, fsdp::detail::cat("has no member '", key, "'"));
    return *it;
  }
  /// Member `key` of the object `j` (at `at`), or null when it has none (a member added in a later version).
  const json* optional_member(const json& j, std::string_view key, std::string_view at) const {
    object(j, at);
    const auto it = j.find(std::string(key));
    return it == j.end() ? nullptr : &*it;
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
        fail(at, fsdp::detail::cat("must be at most ", hi, ", got ", u));
      v = static_cast<std::int64_t>(u);
    } else if (j.is_number_integer()) {
      v = j.get<std::int64_t>();
    } else {
      fail(at, "must be an integer");
    }
    if (v < lo || v > hi) fail(at, fsdp::detail::cat("must be in [", lo, ", ", hi, "], got ", v));
    return v;
  }
  double number(const json& j, std::string_view at) const {
    if (!j.is_number()) fail(at, "must be a number");
    return j.get<double>();
  }

 private:
  /// The path of the member being read at the innermost open object: "files[0].pieces[2].tensor", or with a
  /// top-level noun "tensor 'emb': shape".
  template <class Levels>
  std::string path_of(const Levels& open) const {
    std::string out;
    for (std::size_t i = 0; i < open.size(); ++i) {
      if (!open[i].object) {
        out += fsdp::detail::cat("[", open[i].index, "]");
      } else if (i == 0 && !top_noun.empty() && open[i].name != "__metadata__") {
        out = fsdp::detail::cat(top_noun, " '", open[i].name, "'");
      } else {
        const bool after_noun = i == 1 && !top_noun.empty() && !out.empty() && out.back() == '\'';
        out += out.empty() ? open[i].name : fsdp::detail::cat(after_noun ? ": " : ".", open[i].name);
      }
    }
    return out;
  }
};

inline std::string at(std::string_view base, std::string_view key) {
  return base.empty() ? std::string(key) : fsdp::detail::cat(base, ".", key);
}
inline std::string at(std::string_view base, std::size_t index) { return fsdp::detail::cat(base, "[", index, "]"); }

}  // namespace fsdp::checkpoint::json_fields
